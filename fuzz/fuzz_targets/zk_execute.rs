//! The ZooKeeper service executing what clients sent: a session is opened, then the bytes are
//! requests (a length byte, an operation-code byte, the record), in batches, with agreed time
//! moving on; and every batch ends with the raw bytes as a command. Two replicas must agree on
//! replies and pushes, and a checkpoint must restore to a service with the same checkpoint.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use upright_fuzz::{batch, checkpoints_agree_and_restore, execute_on_both, requests};
use upright_zk::proto::op;
use upright_zk::service::{Answer, Command, ZkService};

const BATCH: usize = 4;
const CODES: [i32; 20] = [
    op::CREATE,
    op::DELETE,
    op::EXISTS,
    op::GET_DATA,
    op::SET_DATA,
    op::GET_ACL,
    op::SET_ACL,
    op::GET_CHILDREN,
    op::SYNC,
    op::PING,
    op::GET_CHILDREN2,
    op::CHECK,
    op::MULTI,
    op::CREATE2,
    op::CREATE_CONTAINER,
    op::CREATE_TTL,
    op::MULTI_READ,
    op::GET_EPHEMERALS,
    op::GET_ALL_CHILDREN_NUMBER,
    op::ADD_WATCH,
];

fuzz_target!(|data: &[u8]| {
    let (mut a, mut b) = (ZkService::new(), ZkService::new());
    let mut request_id = 0u64;
    let mut run = |a: &mut ZkService, b: &mut ZkService, n: u64, operations: Vec<Bytes>| -> Vec<Bytes> {
        let operations = operations.into_iter().map(|o| (0, o)).collect();
        execute_on_both(a, b, &batch(n, 100_000), &requests(&mut request_id, operations))
    };
    let connect = Command::Connect {
        session: 0,
        password: Bytes::new(),
        timeout_ms: 30_000,
    };
    let replies = run(&mut a, &mut b, 1, vec![connect.encode()]);
    let answer: Answer = upright_core::codec::from_bytes(&replies[0]).expect("an answer");
    // ConnectResponse: protocol version, timeout, session id, password.
    let session = answer
        .bytes
        .get(8..16)
        .map_or(0, |s| i64::from_be_bytes(s.try_into().expect("8 bytes")));
    let mut rest = data;
    let mut operations = Vec::new();
    let mut n = 2;
    while let Some((&len, tail)) = rest.split_first() {
        let len = (len as usize).min(tail.len());
        let (request, tail) = tail.split_at(len);
        rest = tail;
        let Some((&code, body)) = request.split_first() else {
            continue;
        };
        operations.push(
            Command::Request {
                session,
                xid: operations.len() as i32,
                opcode: CODES[code as usize % CODES.len()],
                body: Bytes::copy_from_slice(body),
            }
            .encode(),
        );
        if operations.len() == BATCH {
            run(&mut a, &mut b, n, std::mem::take(&mut operations));
            n += 1;
        }
    }
    operations.push(Bytes::copy_from_slice(&data[..data.len().min(32)]));
    run(&mut a, &mut b, n, operations);
    checkpoints_agree_and_restore(&a, &b, ZkService::new);
});

//! The Redis store executing what clients sent: the bytes are a RESP stream, each command (with
//! the one after it when the first byte's bit says so) one ordered operation, in batches of a few,
//! from a few clients, and a raw operation that is not a command list at the end. Two replicas
//! executing the same batches must return the same replies and pushes, and a checkpoint must
//! restore to a store with the same checkpoint: determinism is what replication rests on, and a
//! panic here would stop every correct replica at once.
#![no_main]

use bytes::{Bytes, BytesMut};
use libfuzzer_sys::fuzz_target;
use upright_core::ids::{ClientId, RequestId, SeqNo};
use upright_core::service::{BatchContext, ServiceRequest};
use upright_fuzz::{checkpoints_agree_and_restore, execute_on_both};
use upright_kv::store::RedisStore;
use upright_kv::{encode_operation, resp};

const CLIENTS: u32 = 3;
const BATCH: usize = 4;

fuzz_target!(|data: &[u8]| {
    let pairs = data.first().is_some_and(|b| b & 1 == 1);
    let mut buf = BytesMut::from(data);
    let mut commands = Vec::new();
    while let Ok(Some(command)) = resp::parse(&mut buf) {
        commands.push(command);
        if commands.len() >= 64 {
            break;
        }
    }
    let mut operations: Vec<Bytes> = if pairs {
        commands.chunks(2).map(encode_operation).collect()
    } else {
        commands.chunks(1).map(encode_operation).collect()
    };
    operations.push(Bytes::copy_from_slice(&data[..data.len().min(32)]));
    let (mut a, mut b) = (RedisStore::new(), RedisStore::new());
    for (n, batch) in operations.chunks(BATCH).enumerate() {
        let context = BatchContext {
            index: 0,
            seqno: SeqNo(n as u64 + 1),
            time_us: 1_000_000 * (n as u64 + 1),
            seed: [n as u8; 32],
        };
        let requests: Vec<ServiceRequest> = batch
            .iter()
            .enumerate()
            .map(|(i, operation)| ServiceRequest {
                client: ClientId(i as u32 % CLIENTS),
                request_id: RequestId((n * BATCH + i) as u64 + 1),
                operation: operation.clone(),
            })
            .collect();
        execute_on_both(&mut a, &mut b, &context, &requests);
    }
    checkpoints_agree_and_restore(&a, &b, RedisStore::new);
});

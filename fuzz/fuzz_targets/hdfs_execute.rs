//! The HDFS NameNode executing what gateways and DataNodes sent: the bytes choose commands
//! (namespace operations on a few paths, writes with their block reports, DataNode
//! registrations, heartbeats, replica reports and bad-replica reports, each from the client it
//! needs) in batches with agreed time moving on past lease and DataNode deadlines, and every
//! batch ends with the raw bytes as an operation. Two replicas must agree on every reply, and a
//! checkpoint must restore to a NameNode with the same checkpoint.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use upright_fuzz::{batch, checkpoints_agree_and_restore, execute_on_both, requests};
use upright_hdfs::namenode::{BlockReport, Command};
use upright_hdfs::service::{encode, NameNodeService};

const BATCH: usize = 4;
const PATHS: [&str; 7] = ["/", "/a", "/a/b", "/a/b/c", "/d", "/a/e", "/d/f"];
const HOLDERS: [&str; 2] = ["gateway-1", "gateway-2"];
/// Where the NameNode starts numbering blocks.
const FIRST_BLOCK: u64 = 1 << 30;

/// A command from four bytes, with the client that sends it (DataNodes speak as themselves).
fn command(b: [u8; 4]) -> (u32, Command) {
    let path = |i: u8| PATHS[i as usize % PATHS.len()].to_string();
    let holder = HOLDERS[b[3] as usize % 2].to_string();
    let report = BlockReport {
        block: FIRST_BLOCK + u64::from(b[2] % 8),
        len: u64::from(b[3]) * 1000,
        hash: [b[3] % 4; 32],
    };
    let datanode = u32::from(b[1] % 4);
    let gateway = 10;
    let c = match b[0] % 20 {
        0 => Command::Mkdirs {
            path: path(b[1]),
            permission: None,
            user: "u".into(),
        },
        1 => Command::Create {
            path: path(b[1]),
            overwrite: b[2] & 1 == 1,
            replication: Some(u16::from(b[2] % 4)),
            block_size: None,
            permission: Some(u16::from(b[3]) * 7),
            user: "u".into(),
            holder,
        },
        2 => Command::Append {
            path: path(b[1]),
            holder,
        },
        3 => Command::AddBlock {
            path: path(b[1]),
            holder,
            previous: (b[2] & 8 == 0).then_some(report),
        },
        4 => Command::Complete {
            path: path(b[1]),
            holder,
            last: (b[2] & 8 == 0).then_some(report),
        },
        5 => Command::RenewLease { holder },
        6 => Command::GetFileStatus { path: path(b[1]) },
        7 => Command::ListStatus {
            path: path(b[1]),
            after: (b[2] & 1 == 1).then(|| "b".into()),
        },
        8 => Command::GetContentSummary { path: path(b[1]) },
        9 => Command::GetBlockLocations { path: path(b[1]) },
        10 => Command::Delete {
            path: path(b[1]),
            recursive: b[2] & 1 == 1,
        },
        11 => Command::Rename {
            src: path(b[1]),
            dst: path(b[2]),
        },
        12 => Command::SetPermission {
            path: path(b[1]),
            permission: u16::from_le_bytes([b[2], b[3]]),
        },
        13 => Command::SetOwner {
            path: path(b[1]),
            owner: Some("o".into()),
            group: None,
        },
        14 => Command::SetReplication {
            path: path(b[1]),
            replication: u16::from(b[2] % 5),
        },
        15 => {
            return (
                datanode,
                Command::RegisterDataNode {
                    id: datanode,
                    addr: format!("dn{datanode}:1"),
                    capacity: 1 << 30,
                },
            )
        }
        16 => return (datanode, Command::Heartbeat { id: datanode, used: 0 }),
        17 => return (datanode, Command::BlockReceived { id: datanode, report }),
        18 => Command::BadReplica {
            block: report.block,
            datanode,
        },
        _ => Command::ListDataNodes,
    };
    (gateway, c)
}

fuzz_target!(|data: &[u8]| {
    let (mut a, mut b) = (NameNodeService::new(), NameNodeService::new());
    let mut request_id = 0u64;
    // Seven seconds of agreed time a batch: DataNodes die and leases run out.
    let mut run = |a: &mut NameNodeService, b: &mut NameNodeService, n: u64, operations: Vec<(u32, Bytes)>| {
        execute_on_both(a, b, &batch(n, 7_000_000), &requests(&mut request_id, operations));
    };
    let mut operations = Vec::new();
    let mut n = 1;
    for chunk in data.chunks_exact(4) {
        let (client, c) = command(chunk.try_into().expect("4 bytes"));
        operations.push((client, encode(&c)));
        if operations.len() == BATCH {
            run(&mut a, &mut b, n, std::mem::take(&mut operations));
            n += 1;
        }
    }
    operations.push((10, Bytes::copy_from_slice(&data[..data.len().min(32)])));
    run(&mut a, &mut b, n, operations);
    checkpoints_agree_and_restore(&a, &b, NameNodeService::new);
});

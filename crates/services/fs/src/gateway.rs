//! The NFS gateway: serves NFS version 3 and MOUNT version 3 clients on one TCP port (so a
//! client needs no portmapper: libnfs URLs `nfs://HOST/?nfsport=P&mountport=P&version=3`) as an
//! upright client of the cluster.
//!
//! Each connection reads RPC records (record marking, RFC 5531 section 11) and keeps many calls
//! outstanding. NULL, MOUNT and the RPC-level refusals are answered here; every other NFS call
//! goes to the cluster through the platform's pool ([`upright_node::gateway::Pool`]), which packs
//! the calls of many connections into one operation. Calls that only read take the read-only path
//! (every execution replica must agree, else the pool's client orders them). Replies are written
//! in the order the calls came, which NFS clients accept (they match replies by xid).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;
use upright_node::client::ClientHandle;
use upright_node::gateway::tls::{Accepted as Incoming, GatewayListener, WriteHalf};
use upright_node::gateway::{Pool, Protocol, Queue};

use crate::nfs3::{
    mountproc3, proc3, MNT3ERR_SERVERFAULT, MNT3_OK, MOUNT_PROGRAM, MOUNT_VERSION, NFS_PROGRAM, NFS_VERSION, PATH_MAX,
};
use crate::procedures::{self, Reply};
use crate::rpc::{self, Accepted, Records, AUTH_NONE, AUTH_SYS};
use crate::service::{self, CALLS_PER_OPERATION_MAX, OPERATION_CALL_BYTES_MAX};
use crate::xdr::{Reader, Writer};

/// Calls of one connection read but not yet answered; the connection reads no further until
/// one is answered.
pub const IN_FLIGHT_MAX: usize = 256;
/// Most simultaneous connections; further ones are closed at once.
pub const CONNECTIONS_MAX: u64 = 1024;
/// How long the gateway waits for the cluster to answer an operation.
pub const OPERATION_TIMEOUT: Duration = Duration::from_secs(30);
/// Bytes of a connection's calls waiting for the pool before it reads more (a client streaming
/// WRITEs keeps this much ahead of the cluster).
pub const UNSENT_BYTES_MAX: usize = 4 << 20;

/// NFS calls as upright operations.
pub struct Nfs;

impl Protocol for Nfs {
    /// One call: `procedures::operation(procedure, credential, arguments)`.
    type Command = Bytes;
    /// Its reply, or why the cluster did not answer.
    type Answer = Result<Reply, String>;
    const COMMANDS_MAX: usize = CALLS_PER_OPERATION_MAX;
    const BYTES_MAX: usize = OPERATION_CALL_BYTES_MAX;

    fn command_bytes(call: &Bytes) -> usize {
        call.len() + 8
    }

    fn encode(calls: &[Bytes]) -> Bytes {
        service::encode_calls(calls)
    }

    fn decode(result: &[u8], _calls: usize) -> Option<Vec<Self::Answer>> {
        Some(service::decode_replies(result).ok()?.into_iter().map(Ok).collect())
    }

    fn failed(why: &str) -> Self::Answer {
        Err(why.to_string())
    }
}

/// What a connection owes, in call order.
enum Owed {
    /// A reply made here (a record, not yet framed).
    Local(Bytes),
    /// The cluster's answer to the call with this xid, from the connection's queue.
    Cluster(u32),
    /// The cluster's answer to a MOUNT MNT of a directory below the root (`MOUNT_RESOLVE`).
    Mount(u32),
}

struct Shared {
    pool: Pool<Nfs>,
    root: Bytes,
    connections: AtomicU64,
}

/// Serves NFS and MOUNT clients on `listener` through `clients` (upright client identities of a
/// cluster running [`crate::service::FsService`]) until the listener fails.
pub async fn serve(listener: impl Into<GatewayListener>, clients: Vec<ClientHandle>) -> std::io::Result<()> {
    let listener = listener.into();
    let root = procedures::root_handle(&crate::fs::FileSystem::new()).expect("a new file system has its root");
    let shared = Arc::new(Shared {
        pool: Pool::start(clients, OPERATION_TIMEOUT),
        root: Bytes::copy_from_slice(&root),
        connections: AtomicU64::new(0),
    });
    loop {
        let stream = listener.accept().await?;
        if shared.connections.load(Ordering::Relaxed) >= CONNECTIONS_MAX {
            drop(stream);
            continue;
        }
        shared.connections.fetch_add(1, Ordering::Relaxed);
        let shared = shared.clone();
        tokio::spawn(async move {
            connection(stream, &shared).await;
            shared.connections.fetch_sub(1, Ordering::Relaxed);
        });
    }
}

async fn connection(accepted: Incoming, shared: &Arc<Shared>) {
    let Ok((mut read, write)) = accepted.open().await else {
        return;
    };
    let queue: Arc<Queue<Nfs>> = Arc::new(Queue::default());
    let (owed_tx, owed_rx) = mpsc::channel(IN_FLIGHT_MAX);
    let writer = tokio::spawn(write_replies(write, owed_rx, queue.clone()));
    let mut records = Records::default();
    let mut header = [0u8; 4];
    'read: loop {
        if read.read_exact(&mut header).await.is_err() {
            break;
        }
        let header = u32::from_be_bytes(header);
        let Ok(len) = records.fragment_len(header) else { break };
        let mut data = vec![0u8; len];
        if read.read_exact(&mut data).await.is_err() {
            break;
        }
        let record = match records.fragment(header, &data) {
            Ok(Some(record)) => record,
            Ok(None) => continue,
            Err(_) => break,
        };
        let owed = match rpc::decode_call(&record) {
            Ok((call, args)) => handle(shared, &queue, &call, args),
            Err(error) => match rpc::denied_reply(error) {
                Some(reply) => Owed::Local(reply),
                None if error == rpc::CallError::NotACall => continue,
                None => break 'read,
            },
        };
        if owed_tx.send(owed).await.is_err() {
            break;
        }
        queue.unsent_below(UNSENT_BYTES_MAX).await;
    }
    queue.closed();
    drop(owed_tx);
    let _ = writer.await;
}

/// Answers a call here or hands it to the cluster.
fn handle(shared: &Shared, queue: &Arc<Queue<Nfs>>, call: &rpc::Call, args: &[u8]) -> Owed {
    let local = |stat: Accepted, result: &[u8]| {
        let mut w = rpc::accepted_reply(call.xid, stat);
        w.raw(result);
        Owed::Local(w.finish())
    };
    match call.program {
        NFS_PROGRAM if call.version != NFS_VERSION => local(
            Accepted::ProgMismatch {
                low: NFS_VERSION,
                high: NFS_VERSION,
            },
            &[],
        ),
        NFS_PROGRAM if call.procedure == proc3::NULL => local(Accepted::Success, &[]),
        NFS_PROGRAM if call.procedure >= proc3::COUNT => local(Accepted::ProcUnavail, &[]),
        NFS_PROGRAM => {
            let op = procedures::operation(call.procedure, &call.credential, args);
            shared
                .pool
                .submit(queue, &mut vec![op], procedures::is_read_only(call.procedure));
            Owed::Cluster(call.xid)
        }
        MOUNT_PROGRAM if call.version != MOUNT_VERSION => local(
            Accepted::ProgMismatch {
                low: MOUNT_VERSION,
                high: MOUNT_VERSION,
            },
            &[],
        ),
        MOUNT_PROGRAM if call.procedure == mountproc3::MNT => match Reader::new(args).string(PATH_MAX) {
            Ok(path) if path.split('/').all(|c| c.is_empty() || c == ".") => {
                local(Accepted::Success, &mount_ok(&shared.root))
            }
            Ok(path) => {
                let mut w = Writer::new();
                w.string(path);
                let op = procedures::operation(procedures::MOUNT_RESOLVE, &call.credential, &w.finish());
                shared.pool.submit(queue, &mut vec![op], true);
                Owed::Mount(call.xid)
            }
            Err(_) => local(Accepted::GarbageArgs, &[]),
        },
        MOUNT_PROGRAM => match mount(call.procedure, args) {
            Some(result) => local(Accepted::Success, &result),
            None if call.procedure > mountproc3::EXPORT => local(Accepted::ProcUnavail, &[]),
            None => local(Accepted::GarbageArgs, &[]),
        },
        _ => local(Accepted::ProgUnavail, &[]),
    }
}

/// MNT's success result for the directory with `handle`: the handle and the flavors taken.
fn mount_ok(handle: &[u8]) -> Bytes {
    let mut w = Writer::new();
    w.u32(MNT3_OK).opaque(handle).u32(2).u32(AUTH_SYS).u32(AUTH_NONE);
    w.finish()
}

/// MNT's result from the cluster's answer to `MOUNT_RESOLVE`.
fn mount_result(answer: &Result<Reply, String>) -> (Accepted, Bytes) {
    let Ok(Reply::Result(result)) = answer else {
        return (Accepted::SystemErr, Bytes::new());
    };
    let mut r = Reader::new(result);
    let status = r.u32().unwrap_or(u32::MAX);
    let mut w = Writer::new();
    match (status, r.opaque(crate::nfs3::FHSIZE3)) {
        (0, Ok(handle)) => return (Accepted::Success, mount_ok(handle)),
        // mountstat3 shares these values with nfsstat3 (NOENT, ACCES, NOTDIR, NAMETOOLONG).
        (2 | 13 | 20 | 63, _) => w.u32(status),
        _ => w.u32(MNT3ERR_SERVERFAULT),
    };
    (Accepted::Success, w.finish())
}

/// MOUNT version 3's procedures other than MNT (the export is `/`; any directory below it may be
/// mounted too). `None`: the arguments do not decode or the procedure is unknown.
fn mount(procedure: u32, args: &[u8]) -> Option<Bytes> {
    let mut w = Writer::new();
    match procedure {
        mountproc3::NULL | mountproc3::UMNTALL => {}
        // No list of mounts is kept (the replicas would have to agree on it for nothing).
        mountproc3::DUMP => {
            w.bool(false);
        }
        mountproc3::UMNT => {
            Reader::new(args).string(PATH_MAX).ok()?;
        }
        mountproc3::EXPORT => {
            // One export, "/", open to every host (no groups).
            w.bool(true).string("/").bool(false).bool(false);
        }
        _ => return None,
    }
    Some(w.finish())
}

/// Writes what the connection owes, in order: local replies at once, the cluster's when they
/// come.
async fn write_replies(mut write: WriteHalf, mut owed: mpsc::Receiver<Owed>, queue: Arc<Queue<Nfs>>) {
    while let Some(next) = owed.recv().await {
        let record = match next {
            Owed::Local(record) => record,
            Owed::Mount(xid) => {
                let (stat, result) = mount_result(&queue.next_reply().await);
                let mut w = rpc::accepted_reply(xid, stat);
                w.raw(&result);
                w.finish()
            }
            Owed::Cluster(xid) => {
                let (stat, result) = match queue.next_reply().await {
                    Ok(Reply::Result(result)) => (Accepted::Success, result),
                    Ok(Reply::ProcUnavail) => (Accepted::ProcUnavail, Bytes::new()),
                    Ok(Reply::GarbageArgs) => (Accepted::GarbageArgs, Bytes::new()),
                    Err(_) => (Accepted::SystemErr, Bytes::new()),
                };
                let mut w = rpc::accepted_reply(xid, stat);
                w.raw(&result);
                w.finish()
            }
        };
        if write.write_all(&rpc::frame(&record)).await.is_err() {
            return;
        }
        // Flushed when nothing else is owed yet (a TLS record then goes out).
        if owed.is_empty() && write.flush().await.is_err() {
            return;
        }
    }
}

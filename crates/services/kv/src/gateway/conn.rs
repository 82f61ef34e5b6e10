//! One client connection: a reader that parses commands, answers the gateway's own and queues the
//! rest for the cluster, and a writer that answers them all in the order sent.

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::TcpStream;
use tokio::sync::mpsc::{self, error::TryRecvError, error::TrySendError};

use super::local::{self, Session};
use super::{is_read, Queue, Shared};
use crate::command::{self, Place};
use crate::reply::Reply;
use crate::resp;

/// Most answers a connection may owe (a pipelining client waits when it is reached); this also
/// bounds its commands and replies held by the pool.
pub const PENDING_MAX: usize = 1024;
/// Read buffer growth step.
const READ_CHUNK: usize = 16 * 1024;
/// Answers are written once this many bytes are encoded, or when nothing more is ready.
const WRITE_CHUNK: usize = 64 * 1024;

/// An answer owed to the client, in order.
enum Pending {
    /// Already known (local command or error), encoded.
    Ready(Vec<u8>),
    /// The cluster's next reply for this connection, to be encoded with this protocol version.
    Cluster(u8),
    /// Close after everything before it is written.
    Close,
}

/// The commands read but not yet handed to the pool (handed over once the read buffer holds no
/// further complete command, so one read's pipeline goes to the cluster together).
struct Batch {
    commands: Vec<Vec<Bytes>>,
    reads_only: bool,
}

impl Batch {
    fn submit(&mut self, shared: &Shared, queue: &Arc<Queue>) {
        shared.pool.submit(queue, &mut self.commands, self.reads_only);
        self.reads_only = true;
    }
}

pub(super) async fn run(stream: TcpStream, id: u64, shared: Arc<Shared>) {
    let _ = stream.set_nodelay(true);
    let (mut read, write) = stream.into_split();
    let queue = Arc::new(Queue::default());
    let (tx, rx) = mpsc::channel(PENDING_MAX);
    let writer = tokio::spawn(write_answers(write, rx, queue.clone()));
    let mut session = Session::new(id);
    let mut buf = BytesMut::with_capacity(READ_CHUNK);
    let mut batch = Batch {
        commands: Vec::new(),
        reads_only: true,
    };
    'conn: loop {
        loop {
            let (pending, close) = match resp::parse(&mut buf) {
                Ok(Some(argv)) => dispatch(argv, &mut session, &mut batch, &shared),
                Ok(None) => break,
                Err(e) => {
                    Shared::bump(&shared.protocol_errors);
                    (Pending::Ready(Reply::Error(e.0).to_resp(session.proto)), true)
                }
            };
            // Never wait for room while holding back commands whose answers the writer awaits.
            let pending = match tx.try_send(pending) {
                Ok(()) => None,
                Err(TrySendError::Full(pending)) => Some(pending),
                Err(TrySendError::Closed(_)) => break 'conn,
            };
            if let Some(pending) = pending {
                batch.submit(&shared, &queue);
                if tx.send(pending).await.is_err() {
                    break 'conn;
                }
            }
            if close {
                let _ = tx.send(Pending::Close).await;
                break 'conn;
            }
        }
        batch.submit(&shared, &queue);
        buf.reserve(READ_CHUNK);
        match read.read_buf(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => upright_node::timeline::event("gateway-read", n as u64, id, 0),
        }
    }
    batch.submit(&shared, &queue); // commands sent before a QUIT or a protocol error still run
    queue.closed();
    drop(tx);
    let _ = writer.await;
}

/// Answers a gateway command or queues a cluster command in `batch`; the flag asks to close the
/// connection after the answer.
fn dispatch(argv: Vec<Bytes>, session: &mut Session, batch: &mut Batch, shared: &Shared) -> (Pending, bool) {
    Shared::bump(&shared.commands);
    match command::check(&argv) {
        Err(reply) => (Pending::Ready(reply.to_resp(session.proto)), false),
        Ok(spec) if spec.place == Place::Gateway => {
            let (reply, close) = local::answer(session, spec.name, &argv, shared);
            (Pending::Ready(reply.to_resp(session.proto)), close)
        }
        Ok(spec) => {
            batch.reads_only &= is_read(spec);
            batch.commands.push(argv);
            (Pending::Cluster(session.proto), false)
        }
    }
}

/// Writes the answers in order: everything ready is encoded into one buffer and written with one
/// call; it waits (after writing what it has) only for a reply the cluster has not given yet.
async fn write_answers(mut write: OwnedWriteHalf, mut rx: mpsc::Receiver<Pending>, queue: Arc<Queue>) {
    let mut out = Vec::with_capacity(WRITE_CHUNK);
    loop {
        let pending = match rx.try_recv() {
            Ok(pending) => pending,
            Err(TryRecvError::Disconnected) => break,
            Err(TryRecvError::Empty) => {
                if flush(&mut write, &mut out).await.is_err() {
                    return;
                }
                match rx.recv().await {
                    Some(pending) => pending,
                    None => break,
                }
            }
        };
        match pending {
            Pending::Ready(bytes) => out.extend_from_slice(&bytes),
            Pending::Cluster(proto) => {
                let reply = match queue.try_reply() {
                    Some(reply) => reply,
                    None => {
                        if flush(&mut write, &mut out).await.is_err() {
                            return;
                        }
                        queue.next_reply().await
                    }
                };
                reply.write(proto, &mut out);
            }
            Pending::Close => break,
        }
        if out.len() >= WRITE_CHUNK && flush(&mut write, &mut out).await.is_err() {
            return;
        }
    }
    let _ = flush(&mut write, &mut out).await;
    let _ = write.shutdown().await;
}

async fn flush(write: &mut OwnedWriteHalf, out: &mut Vec<u8>) -> std::io::Result<()> {
    if !out.is_empty() {
        write.write_all(out).await?;
        upright_node::timeline::event("gateway-write", out.len() as u64, 0, 0);
        out.clear();
    }
    Ok(())
}

//! One client connection: a reader that parses commands and dispatches them in order, and a
//! writer that answers them in the same order.

use std::sync::Arc;

use bytes::BytesMut;
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufWriter};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};

use super::local::{self, Session};
use super::pool::Job;
use super::Shared;
use crate::command::{self, Place};
use crate::reply::Reply;
use crate::resp;

/// Most answers a connection may owe (a pipelining client waits when it is reached).
pub const PENDING_MAX: usize = 1024;
/// Read buffer growth step.
const READ_CHUNK: usize = 16 * 1024;

/// An answer owed to the client, in order.
enum Pending {
    /// Already known (local command or error), encoded.
    Ready(Vec<u8>),
    /// From the cluster, to be encoded with this protocol version.
    Wait(oneshot::Receiver<Reply>, u8),
    /// Close after everything before it is written.
    Close,
}

pub(super) async fn run(stream: TcpStream, id: u64, worker: mpsc::Sender<Job>, shared: Arc<Shared>) {
    let _ = stream.set_nodelay(true);
    let (mut read, write) = stream.into_split();
    let (tx, rx) = mpsc::channel(PENDING_MAX);
    let writer = tokio::spawn(write_answers(write, rx));
    let mut session = Session::new(id);
    let mut buf = BytesMut::with_capacity(READ_CHUNK);
    'conn: loop {
        loop {
            let argv = match resp::parse(&mut buf) {
                Ok(Some(argv)) => argv,
                Ok(None) => break,
                Err(e) => {
                    Shared::bump(&shared.protocol_errors);
                    let _ = tx.send(Pending::Ready(Reply::Error(e.0).to_resp(session.proto))).await;
                    let _ = tx.send(Pending::Close).await;
                    break 'conn;
                }
            };
            Shared::bump(&shared.commands);
            let pending = match command::check(&argv) {
                Err(reply) => Pending::Ready(reply.to_resp(session.proto)),
                Ok(spec) if spec.place == Place::Gateway => {
                    let (reply, close) = local::answer(&mut session, spec.name, &argv, &shared);
                    let ready = Pending::Ready(reply.to_resp(session.proto));
                    if close {
                        let _ = tx.send(ready).await;
                        let _ = tx.send(Pending::Close).await;
                        break 'conn;
                    }
                    ready
                }
                Ok(_) => {
                    let (reply, rx) = oneshot::channel();
                    if worker.send(Job { argv, reply }).await.is_err() {
                        break 'conn;
                    }
                    Pending::Wait(rx, session.proto)
                }
            };
            if tx.send(pending).await.is_err() {
                break 'conn;
            }
        }
        buf.reserve(READ_CHUNK);
        match read.read_buf(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
    }
    drop(tx);
    let _ = writer.await;
}

async fn write_answers(write: OwnedWriteHalf, mut rx: mpsc::Receiver<Pending>) {
    let mut out = BufWriter::with_capacity(64 * 1024, write);
    while let Some(pending) = rx.recv().await {
        let bytes = match pending {
            Pending::Ready(bytes) => bytes,
            Pending::Wait(reply, proto) => match reply.await {
                Ok(reply) => reply.to_resp(proto),
                Err(_) => Reply::err("ERR upright: gateway stopped").to_resp(proto),
            },
            Pending::Close => break,
        };
        if out.write_all(&bytes).await.is_err() {
            return;
        }
        if rx.is_empty() && out.flush().await.is_err() {
            return;
        }
    }
    let _ = out.flush().await;
    let _ = out.shutdown().await;
}

//! The Redis-protocol gateway: accepts RESP2/RESP3 connections and is an upright client (the
//! UpRight client shim, run beside the applications that trust it).
//!
//! Concurrency: a small pool of upright clients (`pool`), one per client identity given, serving
//! one list of connections with commands waiting. An idle pool member sends everything the waiting
//! connections queued as one upright operation (a batch of commands) and waits for the
//! quorum-certified result; a connection is in at most one operation at a time, so its commands,
//! pipelined or not, execute and are answered in the order sent, and one agreement round serves
//! many commands of many connections. Upright clients are closed-loop (one outstanding request
//! each), so the pool size bounds the operations in flight, not the connections. After an
//! answer, a member gives the connections it answered a moment (woken by their submissions,
//! bounded by `pool::GATHER_WAIT`) to queue their next commands, so they ride the next
//! operation together instead of taking turns.
//!
//! Reads: an operation made only of reads (GET, MGET, EXISTS, TTL, SCAN, ...; classified in one
//! place, [`pool::is_read`]) takes the read-only path: every execution member answers it from its
//! current state and the client accepts the answer only if all of them match; otherwise (a
//! member slow, down or lying) the same operation is ordered. An operation with any write is
//! ordered.

mod conn;
mod local;
mod pool;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::net::TcpListener;
use upright_node::client::ClientHandle;

pub use pool::{is_read, Pool, Queue};

/// Most simultaneous connections; further ones are closed at once.
pub const CONNECTIONS_MAX: u64 = 4096;
/// How long the gateway waits for the cluster to answer an operation.
pub const OPERATION_TIMEOUT: Duration = Duration::from_secs(30);

/// Counters shared by the gateway's connections (for INFO).
#[derive(Debug)]
pub struct Shared {
    started: Instant,
    port: u16,
    pool_size: usize,
    connected: AtomicU64,
    total_connections: AtomicU64,
    commands: AtomicU64,
    operations: AtomicU64,
    rejected: AtomicU64,
    protocol_errors: AtomicU64,
}

impl Shared {
    fn bump(counter: &AtomicU64) -> u64 {
        counter.fetch_add(1, Ordering::Relaxed) + 1
    }
}

/// Serves Redis clients on `listener` until the task is dropped, with one pool member per
/// upright client handle (each handle must be a distinct client identity).
pub async fn serve(listener: TcpListener, clients: Vec<ClientHandle>) -> std::io::Result<()> {
    assert!(!clients.is_empty(), "the gateway needs at least one upright client");
    let port = listener.local_addr()?.port();
    let shared = Arc::new(Shared {
        started: Instant::now(),
        port,
        pool_size: clients.len(),
        connected: AtomicU64::new(0),
        total_connections: AtomicU64::new(0),
        commands: AtomicU64::new(0),
        operations: AtomicU64::new(0),
        rejected: AtomicU64::new(0),
        protocol_errors: AtomicU64::new(0),
    });
    let pool = Arc::new(Pool::start(clients, shared.clone()));
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                tracing::warn!("gateway accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        if shared.connected.load(Ordering::Relaxed) >= CONNECTIONS_MAX {
            Shared::bump(&shared.rejected);
            drop(stream);
            continue;
        }
        let id = Shared::bump(&shared.total_connections);
        let pool = pool.clone();
        let shared = shared.clone();
        tokio::spawn(async move {
            Shared::bump(&shared.connected);
            conn::run(stream, id, pool, shared.clone()).await;
            shared.connected.fetch_sub(1, Ordering::Relaxed);
        });
    }
}

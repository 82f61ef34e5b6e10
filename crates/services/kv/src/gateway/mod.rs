//! The Redis-protocol gateway: accepts RESP2/RESP3 connections and is an upright client (the
//! UpRight client shim, run beside the applications that trust it).
//!
//! Concurrency: a small pool of upright clients ([`upright_node::gateway::Pool`], shared by every
//! gateway), one per client identity given, serving
//! one list of connections with commands waiting. An idle pool member sends everything the waiting
//! connections queued as one upright operation (a batch of commands) and waits for the
//! quorum-certified result; a connection is in at most one operation at a time, so its commands,
//! pipelined or not, execute and are answered in the order sent, and one agreement round serves
//! many commands of many connections. Upright clients are closed-loop (one outstanding request
//! each), so the pool size bounds the operations in flight, not the connections. After an
//! answer, a member gives the connections it answered a moment (woken by their submissions,
//! bounded by [`upright_node::gateway::pool::GATHER_WAIT`]) to queue their next commands, so they ride the next
//! operation together instead of taking turns.
//!
//! Reads: an operation made only of reads (GET, MGET, EXISTS, TTL, SCAN, ...; classified in one
//! place, [`is_read`]) takes the read-only path: every execution member answers it from its
//! current state and the client accepts the answer only if all of them match; otherwise (a
//! member slow, down or lying) the same operation is ordered. An operation with any write is
//! ordered.

mod blocked;
mod conn;
mod local;
mod pubsub;
mod stats;
pub mod users;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use upright_node::client::{ClientHandle, PushEvent};
use upright_node::gateway::tls::GatewayListener;
use upright_node::gateway::{Pool, Protocol};

use crate::command::CommandSpec;
use crate::reply::Reply;
use crate::COMMANDS_PER_OPERATION_MAX;

/// Most argument bytes of one operation (below the cluster's `request_bytes_max` default of
/// 1 MiB, with room for the encoding's overhead; one command is at most
/// [`crate::resp::COMMAND_BYTES_MAX`]).
pub const OPERATION_ARG_BYTES_MAX: usize = 768 * 1024;

/// Whether a command only reads the store. The one place the gateway classifies commands as
/// reads or writes.
pub fn is_read(spec: &CommandSpec) -> bool {
    spec.is_read()
}

/// How Redis commands travel through the gateway pool: a command is its argument vector, an
/// operation the postcard-encoded list of them ([`crate::encode_operation`]), its result the list
/// of their replies.
pub struct Redis;

impl Protocol for Redis {
    type Command = Vec<Bytes>;
    type Answer = Reply;
    const COMMANDS_MAX: usize = COMMANDS_PER_OPERATION_MAX;
    const BYTES_MAX: usize = OPERATION_ARG_BYTES_MAX;

    /// Its arguments plus an allowance for the encoding.
    fn command_bytes(argv: &Vec<Bytes>) -> usize {
        argv.iter().map(|a| a.len() + 8).sum()
    }

    fn encode(commands: &[Vec<Bytes>]) -> Bytes {
        crate::encode_operation(commands)
    }

    fn decode(result: &[u8], _commands: usize) -> Option<Vec<Reply>> {
        crate::decode_replies(result)
    }

    fn failed(why: &str) -> Reply {
        Reply::err(format!("ERR upright: {why}"))
    }
}

/// A connection's queue in the Redis gateway's pool.
pub type Queue = upright_node::gateway::Queue<Redis>;

/// Most simultaneous connections; further ones are closed at once.
pub const CONNECTIONS_MAX: u64 = 4096;
/// How long the gateway waits for the cluster to answer an operation.
pub const OPERATION_TIMEOUT: Duration = Duration::from_secs(30);

/// Counters shared by the gateway's connections (for INFO).
#[derive(Debug)]
pub struct Shared {
    started: Instant,
    port: u16,
    /// The gateway's users, each with its own pool of upright clients.
    users: Vec<UserEntry>,
    connected: AtomicU64,
    total_connections: AtomicU64,
    commands: AtomicU64,
    rejected: AtomicU64,
    protocol_errors: AtomicU64,
    /// Connections waiting in blocking commands.
    blocked: Arc<blocked::Blocked>,
    /// INFO commandstats.
    stats: stats::CommandStats,
    /// This gateway's pub/sub subscriptions.
    hub: Arc<pubsub::Hub>,
    /// Bytes the connections buffer beyond their first MiB (large commands being read).
    buffered: std::sync::atomic::AtomicUsize,
}

/// A user with its pool.
struct UserEntry {
    /// Its name.
    pub(crate) name: String,
    password: Option<String>,
    pool: Pool<Redis>,
    commands: users::CommandSet,
}

impl std::fmt::Debug for UserEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UserEntry")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl Shared {
    /// The pool the gateway's own requests use (fetching kept replies, collecting blocked
    /// commands' replies): the first user's. A connection's commands use its user's.
    fn pool(&self) -> &Pool<Redis> {
        &self.users[0].pool
    }

    /// The user that authenticates with `name` and `password`, if any.
    fn authenticate(&self, name: &[u8], password: &[u8]) -> Option<usize> {
        self.users.iter().position(|u| {
            users::same_secret(u.name.as_bytes(), name)
                && u.password
                    .as_ref()
                    .is_some_and(|p| users::same_secret(p.as_bytes(), password))
        })
    }

    /// The user a new connection starts as: `default` if it needs no password.
    fn initial_user(&self) -> Option<usize> {
        self.users
            .iter()
            .position(|u| u.name == "default" && u.password.is_none())
    }

    fn bump(counter: &AtomicU64) -> u64 {
        counter.fetch_add(1, Ordering::Relaxed) + 1
    }
}

/// Serves Redis clients on `listener` until the task is dropped, with one pool member per
/// upright client handle (each handle must be a distinct client identity), to anyone (the
/// `default` user, no password, every command).
pub async fn serve(listener: impl Into<GatewayListener>, clients: Vec<ClientHandle>) -> std::io::Result<()> {
    serve_users(listener, vec![users::GatewayUser::open(clients)]).await
}

/// Serves Redis clients on `listener` until the task is dropped, for `users` (AUTH selects one;
/// each needs at least one upright client, and no two users may share one).
pub async fn serve_users(listener: impl Into<GatewayListener>, users: Vec<users::GatewayUser>) -> std::io::Result<()> {
    let listener = listener.into();
    assert!(
        !users.is_empty() && users.iter().all(|u| !u.clients.is_empty()),
        "every gateway user needs at least one upright client"
    );
    let port = listener.local_addr()?.port();
    let blocked = Arc::new(blocked::Blocked::default());
    let hub = Arc::new(pubsub::Hub::default());
    for client in users.iter().flat_map(|u| &u.clients) {
        watch_pushes(client, blocked.clone(), hub.clone());
    }
    let users = users
        .into_iter()
        .map(|u| UserEntry {
            name: u.name,
            password: u.password,
            pool: Pool::start(u.clients, OPERATION_TIMEOUT),
            commands: u.commands,
        })
        .collect();
    let shared = Arc::new(Shared {
        started: Instant::now(),
        port,
        users,
        connected: AtomicU64::new(0),
        total_connections: AtomicU64::new(0),
        commands: AtomicU64::new(0),
        rejected: AtomicU64::new(0),
        protocol_errors: AtomicU64::new(0),
        blocked,
        stats: stats::CommandStats::default(),
        hub,
        buffered: std::sync::atomic::AtomicUsize::new(0),
    });
    loop {
        let stream = match listener.accept().await {
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
        let shared = shared.clone();
        tokio::spawn(async move {
            Shared::bump(&shared.connected);
            conn::run(stream, id, shared.clone()).await;
            shared.connected.fetch_sub(1, Ordering::Relaxed);
        });
    }
}

/// Routes what the store pushes to `client` (blocked commands' tokens, pub/sub messages) to the
/// connections waiting for it, and first drops the waiters, watches and subscriptions a previous
/// gateway with this client identity left at the store.
fn watch_pushes(client: &ClientHandle, blocked: Arc<blocked::Blocked>, hub: Arc<pubsub::Hub>) {
    let stale = crate::encode_operation(&[vec![
        Bytes::from_static(b"upright.unblock-stale"),
        Bytes::copy_from_slice(blocked.prefix().as_bytes()),
    ]]);
    let handle = client.clone();
    tokio::spawn(async move {
        if let Err(e) = handle.invoke(stale, false).await {
            tracing::warn!("gateway could not drop its predecessor's blocked commands: {e}");
        }
    });
    let Some(mut pushes) = client.pushes() else {
        tracing::warn!("gateway client's pushes are taken elsewhere: blocking commands rely on polling");
        return;
    };
    tokio::spawn(async move {
        while let Some(event) = pushes.recv().await {
            match event {
                PushEvent::Message { payload, .. } => match crate::store::Pushed::decode(&payload) {
                    Some(crate::store::Pushed::Ready(token)) => blocked.pushed(&token),
                    Some(message) => hub.deliver(message),
                    None => tracing::warn!("gateway: undecodable push ({} bytes)", payload.len()),
                },
                PushEvent::Gap { .. } => blocked.wake_all(),
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classification() {
        assert!(is_read(crate::command::lookup(b"GET").unwrap()));
        assert!(is_read(crate::command::lookup(b"mget").unwrap()));
        assert!(!is_read(crate::command::lookup(b"set").unwrap()));
        assert!(!is_read(crate::command::lookup(b"getdel").unwrap()));
    }

    #[test]
    fn results_decode_and_failures_are_redis_errors() {
        let replies = vec![Reply::text("a"), Reply::text("b")];
        let bytes = crate::encode_replies(&replies);
        assert_eq!(Redis::decode(&bytes, 2), Some(replies));
        assert_eq!(Redis::decode(b"\xff\xff", 1), None);
        assert_eq!(
            Redis::failed("no result from the cluster (timed out)"),
            Reply::err("ERR upright: no result from the cluster (timed out)")
        );
    }
}

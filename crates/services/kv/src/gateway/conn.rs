//! One client connection: a reader that parses commands, answers the gateway's own and queues the
//! rest for the cluster, and a writer that answers them all in the order sent.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc::{self, error::TryRecvError, error::TrySendError};
use upright_node::gateway::tls::{Accepted, ReadHalf, WriteHalf};

use super::blocked::{Wait, POLL};
use super::local::{self, Session};
use super::local::{ReplyMode, Transaction};
use super::pubsub::{self, Outbox};
use super::users;
use super::{is_read, Queue, Shared};
use crate::command::{self, is, Place};
use crate::reply::Reply;
use crate::resp;
use crate::store::{MULTI_COMMANDS_MAX, PIECE_BYTES_MAX, STAGE_THRESHOLD};

/// Most answers a connection may owe (a pipelining client waits when it is reached); this also
/// bounds its commands and replies held by the pool.
pub const PENDING_MAX: usize = 1024;
/// Read buffer growth step.
const READ_CHUNK: usize = 16 * 1024;
/// What a connection may buffer without counting against [`BUFFERED_BYTES_MAX`].
const SMALL_BUFFER_BYTES: usize = 1 << 20;
/// Most bytes all connections together buffer beyond [`SMALL_BUFFER_BYTES`] each (large commands
/// being read); a connection that would pass it is refused and closed.
pub const BUFFERED_BYTES_MAX: usize = 2 << 30;
/// Largest read-buffer growth at once (reading a large command doubles the buffer up to this).
const MAX_READ_RESERVE: usize = 16 << 20;
/// Most bytes read ahead while the connection waits in a blocking command (Redis, too, reads
/// but does not run a blocked client's next commands).
const BLOCKED_READ_AHEAD_MAX: usize = 1 << 20;
/// Answers are written once this many bytes are encoded, or when nothing more is ready.
const WRITE_CHUNK: usize = 64 * 1024;

/// An answer owed to the client, in order.
enum Pending {
    /// Already known (local command or error), encoded.
    Ready(Vec<u8>),
    /// The cluster's next reply for this connection, to be encoded with this protocol version,
    /// for the command `name` read at `start` (INFO commandstats).
    Cluster(u8, &'static str, Instant),
    /// A blocking command's reply: the cluster's next reply for this connection, or, if the store
    /// says it waits, the reply collected once its token is pushed.
    Blocking {
        proto: u8,
        token: Bytes,
        wait: Arc<Wait>,
        name: &'static str,
        start: Instant,
    },
    /// EXEC's answer: the store's reply to the transaction, with the replies of the gateway's
    /// own commands put in their places among the store's.
    Exec { proto: u8, slots: Vec<Slot> },
    /// A command uploaded in `pieces` staged pieces: their replies (OK, or the first error,
    /// which is then the answer), then the run's reply.
    Staged {
        proto: u8,
        pieces: usize,
        name: &'static str,
        start: Instant,
    },
    /// Take the cluster's next reply for this connection and answer this instead (DISCARD,
    /// an aborted EXEC: the store forgot the connection's WATCH).
    Instead(Vec<u8>),
    /// Tell the reader that everything before is written (a user switch).
    Resume,
    /// Close after everything before it is written.
    Close,
}

/// Where one command of a transaction is answered.
enum Slot {
    /// By the gateway, with this reply.
    Local(Reply),
    /// By the store.
    Store,
    /// By the store, whose reply is replaced by this one (a subscription change: the store
    /// records it, the gateway confirms it).
    StoreAs(Reply),
}

/// What the reader does after a command.
enum Flow {
    Continue,
    /// Close after the answer.
    Close,
    /// A blocking command was sent: run nothing more until it is answered.
    Wait(Bytes, Arc<Wait>),
    /// The connection is now user N's: its next commands go through that user's pool, once
    /// everything before is answered.
    Switch(usize),
}

/// The commands read but not yet handed to the pool (handed over once the read buffer holds no
/// further complete command, so one read's pipeline goes to the cluster together).
struct Batch {
    commands: Vec<Vec<Bytes>>,
    reads_only: bool,
    /// The user whose pool (upright client identities) carries the commands.
    user: usize,
}

impl Batch {
    fn submit(&mut self, shared: &Shared, queue: &Arc<Queue>) {
        shared.users[self.user]
            .pool
            .submit(queue, &mut self.commands, self.reads_only);
        self.reads_only = true;
    }
}

pub(super) async fn run(accepted: Accepted, id: u64, shared: Arc<Shared>) {
    let (mut read, write) = match accepted.open().await {
        Ok(halves) => halves,
        Err(e) => {
            tracing::debug!("gateway connection {id} not set up: {e}");
            return;
        }
    };
    let queue = Arc::new(Queue::default());
    let (tx, rx) = mpsc::channel(PENDING_MAX);
    // The writer says here when it has answered a blocking command.
    let (resume_tx, mut resume_rx) = mpsc::channel(1);
    let (outbox, messages) = Outbox::new();
    let writer = tokio::spawn(write_answers(
        write,
        rx,
        queue.clone(),
        shared.clone(),
        resume_tx,
        (messages, outbox.clone()),
    ));
    let mut session = Session::new(id, outbox);
    // Bytes of `buf` counted in `shared.buffered`.
    let mut held = 0usize;
    let mut buf = BytesMut::with_capacity(READ_CHUNK);
    session.user = shared.initial_user();
    let mut batch = Batch {
        commands: Vec::new(),
        reads_only: true,
        user: session.user.unwrap_or(0),
    };
    'conn: loop {
        loop {
            let (pending, flow) = match resp::parse(&mut buf) {
                Ok(Some(argv)) => {
                    let subscription =
                        command::lookup(&argv[0]).is_some_and(|c| SUBSCRIPTION_COMMANDS.contains(&c.name));
                    let mode = session.reply;
                    let (pending, flow) = dispatch(argv, &mut session, &mut batch, &shared);
                    (as_client_reply_says(pending, mode, &mut session, subscription), flow)
                }
                Ok(None) => break,
                Err(e) => {
                    Shared::bump(&shared.protocol_errors);
                    (Pending::Ready(Reply::Error(e.0).to_resp(session.proto)), Flow::Close)
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
            match flow {
                Flow::Continue => {}
                Flow::Close => {
                    let _ = tx.send(Pending::Close).await;
                    break 'conn;
                }
                Flow::Switch(user) => {
                    // Everything before the switch is carried (and answered) under the previous
                    // user's identities before the next command goes under the new one's.
                    batch.submit(&shared, &queue);
                    if tx.send(Pending::Resume).await.is_err()
                        || !wait_for_answer(&mut read, &mut buf, &mut resume_rx).await
                    {
                        break 'conn;
                    }
                    batch.user = user;
                }
                Flow::Wait(token, wait) => {
                    batch.submit(&shared, &queue);
                    if !wait_for_answer(&mut read, &mut buf, &mut resume_rx).await {
                        // Closed while waiting: end the wait at the store (on this connection's
                        // queue, so it is ordered after the blocking command itself).
                        let mut drop = vec![vec![
                            Bytes::from_static(b"upright.unblock"),
                            token.clone(),
                            Bytes::from_static(b"drop"),
                        ]];
                        shared.pool().submit(&queue, &mut drop, false);
                        wait.closed.store(true, std::sync::atomic::Ordering::Relaxed);
                        wait.wake.notify_one();
                        shared.blocked.finish(&token);
                        break 'conn;
                    }
                }
            }
        }
        batch.submit(&shared, &queue);
        if let Some(spec) = streamable(&buf, &session, &shared) {
            // A large command the cluster may run as it is: streamed as it arrives.
            Shared::bump(&shared.commands);
            shared.stats.called(spec.name);
            let streamed = stream_staged(spec, session.proto, &mut read, &mut buf, &mut batch, &shared, &queue).await;
            let pending = match streamed {
                Streamed::Sent(pending) => pending,
                Streamed::Malformed(error) => {
                    Shared::bump(&shared.protocol_errors);
                    let _ = tx
                        .send(Pending::Ready(Reply::Error(error).to_resp(session.proto)))
                        .await;
                    let _ = tx.send(Pending::Close).await;
                    break;
                }
                Streamed::Closed => break,
            };
            let mode = session.reply;
            let pending = as_client_reply_says(pending, mode, &mut session, false);
            if tx.send(pending).await.is_err() {
                break;
            }
            continue;
        }
        // A command larger than an operation that is not streamed (in a transaction, blocking,
        // or refused before it runs) is read whole: what the gateway's connections hold beyond
        // the first MiB each is bounded together.
        let large = buf.len().saturating_sub(SMALL_BUFFER_BYTES);
        if large > held {
            let total = shared.buffered.fetch_add(large - held, Ordering::Relaxed) + large - held;
            held = large;
            if total > BUFFERED_BYTES_MAX {
                let refusal = Reply::err("ERR upright: the gateway holds too many large commands; try again");
                let _ = tx.send(Pending::Ready(refusal.to_resp(session.proto))).await;
                let _ = tx.send(Pending::Close).await;
                break;
            }
        } else if large < held {
            shared.buffered.fetch_sub(held - large, Ordering::Relaxed);
            held = large;
        }
        buf.reserve(READ_CHUNK.max(buf.len().min(MAX_READ_RESERVE)));
        match read.read_buf(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => upright_node::timeline::event("gateway-read", n as u64, id, 0),
        }
    }
    if let Some(token) = session.watch.take() {
        batch.commands.push(vec![Bytes::from_static(b"upright.unwatch"), token]);
        batch.reads_only = false;
    }
    let unsubscribe = pubsub::drop_all(
        &mut session.subs,
        id,
        &session.outbox,
        &shared.hub,
        shared.blocked.prefix(),
    );
    if !unsubscribe.is_empty() {
        batch.commands.extend(unsubscribe);
        batch.reads_only = false;
    }
    batch.submit(&shared, &queue); // commands sent before a QUIT or a protocol error still run
    shared.buffered.fetch_sub(held, Ordering::Relaxed);
    queue.closed();
    drop(tx);
    let _ = writer.await;
}

/// How far a connection streaming a large command may run ahead of the pieces the pool has sent.
const STREAM_AHEAD_BYTES: usize = 2 * PIECE_BYTES_MAX;

/// `upright.stage TOKEN OFFSET piece`.
fn stage_piece(token: &Bytes, offset: usize, piece: Bytes) -> Vec<Bytes> {
    vec![
        Bytes::from_static(b"upright.stage"),
        token.clone(),
        Bytes::from(offset.to_string()),
        piece,
    ]
}

/// The command at the front of `buf`, if it is to be streamed: more than [`STAGE_THRESHOLD`]
/// bytes of it arrived but not all, and it is one the cluster runs as it is (with the right
/// number of arguments, allowed to the user, outside a transaction and a RESP2 subscription, not
/// blocking and not one the gateway rewrites). Any other is read whole and answered as usual.
fn streamable(buf: &[u8], session: &Session, shared: &Shared) -> Option<&'static command::CommandSpec> {
    if buf.len() <= STAGE_THRESHOLD || session.multi.is_some() || (session.subs.count() > 0 && session.proto == 2) {
        return None;
    }
    let (argc, name) = resp::head(buf)?;
    let spec = command::lookup(name)?;
    let argc = i32::try_from(argc).ok()?;
    let arity = if spec.arity >= 0 {
        argc == spec.arity
    } else {
        argc >= -spec.arity
    };
    let allowed = session.user.is_some_and(|u| shared.users[u].commands.allows(spec.name));
    let plain = spec.place == Place::Replicated
        && !spec.flags.contains(&"blocking")
        && !SUBSCRIPTION_COMMANDS.contains(&spec.name)
        && !matches!(
            spec.name,
            "multi" | "exec" | "discard" | "watch" | "unwatch" | "reset" | "config" | "client"
        );
    (arity && allowed && plain).then_some(spec)
}

/// How streaming a command ended.
enum Streamed {
    /// All of it is staged and run: the answer owed.
    Sent(Pending),
    /// The client's bytes broke the protocol (the error to answer before closing).
    Malformed(String),
    /// The connection closed first.
    Closed,
}

/// Streams the command at the front of `buf` to the cluster as it arrives: each
/// [`PIECE_BYTES_MAX`] of its RESP bytes, checked as [`resp::parse`] checks them, is staged
/// (`upright.stage TOKEN OFFSET piece`) and the connection reads on once the pool has taken all
/// but [`STREAM_AHEAD_BYTES`] of them; the end is run (`upright.run TOKEN`). What the connection
/// holds stays about one piece, however large the command. A command cut short is dropped at
/// the store (`upright.drop TOKEN`, left in `batch` for the caller to send).
async fn stream_staged(
    spec: &'static command::CommandSpec,
    proto: u8,
    read: &mut ReadHalf,
    buf: &mut BytesMut,
    batch: &mut Batch,
    shared: &Shared,
    queue: &Arc<Queue>,
) -> Streamed {
    let start = Instant::now();
    let token = shared.blocked.new_token();
    let mut scan = resp::Scan::default();
    let (mut offset, mut pieces) = (0, 0);
    let drop_staged = |batch: &mut Batch| {
        batch
            .commands
            .push(vec![Bytes::from_static(b"upright.drop"), token.clone()]);
        batch.reads_only = false;
    };
    loop {
        let done = match scan.advance(buf) {
            Ok(done) => done,
            Err(e) => {
                drop_staged(batch);
                return Streamed::Malformed(e.0);
            }
        };
        while scan.scanned() >= PIECE_BYTES_MAX || (done && scan.scanned() > 0) {
            let n = scan.scanned().min(PIECE_BYTES_MAX);
            let piece = buf.split_to(n).freeze();
            scan.taken(n);
            batch.commands.push(stage_piece(&token, offset, piece));
            batch.reads_only = false;
            batch.submit(shared, queue);
            offset += n;
            pieces += 1;
            queue.unsent_below(STREAM_AHEAD_BYTES).await;
        }
        if done {
            break;
        }
        buf.reserve(PIECE_BYTES_MAX);
        match read.read_buf(buf).await {
            Ok(0) | Err(_) => {
                drop_staged(batch);
                return Streamed::Closed;
            }
            Ok(n) => upright_node::timeline::event("gateway-read", n as u64, 0, 0),
        }
    }
    batch.commands.push(vec![Bytes::from_static(b"upright.run"), token]);
    batch.reads_only = false;
    batch.submit(shared, queue);
    Streamed::Sent(Pending::Staged {
        proto,
        pieces,
        name: spec.name,
        start,
    })
}

/// Waits until the writer has answered the blocking command, reading ahead (without running)
/// what the client sends meanwhile; `false` if the connection closed first.
async fn wait_for_answer(read: &mut ReadHalf, buf: &mut BytesMut, resume: &mut mpsc::Receiver<()>) -> bool {
    loop {
        let room = buf.len() < BLOCKED_READ_AHEAD_MAX;
        if room {
            buf.reserve(READ_CHUNK);
        }
        tokio::select! {
            answered = resume.recv() => return answered.is_some(),
            n = read.read_buf(buf), if room => match n {
                Ok(0) | Err(_) => return false,
                Ok(_) => {}
            },
        }
    }
}

/// Answers a gateway command or queues a cluster command in `batch`.
fn dispatch(argv: Vec<Bytes>, session: &mut Session, batch: &mut Batch, shared: &Shared) -> (Pending, Flow) {
    Shared::bump(&shared.commands);
    let proto = session.proto;
    let ready = |reply: Reply| (Pending::Ready(reply.to_resp(proto)), Flow::Continue);
    let checked = command::check(&argv);
    let start = Instant::now();
    if let Ok(spec) = &checked {
        match session.user {
            None if !users::ALWAYS_ALLOWED.contains(&spec.name) => {
                return ready(Reply::err("NOAUTH Authentication required."));
            }
            Some(u) if !shared.users[u].commands.allows(spec.name) => {
                if let Some(tx) = session.multi.as_mut() {
                    tx.failed = true;
                }
                return ready(Reply::err(format!(
                    "NOPERM User {} has no permissions to run the '{}' command",
                    shared.users[u].name, spec.name
                )));
            }
            _ => {}
        }
        if spec.name == "auth" || (spec.name == "hello" && argv.iter().any(|a| is(a, "auth"))) {
            return authenticate(spec.name, argv, session, shared);
        }
        let subscribed = session.subs.count() > 0;
        let allowed = SUBSCRIPTION_COMMANDS.contains(&spec.name) || SUBSCRIBED_ALSO_ALLOWED.contains(&spec.name);
        if subscribed && proto == 2 && !allowed {
            return ready(Reply::err(format!(
                "ERR Can't execute '{}': only (P|S)SUBSCRIBE / (P|S)UNSUBSCRIBE / PING / QUIT / RESET are allowed in this context",
                spec.name
            )));
        }
        if subscribed && proto == 2 && spec.name == "ping" && session.multi.is_none() {
            let said = argv.get(1).cloned().unwrap_or_default();
            return ready(Reply::Array(vec![Reply::text("pong"), Reply::Bulk(said)]));
        }
    }
    match &checked {
        Ok(spec) => shared.stats.called(spec.name),
        Err(_) => {
            if let Some(spec) = command::lookup(&argv[0]) {
                shared.stats.rejected(spec.name);
            }
        }
    }
    if let Some(tx) = session.multi.as_mut() {
        match checked {
            Err(reply) => {
                tx.failed = true;
                return ready(reply);
            }
            Ok(spec) if spec.flags.contains(&"no-multi") => {
                tx.failed = true;
                return ready(Reply::err("ERR Command not allowed inside a transaction"));
            }
            Ok(spec) if !matches!(spec.name, "multi" | "exec" | "discard" | "watch" | "quit" | "reset") => {
                let bytes: usize = argv.iter().map(|a| a.len() + 8).sum();
                if tx.commands.len() >= MULTI_COMMANDS_MAX || tx.bytes + bytes > super::OPERATION_ARG_BYTES_MAX {
                    tx.failed = true;
                    return ready(Reply::err(format!(
                        "ERR upright: transaction too large (at most {MULTI_COMMANDS_MAX} commands and {} bytes)",
                        super::OPERATION_ARG_BYTES_MAX
                    )));
                }
                tx.bytes += bytes;
                tx.commands.push(argv);
                return ready(Reply::Status("QUEUED".into()));
            }
            Ok(_) => {}
        }
    }
    match checked {
        Err(reply) => ready(reply),
        Ok(spec) if SUBSCRIPTION_COMMANDS.contains(&spec.name) => {
            let (replies, command) = subscription(spec.name, &argv[1..], session, shared);
            let bytes = replies.iter().flat_map(|r| r.to_resp(proto)).collect();
            match command {
                Some(command) => {
                    batch.reads_only = false;
                    batch.commands.push(command);
                    (Pending::Instead(bytes), Flow::Continue)
                }
                None => (Pending::Ready(bytes), Flow::Continue),
            }
        }
        Ok(spec) if matches!(spec.name, "multi" | "exec" | "discard" | "watch" | "unwatch" | "reset") => {
            let (pending, flow) = transaction(spec.name, argv, session, batch, shared);
            if let Pending::Ready(bytes) = &pending {
                shared.stats.answered(spec.name, start, bytes.first() == Some(&b'-'));
            }
            (pending, flow)
        }
        Ok(spec)
            if spec.name == "config"
                && argv.len() >= 3
                && is(&argv[2], "notify-keyspace-events")
                && ((argv.len() == 3 && is(&argv[1], "get")) || (argv.len() == 4 && is(&argv[1], "set"))) =>
        {
            // Keyspace notifications are the store's to publish: their setting is agreed state.
            let mut command = vec![Bytes::from_static(b"upright.notify-config")];
            command.extend(argv.get(3).cloned());
            batch.reads_only = false;
            batch.commands.push(command);
            (Pending::Cluster(session.proto, spec.name, start), Flow::Continue)
        }
        Ok(spec) if spec.name == "client" && is(&argv[1], "reply") => {
            session.reply = match argv.get(2) {
                Some(m) if argv.len() == 3 && is(m, "on") => ReplyMode::On,
                Some(m) if argv.len() == 3 && is(m, "off") => ReplyMode::Off,
                Some(m) if argv.len() == 3 && is(m, "skip") => ReplyMode::SkipNext,
                _ => return ready(command::syntax_error()),
            };
            ready(Reply::ok())
        }
        Ok(spec) if spec.name == "client" && is(&argv[1], "unblock") => match client_unblock(&argv[2..], shared) {
            Ok(command) => {
                batch.reads_only = false;
                batch.commands.push(command);
                (Pending::Cluster(session.proto, spec.name, start), Flow::Continue)
            }
            Err(reply) => (Pending::Ready(reply.to_resp(session.proto)), Flow::Continue),
        },
        Ok(spec) if spec.place == Place::Gateway => {
            let (reply, close) = local::answer(session, spec.name, &argv, shared);
            session
                .outbox
                .proto
                .store(session.proto, std::sync::atomic::Ordering::Relaxed);
            shared
                .stats
                .answered(spec.name, start, matches!(reply, Reply::Error(_)));
            let flow = if close { Flow::Close } else { Flow::Continue };
            (Pending::Ready(reply.to_resp(session.proto)), flow)
        }
        Ok(spec) if spec.flags.contains(&"blocking") => {
            let (token, wait) = shared.blocked.register(session.id);
            let mut wrapped = Vec::with_capacity(argv.len() + 2);
            wrapped.push(Bytes::from_static(b"upright.block"));
            wrapped.push(token.clone());
            wrapped.extend(argv);
            batch.reads_only = false;
            batch.commands.push(wrapped);
            let pending = Pending::Blocking {
                proto: session.proto,
                token: token.clone(),
                wait: wait.clone(),
                name: spec.name,
                start,
            };
            (pending, Flow::Wait(token, wait))
        }
        Ok(spec) if argv.iter().map(Bytes::len).sum::<usize>() > STAGE_THRESHOLD => {
            // Too large for one operation: staged in pieces, then run whole.
            let token = shared.blocked.new_token();
            let encoded = Bytes::from(resp::encode_command(&argv));
            let pieces = encoded.len().div_ceil(PIECE_BYTES_MAX);
            for at in (0..encoded.len()).step_by(PIECE_BYTES_MAX) {
                let piece = encoded.slice(at..(at + PIECE_BYTES_MAX).min(encoded.len()));
                batch.commands.push(stage_piece(&token, at, piece));
            }
            batch.commands.push(vec![Bytes::from_static(b"upright.run"), token]);
            batch.reads_only = false;
            let pending = Pending::Staged {
                proto: session.proto,
                pieces,
                name: spec.name,
                start,
            };
            (pending, Flow::Continue)
        }
        Ok(spec) => {
            batch.reads_only &= is_read(spec);
            batch.commands.push(argv);
            (Pending::Cluster(session.proto, spec.name, start), Flow::Continue)
        }
    }
}

/// AUTH [user] password, or HELLO [protover [AUTH user password] [SETNAME name]]: the
/// connection becomes that user's.
fn authenticate(name: &str, argv: Vec<Bytes>, session: &mut Session, shared: &Shared) -> (Pending, Flow) {
    let proto = session.proto;
    let ready = |reply: Reply| (Pending::Ready(reply.to_resp(proto)), Flow::Continue);
    let (user, password, rest) = if name == "auth" {
        match &argv[1..] {
            [password] => (Bytes::from_static(b"default"), password.clone(), Vec::new()),
            [user, password] => (user.clone(), password.clone(), Vec::new()),
            _ => return ready(command::syntax_error()),
        }
    } else {
        let at = argv.iter().position(|a| is(a, "auth")).expect("checked");
        if at + 2 >= argv.len() {
            return ready(Reply::err("ERR Syntax error in HELLO option 'auth'"));
        }
        let mut rest = argv.clone();
        let taken: Vec<Bytes> = rest.drain(at..at + 3).collect();
        (taken[1].clone(), taken[2].clone(), rest)
    };
    if name == "auth" && argv.len() == 2 && shared.users.iter().all(|u| u.password.is_none()) {
        return ready(Reply::err(
            "ERR AUTH <password> called without any password configured for the default user. Are you sure your configuration is correct?",
        ));
    }
    let Some(u) = shared.authenticate(&user, &password) else {
        return ready(Reply::err(
            "WRONGPASS invalid username-password pair or user is disabled.",
        ));
    };
    session.user = Some(u);
    let reply = if name == "auth" {
        Reply::ok()
    } else {
        let (reply, _) = local::answer(session, "hello", &rest, shared);
        session.outbox.proto.store(session.proto, Ordering::Relaxed);
        reply
    };
    (Pending::Ready(reply.to_resp(session.proto)), Flow::Switch(u))
}

/// `pending` as CLIENT REPLY says after the command (`before`: the mode before it, which a
/// CLIENT REPLY command changes): written when replies are on (CLIENT REPLY ON answers OK; OFF
/// and SKIP answer nothing), not while skipping, SKIP covering only the one command after it.
/// Subscription confirmations (`pushes`) are pub/sub messages: written whatever it says, as Redis
/// does, in RESP2 too.
fn as_client_reply_says(pending: Pending, before: ReplyMode, session: &mut Session, pushes: bool) -> Pending {
    let silent = session.reply != ReplyMode::On;
    if before == ReplyMode::SkipNext && session.reply == ReplyMode::SkipNext {
        session.reply = ReplyMode::On; // the skipped command was this one
    }
    if silent && !pushes {
        silence(pending)
    } else {
        pending
    }
}

/// The answer of `pending` left unwritten (CLIENT REPLY OFF / SKIP); a cluster reply is still
/// taken, in order.
fn silence(pending: Pending) -> Pending {
    match pending {
        Pending::Ready(_) => Pending::Ready(Vec::new()),
        Pending::Cluster(..) | Pending::Exec { .. } | Pending::Instead(_) => Pending::Instead(Vec::new()),
        Pending::Staged {
            pieces, name, start, ..
        } => Pending::Staged {
            proto: 0, // 0: write nothing
            pieces,
            name,
            start,
        },
        other => other,
    }
}

/// The pub/sub commands a connection runs through [`pubsub::change`].
const SUBSCRIPTION_COMMANDS: &[&str] = &[
    "subscribe",
    "unsubscribe",
    "psubscribe",
    "punsubscribe",
    "ssubscribe",
    "sunsubscribe",
];

/// Besides [`SUBSCRIPTION_COMMANDS`], what a RESP2 connection with subscriptions may run
/// (Redis' "subscribed context").
const SUBSCRIBED_ALSO_ALLOWED: &[&str] = &["ping", "quit", "reset"];

/// A subscription change of this connection: its confirmations and the store command.
fn subscription(
    name: &str,
    args: &[Bytes],
    session: &mut Session,
    shared: &Shared,
) -> (Vec<Reply>, Option<Vec<Bytes>>) {
    // Sharded pub/sub is plain pub/sub here (the store is one shard).
    let name = match name {
        "ssubscribe" => "subscribe",
        "sunsubscribe" => "unsubscribe",
        other => other,
    };
    pubsub::change(
        name,
        args,
        &mut session.subs,
        session.id,
        &session.outbox,
        &shared.hub,
        shared.blocked.prefix(),
    )
}

/// MULTI, EXEC, DISCARD, WATCH, UNWATCH and RESET (which also ends a transaction and the
/// WATCH), outside a transaction being queued.
fn transaction(
    name: &str,
    argv: Vec<Bytes>,
    session: &mut Session,
    batch: &mut Batch,
    shared: &Shared,
) -> (Pending, Flow) {
    let proto = session.proto;
    let ready = |reply: Reply| (Pending::Ready(reply.to_resp(proto)), Flow::Continue);
    let send = |batch: &mut Batch, command: Vec<Bytes>| {
        batch.reads_only = false;
        batch.commands.push(command);
    };
    let unwatch = |token: Bytes| vec![Bytes::from_static(b"upright.unwatch"), token];
    match name {
        "multi" if session.multi.is_some() => ready(Reply::err("ERR MULTI calls can not be nested")),
        "multi" => {
            session.multi = Some(Transaction::default());
            ready(Reply::ok())
        }
        "watch" if session.multi.is_some() => ready(Reply::err("ERR WATCH inside MULTI is not allowed")),
        "watch" => {
            let token = session.watch.get_or_insert_with(|| shared.blocked.new_token()).clone();
            let mut command = vec![Bytes::from_static(b"upright.watch"), token];
            command.extend(argv.into_iter().skip(1));
            send(batch, command);
            (Pending::Cluster(proto, "watch", Instant::now()), Flow::Continue)
        }
        "unwatch" => match session.watch.take() {
            Some(token) => {
                send(batch, unwatch(token));
                (Pending::Cluster(proto, "unwatch", Instant::now()), Flow::Continue)
            }
            None => ready(Reply::ok()),
        },
        "exec" | "discard" if session.multi.is_none() => {
            ready(Reply::err(format!("ERR {} without MULTI", name.to_uppercase())))
        }
        "discard" | "reset" => {
            session.multi = None;
            if name == "reset" {
                let prefix = shared.blocked.prefix();
                for command in pubsub::drop_all(&mut session.subs, session.id, &session.outbox, &shared.hub, prefix) {
                    send(batch, command);
                }
            }
            let answer = if name == "reset" {
                let (reply, _) = local::answer(session, name, &argv, shared);
                session.user = shared.initial_user();
                reply
            } else {
                Reply::ok()
            };
            let (pending, flow) = match session.watch.take() {
                Some(token) => {
                    send(batch, unwatch(token));
                    (Pending::Instead(answer.to_resp(proto)), Flow::Continue)
                }
                None => ready(answer),
            };
            match (name, session.user) {
                ("reset", Some(u)) if u != batch.user => (pending, Flow::Switch(u)),
                _ => (pending, flow),
            }
        }
        _ => {
            let tx = session.multi.take().expect("checked above");
            let watch = session.watch.take();
            if tx.failed {
                let abort = Reply::err("EXECABORT Transaction discarded because of previous errors.");
                return match watch {
                    Some(token) => {
                        send(batch, unwatch(token));
                        (Pending::Instead(abort.to_resp(proto)), Flow::Continue)
                    }
                    None => ready(abort),
                };
            }
            // The gateway's own commands are answered here, in order; the store runs the rest.
            let mut slots = Vec::with_capacity(tx.commands.len());
            let mut replicated = Vec::new();
            for argv in tx.commands {
                match command::lookup(&argv[0]) {
                    Some(spec) if SUBSCRIPTION_COMMANDS.contains(&spec.name) => {
                        let (mut replies, command) = subscription(spec.name, &argv[1..], session, shared);
                        let reply = if replies.len() == 1 {
                            replies.pop().expect("one")
                        } else {
                            Reply::Array(replies)
                        };
                        match command {
                            Some(command) => {
                                slots.push(Slot::StoreAs(reply));
                                replicated.push(command);
                            }
                            None => slots.push(Slot::Local(reply)),
                        }
                    }
                    Some(spec) if spec.place == Place::Gateway => {
                        slots.push(Slot::Local(local::answer(session, spec.name, &argv, shared).0));
                    }
                    _ => {
                        slots.push(Slot::Store);
                        replicated.push(argv);
                    }
                }
            }
            send(
                batch,
                vec![
                    Bytes::from_static(b"upright.exec"),
                    watch.unwrap_or_default(),
                    crate::store::encode_transaction(&replicated),
                ],
            );
            (
                Pending::Exec {
                    proto: session.proto,
                    slots,
                },
                Flow::Continue,
            )
        }
    }
}

/// CLIENT UNBLOCK id [TIMEOUT|ERROR]: the store command that ends connection `id`'s wait, or
/// the reply if there is nothing to send (0: it does not wait).
fn client_unblock(a: &[Bytes], shared: &Shared) -> Result<Vec<Bytes>, Reply> {
    let (id, how) = match a {
        [id] => (id, Bytes::from_static(b"timeout")),
        [id, how] if is(how, "timeout") || is(how, "error") => (id, how.clone()),
        [_, _] => return Err(Reply::err("ERR CLIENT UNBLOCK reason should be TIMEOUT or ERROR")),
        _ => return Err(command::syntax_error()),
    };
    let id = command::parse_i64(id).ok_or_else(command::not_integer)?;
    match shared.blocked.token_of(id as u64) {
        Some(token) => Ok(vec![Bytes::from_static(b"upright.unblock"), token, how]),
        None => Err(Reply::Int(0)),
    }
}

/// Writes the answers in order: everything ready is encoded into one buffer and written with one
/// call; it waits (after writing what it has) only for a reply the cluster has not given yet.
async fn write_answers(
    mut write: WriteHalf,
    mut rx: mpsc::Receiver<Pending>,
    queue: Arc<Queue>,
    shared: Arc<Shared>,
    resume: mpsc::Sender<()>,
    (mut messages, outbox): (mpsc::Receiver<Reply>, Arc<Outbox>),
) {
    use std::sync::atomic::Ordering::Relaxed;
    let mut out = Vec::with_capacity(WRITE_CHUNK);
    loop {
        // Pub/sub messages go out between answers, as they come.
        while let Ok(message) = messages.try_recv() {
            message.write(outbox.proto.load(Relaxed), &mut out);
        }
        if outbox.overflowed.load(Relaxed) {
            break; // a subscriber this far behind is closed, as Redis does
        }
        let pending = match rx.try_recv() {
            Ok(pending) => pending,
            Err(TryRecvError::Disconnected) => break,
            Err(TryRecvError::Empty) => {
                if flush(&mut write, &mut out).await.is_err() {
                    return;
                }
                tokio::select! {
                    pending = rx.recv() => match pending {
                        Some(pending) => pending,
                        None => break,
                    },
                    Some(message) = messages.recv() => {
                        message.write(outbox.proto.load(Relaxed), &mut out);
                        continue;
                    }
                }
            }
        };
        match pending {
            Pending::Ready(bytes) => out.extend_from_slice(&bytes),
            Pending::Cluster(proto, name, start) => {
                let Some(reply) = next_cluster_reply(&mut write, &mut out, &queue).await else {
                    return;
                };
                let reply = fetch_large(reply, &shared).await;
                shared.stats.answered(name, start, matches!(reply, Reply::Error(_)));
                reply.write(proto, &mut out);
            }
            Pending::Staged {
                proto,
                pieces,
                name,
                start,
            } => {
                let mut refused = None;
                for _ in 0..pieces {
                    let Some(reply) = next_cluster_reply(&mut write, &mut out, &queue).await else {
                        return;
                    };
                    if let (Reply::Error(_), None) = (&reply, &refused) {
                        refused = Some(reply);
                    }
                }
                let Some(reply) = next_cluster_reply(&mut write, &mut out, &queue).await else {
                    return;
                };
                let reply = refused.unwrap_or(fetch_large(reply, &shared).await);
                shared.stats.answered(name, start, matches!(reply, Reply::Error(_)));
                if proto != 0 {
                    reply.write(proto, &mut out);
                }
            }
            Pending::Blocking {
                proto,
                token,
                wait,
                name,
                start,
            } => {
                if flush(&mut write, &mut out).await.is_err() {
                    return;
                }
                let Some(reply) = blocking_answer(&queue, &shared, &token, &wait).await else {
                    break; // the connection closed while waiting
                };
                let reply = fetch_large(reply, &shared).await;
                shared.stats.answered(name, start, matches!(reply, Reply::Error(_)));
                reply.write(proto, &mut out);
                let _ = resume.try_send(());
            }
            Pending::Exec { proto, slots } => {
                let reply = next_cluster_reply(&mut write, &mut out, &queue).await;
                let Some(reply) = reply else { return };
                let reply = fetch_large(reply, &shared).await;
                let reply = match reply {
                    Reply::Array(replies) => {
                        let mut replies = replies.into_iter();
                        Reply::Array(
                            slots
                                .into_iter()
                                .map(|slot| match slot {
                                    Slot::Local(reply) => reply,
                                    Slot::Store => replies.next().unwrap_or(Reply::Nil),
                                    Slot::StoreAs(reply) => {
                                        replies.next();
                                        reply
                                    }
                                })
                                .collect(),
                        )
                    }
                    other => other, // aborted by a WATCH (null array) or refused
                };
                reply.write(proto, &mut out);
            }
            Pending::Instead(bytes) => {
                let Some(reply) = next_cluster_reply(&mut write, &mut out, &queue).await else {
                    return;
                };
                if let Reply::Large { id, .. } = reply {
                    // Not written (CLIENT REPLY OFF): free what the store kept for it.
                    let mut release = vec![vec![
                        Bytes::from_static(b"upright.release"),
                        Bytes::from(id.to_string()),
                    ]];
                    shared.pool().submit(&Arc::new(Queue::default()), &mut release, false);
                }
                out.extend_from_slice(&bytes);
            }
            Pending::Resume => {
                let _ = resume.try_send(());
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

/// Piece of a kept reply asked for at once (several fit one operation's reply bound).
const FETCH_PIECE_BYTES: usize = 128 * 1024;
/// Attempts at one piece refused because its operation's replies were full, before giving up.
const FETCH_ATTEMPTS_MAX: usize = 64;

/// `reply`, or, if the store kept it as too large for one operation, the reply read back in
/// pieces (on the read-only path, every execution replica answering each alike) and then freed.
async fn fetch_large(reply: Reply, shared: &Shared) -> Reply {
    let Reply::Large { id, len } = reply else { return reply };
    // Its own queue: the connection's answers stay in their order meanwhile.
    let queue = Arc::new(Queue::default());
    let id_arg = Bytes::from(id.to_string());
    let mut encoded = Vec::with_capacity(len as usize);
    let mut attempts = 0;
    while (encoded.len() as u64) < len {
        let mut fetch = vec![vec![
            Bytes::from_static(b"upright.fetch"),
            id_arg.clone(),
            Bytes::from(encoded.len().to_string()),
            Bytes::from(FETCH_PIECE_BYTES.to_string()),
        ]];
        shared.pool().submit(&queue, &mut fetch, true);
        match queue.next_reply().await {
            Reply::Bulk(piece) if !piece.is_empty() => encoded.extend_from_slice(&piece),
            Reply::Error(e) if e.contains("reply too large") && attempts < FETCH_ATTEMPTS_MAX => attempts += 1,
            Reply::Error(e) => return Reply::Error(e),
            _ => return Reply::err("ERR upright: a large reply could not be read"),
        }
    }
    let mut release = vec![vec![Bytes::from_static(b"upright.release"), id_arg]];
    shared.pool().submit(&queue, &mut release, false);
    queue.closed();
    upright_core::codec::from_bytes(&encoded)
        .unwrap_or_else(|_| Reply::err("ERR upright: a large reply did not decode"))
}

/// The cluster's next reply for this connection, writing what is ready first if it has to
/// wait; `None` if the client went away.
async fn next_cluster_reply(write: &mut WriteHalf, out: &mut Vec<u8>, queue: &Queue) -> Option<Reply> {
    if let Some(reply) = queue.try_reply() {
        return Some(reply);
    }
    flush(write, out).await.ok()?;
    Some(queue.next_reply().await)
}

/// A blocking command's answer: its reply if the store served it at once; otherwise, once the
/// store pushes its token (or every [`POLL`]), the reply collected from the store. `None` if the
/// connection closed first.
async fn blocking_answer(queue: &Arc<Queue>, shared: &Shared, token: &Bytes, wait: &Wait) -> Option<Reply> {
    use std::sync::atomic::Ordering::Relaxed;
    let mut reply = queue.next_reply().await;
    let mut counted = false;
    while reply == Reply::Blocked {
        if !counted {
            shared.blocked.confirmed.fetch_add(1, Relaxed);
            counted = true;
        }
        let _ = tokio::time::timeout(POLL, wait.wake.notified()).await;
        if wait.closed.load(Relaxed) {
            break;
        }
        let mut collect = vec![vec![Bytes::from_static(b"upright.collect"), token.clone()]];
        shared.pool().submit(queue, &mut collect, false);
        reply = queue.next_reply().await;
    }
    if counted {
        shared.blocked.confirmed.fetch_sub(1, Relaxed);
    }
    shared.blocked.finish(token);
    (!wait.closed.load(Relaxed)).then_some(reply)
}

async fn flush(write: &mut WriteHalf, out: &mut Vec<u8>) -> std::io::Result<()> {
    if !out.is_empty() {
        write.write_all(out).await?;
        write.flush().await?;
        upright_node::timeline::event("gateway-write", out.len() as u64, 0, 0);
        out.clear();
    }
    Ok(())
}

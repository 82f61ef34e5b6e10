//! The ZooKeeper-protocol gateway: serves ZooKeeper clients (kazoo, zkCli, the C and Java clients)
//! on a TCP port as an upright client of the cluster.
//!
//! Each connection opens or resumes a session with an ordered `Connect` and then sends its
//! requests one at a time, in order: writes, watches and `sync` are ordered; reads without a
//! watch take the serializable read path (`r + 1` matching replies) and are ordered instead when
//! the answer is older than what the gateway has already answered to any of its sessions (a
//! client sees its own writes and those completed through the same gateway before, as on one
//! ZooKeeper server, and after `sync` the latest). Pings are answered here. Watch events come as pushed messages, are
//! routed by session, and are written in the service's order among the replies: before any reply
//! that the service says follows them, after the reply of the request they follow. The
//! gateway keeps its live sessions alive with one ordered `Touch` per second; a session whose
//! connection is gone stops being touched and expires on agreed time after its timeout, as in
//! ZooKeeper.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{mpsc, Notify};
use upright_core::stage::ReadPath;
use upright_node::client::{ClientHandle, PushEvent};
use upright_node::gateway::tls::{Accepted, GatewayListener, ReadHalf};

use crate::jute::{Reader, MAX_BUFFER};
use crate::proto::op;
use crate::proto::Code;
use crate::service::{is_plain_read, reply, Answer, Command, Event};

/// Largest frame a client may send (ZooKeeper: `jute.maxbuffer` plus room for the header).
pub const FRAME_BYTES_MAX: usize = MAX_BUFFER + 1024;
/// Frames (replies and events) waiting to be written to one connection; a client that reads
/// none of them while this many wait is disconnected.
pub const OUTBOX_MAX: usize = 4096;
/// How often the gateway touches the sessions it serves.
pub const TOUCH_INTERVAL: Duration = Duration::from_secs(1);
/// How long a reply waits for the events the service says precede it before the connection is
/// closed (an event was lost: the client reconnects rather than miss it silently).
pub const EVENT_WAIT: Duration = Duration::from_secs(5);
/// The `xid` ZooKeeper gives ping replies.
const PING_XID: i32 = -2;

/// One live connection of a session.
struct Conn {
    id: u64,
    gate: Arc<Mutex<Gate>>,
    /// Wakes a reply waiting for events.
    event_queued: Arc<Notify>,
    /// Set (and `closing` notified) to make the connection end.
    closed: Arc<AtomicBool>,
    closing: Arc<Notify>,
}

/// The order of one connection's frames: a reply and the events of its session go out in the
/// order the service made them. While a request is at the cluster its events wait here; when
/// the answer comes, the events the service sent before it go first, then the reply, then the
/// later ones (a client registers a watch when it reads the reply that set it, so an event
/// written ahead of that reply would be dropped by the client).
///
/// Under selective execution an event is numbered in its node's stream rather than among the
/// session's (`seq` 0) and replies count no events; the upright client then delivers a reply
/// after the events it must follow, and the order is its order: each held event carries its
/// place in the client's push queue, and a reply the number of events queued before it.
struct Gate {
    outbox: mpsc::Sender<Bytes>,
    /// The session's events received so far (the highest number).
    received: u64,
    /// A request of the connection is at the cluster.
    in_flight: bool,
    /// Events received meanwhile: the session's number for each (0 under selective
    /// execution), its place in the client's push queue, and the frame.
    held: VecDeque<(u64, u64, Bytes)>,
}

impl Gate {
    fn lock(gate: &Mutex<Gate>) -> std::sync::MutexGuard<'_, Gate> {
        gate.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Event `seq` (0: not numbered among the session's), the `queued`-th of its client's push
    /// queue: written now, or held while a request is at the cluster; false if the connection
    /// cannot keep up (its client reads too slowly).
    fn event(&mut self, seq: u64, queued: u64, frame: Bytes) -> bool {
        if seq != 0 {
            if seq <= self.received {
                return true; // a duplicate (pushes are delivered once, but a session may reconnect)
            }
            self.received = seq;
        }
        if !self.in_flight {
            return self.outbox.try_send(frame).is_ok();
        }
        if self.held.len() >= OUTBOX_MAX {
            return false;
        }
        self.held.push_back((seq, queued, frame));
        true
    }

    /// Writes the held events that come before the reply (the session's first `events`, or
    /// under selective execution those among the first `queued` of the client's push queue),
    /// the reply, then the rest; false if the connection cannot keep up.
    fn reply(&mut self, events: u64, queued: u64, reply: Bytes) -> bool {
        self.in_flight = false;
        let mut ok = true;
        let before = |&(seq, place, _): &(u64, u64, Bytes)| match seq {
            0 => place <= queued,
            seq => seq <= events,
        };
        while self.held.front().is_some_and(before) {
            let (_, _, frame) = self.held.pop_front().expect("checked");
            ok &= self.outbox.try_send(frame).is_ok();
        }
        ok &= self.outbox.try_send(reply).is_ok();
        for (_, _, frame) in self.held.drain(..) {
            ok &= self.outbox.try_send(frame).is_ok();
        }
        ok
    }
}

/// How far the task routing one client's pushes has got.
#[derive(Default)]
struct Routed {
    /// Events taken from the client's push queue and put in their connections' gates.
    count: AtomicU64,
    /// Wakes replies waiting for `count`.
    moved: Notify,
}

/// What the connections share.
struct Shared {
    clients: Vec<ClientHandle>,
    /// Per client, how far its pushes are routed.
    routed: Vec<Routed>,
    next: AtomicUsize,
    connections: AtomicU64,
    sessions: Mutex<HashMap<i64, Conn>>,
    /// Highest zxid seen in any answer.
    zxid: AtomicI64,
}

impl Shared {
    /// The client a connection resuming `session` (0: a new one) speaks through, by index:
    /// all of the connection's commands go through it, so the session's events (pushed to the
    /// client that connected it) and its replies come through one client, in its order.
    fn client_for(&self, session: i64) -> usize {
        let n = self.clients.len();
        if session == 0 {
            self.next.fetch_add(1, Ordering::Relaxed) % n
        } else {
            (session as u64 % n as u64) as usize
        }
    }

    fn sessions(&self) -> std::sync::MutexGuard<'_, HashMap<i64, Conn>> {
        self.sessions.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Ends the connection serving `session`, if it is `id` (any, if `None`).
    fn close(&self, session: i64, id: Option<u64>) {
        let mut sessions = self.sessions();
        if sessions.get(&session).is_some_and(|c| id.is_none_or(|id| c.id == id)) {
            let conn = sessions.remove(&session).expect("checked");
            conn.closed.store(true, Ordering::Relaxed);
            conn.closing.notify_waiters();
        }
    }

    /// `command` through client `client`: the answer, and the number of push events the
    /// client had queued before it.
    async fn invoke(&self, client: usize, command: &Command, serializable: bool) -> Option<(Answer, u64)> {
        let path = if serializable {
            ReadPath::Serializable
        } else {
            ReadPath::Ordered
        };
        let (result, queued) = self.clients[client].invoke_counted(command.encode(), path).await.ok()?;
        let answer: Answer = upright_core::codec::from_bytes(&result).ok()?;
        self.zxid.fetch_max(answer.zxid, Ordering::Relaxed);
        Some((answer, queued))
    }
}

/// Serves ZooKeeper clients on `listener` through `clients` (one or more upright client
/// identities of the cluster) until the listener fails.
pub async fn serve(listener: impl Into<GatewayListener>, clients: Vec<ClientHandle>) -> std::io::Result<()> {
    let listener = listener.into();
    assert!(!clients.is_empty(), "the gateway needs an upright client");
    let shared = Arc::new(Shared {
        routed: clients.iter().map(|_| Routed::default()).collect(),
        clients,
        next: AtomicUsize::new(0),
        connections: AtomicU64::new(0),
        sessions: Mutex::new(HashMap::new()),
        zxid: AtomicI64::new(0),
    });
    for (index, client) in shared.clients.iter().enumerate() {
        if let Some(pushes) = client.pushes() {
            tokio::spawn(route_events(pushes, index, shared.clone()));
        }
    }
    tokio::spawn(touch_sessions(shared.clone()));
    loop {
        let stream = listener.accept().await?;
        let id = shared.connections.fetch_add(1, Ordering::Relaxed);
        tokio::spawn(connection(stream, id, shared.clone()));
    }
}

/// Puts each event client `client` was pushed in its session's outbox; a gap (events lost)
/// ends every connection, whose clients then reconnect.
async fn route_events(mut pushes: mpsc::Receiver<PushEvent>, client: usize, shared: Arc<Shared>) {
    let routed = &shared.routed[client];
    while let Some(push) = pushes.recv().await {
        route_event(push, routed.count.load(Ordering::Relaxed) + 1, &shared);
        routed.count.fetch_add(1, Ordering::Relaxed);
        routed.moved.notify_waiters();
    }
}

/// Routes one push, the `queued`-th of its client's queue.
fn route_event(push: PushEvent, queued: u64, shared: &Shared) {
    {
        match push {
            PushEvent::Message { payload, .. } => {
                let Ok(event) = upright_core::codec::from_bytes::<Event>(&payload) else {
                    return;
                };
                // Before the client can see it: a read it sends after the event is answered
                // from a state that includes the event's write.
                shared.zxid.fetch_max(event.zxid, Ordering::Relaxed);
                let sessions = shared.sessions();
                let Some(conn) = sessions.get(&event.session) else {
                    return;
                };
                if !Gate::lock(&conn.gate).event(event.seq, queued, frame(&event.bytes)) {
                    let session = event.session;
                    drop(sessions);
                    shared.close(session, None);
                    return;
                }
                conn.event_queued.notify_waiters();
            }
            PushEvent::Gap { .. } => {
                let all: Vec<i64> = shared.sessions().keys().copied().collect();
                for session in all {
                    shared.close(session, None);
                }
            }
        }
    }
}

/// Touches the live sessions every [`TOUCH_INTERVAL`]; the ones the cluster no longer knows
/// (expired) lose their connection.
async fn touch_sessions(shared: Arc<Shared>) {
    let mut tick = tokio::time::interval(TOUCH_INTERVAL);
    loop {
        tick.tick().await;
        let sessions: Vec<i64> = shared.sessions().keys().copied().collect();
        if sessions.is_empty() {
            continue;
        }
        let client = shared.client_for(0);
        let Some((answer, _)) = shared.invoke(client, &Command::Touch { sessions }, false).await else {
            continue;
        };
        let gone: Vec<i64> = upright_core::codec::from_bytes(&answer.bytes).unwrap_or_default();
        for session in gone {
            shared.close(session, None);
        }
    }
}

/// `bytes` with its 4-byte length in front.
fn frame(bytes: &[u8]) -> Bytes {
    let mut out = BytesMut::with_capacity(bytes.len() + 4);
    out.put_i32(bytes.len() as i32);
    out.put_slice(bytes);
    out.freeze()
}

/// Reads one length-prefixed frame; `None` at the end of the stream or on a bad length.
async fn read_frame(read: &mut ReadHalf, first: Option<[u8; 4]>) -> Option<Vec<u8>> {
    let len = match first {
        Some(b) => i32::from_be_bytes(b),
        None => read.read_i32().await.ok()?,
    };
    let len = usize::try_from(len).ok().filter(|&n| n <= FRAME_BYTES_MAX)?;
    let mut buf = vec![0u8; len];
    read.read_exact(&mut buf).await.ok()?;
    Some(buf)
}

/// The answer to a four-letter word, if `word` is one the gateway knows.
fn four_letter_word(word: &[u8; 4], shared: &Shared) -> Option<String> {
    let sessions = shared.sessions().len();
    let zxid = shared.zxid.load(Ordering::Relaxed);
    Some(match word {
        b"ruok" => "imok".to_string(),
        b"srvr" | b"stat" => format!(
            "Zookeeper version: upright-zk {} (BFT, replicated by upright)\nLatency min/avg/max: 0/0/0\nReceived: 0\nSent: 0\nConnections: {sessions}\nOutstanding: 0\nZxid: 0x{zxid:x}\nMode: standalone\nNode count: 0\n",
            env!("CARGO_PKG_VERSION")
        ),
        b"mntr" => format!(
            "zk_version\tupright-zk {}\nzk_server_state\tstandalone\nzk_num_alive_connections\t{sessions}\nzk_outstanding_requests\t0\n",
            env!("CARGO_PKG_VERSION")
        ),
        _ => return None,
    })
}

/// Serves one client connection.
async fn connection(accepted: Accepted, id: u64, shared: Arc<Shared>) {
    let Ok((mut read, mut write)) = accepted.open().await else {
        return;
    };
    let mut first = [0u8; 4];
    if read.read_exact(&mut first).await.is_err() {
        return;
    }
    if first.iter().all(u8::is_ascii_lowercase) {
        if let Some(text) = four_letter_word(&first, &shared) {
            let _ = write.write_all(text.as_bytes()).await;
            let _ = write.flush().await;
        }
        let _ = write.shutdown().await;
        return;
    }
    let Some(request) = read_frame(&mut read, Some(first)).await else {
        return;
    };
    // ConnectRequest: protocolVersion, lastZxidSeen, timeOut, sessionId, passwd[, readOnly].
    let mut r = Reader::new(&request);
    let parsed = (|| Ok::<_, crate::jute::JuteError>((r.int()?, r.long()?, r.int()?, r.long()?, r.data()?)))();
    let Ok((_, last_zxid, timeout_ms, session, password)) = parsed else {
        return;
    };
    let connect = Command::Connect {
        session,
        password,
        timeout_ms,
    };
    let client = shared.client_for(session);
    let Some((answer, _)) = shared.invoke(client, &connect, false).await else {
        return;
    };
    let granted = Reader::new(answer.bytes.get(8..).unwrap_or_default())
        .long()
        .unwrap_or(0);
    let written = write.write_all(&frame(&answer.bytes)).await.is_ok() && write.flush().await.is_ok();
    if !written || granted == 0 {
        let _ = write.shutdown().await;
        return;
    }
    let session = granted;
    let (outbox, mut out_rx) = mpsc::channel::<Bytes>(OUTBOX_MAX);
    let gate = Arc::new(Mutex::new(Gate {
        outbox: outbox.clone(),
        received: answer.events,
        in_flight: false,
        held: VecDeque::new(),
    }));
    let conn = Conn {
        id,
        gate: gate.clone(),
        event_queued: Arc::new(Notify::new()),
        closed: Arc::new(AtomicBool::new(false)),
        closing: Arc::new(Notify::new()),
    };
    let (event_queued, closed, closing) = (conn.event_queued.clone(), conn.closed.clone(), conn.closing.clone());
    if let Some(old) = shared.sessions().insert(session, conn) {
        old.closed.store(true, Ordering::Relaxed);
        old.closing.notify_waiters();
    }
    let writer = tokio::spawn(async move {
        while let Some(bytes) = out_rx.recv().await {
            if write.write_all(&bytes).await.is_err() {
                break;
            }
            // Flushed when nothing else is queued yet (a TLS record then goes out).
            if out_rx.is_empty() && write.flush().await.is_err() {
                break;
            }
        }
        let _ = write.shutdown().await;
    });
    let mut seen = last_zxid.max(answer.zxid);
    loop {
        let frame_read = tokio::select! {
            f = read_frame(&mut read, None) => f,
            _ = closing.notified() => None,
        };
        let Some(request) = frame_read else { break };
        if closed.load(Ordering::Relaxed) {
            break;
        }
        let mut r = Reader::new(&request);
        let (Ok(xid), Ok(opcode)) = (r.int(), r.int()) else {
            break;
        };
        let body = Bytes::copy_from_slice(&request[8..]);
        match opcode {
            op::PING => {
                let pong = reply(PING_XID, shared.zxid.load(Ordering::Relaxed), Code::Ok, |_| {});
                if outbox.send(frame(&pong)).await.is_err() {
                    break;
                }
            }
            _ => {
                let plain_read = is_plain_read(opcode, &body);
                let command = Command::Request {
                    session,
                    xid,
                    opcode,
                    body,
                };
                Gate::lock(&gate).in_flight = true;
                let mut answer = None;
                if plain_read {
                    // Not older than anything this gateway answered to any session: its sessions
                    // see one state that only moves forward, as those of one ZooKeeper server do
                    // (a session sees another's write that completed before its read began).
                    // Under selective execution a read-only answer shows zxid 0, so this takes
                    // the ordered path, whose reply comes after the read node's events.
                    let floor = seen.max(shared.zxid.load(Ordering::Relaxed));
                    answer = shared
                        .invoke(client, &command, true)
                        .await
                        .filter(|(a, _)| a.zxid >= floor);
                }
                if answer.is_none() {
                    answer = shared.invoke(client, &command, false).await;
                }
                let Some((answer, queued)) = answer else { break };
                seen = seen.max(answer.zxid);
                // Events that come before this reply go first: the first `answer.events` of the
                // session, or (selective execution) those the client queued before the reply.
                let routed = &shared.routed[client];
                let waited = tokio::time::timeout(EVENT_WAIT, async {
                    loop {
                        let notified = event_queued.notified();
                        let moved = routed.moved.notified();
                        if Gate::lock(&gate).received >= answer.events && routed.count.load(Ordering::Relaxed) >= queued
                        {
                            return;
                        }
                        tokio::select! {
                            _ = notified => {}
                            _ = moved => {}
                        }
                    }
                })
                .await;
                if waited.is_err() || !Gate::lock(&gate).reply(answer.events, queued, frame(&answer.bytes)) {
                    break;
                }
                if opcode == op::CLOSE_SESSION {
                    break;
                }
            }
        }
    }
    shared.close(session, Some(id));
    drop(outbox);
    let _ = writer.await;
}

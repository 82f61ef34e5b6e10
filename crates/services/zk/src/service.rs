//! The replicated ZooKeeper service: sessions, requests and watches as agreed state.
//!
//! A gateway (an upright client) sends [`Command`]s; each reply is a [`Answer`] whose `bytes` are
//! exactly what ZooKeeper's server writes for the request (a `ReplyHeader` and the response
//! record, or a `ConnectResponse`), so the gateway forwards them as they are. Watch events are
//! pushed to the gateway that last spoke for the session ([`Event`]); every reply says how many
//! events its session was sent before it, so the gateway can hold the reply until those are
//! written: a client sees the event before the data that changed (ZooKeeper's guarantee).
//! Under selective execution ([`ZkService::use_positions`]) an event goes instead in the push
//! stream of its node's object, and each reply announces the streams of the nodes its request
//! touches; the upright client then delivers the reply after those nodes' earlier events.
//!
//! Sessions expire on agreed time: each has a deadline of its timeout after the last command for
//! it (a gateway touches the sessions it serves together in one ordered `Touch`), and the service
//! asks to be woken at the earliest deadline; an expired session's ephemeral nodes go and their
//! watches fire, at the same point of the agreed history at every replica.

use std::collections::{BTreeMap, BTreeSet};

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use upright_core::crypto::Digest;
use upright_core::ids::ClientId;
use upright_core::pages::Pages;
use upright_core::service::{BatchContext, Effects, RestoreError, Service, ServiceRequest};

use crate::jute::{Reader, Writer};
use crate::proto::{op, Acl, Code, Id, Op, Stat};
use crate::tree::{Done, Read, Tree, Txn};
use crate::watches::{Change, Kind, Watches};

/// ZooKeeper's default `tickTime` (ms): session timeouts are negotiated between 2 and 20 ticks.
pub const TICK_MS: i32 = 2_000;
/// Shortest session timeout granted (`minSessionTimeout`) at the default tick.
pub const SESSION_TIMEOUT_MIN_MS: i32 = 2 * TICK_MS;
/// Longest session timeout granted (`maxSessionTimeout`) at the default tick.
pub const SESSION_TIMEOUT_MAX_MS: i32 = 20 * TICK_MS;
/// How often empty containers and expired TTL nodes are looked for (ZooKeeper's
/// `znode.container.checkIntervalMs` default), in agreed microseconds.
pub const SWEEP_INTERVAL_US: u64 = 60_000_000;
/// Most sessions at once (a connect beyond it is refused as ZooKeeper refuses one it cannot
/// serve: the connection closes).
pub const SESSIONS_MAX: usize = 100_000;
/// Most identities one session may authenticate as.
pub const AUTH_PER_SESSION_MAX: usize = 16;
/// Keeper state of a watch event on a live session (`SyncConnected`).
pub const STATE_SYNC_CONNECTED: i32 = 3;
/// The `xid` of a watch event's reply header.
pub const NOTIFICATION_XID: i32 = -1;

/// What a gateway asks of the service.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    /// A client's ConnectRequest: a new session (`session` 0) or a reconnect to one (with its
    /// password).
    Connect {
        /// The session to resume, or 0 for a new one.
        session: i64,
        /// The session's password (16 bytes) when resuming.
        password: Bytes,
        /// The timeout the client asks for (ms).
        timeout_ms: i32,
    },
    /// A request of a live session: its header's `xid` and `type`, and the record after it.
    Request {
        /// The session.
        session: i64,
        /// The client's number for the request (echoed in the reply).
        xid: i32,
        /// Its operation code ([`op`]).
        opcode: i32,
        /// Its record.
        body: Bytes,
    },
    /// The sessions a gateway serves are alive (they move their deadlines).
    Touch {
        /// The sessions.
        sessions: Vec<i64>,
    },
}

impl Command {
    /// The command's bytes (what the gateway submits).
    pub fn encode(&self) -> Bytes {
        Bytes::from(upright_core::codec::to_bytes(self))
    }
}

/// The service's reply to a command.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Answer {
    /// The zxid of the state it was answered from (the last committed write).
    pub zxid: i64,
    /// Events pushed for the session before this reply (write them first).
    pub events: u64,
    /// What ZooKeeper writes back (a ReplyHeader and response, or a ConnectResponse); for a
    /// Touch, the postcard-encoded list of the sessions that are gone.
    pub bytes: Bytes,
}

/// A watch event pushed to the gateway of a session.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// The session it is for.
    pub session: i64,
    /// Its number among the session's events, from 1.
    pub seq: u64,
    /// The zxid of the write that caused it: a gateway reads nothing older for its sessions
    /// after it (a client that saw a node's deletion event must not read the node back from a
    /// member that has not executed the deletion yet).
    pub zxid: i64,
    /// ReplyHeader (xid -1) and WatcherEvent, as ZooKeeper writes them.
    pub bytes: Bytes,
}

/// A session's request, as its header and record.
struct Call<'a> {
    session: i64,
    xid: i32,
    opcode: i32,
    body: &'a [u8],
}

/// One session.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Session {
    password: Bytes,
    timeout_ms: i32,
    /// Agreed time (us) at which it expires unless touched.
    deadline_us: u64,
    /// The gateway identity that last spoke for it: its events go there.
    owner: ClientId,
    /// Identities it authenticated as.
    auth: Vec<Id>,
    /// Events pushed so far.
    events: u64,
}

/// The service's state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ZkService {
    /// `tickTime` (ms): session timeouts are granted between 2 and 20 ticks.
    tick_ms: i32,
    /// The tree; its nodes are checkpointed in `nodes`, the rest with the service.
    tree: Tree,
    #[serde(skip)]
    nodes: paged::NodePages,
    /// The last write's zxid.
    zxid: i64,
    sessions: BTreeMap<i64, Session>,
    /// Sessions by deadline.
    deadlines: BTreeSet<(u64, i64)>,
    /// Agreed time (us) of the next look for empty containers and expired TTL nodes, while
    /// there are any.
    next_sweep_us: Option<u64>,
    /// Sessions created so far (the low bits of the next session id).
    created: i64,
    watches: Watches,
    /// Under selective execution's rules ([`ZkService::use_positions`]): zxids are agreed
    /// positions, and a request neither moves its session's deadline nor changes its owner.
    #[serde(skip)]
    positions: bool,
    /// Under those rules, the agreed position of the request (or wake-up) being executed.
    #[serde(skip)]
    position: Option<i64>,
}

/// The zxid of the request at index `index` of batch `seqno` under selective execution's rules:
/// its agreed position, `seqno << 20 | index + 1` (a wake-up, before the batch's requests, is at
/// `seqno << 20`), increasing along the agreed order as ZooKeeper's zxids do and the same
/// whichever member runs it, and when.
pub fn position_zxid(seqno: u64, index: Option<u32>) -> i64 {
    ((seqno as i64) << 20) | index.map_or(0, |i| i64::from(i) + 1)
}

/// The bytes of a reply header and, if `err` is Ok, a response record written by `body`.
pub(crate) fn reply(xid: i32, zxid: i64, err: Code, body: impl FnOnce(&mut Vec<u8>)) -> Bytes {
    let mut out = Vec::new();
    out.int(xid);
    out.long(zxid);
    out.int(err.value());
    if err == Code::Ok {
        body(&mut out);
    }
    Bytes::from(out)
}

/// A ConnectResponse (protocol version 0, not read-only).
fn connect_response(timeout_ms: i32, session: i64, password: &[u8]) -> Bytes {
    let mut out = Vec::new();
    out.int(0);
    out.int(timeout_ms);
    out.long(session);
    out.buffer(Some(password));
    out.boolean(false);
    Bytes::from(out)
}

fn write_acl_stat(out: &mut Vec<u8>, acl: &[Acl], stat: &Stat) {
    Acl::write_all(acl, out);
    stat.write(out);
}

impl Default for ZkService {
    fn default() -> ZkService {
        ZkService::with_tick_ms(TICK_MS)
    }
}

impl ZkService {
    /// An empty tree with no sessions.
    pub fn new() -> ZkService {
        ZkService::default()
    }

    /// An empty tree with no sessions, granting session timeouts between 2 and 20 ticks of
    /// `tick_ms` (ZooKeeper's `tickTime`; the simulator uses short ones so sessions expire
    /// within a run).
    pub fn with_tick_ms(tick_ms: i32) -> ZkService {
        let tree = Tree::default();
        ZkService {
            tick_ms: tick_ms.max(1),
            nodes: paged::NodePages::of(&tree),
            tree,
            zxid: 0,
            sessions: BTreeMap::new(),
            deadlines: BTreeSet::new(),
            next_sweep_us: None,
            created: 0,
            watches: Watches::default(),
            positions: false,
            position: None,
        }
    }

    /// Switches to the rules selective execution needs (docs/ODRC.md, "ZooKeeper under
    /// selective execution", steps 1 and 2): a write's zxid (czxid, mzxid, pzxid, the reply's)
    /// is its agreed position ([`position_zxid`]) instead of the next of a counter that requests
    /// a member skipped would have moved; a reply shows its request's position (a read-only one
    /// shows 0, which clients ignore); sessions are state only global commands write (connect,
    /// close, AUTH, the watch requests, the gateway's Touch, expiry), so a request no longer
    /// moves its session's deadline or owner (the gateway's Touch, every third of the timeout,
    /// keeps it alive); watch events go in their nodes' push streams. What
    /// [`Service::enable_selective_execution`] turns on.
    pub fn use_positions(&mut self) {
        self.positions = true;
    }

    /// The zxid a reply shows: the request's position under [`ZkService::use_positions`],
    /// otherwise the last write's.
    fn shown_zxid(&self) -> i64 {
        self.position.unwrap_or(self.zxid)
    }

    /// When the next sweep of containers and TTL nodes is due. Under selective execution's rules
    /// whether there are any is not state one write may read (they are other nodes): the sweep
    /// then comes every interval, first at the first batch.
    fn sweep_at(&self) -> Option<u64> {
        if self.positions {
            Some(self.next_sweep_us.unwrap_or(0))
        } else {
            self.next_sweep_us
        }
    }

    /// The zxid the next write gets.
    fn next_zxid(&self) -> i64 {
        self.position.unwrap_or(self.zxid + 1)
    }

    /// A write at [`ZkService::next_zxid`] succeeded.
    fn wrote(&mut self) {
        if self.position.is_none() {
            self.zxid += 1;
        }
    }

    /// The tree (for tests and the simulator's checks).
    pub fn tree(&self) -> &Tree {
        &self.tree
    }

    /// The live sessions.
    pub fn sessions(&self) -> impl Iterator<Item = i64> + '_ {
        self.sessions.keys().copied()
    }

    fn touch(&mut self, session: i64, now_us: u64, owner: Option<ClientId>) -> bool {
        let Some(s) = self.sessions.get_mut(&session) else {
            return false;
        };
        self.deadlines.remove(&(s.deadline_us, session));
        s.deadline_us = now_us + s.timeout_ms as u64 * 1_000;
        self.deadlines.insert((s.deadline_us, session));
        if let Some(owner) = owner {
            s.owner = owner;
        }
        true
    }

    fn answer(&self, session: i64, bytes: Bytes) -> Bytes {
        let events = self.sessions.get(&session).map_or(0, |s| s.events);
        let answer = Answer {
            zxid: self.shown_zxid(),
            events,
            bytes,
        };
        Bytes::from(upright_core::codec::to_bytes(&answer))
    }

    /// A ConnectRequest: the session granted (0 if none) and the ConnectResponse.
    fn connect(
        &mut self,
        ctx: &BatchContext,
        client: ClientId,
        session: i64,
        password: &Bytes,
        timeout: i32,
    ) -> (i64, Bytes) {
        // Expired, closed, unknown, the wrong password or no room: ZooKeeper answers with a zero
        // timeout and session, and the client reports the session expired.
        let refused = || (0, connect_response(0, 0, &[0u8; 16]));
        let timeout = timeout.clamp(2 * self.tick_ms, 20 * self.tick_ms);
        let id = if session == 0 {
            if self.sessions.len() >= SESSIONS_MAX {
                return refused();
            }
            self.created += 1;
            // Like ZooKeeper's: a server byte on top (1), then a counter.
            let id = (1i64 << 56) | self.created;
            let password = Bytes::copy_from_slice(
                &Digest::of_parts("upright-zk session password", &[&ctx.seed, &id.to_be_bytes()]).0[..16],
            );
            let deadline_us = ctx.time_us + timeout as u64 * 1_000;
            self.sessions.insert(
                id,
                Session {
                    password,
                    timeout_ms: timeout,
                    deadline_us,
                    owner: client,
                    auth: Vec::new(),
                    events: 0,
                },
            );
            self.deadlines.insert((deadline_us, id));
            id
        } else {
            match self.sessions.get(&session) {
                Some(s) if s.password == *password => {
                    self.touch(session, ctx.time_us, Some(client));
                    session
                }
                _ => return refused(),
            }
        };
        let s = &self.sessions[&id];
        (id, connect_response(s.timeout_ms, id, &s.password))
    }

    /// Runs `write` on the tree as `session`'s next transaction (the next zxid, agreed time in
    /// ms, its identities); the zxid moves only if it succeeded.
    fn transact<T, E>(
        &mut self,
        ctx: &BatchContext,
        session: i64,
        write: impl FnOnce(&mut Tree, &Txn<'_>) -> Result<T, E>,
    ) -> Result<T, E> {
        let auth = self.sessions.get(&session).map(|s| s.auth.clone()).unwrap_or_default();
        let txn = Txn {
            zxid: self.next_zxid(),
            time_ms: (ctx.time_us / 1_000) as i64,
            session,
            auth: &auth,
        };
        let result = write(&mut self.tree, &txn);
        if result.is_ok() {
            self.wrote();
        }
        result
    }

    /// Applies `changes` to the watches and pushes the events.
    fn fire(&mut self, changes: &[Change], effects: &mut Effects) {
        for change in changes {
            for (session, kind, path) in self.watches.fire(change) {
                self.push_event(session, kind, &path, effects);
            }
        }
    }

    /// Pushes a watch event (`kind` on `path`) to `session`'s gateway.
    fn push_event(&mut self, session: i64, kind: i32, path: &str, effects: &mut Effects) {
        let zxid = self.shown_zxid();
        let Some(s) = self.sessions.get_mut(&session) else {
            return;
        };
        if !self.positions {
            // Under selective execution's rules a session's count of events across nodes is
            // not kept (a write on one node may not change it): each event goes in the stream
            // of its path's object instead, numbered there (`seq` 0 below).
            s.events += 1;
        }
        let bytes = reply(NOTIFICATION_XID, -1, Code::Ok, |out| {
            out.int(kind);
            out.int(STATE_SYNC_CONNECTED);
            out.string(path);
        });
        let event = Event {
            session,
            seq: s.events,
            zxid,
            bytes,
        };
        let payload = Bytes::from(upright_core::codec::to_bytes(&event));
        if self.positions {
            effects.push_on(objects::object_of(path), s.owner, payload);
        } else {
            effects.push(s.owner, payload);
        }
    }

    /// Under selective execution's rules: the reply of the request that leaves a watch on
    /// `path` for `session` tells its gateway where the stream of the path's object stands, so
    /// the gateway follows it (docs/ODRC.md, step 5).
    fn announce_watch(&self, session: i64, path: &str, effects: &mut Effects) {
        if let Some(s) = self.sessions.get(&session).filter(|_| self.positions) {
            effects.announce_stream(s.owner, objects::object_of(path));
        }
    }

    /// Ends `session` (closed or expired): its ephemeral nodes go (one write), its watches too.
    fn end_session(&mut self, session: i64, effects: &mut Effects) {
        let Some(s) = self.sessions.remove(&session) else {
            return;
        };
        self.deadlines.remove(&(s.deadline_us, session));
        self.watches.drop_session(session);
        if self.tree.ephemerals_of(session).next().is_none() {
            return;
        }
        let zxid = self.next_zxid();
        self.wrote();
        let gone = self.tree.close_session(zxid, session);
        let changes: Vec<Change> = gone.into_iter().map(Change::Deleted).collect();
        self.fire(&changes, effects);
    }

    fn request(&mut self, ctx: &BatchContext, client: ClientId, call: Call<'_>, effects: &mut Effects) -> Bytes {
        let Call {
            session,
            xid,
            opcode,
            body,
        } = call;
        let alive = if self.positions {
            self.sessions.contains_key(&session)
        } else {
            self.touch(session, ctx.time_us, Some(client))
        };
        if !alive {
            return reply(xid, self.shown_zxid(), Code::SessionExpired, |_| {});
        }
        let mut r = Reader::new(body);
        match opcode {
            op::PING => return reply(xid, self.shown_zxid(), Code::Ok, |_| {}),
            op::CLOSE_SESSION => {
                self.end_session(session, effects);
                return reply(xid, self.shown_zxid(), Code::Ok, |_| {});
            }
            op::AUTH => return self.auth(session, xid, &mut r),
            op::MULTI => return self.multi(ctx, session, xid, &mut r, effects),
            op::MULTI_READ => return self.multi_read(session, xid, &mut r),
            op::SET_WATCHES => return self.set_watches(session, xid, &mut r, false, effects),
            op::SET_WATCHES2 => return self.set_watches(session, xid, &mut r, true, effects),
            op::ADD_WATCH => return self.add_watch(session, xid, &mut r, effects),
            op::REMOVE_WATCHES => return self.remove_watches(session, xid, &mut r, true),
            op::CHECK_WATCHES => return self.remove_watches(session, xid, &mut r, false),
            _ => {}
        }
        let Some(decoded) = Op::read(opcode, &mut r) else {
            return reply(xid, self.shown_zxid(), Code::Unimplemented, |_| {});
        };
        let operation = match decoded.and_then(|o| r.finish().map(|()| o)) {
            Ok(o) => o,
            Err(_) => return reply(xid, self.shown_zxid(), Code::MarshallingError, |_| {}),
        };
        if !operation.is_write() {
            return self.ordered_read(session, xid, opcode, &operation, effects);
        }
        match self.transact(ctx, session, |tree, txn| tree.write(txn, &operation)) {
            Err(code) => reply(xid, self.shown_zxid(), code, |_| {}),
            Ok(done) => {
                let changes = changes_of(&operation, &done);
                self.fire(&changes, effects);
                reply(xid, self.shown_zxid(), Code::Ok, |out| write_done(out, opcode, &done))
            }
        }
    }

    fn auth(&mut self, session: i64, xid: i32, r: &mut Reader<'_>) -> Bytes {
        // AuthPacket: type, scheme, auth. Only `digest` ("user:password") is known.
        let parsed = (|| Ok::<_, crate::jute::JuteError>((r.int()?, r.string()?, r.data()?)))();
        let Ok((_, scheme, auth)) = parsed else {
            return reply(xid, self.shown_zxid(), Code::MarshallingError, |_| {});
        };
        let digest = std::str::from_utf8(&auth).ok().and_then(digest_id);
        let s = self.sessions.get_mut(&session).expect("touched");
        match (scheme.as_str(), digest) {
            ("digest", Some(id)) if s.auth.len() < AUTH_PER_SESSION_MAX => {
                let id = Id {
                    scheme: "digest".into(),
                    id,
                };
                if !s.auth.contains(&id) {
                    s.auth.push(id);
                }
                reply(xid, self.shown_zxid(), Code::Ok, |_| {})
            }
            _ => reply(xid, self.shown_zxid(), Code::AuthFailed, |_| {}),
        }
    }

    fn multi(
        &mut self,
        ctx: &BatchContext,
        session: i64,
        xid: i32,
        r: &mut Reader<'_>,
        effects: &mut Effects,
    ) -> Bytes {
        let Some(ops) = read_multi_ops(r, |_, o| o.is_write()) else {
            return reply(xid, self.shown_zxid(), Code::MarshallingError, |_| {});
        };
        let just_ops: Vec<Op> = ops.iter().map(|(_, o)| o.clone()).collect();
        match self.transact(ctx, session, |tree, txn| tree.multi(txn, &just_ops)) {
            Ok(done) => {
                let changes: Vec<Change> = just_ops.iter().zip(&done).flat_map(|(o, d)| changes_of(o, d)).collect();
                self.fire(&changes, effects);
                reply(xid, self.shown_zxid(), Code::Ok, |out| {
                    for ((opcode, _), d) in ops.iter().zip(&done) {
                        // As ZooKeeper answers inside a multi: create2 as a plain create,
                        // createContainer and createTTL with their Stat.
                        let kind = match *opcode {
                            op::CREATE2 => op::CREATE,
                            op::CREATE_TTL | op::CREATE_CONTAINER => op::CREATE2,
                            other => other,
                        };
                        out.int(kind);
                        out.boolean(false);
                        out.int(0);
                        write_done(out, kind, d);
                    }
                    write_multi_end(out);
                })
            }
            // A failed multi: the header says OK, each result says what became of its op.
            Err(codes) => reply(xid, self.shown_zxid(), Code::Ok, |out| {
                for code in codes {
                    write_multi_error(out, code);
                }
                write_multi_end(out);
            }),
        }
    }

    /// Answers a read from the current state (no watch, nothing changed).
    fn read_reply(&self, session: i64, xid: i32, opcode: i32, operation: &Op) -> Bytes {
        self.read_answer(session, xid, opcode, operation).1
    }

    /// [`ZkService::read_reply`] with the code it answers.
    fn read_answer(&self, session: i64, xid: i32, opcode: i32, operation: &Op) -> (Code, Bytes) {
        let auth = self
            .sessions
            .get(&session)
            .map(|s| s.auth.as_slice())
            .unwrap_or_default();
        let (code, read) = match self.tree.read(operation, session, auth) {
            Err(code) => (code, None),
            // exists on a missing node is NoNode in the header.
            Ok(Read::Exists(None)) => (Code::NoNode, None),
            Ok(read) => (Code::Ok, Some(read)),
        };
        let bytes = reply(xid, self.shown_zxid(), code, |out| {
            if let Some(read) = read {
                write_read(out, opcode, read);
            }
        });
        (code, bytes)
    }

    /// Answers a read in the agreed order, leaving the watch it asks for: on a node that exists
    /// a data watch (exists, getData) or a child watch (getChildren), if the read succeeded; on
    /// a missing node an exist watch (exists only).
    fn ordered_read(&mut self, session: i64, xid: i32, opcode: i32, operation: &Op, effects: &mut Effects) -> Bytes {
        let (code, bytes) = self.read_answer(session, xid, opcode, operation);
        let succeeded = code == Code::Ok;
        let watch = match operation {
            Op::Exists { path, watch: true } if self.tree.get(path).is_some() => Some((Kind::Data, path)),
            Op::Exists { path, watch: true } if crate::tree::validate_path(path, false).is_ok() => {
                Some((Kind::Exist, path))
            }
            Op::GetData { path, watch: true } if succeeded => Some((Kind::Data, path)),
            Op::GetChildren { path, watch: true } if succeeded => Some((Kind::Child, path)),
            _ => None,
        };
        if let Some((kind, path)) = watch {
            if self.positions {
                self.watches.add_unbounded(session, kind, path);
                self.announce_watch(session, path, effects);
            } else {
                self.watches.add(session, kind, path);
            }
        }
        bytes
    }

    fn execute_one(&mut self, ctx: &BatchContext, request: &ServiceRequest, effects: &mut Effects) -> Bytes {
        let Ok(command) = upright_core::codec::from_bytes::<Command>(&request.operation) else {
            return self.answer(0, Bytes::new());
        };
        match command {
            Command::Connect {
                session,
                password,
                timeout_ms,
            } => {
                let (id, bytes) = self.connect(ctx, request.client, session, &password, timeout_ms);
                self.answer(id, bytes)
            }
            Command::Request {
                session,
                xid,
                opcode,
                body,
            } => {
                let call = Call {
                    session,
                    xid,
                    opcode,
                    body: &body,
                };
                let bytes = self.request(ctx, request.client, call, effects);
                self.answer(session, bytes)
            }
            Command::Touch { sessions } => {
                let gone: Vec<i64> = sessions
                    .into_iter()
                    .filter(|&s| !self.touch(s, ctx.time_us, None))
                    .collect();
                self.answer(0, Bytes::from(upright_core::codec::to_bytes(&gone)))
            }
        }
    }
}

/// Whether request `opcode` with record `body` only reads and leaves no watch (not `sync`, whose
/// point is its place in the order): such a request may be answered on the read-only path.
pub fn is_plain_read(opcode: i32, body: &[u8]) -> bool {
    if opcode == op::MULTI_READ {
        return true;
    }
    let mut r = Reader::new(body);
    match Op::read(opcode, &mut r) {
        Some(Ok(operation)) => {
            let ordered = operation.is_write()
                || matches!(
                    operation,
                    Op::Sync { .. }
                        | Op::Exists { watch: true, .. }
                        | Op::GetData { watch: true, .. }
                        | Op::GetChildren { watch: true, .. }
                );
            !ordered && r.finish().is_ok()
        }
        _ => false,
    }
}

/// ZooKeeper's `digest` identity for "user:password": `user:base64(sha1("user:password"))`, as
/// its `DigestAuthenticationProvider` computes it and as clients (kazoo's `make_digest_acl`) put it
/// in ACLs.
pub fn digest_id(user_password: &str) -> Option<String> {
    use base64::Engine;
    use sha1::Digest as _;
    let (user, _) = user_password.split_once(':')?;
    let hash = sha1::Sha1::digest(user_password.as_bytes());
    Some(format!(
        "{user}:{}",
        base64::engine::general_purpose::STANDARD.encode(hash)
    ))
}

/// The tree changes a successful write made (for the watches).
fn changes_of(operation: &Op, done: &Done) -> Vec<Change> {
    match (operation, done) {
        (Op::Create { .. }, Done::Created(path, _)) => vec![Change::Created(path.clone())],
        (Op::Delete { path, .. }, _) => vec![Change::Deleted(path.clone())],
        (Op::SetData { path, .. }, _) => vec![Change::DataChanged(path.clone())],
        _ => Vec::new(),
    }
}

/// A multi's (or multiRead's) result for an operation that failed with `code`.
fn write_multi_error(out: &mut Vec<u8>, code: Code) {
    out.int(op::ERROR);
    out.boolean(false);
    out.int(code.value());
    out.int(code.value());
}

/// The header that ends a multi's (or multiRead's) results.
fn write_multi_end(out: &mut Vec<u8>) {
    out.int(-1);
    out.boolean(true);
    out.int(-1);
}

/// Reads a multi's (or multiRead's) operations up to the closing header, each of a code `allowed`
/// accepts; `None` if the record is malformed or holds another.
fn read_multi_ops(r: &mut Reader<'_>, allowed: impl Fn(i32, &Op) -> bool) -> Option<Vec<(i32, Op)>> {
    let mut ops = Vec::new();
    loop {
        let (opcode, done, _) = (r.int().ok()?, r.boolean().ok()?, r.int().ok()?);
        if done {
            break;
        }
        match Op::read(opcode, r) {
            Some(Ok(o)) if allowed(opcode, &o) => ops.push((opcode, o)),
            _ => return None,
        }
    }
    (r.remaining() == 0).then_some(ops)
}

/// The response record of a write.
fn write_done(out: &mut Vec<u8>, opcode: i32, done: &Done) {
    match done {
        Done::Created(path, stat) => {
            out.string(path);
            if opcode != op::CREATE {
                stat.write(out);
            }
        }
        Done::Stat(stat) => stat.write(out),
        Done::Ok => {}
    }
}

impl Service for ZkService {
    fn execute(&mut self, context: &BatchContext, requests: &[ServiceRequest], effects: &mut Effects) -> Vec<Bytes> {
        let replies = requests
            .iter()
            .enumerate()
            .map(|(i, request)| {
                let context = &BatchContext {
                    index: context.index + i as u32,
                    ..*context
                };
                self.position = self
                    .positions
                    .then(|| position_zxid(context.seqno.0, Some(context.index)));
                let reply = self.execute_one(context, request, effects);
                if self.positions {
                    // A watch on a node the request reads or writes may have fired: its event
                    // comes before this reply (ZooKeeper's order for one node).
                    for object in objects::access(&request.operation)
                        .iter()
                        .flat_map(|a| a.reads.iter().chain(&a.writes))
                    {
                        effects.announce_if_pushed(request.client, object.clone());
                    }
                }
                reply
            })
            .collect();
        self.position = None;
        if self.next_sweep_us.is_none() && self.tree.has_swept() && !self.positions {
            self.next_sweep_us = Some(context.time_us + SWEEP_INTERVAL_US);
        }
        self.nodes.flush(&mut self.tree);
        replies
    }

    fn access(&self, operation: &[u8]) -> Option<upright_core::service::Access> {
        objects::access(operation)
    }

    /// Selective execution (docs/ODRC.md, "ZooKeeper under selective execution"): zxids become
    /// agreed positions, sessions and persistent watches global state, watch events go in their
    /// nodes' streams.
    fn enable_selective_execution(&mut self) -> bool {
        self.use_positions();
        true
    }

    /// Under selective execution's rules the wake-ups (session expiry, the sweep every
    /// interval) depend on the sessions and the clock only.
    fn wakes_on_global_state(&self) -> bool {
        self.positions
    }

    fn placement(&self, object: &[u8]) -> Bytes {
        objects::placement(object)
    }

    /// A znode path's nodes and one-shot watches (`service/objects.rs`).
    fn object_state(&self, object: &[u8]) -> Option<Option<Bytes>> {
        Some(self.object_state_of(object))
    }

    fn restore_object(&mut self, object: &[u8], state: Option<&[u8]>) -> Result<(), RestoreError> {
        self.restore_object_state(object, state)
    }

    fn wake_at(&self) -> Option<u64> {
        let deadline = self.deadlines.first().map(|&(at, _)| at);
        match (deadline, self.sweep_at()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn wake(&mut self, context: &BatchContext, effects: &mut Effects) {
        self.position = self.positions.then(|| position_zxid(context.seqno.0, None));
        while let Some(&(at, session)) = self.deadlines.first() {
            if at > context.time_us {
                break;
            }
            self.end_session(session, effects);
        }
        if self.sweep_at().is_some_and(|at| at <= context.time_us) {
            let gone = self.tree.sweep(self.next_zxid(), (context.time_us / 1_000) as i64);
            if !gone.is_empty() {
                self.wrote();
                let changes: Vec<Change> = gone.into_iter().map(Change::Deleted).collect();
                self.fire(&changes, effects);
            }
            self.next_sweep_us =
                (self.positions || self.tree.has_swept()).then_some(context.time_us + SWEEP_INTERVAL_US);
        }
        self.position = None;
        self.nodes.flush(&mut self.tree);
    }

    fn execute_read_only(&self, operation: &[u8]) -> Option<Bytes> {
        let Ok(Command::Request {
            session,
            xid,
            opcode,
            body,
        }) = upright_core::codec::from_bytes::<Command>(operation)
        else {
            return None;
        };
        if !is_plain_read(opcode, &body) || !self.sessions.contains_key(&session) {
            return None;
        }
        let mut r = Reader::new(&body);
        let bytes = match Op::read(opcode, &mut r) {
            Some(Ok(operation)) => self.read_reply(session, xid, opcode, &operation),
            _ => self.multi_read(session, xid, &mut r),
        };
        Some(self.answer(session, bytes))
    }

    /// Everything but the nodes, which are in [`Service::pages`].
    fn checkpoint(&self) -> Bytes {
        Bytes::from(upright_core::codec::to_bytes(self))
    }

    /// The checkpoint's sessions, watches and indexes, with the nodes of the pages (already
    /// the checkpoint's).
    fn restore(&mut self, checkpoint: &[u8]) -> Result<(), RestoreError> {
        let mut restored: ZkService =
            upright_core::codec::from_bytes(checkpoint).map_err(|e| RestoreError(e.to_string()))?;
        let records = self.nodes.records().map_err(RestoreError)?;
        restored.tree.load(records).map_err(RestoreError)?;
        restored.nodes = std::mem::take(&mut self.nodes);
        restored.nodes.index(&restored.tree);
        restored.positions = self.positions;
        *self = restored;
        Ok(())
    }

    fn pages(&self) -> Option<&Pages> {
        Some(&self.nodes.pages)
    }

    fn pages_mut(&mut self) -> Option<&mut Pages> {
        Some(&mut self.nodes.pages)
    }
}

/// The response record of a read.
fn write_read(out: &mut Vec<u8>, opcode: i32, read: Read) {
    match read {
        Read::Exists(Some(stat)) => stat.write(out),
        Read::Exists(None) => {}
        Read::Data(data, stat) => {
            out.buffer(Some(&data));
            stat.write(out);
        }
        Read::Children(children, stat) => {
            out.strings(&children);
            if opcode == op::GET_CHILDREN2 {
                stat.write(out);
            }
        }
        Read::Acl(acl, stat) => write_acl_stat(out, &acl, &stat),
        Read::Number(n) => out.int(n),
        Read::Paths(paths) => out.strings(&paths),
        Read::Path(path) => out.string(&path),
    }
}

/// Testing only: a service that answers and pushes wrongly (every reply's record and zxid, every
/// event's path altered) while keeping its state right, standing in for a Byzantine replica whose
/// lies the clients' quorums must outvote (`UPRIGHT_TEST_CORRUPT_REPLICA`).
#[derive(Default)]
pub struct Corrupting(ZkService);

fn corrupt_answer(reply: Bytes) -> Bytes {
    let Ok(mut answer) = upright_core::codec::from_bytes::<Answer>(&reply) else {
        return reply;
    };
    answer.zxid += 1_000;
    answer.bytes = flip_last(&answer.bytes);
    Bytes::from(upright_core::codec::to_bytes(&answer))
}

/// `bytes` with a bit of the last byte flipped (a lie of the same length).
fn flip_last(bytes: &[u8]) -> Bytes {
    let mut bytes = bytes.to_vec();
    if let Some(last) = bytes.last_mut() {
        *last ^= 0x20;
    }
    Bytes::from(bytes)
}

fn corrupt_pushes(effects: &mut Effects) {
    for push in effects.take_pushes() {
        let payload = match upright_core::codec::from_bytes::<Event>(&push.payload) {
            Ok(mut event) => {
                event.bytes = flip_last(&event.bytes);
                Bytes::from(upright_core::codec::to_bytes(&event))
            }
            Err(_) => push.payload.clone(),
        };
        effects.add_push(upright_core::service::Push { payload, ..push });
    }
}

impl Service for Corrupting {
    fn execute(&mut self, context: &BatchContext, requests: &[ServiceRequest], effects: &mut Effects) -> Vec<Bytes> {
        let replies = self.0.execute(context, requests, effects);
        corrupt_pushes(effects);
        replies.into_iter().map(corrupt_answer).collect()
    }

    fn access(&self, operation: &[u8]) -> Option<upright_core::service::Access> {
        self.0.access(operation)
    }

    fn placement(&self, object: &[u8]) -> Bytes {
        self.0.placement(object)
    }

    fn enable_selective_execution(&mut self) -> bool {
        self.0.enable_selective_execution()
    }

    fn object_state(&self, object: &[u8]) -> Option<Option<Bytes>> {
        self.0.object_state(object)
    }

    fn restore_object(&mut self, object: &[u8], state: Option<&[u8]>) -> Result<(), RestoreError> {
        self.0.restore_object(object, state)
    }

    fn wake_at(&self) -> Option<u64> {
        self.0.wake_at()
    }

    fn wakes_on_global_state(&self) -> bool {
        self.0.wakes_on_global_state()
    }

    fn wake(&mut self, context: &BatchContext, effects: &mut Effects) {
        self.0.wake(context, effects);
        corrupt_pushes(effects);
    }

    fn execute_read_only(&self, operation: &[u8]) -> Option<Bytes> {
        self.0.execute_read_only(operation).map(corrupt_answer)
    }

    fn checkpoint(&self) -> Bytes {
        self.0.checkpoint()
    }

    fn restore(&mut self, checkpoint: &[u8]) -> Result<(), RestoreError> {
        self.0.restore(checkpoint)
    }

    fn pages(&self) -> Option<&Pages> {
        self.0.pages()
    }

    fn pages_mut(&mut self) -> Option<&mut Pages> {
        self.0.pages_mut()
    }
}

mod objects;
mod paged;
mod watch_requests;

pub use paged::NODE_BUCKETS;

#[cfg(test)]
mod tests;

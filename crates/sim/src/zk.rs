//! `--service zk`: the simulated clients speak ZooKeeper to upright-zk, the service `upright
//! replica --service zk` runs.
//!
//! Each correct client is a small ZooKeeper client ([`ZkClients`]): it opens a session, creates
//! its ephemeral node `/e-<client>`, and carries out each operation of the checkers' key-value
//! model as ZooKeeper requests, one upright operation per request, key `k` being znode `/k`:
//!
//! - **get**: getData (on the ordered path with or without a watch, or on the read-only or
//!   serializable path); NoNode is an absent key;
//! - **put**: setData at any version, or a create if the node is missing (again setData if
//!   someone created it meanwhile);
//! - **append**: getData (with or without a watch), then setData at the version read (or a multi of check and setData),
//!   again from the read on BadVersion; a create with the piece if the node is missing;
//! - **delete**: delete at any version (NoNode is fine), alone or in a multi.
//!
//! Every step's write is atomic, so each model operation takes effect at one step and the
//! linearizability checker sees the model's history. Sessions expire: the service runs with a
//! short tick ([`TICK_MS`]), and now and then a client pauses past its session timeout
//! ([`EXPIRY_PAUSE_PROBABILITY`]); faults expire others. A client told SessionExpired opens a
//! new session and creates its ephemeral node again, which must succeed: the expired session's
//! ephemeral went with it.
//!
//! Watches: an ordered getData may leave a data watch; events arrive as upright pushes. A reply
//! says how many events its session had been sent before it ([`Answer::events`]); like the
//! gateway, the client holds a reply until it has those events, and the checker here asserts
//! ZooKeeper's guarantee: a client never sees a watched node's data change (a newer mzxid, or
//! the node gone) before the watch's event. Events that arrive while a request is outstanding
//! wait for its reply if the service sent them after it (a client registers a watch when it
//! reads the reply that set it). `--sabotage unordered-events` takes replies and events as they
//! arrive.

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use upright_core::kv::{KvOperation, KvReply};
use upright_core::service::ServiceRequest;
use upright_core::stage::{ReadPath, Time};
use upright_core::stages::ServiceFactory;
use upright_zk::jute::Reader;
use upright_zk::proto::{op, request, Acl, Code, Stat};
use upright_zk::service::{Answer, Command, Event, ZkService};

use crate::service::Rewriting;

/// The service's `tickTime` in the simulator (ms): sessions of 2 to 20 ticks.
pub const TICK_MS: i32 = 50;
/// The session timeout the clients ask for (ms).
pub const SESSION_TIMEOUT_MS: i32 = 300;
/// Probability that a client pauses past its session timeout after an operation of the workload.
pub const EXPIRY_PAUSE_PROBABILITY: f64 = 0.03;
/// That pause (virtual microseconds): over twice the session timeout.
pub const EXPIRY_PAUSE_US: Time = 700_000;

/// The execution members' service: upright-zk with [`TICK_MS`]; `corrupt` (sabotage only): one
/// that stores every setData's data with a byte added.
pub fn factory(corrupt: bool) -> ServiceFactory {
    Arc::new(move || {
        let service = ZkService::with_tick_ms(TICK_MS);
        if corrupt {
            Box::new(Rewriting {
                inner: service,
                rewrite: corrupt_set_data,
            })
        } else {
            Box::new(service)
        }
    })
}

/// The bytes of a request of no live session (what the Byzantine client sends).
pub fn stray_request(value: &[u8]) -> Bytes {
    Command::Request {
        session: 0,
        xid: 1,
        opcode: op::SET_DATA,
        body: Bytes::from(request::set_data("/byz", value, -1)),
    }
    .encode()
}

/// What a client does next.
#[derive(Debug, PartialEq, Eq)]
pub enum Next {
    /// Invoke this operation on this path.
    Invoke(Bytes, ReadPath),
    /// Nothing until the events a held reply waits for arrive.
    Hold,
    /// The model operation is complete with this result (a [`KvReply`], or empty if the service
    /// answered something that does not fit).
    Done(Bytes),
}

/// One step of a model operation.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Step {
    Connect,
    Ephemeral,
    Get { watch: bool },
    Set { multi: bool },
    Create,
    AppendRead { watch: bool },
    AppendWrite { new: Bytes, version: i32, multi: bool },
    AppendCreate,
    Delete { multi: bool },
}

/// The model operation in progress.
struct Task {
    op: KvOperation,
    /// The path the workload chose for a get.
    read_path: ReadPath,
    step: Step,
}

/// One client's ZooKeeper state.
#[derive(Default)]
struct Client {
    session: i64,
    xid: i32,
    /// Events of the session received (by their number).
    events: u64,
    /// A push gap: which of the session's events arrived is unknown.
    events_unknown: bool,
    /// Data watches left: path -> the mzxid the watching read saw.
    watches: BTreeMap<String, i64>,
    /// Events received while a request was outstanding, by number: the client takes them in
    /// the service's order, around that request's reply (as the gateway writes them).
    early: Vec<(u64, String)>,
    task: Option<Task>,
    held: Option<Answer>,
    /// A session of this client expired: the next ephemeral create must find the node gone.
    expired_before: bool,
}

/// The ZooKeeper clients of one run and what they found.
pub struct ZkClients {
    clients: BTreeMap<u32, Client>,
    hold_for_events: bool,
    /// The cluster runs with selective execution.
    selective: bool,
    violations: Vec<String>,
    /// Sessions the clients were told had expired.
    pub sessions_expired: u64,
    /// Watch events the clients received.
    pub watch_events: u64,
}

impl ZkClients {
    /// Clients that take replies and events in the service's order (`hold_for_events`; false
    /// only to sabotage: each is taken as it arrives), of a cluster with `selective` execution.
    pub fn new(hold_for_events: bool, selective: bool) -> ZkClients {
        ZkClients {
            clients: BTreeMap::new(),
            hold_for_events,
            selective,
            violations: Vec::new(),
            sessions_expired: 0,
            watch_events: 0,
        }
    }

    /// What the clients found wrong.
    pub fn violations(&self) -> &[String] {
        &self.violations
    }

    /// Starts model operation `op` of `client`; `path`: the path the workload chose (for a get).
    pub fn begin(&mut self, client: u32, op: KvOperation, path: ReadPath, rng: &mut ChaCha8Rng) -> (Bytes, ReadPath) {
        let c = self.clients.entry(client).or_default();
        let step = if c.session == 0 {
            Step::Connect
        } else {
            first_step(&op, path, rng)
        };
        c.task = Some(Task {
            op,
            read_path: path,
            step,
        });
        step_request(c, client, self.selective)
    }

    /// A result was delivered to `client`.
    pub fn deliver(&mut self, client: u32, result: &[u8], rng: &mut ChaCha8Rng) -> Next {
        let Ok(answer) = upright_core::codec::from_bytes::<Answer>(result) else {
            self.violations
                .push(format!("zk: client {client} was given a result that is not an answer"));
            return self.give_up(client);
        };
        let c = self.clients.entry(client).or_default();
        let waits = !matches!(c.task.as_ref().map(|t| &t.step), Some(Step::Connect))
            && self.hold_for_events
            && !c.events_unknown
            && answer.events > c.events;
        if waits {
            c.held = Some(answer);
            return Next::Hold;
        }
        self.process(client, answer, rng)
    }

    /// A push was delivered to `client`; the next step if a held reply could go.
    pub fn pushed(&mut self, client: u32, payload: &[u8], rng: &mut ChaCha8Rng) -> Option<Next> {
        let c = self.clients.entry(client).or_default();
        let Ok(event) = upright_core::codec::from_bytes::<Event>(payload) else {
            self.violations
                .push(format!("zk: client {client} was pushed something that is not an event"));
            return None;
        };
        if event.session != c.session || c.session == 0 {
            return None; // an earlier session's
        }
        // Under selective execution an event is numbered in its node's stream, not among the
        // session's (`seq` 0), and the upright client gives it in order with the replies.
        if event.seq != 0 && !c.events_unknown && event.seq != c.events + 1 {
            self.violations.push(format!(
                "zk: client {client} was given event {} of its session when {} was next",
                event.seq,
                c.events + 1
            ));
        }
        c.events = c.events.max(event.seq);
        self.watch_events += 1;
        match parse_event(&event.bytes) {
            Some((_, path)) if c.task.is_some() && self.hold_for_events => c.early.push((event.seq, path)),
            Some((_, path)) => {
                c.watches.remove(&path);
            }
            None => self
                .violations
                .push(format!("zk: client {client} was given an event it cannot read")),
        }
        self.release(client, rng)
    }

    /// `client` was told some pushes will not come.
    pub fn gap(&mut self, client: u32, rng: &mut ChaCha8Rng) -> Option<Next> {
        let c = self.clients.entry(client).or_default();
        c.events_unknown = true;
        c.watches.clear();
        c.early.clear();
        self.release(client, rng)
    }

    fn release(&mut self, client: u32, rng: &mut ChaCha8Rng) -> Option<Next> {
        let c = self.clients.get_mut(&client)?;
        let ready = c
            .held
            .as_ref()
            .is_some_and(|held| c.events_unknown || held.events <= c.events);
        if !ready {
            return None;
        }
        let held = c.held.take().expect("checked");
        Some(self.process(client, held, rng))
    }

    fn give_up(&mut self, client: u32) -> Next {
        if let Some(c) = self.clients.get_mut(&client) {
            c.task = None;
        }
        Next::Done(Bytes::new())
    }

    fn wrong(&mut self, client: u32, what: String) -> Next {
        self.violations.push(format!("zk: client {client}: {what}"));
        self.give_up(client)
    }

    /// Takes the events the service sent before `answer`, then the answer, then (if the model
    /// operation is over) the later events.
    fn process(&mut self, client: u32, answer: Answer, rng: &mut ChaCha8Rng) -> Next {
        let c = self.clients.get_mut(&client).expect("a client with a task");
        let before = answer.events;
        for (_, path) in c.early.iter().filter(|&&(seq, _)| seq <= before) {
            c.watches.remove(path);
        }
        c.early.retain(|&(seq, _)| seq > before);
        let next = self.step(client, answer, rng);
        if let Some(c) = self.clients.get_mut(&client).filter(|c| c.task.is_none()) {
            for (_, path) in std::mem::take(&mut c.early) {
                c.watches.remove(&path);
            }
        }
        next
    }

    /// The next step after `answer` to the current one.
    fn step(&mut self, client: u32, answer: Answer, rng: &mut ChaCha8Rng) -> Next {
        let selective = self.selective;
        let c = self.clients.get_mut(&client).expect("a client with a task");
        let Some(task) = c.task.as_mut() else {
            return self.wrong(client, "a result with no request outstanding".into());
        };
        let step = task.step.clone();
        if step == Step::Connect {
            let mut r = Reader::new(&answer.bytes);
            let parsed = (|| Ok::<_, upright_zk::jute::JuteError>((r.int()?, r.int()?, r.long()?)))();
            return match parsed {
                Ok((_, timeout, session)) if session != 0 && timeout > 0 => {
                    *c = Client {
                        session,
                        expired_before: c.expired_before,
                        task: c.task.take(),
                        ..Client::default()
                    };
                    c.task.as_mut().expect("kept").step = Step::Ephemeral;
                    invoke(c, client, selective)
                }
                _ => self.wrong(client, "its new session was refused".into()),
            };
        }
        let mut r = Reader::new(&answer.bytes);
        let header = (|| Ok::<_, upright_zk::jute::JuteError>((r.int()?, r.long()?, r.int()?)))();
        let Ok((_, _, err)) = header else {
            return self.wrong(client, format!("an unreadable reply to {step:?}"));
        };
        if err == Code::SessionExpired.value() {
            // The request had no effect: a new session, then the same step again.
            self.sessions_expired += 1;
            c.session = 0;
            c.watches.clear();
            c.expired_before = true;
            task.step = Step::Connect;
            return invoke(c, client, selective);
        }
        let key = task.op.key().clone();
        let node = format!("/{}", String::from_utf8_lossy(&key));
        let value = model_value(&task.op);
        let ok = err == Code::Ok.value();
        // A multi's header says OK; its results say what became of it.
        let err = match step {
            Step::Set { multi: true } | Step::Delete { multi: true } | Step::AppendWrite { multi: true, .. } if ok => {
                match multi_code(&mut r) {
                    Some(code) => code,
                    None => return self.wrong(client, "an unreadable multi result".into()),
                }
            }
            _ => err,
        };
        let code = |c: Code| err == c.value();
        let done = |reply: KvReply| Next::Done(reply.encode());
        let next = match step {
            Step::Connect => unreachable!("handled above"),
            Step::Ephemeral if code(Code::Ok) || (code(Code::NodeExists) && c.expired_before) => {
                if code(Code::NodeExists) {
                    self.violations.push(format!(
                        "zk: client {client}'s ephemeral node outlived its expired session (NodeExists)"
                    ));
                }
                c.expired_before = false;
                let (op, path) = (task.op.clone(), task.read_path);
                task.step = first_step(&op, path, rng);
                None
            }
            Step::Get { watch } => {
                let read = read_data(&mut r, err);
                let Some(read) = read else {
                    return self.wrong(client, format!("getData {node} answered {err}"));
                };
                let serializable = task.read_path == ReadPath::Serializable;
                if let Some(violation) = check_watch(c, client, &node, &read, serializable) {
                    self.violations.push(violation);
                }
                if let (true, Some((_, stat))) = (watch, &read) {
                    c.watches.insert(node.clone(), stat.mzxid);
                }
                c.task = None;
                return done(KvReply::Value(read.map(|(data, _)| data)));
            }
            Step::Set { .. } | Step::Create | Step::Delete { .. } if code(Code::Ok) => {
                c.task = None;
                return done(KvReply::Done);
            }
            Step::Delete { .. } if code(Code::NoNode) => {
                c.task = None;
                return done(KvReply::Done);
            }
            Step::Set { .. } if code(Code::NoNode) => Some(Step::Create),
            Step::Create if code(Code::NodeExists) => Some(Step::Set {
                multi: rng.random_bool(0.3),
            }),
            Step::AppendRead { watch } => match read_data(&mut r, err) {
                Some(read) => {
                    if let Some(violation) = check_watch(c, client, &node, &read, false) {
                        self.violations.push(violation);
                    }
                    if let (true, Some((_, stat))) = (watch, &read) {
                        c.watches.insert(node.clone(), stat.mzxid);
                    }
                    Some(match read {
                        Some((data, stat)) => Step::AppendWrite {
                            new: Bytes::from([&data[..], &value[..]].concat()),
                            version: stat.version,
                            multi: rng.random_bool(0.5),
                        },
                        None => Step::AppendCreate,
                    })
                }
                None => return self.wrong(client, format!("getData {node} answered {err}")),
            },
            Step::AppendWrite { new, .. } if code(Code::Ok) => {
                c.task = None;
                return done(KvReply::Value(Some(new)));
            }
            Step::AppendWrite { .. } if code(Code::BadVersion) || code(Code::NoNode) => Some(Step::AppendRead {
                watch: rng.random_bool(0.5),
            }),
            Step::AppendCreate if code(Code::Ok) => {
                c.task = None;
                return done(KvReply::Value(Some(value)));
            }
            Step::AppendCreate if code(Code::NodeExists) => Some(Step::AppendRead {
                watch: rng.random_bool(0.5),
            }),
            other => return self.wrong(client, format!("{other:?} on {node} answered {err}")),
        };
        if let Some(step) = next {
            c.task.as_mut().expect("in progress").step = step;
        }
        invoke(c, client, selective)
    }
}

/// The first step of `op`.
fn first_step(op: &KvOperation, path: ReadPath, rng: &mut ChaCha8Rng) -> Step {
    match op {
        KvOperation::Burn { .. } => unreachable!("the simulated workload draws no Burn"),
        KvOperation::Get { .. } => Step::Get {
            watch: path == ReadPath::Ordered && rng.random_bool(0.5),
        },
        KvOperation::Put { .. } => Step::Set {
            multi: rng.random_bool(0.3),
        },
        KvOperation::Append { .. } => Step::AppendRead {
            watch: rng.random_bool(0.5),
        },
        KvOperation::Delete { .. } => Step::Delete {
            multi: rng.random_bool(0.5),
        },
    }
}

fn model_value(op: &KvOperation) -> Bytes {
    match op {
        KvOperation::Put { value, .. } | KvOperation::Append { value, .. } => value.clone(),
        _ => Bytes::new(),
    }
}

/// Invokes `c`'s current step.
fn invoke(c: &mut Client, client: u32, selective: bool) -> Next {
    let (operation, path) = step_request(c, client, selective);
    Next::Invoke(operation, path)
}

/// The request of `c`'s current step and the path it takes.
/// `selective`: the cluster runs with selective execution, where a get of a watched node goes on
/// the ordered path, whose reply comes after the node's events (a read-only or serializable
/// answer carries no stream positions; upright-zk's gateway orders such reads too).
fn step_request(c: &mut Client, client: u32, selective: bool) -> (Bytes, ReadPath) {
    let task = c.task.as_ref().expect("a step in progress");
    let node = format!("/{}", String::from_utf8_lossy(task.op.key()));
    let value = model_value(&task.op);
    let (opcode, body, path) = match &task.step {
        Step::Connect => {
            let connect = Command::Connect {
                session: 0,
                password: Bytes::new(),
                timeout_ms: SESSION_TIMEOUT_MS,
            };
            return (connect.encode(), ReadPath::Ordered);
        }
        Step::Ephemeral => {
            let body = request::create(
                &format!("/e-{client}"),
                &c.session.to_be_bytes(),
                &Acl::open(),
                1, /* CreateMode::Ephemeral */
            );
            (op::CREATE, body, ReadPath::Ordered)
        }
        Step::Get { watch } => {
            let path = match selective && c.watches.contains_key(&node) {
                true => ReadPath::Ordered,
                false => task.read_path,
            };
            (op::GET_DATA, request::path_watch(&node, *watch), path)
        }
        Step::AppendRead { watch } => (op::GET_DATA, request::path_watch(&node, *watch), ReadPath::Ordered),
        Step::Set { multi: false } => (op::SET_DATA, request::set_data(&node, &value, -1), ReadPath::Ordered),
        Step::Set { multi: true } => {
            let ops = [(op::SET_DATA, request::set_data(&node, &value, -1))];
            (op::MULTI, request::multi(&ops), ReadPath::Ordered)
        }
        Step::Create | Step::AppendCreate => {
            let body = request::create(&node, &value, &Acl::open(), 0 /* CreateMode::Persistent */);
            (op::CREATE, body, ReadPath::Ordered)
        }
        Step::AppendWrite {
            new,
            version,
            multi: false,
        } => (op::SET_DATA, request::set_data(&node, new, *version), ReadPath::Ordered),
        Step::AppendWrite {
            new,
            version,
            multi: true,
        } => {
            let ops = [
                (op::CHECK, request::path_int(&node, *version)),
                (op::SET_DATA, request::set_data(&node, new, -1)),
            ];
            (op::MULTI, request::multi(&ops), ReadPath::Ordered)
        }
        Step::Delete { multi: false } => (op::DELETE, request::path_int(&node, -1), ReadPath::Ordered),
        Step::Delete { multi: true } => {
            let ops = [(op::DELETE, request::path_int(&node, -1))];
            (op::MULTI, request::multi(&ops), ReadPath::Ordered)
        }
    };
    c.xid += 1;
    let command = Command::Request {
        session: c.session,
        xid: c.xid,
        opcode,
        body: Bytes::from(body),
    };
    (command.encode(), path)
}

/// A getData's outcome: `Some(Some(data, stat))`, `Some(None)` for NoNode, `None` otherwise.
#[allow(clippy::option_option)]
fn read_data(r: &mut Reader<'_>, err: i32) -> Option<Option<(Bytes, Stat)>> {
    if err == Code::NoNode.value() {
        return Some(None);
    }
    if err != Code::Ok.value() {
        return None;
    }
    let data = r.buffer().ok()?.unwrap_or_default();
    let stat = Stat::read(r).ok()?;
    Some(Some((data, stat)))
}

/// The code that decided a multi: OK if it succeeded, else the failing op's own error (the ops
/// after it say RuntimeInconsistency, those before it OK).
fn multi_code(r: &mut Reader<'_>) -> Option<i32> {
    let mut cause = None;
    loop {
        let (kind, done, _) = (r.int().ok()?, r.boolean().ok()?, r.int().ok()?);
        if done {
            return cause;
        }
        if kind != op::ERROR {
            return Some(Code::Ok.value());
        }
        let own = r.int().ok()?;
        if cause.is_none() && own != Code::Ok.value() && own != Code::RuntimeInconsistency.value() {
            cause = Some(own);
        }
    }
}

/// The watch event's type and path.
fn parse_event(bytes: &[u8]) -> Option<(i32, String)> {
    let mut r = Reader::new(bytes);
    let (xid, _, _) = (r.int().ok()?, r.long().ok()?, r.int().ok()?);
    let (kind, _state, path) = (r.int().ok()?, r.int().ok()?, r.string().ok()?);
    (xid == upright_zk::service::NOTIFICATION_XID).then_some((kind, path))
}

/// ZooKeeper's watch guarantee for a read of `node` by `client`: with a data watch left on it
/// (at mzxid `w`), the read must not show a newer version (or the node gone: not checked for a
/// serializable read, which may come from before the node was made).
fn check_watch(
    c: &Client,
    client: u32,
    node: &str,
    read: &Option<(Bytes, Stat)>,
    serializable: bool,
) -> Option<String> {
    let &watched = c.watches.get(node)?;
    let changed = match read {
        Some((_, stat)) => stat.mzxid > watched,
        None => !serializable,
    };
    changed.then(|| {
        format!(
            "zk: client {client} saw {node} change (watched at mzxid {watched}, now {}) before its watch event",
            read.as_ref()
                .map_or("gone".to_string(), |(_, s)| format!("mzxid {}", s.mzxid))
        )
    })
}

/// Sabotage (with [`Rewriting`]): every setData's data with a byte added.
fn corrupt_set_data(request: &ServiceRequest) -> ServiceRequest {
    let Ok(Command::Request {
        session,
        xid,
        opcode: op::SET_DATA,
        body,
    }) = upright_core::codec::from_bytes::<Command>(&request.operation)
    else {
        return request.clone();
    };
    let mut r = Reader::new(&body);
    let Ok((path, data, version)) = (|| Ok::<_, upright_zk::jute::JuteError>((r.string()?, r.data()?, r.int()?)))()
    else {
        return request.clone();
    };
    let command = Command::Request {
        session,
        xid,
        opcode: op::SET_DATA,
        body: Bytes::from(request::set_data(&path, &[&data[..], b"!"].concat(), version)),
    };
    ServiceRequest {
        operation: command.encode(),
        ..request.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_multi_reports_its_own_error() {
        // check fails with BadVersion; the setData after it is RuntimeInconsistency.
        let mut b = Vec::new();
        use upright_zk::jute::Writer;
        for code in [Code::BadVersion, Code::RuntimeInconsistency] {
            b.int(op::ERROR);
            b.boolean(false);
            b.int(code.value());
            b.int(code.value());
        }
        b.int(-1);
        b.boolean(true);
        b.int(-1);
        assert_eq!(multi_code(&mut Reader::new(&b)), Some(Code::BadVersion.value()));
    }

    #[test]
    fn a_read_that_shows_a_watched_change_before_its_event_is_caught() {
        let mut c = Client::default();
        c.watches.insert("/k0".into(), 5);
        let stat = |mzxid| Stat {
            mzxid,
            ..Stat::default()
        };
        let same = Some((Bytes::from_static(b"v"), stat(5)));
        let newer = Some((Bytes::from_static(b"w"), stat(9)));
        assert!(check_watch(&c, 1, "/k0", &same, false).is_none());
        assert!(check_watch(&c, 1, "/k0", &newer, false).is_some());
        assert!(check_watch(&c, 1, "/k0", &None, false).is_some());
        assert!(check_watch(&c, 1, "/k0", &None, true).is_none());
        assert!(check_watch(&c, 1, "/k1", &newer, false).is_none());
    }
}

//! An async client: `invoke(operation) -> result` over the core's client protocol. All clients a
//! process starts together ([`start_clients`]) share one connection to every replica's client
//! listener; each still has its own task, core client, state file and timers.
//!
//! The core client has one outstanding request and queues the rest, delivering results in
//! invocation order, so the host answers invocations first-in first-out.
//!
//! If a state file is given, the client's newest ordered request (its id and operation) is made
//! durable before that request is first sent (UpRight CS3). Request ids are gapless (CS1), so a
//! request that was persisted but never answered (a crash, or the cluster down when the process
//! stopped) must still be ordered, or every later request of this client would wait forever: a
//! restarted client sends it again first, under the same id, and only then continues with the next
//! id (its result goes to nobody; if it had been ordered, the replicas answer from their reply
//! cache). When the answer to a request arrives, its id is written to `<state>.done`, without a
//! sync: a hint only, so the usual restart (last request answered) skips the replay, which the
//! replicas' retransmission pacing would make slow; if the hint is lost the replay is merely slow.
//! If the state file cannot be written the client stops (callers get [`ClientError::Stopped`]); an
//! unreadable state file is an error at start, never "start from id 0".

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::{mpsc, oneshot};
use upright_core::client::Client;
use upright_core::crypto::KeyRing;
use upright_core::ids::{ClientId, Process, ReplicaId, RequestId};
use upright_core::message::Message;
use upright_core::stage::{Action, Input, ReadPath, Stage, Time, Timer};

use crate::files::{endpoint, ClientSetup, FileError};
use crate::replica::Clock;
use crate::transport::{dial_clients, Counters, Dialer, Inbox, CLIENTS_PER_CONNECTION_MAX};

/// Largest frame a client accepts (a reply plus envelope overhead).
const REPLY_FRAME_MAX: usize = upright_core::limits::MESSAGE_BYTES_MAX;
/// Most invocations waiting for the client task.
const COMMANDS_MAX: usize = 1024;
/// Where a client task's sleep waits while its stage has no timer set (kept registered so that
/// setting a timer moves it instead of registering a new one).
const IDLE_SLEEP: Duration = Duration::from_secs(3600);

/// Why an invocation failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Too many invocations are queued.
    #[error("client queue is full")]
    Busy,
    /// The client task stopped (storage failure or shutdown).
    #[error("client stopped")]
    Stopped,
    /// No result within the caller's deadline.
    #[error("timed out")]
    TimedOut,
}

/// Pushed messages waiting for the application (see [`ClientHandle::pushes`]); when it falls this
/// far behind, further pushes are dropped and reported to it as a [`PushEvent::Gap`].
pub const PUSH_QUEUE_MAX: usize = 1024;

/// What the cluster pushed to this client, in order (docs/PROTOCOL.md "Pushed messages"), per
/// stream: the client's own (`stream: None`), and under selective execution each object stream
/// it follows (docs/ODRC.md, "Per-object push streams"), numbered on its own.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PushEvent {
    /// Push `seq` of `stream` (numbered from 1), accepted on `r + 1` matching copies.
    Message {
        /// Its stream.
        stream: Option<Bytes>,
        /// Its number.
        seq: u64,
        /// What the service pushed.
        payload: Bytes,
    },
    /// Pushes `missed_from .. resume_at` of `stream` will not come: the execution members no
    /// longer keep them, or the application did not take them in time.
    Gap {
        /// Its stream.
        stream: Option<Bytes>,
        /// The first missed push.
        missed_from: u64,
        /// The next push that will come.
        resume_at: u64,
    },
}

/// The client task's side of the push queue: a gap for pushes the application did not take.
struct PushOut {
    tx: mpsc::Sender<PushEvent>,
    /// Events put in the queue so far (what [`ClientHandle::invoke_counted`] reports).
    queued: u64,
    /// Per stream, pushes dropped because the queue was full, not yet reported: `(first, next)`
    /// (at most the client's own stream and the object streams it follows).
    dropped: BTreeMap<Option<Bytes>, (u64, u64)>,
}

impl PushOut {
    fn send(&mut self, event: PushEvent) {
        let (stream, first, next) = match &event {
            PushEvent::Message { stream, seq, .. } => (stream.clone(), *seq, seq + 1),
            PushEvent::Gap {
                stream,
                missed_from,
                resume_at,
            } => (stream.clone(), *missed_from, *resume_at),
        };
        if let Some(&(from, _)) = self.dropped.get(&stream) {
            let gap = PushEvent::Gap {
                stream: stream.clone(),
                missed_from: from,
                resume_at: first,
            };
            if self.tx.try_send(gap).is_err() {
                self.dropped.insert(stream, (from, next));
                return;
            }
            self.queued += 1;
            self.dropped.remove(&stream);
        }
        if self.tx.try_send(event).is_err() {
            self.dropped.insert(stream, (first, next));
        } else {
            self.queued += 1;
        }
    }
}

struct Invoke {
    operation: Bytes,
    path: ReadPath,
    reply: oneshot::Sender<Delivered>,
}

/// A result as the client task delivers it: with the number of push events it had put in the
/// push queue before it.
type Delivered = (Bytes, u64);

/// A handle to a running client; cheap to clone (all clones share one client and its ordering).
#[derive(Clone)]
pub struct ClientHandle {
    tx: mpsc::Sender<Invoke>,
    counters: Arc<Counters>,
    pushes: Arc<std::sync::Mutex<Option<mpsc::Receiver<PushEvent>>>>,
}

impl ClientHandle {
    /// The stream of messages the cluster pushes to this client, in order, each once (or a gap
    /// where some are lost); the first call gets it, later calls `None`. Pushes that arrive while
    /// nobody takes them wait in a queue of [`PUSH_QUEUE_MAX`].
    pub fn pushes(&self) -> Option<mpsc::Receiver<PushEvent>> {
        self.pushes.lock().unwrap_or_else(|e| e.into_inner()).take()
    }

    /// Invokes an operation and waits for its result (accepted on a reply quorum); `read_only`
    /// takes the linearizable read-only path ([`ClientHandle::invoke_read_only`]).
    pub async fn invoke(&self, operation: Bytes, read_only: bool) -> Result<Bytes, ClientError> {
        let path = if read_only {
            ReadPath::ReadOnly
        } else {
            ReadPath::Ordered
        };
        self.invoke_on(operation, path).await
    }

    /// Invokes an operation on `path` and waits for its result.
    pub async fn invoke_on(&self, operation: Bytes, path: ReadPath) -> Result<Bytes, ClientError> {
        Ok(self.invoke_counted(operation, path).await?.0)
    }

    /// Invokes an operation on `path`; its result, with the number of events (pushes and gaps)
    /// the client had put in its push queue ([`ClientHandle::pushes`]) before it. The client
    /// delivers results and pushes in one order: under selective execution it holds a reply
    /// until the pushes before the stream positions its request announced are delivered
    /// (docs/PROTOCOL.md, "Pushed messages"), so an application that reads the queue in
    /// another task and writes both to one peer (ZooKeeper's gateway) writes the reply once it
    /// has taken that many events.
    pub async fn invoke_counted(&self, operation: Bytes, path: ReadPath) -> Result<(Bytes, u64), ClientError> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .try_send(Invoke { operation, path, reply })
            .map_err(|e| match e {
                mpsc::error::TrySendError::Full(_) => ClientError::Busy,
                mpsc::error::TrySendError::Closed(_) => ClientError::Stopped,
            })?;
        rx.await.map_err(|_| ClientError::Stopped)
    }

    /// Invokes a read-only operation on the read-only path: answered by every execution member
    /// from its current state and accepted only if all of them match (`Quorums::read_only`);
    /// otherwise (mismatch, a member slow or down, a write operation) the same operation is ordered
    /// like any other. Either way exactly one result, linearizable, comes back.
    pub async fn invoke_read_only(&self, operation: Bytes) -> Result<Bytes, ClientError> {
        self.invoke(operation, true).await
    }

    /// Invokes a read-only operation on the serializable read path: accepted on `r + 1` matching
    /// answers of execution members, so it reflects the state of at least one correct member and
    /// may miss writes acknowledged moments before (ZooKeeper's read semantics); a write operation
    /// or answers that cannot match are ordered instead.
    pub async fn invoke_serializable(&self, operation: Bytes) -> Result<Bytes, ClientError> {
        self.invoke_on(operation, ReadPath::Serializable).await
    }

    /// Like [`ClientHandle::invoke`] with a deadline.
    pub async fn invoke_timeout(
        &self,
        operation: Bytes,
        read_only: bool,
        limit: Duration,
    ) -> Result<Bytes, ClientError> {
        tokio::time::timeout(limit, self.invoke(operation, read_only))
            .await
            .map_err(|_| ClientError::TimedOut)?
    }

    /// Transport counters of this client (shared by the clients of its connection group).
    pub fn counters(&self) -> &Counters {
        &self.counters
    }
}

/// What the state file holds: the newest ordered request's id and, if known, its operation (files
/// written before the operation was kept hold only the id).
type Saved = (RequestId, Option<Bytes>);

/// Reads the state file: `<id>` or `<id>\n<operation as hex>`. No file: a fresh client.
fn read_saved(path: &PathBuf) -> Result<Saved, FileError> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((RequestId(0), None)),
        Err(e) => return Err(FileError(format!("cannot read client state {}: {e}", path.display()))),
    };
    let bad = || {
        FileError(format!(
            "client state {} does not hold a request id (and operation); refusing to guess the next one",
            path.display()
        ))
    };
    let mut lines = text.lines();
    let id = lines.next().and_then(|l| l.trim().parse().ok()).ok_or_else(bad)?;
    let operation = match lines.next().map(str::trim).filter(|l| !l.is_empty()) {
        Some(h) => Some(Bytes::from(hex::decode(h).map_err(|_| bad())?)),
        None => None,
    };
    Ok((RequestId(id), operation))
}

fn done_path(path: &std::path::Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".done");
    PathBuf::from(name)
}

/// Where a restarted client starts: the id to resume after, and the persisted request to send again
/// first (if it may not have been answered).
fn restart_point(path: &Option<PathBuf>) -> Result<(RequestId, Option<Bytes>), FileError> {
    let Some(path) = path else {
        return Ok((RequestId(0), None));
    };
    let (last, operation) = read_saved(path)?;
    let answered = std::fs::read_to_string(done_path(path))
        .ok()
        .and_then(|t| t.trim().parse::<u64>().ok())
        == Some(last.0);
    match operation {
        Some(operation) if last.0 > 0 && !answered => Ok((RequestId(last.0 - 1), Some(operation))),
        _ => Ok((last, None)),
    }
}

fn write_saved(path: &PathBuf, id: RequestId, operation: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(format!("{}\n{}\n", id.0, hex::encode(operation)).as_bytes())?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)?;
    // A bare file name's parent is "" (the current directory).
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => crate::storage::sync_dir(dir)?,
        _ => crate::storage::sync_dir(std::path::Path::new("."))?,
    }
    Ok(())
}

/// Starts a client (must be called inside a tokio runtime). `state_file` keeps the last request
/// id across restarts of this client. A group of one: see [`start_clients`].
pub fn start_client(setup: ClientSetup, state_file: Option<PathBuf>) -> Result<ClientHandle, FileError> {
    let mut handles = start_clients(vec![(setup, state_file)])?;
    Ok(handles.pop().expect("one client started"))
}

/// Starts several clients of one cluster that share one connection per replica (must be called
/// inside a tokio runtime): each dial presents the hellos of all of them, and every client keeps
/// its own task, core client, state file and timers, as if alone. The handles come back in the
/// order of `setups`; clients of one connection group (up to [`CLIENTS_PER_CONNECTION_MAX`])
/// share their transport counters. Nothing starts if any setup is unusable.
pub fn start_clients(setups: Vec<(ClientSetup, Option<PathBuf>)>) -> Result<Vec<ClientHandle>, FileError> {
    crate::timeline::start("client");
    let mut prepared = Vec::with_capacity(setups.len());
    let mut ids = BTreeSet::new();
    for (setup, state_file) in setups {
        if let Some((first, _)) = prepared.first() {
            same_cluster(first, &setup)?;
        }
        if !ids.insert(setup.id) {
            return Err(FileError(format!("client {} is listed twice", setup.id.0)));
        }
        let task = prepare(&setup, state_file)?;
        prepared.push((setup, task));
    }
    let mut handles = Vec::with_capacity(prepared.len());
    let mut rest = prepared.into_iter().peekable();
    while rest.peek().is_some() {
        let group: Vec<_> = rest.by_ref().take(CLIENTS_PER_CONNECTION_MAX).collect();
        handles.extend(start_group(group)?);
    }
    Ok(handles)
}

/// Refuses to group clients of different clusters (or of differently addressed replicas).
fn same_cluster(first: &ClientSetup, other: &ClientSetup) -> Result<(), FileError> {
    let addrs = |s: &ClientSetup| {
        let replicas = &s.cluster.file.replicas;
        let addrs: Vec<(u32, String)> = replicas.iter().map(|e| (e.id, e.client_addr.clone())).collect();
        (s.cluster.config.cluster_name.clone(), addrs)
    };
    if addrs(first) != addrs(other) {
        return Err(FileError(format!(
            "clients {} and {} belong to different clusters; they cannot share connections",
            first.id.0, other.id.0
        )));
    }
    Ok(())
}

/// A client ready to run, not yet connected.
struct Prepared {
    keys: Arc<KeyRing>,
    client: Client,
    state_file: Option<PathBuf>,
    last: RequestId,
    replay: Option<Bytes>,
}

/// Reads the client's state and builds its core client (everything that can fail).
fn prepare(setup: &ClientSetup, state_file: Option<PathBuf>) -> Result<Prepared, FileError> {
    let config = setup.cluster.config.clone();
    let keys = Arc::new(KeyRing::new(&config, Process::Client(setup.id), &setup.keys));
    let (last, replay) = restart_point(&state_file)?;
    let client = Client::resume(config, setup.id, keys.clone(), last).map_err(|e| FileError(e.to_string()))?;
    Ok(Prepared {
        keys,
        client,
        state_file,
        last,
        replay,
    })
}

/// Dials every replica once for the whole group and spawns each client's task.
fn start_group(group: Vec<(ClientSetup, Prepared)>) -> Result<Vec<ClientHandle>, FileError> {
    let cluster = group[0].0.cluster.clone();
    let name = &cluster.config.cluster_name;
    let counters = Arc::new(Counters::default());
    let inboxes: BTreeMap<ClientId, Arc<Inbox>> = group
        .iter()
        .map(|(setup, _)| (setup.id, Arc::new(Inbox::new(counters.clone()))))
        .collect();
    let inboxes = Arc::new(inboxes);
    // Every address first: a bad one refuses the group before any connection is dialled.
    let addrs = cluster
        .file
        .replicas
        .iter()
        .map(|entry| Ok((ReplicaId(entry.id), endpoint(&entry.client_addr)?)))
        .collect::<Result<Vec<_>, FileError>>()?;
    let mut replicas = BTreeMap::new();
    for (to, addr) in addrs {
        let keys = group.iter().map(|(_, p)| p.keys.clone()).collect();
        let dialer = dial_clients(
            addr,
            to,
            keys,
            name.clone(),
            inboxes.clone(),
            REPLY_FRAME_MAX,
            counters.clone(),
        );
        replicas.insert(to, dialer);
    }
    let mut handles = Vec::with_capacity(group.len());
    for (setup, prepared) in group {
        let (tx, rx) = mpsc::channel(COMMANDS_MAX);
        let (push_tx, push_rx) = mpsc::channel(PUSH_QUEUE_MAX);
        let task = ClientTask {
            pushes: PushOut {
                tx: push_tx,
                dropped: BTreeMap::new(),
                queued: 0,
            },
            client: prepared.client,
            replicas: replicas.clone(),
            exec_base: cluster.config.exec_process_base(),
            epoch: cluster.config.epoch(),
            addrs: cluster
                .file
                .replicas
                .iter()
                .map(|e| (ReplicaId(e.id), e.client_addr.clone()))
                .collect(),
            name: name.clone(),
            counters: counters.clone(),
            inbox: inboxes[&setup.id].clone(),
            state_file: prepared.state_file,
            persisted: prepared.last,
            waiting: VecDeque::new(),
            timers: BTreeMap::new(),
            clock: Clock::new(),
        };
        tokio::spawn(task.run(rx, prepared.replay));
        handles.push(ClientHandle {
            tx,
            counters: counters.clone(),
            pushes: Arc::new(std::sync::Mutex::new(Some(push_rx))),
        });
    }
    Ok(handles)
}

struct ClientTask {
    client: Client,
    pushes: PushOut,
    replicas: BTreeMap<ReplicaId, Dialer>,
    /// The first replica process hosting an execution member (`Principal::process_at`): read-only
    /// requests go to execution members, which may run in processes of their own.
    exec_base: u32,
    /// The configuration epoch `replicas` were dialled for, and each replica's client address.
    epoch: u64,
    addrs: BTreeMap<ReplicaId, String>,
    name: String,
    counters: Arc<Counters>,
    inbox: Arc<Inbox>,
    state_file: Option<PathBuf>,
    persisted: RequestId,
    waiting: VecDeque<oneshot::Sender<Delivered>>,
    /// The stage's armed timers (retransmission, push resume, key refresh).
    timers: BTreeMap<Timer, Time>,
    clock: Clock,
}

impl ClientTask {
    async fn run(mut self, mut rx: mpsc::Receiver<Invoke>, replay: Option<Bytes>) {
        let now = self.clock.now();
        if self.step(now, Input::Start).is_err() {
            return;
        }
        if let Some(operation) = replay {
            // The persisted, maybe unanswered request goes first under its own id; no caller.
            let (nobody, _) = oneshot::channel();
            self.waiting.push_back(nobody);
            if self
                .step(
                    now,
                    Input::Invoke {
                        operation,
                        path: ReadPath::Ordered,
                    },
                )
                .is_err()
            {
                return;
            }
        }
        // One sleep for the whole loop, moved to each turn's deadline: a new one per turn made the
        // runtime wake itself through its eventfd (see the replica's `event_loop`); the Redis
        // gateway did two such writes per operation, now 0.13. `armed`: the sleep stands for the
        // stage's timer (otherwise it waits an hour ahead and is not selected).
        let sleep = tokio::time::sleep(IDLE_SLEEP);
        tokio::pin!(sleep);
        let mut armed = false;
        loop {
            let next = self.timers.values().min().copied();
            match next.map(|at| self.clock.instant_of(at)) {
                Some(wake) if !armed || sleep.deadline() != wake => {
                    sleep.as_mut().reset(wake);
                    armed = true;
                }
                None if armed || sleep.is_elapsed() => {
                    sleep.as_mut().reset(tokio::time::Instant::now() + IDLE_SLEEP);
                    armed = false;
                }
                _ => {}
            }
            tokio::select! {
                command = rx.recv() => {
                    let Some(Invoke { operation, path, reply }) = command else { return };
                    if !self.client.can_invoke() {
                        drop(reply); // the caller sees Stopped; the queue bound was reached
                        continue;
                    }
                    self.waiting.push_back(reply);
                    let now = self.clock.now();
                    if self.step(now, Input::Invoke { operation, path }).is_err() {
                        return;
                    }
                }
                _ = self.inbox.notified() => {}
                _ = &mut sleep, if armed => {
                    armed = false;
                    let now = self.clock.now();
                    let due: Vec<Timer> = self.timers.iter().filter(|(_, at)| **at <= now).map(|(t, _)| *t).collect();
                    for timer in due {
                        self.timers.remove(&timer);
                        if self.step(now, Input::Timer(timer)).is_err() {
                            return;
                        }
                    }
                }
            }
            let now = self.clock.now();
            for (_, envelope) in self.inbox.pop_round_robin(usize::MAX) {
                crate::timeline::message("client-recv", &envelope.message, crate::timeline::peer(&envelope.from));
                if self.step(now, Input::Message(envelope)).is_err() {
                    return;
                }
            }
        }
    }

    /// Runs one input. An error means a new request could not be made durable: nothing of
    /// this input was sent, and the task stops (every waiting caller gets `ClientError::Stopped`).
    fn step(&mut self, now: Time, input: Input) -> Result<(), ()> {
        let mut out = Vec::new();
        self.client.handle(now, input, &mut out);
        for action in out {
            match action {
                Action::Send { to, envelope } => {
                    if let Message::ClientRequest {
                        request_id, operation, ..
                    } = &envelope.message
                    {
                        self.persist_request(*request_id, operation)?;
                    }
                    let frame = Arc::new(upright_core::wire::encode(&envelope));
                    if let Message::ClientRequest { client, request_id, .. } = &envelope.message {
                        crate::timeline::event("client-send", u64::from(client.0), request_id.0, to.len() as u64);
                    }
                    for principal in to {
                        let process = principal.process_index(self.exec_base).map(ReplicaId);
                        if let Some(replica) = process.and_then(|r| self.replicas.get(&r)) {
                            replica.send(frame.clone());
                        }
                    }
                }
                Action::SetTimer { timer, at } => {
                    self.timers.insert(timer, at);
                }
                Action::CancelTimer { timer } => {
                    self.timers.remove(&timer);
                }
                Action::Deliver { request_id, result } => {
                    crate::timeline::event("client-deliver", u64::from(self.client.id().0), request_id.0, 0);
                    self.note_answered(request_id);
                    if let Some(reply) = self.waiting.pop_front() {
                        let _ = reply.send((result, self.pushes.queued));
                    }
                }
                Action::DeliverPush { stream, seq, payload } => {
                    self.pushes.send(PushEvent::Message { stream, seq, payload })
                }
                Action::PushGap {
                    stream,
                    missed_from,
                    resume_at,
                } => self.pushes.send(PushEvent::Gap {
                    stream,
                    missed_from,
                    resume_at,
                }),
                Action::Persist { .. } | Action::PersistLazily { .. } | Action::Note(_) => {}
            }
        }
        self.follow_configuration();
        Ok(())
    }

    /// The core client adopted a newer configuration (docs/PROTOCOL.md "Reconfiguration"):
    /// dial the replicas it names whose client address this task has no connection to (its own
    /// connections, with its new keys; the group's stay as they are).
    fn follow_configuration(&mut self) {
        let config = self.client.config().clone();
        if config.epoch() <= self.epoch {
            return;
        }
        self.epoch = config.epoch();
        let Some(signed) = upright_core::reconfig::origin(&config) else {
            return;
        };
        let inboxes: Arc<BTreeMap<ClientId, Arc<Inbox>>> =
            Arc::new([(self.client.id(), self.inbox.clone())].into_iter().collect());
        for (i, text) in signed.change.endpoints.iter().enumerate() {
            let id = ReplicaId(i as u32);
            let Some(client_addr) = crate::files::endpoint_client_addr(text) else {
                tracing::warn!(replica = i, endpoint = %text, "a replica of the new configuration has no client address");
                continue;
            };
            if self.addrs.get(&id).map(String::as_str) == Some(client_addr) {
                continue;
            }
            let Ok(addr) = endpoint(client_addr) else {
                tracing::warn!(
                    replica = i,
                    address = client_addr,
                    "cannot use the client address of a new replica"
                );
                continue;
            };
            tracing::info!(
                replica = i,
                address = client_addr,
                epoch = self.epoch,
                "connecting to a replica of the new configuration"
            );
            let dialer = dial_clients(
                addr,
                id,
                vec![self.client.keys().clone()],
                self.name.clone(),
                inboxes.clone(),
                REPLY_FRAME_MAX,
                self.counters.clone(),
            );
            self.replicas.insert(id, dialer);
            self.addrs.insert(id, client_addr.to_string());
        }
    }

    /// Makes a new ordered request (id and operation) durable in the state file (if there is one)
    /// before it is first sent; retransmissions of it find it persisted already.
    fn persist_request(&mut self, request_id: RequestId, operation: &[u8]) -> Result<(), ()> {
        let Some(path) = &self.state_file else { return Ok(()) };
        if request_id <= self.persisted {
            return Ok(());
        }
        match write_saved(path, request_id, operation) {
            Ok(()) => {
                self.persisted = request_id;
                Ok(())
            }
            Err(e) => {
                // Without the request on disk a restart could reuse its id: stop rather than risk it.
                tracing::error!(path = %path.display(), error = %e, "cannot persist the client's request; client stopped");
                Err(())
            }
        }
    }

    /// The persisted request was answered: leave the hint that a restart need not send it again
    /// (not synced; losing it only makes the next start replay the request).
    fn note_answered(&self, request_id: RequestId) {
        if let Some(path) = &self.state_file {
            if request_id == self.persisted {
                let _ = std::fs::write(done_path(path), request_id.0.to_string());
            }
        }
    }
}

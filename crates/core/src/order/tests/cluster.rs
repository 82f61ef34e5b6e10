//! A deterministic in-test cluster of order members, with fake authentication rows and execution
//! tokens made with real key rings, and a message pump with loss / partition filters.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;

use crate::config::{ClientInfo, ClusterConfig, Knobs, OrderProtocol, ReplicaInfo};
use crate::crypto::{Digest, KeyRing, MatrixRow, MatrixSignature, SecretKeys};
use crate::ids::{ClientId, Principal, Process, ReplicaId, RequestId, SeqNo, StageKind, View};
use crate::message::{AuthItem, Envelope, Message, RequestBody, RequestEntry, Seal, SealFor, SignedEntry};
use crate::order::OrderStage;
use crate::quorum::Quorums;
use crate::stage::{Action, Event, Input, Stage, Storage, Time, Timer};

/// Decides whether a message from `from` to `to` is delivered.
pub(super) type Filter = Box<dyn FnMut(Principal, Principal, &Message) -> bool>;

/// A filter that cuts order member `member` off: it neither sends nor receives.
pub(super) fn cut_off(member: u32) -> Filter {
    let m = Principal::Order(ReplicaId(member));
    Box::new(move |from, to, _| from != m && to != m)
}

pub(super) const CLIENTS: u32 = 3;

pub(super) struct Cluster {
    pub(super) config: Arc<ClusterConfig>,
    pub(super) q: Quorums,
    pub(super) rings: Vec<Arc<KeyRing>>,
    pub(super) members: Vec<Option<OrderStage>>,
    pub(super) storage: Vec<Storage>,
    pub(super) timers: Vec<BTreeMap<Timer, Time>>,
    pub(super) now: Time,
    pub(super) queue: VecDeque<(Principal, Arc<Envelope>)>,
    pub(super) filter: Filter,
    /// Agreement checker: history of each committed seqno (any member).
    pub(super) committed: BTreeMap<SeqNo, Digest>,
    /// NEXT-BATCH senders per seqno (order member -> history).
    /// NEXT-BATCHes received: seqno -> execution member -> sending order member -> history.
    pub(super) next_batches: BTreeMap<SeqNo, BTreeMap<ReplicaId, BTreeMap<ReplicaId, Digest>>>,
    /// The agreed time of each batch sent to execution.
    pub(super) batch_times: BTreeMap<SeqNo, u64>,
    /// Requests seen in NEXT-BATCHes (seqno -> entries).
    pub(super) ordered: BTreeMap<SeqNo, Vec<(ClientId, RequestId)>>,
    pub(super) auto_tokens: bool,
    pub(super) tokens_sent: BTreeSet<SeqNo>,
    pub(super) events: Vec<(usize, Event)>,
    /// PRIMARY-HINTs sent: (sending member, recipient, view, installed).
    pub(super) hints: Vec<(usize, Principal, View, bool)>,
    /// Per member, per client, the newest request it reported ordered to its co-located auth
    /// member (BATCH-COMPLETE; reports to anyone else fail the test). Cleared at a crash.
    pub(super) reported: Vec<BTreeMap<ClientId, RequestId>>,
    pub(super) next_rid: BTreeMap<ClientId, u64>,
    /// Keep lazy writes pending until the member's next eager write (a log is synced in order,
    /// so that write takes them with it) and lose the pending ones at a crash, as if every crash
    /// came before the disk had them. Otherwise lazy writes are as good as synced.
    pub(super) lazy_writes_lost: bool,
    /// Lazy writes of each member not yet made durable by an eager one.
    pub(super) pending_lazy: Vec<Vec<(String, Option<bytes::Bytes>)>>,
}

fn config(u: usize, r: usize, knobs: Knobs, protocol: OrderProtocol) -> (ClusterConfig, Vec<SecretKeys>) {
    let q = Quorums::new(u, r).unwrap();
    let secrets: Vec<SecretKeys> = (0..q.n_replicas())
        .map(|i| SecretKeys::from_seed([i as u8 + 1; 32]))
        .collect();
    let clients = (0..CLIENTS)
        .map(|c| ClientInfo {
            id: ClientId(c),
            keys: SecretKeys::from_seed([100 + c as u8; 32]).public(),
        })
        .collect();
    let config = ClusterConfig {
        cluster_name: "order-test".into(),
        u,
        r,
        replicas: secrets
            .iter()
            .enumerate()
            .map(|(i, s)| ReplicaInfo {
                id: ReplicaId(i as u32),
                keys: s.public(),
            })
            .collect(),
        clients,
        knobs,
        admin: None,
        epoch: 0,
        origin: None,
        protocol,
        selective_execution: false,
        separate_stages: false,
        exec_u: None,
    };
    (config, secrets)
}

pub(super) fn small_knobs() -> Knobs {
    Knobs {
        checkpoint_interval: 4,
        log_window: 8,
        pipeline_window: 4,
        view_change_timeout_us: 100_000,
        // The tests count batches; heartbeats have a test of their own.
        heartbeat_interval_us: 0,
        // The tests count the committed path's messages; tentative execution has its own.
        tentative_entries_max: 0,
        ..Knobs::default()
    }
}

impl Cluster {
    pub(super) fn new(u: usize, r: usize, knobs: Knobs) -> Cluster {
        Cluster::with_protocol(u, r, knobs, OrderProtocol::Pbft)
    }

    /// [`Cluster::new`] running `protocol` (PBFT or its Quorum variant).
    pub(super) fn with_protocol(u: usize, r: usize, knobs: Knobs, protocol: OrderProtocol) -> Cluster {
        let (config, secrets) = config(u, r, knobs, protocol);
        let q = config.validate().unwrap();
        let config = Arc::new(config);
        let rings: Vec<Arc<KeyRing>> = secrets
            .iter()
            .enumerate()
            .map(|(i, s)| Arc::new(KeyRing::new(&config, Process::Replica(ReplicaId(i as u32)), s)))
            .collect();
        let n = q.n_order;
        let mut cluster = Cluster {
            config,
            q,
            rings,
            members: (0..n).map(|_| None).collect(),
            storage: vec![Storage::new(); n],
            timers: vec![BTreeMap::new(); n],
            now: 1_000_000,
            queue: VecDeque::new(),
            filter: Box::new(|_, _, _| true),
            committed: BTreeMap::new(),
            next_batches: BTreeMap::new(),
            batch_times: BTreeMap::new(),
            ordered: BTreeMap::new(),
            auto_tokens: true,
            tokens_sent: BTreeSet::new(),
            events: Vec::new(),
            hints: Vec::new(),
            reported: vec![BTreeMap::new(); n],
            next_rid: BTreeMap::new(),
            lazy_writes_lost: false,
            pending_lazy: vec![Vec::new(); n],
        };
        for i in 0..n {
            cluster.start(i);
        }
        cluster
    }

    /// (Re)creates member `i` from its storage and sends it Start.
    pub(super) fn start(&mut self, i: usize) {
        let stage = OrderStage::new(
            self.config.clone(),
            ReplicaId(i as u32),
            self.rings[i].clone(),
            &self.storage[i],
        )
        .unwrap();
        self.members[i] = Some(stage);
        self.timers[i].clear();
        self.input(i, Input::Start);
    }

    pub(super) fn crash(&mut self, i: usize) {
        self.pending_lazy[i].clear();
        self.reported[i].clear();
        self.members[i] = None;
        self.timers[i].clear();
    }

    pub(super) fn member(&self, i: usize) -> &OrderStage {
        self.members[i].as_ref().expect("member is up")
    }

    pub(super) fn up(&self) -> Vec<usize> {
        (0..self.members.len()).filter(|i| self.members[*i].is_some()).collect()
    }

    pub(super) fn input(&mut self, i: usize, input: Input) {
        let Some(stage) = self.members[i].as_mut() else { return };
        let mut out = Vec::new();
        stage.handle(self.now, input, &mut out);
        for action in out {
            self.apply(i, action);
        }
    }

    pub(super) fn apply(&mut self, i: usize, action: Action) {
        match action {
            // Lazy writes: as good as synced, unless the test says a crash always loses them.
            Action::PersistLazily { key, value } if self.lazy_writes_lost => self.pending_lazy[i].push((key, value)),
            Action::PersistLazily { key, value } => self.write(i, key, value),
            Action::Persist { key, value } => {
                for (key, value) in std::mem::take(&mut self.pending_lazy[i]) {
                    self.write(i, key, value);
                }
                self.write(i, key, value);
            }
            Action::SetTimer { timer, at } => {
                self.timers[i].insert(timer, at);
            }
            Action::CancelTimer { timer } => {
                self.timers[i].remove(&timer);
            }
            Action::Send { to, envelope } => {
                for target in to {
                    match target {
                        Principal::Order(_) => self.queue.push_back((target, envelope.clone())),
                        Principal::Exec(_) => self.exec_receives(target, &envelope),
                        Principal::Auth(_) => match &envelope.message {
                            Message::PrimaryHint { view, installed } => {
                                self.hints.push((i, target, *view, *installed));
                            }
                            Message::BatchComplete { requests, .. } => {
                                assert_eq!(
                                    target,
                                    Principal::Auth(ReplicaId(i as u32)),
                                    "only the co-located member"
                                );
                                for (client, request_id) in requests {
                                    let newest = self.reported[i].entry(*client).or_default();
                                    *newest = (*newest).max(*request_id);
                                }
                            }
                            _ => {}
                        },
                        _ => {}
                    }
                }
            }
            Action::Note(event) => {
                if let Event::Committed { seqno, history, .. } = &event {
                    let agreed = *self.committed.entry(*seqno).or_insert(*history);
                    assert_eq!(agreed, *history, "members committed different batches at {seqno:?}");
                }
                self.events.push((i, event));
            }
            Action::Deliver { .. } | Action::DeliverPush { .. } | Action::PushGap { .. } => {
                panic!("order stage delivered to a client")
            }
        }
    }

    fn write(&mut self, i: usize, key: String, value: Option<bytes::Bytes>) {
        match value {
            Some(v) => self.storage[i].insert(key, v),
            None => self.storage[i].remove(&key),
        };
    }

    /// The fake execution stage: records NEXT-BATCHes and, once an execution member could accept a
    /// checkpoint batch ([`Cluster::exec_agreed`]), sends tokens from every execution member.
    pub(super) fn exec_receives(&mut self, to: Principal, envelope: &Envelope) {
        let (Principal::Exec(exec), Principal::Order(from)) = (to, envelope.from) else {
            return;
        };
        let Message::NextBatch {
            seqno,
            history,
            entries,
            time_us,
            ..
        } = &envelope.message
        else {
            return;
        };
        self.batch_times.insert(*seqno, *time_us);
        self.next_batches
            .entry(*seqno)
            .or_default()
            .entry(exec)
            .or_default()
            .insert(from, *history);
        self.ordered
            .insert(*seqno, entries.iter().map(|e| (e.client, e.request_id)).collect());
        let cp = self.config.knobs.checkpoint_interval;
        if self.auto_tokens && seqno.0 % cp == 0 && self.exec_agreed(*seqno, exec) {
            self.send_tokens(*seqno);
        }
    }

    /// Whether execution member `exec` has what it needs to accept batch `seqno`: the NEXT-BATCH
    /// of its co-located order member, or `q.next_batch()` of them.
    pub(super) fn exec_agreed(&self, seqno: SeqNo, exec: ReplicaId) -> bool {
        self.next_batches
            .get(&seqno)
            .and_then(|by_exec| by_exec.get(&exec))
            .is_some_and(|senders| senders.contains_key(&exec) || senders.len() >= self.q.next_batch())
    }

    /// Sends every token sent so far again (the execution stage resends its newest checkpoint
    /// token on its tick: `resend_newest_checkpoint_token`); for tests whose network lost some.
    pub(super) fn resend_tokens(&mut self) {
        for seqno in std::mem::take(&mut self.tokens_sent) {
            self.send_tokens(seqno);
        }
    }

    pub(super) fn send_tokens(&mut self, seqno: SeqNo) {
        if !self.tokens_sent.insert(seqno) {
            return;
        }
        for e in 0..self.q.n_exec {
            let message = Message::CheckpointToken {
                seqno,
                exec_state: Digest::of(&seqno.0.to_le_bytes()),
            };
            let from = Principal::Exec(ReplicaId(e as u32));
            let env = Arc::new(Envelope::seal(
                &self.rings[e],
                &self.q,
                from,
                message,
                SealFor::Stage(StageKind::Order),
            ));
            for o in ClusterConfig::order_members(&self.q) {
                self.queue.push_back((o, env.clone()));
            }
        }
    }

    /// A client request as every authentication member forwards it (with a valid row each).
    pub(super) fn submit(&mut self, client: u32) -> RequestEntry {
        let rid = self.next_rid.get(&ClientId(client)).map_or(1, |r| r + 1);
        self.submit_body(client, format!("op {client} {rid}").into_bytes())
    }

    /// [`Cluster::submit`] with `operation` as the inline body.
    pub(super) fn submit_body(&mut self, client: u32, operation: Vec<u8>) -> RequestEntry {
        let rid = self.next_rid.entry(ClientId(client)).or_insert(0);
        *rid += 1;
        let entry = RequestEntry {
            client: ClientId(client),
            request_id: RequestId(*rid),
            body: RequestBody::Inline(operation.into()),
        };
        self.resubmit(&entry);
        entry
    }

    /// Delivers the authentication rows of `entry` again to every order member.
    pub(super) fn resubmit(&mut self, entry: &RequestEntry) {
        for a in 0..self.q.n_auth {
            let row = self.row(a, entry);
            let env = Arc::new(Envelope::new(
                Principal::Auth(ReplicaId(a as u32)),
                Message::AuthRequest {
                    items: vec![AuthItem {
                        entry: entry.clone(),
                        row,
                    }],
                },
                Seal::None,
            ));
            for o in ClusterConfig::order_members(&self.q) {
                self.queue.push_back((o, env.clone()));
            }
        }
    }

    pub(super) fn row(&self, auth: usize, entry: &RequestEntry) -> MatrixRow {
        MatrixRow {
            signer: ReplicaId(auth as u32),
            authenticator: self.rings[auth].authenticator(ClusterConfig::order_members(&self.q), &entry.digest()),
        }
    }

    /// A fully signed entry (all authentication rows).
    pub(super) fn signed(&self, entry: &RequestEntry) -> SignedEntry {
        let rows = (0..self.q.n_auth).map(|a| self.row(a, entry)).collect();
        SignedEntry {
            entry: entry.clone(),
            matrix: MatrixSignature { rows },
        }
    }

    /// An envelope sealed by order member `from` (for a Byzantine member driven by the test).
    pub(super) fn forge(&self, from: usize, message: Message) -> Arc<Envelope> {
        let p = Principal::Order(ReplicaId(from as u32));
        Arc::new(Envelope::seal(
            &self.rings[from],
            &self.q,
            p,
            message,
            SealFor::Stage(StageKind::Order),
        ))
    }

    pub(super) fn deliver(&mut self, to: usize, envelope: Arc<Envelope>) {
        self.queue.push_back((Principal::Order(ReplicaId(to as u32)), envelope));
    }

    /// Delivers queued messages until none is left.
    pub(super) fn pump(&mut self) {
        let mut steps = 0;
        while let Some((to, envelope)) = self.queue.pop_front() {
            steps += 1;
            assert!(steps < 1_000_000, "message storm");
            if !(self.filter)(envelope.from, to, &envelope.message) {
                continue;
            }
            let Principal::Order(ReplicaId(i)) = to else { continue };
            self.input(i as usize, Input::Message(envelope));
        }
    }

    /// Advances the clock by `duration`, firing timers in order and pumping after each.
    pub(super) fn run(&mut self, duration: Time) {
        self.pump();
        let end = self.now + duration;
        loop {
            let next = (0..self.timers.len())
                .flat_map(|i| self.timers[i].iter().map(move |(t, at)| (*at, i, *t)))
                .filter(|(at, _, _)| *at <= end)
                .min();
            let Some((at, i, timer)) = next else { break };
            self.now = self.now.max(at);
            self.timers[i].remove(&timer);
            self.input(i, Input::Timer(timer));
            self.pump();
        }
        self.now = end;
    }

    pub(super) fn min_committed(&self) -> SeqNo {
        self.up()
            .iter()
            .map(|i| self.member(*i).last_committed())
            .min()
            .unwrap()
    }

    pub(super) fn ordered_requests(&self) -> BTreeSet<(ClientId, RequestId)> {
        self.ordered.values().flatten().copied().collect()
    }

    /// Per client, the newest request member `i` has committed.
    pub(super) fn last_ordered(&self, i: usize) -> BTreeMap<ClientId, RequestId> {
        self.member(i).prefix.last_ordered.clone()
    }

    /// The lowest committed prefix among `members`.
    pub(super) fn min_committed_of(&self, members: &[usize]) -> SeqNo {
        members
            .iter()
            .map(|i| self.member(*i).last_committed())
            .min()
            .unwrap_or_default()
    }

    pub(super) fn stat(&self, i: usize, name: &str) -> u64 {
        self.member(i).stats().get(name)
    }
}

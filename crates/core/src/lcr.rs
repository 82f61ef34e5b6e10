//! LCR: the crash-only order stage (Quéma ch. 2; docs/PROTOCOL.md "LCR"), for clusters with
//! `r = 0` that set `protocol = "lcr"`.
//!
//! Every order member of a view's ring broadcasts batches of the requests its authentication
//! member forwards. A broadcast travels once around the ring, stamped with its origin's vector
//! clock; the member before its origin marks it stable and sends an ACK around after it. Every
//! member keeps the broadcasts it received sorted by LCR's total order `≺` (the order in which
//! the ring's last member receives them, computed from the clocks) and decides the head of that
//! list whenever it is stable: each decided broadcast is the next batch of the sequence the
//! execution stage runs, through the same contract as PBFT's ([`crate::contract`]).
//!
//! Where the paper assumes more than upright has, this module supplies it:
//! - **FIFO links over a lossy network.** RING messages are numbered per link and view; the
//!   successor takes them in order (holding a bounded number that arrive early) and answers
//!   LINK-ACK; the sender retransmits what is unacknowledged at each tick.
//! - **Crash-recovery instead of crash-stop ("Durability").** A member makes every broadcast it
//!   receives from another origin durable before it forwards anything after it, so a decided
//!   broadcast is on the disks of every ring member but its origin: `n - 1 >= u + 1` of them,
//!   and every RECOVER quorum (`n - u`) includes one. Its own broadcasts, its decisions and the
//!   stable marks are written lazily (a view change finds them again); a member that restarts
//!   rejoins through a view change with what it wrote.
//! - **Views without a perfect failure detector.** The paper's view change (RECOVER,
//!   ACK_RECOVER, END_RECOVERY) relies on a group membership service that never errs. Here a
//!   member that sees no progress for the view-change timeout (or restarts) moves to the next
//!   view: it sends CHANGE to all and RECOVER (its decided log and the broadcasts it holds) to
//!   the view's leader. The leader waits for `n - u` RECOVERs (a majority: `n = 2u + 1`), for
//!   all of them at most a short collect time more, and decides the view's ring (those that
//!   answered) and its start: the longest decided log of the members of the most recent view,
//!   then every broadcast they hold that it does not contain, in `≺` order (uniform agreement:
//!   a batch any member decided was received by every member of that view's ring, and every
//!   `≺`-earlier one was decided before it). The members write the NEW-VIEW and answer
//!   ACCEPTED; once every ring member did, the leader sends END and the start is decided
//!   (released to execution). Because rings are majorities and a NEW-VIEW is decided only once
//!   all its ring holds it, the next leader always hears from a member that holds the last
//!   decided start, and a member that promised a later view takes no part in an earlier one.
//! - **Fairness and flow control.** A member adds at most one batch of its own to each RING
//!   message it sends and keeps at most `pipeline_window` of its broadcasts undecided: forwarded
//!   traffic always goes first, so no member's bursts crowd out the others (the paper's
//!   `burst_size` rule serves the same purpose with per-origin counters).
//!
//! Requests need one matrix row (`q.matrix_accept()`): no member lies at `r = 0`. Every
//! authentication member forwards each request to every order member at once, and client `c`'s
//! requests are broadcast by the ring member at position `c mod ring length` only, so each
//! request crosses the ring once (a member that holds a ready request nobody ordered for the
//! view-change timeout moves to the next view, whose ring leaves a silent member out). A request
//! broadcast twice all the same (the ring changed in between) is dropped when it is decided a
//! second time: each client's last ordered request is part of the decided state.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;

use crate::config::{ClusterConfig, ConfigError, Sabotage};
use crate::contract::tokens::TokenTally;
use crate::contract::{self, OrderSide, Routed, WakeUps};
use crate::crypto::{Digest, KeyRing, MatrixRow};
use crate::ids::{ClientId, Principal, ReplicaId, RequestId, SeqNo, StageKind, View};
use crate::limits::{LAST_EXEC_RESEND_MAX, VIEW_CHANGE_BACKOFF_MAX};
use crate::message::lcr::{
    Broadcast, BroadcastId, Decided, LcrMessage, LcrTimer, NewView, Recover, RingRecord, Snapshot,
};
use crate::message::{batch_digest, history_digest, AuthItem, Envelope, Message, RequestEntry, SealFor};
use crate::order::persist;
use crate::order::request_pool::{Inserted, RequestPool};
use crate::quorum::Quorums;
use crate::stage::{Action, Event, Input, Stage, Stats, Storage, Time, Timer};

/// RING messages of the current view that may arrive ahead of the next expected one and are
/// held until it does (more are dropped and come again with the sender's retransmission).
pub const EARLY_LINKS_MAX: usize = 256;
/// Unacknowledged RING messages a member resends at each tick (oldest first).
pub const RESEND_PER_TICK_MAX: usize = 64;

const VIEW_KEY: &str = "lcr/view";
const LOW_KEY: &str = "lcr/low";
const LOG_PREFIX: &str = "lcr/log/";
const PENDING_PREFIX: &str = "lcr/pending/";

/// What a member writes about its views.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
struct ViewRecord {
    promised: u64,
    installed: u64,
    ring: Vec<ReplicaId>,
}

/// A broadcast held in the pending list.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
struct Held {
    broadcast: Broadcast,
    stable: bool,
}

/// The decided prefix's state: what the next decision is computed from.
#[derive(Clone, Debug, Default)]
struct Prefix {
    seqno: SeqNo,
    history: Digest,
    time_us: u64,
    last_ordered: BTreeMap<ClientId, RequestId>,
}

impl Prefix {
    fn from_snapshot(s: &Snapshot) -> Prefix {
        Prefix {
            seqno: s.seqno,
            history: s.history,
            time_us: s.time_us,
            last_ordered: s.last_ordered.iter().copied().collect(),
        }
    }

    fn snapshot(&self) -> Snapshot {
        Snapshot {
            seqno: self.seqno,
            history: self.history,
            time_us: self.time_us,
            last_ordered: self.last_ordered.iter().map(|(c, r)| (*c, *r)).collect(),
            exec_state: None,
        }
    }

    fn last_ordered_of(&self, client: ClientId) -> RequestId {
        self.last_ordered.get(&client).copied().unwrap_or_default()
    }

    /// The batch `b` becomes when decided next: its requests not ordered before it (none if it
    /// had requests and all were).
    fn decide(&self, b: &Broadcast) -> Option<Decided> {
        let mut seen: BTreeMap<ClientId, RequestId> = BTreeMap::new();
        let entries: Vec<RequestEntry> = b
            .entries
            .iter()
            .filter(|e| {
                let last = seen
                    .get(&e.client)
                    .copied()
                    .unwrap_or_else(|| self.last_ordered_of(e.client));
                let fresh = e.request_id > last;
                if fresh {
                    seen.insert(e.client, e.request_id);
                }
                fresh
            })
            .cloned()
            .collect();
        if entries.is_empty() && !b.entries.is_empty() {
            return None;
        }
        let time_us = b.time_us.max(self.time_us + 1);
        let digest = batch_digest(time_us, entries.iter().map(RequestEntry::digest));
        Some(Decided {
            seqno: self.seqno.next(),
            from: b.id,
            time_us,
            history: history_digest(&self.history, &digest),
            entries,
        })
    }

    fn apply(&mut self, d: &Decided) {
        self.seqno = d.seqno;
        self.history = d.history;
        self.time_us = d.time_us;
        for e in &d.entries {
            self.last_ordered.insert(e.client, e.request_id);
        }
    }
}

/// Whether `a ≺ b` (LCR's total order within a view): with `i`, `j` their origins' ring
/// positions, `a` goes first iff `b`'s origin had received `a` when it sent `b` (`i < j`, or
/// the same origin's earlier broadcast), else iff `a`'s origin had not received `b` when it
/// sent `a`.
pub fn precedes(a: &Broadcast, b: &Broadcast) -> bool {
    let (i, j) = (a.id.origin as usize, b.id.origin as usize);
    let at = |clock: &[u64], k: usize| clock.get(k).copied().unwrap_or(0);
    match i.cmp(&j) {
        std::cmp::Ordering::Equal => a.id.index < b.id.index,
        std::cmp::Ordering::Less => a.id.index <= at(&b.clock, i),
        std::cmp::Ordering::Greater => at(&a.clock, j) < b.id.index,
    }
}

/// Inserts `b` into `list`, kept in `≺` order.
fn insert_sorted<T>(list: &mut Vec<T>, item: T, key: impl Fn(&T) -> &Broadcast) {
    let at = list
        .iter()
        .position(|x| precedes(key(&item), key(x)))
        .unwrap_or(list.len());
    list.insert(at, item);
}

/// The leader's side of a view change in progress.
#[derive(Default)]
struct Leading {
    view: u64,
    recovers: BTreeMap<ReplicaId, Recover>,
    collect_armed: bool,
    new_view: Option<Arc<NewView>>,
    accepted: BTreeSet<ReplicaId>,
    ended: bool,
}

/// The LCR order stage.
pub struct LcrStage {
    config: Arc<ClusterConfig>,
    q: Quorums,
    id: ReplicaId,
    keys: Arc<KeyRing>,
    stats: Stats,
    key_repair: crate::session::KeyRepair,

    // ---- views ----
    /// Highest view this member moved to (it takes part in no earlier one).
    promised: u64,
    /// The view whose NEW-VIEW it accepted last (0: the first view, all members, started
    /// without one).
    installed: u64,
    ring: Vec<ReplicaId>,
    /// The installed view is running (END received, or the first view).
    active: bool,
    /// When a view change in progress gives up and moves to the next view.
    change_deadline: Option<Time>,
    /// View changes since this member was last active (the timeout doubles with each).
    changes: u32,
    leading: Option<Leading>,
    /// First start on empty storage: write the view record before anything is sent.
    fresh: bool,

    // ---- the ring ----
    clock: Vec<u64>,
    /// Received broadcasts of the installed view, not decided, in `≺` order.
    pending: Vec<Held>,
    out_seq: u64,
    unacked: VecDeque<(u64, Principal, Arc<Envelope>)>,
    in_next: u64,
    early_links: BTreeMap<u64, Vec<RingRecord>>,
    to_forward: Vec<RingRecord>,
    last_progress: Time,

    // ---- the decided sequence ----
    /// The oldest kept prefix (a certified checkpoint, or the start).
    low: Snapshot,
    log: BTreeMap<SeqNo, Decided>,
    prefix: Prefix,
    /// Decided batches through here went to execution.
    released: SeqNo,
    /// The prefix at checkpoint sequence numbers above `low`, until their tokens certify them.
    candidates: BTreeMap<SeqNo, Snapshot>,
    tokens: TokenTally,

    // ---- requests ----
    pool: RequestPool,
    /// The last request of each client this member broadcast in the current view.
    proposed: BTreeMap<ClientId, RequestId>,
    batch_cursor: ClientId,
    batch_timer_armed: bool,
    /// The batch-delay timer fired: the next batch goes out however full.
    batch_close_due: bool,
    wakes: WakeUps,
    wake_armed: Option<Time>,
    retransmitted: crate::order::intake::RetransmitPacer,
}

impl LcrStage {
    /// Member `id`, restored from `storage` (empty on first start).
    ///
    /// Panics if `storage` holds LCR records that do not decode: they are this member's own
    /// writes.
    pub fn new(
        config: Arc<ClusterConfig>,
        id: ReplicaId,
        keys: Arc<KeyRing>,
        storage: &Storage,
    ) -> Result<LcrStage, ConfigError> {
        let q = config.validate()?;
        crate::order::check_member_id(&q, id)?;
        let view: Option<ViewRecord> = storage
            .get(VIEW_KEY)
            .map(|b| crate::codec::from_bytes(b).unwrap_or_else(|_| panic!("corrupt LCR storage at {VIEW_KEY}")));
        let low: Snapshot = storage.get(LOW_KEY).map_or_else(Snapshot::default, |b| {
            crate::codec::from_bytes(b).unwrap_or_else(|_| panic!("corrupt LCR storage at {LOW_KEY}"))
        });
        let mut log = BTreeMap::new();
        let mut pending = Vec::new();
        for (key, value) in storage.range(LOG_PREFIX.to_string()..) {
            if !key.starts_with(LOG_PREFIX) {
                break;
            }
            let d: Decided = crate::codec::from_bytes(value).unwrap_or_else(|_| panic!("corrupt LCR storage at {key}"));
            log.insert(d.seqno, d);
        }
        for (key, value) in storage.range(PENDING_PREFIX.to_string()..) {
            if !key.starts_with(PENDING_PREFIX) {
                break;
            }
            let held: Held = crate::codec::from_bytes(value).unwrap_or_else(|_| panic!("corrupt LCR storage at {key}"));
            insert_sorted(&mut pending, held, |h| &h.broadcast);
        }
        let n = q.n_order;
        let record = view.clone().unwrap_or_else(|| ViewRecord {
            promised: 0,
            installed: 0,
            ring: (0..n as u32).map(ReplicaId).collect(),
        });
        let mut stage = LcrStage {
            pool: RequestPool::new(&config),
            config,
            q,
            id,
            keys,
            stats: Stats::default(),
            key_repair: Default::default(),
            promised: record.promised,
            installed: record.installed,
            clock: vec![0; record.ring.len()],
            ring: record.ring,
            active: false,
            change_deadline: None,
            changes: 0,
            leading: None,
            fresh: view.is_none(),
            pending,
            out_seq: 0,
            unacked: VecDeque::new(),
            in_next: 1,
            early_links: BTreeMap::new(),
            to_forward: Vec::new(),
            last_progress: 0,
            released: low.seqno,
            low,
            log,
            prefix: Prefix::default(),
            candidates: BTreeMap::new(),
            tokens: TokenTally::default(),
            proposed: BTreeMap::new(),
            batch_cursor: ClientId(u32::MAX),
            batch_timer_armed: false,
            batch_close_due: false,
            wakes: WakeUps::default(),
            wake_armed: None,
            retransmitted: Default::default(),
        };
        stage.rebuild_prefix();
        Ok(stage)
    }

    /// The view this member is in or moving to.
    pub fn view(&self) -> u64 {
        self.promised
    }

    /// Whether its installed view is running.
    pub fn is_active(&self) -> bool {
        self.active
    }

    /// Highest decided batch.
    pub fn last_decided(&self) -> SeqNo {
        self.prefix.seqno
    }

    fn me(&self) -> Principal {
        Principal::Order(self.id)
    }

    fn sabotage(&self) -> Option<Sabotage> {
        self.config.knobs.sabotage
    }

    fn timeout(&self) -> Time {
        let exponent = self.changes.min(VIEW_CHANGE_BACKOFF_MAX);
        self.config.knobs.view_change_timeout_us.saturating_mul(1 << exponent)
    }

    fn tick_period(&self) -> Time {
        (self.config.knobs.view_change_timeout_us / 4).max(1)
    }

    fn leader_of(&self, view: u64) -> ReplicaId {
        ReplicaId((view % self.q.n_order as u64) as u32)
    }

    fn position(&self) -> Option<usize> {
        self.ring.iter().position(|r| *r == self.id)
    }

    fn successor(&self) -> Option<ReplicaId> {
        let p = self.position()?;
        Some(self.ring[(p + 1) % self.ring.len()])
    }

    fn predecessor(&self) -> Option<ReplicaId> {
        let p = self.position()?;
        Some(self.ring[(p + self.ring.len() - 1) % self.ring.len()])
    }

    /// The ring position before `p`.
    fn before(&self, p: usize) -> usize {
        (p + self.ring.len() - 1) % self.ring.len()
    }

    fn send(&self, out: &mut Vec<Action>, to: Vec<Principal>, message: Message, seal: SealFor) {
        if to.is_empty() {
            return;
        }
        let envelope = Envelope::seal(&self.keys, &self.q, self.me(), message, seal);
        out.push(Action::Send {
            to,
            envelope: Arc::new(envelope),
        });
    }

    fn send_to(&self, out: &mut Vec<Action>, to: ReplicaId, message: LcrMessage) {
        let to = Principal::Order(to);
        self.send(out, vec![to], Message::Lcr(message), SealFor::One(to));
    }

    fn send_to_others(&self, out: &mut Vec<Action>, message: LcrMessage) {
        let others: Vec<Principal> = ClusterConfig::order_members(&self.q)
            .filter(|p| *p != self.me())
            .collect();
        self.send(out, others, Message::Lcr(message), SealFor::Stage(StageKind::Order));
    }

    fn send_to_own_auth(&self, out: &mut Vec<Action>, message: Message) {
        let to = Principal::Auth(self.id);
        self.send(out, vec![to], message, SealFor::One(to));
    }

    /// PRIMARY-HINT naming no primary: the authentication member forwards every request to
    /// every order member at once (the member a client is assigned to broadcasts it).
    fn hint_auth(&self, out: &mut Vec<Action>) {
        let message = Message::PrimaryHint {
            view: View(self.id.0 as u64),
            installed: false,
        };
        self.send_to_own_auth(out, message);
    }

    fn tell_auth_ordered(&self, seqno: SeqNo, requests: Vec<(ClientId, RequestId)>, out: &mut Vec<Action>) {
        for chunk in requests.chunks(crate::limits::BATCH_REQUESTS_MAX) {
            let message = Message::BatchComplete {
                seqno,
                requests: chunk.to_vec(),
            };
            self.send_to_own_auth(out, message);
        }
    }

    fn tell_auth_last_ordered(&self, out: &mut Vec<Action>) {
        let requests = self.prefix.last_ordered.iter().map(|(c, r)| (*c, *r)).collect();
        self.tell_auth_ordered(self.released, requests, out);
    }

    // ---- storage (written with the order stage's helpers, `crate::order::persist`) ----

    fn log_key(seqno: SeqNo) -> String {
        format!("{LOG_PREFIX}{:020}", seqno.0)
    }

    fn pending_key(id: &BroadcastId) -> String {
        format!("{PENDING_PREFIX}{:020}/{:04}/{:020}", id.view, id.origin, id.index)
    }

    fn write_view(&self, out: &mut Vec<Action>) {
        let record = ViewRecord {
            promised: self.promised,
            installed: self.installed,
            ring: self.ring.clone(),
        };
        persist::write(out, VIEW_KEY.to_string(), &record);
    }

    /// Recomputes the prefix and the checkpoint candidates from `low` through the log.
    fn rebuild_prefix(&mut self) {
        self.prefix = Prefix::from_snapshot(&self.low);
        self.candidates.clear();
        let interval = self.config.knobs.checkpoint_interval;
        let low = self.low.seqno;
        self.log.retain(|s, _| *s > low);
        for d in self.log.values() {
            if d.seqno != self.prefix.seqno.next() {
                break;
            }
            self.prefix.apply(d);
            if d.seqno.0.is_multiple_of(interval) {
                self.candidates.insert(d.seqno, self.prefix.snapshot());
            }
        }
        let end = self.prefix.seqno;
        self.log.retain(|s, _| *s <= end);
    }

    // ---- deciding ----

    /// Appends `d` (the next batch) to the decided sequence; released at once when `release`.
    fn append(&mut self, now: Time, d: Decided, release: bool, out: &mut Vec<Action>) {
        debug_assert_eq!(d.seqno, self.prefix.seqno.next());
        // Lazily: every ring member but the origin wrote the broadcast before it forwarded it,
        // so a view change finds it again if this record is lost (module doc, "Durability").
        persist::write_lazily(out, Self::log_key(d.seqno), &d);
        self.prefix.apply(&d);
        for e in &d.entries {
            self.pool.gc(e.client, e.request_id);
        }
        if d.seqno.0.is_multiple_of(self.config.knobs.checkpoint_interval) {
            self.candidates.insert(d.seqno, self.prefix.snapshot());
        }
        self.log.insert(d.seqno, d);
        self.last_progress = now;
        if release {
            self.release(out);
        }
    }

    /// Decides broadcast `b` next (unless all its requests were ordered before).
    fn decide(&mut self, now: Time, b: &Broadcast, out: &mut Vec<Action>) {
        match self.prefix.decide(b) {
            Some(d) => self.append(now, d, true, out),
            None => self.stats.bump("broadcast_already_ordered"),
        }
    }

    /// Sends every decided batch after `released` to execution and reports it.
    fn release(&mut self, out: &mut Vec<Action>) {
        while self.released < self.prefix.seqno {
            let seqno = self.released.next();
            let Some(d) = self.log.get(&seqno) else {
                // Below what is kept (a member adopting a later start): execution asks LAST-EXEC.
                self.released = seqno;
                continue;
            };
            let message = contract::next_batch(View(self.installed), seqno, d.history, d.time_us, d.entries.clone());
            let to = self.next_batch_recipients();
            self.send(out, to, message, SealFor::Stage(StageKind::Exec));
            out.push(Action::Note(Event::Committed {
                seqno,
                view: View(self.installed),
                history: d.history,
            }));
            let requests: Vec<(ClientId, RequestId)> = d.entries.iter().map(|e| (e.client, e.request_id)).collect();
            if !requests.is_empty() {
                self.tell_auth_ordered(seqno, requests, out);
            }
            self.released = seqno;
        }
        self.try_checkpoint(out);
    }

    /// The co-located execution member, and (from the ring's first member) those whose order
    /// member is not on the ring.
    fn next_batch_recipients(&self) -> Vec<Principal> {
        let mut to = Vec::new();
        if (self.id.0 as usize) < self.q.n_exec {
            to.push(Principal::Exec(self.id));
        }
        if self.ring.first() == Some(&self.id) {
            for e in 0..self.q.n_exec as u32 {
                if !self.ring.contains(&ReplicaId(e)) && e != self.id.0 {
                    to.push(Principal::Exec(ReplicaId(e)));
                }
            }
        }
        to
    }

    /// Decides the head of the pending list while it is stable.
    fn try_deliver(&mut self, now: Time, out: &mut Vec<Action>) {
        while self.pending.first().is_some_and(|h| h.stable) {
            let held = self.pending.remove(0);
            self.decide(now, &held.broadcast, out);
            // After the decision's record, so a crash that loses a suffix of the lazy writes
            // keeps the broadcast in one form or the other.
            persist::delete_lazily(out, Self::pending_key(&held.broadcast.id));
        }
    }

    /// A certified checkpoint at or below `released` becomes the new `low`: the log before it
    /// is dropped.
    fn try_checkpoint(&mut self, out: &mut Vec<Action>) {
        let quorum = self.q.checkpoint_token();
        let best = self
            .candidates
            .range(..=self.released)
            .rev()
            .find_map(|(s, _)| self.tokens.certified(*s, quorum).map(|d| (*s, d)));
        let Some((seqno, exec_state)) = best else {
            return;
        };
        let mut low = self.candidates[&seqno].clone();
        low.exec_state = Some(exec_state);
        persist::write(out, LOW_KEY.to_string(), &low);
        let dropped: Vec<SeqNo> = self.log.range(..=seqno).map(|(s, _)| *s).collect();
        for s in dropped {
            self.log.remove(&s);
            persist::delete(out, Self::log_key(s));
        }
        self.candidates = self.candidates.split_off(&seqno.next());
        self.tokens.prune_below(seqno.next());
        self.low = low;
        out.push(Action::Note(Event::CheckpointStable { seqno }));
    }

    // ---- the ring ----

    fn my_undecided(&self) -> usize {
        let Some(me) = self.position() else { return 0 };
        self.pending
            .iter()
            .filter(|h| h.broadcast.id.origin as usize == me)
            .count()
    }

    /// Broadcasts a batch of `entries` (none: a wake-up) on the ring.
    fn broadcast(&mut self, now: Time, entries: Vec<RequestEntry>, out: &mut Vec<Action>) {
        let Some(me) = self.position() else { return };
        self.clock[me] += 1;
        let b = Broadcast {
            id: BroadcastId {
                view: self.installed,
                origin: me as u32,
                index: self.clock[me],
            },
            clock: self.clock.clone(),
            time_us: now,
            entries,
        };
        self.stats.bump("broadcasts");
        if self.ring.len() == 1 || self.sabotage() == Some(Sabotage::UnstableDelivery) {
            self.decide(now, &b, out);
            if self.ring.len() > 1 {
                self.to_forward.push(RingRecord::Data(b));
            }
            return;
        }
        self.hold(b.clone(), false, out);
        self.to_forward.push(RingRecord::Data(b));
    }

    /// Writes broadcast `b` and adds it to the pending list.
    fn hold(&mut self, b: Broadcast, stable: bool, out: &mut Vec<Action>) {
        let held = Held { broadcast: b, stable };
        let key = Self::pending_key(&held.broadcast.id);
        if held.broadcast.id.origin as usize == self.position().unwrap_or(usize::MAX) {
            // Its own broadcast: the others' copies make it durable (module doc, "Durability").
            persist::write_lazily(out, key, &held);
        } else {
            persist::write(out, key, &held);
        }
        insert_sorted(&mut self.pending, held, |h| &h.broadcast);
    }

    fn on_ring(
        &mut self,
        now: Time,
        from: ReplicaId,
        view: u64,
        seq: u64,
        records: &[RingRecord],
        out: &mut Vec<Action>,
    ) {
        if !self.active || view != self.installed || Some(from) != self.predecessor() {
            return self.stats.bump("drop_ring_not_expected");
        }
        if seq < self.in_next {
            self.stats.bump("ring_duplicate");
            return self.link_ack(from, out);
        }
        if seq > self.in_next {
            if self.early_links.len() < EARLY_LINKS_MAX {
                self.early_links.insert(seq, records.to_vec());
            }
            return self.stats.bump("ring_early");
        }
        self.process_records(now, records, out);
        self.in_next += 1;
        while let Some(records) = self.early_links.remove(&self.in_next) {
            self.process_records(now, &records, out);
            self.in_next += 1;
        }
        self.early_links = self.early_links.split_off(&self.in_next);
        self.last_progress = now;
        self.link_ack(from, out);
    }

    /// LINK-ACK to the predecessor `to`: every RING message before `in_next` arrived.
    fn link_ack(&self, to: ReplicaId, out: &mut Vec<Action>) {
        let message = LcrMessage::LinkAck {
            view: self.installed,
            through: self.in_next - 1,
        };
        self.send_to(out, to, message);
    }

    fn process_records(&mut self, now: Time, records: &[RingRecord], out: &mut Vec<Action>) {
        let Some(me) = self.position() else { return };
        for record in records {
            match record {
                RingRecord::Data(b) => {
                    let j = b.id.origin as usize;
                    if j >= self.ring.len()
                        || b.clock.len() != self.ring.len()
                        || b.id.view != self.installed
                        || j == me
                    {
                        self.stats.bump("drop_bad_broadcast");
                        continue;
                    }
                    if b.id.index <= self.clock[j] {
                        self.stats.bump("drop_duplicate_broadcast");
                        continue;
                    }
                    self.clock[j] = b.id.index;
                    let last = me == self.before(j);
                    if self.sabotage() == Some(Sabotage::UnstableDelivery) {
                        self.decide(now, b, out);
                        if !last {
                            self.to_forward.push(RingRecord::Data(b.clone()));
                        }
                        continue;
                    }
                    self.hold(b.clone(), last, out);
                    if last {
                        self.to_forward.push(RingRecord::Ack(b.id));
                        self.try_deliver(now, out);
                    } else {
                        self.to_forward.push(RingRecord::Data(b.clone()));
                    }
                }
                RingRecord::Ack(id) => {
                    let j = id.origin as usize;
                    if j >= self.ring.len() {
                        self.stats.bump("drop_bad_ack");
                        continue;
                    }
                    if let Some(held) = self.pending.iter_mut().find(|h| h.broadcast.id == *id) {
                        // Not written: a restarted member reports what it holds, stable or not.
                        held.stable = true;
                    } else {
                        self.stats.bump("ack_of_unknown_broadcast");
                    }
                    if me != self.before(self.before(j)) {
                        self.to_forward.push(RingRecord::Ack(*id));
                    }
                    self.try_deliver(now, out);
                }
            }
        }
    }

    fn on_link_ack(&mut self, now: Time, from: ReplicaId, view: u64, through: u64) {
        if !self.active || view != self.installed || Some(from) != self.successor() {
            return self.stats.bump("drop_link_ack_not_expected");
        }
        let before = self.unacked.len();
        while self.unacked.front().is_some_and(|(s, _, _)| *s <= through) {
            self.unacked.pop_front();
        }
        if self.unacked.len() < before {
            self.last_progress = now;
        }
    }

    /// Sends what waits to be forwarded, with at most one batch of this member's own.
    fn flush_ring(&mut self, now: Time, out: &mut Vec<Action>) {
        if !self.active {
            return;
        }
        self.propose(now, out);
        if self.to_forward.is_empty() {
            return;
        }
        let Some(successor) = self.successor() else { return };
        self.out_seq += 1;
        let message = Message::Lcr(LcrMessage::Ring {
            view: self.installed,
            seq: self.out_seq,
            records: std::mem::take(&mut self.to_forward),
        });
        let to = Principal::Order(successor);
        let envelope = Arc::new(Envelope::seal(
            &self.keys,
            &self.q,
            self.me(),
            message,
            SealFor::One(to),
        ));
        if self.unacked.is_empty() {
            self.last_progress = now;
        }
        self.unacked.push_back((self.out_seq, to, envelope.clone()));
        out.push(Action::Send { to: vec![to], envelope });
    }

    /// Broadcasts one batch of ready requests (or a due wake-up) if this member has room.
    fn propose(&mut self, now: Time, out: &mut Vec<Action>) {
        let knobs = &self.config.knobs;
        let (size_max, delay_us, window) = (knobs.batch_size_max, knobs.batch_delay_us, knobs.pipeline_window);
        if self.my_undecided() as u64 >= window
            || self.prefix.seqno.0 >= self.low.seqno.0 + knobs.log_window
            || self
                .to_forward
                .iter()
                .any(|r| matches!(r, RingRecord::Data(b) if Some(b.id.origin as usize) == self.position()))
        {
            return;
        }
        let rows = self.q.matrix_accept();
        let mut entries = Vec::new();
        let mut last_client = None;
        let (me, members) = (self.position().unwrap_or(0), self.ring.len().max(1));
        for client in self.pool.clients_after(self.batch_cursor) {
            if entries.len() >= size_max {
                break;
            }
            if client.0 as usize % members != me {
                // Another member's client: it broadcasts the request.
                continue;
            }
            let last = self
                .prefix
                .last_ordered_of(client)
                .max(self.proposed.get(&client).copied().unwrap_or_default());
            if let Some(candidate) = self.pool.ready(client, last.next(), rows) {
                entries.push(candidate.signed().entry);
                last_client = Some(client);
            }
        }
        if entries.is_empty() {
            if self.wake_due(now) {
                self.stats.bump("wake_up_broadcasts");
                self.broadcast(now, Vec::new(), out);
            }
            return;
        }
        if entries.len() < size_max && delay_us > 0 && !self.batch_close_due {
            if !self.batch_timer_armed {
                self.batch_timer_armed = true;
                out.push(Action::SetTimer {
                    timer: Timer::Lcr(LcrTimer::BatchClose),
                    at: now + delay_us,
                });
            }
            return;
        }
        self.batch_close_due = false;
        if let Some(c) = last_client {
            self.batch_cursor = c;
        }
        for e in &entries {
            self.proposed.insert(e.client, e.request_id);
        }
        self.broadcast(now, entries, out);
    }

    /// Whether some client's next request is ready to be ordered here (if its member does not
    /// broadcast it, the ring moves to a view without that member).
    fn requests_wait(&self) -> bool {
        let rows = self.q.matrix_accept();
        self.pool.clients().any(|client| {
            let next = self.prefix.last_ordered_of(client).next();
            self.pool.ready(client, next, rows).is_some()
        })
    }

    /// Whether a wake-up batch is due and this member (the ring's first, with nothing of its
    /// own undecided) broadcasts it.
    fn wake_due(&self, now: Time) -> bool {
        self.ring.first() == Some(&self.id)
            && self.my_undecided() == 0
            && self
                .wakes
                .due(self.prefix.time_us, self.q.small())
                .is_some_and(|at| at <= now)
    }

    fn arm_wake(&mut self, now: Time, out: &mut Vec<Action>) {
        if !self.active || self.ring.first() != Some(&self.id) {
            return;
        }
        let due = self.wakes.due(self.prefix.time_us, self.q.small());
        if let Some(at) = due {
            if at > now && self.wake_armed != Some(at) {
                self.wake_armed = Some(at);
                out.push(Action::SetTimer {
                    timer: Timer::Lcr(LcrTimer::Wake),
                    at,
                });
            }
        }
    }

    // ---- view changes ----

    /// Moves to view `view`: CHANGE to all, RECOVER to its leader.
    fn start_change(&mut self, now: Time, view: u64, out: &mut Vec<Action>) {
        debug_assert!(view > self.promised || (view == self.promised && !self.active));
        self.stats.bump("view_changes_started");
        self.promised = view;
        self.active = false;
        self.write_view(out);
        self.change_deadline = Some(now + self.timeout());
        self.changes = self.changes.saturating_add(1);
        self.leading = (self.leader_of(view) == self.id).then(|| Leading {
            view,
            ..Leading::default()
        });
        self.hint_auth(out);
        self.send_to_others(out, LcrMessage::Change { view });
        self.send_recover(now, out);
    }

    fn own_recover(&self) -> Recover {
        Recover {
            view: self.promised,
            installed: self.installed,
            low: self.low.clone(),
            log: self.log.values().cloned().collect(),
            pending: self.pending.iter().map(|h| h.broadcast.clone()).collect(),
        }
    }

    fn send_recover(&mut self, now: Time, out: &mut Vec<Action>) {
        let recover = self.own_recover();
        let leader = self.leader_of(self.promised);
        if leader == self.id {
            self.on_recover(now, self.id, recover, out);
        } else {
            self.send_to(out, leader, LcrMessage::Recover(Box::new(recover)));
        }
    }

    fn on_change(&mut self, now: Time, view: u64, out: &mut Vec<Action>) {
        if view > self.promised {
            self.start_change(now, view, out);
        }
    }

    fn on_recover(&mut self, now: Time, from: ReplicaId, recover: Recover, out: &mut Vec<Action>) {
        if recover.view > self.promised {
            self.start_change(now, recover.view, out);
        }
        let medium = self.q.order_medium();
        let n = self.q.n_order;
        let Some(leading) = self.leading.as_mut().filter(|l| l.view == recover.view) else {
            return self.stats.bump("drop_recover_not_leading");
        };
        if leading.new_view.is_some() {
            return self.stats.bump("drop_recover_after_new_view");
        }
        leading.recovers.insert(from, recover);
        let count = leading.recovers.len();
        if count >= n {
            self.compose(now, out);
        } else if count >= medium && !leading.collect_armed {
            leading.collect_armed = true;
            out.push(Action::SetTimer {
                timer: Timer::Lcr(LcrTimer::Collect),
                at: now + self.tick_period() / 2,
            });
        }
    }

    /// The leader's NEW-VIEW from the RECOVERs it holds.
    fn compose(&mut self, now: Time, out: &mut Vec<Action>) {
        let Some(leading) = self.leading.as_mut() else { return };
        if leading.new_view.is_some() || leading.recovers.len() < self.q.order_medium() {
            return;
        }
        let newest = leading.recovers.values().map(|r| r.installed).max().unwrap_or(0);
        let at_newest: Vec<&Recover> = leading.recovers.values().filter(|r| r.installed == newest).collect();
        let end_of = |r: &Recover| r.log.last().map_or(r.low.seqno, |d| d.seqno);
        let best = at_newest
            .iter()
            .copied()
            .max_by_key(|r| end_of(r))
            .expect("the leader holds a RECOVER");
        let mut prefix = Prefix::from_snapshot(&best.low);
        let mut entries = Vec::new();
        for d in &best.log {
            if d.seqno == prefix.seqno.next() {
                prefix.apply(d);
                entries.push(d.clone());
            }
        }
        let decided: BTreeSet<BroadcastId> = entries.iter().map(|d| d.from).collect();
        let mut union: Vec<&Broadcast> = Vec::new();
        let mut seen = BTreeSet::new();
        for r in &at_newest {
            for b in &r.pending {
                if b.id.view == newest && !decided.contains(&b.id) && seen.insert(b.id) {
                    insert_sorted(&mut union, b, |b| b);
                }
            }
        }
        for b in union {
            if let Some(d) = prefix.decide(b) {
                prefix.apply(&d);
                entries.push(d);
            }
        }
        let new_view = Arc::new(NewView {
            view: leading.view,
            ring: leading.recovers.keys().copied().collect(),
            low: best.low.clone(),
            entries,
        });
        leading.new_view = Some(new_view.clone());
        self.stats.bump("new_views_sent");
        for member in new_view.ring.iter().filter(|m| **m != self.id) {
            self.send_to(out, *member, LcrMessage::NewView(Box::new((*new_view).clone())));
        }
        self.accept(now, &new_view, out);
    }

    fn on_new_view(&mut self, now: Time, from: ReplicaId, nv: &NewView, out: &mut Vec<Action>) {
        if from != self.leader_of(nv.view) || nv.view < self.promised || !nv.ring.contains(&self.id) {
            return self.stats.bump("drop_new_view");
        }
        if nv.view == self.installed {
            // Already accepted: the leader missed the answer.
            return self.send_to(out, from, LcrMessage::Accepted { view: nv.view });
        }
        self.accept(now, nv, out);
    }

    /// Writes `nv` and answers ACCEPTED: the decided start it carries is released at END.
    fn accept(&mut self, now: Time, nv: &NewView, out: &mut Vec<Action>) {
        for held in std::mem::take(&mut self.pending) {
            persist::delete(out, Self::pending_key(&held.broadcast.id));
        }
        if self.released < nv.low.seqno {
            // Behind the start: adopt its prefix.
            for s in self.log.keys() {
                persist::delete(out, Self::log_key(*s));
            }
            self.log.clear();
            self.low = nv.low.clone();
            persist::write(out, LOW_KEY.to_string(), &self.low);
            self.released = self.released.max(nv.low.seqno);
        } else {
            let replaced: Vec<SeqNo> = self.log.range(nv.low.seqno.next()..).map(|(s, _)| *s).collect();
            for s in replaced {
                self.log.remove(&s);
                persist::delete(out, Self::log_key(s));
            }
        }
        for d in nv.entries.iter().filter(|d| d.seqno > self.low.seqno) {
            persist::write(out, Self::log_key(d.seqno), d);
            self.log.insert(d.seqno, d.clone());
        }
        self.rebuild_prefix();
        for d in self.log.values() {
            for e in &d.entries {
                self.pool.gc(e.client, e.request_id);
            }
        }
        self.promised = nv.view;
        self.installed = nv.view;
        self.ring = nv.ring.clone();
        self.active = false;
        self.write_view(out);
        self.stats.bump("new_views_accepted");
        let leader = self.leader_of(nv.view);
        if leader == self.id {
            self.on_accepted(now, self.id, nv.view, out);
        } else {
            self.send_to(out, leader, LcrMessage::Accepted { view: nv.view });
        }
    }

    fn on_accepted(&mut self, now: Time, from: ReplicaId, view: u64, out: &mut Vec<Action>) {
        let Some(leading) = self.leading.as_mut().filter(|l| l.view == view) else {
            return self.stats.bump("drop_accepted_not_leading");
        };
        let Some(nv) = leading.new_view.clone() else { return };
        if !nv.ring.contains(&from) {
            return;
        }
        leading.accepted.insert(from);
        if leading.ended {
            if from != self.id {
                self.send_to(out, from, LcrMessage::End { view });
            }
            return;
        }
        if leading.accepted.len() == nv.ring.len() {
            leading.ended = true;
            for member in nv.ring.iter().filter(|m| **m != self.id) {
                self.send_to(out, *member, LcrMessage::End { view });
            }
            self.on_end(now, self.id, view, out);
        }
    }

    fn on_end(&mut self, now: Time, from: ReplicaId, view: u64, out: &mut Vec<Action>) {
        if from != self.leader_of(view) || view != self.installed || view != self.promised || self.active {
            return self.stats.bump("drop_end");
        }
        self.activate(now, out);
    }

    /// Starts the installed view: its start is decided, the ring runs.
    fn activate(&mut self, now: Time, out: &mut Vec<Action>) {
        self.active = true;
        self.clock = vec![0; self.ring.len()];
        self.out_seq = 0;
        self.unacked.clear();
        self.in_next = 1;
        self.early_links.clear();
        self.to_forward.clear();
        self.proposed.clear();
        self.change_deadline = None;
        self.changes = 0;
        self.last_progress = now;
        self.wake_armed = None;
        self.release(out);
        self.tell_auth_last_ordered(out);
        self.hint_auth(out);
        out.push(Action::Note(Event::ViewInstalled {
            view: View(self.installed),
        }));
    }

    // ---- requests ----

    fn row_valid(&self, digest: &Digest, row: &MatrixRow) -> bool {
        crate::order::intake::matrix_row_valid(&self.keys, &self.q, self.id, self.sabotage(), digest, row)
    }

    fn on_auth_requests(&mut self, now: Time, from: ReplicaId, items: &[AuthItem], out: &mut Vec<Action>) {
        for item in items {
            let (entry, row) = (&item.entry, &item.row);
            if row.signer != from || !self.pool.knows(entry.client) {
                self.stats.bump("drop_auth_item");
                continue;
            }
            let digest = self.pool.digest_of(entry);
            if !self.row_valid(&digest, row) {
                self.stats.bump("drop_bad_matrix_row");
                continue;
            }
            let last = self.prefix.last_ordered_of(entry.client);
            if entry.request_id <= last {
                self.retransmit_reply(now, entry.client, entry.request_id, out);
                continue;
            }
            match self.pool.insert(entry, digest, row, last) {
                Inserted::New => self.stats.bump("request_rows"),
                Inserted::TooFarAhead => self.stats.bump("drop_request_too_far_ahead"),
                _ => self.stats.bump("drop_duplicate_row"),
            }
        }
    }

    fn retransmit_reply(&mut self, now: Time, client: ClientId, request_id: RequestId, out: &mut Vec<Action>) {
        let interval = self.config.knobs.auth_retransmit_interval_us;
        if !self.retransmitted.due(now, interval, client, request_id) {
            return;
        }
        for exec in ClusterConfig::exec_members(&self.q) {
            self.send(
                out,
                vec![exec],
                contract::retransmit(client, request_id),
                SealFor::One(exec),
            );
        }
    }

    // ---- input ----

    fn on_message(&mut self, now: Time, envelope: &Envelope, out: &mut Vec<Action>) {
        if envelope.open(&self.keys, self.me(), self.sabotage()).is_err() {
            self.stats.reject("drop_bad_seal");
            let me = self.me();
            self.key_repair.after_bad_seal(&self.keys, &self.q, me, envelope, out);
            return;
        }
        if !self.config.contains(envelope.from, &self.q) {
            return self.stats.bump("drop_unknown_sender");
        }
        match contract::route_to_order(self, now, envelope.from, &envelope.message, out) {
            Routed::Handled => return,
            Routed::WrongSender => return self.stats.bump("drop_wrong_sender_or_kind"),
            Routed::NotContract => {}
        }
        match (&envelope.message, envelope.from) {
            (Message::AuthRequest { items }, Principal::Auth(from)) => self.on_auth_requests(now, from, items, out),
            (Message::Lcr(message), Principal::Order(from)) => match message {
                LcrMessage::Ring { view, seq, records } => self.on_ring(now, from, *view, *seq, records, out),
                LcrMessage::LinkAck { view, through } => self.on_link_ack(now, from, *view, *through),
                LcrMessage::Change { view } => self.on_change(now, *view, out),
                LcrMessage::Recover(recover) => {
                    if recover.log.windows(2).any(|w| w[1].seqno != w[0].seqno.next()) {
                        return self.stats.bump("drop_recover_with_gaps");
                    }
                    self.on_recover(now, from, (**recover).clone(), out)
                }
                LcrMessage::NewView(nv) => self.on_new_view(now, from, nv, out),
                LcrMessage::Accepted { view } => self.on_accepted(now, from, *view, out),
                LcrMessage::End { view } => self.on_end(now, from, *view, out),
            },
            _ => self.stats.bump("drop_wrong_sender_or_kind"),
        }
    }

    fn on_tick(&mut self, now: Time, out: &mut Vec<Action>) {
        out.push(Action::SetTimer {
            timer: Timer::Lcr(LcrTimer::Tick),
            at: now + self.tick_period(),
        });
        if self.active {
            for (_, to, envelope) in self.unacked.iter().take(RESEND_PER_TICK_MAX) {
                out.push(Action::Send {
                    to: vec![*to],
                    envelope: envelope.clone(),
                });
            }
            let waiting = !self.pending.is_empty() || !self.unacked.is_empty() || self.requests_wait();
            if waiting && now >= self.last_progress.saturating_add(self.timeout()) {
                self.stats.bump("suspected_ring");
                self.start_change(now, self.promised + 1, out);
            }
            return;
        }
        if self.change_deadline.is_some_and(|at| now >= at) {
            return self.start_change(now, self.promised + 1, out);
        }
        if self.promised > self.installed {
            self.send_to_others(out, LcrMessage::Change { view: self.promised });
            self.send_recover(now, out);
        } else {
            let leader = self.leader_of(self.installed);
            if leader != self.id {
                self.send_to(out, leader, LcrMessage::Accepted { view: self.installed });
            }
        }
        if let Some(nv) = self.leading.as_ref().and_then(|l| {
            l.new_view
                .clone()
                .filter(|_| !l.ended)
                .map(|nv| (nv, l.accepted.clone()))
        }) {
            let (nv, accepted) = nv;
            for member in nv.ring.iter().filter(|m| !accepted.contains(m)) {
                self.send_to(out, *member, LcrMessage::NewView(Box::new((*nv).clone())));
            }
        }
    }
}

impl OrderSide for LcrStage {
    fn checkpoint_token(
        &mut self,
        _now: Time,
        from: ReplicaId,
        seqno: SeqNo,
        exec_state: Digest,
        out: &mut Vec<Action>,
    ) {
        if !seqno.0.is_multiple_of(self.config.knobs.checkpoint_interval) || seqno <= self.low.seqno {
            return self.stats.bump("drop_token_out_of_window");
        }
        self.tokens.offer(from, seqno, exec_state);
        self.try_checkpoint(out);
    }

    fn last_executed(&mut self, _now: Time, from: ReplicaId, seqno: SeqNo, out: &mut Vec<Action>) {
        let to = Principal::Exec(from);
        if seqno < self.low.seqno {
            if let Some(exec_state) = self.low.exec_state {
                let message = contract::load_checkpoint(self.low.seqno, exec_state);
                self.send(out, vec![to], message, SealFor::Stage(StageKind::Exec));
            }
            return;
        }
        let through = self.released.min(SeqNo(seqno.0 + LAST_EXEC_RESEND_MAX));
        if through <= seqno {
            return;
        }
        for (s, d) in self.log.range(seqno.next()..=through) {
            let message = contract::next_batch(View(self.installed), *s, d.history, d.time_us, d.entries.clone());
            self.send(out, vec![to], message, SealFor::Stage(StageKind::Exec));
        }
    }

    fn wake_at(&mut self, now: Time, from: ReplicaId, seqno: SeqNo, at_us: Option<u64>, out: &mut Vec<Action>) {
        self.wakes.offer(from, seqno, at_us);
        self.arm_wake(now, out);
    }
}

impl Stage for LcrStage {
    fn principal(&self) -> Principal {
        self.me()
    }

    fn handle(&mut self, now: Time, input: Input, out: &mut Vec<Action>) {
        match input {
            Input::Start | Input::Recover => {
                out.push(Action::SetTimer {
                    timer: Timer::Lcr(LcrTimer::Tick),
                    at: now + self.tick_period(),
                });
                if std::mem::take(&mut self.fresh) {
                    self.write_view(out);
                    self.activate(now, out);
                } else {
                    // A restart: rejoin through the next view with what was written.
                    self.tell_auth_last_ordered(out);
                    let next = self.promised.max(self.installed) + 1;
                    self.start_change(now, next, out);
                }
            }
            Input::Message(envelope) => self.on_message(now, &envelope, out),
            Input::Timer(Timer::Lcr(LcrTimer::Tick)) => self.on_tick(now, out),
            Input::Timer(Timer::Lcr(LcrTimer::BatchClose)) => {
                self.batch_timer_armed = false;
                self.batch_close_due = true;
            }
            Input::Timer(Timer::Lcr(LcrTimer::Collect)) => {
                if let Some(l) = self.leading.as_mut() {
                    l.collect_armed = false;
                }
                self.compose(now, out);
            }
            Input::Timer(Timer::Lcr(LcrTimer::Wake)) => {
                self.wake_armed = None;
            }
            Input::Timer(_) | Input::Invoke { .. } => self.stats.bump("drop_unexpected_input"),
        }
        self.flush_ring(now, out);
        self.arm_wake(now, out);
    }

    fn stats(&self) -> &Stats {
        &self.stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn b(origin: u32, index: u64, clock: &[u64]) -> Broadcast {
        Broadcast {
            id: BroadcastId { view: 0, origin, index },
            clock: clock.to_vec(),
            time_us: 0,
            entries: Vec::new(),
        }
    }

    #[test]
    fn the_papers_example_orders_the_later_origin_first_when_it_had_not_seen_the_other() {
        // Quéma 2.3: m1 from p1 carries [0,1,0,0], m3 from p3 carries [0,0,0,1]: m3 ≺ m1.
        let m1 = b(1, 1, &[0, 1, 0, 0]);
        let m3 = b(3, 1, &[0, 0, 0, 1]);
        assert!(precedes(&m3, &m1));
        assert!(!precedes(&m1, &m3));
        // Had p3 received m1 before sending, m1 would go first.
        let m3_after = b(3, 1, &[0, 1, 0, 1]);
        assert!(precedes(&m1, &m3_after));
        assert!(!precedes(&m3_after, &m1));
    }

    fn entry(client: u32) -> RequestEntry {
        RequestEntry {
            client: ClientId(client),
            request_id: RequestId(1),
            body: crate::message::RequestBody::Inline(Bytes::from_static(b"op")),
        }
    }

    fn with_entry(mut b: Broadcast, client: u32) -> Broadcast {
        b.entries = vec![entry(client)];
        b
    }

    /// Member `leader` of a fresh 3-member cluster (u = 1), moved to `view` (which it leads).
    fn leader_of(leader: u32, view: u64) -> (LcrStage, Vec<Action>) {
        let f = crate::testing::fixture(1, 0, 4, crate::config::Knobs::default());
        let mut stage = LcrStage::new(
            f.config.clone(),
            ReplicaId(leader),
            f.replicas[leader as usize].clone(),
            &Storage::new(),
        )
        .unwrap();
        let mut out = Vec::new();
        stage.handle(0, Input::Start, &mut out);
        stage.start_change(0, view, &mut out);
        assert!(stage.leading.is_some(), "member {leader} leads view {view}");
        (stage, out)
    }

    fn recover(view: u64, installed: u64, log: Vec<Decided>, pending: Vec<Broadcast>) -> Recover {
        Recover {
            view,
            installed,
            low: Snapshot::default(),
            log,
            pending,
        }
    }

    fn new_view(stage: &LcrStage) -> Arc<NewView> {
        stage
            .leading
            .as_ref()
            .and_then(|l| l.new_view.clone())
            .expect("NEW-VIEW composed")
    }

    #[test]
    fn a_new_view_keeps_what_one_member_decided_and_orders_the_rest_by_precedence() {
        // View 0, ring [0, 1, 2]. x from 0; z from 2 after it had x; y from 1 after x, before z.
        let x = with_entry(b(0, 1, &[1, 0, 0]), 0);
        let z = with_entry(b(2, 1, &[1, 0, 1]), 2);
        let y = with_entry(b(1, 1, &[1, 1, 0]), 1);
        assert!(precedes(&x, &z) && precedes(&z, &y) && precedes(&x, &y));
        let decided_x = Prefix::default().decide(&x).unwrap();
        let (mut leader, mut out) = leader_of(1, 1);
        // Member 0 decided x and holds y; member 2 holds z and x (not decided there yet).
        leader.on_recover(
            0,
            ReplicaId(0),
            recover(1, 0, vec![decided_x.clone()], vec![y.clone()]),
            &mut out,
        );
        leader.on_recover(
            0,
            ReplicaId(2),
            recover(1, 0, vec![], vec![z.clone(), x.clone()]),
            &mut out,
        );
        let nv = new_view(&leader);
        assert_eq!(nv.ring, vec![ReplicaId(0), ReplicaId(1), ReplicaId(2)]);
        let from: Vec<BroadcastId> = nv.entries.iter().map(|d| d.from).collect();
        assert_eq!(from, vec![x.id, z.id, y.id], "x once, then z before y");
        assert_eq!(nv.entries[0], decided_x);
        assert_eq!(nv.entries.iter().map(|d| d.seqno.0).collect::<Vec<_>>(), vec![1, 2, 3]);
        // The leader accepted it itself: its decided log holds the new start, not yet released.
        assert_eq!(leader.last_decided(), SeqNo(3));
        assert_eq!(leader.released, SeqNo(0));
    }

    #[test]
    fn a_new_view_follows_the_latest_installed_view_and_ignores_older_pending_broadcasts() {
        let x = with_entry(b(0, 1, &[1, 0, 0]), 0);
        let w = with_entry(b(1, 1, &[0, 1, 0]), 1);
        let decided_x = Prefix::default().decide(&x).unwrap();
        let (mut leader, mut out) = leader_of(2, 2);
        // Member 0 installed view 1 (whose start decided x); member 1 is still in view 0 and
        // holds w, which view 1's start did not take: nobody decided it.
        leader.on_recover(
            0,
            ReplicaId(0),
            recover(2, 1, vec![decided_x.clone()], vec![]),
            &mut out,
        );
        leader.on_recover(0, ReplicaId(1), recover(2, 0, vec![], vec![w]), &mut out);
        let nv = new_view(&leader);
        assert_eq!(nv.entries, vec![decided_x]);
    }

    #[test]
    fn the_leader_waits_for_every_member_of_the_ring_before_it_ends_the_view_change() {
        let (mut leader, mut out) = leader_of(1, 1);
        leader.on_recover(0, ReplicaId(0), recover(1, 0, vec![], vec![]), &mut out);
        leader.on_recover(0, ReplicaId(2), recover(1, 0, vec![], vec![]), &mut out);
        assert!(!leader.is_active());
        leader.on_accepted(0, ReplicaId(0), 1, &mut out);
        assert!(!leader.is_active(), "member 2 has not accepted");
        leader.on_accepted(0, ReplicaId(2), 1, &mut out);
        assert!(leader.is_active());
        let ends = out
            .iter()
            .filter(|a| matches!(a, Action::Send { envelope, .. } if matches!(envelope.message, Message::Lcr(LcrMessage::End { view: 1 }))))
            .count();
        assert_eq!(ends, 2, "END to members 0 and 2");
    }

    #[test]
    fn a_member_that_moved_to_a_later_view_refuses_an_earlier_new_view() {
        let f = crate::testing::fixture(1, 0, 4, crate::config::Knobs::default());
        let mut stage = LcrStage::new(f.config.clone(), ReplicaId(0), f.replicas[0].clone(), &Storage::new()).unwrap();
        let mut out = Vec::new();
        stage.handle(0, Input::Start, &mut out);
        stage.start_change(0, 4, &mut out);
        let nv = NewView {
            view: 1,
            ring: vec![ReplicaId(0), ReplicaId(1), ReplicaId(2)],
            low: Snapshot::default(),
            entries: Vec::new(),
        };
        stage.on_new_view(0, ReplicaId(1), &nv, &mut out);
        assert_eq!(stage.installed, 0);
        assert_eq!(stage.view(), 4);
    }

    #[test]
    fn one_origins_broadcasts_keep_their_order() {
        let a = b(2, 1, &[0, 0, 1]);
        let c = b(2, 2, &[0, 0, 2]);
        assert!(precedes(&a, &c));
        assert!(!precedes(&c, &a));
    }

    #[test]
    fn a_batch_of_requests_all_ordered_before_is_dropped_and_an_empty_one_is_kept() {
        let mut prefix = Prefix::default();
        prefix.last_ordered.insert(ClientId(1), RequestId(3));
        let entry = |request: u64| RequestEntry {
            client: ClientId(1),
            request_id: RequestId(request),
            body: crate::message::RequestBody::Inline(Bytes::from_static(b"x")),
        };
        let mut old = b(0, 1, &[1, 0, 0]);
        old.entries = vec![entry(3)];
        assert!(prefix.decide(&old).is_none());
        let mut fresh = b(0, 2, &[2, 0, 0]);
        fresh.entries = vec![entry(3), entry(4), entry(4)];
        let d = prefix.decide(&fresh).unwrap();
        assert_eq!(d.entries, vec![entry(4)]);
        assert_eq!(d.seqno, SeqNo(1));
        let wake = b(0, 3, &[3, 0, 0]);
        assert!(prefix.decide(&wake).is_some_and(|d| d.entries.is_empty()));
    }
}

//! Aliph's Quorum over PBFT views (`protocol = "quorum"`; Quéma ch. 3, notes 1.4-1.8;
//! docs/PROTOCOL.md "Quorum").
//!
//! Each view starts with Aliph's Backup: the three-phase path orders the NEW-VIEW's batches and
//! then `quorum_backup_batches` more (empty ones when nothing is waiting), up to sequence number
//! `fast_from`. Once a member has committed through `fast_from` it is in the view's Quorum
//! phase: it takes the requests its co-located authentication member forwards, in the order they
//! arrive, and executes each speculatively at the next sequence number as soon as every batch
//! before it is committed (one request per batch, agreed time one microsecond after the last).
//! It writes the batch (and its claim of it, [`SpeculativeClaim`](crate::message::SpeculativeClaim)) before anything depends on
//! it, sends a COMMIT for it to every order member, and hands it to its co-located execution
//! member as a TENTATIVE-BATCH; that member answers the client with a TENTATIVE-REPLY. A client
//! commits on matching TENTATIVE-REPLYs from every execution member
//! (`q.speculative_reply()`, one per order member). A member that holds COMMITs from every order
//! member for its batch (Aliph's checkpoint agreement, per batch) commits it: NEXT-BATCH,
//! committed replies, checkpoints as usual.
//!
//! An abort is a view change. A member moves to the next view when a request from its
//! authentication member waits `quorum_commit_timeout_us` in the Quorum phase (its batch did not
//! gather every vote: contention, a member down, a lie), a wake-up the service asked for is due, or
//! agreed time lags its clock by more than the heartbeat interval when a request arrives (agreed
//! time advances only in Backup: `agreed_time_stale`). VIEW-CHANGEs carry the speculative claims, and the new
//! primary's selection keeps a claim that `r + 1` members of the quorum share
//! ([`super::view_change::select`]): Aliph's abort history, so a batch a client committed is
//! kept. The new view's Backup orders what was waiting, and the view's Quorum phase follows.

use std::collections::VecDeque;

use super::OrderStage;
use crate::config::{OrderProtocol, Sabotage};
use crate::ids::{ClientId, RequestId, SeqNo};
use crate::limits::QUORUM_BACKUP_BATCHES_MAX;
use crate::message::{batch_digest, history_digest, Batch, FastPhase, Message, PbftMessage, ViewChange};
use crate::stage::{Action, PbftTimer, Time, Timer};

use super::persist;

/// Requests from the co-located authentication member waiting for the Quorum phase, oldest
/// first (older ones are dropped past this bound; the Backup phase orders them from the pool).
pub const SPECULATION_QUEUE_MAX: usize = 4096;

/// Commit timeouts without a ready request after which a Backup phase ends early
/// (`OrderStage::backup_idle_us`).
pub const BACKUP_IDLE_TIMEOUTS: u64 = 5;

/// Whether `batch`, accepted in a view's Backup phase, ends it: a batch without requests (the
/// primary's filler or a heartbeat), not a NEW-VIEW's null batch (time 0).
pub(super) fn ends_backup(batch: &Batch) -> bool {
    batch.entries.is_empty() && batch.time_us > 0
}

/// The Quorum phase's per-member state.
#[derive(Debug, Default)]
pub(crate) struct Speculation {
    /// The last sequence number of the current view's Backup phase (`u64::MAX` while no view's
    /// start is known here: after a restart the member waits for the next NEW-VIEW).
    pub(super) fast_from: SeqNo,
    /// Requests from the co-located authentication member, with when they arrived.
    queue: VecDeque<(ClientId, RequestId, Time)>,
    /// When the QuorumAbort timer is armed for.
    armed: Option<Time>,
    /// (Primary, Backup phase) since when no request was ready and nothing in flight.
    pub(super) idle_since: Option<Time>,
    /// The current view's Backup length, and its NEW-VIEW's last sequence number.
    k: u64,
    top: SeqNo,
    /// The last view this member left: its Backup length, the batches its fast phase committed
    /// here, and which fast phase it was.
    last_phase: Option<(u64, u64, FastPhase)>,
    /// The current view's fast phase.
    pub(super) mode: FastPhase,
    /// Whether this member left its Quorum phase for agreed time's sake (`abort_quorum_phase`).
    benign_abort: bool,
    /// (`protocol = "aliph"`, Chain phase) when each client last had a batch accepted here, and
    /// since when this member has been in the view.
    pub(super) chain_clients: std::collections::BTreeMap<ClientId, Time>,
    pub(super) view_since: Time,
    /// (`protocol = "chain"`) CHAINs ahead of the next sequence number to accept.
    pub(super) chain_pending: super::chain::ChainPending,
}

impl Speculation {
    pub(super) fn new(restarted: bool, protocol: OrderProtocol) -> Speculation {
        Speculation {
            fast_from: if restarted { SeqNo(u64::MAX) } else { SeqNo(0) },
            mode: protocol.first_fast_phase(),
            ..Speculation::default()
        }
    }
}

impl OrderStage {
    /// Whether the current view's fast phase is Quorum (`protocol = "quorum"`, or `"aliph"` in
    /// such a view).
    pub(super) fn quorum_protocol(&self) -> bool {
        self.speculation.mode == FastPhase::Quorum
    }

    /// Whether each view of the cluster has a fast phase after its Backup phase (`protocol =
    /// "quorum"` or `"chain"`).
    pub(super) fn fast_protocol(&self) -> bool {
        self.config.protocol.has_fast_phase()
    }

    /// Whether `seqno` belongs to the current view's fast (Quorum or Chain) phase.
    pub(super) fn speculative_seqno(&self, seqno: SeqNo) -> bool {
        self.fast_protocol() && seqno > self.speculation.fast_from
    }

    /// Whether this member runs the current view's fast (Quorum or Chain) phase now.
    pub(super) fn speculating(&self) -> bool {
        self.fast_protocol()
            && !self.changing
            && !self.is_abstaining()
            && !self.recovering()
            && self.prefix.last_committed >= self.speculation.fast_from
    }

    /// Enters a view whose NEW-VIEW ends at `top` and whose Backup phase orders at most `k`
    /// batches more: its Quorum phase starts after `top + k`, or earlier after an empty batch
    /// (`note_empty_backup_batch`).
    pub(super) fn start_speculation_after(&mut self, now: Time, top: SeqNo, k: u64, mode: FastPhase) {
        self.speculation.chain_pending.clear();
        self.speculation.chain_clients.clear();
        self.speculation.view_since = now;
        if self.fast_protocol() {
            self.speculation.fast_from = SeqNo(top.0.saturating_add(k));
            self.speculation.top = top;
            self.speculation.k = k;
            self.speculation.mode = mode;
        }
    }

    /// A batch accepted at `seqno` in the current view's Backup phase that ends it (one
    /// [`ends_backup`]) ends it there:
    /// the cluster is idle, and the Quorum phase can start. Every member accepts the view's
    /// batches in sequence, so all end it at the same batch, and PRE-PREPAREs past it are
    /// refused like any past `fast_from`.
    pub(super) fn note_empty_backup_batch(&mut self, seqno: SeqNo) {
        let s = &mut self.speculation;
        if self.config.protocol.has_fast_phase() && seqno > s.top && seqno <= s.fast_from {
            s.fast_from = seqno;
        }
    }

    /// How long the primary's Backup phase must have nothing ready and nothing in flight before
    /// it ends the phase with an empty batch: five commit timeouts (100 ms by default). A view
    /// change pauses clients (their next requests wait at their authentication members for the
    /// commit reports), and such a pause must not end the phase: measured at 16 clients, one
    /// commit timeout ended nearly every Backup phase early and halved throughput (7,182 against
    /// 11,784 ops/s, docs/PERFORMANCE.md "Session 38").
    pub(super) fn backup_idle_us(&self) -> u64 {
        self.config
            .knobs
            .quorum_commit_timeout_us
            .saturating_mul(BACKUP_IDLE_TIMEOUTS)
    }

    /// Whether a NEW-VIEW's Backup length `k` is one its primary may choose: 0 unless the
    /// protocol is Quorum, else `quorum_backup_batches` to [`QUORUM_BACKUP_BATCHES_MAX`].
    pub(super) fn backup_batches_valid(&self, k: u64) -> bool {
        if !self.fast_protocol() {
            return k == 0;
        }
        (self.config.knobs.quorum_backup_batches..=self.backup_batches_max()).contains(&k)
    }

    /// The longest Backup phase a NEW-VIEW may ask for: [`QUORUM_BACKUP_BATCHES_MAX`], or the
    /// configured base if that is larger.
    fn backup_batches_max(&self) -> u64 {
        QUORUM_BACKUP_BATCHES_MAX.max(self.config.knobs.quorum_backup_batches)
    }

    /// (New primary) the Backup length of the view it starts: Aliph's `k`, doubled when the
    /// last Quorum phase it saw committed fewer batches than the Backup phase before it (so
    /// sustained contention or a faulty member keeps the cluster mostly on the three-phase path,
    /// as Aliph's exponential `k` does), back to `quorum_backup_batches` otherwise.
    pub(super) fn next_backup_batches(&self) -> u64 {
        if !self.fast_protocol() {
            return 0;
        }
        let base = self.config.knobs.quorum_backup_batches;
        match self.speculation.last_phase {
            Some((k, committed, _)) if committed < k => k.saturating_mul(2).clamp(base, self.backup_batches_max()),
            _ => base,
        }
    }

    /// (New primary) the fast phase of the view it starts. Fixed by the protocol except under
    /// Aliph, whose composition runs Quorum, Chain, Backup, Quorum, ... (Quéma 3.5): after a
    /// Quorum phase that committed fewer batches than its Backup phase (contention, or a member
    /// down or lying) the next view runs Chain; after a Chain phase (it ends on a fault, or with
    /// at most one active client: `check_chain_clients`) the next runs Quorum.
    pub(super) fn next_fast_phase(&self) -> FastPhase {
        if self.config.protocol != OrderProtocol::Aliph {
            return self.config.protocol.first_fast_phase();
        }
        match self.speculation.last_phase {
            Some((k, committed, FastPhase::Quorum)) if committed < k => FastPhase::Chain,
            _ => FastPhase::Quorum,
        }
    }

    /// Notes, as this member leaves the current view, how its Quorum phase went.
    pub(super) fn note_phase_end(&mut self) {
        self.speculation.chain_pending.clear();
        if self.fast_protocol() && self.speculation.fast_from != SeqNo(u64::MAX) {
            let committed = self
                .prefix
                .last_committed
                .0
                .saturating_sub(self.speculation.fast_from.0);
            let k = self.speculation.k.max(1);
            let committed = if std::mem::take(&mut self.speculation.benign_abort) {
                committed.max(k)
            } else {
                committed
            };
            self.speculation.last_phase = Some((k, committed, self.speculation.mode));
        }
    }

    /// A request `(client, request_id)` came from the co-located authentication member.
    pub(super) fn note_own_request(&mut self, now: Time, client: ClientId, request_id: RequestId) {
        if !self.config.protocol.speculates() {
            return;
        }
        self.prune_speculation_queue();
        let queue = &mut self.speculation.queue;
        if queue.iter().any(|&(c, r, _)| c == client && r == request_id) {
            return;
        }
        if queue.len() >= SPECULATION_QUEUE_MAX {
            queue.pop_front();
            self.stats.bump("speculation_queue_full");
        }
        queue.push_back((client, request_id, now));
    }

    /// Drops the queued requests already ordered (in either phase), so the queue holds only
    /// what still waits: each arrival's duplicate check and each speculation scan it.
    fn prune_speculation_queue(&mut self) {
        let last_ordered = &self.prefix.last_ordered;
        self.speculation
            .queue
            .retain(|(client, request_id, _)| last_ordered.get(client).is_none_or(|last| request_id > last));
    }

    /// Executes the oldest waiting request speculatively at the next sequence number, if this
    /// member is in the Quorum phase and every batch before it is committed.
    pub(super) fn speculate(&mut self, now: Time, out: &mut Vec<Action>) {
        if !self.quorum_protocol() || !self.speculating() {
            return;
        }
        let n = self.prefix.last_committed.next();
        if !self.in_window(n) || self.log.get(&n).is_some_and(|s| s.accepted_in(self.view).is_some()) {
            return;
        }
        self.prune_speculation_queue();
        let chosen = self.speculation.queue.iter().find_map(|&(client, request_id, _)| {
            (request_id == self.last_ordered_of(client).next())
                .then(|| self.pool.with_row_of(client, request_id, self.id))
                .flatten()
        });
        let Some(candidate) = chosen.cloned() else { return };
        if self.agreed_time_stale(now) {
            return self.abort_quorum_phase(now, "quorum_abort_clock", out);
        }
        let view = self.view;
        let time_us = self.prefix.max_time + 1;
        let batch = Batch {
            time_us,
            entries: vec![candidate.signed()],
        };
        let digest = batch_digest(time_us, std::iter::once(candidate.digest()));
        let history = history_digest(&self.prefix.history, &digest);
        let me = self.id;
        let slot = self.log.entry(n).or_default();
        slot.accept_digested(n, view, batch.clone(), digest);
        slot.accepted_at = now;
        slot.record.speculative = Some(super::log::SpeculativeRecord {
            view,
            history,
            digest,
            batch: None,
        });
        slot.commits.insert(me, (view, digest));
        // Synchronously: the claim is on disk before the vote and the speculative reply go out,
        // so a member that restarts (even all of them at once) still reports it.
        persist::write(out, persist::slot_key(n), &slot.record);
        self.stats.bump("speculated");
        self.send_to_order(out, Message::Pbft(PbftMessage::Commit { view, seqno: n, digest }));
        if self.hosts_exec() {
            self.send_tentative_batch(n, history, &batch, out);
        }
        self.check_committed(now, n, out);
    }

    /// The view-change selection over `bodies` (`Sabotage::QuorumDropSpeculative`: with the
    /// speculative claims left out, so the new view forgets what the Quorum phase executed).
    pub(super) fn selection(&self, bodies: &[&ViewChange]) -> Option<super::view_change::Selection> {
        if self.sabotage() != Some(Sabotage::QuorumDropSpeculative) {
            return super::view_change::select(&self.q, bodies);
        }
        let stripped: Vec<ViewChange> = bodies
            .iter()
            .map(|vc| ViewChange {
                speculative: Vec::new(),
                ..(*vc).clone()
            })
            .collect();
        super::view_change::select(&self.q, &stripped.iter().collect::<Vec<_>>())
    }

    /// (Quorum phase) aborts it, moving to the next view, when a request from the co-located
    /// authentication member has waited `quorum_commit_timeout_us`, a wake-up is due, or a
    /// member's proactive recovery waits for the prefix to grow while no request does; arms the
    /// QuorumAbort timer for the oldest waiting request otherwise.
    pub(super) fn check_speculation(&mut self, now: Time, out: &mut Vec<Action>) {
        if !self.quorum_protocol() || !self.speculating() {
            return;
        }
        let timeout = self.config.knobs.quorum_commit_timeout_us;
        let waiting = || {
            self.speculation
                .queue
                .iter()
                .filter(|&&(client, request_id, _)| request_id > self.last_ordered_of(client))
        };
        let oldest = waiting().map(|&(_, _, at)| at).min();
        // Contention (Quéma: two requests invoked and neither committed): a request waits
        // behind the one being agreed on. Quorum's progress condition no longer holds, and one
        // request per round trip is all it would do: abort at once (Aliph hands over to Chain
        // here; upright's Backup takes the load, and k grows while contention lasts).
        if waiting().nth(1).is_some() {
            return self.abort_quorum_phase(now, "quorum_abort_contention", out);
        }
        let woken = self
            .wakes
            .due(self.prefix.max_time, self.q.small())
            .is_some_and(|at| at <= now);
        // A member's proactive recovery needs the committed prefix to reach its recovery point
        // (`recovery.rs`), which an idle Quorum phase never does: Backup's heartbeats do.
        let assist = self.assisting() && oldest.is_none();
        if woken {
            return self.abort_quorum_phase(now, "quorum_abort_wake", out);
        }
        if assist {
            return self.abort_quorum_phase(now, "quorum_abort_recovery", out);
        }
        if oldest.is_some_and(|at| now >= at.saturating_add(timeout)) {
            return self.abort_quorum_phase(now, "quorum_abort_timeout", out);
        }
        if let Some(at) = oldest.map(|at| at.saturating_add(timeout)) {
            self.arm_quorum_timer(now, at, out);
        }
    }

    /// Whether agreed time, which a Quorum phase does not advance (each batch is one microsecond
    /// after the last), lags this member's clock by more than the heartbeat interval (500 ms by
    /// default; the bound PBFT's heartbeats keep): a request ordered now would be executed at a
    /// stale time (a Redis `EX 10` would expire early, a TTL would read high), so the phase ends
    /// and the next view's Backup orders it at the primary's time. This also ends a cluster's
    /// first Quorum phase, whose agreed time is 0, at its first request. With heartbeats off
    /// (`heartbeat_interval_us = 0`) agreed time has no such bound, here as under PBFT.
    pub(super) fn agreed_time_stale(&self, now: Time) -> bool {
        let interval = self.config.knobs.heartbeat_interval_us;
        interval != 0 && now > self.prefix.max_time.saturating_add(interval)
    }

    /// Aborts the Quorum phase (counted as `why`): moves to the next view. An abort for agreed
    /// time (a due wake-up, a stale clock) says nothing about contention or faults, so it does
    /// not lengthen the next Backup phase or, under Aliph, move to Chain.
    pub(super) fn abort_quorum_phase(&mut self, now: Time, why: &'static str, out: &mut Vec<Action>) {
        self.stats.bump(why);
        self.speculation.armed = None;
        self.speculation.benign_abort = matches!(why, "quorum_abort_wake" | "quorum_abort_clock");
        let target = self.view.next();
        self.start_view_change(now, target, out);
    }

    /// Arms the QuorumAbort timer for `at` unless it is armed for earlier (and still ahead).
    pub(super) fn arm_quorum_timer(&mut self, now: Time, at: Time, out: &mut Vec<Action>) {
        if self.speculation.armed.is_none_or(|armed| armed > at || armed <= now) {
            self.speculation.armed = Some(at);
            out.push(Action::SetTimer {
                timer: Timer::Pbft(PbftTimer::QuorumAbort),
                at,
            });
        }
    }

    /// The QuorumAbort timer fired.
    pub(super) fn on_quorum_abort_timer(&mut self, now: Time, out: &mut Vec<Action>) {
        self.speculation.armed = None;
        self.check_speculation(now, out);
        self.check_chain_stall(now, out);
    }
}

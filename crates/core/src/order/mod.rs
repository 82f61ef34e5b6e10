//! The order stage: PBFT agreement on batches (docs/PROTOCOL.md "Normal case" 3-4, "Checkpoints
//! and the stage interlock", "Catch-up of execution members", "View change").
//!
//! Layout by concept (the normal case in five parts, as in PBFT thesis 2.3):
//! - `intake` (AUTH-REQ items, matrix rows pooled per entry in `request_pool`), `projection`
//!   (what the next batch is validated against), `agreement` (pre-prepare / prepare / commit,
//!   heartbeats), `handoff` (NEXT-BATCH to execution, LAST-EXEC), `catch_up` (retransmission and
//!   help after losses);
//! - `log` (per-seqno slots, watermarks), [`checkpoint`] (tokens, votes, stable certificates,
//!   order state transfer), [`view_change`] (VIEW-CHANGE / NEW-VIEW and the selection rules),
//!   `persist` (storage layout and recovery).

mod agreement;
mod catch_up;
mod chain;
pub mod checkpoint;
mod handoff;
pub(crate) mod intake;
pub(crate) mod log;
pub mod monitor;
pub(crate) mod persist;
mod projection;
pub mod quorum;
mod reconfig;
mod recovery;
pub(crate) mod request_pool;
pub mod view_change;

#[cfg(test)]
mod tests;

use crate::contract::tokens::TokenTally;
use crate::contract::{self, OrderSide, Routed, WakeUps};
use crate::message::PbftMessage;
use crate::stage::PbftTimer;
use std::collections::BTreeMap;
use std::mem;
use std::sync::Arc;

use crate::config::{ClusterConfig, ConfigError, Sabotage};
use crate::crypto::{Digest, KeyRing};
use crate::ids::{ClientId, Principal, ReplicaId, RequestId, SeqNo, View};
use crate::limits::BATCH_REQUESTS_MAX;
use crate::message::{Batch, Envelope, Message, SealFor, Signed, StableCheckpoint};
use crate::quorum::Quorums;
use crate::stage::{Action, Input, Stage, Stats, Storage, Time, Timer};

use self::agreement::PrimaryVote;
use self::log::Slot;
use self::persist::{OwnCheckpoint, ViewRecord};
use self::request_pool::RequestPool;
use self::view_change::ViewChangeState;

pub use self::reconfig::{configured, EpochRecord, StoredConfigError, PREVIOUS_EPOCHS_KEPT};

use crate::limits::VIEW_CHANGE_BACKOFF_MAX;
/// How long an order member holds back a NEXT-BATCH for another process's execution member, as a
/// fraction of the view-change timeout (`view_change_timeout_us / 200`: 5 ms by default): long
/// enough for that member's own order member's COMMIT to arrive (then it is not sent), short
/// enough that an execution member whose order member is cut off or in another view is not
/// held up much under load (held-back messages are checked at each later commit, and all sent at
/// the next tick; PROTOCOL.md step 4).
pub const NEXT_BATCH_HOLD_FRACTION: u64 = 200;
/// How long a backup waits, as a fraction of the view-change timeout (`view_change_timeout_us /
/// 200`: 5 ms by default), for a slot whose PREPARE left the primary out to commit before it
/// sends that PREPARE to the primary too (PROTOCOL.md step 3, "the primary's vote").
pub const PRIMARY_HELP_HOLD_FRACTION: u64 = 200;
/// How long a backup that includes the primary waits, as a fraction of the view-change timeout
/// (`view_change_timeout_us / 10`: 100 ms by default), for a slot without the primary's COMMIT to
/// commit before it sends that slot's PREPARE to the other backups again (PROTOCOL.md step 3,
/// "the primary's vote"): long enough that a slot slowed by load alone does not resend, short
/// beside the retransmission tick.
pub const STUCK_SIGNAL_HOLD_FRACTION: u64 = 10;
/// A backup that includes the primary in its PREPAREs leaves it out again after this many
/// consecutive commits at which every backup's COMMIT for the slot before had arrived: the stall
/// was a passing delay, not a backup that is down (which would never complete a slot). Doubled
/// (up to [`QUIET_AGAIN_AFTER_MAX`]) each time a stall follows within a view-change timeout of
/// leaving it out again, so a backup that withholds its COMMIT now and then (Byzantine, or
/// flapping) cannot make the others wait out the hold often; reset after a quiet timeout.
pub const QUIET_AGAIN_AFTER: u64 = 8;
/// How soon a primary looks again at a wake-up that was due while a batch was in flight (it is
/// ordered as soon as that batch commits and the log is idle).
pub const WAKE_RETRY_US: u64 = 1_000;
pub use crate::limits::BATCH_INLINE_BYTES_MAX;
pub use crate::limits::LAST_EXEC_RESEND_MAX;
pub use crate::limits::QUIET_AGAIN_AFTER_MAX;

/// The committed prefix's state at a checkpoint sequence number, kept until the checkpoint is
/// built (execution tokens may arrive after later batches committed).
#[derive(Clone, Debug)]
struct Snapshot {
    history: Digest,
    time_us: u64,
    last_ordered: Vec<(ClientId, RequestId)>,
    pending: Option<crate::reconfig::Pending>,
}

/// The committed prefix: everything up to `last_committed` committed here, and what it
/// determines (the history digest, agreed time, each client's last ordered request, and the
/// snapshots order checkpoints are built from).
#[derive(Default)]
struct CommittedPrefix {
    last_committed: SeqNo,
    /// `H_last_committed`.
    history: Digest,
    /// Largest batch time in the committed prefix (a heartbeat's counts; a view change's null
    /// batch has time 0).
    max_time: u64,
    /// Last ordered request per client in the committed prefix.
    last_ordered: BTreeMap<ClientId, RequestId>,
    snapshots: BTreeMap<SeqNo, Snapshot>,
    /// A reconfiguration ordered in this epoch and not yet in effect (`reconfig.rs`).
    pending: Option<crate::reconfig::Pending>,
}

/// Checkpoints above the low watermark: execution's tokens, the members' signed votes, this
/// member's own checkpoints, and an order state transfer in progress.
#[derive(Default)]
struct Checkpoints {
    /// CP-TOKENs per checkpoint seqno and execution member.
    tokens: TokenTally,
    /// Signed checkpoint votes per seqno and member.
    votes: BTreeMap<SeqNo, BTreeMap<ReplicaId, Signed<crate::message::CheckpointVote>>>,
    /// This member's own checkpoints and votes above `h`.
    own: BTreeMap<SeqNo, OwnCheckpoint>,
    /// Order state transfer in progress: (seqno, digest; default digest = any stable >= seqno).
    fetching: Option<(SeqNo, Digest)>,
}

/// The order stage: PBFT agreement on batches. Its state is grouped the way raft-rs groups a
/// `Raft`: the view and its change (`ViewChangeState`), the log with its watermarks and the
/// committed prefix (`CommittedPrefix`), the request pool (`RequestPool`), the checkpoints
/// (`Checkpoints`) and the primary's vote (`PrimaryVote`).
pub struct OrderStage {
    config: Arc<ClusterConfig>,
    q: Quorums,
    id: ReplicaId,
    keys: Arc<KeyRing>,
    /// NEW-KEYs sent in answer to bad seals (`crate::session::KeyRepair`).
    key_repair: crate::session::KeyRepair,
    stats: Stats,

    // ---- view ----
    /// Current view; while `changing`, the view being moved to.
    view: View,
    /// A view change to `view` is in progress.
    changing: bool,
    /// The view-change timer, the VIEW-CHANGEs received and the current view's NEW-VIEW.
    view_change: ViewChangeState,

    // ---- log and committed prefix ----
    /// Low watermark `h`: the latest stable checkpoint.
    h: SeqNo,
    stable: Option<StableCheckpoint>,
    log: BTreeMap<SeqNo, Slot>,
    /// Out-of-order PRE-PREPAREs of the current view (at most one per seqno in the window).
    buffered: BTreeMap<SeqNo, Batch>,
    /// Agreement messages (authenticated) of the view this member is changing to, or of the
    /// next view, that came before it installed that view: handled once it does, instead of
    /// waiting for their senders' retransmission (`catch_up::EARLY_PER_SENDER_MAX` per sender).
    early: BTreeMap<ReplicaId, std::collections::VecDeque<PbftMessage>>,
    /// Per member, the latest view whose primary it suspects (SUSPECT; this member's own too).
    suspects: BTreeMap<ReplicaId, View>,
    /// How far this member committed, and what that prefix determines.
    prefix: CommittedPrefix,

    // ---- requests ----
    pool: RequestPool,
    /// The last client of the last batch this member proposed: the next batch starts after it.
    batch_cursor: ClientId,
    /// The primary's BatchClose timer is armed.
    batch_timer_armed: bool,
    /// Last RETRANSMIT per client.
    retransmitted: intake::RetransmitPacer,
    /// The wake-ups execution members asked for (WAKE-AT): an idle primary orders an empty batch
    /// when one is due, and backups accept it then.
    wakes: WakeUps,

    // ---- checkpoints ----
    checkpoints: Checkpoints,
    /// Last time each member was sent help (stable checkpoint / NEW-VIEW).
    helped: BTreeMap<ReplicaId, Time>,
    /// NEXT-BATCHes held back: committed slot -> (when this member committed it, the execution
    /// members whose order member's COMMIT had not arrived then). Sent to those whose order
    /// member's COMMIT still has not arrived once held long enough (`send_owed_next_batches`);
    /// slots in the log only.
    next_batch_owed: BTreeMap<SeqNo, (Time, Vec<ReplicaId>)>,
    /// The last `(view, seqno)` handed to the co-located execution member as a TENTATIVE-BATCH
    /// (`handoff.rs`, tentative execution), so that each is handed over once.
    tentative_sent: Option<(View, SeqNo)>,
    /// The primary's part in the prepare phase: left out while every backup keeps up.
    primary_vote: PrimaryVote,
    /// After a restart, the installed view this member was in. Accepted batches are written
    /// lazily (the PRE-PREPARE or PREPARE goes out before the disk has them), so the member may
    /// have sent votes there that its storage no longer shows: it accepts and proposes nothing in
    /// this view or below, and rejoins at the next view change.
    abstain_through: Option<View>,
    /// First start on empty storage: the view record is written before anything is sent, so a
    /// restart can tell that this member may have voted.
    record_start: bool,
    /// A backup's watch on the primary (Aardvark; `monitor.rs`).
    monitor: monitor::Monitor,
    /// A proactive recovery in progress or done since start (`recovery.rs`).
    recovery: Option<recovery::Recovery>,
    /// When each peer was last answered a QUERY-STABLE (at most once per tick each).
    stable_answered: BTreeMap<ReplicaId, Time>,
    /// Heartbeats are sped up through this sequence number, for a member's recovery
    /// (`recovery::RECOVERY_HEARTBEAT_US`).
    assist_through: SeqNo,
    /// The hand-over to the next configuration in progress (`reconfig.rs`).
    handover: Option<reconfig::Handover>,
    /// This member's configuration ended (switched or removed): it ignores all input.
    finished: bool,
    /// Removed by the change at the boundary, but still serving the old configuration's last
    /// state until the next configuration started (`reconfig.rs`).
    leaving: Option<reconfig::Leaving>,
    /// In a reconfigured cluster, the earlier epochs' last certificates (`reconfig.rs`).
    previous: Vec<StableCheckpoint>,
    /// After a restart in a cluster that can be reconfigured: the peers that answered this
    /// member's QUERY-STABLE probe so far (`recovery.rs`; the probe ends with `n - u`).
    probing: Option<std::collections::BTreeSet<ReplicaId>>,
    /// When each peer whose message did not verify here was last probed (at most once per tick
    /// each).
    probed: BTreeMap<ReplicaId, Time>,
    /// The highest batch the co-located execution member reported executed (CP-TOKEN or
    /// LAST-EXEC): a hand-over waits for it to hold the boundary's state (`reconfig.rs`).
    own_exec_through: SeqNo,
    /// The committed prefix at the last tick, and for how many ticks it has not moved (a
    /// member that hears nothing may have missed a reconfiguration: it probes).
    quiet: (SeqNo, u32),
    /// `protocol = "quorum"` or `"chain"`: the current view's fast phase (`quorum.rs`,
    /// `chain.rs`).
    speculation: quorum::Speculation,
}

impl OrderStage {
    /// Member `id` of this stage, restored from `storage` (empty on first start).
    ///
    /// Panics if `storage` holds order records that do not decode: they are this member's own
    /// writes, and guessing around a corrupted log could contradict what it sent before.
    pub fn new(
        config: Arc<ClusterConfig>,
        id: ReplicaId,
        keys: Arc<KeyRing>,
        storage: &Storage,
    ) -> Result<OrderStage, ConfigError> {
        let q = config.validate()?;
        check_member_id(&q, id)?;
        let protocol = config.protocol;
        let mut recovered =
            persist::recover(storage).unwrap_or_else(|e| panic!("corrupt order storage at key {}", e.0));
        let record = reconfig::stored_record(storage);
        let stored_epoch = record.as_ref().map_or(0, |r| r.change.change.epoch);
        if (recovered.view_found || recovered.stable.is_some()) && stored_epoch != config.epoch() {
            panic!(
                "this order log is of configuration epoch {stored_epoch}, the replica was started in epoch {} \
                 (start it in the configuration its log records: upright_core::order::configured)",
                config.epoch()
            );
        }
        let previous = record.map_or_else(Vec::new, |r| {
            if let Some(base) = r.base {
                if recovered
                    .stable
                    .as_ref()
                    .is_none_or(|s| s.checkpoint.seqno <= base.checkpoint.seqno)
                {
                    recovered.stable = Some(base);
                }
            }
            r.previous
        });
        let pool = RequestPool::new(&config);
        let mut stage = OrderStage {
            config,
            q,
            id,
            keys,
            key_repair: Default::default(),
            stats: Stats::default(),
            view: recovered.view.view,
            changing: recovered.view.changing,
            view_change: ViewChangeState::default(),
            h: SeqNo(0),
            stable: None,
            log: BTreeMap::new(),
            buffered: BTreeMap::new(),
            early: BTreeMap::new(),
            suspects: BTreeMap::new(),
            prefix: CommittedPrefix::default(),
            pool,
            batch_cursor: ClientId(u32::MAX),
            batch_timer_armed: false,
            wakes: WakeUps::default(),
            retransmitted: Default::default(),
            checkpoints: Checkpoints {
                own: recovered.checkpoints,
                ..Checkpoints::default()
            },
            helped: BTreeMap::new(),
            next_batch_owed: BTreeMap::new(),
            tentative_sent: None,
            primary_vote: PrimaryVote::new(),
            abstain_through: (recovered.view_found && !recovered.view.changing).then_some(recovered.view.view),
            record_start: !recovered.view_found,
            monitor: monitor::Monitor::default(),
            recovery: None,
            stable_answered: BTreeMap::new(),
            assist_through: SeqNo(0),
            handover: None,
            finished: false,
            leaving: None,
            previous,
            probing: None,
            probed: BTreeMap::new(),
            own_exec_through: SeqNo(0),
            quiet: (SeqNo(0), 0),
            speculation: quorum::Speculation::new(recovered.view_found, protocol),
        };
        if let Some(stable) = recovered.stable {
            stage.reset_to_checkpoint(stable);
        }
        stage.log = recovered
            .slots
            .into_iter()
            .map(|(n, r)| (n, Slot::from_record(r)))
            .collect();
        stage.replay_committed();
        Ok(stage)
    }

    /// The current view (while a view change is in progress: the view being moved to).
    pub fn view(&self) -> View {
        self.view
    }

    /// Whether this member is the primary of an installed view.
    pub fn is_primary(&self) -> bool {
        !self.changing && self.primary_of(self.view) == self.id
    }

    /// Whether this member restarted in the current view and stays silent in it (see
    /// `abstain_through`).
    pub fn is_abstaining(&self) -> bool {
        self.abstain_through.is_some_and(|v| self.view <= v)
    }

    /// Whether a view change is in progress.
    pub fn is_changing_view(&self) -> bool {
        self.changing
    }

    /// Highest sequence number such that it and every batch before it committed here.
    pub fn last_committed(&self) -> SeqNo {
        self.prefix.last_committed
    }

    /// Low watermark `h`: the latest stable checkpoint (0 initially).
    pub fn low_watermark(&self) -> SeqNo {
        self.h
    }

    // ---- small helpers shared by the submodules ----

    fn primary_of(&self, view: View) -> ReplicaId {
        self.q.primary(view)
    }

    fn me(&self) -> Principal {
        Principal::Order(self.id)
    }

    fn sabotage(&self) -> Option<Sabotage> {
        self.config.knobs.sabotage
    }

    /// Votes needed to prepare and to commit (one fewer under `Sabotage::ShortQuorum`).
    fn agreement_quorum(&self) -> usize {
        match self.sabotage() {
            Some(Sabotage::ShortQuorum) => self.q.order_medium().saturating_sub(1).max(1),
            _ => self.q.order_medium(),
        }
    }

    fn log_window(&self) -> u64 {
        self.config.knobs.log_window
    }

    fn in_window(&self, seqno: SeqNo) -> bool {
        seqno > self.h && seqno.0 <= self.h.0 + self.log_window() && seqno <= self.epoch_end()
    }

    /// Period of the housekeeping tick (retransmissions).
    fn tick_period(&self) -> Time {
        (self.config.knobs.view_change_timeout_us / 4).max(1)
    }

    fn view_change_timeout(&self) -> Time {
        let exponent = self.view_change.consecutive.min(VIEW_CHANGE_BACKOFF_MAX);
        self.config.knobs.view_change_timeout_us.saturating_mul(1 << exponent)
    }

    fn other_order_members(&self) -> Vec<Principal> {
        ClusterConfig::order_members(&self.q)
            .filter(|p| *p != self.me())
            .collect()
    }

    /// BATCH-COMPLETE to the co-located authentication member: these requests are ordered
    /// (committed here, in batch `seqno` or before it). Sent for every committed batch with
    /// requests, and with every client's last ordered request at start and after a state transfer,
    /// so the member lets each client's next request through (PROTOCOL.md step 7).
    fn tell_auth_ordered(&self, seqno: SeqNo, requests: Vec<(ClientId, RequestId)>, out: &mut Vec<Action>) {
        for chunk in requests.chunks(BATCH_REQUESTS_MAX) {
            let message = Message::BatchComplete {
                seqno,
                requests: chunk.to_vec(),
            };
            self.send_to_own_auth(out, message);
        }
    }

    /// Every client's last ordered request, to the co-located authentication member.
    fn tell_auth_last_ordered(&self, out: &mut Vec<Action>) {
        let requests = self.prefix.last_ordered.iter().map(|(c, r)| (*c, *r)).collect();
        self.tell_auth_ordered(self.prefix.last_committed, requests, out);
    }

    /// PRIMARY-HINT to the co-located authentication member: the current view and whether it is
    /// installed (sent at start and whenever the view is left or installed).
    fn hint_primary(&self, out: &mut Vec<Action>) {
        let message = Message::PrimaryHint {
            view: self.view,
            installed: !self.changing,
        };
        self.send_to_own_auth(out, message);
    }

    /// To the authentication member of this process (`Auth(id)`), with a MAC for it.
    fn send_to_own_auth(&self, out: &mut Vec<Action>, message: Message) {
        let to = Principal::Auth(self.id);
        self.send(out, vec![to], message, SealFor::One(to));
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

    /// Sends to every other order member, sealed with an order-stage authenticator.
    fn send_to_order(&self, out: &mut Vec<Action>, message: Message) {
        self.send(
            out,
            self.other_order_members(),
            message,
            SealFor::Stage(crate::ids::StageKind::Order),
        );
    }

    fn last_ordered_of(&self, client: ClientId) -> RequestId {
        self.prefix.last_ordered.get(&client).copied().unwrap_or_default()
    }

    /// Whether help (stable checkpoint, NEW-VIEW) may be sent to `member` now: at most once per tick.
    fn may_help(&mut self, now: Time, member: ReplicaId) -> bool {
        let period = self.tick_period();
        once_per(&mut self.helped, now, member, period)
    }

    // ---- input dispatch ----

    fn on_message(&mut self, now: Time, envelope: &Envelope, out: &mut Vec<Action>) {
        if envelope.open(&self.keys, self.me(), self.sabotage()).is_err() {
            self.stats.reject("drop_bad_seal");
            let me = self.me();
            self.key_repair.after_bad_seal(&self.keys, &self.q, me, envelope, out);
            self.help_previous_epoch(now, envelope.from, out);
            self.probe_peer(now, envelope.from, out);
            return;
        }
        if !self.config.contains(envelope.from, &self.q) {
            // A hand-over vote of a member only the next configuration has.
            if let (Message::Pbft(PbftMessage::Checkpoint(vote)), true) = (&envelope.message, self.handover.is_some()) {
                if self.on_handover_vote(now, vote, out) {
                    return self.stats.bump("handover_vote");
                }
            }
            self.stats.bump("drop_unknown_sender");
            return;
        }
        match contract::route_to_order(self, now, envelope.from, &envelope.message, out) {
            Routed::Handled => return,
            Routed::WrongSender => return self.stats.bump("drop_wrong_sender_or_kind"),
            Routed::NotContract => {}
        }
        match (&envelope.message, envelope.from) {
            (Message::AuthRequest { items }, Principal::Auth(from)) => self.on_auth_requests(now, from, items, out),
            (Message::Pbft(PbftMessage::PrePrepare { view, seqno, batch }), Principal::Order(from)) => {
                self.on_pre_prepare(now, from, *view, *seqno, batch, out)
            }
            (Message::Pbft(PbftMessage::Chain { view, seqno, batch }), Principal::Order(from)) => {
                self.on_chain(now, from, *view, *seqno, batch, out)
            }
            (Message::Pbft(PbftMessage::Prepare { view, seqno, digest }), Principal::Order(from)) => {
                self.on_prepare(now, from, *view, *seqno, *digest, out)
            }
            (Message::Pbft(PbftMessage::Commit { view, seqno, digest }), Principal::Order(from)) => {
                self.on_commit(now, from, *view, *seqno, *digest, out)
            }
            (Message::Pbft(PbftMessage::Checkpoint(vote)), Principal::Order(from)) => {
                self.on_checkpoint_vote(now, from, vote, out)
            }
            (Message::Pbft(PbftMessage::ViewChange(vc)), Principal::Order(from)) => {
                self.on_view_change(now, from, vc, out)
            }
            (Message::Pbft(PbftMessage::NewView(nv)), Principal::Order(_)) => self.on_new_view(now, nv, out),
            (Message::Pbft(PbftMessage::FetchOrderCheckpoint { seqno, digest }), Principal::Order(from)) => {
                self.on_fetch_checkpoint(from, *seqno, *digest, out)
            }
            (Message::Pbft(PbftMessage::OrderCheckpointState(stable)), Principal::Order(_)) => {
                self.on_checkpoint_state(now, stable, out)
            }
            (Message::Pbft(PbftMessage::Suspect { view }), Principal::Order(from)) => {
                self.on_suspect(now, from, *view, out)
            }
            (Message::Pbft(PbftMessage::QueryStable { nonce }), Principal::Order(from)) => {
                self.on_query_stable(now, from, *nonce, out)
            }
            (Message::Pbft(PbftMessage::ReplyStable { nonce, stable }), Principal::Order(from)) => {
                self.on_reply_stable(now, from, *nonce, stable, out)
            }
            _ => self.stats.bump("drop_wrong_sender_or_kind"),
        }
    }

    fn on_tick(&mut self, now: Time, out: &mut Vec<Action>) {
        out.push(Action::SetTimer {
            timer: Timer::Pbft(PbftTimer::OrderTick),
            at: now + self.tick_period(),
        });
        self.helped.clear();
        self.tick_leaving(out);
        self.query_stable(out);
        self.probe_when_quiet();
        self.probe(out);
        self.send_owed_next_batches(now, SeqNo(u64::MAX), out);
        self.check_quiet_prepares(now, out);
        if self.changing {
            self.resend_view_change(now, out);
        } else {
            self.retransmit_agreement(now, out);
            self.retransmit_chain(now, out);
            self.check_chain_clients(now, out);
            self.propose_heartbeat(now, out);
            self.arm_wake(now, out);
            self.watch_primary(now, out);
            self.resend_suspicion(out);
        }
        self.retransmit_checkpoint(out);
        self.send_handover_vote(out);
    }

    /// Work that may have become possible after any input: ordering new batches, (re)arming the
    /// view-change timer.
    fn after_input(&mut self, now: Time, out: &mut Vec<Action>) {
        self.propose(now, false, out);
        self.fill_backup(now, out);
        self.speculate(now, out);
        self.check_speculation(now, out);
        self.drain_chain(now, out);
        if self.assisting() {
            self.propose_heartbeat(now, out);
        }
        self.update_view_change_timer(now, out);
        self.check_recovery_complete();
    }
}

/// The order stage's side of the contract with execution ([`crate::contract`]).
impl OrderSide for OrderStage {
    fn checkpoint_token(
        &mut self,
        now: Time,
        from: ReplicaId,
        seqno: SeqNo,
        exec_state: Digest,
        out: &mut Vec<Action>,
    ) {
        self.own_exec_progress(now, from, seqno, out);
        if !seqno.0.is_multiple_of(self.config.knobs.checkpoint_interval) || !self.in_window(seqno) {
            return self.stats.bump("drop_token_out_of_window");
        }
        self.checkpoints.tokens.offer(from, seqno, exec_state);
        self.try_votes(now, out);
    }

    fn last_executed(&mut self, now: Time, from: ReplicaId, seqno: SeqNo, out: &mut Vec<Action>) {
        self.own_exec_progress(now, from, seqno, out);
        self.on_last_executed(from, seqno, out)
    }

    fn wake_at(&mut self, now: Time, from: ReplicaId, seqno: SeqNo, at_us: Option<u64>, out: &mut Vec<Action>) {
        self.wakes.offer(from, seqno, at_us);
        self.arm_wake(now, out);
    }
}

impl Stage for OrderStage {
    fn principal(&self) -> Principal {
        Principal::Order(self.id)
    }

    fn handle(&mut self, now: Time, input: Input, out: &mut Vec<Action>) {
        if self.finished {
            return self.stats.bump("drop_after_reconfiguration");
        }
        match input {
            Input::Start | Input::Recover => {
                let joining = self.joining();
                if mem::take(&mut self.record_start) {
                    if joining {
                        reconfig::joining_record(out, &self.config);
                    }
                    persist_view(out, self.view, self.changing);
                }
                out.push(Action::SetTimer {
                    timer: Timer::Pbft(PbftTimer::OrderTick),
                    at: now + self.tick_period(),
                });
                if self.changing {
                    self.resume_view_change(now, out);
                } else {
                    self.monitor.view_installed(self.view, now);
                }
                self.hint_primary(out);
                self.tell_auth_last_ordered(out);
                if matches!(input, Input::Recover) {
                    self.begin_recovery(now, out);
                }
                if joining {
                    // A new member: the probe below finds the stable checkpoint to start from.
                    self.stats.bump("joining");
                }
                // A restart at the epoch's boundary (it went down before the hand-over ended).
                self.check_boundary(now, out);
                if self.config.admin.is_some() && self.recovery.is_none() {
                    self.probing = Some(Default::default());
                    self.probe(out);
                }
            }
            Input::Message(envelope) => self.on_message(now, &envelope, out),
            Input::Timer(Timer::Pbft(PbftTimer::OrderTick)) => self.on_tick(now, out),
            Input::Timer(Timer::Pbft(PbftTimer::PrimaryHelp)) => {
                self.primary_vote.primary_help_armed = None;
                self.check_quiet_prepares(now, out);
            }
            Input::Timer(Timer::Pbft(PbftTimer::Watch)) => {
                self.monitor.watch_armed = None;
                if !self.changing {
                    self.watch_primary(now, out);
                }
            }
            Input::Timer(Timer::Pbft(PbftTimer::Wake)) => {
                self.propose_heartbeat(now, out);
                self.arm_wake(now, out);
            }
            Input::Timer(Timer::Pbft(PbftTimer::BatchClose)) => {
                self.batch_timer_armed = false;
                self.propose(now, true, out);
            }
            Input::Timer(Timer::Pbft(PbftTimer::QuorumAbort)) => self.on_quorum_abort_timer(now, out),
            Input::Timer(Timer::Pbft(PbftTimer::ViewChange)) => {
                self.view_change.deadline = None;
                self.on_view_change_timer(now, out);
            }
            Input::Timer(_) | Input::Invoke { .. } => self.stats.bump("drop_unexpected_input"),
        }
        self.after_input(now, out);
    }

    fn stats(&self) -> &Stats {
        &self.stats
    }
}

/// Whether `member` may be sent something again at `now`, at most once per `period` (`last`:
/// when each was last sent it; updated when it may).
fn once_per(last: &mut BTreeMap<ReplicaId, Time>, now: Time, member: ReplicaId, period: Time) -> bool {
    match last.get(&member) {
        Some(&at) if now < at.saturating_add(period) => false,
        _ => {
            last.insert(member, now);
            true
        }
    }
}

/// An order member's id is below `n_order` (for every ordering protocol's stage).
pub(crate) fn check_member_id(q: &Quorums, id: ReplicaId) -> Result<(), ConfigError> {
    if id.0 as usize >= q.n_order {
        return Err(ConfigError::BadKnob {
            name: "order member id",
            value: id.0 as u64,
            why: "must be below n_order",
        });
    }
    Ok(())
}

/// Persists the view record.
fn persist_view(out: &mut Vec<Action>, view: View, changing: bool) {
    persist::write(out, persist::VIEW_KEY.to_string(), &ViewRecord { view, changing });
}

//! The synchronous heart of a replica process: its co-located stages, their logs and timers, and
//! the durability rule. The runtime (`upright-node`) runs it over files that fsync; the simulator
//! runs the same code over a simulated disk that loses unsynced writes on a crash, so the
//! durability rule the simulator proves is the one that runs.
//!
//! Inputs are fed one at a time; each stage's actions are carried out in order, except that sends
//! are collected and performed by [`Host::flush`], which first syncs every log with buffered
//! persists (group commit: one sync per log for all persists of all inputs handled since the last
//! flush, always before any send that follows them). Messages between co-located stages go
//! through an in-memory queue, also only after the sync.
//!
//! A send emitted while no eager persist (`Action::Persist`) waits for a sync depends on nothing
//! the sync would make durable (docs/PROTOCOL.md, the durability rule; lazy persists never hold a
//! send back). Such sends go *ahead* of the sync: [`Host::send_ahead`] and [`Host::flush`] route
//! them first. A backup that receives a PRE-PREPARE together with a PREPARE is prepared in the same
//! round: its PREPARE then goes out at once and only its COMMIT waits for the prepared
//! certificate's fsync, instead of the PREPARE waiting too (which put a second fsync on the
//! critical path of the backup that needs that PREPARE).

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use crate::ids::{Principal, Process, ReplicaId, StageKind};
use crate::message::{Envelope, Message};
use crate::stage::{Action, Event, Input, Stage, Time, Timer};

pub use crate::limits::LOCAL_ROUNDS_MAX;

/// Where the host sends envelopes for other processes.
pub trait Router {
    /// Sends `envelope`, emitted by the member `from`, to other processes: `to` names one
    /// principal per process (the receiving host dispatches by message kind, [`stage_for`]), in
    /// the order the member listed them; never empty.
    fn send(&mut self, from: Principal, to: Vec<Principal>, envelope: Arc<Envelope>);

    /// An envelope between co-located members is about to be handled (for tracing).
    fn local(&mut self, _envelope: &Envelope) {}
}

/// A stage member's write-ahead log, as the host needs it: the runtime's is a file that fsyncs,
/// the simulator's a map that loses what is unsynced on a crash.
pub trait Log {
    /// Buffers a write that the member's next send waits for (`None` deletes the key).
    fn append(&mut self, key: &str, value: Option<&Bytes>);
    /// Buffers a write that no send waits for (written in order with the others).
    fn append_lazily(&mut self, key: &str, value: Option<&Bytes>);
    /// Whether an eager write is buffered and not yet durable (sends emitted now must wait).
    fn needs_sync(&self) -> bool;
    /// Whether any write is buffered.
    fn is_dirty(&self) -> bool;
    /// Writes everything buffered and makes it durable if an eager write is among it; returns
    /// how long the sync took, when it was timed.
    fn sync(&mut self) -> std::io::Result<Option<Duration>>;
    /// Syncs done so far (a group commit is a flush in which one of the logs synced).
    fn syncs(&self) -> u64;
}

/// The stage of a replica that handles a message kind (`None`: a message only clients receive).
pub fn stage_for(message: &Message) -> Option<StageKind> {
    use Message::*;
    match message {
        ClientRequest { .. } | BatchComplete { .. } | Fetch { .. } | PrimaryHint { .. } | NewKey { .. } => {
            Some(StageKind::Auth)
        }
        AuthRequest { .. } | Pbft(_) | Lcr(_) | CheckpointToken { .. } | LastExecuted { .. } | WakeAt { .. } => {
            Some(StageKind::Order)
        }
        Command { .. }
        | NextBatch { .. }
        | TentativeBatch { .. }
        | LoadCheckpoint { .. }
        | Retransmit { .. }
        | FetchState { .. }
        | StateManifest { .. }
        | StateChunk { .. }
        | FetchPages { .. }
        | PageAnswer { .. }
        | ObjectCheckpoint { .. }
        | ReadOnlyRequest { .. }
        | PushResume { .. } => Some(StageKind::Exec),
        Reply { .. } | TentativeReply { .. } | Push { .. } | PushGap { .. } | Configuration { .. } => None,
    }
}

/// One co-located stage member with its log.
pub struct Member<L> {
    /// Which stage.
    pub kind: StageKind,
    /// The state machine.
    pub stage: Box<dyn Stage + Send>,
    /// Its write-ahead log.
    pub log: L,
}

/// Progress seen through [`Action::Note`] (for metrics and status).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Progress {
    /// Current view of the order member.
    pub view: u64,
    /// Highest committed batch.
    pub committed: u64,
    /// Batches committed since start.
    pub batches_committed: u64,
    /// Highest stable checkpoint.
    pub stable_checkpoint: u64,
    /// Last executed batch.
    pub executed: u64,
    /// Last execution checkpoint.
    pub exec_checkpoint: u64,
    /// Its state digest (the first bytes, hex): equal at every correct execution member.
    pub exec_checkpoint_digest: String,
    /// State transfers completed.
    pub state_loads: u64,
    /// Messages the service pushed to clients since start.
    pub pushes: u64,
    /// The order member finished its configuration ([`Event::Reconfigured`]): the new epoch, and
    /// whether this replica is a member of it. The host's owner starts the replica again in it
    /// (or stops it) after the next flush.
    pub reconfigured: Option<(u64, bool)>,
    /// The order member began handing over to the change's configuration
    /// ([`Event::HandingOver`]); the host's owner takes it to connect to the members it adds.
    pub handing_over: Option<Box<crate::reconfig::SignedReconfiguration>>,
}

/// Host-side counters and timings.
#[derive(Clone, Debug, Default)]
pub struct HostStats {
    /// Inputs dropped by reason.
    pub dropped: BTreeMap<&'static str, u64>,
    /// Group commits (flushes that synced at least one log).
    pub group_commits: u64,
    /// Sum and max of sync latency.
    pub fsync_total: Duration,
    /// Longest sync.
    pub fsync_max: Duration,
    /// Envelopes sent to other processes.
    pub sent: u64,
    /// Envelopes delivered between co-located stages.
    pub local: u64,
    /// Envelopes to other processes routed ahead of a sync that was due (they depended on no
    /// unsynced eager persist).
    pub sent_ahead: u64,
}

/// The stages of one replica, their logs and timers.
pub struct Host<L> {
    me: ReplicaId,
    /// The first replica process hosting an execution member (`Principal::process_at`): 0 when
    /// the stages share processes.
    exec_base: u32,
    members: Vec<Member<L>>,
    /// (time, member, timer) for firing in order; `timer_at` for moving/cancelling.
    timers: BTreeMap<(Time, usize, Timer), ()>,
    timer_at: BTreeMap<(usize, Timer), Time>,
    /// Sends emitted while no eager persist was waiting for a sync: they may go before it.
    ahead: Vec<(usize, Vec<Principal>, Arc<Envelope>)>,
    /// Sends emitted after an eager persist that is not synced yet: they go after the sync.
    outbox: Vec<(usize, Vec<Principal>, Arc<Envelope>)>,
    local: VecDeque<(usize, Arc<Envelope>)>,
    /// Notes kept for [`Host::take_notes`] (only when [`Host::keep_notes`] asked for them).
    notes: Option<Vec<(Principal, Event)>>,
    /// Notes of progress ([`Event::reports_durable_progress`]) emitted after an eager persist
    /// that is not synced yet: they take effect after the sync, like the sends (a batch noted
    /// committed is durably so; a crash before the sync loses them with what they report).
    noted_behind: Vec<(usize, Event)>,
    /// Progress from notes.
    pub progress: Progress,
    /// Counters.
    pub stats: HostStats,
}

impl<L: Log> Host<L> {
    /// A host for replica `me` with these members (at most one per stage kind).
    pub fn new(me: ReplicaId, members: Vec<Member<L>>) -> Host<L> {
        Host {
            me,
            exec_base: 0,
            members,
            timers: BTreeMap::new(),
            timer_at: BTreeMap::new(),
            ahead: Vec::new(),
            outbox: Vec::new(),
            local: VecDeque::new(),
            notes: None,
            noted_behind: Vec::new(),
            progress: Progress::default(),
            stats: HostStats::default(),
        }
    }

    /// This host in a cluster whose execution members start at replica process `exec_base`
    /// ([`crate::quorum::Quorums::exec_process_base`]; separate stages).
    pub fn with_exec_base(mut self, exec_base: u32) -> Host<L> {
        self.exec_base = exec_base;
        self
    }

    /// The principal of member `index`.
    pub fn principal(&self, index: usize) -> Principal {
        match self.members[index].kind {
            StageKind::Exec => Principal::Exec(ReplicaId(self.me.0 - self.exec_base)),
            kind => kind.member(self.me),
        }
    }

    /// The members.
    pub fn members(&self) -> &[Member<L>] {
        &self.members
    }

    /// The members, to reach their logs (a sync outside a flush only makes writes durable
    /// earlier, which is always allowed).
    pub fn members_mut(&mut self) -> &mut [Member<L>] {
        &mut self.members
    }

    /// Ends the host (a crash or a stop): its members with their logs.
    pub fn into_members(self) -> Vec<Member<L>> {
        self.members
    }

    /// From now on keeps every member's notes ([`Action::Note`]) for [`Host::take_notes`].
    pub fn keep_notes(&mut self) {
        self.notes.get_or_insert_with(Vec::new);
    }

    /// The notes kept since the last call, in emission order, each with the member that emitted it.
    pub fn take_notes(&mut self) -> Vec<(Principal, Event)> {
        self.notes.as_mut().map(std::mem::take).unwrap_or_default()
    }

    fn member_of(&self, kind: StageKind) -> Option<usize> {
        self.members.iter().position(|m| m.kind == kind)
    }

    fn drop_input(&mut self, reason: &'static str) {
        *self.stats.dropped.entry(reason).or_insert(0) += 1;
    }

    /// Sends `Input::Start` to every member.
    pub fn start(&mut self, now: Time) {
        for index in 0..self.members.len() {
            self.handle(now, index, Input::Start);
        }
    }

    /// Sends `Input::Recover` to every member: [`Host::start`] for a proactive recovery.
    pub fn start_recovering(&mut self, now: Time) {
        for index in 0..self.members.len() {
            self.handle(now, index, Input::Recover);
        }
    }

    /// Whether every member that took part in a proactive recovery has finished its part: the
    /// order member reached its recovery point and the execution member checked its state
    /// (their `recovery_complete` / `recovery_state_checked` counters).
    pub fn recovery_complete(&self) -> bool {
        self.members.iter().all(|m| match m.kind {
            StageKind::Auth => true,
            StageKind::Order => m.stage.stats().get("recovery_complete") > 0,
            StageKind::Exec => m.stage.stats().get("recovery_state_checked") > 0,
        })
    }

    /// An envelope from the network, dispatched by message kind. Returns how many inputs the
    /// member that handled it refused as proof that their sender is faulty
    /// ([`crate::stage::Stats::rejected`]): what a cut-off of flooding peers counts
    /// ([`crate::cutoff`]).
    pub fn deliver(&mut self, now: Time, envelope: Arc<Envelope>) -> u64 {
        let Some(kind) = stage_for(&envelope.message) else {
            self.drop_input("host_dropped_not_for_replica");
            return 0;
        };
        // A NEW-KEY goes to the process's key member: its authentication member, or the
        // execution member of an execution-only process (`Quorums::key_member`).
        let key_member = || {
            matches!(envelope.message, Message::NewKey { .. })
                .then(|| self.member_of(StageKind::Exec))
                .flatten()
        };
        let Some(index) = self.member_of(kind).or_else(key_member) else {
            self.drop_input("host_dropped_stage_not_hosted");
            return 0;
        };
        let before = self.members[index].stage.stats().rejected;
        self.handle(now, index, Input::Message(envelope));
        self.members[index].stage.stats().rejected - before
    }

    /// When the next timer is due.
    pub fn next_timer(&self) -> Option<Time> {
        self.timers.keys().next().map(|(at, _, _)| *at)
    }

    /// Fires every timer due at `now`.
    pub fn fire_timers(&mut self, now: Time) {
        while let Some(&(at, index, timer)) = self.timers.keys().next() {
            if at > now {
                break;
            }
            self.timers.remove(&(at, index, timer));
            self.timer_at.remove(&(index, timer));
            self.handle(now, index, Input::Timer(timer));
        }
    }

    fn handle(&mut self, now: Time, index: usize, input: Input) {
        let mut out = Vec::new();
        self.members[index].stage.handle(now, input, &mut out);
        self.perform(index, out);
    }

    /// Calls every member's flush hook ([`Stage::flush`]): the round's inputs were all handled.
    /// Nothing is allocated unless a member emits something.
    fn flush_members(&mut self, now: Time) {
        let mut out = Vec::new();
        for index in 0..self.members.len() {
            self.members[index].stage.flush(now, &mut out);
            if !out.is_empty() {
                self.perform(index, std::mem::take(&mut out));
            }
        }
    }

    fn perform(&mut self, index: usize, out: Vec<Action>) {
        for action in out {
            match action {
                Action::Persist { key, value } => self.members[index].log.append(&key, value.as_ref()),
                Action::PersistLazily { key, value } => self.members[index].log.append_lazily(&key, value.as_ref()),
                // Emission order is kept: while no sync is due the outbox is empty (it is drained
                // right after each sync), so every send ahead precedes every send behind.
                Action::Send { to, envelope } if !self.sync_due() => self.ahead.push((index, to, envelope)),
                Action::Send { to, envelope } => self.outbox.push((index, to, envelope)),
                Action::SetTimer { timer, at } => {
                    if let Some(old) = self.timer_at.insert((index, timer), at) {
                        self.timers.remove(&(old, index, timer));
                    }
                    self.timers.insert((at, index, timer), ());
                }
                Action::CancelTimer { timer } => {
                    if let Some(old) = self.timer_at.remove(&(index, timer)) {
                        self.timers.remove(&(old, index, timer));
                    }
                }
                Action::Note(event) if self.sync_due() && event.reports_durable_progress() => {
                    self.noted_behind.push((index, event))
                }
                Action::Note(event) => self.note(index, event),
                Action::Deliver { .. } | Action::DeliverPush { .. } | Action::PushGap { .. } => {}
            }
        }
    }

    /// A note of member `index` takes effect: kept for [`Host::take_notes`], and progress.
    fn note(&mut self, index: usize, event: Event) {
        let principal = self.principal(index);
        if let Some(notes) = &mut self.notes {
            notes.push((principal, event.clone()));
        }
        let p = &mut self.progress;
        match event {
            Event::Committed { seqno, view, .. } => {
                p.committed = p.committed.max(seqno.0);
                p.view = p.view.max(view.0);
                p.batches_committed += 1;
            }
            Event::ViewInstalled { view } => p.view = p.view.max(view.0),
            Event::CheckpointStable { seqno } => p.stable_checkpoint = p.stable_checkpoint.max(seqno.0),
            Event::Executed { seqno, .. } => p.executed = seqno.0,
            Event::Checkpointed { seqno, state_digest } => {
                p.exec_checkpoint = seqno.0;
                p.exec_checkpoint_digest = format!("{state_digest:?}");
            }
            Event::StateLoaded { seqno, state_digest } => {
                p.exec_checkpoint = seqno.0;
                p.exec_checkpoint_digest = format!("{state_digest:?}");
                p.executed = seqno.0;
                p.state_loads += 1;
            }
            Event::Pushed { .. } => p.pushes += 1,
            Event::Reconfigured { epoch, member, .. } => p.reconfigured = Some((epoch, member)),
            Event::HandingOver { change } => p.handing_over = Some(change),
        }
    }

    /// Starts ending a round: calls every member's flush hook and routes the sends that depend on
    /// no unsynced persist. Returns whether it routed any to another process while a sync is due:
    /// the caller may then let those be written (the transport writes from its own tasks) before
    /// [`Host::flush`] blocks on the sync. Calling [`Host::flush`] alone is equally correct.
    pub fn send_ahead(&mut self, now: Time, router: &mut dyn Router) -> bool {
        self.flush_members(now);
        self.route_ahead(router) > 0
    }

    /// Whether a member's log holds an eager persist not yet synced (sends emitted now wait).
    fn sync_due(&self) -> bool {
        self.members.iter().any(|m| m.log.needs_sync())
    }

    /// Routes the sends emitted while no sync was due; returns how many envelopes went to other
    /// processes ahead of a sync that is due now (counted in `sent_ahead`).
    fn route_ahead(&mut self, router: &mut dyn Router) -> u64 {
        let sent = self.stats.sent;
        for (index, to, envelope) in std::mem::take(&mut self.ahead) {
            self.route(index, to, envelope, router);
        }
        if !self.sync_due() {
            return 0;
        }
        let ahead = self.stats.sent - sent;
        self.stats.sent_ahead += ahead;
        ahead
    }

    /// Ends a round: calls every member's flush hook, routes the sends that depend on no unsynced
    /// persist, makes buffered persists durable (one sync per dirty log), then performs the other
    /// sends; deliveries to co-located stages are handled here too (each followed by another flush
    /// hook), repeating until no work is left.
    pub fn flush(&mut self, now: Time, router: &mut dyn Router) -> std::io::Result<()> {
        for _ in 0..LOCAL_ROUNDS_MAX {
            self.flush_members(now);
            self.route_ahead(router);
            self.sync_logs()?;
            for (index, event) in std::mem::take(&mut self.noted_behind) {
                self.note(index, event);
            }
            for (index, to, envelope) in std::mem::take(&mut self.outbox) {
                self.route(index, to, envelope, router);
            }
            let Some((index, envelope)) = self.local.pop_front() else {
                return Ok(());
            };
            self.stats.local += 1;
            router.local(&envelope);
            self.handle(now, index, Input::Message(envelope));
        }
        Ok(())
    }

    fn sync_logs(&mut self) -> std::io::Result<()> {
        let mut synced = false;
        for member in &mut self.members {
            if member.log.is_dirty() {
                let was = member.log.syncs();
                let took = member.log.sync()?;
                if let Some(took) = took {
                    self.stats.fsync_total += took;
                    self.stats.fsync_max = self.stats.fsync_max.max(took);
                }
                synced |= member.log.syncs() > was;
            }
        }
        if synced {
            self.stats.group_commits += 1;
        }
        Ok(())
    }

    fn route(&mut self, from: usize, to: Vec<Principal>, envelope: Arc<Envelope>, router: &mut dyn Router) {
        let mut remote: Vec<Principal> = Vec::new();
        let mut processes: Vec<Process> = Vec::new();
        for principal in to {
            let process = principal.process_at(self.exec_base);
            if process == Process::Replica(self.me) {
                let kind = principal.stage().expect("replica principals have a stage");
                match self.member_of(kind) {
                    Some(index) => self.local.push_back((index, envelope.clone())),
                    None => self.drop_input("host_dropped_stage_not_hosted"),
                }
                continue;
            }
            if processes.contains(&process) {
                continue; // one copy per process: the receiver dispatches by message kind
            }
            processes.push(process);
            remote.push(principal);
        }
        if !remote.is_empty() {
            self.stats.sent += remote.len() as u64;
            router.send(self.principal(from), remote, envelope);
        }
    }
}

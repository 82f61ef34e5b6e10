//! Reconfiguration at an order member (docs/PROTOCOL.md "Reconfiguration").
//!
//! 1. **Ordered.** When a batch with a valid change of the administrator commits here (the first
//!    such in the epoch), the committed prefix records it as pending, with its boundary `B` =
//!    the first checkpoint at or after that batch plus `L`; every later order checkpoint carries
//!    it, so a member that jumps ahead by state transfer learns it too. No member orders past
//!    `B` in this epoch: one that does not know the change has its low watermark below that
//!    first checkpoint, so its window ends before `B`, and one that knows it stops at `B`.
//!    Heartbeats speed up (as for a recovery) so that an idle cluster gets to `B` in a second.
//! 2. **Hand-over.** When checkpoint `B` becomes stable here (this epoch's certificate), the
//!    member signs the same checkpoint again as a member of the next configuration (its keys
//!    there bind the new epoch) and sends that vote to the next configuration's order members,
//!    each tick until it switches. With `checkpoint_stable` such votes of the next configuration
//!    (or a certificate from a member that already switched), `B` is stable in both, and the
//!    member switches: it writes the epoch record (the change, the new certificate and the last
//!    one of the old epoch) before anything else, and notes [`Event::Reconfigured`]; its host
//!    starts every member again in the new configuration ([`configured`]). It ignores all input
//!    from then on. A member the change removes just stops.
//! 3. **The new epoch** starts from the new certificate of `B`, in view 0. A member that is new
//!    (empty storage in a configuration with epoch > 0) asks for the stable checkpoint as a
//!    recovering member does and catches up by state transfer. A member still in the old epoch
//!    that sends to one in the new (its seal or signature fails there) is sent the old epoch's
//!    last certificate, which takes it to the hand-over.

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::checkpoint::verify_stable;
use super::{persist, OrderStage};
use crate::codec;
use crate::config::ClusterConfig;
use crate::crypto::KeyRing;
use crate::ids::{Principal, Process, ReplicaId, SeqNo};
use crate::message::{CheckpointVote, Message, OrderCheckpoint, PbftMessage, SealFor, Signed, StableCheckpoint};
use crate::quorum::Quorums;
use crate::reconfig::{self, holders, Pending, SignedReconfiguration};
use crate::stage::{Action, Event, Storage, Time};

/// Key of the epoch record.
pub(crate) const EPOCH_KEY: &str = "order/epoch";

/// What an order member writes when it switches to a new configuration (or first starts in
/// one, as a new member: then without certificates).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EpochRecord {
    /// The change that made the configuration.
    pub change: SignedReconfiguration,
    /// The new epoch's certificate of its first checkpoint (the old epoch's last), or of a
    /// later one (a member that handed over late).
    pub base: Option<StableCheckpoint>,
    /// The last certificate of each earlier epoch this member went through, oldest first (at
    /// most [`PREVIOUS_EPOCHS_KEPT`]): sent to members still in one of them, so that each can
    /// move up epoch by epoch.
    pub previous: Vec<StableCheckpoint>,
}

/// Earlier epochs' last certificates a member keeps (a member that missed more
/// reconfigurations than this while down must be removed and added again).
pub const PREVIOUS_EPOCHS_KEPT: usize = 16;

/// The record a new member writes before it first sends anything.
pub(super) fn joining_record(out: &mut Vec<Action>, config: &ClusterConfig) {
    if let Some(change) = reconfig::origin(config) {
        let record = EpochRecord {
            change,
            base: None,
            previous: Vec::new(),
        };
        out.push(Action::Persist {
            key: EPOCH_KEY.to_string(),
            value: Some(Bytes::from(codec::to_bytes(&record))),
        });
    }
}

/// Why the configuration stored with an order member cannot be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StoredConfigError {
    /// The record does not decode.
    #[error("the order log's epoch record does not decode")]
    Corrupt,
    /// The stored change does not follow from the initial configuration.
    #[error("the order log's configuration change does not apply to this cluster's configuration: {0}")]
    Mismatch(#[from] reconfig::ReconfigError),
}

/// The configuration a replica runs in: `initial` (from `cluster.toml`), or the newer one its
/// order member switched to, as recorded in its log (`order_storage`). The administrator's key
/// and the clients never change, so the last change alone gives the whole configuration.
pub fn configured(initial: &ClusterConfig, order_storage: &Storage) -> Result<ClusterConfig, StoredConfigError> {
    let Some(bytes) = order_storage.get(EPOCH_KEY) else {
        return Ok(initial.clone());
    };
    let record: EpochRecord = codec::from_bytes(bytes).map_err(|_| StoredConfigError::Corrupt)?;
    if record.change.change.epoch <= initial.epoch() {
        return Ok(initial.clone());
    }
    Ok(reconfig::successor(initial, &record.change, true)?)
}

/// The epoch record stored with an order member, if any (for its stage constructor).
pub(crate) fn stored_record(storage: &Storage) -> Option<EpochRecord> {
    storage.get(EPOCH_KEY).and_then(|b| codec::from_bytes(b).ok())
}

/// Ticks a removed member keeps serving after the boundary when no certificate of the next
/// configuration reaches it (one whose peers cannot talk to it any more).
pub const LEAVING_TICKS_MAX: u32 = 40;

/// A member the change removes, after the boundary: it stays up, so that its execution member
/// serves the boundary's state to the next configuration's members that lag (they vote in the
/// hand-over only once they hold it, and the members that had it may all be removed), until a
/// certificate of the next configuration at or after the boundary shows the hand-over done,
/// or [`LEAVING_TICKS_MAX`] ticks passed.
pub(super) struct Leaving {
    pub config: Arc<ClusterConfig>,
    pub q: Quorums,
    pub keys: Arc<KeyRing>,
    pub boundary: SeqNo,
    pub change: crate::crypto::Digest,
    pub ticks: u32,
}

/// The hand-over in progress at a member whose stable checkpoint reached the boundary.
pub(super) struct Handover {
    /// The next configuration, its quorums, and this process's keys and id in it.
    pub config: Arc<ClusterConfig>,
    pub q: Quorums,
    pub keys: Arc<KeyRing>,
    pub id: ReplicaId,
    /// The old epoch's last certificate (at the boundary).
    pub previous: StableCheckpoint,
    /// The next configuration's votes for it, by signer.
    pub votes: BTreeMap<ReplicaId, Signed<CheckpointVote>>,
    /// This member's own vote there.
    pub own: Signed<CheckpointVote>,
    /// Whether this member may vote yet: an execution member in both configurations votes once
    /// its co-located execution member holds the boundary's state.
    pub ready: bool,
    /// The next configuration's members whose votes say they hold the boundary's state
    /// (execution members in both configurations; they vote only once they do).
    pub holders: std::collections::BTreeSet<ReplicaId>,
    /// Holders' votes needed besides `checkpoint_stable` votes: `min(u_old, u_new) + 1`, so
    /// that a correct holder stays up to serve the state to the others (as the old
    /// configuration's `checkpoint_token` quorum guaranteed; a configuration that grows `u`
    /// has its full guarantee once the new members fetched the state).
    pub holders_needed: usize,
}

impl OrderStage {
    /// The pending change, if it is for the next epoch (a checkpoint of a new epoch's first
    /// batch still carries the change that made it).
    pub(super) fn pending_for_next(&self, pending: Option<&Pending>) -> Option<Pending> {
        pending
            .filter(|p| p.change.change.epoch == self.config.epoch() + 1)
            .cloned()
    }

    /// Looks at a batch that just committed for the administrator's change (only the first valid
    /// one of an epoch counts; the execution stage answers the same, [`reconfig::reply_text`]).
    pub(super) fn note_reconfiguration(&mut self, seqno: SeqNo, batch: &crate::message::Batch) {
        if self.prefix.pending.is_some() {
            return;
        }
        let Some(admin) = self.config.admin else { return };
        for signed in batch.entries.iter().filter(|e| e.entry.client == admin) {
            let crate::message::RequestBody::Inline(op) = &signed.entry.body else {
                continue;
            };
            if let Ok(next) = reconfig::decode_and_check(&self.config, op) {
                let change = reconfig::origin(&next).expect("a successor records its change");
                let knobs = &self.config.knobs;
                let boundary = reconfig::boundary(seqno, knobs.checkpoint_interval, knobs.log_window);
                self.stats.bump("reconfiguration_ordered");
                self.prefix.pending = Some(Pending {
                    change,
                    ordered_at: seqno,
                    boundary,
                });
                self.assist(boundary);
                return;
            }
        }
    }

    /// The last sequence number this member may order in this epoch.
    pub(super) fn epoch_end(&self) -> SeqNo {
        self.prefix.pending.as_ref().map_or(SeqNo(u64::MAX), |p| p.boundary)
    }

    /// After a checkpoint became stable: at the boundary, begin the hand-over.
    pub(super) fn check_boundary(&mut self, now: Time, out: &mut Vec<Action>) {
        if self.handover.is_some() || self.finished || self.leaving.is_some() {
            return;
        }
        let Some(pending) = self.prefix.pending.clone() else {
            return;
        };
        let Some(stable) = self.stable.clone().filter(|s| s.checkpoint.seqno == pending.boundary) else {
            return;
        };
        let next = match reconfig::successor(&self.config, &pending.change, false) {
            Ok(next) => Arc::new(next),
            Err(e) => panic!("a pending change was checked when ordered: {e}"),
        };
        let my_keys = self.config.replicas[self.id.0 as usize].keys;
        let Some(id) = next.replica_with(&my_keys) else {
            // Removed: serve the boundary's state until the next configuration started.
            self.stats.bump("reconfiguration_leaving");
            let q = next.validate().expect("checked when ordered");
            let keys = Arc::new(self.keys.successor(&next, Process::Replica(self.id), false));
            self.leaving = Some(Leaving {
                config: next,
                q,
                keys,
                boundary: pending.boundary,
                change: pending.change.digest(),
                ticks: 0,
            });
            return;
        };
        let q = next.validate().expect("checked when ordered");
        let keys = Arc::new(self.keys.successor(&next, Process::Replica(id), false));
        let own = Signed::sign(
            &keys,
            id,
            CheckpointVote {
                seqno: pending.boundary,
                digest: stable.checkpoint.digest(),
            },
        );
        self.stats.bump("reconfiguration_handover");
        let holders = holders(&self.config, &next);
        let holders_needed = reconfig::holders_needed(&self.config, &next);
        out.push(Action::Note(Event::HandingOver {
            change: Box::new(pending.change.clone()),
        }));
        self.begin_handover(now, (next, q, keys, id), stable, own, (holders, holders_needed), out);
    }

    /// Starts a hand-over into `next` (`(configuration, quorums, keys, our id)`) at `previous`,
    /// the old configuration's last certificate.
    fn begin_handover(
        &mut self,
        now: Time,
        (config, q, keys, id): (Arc<ClusterConfig>, Quorums, Arc<KeyRing>, ReplicaId),
        previous: StableCheckpoint,
        own: Signed<CheckpointVote>,
        (holders, holders_needed): (std::collections::BTreeSet<ReplicaId>, usize),
        out: &mut Vec<Action>,
    ) {
        self.handover = Some(Handover {
            config,
            q,
            keys,
            id,
            previous,
            votes: BTreeMap::new(),
            own,
            ready: false,
            holders,
            holders_needed,
        });
        self.check_ready(now, out);
    }

    /// A certificate while leaving: one of the next configuration at or after the boundary
    /// ends it. Returns whether it was one.
    pub(super) fn on_leaving_certificate(&mut self, stable: &StableCheckpoint, out: &mut Vec<Action>) -> bool {
        let Some(leaving) = &self.leaving else { return false };
        if stable.checkpoint.seqno < leaving.boundary
            || !verify_stable(&leaving.config, &leaving.q, &leaving.keys, stable)
        {
            return false;
        }
        self.stats.bump("leaving_certificate");
        self.leave(out);
        true
    }

    /// Each tick while leaving: leave after [`LEAVING_TICKS_MAX`].
    pub(super) fn tick_leaving(&mut self, out: &mut Vec<Action>) {
        let Some(leaving) = self.leaving.as_mut() else { return };
        leaving.ticks += 1;
        if leaving.ticks >= LEAVING_TICKS_MAX {
            self.stats.bump("leaving_timeout");
            self.leave(out);
        }
    }

    fn leave(&mut self, out: &mut Vec<Action>) {
        let Some(leaving) = self.leaving.take() else { return };
        self.stats.bump("reconfiguration_removed");
        self.finished = true;
        out.push(Action::Note(Event::Reconfigured {
            epoch: leaving.config.epoch(),
            member: false,
            change: leaving.change,
            boundary: leaving.boundary,
        }));
    }

    /// The co-located execution member reported its progress.
    pub(super) fn own_exec_progress(&mut self, now: Time, from: ReplicaId, seqno: SeqNo, out: &mut Vec<Action>) {
        if from == self.id && seqno > self.own_exec_through {
            self.own_exec_through = seqno;
            self.check_ready(now, out);
        }
    }

    /// Votes in the hand-over once this member may.
    fn check_ready(&mut self, now: Time, out: &mut Vec<Action>) {
        let through = self.own_exec_through;
        let Some(handover) = self.handover.as_mut() else { return };
        if handover.ready {
            return;
        }
        let boundary = handover.previous.checkpoint.seqno;
        if handover.holders.contains(&handover.id) && through < boundary {
            return self.stats.bump("handover_waits_for_execution");
        }
        handover.ready = true;
        handover.votes.insert(handover.id, handover.own.clone());
        self.send_handover_vote(out);
        self.try_switch(now, None, out);
    }

    /// The hand-over vote, to every order member of the next configuration (each tick).
    pub(super) fn send_handover_vote(&self, out: &mut Vec<Action>) {
        let Some(handover) = self.handover.as_ref().filter(|h| h.ready) else {
            return;
        };
        // Addressed as this configuration knows them, where it does (a member a shrink
        // renumbers is still at its old id until it switches); the members the change adds by
        // their new ids (above this configuration's, where the host connected to them).
        let to: Vec<Principal> = ClusterConfig::order_members(&handover.q)
            .filter(|p| *p != Principal::Order(handover.id))
            .map(|p| {
                let keys = p
                    .replica()
                    .and_then(|r| handover.config.replicas.get(r.0 as usize))
                    .map(|m| m.keys);
                match keys.and_then(|k| self.config.replica_with(&k)) {
                    Some(here) => Principal::Order(here),
                    None => p,
                }
            })
            .collect();
        // Sealed with nothing (the vote is signed), so members of either epoch can read it.
        self.send(
            out,
            to,
            Message::Pbft(PbftMessage::Checkpoint(handover.own.clone())),
            SealFor::Nothing,
        );
    }

    /// A checkpoint vote or certificate during the hand-over: counted if it is the next
    /// configuration's for the boundary. Returns whether it was.
    pub(super) fn on_handover_vote(&mut self, now: Time, vote: &Signed<CheckpointVote>, out: &mut Vec<Action>) -> bool {
        let Some(handover) = &mut self.handover else {
            return false;
        };
        if vote.value != handover.own.value
            || (vote.signer.0 as usize) >= handover.q.n_order
            || vote.verify(&handover.keys, handover.config.knobs.sabotage).is_err()
        {
            return false;
        }
        handover.votes.insert(vote.signer, vote.clone());
        self.try_switch(now, None, out);
        true
    }

    /// A certificate of the next configuration at or after the boundary (from a member that
    /// switched; a later one if the next epoch went on meanwhile: this member then catches up
    /// from it). Returns whether it was one.
    pub(super) fn on_handover_certificate(
        &mut self,
        now: Time,
        stable: &StableCheckpoint,
        out: &mut Vec<Action>,
    ) -> bool {
        let Some(handover) = &self.handover else { return false };
        if stable.checkpoint.seqno < handover.previous.checkpoint.seqno
            || !verify_stable(&handover.config, &handover.q, &handover.keys, stable)
        {
            return false;
        }
        self.try_switch(now, Some(stable.clone()), out);
        true
    }

    /// Switches once the boundary is certified in the next configuration.
    fn try_switch(&mut self, now: Time, certificate: Option<StableCheckpoint>, out: &mut Vec<Action>) {
        let Some(handover) = &self.handover else { return };
        let held = handover.votes.keys().filter(|s| handover.holders.contains(s)).count();
        let base = match certificate {
            Some(c) => c,
            None if handover.ready
                && handover.votes.len() >= handover.q.checkpoint_stable()
                && held >= handover.holders_needed =>
            {
                StableCheckpoint {
                    checkpoint: handover.previous.checkpoint.clone(),
                    votes: handover.votes.values().cloned().collect(),
                }
            }
            None => return,
        };
        let handover = self.handover.take().expect("checked");
        let epoch = handover.config.epoch();
        let boundary = handover.previous.checkpoint.seqno;
        let _ = now;
        let mut previous = self.previous.clone();
        previous.push(handover.previous);
        if previous.len() > PREVIOUS_EPOCHS_KEPT {
            previous.remove(0);
        }
        let record = EpochRecord {
            change: reconfig::origin(&handover.config).expect("a successor records its change"),
            base: Some(base.clone()),
            previous,
        };
        // The record first: a log that has it also has what follows (prefix durability), and a
        // restart with the record runs in the new configuration.
        out.push(Action::Persist {
            key: EPOCH_KEY.to_string(),
            value: Some(Bytes::from(codec::to_bytes(&record))),
        });
        persist::delete(out, persist::VIEW_KEY.to_string());
        persist::write(out, persist::STABLE_KEY.to_string(), &base);
        self.stats.bump("reconfiguration_switched");
        self.finished = true;
        out.push(Action::Note(Event::Reconfigured {
            epoch,
            member: true,
            change: record.change.digest(),
            boundary,
        }));
    }

    /// A member still in an earlier epoch sent something that does not verify here: send it
    /// the earlier epochs' last certificates (at most once per tick), which take it to the
    /// hand-over, epoch by epoch.
    pub(super) fn help_previous_epoch(&mut self, now: Time, from: Principal, out: &mut Vec<Action>) {
        let Principal::Order(member) = from else { return };
        let mut certificates = self.previous.clone();
        // And our own stable certificate: a member handing over to this configuration switches
        // with it (one that has to wait for its execution member cannot vote, and gets it so).
        if !self.previous.is_empty() {
            certificates.extend(self.stable.clone());
        }
        // A member of the next configuration (new, or already switched) asking while this one
        // hands over: the boundary's certificate.
        certificates.extend(self.handover.as_ref().map(|h| h.previous.clone()));
        // The sender named itself by its id in its own configuration, maybe the previous one,
        // where a shrink may have given it another id than it has here: to that id in this
        // configuration too (the one its keys have here), so the help reaches it.
        let mut to = vec![from];
        let renumbered = reconfig::origin(&self.config)
            .and_then(|o| o.change.from_replicas.get(member.0 as usize).copied())
            .and_then(|keys| self.config.replica_with(&keys))
            .map(Principal::Order);
        if let Some(here) = renumbered.filter(|p| *p != from) {
            to.push(here);
        }
        to.retain(|p| *p != Principal::Order(self.id));
        if certificates.is_empty() || to.is_empty() || !self.may_help(now, member) {
            return;
        }
        self.stats.bump("previous_epoch_helped");
        for previous in certificates {
            let message = Message::Pbft(PbftMessage::OrderCheckpointState(previous));
            self.send(out, to.clone(), message, SealFor::Nothing);
        }
    }

    /// A new member that holds nothing yet got a certificate it cannot check in its own
    /// configuration: if it is the previous configuration's last one (checked with that
    /// configuration's members, [`reconfig::predecessor`]), the new member votes for that
    /// checkpoint too, as the members handing over do. Without these votes a configuration that
    /// adds members while one of the old ones is down could never start: its first certificate
    /// needs `n - u` votes of the new configuration. Returns whether it was such a certificate.
    pub(super) fn on_joining_certificate(
        &mut self,
        now: Time,
        stable: &StableCheckpoint,
        out: &mut Vec<Action>,
    ) -> bool {
        if self.handover.is_some() || self.stable.is_some() || self.config.epoch() == 0 {
            return false;
        }
        let Some(origin) = reconfig::origin(&self.config) else {
            return false;
        };
        let matches = stable
            .checkpoint
            .reconfiguration
            .as_ref()
            .is_some_and(|p| p.change == origin && p.boundary == stable.checkpoint.seqno);
        if !matches {
            return false;
        }
        let Some(previous) = reconfig::predecessor(&self.config) else {
            return false;
        };
        let Ok(q) = previous.validate() else { return false };
        let keys = self.keys.successor(&previous, Process::Replica(self.id), false);
        if !verify_stable(&previous, &q, &keys, stable) {
            return false;
        }
        let own = Signed::sign(
            &self.keys,
            self.id,
            CheckpointVote {
                seqno: stable.checkpoint.seqno,
                digest: stable.checkpoint.digest(),
            },
        );
        self.stats.bump("joining_handover");
        let holders = holders(&previous, &self.config);
        let holders_needed = reconfig::holders_needed(&previous, &self.config);
        // A hand-over into the configuration this member is already in: when it completes,
        // the member starts again from the new certificate. A new member holds no state, so it
        // never counts as a holder.
        let next = (self.config.clone(), self.q, self.keys.clone(), self.id);
        self.begin_handover(now, next, stable.clone(), own, (holders, holders_needed), out);
        true
    }

    /// Whether this member is new in a reconfigured cluster (it starts with nothing and catches
    /// up as a recovering member does).
    pub(super) fn joining(&self) -> bool {
        self.config.epoch() > 0 && self.record_start && self.stable.is_none()
    }
}

/// Checks the change a checkpoint carries: for the next epoch, a valid change with the boundary
/// of its batch; for this epoch, only at this epoch's first checkpoint (its boundary).
pub(super) fn pending_is_valid(config: &ClusterConfig, checkpoint: &OrderCheckpoint) -> bool {
    let Some(p) = &checkpoint.reconfiguration else {
        return true;
    };
    let knobs = &config.knobs;
    let epoch = p.change.change.epoch;
    p.boundary == reconfig::boundary(p.ordered_at, knobs.checkpoint_interval, knobs.log_window)
        && checkpoint.seqno >= p.ordered_at
        && checkpoint.seqno <= p.boundary
        && if epoch == config.epoch() + 1 {
            reconfig::successor(config, &p.change, false).is_ok()
        } else {
            epoch == config.epoch()
                && reconfig::origin(config).as_ref() == Some(&p.change)
                && checkpoint.seqno == p.boundary
        }
}

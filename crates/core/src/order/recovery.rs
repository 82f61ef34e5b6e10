//! Proactive recovery at an order member (docs/PROTOCOL.md "Proactive recovery"; PBFT thesis
//! 4.3.2, estimation of the high-water mark).
//!
//! Whoever controlled this process before the recovery may have made its order member send
//! votes for any sequence number up to its low watermark then plus the log window `L`. The
//! member asks every peer for its stable checkpoint certificate (QUERY-STABLE, fresh nonce);
//! once `n - u` peers answered, the recovery point is `H = c_max + L`, rounded up to a
//! checkpoint, where `c_max` is the highest *certified* checkpoint among the answers. A
//! certificate cannot be inflated (it carries `checkpoint_stable` signed votes), and among any
//! `n - u` of the other members at least one is correct and was in the quorum that made the old
//! low watermark stable (`(n - u) + (n - u - r - 1) - (n - 1) = 1` for `n = 2u + r + 1`), so
//! `c_max` is at least the old low watermark and `H` covers every vote the old process could
//! have sent. The recovery of the order member is complete once a checkpoint at or above `H` is
//! stable here: everything before it is settled by the certificate, so nothing the old process
//! said can matter any more.

use std::collections::BTreeMap;

use super::checkpoint::verify_stable;
use super::OrderStage;
use crate::ids::{Principal, ReplicaId, SeqNo};
use crate::message::{Message, PbftMessage, SealFor, StableCheckpoint};
use crate::stage::{Action, Time};

/// A recovery in progress at this member.
#[derive(Debug, Default)]
pub(super) struct Recovery {
    /// The QUERY-STABLE nonce: the key epoch the recovery began (strictly increasing, persisted
    /// by the authentication member before it is announced).
    nonce: u64,
    /// The certified stable checkpoint each peer answered with (0: none yet).
    answers: BTreeMap<ReplicaId, SeqNo>,
    /// The recovery point `H`, once estimated.
    point: Option<SeqNo>,
    /// A stable checkpoint reached `H`.
    complete: bool,
}

/// While a recovery is being helped along (`OrderStage::assist_through`), an idle primary orders
/// a heartbeat this often instead of every `heartbeat_interval_us`, and backups accept them: an
/// idle cluster then reaches a recovering member's recovery point (`L` batches and more past the
/// newest stable checkpoint) in a second, not in minutes (PBFT's primary "issues null requests
/// if the system is idle"). A faulty member that asks for estimations again and again gets the
/// cluster to order at most about `L + 2 * checkpoint_interval` empty batches per question
/// answered (one per tick period per member).
pub const RECOVERY_HEARTBEAT_US: Time = 2_000;

/// Ticks without a commit (and at least four heartbeat intervals) after which a member of a
/// cluster that can be reconfigured probes its peers ([`OrderStage::probe_when_quiet`]).
pub const QUIET_TICKS_PROBE: u32 = 8;

impl OrderStage {
    /// The least time between an idle primary's heartbeats at `seqno`.
    pub(super) fn heartbeat_spacing(&self, seqno: SeqNo) -> Time {
        let interval = self.config.knobs.heartbeat_interval_us;
        if seqno <= self.assist_through {
            RECOVERY_HEARTBEAT_US.min(interval)
        } else {
            interval
        }
    }

    /// Whether this member's own proactive recovery is under way (not yet complete).
    pub(super) fn recovering(&self) -> bool {
        self.recovery.as_ref().is_some_and(|r| !r.complete)
    }

    /// Whether heartbeats are being sped up for a recovery.
    pub(super) fn assisting(&self) -> bool {
        self.prefix.last_committed < self.assist_through
    }

    /// Speeds heartbeats up through `target` (see [`RECOVERY_HEARTBEAT_US`]).
    pub(super) fn assist(&mut self, target: SeqNo) {
        if target > self.assist_through {
            self.assist_through = target;
        }
    }

    /// `Input::Recover`: start the estimation. A recovering primary gives its view up (it
    /// abstains in it after the restart): it moves to the next view at once, and its peers do
    /// when its QUERY-STABLE arrives (PBFT: "a primary first multicasts VIEW-CHANGE").
    pub(super) fn begin_recovery(&mut self, now: Time, out: &mut Vec<Action>) {
        self.stats.bump("recovery_started");
        self.recovery = Some(Recovery {
            nonce: self.keys.epoch(),
            ..Recovery::default()
        });
        self.query_stable(out);
        if !self.changing && self.primary_of(self.view) == self.id {
            self.stats.bump("recovery_primary_steps_down");
            self.start_view_change(now, self.view.next(), out);
        }
    }

    /// QUERY-STABLE to every peer that has not answered (at start and each tick until `H` is
    /// known).
    pub(super) fn query_stable(&mut self, out: &mut Vec<Action>) {
        let Some(recovery) = self.recovery.as_ref().filter(|r| r.point.is_none()) else {
            return;
        };
        let message = Message::Pbft(PbftMessage::QueryStable { nonce: recovery.nonce });
        let missing: Vec<Principal> = self
            .other_order_members()
            .into_iter()
            .filter(|p| !matches!(p, Principal::Order(r) if recovery.answers.contains_key(r)))
            .collect();
        for to in missing {
            self.send(out, vec![to], message.clone(), SealFor::One(to));
        }
    }

    /// The restart probe (nonce 0): QUERY-STABLE to the peers that have not answered, at start
    /// and each tick until `n - u` did. A member that restarts may have missed a reconfiguration
    /// while it was down; its peers in a later configuration cannot read the probe and answer
    /// with the earlier configurations' last certificates instead (`reconfig.rs`).
    pub(super) fn probe(&mut self, out: &mut Vec<Action>) {
        let Some(answered) = &self.probing else { return };
        let message = Message::Pbft(PbftMessage::QueryStable { nonce: 0 });
        let missing: Vec<Principal> = self
            .other_order_members()
            .into_iter()
            .filter(|p| !matches!(p, Principal::Order(r) if answered.contains(r)))
            .collect();
        for to in missing {
            self.send(out, vec![to], message.clone(), SealFor::One(to));
        }
    }

    /// Each tick: a member whose committed prefix has not moved for [`QUIET_TICKS_PROBE`] ticks
    /// while heartbeats are on probes its peers (a cluster that can be reconfigured only): the
    /// others may have moved to a configuration it does not know, and then nobody sends it
    /// anything it can read.
    pub(super) fn probe_when_quiet(&mut self) {
        if self.config.admin.is_none() || self.config.knobs.heartbeat_interval_us == 0 {
            return;
        }
        let committed = self.prefix.last_committed;
        if committed != self.quiet.0 {
            self.quiet = (committed, 0);
            return;
        }
        self.quiet.1 += 1;
        let period = self.tick_period().max(1);
        let heartbeat_ticks = self.config.knobs.heartbeat_interval_us.div_ceil(period) as u32;
        if self.quiet.1 >= QUIET_TICKS_PROBE.max(4 * heartbeat_ticks) && self.probing.is_none() {
            self.quiet.1 = 0;
            self.stats.bump("quiet_probe");
            self.probing = Some(Default::default());
        }
    }

    /// A peer's message did not verify here: maybe it is in a later configuration. A probe
    /// (at most once per tick per peer) gets it to send the certificates that lead there
    /// (`reconfig.rs`); a peer in the same configuration just answers it.
    pub(super) fn probe_peer(&mut self, now: Time, from: Principal, out: &mut Vec<Action>) {
        let Principal::Order(peer) = from else { return };
        if self.config.admin.is_none() || peer == self.id || (peer.0 as usize) >= self.q.n_order {
            return;
        }
        let period = self.tick_period();
        if super::once_per(&mut self.probed, now, peer, period) {
            self.stats.bump("peer_probed");
            let message = Message::Pbft(PbftMessage::QueryStable { nonce: 0 });
            self.send(out, vec![from], message, SealFor::One(from));
        }
    }

    /// A peer's QUERY-STABLE: answer with our stable checkpoint certificate (at most once per
    /// tick period per peer: the answer is larger than the question). A recovery's (nonce above
    /// 0) also speeds heartbeats up, and replaces a recovering primary; a restart probe's does not.
    pub(super) fn on_query_stable(&mut self, now: Time, from: ReplicaId, nonce: u64, out: &mut Vec<Action>) {
        if nonce != 0 && !self.changing && self.primary_of(self.view) == from {
            // The primary is recovering: it cannot lead this view any more.
            self.stats.bump("primary_recovering");
            self.start_view_change(now, self.view.next(), out);
        }
        let period = self.tick_period();
        if !super::once_per(&mut self.stable_answered, now, from, period) {
            return self.stats.bump("query_stable_rate_limited");
        }
        self.stats.bump("query_stable_answered");
        if nonce != 0 {
            // The asker's recovery point is at most the newest stable checkpoint plus `L`,
            // rounded up; ours may trail the newest by a checkpoint.
            let knobs = &self.config.knobs;
            let target = self.h.0 + knobs.log_window + 2 * knobs.checkpoint_interval;
            self.assist(SeqNo(target));
        }
        let to = Principal::Order(from);
        let message = Message::Pbft(PbftMessage::ReplyStable {
            nonce,
            stable: self.stable.clone(),
        });
        self.send(out, vec![to], message, SealFor::One(to));
    }

    /// A peer's REPLY-STABLE: count its certified checkpoint; with `n - u` answers, fix `H`.
    pub(super) fn on_reply_stable(
        &mut self,
        now: Time,
        from: ReplicaId,
        nonce: u64,
        stable: &Option<StableCheckpoint>,
        out: &mut Vec<Action>,
    ) {
        if nonce == 0 {
            return self.on_probe_answer(now, from, stable, out);
        }
        let Some(recovery) = self.recovery.as_ref().filter(|r| r.point.is_none() && r.nonce == nonce) else {
            return self.stats.bump("drop_reply_stable_unasked");
        };
        if recovery.answers.contains_key(&from) {
            return self.stats.bump("drop_reply_stable_duplicate");
        }
        let certified = match stable {
            None => SeqNo(0),
            Some(s) if verify_stable(&self.config, &self.q, &self.keys, s) => s.checkpoint.seqno,
            Some(_) => return self.stats.reject("drop_reply_stable_bad_certificate"),
        };
        let recovery = self.recovery.as_mut().expect("checked above");
        recovery.answers.insert(from, certified);
        if recovery.answers.len() >= self.q.n_order - self.q.u {
            let highest = recovery.answers.values().max().copied().unwrap_or_default();
            let interval = self.config.knobs.checkpoint_interval;
            let point = (highest.0 + self.config.knobs.log_window).div_ceil(interval) * interval;
            recovery.point = Some(SeqNo(point));
            self.assist(SeqNo(point));
            self.stats.bump("recovery_point_estimated");
            *self.stats.counters.entry("recovery_point").or_insert(0) = point;
        }
        // A newer certificate than ours also brings this member forward.
        if let Some(s) = stable.as_ref().filter(|s| s.checkpoint.seqno > self.h) {
            self.on_checkpoint_state(now, s, out);
        }
        self.check_recovery_complete();
    }

    /// An answer to the restart probe: a newer certificate brings this member forward.
    fn on_probe_answer(
        &mut self,
        now: Time,
        from: ReplicaId,
        stable: &Option<StableCheckpoint>,
        out: &mut Vec<Action>,
    ) {
        let Some(answered) = self.probing.as_mut() else {
            return self.stats.bump("drop_reply_stable_unasked");
        };
        answered.insert(from);
        if answered.len() >= self.q.n_order - self.q.u {
            self.probing = None;
            self.stats.bump("probe_complete");
        }
        if let Some(s) = stable.as_ref().filter(|s| s.checkpoint.seqno > self.h) {
            self.on_checkpoint_state(now, s, out);
        }
    }

    /// Completes the recovery once a stable checkpoint reached `H`.
    pub(super) fn check_recovery_complete(&mut self) {
        let h = self.h;
        let Some(recovery) = self.recovery.as_mut() else { return };
        if !recovery.complete && recovery.point.is_some_and(|point| h >= point) {
            recovery.complete = true;
            self.stats.bump("recovery_complete");
        }
    }
}

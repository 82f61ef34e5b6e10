//! Key refresh and the new key of a proactive recovery at an execution-only process (separate
//! stages, docs/ODRC.md "Separated stages"): with no authentication member in its process, the
//! execution member is the process's key member (`crate::session::ReplicaKeys`, the schedule the
//! authentication member runs elsewhere). Where stages share processes the execution member
//! runs none: its process's authentication member does.

use super::ExecStage;
use crate::ids::Principal;
use crate::message::Envelope;
use crate::session::{KeyMember, ReplicaKeys};
use crate::stage::{Action, Storage, Time, Timer};

/// Storage key of the last epoch an execution-only process announced.
pub const EPOCH_KEY: &str = "exec/key-epoch";

/// The schedule of an execution member that is its process's key member, restored from
/// `storage`; `None` where an authentication member shares the process.
pub(super) fn restore(q: &crate::quorum::Quorums, me: Principal, storage: &Storage) -> Option<ReplicaKeys> {
    let process = q.process_of(me);
    let replica = match process {
        crate::ids::Process::Replica(r) => r,
        crate::ids::Process::Client(_) => return None,
    };
    (q.key_member(replica) == Some(me)).then(|| ReplicaKeys::restore(storage, EPOCH_KEY))
}

impl ExecStage {
    /// Runs `step` on the key schedule, if this member keeps its process's keys.
    fn with_keys(&mut self, step: impl FnOnce(&mut ReplicaKeys, &mut KeyMember<'_>)) -> bool {
        let Some(schedule) = self.key_schedule.as_mut() else {
            return false;
        };
        let mut member = KeyMember {
            keys: &self.keys,
            quorums: &self.q,
            config: &self.config,
            me: Principal::Exec(self.id),
            stats: &mut self.stats,
        };
        step(schedule, &mut member);
        true
    }

    fn arm_keys(&self, out: &mut Vec<Action>) {
        if let Some(at) = self.key_schedule.as_ref().and_then(ReplicaKeys::due) {
            out.push(Action::SetTimer {
                timer: Timer::KeyRefresh,
                at,
            });
        }
    }

    /// At start, and with a proactive recovery's new epoch (`recover`).
    pub(super) fn start_keys(&mut self, now: Time, recover: bool, out: &mut Vec<Action>) {
        self.with_keys(|k, m| {
            k.start(m, now, out);
            if recover {
                k.recover(m, now, out);
            }
        });
        self.arm_keys(out);
    }

    /// The KeyRefresh timer: retire, refresh when due, hello again; re-arm.
    pub(super) fn key_timer(&mut self, now: Time, out: &mut Vec<Action>) {
        if !self.with_keys(|k, m| k.tick(m, now, out)) {
            self.stats.bump("unexpected_timer");
        }
        self.arm_keys(out);
    }

    /// A NEW-KEY (only an execution-only process's member takes them).
    pub(super) fn on_new_key(&mut self, envelope: &Envelope, out: &mut Vec<Action>) {
        if !self.with_keys(|k, m| k.on_new_key(m, envelope, out)) {
            self.stats.bump("dropped_unexpected_message");
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::config::Knobs;
    use crate::exec::ExecStage;
    use crate::ids::{ClientId, Principal, Process, ReplicaId};
    use crate::kv::KvService;
    use crate::message::{Envelope, Message, SealFor};
    use crate::stage::{Action, Input, Stage, Storage, Timer};
    use crate::testing::{fixture, new_keys, separated_fixture};
    use std::sync::Arc;

    fn knobs() -> Knobs {
        Knobs {
            key_refresh_us: 1_000_000,
            key_overlap_us: 300_000,
            ..Knobs::default()
        }
    }

    /// An execution-only process (separate stages, 4 + 5 processes) is its own key member: at
    /// start it announces a new epoch (persisted first) to every other process's key member and
    /// every client, retires the previous keys after the overlap, refreshes each period,
    /// installs a peer's NEW-KEY and answers its hello; a restart never announces a stored epoch
    /// again, and a proactive recovery starts a new one.
    #[test]
    fn an_execution_only_member_keeps_its_process_keys() {
        let f = separated_fixture(1, 1, 2, 2, knobs());
        assert_eq!(f.quorums.n_replicas(), 9);
        // Execution member 1 lives in process 5.
        let ring = f.replicas[5].clone();
        let mut storage = Storage::new();
        let mut e = ExecStage::new(
            f.config.clone(),
            ReplicaId(1),
            ring.clone(),
            &storage,
            Box::new(KvService::new()),
        )
        .unwrap();
        let mut out = Vec::new();
        e.handle(10, Input::Start, &mut out);
        let persisted = out
            .iter()
            .position(|x| matches!(x, Action::Persist { key, .. } if key == super::EPOCH_KEY));
        let sent = out.iter().position(
            |x| matches!(x, Action::Send { envelope, .. } if matches!(envelope.message, Message::NewKey { .. })),
        );
        assert!(persisted.unwrap() < sent.unwrap(), "persisted before it is announced");
        let keys = new_keys(&out);
        let [(to, first, true)] = &keys[..] else {
            panic!("{keys:?}")
        };
        let mut expected: Vec<Principal> = (0..4).map(|r| Principal::Auth(ReplicaId(r))).collect();
        expected.extend([0, 2, 3, 4].map(|i| Principal::Exec(ReplicaId(i))));
        expected.extend([0, 1].map(|c| Principal::Client(ClientId(c))));
        assert_eq!(to, &expected);
        assert_eq!(ring.epoch(), first.epoch);
        assert!(out.iter().any(|a| matches!(
            a,
            Action::SetTimer {
                timer: Timer::KeyRefresh,
                ..
            }
        )));

        // A peer's hello is installed and answered with ours.
        let (peer_key, hello) = {
            let peer = &f.replicas[1];
            let key = peer.refresh(5).unwrap();
            (key.clone(), Message::NewKey { key, hello: true })
        };
        let envelope = Envelope::seal(
            &f.replicas[1],
            &f.quorums,
            Principal::Auth(ReplicaId(1)),
            hello,
            SealFor::Nothing,
        );
        let mut out = Vec::new();
        e.handle(20, Input::Message(Arc::new(envelope)), &mut out);
        assert_eq!(e.stats().get("new_key_installed"), 1);
        assert_eq!(ring.peer_epoch(Process::Replica(ReplicaId(1))), peer_key.epoch);
        let answered = new_keys(&out);
        assert_eq!(answered.len(), 1);
        assert_eq!(answered[0].0, vec![Principal::Auth(ReplicaId(1))]);

        // Retirement after the overlap, the next refresh after the period.
        let mut out = Vec::new();
        e.handle(300_010, Input::Timer(Timer::KeyRefresh), &mut out);
        assert_eq!(e.stats().get("keys_retired"), 1);
        let mut out = Vec::new();
        e.handle(1_000_010, Input::Timer(Timer::KeyRefresh), &mut out);
        assert_eq!(e.stats().get("keys_refreshed"), 2);
        let second = new_keys(&out)[0].1.clone();
        assert!(second.epoch > first.epoch);
        for action in &out {
            if let Action::Persist { key, value } = action {
                storage.insert(key.clone(), value.clone().unwrap());
            }
        }

        // Restarted from its storage into a proactive recovery: a newer epoch, announced at once.
        let ring = Arc::new(crate::crypto::KeyRing::new(
            &f.config,
            Process::Replica(ReplicaId(5)),
            &crate::crypto::SecretKeys::from_seed([6; 32]),
        ));
        let mut e = ExecStage::new(
            f.config.clone(),
            ReplicaId(1),
            ring,
            &storage,
            Box::new(KvService::new()),
        )
        .unwrap();
        let mut out = Vec::new();
        e.handle(15, Input::Recover, &mut out);
        assert_eq!(e.stats().get("recovery_new_key"), 1);
        let third = new_keys(&out);
        assert_eq!(third.len(), 1);
        assert!(
            third[0].1.epoch > second.epoch,
            "the stored epoch is not announced again"
        );
    }

    /// Where an authentication member shares the process, the execution member keeps no keys:
    /// it announces nothing and leaves NEW-KEYs to the authentication member.
    #[test]
    fn a_co_located_execution_member_keeps_no_keys() {
        let f = fixture(1, 1, 2, knobs());
        let mut e = ExecStage::new(
            f.config.clone(),
            ReplicaId(1),
            f.replicas[1].clone(),
            &Storage::new(),
            Box::new(KvService::new()),
        )
        .unwrap();
        let mut out = Vec::new();
        e.handle(10, Input::Start, &mut out);
        assert!(new_keys(&out).is_empty());
        let key = f.replicas[2].refresh(5).unwrap();
        let envelope = Envelope::seal(
            &f.replicas[2],
            &f.quorums,
            Principal::Auth(ReplicaId(2)),
            Message::NewKey { key, hello: true },
            SealFor::Nothing,
        );
        let mut out = Vec::new();
        e.handle(20, Input::Message(Arc::new(envelope)), &mut out);
        assert!(out.is_empty());
        assert_eq!(e.stats().get("dropped_unexpected_message"), 1);
    }
}

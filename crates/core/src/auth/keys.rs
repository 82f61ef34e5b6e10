//! Key refresh at a replica (`crate::session::ReplicaKeys`): the authentication member is its
//! process's key member. It refreshes the process's receive keys every `knobs.key_refresh_us`,
//! retires the previous ones `knobs.key_overlap_us` later, and installs the NEW-KEYs of replicas
//! and clients (the key ring is the process's, so every co-located member uses them at once).

use super::AuthStage;
use crate::ids::Principal;
use crate::message::Envelope;
use crate::session::{KeyMember, ReplicaKeys};
use crate::stage::{Action, Storage, Time};

/// Storage key of the last announced epoch.
pub const EPOCH_KEY: &str = "auth/key-epoch";

/// The schedule restored from `storage`.
pub(super) fn restore(storage: &Storage) -> ReplicaKeys {
    ReplicaKeys::restore(storage, EPOCH_KEY)
}

impl AuthStage {
    /// Runs `step` on the key schedule with this member's keys, configuration and counters.
    fn with_keys<T>(&mut self, step: impl FnOnce(&mut ReplicaKeys, &mut KeyMember<'_>) -> T) -> T {
        let mut member = KeyMember {
            keys: &self.keys,
            quorums: &self.quorums,
            config: &self.config,
            me: Principal::Auth(self.id),
            stats: &mut self.stats,
        };
        step(&mut self.key_schedule, &mut member)
    }

    fn arm_keys(&mut self, out: &mut Vec<Action>) {
        if let Some(due) = self.key_schedule.due() {
            self.arm_at(due, out);
        }
    }

    /// At start: refresh at once if refresh is on (`ReplicaKeys::start`).
    pub(super) fn start_keys(&mut self, now: Time, out: &mut Vec<Action>) {
        self.with_keys(|k, m| k.start(m, now, out));
        self.arm_keys(out);
    }

    /// Proactive recovery: a new key epoch at once (`ReplicaKeys::recover`).
    pub(super) fn recover_keys(&mut self, now: Time, out: &mut Vec<Action>) {
        self.with_keys(|k, m| k.recover(m, now, out));
        self.arm_keys(out);
    }

    /// The AuthTick part of key refresh: retire, refresh when due (the tick re-arms).
    pub(super) fn key_tick(&mut self, now: Time, out: &mut Vec<Action>) {
        self.with_keys(|k, m| k.tick(m, now, out));
    }

    /// A NEW-KEY from a replica or a client: install it; answer a hello with ours.
    pub(super) fn on_new_key(&mut self, envelope: &Envelope, out: &mut Vec<Action>) {
        self.with_keys(|k, m| k.on_new_key(m, envelope, out));
    }
}

//! Key refresh at a replica (`crate::session`): the authentication member refreshes its
//! process's receive keys every `knobs.key_refresh_us`, retires the previous ones
//! `knobs.key_overlap_us` later, and installs the NEW-KEYs of replicas and clients (the key ring
//! is the process's, so every co-located member uses them at once).
//!
//! The epoch is persisted (eagerly: the NEW-KEY waits for it) before it is announced, so a
//! restarted replica never announces an epoch its peers have seen: `max(stored + 1, now)`.

use bytes::Bytes;

use super::AuthStage;
use crate::ids::{ClientId, Principal, ReplicaId};
use crate::message::Envelope;
use crate::session::{self, NewKey, Schedule};
use crate::stage::{Action, Storage, Time};

/// Storage key of the last announced epoch.
pub const EPOCH_KEY: &str = "auth/key-epoch";

/// The refresh schedule.
#[derive(Debug, Default)]
pub(super) struct KeySchedule {
    /// The last epoch announced (or restored from storage).
    epoch: u64,
    schedule: Schedule,
    /// When to ask again the replicas whose NEW-KEY we do not have (a hello sent while the
    /// connection to them was still being made is lost).
    hello_again_at: Option<Time>,
}

/// How often a replica repeats its hello to the replicas whose keys it does not know.
pub const HELLO_AGAIN_US: Time = 250_000;

impl KeySchedule {
    /// The schedule restored from `storage` (the last epoch announced).
    pub fn restore(storage: &Storage) -> KeySchedule {
        let epoch = storage
            .get(EPOCH_KEY)
            .and_then(|v| <[u8; 8]>::try_from(&v[..]).ok())
            .map_or(0, u64::from_le_bytes);
        KeySchedule {
            epoch,
            ..KeySchedule::default()
        }
    }

    /// The earliest key deadline, if any.
    pub fn due(&self) -> Option<Time> {
        self.schedule.due().into_iter().chain(self.hello_again_at).min()
    }
}

impl AuthStage {
    /// At start: refresh at once if refresh is on, asking every peer for its current NEW-KEY
    /// (after a restart we know none of theirs, and they hold keys to us we no longer have).
    /// Also without periodic refresh if this process ever announced an epoch (a proactive
    /// recovery did): its peers still send under that epoch's keys, which the restart lost
    /// (and a restart into a new configuration changed).
    pub(super) fn start_keys(&mut self, now: Time, out: &mut Vec<Action>) {
        if self.config.knobs.key_refresh_us > 0 || self.key_schedule.epoch > 0 {
            self.refresh_keys(now, true, out);
        }
    }

    /// Proactive recovery: a new key epoch at once (announced to every replica and client, who
    /// answer with theirs), whether or not refresh is periodic; the previous epoch's keys, which
    /// whoever controlled this process before may know, are refused after the overlap.
    pub(super) fn recover_keys(&mut self, now: Time, out: &mut Vec<Action>) {
        self.stats.bump("recovery_new_key");
        // `start_keys` has just begun this start's epoch if refresh is periodic or this process
        // announced epochs before.
        if self.config.knobs.key_refresh_us == 0 && self.keys.epoch() == 0 {
            self.refresh_keys(now, true, out);
        }
    }

    /// The AuthTick part of key refresh: retire, refresh when due.
    pub(super) fn key_tick(&mut self, now: Time, out: &mut Vec<Action>) {
        let (retired, refresh) = self.key_schedule.schedule.tick(&self.keys, now);
        if retired {
            self.stats.bump("keys_retired");
        }
        if refresh {
            self.refresh_keys(now, false, out);
        }
        if self.key_schedule.hello_again_at.is_some_and(|at| at <= now) {
            self.hello_again(now, out);
        }
    }

    /// Repeats our hello to the replicas whose NEW-KEY we have not installed (until we have
    /// every one).
    fn hello_again(&mut self, now: Time, out: &mut Vec<Action>) {
        let me = self.id;
        let unknown: Vec<Principal> = (0..self.config.replicas.len() as u32)
            .map(ReplicaId)
            .filter(|r| *r != me && self.keys.peer_epoch(crate::ids::Process::Replica(*r)) == 0)
            .map(Principal::Auth)
            .collect();
        // Without periodic refresh peers announce nothing to answer with: a recovery's hello
        // is sent once.
        let periodic = self.config.knobs.key_refresh_us > 0;
        match self.keys.announcement() {
            Some(ours) if periodic && !unknown.is_empty() => {
                self.stats.bump("new_key_hello_again");
                self.send_new_key(ours, true, unknown, out);
                self.key_schedule.hello_again_at = Some(now.saturating_add(HELLO_AGAIN_US));
            }
            _ => self.key_schedule.hello_again_at = None,
        }
    }

    fn refresh_keys(&mut self, now: Time, hello: bool, out: &mut Vec<Action>) {
        let ks = &mut self.key_schedule;
        let Some(key) = ks.schedule.refresh(&self.keys, ks.epoch, now, &self.config.knobs) else {
            return;
        };
        ks.epoch = key.epoch;
        out.push(Action::Persist {
            key: EPOCH_KEY.to_string(),
            value: Some(Bytes::copy_from_slice(&key.epoch.to_le_bytes())),
        });
        self.stats.bump("keys_refreshed");
        if hello {
            self.key_schedule.hello_again_at = Some(now.saturating_add(HELLO_AGAIN_US));
        }
        let me = self.id;
        let replicas = (0..self.config.replicas.len() as u32)
            .map(ReplicaId)
            .filter(|r| *r != me)
            .map(Principal::Auth);
        let clients = self.config.clients.iter().map(|c| Principal::Client(c.id));
        let to: Vec<Principal> = replicas.chain(clients).collect();
        self.send_new_key(key, hello, to, out);
        if let Some(due) = self.key_schedule.due() {
            self.arm_at(due, out);
        }
    }

    fn send_new_key(&mut self, key: NewKey, hello: bool, to: Vec<Principal>, out: &mut Vec<Action>) {
        if !to.is_empty() {
            out.push(session::send_new_key(
                &self.keys,
                &self.quorums,
                Principal::Auth(self.id),
                key,
                hello,
                to,
            ));
        }
    }

    /// A NEW-KEY from a replica or a client: install it; answer a hello with ours.
    pub(super) fn on_new_key(&mut self, envelope: &Envelope, out: &mut Vec<Action>) {
        let known = match envelope.from {
            Principal::Client(ClientId(c)) => self.config.clients.iter().any(|info| info.id.0 == c),
            // Any member of another replica (a NEW-KEY in answer to a bad seal comes from the
            // member that saw it); the signature is the process's.
            Principal::Auth(r) | Principal::Order(r) | Principal::Exec(r) => {
                r != self.id && (r.0 as usize) < self.config.replicas.len()
            }
        };
        let (stat, answer) = session::receive(&self.keys, envelope, known);
        self.stats.bump(stat);
        if let Some((ours, to)) = answer {
            self.stats.bump("new_key_hello_answered");
            self.send_new_key(ours, false, vec![to], out);
        }
    }
}

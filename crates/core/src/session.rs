//! Session keys that change (PBFT thesis ch. 4, key refresh): every process refreshes the MAC keys
//! of the messages it *receives* every `knobs.key_refresh_us`, and messages under a key it retired
//! are refused once a bounded overlap (`knobs.key_overlap_us`) has passed.
//!
//! PBFT's NEW-KEY carries, for each peer, a fresh key encrypted to that peer and signed. Here a
//! NEW-KEY carries one fresh ephemeral X25519 public key, signed with the process's long-term
//! Ed25519 key; the key of messages from `p` to `q` in `q`'s epoch `e` is
//! `BLAKE3-KDF(X25519(static_p, ephemeral_q,e), p, q, e, cluster)`, which only `p` (with its
//! static secret) and `q` (with its ephemeral secret) can compute: the same secrecy as a key
//! encrypted to each recipient, in one message of 112 bytes whatever the number of peers. As in
//! PBFT, the receiver chooses the keys of its incoming channels, so a sender switches to a new key
//! only once it has the NEW-KEY that defines it, and no message is lost to a refresh: the receiver
//! accepts the previous epoch's keys until it retires them.
//!
//! Epoch 0 is the long-term pairwise key ([`crate::crypto::KeyRing::new`]), used until the first
//! refresh; a cluster without refresh never leaves it. Epochs only grow: a replica persists its
//! last epoch before announcing the next (a replayed NEW-KEY names an epoch its peers have seen
//! and is refused), and each epoch is at least the announcing process's clock in microseconds.
//!
//! What a refresh protects: the session keys a compromised process held are useless once it
//! refreshed and retired them. The long-term keys themselves are, as PBFT's secure co-processor
//! kept them, outside what an attacker can read (docs/OPERATING.md, window of vulnerability).

use std::collections::BTreeMap;

use crate::ids::Process;

pub use crate::crypto::{Accepted, NewKey};

/// NEW-KEYs one process sends another, per epoch of its own, in answer to bad seals.
pub const REPAIRS_PER_EPOCH_MAX: u8 = 3;

/// Answers a message whose seal does not verify, from a configured process, with our current
/// NEW-KEY (at most [`REPAIRS_PER_EPOCH_MAX`] times per peer, epoch of ours and epoch of the
/// peer's we know): the usual cause is a sender that missed our NEW-KEY (lost in the network,
/// or sent while its connection was down), or that restarted and forgot it, and seals under
/// keys we retired. Without it such a sender stays unheard until our next refresh. A forger
/// gets at most three public announcements per pair of epochs out of it; a peer that restarts
/// (and announces a new epoch) gets three more.
#[derive(Debug, Default)]
pub struct KeyRepair {
    /// Per peer: (our epoch, its epoch as we know it) and the repairs sent for that pair.
    sent: BTreeMap<Process, ((u64, u64), u8)>,
}

impl KeyRepair {
    /// After a bad seal on `envelope` at member `me`: our NEW-KEY to the sender's process, if
    /// we refreshed, it is a configured process, and the budget allows.
    pub fn after_bad_seal(
        &mut self,
        keys: &crate::crypto::KeyRing,
        quorums: &crate::quorum::Quorums,
        me: crate::ids::Principal,
        envelope: &crate::message::Envelope,
        out: &mut Vec<crate::stage::Action>,
    ) {
        use crate::ids::Principal;
        let process = keys.process_of(envelope.from);
        let (Some(ours), true) = (keys.announcement(), keys.knows(process)) else {
            return;
        };
        let to = match process {
            Process::Replica(r) => match quorums.members_of(r).first() {
                Some(member) => *member,
                None => return,
            },
            Process::Client(c) => Principal::Client(c),
        };
        if process == keys.process_of(me) {
            return;
        }
        let epochs = (ours.epoch, keys.peer_epoch(process));
        let entry = self.sent.entry(process).or_insert((epochs, 0));
        if entry.0 != epochs {
            *entry = (epochs, 0);
        }
        if entry.1 >= REPAIRS_PER_EPOCH_MAX {
            return;
        }
        entry.1 += 1;
        out.push(send_new_key(keys, quorums, me, ours, false, vec![to]));
    }
}

/// The action that sends NEW-KEY `key` from member `from` to `to` (sealed with nothing: the
/// announcement carries its process's signature).
pub fn send_new_key(
    keys: &crate::crypto::KeyRing,
    quorums: &crate::quorum::Quorums,
    from: crate::ids::Principal,
    key: NewKey,
    hello: bool,
    to: Vec<crate::ids::Principal>,
) -> crate::stage::Action {
    let message = crate::message::Message::NewKey { key, hello };
    let sealed = crate::message::Envelope::seal(keys, quorums, from, message, crate::message::SealFor::Nothing);
    crate::stage::Action::Send {
        to,
        envelope: std::sync::Arc::new(sealed),
    }
}

/// When a process refreshes next and retires its previous keys (the authentication member's at
/// a replica, the client stage's at a client).
#[derive(Debug, Default)]
pub struct Schedule {
    /// When to refresh next (`None`: refresh is off, or not started).
    pub next_refresh: Option<crate::stage::Time>,
    /// When to retire the previous epoch's keys.
    pub retire_at: Option<crate::stage::Time>,
}

impl Schedule {
    /// Starts epoch `max(last + 1, now)` at `keys` (`last`: the last epoch announced, which a
    /// replica restores from storage) and schedules the next refresh and the retirement.
    pub fn refresh(
        &mut self,
        keys: &crate::crypto::KeyRing,
        last: u64,
        now: crate::stage::Time,
        knobs: &crate::config::Knobs,
    ) -> Option<NewKey> {
        let key = keys.refresh(last.saturating_add(1).max(now))?;
        // Without periodic refresh (a recovery's one new epoch) nothing more is scheduled.
        self.next_refresh = (knobs.key_refresh_us > 0).then(|| now.saturating_add(knobs.key_refresh_us));
        self.retire_at = Some(now.saturating_add(knobs.key_overlap_us));
        Some(key)
    }

    /// Retires the previous keys if their time has come (returns whether it did) and tells
    /// whether a refresh is due.
    pub fn tick(&mut self, keys: &crate::crypto::KeyRing, now: crate::stage::Time) -> (bool, bool) {
        let retire = self.retire_at.is_some_and(|at| at <= now);
        if retire {
            keys.retire();
            self.retire_at = None;
        }
        (retire, self.next_refresh.is_some_and(|at| at <= now))
    }

    /// The earliest deadline.
    pub fn due(&self) -> Option<crate::stage::Time> {
        self.next_refresh.into_iter().chain(self.retire_at).min()
    }
}

/// A NEW-KEY at `keys` from `envelope.from` (`known`: whether that principal may send one
/// here): the counter to bump and, for a hello that was not refused, whom to answer with our
/// own announcement.
pub fn receive(
    keys: &crate::crypto::KeyRing,
    envelope: &crate::message::Envelope,
    known: bool,
) -> (&'static str, Option<(NewKey, crate::ids::Principal)>) {
    let crate::message::Message::NewKey { key, hello } = &envelope.message else {
        return ("new_key_wrong_kind", None);
    };
    if !known {
        return ("new_key_wrong_sender", None);
    }
    let stat = match keys.accept_new_key(keys.process_of(envelope.from), key) {
        Ok(Accepted::Installed) => "new_key_installed",
        Ok(Accepted::Stale) => "new_key_stale",
        Err(_) => return ("new_key_bad_signature", None),
    };
    let answer = keys.announcement().filter(|_| *hello).map(|ours| (ours, envelope.from));
    (stat, answer)
}

/// Key refresh at a replica process, run by its *key member*: the authentication member, or the
/// execution member of an execution-only process (separate stages), which has no authentication
/// member. It refreshes the process's receive keys every `knobs.key_refresh_us`, retires the
/// previous ones `knobs.key_overlap_us` later, and installs the NEW-KEYs of replicas and clients
/// (the key ring is the process's, so every co-located member uses them at once).
///
/// The epoch is persisted (eagerly: the NEW-KEY waits for it) before it is announced, so a
/// restarted replica never announces an epoch its peers have seen: `max(stored + 1, now)`.
#[derive(Debug)]
pub(crate) struct ReplicaKeys {
    /// The storage key of the last announced epoch.
    storage_key: &'static str,
    /// The last epoch announced (or restored from storage).
    epoch: u64,
    schedule: Schedule,
    /// When to ask again the replicas whose NEW-KEY we do not have (a hello sent while the
    /// connection to them was still being made is lost).
    hello_again_at: Option<crate::stage::Time>,
}

/// How often a replica repeats its hello to the replicas whose keys it does not know.
pub const HELLO_AGAIN_US: crate::stage::Time = 250_000;

/// What a key member lends [`ReplicaKeys`] for one step.
pub(crate) struct KeyMember<'a> {
    pub keys: &'a crate::crypto::KeyRing,
    pub quorums: &'a crate::quorum::Quorums,
    pub config: &'a crate::config::ClusterConfig,
    /// The key member itself.
    pub me: crate::ids::Principal,
    pub stats: &'a mut crate::stage::Stats,
}

impl KeyMember<'_> {
    /// Our process's index among the replicas.
    fn my_replica(&self) -> Option<crate::ids::ReplicaId> {
        match self.quorums.process_of(self.me) {
            Process::Replica(r) => Some(r),
            Process::Client(_) => None,
        }
    }

    /// The key member of every other replica process whose NEW-KEY satisfies `want`.
    fn other_replicas(&self, want: impl Fn(Process) -> bool) -> Vec<crate::ids::Principal> {
        let mine = self.my_replica();
        (0..self.config.replicas.len() as u32)
            .map(crate::ids::ReplicaId)
            .filter(|r| Some(*r) != mine && want(Process::Replica(*r)))
            .filter_map(|r| self.quorums.key_member(r))
            .collect()
    }

    fn send(&self, key: NewKey, hello: bool, to: Vec<crate::ids::Principal>, out: &mut Vec<crate::stage::Action>) {
        if !to.is_empty() {
            out.push(send_new_key(self.keys, self.quorums, self.me, key, hello, to));
        }
    }
}

impl ReplicaKeys {
    /// The schedule restored from `storage` (the last epoch announced, under `storage_key`).
    pub fn restore(storage: &crate::stage::Storage, storage_key: &'static str) -> ReplicaKeys {
        let epoch = storage
            .get(storage_key)
            .and_then(|v| <[u8; 8]>::try_from(&v[..]).ok())
            .map_or(0, u64::from_le_bytes);
        ReplicaKeys {
            storage_key,
            epoch,
            schedule: Schedule::default(),
            hello_again_at: None,
        }
    }

    /// The earliest key deadline, if any.
    pub fn due(&self) -> Option<crate::stage::Time> {
        self.schedule.due().into_iter().chain(self.hello_again_at).min()
    }

    /// At start: refresh at once if refresh is on, asking every peer for its current NEW-KEY
    /// (after a restart we know none of theirs, and they hold keys to us we no longer have).
    /// Also without periodic refresh if this process ever announced an epoch (a proactive
    /// recovery did): its peers still send under that epoch's keys, which the restart lost
    /// (and a restart into a new configuration changed).
    pub fn start(&mut self, m: &mut KeyMember<'_>, now: crate::stage::Time, out: &mut Vec<crate::stage::Action>) {
        if m.config.knobs.key_refresh_us > 0 || self.epoch > 0 {
            self.refresh(m, now, true, out);
        }
    }

    /// Proactive recovery: a new key epoch at once (announced to every replica and client, who
    /// answer with theirs), whether or not refresh is periodic; the previous epoch's keys, which
    /// whoever controlled this process before may know, are refused after the overlap.
    pub fn recover(&mut self, m: &mut KeyMember<'_>, now: crate::stage::Time, out: &mut Vec<crate::stage::Action>) {
        m.stats.bump("recovery_new_key");
        // `start` has just begun this start's epoch if refresh is periodic or this process
        // announced epochs before.
        if m.config.knobs.key_refresh_us == 0 && m.keys.epoch() == 0 {
            self.refresh(m, now, true, out);
        }
    }

    /// Retire, refresh when due, hello again when due.
    pub fn tick(&mut self, m: &mut KeyMember<'_>, now: crate::stage::Time, out: &mut Vec<crate::stage::Action>) {
        let (retired, refresh) = self.schedule.tick(m.keys, now);
        if retired {
            m.stats.bump("keys_retired");
        }
        if refresh {
            self.refresh(m, now, false, out);
        }
        if self.hello_again_at.is_some_and(|at| at <= now) {
            self.hello_again(m, now, out);
        }
    }

    /// Repeats our hello to the replicas whose NEW-KEY we have not installed (until we have
    /// every one).
    fn hello_again(&mut self, m: &mut KeyMember<'_>, now: crate::stage::Time, out: &mut Vec<crate::stage::Action>) {
        let unknown = m.other_replicas(|p| m.keys.peer_epoch(p) == 0);
        // Without periodic refresh peers announce nothing to answer with: a recovery's hello
        // is sent once.
        let periodic = m.config.knobs.key_refresh_us > 0;
        match m.keys.announcement() {
            Some(ours) if periodic && !unknown.is_empty() => {
                m.stats.bump("new_key_hello_again");
                m.send(ours, true, unknown, out);
                self.hello_again_at = Some(now.saturating_add(HELLO_AGAIN_US));
            }
            _ => self.hello_again_at = None,
        }
    }

    fn refresh(
        &mut self,
        m: &mut KeyMember<'_>,
        now: crate::stage::Time,
        hello: bool,
        out: &mut Vec<crate::stage::Action>,
    ) {
        let Some(key) = self.schedule.refresh(m.keys, self.epoch, now, &m.config.knobs) else {
            return;
        };
        self.epoch = key.epoch;
        out.push(crate::stage::Action::Persist {
            key: self.storage_key.to_string(),
            value: Some(bytes::Bytes::copy_from_slice(&key.epoch.to_le_bytes())),
        });
        m.stats.bump("keys_refreshed");
        if hello {
            self.hello_again_at = Some(now.saturating_add(HELLO_AGAIN_US));
        }
        let mut to = m.other_replicas(|_| true);
        to.extend(m.config.clients.iter().map(|c| crate::ids::Principal::Client(c.id)));
        m.send(key, hello, to, out);
    }

    /// A NEW-KEY from a replica or a client: install it; answer a hello with ours.
    pub fn on_new_key(
        &mut self,
        m: &mut KeyMember<'_>,
        envelope: &crate::message::Envelope,
        out: &mut Vec<crate::stage::Action>,
    ) {
        use crate::ids::Principal;
        let known = match envelope.from {
            Principal::Client(c) => m.config.clients.iter().any(|info| info.id == c),
            // Any member of another replica process (a NEW-KEY in answer to a bad seal comes from
            // the member that saw it); the signature is the process's.
            from => match m.quorums.process_of(from) {
                Process::Replica(r) => Some(r) != m.my_replica() && (r.0 as usize) < m.config.replicas.len(),
                Process::Client(_) => false,
            },
        };
        let (stat, answer) = receive(m.keys, envelope, known);
        m.stats.bump(stat);
        if let Some((ours, to)) = answer {
            m.stats.bump("new_key_hello_answered");
            m.send(ours, false, vec![to], out);
        }
    }
}

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

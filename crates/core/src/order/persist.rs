//! What the order stage writes to storage, and reading it back after a restart.
//!
//! Keys (all under `order/`):
//! - `order/view`: the current view and whether a view change to it is in progress (written at
//!   the first start too, before anything is sent, so a restart knows it may have voted);
//! - `order/stable`: the latest stable checkpoint with its certificate;
//! - `order/slot/<seqno>`: a [`SlotRecord`] per sequence number above the stable checkpoint,
//!   written whole when a batch is accepted there: lazily in the normal case (the PRE-PREPARE or
//!   PREPARE does not wait for the disk; the prepared certificate, written eagerly after it in the
//!   same log, makes it durable; a member that loses it abstains in that view after restarting),
//!   eagerly from a NEW-VIEW;
//! - `order/mark/<seqno>`: a [`SlotMark`] (prepared certificate and commit decision by digest),
//!   written instead of the whole record when the slot prepares (before COMMIT is sent) or commits
//!   (lazily: nothing sent depends on it, a member that loses it still holds the prepared
//!   certificate and learns the decision again); recovery merges it into the record
//!   ([`SlotRecord::merge`]);
//! - `order/cp/<seqno>`: this member's own checkpoint and signed vote, per checkpoint above it.
//!
//! Sequence numbers are zero-padded so keys sort numerically.

use std::collections::BTreeMap;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::log::{SlotMark, SlotRecord};
use crate::codec;
use crate::ids::{SeqNo, View};
use crate::message::{CheckpointVote, OrderCheckpoint, Signed, StableCheckpoint};
use crate::stage::{Action, Storage};

/// Key of the view record.
pub(crate) const VIEW_KEY: &str = "order/view";
/// Key of the stable checkpoint.
pub(crate) const STABLE_KEY: &str = "order/stable";
const SLOT_PREFIX: &str = "order/slot/";
const MARK_PREFIX: &str = "order/mark/";
const CHECKPOINT_PREFIX: &str = "order/cp/";

/// The persisted view state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ViewRecord {
    /// Current view (the target view while a view change is in progress).
    pub view: View,
    /// A view change to `view` is in progress (VIEW-CHANGE sent, NEW-VIEW not yet installed).
    pub changing: bool,
}

/// This member's own checkpoint and vote.
pub(crate) type OwnCheckpoint = (OrderCheckpoint, Signed<CheckpointVote>);

/// Everything read back from storage.
#[derive(Debug, Default)]
pub(crate) struct Recovered {
    pub view: ViewRecord,
    /// Whether a view record was stored (every member writes one before it first sends).
    pub view_found: bool,
    pub stable: Option<StableCheckpoint>,
    pub slots: BTreeMap<SeqNo, SlotRecord>,
    pub checkpoints: BTreeMap<SeqNo, OwnCheckpoint>,
}

/// Key of a slot record.
pub(crate) fn slot_key(seqno: SeqNo) -> String {
    format!("{SLOT_PREFIX}{:020}", seqno.0)
}

/// Key of a slot mark.
pub(crate) fn mark_key(seqno: SeqNo) -> String {
    format!("{MARK_PREFIX}{:020}", seqno.0)
}

/// Key of an own checkpoint.
pub(crate) fn checkpoint_key(seqno: SeqNo) -> String {
    format!("{CHECKPOINT_PREFIX}{:020}", seqno.0)
}

/// A write action.
pub(crate) fn write<T: Serialize>(out: &mut Vec<Action>, key: String, value: &T) {
    out.push(Action::Persist {
        key,
        value: Some(Bytes::from(codec::to_bytes(value))),
    });
}

/// A write that later sends need not wait for ([`Action::PersistLazily`]).
pub(crate) fn write_lazily<T: Serialize>(out: &mut Vec<Action>, key: String, value: &T) {
    out.push(Action::PersistLazily {
        key,
        value: Some(Bytes::from(codec::to_bytes(value))),
    });
}

/// A delete action.
pub(crate) fn delete(out: &mut Vec<Action>, key: String) {
    out.push(Action::Persist { key, value: None });
}

/// A delete that later sends need not wait for ([`Action::PersistLazily`]).
pub(crate) fn delete_lazily(out: &mut Vec<Action>, key: String) {
    out.push(Action::PersistLazily { key, value: None });
}

/// Why storage could not be read (our own writes: a corrupted store is not something to guess
/// around, so `new` fails loudly).
#[derive(Debug)]
pub(crate) struct CorruptStorage(pub String);

fn seqno_of(key: &str, prefix: &str) -> Result<SeqNo, CorruptStorage> {
    key[prefix.len()..]
        .parse()
        .map(SeqNo)
        .map_err(|_| CorruptStorage(key.to_string()))
}

fn decode<T: for<'a> Deserialize<'a>>(key: &str, value: &Bytes) -> Result<T, CorruptStorage> {
    codec::from_bytes(value).map_err(|_| CorruptStorage(key.to_string()))
}

/// Reads the order stage's keys. Records at or below the stable checkpoint are ignored (they may
/// survive when a crash interrupted garbage collection).
pub(crate) fn recover(storage: &Storage) -> Result<Recovered, CorruptStorage> {
    let mut recovered = Recovered::default();
    if let Some(value) = storage.get(VIEW_KEY) {
        recovered.view = decode(VIEW_KEY, value)?;
        recovered.view_found = true;
    }
    if let Some(value) = storage.get(STABLE_KEY) {
        recovered.stable = Some(decode(STABLE_KEY, value)?);
    }
    let h = recovered.stable.as_ref().map_or(SeqNo(0), |s| s.checkpoint.seqno);
    for (key, value) in storage.range(SLOT_PREFIX.to_string()..) {
        if !key.starts_with(SLOT_PREFIX) {
            break;
        }
        let seqno = seqno_of(key, SLOT_PREFIX)?;
        if seqno > h {
            recovered.slots.insert(seqno, decode(key, value)?);
        }
    }
    for (key, value) in storage.range(MARK_PREFIX.to_string()..) {
        if !key.starts_with(MARK_PREFIX) {
            break;
        }
        let seqno = seqno_of(key, MARK_PREFIX)?;
        if seqno > h {
            let mark: SlotMark = decode(key, value)?;
            let corrupt = || CorruptStorage(key.to_string());
            let record = recovered.slots.get_mut(&seqno).ok_or_else(corrupt)?;
            record.merge(mark).map_err(|_| corrupt())?;
        }
    }
    for (key, value) in storage.range(CHECKPOINT_PREFIX.to_string()..) {
        if !key.starts_with(CHECKPOINT_PREFIX) {
            break;
        }
        let seqno = seqno_of(key, CHECKPOINT_PREFIX)?;
        if seqno > h {
            recovered.checkpoints.insert(seqno, decode(key, value)?);
        }
    }
    Ok(recovered)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_sort_numerically_and_round_trip() {
        assert!(slot_key(SeqNo(9)) < slot_key(SeqNo(10)));
        let mut out = Vec::new();
        write(
            &mut out,
            VIEW_KEY.to_string(),
            &ViewRecord {
                view: View(3),
                changing: true,
            },
        );
        write(&mut out, slot_key(SeqNo(2)), &SlotRecord::default());
        let mut storage = Storage::new();
        for action in out {
            if let Action::Persist { key, value: Some(v) } = action {
                storage.insert(key, v);
            }
        }
        let r = recover(&storage).unwrap();
        assert_eq!(
            r.view,
            ViewRecord {
                view: View(3),
                changing: true
            }
        );
        assert_eq!(r.slots.keys().copied().collect::<Vec<_>>(), vec![SeqNo(2)]);
        storage.insert(VIEW_KEY.to_string(), Bytes::from_static(b"\xff\xff"));
        assert!(recover(&storage).is_err());
    }

    fn stored(out: Vec<Action>) -> Storage {
        let mut storage = Storage::new();
        for action in out {
            if let Action::Persist { key, value: Some(v) } = action {
                storage.insert(key, v);
            }
        }
        storage
    }

    #[test]
    fn marks_are_merged_on_recovery_and_need_their_record() {
        use crate::message::Batch;
        let mut slot = super::super::log::Slot::default();
        let digest = slot.accept(
            SeqNo(7),
            View(0),
            Batch {
                time_us: 1,
                entries: vec![],
            },
        );
        slot.record.committed = Some(View(0));
        let mark = SlotMark {
            prepared: Some((View(0), digest)),
            committed: Some((View(0), digest)),
        };
        let mut out = Vec::new();
        write(
            &mut out,
            slot_key(SeqNo(7)),
            &SlotRecord {
                committed: None,
                ..slot.record.clone()
            },
        );
        write(&mut out, mark_key(SeqNo(7)), &mark);
        let r = recover(&stored(out)).unwrap();
        let record = &r.slots[&SeqNo(7)];
        assert_eq!(record.committed, Some(View(0)));
        assert_eq!(
            record.prepared.as_ref().map(|p| (p.view, p.digest)),
            Some((View(0), digest))
        );
        // A mark whose record is missing is a corrupted store.
        let mut out = Vec::new();
        write(&mut out, mark_key(SeqNo(7)), &mark);
        assert!(recover(&stored(out)).is_err());
    }
}

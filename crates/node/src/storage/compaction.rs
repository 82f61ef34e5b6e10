//! Compaction off the event loop.
//!
//! Writing a snapshot costs time proportional to the live state, not to the records that
//! triggered it: an authentication member keeps every body it may still be FETCHed for (up to
//! `3 * checkpoint_interval + 1` per client), so with 4-KiB bodies its snapshot is tens of MB, and
//! writing plus syncing it inside [`StageLog::sync`](super::StageLog::sync) stalled the whole
//! replica for hundreds of milliseconds (all authentication members reach the bound at the same
//! moment, as they log the same bodies): the 4/0 bench's ~500 ms tail, one client retransmission.
//!
//! So the event loop only *rotates* the log — the current log becomes `log.prev`, a fresh
//! preallocated `log` takes the new records — and a background thread writes the snapshot of the
//! state at the rotation, renames it into place and then retires `log.prev` (renamed `log.dead`,
//! freed 1 MiB at a time, deleted; `log.dead` is never read and is deleted at the next open).
//! Recovery reads `snapshot`, then `log.prev` if present, then `log`. Every crash point is safe:
//! - before the snapshot rename: the old snapshot + `log.prev` (every record since it, up to the
//!   rotation) + `log` (every record since);
//! - after the rename, before `log.prev` is deleted: the new snapshot is the state at the rotation
//!   and `log.prev` is the complete sequence of records that led to it from the old snapshot, so
//!   replaying it over the new snapshot yields that same state (each record sets or deletes a whole
//!   value; a key's last record in `log.prev` is its value at the rotation), then `log` as before.
//!
//! A compaction pays for the live state it rewrites, so it is started only once the log is both
//! past its bound and [`LOG_TO_LIVE_FACTOR`] times larger than the live state (then at least half
//! of the log is superseded records): a log that is mostly live (an authentication member logging
//! new bodies faster than old ones are evicted) is not rewritten for nothing every
//! `compact_log_bytes`, and the bytes rewritten stay below the bytes logged.
//!
//! One compaction is in flight at a time. If the new log reaches [`COMPACTION_BACKLOG_FACTOR`]
//! times the bound (or the live state) before it finishes, the event loop waits for it (the log
//! stays bounded; the disk is then simply too slow for the write rate).

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use upright_core::stage::Storage;

use super::{encode_record, end_marker, sync_dir, LOG_DEAD, LOG_PREV, SNAPSHOT, SNAPSHOT_TMP};

/// A compaction starts once the log is this many times larger than the live state (and past its
/// bound).
pub const LOG_TO_LIVE_FACTOR: u64 = 2;

/// Bytes of a retired log freed per step.
pub const RELEASE_STEP_BYTES: u64 = 1 << 20;

/// Pause between two steps of freeing a retired log.
pub const RELEASE_PAUSE: Duration = Duration::from_millis(20);

/// Longest pause between two snapshot chunks.
pub const PACING_SLEEP_MAX: Duration = Duration::from_millis(50);

/// Bytes of snapshot written between two syncs.
pub const SNAPSHOT_CHUNK_BYTES: usize = 1 << 20;

/// While a compaction is in flight the log may grow to this many times
/// [`StorageOptions::compact_log_bytes`](super::StorageOptions::compact_log_bytes) (or the live
/// state, if larger) before the event loop waits for it.
pub const COMPACTION_BACKLOG_FACTOR: u64 = 4;

/// A snapshot being written by a background thread.
pub(super) struct Compaction {
    handle: JoinHandle<io::Result<()>>,
}

impl Compaction {
    /// Starts writing the snapshot of `state` (the state at the rotation) into `dir`; when it is in
    /// place, deletes `log.prev`.
    pub(super) fn start(dir: &Path, state: Storage) -> io::Result<Compaction> {
        let dir: PathBuf = dir.to_path_buf();
        let handle = thread::Builder::new()
            .name("log-compaction".into())
            .spawn(move || write_snapshot_and_drop_prev(&dir, &state))?;
        Ok(Compaction { handle })
    }

    /// Whether the thread has finished (its result is then ready for [`Compaction::wait`]).
    pub(super) fn is_finished(&self) -> bool {
        self.handle.is_finished()
    }

    /// Waits for the thread and returns its result.
    pub(super) fn wait(self) -> io::Result<()> {
        match self.handle.join() {
            Ok(result) => result,
            Err(_) => Err(io::Error::other("the log compaction thread panicked")),
        }
    }
}

/// Writes `snapshot.tmp` (synced), renames it to `snapshot`, syncs the directory, then retires
/// `log.prev` (see [`release_gradually`]).
pub(super) fn write_snapshot_and_drop_prev(dir: &Path, state: &Storage) -> io::Result<()> {
    write_snapshot_tmp(dir, state)?;
    fs::rename(dir.join(SNAPSHOT_TMP), dir.join(SNAPSHOT))?;
    sync_dir(dir)?;
    match fs::rename(dir.join(LOG_PREV), dir.join(LOG_DEAD)) {
        Ok(()) => sync_dir(dir)?,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    }
    release_gradually(&dir.join(LOG_DEAD))?;
    fs::remove_file(dir.join(LOG_DEAD))?;
    sync_dir(dir)
}

/// Frees a dead file's blocks [`RELEASE_STEP_BYTES`] at a time, pausing [`RELEASE_PAUSE`] between
/// steps.
///
/// Unlinking a whole old log (tens of MB, preallocated) at once frees all its blocks in one journal
/// transaction; on a file system mounted with `discard` (as the bench machine's is) that commit
/// also discards them, and every log's `fdatasync` waits for it: measured, the unlink alone made
/// the 4/0 bench's throughput drop by half for a second and its p99.9 go from 29 ms to 281 ms.
/// The file is already renamed to `log.dead` (never read: a crash leaves it to be deleted at the
/// next open), so its partial truncations can never be mistaken for a damaged log.
fn release_gradually(path: &Path) -> io::Result<()> {
    let file = fs::OpenOptions::new().write(true).open(path)?;
    let mut len = file.metadata()?.len();
    while len > 0 {
        len = len.saturating_sub(RELEASE_STEP_BYTES);
        // Not synced: the logs' next group commit carries this step's (small) journal work.
        file.set_len(len)?;
        thread::sleep(RELEASE_PAUSE);
    }
    Ok(())
}

/// The complete snapshot of `state` under its temporary name, synced; written and synced
/// [`SNAPSHOT_CHUNK_BYTES`] at a time.
///
/// After each chunk the thread sleeps as long as the chunk took (at most [`PACING_SLEEP_MAX`]), so
/// the snapshot takes at most about half of the disk's time and the group commits of the logs
/// (the latency of every request) are not queued behind it. Syncing as it goes keeps the
/// snapshot's dirty data small. Written in one piece and synced at the
/// end, tens of MB sat in the page cache and the first `fdatasync` of any log on the same file
/// system (ext4's journal commit writes out the data of newly allocated blocks first) waited for
/// all of it: moving the snapshot off the event loop alone did not remove the stall.
pub(super) fn write_snapshot_tmp(dir: &Path, state: &Storage) -> io::Result<()> {
    use std::io::Write;
    let mut file = fs::File::create(dir.join(SNAPSHOT_TMP))?;
    let mut chunk = Vec::with_capacity(2 * SNAPSHOT_CHUNK_BYTES);
    for (key, value) in state {
        encode_record(key, Some(value), &mut chunk);
        if chunk.len() >= SNAPSHOT_CHUNK_BYTES {
            let started = Instant::now();
            file.write_all(&chunk)?;
            file.sync_data()?;
            chunk.clear();
            // Leave the disk to the logs' group commits for as long as this chunk took.
            thread::sleep(started.elapsed().min(PACING_SLEEP_MAX));
        }
    }
    end_marker(state.len(), &mut chunk);
    file.write_all(&chunk)?;
    file.sync_all()
}

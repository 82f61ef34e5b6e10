//! Durable storage of one stage member: a write-ahead log of [`Action::Persist`] records plus a
//! snapshot, with group commit and recovery.
//!
//! Files in the member's directory:
//! - `snapshot`: every key's value at the last compaction, followed by an end marker that states
//!   the number of entries (a snapshot without its marker is incomplete and refused);
//! - `log`: the records written since, in order, written at explicit positions into space
//!   allocated ahead in chunks of [`LOG_PREALLOC_BYTES`] (`prealloc.rs`), so a group commit's
//!   `fdatasync` does not also commit a new file size; the space after the last record reads as
//!   zeros.
//!
//! - `log.prev`: while a compaction is in flight (`compaction.rs`), the log that was current when it
//!   started; deleted once the new snapshot is in place.
//!
//! Compaction runs off the event loop: [`StageLog::sync`] only rotates the log and a background
//! thread writes the snapshot (see `compaction.rs`).
//!
//! Recovery loads the snapshot and replays `log.prev` (if present) and the log over it. Replaying is
//! idempotent (each record sets or deletes a whole value), so a crash after the new snapshot is
//! renamed into place but before the old log is reset or deleted loses nothing. Zeros after the last record are the normal end of the
//! data ([`Recovery::Clean`]). A torn last log record (followed only by zeros) is an interrupted
//! write: it is truncated and the space allocated again. Damage anywhere else means the files
//! cannot be trusted: they are moved aside, the stage starts from empty storage and recovers its
//! state from its peers (the protocol's state transfer), and [`Recovery::Corrupted`] is reported so
//! the host logs and counts it.
//!
//! [`Action::Persist`]: upright_core::stage::Action::Persist

mod compaction;
mod prealloc;
mod record;

use std::fs::{self, File};
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use upright_core::stage::Storage;

use compaction::Compaction;
pub use compaction::{COMPACTION_BACKLOG_FACTOR, LOG_TO_LIVE_FACTOR, SNAPSHOT_CHUNK_BYTES};
use prealloc::LogFile;
pub use prealloc::LOG_PREALLOC_BYTES;
pub use record::{encode_record, parse_records, Record, Tail, RECORD_BYTES_MAX};

const SNAPSHOT: &str = "snapshot";
const SNAPSHOT_TMP: &str = "snapshot.tmp";
const LOG: &str = "log";
const LOG_TMP: &str = "log.tmp";
const LOG_PREV: &str = "log.prev";
/// A retired `log.prev` being freed in the background; never read, deleted at open.
const LOG_DEAD: &str = "log.dead";
/// Key of the snapshot's end marker (stage keys never start with a NUL byte).
const END_MARKER: &str = "\0end";

/// When to call `fsync`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FsyncPolicy {
    /// Make every group of persists durable before the next send (the protocol's rule).
    #[default]
    Always,
    /// Write but never sync: for benchmarks only; a machine crash may lose acknowledged state.
    Never,
}

/// Storage settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StorageOptions {
    /// Sync policy.
    pub fsync: FsyncPolicy,
    /// Compact (snapshot + fresh log) once the log is larger than this.
    pub compact_log_bytes: u64,
    /// Testing: a sleep after the fsync of every [`StageLog::sync`] (group commit), to model a
    /// disk whose flush is slower than this machine's (see [`FSYNC_DELAY_ENV`]). Compaction's own
    /// syncs are not delayed. Zero in normal operation.
    pub fsync_delay: Duration,
    /// How long [`StageLog::sync`] waits for its `fdatasync` by spinning before it sleeps
    /// (`crate::spin::sync_data`). Zero (the default): a direct `fdatasync` on the calling thread.
    /// `upright replica` sets [`crate::spin::SYNC_SPIN_MAX`] unless the cluster file's
    /// `idle_spin_us` is 0.
    pub sync_spin: Duration,
}

/// Environment variable that sets [`StorageOptions::fsync_delay`] of `upright replica` (and so of
/// the demo's replicas), in microseconds: a stand-in for a slower disk in measurements.
pub const FSYNC_DELAY_ENV: &str = "UPRIGHT_TEST_FSYNC_DELAY_US";

impl StorageOptions {
    /// The fsync delay asked for by [`FSYNC_DELAY_ENV`]: zero if unset, an error if it is not a
    /// number of microseconds (at most one second).
    pub fn fsync_delay_from_env() -> Result<Duration, String> {
        let Ok(value) = std::env::var(FSYNC_DELAY_ENV) else {
            return Ok(Duration::ZERO);
        };
        match value.trim().parse::<u64>() {
            Ok(us) if us <= 1_000_000 => Ok(Duration::from_micros(us)),
            _ => Err(format!(
                "{FSYNC_DELAY_ENV}={value:?}: expected microseconds from 0 to 1000000"
            )),
        }
    }
}

impl Default for StorageOptions {
    fn default() -> Self {
        StorageOptions {
            fsync: FsyncPolicy::Always,
            compact_log_bytes: 64 << 20,
            fsync_delay: Duration::ZERO,
            sync_spin: Duration::ZERO,
        }
    }
}

/// What recovery found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Recovery {
    /// No files yet: first start.
    Fresh,
    /// Everything read back.
    Clean,
    /// The last log record was incomplete and was truncated (normal after a crash).
    TornTail {
        /// Bytes of the torn record removed (up to its last non-zero byte; the allocated zeros
        /// after it are not counted).
        truncated_bytes: u64,
    },
    /// The snapshot or the middle of the log is damaged: the files were moved aside and the stage
    /// starts from empty storage.
    Corrupted {
        /// What and where.
        reason: String,
        /// Where the damaged files were moved.
        moved_to: PathBuf,
    },
}

/// Counters of one log, for metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LogStats {
    /// Syncs performed (group commits).
    pub syncs: u64,
    /// Records written.
    pub records: u64,
    /// Total time spent in fsync.
    pub fsync_total: Duration,
    /// Longest fsync.
    pub fsync_max: Duration,
    /// Compactions done.
    pub compactions: u64,
    /// Chunks of [`LOG_PREALLOC_BYTES`] allocated ahead of the data.
    pub preallocations: u64,
}

/// The write-ahead log of one stage member.
pub struct StageLog {
    dir: PathBuf,
    options: StorageOptions,
    file: LogFile,
    /// End of the valid data in the log file (the file itself is longer: allocated space).
    log_bytes: u64,
    /// The current value of every key (needed to write snapshots).
    map: Storage,
    /// Approximate size of `map` as a snapshot ([`live_size`] summed).
    live_bytes: u64,
    /// Encoded records not yet written.
    pending: Vec<u8>,
    /// `pending` holds an eager persist: the next [`StageLog::sync`] must fsync.
    must_sync: bool,
    /// The snapshot being written in the background, if any (at most one).
    compaction: Option<Compaction>,
    stats: LogStats,
}

impl StageLog {
    /// Opens (creating if needed) the log in `dir` and recovers its contents.
    pub fn open(dir: &Path, options: StorageOptions) -> io::Result<(StageLog, Storage, Recovery)> {
        fs::create_dir_all(dir)?;
        let _ = fs::remove_file(dir.join(SNAPSHOT_TMP));
        let _ = fs::remove_file(dir.join(LOG_TMP));
        let _ = fs::remove_file(dir.join(LOG_DEAD));
        let (map, recovery, log_bytes) = match recover(dir)? {
            Ok(found) => found,
            Err(reason) => {
                let moved_to = move_aside(dir)?;
                let corrupted = Recovery::Corrupted { reason, moved_to };
                (Storage::new(), corrupted, 0)
            }
        };
        let mut file = LogFile::open(&dir.join(LOG))?;
        if matches!(recovery, Recovery::TornTail { .. }) {
            file.truncate(log_bytes)?;
        }
        file.reserve(log_bytes + 1)?;
        sync_dir(dir)?;
        let mut log = StageLog {
            dir: dir.to_path_buf(),
            options,
            file,
            log_bytes,
            live_bytes: map.iter().map(|(k, v)| live_size(k, v)).sum(),
            map: map.clone(),
            pending: Vec::new(),
            must_sync: false,
            compaction: None,
            stats: LogStats::default(),
        };
        if dir.join(LOG_PREV).exists() {
            // A compaction was interrupted: finish the job now (rare, at start only).
            log.compact()?;
        }
        Ok((log, map, recovery))
    }

    /// Buffers one persist; it becomes durable at the next [`StageLog::sync`].
    pub fn append(&mut self, key: &str, value: Option<&Bytes>) {
        self.append_lazily(key, value);
        self.must_sync = true;
    }

    /// Buffers one lazy persist ([`upright_core::stage::Action::PersistLazily`]): written in order
    /// with the others, durable with the next sync that an eager persist asks for.
    pub fn append_lazily(&mut self, key: &str, value: Option<&Bytes>) {
        assert!(!key.starts_with('\0'), "stage keys must not start with NUL");
        encode_record(key, value, &mut self.pending);
        let old = match value {
            Some(v) => {
                self.live_bytes += live_size(key, v);
                self.map.insert(key.to_string(), v.clone())
            }
            None => self.map.remove(key),
        };
        if let Some(old) = old {
            self.live_bytes -= live_size(key, &old);
        }
        self.stats.records += 1;
    }

    /// Whether there are buffered persists (eager or lazy).
    pub fn is_dirty(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Whether an eager persist is buffered: the next [`StageLog::sync`] fsyncs (per policy), and
    /// a send emitted now depends on it.
    pub fn needs_sync(&self) -> bool {
        self.must_sync
    }

    /// Writes the buffered persists and, if one of them is eager, (per policy) fsyncs once for all
    /// of them; compacts if the log grew past its bound. Only lazy ones: written, not synced (the
    /// next eager sync, or the OS, makes them durable). Returns the fsync time if one was done.
    pub fn sync(&mut self) -> io::Result<Option<Duration>> {
        if self.pending.is_empty() {
            return Ok(None);
        }
        self.write_pending()?;
        if !std::mem::take(&mut self.must_sync) {
            return Ok(None);
        }
        let took = if self.options.fsync == FsyncPolicy::Always {
            let start = Instant::now();
            self.file.sync_data(self.options.sync_spin)?;
            if !self.options.fsync_delay.is_zero() {
                std::thread::sleep(self.options.fsync_delay);
            }
            let took = start.elapsed();
            self.stats.fsync_total += took;
            self.stats.fsync_max = self.stats.fsync_max.max(took);
            Some(took)
        } else {
            None
        };
        self.stats.syncs += 1;
        self.maybe_compact()?;
        Ok(took)
    }

    /// After a sync (everything written so far is as durable as the policy makes it): collects a
    /// finished background compaction and starts one if the log passed its bound; waits for the
    /// one in flight if the log passed [`COMPACTION_BACKLOG_FACTOR`] times the bound.
    fn maybe_compact(&mut self) -> io::Result<()> {
        let bound = self.options.compact_log_bytes;
        let finished = self.compaction.as_ref().is_some_and(|c| c.is_finished());
        let backlog = self.log_bytes > bound.max(self.live_bytes).saturating_mul(COMPACTION_BACKLOG_FACTOR);
        if finished || (backlog && self.compaction.is_some()) {
            self.wait_compaction()?;
        }
        let mostly_dead = self.log_bytes > self.live_bytes.saturating_mul(LOG_TO_LIVE_FACTOR);
        if self.compaction.is_none() && self.log_bytes > bound && mostly_dead {
            self.start_compaction()?;
        }
        Ok(())
    }

    /// Rotates the log (the current one becomes `log.prev`, a fresh one takes its place) and
    /// starts writing the snapshot of the current state in the background. The caller has synced.
    fn start_compaction(&mut self) -> io::Result<()> {
        assert!(self.compaction.is_none(), "one compaction at a time");
        assert!(self.pending.is_empty(), "called after a sync");
        if self.dir.join(LOG_PREV).exists() {
            // An earlier background compaction failed and left its old log: rotating again would
            // replace it. Compact here instead, which covers and deletes it.
            return self.compact();
        }
        let fresh = LogFile::create(&self.dir.join(LOG_TMP))?;
        fs::rename(self.dir.join(LOG), self.dir.join(LOG_PREV))?;
        fs::rename(self.dir.join(LOG_TMP), self.dir.join(LOG))?;
        sync_dir(&self.dir)?;
        self.stats.preallocations += self.file.allocations();
        self.file = fresh;
        self.log_bytes = 0;
        self.compaction = Some(Compaction::start(&self.dir, self.map.clone())?);
        self.stats.compactions += 1;
        Ok(())
    }

    /// Waits for the background compaction, if one is in flight, and returns its result.
    pub fn wait_compaction(&mut self) -> io::Result<()> {
        match self.compaction.take() {
            Some(compaction) => compaction.wait(),
            None => Ok(()),
        }
    }

    /// Writes a snapshot of the current state and starts a fresh log (atomic renames, directory
    /// synced after each), on the calling thread, after any background compaction finished.
    /// Pending records are written first; a leftover `log.prev` is deleted once the snapshot (which
    /// covers it) is in place.
    pub fn compact(&mut self) -> io::Result<()> {
        self.wait_compaction()?;
        self.write_pending()?;
        self.must_sync = false; // the snapshot below is synced and holds everything
        self.write_snapshot_tmp()?;
        fs::rename(self.dir.join(SNAPSHOT_TMP), self.dir.join(SNAPSHOT))?;
        sync_dir(&self.dir)?;
        let fresh = LogFile::create(&self.dir.join(LOG_TMP))?;
        fs::rename(self.dir.join(LOG_TMP), self.dir.join(LOG))?;
        sync_dir(&self.dir)?;
        if self.dir.join(LOG_PREV).exists() {
            fs::remove_file(self.dir.join(LOG_PREV))?;
            sync_dir(&self.dir)?;
        }
        self.stats.preallocations += self.file.allocations();
        self.file = fresh;
        self.log_bytes = 0;
        self.stats.compactions += 1;
        Ok(())
    }

    /// Writes the buffered records at the end of the valid data (not synced).
    fn write_pending(&mut self) -> io::Result<()> {
        if !self.pending.is_empty() {
            self.file.write_at(&self.pending, self.log_bytes)?;
            self.log_bytes += self.pending.len() as u64;
            self.pending.clear();
        }
        Ok(())
    }

    /// First step of compaction: the complete snapshot under its temporary name, synced.
    fn write_snapshot_tmp(&self) -> io::Result<()> {
        compaction::write_snapshot_tmp(&self.dir, &self.map)
    }

    /// Approximate size of the live state as a snapshot.
    pub fn live_bytes(&self) -> u64 {
        self.live_bytes
    }

    /// Whether a background compaction is in flight.
    pub fn compacting(&self) -> bool {
        self.compaction.is_some()
    }

    /// The current contents (what a restart would recover once synced).
    pub fn contents(&self) -> &Storage {
        &self.map
    }

    /// Counters.
    pub fn stats(&self) -> LogStats {
        LogStats {
            preallocations: self.stats.preallocations + self.file.allocations(),
            ..self.stats
        }
    }

    /// Size of the valid data in the log (written bytes; not the allocated size of the file).
    pub fn log_bytes(&self) -> u64 {
        self.log_bytes
    }

    /// Length of the log file: the data plus the space allocated ahead of it.
    pub fn allocated_bytes(&self) -> u64 {
        self.file.allocated()
    }
}

impl Drop for StageLog {
    fn drop(&mut self) {
        // Let a background snapshot finish (an error leaves `log.prev`, which the next open handles).
        let _ = self.wait_compaction();
    }
}

/// Approximate bytes a key and its value take in a snapshot (record header and encoding included).
fn live_size(key: &str, value: &Bytes) -> u64 {
    (key.len() + value.len() + 16) as u64
}

/// The value of a snapshot's end marker: the number of entries before it.
fn end_marker_value(entries: usize) -> Bytes {
    Bytes::copy_from_slice(&(entries as u64).to_le_bytes())
}

/// Appends the snapshot's end marker, which states the number of entries before it.
fn end_marker(entries: usize, out: &mut Vec<u8>) {
    encode_record(END_MARKER, Some(&end_marker_value(entries)), out);
}

/// Reads snapshot and log: the state, what was found and the length of the log's valid data (the
/// caller truncates a torn tail to it). `Ok(Err(reason))` = the files are damaged.
fn recover(dir: &Path) -> io::Result<Result<(Storage, Recovery, u64), String>> {
    let snapshot = read_if_exists(&dir.join(SNAPSHOT))?;
    let log = read_if_exists(&dir.join(LOG))?;
    let mut map = match snapshot.as_deref().map(read_snapshot).transpose() {
        Ok(map) => map.unwrap_or_default(),
        Err(reason) => return Ok(Err(reason)),
    };
    // An interrupted compaction's old log: complete (it was synced before the rotation, and no
    // record was written to it after), so anything but a clean end is damage.
    let prev = read_if_exists(&dir.join(LOG_PREV))?;
    if let Some(prev) = &prev {
        let (records, tail) = parse_records(prev);
        if !matches!(tail, Tail::Clean | Tail::Zeros { .. }) {
            return Ok(Err(format!("log.prev is damaged ({tail:?})")));
        }
        apply(&mut map, records);
    }
    let bytes = log.unwrap_or_default();
    let (records, tail) = parse_records(&bytes);
    let (valid_bytes, torn) = match tail {
        Tail::Clean => (bytes.len() as u64, false),
        Tail::Zeros { valid_bytes } => (valid_bytes, false),
        Tail::Torn { valid_bytes } => (valid_bytes, true),
        Tail::Corrupt { offset, why } => return Ok(Err(format!("log record at byte {offset}: {why}"))),
    };
    let recovery = if torn {
        let data_end = bytes.iter().rposition(|&b| b != 0).map_or(0, |i| i as u64 + 1);
        Recovery::TornTail {
            truncated_bytes: data_end.saturating_sub(valid_bytes),
        }
    } else if snapshot.is_none() && prev.is_none() && valid_bytes == 0 {
        Recovery::Fresh
    } else {
        Recovery::Clean
    };
    apply(&mut map, records);
    Ok(Ok((map, recovery, valid_bytes)))
}

/// Replays `records` over `map`.
fn apply(map: &mut Storage, records: Vec<Record>) {
    for record in records {
        match record.value {
            Some(value) => map.insert(record.key, value),
            None => map.remove(&record.key),
        };
    }
}

/// Reads a snapshot: every record, then the end marker with their count. `Err(reason)` = damaged.
fn read_snapshot(bytes: &[u8]) -> Result<Storage, String> {
    let (records, tail) = parse_records(bytes);
    if tail != Tail::Clean {
        return Err(format!("snapshot is damaged ({tail:?})"));
    }
    let Some((end, entries)) = records.split_last() else {
        return Err("snapshot is empty".into());
    };
    if end.key != END_MARKER || end.value.as_ref() != Some(&end_marker_value(entries.len())) {
        return Err("snapshot has no valid end marker".into());
    }
    let mut map = Storage::new();
    for record in entries {
        if let Some(value) = &record.value {
            map.insert(record.key.clone(), value.clone());
        }
    }
    Ok(map)
}

fn read_if_exists(path: &Path) -> io::Result<Option<Vec<u8>>> {
    match fs::read(path) {
        Ok(bytes) => Ok(Some(bytes)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Moves damaged files into `corrupt-<n>/` inside `dir` (kept for inspection, never read again).
fn move_aside(dir: &Path) -> io::Result<PathBuf> {
    let mut n = 0;
    let target = loop {
        let candidate = dir.join(format!("corrupt-{n}"));
        if !candidate.exists() {
            break candidate;
        }
        n += 1;
    };
    fs::create_dir(&target)?;
    for name in [SNAPSHOT, LOG_PREV, LOG] {
        if dir.join(name).exists() {
            fs::rename(dir.join(name), target.join(name))?;
        }
    }
    sync_dir(dir)?;
    Ok(target)
}

/// Makes renames and creations in `dir` durable.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests;

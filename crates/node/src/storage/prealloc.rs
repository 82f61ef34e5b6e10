//! The log file, preallocated: space is allocated ahead of the data in chunks of
//! [`LOG_PREALLOC_BYTES`] and records are written at explicit positions into it.
//!
//! An append to a file that grows makes every `fdatasync` also commit the new file size through the
//! file system's journal; writing inside space that is already allocated (and part of the file's
//! size) avoids that, which makes each group commit cheaper. Only the sync after a new chunk is
//! allocated pays for the metadata. The allocated-but-unused space reads as zeros, which
//! [`parse_records`](super::parse_records) reports as [`Tail::Zeros`](super::Tail::Zeros).
//!
//! The space is allocated by writing zeros into it, not with `fallocate`, and not with
//! `File::set_len`. `set_len` makes a sparse file whose blocks are only allocated when written.
//! `fallocate` allocates the blocks but marks them unwritten (ext4, XFS), so the first write into
//! each block converts its extent at the next `fdatasync`, again through the journal: with the
//! ~1 KiB a 16-command batch adds to the order log, about every fourth sync paid for it. On the
//! development VM (one virtual disk, three processes syncing 1,100-byte records at once, p50 per
//! sync) that was 168-231 us into `fallocate`d space against 152-169 us into zeros, and in
//! `upright demo` under `redis-benchmark -t set -c 16` 262-313 against 215-227 us of sync per
//! batch at each backup (docs/PERFORMANCE.md). Zeros cost one write of the chunk and a sync when
//! it is allocated: about 2 ms per MiB there, once per ~1,000 batches.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// Allocation chunk of a log file: the file is extended by whole chunks of zeros ahead of its data.
/// Small enough that allocating one (writing and syncing it) is a short pause (~2 ms on the
/// development VM) and the many short-lived clusters of the tests write little; large enough
/// that it is rare (about once per thousand 1 KiB writes).
pub const LOG_PREALLOC_BYTES: u64 = 1 << 20;

/// Zeros written per system call while allocating.
const ZERO_WRITE_BYTES: usize = 64 << 10;

/// An open log file with the length of its allocated space.
pub(super) struct LogFile {
    /// Shared with the sync thread while a spinning sync runs (`crate::spin::sync_data`).
    file: Arc<File>,
    /// The file's length: data plus allocated space ahead of it (zeros).
    allocated: u64,
    /// Chunks allocated.
    allocations: u64,
}

impl LogFile {
    /// Opens (creating if needed) an existing log file for writing at explicit positions.
    pub(super) fn open(path: &Path) -> io::Result<LogFile> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)?;
        let allocated = file.metadata()?.len();
        Ok(LogFile {
            file: Arc::new(file),
            allocated,
            allocations: 0,
        })
    }

    /// Creates an empty log file at `path` (replacing any) with its first chunk allocated and
    /// synced, ready to be renamed into place.
    pub(super) fn create(path: &Path) -> io::Result<LogFile> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)?;
        let mut log = LogFile {
            file: Arc::new(file),
            allocated: 0,
            allocations: 0,
        };
        log.reserve(1)?;
        log.file.sync_all()?;
        Ok(log)
    }

    /// Makes sure the bytes before `end` are allocated: if not, writes zeros up to the next chunk
    /// boundary at or after `end` and syncs them with the new size (the one sync that pays the
    /// metadata).
    pub(super) fn reserve(&mut self, end: u64) -> io::Result<()> {
        if end <= self.allocated {
            return Ok(());
        }
        let target = end.div_ceil(LOG_PREALLOC_BYTES) * LOG_PREALLOC_BYTES;
        write_zeros(&self.file, self.allocated, target)?;
        self.file.sync_all()?;
        self.allocated = target;
        self.allocations += 1;
        Ok(())
    }

    /// Writes `bytes` at `offset`, allocating first if they would pass the allocated end.
    pub(super) fn write_at(&mut self, bytes: &[u8], offset: u64) -> io::Result<()> {
        let end = offset + bytes.len() as u64;
        self.reserve(end)?;
        self.file.write_all_at(bytes, offset)?;
        self.allocated = self.allocated.max(end);
        Ok(())
    }

    /// `fdatasync`, waited for by spinning up to `spin` (`crate::spin::sync_data`; zero: a
    /// direct `fdatasync`).
    pub(super) fn sync_data(&self, spin: Duration) -> io::Result<()> {
        crate::spin::sync_data(&self.file, spin)
    }

    /// Cuts the file to `len` (removing a torn record and the space after it) and allocates again
    /// from there, so everything after the valid data reads as zeros. Synced.
    pub(super) fn truncate(&mut self, len: u64) -> io::Result<()> {
        self.file.set_len(len)?;
        self.allocated = len;
        self.file.sync_all()?;
        self.reserve(len + 1)
    }

    /// The file's length (data plus allocated space).
    pub(super) fn allocated(&self) -> u64 {
        self.allocated
    }

    /// Chunks allocated by this handle.
    pub(super) fn allocations(&self) -> u64 {
        self.allocations
    }
}

/// Writes zeros into `from..to`.
fn write_zeros(file: &File, from: u64, to: u64) -> io::Result<()> {
    static ZEROS: [u8; ZERO_WRITE_BYTES] = [0; ZERO_WRITE_BYTES];
    let mut at = from;
    while at < to {
        let n = (to - at).min(ZERO_WRITE_BYTES as u64) as usize;
        file.write_all_at(&ZEROS[..n], at)?;
        at += n as u64;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Offset of the first hole at or after 0 (`SEEK_HOLE`): the end of the file when every block
    /// is written. ext4 and XFS report `fallocate`d (unwritten) blocks as a hole.
    fn first_hole(file: &File) -> u64 {
        use std::os::fd::AsRawFd;
        // SAFETY: plain system call on a file descriptor owned by `file`; no memory is passed.
        let at = unsafe { libc::lseek(file.as_raw_fd(), 0, libc::SEEK_HOLE) };
        assert!(at >= 0, "lseek(SEEK_HOLE): {}", io::Error::last_os_error());
        at as u64
    }

    #[test]
    fn reserve_writes_whole_chunks_of_zeros_and_truncate_allocates_again() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log");
        let mut log = LogFile::create(&path).unwrap();
        assert_eq!(log.allocated(), LOG_PREALLOC_BYTES);
        assert_eq!(
            first_hole(&log.file),
            LOG_PREALLOC_BYTES,
            "the chunk is written, not a hole"
        );
        log.write_at(b"data", 0).unwrap();
        log.reserve(LOG_PREALLOC_BYTES + 1).unwrap();
        assert_eq!(log.allocated(), 2 * LOG_PREALLOC_BYTES);
        assert_eq!(log.allocations(), 2);
        assert_eq!(first_hole(&log.file), 2 * LOG_PREALLOC_BYTES);
        log.write_at(b"torn", 4).unwrap();
        log.truncate(4).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(bytes.len() as u64, LOG_PREALLOC_BYTES);
        assert_eq!(&bytes[..4], b"data");
        assert!(bytes[4..].iter().all(|&b| b == 0));
        assert_eq!(first_hole(&log.file), LOG_PREALLOC_BYTES);
    }

    #[test]
    fn a_write_past_the_allocated_end_allocates_first() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log");
        let mut log = LogFile::create(&path).unwrap();
        let at = LOG_PREALLOC_BYTES - 2;
        log.write_at(b"abcd", at).unwrap();
        assert_eq!(log.allocated(), 2 * LOG_PREALLOC_BYTES);
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(bytes.len() as u64, 2 * LOG_PREALLOC_BYTES);
        assert_eq!(&bytes[at as usize..at as usize + 4], b"abcd");
        assert!(bytes[at as usize + 4..].iter().all(|&b| b == 0));
    }

    /// How the space a record goes into was made, for the measurements below.
    #[derive(Clone, Copy, Debug)]
    enum Space {
        /// None: each write extends the file.
        Appending,
        /// `fallocate`: allocated, unwritten blocks.
        Fallocated,
        /// This module's zeros.
        Zeros,
    }

    /// `n` writes of `record` bytes, each followed by `fdatasync`; the sorted durations.
    fn timed_syncs(path: &Path, space: Space, record: usize, n: u64) -> Vec<Duration> {
        let mut log = matches!(space, Space::Zeros).then(|| LogFile::create(path).unwrap());
        let file = match &log {
            Some(log) => log.file.clone(),
            None => {
                let f = File::options()
                    .read(true)
                    .write(true)
                    .create(true)
                    .truncate(true)
                    .open(path)
                    .unwrap();
                if let Space::Fallocated = space {
                    use std::os::fd::AsRawFd;
                    let len = (n * record as u64 + 1).div_ceil(LOG_PREALLOC_BYTES) * LOG_PREALLOC_BYTES;
                    // SAFETY: plain system call on a file descriptor we own; no memory is passed.
                    let rc = unsafe { libc::fallocate(f.as_raw_fd(), 0, 0, len as libc::off_t) };
                    assert_eq!(rc, 0, "fallocate: {}", io::Error::last_os_error());
                }
                f.sync_all().unwrap();
                Arc::new(f)
            }
        };
        let bytes = vec![0x42u8; record];
        let mut took = Vec::new();
        for i in 0..n {
            let t = std::time::Instant::now();
            let at = i * record as u64;
            match &mut log {
                Some(log) => log.write_at(&bytes, at).unwrap(),
                None => file.write_all_at(&bytes, at).unwrap(),
            }
            file.sync_data().unwrap();
            took.push(t.elapsed());
        }
        took.sort();
        took
    }

    /// Measurement, not a check: one log, 1,100-byte records (a 16-command batch in the order
    /// log). `cargo test -p upright-node --release --lib storage::prealloc::tests::fsync_timing --
    /// --ignored --nocapture`.
    #[test]
    #[ignore]
    fn fsync_timing_one_log() {
        let dir = tempfile::tempdir().unwrap();
        for round in 0..2 {
            for space in [Space::Appending, Space::Fallocated, Space::Zeros] {
                let took = timed_syncs(&dir.path().join(format!("log-{round}-{space:?}")), space, 1100, 2000);
                let pct = |p: usize| took[took.len() * p / 100].as_micros();
                println!(
                    "{space:?}: 2000 x (1100 B write + fdatasync): p50 {} us, p90 {} us",
                    pct(50),
                    pct(90)
                );
            }
        }
    }

    /// Measurement, not a check: three logs synced at once (the three backups of a local
    /// cluster), p50 of each. `cargo test -p upright-node --release --lib
    /// storage::prealloc::tests::fsync_timing -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn fsync_timing_three_logs_at_once() {
        let dir = tempfile::tempdir().unwrap();
        for round in 0..2 {
            for space in [Space::Appending, Space::Fallocated, Space::Zeros] {
                let threads: Vec<_> = (0..3)
                    .map(|t| {
                        let path = dir.path().join(format!("log-{round}-{space:?}-{t}"));
                        std::thread::spawn(move || timed_syncs(&path, space, 1100, 1500))
                    })
                    .collect();
                let p50: Vec<u128> = threads
                    .into_iter()
                    .map(|t| {
                        let took = t.join().unwrap();
                        took[took.len() / 2].as_micros()
                    })
                    .collect();
                println!("{space:?}: three logs x 1500 syncs at once, p50 per log {p50:?} us");
            }
        }
    }
}

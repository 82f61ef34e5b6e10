//! The log file, preallocated: space is allocated ahead of the data in chunks of
//! [`LOG_PREALLOC_BYTES`] and records are written at explicit positions into it.
//!
//! An append to a file that grows makes every `fdatasync` also commit the new file size through the
//! file system's journal; writing inside space that is already allocated (and part of the file's
//! size) avoids that, which makes each group commit cheaper. Only the sync after a new chunk is
//! allocated pays for the metadata. The allocated-but-unwritten space reads as zeros, which
//! [`parse_records`](super::parse_records) reports as [`Tail::Zeros`](super::Tail::Zeros).
//!
//! `fallocate` is used, not `File::set_len`: `set_len` makes a sparse file whose blocks are only
//! allocated when written, which brings the metadata update back. If the file system refuses
//! (`EOPNOTSUPP`), the log warns once and falls back to plain appends (writes past the end).

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Allocation chunk of a log file: the file is extended by whole chunks ahead of its data. Small
/// enough that the many short-lived clusters of the tests allocate little (allocation writes no
/// data), large enough that the allocating sync is rare (about one per ten thousand small writes).
pub const LOG_PREALLOC_BYTES: u64 = 4 << 20;

/// Whether the "cannot preallocate" warning was already logged (once per process).
static WARNED: AtomicBool = AtomicBool::new(false);

/// An open log file with the length of its allocated space.
pub(super) struct LogFile {
    /// Shared with the sync thread while a spinning sync runs (`crate::spin::sync_data`).
    file: Arc<File>,
    /// The file's length: data plus allocated space ahead of it (zeros).
    allocated: u64,
    /// False once the file system refused to preallocate: the file grows by each write.
    preallocate: bool,
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
            preallocate: true,
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
            preallocate: true,
            allocations: 0,
        };
        log.reserve(1)?;
        log.file.sync_all()?;
        Ok(log)
    }

    /// Makes sure the bytes before `end` are allocated: if not, allocates up to the next chunk
    /// boundary at or after `end` and syncs the new size (the one sync that pays the metadata).
    pub(super) fn reserve(&mut self, end: u64) -> io::Result<()> {
        if !self.preallocate || end <= self.allocated {
            return Ok(());
        }
        let target = end.div_ceil(LOG_PREALLOC_BYTES) * LOG_PREALLOC_BYTES;
        match allocate(&self.file, self.allocated, target - self.allocated) {
            Ok(()) => {
                self.file.sync_all()?;
                self.allocated = target;
                self.allocations += 1;
            }
            Err(e) if is_unsupported(&e) => {
                if !WARNED.swap(true, Ordering::Relaxed) {
                    tracing::warn!(error = %e, "the file system cannot preallocate log files; logs grow by appends");
                }
                self.preallocate = false;
            }
            Err(e) => return Err(e),
        }
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

/// Allocates `len` bytes at `offset` (mode 0: the file's size grows to cover them).
#[cfg(target_os = "linux")]
fn allocate(file: &File, offset: u64, len: u64) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let (Ok(offset), Ok(len)) = (libc::off_t::try_from(offset), libc::off_t::try_from(len)) else {
        return Err(io::Error::from_raw_os_error(libc::EFBIG));
    };
    loop {
        // SAFETY: plain system call on a file descriptor we own; no memory is passed.
        let rc = unsafe { libc::fallocate(file.as_raw_fd(), 0, offset, len) };
        if rc == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Other systems: no preallocation (plain appends).
#[cfg(not(target_os = "linux"))]
fn allocate(_file: &File, _offset: u64, _len: u64) -> io::Result<()> {
    Err(io::Error::from_raw_os_error(libc::EOPNOTSUPP))
}

/// Whether an allocation error means the file system (or system) does not support it.
fn is_unsupported(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(code) if code == libc::EOPNOTSUPP || code == libc::ENOSYS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_preallocation_the_file_grows_by_each_write() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log");
        let mut log = LogFile::open(&path).unwrap();
        log.preallocate = false; // as after the file system refused
        log.reserve(1).unwrap();
        assert_eq!(log.allocated(), 0);
        log.write_at(b"abc", 0).unwrap();
        log.write_at(b"defg", 3).unwrap();
        assert_eq!(log.allocated(), 7);
        assert_eq!(std::fs::read(&path).unwrap(), b"abcdefg");
        assert_eq!(log.allocations(), 0);
    }

    #[test]
    fn reserve_allocates_whole_chunks_of_zeros_and_truncate_allocates_again() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log");
        let mut log = LogFile::create(&path).unwrap();
        assert_eq!(log.allocated(), LOG_PREALLOC_BYTES);
        log.write_at(b"data", 0).unwrap();
        log.reserve(LOG_PREALLOC_BYTES + 1).unwrap();
        assert_eq!(log.allocated(), 2 * LOG_PREALLOC_BYTES);
        assert_eq!(log.allocations(), 2);
        log.write_at(b"torn", 4).unwrap();
        log.truncate(4).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(bytes.len() as u64, LOG_PREALLOC_BYTES);
        assert_eq!(&bytes[..4], b"data");
        assert!(bytes[4..].iter().all(|&b| b == 0));
    }

    /// Measurement, not a check: `cargo test -p upright-node --release --lib
    /// storage::prealloc::tests::fsync_timing -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn fsync_timing_appending_vs_preallocated() {
        let dir = tempfile::tempdir().unwrap();
        let record = [0x42u8; 300];
        for round in 0..2 {
            for preallocate in [false, true] {
                let path = dir.path().join(format!("log-{round}-{preallocate}"));
                let mut log = LogFile::open(&path).unwrap();
                log.preallocate = preallocate;
                log.reserve(1).unwrap();
                let mut took = Vec::new();
                let start = std::time::Instant::now();
                for i in 0..2000u64 {
                    let t = std::time::Instant::now();
                    log.write_at(&record, i * record.len() as u64).unwrap();
                    log.sync_data(Duration::ZERO).unwrap();
                    took.push(t.elapsed());
                }
                let total = start.elapsed();
                took.sort();
                let pct = |p: usize| took[took.len() * p / 100].as_micros();
                println!(
                    "preallocate={preallocate}: 2000 x (300 B write + fdatasync) in {:?}: p50 {} us, p90 {} us, p99 {} us",
                    total,
                    pct(50),
                    pct(90),
                    pct(99)
                );
            }
        }
    }

    /// Measurement, not a check: 8 logs synced concurrently (like the stage logs of a local
    /// cluster). `cargo test -p upright-node --release --lib storage::prealloc::tests::fsync_timing
    /// -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn fsync_timing_concurrent_logs() {
        let dir = tempfile::tempdir().unwrap();
        for round in 0..2 {
            for preallocate in [false, true] {
                let start = std::time::Instant::now();
                let threads: Vec<_> = (0..8)
                    .map(|t| {
                        let path = dir.path().join(format!("log-{round}-{preallocate}-{t}"));
                        std::thread::spawn(move || {
                            let mut log = LogFile::open(&path).unwrap();
                            log.preallocate = preallocate;
                            log.reserve(1).unwrap();
                            for i in 0..600u64 {
                                log.write_at(&[0x42u8; 300], i * 300).unwrap();
                                log.sync_data(Duration::ZERO).unwrap();
                            }
                        })
                    })
                    .collect();
                threads.into_iter().for_each(|t| t.join().unwrap());
                println!(
                    "preallocate={preallocate}: 8 logs x 600 syncs concurrently in {:?}",
                    start.elapsed()
                );
            }
        }
    }
}

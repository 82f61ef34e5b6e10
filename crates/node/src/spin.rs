//! Waiting without putting the CPU to sleep at once.
//!
//! A replica's work comes in short bursts a few tens of microseconds apart: a PRE-PREPARE, then
//! the PREPAREs, the log sync, the COMMITs. Between them its thread used to sleep in `epoll_wait`
//! or in `fdatasync`, and a CPU with nothing else to run went idle. Waking a sleeping thread on an
//! idle CPU is the most expensive thing a message does on a virtual machine (an inter-processor
//! interrupt, an exit to the hypervisor, the vCPU scheduled again): on this project's 2-vCPU test
//! machine a loopback round trip costs 17 us between two processes on one CPU and 77 us across
//! the two (docs/PERFORMANCE.md). So a replica that runs out of input first *spins* for a short
//! while ([`IDLE_SPIN_DEFAULT_US`], the cluster file's `idle_spin_us`) and waits for a log sync the
//! same way ([`sync_data`]):
//!
//! - every turn of the spin calls `sched_yield`, so any other runnable thread on the CPU (another
//!   replica, a client) runs first: the spin mostly uses time the CPU would otherwise spend idle,
//!   though not only (on a CPU-bound machine it still costs some throughput, see below);
//! - it is bounded: after the window the thread sleeps as before, so an idle cluster costs
//!   nothing.
//!
//! The syncs of every log in the process go through one sync thread, one after another, as the
//! host issues them anyway.
//!
//! Measured with `redis-benchmark -t set -c 16` against `upright demo`, alternated rounds:
//! docs/PERFORMANCE.md, "Session 15: idle spinning" (SET +15-18%; at saturation ~5% less
//! throughput and more CPU per operation). `idle_spin_us = 0` restores sleeping at once.

use std::fs::File;
use std::io;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::Thread;
use std::time::{Duration, Instant};

/// Default of the cluster file's `idle_spin_us`: how long a replica's event loop spins (yielding
/// the CPU to any other runnable thread) after it runs out of input, before it sleeps. 50, 100
/// and 300 us were measured (with syncs spinning too); 100 was best (docs/PERFORMANCE.md).
pub const IDLE_SPIN_DEFAULT_US: u64 = 100;

/// Most that [`sync_data`] spins before it sleeps until the sync ends. A log sync takes 0.1-0.3 ms
/// on the test machine's virtual disk; a much slower one is not worth spinning for.
pub const SYNC_SPIN_MAX: Duration = Duration::from_millis(2);

/// One turn of a spin: lets any other runnable thread on this CPU run first (`sched_yield`).
pub fn yield_cpu() {
    std::thread::yield_now();
}

/// A sync handed to the sync thread.
struct Job {
    file: Arc<File>,
    done: Arc<Done>,
}

/// Completion of one [`Job`].
struct Done {
    /// [`PENDING`], [`SYNCED`] or [`FAILED`].
    state: AtomicU8,
    /// The error of a failed sync.
    error: Mutex<Option<io::Error>>,
    /// The thread waiting for it (woken if it stopped spinning).
    waiter: Thread,
}

const PENDING: u8 = 0;
const SYNCED: u8 = 1;
const FAILED: u8 = 2;

/// The process's sync thread: runs each job's `fdatasync` in turn.
fn sync_thread() -> Option<&'static Sender<Job>> {
    static SENDER: OnceLock<Option<Sender<Job>>> = OnceLock::new();
    SENDER
        .get_or_init(|| {
            let (tx, rx) = channel::<Job>();
            std::thread::Builder::new()
                .name("upright-sync".into())
                .spawn(move || {
                    while let Ok(job) = rx.recv() {
                        let result = job.file.sync_data();
                        let state = match result {
                            Ok(()) => SYNCED,
                            Err(e) => {
                                *job.done.error.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
                                FAILED
                            }
                        };
                        job.done.state.store(state, Ordering::Release);
                        job.done.waiter.unpark();
                    }
                })
                .ok()
                .map(|_| tx)
        })
        .as_ref()
}

/// `fdatasync` of `file`, waited for by spinning (see the module documentation) for up to `spin`
/// and then sleeping. The sync itself runs on the process's sync thread, so this thread stays on
/// its CPU while the disk works; it returns when the sync has ended, with its outcome, exactly like
/// a direct `fdatasync`. `spin` zero (or a sync thread that cannot be started): a direct
/// `fdatasync` on this thread.
pub fn sync_data(file: &Arc<File>, spin: Duration) -> io::Result<()> {
    let Some(sender) = (!spin.is_zero()).then(sync_thread).flatten() else {
        return file.sync_data();
    };
    let done = Arc::new(Done {
        state: AtomicU8::new(PENDING),
        error: Mutex::new(None),
        waiter: std::thread::current(),
    });
    let job = Job {
        file: file.clone(),
        done: done.clone(),
    };
    if sender.send(job).is_err() {
        return file.sync_data();
    }
    let start = Instant::now();
    loop {
        match done.state.load(Ordering::Acquire) {
            SYNCED => return Ok(()),
            FAILED => {
                let error = done.error.lock().unwrap_or_else(|p| p.into_inner()).take();
                return Err(error.unwrap_or_else(|| io::Error::other("fdatasync failed")));
            }
            _ if start.elapsed() < spin => yield_cpu(),
            // An unpark that came first makes this return at once; a spurious wake-up loops.
            _ => std::thread::park(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn a_spinning_sync_makes_the_data_durable_like_a_direct_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let mut f = File::create(&path).unwrap();
        f.write_all(b"hello").unwrap();
        let f = Arc::new(f);
        sync_data(&f, SYNC_SPIN_MAX).unwrap();
        sync_data(&f, Duration::ZERO).unwrap();
        // Spinning shorter than the sync: the waiter sleeps and is woken by the sync thread.
        for _ in 0..20 {
            sync_data(&f, Duration::from_nanos(1)).unwrap();
        }
        assert_eq!(std::fs::read(&path).unwrap(), b"hello");
    }

    #[test]
    fn a_failed_sync_returns_its_error() {
        // fdatasync of a pipe fails with EINVAL, directly and on the sync thread alike.
        let (reader, _writer) = std::io::pipe().unwrap();
        let pipe = Arc::new(File::from(std::os::fd::OwnedFd::from(reader)));
        let direct = sync_data(&pipe, Duration::ZERO).unwrap_err();
        let spun = sync_data(&pipe, SYNC_SPIN_MAX).unwrap_err();
        assert_eq!(direct.kind(), spun.kind());
        assert_eq!(direct.raw_os_error(), spun.raw_os_error());
    }
}

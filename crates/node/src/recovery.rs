//! Proactive recovery in the runtime (docs/OPERATING.md "Proactive recovery"; PBFT thesis 4.3):
//! when a replica recovers (told by `upright recover`, or on its schedule) it writes a marker
//! file into its data directory, syncs it, and replaces its own process image with a fresh one
//! of the binary on disk (`exec`), so nothing of its memory survives. The new process finds the
//! marker and starts its stages with `Input::Recover`: a new key epoch, the recovery point
//! estimated from its peers, its state checked against a certified checkpoint. Once the host
//! says every member has finished ([`upright_core::host::Host::recovery_complete`]), the marker
//! is removed and the time the whole recovery took is logged and reported.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

/// The marker's file name in a replica's data directory.
pub const MARKER_FILE: &str = "recovering";

/// Most bytes of a marker file.
const MARKER_BYTES_MAX: u64 = 4096;

/// A recovery in progress, as its marker file records it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Marker {
    /// When it was asked for (Unix milliseconds): also its id in the status.
    pub started_unix_ms: u64,
    /// Why: `command` (`upright recover`) or `schedule`.
    pub reason: String,
}

/// Milliseconds since the Unix epoch.
pub fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn marker_path(dir: &Path) -> PathBuf {
    dir.join(MARKER_FILE)
}

/// The marker in replica data directory `dir`, if a recovery is in progress. A marker that
/// cannot be read or parsed still means a recovery (it is only ever written for one); its start
/// is then unknown (0).
pub fn read_marker(dir: &Path) -> Option<Marker> {
    let path = marker_path(dir);
    let meta = std::fs::metadata(&path).ok()?;
    let text = if meta.len() <= MARKER_BYTES_MAX {
        std::fs::read_to_string(&path).unwrap_or_default()
    } else {
        String::new()
    };
    let mut fields = text.split_whitespace();
    let started_unix_ms = fields.next().and_then(|s| s.parse().ok()).unwrap_or(0);
    let reason = fields.next().unwrap_or("unknown").to_string();
    Some(Marker {
        started_unix_ms,
        reason,
    })
}

/// Writes the marker (into a temporary file, synced, renamed, directory synced): after this
/// returns, a crash or the `exec` still finds it.
pub fn write_marker(dir: &Path, reason: &str) -> std::io::Result<Marker> {
    let marker = Marker {
        started_unix_ms: unix_ms(),
        reason: reason.to_string(),
    };
    let tmp = dir.join(format!("{MARKER_FILE}.tmp"));
    let mut file = std::fs::File::create(&tmp)?;
    writeln!(file, "{} {}", marker.started_unix_ms, marker.reason)?;
    file.sync_all()?;
    std::fs::rename(&tmp, marker_path(dir))?;
    std::fs::File::open(dir)?.sync_all()?;
    Ok(marker)
}

/// Removes the marker (the recovery completed), durably.
pub fn remove_marker(dir: &Path) -> std::io::Result<()> {
    match std::fs::remove_file(marker_path(dir)) {
        Ok(()) => std::fs::File::open(dir)?.sync_all(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// When replica `id` of `n` next recovers on the schedule with watchdog period `period_ms`
/// (`T_w`), in Unix milliseconds: the first `k * T_w + id * T_w / n` after `now_ms`. Each replica
/// has its own slot of `T_w / n` in every period, so as long as a recovery takes less than a
/// slot no two replicas recover at once (PBFT's staggering); a recovery that takes longer is
/// logged as a warning.
pub fn next_scheduled(now_ms: u64, period_ms: u64, id: u32, n: u32) -> u64 {
    let period = period_ms.max(1);
    let offset = period / u64::from(n.max(1)) * u64::from(id);
    let base = now_ms - now_ms % period;
    let candidate = base + offset;
    if candidate > now_ms {
        candidate
    } else {
        candidate + period
    }
}

/// Replaces this process with a fresh run of the binary on disk, with the same arguments (the
/// restart of a proactive recovery). Returns only if that fails.
pub fn exec_fresh() -> std::io::Error {
    use std::os::unix::process::CommandExt as _;
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(e) => return e,
    };
    std::process::Command::new(exe).args(std::env::args_os().skip(1)).exec()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_marker_survives_until_removed_and_reads_back() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read_marker(dir.path()), None);
        let written = write_marker(dir.path(), "command").unwrap();
        assert_eq!(read_marker(dir.path()), Some(written.clone()));
        assert!(written.started_unix_ms > 0);
        assert!(!dir.path().join("recovering.tmp").exists());
        remove_marker(dir.path()).unwrap();
        assert_eq!(read_marker(dir.path()), None);
        remove_marker(dir.path()).unwrap();
        // A damaged marker still means a recovery is in progress.
        std::fs::write(dir.path().join(MARKER_FILE), b"garbage").unwrap();
        let marker = read_marker(dir.path()).unwrap();
        assert_eq!(marker.started_unix_ms, 0);
    }

    #[test]
    fn the_schedule_gives_each_replica_its_own_slot_of_the_period() {
        // T_w = 400 s, 4 replicas: slots at 0, 100, 200, 300 s of each period.
        let t_w = 400_000;
        let now = 1_000_000_050;
        let next: Vec<u64> = (0..4).map(|id| next_scheduled(now, t_w, id, 4)).collect();
        let base = now - now % t_w;
        assert_eq!(next[0], base + t_w);
        assert_eq!(next[1], base + 100_000 + if base + 100_000 > now { 0 } else { t_w });
        for (id, at) in next.iter().enumerate() {
            assert!(*at > now && *at <= now + t_w, "replica {id}: {at}");
            assert_eq!((at % t_w) / 100_000, id as u64, "replica {id} is in its own slot");
        }
        // Exactly at its slot: the next one is a period later.
        let at = next_scheduled(now, t_w, 2, 4);
        assert_eq!(next_scheduled(at, t_w, 2, 4), at + t_w);
    }
}

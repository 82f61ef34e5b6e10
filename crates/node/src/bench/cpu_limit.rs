//! `upright bench --cpu-per-process F`: each benchmark process (every replica, and the NO-REP
//! server) in a cgroup of its own whose CPU quota is `F` of one core, so that processes sharing
//! this host's cores behave like machines of their own with a fixed CPU each (the setting of
//! the papers' clusters: ODRC's and UpRight's replicas each had a machine). Needs root and the
//! cgroup `cpu` controller (v1 `/sys/fs/cgroup/cpu`, or v2 with `cpu` enabled for children of
//! the root); a clear error otherwise.

use std::path::{Path, PathBuf};

use crate::files::FileError;

/// CFS period the quota is a share of.
const PERIOD_US: u64 = 100_000;

/// The cgroup layout of this host.
enum Layout {
    /// cgroup v1: the `cpu` hierarchy's root.
    V1(PathBuf),
    /// cgroup v2 (unified): its root.
    V2(PathBuf),
}

fn layout() -> Result<Layout, FileError> {
    let v2 = Path::new("/sys/fs/cgroup");
    if v2.join("cgroup.controllers").exists() {
        let controllers = std::fs::read_to_string(v2.join("cgroup.controllers")).unwrap_or_default();
        if !controllers.split_whitespace().any(|c| c == "cpu") {
            return Err(FileError(
                "--cpu-per-process: the cgroup v2 cpu controller is not available".into(),
            ));
        }
        // Children of the root may use it (harmless if it already is).
        let _ = std::fs::write(v2.join("cgroup.subtree_control"), "+cpu");
        return Ok(Layout::V2(v2.to_path_buf()));
    }
    let v1 = v2.join("cpu");
    if v1.join("cpu.cfs_quota_us").exists() {
        return Ok(Layout::V1(v1));
    }
    Err(FileError(
        "--cpu-per-process needs the cgroup cpu controller (/sys/fs/cgroup/cpu or cgroup v2), which this host lacks"
            .into(),
    ))
}

fn write(path: &Path, value: &str) -> Result<(), FileError> {
    std::fs::write(path, value).map_err(|e| {
        FileError(format!(
            "--cpu-per-process: cannot write {value:?} to {} ({e}; it needs root)",
            path.display()
        ))
    })
}

/// A cgroup holding one process, its CPU limited; removed when dropped (after the process
/// ended).
#[derive(Debug)]
pub struct CpuLimit {
    dir: PathBuf,
}

impl CpuLimit {
    /// Moves process `pid` (all its threads, and those it starts later) into a new cgroup with
    /// `fraction` of one core.
    pub fn apply(pid: u32, fraction: f64) -> Result<CpuLimit, FileError> {
        if !(fraction > 0.0 && fraction <= 64.0) {
            return Err(FileError(format!(
                "--cpu-per-process {fraction}: give a share of one core above 0 (e.g. 0.2)"
            )));
        }
        let quota = ((fraction * PERIOD_US as f64) as u64).max(1_000);
        let name = format!("upright-bench-{}-{pid}", std::process::id());
        let (dir, settings): (PathBuf, Vec<(&str, String)>) = match layout()? {
            Layout::V1(root) => (
                root.join(&name),
                vec![
                    ("cpu.cfs_period_us", PERIOD_US.to_string()),
                    ("cpu.cfs_quota_us", quota.to_string()),
                ],
            ),
            Layout::V2(root) => (root.join(&name), vec![("cpu.max", format!("{quota} {PERIOD_US}"))]),
        };
        std::fs::create_dir(&dir).map_err(|e| {
            FileError(format!(
                "--cpu-per-process: cannot create cgroup {} ({e}; it needs root)",
                dir.display()
            ))
        })?;
        let limit = CpuLimit { dir };
        for (file, value) in settings {
            write(&limit.dir.join(file), &value)?;
        }
        write(&limit.dir.join("cgroup.procs"), &pid.to_string())?;
        Ok(limit)
    }
}

impl Drop for CpuLimit {
    fn drop(&mut self) {
        // Empty once its process is gone: then it can be removed.
        for _ in 0..50 {
            if std::fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        tracing::warn!(cgroup = %self.dir.display(), "could not remove the benchmark's cgroup");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A busy loop limited to a tenth of a core gets about that (root and a cgroup cpu
    /// controller only: skipped, loudly, without them), and its cgroup goes with it.
    #[test]
    fn a_limited_process_gets_its_share_and_its_cgroup_is_removed() {
        // SAFETY: geteuid only reads the process's credentials.
        if unsafe { libc::geteuid() } != 0 || layout().is_err() {
            eprintln!("\n*** SKIPPED cpu limit test: needs root and the cgroup cpu controller ***\n");
            return;
        }
        let mut child = std::process::Command::new("sh")
            .args(["-c", "while :; do :; done"])
            .spawn()
            .expect("start a busy loop");
        let limit = CpuLimit::apply(child.id(), 0.1).expect("limit it");
        let dir = limit.dir.clone();
        let before = crate::bench::launch::cpu_us(child.id()).unwrap();
        std::thread::sleep(std::time::Duration::from_secs(2));
        let used = crate::bench::launch::cpu_us(child.id()).unwrap() - before;
        let _ = child.kill();
        let _ = child.wait();
        drop(limit);
        assert!(used < 500_000, "a tenth of a core for 2 s used {used} us");
        assert!(used > 50_000, "the loop hardly ran: {used} us");
        assert!(!dir.exists(), "{} left behind", dir.display());
    }

    #[test]
    fn a_share_outside_the_range_is_refused_before_touching_cgroups() {
        for bad in [0.0, -1.0, f64::NAN, 65.0] {
            let e = CpuLimit::apply(std::process::id(), bad).unwrap_err();
            assert!(e.0.contains("share of one core"), "{e}");
        }
    }
}

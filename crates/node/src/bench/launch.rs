//! Local processes for a benchmark: a cluster of replica processes and the NO-REP server, each a
//! child process of the `upright` binary, plus CPU accounting from `/proc/<pid>/stat`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use upright_core::config::Knobs;

use super::cpu_limit::CpuLimit;
use crate::files::{self, FileError, InitPlan};
use crate::storage::FsyncPolicy;

/// Child processes of one benchmark target; all are SIGKILLed when dropped.
pub struct Processes {
    children: Vec<Child>,
    /// Each child's CPU limit (`--cpu-per-process`), removed after the children are gone.
    limits: Vec<Option<CpuLimit>>,
    /// Directory with the config, client files and logs.
    pub dir: PathBuf,
}

impl Processes {
    /// Process ids of the children.
    pub fn pids(&self) -> Vec<u32> {
        self.children.iter().map(|c| c.id()).collect()
    }

    /// Whether every child is still running.
    pub fn all_running(&mut self) -> bool {
        self.children.iter_mut().all(|c| matches!(c.try_wait(), Ok(None)))
    }
}

impl Drop for Processes {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A free loopback port below Linux's ephemeral range (32768+), so no outgoing connection can take
/// it between the choice and the bind; distinct within this process.
fn free_port() -> Result<u16, FileError> {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let start = std::process::id().wrapping_mul(7919).wrapping_add(5003) % 12_000;
    for _ in 0..12_000 {
        let port = 20_000 + ((start + NEXT.fetch_add(1, Ordering::Relaxed)) % 12_000) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return Ok(port);
        }
    }
    Err(FileError("no free loopback port between 20000 and 32000".into()))
}

/// What to launch.
#[derive(Clone, Debug)]
pub struct Target {
    /// Failures of any kind tolerated (`u = r = 0` with `norep` is the NO-REP server).
    pub u: usize,
    /// Byzantine failures tolerated.
    pub r: usize,
    /// Protocol knobs (batch size).
    pub knobs: Knobs,
    /// Log sync policy.
    pub fsync: FsyncPolicy,
    /// The replicas' `idle_spin_us`.
    pub idle_spin_us: u64,
    /// Client identities to create.
    pub clients: u32,
    /// Run the NO-REP server instead of replicas.
    pub norep: bool,
    /// Extra arguments of every `upright replica` (the service to run).
    pub replica_args: Vec<String>,
    /// Extra environment of every replica process (testing switches naming one replica).
    pub replica_env: Vec<(String, String)>,
    /// Client identities created after the `clients` ones for attackers (not started as
    /// clients; `upright bench --attack`).
    pub attackers: u32,
    /// The ordering protocol.
    pub protocol: upright_core::config::OrderProtocol,
    /// Selective execution (`selective_execution` in cluster.toml).
    pub selective_execution: bool,
    /// Separate stages with this execution fault bound (`separate_stages` and `exec_u` in
    /// cluster.toml): `2u + r + 1` authentication and order processes, then the execution ones.
    pub separate_stages: Option<usize>,
    /// Each process limited to this share of one core (`--cpu-per-process`; `cpu_limit`).
    pub cpu_per_process: Option<f64>,
}

fn spawn(
    exe: &Path,
    dir: &Path,
    args: &[String],
    env: &[(String, String)],
    log_name: &str,
) -> Result<Child, FileError> {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join(log_name))
        .map_err(|e| FileError(format!("cannot create log file: {e}")))?;
    Command::new(exe)
        .args(args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(log.try_clone().map_err(|e| FileError(e.to_string()))?)
        .stderr(log)
        .spawn()
        .map_err(|e| FileError(format!("cannot start {} {}: {e}", exe.display(), args.join(" "))))
}

/// The number of replica processes of `target`.
fn replicas(target: &Target) -> Result<usize, FileError> {
    let mut q = upright_core::quorum::Quorums::new(target.u, target.r).map_err(|e| FileError(e.to_string()))?;
    if let Some(exec_u) = target.separate_stages {
        q = q.with_separate_stages(exec_u).map_err(|e| FileError(e.to_string()))?;
    }
    Ok(q.n_replicas())
}

/// Writes the config of `target` into `dir` and starts its processes from the binary `exe`.
pub fn launch(exe: &Path, dir: &Path, target: &Target) -> Result<Processes, FileError> {
    configure(dir, target)?;
    start(exe, dir, target)
}

/// Writes the config of `target` into `dir` (`upright init`'s files, fresh keys), without starting
/// anything: a bench that chooses its roles by the generated keys reads them before [`start`].
pub fn configure(dir: &Path, target: &Target) -> Result<(), FileError> {
    let n = replicas(target)?;
    let mut ports = Vec::new();
    for _ in 0..n {
        ports.push((free_port()?, free_port()?, free_port()?));
    }
    let plan = InitPlan {
        cluster_name: if target.norep { "upright-norep" } else { "upright-bench" }.into(),
        u: target.u,
        r: target.r,
        hosts: vec!["127.0.0.1".into()],
        clients: target.clients + target.attackers,
        base_port: 0,
        ports: Some(ports),
        knobs: Some(target.knobs.clone()),
        fsync: target.fsync,
        idle_spin_us: target.idle_spin_us,
        unix_dir: None,
        metrics_host: Default::default(),
        metrics_token: false,
        recovery_interval_secs: 0,
        protocol: target.protocol,
        selective_execution: target.selective_execution,
        separate_stages: target.separate_stages,
    };
    files::init_cluster(&plan, dir)?;
    Ok(())
}

/// Starts the processes of `target`, configured in `dir` by [`configure`], from the binary `exe`.
pub fn start(exe: &Path, dir: &Path, target: &Target) -> Result<Processes, FileError> {
    let config = dir.join("cluster.toml").display().to_string();
    let mut children = Vec::new();
    if target.norep {
        let args = ["norep".to_string(), "--config".into(), config];
        children.push(spawn(exe, dir, &args, &[], "norep.log")?);
    } else {
        for id in 0..replicas(target)? {
            children.push(spawn_replica(exe, dir, target, id as u32)?);
        }
    }
    let limits = children
        .iter()
        .map(|c| target.cpu_per_process.map(|f| CpuLimit::apply(c.id(), f)).transpose())
        .collect::<Result<Vec<_>, FileError>>()?;
    Ok(Processes {
        children,
        limits,
        dir: dir.to_path_buf(),
    })
}

/// Starts replica `id` of `target` (configured in `dir` by [`launch`]); its log is appended to.
fn spawn_replica(exe: &Path, dir: &Path, target: &Target, id: u32) -> Result<Child, FileError> {
    let mut args = vec![
        "replica".to_string(),
        "--config".into(),
        dir.join("cluster.toml").display().to_string(),
        "--id".into(),
        id.to_string(),
    ];
    args.extend(target.replica_args.iter().cloned());
    spawn(exe, dir, &args, &target.replica_env, &format!("replica-{id}.log"))
}

impl Processes {
    /// SIGKILLs replica `id` (the `id`-th child) and waits for it.
    pub fn kill(&mut self, id: usize) -> Result<(), FileError> {
        let child = self
            .children
            .get_mut(id)
            .ok_or_else(|| FileError(format!("no process {id}")))?;
        child
            .kill()
            .map_err(|e| FileError(format!("cannot kill replica {id}: {e}")))?;
        let _ = child.wait();
        Ok(())
    }

    /// Starts replica `id` again (after [`Processes::kill`]) from the same binary and config.
    pub fn restart(&mut self, exe: &Path, target: &Target, id: usize) -> Result<(), FileError> {
        let child = spawn_replica(exe, &self.dir, target, id as u32)?;
        self.limits[id] = None;
        self.limits[id] = target
            .cpu_per_process
            .map(|f| CpuLimit::apply(child.id(), f))
            .transpose()?;
        self.children[id] = child;
        Ok(())
    }
}

/// CPU time (user + system, all threads) a process has used so far, in microseconds, from the
/// kernel's own accounting; `None` if the process is gone.
pub fn cpu_us(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat_cpu_ticks(&stat).map(|ticks| ticks * 1_000_000 / clock_ticks_per_second())
}

/// Sum of [`cpu_us`] over `pids` (a vanished process counts 0).
pub fn cpu_us_sum(pids: &[u32]) -> u64 {
    pids.iter().filter_map(|p| cpu_us(*p)).sum()
}

/// `utime + stime` (fields 14 and 15) of a `/proc/<pid>/stat` line, in clock ticks.
pub fn parse_stat_cpu_ticks(stat: &str) -> Option<u64> {
    // The command name (field 2) is in parentheses and may contain spaces: split after it.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // rest starts at field 3 (state): utime is field 14, stime field 15.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

fn clock_ticks_per_second() -> u64 {
    // SAFETY: sysconf only reads a system constant.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks > 0 {
        ticks as u64
    } else {
        100
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_stat_with_spaces_in_the_name() {
        let line = "1234 (a b) c) S 1 2 3 4 5 6 7 8 9 10 111 222 13 14 15";
        assert_eq!(parse_stat_cpu_ticks(line), Some(333));
        assert_eq!(parse_stat_cpu_ticks("garbage"), None);
    }

    #[test]
    fn own_cpu_time_is_readable() {
        assert!(cpu_us(std::process::id()).is_some());
    }
}

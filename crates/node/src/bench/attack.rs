//! `upright bench --attack NAME|all`: Aardvark's attacks (UpRight thesis ch. 3) on a local
//! cluster of replica processes, each measured beside the fault-free runs of the same invocation
//! (same configuration, clients and workload; one before the attacks and one after, the faster
//! one the reference).
//!
//! A replica attack starts one replica as the simulator's Byzantine replica with the named
//! behaviour (the testing switch [`crate::replica::BYZANTINE_ENV`]); a client
//! attack adds [`ATTACKERS`] attacking clients, each with its own identity and connections, beside
//! the measured ones. With `defences` off the replicas run without the primary watch
//! (`watch_primary`), without signed requests (`client_signatures`, which carries the
//! blacklist) and without cutting off flooding peers (`peer_cut_off`): PBFT's own defences only.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use upright_core::crypto::{KeyRing, Signature};
use upright_core::ids::{ClientId, Principal, Process, ReplicaId, RequestId, StageKind};
use upright_core::kv::KvOperation;
use upright_core::message::{client_request_digest, Envelope, Message, Seal, SealFor};

use super::load::{self, Measurement, Workload};
use super::report::{json_string, ms, nice_max, Plot};
use super::{bench_knobs, start, BenchOptions, Running, Target};
use crate::files::{endpoint, ClientFile, FileError};
use crate::transport::{dial_clients, Counters, Dialer, Inbox};

/// Attacking clients of a client attack.
pub const ATTACKERS: u32 = 8;
/// How often each flooding client sends a request (with [`ATTACKERS`] of them: 8,000 requests
/// per second to every replica).
pub const FLOOD_EVERY: Duration = Duration::from_millis(1);
/// How often each client with inconsistent authenticators sends a new request (1,600 per second
/// in all; each is signed properly, which costs the attacker a signature).
pub const INCONSISTENT_EVERY: Duration = Duration::from_millis(5);

/// One of Aardvark's attacks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Attack {
    /// Many clients flood every replica with requests carrying bad signatures under valid MACs
    /// and requests carrying bad MACs.
    ClientFlood,
    /// The view-0 primary holds each PRE-PREPARE that carries requests for three quarters of the
    /// view-change timeout.
    SlowPrimary,
    /// The view-0 primary ignores client 0's requests.
    StarveClient,
    /// A backup sends well-formed junk under its own valid MACs with every message.
    FloodPeers,
    /// A backup that is also an execution member sends nothing.
    Silence,
    /// Clients whose request authenticators are valid for some authentication members and
    /// garbage for the others.
    ClientInconsistentAuth,
    /// An execution member (not the primary) sends a wrong result in every reply (ODRC's fault
    /// experiment; not one of Aardvark's, so not in `all`).
    WrongReplies,
}

impl Attack {
    /// Every attack, in the order `all` runs them.
    pub const ALL: [Attack; 6] = [
        Attack::ClientFlood,
        Attack::SlowPrimary,
        Attack::StarveClient,
        Attack::FloodPeers,
        Attack::Silence,
        Attack::ClientInconsistentAuth,
    ];

    /// Its name (`--attack`; the replica attacks are named as the simulator's behaviours).
    pub fn name(self) -> &'static str {
        match self {
            Attack::ClientFlood => "client-flood",
            Attack::SlowPrimary => "slow-primary",
            Attack::StarveClient => "starve-client",
            Attack::FloodPeers => "flood-peers",
            Attack::Silence => "silence",
            Attack::ClientInconsistentAuth => "client-inconsistent-auth",
            Attack::WrongReplies => "wrong-replies",
        }
    }

    /// Parses `all` or a comma-separated list of names.
    pub fn parse_list(text: &str) -> Result<Vec<Attack>, String> {
        if text.trim() == "all" {
            return Ok(Attack::ALL.to_vec());
        }
        let mut attacks = Vec::new();
        let known = Attack::ALL.into_iter().chain([Attack::WrongReplies]);
        for name in text.split(',').map(str::trim) {
            let attack = known.clone().find(|a| a.name() == name).ok_or_else(|| {
                let names: Vec<&str> = known.clone().map(|a| a.name()).collect();
                format!("--attack {name:?}: expected all or one of {}", names.join(", "))
            })?;
            if !attacks.contains(&attack) {
                attacks.push(attack);
            }
        }
        Ok(attacks)
    }

    /// The Byzantine replica of a replica attack in a cluster of `n` replicas, and the behaviour
    /// it runs.
    fn byzantine(self, n: usize) -> Option<(u32, &'static str)> {
        match self {
            Attack::SlowPrimary | Attack::StarveClient => Some((0, self.name())),
            // A backup that is not the next primary (replica 1 would be replaced by the first
            // view change and so hide what the flood costs).
            Attack::FloodPeers => Some(((n - 1) as u32, self.name())),
            // An execution member (members are replicas 0..n_exec), not the primary.
            Attack::Silence | Attack::WrongReplies => Some((1, self.name())),
            Attack::ClientFlood | Attack::ClientInconsistentAuth => None,
        }
    }

    /// Whether it needs a Byzantine replica (so `r >= 1`).
    pub fn needs_byzantine_replica(self) -> bool {
        self.byzantine(4).is_some()
    }
}

/// What the defences did during a run, summed over the replicas' metrics at its end.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DefenceEvents {
    /// The highest view of any order member.
    pub view: u64,
    /// View changes a backup started because the primary was slow or unfair
    /// (`view_change_primary_slow`) or fell behind earlier views' throughput
    /// (`view_change_primary_throughput`).
    pub watch_view_changes: u64,
    /// Peer replicas cut off (`net_peer_cut_off`, [`upright_core::cutoff`]).
    pub peer_cut_offs: u64,
    /// Clients blacklisted (`client_blacklisted`).
    pub clients_blacklisted: u64,
}

impl DefenceEvents {
    /// Adds what one replica's Prometheus text reports.
    pub fn add_metrics(&mut self, text: &str) {
        for (series, value) in crate::metrics::prometheus_samples(text) {
            let counter = |n: &str| crate::metrics::prometheus_label(series, "name") == Some(n);
            if series.starts_with("upright_view{") {
                self.view = self.view.max(value);
            } else if counter("view_change_primary_slow") || counter("view_change_primary_throughput") {
                self.watch_view_changes += value;
            } else if counter("net_peer_cut_off") {
                self.peer_cut_offs += value;
            } else if counter("client_blacklisted") {
                self.clients_blacklisted += value;
            }
        }
    }
}

/// One attack's figures beside the fault-free run's.
#[derive(Clone, Debug)]
pub struct AttackPoint {
    /// The attack.
    pub attack: Attack,
    /// Whether the defences were on.
    pub defences: bool,
    /// Fault model.
    pub u: usize,
    /// Byzantine faults tolerated.
    pub r: usize,
    /// Measured clients.
    pub clients: u32,
    /// Workload.
    pub workload: Workload,
    /// Under attack.
    pub attacked: Measurement,
    /// The fault-free run of the same invocation.
    pub fault_free: Measurement,
    /// What the defences did under attack.
    pub events: DefenceEvents,
}

impl AttackPoint {
    /// Throughput under attack as a fraction of the fault-free run's.
    pub fn ratio(&self) -> f64 {
        if self.fault_free.throughput > 0.0 {
            self.attacked.throughput / self.fault_free.throughput
        } else {
            0.0
        }
    }
}

/// The replicas' knobs: the bench's, with the defences on or off.
fn knobs(options: &BenchOptions, defences: bool) -> upright_core::config::Knobs {
    let mut knobs = bench_knobs(options, options.batch_sizes[0]);
    knobs.watch_primary = defences;
    knobs.client_signatures = defences;
    knobs.peer_cut_off = defences;
    knobs
}

fn target(options: &BenchOptions, defences: bool, attack: Option<Attack>) -> Target {
    let (u, r) = options.faults[0];
    let n = 2 * u + r + 1;
    let replica_env = match attack.and_then(|a| a.byzantine(n)) {
        Some((id, behaviour)) => vec![(crate::replica::BYZANTINE_ENV.to_string(), format!("{id}:{behaviour}"))],
        None => Vec::new(),
    };
    Target {
        u,
        r,
        knobs: knobs(options, defences),
        fsync: options.fsync,
        idle_spin_us: options.idle_spin_us,
        clients: options.clients[0],
        norep: false,
        replica_args: Vec::new(),
        replica_env,
        attackers: ATTACKERS,
        selective_execution: options.selective.first().copied().unwrap_or(false),
        protocol: Default::default(),
        separate_stages: None,
        cpu_per_process: options.cpu_per_process,
    }
}

/// Runs the fault-free run, each attack and the fault-free run again, on a fresh cluster each
/// (the faster fault-free run is the reference); prints a result line per attack. Uses the
/// first workload, client count, `(u, r)` and batch size of `options`.
pub async fn run(options: &BenchOptions, attacks: &[Attack], defences: bool) -> Result<Vec<AttackPoint>, FileError> {
    let workload = options.workloads[0];
    let clients = options.clients[0];
    let (u, r) = options.faults[0];
    if r == 0 {
        if let Some(a) = attacks.iter().find(|a| a.needs_byzantine_replica()) {
            return Err(FileError(format!(
                "--attack {}: a Byzantine replica needs r >= 1 (--ur {u}/0 tolerates none)",
                a.name()
            )));
        }
    }
    let on_off = if defences { "on" } else { "off" };
    println!(
        "upright bench --attack: {} cores, u={u} r={r}, {clients} clients, workload {}, defences {on_off}",
        super::cores(),
        workload.name(),
    );
    let fault_free_line = |again: &str, m: &Measurement| {
        println!(
            "FAULT-FREE defences={on_off}{again}: {:.0} ops/s, p50 {} ms, p99 {} ms",
            m.throughput,
            ms(m.p50_us),
            ms(m.p99_us)
        )
    };
    let (first, _) = measure(options, defences, None).await?;
    fault_free_line("", &first);
    let mut runs = Vec::new();
    for &attack in attacks {
        let (attacked, events) = measure(options, defences, Some(attack)).await?;
        println!(
            "  {} defences={on_off}: {:.0} ops/s (ratio follows the second fault-free run)",
            attack.name(),
            attacked.throughput
        );
        runs.push((attack, attacked, events));
    }
    // The fault-free run again at the end: on this machine one run of a few seconds can be 30%
    // off; the better of the two is the reference (which can only lower the ratios).
    let (last, _) = measure(options, defences, None).await?;
    fault_free_line(" (again)", &last);
    let fault_free = if last.throughput > first.throughput {
        last
    } else {
        first
    };
    let points: Vec<AttackPoint> = runs
        .into_iter()
        .map(|(attack, attacked, events)| AttackPoint {
            attack,
            defences,
            u,
            r,
            clients,
            workload,
            attacked,
            fault_free: fault_free.clone(),
            events,
        })
        .collect();
    for point in &points {
        println!("{}", result_line(point));
    }
    Ok(points)
}

/// One measured run on a fresh cluster: fault-free (`None`) or under `attack`.
async fn measure(
    options: &BenchOptions,
    defences: bool,
    attack: Option<Attack>,
) -> Result<(Measurement, DefenceEvents), FileError> {
    let workload = options.workloads[0];
    let target = target(options, defences, attack);
    let mut cluster: Running = start(options, target.clone()).await?;
    load::prepare(&cluster.clients, workload).await.map_err(FileError)?;
    let _attackers = match attack {
        Some(a @ (Attack::ClientFlood | Attack::ClientInconsistentAuth)) => {
            Some(Attackers::start(&cluster.processes.dir, target.clients, a)?)
        }
        _ => None,
    };
    let label = format!(
        "upright u={} r={} {} {} clients",
        target.u,
        target.r,
        attack.map_or("fault-free", Attack::name),
        target.clients
    );
    let pids = cluster.processes.pids();
    let m = load::measure(
        &label,
        &cluster.clients,
        workload,
        &pids,
        options.warmup,
        options.duration,
    )
    .await;
    if !cluster.processes.all_running() {
        return Err(FileError(format!(
            "a replica process exited; logs in {}",
            cluster.processes.dir.display()
        )));
    }
    let mut events = DefenceEvents::default();
    let config = crate::files::Cluster::load(&cluster.processes.dir.join("cluster.toml"))?;
    let token = config.metrics_token()?;
    for entry in &config.file.replicas {
        let addr = crate::files::resolve(&entry.metrics_addr)?;
        let text = crate::metrics::http_get(addr, "/metrics", token.as_deref())
            .await
            .map_err(|e| FileError(format!("cannot read replica {}'s metrics: {e}", entry.id)))?;
        events.add_metrics(&text);
    }
    Ok((m, events))
}

/// The attacking clients of a client attack: one task sending their requests over their own
/// connections; stopped when dropped.
struct Attackers {
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Attackers {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// One attacking client.
struct Attacker {
    id: ClientId,
    keys: Arc<KeyRing>,
    next: u64,
}

impl Attackers {
    /// Starts the [`ATTACKERS`] clients after the first `first` of the cluster configured in
    /// `dir`.
    fn start(dir: &Path, first: u32, attack: Attack) -> Result<Attackers, FileError> {
        let mut setups = Vec::new();
        for c in first..first + ATTACKERS {
            setups.push(ClientFile::load(&dir.join(format!("client-{c}.toml")))?);
        }
        let cluster = setups[0].cluster.clone();
        let quorums = cluster.config.validate().map_err(|e| FileError(e.to_string()))?;
        let attackers: Vec<Attacker> = setups
            .iter()
            .map(|s| Attacker {
                id: s.id,
                keys: Arc::new(KeyRing::new(&cluster.config, Process::Client(s.id), &s.keys)),
                next: 0,
            })
            .collect();
        let counters = Arc::new(Counters::default());
        let inboxes: BTreeMap<ClientId, Arc<Inbox>> = attackers
            .iter()
            .map(|a| (a.id, Arc::new(Inbox::new(counters.clone()))))
            .collect();
        let inboxes = Arc::new(inboxes);
        let name = &cluster.config.cluster_name;
        let mut dialers: Vec<Dialer> = Vec::new();
        for entry in &cluster.file.replicas {
            let to = ReplicaId(entry.id);
            let addr = endpoint(&entry.client_addr)?;
            dialers.push(dial_clients(
                addr,
                to,
                attackers.iter().map(|a| a.keys.clone()).collect(),
                name.clone(),
                inboxes.clone(),
                upright_core::limits::MESSAGE_BYTES_MAX,
                counters.clone(),
            ));
        }
        let every = match attack {
            Attack::ClientInconsistentAuth => INCONSISTENT_EVERY,
            _ => FLOOD_EVERY,
        };
        let task = tokio::spawn(async move {
            let mut attackers = attackers;
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            let mut turn = 0u64;
            loop {
                tick.tick().await;
                for a in &mut attackers {
                    turn += 1;
                    a.next += 1;
                    let envelope = a.request(&quorums, attack, turn);
                    let frame = Arc::new(upright_core::wire::encode(&envelope));
                    for d in &dialers {
                        d.send(frame.clone());
                    }
                }
                // Replies (to the requests some members accepted) are read and dropped.
                for inbox in inboxes.values() {
                    drop(inbox.pop_round_robin(usize::MAX));
                }
            }
        });
        Ok(Attackers { task })
    }
}

impl Attacker {
    /// The attacker's next request, spoiled the way `attack` spoils it (`turn` varies which
    /// part of it is spoiled).
    fn request(&self, quorums: &upright_core::quorum::Quorums, attack: Attack, turn: u64) -> Envelope {
        let operation = KvOperation::Put {
            key: Bytes::from(format!("attacker{}", self.id.0)),
            value: Bytes::from_static(b"12345678"),
        }
        .encode();
        let request_id = RequestId(self.next);
        let signature = match attack {
            // A garbage signature (the flood costs the attacker nothing to make).
            Attack::ClientFlood => Signature([7; 64]),
            _ => self.keys.sign(&client_request_digest(self.id, request_id, &operation)),
        };
        let message = Message::ClientRequest {
            client: self.id,
            request_id,
            operation,
            read_only: false,
            signature: Some(signature),
            config_epoch: 0,
        };
        let mut envelope = Envelope::seal(
            &self.keys,
            quorums,
            Principal::Client(self.id),
            message,
            SealFor::Stage(StageKind::Auth),
        );
        if let Seal::Authenticator(a) = &mut envelope.seal {
            let n = a.macs.len() as u64;
            match attack {
                // Every other request: bad MACs for every member (the other half carries valid
                // MACs and the bad signature).
                Attack::ClientFlood if turn.is_multiple_of(2) => a.macs.iter_mut().for_each(|m| m.0[0] ^= 0x5a),
                // Garbage for a varying, never empty, proper subset of the members.
                Attack::ClientInconsistentAuth if n > 1 => {
                    let mask = 1 + turn % ((1 << n.min(16)) - 2);
                    for (i, m) in a.macs.iter_mut().enumerate() {
                        if mask >> (i % 16) & 1 == 1 {
                            m.0[0] ^= 0x5a;
                        }
                    }
                }
                _ => {}
            }
        }
        envelope
    }
}

/// One line per attack: throughput and p99 under attack beside fault-free.
pub fn result_line(p: &AttackPoint) -> String {
    let (a, f) = (&p.attacked, &p.fault_free);
    let mut line = format!(
        "ATTACK {} defences={}: {:.0} ops/s ({:.1}% of fault-free {:.0} ops/s), p50 {} ms, p99 {} ms (fault-free {} ms), slowest client {} ops (fault-free {})",
        p.attack.name(),
        if p.defences { "on" } else { "off" },
        a.throughput,
        100.0 * p.ratio(),
        f.throughput,
        ms(a.p50_us),
        ms(a.p99_us),
        ms(f.p99_us),
        a.client_ops_min,
        f.client_ops_min
    );
    if a.errors > 0 {
        let _ = write!(line, ", {} errors", a.errors);
    }
    let e = &p.events;
    let _ = write!(
        line,
        "; view {}, watch view changes {}, peers cut off {}, clients blacklisted {}",
        e.view, e.watch_view_changes, e.peer_cut_offs, e.clients_blacklisted
    );
    line
}

/// A Markdown table of the attacks.
pub fn table(points: &[AttackPoint]) -> String {
    let mut s = String::from(
        "| attack | defences | ops/s | fault-free ops/s | ratio | p99 ms | fault-free p99 ms | slowest client ops | errors | view | peers cut off | clients blacklisted |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for p in points {
        let _ = writeln!(
            s,
            "| {} | {} | {:.0} | {:.0} | {:.1}% | {} | {} | {} | {} | {} | {} | {} |",
            p.attack.name(),
            if p.defences { "on" } else { "off" },
            p.attacked.throughput,
            p.fault_free.throughput,
            100.0 * p.ratio(),
            ms(p.attacked.p99_us),
            ms(p.fault_free.p99_us),
            p.attacked.client_ops_min,
            p.attacked.errors,
            p.events.view,
            p.events.peer_cut_offs,
            p.events.clients_blacklisted
        );
    }
    s
}

fn json_list(values: &[f64]) -> String {
    let items: Vec<String> = values.iter().map(|v| format!("{v:.1}")).collect();
    format!("[{}]", items.join(", "))
}

/// The JSON: an array with one object per attack.
pub fn to_json(points: &[AttackPoint], cores: usize, command: &str) -> String {
    let mut s = String::from("[\n");
    for (i, p) in points.iter().enumerate() {
        let (a, f) = (&p.attacked, &p.fault_free);
        let _ = write!(
            s,
            "  {{\"attack\": {}, \"throughput_ops_per_s\": {:.1}, \"fault_free_ops_per_s\": {:.1}, \"ratio\": {:.4}, \
             \"defences\": {}, \"u\": {}, \"r\": {}, \"clients\": {}, \"workload\": {}, \
             \"p50_ms\": {:.3}, \"p99_ms\": {:.3}, \"fault_free_p50_ms\": {:.3}, \"fault_free_p99_ms\": {:.3}, \
             \"errors\": {}, \"slowest_client_ops\": {}, \"fault_free_slowest_client_ops\": {}, \
             \"cpu_us_per_op\": {:.1}, \"fault_free_cpu_us_per_op\": {:.1}, \
             \"view\": {}, \"watch_view_changes\": {}, \"peer_cut_offs\": {}, \"clients_blacklisted\": {}, \
             \"per_second\": {}, \"fault_free_per_second\": {}, \"cores\": {cores}, \"command\": {}}}",
            json_string(p.attack.name()),
            a.throughput,
            f.throughput,
            p.ratio(),
            p.defences,
            p.u,
            p.r,
            p.clients,
            json_string(&p.workload.name()),
            a.p50_us as f64 / 1000.0,
            a.p99_us as f64 / 1000.0,
            f.p50_us as f64 / 1000.0,
            f.p99_us as f64 / 1000.0,
            a.errors,
            a.client_ops_min,
            f.client_ops_min,
            a.cpu_us_per_op,
            f.cpu_us_per_op,
            p.events.view,
            p.events.watch_view_changes,
            p.events.peer_cut_offs,
            p.events.clients_blacklisted,
            json_list(&a.per_second),
            json_list(&f.per_second),
            json_string(command)
        );
        s.push_str(if i + 1 < points.len() { ",\n" } else { "\n" });
    }
    s.push_str("]\n");
    s
}

/// Where the plot goes next to the JSON file `json`: `<stem>-over-time.svg`.
pub fn svg_path(json: &Path) -> std::path::PathBuf {
    let stem = json
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "attack".into());
    json.with_file_name(format!("{stem}-over-time.svg"))
}

/// Throughput over time: one line per attack and one for the fault-free run, a point per
/// second of the measurement window.
pub fn to_svg(points: &[AttackPoint]) -> String {
    let mut series: Vec<(String, &[f64])> = Vec::new();
    if let Some(p) = points.first() {
        series.push(("fault-free".into(), &p.fault_free.per_second));
    }
    for p in points {
        series.push((p.attack.name().to_string(), &p.attacked.per_second));
    }
    let xmax = series.iter().map(|(_, v)| v.len()).max().unwrap_or(1).max(1) as f64;
    let ymax = nice_max(series.iter().flat_map(|(_, v)| v.iter().copied()).fold(0.0, f64::max));
    let plot = Plot {
        width: 720.0,
        right: 200.0,
        xmax,
        ymax,
    };
    let defences = points.first().is_none_or(|p| p.defences);
    let mut s = plot.open(
        &format!(
            "Throughput under attack, per second (defences {})",
            if defences { "on" } else { "off" }
        ),
        "seconds into the measurement window",
        "ops/s",
        0,
    );
    let colours = ["#777", "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"];
    for (i, (name, values)) in series.iter().enumerate() {
        let colour = colours[i % colours.len()];
        let path: Vec<String> = values
            .iter()
            .enumerate()
            .map(|(x, y)| format!("{:.1},{:.1}", plot.px(x as f64 + 1.0), plot.py(*y)))
            .collect();
        let _ = writeln!(
            s,
            "<polyline fill=\"none\" stroke=\"{colour}\" stroke-width=\"1.5\" points=\"{}\"/>",
            path.join(" ")
        );
        let ly = 54.0 + 16.0 * i as f64;
        let _ = writeln!(
            s,
            "<rect x=\"{}\" y=\"{}\" width=\"10\" height=\"10\" fill=\"{colour}\"/><text x=\"{}\" y=\"{}\">{name}</text>",
            plot.width - plot.right + 10.0,
            ly - 9.0,
            plot.width - plot.right + 26.0,
            ly
        );
    }
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attack_lists_parse() {
        assert_eq!(Attack::parse_list("all").unwrap(), Attack::ALL.to_vec());
        assert_eq!(
            Attack::parse_list("silence, slow-primary,silence").unwrap(),
            vec![Attack::Silence, Attack::SlowPrimary]
        );
        let e = Attack::parse_list("silence,nope").unwrap_err();
        assert!(e.contains("\"nope\"") && e.contains("client-flood"), "{e}");
        for a in Attack::ALL {
            assert_eq!(Attack::parse_list(a.name()).unwrap(), vec![a]);
        }
    }

    #[test]
    fn replica_attacks_name_a_replica_of_the_cluster() {
        for n in [4, 7] {
            for a in Attack::ALL {
                if let Some((id, behaviour)) = a.byzantine(n) {
                    assert!((id as usize) < n);
                    assert_eq!(behaviour, a.name());
                }
            }
        }
        assert!(!Attack::ClientFlood.needs_byzantine_replica());
        assert!(Attack::Silence.needs_byzantine_replica());
    }

    fn point(attack: Attack, ops_per_s: f64) -> AttackPoint {
        let m = |t: f64| Measurement {
            throughput: t,
            per_second: vec![t, t],
            ..Measurement::default()
        };
        AttackPoint {
            attack,
            defences: true,
            u: 1,
            r: 1,
            clients: 16,
            workload: Workload::parse("0/0").unwrap(),
            attacked: m(ops_per_s),
            fault_free: m(1000.0),
            events: DefenceEvents::default(),
        }
    }

    #[test]
    fn json_has_one_object_per_attack_with_the_ratio() {
        let points = [point(Attack::Silence, 900.0), point(Attack::SlowPrimary, 500.0)];
        let json = to_json(&points, 2, "upright bench --attack all");
        assert!(json.starts_with("[\n") && json.ends_with("]\n"));
        assert_eq!(json.matches("\"attack\": ").count(), 2);
        assert!(json.contains("\"attack\": \"silence\", \"throughput_ops_per_s\": 900.0, \"fault_free_ops_per_s\": 1000.0, \"ratio\": 0.9000"));
        assert!(json.contains("\"ratio\": 0.5000"));
        let svg = to_svg(&points);
        assert_eq!(svg.matches("<polyline").count(), 3);
        assert!(table(&points).contains("| slow-primary | on | 500 | 1000 | 50.0% |"));
    }

    #[test]
    fn defence_events_are_read_from_the_metrics() {
        let mut e = DefenceEvents::default();
        e.add_metrics(
            "# HELP upright_view x\nupright_view{replica=\"0\"} 2\n\
             upright_stage_counter{replica=\"0\",stage=\"order\",name=\"view_change_primary_slow\"} 1\n\
             upright_net_counter{replica=\"0\",name=\"net_peer_cut_off\"} 3\n\
             upright_stage_counter{replica=\"0\",stage=\"auth\",name=\"client_blacklisted\"} 8\n",
        );
        e.add_metrics(
            "upright_view{replica=\"1\"} 1\n\
             upright_stage_counter{replica=\"1\",stage=\"order\",name=\"view_change_primary_throughput\"} 1\n\
             upright_stage_counter{replica=\"1\",stage=\"order\",name=\"view_change_started\"} 5\n",
        );
        assert_eq!(
            e,
            DefenceEvents {
                view: 2,
                watch_view_changes: 2,
                peer_cut_offs: 3,
                clients_blacklisted: 8
            }
        );
    }
}

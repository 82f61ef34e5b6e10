//! The `upright` command's configuration handling: `init` writes a usable cluster, and every
//! misconfiguration is a one-line error with a non-zero exit (no replica stage runs here).

use std::process::Command;
use std::sync::Mutex;

/// Held by the tests that run a whole cluster (the demo's smoke run, the state-transfer bench),
/// so they do not share this machine's cores with each other: under that load the bench's
/// killed replica at times caught up batch by batch instead of by state transfer, and the bench
/// (which measures the transfer) timed out.
static CLUSTER: Mutex<()> = Mutex::new(());

fn upright(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_upright")).args(args).output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

fn one_line_error(args: &[&str], expected: &str) {
    let (code, _, stderr) = upright(args);
    assert_ne!(code, 0, "{args:?} must fail");
    assert_eq!(stderr.trim().lines().count(), 1, "{args:?}: {stderr}");
    assert!(stderr.contains(expected), "{args:?}: {stderr}");
}

#[test]
fn init_then_misconfigurations_are_one_line_errors() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("c");
    let out = out.to_str().unwrap();
    let (code, stdout, stderr) = upright(&[
        "init",
        "--replicas",
        "4",
        "--u",
        "1",
        "--r",
        "1",
        "--hosts",
        "127.0.0.1",
        "--clients",
        "2",
        "--out",
        out,
    ]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("cluster.toml"));
    // The Redis gateway: a pool needs one client identity per member, from the files beside the first.
    let client = format!("{out}/client-0.toml");
    one_line_error(
        &["redis", "--client", &client, "--pool", "3"],
        "a pool of 3 needs client identities 0..2",
    );
    one_line_error(&["redis", "--client", &format!("{out}/nope.toml")], "cannot read");
    one_line_error(
        &["redis", "--client", &client, "--listen", "nonsense"],
        "cannot listen on nonsense",
    );
    let config = format!("{out}/cluster.toml");
    one_line_error(
        &[
            "init",
            "--replicas",
            "5",
            "--u",
            "1",
            "--r",
            "1",
            "--hosts",
            "h",
            "--out",
            out,
        ],
        "needs 2u + r + 1 = 4 replicas",
    );
    one_line_error(
        &["replica", "--config", &config, "--id", "7"],
        "there is no replica 7 (the cluster has had replicas 0..3)",
    );
    one_line_error(
        &["replica", "--config", "/nonexistent/cluster.toml", "--id", "0"],
        "cannot read",
    );
    let key1 = format!("{out}/keys/replica-1.key");
    one_line_error(
        &["replica", "--config", &config, "--id", "0", "--key", &key1],
        "belongs to replica 1, not replica 0",
    );
    std::fs::remove_file(format!("{out}/keys/replica-2.key")).unwrap();
    one_line_error(&["replica", "--config", &config, "--id", "2"], "cannot read key file");
    // A key of another cluster.
    let other = dir.path().join("o");
    let other = other.to_str().unwrap();
    let (code, _, _) = upright(&[
        "init",
        "--replicas",
        "4",
        "--u",
        "1",
        "--r",
        "1",
        "--hosts",
        "127.0.0.1",
        "--name",
        "other",
        "--out",
        other,
    ]);
    assert_eq!(code, 0);
    let key_other = format!("{other}/keys/replica-0.key");
    one_line_error(
        &["replica", "--config", &config, "--id", "0", "--key", &key_other],
        "is for cluster \"other\"",
    );
    // keygen writes a private key file.
    let key = dir.path().join("k.key");
    let (code, stdout, _) = upright(&["keygen", "--replica", "0", "--out", key.to_str().unwrap()]);
    assert_eq!(code, 0);
    assert!(stdout.contains("x25519 = "));
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(&key).unwrap().permissions().mode() & 0o777, 0o600);
}

/// Separate stages: `upright init --separate-stages` counts both kinds of process, and
/// `upright replica --stages` is refused where cluster.toml places other stages (or nothing).
#[test]
fn separate_stages_misconfigurations_are_one_line_errors() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("s");
    let out = out.to_str().unwrap();
    let mut init: Vec<&str> = "init --u 1 --r 1 --hosts 127.0.0.1 --separate-stages --exec-u 2 --out"
        .split(' ')
        .collect();
    init.push(out);
    one_line_error(&[&init[..], &["--replicas", "4"]].concat(), "9 in all");
    // Execution-only processes keep their own keys: key refresh and proactive recovery go with
    // separate stages.
    let with_keys = [
        "--replicas",
        "9",
        "--key-refresh-secs",
        "5",
        "--recovery-interval-secs",
        "900",
    ];
    let (code, stdout, stderr) = upright(&[&init[..], &with_keys[..]].concat());
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("--stages exec --id i"), "{stdout}");
    let config = format!("{out}/cluster.toml");
    let toml = std::fs::read_to_string(&config).unwrap();
    assert!(toml.contains("key_refresh_us = 5000000"), "{toml}");
    assert!(toml.contains("recovery_interval_secs = 900"), "{toml}");
    one_line_error(
        &["replica", "--config", &config, "--stages", "exec", "--id", "5"],
        "the cluster has 5 execution members (0 to 4)",
    );
    one_line_error(
        &["replica", "--config", &config, "--stages", "exec,order", "--id", "1"],
        "cluster.toml places auth,order on that replica",
    );
    one_line_error(
        &["replica", "--config", &config, "--stages", "auth,order", "--id", "6"],
        "cluster.toml places exec on that replica",
    );
    // The benchmark's separate stages and CPU limits.
    fn bench<'a>(extra: &[&'a str]) -> Vec<&'a str> {
        [&["bench", "--workload", "cpu200", "--duration", "1s"][..], extra].concat()
    }
    one_line_error(
        &bench(&["--separate-stages", "--protocol", "quorum"]),
        "--protocol pbft only",
    );
    one_line_error(
        &bench(&["--separate-stages", "--tentative", "8"]),
        "does not go with --tentative",
    );
    one_line_error(&bench(&["--cpu-per-process", "0"]), "share of one core");
    one_line_error(&bench(&["--workload", "cpu200x0"]), "K must be 1 to");
    one_line_error(
        &["demo", "--service", "fs", "--selective-execution"],
        "--service redis, zk or kv, not fs",
    );
}

#[test]
fn a_demo_whose_replicas_cannot_start_says_why_at_once() {
    let started = std::time::Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_upright"))
        .args(["demo", "--port", "0"])
        .env("UPRIGHT_TEST_FSYNC_DELAY_US", "soon")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains("exited before the cluster served a request")
            && stderr.contains("UPRIGHT_TEST_FSYNC_DELAY_US=\"soon\": expected microseconds"),
        "{stderr}"
    );
    // Not the 60 s readiness timeout.
    assert!(
        started.elapsed() < std::time::Duration::from_secs(30),
        "{:?}",
        started.elapsed()
    );
}

/// `upright demo --smoke` over Unix-domain sockets (the demo's default): the SIGKILLed replica
/// leaves its socket files behind, and the restarted one must replace them and keep running
/// (the smoke run fails if a replica has exited), with nothing acknowledged lost.
#[test]
fn the_demo_smoke_run_over_unix_sockets_survives_a_sigkill_and_restart() {
    let _one_cluster = CLUSTER.lock().unwrap_or_else(|e| e.into_inner());
    let out = Command::new(env!("CARGO_BIN_EXE_upright"))
        .args(["demo", "--smoke", "--seconds", "3", "--clients", "2"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(stdout.contains("over Unix-domain sockets"), "{stdout}");
    assert!(stdout.contains("replicas unix:/"), "{stdout}");
    assert!(stdout.contains("replica 1 restarted"), "{stdout}");
    assert!(stdout.contains("lost acknowledged writes: 0"), "{stdout}");
    assert!(!stdout.contains("exited"), "{stdout}");
}

/// The state-transfer benchmark at a small size: a replica SIGKILLed during writes comes back by
/// fetching only the objects that changed, while another replica answers state requests wrongly,
/// and ends at the same checkpoint digest as the others (the bench fails otherwise).
#[test]
fn the_state_transfer_bench_brings_a_replica_back_by_difference_despite_wrong_chunks() {
    let _one_cluster = CLUSTER.lock().unwrap_or_else(|e| e.into_inner());
    let run = || {
        upright(&[
            "bench",
            "--workload",
            "state-transfer",
            "--objects",
            "50000",
            "--object-bytes",
            "512",
            "--writes",
            "2000",
        ])
    };
    let (code, out, err) = run();
    assert_eq!(code, 0, "{out}\n{err}");
    let line = |prefix: &str| {
        out.lines()
            .find(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("no {prefix:?} line in {out}\n{err}"))
            .to_string()
    };
    let checkpoint = line("checkpoint after 1000 changed objects: ");
    let numbers = |line: &str| -> Vec<f64> {
        line.split(|c: char| !(c.is_ascii_digit() || c == '.'))
            .filter_map(|t| t.parse().ok())
            .collect()
    };
    let [_, x, y] = numbers(&checkpoint)[..] else {
        panic!("expected three numbers: {checkpoint}")
    };
    assert!(
        x < y,
        "an incremental checkpoint costs less than a whole one: {checkpoint}"
    );
    let transfer = line("state transfer: ");
    let [b, s, _] = numbers(&transfer)[..] else {
        panic!("expected three numbers: {transfer}")
    };
    assert!(s >= 50_000.0 * 512.0, "{transfer}");
    // At most the 2,200 written objects (plus tree nodes), far from the whole state.
    assert!(b > 0.0 && b < s * 0.25, "{transfer}");
    assert!(err.contains("agree on checkpoint"), "{err}");
    assert!(
        !err.contains(" 0 wrong answers refused"),
        "the lying replica was asked and caught: {err}"
    );
    // Then replica 1 recovers proactively under the writers' load: it checks its state against
    // a certified checkpoint by difference, not by fetching all of it.
    let recovery = line("proactive recovery of replica 1: ");
    let [_, secs, fetched, _, state] = numbers(&recovery)[..] else {
        panic!("expected five numbers: {recovery}")
    };
    assert!(secs > 0.0 && secs < 60.0, "{recovery}");
    assert!(fetched < state * 0.25, "{recovery}");
}

/// `upright bench --attack`: a real replica process runs the simulator's slow primary. With
/// the defences on the primary watch replaces it and throughput stays near the fault-free run
/// of the same invocation; with them off (PBFT's timer alone) it falls to almost nothing. A
/// replica flooding its peers is cut off. The JSON has one object per attack with the named
/// fields.
#[test]
fn the_attack_bench_shows_the_slow_primary_replaced_only_with_the_defences_on() {
    let _one_cluster = CLUSTER.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let ratio = |defences: &str| {
        let json = dir.path().join(format!("attack-{defences}.json"));
        // With the defences on, a replica flooding its peers with refused messages too: the
        // others cut it off.
        let attacks = if defences == "on" {
            "slow-primary,flood-peers"
        } else {
            "slow-primary"
        };
        let (code, out, err) = upright(&[
            "bench",
            "--attack",
            attacks,
            "--defences",
            defences,
            "--clients",
            "4",
            "--duration",
            "2s",
            "--warmup",
            "1s",
            "--json",
            json.to_str().unwrap(),
        ]);
        assert_eq!(code, 0, "{out}\n{err}");
        assert!(
            out.contains(&format!("ATTACK slow-primary defences={defences}: ")),
            "{out}"
        );
        let text = std::fs::read_to_string(&json).unwrap();
        assert!(text.starts_with('['), "{text}");
        assert_eq!(text.matches("\"attack\": \"slow-primary\"").count(), 1, "{text}");
        assert_eq!(
            text.matches("\"attack\": ").count(),
            attacks.split(',').count(),
            "{text}"
        );
        for field in ["throughput_ops_per_s", "fault_free_ops_per_s"] {
            assert!(text.contains(&format!("\"{field}\": ")), "{text}");
        }
        assert!(dir.path().join(format!("attack-{defences}-over-time.svg")).exists());
        if defences == "on" {
            let flood = text
                .lines()
                .find(|l| l.contains("\"attack\": \"flood-peers\""))
                .unwrap();
            assert!(!flood.contains("\"peer_cut_offs\": 0,"), "{flood}");
        }
        let at = text.find("\"ratio\": ").unwrap() + "\"ratio\": ".len();
        let end = text[at..].find(',').unwrap();
        text[at..at + end].parse::<f64>().unwrap()
    };
    let on = ratio("on");
    let off = ratio("off");
    assert!(on > 0.6, "defences on: {on}");
    assert!(off < 0.3, "defences off: {off}");
}

#[test]
fn hdfs_commands_fail_with_one_line_errors() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("client-8.toml");
    let missing = missing.to_str().unwrap();
    let blocks = dir.path().join("blocks");
    one_line_error(
        &["datanode", "--client", missing, "--dir", blocks.to_str().unwrap()],
        "cannot read",
    );
    one_line_error(&["hdfs", "--client", missing], "cannot read");
    one_line_error(
        &["hdfs-bench", "--url", "https://127.0.0.1:9870"],
        "is not an http:// URL",
    );
    // Nothing listens on port 1: the first write says where it failed.
    one_line_error(
        &[
            "hdfs-bench",
            "--url",
            "http://127.0.0.1:1",
            "--file-mib",
            "1",
            "--clients",
            "1",
        ],
        "write phase failed",
    );
}

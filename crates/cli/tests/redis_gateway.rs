//! `upright redis` serving redis-cli from a cluster set up the way a user sets one up: `upright
//! init`, four `upright replica --service redis` processes (replica 2 a Byzantine stand-in that
//! corrupts its stored values and replies), and the standalone gateway. The gateway is then
//! SIGKILLed and restarted: its pool members continue their request ids from their files, so the
//! cluster keeps answering them (a reused id would be taken for a replay and never executed).
//!
//! Needs `redis-cli` (Debian `redis-tools`, which `.ci/run` installs); skipped, loudly, without it.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[path = "common/redis_cli.rs"]
mod redis_cli;
use redis_cli::{cli, have};

#[path = "common/cluster.rs"]
mod cluster;
#[path = "common/demo.rs"]
mod demo;
use cluster::Proc;

/// A base port whose cluster ports and `base + 300` (the gateway) are free.
fn free_base() -> u16 {
    cluster::free_base(22_000, 1)
}

fn upright(dir: &Path, args: &[&str], log: &str) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_upright"));
    command.args(args).stdin(Stdio::null());
    let log = std::fs::File::create(dir.join(log)).unwrap();
    command.stdout(log.try_clone().unwrap()).stderr(log);
    command
}

/// Starts the gateway and waits for its banner.
fn start_gateway(dir: &Path, port: u16) -> Proc {
    start_gateway_with(dir, port, &[])
}

/// Starts the gateway with `extra` arguments and waits for its banner.
fn start_gateway_with(dir: &Path, port: u16, extra: &[&str]) -> Proc {
    let mut child = Command::new(env!("CARGO_BIN_EXE_upright"))
        .args(["redis", "--client"])
        .arg(dir.join("client-0.toml"))
        .args(["--listen", &format!("127.0.0.1:{port}"), "--pool", "2"])
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start upright redis");
    let stdout = child.stdout.take().unwrap();
    let mut lines = BufReader::new(stdout).lines();
    let first = lines.next().expect("a banner line").unwrap();
    println!("gateway: {first}");
    assert!(
        first.starts_with(&format!("Redis protocol (RESP2/RESP3) on 127.0.0.1:{port}")),
        "{first}"
    );
    std::thread::spawn(move || lines.map_while(Result::ok).for_each(|l| println!("gateway: {l}")));
    Proc(child)
}

/// Starts the four `upright replica --service redis` processes of `config`, replica 2 a
/// Byzantine stand-in that corrupts its stored values and replies.
fn start_replicas(dir: &Path, config: &str) -> Vec<Proc> {
    (0..4)
        .map(|id| {
            let id = id.to_string();
            let args = ["replica", "--config", config, "--id", &id, "--service", "redis"];
            let mut c = upright(dir, &args, &format!("replica-{id}.log"));
            c.env("UPRIGHT_TEST_CORRUPT_REPLICA", "2");
            Proc(c.spawn().unwrap())
        })
        .collect()
}

/// Retries a command until the cluster has elected and answered (replicas start in any order).
fn cli_when_up(port: u16, args: &[&str], want: &str) {
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        let got = cli(port, args);
        if got == want {
            return;
        }
        assert!(Instant::now() < until, "redis-cli {args:?}: {got:?}, wanted {want:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn redis_cli_through_upright_redis_against_an_initialised_cluster() {
    if !have("redis-cli") {
        eprintln!(
            "\n\n*** SKIPPED upright redis test: redis-cli is not installed (apt-get install redis-tools) ***\n\n"
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let base = free_base();
    let config = cluster::init(dir, base);
    let _replicas = start_replicas(dir, &config);
    let port = base + 300;
    let gateway = start_gateway(dir, port);
    cli_when_up(port, &["SET", "gw:a", "hello"], "OK");
    assert_eq!(cli(port, &["GET", "gw:a"]), "hello");
    assert_eq!(cli(port, &["APPEND", "gw:a", " world"]), "11");
    assert_eq!(cli(port, &["INCRBY", "gw:n", "5"]), "5");
    assert_eq!(cli(port, &["MGET", "gw:a", "gw:none", "gw:n"]), "hello world\n\n5");
    assert_eq!(cli(port, &["PING"]), "PONG");
    let info = cli(port, &["INFO"]);
    assert!(info.contains("upright_client_pool:2"), "{info}");

    // SIGKILL the gateway mid-life and start it again: its members' next ids follow the ones the
    // cluster has executed, so new writes are executed, not ignored as replays.
    drop(gateway);
    for member in ["client-0", "client-1"] {
        assert!(
            dir.join(format!("{member}.last-request-id")).exists(),
            "{member} keeps its request id"
        );
    }
    let _gateway = start_gateway(dir, port);
    cli_when_up(port, &["INCRBY", "gw:n", "5"], "10");
    assert_eq!(cli(port, &["SET", "gw:after", "restart"]), "OK");
    assert_eq!(cli(port, &["GET", "gw:after"]), "restart");
    assert_eq!(cli(port, &["GET", "gw:a"]), "hello world");

    large_commands_stream_to_the_cluster(port);
    users_select_identities_and_commands(dir, base + 301);

    // The Byzantine stand-in really ran.
    let log = std::fs::read_to_string(dir.join("replica-2.log")).unwrap();
    assert!(log.contains("corrupts its stored values and replies"), "{log}");
}

/// The gateway's `upright_operations` (operations its pool sent to the cluster).
fn operations_sent(port: u16) -> u64 {
    let info = cli(port, &["INFO"]);
    let line = info.lines().find(|l| l.starts_with("upright_operations:")).unwrap();
    line["upright_operations:".len()..].trim().parse().unwrap()
}

/// A large command goes to the cluster piece by piece while the client is still sending it (the
/// gateway does not hold it whole), runs once it ends, and one cut short runs nothing.
fn large_commands_stream_to_the_cluster(port: u16) {
    use std::io::{Read, Write};
    const LEN: usize = 24 << 20;
    let value: Vec<u8> = (0..LEN).map(|i| b'a' + (i % 26) as u8).collect();
    let head = format!("*3\r\n$3\r\nSET\r\n$10\r\nstream:big\r\n${LEN}\r\n");
    let mut conn = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    let before = operations_sent(port);
    conn.write_all(head.as_bytes()).unwrap();
    conn.write_all(&value[..LEN / 2]).unwrap();
    // Half sent: its pieces (512 KiB each) reach the cluster before the rest is written.
    let deadline = Instant::now() + Duration::from_secs(60);
    while operations_sent(port) < before + 16 {
        assert!(Instant::now() < deadline, "the first half was not streamed");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(cli(port, &["EXISTS", "stream:big"]), "0", "nothing runs before the end");
    conn.write_all(&value[LEN / 2..]).unwrap();
    conn.write_all(b"\r\n*2\r\n$6\r\nSTRLEN\r\n$10\r\nstream:big\r\n")
        .unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    let want = format!("+OK\r\n:{LEN}\r\n");
    let mut got = vec![0u8; want.len()];
    conn.read_exact(&mut got).unwrap();
    assert_eq!(String::from_utf8_lossy(&got), want, "the SET and the command after it");
    let middle = cli(
        port,
        &[
            "GETRANGE",
            "stream:big",
            &(LEN / 2 - 5).to_string(),
            &(LEN / 2 + 4).to_string(),
        ],
    );
    assert_eq!(middle.as_bytes(), &value[LEN / 2 - 5..LEN / 2 + 5]);

    // Cut short: the connection closes halfway; nothing is set.
    let mut cut = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    cut.write_all(head.replace("stream:big", "stream:cut").as_bytes())
        .unwrap();
    cut.write_all(&value[..LEN / 2]).unwrap();
    drop(cut);
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(cli(port, &["EXISTS", "stream:cut"]), "0");
    assert_eq!(cli(port, &["DEL", "stream:big"]), "1");
}

/// redis-cli as `user` (password `password`), or unauthenticated: its output, error or not.
fn cli_as(port: u16, auth: Option<(&str, &str)>, args: &[&str]) -> String {
    let mut command = Command::new("redis-cli");
    command.args(["-p", &port.to_string(), "--no-auth-warning"]);
    if let Some((user, password)) = auth {
        command.args(["--user", user, "--pass", password]);
    }
    let out = command.args(args).output().expect("run redis-cli");
    (String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr))
        .trim_end()
        .to_string()
}

/// A second gateway with two users (`--users`): each authenticates with its own password, runs
/// only its own commands, and its writes reach the cluster under its own client identity.
fn users_select_identities_and_commands(dir: &Path, port: u16) {
    let users = dir.join("users.toml");
    std::fs::write(
        &users,
        "[[user]]\nname = \"app\"\npassword = \"app-secret\"\nclient = \"client-2.toml\"\ncommands = [\"@all\", \"-@admin\"]\n\n\
         [[user]]\nname = \"viewer\"\npassword = \"viewer-secret\"\nclient = \"client-3.toml\"\ncommands = [\"@read\", \"ping\"]\n",
    )
    .unwrap();
    let _gateway = start_gateway_with(dir, port, &["--users", users.to_str().unwrap()]);
    let app = Some(("app", "app-secret"));
    let viewer = Some(("viewer", "viewer-secret"));
    let until = Instant::now() + Duration::from_secs(60);
    while cli_as(port, app, &["SET", "users:k", "v"]) != "OK" {
        assert!(Instant::now() < until, "the users' gateway never answered");
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(
        cli_as(port, None, &["GET", "users:k"]),
        "NOAUTH Authentication required."
    );
    assert!(
        cli_as(port, Some(("app", "wrong")), &["GET", "users:k"]).contains("WRONGPASS"),
        "a wrong password is refused"
    );
    assert_eq!(cli_as(port, viewer, &["GET", "users:k"]), "v");
    // redis-cli -3 authenticates with HELLO 3 AUTH.
    let hello = Command::new("redis-cli")
        .args([
            "-3",
            "-p",
            &port.to_string(),
            "--no-auth-warning",
            "--user",
            "viewer",
            "--pass",
            "viewer-secret",
        ])
        .args(["GET", "users:k"])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&hello.stdout).trim_end(), "v", "{hello:?}");
    assert_eq!(
        cli_as(port, viewer, &["SET", "users:k", "w"]),
        "NOPERM User viewer has no permissions to run the 'set' command"
    );
    assert_eq!(
        cli_as(port, app, &["FLUSHALL"]),
        "NOPERM User app has no permissions to run the 'flushall' command"
    );
    assert_eq!(cli_as(port, app, &["GET", "users:k"]), "v", "nothing was flushed");
    // Each user's commands travel through its own pool (its own client identity).
    let operations = |user: &str| -> u64 {
        let info = cli_as(port, app, &["INFO"]);
        let line = info
            .lines()
            .find(|l| l.starts_with(&format!("upright_user_{user}:")))
            .unwrap_or_else(|| panic!("no line for {user} in {info}"));
        line.split("operations=").nth(1).unwrap().trim().parse().unwrap()
    };
    let (app_before, viewer_before) = (operations("app"), operations("viewer"));
    assert_eq!(cli_as(port, app, &["SET", "users:k2", "x"]), "OK");
    assert!(
        operations("app") > app_before,
        "the app's write went through the app's pool"
    );
    assert_eq!(operations("viewer"), viewer_before, "and not through the viewer's");
}

/// A counter of replica `id`'s `GET /status` (its metrics address from cluster.toml).
fn status_counter(dir: &Path, id: usize, name: &str) -> u64 {
    let toml = std::fs::read_to_string(dir.join("cluster.toml")).unwrap();
    let addr = toml
        .lines()
        .filter_map(|l| l.strip_prefix("metrics_addr = \""))
        .nth(id)
        .and_then(|a| a.strip_suffix('"'))
        .expect("metrics_addr in cluster.toml")
        .to_string();
    demo::status_counter_at(&addr, name)
}

/// Selective execution with the Redis store, as a user runs it (`upright init
/// --selective-execution`, four `upright replica --service redis`, replica 2 a Byzantine stand-in
/// that corrupts its stored values, replies and key states): redis-py's checks of every data
/// type, expiry, pipelines, MULTI/EXEC and pub/sub pass, what selective execution refuses is
/// refused with an error that says so, and the correct execution replicas skipped requests.
#[test]
fn redis_clients_against_a_selective_cluster_with_a_lying_replica() {
    if !have("redis-cli") {
        eprintln!(
            "\n\n*** SKIPPED selective redis test: redis-cli is not installed (apt-get install redis-tools) ***\n\n"
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let base = cluster::free_base(22_050, 1); // beside the other test's (they run at once)
    let (config, _) = cluster::init_with(dir, base, &["--selective-execution"]);
    let _replicas = start_replicas(dir, &config);
    let port = base + 300;
    let _gateway = start_gateway(dir, port);
    cli_when_up(port, &["SET", "sel:up", "yes"], "OK");
    demo::run_python_checks(
        "redis_selective.py",
        port,
        "python redis client under selective execution (pip install redis)",
    );
    // Both correct execution replicas skipped requests on keys they do not maintain (stage
    // counters reach /status a moment later).
    let until = Instant::now() + Duration::from_secs(10);
    for id in [0, 1] {
        while status_counter(dir, id, "stat_exec_requests_skipped") == 0 {
            assert!(Instant::now() < until, "replica {id} skipped nothing");
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    let log = std::fs::read_to_string(dir.join("replica-2.log")).unwrap();
    assert!(log.contains("corrupts its stored values and replies"), "{log}");
}

//! Real Redis clients against `upright demo` (four replicas and the Redis gateway) in which
//! replica 2 is Byzantine: its store corrupts every value it stores and every reply it gives
//! (`UPRIGHT_TEST_CORRUPT_REPLICA=2`). Every read checked here must still be correct.
//!
//! Needs `redis-cli`, `redis-benchmark` (Debian `redis-tools`) and Python's `redis` package
//! (`.ci/run` installs them); skipped, loudly, only if `redis-cli` is missing.

use std::io::{Read, Write};
use std::process::Command;
use std::time::{Duration, Instant};

#[path = "common/redis_cli.rs"]
mod redis_cli;
use redis_cli::{cli, have};

#[path = "common/demo.rs"]
mod demo;
use demo::{free_port, start_demo, Demo};

fn redis_cli_round_trips(port: u16) {
    let cases: &[(&[&str], &str)] = &[
        (&["PING"], "PONG"),
        (&["SET", "cli:a", "hello"], "OK"),
        (&["GET", "cli:a"], "hello"),
        (&["APPEND", "cli:a", " world"], "11"),
        (&["GET", "cli:a"], "hello world"),
        (&["SET", "cli:a", "x", "NX"], ""),
        (&["INCR", "cli:n"], "1"),
        (&["INCRBY", "cli:n", "9"], "10"),
        (&["DECR", "cli:n"], "9"),
        (&["INCR", "cli:a"], "ERR value is not an integer or out of range"),
        (&["MSET", "cli:x", "1", "cli:y", "2"], "OK"),
        (&["MGET", "cli:x", "cli:nope", "cli:y"], "1\n\n2"),
        (&["SET", "cli:t", "v", "EX", "100"], "OK"),
        (&["TTL", "cli:t"], "100"),
        (&["PERSIST", "cli:t"], "1"),
        (&["TTL", "cli:t"], "-1"),
        (&["EXISTS", "cli:x", "cli:y", "cli:nope"], "2"),
        (&["DEL", "cli:x", "cli:y"], "2"),
        (&["KEYS", "cli:*"], "cli:a\ncli:n\ncli:t"),
        (&["GET"], "ERR wrong number of arguments for 'get' command"),
        (
            &["FOO", "bar"],
            "ERR unknown command 'FOO', with args beginning with: 'bar'",
        ), // (trailing space trimmed)
        (
            &["SET", "cli:a", "1", "EX", "0"],
            "ERR invalid expire time in 'set' command",
        ),
        (&["SELECT", "0"], "OK"),
        (&["ECHO", "hi"], "hi"),
    ];
    for (args, want) in cases {
        assert_eq!(cli(port, args), *want, "redis-cli {args:?}");
    }
    // A value above the inline bound (16 KiB) is ordered by digest and fetched by the execution
    // members; one below it rides in the batch.
    for (key, len) in [("cli:big", 40_000), ("cli:mid", 2_000)] {
        let value: String = (0..len).map(|i| char::from(b'a' + (i % 26) as u8)).collect();
        assert_eq!(cli(port, &["SET", key, &value]), "OK");
        assert_eq!(cli(port, &["GET", key]), value, "GET {key}");
    }
    // RESP3 through HELLO.
    let hello = cli(port, &["-3", "HELLO", "3"]);
    assert!(hello.contains("proto") && hello.contains('3'), "{hello}");
}

fn malformed_input_closes_only_that_connection(port: u16) {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s.write_all(b"*1\r\n$-7\r\n").unwrap();
    let mut got = Vec::new();
    let _ = s.read_to_end(&mut got);
    assert_eq!(got, b"-ERR Protocol error: invalid bulk length\r\n");
    let mut big = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    big.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    big.write_all(b"*1\r\n$999999999\r\n").unwrap();
    let mut got = Vec::new();
    let _ = big.read_to_end(&mut got);
    assert!(got.starts_with(b"-ERR Protocol error"), "{got:?}");
    assert_eq!(cli(port, &["GET", "cli:n"]), "9");
}

fn python_client(port: u16) {
    demo::run_python_checks("redis_clients.py", port, "python redis client (pip install redis)");
}

fn benchmark(port: u16) {
    let out = Command::new("redis-benchmark")
        .args(["-p", &port.to_string(), "-t", "set,get,incr,mset", "-n", "2000", "-q"])
        .output()
        .expect("run redis-benchmark (apt-get install redis-tools)");
    let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    println!("{text}");
    assert!(out.status.success(), "redis-benchmark failed: {text}");
    let done: Vec<&str> = text
        .split(['\r', '\n'])
        .filter(|l| l.contains("requests per second"))
        .collect();
    assert_eq!(done.len(), 4, "expected four finished tests: {text}");
    assert!(!text.contains("ERR") && !text.contains("rror"), "{text}");
    // Every INCR of the benchmark counted exactly once; its 3-byte values are intact (the
    // corrupting replica would append to them).
    assert_eq!(cli(port, &["GET", "counter:__rand_int__"]), "2000");
    assert_eq!(cli(port, &["STRLEN", "key:__rand_int__"]), "3");
}

/// The demos of this file run one at a time (each starts its replicas; the machine may have two
/// cores, and the replica count checks look at every process).
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn real_redis_clients_against_a_cluster_with_a_byzantine_replica() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !have("redis-cli") {
        eprintln!(
            "\n\n*** SKIPPED real_redis_clients: redis-cli is not installed (apt-get install redis-tools) ***\n\n"
        );
        return;
    }
    let port = free_port();
    let demo = start_demo(port);
    redis_cli_round_trips(port);
    malformed_input_closes_only_that_connection(port);
    python_client(port);
    benchmark(port);
    // The Byzantine stand-in really ran: replica 2 said so in its log.
    let log = std::fs::read_to_string(&demo.log_dir).unwrap_or_default();
    assert!(
        log.contains("corrupts its stored values and replies"),
        "replica 2 did not run the corrupting store; log {}: {log}",
        demo.log_dir
    );
    stopped_by_sigterm_with_its_replicas(demo);
}

/// redis-cli, redis-py and redis-benchmark against `upright demo --protocol lcr` (three
/// replicas, u = 1, r = 0, ordering on LCR's ring): the clients cannot tell the protocols apart.
#[test]
fn real_redis_clients_against_an_lcr_cluster() {
    real_redis_clients_against("lcr", "3 replicas (u = 1, r = 0, lcr)", 3);
}

/// redis-cli, redis-py and redis-benchmark against `upright demo --protocol aliph` (four
/// replicas, u = r = 1): one client's round trips run in Quorum views, redis-benchmark's load
/// moves the cluster to Chain views; the clients see one Redis either way.
#[test]
fn real_redis_clients_against_an_aliph_cluster() {
    real_redis_clients_against("aliph", "4 replicas (u = 1, r = 1, aliph)", 4);
}

/// redis-cli, redis-py and redis-benchmark against `upright demo --protocol <protocol>`, whose
/// start line names `shape`, then SIGTERM, which must stop its `replicas` processes.
fn real_redis_clients_against(protocol: &str, shape: &str, replicas: usize) {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !have("redis-cli") {
        eprintln!("\n\n*** SKIPPED real_redis_clients ({protocol}): redis-cli is not installed ***\n\n");
        return;
    }
    let port = free_port();
    let demo = demo::start_demo_running(
        "redis",
        port,
        &format!("Redis protocol (RESP2/RESP3) on 127.0.0.1:{port}"),
        &["--protocol", protocol],
    );
    assert!(
        demo.lines.lock().unwrap().iter().any(|l| l.contains(shape)),
        "the demo ran {protocol}"
    );
    redis_cli_round_trips(port);
    python_client(port);
    benchmark(port);
    stopped_by_sigterm_with(demo, replicas);
}

/// `kill <demo>` (SIGTERM, what a service manager sends) stops the demo and its replica processes.
fn stopped_by_sigterm_with_its_replicas(demo: Demo) {
    stopped_by_sigterm_with(demo, 4);
}

/// [`stopped_by_sigterm_with_its_replicas`] for a demo of `expected` replica processes.
fn stopped_by_sigterm_with(mut demo: Demo, expected: usize) {
    let dir = std::path::Path::new(&demo.log_dir)
        .parent()
        .expect("replica log inside the demo directory")
        .display()
        .to_string();
    let replicas = || {
        std::fs::read_dir("/proc")
            .unwrap()
            .filter_map(|e| std::fs::read(e.ok()?.path().join("cmdline")).ok())
            .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
            .filter(|c| c.contains(" replica ") && c.contains(&dir))
            .count()
    };
    assert_eq!(replicas(), expected, "{expected} replica processes run from {dir}");
    unsafe { libc::kill(demo.child.id() as i32, libc::SIGTERM) };
    let until = Instant::now() + Duration::from_secs(15);
    while Instant::now() < until && !matches!(demo.child.try_wait(), Ok(Some(_))) {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        matches!(demo.child.try_wait(), Ok(Some(_))),
        "the demo exits on SIGTERM"
    );
    while Instant::now() < until && replicas() > 0 {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(replicas(), 0, "no replica of {dir} outlives the demo");
}

//! Real ZooKeeper clients against `upright demo --service zk` (four replicas and the ZooKeeper
//! gateway) in which replica 2 is Byzantine: every reply and every watch event it sends is wrong
//! (`UPRIGHT_TEST_CORRUPT_REPLICA=2`), and replica 3 is SIGKILLed while kazoo runs (the demo
//! restarts it and it catches up). Every answer checked here must still be right.
//!
//! Needs Python's `kazoo`, and for the Java CLI and the C client Debian's `zookeeper` and
//! `zookeeper-bin` (`.ci/run` installs them); each part is skipped, loudly, only if its client is
//! missing.

use std::io::{Read, Write};
use std::process::Command;
use std::time::Duration;

#[path = "common/demo.rs"]
mod demo;
use demo::{free_port, start_service_demo};

fn have_kazoo() -> bool {
    Command::new("python3")
        .args(["-c", "import kazoo"])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// A four-letter word and its answer.
fn four_letter_word(port: u16, word: &str) -> String {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(word.as_bytes()).unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

const ZKCLI: &str = "/usr/share/zookeeper/bin/zkCli.sh";
const C_CLIENT: &str = "/usr/lib/zookeeper/bin/cli_mt";

/// `zkCli.sh -server 127.0.0.1:PORT args...`: what it printed, without its connection chatter.
fn zkcli(port: u16, args: &[&str]) -> String {
    let out = Command::new(ZKCLI)
        .args(["-server", &format!("127.0.0.1:{port}")])
        .args(args)
        .output()
        .expect("run zkCli.sh");
    let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    text.lines()
        .filter(|l| {
            !l.is_empty()
                && !l.starts_with("WATCHER::")
                && !l.starts_with("WatchedEvent state:SyncConnected type:None")
                && !l.starts_with("Connecting to")
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// ZooKeeper's own command-line client (Java), scripted as an operator would use it.
fn java_cli(port: u16) {
    if !std::path::Path::new(ZKCLI).exists() {
        eprintln!("\n\n*** SKIPPED zkCli.sh checks: apt-get install zookeeper ***\n\n");
        return;
    }
    assert!(zkcli(port, &["create", "/cli", "hello"]).contains("Created /cli"));
    assert!(zkcli(port, &["ls", "/"]).contains("cli"), "ls");
    let got = zkcli(port, &["get", "-s", "/cli"]);
    assert!(
        got.contains("hello") && got.contains("dataVersion = 0") && got.contains("dataLength = 5"),
        "{got}"
    );
    zkcli(port, &["set", "/cli", "world"]);
    let stat = zkcli(port, &["stat", "/cli"]);
    assert!(
        stat.contains("dataVersion = 1") && stat.contains("dataLength = 5"),
        "{stat}"
    );
    assert!(zkcli(port, &["create", "-s", "/cli/seq-", "x"]).contains("Created /cli/seq-0000000000"));
    assert!(zkcli(port, &["delete", "/cli"]).contains("Node not empty: /cli"));
    assert!(zkcli(port, &["get", "/none"]).contains("Node does not exist: /none"));
    zkcli(port, &["deleteall", "/cli"]);
    assert!(zkcli(port, &["stat", "/cli"]).contains("Node does not exist: /cli"));
    zkcli(port, &["create", "/locked", "x"]);
    zkcli(port, &["setAcl", "/locked", "world:anyone:r"]);
    assert!(zkcli(port, &["set", "/locked", "y"]).contains("Insufficient permission : /locked"));
    assert!(zkcli(port, &["sync", "/"]).contains("Sync is OK"));
    println!("zkCli.sh: ok");
}

/// ZooKeeper's C client (`cli_mt`) connecting and reading.
fn c_client(port: u16) {
    if !std::path::Path::new(C_CLIENT).exists() {
        eprintln!("\n\n*** SKIPPED C client checks: apt-get install zookeeper-bin ***\n\n");
        return;
    }
    zkcli(port, &["create", "/for-c", "from-java"]);
    let mut child = Command::new(C_CLIENT)
        .arg(format!("127.0.0.1:{port}"))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run cli_mt");
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"ls /\nget /for-c\n").unwrap();
    std::thread::sleep(Duration::from_secs(2));
    stdin.write_all(b"quit\n").unwrap();
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(text.contains("state = CONNECTED_STATE"), "{text}");
    assert!(text.contains("\tfor-c") && text.contains("from-java"), "{text}");
    println!("C client: ok");
}

/// kazoo's checks (`zk_clients.py`) against the demo's gateway on `port`, with replica `victim`
/// SIGKILLed 1.5 s in; they pass and the demo restarts the replica.
fn kazoo_while_killing(demo: &demo::Demo, port: u16, victim: u32) {
    let kazoo = std::thread::spawn(move || demo::run_python_checks("zk_clients.py", port, "kazoo"));
    std::thread::sleep(Duration::from_millis(1_500));
    assert!(demo.kill_replica(victim), "replica {victim}'s process not found");
    let stdout = kazoo.join().expect("kazoo checks");
    assert!(stdout.contains("kazoo: all checks passed"));
    assert!(
        demo.wait_for_line(&format!("replica {victim} restarted"), Duration::from_secs(30)),
        "the demo did not restart replica {victim}"
    );
}

/// The demos of this file run one at a time (each starts its replicas on a two-core machine).
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn kazoo_through_the_zookeeper_gateway_with_a_lying_replica() {
    if !have_kazoo() {
        eprintln!("\n\n*** SKIPPED upright-zk client test: python3 -m pip install kazoo ***\n\n");
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let port = free_port();
    let demo = start_service_demo("zk", port, &format!("ZooKeeper protocol on 127.0.0.1:{port}"));
    assert_eq!(four_letter_word(port, "ruok"), "imok");
    assert!(four_letter_word(port, "srvr").contains("Zookeeper version"));
    assert!(four_letter_word(port, "mntr").contains("zk_server_state"));
    java_cli(port);
    c_client(port);
    // kazoo's checks run while replica 3 is SIGKILLed and restarted.
    kazoo_while_killing(&demo, port, 3);
    // The Byzantine stand-in really ran.
    let log = std::fs::read_to_string(&demo.log_dir).unwrap_or_default();
    assert!(log.contains("corrupts its replies and pushed events"), "{log}");
}

/// kazoo against `upright demo --service zk --protocol lcr` (three replicas, u = 1, r = 0), with
/// replica 1 SIGKILLed and restarted while it runs: sessions, watches and ephemerals on LCR's
/// ring (its wake-ups expire sessions).
#[test]
fn kazoo_through_the_zookeeper_gateway_on_lcr() {
    if !have_kazoo() {
        eprintln!("\n\n*** SKIPPED upright-zk client test (lcr): python3 -m pip install kazoo ***\n\n");
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let port = free_port();
    let demo = demo::start_demo_running(
        "zk",
        port,
        &format!("ZooKeeper protocol on 127.0.0.1:{port}"),
        &["--protocol", "lcr"],
    );
    assert_eq!(four_letter_word(port, "ruok"), "imok");
    kazoo_while_killing(&demo, port, 1);
}

/// kazoo against `upright demo --service zk --selective-execution` (each znode maintained by
/// two of the four execution replicas, replica 2 a Byzantine stand-in lying in every reply and
/// event), with replica 3 SIGKILLed and restarted while it runs: sessions, watches (each node's
/// events in its own push stream, written before the data they announce), ephemerals, expiry
/// and the recipes pass, and the correct replicas skipped requests on znodes they do not keep.
/// (Its own demo, with a free port; about 20 s.)
#[test]
fn kazoo_through_the_zookeeper_gateway_under_selective_execution() {
    if !have_kazoo() {
        eprintln!("\n\n*** SKIPPED upright-zk client test (selective): python3 -m pip install kazoo ***\n\n");
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let port = free_port();
    let demo = demo::start_demo_running(
        "zk",
        port,
        &format!("ZooKeeper protocol on 127.0.0.1:{port}"),
        &["--selective-execution", "--env", "UPRIGHT_TEST_CORRUPT_REPLICA=2"],
    );
    kazoo_while_killing(&demo, port, 3);
    // Which correct replica skips how much depends on where the test's paths are placed (a
    // top-level create also touches the root); together they skip some.
    let until = std::time::Instant::now() + Duration::from_secs(10);
    let skipped = || [0, 1].map(|id| demo.status_counter(id, "stat_exec_requests_skipped"));
    while skipped().iter().sum::<u64>() == 0 {
        assert!(
            std::time::Instant::now() < until,
            "the correct replicas skipped nothing"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    println!("requests skipped by replicas 0 and 1: {:?}", skipped());
    let log = std::fs::read_to_string(&demo.log_dir).unwrap_or_default();
    assert!(log.contains("corrupts its replies and pushed events"), "{log}");
}

//! Real ZooKeeper clients against `upright demo --service zk` (four replicas and the ZooKeeper
//! gateway) in which replica 2 is Byzantine: every reply and every watch event it sends is wrong
//! (`UPRIGHT_TEST_CORRUPT_REPLICA=2`). Every answer checked here must still be right.
//!
//! Needs Python's `kazoo` (`.ci/run` installs it); skipped, loudly, only if it is missing.

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

#[test]
fn kazoo_through_the_zookeeper_gateway_with_a_lying_replica() {
    if !have_kazoo() {
        eprintln!("\n\n*** SKIPPED upright-zk client test: python3 -m pip install kazoo ***\n\n");
        return;
    }
    let port = free_port();
    let demo = start_service_demo("zk", port, &format!("ZooKeeper protocol on 127.0.0.1:{port}"));
    assert_eq!(four_letter_word(port, "ruok"), "imok");
    assert!(four_letter_word(port, "srvr").contains("Zookeeper version"));
    assert!(four_letter_word(port, "mntr").contains("zk_server_state"));
    let stdout = demo::run_python_checks("zk_clients.py", port, "kazoo");
    assert!(stdout.contains("kazoo: all checks passed"));
    // The Byzantine stand-in really ran.
    let log = std::fs::read_to_string(&demo.log_dir).unwrap_or_default();
    assert!(log.contains("corrupts its replies and pushed events"), "{log}");
}

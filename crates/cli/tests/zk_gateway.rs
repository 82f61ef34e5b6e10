//! `upright zk` the way a user runs it: `upright init`, four `upright replica --service zk`
//! processes (replica 2 a Byzantine stand-in that lies in every reply and event), and two
//! standalone gateways with their own client identities. A kazoo client given both gateways keeps
//! its session, its ephemeral node and its watch when the gateway it uses is SIGKILLed, while a
//! replica is SIGKILLed and restarted too.
//!
//! Needs Python's `kazoo` (`.ci/run` installs it); skipped, loudly, without it.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

#[path = "common/cluster.rs"]
mod cluster;
use cluster::Proc;

fn replica(dir: &Path, config: &str, id: u32) -> Proc {
    cluster::replica(dir, config, id, "zk")
}

/// Starts `upright zk` with client identity `client` and waits for its banner.
fn gateway(dir: &Path, client: u32, port: u16) -> Proc {
    let mut child = Command::new(env!("CARGO_BIN_EXE_upright"))
        .args(["zk", "--client"])
        .arg(dir.join(format!("client-{client}.toml")))
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start upright zk");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = lines.next().expect("a banner line").unwrap();
    assert!(
        first.starts_with(&format!("ZooKeeper protocol on 127.0.0.1:{port}")),
        "{first}"
    );
    std::thread::spawn(move || {
        lines
            .map_while(Result::ok)
            .for_each(|l| println!("gateway {client}: {l}"))
    });
    Proc(child)
}

#[test]
fn a_session_moves_between_gateways_when_one_is_killed() {
    if !Command::new("python3")
        .args(["-c", "import kazoo"])
        .output()
        .is_ok_and(|o| o.status.success())
    {
        eprintln!("\n\n*** SKIPPED upright zk gateway test: python3 -m pip install kazoo ***\n\n");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let base = cluster::free_base(23_000, 2);
    let config = cluster::init(dir, base);
    let mut replicas: Vec<Proc> = (0..4).map(|id| replica(dir, &config, id)).collect();
    let (port_a, port_b) = (base + 300, base + 301);
    let a = gateway(dir, 0, port_a);
    let _b = gateway(dir, 1, port_b);
    // A replica SIGKILLed as the clients start, and restarted while they run.
    drop(replicas.remove(3));
    let restarter = {
        let dir = dir.to_path_buf();
        let config = config.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(700));
            replica(&dir, &config, 3)
        })
    };
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/zk_failover.py");
    let out = Command::new("python3")
        .arg(script)
        .args([port_a.to_string(), port_b.to_string(), a.0.id().to_string()])
        .output()
        .expect("run python3");
    let stdout = String::from_utf8_lossy(&out.stdout);
    print!("{stdout}");
    assert!(
        out.status.success() && stdout.contains("failover: ok"),
        "failover checks failed: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    replicas.push(restarter.join().unwrap());
    let log = std::fs::read_to_string(dir.join("replica-2.log")).unwrap();
    assert!(log.contains("corrupts its replies and pushed events"), "{log}");
}

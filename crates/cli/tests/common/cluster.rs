//! A cluster set up the way a user sets one up (`upright init` on loopback, then replica
//! processes), for the tests of the standalone gateways.
#![allow(dead_code)]

use std::path::Path;
use std::process::{Child, Command, Stdio};

/// A child process that is SIGKILLed when dropped.
pub struct Proc(pub Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Whether nothing listens on the loopback `port`.
pub fn port_free(port: u16) -> bool {
    std::net::TcpListener::bind(("127.0.0.1", port)).is_ok()
}

/// A base port at or above `from` whose replica, client and metrics ports (`base + i`,
/// `base + 100 + i`, `base + 200 + i` for four replicas) and `base + 300 .. base + 300 + extra`
/// (gateways) are free.
pub fn free_base(from: u16, extra: u16) -> u16 {
    let start = std::process::id().wrapping_mul(7919) % 80;
    (0..80)
        .map(|i| from + ((start + i) % 80) as u16 * 400)
        .find(|&b| {
            (0..4).all(|i| [b + i, b + 100 + i, b + 200 + i].into_iter().all(port_free))
                && (0..extra).all(|g| port_free(b + 300 + g))
        })
        .expect("free loopback ports")
}

/// `upright init` of four replicas (u = r = 1) and four clients on 127.0.0.1 from `base` into
/// `dir`; the path of its cluster.toml.
pub fn init(dir: &Path, base: u16) -> String {
    init_with(dir, base, &[]).0
}

/// [`init`] with `extra` arguments; the path of its cluster.toml and what it printed.
pub fn init_with(dir: &Path, base: u16, extra: &[&str]) -> (String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_upright"))
        .args([
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
            "4",
        ])
        .args(extra)
        .args(["--base-port", &base.to_string(), "--out"])
        .arg(dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "upright init: {out:?}");
    let printed = String::from_utf8_lossy(&out.stdout).to_string();
    (dir.join("cluster.toml").display().to_string(), printed)
}

/// Runs `program` with `args` (at most 120 s) and checks that it succeeded; its output.
pub fn run(program: &str, args: &[&str]) -> std::process::Output {
    let out = Command::new("timeout")
        .arg("120")
        .arg(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("run {program}: {e}"));
    assert!(
        out.status.success(),
        "{program} {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// `upright replica --id ID --service SERVICE` of the cluster at `config`, logging to
/// `replica-<id>.log` in `dir`; replica 2 is the Byzantine stand-in that lies in every reply
/// (`UPRIGHT_TEST_CORRUPT_REPLICA`).
pub fn replica(dir: &Path, config: &str, id: u32, service: &str) -> Proc {
    let log = std::fs::File::create(dir.join(format!("replica-{id}.log"))).unwrap();
    let mut c = Command::new(env!("CARGO_BIN_EXE_upright"));
    c.args([
        "replica",
        "--config",
        config,
        "--id",
        &id.to_string(),
        "--service",
        service,
    ])
    .env("UPRIGHT_TEST_CORRUPT_REPLICA", "2")
    .stdin(Stdio::null())
    .stdout(log.try_clone().unwrap())
    .stderr(log);
    Proc(c.spawn().unwrap())
}

/// `upright KIND --client client-0.toml --listen 127.0.0.1:PORT` (a standalone gateway of the
/// cluster in `dir`), logging to `KIND-gateway.log`, once it accepts connections.
pub fn gateway(dir: &Path, kind: &str, port: u16) -> Proc {
    let log = std::fs::File::create(dir.join(format!("{kind}-gateway.log"))).unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_upright"))
        .args([kind, "--client"])
        .arg(dir.join("client-0.toml"))
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap_or_else(|e| panic!("start upright {kind}: {e}"));
    let gateway = Proc(child);
    let up = (0..200).any(|_| {
        std::thread::sleep(std::time::Duration::from_millis(50));
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
    assert!(up, "upright {kind} listens on {port}");
    gateway
}

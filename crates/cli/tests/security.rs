//! What keeps strangers out, the way a user sets it up.
//!
//! Gateways over TLS: `upright init`, four `upright replica` processes,
//! and the standalone gateway given `--tls-cert` and `--tls-key` (a certificate `openssl` makes
//! here). Clients nobody here wrote connect with TLS and work: `redis-cli --tls` and redis-py
//! (`ssl=True`) through `upright redis`, kazoo (`use_ssl=True`) through `upright zk`, each
//! checking the gateway's certificate. A plain-text client gets no answer, and a client that
//! connects and never starts its handshake holds up nobody.
//!
//! Needs openssl, redis-cli, redis-py and kazoo (`.ci/run` installs them); skipped, loudly,
//! without them.
//!
//! The metrics token: `upright init --metrics-token`, and the replicas' metrics endpoints answer
//! only requests that carry it, which `upright status` does.

use std::io::Read;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

#[path = "common/cluster.rs"]
mod cluster;
use cluster::Proc;

/// A self-signed certificate for 127.0.0.1 and its key, in `dir`.
fn certificate(dir: &Path) -> (PathBuf, PathBuf) {
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    let out = Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ])
        .args(["-days", "2", "-subj", "/CN=localhost"])
        .args(["-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost", "-keyout"])
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output()
        .expect("run openssl");
    assert!(
        out.status.success(),
        "openssl: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (cert, key)
}

/// `upright KIND --client client-0.toml --listen 127.0.0.1:PORT --tls-cert CERT --tls-key KEY`,
/// once it accepts connections.
fn gateway(kind: &str, dir: &Path, port: u16, tls: &(PathBuf, PathBuf)) -> Proc {
    let log = std::fs::File::create(dir.join(format!("{kind}-gateway.log"))).unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_upright"))
        .args([kind, "--client"])
        .arg(dir.join("client-0.toml"))
        .args(["--listen", &format!("127.0.0.1:{port}"), "--tls-cert"])
        .arg(&tls.0)
        .arg("--tls-key")
        .arg(&tls.1)
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("start the gateway");
    let listening = (0..200).any(|_| {
        std::thread::sleep(Duration::from_millis(50));
        TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
    assert!(listening, "upright {kind} listens on {port}");
    Proc(child)
}

fn have(program: &str, args: &[&str]) -> bool {
    Command::new(program)
        .args(args)
        .output()
        .is_ok_and(|o| o.status.success())
}

/// What `program args` printed, trimmed (it must succeed).
fn run(program: &str, args: &[&str]) -> String {
    let out = cluster::run(program, args);
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Four replicas of `service` in `dir` from `base`.
fn replicas(dir: &Path, base: u16, service: &str) -> Vec<Proc> {
    let config = cluster::init(dir, base);
    (0..4).map(|id| cluster::replica(dir, &config, id, service)).collect()
}

#[test]
fn redis_and_zookeeper_clients_reach_the_gateways_over_tls() {
    let tools = have("openssl", &["version"])
        && have("redis-cli", &["--version"])
        && have("python3", &["-c", "import redis, kazoo"]);
    if !tools {
        eprintln!("\n\n*** SKIPPED gateway TLS test: needs openssl, redis-cli, and python3 -m pip install redis kazoo ***\n\n");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let tls = certificate(dir.path());
    let cert = tls.0.to_str().unwrap().to_string();

    // Redis: redis-cli and redis-py over TLS.
    let redis_dir = dir.path().join("redis");
    std::fs::create_dir(&redis_dir).unwrap();
    let base = cluster::free_base(25_100, 1);
    let _redis_replicas = replicas(&redis_dir, base, "redis");
    let port = base + 300;
    let _redis = gateway("redis", &redis_dir, port, &tls);
    // A client that connects and never starts its handshake.
    let mut silent = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let p = port.to_string();
    let tls_cli = |args: &[&str]| {
        let mut all = vec!["--tls", "--cacert", &cert, "-p", &p];
        all.extend_from_slice(args);
        run("redis-cli", &all)
    };
    assert_eq!(tls_cli(&["SET", "over-tls", "yes"]), "OK");
    assert_eq!(tls_cli(&["GET", "over-tls"]), "yes");
    let script = format!(
        "import redis\nr = redis.Redis(host='127.0.0.1', port={port}, ssl=True, ssl_ca_certs='{cert}')\n\
         r.set('py', 'tls')\nprint(r.get('py').decode(), r.get('over-tls').decode())"
    );
    assert_eq!(run("python3", &["-c", &script]), "tls yes");
    // Plain text gets no Redis answer (the gateway waits for a TLS ClientHello).
    let plain = Command::new("timeout")
        .args(["5", "redis-cli", "-p", &p, "PING"])
        .output()
        .unwrap();
    assert!(
        !String::from_utf8_lossy(&plain.stdout).contains("PONG"),
        "a plain-text client was answered"
    );
    // The silent client got nothing either, and was closed after the handshake timeout or is
    // still waiting; either way it held nobody up.
    silent.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
    let mut buf = [0u8; 16];
    assert!(
        !matches!(silent.read(&mut buf), Ok(n) if n > 0),
        "the silent client got bytes"
    );

    // ZooKeeper: kazoo over TLS.
    let zk_dir = dir.path().join("zk");
    std::fs::create_dir(&zk_dir).unwrap();
    let base = cluster::free_base(25_150, 1);
    let _zk_replicas = replicas(&zk_dir, base, "zk");
    let port = base + 300;
    let _zk = gateway("zk", &zk_dir, port, &tls);
    let script = format!(
        "from kazoo.client import KazooClient\n\
         zk = KazooClient(hosts='127.0.0.1:{port}', use_ssl=True, verify_certs=True, ca='{cert}')\n\
         zk.start(timeout=30)\nzk.create('/tls', b'kazoo')\nprint(zk.get('/tls')[0].decode())\nzk.stop()"
    );
    assert_eq!(run("python3", &["-c", &script]), "kazoo");
}

/// A raw `GET /status` to `port`, with `token` if given: the response's status line.
fn status_line(port: u16, token: Option<&str>) -> String {
    use std::io::Write;
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    // In two pieces, the header with the token in the second: the endpoint reads the whole head.
    s.write_all(b"GET /status HTTP/1.1\r\nHost: x\r\n").unwrap();
    s.flush().unwrap();
    std::thread::sleep(Duration::from_millis(20));
    s.write_all(format!("{auth}Connection: close\r\n\r\n").as_bytes())
        .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    text.lines().next().unwrap_or_default().to_string()
}

#[test]
fn with_a_metrics_token_the_endpoints_answer_only_upright_status_and_whoever_has_it() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let base = cluster::free_base(25_200, 0);
    let (config, printed) = cluster::init_with(dir, base, &["--metrics-token"]);
    assert!(printed.contains("keys/metrics.token"), "{printed}");
    let _replicas: Vec<Proc> = (0..4).map(|id| cluster::replica(dir, &config, id, "kv")).collect();
    let status = || {
        let out = Command::new(env!("CARGO_BIN_EXE_upright"))
            .args(["status", "--config", &config])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    let all_up = (0..100).any(|_| {
        std::thread::sleep(Duration::from_millis(100));
        status().contains("4 of 4 replicas answered")
    });
    assert!(all_up, "upright status with the token: {}", status());
    let metrics = base + 200;
    assert!(status_line(metrics, None).contains("401"), "no token");
    assert!(
        status_line(metrics, Some("not-the-token")).contains("401"),
        "a wrong token"
    );
    let token = std::fs::read_to_string(dir.join("keys/metrics.token")).unwrap();
    assert!(status_line(metrics, Some(token.trim())).contains("200 OK"));
}

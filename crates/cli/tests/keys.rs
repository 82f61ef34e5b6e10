//! Key refresh with real processes: `upright init --key-refresh-secs 1`, four `upright replica`
//! processes (each refreshes its session keys every second and refuses the previous ones after
//! the overlap).
//!
//! - redis-cli, through the standalone `upright redis` gateway (itself a client that refreshes
//!   its keys), writes and reads back across several refreshes.
//! - A client driven by hand through the transport keeps its first keys and ignores the NEW-KEYs
//!   the replicas send it: once the replicas have refreshed and retired those keys, its request
//!   gets no answer. When it installs the replicas' NEW-KEYs, the same request is answered.
//!
//! Needs redis-cli for the first part (`.ci/run` installs it); skipped, loudly, without it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use upright_core::crypto::KeyRing;
use upright_core::ids::{ClientId, Principal, Process, ReplicaId, RequestId, StageKind};
use upright_core::message::{Envelope, Message, SealFor};
use upright_node::files::{endpoint, ClientFile};
use upright_node::transport::{dial_clients, Counters, Inbox};

#[path = "common/cluster.rs"]
mod cluster;
use cluster::Proc;

fn have_redis_cli() -> bool {
    Command::new("redis-cli")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// The hand-driven client: client 1's keys, one connection to each replica's client port.
struct RawClient {
    id: ClientId,
    keys: Arc<KeyRing>,
    quorums: upright_core::quorum::Quorums,
    inbox: Arc<Inbox>,
    dialers: Vec<upright_node::transport::Dialer>,
}

impl RawClient {
    fn connect(dir: &Path) -> RawClient {
        let setup = ClientFile::load(&dir.join("client-1.toml")).unwrap();
        let config = setup.cluster.config.clone();
        let quorums = config.validate().unwrap();
        let keys = Arc::new(KeyRing::new(&config, Process::Client(setup.id), &setup.keys));
        let counters = Arc::new(Counters::default());
        let inbox = Arc::new(Inbox::new(counters.clone()));
        let inboxes = Arc::new(BTreeMap::from([(setup.id, inbox.clone())]));
        let dialers = setup
            .cluster
            .file
            .replicas
            .iter()
            .map(|entry| {
                dial_clients(
                    endpoint(&entry.client_addr).unwrap(),
                    ReplicaId(entry.id),
                    vec![keys.clone()],
                    config.cluster_name.clone(),
                    inboxes.clone(),
                    1 << 20,
                    counters.clone(),
                )
            })
            .collect();
        RawClient {
            id: setup.id,
            keys,
            quorums,
            inbox,
            dialers,
        }
    }

    /// Sends request `request_id` (an operation the Redis service answers with an error: any
    /// answer shows the request got through) to every authentication member.
    fn send(&self, request_id: u64) {
        let message = Message::ClientRequest {
            client: self.id,
            request_id: RequestId(request_id),
            operation: Bytes::from_static(b"not a redis command"),
            read_only: false,
            signature: None,
            config_epoch: 0,
        };
        let envelope = Envelope::seal(
            &self.keys,
            &self.quorums,
            Principal::Client(self.id),
            message,
            SealFor::Stage(StageKind::Auth),
        );
        let frame = Arc::new(upright_core::wire::encode(&envelope));
        for dialer in &self.dialers {
            dialer.send(frame.clone());
        }
    }

    /// Execution members that answered `request_id` within `wait`; NEW-KEYs received meanwhile
    /// are installed only if `install`.
    fn answers(&self, request_id: u64, wait: Duration, install: bool) -> (BTreeSet<ReplicaId>, usize) {
        let deadline = Instant::now() + wait;
        let (mut answered, mut new_keys) = (BTreeSet::new(), 0);
        while Instant::now() < deadline {
            for (_, envelope) in self.inbox.pop_round_robin(usize::MAX) {
                match (&envelope.message, envelope.from) {
                    (Message::Reply { request_id: id, .. }, Principal::Exec(r)) if id.0 == request_id => {
                        answered.insert(r);
                    }
                    (Message::NewKey { key, .. }, from) => {
                        new_keys += 1;
                        if install {
                            let _ = self.keys.accept_new_key(self.keys.process_of(from), key);
                        }
                    }
                    _ => {}
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        (answered, new_keys)
    }
}

#[test]
fn requests_under_retired_keys_are_refused_and_refreshed_keys_serve_real_clients() {
    let dir = tempfile::tempdir().unwrap();
    let base = cluster::free_base(24_000, 1);
    let (config, _) = cluster::init_with(dir.path(), base, &["--key-refresh-secs", "1"]);
    let text = std::fs::read_to_string(&config).unwrap();
    assert!(text.contains("key_refresh_us = 1000000"), "{text}");
    let _replicas: Vec<Proc> = (0..4)
        .map(|id| cluster::replica(dir.path(), &config, id, "redis"))
        .collect();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let _guard = runtime.enter();

    // The stale client connects now, ignores every NEW-KEY, and waits until the replicas have
    // refreshed at least twice past their start (their first epoch's keys are retired too).
    let raw = RawClient::connect(dir.path());
    let (_, seen) = raw.answers(0, Duration::from_millis(3_500), false);
    assert!(seen >= 4, "NEW-KEYs from the replicas reached the client: {seen}");
    raw.send(1);
    let (answered, _) = raw.answers(1, Duration::from_secs(3), false);
    assert!(
        answered.is_empty(),
        "a request under the long-term keys, retired, was answered by {answered:?}"
    );
    // With the replicas' current keys the same request goes through (r + 1 = 2 answers at
    // least). Keys installed as NEW-KEYs arrive; the request is sent again each second.
    let mut answered = BTreeSet::new();
    for _ in 0..8 {
        let (_, _) = raw.answers(0, Duration::from_millis(1_100), true);
        raw.send(1);
        answered.extend(raw.answers(1, Duration::from_millis(900), true).0);
        if answered.len() >= 2 {
            break;
        }
    }
    assert!(answered.len() >= 2, "answered under refreshed keys by {answered:?}");

    if !have_redis_cli() {
        eprintln!("SKIPPED the redis-cli part: redis-cli is not installed");
        return;
    }
    let port = base + 300;
    let _gateway = cluster::gateway(dir.path(), "redis", port);
    let started = Instant::now();
    let mut n = 0u32;
    // Writes and reads for five seconds: five refreshes of every replica and of the gateway.
    while started.elapsed() < Duration::from_secs(5) {
        let p = port.to_string();
        let set = cluster::run("redis-cli", &["-p", &p, "SET", &format!("k{n}"), &format!("v{n}")]);
        assert_eq!(String::from_utf8_lossy(&set.stdout).trim(), "OK", "SET k{n}");
        let get = cluster::run("redis-cli", &["-p", &p, "GET", &format!("k{n}")]);
        assert_eq!(String::from_utf8_lossy(&get.stdout).trim(), format!("v{n}"), "GET k{n}");
        n += 1;
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(n >= 10, "{n} writes in 5 s");
    eprintln!("{n} SET+GET pairs through redis-cli across key refreshes");
}

//! UpRight-HDFS the way a user runs it (issue 29): `upright demo --service hdfs` (four NameNode
//! replicas, three DataNodes, the WebHDFS gateway) used by PyPI's `hdfs` package (hdfscli's
//! Python API and command line), while, as in UpRight's experiment, NameNode replica 2 lies in
//! every reply, NameNode replica 1 is SIGKILLed, its log and snapshot corrupted and restarted,
//! and DataNode 8 flips a bit of the first block it stores and serves it unchecked: every byte
//! read back equals what was written, and the corrupt replica is replaced by a copy from a good
//! one.
//!
//! Needs Python's `hdfs` (`.ci/run` installs it); skipped, loudly, without it.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[path = "common/demo.rs"]
mod demo;
#[path = "common/storage.rs"]
mod storage;
use storage::corrupt_storage;

/// The block id in a DataNode log line `... block=<id> ...`.
fn block_of(line: &str) -> Option<u64> {
    let at = line.find("block=")? + "block=".len();
    line[at..].split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
}

#[test]
fn hdfs_clients_read_back_every_byte_under_namenode_and_datanode_faults() {
    let have_hdfs = Command::new("python3")
        .args(["-c", "import hdfs"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !have_hdfs {
        eprintln!("\n\n*** SKIPPED upright hdfs gateway test: python3 -m pip install hdfs ***\n\n");
        return;
    }
    let port = demo::free_port();
    let demo = demo::start_demo_running(
        "hdfs",
        port,
        &format!("WebHDFS on http://127.0.0.1:{port}"),
        &[
            "--gateway-pool",
            "8",
            "--env",
            "UPRIGHT_TEST_CORRUPT_REPLICA=2",
            "--env",
            "UPRIGHT_TEST_FLIP_DATANODE=8",
        ],
    );
    let dir = Path::new(&demo.log_dir).parent().unwrap().to_path_buf();
    let replica_log = std::fs::read_to_string(dir.join("replica-2.log")).unwrap();
    assert!(replica_log.contains("corrupts its replies"), "{replica_log}");

    let script = format!("{}/tests/hdfs_clients.py", env!("CARGO_MANIFEST_DIR"));
    let clients = Command::new("python3")
        .args([script.as_str(), &port.to_string(), "14"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run python3");

    // NameNode replica 1: SIGKILLed while the clients run, its files corrupted before the demo
    // restarts it (it waits a second), then back.
    std::thread::sleep(Duration::from_secs(4));
    assert!(demo.kill_replica(1), "replica 1's process not found");
    let corrupted = corrupt_storage(&dir.join("data").join("replica-1"));
    assert!(corrupted > 0, "replica 1 had no log or snapshot to corrupt");
    println!("replica 1 SIGKILLed; {corrupted} of its files corrupted");
    assert!(
        demo.wait_for_line("replica 1 restarted", Duration::from_secs(30)),
        "the demo did not restart replica 1"
    );

    let out = clients.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    print!("{stdout}");
    assert!(
        out.status.success() && stdout.contains("hdfs clients: all checks passed"),
        "hdfs client checks failed: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // DataNode 8 flipped a bit of its first replica; a reader caught it (DataNode 8 served it
    // unchecked) and the NameNode had a good replica copied over it.
    let flipper = std::fs::read_to_string(dir.join("datanode-8.log")).unwrap();
    let flipped = flipper
        .lines()
        .find(|l| l.contains("TESTING: flipped a bit"))
        .and_then(block_of)
        .unwrap_or_else(|| panic!("DataNode 8 did not flip a bit: {flipper}"));
    let flipper_addr = flipper
        .lines()
        .find_map(|l| l.strip_prefix("DataNode 8 on "))
        .and_then(|l| l.split_whitespace().next())
        .expect("DataNode 8's address")
        .to_string();
    let until = Instant::now() + Duration::from_secs(60);
    let copied = loop {
        let copied = ["datanode-9.log", "datanode-10.log"].iter().any(|log| {
            std::fs::read_to_string(dir.join(log))
                .unwrap_or_default()
                .lines()
                .any(|l| {
                    l.contains("copied a replica")
                        && block_of(l) == Some(flipped)
                        && l.contains(&format!("target=\"{flipper_addr}\""))
                })
        });
        if copied || Instant::now() > until {
            break copied;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(copied, "block {flipped} was not re-replicated to DataNode 8");
    let data = |dn: u32| std::fs::read(dir.join(format!("datanode-{dn}")).join(format!("{flipped}.data")));
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let (repaired, good) = (data(8).ok(), data(9).unwrap());
        if repaired.as_ref() == Some(&good) {
            break;
        }
        assert!(
            Instant::now() < until,
            "DataNode 8's replica of block {flipped} still differs from DataNode 9's"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    println!("block {flipped}: flipped on DataNode 8, caught by the reader, copied back from a good replica");
}

#[test]
fn block_ids_parse_from_log_lines() {
    assert_eq!(block_of("WARN x: TESTING: flipped block=1073741824"), Some(1073741824));
    assert_eq!(block_of("INFO copied a replica block=17 target=\"a\""), Some(17));
    assert_eq!(block_of("no block here"), None);
}

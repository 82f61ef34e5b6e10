//! UpRight-HDFS the way a user runs it (issue 29): `upright demo --service hdfs` (four NameNode
//! replicas, three DataNodes, the WebHDFS gateway) used by PyPI's `hdfs` package (hdfscli's
//! Python API and command line), while, as in UpRight's experiment, NameNode replica 2 lies in
//! every reply, NameNode replica 1 is SIGKILLed, its log and snapshot corrupted and restarted,
//! and DataNode 8 flips a bit of the first block it stores and serves it unchecked: every byte
//! read back equals what was written, and the corrupt replica is replaced by a copy from a good
//! one. Hadoop's own FsShell (`-put -get -ls -mv -rm -cat -checksum` over `webhdfs://`) runs
//! beside hdfscli through the same faults.
//!
//! Needs Python's `hdfs` and Hadoop's client jars (`.ci/run` installs both; the jars come from
//! `scripts/hadoop-jars.sh`); skipped, loudly, without them.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[path = "common/demo.rs"]
mod demo;
#[path = "common/storage.rs"]
mod storage;
use storage::corrupt_storage;

/// Where `scripts/hadoop-jars.sh` put Hadoop's client jars (or `UPRIGHT_HADOOP_JARS`), if
/// they are there and Java runs.
fn hadoop_jars() -> Option<PathBuf> {
    let dir = std::env::var_os("UPRIGHT_HADOOP_JARS")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/hadoop-jars"));
    let has_common = std::fs::read_dir(dir.join("lib"))
        .ok()?
        .flatten()
        .any(|e| e.file_name().to_string_lossy().starts_with("hadoop-common-"));
    let java = Command::new("java")
        .arg("-version")
        .output()
        .is_ok_and(|o| o.status.success());
    (has_common && java && dir.join("conf/core-site.xml").exists()).then_some(dir)
}

/// Runs `FsShell -fs webhdfs://127.0.0.1:PORT ARGS...`: whether it succeeded, its stdout.
fn fs_shell(jars: &Path, port: u16, args: &[&str]) -> (bool, Vec<u8>) {
    let classpath = format!("{}:{}/*", jars.join("conf").display(), jars.join("lib").display());
    let out = Command::new("java")
        .args([
            "-Xshare:auto",
            "-XX:TieredStopAtLevel=1",
            "-cp",
            &classpath,
            "org.apache.hadoop.fs.FsShell",
        ])
        .args(["-fs", &format!("webhdfs://127.0.0.1:{port}")])
        .args(args)
        .output()
        .expect("run java");
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !stderr.trim().is_empty() {
        println!("FsShell {}: {}", args.join(" "), stderr.trim());
    }
    (out.status.success(), out.stdout)
}

/// HDFS's file checksum computed here, independently of the gateway: a CRC32C per 512 bytes,
/// an MD5 over each block's CRCs, an MD5 over the blocks' MD5s; the algorithm's name and the
/// checksum's 28 bytes in hex (bytes per CRC, CRCs per block, the MD5).
fn hdfs_checksum(data: &[u8], block_size: usize) -> (String, String) {
    use md5::{Digest, Md5};
    let blocks: Vec<&[u8]> = data.chunks(block_size).collect();
    let mut file = Md5::new();
    for block in &blocks {
        let mut crcs = Md5::new();
        for chunk in block.chunks(512) {
            crcs.update(crc32c::crc32c(chunk).to_be_bytes());
        }
        file.update(crcs.finalize());
    }
    let per_block = if blocks.len() > 1 {
        blocks[0].len().div_ceil(512) as u64
    } else {
        0
    };
    let mut bytes = 512u32.to_be_bytes().to_vec();
    bytes.extend_from_slice(&per_block.to_be_bytes());
    bytes.extend_from_slice(&file.finalize());
    (format!("MD5-of-{per_block}MD5-of-512CRC32C"), hex::encode(bytes))
}

/// FsShell's session: every command the issue names, each result checked; the failures.
fn fs_shell_session(jars: &Path, port: u16) -> Vec<String> {
    let mut failures = Vec::new();
    let tmp = tempfile::tempdir().unwrap();
    // 2.5 MiB of pseudo-random bytes, written in 1 MiB blocks (three blocks).
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let data: Vec<u8> = (0..(5 << 19) + 77)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    let local = tmp.path().join("a.bin");
    std::fs::write(&local, &data).unwrap();
    let local = local.display().to_string();
    let mut run = |what: &str, args: &[&str]| {
        let (ok, out) = fs_shell(jars, port, args);
        if !ok {
            failures.push(format!("FsShell {what} failed"));
        }
        out
    };
    run("-mkdir", &["-mkdir", "-p", "/shell"]);
    run("-put", &["-D", "dfs.blocksize=1048576", "-put", &local, "/shell/a.bin"]);
    let listing = String::from_utf8_lossy(&run("-ls", &["-ls", "/shell"])).to_string();
    let cat = run("-cat", &["-cat", "/shell/a.bin"]);
    let checksum = String::from_utf8_lossy(&run("-checksum", &["-checksum", "/shell/a.bin"])).to_string();
    run("-mv", &["-mv", "/shell/a.bin", "/shell/b.bin"]);
    let got = tmp.path().join("b.bin");
    run("-get", &["-get", "/shell/b.bin", &got.display().to_string()]);
    let removed = String::from_utf8_lossy(&run("-rm", &["-rm", "/shell/b.bin"])).to_string();
    let after = String::from_utf8_lossy(&run("-ls", &["-ls", "/shell"])).to_string();
    let (missing_ok, _) = fs_shell(jars, port, &["-cat", "/shell/b.bin"]);
    if !listing.contains(&format!("{} ", data.len())) || !listing.contains("/shell/a.bin") {
        failures.push(format!(
            "-ls did not list /shell/a.bin with its {} bytes: {listing}",
            data.len()
        ));
    }
    if cat != data {
        failures.push(format!("-cat gave {} bytes, not the {} written", cat.len(), data.len()));
    }
    let (algorithm, bytes) = hdfs_checksum(&data, 1 << 20);
    let want = format!("/shell/a.bin\t{algorithm}\t{bytes}");
    if checksum.trim() != want {
        failures.push(format!(
            "-checksum gave {:?}, HDFS's checksum of the bytes is {want:?}",
            checksum.trim()
        ));
    }
    if std::fs::read(&got).ok().as_deref() != Some(&data[..]) {
        failures.push("-get did not give back the bytes written".into());
    }
    if !removed.contains("Deleted /shell/b.bin") || after.contains("b.bin") {
        failures.push(format!("-rm did not delete /shell/b.bin: {removed} / {after}"));
    }
    if missing_ok {
        failures.push("-cat of a deleted file succeeded".into());
    }
    failures
}

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

    // Hadoop's FsShell beside hdfscli, through the same faults.
    let shell = match hadoop_jars() {
        Some(jars) => Some(std::thread::spawn(move || fs_shell_session(&jars, port))),
        None => {
            eprintln!("\n\n*** SKIPPED the FsShell part: run scripts/hadoop-jars.sh (needs Java and Maven) ***\n\n");
            None
        }
    };

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

    if let Some(shell) = shell {
        let failures = shell.join().unwrap();
        assert!(failures.is_empty(), "FsShell: {failures:#?}");
        println!("FsShell: -mkdir -put -ls -cat -checksum -mv -get -rm checked");
    }

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

#[test]
fn the_checksum_is_hdfs_s_for_a_known_file() {
    // What Hadoop 3.5.0's MiniDFSCluster answered to GETFILECHECKSUM of this 14-byte file
    // (scripts/hadoop/MiniHdfs.java, session 44).
    let (algorithm, bytes) = hdfs_checksum(b"hello fsshell\n", 128 << 20);
    assert_eq!(algorithm, "MD5-of-0MD5-of-512CRC32C");
    assert_eq!(bytes, "0000020000000000000000004c507909805eb9ccd48dd31e6b505e8d");
    // Three blocks: the CRCs per block are the first block's.
    let (algorithm, _) = hdfs_checksum(&vec![7u8; (5 << 19) + 77], 1 << 20);
    assert_eq!(algorithm, "MD5-of-2048MD5-of-512CRC32C");
}

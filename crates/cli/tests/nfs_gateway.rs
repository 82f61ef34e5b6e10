//! `upright nfs` the way a user runs it: `upright init`, four `upright replica --service fs`
//! processes (replica 2 a Byzantine stand-in that lies in every reply) and the gateway; Debian's
//! libnfs-utils (`nfs-cp`, `nfs-ls`, `nfs-cat`), which nobody here wrote, copy a tree of files in
//! and back out byte for byte while replica 3 is SIGKILLed and restarted.
//!
//! Then PyPI's libnfs (`nfs_clients.py`) exercises what a file system user does: rename over an
//! existing file, hard links, symlinks, truncation, permissions as two users (ACCESS, chmod,
//! chown), MKNOD of a FIFO, a directory of 10,000 entries and a 1 GiB file written and read
//! back, while replica 3 is SIGKILLed and restarted again. The procedures that binding cannot
//! reach (NULL, FSSTAT, PATHCONF, plain READDIR, MOUNT's EXPORT and UMNT) are called here.
//!
//! Needs libnfs-utils and PyPI's libnfs (`.ci/run` installs both); each part is skipped, loudly,
//! without its client. libnfs-utils has no mkdir, so the test makes the tree's directories with
//! MKDIR calls of its own.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use upright_fs::nfs3::{proc3, Attributes, SetAttributes, MOUNT_PROGRAM, NFS_PROGRAM};
use upright_fs::xdr::{Reader, Writer};

#[path = "common/cluster.rs"]
mod cluster;
use cluster::Proc;

fn replica(dir: &Path, config: &str, id: u32) -> Proc {
    cluster::replica(dir, config, id, "fs")
}

/// One RPC call over `stream` (AUTH_SYS as root); the reply's result after the header.
fn rpc(stream: &mut TcpStream, xid: u32, program: u32, procedure: u32, args: &[u8]) -> Vec<u8> {
    let mut cred = Writer::new();
    cred.u32(0).string("test").u32(0).u32(0).u32(0);
    let cred = cred.finish();
    let mut w = Writer::new();
    w.u32(xid).u32(0).u32(2).u32(program).u32(3).u32(procedure);
    w.u32(1).opaque(&cred).u32(0).opaque(&[]).raw(args);
    let record = w.finish();
    stream.write_all(&upright_fs::rpc::frame(&record)).unwrap();
    let mut header = [0u8; 4];
    stream.read_exact(&mut header).unwrap();
    let mut reply = vec![0u8; (u32::from_be_bytes(header) & 0x7fff_ffff) as usize];
    stream.read_exact(&mut reply).unwrap();
    let mut r = Reader::new(&reply);
    assert_eq!(r.u32().unwrap(), xid);
    // REPLY, MSG_ACCEPTED, verifier, SUCCESS.
    assert_eq!((r.u32().unwrap(), r.u32().unwrap()), (1, 0));
    r.u32().unwrap();
    r.opaque(400).unwrap();
    assert_eq!(r.u32().unwrap(), 0, "accepted: SUCCESS");
    r.rest().to_vec()
}

/// MKDIR `name` in `dir` (mode 0777); the new directory's handle.
fn mkdir(stream: &mut TcpStream, xid: u32, dir: &[u8], name: &str) -> Vec<u8> {
    let mut w = Writer::new();
    w.opaque(dir).string(name);
    SetAttributes {
        mode: Some(0o777),
        ..SetAttributes::default()
    }
    .encode(&mut w);
    let result = rpc(stream, xid, NFS_PROGRAM, proc3::MKDIR, &w.finish());
    let mut r = Reader::new(&result);
    assert_eq!(r.u32().unwrap(), 0, "MKDIR {name}: NFS3_OK");
    assert!(r.bool().unwrap());
    r.opaque(64).unwrap().to_vec()
}

/// Entries of the large directory.
const MANY: u32 = 10_000;

/// CREATE (UNCHECKED) `entry-00000` .. in `dir`, all outstanding at once; checks every reply.
fn create_many(stream: &TcpStream, dir: &[u8], n: u32) {
    let mut reader = stream.try_clone().unwrap();
    let replies = std::thread::spawn(move || {
        for i in 0..n {
            let mut header = [0u8; 4];
            reader.read_exact(&mut header).unwrap();
            let mut reply = vec![0u8; (u32::from_be_bytes(header) & 0x7fff_ffff) as usize];
            reader.read_exact(&mut reply).unwrap();
            let mut r = Reader::new(&reply);
            assert_eq!(r.u32().unwrap(), 10_000 + i, "replies come in call order");
            assert_eq!(&reply[20..24], &[0, 0, 0, 0], "CREATE {i}: accepted");
            let rest = &reply[24..];
            assert_eq!(&rest[..4], &[0, 0, 0, 0], "CREATE {i}: NFS3_OK");
        }
    });
    let mut writer = stream.try_clone().unwrap();
    let mut cred = Writer::new();
    cred.u32(0).string("test").u32(0).u32(0).u32(0);
    let cred = cred.finish();
    for i in 0..n {
        let mut w = Writer::new();
        w.u32(10_000 + i)
            .u32(0)
            .u32(2)
            .u32(NFS_PROGRAM)
            .u32(3)
            .u32(proc3::CREATE);
        w.u32(1).opaque(&cred).u32(0).opaque(&[]);
        w.opaque(dir).string(&format!("entry-{i:05}")).u32(0);
        SetAttributes::default().encode(&mut w);
        writer.write_all(&upright_fs::rpc::frame(&w.finish())).unwrap();
    }
    replies.join().unwrap();
}

/// Deterministic contents (not all zeros, different per file).
fn contents(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn url(port: u16, path: &str) -> String {
    format!("nfs://127.0.0.1/{path}?nfsport={port}&mountport={port}&version=3")
}

use cluster::run;

#[test]
fn libnfs_utils_copy_a_tree_in_and_out_byte_for_byte_with_a_replica_killed_and_another_lying() {
    if Command::new("nfs-cp").output().is_err() {
        eprintln!("\n\n*** SKIPPED upright nfs gateway test: apt-get install libnfs-utils ***\n\n");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let base = cluster::free_base(24_100, 1);
    let config = cluster::init(dir, base);
    let mut replicas: Vec<Proc> = (0..4).map(|id| replica(dir, &config, id)).collect();
    let port = base + 300;
    let _gateway = cluster::gateway(dir, "nfs", port);

    // The tree's directories, made through the gateway (MNT gives the root's handle).
    let mut stream = (0..100)
        .find_map(|_| {
            std::thread::sleep(Duration::from_millis(100));
            TcpStream::connect(("127.0.0.1", port)).ok()
        })
        .expect("the gateway listens");
    stream.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut mnt = Writer::new();
    mnt.string("/");
    let result = rpc(&mut stream, 1, MOUNT_PROGRAM, 1, &mnt.finish());
    let mut r = Reader::new(&result);
    assert_eq!(r.u32().unwrap(), 0, "MNT3_OK");
    let root = r.opaque(64).unwrap().to_vec();
    let a = mkdir(&mut stream, 2, &root, "a");
    mkdir(&mut stream, 3, &a, "b");
    // The procedures PyPI's libnfs cannot call by itself (it has no statvfs or pathconf, and
    // lists directories with READDIRPLUS): NULL of both programs, FSSTAT, FSINFO, PATHCONF,
    // READDIR, and MOUNT's EXPORT and UMNT; each answers NFS3_OK (or MNT3_OK).
    assert!(rpc(&mut stream, 20, NFS_PROGRAM, proc3::NULL, &[]).is_empty());
    assert!(rpc(&mut stream, 21, MOUNT_PROGRAM, 0, &[]).is_empty());
    let mut on_root = Writer::new();
    on_root.opaque(&root);
    let on_root = on_root.finish();
    for (xid, procedure) in [(22, proc3::FSSTAT), (23, proc3::FSINFO), (24, proc3::PATHCONF)] {
        let result = rpc(&mut stream, xid, NFS_PROGRAM, procedure, &on_root);
        assert_eq!(Reader::new(&result).u32().unwrap(), 0, "procedure {procedure}: NFS3_OK");
    }
    let mut readdir = Writer::new();
    readdir.opaque(&a).u64(0).fixed(&[0; 8]).u32(4096);
    let result = rpc(&mut stream, 25, NFS_PROGRAM, proc3::READDIR, &readdir.finish());
    let mut r = Reader::new(&result);
    assert_eq!(r.u32().unwrap(), 0, "READDIR: NFS3_OK");
    r.optional(Attributes::decode).unwrap();
    r.fixed(8).unwrap();
    let mut names = Vec::new();
    while r.bool().unwrap() {
        r.u64().unwrap();
        names.push(r.string(255).unwrap().to_string());
        r.u64().unwrap();
    }
    assert!(r.bool().unwrap(), "READDIR of /a reaches its end");
    assert!(names.iter().any(|n| n == "b"), "READDIR of /a: {names:?}");
    let exports = rpc(&mut stream, 26, MOUNT_PROGRAM, 5, &[]);
    assert!(String::from_utf8_lossy(&exports).contains('/'), "EXPORT lists /");
    let mut umnt = Writer::new();
    umnt.string("/");
    assert!(
        rpc(&mut stream, 27, MOUNT_PROGRAM, 3, &umnt.finish()).is_empty(),
        "UMNT"
    );
    // A directory of 10,000 entries for the Python client to list (made here with every CREATE
    // outstanding at once, so the gateway packs them into a few operations).
    let many = mkdir(&mut stream, 4, &root, "many");
    create_many(&stream, &many, MANY);

    // Files of the sizes that matter: empty, one byte, around a 4 KiB block and a 64 KiB page,
    // and a few MiB.
    let sizes = [0usize, 1, 4095, 65_536, 65_537, 300_000, 3_000_000];
    let local = dir.join("local");
    std::fs::create_dir(&local).unwrap();
    let mut files = Vec::new();
    for (i, size) in sizes.iter().enumerate() {
        let remote = match i % 3 {
            0 => format!("/f{i}.bin"),
            1 => format!("/a/f{i}.bin"),
            _ => format!("/a/b/f{i}.bin"),
        };
        let path = local.join(format!("f{i}.bin"));
        std::fs::write(&path, contents(*size, i as u64)).unwrap();
        files.push((path, remote));
    }
    // Replica 3 is down for the first half of the copies and back for the rest.
    drop(replicas.remove(3));
    for (i, (path, remote)) in files.iter().enumerate() {
        if i == files.len() / 2 {
            replicas.push(replica(dir, &config, 3));
        }
        let out = run("nfs-cp", &[path.to_str().unwrap(), &url(port, &format!("/{remote}"))]);
        assert!(String::from_utf8_lossy(&out.stdout).contains("copied"), "{out:?}");
    }
    // Back out, byte for byte.
    let back = dir.join("back");
    std::fs::create_dir(&back).unwrap();
    for (path, remote) in &files {
        let copy = back.join(path.file_name().unwrap());
        run("nfs-cp", &[&url(port, &format!("/{remote}")), copy.to_str().unwrap()]);
        assert_eq!(std::fs::read(&copy).unwrap(), std::fs::read(path).unwrap(), "{remote}");
    }
    let cat = run("nfs-cat", &[&url(port, "//a/f1.bin")]);
    assert_eq!(cat.stdout, contents(1, 1));
    // nfs-ls sees every name, recursively, with its size.
    let ls = run("nfs-ls", &["-R", &url(port, "")]);
    let listing = String::from_utf8_lossy(&ls.stdout);
    for (i, (_, remote)) in files.iter().enumerate() {
        let name = remote.rsplit('/').next().unwrap();
        let line = listing
            .lines()
            .find(|l| l.ends_with(name))
            .unwrap_or_else(|| panic!("{name} not listed:\n{listing}"));
        assert!(line.contains(&format!(" {} ", sizes[i])), "{line}");
    }

    if !Command::new("python3")
        .args(["-c", "import libnfs"])
        .output()
        .is_ok_and(|o| o.status.success())
    {
        eprintln!("\n\n*** SKIPPED the PyPI libnfs part: python3 -m pip install libnfs (needs libnfs-dev) ***\n\n");
    } else {
        drop(replicas.remove(3));
        let restarter = {
            let dir = dir.to_path_buf();
            let config = config.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_secs(3));
                replica(&dir, &config, 3)
            })
        };
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/nfs_clients.py");
        // A cluster that stops answering must fail the test, not hang it.
        let out = Command::new("timeout")
            .args(["1200", "python3"])
            .arg(script)
            .args([port.to_string(), BIG_FILE_MIB.to_string(), MANY.to_string()])
            .output()
            .expect("run python3");
        let stdout = String::from_utf8_lossy(&out.stdout);
        print!("{stdout}");
        assert!(
            out.status.success() && stdout.contains("nfs clients: ok"),
            "libnfs checks failed: {stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        replicas.push(restarter.join().unwrap());
    }
    let log = std::fs::read_to_string(dir.join("replica-2.log")).unwrap();
    assert!(log.contains("corrupts its replies"), "{log}");
}

/// The big file of the PyPI libnfs part (the issue asks for 1 GiB).
const BIG_FILE_MIB: u32 = 1024;

/// NO-REP, the benchmark's baseline: `upright norep --service fs` (the same file system,
/// unreplicated) behind the same gateway serves libnfs-utils, and `scripts/nfs_bench.py` (the
/// benchmark's workload, which checks every byte it reads back) runs against it to the end.
#[test]
fn the_no_rep_file_system_serves_nfs_clients_and_the_benchmark_workload() {
    if Command::new("nfs-cp").output().is_err() {
        eprintln!("\n\n*** SKIPPED upright norep --service fs test: apt-get install libnfs-utils ***\n\n");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let base = cluster::free_base(24_150, 1);
    let init = Command::new(env!("CARGO_BIN_EXE_upright"))
        .args([
            "init",
            "--replicas",
            "1",
            "--u",
            "0",
            "--r",
            "0",
            "--hosts",
            "127.0.0.1",
        ])
        .args(["--clients", "4", "--base-port", &base.to_string(), "--out"])
        .arg(dir)
        .output()
        .unwrap();
    assert!(init.status.success(), "upright init: {init:?}");
    let log = std::fs::File::create(dir.join("norep.log")).unwrap();
    let _norep = Proc(
        Command::new(env!("CARGO_BIN_EXE_upright"))
            .args(["norep", "--service", "fs", "--config"])
            .arg(dir.join("cluster.toml"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap(),
    );
    let port = base + 300;
    let _gateway = cluster::gateway(dir, "nfs", port);
    let ready = (0..100).any(|_| {
        std::thread::sleep(Duration::from_millis(100));
        TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
    assert!(ready, "the gateway listens");

    let local = dir.join("in.bin");
    let data = contents(300_000, 7);
    std::fs::write(&local, &data).unwrap();
    run("nfs-cp", &[local.to_str().unwrap(), &url(port, "/in.bin")]);
    let back = dir.join("back.bin");
    run("nfs-cp", &[&url(port, "/in.bin"), back.to_str().unwrap()]);
    assert_eq!(std::fs::read(&back).unwrap(), data, "nothing read differs");

    if !Command::new("python3")
        .args(["-c", "import libnfs"])
        .status()
        .is_ok_and(|s| s.success())
    {
        eprintln!("\n\n*** SKIPPED the benchmark workload: python3 -m pip install libnfs ***\n\n");
        return;
    }
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/nfs_bench.py");
    let out = Command::new("timeout")
        .args([
            "300",
            "python3",
            script,
            "--files",
            "50",
            "--transactions",
            "100",
            "--json",
        ])
        .arg(dir.join("bench.json"))
        .arg(format!("NO-REP={}", url(port, "")))
        .output()
        .expect("run python3");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("| andrew total |") && stdout.contains("| postmark total |"),
        "nfs_bench.py: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json = std::fs::read_to_string(dir.join("bench.json")).unwrap();
    assert!(json.contains("\"transactions\": 100"), "{json}");
}

//! The same table of requests, sent by a raw jute client to upright-zk (`upright demo --service
//! zk`) and to Apache ZooKeeper (Debian's `zookeeper` package, standalone): every request must
//! get the same error code and the same answer, Stat fields included, except what differs by
//! nature (zxids, times, session ids). Skipped, loudly, if ZooKeeper is not installed.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use upright_zk::jute::{Reader, Writer};
use upright_zk::proto::request::{
    connect, create, multi, path as path_only, path_int, path_watch as path_bool, set_data,
};
use upright_zk::proto::{op, perms, Acl, Id, Stat};

#[path = "common/demo.rs"]
mod demo;

const ZK_SERVER: &str = "/usr/share/zookeeper/bin/zkServer.sh";

/// A raw ZooKeeper client: one session, one request at a time.
struct Raw {
    stream: TcpStream,
    xid: i32,
    session: i64,
}

fn frame(stream: &mut TcpStream, body: &[u8]) -> std::io::Result<()> {
    let mut out = Vec::new();
    out.int(body.len() as i32);
    out.extend_from_slice(body);
    stream.write_all(&out)
}

fn read_frame(stream: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    let mut len = [0u8; 4];
    stream.read_exact(&mut len)?;
    let mut body = vec![0u8; i32::from_be_bytes(len) as usize];
    stream.read_exact(&mut body)?;
    Ok(body)
}

impl Raw {
    fn connect(port: u16) -> Raw {
        // A server that is still starting accepts and then closes the connection (ZooKeeper:
        // "ZooKeeperServer not running"): try again, as a client does, for up to a minute.
        let until = Instant::now() + Duration::from_secs(60);
        let (stream, response) = loop {
            match Raw::handshake(port) {
                Ok(done) => break done,
                Err(_) if Instant::now() < until => std::thread::sleep(Duration::from_millis(200)),
                Err(e) => panic!("connect to {port}: {e}"),
            }
        };
        let mut r = Reader::new(&response);
        let (_, timeout, session) = (r.int().unwrap(), r.int().unwrap(), r.long().unwrap());
        assert_eq!(timeout, 30_000, "port {port}");
        Raw {
            stream,
            xid: 0,
            session,
        }
    }

    /// Connects and sends a ConnectRequest for a new session: the stream and the ConnectResponse.
    fn handshake(port: u16) -> std::io::Result<(TcpStream, Vec<u8>)> {
        let mut stream = TcpStream::connect(("127.0.0.1", port))?;
        stream.set_read_timeout(Some(Duration::from_secs(30)))?;
        frame(&mut stream, &connect(30_000, 0, &[0u8; 16]))?;
        let response = read_frame(&mut stream)?;
        Ok((stream, response))
    }

    /// Sends a request and returns its error code and response record (notifications skipped).
    fn call(&mut self, opcode: i32, body: &[u8]) -> (i32, Vec<u8>) {
        self.xid += 1;
        let xid = if opcode == op::AUTH { -4 } else { self.xid };
        let mut request = Vec::new();
        request.int(xid);
        request.int(opcode);
        request.extend_from_slice(body);
        frame(&mut self.stream, &request).unwrap();
        loop {
            let reply = read_frame(&mut self.stream).unwrap();
            let mut r = Reader::new(&reply);
            let (got, _, err) = (r.int().unwrap(), r.long().unwrap(), r.int().unwrap());
            if got == xid {
                return (err, reply[16..].to_vec());
            }
        }
    }
}

/// A Stat with what differs by nature masked: zxids and times as whether they are set, the owner
/// as SESSION when it is the caller's session.
fn stat_text(r: &mut Reader<'_>, session: i64) -> String {
    let s = Stat::read(r).unwrap();
    let owner = if s.ephemeral_owner == session {
        "SESSION".to_string()
    } else {
        format!("{:#x}", s.ephemeral_owner)
    };
    format!(
        "stat(version={} cversion={} aversion={} owner={owner} dataLength={} numChildren={} zxids={} times={})",
        s.version,
        s.cversion,
        s.aversion,
        s.data_length,
        s.num_children,
        s.czxid > 0 && s.mzxid >= s.czxid && s.pzxid >= s.czxid,
        s.ctime > 0 && s.mtime >= s.ctime,
    )
}

fn strings_text(r: &mut Reader<'_>) -> String {
    let mut v = r.strings().unwrap();
    v.sort();
    format!("{v:?}")
}

/// The response record of `opcode`, read from `r`, as comparable text.
fn record_text(opcode: i32, r: &mut Reader<'_>, session: i64) -> String {
    match opcode {
        op::CREATE | op::SYNC => r.string().unwrap(),
        op::CREATE2 | op::CREATE_CONTAINER | op::CREATE_TTL => {
            format!("{} {}", r.string().unwrap(), stat_text(r, session))
        }
        op::EXISTS | op::SET_DATA | op::SET_ACL => stat_text(r, session),
        op::GET_DATA => format!("{:?} {}", r.buffer().unwrap(), stat_text(r, session)),
        op::GET_CHILDREN => strings_text(r),
        op::GET_CHILDREN2 => format!("{} {}", strings_text(r), stat_text(r, session)),
        op::GET_ACL => format!("{:?} {}", Acl::read_all(r).unwrap(), stat_text(r, session)),
        op::GET_ALL_CHILDREN_NUMBER => r.int().unwrap().to_string(),
        op::GET_EPHEMERALS => strings_text(r),
        op::MULTI | op::MULTI_READ => {
            let mut parts = Vec::new();
            loop {
                let (kind, done, err) = (r.int().unwrap(), r.boolean().unwrap(), r.int().unwrap());
                if done {
                    break;
                }
                parts.push(match kind {
                    op::ERROR => format!("error {err}/{}", r.int().unwrap()),
                    op::DELETE | op::CHECK => "ok".into(),
                    other => format!("{other}: {}", record_text(other, r, session)),
                });
            }
            format!("{parts:?}")
        }
        _ => String::new(),
    }
}

/// The whole response of `opcode` as comparable text.
fn response_text(opcode: i32, body: &[u8], session: i64) -> String {
    let r = &mut Reader::new(body);
    let text = record_text(opcode, r, session);
    assert_eq!(r.remaining(), 0, "trailing bytes after {opcode}'s response");
    text
}

fn acl(scheme: &str, id: &str, perms: i32) -> Acl {
    Acl {
        perms,
        id: Id {
            scheme: scheme.into(),
            id: id.into(),
        },
    }
}

/// The probes, in order (each may depend on the ones before), with a name for the report.
fn probes() -> Vec<(&'static str, i32, Vec<u8>)> {
    let open = Acl::open();
    let ttl = {
        let mut b = create("/probe/ttl", b"", &open, 5);
        b.long(60_000);
        b
    };
    let mut auth = Vec::new();
    auth.int(0);
    auth.string("digest");
    auth.buffer(Some(b"user:secret"));
    vec![
        ("create", op::CREATE, create("/probe", b"data", &open, 0)),
        ("create existing", op::CREATE, create("/probe", b"", &open, 0)),
        ("create without parent", op::CREATE, create("/probe/x/y", b"", &open, 0)),
        ("create relative path", op::CREATE, create("probe2", b"", &open, 0)),
        ("create trailing slash", op::CREATE, create("/probe/", b"", &open, 0)),
        ("create dot segment", op::CREATE, create("/probe/./x", b"", &open, 0)),
        ("create bad flags", op::CREATE, create("/probe/f", b"", &open, 9)),
        ("create empty acl", op::CREATE, create("/probe/f", b"", &[], 0)),
        (
            "create world:someone",
            op::CREATE,
            create("/probe/f", b"", &[acl("world", "someone", perms::ALL)], 0),
        ),
        (
            "create auth unauthenticated",
            op::CREATE,
            create("/probe/f", b"", &[acl("auth", "", perms::ALL)], 0),
        ),
        (
            "create unknown scheme",
            op::CREATE,
            create("/probe/f", b"", &[acl("nope", "x", perms::ALL)], 0),
        ),
        ("create2", op::CREATE2, create("/probe/a", b"aa", &open, 0)),
        ("create2 ephemeral", op::CREATE2, create("/probe/a/e", b"", &open, 1)),
        (
            "create under ephemeral",
            op::CREATE,
            create("/probe/a/e/x", b"", &open, 0),
        ),
        ("create sequential", op::CREATE, create("/probe/s-", b"", &open, 2)),
        (
            "create ephemeral sequential",
            op::CREATE,
            create("/probe/s-", b"", &open, 3),
        ),
        ("create sequential bare", op::CREATE, create("/probe/", b"", &open, 2)),
        (
            "createContainer",
            op::CREATE_CONTAINER,
            create("/probe/c", b"", &open, 4),
        ),
        ("createTTL", op::CREATE_TTL, ttl),
        ("exists container", op::EXISTS, path_bool("/probe/c", false)),
        ("exists ttl", op::EXISTS, path_bool("/probe/ttl", false)),
        (
            "multi containers",
            op::MULTI,
            multi(&[
                (op::CREATE_CONTAINER, create("/probe/mc", b"", &open, 4)),
                (op::CREATE2, create("/probe/mc/x", b"", &open, 0)),
            ]),
        ),
        ("exists", op::EXISTS, path_bool("/probe", false)),
        ("exists missing", op::EXISTS, path_bool("/probe/none", false)),
        ("getData", op::GET_DATA, path_bool("/probe", false)),
        ("getData missing", op::GET_DATA, path_bool("/probe/none", false)),
        ("setData bad version", op::SET_DATA, set_data("/probe", b"new", 7)),
        ("setData", op::SET_DATA, set_data("/probe", b"new", 0)),
        ("setData any version", op::SET_DATA, set_data("/probe", b"newer", -1)),
        ("setData missing", op::SET_DATA, set_data("/probe/none", b"", -1)),
        ("getChildren", op::GET_CHILDREN, path_bool("/probe", false)),
        ("getChildren2", op::GET_CHILDREN2, path_bool("/probe", false)),
        ("getChildren missing", op::GET_CHILDREN, path_bool("/probe/none", false)),
        ("getAllChildrenNumber", op::GET_ALL_CHILDREN_NUMBER, path_only("/probe")),
        ("getEphemerals", op::GET_EPHEMERALS, path_only("/probe")),
        ("delete not empty", op::DELETE, path_int("/probe", -1)),
        ("delete bad version", op::DELETE, path_int("/probe/a", 5)),
        ("delete missing", op::DELETE, path_int("/probe/none", -1)),
        ("delete root", op::DELETE, path_int("/", -1)),
        ("delete /zookeeper", op::DELETE, path_int("/zookeeper", -1)),
        ("delete", op::DELETE, path_int("/probe/a/e", 0)),
        ("getACL", op::GET_ACL, path_only("/probe")),
        ("getACL missing", op::GET_ACL, path_only("/probe/none")),
        (
            "multi failing",
            op::MULTI,
            multi(&[
                (op::CREATE, create("/probe/m", b"", &open, 0)),
                (op::CHECK, path_int("/probe", 99)),
                (op::SET_DATA, set_data("/probe/a", b"", -1)),
            ]),
        ),
        (
            "multi",
            op::MULTI,
            multi(&[
                (op::CREATE, create("/probe/m", b"", &open, 0)),
                (op::CREATE2, create("/probe/m/n", b"x", &open, 0)),
                (op::CHECK, path_int("/probe/m", 0)),
                (op::SET_DATA, set_data("/probe/m", b"y", 0)),
                (op::DELETE, path_int("/probe/m/n", 0)),
            ]),
        ),
        (
            "multiRead",
            op::MULTI_READ,
            multi(&[
                (op::GET_DATA, path_bool("/probe/m", false)),
                (op::GET_CHILDREN, path_bool("/probe", false)),
                (op::GET_DATA, path_bool("/probe/none", false)),
            ]),
        ),
        ("sync", op::SYNC, path_only("/probe")),
        ("removeWatches none", op::REMOVE_WATCHES, path_int("/probe", 1)),
        ("auth digest", op::AUTH, auth),
        (
            "create auth acl",
            op::CREATE,
            create("/probe/mine", b"", &[acl("auth", "", perms::ALL)], 0),
        ),
        ("getACL digest", op::GET_ACL, path_only("/probe/mine")),
        ("setACL bad version", op::SET_ACL, {
            let mut b = path_only("/probe");
            Acl::write_all(&[acl("world", "anyone", perms::READ)], &mut b);
            b.int(4);
            b
        }),
        ("setACL read-only", op::SET_ACL, {
            let mut b = path_only("/probe");
            Acl::write_all(&[acl("world", "anyone", perms::READ)], &mut b);
            b.int(0);
            b
        }),
        ("setData not allowed", op::SET_DATA, set_data("/probe", b"x", -1)),
        ("create under read-only", op::CREATE, create("/probe/no", b"", &open, 0)),
        ("getData allowed", op::GET_DATA, path_bool("/probe", false)),
    ]
}

/// A ZooKeeper server, killed when dropped (also when a probe fails).
struct ZooKeeper(Child);

impl Drop for ZooKeeper {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts Apache ZooKeeper standalone on `port` with its data in `dir` (TTL nodes enabled).
fn start_zookeeper(dir: &std::path::Path, port: u16) -> ZooKeeper {
    let config = dir.join("zoo.cfg");
    std::fs::write(
        &config,
        format!(
            "tickTime=2000\ndataDir={}\nclientPort={port}\nadmin.enableServer=false\n",
            dir.display()
        ),
    )
    .unwrap();
    Command::new(ZK_SERVER)
        .args(["start-foreground"])
        .arg(&config)
        .env("ZOOCFGDIR", dir)
        .env("ZOO_LOG_DIR", dir)
        .env("SERVER_JVMFLAGS", "-Dzookeeper.extendedTypesEnabled=true")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map(ZooKeeper)
        .expect("start zkServer.sh")
}

#[test]
fn upright_zk_answers_every_probe_as_apache_zookeeper_does() {
    if !std::path::Path::new(ZK_SERVER).exists() {
        eprintln!("\n\n*** SKIPPED upright-zk probe table: apt-get install zookeeper ***\n\n");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // The demo holds its port once it has announced it, so ZooKeeper's is another.
    let ours_port = demo::free_port();
    let _demo = demo::start_service_demo("zk", ours_port, &format!("ZooKeeper protocol on 127.0.0.1:{ours_port}"));
    let zk_port = demo::free_port();
    assert_ne!(zk_port, ours_port);
    let zookeeper = start_zookeeper(dir.path(), zk_port);
    let mut theirs = Raw::connect(zk_port);
    let mut ours = Raw::connect(ours_port);
    let mut differences = Vec::new();
    for (name, opcode, body) in probes() {
        let (their_err, their_body) = theirs.call(opcode, &body);
        let (our_err, our_body) = ours.call(opcode, &body);
        let text = |err: i32, body: &[u8], session| {
            if err == 0 {
                response_text(opcode, body, session)
            } else {
                format!("({} bytes)", body.len())
            }
        };
        let their_text = text(their_err, &their_body, theirs.session);
        let our_text = text(our_err, &our_body, ours.session);
        println!("{name}: ZooKeeper {their_err} {their_text}");
        if (their_err, &their_text) != (our_err, &our_text) {
            differences.push(format!(
                "{name}:\n  ZooKeeper: {their_err} {their_text}\n  upright:   {our_err} {our_text}"
            ));
        }
    }
    drop(zookeeper);
    assert!(
        differences.is_empty(),
        "answers that differ:\n{}",
        differences.join("\n")
    );
}

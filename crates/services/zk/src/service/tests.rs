use super::*;
use crate::jute::Reader;
use upright_core::ids::{RequestId, SeqNo};

const GW: ClientId = ClientId(7);
const GW2: ClientId = ClientId(8);

/// A service driven one command per batch, at 1 ms steps of agreed time.
struct Harness {
    zk: ZkService,
    seqno: u64,
    time_us: u64,
    pushes: Vec<(ClientId, Event)>,
}

/// A parsed reply: header fields and the record after them.
struct Reply {
    answer: Answer,
    xid: i32,
    zxid: i64,
    err: i32,
    body: Vec<u8>,
}

impl Harness {
    fn new() -> Harness {
        Harness {
            zk: ZkService::new(),
            seqno: 0,
            time_us: 1_000_000,
            pushes: Vec::new(),
        }
    }

    fn context(&mut self) -> BatchContext {
        self.seqno += 1;
        self.time_us += 1_000;
        BatchContext {
            index: 0,
            seqno: SeqNo(self.seqno),
            time_us: self.time_us,
            seed: [self.seqno as u8; 32],
        }
    }

    fn run(&mut self, client: ClientId, command: Command) -> Answer {
        let context = self.context();
        let mut effects = Effects::default();
        if self.zk.wake_at().is_some_and(|at| at <= context.time_us) {
            self.zk.wake(&context, &mut effects);
        }
        let request = ServiceRequest {
            client,
            request_id: RequestId(self.seqno),
            operation: command.encode(),
        };
        let out = self.zk.execute(&context, &[request], &mut effects);
        self.collect(effects);
        upright_core::codec::from_bytes(&out[0]).unwrap()
    }

    fn collect(&mut self, mut effects: Effects) {
        for push in effects.take_pushes() {
            self.pushes
                .push((push.client, upright_core::codec::from_bytes(&push.payload).unwrap()));
        }
    }

    /// Advances agreed time to `time_us` with an empty batch (a heartbeat), waking the service.
    fn idle_until(&mut self, time_us: u64) {
        self.time_us = time_us - 1_000;
        let context = self.context();
        let mut effects = Effects::default();
        if self.zk.wake_at().is_some_and(|at| at <= context.time_us) {
            self.zk.wake(&context, &mut effects);
        }
        self.collect(effects);
    }

    /// A new session asking for `timeout_ms`: (id, password, granted timeout).
    fn connect(&mut self, client: ClientId, timeout_ms: i32) -> (i64, Bytes, i32) {
        let answer = self.run(
            client,
            Command::Connect {
                session: 0,
                password: Bytes::new(),
                timeout_ms,
            },
        );
        let mut r = Reader::new(&answer.bytes);
        assert_eq!(r.int(), Ok(0), "protocol version");
        let timeout = r.int().unwrap();
        let id = r.long().unwrap();
        let password = r.buffer().unwrap().unwrap();
        assert_eq!(r.boolean(), Ok(false));
        r.finish().unwrap();
        (id, password, timeout)
    }

    fn request(&mut self, client: ClientId, session: i64, opcode: i32, body: Vec<u8>) -> Reply {
        let answer = self.run(
            client,
            Command::Request {
                session,
                xid: 42,
                opcode,
                body: Bytes::from(body),
            },
        );
        parse(answer)
    }
}

fn parse(answer: Answer) -> Reply {
    let mut r = Reader::new(&answer.bytes);
    let (xid, zxid, err) = (r.int().unwrap(), r.long().unwrap(), r.int().unwrap());
    let body = answer.bytes[16..].to_vec();
    Reply {
        answer,
        xid,
        zxid,
        err,
        body,
    }
}

fn create_body(path: &str, data: &[u8], flags: i32) -> Vec<u8> {
    request::create(path, data, &Acl::open(), flags)
}

use crate::proto::request::{self, path_int as path_version, path_watch, set_data as set_body};

#[test]
fn sessions_get_a_negotiated_timeout_and_resume_with_their_password() {
    let mut h = Harness::new();
    let (id, password, timeout) = h.connect(GW, 100);
    assert_eq!(timeout, SESSION_TIMEOUT_MIN_MS);
    assert_ne!(id, 0);
    assert_eq!(password.len(), 16);
    let (other, other_password, timeout) = h.connect(GW, 1_000_000);
    assert_eq!(timeout, SESSION_TIMEOUT_MAX_MS);
    assert_ne!(other, id);
    assert_ne!(other_password, password);
    // Resume through another gateway: same session; its events now go there.
    let resumed = h.run(
        GW2,
        Command::Connect {
            session: id,
            password: password.clone(),
            timeout_ms: 6_000,
        },
    );
    assert_eq!(Reader::new(&resumed.bytes[8..]).long(), Ok(id));
    let wrong = h.run(
        GW2,
        Command::Connect {
            session: id,
            password: other_password,
            timeout_ms: 6_000,
        },
    );
    let mut r = Reader::new(&wrong.bytes);
    assert_eq!(
        (r.int(), r.int(), r.long()),
        (Ok(0), Ok(0), Ok(0)),
        "refused: zero timeout and session"
    );
}

#[test]
fn requests_answer_as_zookeeper_does_and_writes_move_the_zxid() {
    let mut h = Harness::new();
    let (s, _, _) = h.connect(GW, 10_000);
    let created = h.request(GW, s, op::CREATE, create_body("/a", b"hello", 0));
    assert_eq!((created.xid, created.err, created.zxid), (42, 0, 1));
    assert_eq!(Reader::new(&created.body).string(), Ok("/a".to_string()));
    assert_eq!(created.body.len(), 4 + 2, "create answers the path only");
    let created2 = h.request(GW, s, op::CREATE2, create_body("/b", b"", 0));
    assert_eq!(created2.body.len(), 4 + 2 + 68, "create2 adds the Stat");
    let dup = h.request(GW, s, op::CREATE, create_body("/a", b"", 0));
    assert_eq!((dup.err, dup.zxid, dup.body.len()), (Code::NodeExists.value(), 2, 0));
    let got = h.request(GW, s, op::GET_DATA, path_watch("/a", false));
    let mut r = Reader::new(&got.body);
    assert_eq!(r.buffer(), Ok(Some(Bytes::from_static(b"hello"))));
    let stat = Stat::read(&mut r).unwrap();
    assert_eq!((stat.czxid, stat.data_length, stat.version), (1, 5, 0));
    assert_eq!(got.zxid, 2, "a read moves nothing");
    let set = h.request(GW, s, op::SET_DATA, set_body("/a", b"x", 0));
    assert_eq!(Stat::read(&mut Reader::new(&set.body)).unwrap().version, 1);
    let stale = h.request(GW, s, op::SET_DATA, set_body("/a", b"y", 0));
    assert_eq!(stale.err, Code::BadVersion.value());
    let missing = h.request(GW, s, op::EXISTS, path_watch("/none", false));
    assert_eq!((missing.err, missing.body.len()), (Code::NoNode.value(), 0));
    let children = h.request(GW, s, op::GET_CHILDREN2, path_watch("/", false));
    let mut r = Reader::new(&children.body);
    assert_eq!(r.strings(), Ok(vec!["a".to_string(), "b".into(), "zookeeper".into()]));
    assert_eq!(Stat::read(&mut r).unwrap().num_children, 3);
    let deleted = h.request(GW, s, op::DELETE, path_version("/a", -1));
    assert_eq!((deleted.err, deleted.zxid), (0, 4));
    let bogus = h.request(GW, s, 999, Vec::new());
    assert_eq!(bogus.err, Code::Unimplemented.value());
    let truncated = h.request(GW, s, op::GET_DATA, vec![0, 0, 0, 9]);
    assert_eq!(truncated.err, Code::MarshallingError.value());
    let expired = h.request(GW, 12345, op::GET_DATA, path_watch("/b", false));
    assert_eq!(expired.err, Code::SessionExpired.value());
}

#[test]
fn watches_push_events_before_the_reply_that_shows_the_change() {
    let mut h = Harness::new();
    let (a, _, _) = h.connect(GW, 10_000);
    let (b, _, _) = h.connect(GW2, 10_000);
    h.request(GW, a, op::CREATE, create_body("/w", b"1", 0));
    let watched = h.request(GW, a, op::GET_DATA, path_watch("/w", true));
    assert_eq!(watched.answer.events, 0);
    h.request(GW, a, op::EXISTS, path_watch("/w/new", true));
    h.request(GW, a, op::GET_CHILDREN, path_watch("/w", true));
    h.request(GW2, b, op::SET_DATA, set_body("/w", b"2", -1));
    h.request(GW2, b, op::CREATE, create_body("/w/new", b"", 0));
    let events: Vec<(ClientId, i64, u64, i32, String)> = h
        .pushes
        .iter()
        .map(|(to, e)| {
            let mut r = Reader::new(&e.bytes);
            assert_eq!((r.int(), r.long(), r.int()), (Ok(NOTIFICATION_XID), Ok(-1), Ok(0)));
            let kind = r.int().unwrap();
            assert_eq!(r.int(), Ok(STATE_SYNC_CONNECTED));
            (*to, e.session, e.seq, kind, r.string().unwrap())
        })
        .collect();
    assert_eq!(
        events,
        [
            (GW, a, 1, crate::watches::event::NODE_DATA_CHANGED, "/w".to_string()),
            (GW, a, 2, crate::watches::event::NODE_CREATED, "/w/new".to_string()),
            (GW, a, 3, crate::watches::event::NODE_CHILDREN_CHANGED, "/w".to_string()),
        ]
    );
    // a's next reply says three events came before it: the gateway writes them first.
    let read = h.request(GW, a, op::GET_DATA, path_watch("/w", false));
    assert_eq!(read.answer.events, 3);
    // One-shot: another change fires nothing for a.
    h.request(GW2, b, op::SET_DATA, set_body("/w", b"3", -1));
    assert_eq!(h.pushes.len(), 3);
    // A failed read leaves no watch.
    h.request(GW, a, op::GET_DATA, path_watch("/none", true));
    h.request(GW2, b, op::CREATE, create_body("/none", b"", 0));
    assert_eq!(h.pushes.len(), 3);
}

#[test]
fn a_session_expires_on_agreed_time_and_its_ephemerals_go() {
    let mut h = Harness::new();
    let (owner, _, timeout) = h.connect(GW, 4_000);
    let (watcher, _, _) = h.connect(GW2, 40_000);
    h.request(GW, owner, op::CREATE, create_body("/lock", b"", 1));
    h.request(GW2, watcher, op::EXISTS, path_watch("/lock", true));
    let deadline = h.zk.wake_at().unwrap();
    assert_eq!(
        deadline,
        h.time_us - 1_000 + timeout as u64 * 1_000,
        "the owner's last request + its timeout"
    );
    // A touch moves the deadline; an unknown session is reported gone.
    let touched = h.run(
        GW,
        Command::Touch {
            sessions: vec![owner, 999],
        },
    );
    let gone: Vec<i64> = upright_core::codec::from_bytes(&touched.bytes).unwrap();
    assert_eq!(gone, [999]);
    let deadline = h.zk.wake_at().unwrap();
    h.idle_until(deadline - 1);
    assert!(h.zk.tree().get("/lock").is_some(), "not before its deadline");
    h.idle_until(deadline);
    assert!(
        h.zk.tree().get("/lock").is_none(),
        "the ephemeral went with the session"
    );
    assert!(!h.zk.sessions().any(|s| s == owner));
    assert_eq!(h.pushes.len(), 1);
    assert_eq!(h.pushes[0].1.session, watcher);
    let after = h.request(GW, owner, op::GET_DATA, path_watch("/", false));
    assert_eq!(after.err, Code::SessionExpired.value());
    // closeSession ends it at once.
    let (s, _, _) = h.connect(GW, 4_000);
    h.request(GW, s, op::CREATE, create_body("/e", b"", 1));
    assert_eq!(h.request(GW, s, op::CLOSE_SESSION, Vec::new()).err, 0);
    assert!(h.zk.tree().get("/e").is_none());
}

fn multi_body(ops: &[(i32, Vec<u8>)]) -> Vec<u8> {
    request::multi(ops)
}

#[test]
fn a_multi_answers_each_op_and_fails_whole() {
    let mut h = Harness::new();
    let (s, _, _) = h.connect(GW, 10_000);
    let ok = h.request(
        GW,
        s,
        op::MULTI,
        multi_body(&[
            (op::CREATE, create_body("/t", b"", 0)),
            (op::CREATE2, create_body("/t/x", b"", 0)),
            (op::CHECK, path_version("/t", 0)),
        ]),
    );
    assert_eq!((ok.err, ok.zxid), (0, 1), "one zxid for the whole multi");
    let mut r = Reader::new(&ok.body);
    assert_eq!((r.int(), r.boolean(), r.int()), (Ok(op::CREATE), Ok(false), Ok(0)));
    assert_eq!(r.string(), Ok("/t".to_string()));
    // Inside a multi ZooKeeper answers create2 as a plain create (no Stat).
    assert_eq!((r.int(), r.boolean(), r.int()), (Ok(op::CREATE), Ok(false), Ok(0)));
    assert_eq!(r.string(), Ok("/t/x".to_string()));
    assert_eq!((r.int(), r.boolean(), r.int()), (Ok(op::CHECK), Ok(false), Ok(0)));
    assert_eq!((r.int(), r.boolean(), r.int()), (Ok(-1), Ok(true), Ok(-1)));
    r.finish().unwrap();
    let failed = h.request(
        GW,
        s,
        op::MULTI,
        multi_body(&[
            (op::CREATE, create_body("/u", b"", 0)),
            (op::CHECK, path_version("/t", 5)),
            (op::DELETE, path_version("/t/x", -1)),
        ]),
    );
    assert_eq!(
        (failed.err, failed.zxid),
        (0, 1),
        "the header says OK; nothing was written"
    );
    let mut r = Reader::new(&failed.body);
    for code in [Code::Ok, Code::BadVersion, Code::RuntimeInconsistency] {
        assert_eq!(
            (r.int(), r.boolean(), r.int()),
            (Ok(op::ERROR), Ok(false), Ok(code.value()))
        );
        assert_eq!(r.int(), Ok(code.value()));
    }
    assert!(h.zk.tree().get("/u").is_none() && h.zk.tree().get("/t/x").is_some());
}

#[test]
fn digest_auth_matches_the_ids_clients_compute() {
    // ZooKeeper's documentation: the superuser digest for "super:admin".
    assert_eq!(digest_id("super:admin").unwrap(), "super:xQJmxLMiHGwaqBvst5y6rkB6HQs=");
    let mut h = Harness::new();
    let (alice, _, _) = h.connect(GW, 10_000);
    let (bob, _, _) = h.connect(GW, 10_000);
    let mut auth = Vec::new();
    auth.int(0);
    auth.string("digest");
    auth.buffer(Some(b"alice:secret"));
    assert_eq!(h.request(GW, alice, op::AUTH, auth).err, 0);
    let mut bad = Vec::new();
    bad.int(0);
    bad.string("ip");
    bad.buffer(Some(b"127.0.0.1"));
    assert_eq!(h.request(GW, bob, op::AUTH, bad).err, Code::AuthFailed.value());
    let mut body = Vec::new();
    body.string("/alice");
    body.buffer(Some(b"mine"));
    Acl::write_all(
        &[Acl {
            perms: crate::proto::perms::ALL,
            id: Id {
                scheme: "digest".into(),
                id: digest_id("alice:secret").unwrap(),
            },
        }],
        &mut body,
    );
    body.int(0);
    assert_eq!(h.request(GW, alice, op::CREATE, body).err, 0);
    assert_eq!(h.request(GW, alice, op::GET_DATA, path_watch("/alice", false)).err, 0);
    assert_eq!(
        h.request(GW, bob, op::GET_DATA, path_watch("/alice", false)).err,
        Code::NoAuth.value()
    );
}

#[test]
fn plain_reads_take_the_read_only_path_and_the_state_checkpoints_with_its_pages() {
    let mut h = Harness::new();
    let (s, _, _) = h.connect(GW, 10_000);
    h.request(GW, s, op::CREATE, create_body("/r", b"v", 0));
    let read = |watch| {
        Command::Request {
            session: s,
            xid: 42,
            opcode: op::GET_DATA,
            body: Bytes::from(path_watch("/r", watch)),
        }
        .encode()
    };
    let fast = h.zk.execute_read_only(&read(false)).expect("a plain read");
    let ordered = h.request(GW, s, op::GET_DATA, path_watch("/r", false));
    assert_eq!(
        upright_core::codec::from_bytes::<Answer>(&fast).unwrap(),
        ordered.answer
    );
    assert!(h.zk.execute_read_only(&read(true)).is_none(), "a watch is agreed state");
    let write = Command::Request {
        session: s,
        xid: 1,
        opcode: op::SET_DATA,
        body: Bytes::from(set_body("/r", b"w", -1)),
    };
    assert!(h.zk.execute_read_only(&write.encode()).is_none());
    h.request(GW, s, op::GET_DATA, path_watch("/r", true));
    // The nodes travel as pages (as a state transfer installs them), the rest as the checkpoint.
    let mut copy = ZkService::new();
    assert!(!copy.checkpoint().is_empty());
    copy.nodes = h.zk.nodes.clone();
    copy.restore(&h.zk.checkpoint()).unwrap();
    assert_eq!(copy, h.zk, "sessions, watches, tree, pages and zxid");
    assert_eq!(
        copy.tree().get("/r").map(|n| n.data.clone()),
        Some(Bytes::from_static(b"v"))
    );
    assert_eq!(copy.checkpoint(), h.zk.checkpoint());
    assert!(copy.restore(b"garbage").is_err());
    // Without the pages there is no tree: the checkpoint alone does not carry the nodes.
    let mut bare = ZkService::new();
    bare.nodes.pages = upright_core::pages::Pages::new();
    assert!(bare.restore(&h.zk.checkpoint()).is_err());
}

/// The nodes are in pages, one bucket of nodes per page (or several pages for a bucket of large
/// nodes): a write changes the pages of its node and its parent, nothing else, and the pages
/// give back the same tree.
#[test]
fn nodes_live_in_pages_and_a_write_changes_only_its_buckets() {
    use super::paged::{bucket, NODE_BUCKETS};
    let mut h = Harness::new();
    let (s, _, _) = h.connect(GW, 10_000);
    h.request(GW, s, op::CREATE, create_body("/app", b"", 0));
    for i in 0..50 {
        h.request(GW, s, op::CREATE, create_body(&format!("/app/n{i}"), b"x", 0));
    }
    h.zk.nodes.pages.freeze();
    h.request(GW, s, op::SET_DATA, set_body("/app/n7", b"changed", -1));
    let changed = h.zk.nodes.pages.changed_indices();
    assert_eq!(
        changed,
        vec![bucket("/app/n7")],
        "setData rewrites its node's bucket only"
    );
    h.zk.nodes.pages.freeze();
    h.request(GW, s, op::DELETE, path_version("/app/n8", -1));
    let mut want = vec![bucket("/app/n8"), bucket("/app")];
    want.sort();
    want.dedup();
    assert_eq!(
        h.zk.nodes.pages.changed_indices(),
        want,
        "delete: the node's and its parent's"
    );
    // A large node spans pieces of its bucket: page k * NODE_BUCKETS + bucket.
    let big = vec![b'z'; 900_000];
    h.request(GW, s, op::CREATE, create_body("/big", &big, 0));
    let b = bucket("/big");
    for k in 0..14 {
        assert!(
            !h.zk.nodes.pages.get(k * NODE_BUCKETS + b).unwrap().is_empty(),
            "piece {k}"
        );
    }
    let records = h.zk.nodes.records().unwrap();
    let mut rebuilt = crate::tree::Tree::default();
    rebuilt.load(records).unwrap();
    assert_eq!(&rebuilt, h.zk.tree());
    // Deleting it empties the pieces it took.
    h.request(GW, s, op::DELETE, path_version("/big", -1));
    assert!(h.zk.nodes.pages.get(NODE_BUCKETS + b).unwrap().is_empty());
}

#[test]
fn the_corrupting_stand_in_lies_in_every_reply_and_event_but_keeps_its_state() {
    let mut honest = Harness::new();
    let mut liar = Corrupting::default();
    let (s, _, _) = honest.connect(GW, 10_000);
    honest.request(GW, s, op::GET_DATA, path_watch("/zookeeper", true));
    let context = honest.context();
    let mut liar_state = honest.zk.clone();
    std::mem::swap(&mut liar.0, &mut liar_state);
    let request = ServiceRequest {
        client: GW,
        request_id: RequestId(99),
        operation: Command::Request {
            session: s,
            xid: 1,
            opcode: op::SET_DATA,
            body: Bytes::from(set_body("/zookeeper", b"x", -1)),
        }
        .encode(),
    };
    let (mut good, mut bad) = (Effects::default(), Effects::default());
    let right = honest.zk.execute(&context, std::slice::from_ref(&request), &mut good);
    let wrong = liar.execute(&context, std::slice::from_ref(&request), &mut bad);
    assert_ne!(right, wrong);
    assert_eq!(good.pushes().len(), 1);
    assert_ne!(good.pushes(), bad.pushes());
    assert_eq!(liar.0, honest.zk, "its state stays right, pages included");
}

fn events_of(h: &Harness, from: usize) -> Vec<(i32, String)> {
    h.pushes[from..]
        .iter()
        .map(|(_, e)| {
            let mut r = Reader::new(&e.bytes[16..]);
            let kind = r.int().unwrap();
            r.int().unwrap();
            (kind, r.string().unwrap())
        })
        .collect()
}

#[test]
fn set_watches_after_a_reconnect_fires_what_the_client_missed() {
    use crate::watches::event;
    let mut h = Harness::new();
    let (a, _, _) = h.connect(GW, 10_000);
    let (b, _, _) = h.connect(GW2, 10_000);
    h.request(GW, a, op::CREATE, create_body("/w", b"", 0));
    h.request(GW, a, op::CREATE, create_body("/same", b"", 0));
    let seen = h.request(GW, a, op::GET_DATA, path_watch("/w", true)).zxid;
    // While a is away: /w changes (its event is lost with the old connection), /new appears.
    h.request(GW2, b, op::SET_DATA, set_body("/w", b"x", -1));
    h.request(GW2, b, op::CREATE, create_body("/new", b"", 0));
    let before = h.pushes.len();
    let mut body = Vec::new();
    body.long(seen);
    body.strings(&["/w".into(), "/same".into(), "/gone".into()]);
    body.strings(&["/new".into(), "/absent".into()]);
    body.strings(&["/".into()]);
    let answer = h.request(GW, a, op::SET_WATCHES, body);
    assert_eq!(answer.err, 0);
    assert_eq!(
        events_of(&h, before),
        [
            (event::NODE_DATA_CHANGED, "/w".to_string()),
            (event::NODE_DELETED, "/gone".to_string()),
            (event::NODE_CREATED, "/new".to_string()),
            (event::NODE_CHILDREN_CHANGED, "/".to_string()),
        ]
    );
    assert_eq!(
        answer.answer.events, h.zk.sessions[&a].events,
        "the reply follows its events"
    );
    // The ones that had not fired are watched again, and only those.
    let before = h.pushes.len();
    h.request(GW2, b, op::SET_DATA, set_body("/same", b"y", -1));
    h.request(GW2, b, op::CREATE, create_body("/absent", b"", 0));
    h.request(GW2, b, op::SET_DATA, set_body("/w", b"z", -1));
    assert_eq!(
        events_of(&h, before),
        [
            (event::NODE_DATA_CHANGED, "/same".to_string()),
            (event::NODE_CREATED, "/absent".to_string()),
        ]
    );
}

#[test]
fn persistent_watches_stay_until_removed() {
    use crate::watches::event;
    let mut h = Harness::new();
    let (a, _, _) = h.connect(GW, 10_000);
    assert_eq!(h.request(GW, a, op::ADD_WATCH, path_version("/p", 1)).err, 0);
    assert_eq!(
        h.request(GW, a, op::ADD_WATCH, path_version("/p", 7)).err,
        Code::BadArguments.value()
    );
    h.request(GW, a, op::CREATE, create_body("/p", b"", 0));
    h.request(GW, a, op::CREATE, create_body("/p/x", b"", 0));
    h.request(GW, a, op::SET_DATA, set_body("/p/x", b"1", -1));
    h.request(GW, a, op::SET_DATA, set_body("/p/x", b"2", -1));
    assert_eq!(
        events_of(&h, 0),
        [
            (event::NODE_CREATED, "/p".to_string()),
            (event::NODE_CREATED, "/p/x".to_string()),
            (event::NODE_DATA_CHANGED, "/p/x".to_string()),
            (event::NODE_DATA_CHANGED, "/p/x".to_string()),
        ]
    );
    assert_eq!(h.request(GW, a, op::CHECK_WATCHES, path_version("/p", 5)).err, 0);
    assert_eq!(
        h.request(GW, a, op::CHECK_WATCHES, path_version("/p", 1)).err,
        Code::NoWatcher.value()
    );
    assert_eq!(h.request(GW, a, op::REMOVE_WATCHES, path_version("/p", 3)).err, 0);
    assert_eq!(
        h.request(GW, a, op::REMOVE_WATCHES, path_version("/p", 5)).err,
        Code::NoWatcher.value()
    );
    h.request(GW, a, op::SET_DATA, set_body("/p/x", b"3", -1));
    assert_eq!(h.pushes.len(), 4, "removed");
}

#[test]
fn multi_read_answers_each_read_on_its_own() {
    let mut h = Harness::new();
    let (s, _, _) = h.connect(GW, 10_000);
    h.request(GW, s, op::CREATE, create_body("/a", b"va", 0));
    let body = multi_body(&[
        (op::GET_DATA, path_watch("/a", false)),
        (op::GET_CHILDREN, path_watch("/", false)),
        (op::GET_DATA, path_watch("/missing", false)),
    ]);
    let ordered = h.request(GW, s, op::MULTI_READ, body.clone());
    assert_eq!(ordered.err, 0);
    let mut r = Reader::new(&ordered.body);
    assert_eq!((r.int(), r.boolean(), r.int()), (Ok(op::GET_DATA), Ok(false), Ok(0)));
    assert_eq!(r.buffer(), Ok(Some(Bytes::from_static(b"va"))));
    Stat::read(&mut r).unwrap();
    assert_eq!(
        (r.int(), r.boolean(), r.int()),
        (Ok(op::GET_CHILDREN), Ok(false), Ok(0))
    );
    assert_eq!(r.strings(), Ok(vec!["a".to_string(), "zookeeper".into()]));
    let no_node = Code::NoNode.value();
    assert_eq!(
        (r.int(), r.boolean(), r.int(), r.int()),
        (Ok(op::ERROR), Ok(false), Ok(no_node), Ok(no_node))
    );
    assert_eq!((r.int(), r.boolean(), r.int()), (Ok(-1), Ok(true), Ok(-1)));
    r.finish().unwrap();
    let fast = Command::Request {
        session: s,
        xid: 42,
        opcode: op::MULTI_READ,
        body: Bytes::from(body),
    };
    let fast = h.zk.execute_read_only(&fast.encode()).expect("multiRead is a read");
    assert_eq!(
        upright_core::codec::from_bytes::<Answer>(&fast).unwrap(),
        ordered.answer
    );
}

#[test]
fn empty_containers_and_expired_ttl_nodes_are_swept_on_agreed_time() {
    let mut h = Harness::new();
    let (s, _, _) = h.connect(GW, 40_000);
    h.request(GW, s, op::CREATE_CONTAINER, create_body("/c", b"", 4));
    h.request(GW, s, op::CREATE_CONTAINER, create_body("/never-used", b"", 4));
    h.request(GW, s, op::CREATE, create_body("/c/child", b"", 0));
    let mut ttl = create_body("/t", b"", 5);
    ttl.long(30_000);
    assert_eq!(h.request(GW, s, op::CREATE_TTL, ttl).err, 0);
    h.request(GW, s, op::EXISTS, path_watch("/c", true));
    let sweep = h.zk.next_sweep_us.expect("a sweep is scheduled");
    assert_eq!(h.zk.wake_at(), Some(sweep.min(h.zk.deadlines.first().unwrap().0)));
    // Agreed time moves in steps of 20 s, the session touched at each (it lives 40 s).
    let advance = |h: &mut Harness, to: u64| {
        while h.time_us < to {
            h.time_us = (h.time_us + 20_000_000).min(to) - 1_000;
            h.run(GW, Command::Touch { sessions: vec![s] });
        }
    };
    // The container still has its child: it stays; the TTL node, untouched for 60 s > 30 s, goes.
    advance(&mut h, sweep);
    assert!(h.zk.tree().get("/c").is_some());
    assert!(h.zk.tree().get("/t").is_none(), "a TTL node untouched for its TTL goes");
    assert!(h.zk.next_sweep_us.unwrap() > sweep, "the next look is scheduled");
    h.request(GW, s, op::DELETE, path_version("/c/child", -1));
    let next = h.zk.next_sweep_us.unwrap();
    advance(&mut h, next);
    assert!(h.zk.tree().get("/c").is_none(), "an emptied container goes");
    assert!(
        h.zk.tree().get("/never-used").is_some(),
        "one that never had children stays"
    );
    let deleted: Vec<_> = h.pushes.iter().map(|(_, e)| e.session).collect();
    assert_eq!(deleted, [s], "the watch on /c fired");
    assert!(h.zk.next_sweep_us.is_some(), "/never-used is still looked at");
}

/// Runs `requests` (client, command) as one batch at `seqno`, from `index` on.
fn batch(zk: &mut ZkService, seqno: u64, index: u32, requests: &[(ClientId, Command)]) -> Vec<Reply> {
    let context = BatchContext {
        index,
        seqno: SeqNo(seqno),
        time_us: 1_000_000 + seqno * 1_000,
        seed: [seqno as u8; 32],
    };
    let requests: Vec<ServiceRequest> = requests
        .iter()
        .enumerate()
        .map(|(i, (client, command))| ServiceRequest {
            client: *client,
            request_id: RequestId(seqno * 100 + u64::from(index) + i as u64),
            operation: command.encode(),
        })
        .collect();
    let out = zk.execute(&context, &requests, &mut Effects::default());
    out.into_iter()
        .map(|a| parse(upright_core::codec::from_bytes(&a).unwrap()))
        .collect()
}

/// New sessions through `gateways` on two members (a connect is global: both run it), in batch
/// 1 one after another; their ids.
fn connect_on_both(all: &mut ZkService, some: &mut ZkService, gateways: &[ClientId]) -> Vec<i64> {
    let connect = Command::Connect {
        session: 0,
        password: Bytes::new(),
        timeout_ms: 30_000,
    };
    let mut sessions = Vec::new();
    for (index, gateway) in gateways.iter().enumerate() {
        let request = [(*gateway, connect.clone())];
        let reply = batch(all, 1, index as u32, &request).remove(0);
        batch(some, 1, index as u32, &request);
        sessions.push(Reader::new(&reply.answer.bytes[8..]).long().unwrap());
    }
    sessions
}

fn call(session: i64, opcode: i32, body: Vec<u8>) -> Command {
    Command::Request {
        session,
        xid: 42,
        opcode,
        body: Bytes::from(body),
    }
}

/// Two members under selective execution's rules: `all` runs every write, `some` only those on
/// `/a` (it skipped the writes on `/b`, another member's objects). A write on `/a` is answered
/// alike, and leaves the same node, on both: its zxid is its agreed position, not the next of a
/// counter the skipped writes moved on `all` only. Without the rules the two differ.
#[test]
fn under_positions_a_write_gets_its_agreed_position_whichever_member_runs_it() {
    for positions in [true, false] {
        let (mut all, mut some) = (ZkService::new(), ZkService::new());
        if positions {
            all.use_positions();
            some.use_positions();
        }
        let s = connect_on_both(&mut all, &mut some, &[GW])[0];
        let on_b = call(s, op::CREATE, create_body("/b", b"", 0));
        let on_a = call(s, op::CREATE2, create_body("/a", b"x", 0));
        // Batch 2: a write on /b, then one on /a. `some` runs the second alone, at index 1.
        let a_all = batch(&mut all, 2, 0, &[(GW, on_b), (GW, on_a.clone())]).remove(1);
        let a_some = batch(&mut some, 2, 1, &[(GW, on_a)]).remove(0);
        let set = call(s, op::SET_DATA, set_body("/a", b"y", 0));
        let set_all = batch(&mut all, 3, 0, &[(GW, set.clone())]).remove(0);
        let set_some = batch(&mut some, 3, 0, &[(GW, set)]).remove(0);
        let node = |zk: &ZkService| zk.tree().get("/a").cloned();
        if positions {
            assert_eq!(a_all.zxid, position_zxid(2, Some(1)));
            assert_eq!(set_all.zxid, position_zxid(3, Some(0)));
            assert_eq!(
                (a_all.zxid, &a_all.body, set_all.zxid, &set_all.body),
                (a_some.zxid, &a_some.body, set_some.zxid, &set_some.body)
            );
            assert_eq!(node(&all), node(&some));
            assert_eq!(node(&all).unwrap().stat.czxid, position_zxid(2, Some(1)));
            assert!(
                position_zxid(2, None) < a_all.zxid && a_all.zxid < set_all.zxid,
                "increasing"
            );
        } else {
            assert_ne!(a_all.zxid, a_some.zxid, "the counter counts the skipped write");
            assert_ne!(node(&all), node(&some));
        }
    }
}

/// Under selective execution's rules a request is not a session's heartbeat (it would write
/// session state, which only global commands may): the session expires its timeout after the
/// connect however many requests it sends, unless the gateway's Touch moves the deadline.
#[test]
fn under_positions_only_touch_keeps_a_session_alive() {
    for positions in [true, false] {
        let mut h = Harness::new();
        if positions {
            h.zk.use_positions();
        }
        let (s, _, timeout) = h.connect(GW, 4_000);
        let expiry = h.time_us + timeout as u64 * 1_000;
        while h.time_us + 1_000 < expiry {
            let read = h.request(GW2, s, op::GET_DATA, path_watch("/", false));
            assert_eq!(read.err, 0);
        }
        let late = h.request(GW2, s, op::GET_DATA, path_watch("/", false));
        let expired = late.err == Code::SessionExpired.value();
        assert_eq!(expired, positions, "positions: {positions}");
        if positions {
            // A touched session lives on.
            let (t, _, timeout) = h.connect(GW, 4_000);
            let until = h.time_us + 3 * timeout as u64 * 1_000;
            while h.time_us < until {
                h.run(GW, Command::Touch { sessions: vec![t] });
            }
            assert_eq!(h.request(GW, t, op::PING, Vec::new()).err, 0);
        }
    }
}

/// Under selective execution's rules a member that skipped the writes on some znodes catches up
/// by installing those znodes' object states from a member that ran them (what a checkpoint's
/// OBJECT-CP brings): nodes (sequential and ephemeral ones, a container), their parents'
/// children and cversions, and the one-shot watches on them, exist watches on absent paths
/// included. Its tree, watches, pages and checkpoint are then the other's, and later writes
/// and a session's close run alike on both.
#[test]
fn object_states_bring_a_member_that_skipped_writes_to_the_same_state() {
    let (mut all, mut some) = (ZkService::new(), ZkService::new());
    all.use_positions();
    some.use_positions();
    let [s1, s2] = connect_on_both(&mut all, &mut some, &[GW, GW2])[..] else {
        unreachable!("two gateways, two sessions")
    };
    const SEQUENTIAL_EPHEMERAL: i32 = 3;
    const CONTAINER: i32 = 4;
    let on_q = [
        (GW, call(s1, op::CREATE, create_body("/q", b"queue", 0))),
        (
            GW,
            call(s1, op::CREATE, create_body("/q/lock-", b"", SEQUENTIAL_EPHEMERAL)),
        ),
        (
            GW,
            call(s1, op::CREATE, create_body("/q/lock-", b"", SEQUENTIAL_EPHEMERAL)),
        ),
        (GW2, call(s2, op::GET_CHILDREN, path_watch("/q", true))),
        (GW2, call(s2, op::EXISTS, path_watch("/q/absent", true))),
        (GW, call(s1, op::SET_DATA, set_body("/q", b"q2", -1))),
        (GW, call(s1, op::CREATE_CONTAINER, create_body("/c", b"", CONTAINER))),
        (GW, call(s1, op::CREATE, create_body("/c/k", b"", 0))),
    ];
    let on_x = [
        (GW, call(s1, op::CREATE, create_body("/x", b"x", 0))),
        (GW2, call(s2, op::GET_DATA, path_watch("/x", true))),
    ];
    // `all` runs every write; `some` only those on /x, each at its own position.
    let mut seqno = 2;
    let mut skipped = std::collections::BTreeSet::new();
    for (i, request) in on_q.iter().enumerate() {
        batch(&mut all, seqno, 0, std::slice::from_ref(request));
        skipped.extend(all.access(&request.1.encode()).unwrap().writes);
        if let Some(x) = on_x.get(i) {
            let both = batch(&mut all, seqno + 1, 0, std::slice::from_ref(x));
            let one = batch(&mut some, seqno + 1, 0, std::slice::from_ref(x));
            assert_eq!(both[0].body, one[0].body);
        }
        seqno += 2;
    }
    assert_ne!(all.tree(), some.tree());
    assert_ne!(all.checkpoint(), some.checkpoint());
    assert!(skipped.contains(&Bytes::from("n//q/lock-")), "{skipped:?}");
    assert!(all.object_state(b"n//q/lock-").unwrap().is_some());
    assert_eq!(all.object_state(b"n//nothing").unwrap(), None);
    for object in &skipped {
        let state = all.object_state(object).unwrap();
        some.restore_object(object, state.as_deref()).unwrap();
    }
    assert_eq!(all.tree(), some.tree());
    assert_eq!(all.checkpoint(), some.checkpoint());
    let pages = |zk: &ZkService| {
        let p = zk.pages().unwrap();
        (0..p.len()).map(|i| p.get(i)).collect::<Vec<_>>()
    };
    assert!(pages(&all) == pages(&some), "the same pages");
    // Installing again changes nothing; a wrong object is refused.
    let state = all.object_state(b"n//q").unwrap();
    some.restore_object(b"n//q", state.as_deref()).unwrap();
    assert_eq!(all.checkpoint(), some.checkpoint());
    assert!(some.restore_object(b"n//x", state.as_deref()).is_err());
    assert!(some.restore_object(b"not a znode", None).is_err());
    // Then both run on alike: a write on /q, and s1's close (its ephemerals go everywhere).
    let next = [
        (
            GW,
            call(s1, op::CREATE2, create_body("/q/lock-", b"", SEQUENTIAL_EPHEMERAL)),
        ),
        (GW, call(s1, op::CLOSE_SESSION, Vec::new())),
    ];
    let a = batch(&mut all, seqno, 0, &next);
    let b = batch(&mut some, seqno, 0, &next);
    assert_eq!((&a[0].body, a[1].err), (&b[0].body, b[1].err));
    assert_eq!(Reader::new(&a[0].body).string(), Ok("/q/lock-0000000002".to_string()));
    assert!(
        all.tree().get("/q/lock-0000000000").is_none(),
        "closed: ephemerals gone"
    );
    assert_eq!(all.tree(), some.tree());
    assert_eq!(all.checkpoint(), some.checkpoint());
}

/// Under selective execution's rules the sweep of containers and TTL nodes comes every interval
/// whether or not there are any (that is state of other nodes, which a write may not read to
/// schedule it), first at the first batch; it still deletes an emptied container on time.
#[test]
fn under_positions_the_sweep_comes_every_interval() {
    let mut h = Harness::new();
    h.zk.use_positions();
    assert_eq!(
        h.zk.wake_at(),
        Some(0),
        "the first batch sweeps (and schedules the next)"
    );
    let (s, _, _) = h.connect(GW, 40_000);
    let first = h.zk.next_sweep_us.expect("scheduled by the first wake-up");
    h.request(GW, s, op::CREATE_CONTAINER, create_body("/c", b"", 4));
    h.request(GW, s, op::CREATE, create_body("/c/child", b"", 0));
    assert_eq!(h.zk.next_sweep_us, Some(first), "a write does not schedule it");
    h.request(GW, s, op::DELETE, path_version("/c/child", -1));
    while h.time_us < first {
        h.time_us = (h.time_us + 20_000_000).min(first) - 1_000;
        h.run(GW, Command::Touch { sessions: vec![s] });
    }
    assert!(h.zk.tree().get("/c").is_none(), "an emptied container goes");
    assert_eq!(
        h.zk.next_sweep_us,
        Some(h.time_us + SWEEP_INTERVAL_US),
        "the next one interval on"
    );
}

/// An event carries the zxid of the write that caused it (a write's reply shows the same one; an
/// expiry's is the wake-up's), so a gateway reads nothing older after passing it on.
#[test]
fn an_event_carries_its_writes_zxid() {
    let mut h = Harness::new();
    let (owner, _, _) = h.connect(GW, 4_000);
    let (watcher, _, _) = h.connect(GW2, 40_000);
    h.request(GW, owner, op::CREATE, create_body("/e", b"", 1));
    let created = h.request(GW, owner, op::CREATE, create_body("/f", b"", 0));
    h.request(GW2, watcher, op::EXISTS, path_watch("/e", true));
    let set = h.request(GW, owner, op::SET_DATA, set_body("/f", b"x", -1));
    assert!(set.zxid > created.zxid);
    h.request(GW2, watcher, op::GET_DATA, path_watch("/f", true));
    let changed = h.request(GW, owner, op::SET_DATA, set_body("/f", b"y", -1));
    let event = &h.pushes.last().unwrap().1;
    assert_eq!(event.zxid, changed.zxid, "the data watch on /f");
    // The owner's session expires: /e goes in the wake-up's write, and the event says so.
    let deadline = h.zk.wake_at().unwrap();
    h.idle_until(deadline);
    assert!(h.zk.tree().get("/e").is_none());
    let event = &h.pushes.last().unwrap().1;
    assert_eq!(event.zxid, h.zk.zxid, "the expiry's write");
    assert!(event.zxid > changed.zxid);
}

/// Runs `command` of `client` alone in batch `seqno` (a wake-up first if one is due); its
/// reply and what it left in the effects.
fn run_with_effects(zk: &mut ZkService, seqno: u64, client: ClientId, command: Command) -> (Answer, Effects) {
    let context = BatchContext {
        index: 0,
        seqno: SeqNo(seqno),
        time_us: 1_000_000 + seqno * 1_000,
        seed: [seqno as u8; 32],
    };
    let mut effects = Effects::default();
    if zk.wake_at().is_some_and(|at| at <= context.time_us) {
        zk.wake(&context, &mut effects);
    }
    let request = ServiceRequest {
        client,
        request_id: RequestId(seqno),
        operation: command.encode(),
    };
    let out = zk.execute(&context, &[request], &mut effects);
    (upright_core::codec::from_bytes(&out[0]).unwrap(), effects)
}

/// The pushes in `effects`: the stream's object, the client, the event's kind and path, its
/// session's number for it.
fn stream_events(effects: &mut Effects) -> Vec<(Option<Bytes>, ClientId, i32, String, u64)> {
    effects
        .take_pushes()
        .into_iter()
        .map(|push| {
            let event: Event = upright_core::codec::from_bytes(&push.payload).unwrap();
            let (kind, path) = {
                let mut r = Reader::new(&event.bytes[16..]);
                (r.int().unwrap(), {
                    r.int().unwrap();
                    r.string().unwrap()
                })
            };
            (push.object, push.client, kind, path, event.seq)
        })
        .collect()
}

/// Selective execution (docs/ODRC.md, step 5): a watch event goes in the stream of its path's
/// object (a child event in the parent's), unnumbered among the session's events; the request
/// that leaves a watch announces its stream outright, every request announces the streams of
/// the objects it touches in case they had a push, a persistent-recursive watch is refused, and
/// an expiry's events (a wake-up on the sessions only) are pushed on the ephemeral's stream.
/// Without selective execution the same events go in the session's own numbering.
#[test]
fn under_selective_execution_events_go_in_their_nodes_streams_and_replies_announce_them() {
    use crate::watches::event;
    use objects::object_of;
    let mut zk = ZkService::new();
    assert!(!zk.wakes_on_global_state());
    assert!(zk.enable_selective_execution());
    assert!(zk.wakes_on_global_state());
    let connect = |timeout_ms| Command::Connect {
        session: 0,
        password: Bytes::new(),
        timeout_ms,
    };
    let session = |answer: &Answer| Reader::new(&answer.bytes[8..]).long().unwrap();
    let owner = session(&run_with_effects(&mut zk, 1, GW, connect(4_000)).0);
    let watcher = session(&run_with_effects(&mut zk, 2, GW2, connect(40_000)).0);
    run_with_effects(&mut zk, 3, GW, call(owner, op::CREATE, create_body("/a", b"", 0)));
    run_with_effects(&mut zk, 4, GW, call(owner, op::CREATE, create_body("/e", b"", 1)));

    // The watcher's getData and getChildren announce /a's stream outright.
    let (_, mut fx) = run_with_effects(&mut zk, 5, GW2, call(watcher, op::GET_DATA, path_watch("/a", true)));
    assert!(fx.take_announced().contains(&(GW2, object_of("/a"), true)));
    run_with_effects(&mut zk, 6, GW2, call(watcher, op::GET_CHILDREN, path_watch("/a", true)));
    let (_, mut fx) = run_with_effects(&mut zk, 7, GW2, call(watcher, op::EXISTS, path_watch("/e", true)));
    assert!(fx.take_announced().contains(&(GW2, object_of("/e"), true)));

    // A write's events go in the streams of /a (data) and of /a again (its child).
    let (_, mut fx) = run_with_effects(&mut zk, 8, GW, call(owner, op::SET_DATA, set_body("/a", b"x", -1)));
    assert_eq!(
        stream_events(&mut fx),
        vec![(Some(object_of("/a")), GW2, event::NODE_DATA_CHANGED, "/a".into(), 0)]
    );
    assert!(
        fx.take_announced().contains(&(GW, object_of("/a"), false)),
        "the writer's reply names /a's stream in case it had a push"
    );
    let (_, mut fx) = run_with_effects(&mut zk, 9, GW, call(owner, op::CREATE, create_body("/a/b", b"", 0)));
    assert_eq!(
        stream_events(&mut fx),
        vec![(Some(object_of("/a")), GW2, event::NODE_CHILDREN_CHANGED, "/a".into(), 0)]
    );
    // A plain read announces if pushed too (the event may still be on its way).
    let (_, mut fx) = run_with_effects(&mut zk, 10, GW2, call(watcher, op::GET_DATA, path_watch("/a", false)));
    assert_eq!(fx.take_announced(), vec![(GW2, object_of("/a"), false)]);

    // Persistent watches: plain ones announced, recursive ones not offered.
    let (reply, mut fx) = run_with_effects(&mut zk, 11, GW2, call(watcher, op::ADD_WATCH, path_version("/p", 0)));
    assert_eq!(parse(reply).err, 0);
    assert!(fx.take_announced().contains(&(GW2, object_of("/p"), true)));
    let (reply, _) = run_with_effects(&mut zk, 12, GW2, call(watcher, op::ADD_WATCH, path_version("/q", 1)));
    assert_eq!(parse(reply).err, Code::Unimplemented.value());

    // The owner's session expires (a wake-up): /e's event goes in /e's stream.
    let deadline = zk.wake_at().unwrap();
    let seqno = (deadline - 1_000_000) / 1_000 + 1;
    let touch = Command::Touch {
        sessions: vec![watcher],
    };
    let (_, mut fx) = run_with_effects(&mut zk, seqno, GW2, touch);
    assert!(zk.tree().get("/e").is_none());
    assert_eq!(
        stream_events(&mut fx),
        vec![(Some(object_of("/e")), GW2, event::NODE_DELETED, "/e".into(), 0)]
    );

    // Without selective execution: the session's own numbering, on no object.
    let mut h = Harness::new();
    let (a, _, _) = h.connect(GW, 10_000);
    h.request(GW, a, op::CREATE, create_body("/a", b"", 0));
    h.request(GW, a, op::GET_DATA, path_watch("/a", true));
    h.request(GW, a, op::SET_DATA, set_body("/a", b"x", -1));
    assert_eq!(h.pushes.last().unwrap().1.seq, 1);
}

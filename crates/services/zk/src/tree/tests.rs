use super::*;
use crate::proto::Acl;

const S1: i64 = 0x100;
const S2: i64 = 0x200;

struct T {
    tree: Tree,
    zxid: i64,
}

impl T {
    fn new() -> T {
        T {
            tree: Tree::new(),
            zxid: 0,
        }
    }

    fn txn<'a>(&mut self, session: i64, auth: &'a [Id]) -> Txn<'a> {
        self.zxid += 1;
        Txn {
            zxid: self.zxid,
            time_ms: 1_000 * self.zxid,
            session,
            auth,
        }
    }

    fn write(&mut self, session: i64, op: Op) -> Result<Done, Code> {
        let txn = self.txn(session, &[]);
        self.tree.write(&txn, &op)
    }

    fn create(&mut self, path: &str, flags: i32) -> Result<String, Code> {
        self.write(S1, create(path, flags)).map(|d| match d {
            Done::Created(p, _) => p,
            other => panic!("{other:?}"),
        })
    }

    fn stat(&self, path: &str) -> Stat {
        self.tree.get(path).unwrap().stat()
    }
}

fn create(path: &str, flags: i32) -> Op {
    Op::Create {
        path: path.into(),
        data: Bytes::from_static(b"d"),
        acl: Acl::open(),
        flags,
        ttl: 0,
    }
}

fn set(path: &str, version: i32) -> Op {
    Op::SetData {
        path: path.into(),
        data: Bytes::from_static(b"new"),
        version,
    }
}

fn delete(path: &str, version: i32) -> Op {
    Op::Delete {
        path: path.into(),
        version,
    }
}

#[test]
fn a_fresh_tree_has_the_root_and_the_system_nodes() {
    let t = Tree::new();
    assert_eq!(t.get("/").unwrap().children.iter().collect::<Vec<_>>(), ["zookeeper"]);
    assert_eq!(t.get("/zookeeper").unwrap().children.len(), 2);
    assert_eq!(
        t.read(&Op::GetAllChildrenNumber { path: "/".into() }, S1, &[]),
        Ok(Read::Number(3))
    );
}

#[test]
fn create_sets_the_stat_and_moves_the_parents_child_version() {
    let mut t = T::new();
    assert_eq!(t.create("/a", 0), Ok("/a".to_string()));
    let a = t.stat("/a");
    assert_eq!((a.czxid, a.mzxid, a.pzxid), (1, 1, 1));
    assert_eq!((a.ctime, a.mtime), (1_000, 1_000));
    assert_eq!((a.version, a.cversion, a.aversion, a.ephemeral_owner), (0, 0, 0, 0));
    assert_eq!((a.data_length, a.num_children), (1, 0));
    let root = t.stat("/");
    assert_eq!((root.cversion, root.pzxid, root.num_children), (1, 1, 2));
    assert_eq!(t.create("/a", 0), Err(Code::NodeExists));
    assert_eq!(t.create("/x/y", 0), Err(Code::NoNode));
    assert_eq!(t.create("/", 0), Err(Code::NodeExists));
}

#[test]
fn sequential_names_take_the_parents_child_version_in_ten_digits() {
    let mut t = T::new();
    t.create("/q", 0).unwrap();
    assert_eq!(t.create("/q/n-", 2), Ok("/q/n-0000000000".to_string()));
    t.create("/q/other", 0).unwrap();
    assert_eq!(t.create("/q/n-", 2), Ok("/q/n-0000000002".to_string()));
    t.write(S1, delete("/q/n-0000000000", -1)).unwrap();
    assert_eq!(
        t.create("/q/n-", 3),
        Ok("/q/n-0000000004".to_string()),
        "deletes count too"
    );
    assert_eq!(t.create("/q/", 2), Ok("/q/0000000005".to_string()), "a bare suffix");
}

#[test]
fn paths_are_checked_as_zookeeper_checks_them() {
    for bad in ["", "a", "/a/", "//a", "/a//b", "/a/./b", "/a/..", "/a\u{0}b", "/a\u{1}"] {
        assert_eq!(validate_path(bad, false), Err(Code::BadArguments), "{bad:?}");
    }
    for good in ["/", "/a", "/a/b.c", "/a/..b", "/zookeeper2"] {
        assert_eq!(validate_path(good, false), Ok(()), "{good:?}");
    }
    assert_eq!(validate_path("/a/", true), Ok(()), "a sequence suffix follows");
    assert_eq!(validate_path("/", true), Err(Code::BadArguments));
    // As Apache ZooKeeper answers (crates/cli/tests/zk_probes.rs): the parent is looked up
    // before the whole path is validated.
    let mut t = T::new();
    assert_eq!(t.create("/a/", 0), Err(Code::NoNode), "no /a yet");
    assert_eq!(t.create("a", 0), Err(Code::BadArguments), "no slash at all");
    t.create("/a", 0).unwrap();
    assert_eq!(t.create("/a/", 0), Err(Code::BadArguments));
    assert_eq!(t.create("/a/./b", 0), Err(Code::NoNode), "/a/. is no node");
    assert_eq!(t.create("/a/b", 9), Err(Code::BadArguments), "unknown create mode");
}

#[test]
fn versions_guard_set_delete_and_check() {
    let mut t = T::new();
    t.create("/a", 0).unwrap();
    assert_eq!(t.write(S1, set("/a", 3)), Err(Code::BadVersion));
    let Done::Stat(stat) = t.write(S1, set("/a", 0)).unwrap() else {
        panic!()
    };
    assert_eq!(
        (stat.version, stat.mzxid, stat.mtime, stat.data_length),
        (1, 3, 3_000, 3)
    );
    assert_eq!(stat.czxid, 1, "created stays");
    assert!(t.write(S1, set("/a", -1)).is_ok(), "-1 matches any version");
    let check = |version| Op::Check {
        path: "/a".into(),
        version,
    };
    assert_eq!(t.write(S1, check(1)), Err(Code::BadVersion));
    assert_eq!(t.write(S1, check(2)), Ok(Done::Ok));
    assert_eq!(t.write(S1, set("/none", -1)), Err(Code::NoNode));
    assert_eq!(t.write(S1, delete("/a", 1)), Err(Code::BadVersion));
    t.create("/a/child", 0).unwrap();
    assert_eq!(t.write(S1, delete("/a", 2)), Err(Code::NotEmpty));
    t.write(S1, delete("/a/child", 0)).unwrap();
    assert_eq!(t.write(S1, delete("/a", 2)), Ok(Done::Ok));
    assert!(t.tree.get("/a").is_none());
    assert_eq!(t.write(S1, delete("/a", -1)), Err(Code::NoNode));
    assert_eq!(t.write(S1, delete("/", -1)), Err(Code::BadArguments));
    assert_eq!(t.write(S1, delete("/zookeeper", -1)), Err(Code::BadArguments));
}

#[test]
fn ephemerals_belong_to_their_session_and_have_no_children() {
    let mut t = T::new();
    t.create("/e", 1).unwrap();
    assert_eq!(t.stat("/e").ephemeral_owner, S1);
    assert_eq!(t.create("/e/c", 0), Err(Code::NoChildrenForEphemerals));
    t.create("/p", 0).unwrap();
    t.create("/p/e-", 3).unwrap();
    let mine: Vec<_> = t.tree.ephemerals_of(S1).cloned().collect();
    assert_eq!(mine, ["/e", "/p/e-0000000000"]);
    assert_eq!(
        t.tree.read(&Op::GetEphemerals { prefix: "/p".into() }, S1, &[]),
        Ok(Read::Paths(vec!["/p/e-0000000000".into()]))
    );
    assert_eq!(t.tree.ephemerals_of(S2).count(), 0);
    let gone = t.tree.close_session(99, S1);
    assert_eq!(gone.len(), 2);
    assert!(t.tree.get("/e").is_none() && t.tree.get("/p/e-0000000000").is_none());
    assert_eq!(t.stat("/p").pzxid, 99);
    assert_eq!(t.tree.ephemerals_of(S1).count(), 0);
}

#[test]
fn containers_and_ttl_nodes_are_marked_in_their_owner_field() {
    let mut t = T::new();
    t.create("/c", 4).unwrap();
    assert_eq!(t.tree.get("/c").unwrap().stat.ephemeral_owner, CONTAINER_OWNER);
    assert_eq!(
        t.stat("/c").ephemeral_owner,
        0,
        "clients see 0, as ZooKeeper shows them"
    );
    assert!(t.create("/c/child", 0).is_ok(), "a container has children");
    let ttl = |flags, ttl| Op::Create {
        path: "/t".into(),
        data: Bytes::new(),
        acl: Acl::open(),
        flags,
        ttl,
    };
    assert_eq!(
        t.write(S1, ttl(5, 0)),
        Err(Code::BadArguments),
        "a TTL mode needs a TTL"
    );
    assert_eq!(
        t.write(S1, ttl(0, 10)),
        Err(Code::BadArguments),
        "a TTL needs a TTL mode"
    );
    assert_eq!(t.write(S1, ttl(5, TTL_MAX_MS + 1)), Err(Code::BadArguments));
    assert!(t.write(S1, ttl(5, 10_000)).is_ok());
    assert_eq!(t.tree.get("/t").unwrap().stat.ephemeral_owner, TTL_OWNER_MASK | 10_000);
    assert_eq!(t.stat("/t").ephemeral_owner, 0);
    assert!(t.tree.get("/t").unwrap().session().is_none());
}

#[test]
fn acls_are_fixed_up_and_enforced() {
    let mut t = T::new();
    let alice = [Id {
        scheme: "digest".into(),
        id: "alice:hash".into(),
    }];
    let only = |scheme: &str, id: &str| {
        vec![Acl {
            perms: perms::ALL,
            id: Id {
                scheme: scheme.into(),
                id: id.into(),
            },
        }]
    };
    let create_with = |path: &str, acl: Vec<Acl>| Op::Create {
        path: path.into(),
        data: Bytes::new(),
        acl,
        flags: 0,
        ttl: 0,
    };
    let txn = t.txn(S1, &[]);
    assert_eq!(
        t.tree.write(&txn, &create_with("/x", only("ip", "127.0.0.1"))),
        Err(Code::InvalidAcl)
    );
    assert_eq!(
        t.tree.write(&txn, &create_with("/x", only("auth", ""))),
        Err(Code::InvalidAcl),
        "no identity"
    );
    assert_eq!(
        t.tree.write(&txn, &create_with("/x", only("world", "someone"))),
        Err(Code::InvalidAcl)
    );
    assert_eq!(
        t.tree.write(&txn, &create_with("/x", Vec::new())),
        Err(Code::InvalidAcl)
    );
    let txn = t.txn(S1, &alice);
    t.tree.write(&txn, &create_with("/private", only("auth", ""))).unwrap();
    assert_eq!(t.tree.get("/private").unwrap().acl, only("digest", "alice:hash"));
    // Others may not read, write or create under it; alice may.
    assert_eq!(
        t.tree.read(
            &Op::GetData {
                path: "/private".into(),
                watch: false
            },
            S2,
            &[]
        ),
        Err(Code::NoAuth)
    );
    assert!(matches!(
        t.tree.read(
            &Op::GetData {
                path: "/private".into(),
                watch: false
            },
            S1,
            &alice
        ),
        Ok(Read::Data(..))
    ));
    assert_eq!(t.write(S2, set("/private", -1)), Err(Code::NoAuth));
    assert_eq!(t.create("/private/c", 0), Err(Code::NoAuth));
    let txn = t.txn(S1, &alice);
    assert!(t.tree.write(&txn, &create("/private/c", 0)).is_ok());
    // setACL needs ADMIN and the right aversion.
    let set_acl = |version| Op::SetAcl {
        path: "/private".into(),
        acl: Acl::open(),
        version,
    };
    assert_eq!(t.write(S2, set_acl(0)), Err(Code::NoAuth));
    let txn = t.txn(S1, &alice);
    assert_eq!(t.tree.write(&txn, &set_acl(1)), Err(Code::BadVersion));
    let Ok(Done::Stat(stat)) = t.tree.write(&txn, &set_acl(0)) else {
        panic!()
    };
    assert_eq!(stat.aversion, 1);
    assert!(t.write(S2, set("/private", -1)).is_ok(), "open now");
}

#[test]
fn a_multi_applies_all_or_nothing_and_reports_as_zookeeper_does() {
    let mut t = T::new();
    t.create("/m", 0).unwrap();
    let before = t.tree.clone();
    let ops = [
        create("/m/a", 0),
        set("/m", 0),
        create("/m/e", 1),
        create("/m/c", 4),
        delete("/m/none", -1),
        create("/m/b", 0),
    ];
    let txn = t.txn(S1, &[]);
    assert_eq!(
        t.tree.multi(&txn, &ops),
        Err(vec![
            Code::Ok,
            Code::Ok,
            Code::Ok,
            Code::Ok,
            Code::NoNode,
            Code::RuntimeInconsistency
        ])
    );
    assert_eq!(
        t.tree, before,
        "nothing of it stays, the ephemeral and container indexes included"
    );
    assert!(!t.tree.has_swept());
    let ops = [create("/m/a", 0), set("/m", 0), create("/m/e", 1), delete("/m/a", 0)];
    let txn = t.txn(S1, &[]);
    let done = t.tree.multi(&txn, &ops).unwrap();
    assert_eq!(done.len(), 4);
    assert!(matches!(&done[0], Done::Created(p, s) if p == "/m/a" && s.czxid == txn.zxid));
    let m = t.stat("/m");
    assert_eq!((m.version, m.cversion, m.num_children, m.mzxid), (1, 3, 1, txn.zxid));
    assert_eq!(t.tree.ephemerals_of(S1).collect::<Vec<_>>(), ["/m/e"]);
    let txn = t.txn(S1, &[]);
    assert_eq!(
        t.tree.multi(&txn, &[Op::GetAcl { path: "/m".into() }]),
        Err(vec![Code::BadArguments])
    );
}

#[test]
fn reads_answer_with_the_stat_and_check_read_permission() {
    let mut t = T::new();
    t.create("/r", 0).unwrap();
    t.create("/r/a", 0).unwrap();
    t.create("/r/a/b", 0).unwrap();
    let read = |op| t.tree.read(&op, S1, &[]);
    assert_eq!(
        read(Op::Exists {
            path: "/none".into(),
            watch: false
        }),
        Ok(Read::Exists(None))
    );
    assert_eq!(
        read(Op::GetData {
            path: "/none".into(),
            watch: false
        }),
        Err(Code::NoNode)
    );
    let Ok(Read::Children(children, stat)) = read(Op::GetChildren {
        path: "/r".into(),
        watch: false,
    }) else {
        panic!()
    };
    assert_eq!((children, stat.num_children), (vec!["a".to_string()], 1));
    assert_eq!(
        read(Op::GetAllChildrenNumber { path: "/r".into() }),
        Ok(Read::Number(2))
    );
    assert_eq!(
        read(Op::GetAllChildrenNumber { path: "/r/a/b".into() }),
        Ok(Read::Number(0))
    );
    assert_eq!(
        read(Op::Exists {
            path: "bad".into(),
            watch: false
        }),
        Err(Code::BadArguments)
    );
}

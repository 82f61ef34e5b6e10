use super::*;

const WRITER: &str = "gateway-1";

fn h(byte: u8) -> Hash {
    [byte; 32]
}

/// A NameNode at agreed time `t` (ms), applying commands with a fixed seed per step.
struct Nn {
    nn: NameNode,
    t: u64,
}

impl Nn {
    fn new() -> Nn {
        Nn {
            nn: NameNode::new(),
            t: 1_000_000,
        }
    }

    fn run(&mut self, c: Command) -> Answer {
        self.t += 1;
        self.nn.apply(self.t, self.t * 7919, &c)
    }

    fn ok(&mut self, c: Command) -> Answer {
        let a = self.run(c.clone());
        assert!(!matches!(a, Answer::Error(_)), "{c:?}: {a:?}");
        a
    }

    fn err(&mut self, c: Command) -> HdfsError {
        match self.run(c.clone()) {
            Answer::Error(e) => e,
            other => panic!("{c:?} did not fail: {other:?}"),
        }
    }

    fn status(&mut self, path: &str) -> FileStatus {
        match self.ok(Command::GetFileStatus { path: path.into() }) {
            Answer::Status(s) => s,
            other => panic!("{other:?}"),
        }
    }

    fn datanodes(&mut self, n: u32) {
        for id in 0..n {
            self.ok(Command::RegisterDataNode {
                id,
                addr: format!("127.0.0.1:{}", 9866 + id),
                capacity: 1 << 40,
            });
        }
    }

    fn create(&mut self, path: &str, replication: u16) {
        self.ok(Command::Create {
            path: path.into(),
            overwrite: false,
            replication: Some(replication),
            block_size: None,
            permission: None,
            user: "alice".into(),
            holder: WRITER.into(),
        });
    }

    fn add_block(&mut self, path: &str, previous: Option<BlockReport>) -> LocatedBlock {
        match self.ok(Command::AddBlock {
            path: path.into(),
            holder: WRITER.into(),
            previous,
        }) {
            Answer::Block(b) => b,
            other => panic!("{other:?}"),
        }
    }

    fn received(&mut self, datanode: u32, report: BlockReport) {
        self.ok(Command::BlockReceived { id: datanode, report });
    }

    fn complete(&mut self, path: &str, last: Option<BlockReport>) -> bool {
        match self.ok(Command::Complete {
            path: path.into(),
            holder: WRITER.into(),
            last,
        }) {
            Answer::Done(done) => done,
            other => panic!("{other:?}"),
        }
    }

    /// Writes a one-block file whose replicas every target DataNode reports correctly.
    fn write_file(&mut self, path: &str, replication: u16, len: u64, byte: u8) -> LocatedBlock {
        self.create(path, replication);
        let b = self.add_block(path, None);
        let report = BlockReport {
            block: b.block,
            len,
            hash: h(byte),
        };
        for d in &b.datanodes {
            self.received(d.id, report);
        }
        assert!(self.complete(path, Some(report)));
        b
    }

    fn locations(&mut self, path: &str) -> (Vec<LocatedBlock>, u64, bool) {
        match self.ok(Command::GetBlockLocations { path: path.into() }) {
            Answer::Locations {
                blocks,
                length,
                complete,
            } => (blocks, length, complete),
            other => panic!("{other:?}"),
        }
    }

    fn heartbeat(&mut self, id: u32) -> Vec<DataNodeCommand> {
        match self.ok(Command::Heartbeat { id, used: 0 }) {
            Answer::Commands(c) => c,
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn directories_files_listing_and_summaries() {
    let mut n = Nn::new();
    n.ok(Command::Mkdirs {
        path: "/a/b/c".into(),
        permission: Some(0o750),
        user: "alice".into(),
    });
    let c = n.status("/a/b/c");
    assert!(c.is_dir && c.permission == 0o750 && c.owner == "alice");
    assert_eq!(n.status("/a").permission, 0o755, "parents get the default");
    n.datanodes(3);
    n.write_file("/a/f1", 3, 100, 1);
    n.write_file("/a/f0", 2, 50, 2);
    let Answer::Listing { entries, remaining } = n.ok(Command::ListStatus {
        path: "/a".into(),
        after: None,
    }) else {
        panic!("listing")
    };
    let names: Vec<&str> = entries.iter().map(|e| e.path_suffix.as_str()).collect();
    assert_eq!((names, remaining), (vec!["b", "f0", "f1"], 0));
    let Answer::Listing { entries, .. } = n.ok(Command::ListStatus {
        path: "/a".into(),
        after: Some("b".into()),
    }) else {
        panic!("listing")
    };
    assert_eq!(entries.len(), 2);
    let f1 = n.status("/a/f1");
    assert!(!f1.is_dir && f1.length == 100 && f1.replication == 3 && f1.block_size == BLOCK_SIZE_DEFAULT);
    let Answer::Summary(s) = n.ok(Command::GetContentSummary { path: "/a".into() }) else {
        panic!("summary")
    };
    assert_eq!(
        s,
        ContentSummary {
            directories: 3,
            files: 2,
            length: 150,
            space_consumed: 400
        }
    );
    n.ok(Command::SetPermission {
        path: "/a/f1".into(),
        permission: 0o600,
    });
    n.ok(Command::SetOwner {
        path: "/a/f1".into(),
        owner: Some("bob".into()),
        group: None,
    });
    let f1 = n.status("/a/f1");
    assert_eq!(
        (f1.permission, f1.owner.as_str(), f1.group.as_str()),
        (0o600, "bob", "supergroup")
    );
}

#[test]
fn errors_are_hdfs_exceptions() {
    let mut n = Nn::new();
    n.datanodes(1);
    n.write_file("/f", 1, 10, 1);
    let create = |path: &str, overwrite| Command::Create {
        path: path.into(),
        overwrite,
        replication: Some(1),
        block_size: None,
        permission: None,
        user: "alice".into(),
        holder: WRITER.into(),
    };
    assert_eq!(n.err(create("/f", false)).exception(), "FileAlreadyExistsException");
    assert_eq!(n.err(create("/f/g", false)).exception(), "ParentNotDirectoryException");
    assert_eq!(
        n.err(Command::GetFileStatus { path: "/nope".into() }).exception(),
        "FileNotFoundException"
    );
    assert_eq!(
        n.err(Command::GetFileStatus { path: "rel".into() }).exception(),
        "IllegalArgumentException"
    );
    n.ok(Command::Mkdirs {
        path: "/d/e".into(),
        permission: None,
        user: "alice".into(),
    });
    assert_eq!(
        n.err(Command::Delete {
            path: "/d".into(),
            recursive: false
        })
        .exception(),
        "PathIsNotEmptyDirectoryException"
    );
    // Being written: another create, an append, and a block by someone else are refused.
    n.ok(create("/w", false));
    let other = Command::AddBlock {
        path: "/w".into(),
        holder: "someone-else".into(),
        previous: None,
    };
    assert_eq!(n.err(other).exception(), "LeaseExpiredException");
    assert_eq!(n.err(create("/w", true)).exception(), "AlreadyBeingCreatedException");
    assert_eq!(
        n.err(Command::Append {
            path: "/w".into(),
            holder: "x".into()
        })
        .exception(),
        "AlreadyBeingCreatedException"
    );
    let Command::Create {
        path,
        overwrite,
        block_size,
        permission,
        user,
        holder,
        ..
    } = create("/r", false)
    else {
        unreachable!()
    };
    let bad_replication = Command::Create {
        path,
        overwrite,
        replication: Some(0),
        block_size,
        permission,
        user,
        holder,
    };
    assert_eq!(n.err(bad_replication).exception(), "IllegalArgumentException");
    // No DataNode: a block cannot be placed.
    let mut empty = Nn::new();
    empty.create("/x", 3);
    let e = empty.err(Command::AddBlock {
        path: "/x".into(),
        holder: WRITER.into(),
        previous: None,
    });
    assert!(matches!(e, HdfsError::NoDataNodes { live: 0, .. }), "{e}");
}

#[test]
fn a_block_commits_when_the_writer_and_a_datanode_report_the_same_hash() {
    let mut n = Nn::new();
    n.datanodes(5);
    n.create("/f", 3);
    let b1 = n.add_block("/f", None);
    let ids: BTreeSet<u32> = b1.datanodes.iter().map(|d| d.id).collect();
    assert_eq!(ids.len(), 3, "three distinct DataNodes: {b1:?}");
    let r1 = BlockReport {
        block: b1.block,
        len: 1 << 20,
        hash: h(1),
    };
    // A lying DataNode reports other bytes: not counted, and told to drop them.
    let liar = b1.datanodes[0].id;
    n.received(liar, BlockReport { hash: h(9), ..r1 });
    let b2 = n.add_block("/f", Some(r1));
    assert_eq!(b2.offset, 0, "the first block is not committed yet");
    let r2 = BlockReport {
        block: b2.block,
        len: 10,
        hash: h(2),
    };
    n.received(b2.datanodes[0].id, r2);
    assert!(!n.complete("/f", Some(r2)), "block 1 has no good replica yet");
    assert!(n
        .heartbeat(liar)
        .contains(&DataNodeCommand::Delete { blocks: vec![b1.block] }));
    let (blocks, length, complete) = n.locations("/f");
    assert!(
        blocks.is_empty() && length == 0 && !complete,
        "nothing committed: {blocks:?}"
    );
    n.received(b1.datanodes[1].id, r1);
    assert!(n.complete("/f", None));
    let (blocks, length, complete) = n.locations("/f");
    assert!(complete);
    assert_eq!(length, (1 << 20) + 10);
    assert_eq!(blocks[0].hash, Some(h(1)));
    assert_eq!(blocks[0].datanodes.len(), 1, "only the good replica is offered");
    assert_eq!(blocks[1].offset, 1 << 20);
    assert_eq!(n.status("/f").length, (1 << 20) + 10);
}

#[test]
fn an_expired_lease_closes_the_file_with_its_committed_blocks() {
    let mut n = Nn::new();
    n.datanodes(1);
    n.create("/f", 1);
    let b1 = n.add_block("/f", None);
    let r1 = BlockReport {
        block: b1.block,
        len: 7,
        hash: h(1),
    };
    n.received(0, r1);
    let b2 = n.add_block("/f", Some(r1));
    let until = n.t + LEASE_HARD_LIMIT_MS + 1;
    // The DataNode keeps beating; the writer is gone.
    let mut deletes = Vec::new();
    while n.t < until - DATANODE_DEAD_MS / 2 {
        n.t += DATANODE_DEAD_MS / 2;
        deletes.extend(n.heartbeat(0));
        let (_, _, complete) = n.locations("/f");
        assert!(!complete, "still open at {}", n.t);
    }
    assert!(n.nn.wake_at_ms().is_some_and(|at| at <= until + DATANODE_DEAD_MS));
    n.nn.wake(until + 1, 5);
    let (blocks, length, complete) = n.locations("/f");
    assert!(complete, "recovered");
    assert_eq!((blocks.len(), length), (1, 7));
    deletes.extend(n.heartbeat(0));
    assert!(deletes.contains(&DataNodeCommand::Delete { blocks: vec![b2.block] }));
    // Another writer may now append.
    n.ok(Command::Append {
        path: "/f".into(),
        holder: "other".into(),
    });
}

#[test]
fn a_dead_datanode_s_blocks_are_copied_to_another() {
    let mut n = Nn::new();
    n.datanodes(4);
    let b = n.write_file("/f", 3, 100, 1);
    let holders: Vec<u32> = b.datanodes.iter().map(|d| d.id).collect();
    let spare = (0..4).find(|d| !holders.contains(d)).unwrap();
    let victim = holders[0];
    // Everyone but the victim keeps beating past the dead line.
    let end = n.t + DATANODE_DEAD_MS + 10;
    let mut copies = Vec::new();
    while n.t < end {
        n.t += 1_000;
        for d in (0..4).filter(|d| *d != victim) {
            copies.extend(n.heartbeat(d).into_iter().map(|c| (d, c)));
        }
    }
    assert_eq!(n.nn.live_replicas(b.block), 2);
    assert!(copies.iter().all(|(source, _)| holders[1..].contains(source)));
    let [(_, DataNodeCommand::Copy { report, target })] = &copies[..] else {
        panic!("one copy wanted: {copies:?}")
    };
    assert_eq!((target.id, report.hash, report.len), (spare, h(1), 100));
    n.received(spare, *report);
    assert_eq!(n.nn.live_replicas(b.block), 3);
    // A reader finds the spare's replica corrupt: dropped (the spare is told to delete it) and,
    // the victim being dead, the spare is the only live DataNode to copy the block to again.
    n.ok(Command::BadReplica {
        block: b.block,
        datanode: spare,
    });
    assert_eq!(n.nn.live_replicas(b.block), 2);
    assert!(n
        .heartbeat(spare)
        .contains(&DataNodeCommand::Delete { blocks: vec![b.block] }));
    // The victim comes back: the block is copied to it (or it reports its old replica).
    n.heartbeat(victim);
    n.received(
        victim,
        BlockReport {
            block: b.block,
            len: 100,
            hash: h(1),
        },
    );
    assert_eq!(n.nn.live_replicas(b.block), 3);
}

#[test]
fn a_bad_replica_is_copied_back_only_after_its_datanode_is_told_to_delete_it() {
    let mut n = Nn::new();
    n.datanodes(3);
    let b = n.write_file("/f", 3, 100, 1);
    assert_eq!(n.nn.live_replicas(b.block), 3);
    n.ok(Command::BadReplica {
        block: b.block,
        datanode: 2,
    });
    assert_eq!(n.nn.live_replicas(b.block), 2);
    // DataNode 2 is the only one without a good replica, but its delete is still pending: a
    // copy sent now could arrive before the delete and be deleted with it.
    assert!(n.heartbeat(0).is_empty() && n.heartbeat(1).is_empty());
    assert_eq!(n.heartbeat(2), vec![DataNodeCommand::Delete { blocks: vec![b.block] }]);
    let copies: Vec<DataNodeCommand> = n.heartbeat(0).into_iter().chain(n.heartbeat(1)).collect();
    let [DataNodeCommand::Copy { report, target }] = &copies[..] else {
        panic!("one copy wanted: {copies:?}")
    };
    assert_eq!((target.id, report.block, report.hash), (2, b.block, h(1)));
    n.received(2, *report);
    assert_eq!(n.nn.live_replicas(b.block), 3);
}

#[test]
fn rename_and_delete_follow_hdfs() {
    let mut n = Nn::new();
    n.datanodes(1);
    n.write_file("/a/f", 1, 5, 1);
    n.ok(Command::Mkdirs {
        path: "/b".into(),
        permission: None,
        user: "u".into(),
    });
    let rename = |src: &str, dst: &str| Command::Rename {
        src: src.into(),
        dst: dst.into(),
    };
    assert_eq!(n.ok(rename("/a/f", "/b")), Answer::Done(true), "into a directory");
    assert_eq!(n.status("/b/f").length, 5);
    assert_eq!(n.ok(rename("/b/f", "/b/g")), Answer::Done(true));
    assert_eq!(n.ok(rename("/nope", "/c")), Answer::Done(false));
    assert_eq!(n.ok(rename("/b", "/b/sub")), Answer::Done(false), "not below itself");
    assert_eq!(n.ok(rename("/a", "/b/g")), Answer::Done(false), "onto a file");
    assert_eq!(n.ok(rename("/b", "/c/d")), Answer::Done(false), "the parent must exist");
    let Answer::Locations { blocks, .. } = n.ok(Command::GetBlockLocations { path: "/b/g".into() }) else {
        panic!()
    };
    let block = blocks[0].block;
    assert_eq!(
        n.ok(Command::Delete {
            path: "/b".into(),
            recursive: true
        }),
        Answer::Done(true)
    );
    assert_eq!(
        n.ok(Command::Delete {
            path: "/b".into(),
            recursive: true
        }),
        Answer::Done(false),
        "already gone"
    );
    assert!(n
        .heartbeat(0)
        .contains(&DataNodeCommand::Delete { blocks: vec![block] }));
}

#[test]
fn the_same_commands_give_the_same_state_and_the_checkpoint_round_trips() {
    use crate::service::{decode_answer, encode, NameNodeService};
    use upright_core::ids::{ClientId, RequestId, SeqNo};
    use upright_core::service::{BatchContext, Effects, Service, ServiceRequest};
    let commands = [
        Command::RegisterDataNode {
            id: 0,
            addr: "a:1".into(),
            capacity: 10,
        },
        Command::RegisterDataNode {
            id: 1,
            addr: "b:1".into(),
            capacity: 10,
        },
        Command::Create {
            path: "/x/y".into(),
            overwrite: false,
            replication: Some(2),
            block_size: None,
            permission: None,
            user: "u".into(),
            holder: WRITER.into(),
        },
        Command::AddBlock {
            path: "/x/y".into(),
            holder: WRITER.into(),
            previous: None,
        },
    ];
    let run = || {
        let mut s = NameNodeService::new();
        let requests: Vec<ServiceRequest> = commands
            .iter()
            .enumerate()
            .map(|(i, c)| ServiceRequest {
                // A DataNode speaks as the client of its id.
                client: match c {
                    Command::RegisterDataNode { id, .. } => ClientId(*id),
                    _ => ClientId(7),
                },
                request_id: RequestId(i as u64 + 1),
                operation: encode(c),
            })
            .collect();
        let context = BatchContext {
            index: 0,
            seqno: SeqNo(1),
            time_us: 5_000_000,
            seed: [3; 32],
        };
        let replies = s.execute(&context, &requests, &mut Effects::default());
        (s, replies)
    };
    let (a, replies_a) = run();
    let (b, replies_b) = run();
    assert_eq!(replies_a, replies_b);
    assert_eq!(a.checkpoint(), b.checkpoint());
    assert!(matches!(decode_answer(&replies_a[3]), Some(Answer::Block(l)) if l.datanodes.len() == 2));
    let mut c = NameNodeService::new();
    c.restore(&a.checkpoint()).unwrap();
    assert_eq!(c.namenode(), a.namenode());
    assert!(c.restore(b"garbage").is_err());
    let read = encode(&Command::GetFileStatus { path: "/x/y".into() });
    assert!(matches!(
        c.execute_read_only(&read).and_then(|r| decode_answer(&r)),
        Some(Answer::Status(s)) if !s.is_dir
    ));
    assert!(
        c.execute_read_only(&encode(&commands[2])).is_none(),
        "a write is ordered"
    );
}

impl NameNode {
    /// The structure every command must keep: the tree is consistent both ways, every file's
    /// blocks are in the map and belong to it, every block in the map belongs to a file, a
    /// committed block has its writer's report, leases cover exactly the open files' writers.
    fn check_invariants(&self) -> Result<(), String> {
        for (id, inode) in &self.inodes {
            if *id != ROOT {
                let parent = self.inodes.get(&inode.parent).ok_or(format!("{id}: no parent"))?;
                match &parent.kind {
                    Kind::Dir { children } if children.get(&inode.name) == Some(id) => {}
                    _ => return Err(format!("{id} ({}) not in its parent", inode.name)),
                }
            }
            match &inode.kind {
                Kind::Dir { children } => {
                    for (name, child) in children {
                        let c = self.inodes.get(child).ok_or(format!("{name}: dangling"))?;
                        if c.parent != *id || c.name != *name {
                            return Err(format!("{name}: wrong parent link"));
                        }
                    }
                }
                Kind::File { blocks, writer, .. } => {
                    for b in blocks {
                        let block = self.blocks.get(b).ok_or(format!("file {id}: block {b} missing"))?;
                        if block.file != *id {
                            return Err(format!("block {b} names file {}", block.file));
                        }
                    }
                    if let Some(w) = writer {
                        if !self.leases.contains_key(w) {
                            return Err(format!("file {id} open by {w} without a lease"));
                        }
                    }
                }
            }
        }
        for (b, block) in &self.blocks {
            match self.inodes.get(&block.file).map(|i| &i.kind) {
                Some(Kind::File { blocks, .. }) if blocks.contains(b) => {}
                _ => return Err(format!("block {b} belongs to no file")),
            }
            if block.committed && block.expected.is_none() {
                return Err(format!("block {b} committed without the writer's report"));
            }
        }
        for holder in self.leases.keys() {
            let writes = self
                .inodes
                .values()
                .any(|i| matches!(&i.kind, Kind::File { writer: Some(w), .. } if w == holder));
            if !writes {
                return Err(format!("lease of {holder} covers no file"));
            }
        }
        Ok(())
    }
}

mod model {
    use proptest::prelude::*;

    use super::*;

    fn path() -> impl Strategy<Value = String> {
        prop::sample::select(vec!["/a", "/b", "/a/x", "/a/y", "/b/x", "/a/x/z"]).prop_map(String::from)
    }

    fn holder() -> impl Strategy<Value = String> {
        prop::sample::select(vec!["w1", "w2"]).prop_map(String::from)
    }

    fn report() -> impl Strategy<Value = Option<BlockReport>> {
        // Blocks are numbered from 1 << 30; small offsets hit the ones allocated.
        prop::option::of((0..6u64, 1..3u8).prop_map(|(b, hash)| BlockReport {
            block: (1 << 30) + b,
            len: u64::from(hash) * 100,
            hash: [hash; 32],
        }))
    }

    fn command() -> impl Strategy<Value = Command> {
        prop_oneof![
            (path(), any::<bool>()).prop_map(|(path, perm)| Command::Mkdirs {
                path,
                permission: perm.then_some(0o700),
                user: "u".into()
            }),
            (path(), any::<bool>(), holder()).prop_map(|(path, overwrite, holder)| Command::Create {
                path,
                overwrite,
                replication: Some(2),
                block_size: None,
                permission: None,
                user: "u".into(),
                holder
            }),
            (path(), holder()).prop_map(|(path, holder)| Command::Append { path, holder }),
            (path(), holder(), report()).prop_map(|(path, holder, previous)| Command::AddBlock {
                path,
                holder,
                previous
            }),
            (path(), holder(), report()).prop_map(|(path, holder, last)| Command::Complete { path, holder, last }),
            (path(), any::<bool>()).prop_map(|(path, recursive)| Command::Delete { path, recursive }),
            (path(), path()).prop_map(|(src, dst)| Command::Rename { src, dst }),
            (0..3u32, report()).prop_filter_map("a report", |(id, r)| r
                .map(|report| Command::BlockReceived { id, report })),
            (0..3u32).prop_map(|id| Command::Heartbeat { id, used: 0 }),
            (0..6u64, 0..3u32).prop_map(|(b, datanode)| Command::BadReplica {
                block: (1 << 30) + b,
                datanode
            }),
            (path(), 1..4u16).prop_map(|(path, replication)| Command::SetReplication { path, replication }),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Any sequence of commands (valid or not, at times that let leases and DataNodes
        /// expire) keeps the structure, runs alike twice, and checkpoints to what it restores.
        #[test]
        fn any_commands_keep_the_namespace_consistent(
            steps in prop::collection::vec((command(), 0..120_000u64), 1..60)
        ) {
            let mut a = NameNode::new();
            let mut b = NameNode::new();
            let mut t = 1_000;
            for id in 0..3 {
                let register = Command::RegisterDataNode { id, addr: format!("d{id}:1"), capacity: 1 };
                a.apply(t, 1, &register);
                b.apply(t, 1, &register);
            }
            for (i, (command, step)) in steps.iter().enumerate() {
                t += step;
                let seed = i as u64 * 31;
                let answer = a.apply(t, seed, command);
                prop_assert_eq!(&answer, &b.apply(t, seed, command));
                if let Err(e) = a.check_invariants() {
                    prop_assert!(false, "after {:?} -> {:?}: {}", command, answer, e);
                }
            }
            let restored: NameNode = upright_core::codec::from_bytes(&upright_core::codec::to_bytes(&a)).unwrap();
            prop_assert_eq!(&restored, &a);
            prop_assert_eq!(a, b);
        }
    }
}

#[test]
fn a_client_cannot_speak_for_another_datanode() {
    use crate::service::{decode_answer, encode, NameNodeService};
    use upright_core::ids::{ClientId, RequestId, SeqNo};
    use upright_core::service::{BatchContext, Effects, Service, ServiceRequest};
    let mut s = NameNodeService::new();
    let context = BatchContext {
        index: 0,
        seqno: SeqNo(1),
        time_us: 5_000_000,
        seed: [3; 32],
    };
    let register = |id: u32| Command::RegisterDataNode {
        id,
        addr: "a:1".into(),
        capacity: 10,
    };
    let requests = [
        (5, register(4)),
        (4, register(4)),
        (5, Command::Heartbeat { id: 4, used: 0 }),
        (4, Command::ListDataNodes),
    ];
    let requests: Vec<ServiceRequest> = requests
        .iter()
        .enumerate()
        .map(|(i, (client, c))| ServiceRequest {
            client: ClientId(*client),
            request_id: RequestId(i as u64 + 1),
            operation: encode(c),
        })
        .collect();
    let replies = s.execute(&context, &requests, &mut Effects::default());
    let answers: Vec<Answer> = replies.iter().map(|r| decode_answer(r).unwrap()).collect();
    assert!(
        matches!(&answers[0], Answer::Error(HdfsError::BadArgument(m)) if m.contains("cannot speak for DataNode 4"))
    );
    assert_eq!(answers[1], Answer::Ok);
    assert!(matches!(&answers[2], Answer::Error(HdfsError::BadArgument(_))));
    let Answer::DataNodes(nodes) = &answers[3] else {
        panic!("{:?}", answers[3]);
    };
    assert_eq!(nodes.len(), 1);
    assert_eq!(
        (nodes[0].id, nodes[0].last_heartbeat_ms, nodes[0].dead),
        (4, 5_000, false)
    );
}

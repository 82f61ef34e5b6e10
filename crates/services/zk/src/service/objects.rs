//! The objects of ZooKeeper's requests, for selective execution (ODRC's request analysis;
//! docs/ODRC.md, "ZooKeeper under selective execution").
//!
//! An object is a znode path, `n/<path>`: the node if it exists (its data, ACL, Stat, its
//! children's names) and the watches on that path, so an absent path with exist watchers is an
//! object too. Sequential nodes are named at execution (`<prefix><10 characters of the parent's
//! cversion>`), which the request's bytes do not tell, so a path's object is its path with such a
//! suffix removed ([`object_of`]): every node a sequential create of `prefix` can make lives in
//! the object of `prefix`, and a few ordinary nodes whose names end in ten digits share it
//! (coarser objects are allowed: a request may declare more than it touches, never less).
//!
//! A create or delete touches its node and its parent (the parent's children, cversion and
//! pzxid); setData and setACL touch the node; a read touches the node, and one that leaves a
//! watch writes it; a multi touches the union of its operations'. What reads or writes state of
//! many nodes or of the sessions is global (`None`: every member runs it, after bringing every
//! object up to date): connecting, closing a session (its ephemeral nodes go), AUTH, the watch
//! requests (SET_WATCHES, ADD_WATCH, REMOVE_WATCHES, CHECK_WATCHES: persistent watches are
//! session state), getEphemerals, getAllChildrenNumber and the gateway's Touch. A ping and a sync
//! touch no object (they run everywhere and need nothing brought up to date).
//!
//! Placement is the path's first component, so a node and its parent share maintainers below
//! the top level; a top-level create or delete also touches the root and is cross-border (as in
//! ODRC's file system with its locality policy).

use std::collections::BTreeSet;

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use upright_core::service::{Access, RestoreError};

use super::{Command, ZkService};
use crate::jute::Reader;
use crate::proto::{op, CreateMode, Op};
use crate::tree::{parent_of, Node};
use crate::watches::Kind;

/// What every object name starts with.
const NODE_PREFIX: &str = "n/";

/// Length of the suffix a sequential create appends (`%010d` of the parent's cversion).
const SEQUENCE_SUFFIX: usize = 10;

/// The object holding node `path`: the path without a sequential suffix (ten digits, or a minus
/// sign and nine, at the end of its last component).
pub fn object_of(path: &str) -> Bytes {
    let last = path.rsplit('/').next().unwrap_or_default();
    let base = if last.len() >= SEQUENCE_SUFFIX {
        let suffix = &last.as_bytes()[last.len() - SEQUENCE_SUFFIX..];
        let digits = |s: &[u8]| s.iter().all(u8::is_ascii_digit);
        if digits(suffix) || (suffix[0] == b'-' && digits(&suffix[1..])) {
            &path[..path.len() - SEQUENCE_SUFFIX]
        } else {
            path
        }
    } else {
        path
    };
    named(base)
}

/// The object named after `path` as it is (no suffix removed).
fn named(path: &str) -> Bytes {
    Bytes::from(format!("{NODE_PREFIX}{path}"))
}

/// The path an object is named after (`None` for a name that is not an object's).
fn base_of(object: &[u8]) -> Option<&str> {
    std::str::from_utf8(object.strip_prefix(NODE_PREFIX.as_bytes())?).ok()
}

/// The path ranges that hold every path of the object named after `base`: `base` itself, and
/// `base` followed by a minus sign or a digit (a sequential suffix); the paths in them that
/// belong to another object (a child `base-x/...`, a longer name) are filtered out by
/// [`object_of`].
fn ranges(base: &str) -> [(String, String); 3] {
    [
        (base.to_string(), format!("{base}\0")),
        (format!("{base}-"), format!("{base}.")),
        (format!("{base}0"), format!("{base}:")),
    ]
}

/// The one-shot watch kinds, kept with the node they are on (persistent ones are session state).
const ONE_SHOT: [Kind; 3] = [Kind::Data, Kind::Exist, Kind::Child];

/// An object's state: its nodes and the one-shot watches on its paths.
#[derive(Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
struct ObjectState {
    nodes: Vec<(String, Node)>,
    watches: Vec<(Kind, String, BTreeSet<i64>)>,
}

impl ZkService {
    /// Calls `node` with each node of object `name` (named after `base`) and `watch` with each
    /// one-shot watch on its paths.
    fn visit_object(
        &self,
        name: &Bytes,
        base: &str,
        mut node: impl FnMut(&String, &Node),
        mut watch: impl FnMut(Kind, &String, &BTreeSet<i64>),
    ) {
        for (from, to) in ranges(base) {
            for (path, n) in self.tree.nodes_in(&from, &to) {
                if object_of(path) == name {
                    node(path, n);
                }
            }
            for kind in ONE_SHOT {
                for (path, sessions) in self.watches.watching_in(kind, &from, &to) {
                    if object_of(path) == name {
                        watch(kind, path, sessions);
                    }
                }
            }
        }
    }

    /// The state of object `object` ([`upright_core::service::Service::object_state`]).
    pub(super) fn object_state_of(&self, object: &[u8]) -> Option<Bytes> {
        let name = Bytes::copy_from_slice(object);
        let base = base_of(object)?;
        let mut state = ObjectState::default();
        self.visit_object(
            &name,
            base,
            |path, node| state.nodes.push((path.clone(), node.clone())),
            |kind, path, sessions| state.watches.push((kind, path.clone(), sessions.clone())),
        );
        (state != ObjectState::default()).then(|| Bytes::from(upright_core::codec::to_bytes(&state)))
    }

    /// Replaces object `object` with `state` ([`upright_core::service::Service::restore_object`]):
    /// its nodes and one-shot watches, then the pages of the buckets that changed.
    pub(super) fn restore_object_state(&mut self, object: &[u8], state: Option<&[u8]>) -> Result<(), RestoreError> {
        let name = Bytes::copy_from_slice(object);
        let base = base_of(object).ok_or_else(|| RestoreError(format!("{name:?} is not a znode object")))?;
        let state: ObjectState = match state {
            None => ObjectState::default(),
            Some(bytes) => {
                upright_core::codec::from_bytes(bytes).map_err(|e| RestoreError(format!("znode object: {e}")))?
            }
        };
        if let Some((path, _)) = state.nodes.iter().find(|(path, _)| object_of(path) != name) {
            return Err(RestoreError(format!("{path} is not in object {name:?}")));
        }
        if let Some((_, path, _)) = state
            .watches
            .iter()
            .find(|(k, path, _)| !ONE_SHOT.contains(k) || object_of(path) != name)
        {
            return Err(RestoreError(format!("a watch on {path} is not in object {name:?}")));
        }
        let mut old_nodes = Vec::new();
        let mut old_watches = Vec::new();
        self.visit_object(
            &name,
            base,
            |path, _| old_nodes.push(path.clone()),
            |kind, path, _| old_watches.push((kind, path.clone())),
        );
        for path in old_nodes {
            self.tree.put_node(&path, None);
        }
        for (kind, path) in old_watches {
            self.watches.set_watching(kind, &path, BTreeSet::new());
        }
        for (path, node) in state.nodes {
            self.tree.put_node(&path, Some(node));
        }
        for (kind, path, sessions) in state.watches {
            self.watches.set_watching(kind, &path, sessions);
        }
        self.nodes.flush(&mut self.tree);
        Ok(())
    }
}

/// Which maintainers object `object` has: its path's first component (the root's is empty).
pub fn placement(object: &[u8]) -> Bytes {
    let path = object.strip_prefix(NODE_PREFIX.as_bytes()).unwrap_or(object);
    let rest = path.strip_prefix(b"/").unwrap_or(path);
    let end = rest.iter().position(|&b| b == b'/').unwrap_or(rest.len());
    Bytes::copy_from_slice(&rest[..end])
}

/// The objects a command may read and write; `None` for a global one (or one that does not
/// decode).
pub fn access(operation: &[u8]) -> Option<Access> {
    let Ok(Command::Request { opcode, body, .. }) = upright_core::codec::from_bytes::<Command>(operation) else {
        // Connect, Touch, or malformed.
        return None;
    };
    let mut r = Reader::new(&body);
    match opcode {
        op::PING => return Some(Access::default()),
        op::MULTI | op::MULTI_READ => return multi_access(&mut r),
        _ => {}
    }
    let operation = Op::read(opcode, &mut r)?.ok()?;
    r.finish().ok()?;
    op_access(&operation)
}

/// A multi's (or multiRead's) union; `None` if one of its operations is global or malformed.
fn multi_access(r: &mut Reader<'_>) -> Option<Access> {
    let mut all = Access::default();
    loop {
        let (opcode, done, _) = (r.int().ok()?, r.boolean().ok()?, r.int().ok()?);
        if done {
            break;
        }
        let operation = Op::read(opcode, r)?.ok()?;
        all.merge(op_access(&operation)?);
    }
    (r.remaining() == 0).then_some(all)
}

/// One tree operation's objects.
fn op_access(operation: &Op) -> Option<Access> {
    Some(match operation {
        Op::Create { path, flags, .. } => {
            let sequential = CreateMode::from_flags(*flags).is_some_and(|m| m.is_sequential());
            // A sequential create's nodes live in its prefix's object; a plain one's in its own.
            let node = if sequential { named(path) } else { object_of(path) };
            Access::writing([node, object_of(parent_of(path))])
        }
        Op::Delete { path, .. } => Access::writing([object_of(path), object_of(parent_of(path))]),
        Op::SetData { path, .. } | Op::SetAcl { path, .. } => Access::writing([object_of(path)]),
        Op::Check { path, .. } | Op::GetAcl { path } => Access::reading([object_of(path)]),
        Op::Exists { path, watch } | Op::GetData { path, watch } | Op::GetChildren { path, watch } => {
            if *watch {
                Access::writing([object_of(path)])
            } else {
                Access::reading([object_of(path)])
            }
        }
        Op::Sync { .. } => Access::default(),
        Op::GetAllChildrenNumber { .. } | Op::GetEphemerals { .. } => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::request;

    fn command(opcode: i32, body: Vec<u8>) -> Vec<u8> {
        Command::Request {
            session: 1,
            xid: 1,
            opcode,
            body: body.into(),
        }
        .encode()
        .to_vec()
    }

    fn objects(names: &[&str]) -> std::collections::BTreeSet<Bytes> {
        names.iter().map(|n| Bytes::from(format!("n/{n}"))).collect()
    }

    #[test]
    fn a_sequential_node_lives_in_its_prefix_object() {
        assert_eq!(object_of("/a/lock-0000000007"), Bytes::from("n//a/lock-"));
        assert_eq!(
            object_of("/a/lock--000000001"),
            Bytes::from("n//a/lock-"),
            "an overflowed cversion"
        );
        assert_eq!(object_of("/a/0000000003"), Bytes::from("n//a/"));
        assert_eq!(
            object_of("/a/lock000000007"),
            Bytes::from("n//a/lock000000007"),
            "nine digits"
        );
        assert_eq!(object_of("/a/b"), Bytes::from("n//a/b"));
        assert_eq!(object_of("/"), Bytes::from("n//"));
        // A sequential create whose prefix ends in digits itself: its nodes' object is the prefix.
        let create = command(op::CREATE, request::create("/a/x0000000001", b"", &[], 2));
        let created = "/a/x0000000001".to_string() + "0000000005";
        assert!(access(&create).unwrap().writes.contains(&object_of(&created)));
    }

    #[test]
    fn a_create_or_delete_writes_its_node_and_parent_and_a_watch_is_a_write() {
        let create = access(&command(op::CREATE, request::create("/a/b", b"x", &[], 0))).unwrap();
        assert_eq!(create.writes, objects(&["/a/b", "/a"]));
        let top = access(&command(op::CREATE2, request::create("/a", b"x", &[], 0))).unwrap();
        assert_eq!(top.writes, objects(&["/a", "/"]));
        let delete = access(&command(op::DELETE, request::path_int("/a/b", -1))).unwrap();
        assert_eq!(delete.writes, objects(&["/a/b", "/a"]));
        let read = access(&command(op::GET_DATA, request::path_watch("/a/b", false))).unwrap();
        assert!(read.is_read_only());
        assert_eq!(read.reads, objects(&["/a/b"]));
        let watched = access(&command(op::GET_CHILDREN2, request::path_watch("/a", true))).unwrap();
        assert_eq!(watched.writes, objects(&["/a"]));
        assert_eq!(access(&command(op::PING, Vec::new())), Some(Access::default()));
    }

    #[test]
    fn session_watch_and_whole_tree_requests_are_global() {
        assert_eq!(access(&command(op::CLOSE_SESSION, Vec::new())), None);
        assert_eq!(access(&command(op::ADD_WATCH, request::path_int("/a", 1))), None);
        assert_eq!(access(&command(op::GET_ALL_CHILDREN_NUMBER, request::path("/a"))), None);
        let connect = Command::Connect {
            session: 0,
            password: Bytes::new(),
            timeout_ms: 4_000,
        };
        assert_eq!(access(&connect.encode()), None);
        assert_eq!(access(&Command::Touch { sessions: vec![1] }.encode()), None);
        assert_eq!(access(b"\xff\x00garbage"), None);
        let trailing = {
            let mut body = request::path_watch("/a", false);
            body.push(0);
            command(op::GET_DATA, body)
        };
        assert_eq!(access(&trailing), None, "malformed: global");
    }

    #[test]
    fn a_multi_declares_the_union_and_placement_is_the_first_component() {
        let ops = [
            (op::CREATE, request::create("/a/b", b"", &[], 0)),
            (op::SET_DATA, request::set_data("/c/d", b"v", -1)),
        ];
        let multi = access(&command(op::MULTI, request::multi(&ops))).unwrap();
        assert_eq!(multi.writes, objects(&["/a/b", "/a", "/c/d"]));
        assert_eq!(placement(b"n//a/b"), Bytes::from("a"));
        assert_eq!(placement(b"n//a"), Bytes::from("a"));
        assert_eq!(placement(b"n//"), Bytes::new());
        assert_eq!(placement(&object_of("/c/lock-0000000001")), Bytes::from("c"));
    }
}

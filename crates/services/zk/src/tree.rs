//! The znode tree with ZooKeeper's rules: what each write checks, in the order ZooKeeper checks it
//! (so the same request fails with the same code), and what it changes (versions, zxids, times,
//! the parent's child version). Every write runs with a [`Txn`]: its zxid and agreed time come from
//! the agreed order, identical at every replica. A multi applies all of its operations or none.

use std::collections::{BTreeMap, BTreeSet};

use bytes::Bytes;

use crate::jute::MAX_BUFFER;
use crate::proto::{perms, Acl, Code, CreateMode, Id, Op, Stat};

/// `ephemeralOwner` of a container node (`EphemeralType.CONTAINER_EPHEMERAL_OWNER`).
pub const CONTAINER_OWNER: i64 = i64::MIN;
/// High byte of a TTL node's `ephemeralOwner`; the low 40 bits hold the TTL in milliseconds.
pub const TTL_OWNER_MASK: i64 = 0xff00_0000_0000_0000_u64 as i64;
/// Largest TTL (ms) a TTL node may have (`EphemeralType.TTL.maxValue()`, about 34 years).
pub const TTL_MAX_MS: i64 = 0x0000_00ff_ffff_ffff;
/// Nodes every ZooKeeper server has, and that no client may delete.
pub const SYSTEM_NODES: [&str; 3] = ["/zookeeper", "/zookeeper/config", "/zookeeper/quota"];

/// One znode.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Node {
    /// Its data (at most [`MAX_BUFFER`] bytes).
    pub data: Bytes,
    /// Who may do what with it.
    pub acl: Vec<Acl>,
    /// Its metadata; `data_length` and `num_children` are filled in when it is read.
    pub stat: Stat,
    /// Its children's names.
    pub children: BTreeSet<String>,
}

impl Node {
    fn new(data: Bytes, acl: Vec<Acl>, zxid: i64, time: i64, owner: i64) -> Node {
        Node {
            data,
            acl,
            stat: Stat {
                czxid: zxid,
                mzxid: zxid,
                ctime: time,
                mtime: time,
                ephemeral_owner: owner,
                pzxid: zxid,
                ..Stat::default()
            },
            children: BTreeSet::new(),
        }
    }

    /// Its `Stat` as clients see it: a container's or TTL node's owner marker shows as 0, as
    /// ZooKeeper shows it (`DataNode.copyStat`).
    pub fn stat(&self) -> Stat {
        Stat {
            data_length: self.data.len() as i32,
            num_children: self.children.len() as i32,
            ephemeral_owner: self.session().unwrap_or(0),
            ..self.stat
        }
    }

    /// Whether it is a container or a TTL node (its owner field holds their marker).
    pub fn is_swept(&self) -> bool {
        let owner = self.stat.ephemeral_owner;
        owner == CONTAINER_OWNER || (owner != 0 && owner & TTL_OWNER_MASK == TTL_OWNER_MASK)
    }

    /// The session whose ephemeral node this is, if it is one (not a container or TTL node).
    pub fn session(&self) -> Option<i64> {
        let owner = self.stat.ephemeral_owner;
        (owner != 0 && owner != CONTAINER_OWNER && owner & TTL_OWNER_MASK != TTL_OWNER_MASK).then_some(owner)
    }
}

/// Who writes, and when, in the agreed order.
#[derive(Clone, Copy, Debug)]
pub struct Txn<'a> {
    /// The transaction's zxid (every operation of a multi shares it).
    pub zxid: i64,
    /// Agreed time, milliseconds since the epoch.
    pub time_ms: i64,
    /// The session it runs for.
    pub session: i64,
    /// The identities the session authenticated as (`digest:user:hash`), for ACL checks and
    /// `auth` ACL entries.
    pub auth: &'a [Id],
}

/// What a successful write returns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Done {
    /// create: the path created (with its sequence suffix) and its Stat.
    Created(String, Stat),
    /// setData, setACL: the node's new Stat.
    Stat(Stat),
    /// delete, check.
    Ok,
}

/// The tree. Its nodes are not serialized with it: the service keeps them in pages
/// ([`Tree::record`], [`Tree::load`]), so a checkpoint costs the nodes that changed.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct Tree {
    #[serde(skip)]
    nodes: BTreeMap<String, Node>,
    /// Each session's ephemeral nodes.
    ephemerals: BTreeMap<i64, BTreeSet<String>>,
    /// Container and TTL nodes (deleted by [`Tree::sweep`] once empty or expired).
    swept: BTreeSet<String>,
    /// Nodes created, changed or deleted since [`Tree::take_dirty`].
    #[serde(skip)]
    dirty: BTreeSet<String>,
}

/// Trees are equal when their nodes and indexes are (which changes are not yet written to
/// pages is bookkeeping).
impl PartialEq for Tree {
    fn eq(&self, other: &Tree) -> bool {
        self.nodes == other.nodes && self.ephemerals == other.ephemerals && self.swept == other.swept
    }
}

impl Eq for Tree {}

/// A node as its page keeps it: everything but its children, which the paths of the other
/// nodes give.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct NodeRecord {
    /// Its data.
    pub data: Bytes,
    /// Its ACL.
    pub acl: Vec<Acl>,
    /// Its Stat as stored.
    pub stat: Stat,
}

impl Default for Tree {
    fn default() -> Tree {
        Tree::new()
    }
}

/// Nodes saved before a multi touched them, to put back if it fails.
type Undo = BTreeMap<String, Option<Node>>;

/// The parent of a valid path ("/" for a child of the root, and for the root).
pub(crate) fn parent_of(path: &str) -> &str {
    match path.rfind('/') {
        Some(0) | None => "/",
        Some(i) => &path[..i],
    }
}

/// The last segment of a valid path.
fn name_of(path: &str) -> &str {
    &path[path.rfind('/').map_or(0, |i| i + 1)..]
}

/// ZooKeeper's `PathUtils.validatePath`: absolute, no empty, `.` or `..` segment, no trailing
/// slash (except where a sequence suffix follows), no control or reserved characters.
pub fn validate_path(path: &str, sequential: bool) -> Result<(), Code> {
    let bad = Err(Code::BadArguments);
    if !path.starts_with('/') {
        return bad;
    }
    if path.len() == 1 {
        return if sequential { bad } else { Ok(()) };
    }
    if path.ends_with('/') && !sequential {
        return bad;
    }
    let segments: Vec<&str> = path[1..].split('/').collect();
    let last = segments.len() - 1;
    for (i, segment) in segments.iter().enumerate() {
        if segment.is_empty() && !(sequential && i == last) {
            return bad;
        }
        if *segment == "." || *segment == ".." {
            return bad;
        }
    }
    let reserved = |c: char| matches!(c, '\u{0}'..='\u{1f}' | '\u{7f}'..='\u{9f}' | '\u{e000}'..='\u{f8ff}' | '\u{fff0}'..='\u{ffff}');
    if path.chars().any(reserved) {
        return bad;
    }
    Ok(())
}

/// Whether `acl` grants `perm` to a session authenticated as `auth` (an empty ACL grants all).
pub fn allowed(acl: &[Acl], perm: i32, auth: &[Id]) -> bool {
    acl.is_empty()
        || acl
            .iter()
            .any(|a| a.perms & perm != 0 && ((a.id.scheme == "world" && a.id.id == "anyone") || auth.contains(&a.id)))
}

/// ZooKeeper's `fixupACL`: `world` only as `anyone`, `auth` replaced by the session's own
/// identities (InvalidACL if it has none), `digest` as `user:hash`; `ip` and any other scheme are
/// refused (InvalidACL), as is an empty ACL.
pub fn fixup_acl(acl: &[Acl], auth: &[Id]) -> Result<Vec<Acl>, Code> {
    if acl.is_empty() {
        return Err(Code::InvalidAcl);
    }
    let mut out: Vec<Acl> = Vec::new();
    for a in acl {
        match a.id.scheme.as_str() {
            "world" if a.id.id == "anyone" => out.push(a.clone()),
            "auth" => {
                if auth.is_empty() {
                    return Err(Code::InvalidAcl);
                }
                out.extend(auth.iter().map(|id| Acl {
                    perms: a.perms,
                    id: id.clone(),
                }));
            }
            "digest"
                if a.id
                    .id
                    .split_once(':')
                    .is_some_and(|(u, h)| !u.is_empty() && !h.is_empty()) =>
            {
                out.push(a.clone())
            }
            _ => return Err(Code::InvalidAcl),
        }
    }
    let mut seen = BTreeSet::new();
    out.retain(|a| seen.insert(a.clone()));
    Ok(out)
}

fn check_version(expected: i32, actual: i32) -> Result<(), Code> {
    if expected == -1 || expected == actual {
        Ok(())
    } else {
        Err(Code::BadVersion)
    }
}

impl Tree {
    /// The tree of a fresh server: the root and ZooKeeper's system nodes.
    pub fn new() -> Tree {
        let mut tree = Tree {
            nodes: BTreeMap::new(),
            ephemerals: BTreeMap::new(),
            swept: BTreeSet::new(),
            dirty: BTreeSet::new(),
        };
        tree.nodes
            .insert("/".into(), Node::new(Bytes::new(), Acl::open(), 0, 0, 0));
        for path in SYSTEM_NODES {
            tree.nodes
                .insert(path.into(), Node::new(Bytes::new(), Acl::open(), 0, 0, 0));
            let parent = parent_of(path).to_string();
            tree.nodes
                .get_mut(&parent)
                .expect("system nodes are listed parents first")
                .children
                .insert(name_of(path).into());
        }
        tree
    }

    /// The node at `path`.
    pub fn get(&self, path: &str) -> Option<&Node> {
        self.nodes.get(path)
    }

    /// Every node's path, in order.
    pub fn paths(&self) -> impl Iterator<Item = &String> + '_ {
        self.nodes.keys()
    }

    /// The nodes whose paths lie in `from..to`, in path order.
    pub fn nodes_in<'a>(&'a self, from: &'a str, to: &'a str) -> impl Iterator<Item = (&'a String, &'a Node)> + 'a {
        use std::ops::Bound;
        self.nodes.range::<str, _>((Bound::Included(from), Bound::Excluded(to)))
    }

    /// Puts `node` at `path`, or removes the node there for `None` (a failed multi's undo, an
    /// object's certified state under selective execution): nothing else changes here (not its
    /// parent's children), the indexes of ephemeral, container and TTL nodes and the page
    /// bookkeeping follow.
    pub fn put_node(&mut self, path: &str, node: Option<Node>) {
        if let Some(old) = self.nodes.remove(path) {
            if let Some(owner) = old.session() {
                self.unindex(owner, path);
            }
            self.swept.remove(path);
        }
        if let Some(node) = node {
            if let Some(session) = node.session() {
                self.ephemerals.entry(session).or_default().insert(path.to_string());
            }
            if node.is_swept() {
                self.swept.insert(path.to_string());
            }
            self.nodes.insert(path.to_string(), node);
        }
        self.dirty.insert(path.to_string());
    }

    /// The paths of the nodes created, changed or deleted since the last call.
    pub fn take_dirty(&mut self) -> BTreeSet<String> {
        std::mem::take(&mut self.dirty)
    }

    /// The node at `path` as its page keeps it.
    pub fn record(&self, path: &str) -> Option<NodeRecord> {
        self.nodes.get(path).map(|n| NodeRecord {
            data: n.data.clone(),
            acl: n.acl.clone(),
            stat: n.stat,
        })
    }

    /// Replaces the nodes with `records` (every node, the root included), giving each its
    /// children; `Err` names a node whose parent is missing.
    pub fn load(&mut self, records: Vec<(String, NodeRecord)>) -> Result<(), String> {
        let mut nodes: BTreeMap<String, Node> = records
            .into_iter()
            .map(|(path, r)| {
                let node = Node {
                    data: r.data,
                    acl: r.acl,
                    stat: r.stat,
                    children: BTreeSet::new(),
                };
                (path, node)
            })
            .collect();
        let paths: Vec<String> = nodes.keys().filter(|p| p.as_str() != "/").cloned().collect();
        for path in paths {
            let parent = nodes
                .get_mut(parent_of(&path))
                .ok_or_else(|| format!("{path} has no parent"))?;
            parent.children.insert(name_of(&path).to_string());
        }
        if !nodes.contains_key("/") {
            return Err("no root".into());
        }
        self.nodes = nodes;
        self.dirty.clear();
        Ok(())
    }

    /// How many nodes the tree holds.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether only the root is left (never: the system nodes stay).
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// The ephemeral nodes of `session`.
    pub fn ephemerals_of(&self, session: i64) -> impl Iterator<Item = &String> {
        self.ephemerals.get(&session).into_iter().flatten()
    }

    /// Runs one write operation (a read is answered by [`Tree::read`]).
    pub fn write(&mut self, txn: &Txn<'_>, op: &Op) -> Result<Done, Code> {
        self.write_saving(txn, op, None)
    }

    /// Runs the operations of a multi, all or none: `Ok` with each one's result, or `Err` with
    /// each one's code as ZooKeeper reports a failed multi (`Ok` before the one that failed, its
    /// code, `RuntimeInconsistency` after), the tree unchanged.
    pub fn multi(&mut self, txn: &Txn<'_>, ops: &[Op]) -> Result<Vec<Done>, Vec<Code>> {
        let mut undo = Undo::new();
        let mut done = Vec::with_capacity(ops.len());
        for (i, op) in ops.iter().enumerate() {
            let result = if op.is_write() {
                self.write_saving(txn, op, Some(&mut undo))
            } else {
                Err(Code::BadArguments) // only writes and checks go in a multi
            };
            match result {
                Ok(d) => done.push(d),
                Err(code) => {
                    self.restore(undo);
                    let mut codes = vec![Code::Ok; i];
                    codes.push(code);
                    codes.resize(ops.len(), Code::RuntimeInconsistency);
                    return Err(codes);
                }
            }
        }
        Ok(done)
    }

    fn save(&self, undo: &mut Option<&mut Undo>, path: &str) {
        if let Some(undo) = undo.as_deref_mut() {
            undo.entry(path.to_string())
                .or_insert_with(|| self.nodes.get(path).cloned());
        }
    }

    fn restore(&mut self, undo: Undo) {
        for (path, node) in undo {
            self.put_node(&path, node);
        }
    }

    fn unindex(&mut self, owner: i64, path: &str) {
        if let Some(set) = self.ephemerals.get_mut(&owner) {
            set.remove(path);
            if set.is_empty() {
                self.ephemerals.remove(&owner);
            }
        }
    }

    fn write_saving(&mut self, txn: &Txn<'_>, op: &Op, mut undo: Option<&mut Undo>) -> Result<Done, Code> {
        match op {
            Op::Create {
                path,
                data,
                acl,
                flags,
                ttl,
            } => self.create(txn, path, data, acl, *flags, *ttl, &mut undo),
            Op::Delete { path, version } => {
                validate_path(path, false)?;
                if path == "/" || SYSTEM_NODES.contains(&path.as_str()) {
                    return Err(Code::BadArguments);
                }
                let parent = parent_of(path);
                let parent_acl = &self.nodes.get(parent).ok_or(Code::NoNode)?.acl;
                let node = self.nodes.get(path.as_str()).ok_or(Code::NoNode)?;
                if !allowed(parent_acl, perms::DELETE, txn.auth) {
                    return Err(Code::NoAuth);
                }
                check_version(*version, node.stat.version)?;
                if !node.children.is_empty() {
                    return Err(Code::NotEmpty);
                }
                self.save(&mut undo, path);
                self.save(&mut undo, parent);
                self.remove(txn.zxid, path);
                Ok(Done::Ok)
            }
            Op::SetData { path, data, version } => {
                validate_path(path, false)?;
                if data.len() > MAX_BUFFER {
                    return Err(Code::BadArguments);
                }
                let node = self.nodes.get(path.as_str()).ok_or(Code::NoNode)?;
                if !allowed(&node.acl, perms::WRITE, txn.auth) {
                    return Err(Code::NoAuth);
                }
                check_version(*version, node.stat.version)?;
                self.save(&mut undo, path);
                self.dirty.insert(path.clone());
                let node = self.nodes.get_mut(path.as_str()).expect("checked above");
                node.data = data.clone();
                node.stat.version = node.stat.version.wrapping_add(1);
                node.stat.mzxid = txn.zxid;
                node.stat.mtime = txn.time_ms;
                Ok(Done::Stat(node.stat()))
            }
            Op::Check { path, version } => {
                validate_path(path, false)?;
                let node = self.nodes.get(path.as_str()).ok_or(Code::NoNode)?;
                if !allowed(&node.acl, perms::READ, txn.auth) {
                    return Err(Code::NoAuth);
                }
                check_version(*version, node.stat.version)?;
                Ok(Done::Ok)
            }
            Op::SetAcl { path, acl, version } => {
                validate_path(path, false)?;
                let acl = fixup_acl(acl, txn.auth)?;
                let node = self.nodes.get(path.as_str()).ok_or(Code::NoNode)?;
                if !allowed(&node.acl, perms::ADMIN, txn.auth) {
                    return Err(Code::NoAuth);
                }
                check_version(*version, node.stat.aversion)?;
                self.save(&mut undo, path);
                self.dirty.insert(path.clone());
                let node = self.nodes.get_mut(path.as_str()).expect("checked above");
                node.acl = acl;
                node.stat.aversion = node.stat.aversion.wrapping_add(1);
                Ok(Done::Stat(node.stat()))
            }
            _ => Err(Code::BadArguments),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn create(
        &mut self,
        txn: &Txn<'_>,
        path: &str,
        data: &Bytes,
        acl: &[Acl],
        flags: i32,
        ttl: i64,
        undo: &mut Option<&mut Undo>,
    ) -> Result<Done, Code> {
        let mode = CreateMode::from_flags(flags).ok_or(Code::BadArguments)?;
        if mode.is_ttl() != (ttl != 0) || !(0..=TTL_MAX_MS).contains(&ttl) {
            return Err(Code::BadArguments);
        }
        if data.len() > MAX_BUFFER {
            return Err(Code::BadArguments);
        }
        // ZooKeeper looks only for a slash and no NUL first, finds the parent, and validates
        // the whole path (with its sequence suffix) after that: "/a/./b" is NoNode ("/a/." is
        // no node), "/a/" is BadArguments once "/a" is found.
        if !path.contains('/') || path.contains('\0') {
            return Err(Code::BadArguments);
        }
        let acl = fixup_acl(acl, txn.auth)?;
        let parent_path = parent_of(path).to_string();
        let parent = self.nodes.get(&parent_path).ok_or(Code::NoNode)?;
        if !allowed(&parent.acl, perms::CREATE, txn.auth) {
            return Err(Code::NoAuth);
        }
        let path = if mode.is_sequential() {
            format!("{path}{:010}", parent.stat.cversion)
        } else {
            path.to_string()
        };
        validate_path(&path, false)?;
        if path == "/" {
            return Err(Code::NodeExists);
        }
        if self.nodes.contains_key(&path) {
            return Err(Code::NodeExists);
        }
        if parent.session().is_some() {
            return Err(Code::NoChildrenForEphemerals);
        }
        let owner = match mode {
            _ if mode.is_ephemeral() => txn.session,
            CreateMode::Container => CONTAINER_OWNER,
            _ if mode.is_ttl() => TTL_OWNER_MASK | ttl,
            _ => 0,
        };
        self.save(undo, &path);
        self.save(undo, &parent_path);
        let node = Node::new(data.clone(), acl, txn.zxid, txn.time_ms, owner);
        let stat = node.stat();
        self.put_node(&path, Some(node));
        self.dirty.insert(parent_path.clone());
        let parent = self.nodes.get_mut(&parent_path).expect("checked above");
        parent.children.insert(name_of(&path).to_string());
        parent.stat.cversion = parent.stat.cversion.wrapping_add(1);
        parent.stat.pzxid = txn.zxid;
        Ok(Done::Created(path, stat))
    }

    /// Removes a childless node (checked by the caller) and updates its parent.
    fn remove(&mut self, zxid: i64, path: &str) {
        assert!(self.nodes.contains_key(path), "checked by the caller");
        self.put_node(path, None);
        self.dirty.insert(parent_of(path).to_string());
        let parent = self.nodes.get_mut(parent_of(path)).expect("a node's parent exists");
        parent.children.remove(name_of(path));
        parent.stat.cversion = parent.stat.cversion.wrapping_add(1);
        parent.stat.pzxid = zxid;
    }

    /// Whether there are container or TTL nodes to look at now and then.
    pub fn has_swept(&self) -> bool {
        !self.swept.is_empty()
    }

    /// ZooKeeper's container manager, on agreed time `now_ms`: deletes each container that had
    /// children and has none left, and each childless TTL node not modified for its TTL, without
    /// an ACL check (ZooKeeper's `deleteContainer`); their paths.
    pub fn sweep(&mut self, zxid: i64, now_ms: i64) -> Vec<String> {
        let due: Vec<String> = self
            .swept
            .iter()
            .filter(|path| {
                let node = &self.nodes[path.as_str()];
                let owner = node.stat.ephemeral_owner;
                node.children.is_empty()
                    && if owner == CONTAINER_OWNER {
                        node.stat.cversion > 0
                    } else {
                        now_ms.saturating_sub(node.stat.mtime) > owner & TTL_MAX_MS
                    }
            })
            .cloned()
            .collect();
        for path in &due {
            self.remove(zxid, path);
        }
        due
    }

    /// Deletes the ephemeral nodes of `session` (it closed or expired), deepest first; their
    /// paths.
    pub fn close_session(&mut self, zxid: i64, session: i64) -> Vec<String> {
        let paths: Vec<String> = self.ephemerals.remove(&session).into_iter().flatten().collect();
        for path in paths.iter().rev() {
            if self.nodes.contains_key(path) {
                self.remove(zxid, path);
            }
        }
        paths
    }

    /// Answers a read for a session authenticated as `auth`.
    pub fn read(&self, op: &Op, session: i64, auth: &[Id]) -> Result<Read, Code> {
        let readable = |path: &str| -> Result<&Node, Code> {
            validate_path(path, false)?;
            let node = self.nodes.get(path).ok_or(Code::NoNode)?;
            if allowed(&node.acl, perms::READ, auth) {
                Ok(node)
            } else {
                Err(Code::NoAuth)
            }
        };
        match op {
            Op::Exists { path, .. } => {
                validate_path(path, false)?;
                Ok(Read::Exists(self.nodes.get(path.as_str()).map(Node::stat)))
            }
            Op::GetData { path, .. } => readable(path).map(|n| Read::Data(n.data.clone(), n.stat())),
            Op::GetChildren { path, .. } => {
                readable(path).map(|n| Read::Children(n.children.iter().cloned().collect(), n.stat()))
            }
            Op::GetAcl { path } => {
                validate_path(path, false)?;
                let node = self.nodes.get(path.as_str()).ok_or(Code::NoNode)?;
                Ok(Read::Acl(node.acl.clone(), node.stat()))
            }
            Op::GetAllChildrenNumber { path } => {
                readable(path)?;
                if path == "/" {
                    return Ok(Read::Number(self.nodes.len() as i32 - 1));
                }
                let prefix = format!("{path}/");
                let count = self
                    .nodes
                    .range::<String, _>(prefix.clone()..)
                    .take_while(|(p, _)| p.starts_with(&prefix))
                    .count();
                Ok(Read::Number(count as i32))
            }
            Op::GetEphemerals { prefix } => Ok(Read::Paths(
                self.ephemerals_of(session)
                    .filter(|p| p.starts_with(prefix.as_str()))
                    .cloned()
                    .collect(),
            )),
            Op::Sync { path } => Ok(Read::Path(path.clone())),
            _ => Err(Code::BadArguments),
        }
    }
}

/// What a read returns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Read {
    /// exists: the node's Stat, if there is one.
    Exists(Option<Stat>),
    /// getData.
    Data(Bytes, Stat),
    /// getChildren, getChildren2: the names, in order.
    Children(Vec<String>, Stat),
    /// getACL.
    Acl(Vec<Acl>, Stat),
    /// getAllChildrenNumber.
    Number(i32),
    /// getEphemerals.
    Paths(Vec<String>),
    /// sync: the path.
    Path(String),
}

#[cfg(test)]
mod tests;

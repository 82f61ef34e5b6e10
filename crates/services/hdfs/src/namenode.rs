//! The NameNode's state machine (docs/HDFS.md): the namespace, files under construction and their
//! writers' leases, the block map with committed block hashes, and the DataNodes.
//!
//! Deterministic: every change comes from a [`Command`] applied at an agreed time with an agreed
//! seed ([`NameNode::apply`]), every table is an ordered map, and every choice (where a block's
//! replicas go, which replica is copied where) is drawn from the seed.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

/// A block's hash (BLAKE3 over its 64 KiB sub-blocks' hashes; docs/HDFS.md).
pub type Hash = [u8; 32];

/// The root directory's inode.
pub const ROOT: u64 = 1;
/// HDFS's default block size (`dfs.blocksize`): 128 MiB.
pub const BLOCK_SIZE_DEFAULT: u64 = 128 << 20;
/// Smallest block size a file may ask for (HDFS's `dfs.namenode.fs-limits.min-block-size`).
pub const BLOCK_SIZE_MIN: u64 = 1 << 20;
/// Largest block size a file may ask for.
pub const BLOCK_SIZE_MAX: u64 = 1 << 30;
/// HDFS's default replication factor (`dfs.replication`).
pub const REPLICATION_DEFAULT: u16 = 3;
/// Largest replication factor (HDFS's `dfs.replication.max`).
pub const REPLICATION_MAX: u16 = 512;
/// Replicas with the committed hash a block needs before it commits
/// (`dfs.namenode.replication.min`).
pub const MIN_REPLICAS: usize = 1;
/// A writer that has not renewed its lease for this long (agreed time) loses it: the file is closed
/// with its committed blocks (HDFS's hard limit is an hour; a gateway renews every few seconds).
pub const LEASE_HARD_LIMIT_MS: u64 = 10 * 60 * 1000;
/// A DataNode without a heartbeat for this long (agreed time) is dead (HDFS: 10.5 minutes).
pub const DATANODE_DEAD_MS: u64 = 60 * 1000;
/// A copy of a block that did not arrive in this long is handed out again.
pub const COPY_TIMEOUT_MS: u64 = 5 * 60 * 1000;
/// Longest path (bytes) and longest name component, as HDFS's limits.
pub const PATH_MAX: usize = 8000;
/// Longest name component (`dfs.namenode.fs-limits.max-component-length`).
pub const NAME_MAX: usize = 255;
/// Most entries one directory holds (`dfs.namenode.fs-limits.max-directory-items`).
pub const DIRECTORY_ITEMS_MAX: usize = 1 << 20;
/// Most inodes the namespace holds.
pub const INODES_MAX: usize = 10_000_000;
/// Most blocks one file holds (`dfs.namenode.fs-limits.max-blocks-per-file`).
pub const BLOCKS_PER_FILE_MAX: usize = 10_000;
/// Most DataNodes.
pub const DATANODES_MAX: usize = 10_000;
/// Most entries one LISTSTATUS reply carries (`dfs.ls.limit`); the rest come by `after`.
pub const LISTING_LIMIT: usize = 1000;
/// Most commands queued for one DataNode's next heartbeat.
pub const PENDING_PER_DATANODE_MAX: usize = 10_000;

/// One command of a client (the WebHDFS gateway) or a DataNode.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    /// MKDIRS: the directory and any missing parents.
    Mkdirs {
        /// Absolute path.
        path: String,
        /// Permission bits (`None`: 755).
        permission: Option<u16>,
        /// The user asking (owner of what is created).
        user: String,
    },
    /// CREATE: a new file under construction, its parents created as needed.
    Create {
        /// Absolute path.
        path: String,
        /// Replace an existing file.
        overwrite: bool,
        /// Replication factor (`None`: [`REPLICATION_DEFAULT`]).
        replication: Option<u16>,
        /// Block size (`None`: [`BLOCK_SIZE_DEFAULT`]).
        block_size: Option<u64>,
        /// Permission bits (`None`: 644).
        permission: Option<u16>,
        /// The user asking.
        user: String,
        /// The writer (its lease).
        holder: String,
    },
    /// APPEND: reopens a complete file for writing at its end (the next block is new).
    Append {
        /// Absolute path.
        path: String,
        /// The writer.
        holder: String,
    },
    /// The writer's next block: commits the previous one (if any) with the writer's length and
    /// hash, and allocates the next with its DataNodes.
    AddBlock {
        /// The file.
        path: String,
        /// The writer.
        holder: String,
        /// The block just written.
        previous: Option<BlockReport>,
    },
    /// Closes a file: the last block's length and hash; `Done(false)` until every block has
    /// committed (the writer asks again).
    Complete {
        /// The file.
        path: String,
        /// The writer.
        holder: String,
        /// The last block written.
        last: Option<BlockReport>,
    },
    /// The writer is alive (renews its leases).
    RenewLease {
        /// The writer.
        holder: String,
    },
    /// GETFILESTATUS.
    GetFileStatus {
        /// Absolute path.
        path: String,
    },
    /// LISTSTATUS: a directory's entries after `after` (a name), at most [`LISTING_LIMIT`].
    ListStatus {
        /// Absolute path.
        path: String,
        /// Start after this name.
        after: Option<String>,
    },
    /// GETCONTENTSUMMARY.
    GetContentSummary {
        /// Absolute path.
        path: String,
    },
    /// OPEN's metadata: the file's committed blocks with their hashes and DataNodes.
    GetBlockLocations {
        /// Absolute path.
        path: String,
    },
    /// DELETE.
    Delete {
        /// Absolute path.
        path: String,
        /// Delete a non-empty directory.
        recursive: bool,
    },
    /// RENAME (HDFS's rename: into `dst` if it is a directory; `false` if it cannot).
    Rename {
        /// Source path.
        src: String,
        /// Destination path.
        dst: String,
    },
    /// SETPERMISSION.
    SetPermission {
        /// Absolute path.
        path: String,
        /// Permission bits (up to 0o1777).
        permission: u16,
    },
    /// SETOWNER (either may be left out).
    SetOwner {
        /// Absolute path.
        path: String,
        /// New owner.
        owner: Option<String>,
        /// New group.
        group: Option<String>,
    },
    /// SETREPLICATION of a file.
    SetReplication {
        /// Absolute path.
        path: String,
        /// Replication factor.
        replication: u16,
    },
    /// A DataNode joins (or rejoins after a restart).
    RegisterDataNode {
        /// Its id (from its identity).
        id: u32,
        /// Where readers and writers reach it (`host:port`).
        addr: String,
        /// Bytes it may store.
        capacity: u64,
    },
    /// A DataNode is alive; the answer is what the NameNode asks of it.
    Heartbeat {
        /// The DataNode.
        id: u32,
        /// Bytes it stores.
        used: u64,
    },
    /// A DataNode finalized a replica with this length and hash.
    BlockReceived {
        /// The DataNode.
        id: u32,
        /// The replica.
        report: BlockReport,
    },
    /// A reader found DataNode `datanode`'s replica of `block` not matching the committed hash.
    BadReplica {
        /// The block.
        block: u64,
        /// The DataNode that served wrong bytes.
        datanode: u32,
    },
    /// The registered DataNodes (HDFS's `dfsadmin -report`).
    ListDataNodes,
}

/// A DataNode as the NameNode sees it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DataNodeInfo {
    /// Its id.
    pub id: u32,
    /// `host:port`.
    pub addr: String,
    /// Bytes it offers.
    pub capacity: u64,
    /// Bytes it stores (its last heartbeat).
    pub used: u64,
    /// Agreed time of its last heartbeat (ms).
    pub last_heartbeat_ms: u64,
    /// No heartbeat for [`DATANODE_DEAD_MS`].
    pub dead: bool,
    /// Good replicas it holds.
    pub replicas: u64,
}

/// A block with the length and hash someone reports for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlockReport {
    /// The block.
    pub block: u64,
    /// Bytes in it.
    pub len: u64,
    /// Its hash.
    pub hash: Hash,
}

/// A file or directory as GETFILESTATUS and LISTSTATUS give it (WebHDFS's `FileStatus`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileStatus {
    /// The last path component (empty for GETFILESTATUS).
    pub path_suffix: String,
    /// Directory or file.
    pub is_dir: bool,
    /// Bytes (committed blocks).
    pub length: u64,
    /// Owner.
    pub owner: String,
    /// Group.
    pub group: String,
    /// Permission bits.
    pub permission: u16,
    /// Last access, ms since the epoch (agreed time).
    pub access_time: u64,
    /// Last modification, ms since the epoch (agreed time).
    pub modification_time: u64,
    /// Block size (0 for a directory).
    pub block_size: u64,
    /// Replication factor (0 for a directory).
    pub replication: u16,
    /// The inode number.
    pub file_id: u64,
    /// Entries of a directory (0 for a file).
    pub children: u64,
}

/// GETCONTENTSUMMARY.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContentSummary {
    /// Directories, the path itself included if it is one.
    pub directories: u64,
    /// Files.
    pub files: u64,
    /// Bytes of the files.
    pub length: u64,
    /// Bytes times replication.
    pub space_consumed: u64,
}

/// A DataNode as readers and writers reach it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DataNodeAddr {
    /// Its id.
    pub id: u32,
    /// `host:port`.
    pub addr: String,
}

/// A block with where it is.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LocatedBlock {
    /// The block.
    pub block: u64,
    /// Its offset in the file.
    pub offset: u64,
    /// Its length (committed; 0 for a block being written).
    pub len: u64,
    /// Its committed hash (`None` for a block being written).
    pub hash: Option<Hash>,
    /// DataNodes to read it from (good replicas on live DataNodes), or to write it to.
    pub datanodes: Vec<DataNodeAddr>,
}

/// What the NameNode asks of a DataNode (in its heartbeat's answer).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum DataNodeCommand {
    /// Copy the replica of `report.block` (which must have this length and hash) to `target`.
    Copy {
        /// The block, its length and its committed hash.
        report: BlockReport,
        /// Where to.
        target: DataNodeAddr,
    },
    /// Drop the replicas of these blocks.
    Delete {
        /// The blocks.
        blocks: Vec<u64>,
    },
}

/// The answer to a command.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Answer {
    /// Done (MKDIRS, CREATE, APPEND, SETPERMISSION, ...).
    Ok,
    /// A yes or no (DELETE, RENAME, COMPLETE).
    Done(bool),
    /// GETFILESTATUS.
    Status(FileStatus),
    /// LISTSTATUS: entries, and how many come after them.
    Listing {
        /// The entries.
        entries: Vec<FileStatus>,
        /// Entries left after these.
        remaining: u64,
    },
    /// GETCONTENTSUMMARY.
    Summary(ContentSummary),
    /// ADDBLOCK: the new block and the DataNodes to write it to.
    Block(LocatedBlock),
    /// GETBLOCKLOCATIONS: the committed blocks, the file's length, and whether it is complete.
    Locations {
        /// The blocks in order.
        blocks: Vec<LocatedBlock>,
        /// The file's length.
        length: u64,
        /// Whether the file is closed.
        complete: bool,
    },
    /// HEARTBEAT: what the DataNode is to do.
    Commands(Vec<DataNodeCommand>),
    /// The registered DataNodes.
    DataNodes(Vec<DataNodeInfo>),
    /// A failure, as HDFS names it.
    Error(HdfsError),
}

/// HDFS's exceptions, as WebHDFS's `RemoteException` names them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum HdfsError {
    /// The path does not exist.
    #[error("File does not exist: {0}")]
    NotFound(String),
    /// The path exists.
    #[error("{0} already exists")]
    AlreadyExists(String),
    /// A component of the path is a file.
    #[error("Parent path is not a directory: {0}")]
    ParentNotDirectory(String),
    /// A non-recursive delete of a non-empty directory.
    #[error("{0} is non empty")]
    NotEmpty(String),
    /// A file operation on a directory.
    #[error("Path is not a file: {0}")]
    NotAFile(String),
    /// Another writer holds the file.
    #[error("Failed to create file {path}: it is being written by {holder}")]
    BeingWritten {
        /// The file.
        path: String,
        /// Its writer.
        holder: String,
    },
    /// The writer holds no lease on the file (it expired, or it never had one).
    #[error("No lease on {0}: the file is not open for writing by this writer")]
    NoLease(String),
    /// A bad argument (path, name, size, replication, permission).
    #[error("{0}")]
    BadArgument(String),
    /// Fewer live DataNodes than a block needs.
    #[error("File {path} could only be written to {live} of the {needed} minReplication nodes")]
    NoDataNodes {
        /// The file.
        path: String,
        /// Live DataNodes.
        live: usize,
        /// Needed.
        needed: usize,
    },
    /// A limit of the namespace.
    #[error("{0}")]
    Limit(String),
    /// A DataNode that is not registered.
    #[error("DataNode {0} is not registered")]
    UnknownDataNode(u32),
}

impl HdfsError {
    /// The Java exception WebHDFS names in its `RemoteException`.
    pub fn exception(&self) -> &'static str {
        match self {
            HdfsError::NotFound(_) => "FileNotFoundException",
            HdfsError::AlreadyExists(_) => "FileAlreadyExistsException",
            HdfsError::ParentNotDirectory(_) => "ParentNotDirectoryException",
            HdfsError::NotEmpty(_) => "PathIsNotEmptyDirectoryException",
            HdfsError::NotAFile(_) => "FileNotFoundException",
            HdfsError::BeingWritten { .. } => "AlreadyBeingCreatedException",
            HdfsError::NoLease(_) => "LeaseExpiredException",
            HdfsError::BadArgument(_) => "IllegalArgumentException",
            HdfsError::NoDataNodes { .. } | HdfsError::Limit(_) | HdfsError::UnknownDataNode(_) => "IOException",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
enum Kind {
    Dir {
        children: BTreeMap<String, u64>,
    },
    File {
        replication: u16,
        block_size: u64,
        blocks: Vec<u64>,
        /// The writer, while the file is open.
        writer: Option<String>,
    },
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Inode {
    parent: u64,
    name: String,
    owner: String,
    group: String,
    permission: u16,
    mtime: u64,
    atime: u64,
    kind: Kind,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Block {
    file: u64,
    /// The writer's length and hash, once reported.
    expected: Option<(u64, Hash)>,
    /// Committed (the writer's report matched by [`MIN_REPLICAS`] DataNodes).
    committed: bool,
    /// DataNodes it was handed to when allocated.
    targets: Vec<u32>,
    /// What each DataNode reported for its replica.
    reported: BTreeMap<u32, (u64, Hash)>,
    /// Copies handed out and not arrived: target and when.
    copying: BTreeMap<u32, u64>,
}

impl Block {
    /// DataNodes whose replica matches the writer's report.
    fn good(&self) -> impl Iterator<Item = u32> + '_ {
        self.reported
            .iter()
            .filter(move |(_, r)| Some(**r) == self.expected)
            .map(|(id, _)| *id)
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct DataNode {
    addr: String,
    capacity: u64,
    used: u64,
    last_heartbeat_ms: u64,
    dead: bool,
    pending: Vec<DataNodeCommand>,
}

/// The NameNode's state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NameNode {
    inodes: BTreeMap<u64, Inode>,
    next_inode: u64,
    blocks: BTreeMap<u64, Block>,
    next_block: u64,
    datanodes: BTreeMap<u32, DataNode>,
    /// Writers and the agreed time their lease ends.
    leases: BTreeMap<String, u64>,
    /// Agreed time of the command being applied (ms).
    now_ms: u64,
    /// Random state for the command being applied.
    random: u64,
}

impl Default for NameNode {
    fn default() -> NameNode {
        NameNode::new()
    }
}

fn bad(why: impl Into<String>) -> HdfsError {
    HdfsError::BadArgument(why.into())
}

/// The components of an absolute path (`/` has none).
fn components(path: &str) -> Result<Vec<&str>, HdfsError> {
    if !path.starts_with('/') {
        return Err(bad(format!("Invalid path name {path}: not absolute")));
    }
    if path.len() > PATH_MAX {
        return Err(bad(format!("Invalid path name: longer than {PATH_MAX} bytes")));
    }
    let parts: Vec<&str> = path.split('/').filter(|c| !c.is_empty()).collect();
    for c in &parts {
        if *c == "." || *c == ".." || c.contains(':') {
            return Err(bad(format!("Invalid path name {path}")));
        }
        if c.len() > NAME_MAX {
            return Err(bad(format!("The maximum path component name limit of {c} is exceeded")));
        }
    }
    Ok(parts)
}

/// splitmix64.
fn mix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl NameNode {
    /// An empty namespace: the root directory, owned by `hdfs`.
    pub fn new() -> NameNode {
        let mut inodes = BTreeMap::new();
        inodes.insert(
            ROOT,
            Inode {
                parent: ROOT,
                name: String::new(),
                owner: "hdfs".into(),
                group: "supergroup".into(),
                permission: 0o755,
                mtime: 0,
                atime: 0,
                kind: Kind::Dir {
                    children: BTreeMap::new(),
                },
            },
        );
        NameNode {
            inodes,
            next_inode: ROOT + 1,
            blocks: BTreeMap::new(),
            next_block: 1 << 30, // HDFS's first block ids are large; any start works
            datanodes: BTreeMap::new(),
            leases: BTreeMap::new(),
            now_ms: 0,
            random: 0,
        }
    }

    /// Applies `command` at agreed time `now_ms` with agreed randomness `seed`.
    pub fn apply(&mut self, now_ms: u64, seed: u64, command: &Command) -> Answer {
        self.now_ms = self.now_ms.max(now_ms);
        self.random = seed;
        self.expire();
        let result = match command {
            Command::Mkdirs { path, permission, user } => self
                .mkdirs(path, permission.unwrap_or(0o755), user)
                .map(|_| Answer::Done(true)),
            Command::Create {
                path,
                overwrite,
                replication,
                block_size,
                permission,
                user,
                holder,
            } => self
                .create(
                    path,
                    *overwrite,
                    (
                        replication.unwrap_or(REPLICATION_DEFAULT),
                        block_size.unwrap_or(BLOCK_SIZE_DEFAULT),
                    ),
                    permission.unwrap_or(0o644),
                    user,
                    holder,
                )
                .map(|_| Answer::Ok),
            Command::Append { path, holder } => self.append(path, holder).map(|_| Answer::Ok),
            Command::AddBlock { path, holder, previous } => self.add_block(path, holder, previous.as_ref()),
            Command::Complete { path, holder, last } => self.complete(path, holder, last.as_ref()),
            Command::RenewLease { holder } => {
                if let Some(until) = self.leases.get_mut(holder) {
                    *until = self.now_ms + LEASE_HARD_LIMIT_MS;
                }
                Ok(Answer::Ok)
            }
            Command::GetFileStatus { .. }
            | Command::ListStatus { .. }
            | Command::GetContentSummary { .. }
            | Command::GetBlockLocations { .. }
            | Command::ListDataNodes => return self.read(command).expect("a read"),
            Command::Delete { path, recursive } => self.delete(path, *recursive),
            Command::Rename { src, dst } => self.rename(src, dst),
            Command::SetPermission { path, permission } => self.set_permission(path, *permission),
            Command::SetOwner { path, owner, group } => self.resolve(path).map(|id| {
                let inode = self.inodes.get_mut(&id).expect("resolved");
                if let Some(o) = owner {
                    inode.owner = o.clone();
                }
                if let Some(g) = group {
                    inode.group = g.clone();
                }
                Answer::Ok
            }),
            Command::SetReplication { path, replication } => self.set_replication(path, *replication),
            Command::RegisterDataNode { id, addr, capacity } => self.register(*id, addr, *capacity),
            Command::Heartbeat { id, used } => self.heartbeat(*id, *used),
            Command::BlockReceived { id, report } => self.block_received(*id, report),
            Command::BadReplica { block, datanode } => {
                self.drop_replica(*block, *datanode);
                self.schedule_copies();
                Ok(Answer::Ok)
            }
        };
        result.unwrap_or_else(Answer::Error)
    }

    /// Answers a command that only reads (GETFILESTATUS, LISTSTATUS, GETCONTENTSUMMARY, the
    /// block locations) from the current state; `None` for one that writes.
    pub fn read(&self, command: &Command) -> Option<Answer> {
        let result = match command {
            Command::GetFileStatus { path } => self
                .resolve(path)
                .map(|id| Answer::Status(self.status(id, String::new()))),
            Command::ListStatus { path, after } => self.list(path, after.as_deref()),
            Command::GetContentSummary { path } => self.resolve(path).map(|id| {
                let mut summary = ContentSummary::default();
                self.summarize(id, &mut summary);
                Answer::Summary(summary)
            }),
            Command::GetBlockLocations { path } => self.locations(path),
            Command::ListDataNodes => Ok(Answer::DataNodes(
                self.datanodes
                    .iter()
                    .map(|(id, d)| DataNodeInfo {
                        id: *id,
                        addr: d.addr.clone(),
                        capacity: d.capacity,
                        used: d.used,
                        last_heartbeat_ms: d.last_heartbeat_ms,
                        dead: d.dead,
                        replicas: self.blocks.values().filter(|b| b.good().any(|g| g == *id)).count() as u64,
                    })
                    .collect(),
            )),
            _ => return None,
        };
        Some(result.unwrap_or_else(Answer::Error))
    }

    /// The agreed time (ms) at which the NameNode next has something to do on its own: a lease
    /// that runs out, a DataNode that would be dead, a copy to hand out again.
    pub fn wake_at_ms(&self) -> Option<u64> {
        let leases = self.leases.values().copied();
        let datanodes = self
            .datanodes
            .values()
            .filter(|d| !d.dead)
            .map(|d| d.last_heartbeat_ms + DATANODE_DEAD_MS);
        let copies = self
            .blocks
            .values()
            .flat_map(|b| b.copying.values().map(|since| since + COPY_TIMEOUT_MS));
        leases.chain(datanodes).chain(copies).min().map(|t| t + 1)
    }

    /// Runs what agreed time `now_ms` makes due (leases, dead DataNodes, late copies).
    pub fn wake(&mut self, now_ms: u64, seed: u64) {
        self.now_ms = self.now_ms.max(now_ms);
        self.random = seed;
        self.expire();
    }

    fn draw(&mut self) -> u64 {
        mix(&mut self.random)
    }

    /// Expired leases close their files; silent DataNodes die; late copies are retried.
    fn expire(&mut self) {
        let now = self.now_ms;
        let expired: Vec<String> = self
            .leases
            .iter()
            .filter(|(_, until)| **until < now)
            .map(|(h, _)| h.clone())
            .collect();
        for holder in expired {
            self.leases.remove(&holder);
            let files: Vec<u64> = self
                .inodes
                .iter()
                .filter(|(_, i)| matches!(&i.kind, Kind::File { writer: Some(w), .. } if *w == holder))
                .map(|(id, _)| *id)
                .collect();
            for file in files {
                self.recover(file);
            }
        }
        let mut died = false;
        for dn in self.datanodes.values_mut() {
            if !dn.dead && dn.last_heartbeat_ms + DATANODE_DEAD_MS < now {
                dn.dead = true;
                dn.pending.clear();
                died = true;
            }
        }
        let mut late = false;
        for block in self.blocks.values_mut() {
            let before = block.copying.len();
            block.copying.retain(|_, since| *since + COPY_TIMEOUT_MS >= now);
            late |= block.copying.len() != before;
        }
        if died || late {
            self.schedule_copies();
        }
    }

    /// Closes a file whose writer is gone: committed blocks stay, the rest go.
    fn recover(&mut self, file: u64) {
        let Some(Kind::File { blocks, writer, .. }) = self.inodes.get_mut(&file).map(|i| &mut i.kind) else {
            return;
        };
        *writer = None;
        let (keep, drop): (Vec<u64>, Vec<u64>) = blocks
            .iter()
            .partition(|b| self.blocks.get(b).is_some_and(|b| b.committed));
        *blocks = keep;
        self.forget_blocks(&drop);
    }

    fn resolve(&self, path: &str) -> Result<u64, HdfsError> {
        let mut id = ROOT;
        for c in components(path)? {
            match &self.inodes[&id].kind {
                Kind::Dir { children } => match children.get(c) {
                    Some(next) => id = *next,
                    None => return Err(HdfsError::NotFound(path.to_string())),
                },
                Kind::File { .. } => return Err(HdfsError::ParentNotDirectory(path.to_string())),
            }
        }
        Ok(id)
    }

    /// The parent directory of `path` and its last component; `create_parents` makes missing
    /// directories.
    fn parent_of<'a>(&mut self, path: &'a str, create_parents: Option<&str>) -> Result<(u64, &'a str), HdfsError> {
        let parts = components(path)?;
        let Some((name, dirs)) = parts.split_last() else {
            return Err(bad("the root has no parent"));
        };
        let mut id = ROOT;
        for c in dirs {
            let next = match &self.inodes[&id].kind {
                Kind::Dir { children } => children.get(*c).copied(),
                Kind::File { .. } => return Err(HdfsError::ParentNotDirectory(path.to_string())),
            };
            id = match (next, create_parents) {
                (Some(next), _) => next,
                (None, Some(user)) => self.make_dir(id, c, 0o755, user)?,
                (None, None) => return Err(HdfsError::NotFound(path.to_string())),
            };
        }
        if matches!(self.inodes[&id].kind, Kind::File { .. }) {
            return Err(HdfsError::ParentNotDirectory(path.to_string()));
        }
        Ok((id, name))
    }

    /// A new inode `name` in directory `parent`, owned by `user`, of group `supergroup`.
    fn new_inode(
        &mut self,
        parent: u64,
        name: &str,
        (user, permission): (&str, u16),
        kind: Kind,
    ) -> Result<u64, HdfsError> {
        if self.inodes.len() >= INODES_MAX {
            return Err(HdfsError::Limit(format!("the namespace holds {INODES_MAX} inodes")));
        }
        let Kind::Dir { children } = &mut self.inodes.get_mut(&parent).expect("parent").kind else {
            unreachable!("parents are directories");
        };
        if children.len() >= DIRECTORY_ITEMS_MAX {
            return Err(HdfsError::Limit(format!(
                "The directory item limit of {DIRECTORY_ITEMS_MAX} is exceeded"
            )));
        }
        let id = self.next_inode;
        self.next_inode += 1;
        children.insert(name.to_string(), id);
        let now = self.now_ms;
        self.inodes.insert(
            id,
            Inode {
                parent,
                name: name.to_string(),
                owner: user.to_string(),
                group: "supergroup".into(),
                permission,
                mtime: now,
                atime: now,
                kind,
            },
        );
        self.touch(parent);
        Ok(id)
    }

    fn touch(&mut self, id: u64) {
        let now = self.now_ms;
        if let Some(i) = self.inodes.get_mut(&id) {
            i.mtime = now;
        }
    }

    fn make_dir(&mut self, parent: u64, name: &str, permission: u16, user: &str) -> Result<u64, HdfsError> {
        let kind = Kind::Dir {
            children: BTreeMap::new(),
        };
        self.new_inode(parent, name, (user, permission), kind)
    }

    fn mkdirs(&mut self, path: &str, permission: u16, user: &str) -> Result<(), HdfsError> {
        check_permission(permission)?;
        if components(path)?.is_empty() {
            return Ok(());
        }
        let (parent, name) = self.parent_of(path, Some(user))?;
        match self.child(parent, name) {
            Some(id) if matches!(self.inodes[&id].kind, Kind::Dir { .. }) => Ok(()),
            Some(_) => Err(HdfsError::AlreadyExists(path.to_string())),
            None => self.make_dir(parent, name, permission, user).map(|_| ()),
        }
    }

    fn child(&self, dir: u64, name: &str) -> Option<u64> {
        match &self.inodes[&dir].kind {
            Kind::Dir { children } => children.get(name).copied(),
            Kind::File { .. } => None,
        }
    }

    fn create(
        &mut self,
        path: &str,
        overwrite: bool,
        (replication, block_size): (u16, u64),
        permission: u16,
        user: &str,
        holder: &str,
    ) -> Result<(), HdfsError> {
        check_permission(permission)?;
        check_replication(replication)?;
        if !(BLOCK_SIZE_MIN..=BLOCK_SIZE_MAX).contains(&block_size) {
            return Err(bad(format!(
                "Specified block size {block_size} is outside {BLOCK_SIZE_MIN} to {BLOCK_SIZE_MAX}"
            )));
        }
        if holder.is_empty() {
            return Err(bad("a writer needs a name"));
        }
        let (parent, name) = self.parent_of(path, Some(user))?;
        if let Some(existing) = self.child(parent, name) {
            match &self.inodes[&existing].kind {
                Kind::Dir { .. } => return Err(HdfsError::AlreadyExists(path.to_string())),
                Kind::File { writer: Some(w), .. } => {
                    return Err(HdfsError::BeingWritten {
                        path: path.to_string(),
                        holder: w.clone(),
                    })
                }
                Kind::File { .. } if !overwrite => return Err(HdfsError::AlreadyExists(path.to_string())),
                Kind::File { .. } => self.remove(existing),
            }
        }
        let kind = Kind::File {
            replication,
            block_size,
            blocks: Vec::new(),
            writer: Some(holder.to_string()),
        };
        self.new_inode(parent, name, (user, permission), kind)?;
        self.leases
            .insert(holder.to_string(), self.now_ms + LEASE_HARD_LIMIT_MS);
        Ok(())
    }

    fn append(&mut self, path: &str, holder: &str) -> Result<(), HdfsError> {
        if holder.is_empty() {
            return Err(bad("a writer needs a name"));
        }
        let id = self.resolve(path)?;
        match &mut self.inodes.get_mut(&id).expect("resolved").kind {
            Kind::Dir { .. } => Err(HdfsError::NotAFile(path.to_string())),
            Kind::File { writer: Some(w), .. } => Err(HdfsError::BeingWritten {
                path: path.to_string(),
                holder: w.clone(),
            }),
            Kind::File { writer, .. } => {
                *writer = Some(holder.to_string());
                self.leases
                    .insert(holder.to_string(), self.now_ms + LEASE_HARD_LIMIT_MS);
                Ok(())
            }
        }
    }

    /// The file `path` open for writing by `holder`: its inode.
    fn written_by(&mut self, path: &str, holder: &str) -> Result<u64, HdfsError> {
        let id = self.resolve(path)?;
        match &self.inodes[&id].kind {
            Kind::File { writer: Some(w), .. } if w == holder => {
                self.leases
                    .insert(holder.to_string(), self.now_ms + LEASE_HARD_LIMIT_MS);
                Ok(id)
            }
            Kind::Dir { .. } => Err(HdfsError::NotAFile(path.to_string())),
            Kind::File { .. } => Err(HdfsError::NoLease(path.to_string())),
        }
    }

    /// The writer's report of `report.block` (a block of `file` not yet reported).
    fn writer_reports(&mut self, file: u64, report: &BlockReport, path: &str) -> Result<(), HdfsError> {
        let last = match &self.inodes[&file].kind {
            Kind::File { blocks, .. } => blocks.last().copied(),
            Kind::Dir { .. } => None,
        };
        if last != Some(report.block) {
            return Err(bad(format!("block {} is not the last block of {path}", report.block)));
        }
        let block = self
            .blocks
            .get_mut(&report.block)
            .expect("a file's blocks are in the map");
        let expected = (report.len, report.hash);
        match block.expected {
            None => block.expected = Some(expected),
            Some(e) if e == expected => {}
            Some(_) => return Err(bad(format!("block {} was reported with another hash", report.block))),
        }
        // DataNodes that reported other bytes before the writer spoke: their replicas go.
        let wrong: Vec<u32> = block
            .reported
            .iter()
            .filter(|(_, r)| **r != expected)
            .map(|(d, _)| *d)
            .collect();
        for d in wrong {
            self.drop_replica(report.block, d);
        }
        self.check_commit(report.block);
        Ok(())
    }

    fn check_commit(&mut self, id: u64) {
        let Some(block) = self.blocks.get_mut(&id) else { return };
        if !block.committed && block.expected.is_some() && block.good().count() >= MIN_REPLICAS {
            block.committed = true;
        }
    }

    fn add_block(&mut self, path: &str, holder: &str, previous: Option<&BlockReport>) -> Result<Answer, HdfsError> {
        let file = self.written_by(path, holder)?;
        if let Some(report) = previous {
            self.writer_reports(file, report, path)?;
        }
        let Kind::File {
            replication, blocks, ..
        } = &self.inodes[&file].kind
        else {
            unreachable!("written_by gives files");
        };
        let replication = *replication as usize;
        if let Some(last) = blocks.last() {
            if self.blocks.get(last).is_some_and(|b| b.expected.is_none()) {
                return Err(bad(format!("the last block of {path} was not reported")));
            }
        }
        if blocks.len() >= BLOCKS_PER_FILE_MAX {
            return Err(HdfsError::Limit(format!(
                "File has reached the limit on maximum number of blocks ({BLOCKS_PER_FILE_MAX})"
            )));
        }
        let live = self.live_datanodes();
        if live.len() < MIN_REPLICAS {
            return Err(HdfsError::NoDataNodes {
                path: path.to_string(),
                live: live.len(),
                needed: MIN_REPLICAS,
            });
        }
        let targets = self.pick(&live, replication.min(live.len()));
        let id = self.next_block;
        self.next_block += 1;
        self.blocks.insert(
            id,
            Block {
                file,
                expected: None,
                committed: false,
                targets: targets.clone(),
                reported: BTreeMap::new(),
                copying: BTreeMap::new(),
            },
        );
        let offset = self.file_length(file);
        if let Kind::File { blocks, .. } = &mut self.inodes.get_mut(&file).expect("file").kind {
            blocks.push(id);
        }
        Ok(Answer::Block(LocatedBlock {
            block: id,
            offset,
            len: 0,
            hash: None,
            datanodes: self.addrs(targets),
        }))
    }

    /// The DataNodes not dead, by id.
    fn live_datanodes(&self) -> Vec<u32> {
        self.datanodes
            .iter()
            .filter(|(_, d)| !d.dead)
            .map(|(id, _)| *id)
            .collect()
    }

    /// `n` distinct DataNodes of `from`, drawn with the agreed randomness.
    fn pick(&mut self, from: &[u32], n: usize) -> Vec<u32> {
        let mut pool = from.to_vec();
        let mut out = Vec::with_capacity(n);
        while out.len() < n && !pool.is_empty() {
            let i = (self.draw() % pool.len() as u64) as usize;
            out.push(pool.swap_remove(i));
        }
        out
    }

    fn addrs(&self, ids: impl IntoIterator<Item = u32>) -> Vec<DataNodeAddr> {
        ids.into_iter()
            .filter_map(|id| {
                self.datanodes.get(&id).map(|d| DataNodeAddr {
                    id,
                    addr: d.addr.clone(),
                })
            })
            .collect()
    }

    fn complete(&mut self, path: &str, holder: &str, last: Option<&BlockReport>) -> Result<Answer, HdfsError> {
        let file = self.written_by(path, holder)?;
        if let Some(report) = last {
            self.writer_reports(file, report, path)?;
        }
        let Kind::File { blocks, .. } = &self.inodes[&file].kind else {
            unreachable!("written_by gives files");
        };
        if blocks.iter().any(|b| !self.blocks[b].committed) {
            if blocks.iter().any(|b| self.blocks[b].expected.is_none()) {
                return Err(bad(format!("a block of {path} was not reported by its writer")));
            }
            return Ok(Answer::Done(false));
        }
        if let Kind::File { writer, .. } = &mut self.inodes.get_mut(&file).expect("file").kind {
            *writer = None;
        }
        self.touch(file);
        self.release_if_idle(holder);
        self.schedule_copies();
        Ok(Answer::Done(true))
    }

    fn file_length(&self, file: u64) -> u64 {
        match &self.inodes[&file].kind {
            Kind::File { blocks, .. } => blocks
                .iter()
                .filter_map(|b| self.blocks.get(b))
                .filter(|b| b.committed)
                .filter_map(|b| b.expected.map(|(len, _)| len))
                .sum(),
            Kind::Dir { .. } => 0,
        }
    }

    fn status(&self, id: u64, path_suffix: String) -> FileStatus {
        let i = &self.inodes[&id];
        let (is_dir, block_size, replication, children) = match &i.kind {
            Kind::Dir { children } => (true, 0, 0, children.len() as u64),
            Kind::File {
                replication,
                block_size,
                ..
            } => (false, *block_size, *replication, 0),
        };
        FileStatus {
            path_suffix,
            is_dir,
            length: self.file_length(id),
            owner: i.owner.clone(),
            group: i.group.clone(),
            permission: i.permission,
            access_time: if is_dir { 0 } else { i.atime },
            modification_time: i.mtime,
            block_size,
            replication,
            file_id: id,
            children,
        }
    }

    fn list(&self, path: &str, after: Option<&str>) -> Result<Answer, HdfsError> {
        let id = self.resolve(path)?;
        let Kind::Dir { children } = &self.inodes[&id].kind else {
            // LISTSTATUS of a file lists the file itself.
            return Ok(Answer::Listing {
                entries: vec![self.status(id, String::new())],
                remaining: 0,
            });
        };
        let rest: Vec<(&String, &u64)> = match after {
            Some(a) => children
                .range::<str, _>((std::ops::Bound::Excluded(a), std::ops::Bound::Unbounded))
                .collect(),
            None => children.iter().collect(),
        };
        let entries = rest
            .iter()
            .take(LISTING_LIMIT)
            .map(|(name, child)| self.status(**child, (*name).clone()))
            .collect::<Vec<_>>();
        Ok(Answer::Listing {
            remaining: (rest.len() - entries.len()) as u64,
            entries,
        })
    }

    fn summarize(&self, id: u64, summary: &mut ContentSummary) {
        match &self.inodes[&id].kind {
            Kind::Dir { children } => {
                summary.directories += 1;
                for child in children.values() {
                    self.summarize(*child, summary);
                }
            }
            Kind::File { replication, .. } => {
                let len = self.file_length(id);
                summary.files += 1;
                summary.length += len;
                summary.space_consumed += len * u64::from(*replication);
            }
        }
    }

    fn locations(&self, path: &str) -> Result<Answer, HdfsError> {
        let id = self.resolve(path)?;
        let Kind::File { blocks, writer, .. } = &self.inodes[&id].kind else {
            return Err(HdfsError::NotAFile(path.to_string()));
        };
        let mut offset = 0;
        let mut out = Vec::new();
        for b in blocks {
            let block = &self.blocks[b];
            let (true, Some((len, hash))) = (block.committed, block.expected) else {
                break; // the committed prefix
            };
            let live = block.good().filter(|d| self.datanodes.get(d).is_some_and(|d| !d.dead));
            out.push(LocatedBlock {
                block: *b,
                offset,
                len,
                hash: Some(hash),
                datanodes: self.addrs(live),
            });
            offset += len;
        }
        Ok(Answer::Locations {
            blocks: out,
            length: offset,
            complete: writer.is_none(),
        })
    }

    /// Removes inode `id` and everything under it, and its blocks.
    fn remove(&mut self, id: u64) {
        let Some(inode) = self.inodes.remove(&id) else { return };
        if let Some(Kind::Dir { children }) = self.inodes.get_mut(&inode.parent).map(|p| &mut p.kind) {
            children.remove(&inode.name);
        }
        self.touch(inode.parent);
        let mut stack = vec![inode];
        let mut writers = Vec::new();
        while let Some(inode) = stack.pop() {
            match inode.kind {
                Kind::Dir { children } => {
                    stack.extend(children.values().filter_map(|c| self.inodes.remove(c)));
                }
                Kind::File { blocks, writer, .. } => {
                    writers.extend(writer);
                    self.forget_blocks(&blocks);
                }
            }
        }
        for writer in writers {
            self.release_if_idle(&writer);
        }
    }

    /// Drops `holder`'s lease if it writes no file any more.
    fn release_if_idle(&mut self, holder: &str) {
        let writes = self
            .inodes
            .values()
            .any(|i| matches!(&i.kind, Kind::File { writer: Some(w), .. } if w == holder));
        if !writes {
            self.leases.remove(holder);
        }
    }

    /// Drops `blocks` from the map and asks their DataNodes to delete their replicas.
    fn forget_blocks(&mut self, blocks: &[u64]) {
        for b in blocks {
            let Some(block) = self.blocks.remove(b) else { continue };
            let holders: BTreeSet<u32> = block
                .reported
                .keys()
                .chain(&block.targets)
                .chain(block.copying.keys())
                .copied()
                .collect();
            for holder in holders {
                self.queue(holder, DataNodeCommand::Delete { blocks: vec![*b] });
            }
        }
    }

    fn queue(&mut self, datanode: u32, command: DataNodeCommand) {
        if let Some(d) = self.datanodes.get_mut(&datanode) {
            if !d.dead && d.pending.len() < PENDING_PER_DATANODE_MAX {
                d.pending.push(command);
            }
        }
    }

    fn delete(&mut self, path: &str, recursive: bool) -> Result<Answer, HdfsError> {
        let id = match self.resolve(path) {
            Ok(id) => id,
            Err(HdfsError::NotFound(_)) => return Ok(Answer::Done(false)),
            Err(e) => return Err(e),
        };
        if id == ROOT {
            return Ok(Answer::Done(false));
        }
        if let Kind::Dir { children } = &self.inodes[&id].kind {
            if !children.is_empty() && !recursive {
                return Err(HdfsError::NotEmpty(path.to_string()));
            }
        }
        self.remove(id);
        Ok(Answer::Done(true))
    }

    fn rename(&mut self, src: &str, dst: &str) -> Result<Answer, HdfsError> {
        let Ok(from) = self.resolve(src) else {
            return Ok(Answer::Done(false));
        };
        if from == ROOT {
            return Ok(Answer::Done(false));
        }
        // Into `dst` if it is a directory, else as `dst`.
        let (parent, name) = match self.resolve(dst) {
            Ok(d) if matches!(self.inodes[&d].kind, Kind::Dir { .. }) => (d, self.inodes[&from].name.clone()),
            Ok(_) => return Ok(Answer::Done(false)),
            Err(HdfsError::NotFound(_)) => match self.parent_of(dst, None) {
                Ok((p, n)) => (p, n.to_string()),
                Err(_) => return Ok(Answer::Done(false)),
            },
            Err(e) => return Err(e),
        };
        // Not into itself or below itself.
        let mut up = parent;
        loop {
            if up == from {
                return Ok(Answer::Done(false));
            }
            if up == ROOT {
                break;
            }
            up = self.inodes[&up].parent;
        }
        if self.child(parent, &name).is_some() {
            return Ok(Answer::Done(false));
        }
        if let Kind::Dir { children } = &self.inodes[&parent].kind {
            if children.len() >= DIRECTORY_ITEMS_MAX {
                return Err(HdfsError::Limit(format!(
                    "The directory item limit of {DIRECTORY_ITEMS_MAX} is exceeded"
                )));
            }
        }
        let old_parent = self.inodes[&from].parent;
        let old_name = self.inodes[&from].name.clone();
        if let Kind::Dir { children } = &mut self.inodes.get_mut(&old_parent).expect("parent").kind {
            children.remove(&old_name);
        }
        if let Kind::Dir { children } = &mut self.inodes.get_mut(&parent).expect("parent").kind {
            children.insert(name.clone(), from);
        }
        let moved = self.inodes.get_mut(&from).expect("source");
        moved.parent = parent;
        moved.name = name;
        self.touch(old_parent);
        self.touch(parent);
        Ok(Answer::Done(true))
    }

    fn set_permission(&mut self, path: &str, permission: u16) -> Result<Answer, HdfsError> {
        check_permission(permission)?;
        let id = self.resolve(path)?;
        self.inodes.get_mut(&id).expect("resolved").permission = permission;
        Ok(Answer::Ok)
    }

    fn set_replication(&mut self, path: &str, replication: u16) -> Result<Answer, HdfsError> {
        check_replication(replication)?;
        let id = self.resolve(path)?;
        match &mut self.inodes.get_mut(&id).expect("resolved").kind {
            Kind::Dir { .. } => Ok(Answer::Done(false)),
            Kind::File { replication: r, .. } => {
                *r = replication;
                self.schedule_copies();
                Ok(Answer::Done(true))
            }
        }
    }

    fn register(&mut self, id: u32, addr: &str, capacity: u64) -> Result<Answer, HdfsError> {
        if addr.is_empty() || addr.len() > 256 {
            return Err(bad("a DataNode address is host:port"));
        }
        if !self.datanodes.contains_key(&id) && self.datanodes.len() >= DATANODES_MAX {
            return Err(HdfsError::Limit(format!("{DATANODES_MAX} DataNodes are registered")));
        }
        let now = self.now_ms;
        let dn = self.datanodes.entry(id).or_insert_with(|| DataNode {
            addr: String::new(),
            capacity: 0,
            used: 0,
            last_heartbeat_ms: now,
            dead: false,
            pending: Vec::new(),
        });
        dn.addr = addr.to_string();
        dn.capacity = capacity;
        dn.last_heartbeat_ms = now;
        dn.dead = false;
        self.schedule_copies();
        Ok(Answer::Ok)
    }

    fn heartbeat(&mut self, id: u32, used: u64) -> Result<Answer, HdfsError> {
        let now = self.now_ms;
        let dn = self.datanodes.get_mut(&id).ok_or(HdfsError::UnknownDataNode(id))?;
        dn.used = used;
        dn.last_heartbeat_ms = now;
        let revived = std::mem::replace(&mut dn.dead, false);
        let commands = std::mem::take(&mut dn.pending);
        // A revived DataNode holds replicas again; one told to delete may take copies again.
        if revived || !commands.is_empty() {
            self.schedule_copies();
        }
        Ok(Answer::Commands(commands))
    }

    fn block_received(&mut self, id: u32, report: &BlockReport) -> Result<Answer, HdfsError> {
        if !self.datanodes.contains_key(&id) {
            return Err(HdfsError::UnknownDataNode(id));
        }
        let Some(block) = self.blocks.get_mut(&report.block) else {
            // A block that no longer exists (deleted, or never allocated): drop the replica.
            self.queue(
                id,
                DataNodeCommand::Delete {
                    blocks: vec![report.block],
                },
            );
            return Ok(Answer::Ok);
        };
        block.copying.remove(&id);
        block.reported.insert(id, (report.len, report.hash));
        if block.expected.is_some_and(|e| e != (report.len, report.hash)) {
            // Not the committed bytes: that replica does not count and goes.
            self.queue(
                id,
                DataNodeCommand::Delete {
                    blocks: vec![report.block],
                },
            );
        }
        self.check_commit(report.block);
        self.schedule_copies();
        Ok(Answer::Ok)
    }

    fn drop_replica(&mut self, block: u64, datanode: u32) {
        let removed = self
            .blocks
            .get_mut(&block)
            .is_some_and(|b| b.reported.remove(&datanode).is_some());
        if removed {
            self.queue(datanode, DataNodeCommand::Delete { blocks: vec![block] });
        }
    }

    /// Hands out copies for every committed block of a closed file with fewer good replicas on
    /// live DataNodes than its file's replication (and none being copied already).
    fn schedule_copies(&mut self) {
        let live = self.live_datanodes();
        let ids: Vec<u64> = self.blocks.keys().copied().collect();
        for id in ids {
            let block = &self.blocks[&id];
            let Some((len, hash)) = block.expected.filter(|_| block.committed) else {
                continue;
            };
            let Some(Kind::File { replication, .. }) = self.inodes.get(&block.file).map(|i| &i.kind) else {
                continue;
            };
            let good: Vec<u32> = block.good().filter(|d| live.contains(d)).collect();
            let want = (*replication as usize).min(live.len());
            let short = want.saturating_sub(good.len() + block.copying.len());
            if short == 0 || good.is_empty() {
                continue;
            }
            // Not to a DataNode still to be told to delete its replica of this block: the copy
            // could arrive before the delete and be deleted with it.
            let deleting = |d: &u32| {
                self.datanodes[d]
                    .pending
                    .iter()
                    .any(|c| matches!(c, DataNodeCommand::Delete { blocks } if blocks.contains(&id)))
            };
            let candidates: Vec<u32> = live
                .iter()
                .copied()
                .filter(|d| !good.contains(d) && !block.copying.contains_key(d) && !deleting(d))
                .collect();
            let targets = self.pick(&candidates, short);
            for target in targets {
                let source = good[(self.draw() % good.len() as u64) as usize];
                let Some(addr) = self.addrs([target]).pop() else {
                    continue;
                };
                self.queue(
                    source,
                    DataNodeCommand::Copy {
                        report: BlockReport { block: id, len, hash },
                        target: addr,
                    },
                );
                let now = self.now_ms;
                self.blocks.get_mut(&id).expect("block").copying.insert(target, now);
            }
        }
    }

    /// Good replicas of `block` on live DataNodes (tests and status).
    pub fn live_replicas(&self, block: u64) -> usize {
        self.blocks.get(&block).map_or(0, |b| {
            b.good()
                .filter(|d| self.datanodes.get(d).is_some_and(|d| !d.dead))
                .count()
        })
    }
}

fn check_permission(permission: u16) -> Result<(), HdfsError> {
    if permission > 0o1777 {
        return Err(bad(format!("Invalid permission {permission:o}")));
    }
    Ok(())
}

fn check_replication(replication: u16) -> Result<(), HdfsError> {
    if replication == 0 || replication > REPLICATION_MAX {
        return Err(bad(format!(
            "Requested replication factor of {replication} is outside 1 to {REPLICATION_MAX}"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests;

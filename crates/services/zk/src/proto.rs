//! ZooKeeper's protocol records (`zookeeper.jute`), operation codes, error codes, create modes and
//! ACL permissions, as ZooKeeper 3.5-3.9 clients send and expect them.

use bytes::Bytes;

use crate::jute::{JuteError, Reader, Writer};

/// Operation codes (`ZooDefs.OpCode`), named as ZooKeeper names them.
#[allow(missing_docs)]
pub mod op {
    pub const NOTIFICATION: i32 = 0;
    pub const CREATE: i32 = 1;
    pub const DELETE: i32 = 2;
    pub const EXISTS: i32 = 3;
    pub const GET_DATA: i32 = 4;
    pub const SET_DATA: i32 = 5;
    pub const GET_ACL: i32 = 6;
    pub const SET_ACL: i32 = 7;
    pub const GET_CHILDREN: i32 = 8;
    pub const SYNC: i32 = 9;
    pub const PING: i32 = 11;
    pub const GET_CHILDREN2: i32 = 12;
    pub const CHECK: i32 = 13;
    pub const MULTI: i32 = 14;
    pub const CREATE2: i32 = 15;
    pub const RECONFIG: i32 = 16;
    pub const CHECK_WATCHES: i32 = 17;
    pub const REMOVE_WATCHES: i32 = 18;
    pub const CREATE_CONTAINER: i32 = 19;
    pub const DELETE_CONTAINER: i32 = 20;
    pub const CREATE_TTL: i32 = 21;
    pub const MULTI_READ: i32 = 22;
    pub const AUTH: i32 = 100;
    pub const SET_WATCHES: i32 = 101;
    pub const SASL: i32 = 102;
    pub const GET_EPHEMERALS: i32 = 103;
    pub const GET_ALL_CHILDREN_NUMBER: i32 = 104;
    pub const SET_WATCHES2: i32 = 105;
    pub const ADD_WATCH: i32 = 106;
    pub const WHO_AM_I: i32 = 107;
    pub const CREATE_SESSION: i32 = -10;
    pub const CLOSE_SESSION: i32 = -11;
    pub const ERROR: i32 = -1;
}

/// Error codes (`KeeperException.Code`), named as ZooKeeper names them.
#[allow(missing_docs)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(i32)]
pub enum Code {
    Ok = 0,
    SystemError = -1,
    RuntimeInconsistency = -2,
    DataInconsistency = -3,
    ConnectionLoss = -4,
    MarshallingError = -5,
    Unimplemented = -6,
    OperationTimeout = -7,
    BadArguments = -8,
    UnknownSession = -12,
    ApiError = -100,
    NoNode = -101,
    NoAuth = -102,
    BadVersion = -103,
    NoChildrenForEphemerals = -108,
    NodeExists = -110,
    NotEmpty = -111,
    SessionExpired = -112,
    InvalidCallback = -113,
    InvalidAcl = -114,
    AuthFailed = -115,
    SessionMoved = -118,
    NotReadOnly = -119,
    EphemeralOnLocalSession = -120,
    NoWatcher = -121,
    RequestTimeout = -122,
    ReconfigDisabled = -123,
    QuotaExceeded = -125,
    ThrottledOp = -127,
}

impl Code {
    /// The code as it travels (`ReplyHeader.err`, `ErrorResponse.err`).
    pub fn value(self) -> i32 {
        self as i32
    }
}

/// ACL permissions (`ZooDefs.Perms`).
#[allow(missing_docs)]
pub mod perms {
    pub const READ: i32 = 1;
    pub const WRITE: i32 = 1 << 1;
    pub const CREATE: i32 = 1 << 2;
    pub const DELETE: i32 = 1 << 3;
    pub const ADMIN: i32 = 1 << 4;
    pub const ALL: i32 = READ | WRITE | CREATE | DELETE | ADMIN;
}

/// How a node is created (`CreateMode`, the `flags` of a create), named as ZooKeeper names them.
#[allow(missing_docs)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum CreateMode {
    Persistent,
    Ephemeral,
    PersistentSequential,
    EphemeralSequential,
    Container,
    PersistentWithTtl,
    PersistentSequentialWithTtl,
}

impl CreateMode {
    /// The mode for a create's `flags`; `None` for an unknown one (ZooKeeper: BadArguments).
    pub fn from_flags(flags: i32) -> Option<CreateMode> {
        Some(match flags {
            0 => CreateMode::Persistent,
            1 => CreateMode::Ephemeral,
            2 => CreateMode::PersistentSequential,
            3 => CreateMode::EphemeralSequential,
            4 => CreateMode::Container,
            5 => CreateMode::PersistentWithTtl,
            6 => CreateMode::PersistentSequentialWithTtl,
            _ => return None,
        })
    }

    /// Whether the name gets a sequence suffix.
    pub fn is_sequential(self) -> bool {
        matches!(
            self,
            CreateMode::PersistentSequential
                | CreateMode::EphemeralSequential
                | CreateMode::PersistentSequentialWithTtl
        )
    }

    /// Whether the node belongs to its session.
    pub fn is_ephemeral(self) -> bool {
        matches!(self, CreateMode::Ephemeral | CreateMode::EphemeralSequential)
    }

    /// Whether the node is deleted by time.
    pub fn is_ttl(self) -> bool {
        matches!(
            self,
            CreateMode::PersistentWithTtl | CreateMode::PersistentSequentialWithTtl
        )
    }
}

/// An identity in an ACL (`Id`): `world:anyone`, `auth:`, `digest:user:hash`, `ip:addr`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub struct Id {
    /// `world`, `auth`, `digest`, `ip`.
    pub scheme: String,
    /// Within the scheme: `anyone`, `user:base64(sha1(user:password))`, an address.
    pub id: String,
}

impl Id {
    /// `world:anyone`.
    pub fn anyone() -> Id {
        Id {
            scheme: "world".into(),
            id: "anyone".into(),
        }
    }

    fn read(r: &mut Reader<'_>) -> Result<Id, JuteError> {
        Ok(Id {
            scheme: r.string()?,
            id: r.string()?,
        })
    }

    fn write(&self, w: &mut impl Writer) {
        w.string(&self.scheme);
        w.string(&self.id);
    }
}

/// One entry of an ACL.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub struct Acl {
    /// The permissions granted ([`perms`]).
    pub perms: i32,
    /// To whom.
    pub id: Id,
}

impl Acl {
    /// `OPEN_ACL_UNSAFE`: everything to anyone.
    pub fn open() -> Vec<Acl> {
        vec![Acl {
            perms: perms::ALL,
            id: Id::anyone(),
        }]
    }

    /// `vector<ACL>`.
    pub fn read_all(r: &mut Reader<'_>) -> Result<Vec<Acl>, JuteError> {
        r.vector(12, |r| {
            Ok(Acl {
                perms: r.int()?,
                id: Id::read(r)?,
            })
        })
    }

    /// `vector<ACL>`.
    pub fn write_all(acl: &[Acl], w: &mut impl Writer) {
        w.int(acl.len() as i32);
        for a in acl {
            w.int(a.perms);
            a.id.write(w);
        }
    }
}

/// A node's metadata as clients see it (`Stat`): ZooKeeper's fields, in snake case, in wire order.
#[allow(missing_docs)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct Stat {
    pub czxid: i64,
    pub mzxid: i64,
    pub ctime: i64,
    pub mtime: i64,
    pub version: i32,
    pub cversion: i32,
    pub aversion: i32,
    pub ephemeral_owner: i64,
    pub data_length: i32,
    pub num_children: i32,
    pub pzxid: i64,
}

impl Stat {
    /// Writes the record.
    pub fn write(&self, w: &mut impl Writer) {
        w.long(self.czxid);
        w.long(self.mzxid);
        w.long(self.ctime);
        w.long(self.mtime);
        w.int(self.version);
        w.int(self.cversion);
        w.int(self.aversion);
        w.long(self.ephemeral_owner);
        w.int(self.data_length);
        w.int(self.num_children);
        w.long(self.pzxid);
    }

    /// Reads the record.
    pub fn read(r: &mut Reader<'_>) -> Result<Stat, JuteError> {
        Ok(Stat {
            czxid: r.long()?,
            mzxid: r.long()?,
            ctime: r.long()?,
            mtime: r.long()?,
            version: r.int()?,
            cversion: r.int()?,
            aversion: r.int()?,
            ephemeral_owner: r.long()?,
            data_length: r.int()?,
            num_children: r.int()?,
            pzxid: r.long()?,
        })
    }
}

/// An operation on the tree, decoded from its request record (the body after `RequestHeader`);
/// the fields are the record's.
#[allow(missing_docs)]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// create, create2, createContainer, createTTL (`ttl` 0 unless TTL).
    Create {
        path: String,
        data: Bytes,
        acl: Vec<Acl>,
        flags: i32,
        ttl: i64,
    },
    Delete {
        path: String,
        version: i32,
    },
    SetData {
        path: String,
        data: Bytes,
        version: i32,
    },
    Check {
        path: String,
        version: i32,
    },
    SetAcl {
        path: String,
        acl: Vec<Acl>,
        version: i32,
    },
    Exists {
        path: String,
        watch: bool,
    },
    GetData {
        path: String,
        watch: bool,
    },
    GetChildren {
        path: String,
        watch: bool,
    },
    GetAcl {
        path: String,
    },
    GetAllChildrenNumber {
        path: String,
    },
    GetEphemerals {
        prefix: String,
    },
    Sync {
        path: String,
    },
}

impl Op {
    /// Decodes the request record of operation `code` (a create's variant is told by `code`).
    /// `None` for a code that is not a tree operation.
    pub fn read(code: i32, r: &mut Reader<'_>) -> Option<Result<Op, JuteError>> {
        let path_version = |r: &mut Reader<'_>| -> Result<(String, i32), JuteError> { Ok((r.string()?, r.int()?)) };
        let path_watch = |r: &mut Reader<'_>| -> Result<(String, bool), JuteError> { Ok((r.string()?, r.boolean()?)) };
        Some(match code {
            op::CREATE | op::CREATE2 | op::CREATE_CONTAINER | op::CREATE_TTL => (|| {
                let (path, data, acl, flags) = (r.string()?, r.data()?, Acl::read_all(r)?, r.int()?);
                let ttl = if code == op::CREATE_TTL { r.long()? } else { 0 };
                Ok(Op::Create {
                    path,
                    data,
                    acl,
                    flags,
                    ttl,
                })
            })(),
            op::DELETE => path_version(r).map(|(path, version)| Op::Delete { path, version }),
            op::SET_DATA => (|| {
                Ok(Op::SetData {
                    path: r.string()?,
                    data: r.data()?,
                    version: r.int()?,
                })
            })(),
            op::CHECK => path_version(r).map(|(path, version)| Op::Check { path, version }),
            op::SET_ACL => (|| {
                Ok(Op::SetAcl {
                    path: r.string()?,
                    acl: Acl::read_all(r)?,
                    version: r.int()?,
                })
            })(),
            op::EXISTS => path_watch(r).map(|(path, watch)| Op::Exists { path, watch }),
            op::GET_DATA => path_watch(r).map(|(path, watch)| Op::GetData { path, watch }),
            op::GET_CHILDREN | op::GET_CHILDREN2 => path_watch(r).map(|(path, watch)| Op::GetChildren { path, watch }),
            op::GET_ACL => r.string().map(|path| Op::GetAcl { path }),
            op::GET_ALL_CHILDREN_NUMBER => r.string().map(|path| Op::GetAllChildrenNumber { path }),
            op::GET_EPHEMERALS => r.string().map(|prefix| Op::GetEphemerals { prefix }),
            op::SYNC => r.string().map(|path| Op::Sync { path }),
            _ => return None,
        })
    }

    /// Whether the operation changes the tree (it is ordered; the others may be read-only).
    pub fn is_write(&self) -> bool {
        matches!(
            self,
            Op::Create { .. } | Op::Delete { .. } | Op::SetData { .. } | Op::Check { .. } | Op::SetAcl { .. }
        )
    }
}

/// Request records as clients encode them (for tests, tools and the simulator's clients).
pub mod request {
    use super::Acl;
    use crate::jute::Writer;

    /// CreateRequest (create, create2, createContainer; createTTL appends the TTL as a long).
    pub fn create(path: &str, data: &[u8], acl: &[Acl], flags: i32) -> Vec<u8> {
        let mut b = Vec::new();
        b.string(path);
        b.buffer(Some(data));
        Acl::write_all(acl, &mut b);
        b.int(flags);
        b
    }

    /// ConnectRequest (protocol version 0, no zxid seen, not read-only): a new session (`session`
    /// 0, a zero password) or a reconnect.
    pub fn connect(timeout_ms: i32, session: i64, password: &[u8; 16]) -> Vec<u8> {
        let mut b = Vec::new();
        b.int(0);
        b.long(0);
        b.int(timeout_ms);
        b.long(session);
        b.buffer(Some(password));
        b.boolean(false);
        b
    }

    /// A path and a watch flag (exists, getData, getChildren, getChildren2).
    pub fn path_watch(path: &str, watch: bool) -> Vec<u8> {
        let mut b = Vec::new();
        b.string(path);
        b.boolean(watch);
        b
    }

    /// A path and a number (delete and check: a version; removeWatches: a watcher type;
    /// addWatch: a mode).
    pub fn path_int(path: &str, n: i32) -> Vec<u8> {
        let mut b = Vec::new();
        b.string(path);
        b.int(n);
        b
    }

    /// A path alone (getACL, sync, getAllChildrenNumber, getEphemerals).
    pub fn path(path: &str) -> Vec<u8> {
        let mut b = Vec::new();
        b.string(path);
        b
    }

    /// SetDataRequest.
    pub fn set_data(path: &str, data: &[u8], version: i32) -> Vec<u8> {
        let mut b = Vec::new();
        b.string(path);
        b.buffer(Some(data));
        b.int(version);
        b
    }

    /// A multi or multiRead: each operation's header and record, then the closing header.
    pub fn multi(ops: &[(i32, Vec<u8>)]) -> Vec<u8> {
        let mut b = Vec::new();
        for (opcode, body) in ops {
            b.int(*opcode);
            b.boolean(false);
            b.int(-1);
            b.extend_from_slice(body);
        }
        b.int(-1);
        b.boolean(true);
        b.int(-1);
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_create_request_decodes_as_clients_encode_it() {
        // kazoo's create("/a", b"v", ephemeral=True): path, data, ACL [world:anyone ALL], flags 1.
        let mut body = Vec::new();
        body.string("/a");
        body.buffer(Some(b"v"));
        Acl::write_all(&Acl::open(), &mut body);
        body.int(1);
        let mut r = Reader::new(&body);
        let op = Op::read(op::CREATE, &mut r).unwrap().unwrap();
        r.finish().unwrap();
        assert_eq!(
            op,
            Op::Create {
                path: "/a".into(),
                data: Bytes::from_static(b"v"),
                acl: Acl::open(),
                flags: 1,
                ttl: 0
            }
        );
        assert!(op.is_write());
        // createTTL adds the TTL after the flags.
        body.long(5_000);
        let mut r = Reader::new(&body);
        assert!(matches!(
            Op::read(op::CREATE_TTL, &mut r).unwrap().unwrap(),
            Op::Create { ttl: 5_000, .. }
        ));
        assert!(Op::read(op::PING, &mut Reader::new(&[])).is_none());
    }

    #[test]
    fn stat_is_68_bytes_in_field_order() {
        let stat = Stat {
            czxid: 1,
            mzxid: 2,
            ctime: 3,
            mtime: 4,
            version: 5,
            cversion: 6,
            aversion: 7,
            ephemeral_owner: 8,
            data_length: 9,
            num_children: 10,
            pzxid: 11,
        };
        let mut out = Vec::new();
        stat.write(&mut out);
        assert_eq!(out.len(), 68);
        assert_eq!(&out[..8], &1i64.to_be_bytes());
        assert_eq!(&out[60..], &11i64.to_be_bytes());
        assert_eq!(Stat::read(&mut Reader::new(&out)), Ok(stat));
        assert_eq!(CreateMode::from_flags(3), Some(CreateMode::EphemeralSequential));
        assert_eq!(CreateMode::from_flags(7), None);
        assert_eq!(Code::NoNode.value(), -101);
    }
}

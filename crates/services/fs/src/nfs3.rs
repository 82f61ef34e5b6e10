//! NFS version 3's and MOUNT version 3's protocol constants and the XDR types shared by the
//! gateway and the file system (RFC 1813 sections 2, 3 and 5).

use crate::xdr::{Reader, Writer, XdrError};

/// ONC RPC program numbers and versions.
pub const NFS_PROGRAM: u32 = 100003;
pub const NFS_VERSION: u32 = 3;
pub const MOUNT_PROGRAM: u32 = 100005;
pub const MOUNT_VERSION: u32 = 3;

/// NFSv3 procedures (RFC 1813 section 3).
pub mod proc3 {
    pub const NULL: u32 = 0;
    pub const GETATTR: u32 = 1;
    pub const SETATTR: u32 = 2;
    pub const LOOKUP: u32 = 3;
    pub const ACCESS: u32 = 4;
    pub const READLINK: u32 = 5;
    pub const READ: u32 = 6;
    pub const WRITE: u32 = 7;
    pub const CREATE: u32 = 8;
    pub const MKDIR: u32 = 9;
    pub const SYMLINK: u32 = 10;
    pub const MKNOD: u32 = 11;
    pub const REMOVE: u32 = 12;
    pub const RMDIR: u32 = 13;
    pub const RENAME: u32 = 14;
    pub const LINK: u32 = 15;
    pub const READDIR: u32 = 16;
    pub const READDIRPLUS: u32 = 17;
    pub const FSSTAT: u32 = 18;
    pub const FSINFO: u32 = 19;
    pub const PATHCONF: u32 = 20;
    pub const COMMIT: u32 = 21;
    /// One past the last procedure.
    pub const COUNT: u32 = 22;
}

/// MOUNT version 3 procedures (RFC 1813 section 5.2).
pub mod mountproc3 {
    pub const NULL: u32 = 0;
    pub const MNT: u32 = 1;
    pub const DUMP: u32 = 2;
    pub const UMNT: u32 = 3;
    pub const UMNTALL: u32 = 4;
    pub const EXPORT: u32 = 5;
}

/// `nfsstat3` (RFC 1813 section 2.6).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[repr(u32)]
pub enum Status {
    Ok = 0,
    Perm = 1,
    NoEnt = 2,
    Io = 5,
    NxIo = 6,
    Acces = 13,
    Exist = 17,
    XDev = 18,
    NoDev = 19,
    NotDir = 20,
    IsDir = 21,
    Inval = 22,
    FBig = 27,
    NoSpc = 28,
    RoFs = 30,
    MLink = 31,
    NameTooLong = 63,
    NotEmpty = 66,
    DQuot = 69,
    Stale = 70,
    Remote = 71,
    BadHandle = 10001,
    NotSync = 10002,
    BadCookie = 10003,
    NotSupp = 10004,
    TooSmall = 10005,
    ServerFault = 10006,
    BadType = 10007,
    Jukebox = 10008,
}

/// `mountstat3` values this server answers.
pub const MNT3_OK: u32 = 0;
pub const MNT3ERR_NOENT: u32 = 2;
pub const MNT3ERR_ACCES: u32 = 13;
pub const MNT3ERR_SERVERFAULT: u32 = 10006;

/// `ftype3`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[repr(u32)]
pub enum FileType {
    Regular = 1,
    Directory = 2,
    Block = 3,
    Character = 4,
    Symlink = 5,
    Socket = 6,
    Fifo = 7,
}

impl FileType {
    pub fn from_u32(v: u32) -> Result<FileType, XdrError> {
        Ok(match v {
            1 => FileType::Regular,
            2 => FileType::Directory,
            3 => FileType::Block,
            4 => FileType::Character,
            5 => FileType::Symlink,
            6 => FileType::Socket,
            7 => FileType::Fifo,
            _ => return Err(XdrError::BadValue(v)),
        })
    }
}

/// Protocol limits (RFC 1813 section 2.4 and the sizes this server offers in FSINFO).
pub const FHSIZE3: usize = 64;
pub const COOKIEVERFSIZE: usize = 8;
pub const CREATEVERFSIZE: usize = 8;
pub const WRITEVERFSIZE: usize = 8;
/// Longest file name component and path this server takes (MOUNT's `dirpath`: 1024).
pub const NAME_MAX: usize = 255;
pub const PATH_MAX: usize = 1024;

/// `nfstime3`: seconds and nanoseconds since the epoch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Time {
    pub seconds: u32,
    pub nseconds: u32,
}

impl Time {
    /// An agreed time in microseconds as `nfstime3` (seconds wrap in 2106, as the protocol's do).
    pub fn from_micros(us: u64) -> Time {
        Time {
            seconds: (us / 1_000_000) as u32,
            nseconds: (us % 1_000_000) as u32 * 1000,
        }
    }

    pub fn encode(&self, w: &mut Writer) {
        w.u32(self.seconds).u32(self.nseconds);
    }

    pub fn decode(r: &mut Reader<'_>) -> Result<Time, XdrError> {
        Ok(Time {
            seconds: r.u32()?,
            nseconds: r.u32()?,
        })
    }
}

/// `fattr3` (RFC 1813 section 2.5).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Attributes {
    pub kind: u32,
    pub mode: u32,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    pub used: u64,
    pub rdev: (u32, u32),
    pub fsid: u64,
    pub fileid: u64,
    pub atime: Time,
    pub mtime: Time,
    pub ctime: Time,
}

impl Attributes {
    pub fn encode(&self, w: &mut Writer) {
        w.u32(self.kind)
            .u32(self.mode)
            .u32(self.nlink)
            .u32(self.uid)
            .u32(self.gid);
        w.u64(self.size).u64(self.used).u32(self.rdev.0).u32(self.rdev.1);
        w.u64(self.fsid).u64(self.fileid);
        self.atime.encode(w);
        self.mtime.encode(w);
        self.ctime.encode(w);
    }

    pub fn decode(r: &mut Reader<'_>) -> Result<Attributes, XdrError> {
        Ok(Attributes {
            kind: r.u32()?,
            mode: r.u32()?,
            nlink: r.u32()?,
            uid: r.u32()?,
            gid: r.u32()?,
            size: r.u64()?,
            used: r.u64()?,
            rdev: (r.u32()?, r.u32()?),
            fsid: r.u64()?,
            fileid: r.u64()?,
            atime: Time::decode(r)?,
            mtime: Time::decode(r)?,
            ctime: Time::decode(r)?,
        })
    }

    /// `post_op_attr` with these attributes.
    pub fn encode_post_op(attributes: Option<&Attributes>, w: &mut Writer) {
        w.bool(attributes.is_some());
        if let Some(a) = attributes {
            a.encode(w);
        }
    }

    /// `wcc_attr`: what `pre_op_attr` carries (size, mtime, ctime).
    pub fn encode_wcc(&self, w: &mut Writer) {
        w.u64(self.size);
        self.mtime.encode(w);
        self.ctime.encode(w);
    }
}

/// How SETATTR, CREATE and MKDIR set a time (`time_how` with its value).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SetTime {
    DontChange,
    ServerTime,
    ClientTime(Time),
}

impl SetTime {
    fn decode(r: &mut Reader<'_>) -> Result<SetTime, XdrError> {
        Ok(match r.u32()? {
            0 => SetTime::DontChange,
            1 => SetTime::ServerTime,
            2 => SetTime::ClientTime(Time::decode(r)?),
            v => return Err(XdrError::BadValue(v)),
        })
    }

    fn encode(&self, w: &mut Writer) {
        match self {
            SetTime::DontChange => {
                w.u32(0);
            }
            SetTime::ServerTime => {
                w.u32(1);
            }
            SetTime::ClientTime(t) => {
                w.u32(2);
                t.encode(w);
            }
        }
    }
}

/// `sattr3`: the attributes a call asks to set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SetAttributes {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: SetTime,
    pub mtime: SetTime,
}

impl Default for SetAttributes {
    fn default() -> Self {
        SetAttributes {
            mode: None,
            uid: None,
            gid: None,
            size: None,
            atime: SetTime::DontChange,
            mtime: SetTime::DontChange,
        }
    }
}

impl SetAttributes {
    pub fn decode(r: &mut Reader<'_>) -> Result<SetAttributes, XdrError> {
        Ok(SetAttributes {
            mode: r.optional(|r| r.u32())?,
            uid: r.optional(|r| r.u32())?,
            gid: r.optional(|r| r.u32())?,
            size: r.optional(|r| r.u64())?,
            atime: SetTime::decode(r)?,
            mtime: SetTime::decode(r)?,
        })
    }

    pub fn encode(&self, w: &mut Writer) {
        for v in [self.mode, self.uid, self.gid] {
            w.bool(v.is_some());
            if let Some(v) = v {
                w.u32(v);
            }
        }
        w.bool(self.size.is_some());
        if let Some(s) = self.size {
            w.u64(s);
        }
        self.atime.encode(w);
        self.mtime.encode(w);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn set_time() -> impl Strategy<Value = SetTime> {
        prop_oneof![
            Just(SetTime::DontChange),
            Just(SetTime::ServerTime),
            (any::<u32>(), 0..1_000_000_000u32).prop_map(|(s, n)| SetTime::ClientTime(Time {
                seconds: s,
                nseconds: n
            })),
        ]
    }

    proptest! {
        #[test]
        fn set_attributes_round_trip(
            mode in proptest::option::of(any::<u32>()),
            uid in proptest::option::of(any::<u32>()),
            gid in proptest::option::of(any::<u32>()),
            size in proptest::option::of(any::<u64>()),
            atime in set_time(),
            mtime in set_time(),
        ) {
            let s = SetAttributes { mode, uid, gid, size, atime, mtime };
            let mut w = Writer::new();
            s.encode(&mut w);
            let bytes = w.finish();
            let mut r = Reader::new(&bytes);
            prop_assert_eq!(SetAttributes::decode(&mut r).unwrap(), s);
            prop_assert_eq!(r.remaining(), 0);
        }
    }

    #[test]
    fn attributes_take_84_bytes_as_fattr3_does() {
        let a = Attributes {
            kind: FileType::Regular as u32,
            mode: 0o644,
            nlink: 1,
            size: 5,
            fileid: 7,
            mtime: Time::from_micros(1_500_000),
            ..Attributes::default()
        };
        let mut w = Writer::new();
        a.encode(&mut w);
        let bytes = w.finish();
        assert_eq!(bytes.len(), 84);
        assert_eq!(Attributes::decode(&mut Reader::new(&bytes)).unwrap(), a);
        assert_eq!(
            a.mtime,
            Time {
                seconds: 1,
                nseconds: 500_000_000
            }
        );
    }
}

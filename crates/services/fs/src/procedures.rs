//! The NFSv3 procedures (RFC 1813 section 3) on the replicated [`FileSystem`]: an operation is
//! `procedure, credential, arguments` as the gateway received them ([`operation`]), the reply is
//! the procedure's XDR result. Errors are the ones RFC 1813 lists for each case; a call whose
//! arguments do not decode gets [`Reply::GarbageArgs`], which the gateway turns into the RPC
//! GARBAGE_ARGS answer.

use bytes::Bytes;

use crate::fs::{
    Body, Entries, FileSystem, Inode, BLOCK_BYTES, DOTDOT_COOKIE, DOT_COOKIE, FILE_BYTES_MAX, HANDLE_BYTES, ROOT,
    SYMLINK_MAX,
};
use crate::nfs3::{proc3, Attributes, FileType, SetAttributes, SetTime, Status, Time, FHSIZE3, NAME_MAX};
use crate::rpc::Credential;
use crate::xdr::{Reader, Writer, XdrError};

/// Largest READ and WRITE this server offers (FSINFO's `rtmax`/`wtmax`, also its preference).
pub const IO_BYTES_MAX: u32 = 64 * 1024;
/// The file system id every file reports.
pub const FSID: u64 = 1;
/// WRITE's and COMMIT's verifier: every WRITE is stable once agreed, so it never changes.
pub const WRITE_VERIFIER: [u8; 8] = *b"upright1";
/// READDIR's cookie verifier: cookies are name hashes, valid whatever changes (constant).
pub const COOKIE_VERIFIER: [u8; 8] = [0; 8];
/// Capacity FSSTAT reports: the page space a file system may grow to.
pub const CAPACITY_BYTES: u64 = 1 << 44;
/// Most links to one file.
pub const LINK_MAX: u32 = 32_000;
/// Not an NFS procedure: the gateway's MOUNT asks the file system for the handle of a directory
/// path (`dirpath`), so a client may mount any directory, as libnfs does for
/// `nfs://HOST/dir/file` (export `/dir`). Read-only; the result is a status and, if it is
/// NFS3_OK, the handle.
pub const MOUNT_RESOLVE: u32 = 0x4d4e_5400;

/// `stable_how` FILE_SYNC.
const FILE_SYNC: u32 = 2;

/// ACCESS bits (RFC 1813 section 3.3.4).
pub mod access {
    pub const READ: u32 = 0x01;
    pub const LOOKUP: u32 = 0x02;
    pub const MODIFY: u32 = 0x04;
    pub const EXTEND: u32 = 0x08;
    pub const DELETE: u32 = 0x10;
    pub const EXECUTE: u32 = 0x20;
}

/// Permission bits a check asks for.
const R: u32 = 4;
const W: u32 = 2;
const X: u32 = 1;

/// The operation for one NFS call: procedure, the caller's credential, the arguments.
pub fn operation(procedure: u32, credential: &Credential, args: &[u8]) -> Bytes {
    let mut w = Writer::with_capacity(args.len() + 32 + 4 * credential.gids.len());
    w.u32(procedure);
    credential.encode(&mut w);
    w.raw(args);
    w.finish()
}

/// Whether a procedure changes nothing (it may take the read-only path). READ leaves atime as it
/// is (as a `noatime` mount does), and COMMIT has nothing to do (every WRITE is FILE_SYNC), so
/// they are among them.
pub fn is_read_only(procedure: u32) -> bool {
    matches!(
        procedure,
        proc3::NULL
            | proc3::GETATTR
            | proc3::LOOKUP
            | proc3::ACCESS
            | proc3::READLINK
            | proc3::READ
            | proc3::READDIR
            | proc3::READDIRPLUS
            | proc3::FSSTAT
            | proc3::FSINFO
            | proc3::PATHCONF
            | proc3::COMMIT
            | MOUNT_RESOLVE
    )
}

/// The answer to an operation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    /// The procedure's result (status first).
    Result(Bytes),
    /// The procedure number is not one of NFSv3's.
    ProcUnavail,
    /// The arguments do not decode.
    GarbageArgs,
}

impl Reply {
    /// As the service's reply bytes: a tag, then the result.
    pub fn encode(&self) -> Bytes {
        let mut w = Writer::new();
        match self {
            Reply::Result(result) => {
                w.u32(0).raw(result);
            }
            Reply::ProcUnavail => {
                w.u32(1);
            }
            Reply::GarbageArgs => {
                w.u32(2);
            }
        }
        w.finish()
    }

    pub fn decode(bytes: &[u8]) -> Result<Reply, XdrError> {
        let mut r = Reader::new(bytes);
        match r.u32()? {
            0 => Ok(Reply::Result(Bytes::copy_from_slice(r.rest()))),
            1 => Ok(Reply::ProcUnavail),
            2 => Ok(Reply::GarbageArgs),
            v => Err(XdrError::BadValue(v)),
        }
    }
}

/// Why a call failed: its failure result (an NFS status and what the procedure reports with it)
/// is written already, or its arguments do not decode.
enum Failure {
    Answered,
    Garbage,
}

impl From<XdrError> for Failure {
    fn from(_: XdrError) -> Failure {
        Failure::Garbage
    }
}

/// Runs one operation; `now_us` is the agreed time. Read-only procedures change nothing.
pub fn execute(fs: &mut FileSystem, now_us: u64, op: &[u8]) -> Reply {
    let (procedure, credential, mut r) = match header(op) {
        Ok(header) => header,
        Err(reply) => return reply,
    };
    let mut call = Call {
        fs,
        now: Time::from_micros(now_us),
        cred: &credential,
        out: Writer::with_capacity(256),
    };
    match call.run(procedure, &mut r) {
        Ok(()) => Reply::Result(call.out.finish()),
        Err(()) => Reply::GarbageArgs,
    }
}

/// An operation's procedure and caller, and a reader at its arguments; or the answer to an
/// operation whose header does not decode or names no procedure of ours.
fn header(op: &[u8]) -> Result<(u32, Credential, Reader<'_>), Reply> {
    let mut r = Reader::new(op);
    let procedure = r.u32().map_err(|_| Reply::GarbageArgs)?;
    let credential = Credential::decode(&mut r).map_err(|_| Reply::GarbageArgs)?;
    if procedure >= proc3::COUNT && procedure != MOUNT_RESOLVE {
        return Err(Reply::ProcUnavail);
    }
    Ok((procedure, credential, r))
}

/// Answers a read-only operation from the current state, or `None` if it writes. The answer is
/// the one [`execute`] gives (a read-only procedure's result does not depend on the time).
pub fn execute_read_only(fs: &FileSystem, op: &[u8]) -> Option<Reply> {
    let procedure = Reader::new(op).u32().ok()?;
    if procedure < proc3::COUNT && !is_read_only(procedure) {
        return None;
    }
    let (procedure, credential, mut r) = match header(op) {
        Ok(header) => header,
        Err(reply) => return Some(reply),
    };
    let mut out = Writer::with_capacity(256);
    let result = ReadCall {
        fs,
        cred: &credential,
        out: &mut out,
    }
    .run(procedure, &mut r);
    Some(match result {
        Ok(()) => Reply::Result(out.finish()),
        Err(()) => Reply::GarbageArgs,
    })
}

fn read_handle<'a>(r: &mut Reader<'a>) -> Result<&'a [u8], XdrError> {
    r.opaque(FHSIZE3)
}

fn encode_handle(w: &mut Writer, fileid: u64, inode: &Inode) {
    w.opaque(&FileSystem::handle(fileid, inode));
}

/// `fattr3` of an inode.
pub fn attributes(fileid: u64, inode: &Inode) -> Attributes {
    let (size, used) = match inode.kind {
        // Directories report a size that grows with their entries.
        FileType::Directory => {
            let size = 4096 * (1 + inode.size / 128);
            (size, size)
        }
        _ => (inode.size, inode.size.div_ceil(4096) * 4096),
    };
    Attributes {
        kind: inode.kind as u32,
        mode: inode.mode & 0o7777,
        nlink: inode.nlink,
        uid: inode.uid,
        gid: inode.gid,
        size,
        used,
        rdev: inode.rdev,
        fsid: FSID,
        fileid,
        atime: inode.atime,
        mtime: inode.mtime,
        ctime: inode.ctime,
    }
}

fn post_op(w: &mut Writer, object: Option<(u64, &Inode)>) {
    let attrs = object.map(|(id, i)| attributes(id, i));
    Attributes::encode_post_op(attrs.as_ref(), w);
}

/// `wcc_data`: the attributes before (`pre_op_attr`) and after.
fn wcc(w: &mut Writer, before: Option<&Inode>, after: Option<(u64, &Inode)>) {
    w.bool(before.is_some());
    if let Some(b) = before {
        w.u64(b.size);
        b.mtime.encode(w);
        b.ctime.encode(w);
    }
    post_op(w, after);
}

/// Whether `cred` has the permission bits `want` (R, W, X) on `inode`. Root has all but
/// execute on a file without any execute bit.
fn permits(cred: &Credential, inode: &Inode, want: u32) -> bool {
    if cred.uid == 0 {
        return want & X == 0 || inode.kind == FileType::Directory || inode.mode & 0o111 != 0;
    }
    let bits = if cred.uid == inode.uid {
        inode.mode >> 6
    } else if cred.in_group(inode.gid) {
        inode.mode >> 3
    } else {
        inode.mode
    } & 7;
    bits & want == want
}

fn check_name(name: &str) -> Result<(), Status> {
    if name.len() > NAME_MAX {
        return Err(Status::NameTooLong);
    }
    if name.is_empty() || name.contains('/') || name.contains('\0') {
        return Err(Status::Inval);
    }
    Ok(())
}

/// Read-only procedures, shared by the ordered and the read-only path.
struct ReadCall<'a> {
    fs: &'a FileSystem,
    cred: &'a Credential,
    out: &'a mut Writer,
}

impl ReadCall<'_> {
    fn run(mut self, procedure: u32, r: &mut Reader<'_>) -> Result<(), ()> {
        let result = match procedure {
            proc3::NULL => Ok(()),
            proc3::GETATTR => self.getattr(r),
            proc3::LOOKUP => self.lookup(r),
            proc3::ACCESS => self.access(r),
            proc3::READLINK => self.readlink(r),
            proc3::READ => self.read(r),
            proc3::READDIR => self.readdir(r, false),
            proc3::READDIRPLUS => self.readdir(r, true),
            proc3::FSSTAT => self.fsstat(r),
            proc3::FSINFO => self.fsinfo(r),
            proc3::PATHCONF => self.pathconf(r),
            proc3::COMMIT => self.commit(r),
            MOUNT_RESOLVE => self.resolve_path(r),
            _ => unreachable!("only read-only procedures come here"),
        };
        match result {
            Ok(()) => Ok(()),
            Err(Failure::Garbage) => Err(()),
            // The failure was written already (each procedure writes its own fail result).
            Err(Failure::Answered) => Ok(()),
        }
    }

    /// Writes a failure that carries only `post_op_attr` of `object`.
    fn fail_post_op(&mut self, status: Status, object: Option<(u64, &Inode)>) -> Failure {
        self.out.u32(status as u32);
        post_op(self.out, object);
        Failure::Answered
    }

    fn fail_bare(&mut self, status: Status) -> Failure {
        self.out.u32(status as u32);
        Failure::Answered
    }

    /// Writes a failure that carries `wcc_data` of one object.
    fn fail_wcc(&mut self, status: Status, object: Option<(u64, &Inode)>) -> Failure {
        self.out.u32(status as u32);
        wcc(self.out, object.map(|(_, i)| i), object);
        Failure::Answered
    }

    /// COMMIT: every WRITE is FILE_SYNC once it is agreed, so there is nothing to commit; the
    /// answer is the file's attributes and the constant verifier (read-only: it changes nothing).
    fn commit(&mut self, r: &mut Reader<'_>) -> Result<(), Failure> {
        let handle = read_handle(r)?;
        let (_offset, _count) = (r.u64()?, r.u32()?);
        let (id, inode) = self.fs.resolve(handle).map_err(|s| self.fail_wcc(s, None))?;
        if inode.kind != FileType::Regular {
            let status = if inode.kind == FileType::Directory {
                Status::IsDir
            } else {
                Status::Inval
            };
            return Err(self.fail_wcc(status, Some((id, &inode))));
        }
        self.out.u32(Status::Ok as u32);
        wcc(self.out, Some(&inode), Some((id, &inode)));
        self.out.fixed(&WRITE_VERIFIER);
        Ok(())
    }

    /// [`MOUNT_RESOLVE`]: walks `dirpath` from the root as LOOKUPs would (search permission on
    /// every directory on the way); the end must be a directory.
    fn resolve_path(&mut self, r: &mut Reader<'_>) -> Result<(), Failure> {
        let path = r.string(crate::nfs3::PATH_MAX)?;
        let (mut id, mut inode) = (ROOT, self.fs.inode(ROOT).map_err(|s| self.fail_bare(s))?);
        for name in path.split('/').filter(|c| !c.is_empty() && *c != ".") {
            if inode.kind != FileType::Directory {
                return Err(self.fail_bare(Status::NotDir));
            }
            if !permits(self.cred, &inode, X) {
                return Err(self.fail_bare(Status::Acces));
            }
            id = self.fs.lookup(&inode, name).map_err(|s| self.fail_bare(s))?;
            inode = self.fs.inode(id).map_err(|s| self.fail_bare(s))?;
        }
        if inode.kind != FileType::Directory {
            return Err(self.fail_bare(Status::NotDir));
        }
        self.out.u32(Status::Ok as u32);
        encode_handle(self.out, id, &inode);
        Ok(())
    }

    fn getattr(&mut self, r: &mut Reader<'_>) -> Result<(), Failure> {
        let handle = read_handle(r)?;
        let (id, inode) = self.fs.resolve(handle).map_err(|s| self.fail_bare(s))?;
        self.out.u32(Status::Ok as u32);
        attributes(id, &inode).encode(self.out);
        Ok(())
    }

    fn lookup(&mut self, r: &mut Reader<'_>) -> Result<(), Failure> {
        let handle = read_handle(r)?;
        let name = r.string(NAME_MAX + 1)?;
        let (dir_id, dir) = self.fs.resolve(handle).map_err(|s| self.fail_post_op(s, None))?;
        if dir.kind != FileType::Directory {
            return Err(self.fail_post_op(Status::NotDir, Some((dir_id, &dir))));
        }
        if !permits(self.cred, &dir, X) {
            return Err(self.fail_post_op(Status::Acces, Some((dir_id, &dir))));
        }
        if name.len() > NAME_MAX {
            return Err(self.fail_post_op(Status::NameTooLong, Some((dir_id, &dir))));
        }
        let found = if name == "." {
            Ok(dir_id)
        } else {
            self.fs.lookup(&dir, name)
        };
        let id = found.map_err(|s| self.fail_post_op(s, Some((dir_id, &dir))))?;
        let inode = self
            .fs
            .inode(id)
            .map_err(|s| self.fail_post_op(s, Some((dir_id, &dir))))?;
        self.out.u32(Status::Ok as u32);
        encode_handle(self.out, id, &inode);
        post_op(self.out, Some((id, &inode)));
        post_op(self.out, Some((dir_id, &dir)));
        Ok(())
    }

    fn access(&mut self, r: &mut Reader<'_>) -> Result<(), Failure> {
        let handle = read_handle(r)?;
        let asked = r.u32()?;
        let (id, inode) = self.fs.resolve(handle).map_err(|s| self.fail_post_op(s, None))?;
        let mut granted = 0;
        let dir = inode.kind == FileType::Directory;
        if permits(self.cred, &inode, R) {
            granted |= access::READ;
        }
        if permits(self.cred, &inode, W) {
            granted |= access::MODIFY | access::EXTEND | if dir { access::DELETE } else { 0 };
        }
        if permits(self.cred, &inode, X) {
            granted |= if dir { access::LOOKUP } else { access::EXECUTE };
        }
        self.out.u32(Status::Ok as u32);
        post_op(self.out, Some((id, &inode)));
        self.out.u32(asked & granted);
        Ok(())
    }

    fn readlink(&mut self, r: &mut Reader<'_>) -> Result<(), Failure> {
        let handle = read_handle(r)?;
        let (id, inode) = self.fs.resolve(handle).map_err(|s| self.fail_post_op(s, None))?;
        let Body::Symlink { target } = &inode.body else {
            return Err(self.fail_post_op(Status::Inval, Some((id, &inode))));
        };
        self.out.u32(Status::Ok as u32);
        post_op(self.out, Some((id, &inode)));
        self.out.string(target);
        Ok(())
    }

    fn read(&mut self, r: &mut Reader<'_>) -> Result<(), Failure> {
        let handle = read_handle(r)?;
        let (offset, count) = (r.u64()?, r.u32()?);
        let (id, inode) = self.fs.resolve(handle).map_err(|s| self.fail_post_op(s, None))?;
        if inode.kind == FileType::Directory {
            return Err(self.fail_post_op(Status::IsDir, Some((id, &inode))));
        }
        if inode.kind != FileType::Regular {
            return Err(self.fail_post_op(Status::Inval, Some((id, &inode))));
        }
        // The owner may read its file whatever the mode (as NFS servers allow, so a client can
        // read back what it wrote to a file it created without read permission).
        if self.cred.uid != inode.uid && !permits(self.cred, &inode, R) {
            return Err(self.fail_post_op(Status::Acces, Some((id, &inode))));
        }
        let (data, eof) = self
            .fs
            .read(&inode, offset, count.min(IO_BYTES_MAX))
            .map_err(|s| self.fail_post_op(s, Some((id, &inode))))?;
        self.out.u32(Status::Ok as u32);
        post_op(self.out, Some((id, &inode)));
        self.out.u32(data.len() as u32).bool(eof).opaque(&data);
        Ok(())
    }

    fn readdir(&mut self, r: &mut Reader<'_>, plus: bool) -> Result<(), Failure> {
        let handle = read_handle(r)?;
        let cookie = r.u64()?;
        let verifier = r.fixed(8)?;
        let count = r.u32()? as usize;
        let max = if plus { r.u32()? as usize } else { count };
        let (id, dir) = self.fs.resolve(handle).map_err(|s| self.fail_post_op(s, None))?;
        if dir.kind != FileType::Directory {
            return Err(self.fail_post_op(Status::NotDir, Some((id, &dir))));
        }
        if !permits(self.cred, &dir, R) {
            return Err(self.fail_post_op(Status::Acces, Some((id, &dir))));
        }
        if cookie != 0 && verifier != COOKIE_VERIFIER {
            return Err(self.fail_post_op(Status::BadCookie, Some((id, &dir))));
        }
        let Body::Directory { parent, .. } = &dir.body else {
            unreachable!("checked: a directory");
        };
        // Entries: "." and ".." first, then the names by cookie.
        let mut entries: Vec<(u64, String, u64)> = Vec::new();
        if cookie < DOT_COOKIE {
            entries.push((id, ".".into(), DOT_COOKIE));
        }
        if cookie < DOTDOT_COOKIE {
            entries.push((*parent, "..".into(), DOTDOT_COOKIE));
        }
        // Enough entries to fill the reply: each takes at least 24 bytes (more with attributes).
        let per = if plus { 24 + 88 + 4 + 24 } else { 24 };
        let want = (max / per).clamp(1, 20_000);
        let (listed, mut eof) = self
            .fs
            .list(&dir, cookie, want)
            .map_err(|s| self.fail_post_op(s, Some((id, &dir))))?;
        entries.extend(listed.into_iter().map(|e| (e.fileid, e.name, e.hash)));

        let mut body = Writer::with_capacity(max.min(1 << 20));
        // Header: status, dir attributes, verifier; trailer: no more entries, eof.
        let fixed = 4 + 4 + 84 + 8 + 4 + 4;
        let (mut used, mut dircount_used, mut written) = (fixed, 0usize, 0usize);
        for (fileid, name, next_cookie) in &entries {
            let mut one = Writer::with_capacity(64);
            one.bool(true).u64(*fileid).string(name).u64(*next_cookie);
            let name_part = one.len();
            if plus {
                match self.fs.inode(*fileid) {
                    Ok(inode) => {
                        post_op(&mut one, Some((*fileid, &inode)));
                        one.bool(true);
                        encode_handle(&mut one, *fileid, &inode);
                    }
                    Err(_) => {
                        one.bool(false).bool(false);
                    }
                }
            }
            let dircount_would = dircount_used + name_part;
            if used + one.len() > max || (plus && dircount_would > count) {
                eof = false;
                break;
            }
            used += one.len();
            dircount_used = dircount_would;
            body.raw(&one.finish());
            written += 1;
        }
        if written == 0 && !entries.is_empty() {
            return Err(self.fail_post_op(Status::TooSmall, Some((id, &dir))));
        }
        self.out.u32(Status::Ok as u32);
        post_op(self.out, Some((id, &dir)));
        self.out.fixed(&COOKIE_VERIFIER);
        self.out.raw(&body.finish());
        self.out.bool(false).bool(eof && written == entries.len());
        Ok(())
    }

    fn fsstat(&mut self, r: &mut Reader<'_>) -> Result<(), Failure> {
        let handle = read_handle(r)?;
        let (id, inode) = self.fs.resolve(handle).map_err(|s| self.fail_post_op(s, None))?;
        let (files, pages, free) = self.fs.usage().map_err(|s| self.fail_post_op(s, Some((id, &inode))))?;
        let used = (pages - free) * BLOCK_BYTES;
        let free_bytes = CAPACITY_BYTES.saturating_sub(used);
        let total_files = CAPACITY_BYTES / BLOCK_BYTES;
        self.out.u32(Status::Ok as u32);
        post_op(self.out, Some((id, &inode)));
        self.out.u64(CAPACITY_BYTES).u64(free_bytes).u64(free_bytes);
        self.out
            .u64(total_files)
            .u64(total_files - files)
            .u64(total_files - files);
        self.out.u32(0);
        Ok(())
    }

    fn fsinfo(&mut self, r: &mut Reader<'_>) -> Result<(), Failure> {
        let handle = read_handle(r)?;
        let (id, inode) = self.fs.resolve(handle).map_err(|s| self.fail_post_op(s, None))?;
        self.out.u32(Status::Ok as u32);
        post_op(self.out, Some((id, &inode)));
        // rtmax, rtpref, rtmult, wtmax, wtpref, wtmult, dtpref.
        self.out.u32(IO_BYTES_MAX).u32(IO_BYTES_MAX).u32(4096);
        self.out.u32(IO_BYTES_MAX).u32(IO_BYTES_MAX).u32(4096).u32(IO_BYTES_MAX);
        self.out.u64(FILE_BYTES_MAX);
        // time_delta: agreed times have microseconds.
        Time {
            seconds: 0,
            nseconds: 1000,
        }
        .encode(self.out);
        // FSF3_LINK | FSF3_SYMLINK | FSF3_HOMOGENEOUS | FSF3_CANSETTIME.
        self.out.u32(0x1 | 0x2 | 0x8 | 0x10);
        Ok(())
    }

    fn pathconf(&mut self, r: &mut Reader<'_>) -> Result<(), Failure> {
        let handle = read_handle(r)?;
        let (id, inode) = self.fs.resolve(handle).map_err(|s| self.fail_post_op(s, None))?;
        self.out.u32(Status::Ok as u32);
        post_op(self.out, Some((id, &inode)));
        // linkmax, name_max, no_trunc, chown_restricted, case_insensitive, case_preserving.
        self.out
            .u32(LINK_MAX)
            .u32(NAME_MAX as u32)
            .bool(true)
            .bool(true)
            .bool(false)
            .bool(true);
        Ok(())
    }
}

/// An ordered call: may change the file system at agreed time `now`.
struct Call<'a> {
    fs: &'a mut FileSystem,
    now: Time,
    cred: &'a Credential,
    out: Writer,
}

impl Call<'_> {
    fn run(&mut self, procedure: u32, r: &mut Reader<'_>) -> Result<(), ()> {
        if is_read_only(procedure) {
            return ReadCall {
                fs: self.fs,
                cred: self.cred,
                out: &mut self.out,
            }
            .run(procedure, r);
        }
        let result = match procedure {
            proc3::SETATTR => self.setattr(r),
            proc3::WRITE => self.write(r),
            proc3::CREATE => self.create(r),
            proc3::MKDIR => self.mkdir(r),
            proc3::SYMLINK => self.symlink(r),
            proc3::MKNOD => self.mknod(r),
            proc3::REMOVE => self.remove(r, false),
            proc3::RMDIR => self.remove(r, true),
            proc3::RENAME => self.rename(r),
            proc3::LINK => self.link(r),
            _ => unreachable!("the procedure number was checked"),
        };
        match result {
            Err(Failure::Garbage) => Err(()),
            _ => Ok(()),
        }
    }

    /// Writes a failure that carries `wcc_data` of one object.
    fn fail_wcc(&mut self, status: Status, object: Option<(u64, &Inode)>) -> Failure {
        self.out.u32(status as u32);
        wcc(&mut self.out, object.map(|(_, i)| i), object);
        Failure::Answered
    }

    fn setattr(&mut self, r: &mut Reader<'_>) -> Result<(), Failure> {
        let handle = read_handle(r)?;
        let set = SetAttributes::decode(r)?;
        let guard = r.optional(Time::decode)?;
        let (id, inode) = self.fs.resolve(handle).map_err(|s| self.fail_wcc(s, None))?;
        if guard.is_some_and(|ctime| ctime != inode.ctime) {
            return Err(self.fail_wcc(Status::NotSync, Some((id, &inode))));
        }
        let mut after = inode.clone();
        self.apply(id, &mut after, &set, true)
            .map_err(|s| self.fail_wcc(s, Some((id, &inode))))?;
        self.fs.put_inode(id, &after);
        self.out.u32(Status::Ok as u32);
        wcc(&mut self.out, Some(&inode), Some((id, &after)));
        Ok(())
    }

    /// Applies `set` to `inode` with the permission checks of SETATTR (`checked`; a new file's
    /// initial attributes are not checked). Changes ctime when anything changes.
    fn apply(&mut self, _id: u64, inode: &mut Inode, set: &SetAttributes, checked: bool) -> Result<(), Status> {
        let owner = self.cred.uid == 0 || self.cred.uid == inode.uid;
        if checked {
            if (set.mode.is_some() || set.gid.is_some()) && !owner {
                return Err(Status::Perm);
            }
            if set.uid.is_some_and(|u| u != inode.uid) && self.cred.uid != 0 {
                return Err(Status::Perm);
            }
            if set
                .gid
                .is_some_and(|g| g != inode.gid && self.cred.uid != 0 && !self.cred.in_group(g))
            {
                return Err(Status::Perm);
            }
            let times = |t: SetTime| !matches!(t, SetTime::DontChange);
            if (matches!(set.atime, SetTime::ClientTime(_)) || matches!(set.mtime, SetTime::ClientTime(_))) && !owner {
                return Err(Status::Perm);
            }
            if (times(set.atime) || times(set.mtime)) && !owner && !permits(self.cred, inode, W) {
                return Err(Status::Acces);
            }
            if set.size.is_some() && !permits(self.cred, inode, W) && self.cred.uid != inode.uid {
                return Err(Status::Acces);
            }
        }
        let mut changed = false;
        if let Some(size) = set.size {
            if inode.kind == FileType::Directory {
                return Err(Status::IsDir);
            }
            if inode.kind != FileType::Regular {
                return Err(Status::Inval);
            }
            if size != inode.size {
                self.fs.truncate(inode, size)?;
                inode.mtime = self.now;
            }
            changed = true;
        }
        if let Some(mode) = set.mode {
            inode.mode = mode & 0o7777;
            changed = true;
        }
        if let Some(uid) = set.uid {
            inode.uid = uid;
            changed = true;
        }
        if let Some(gid) = set.gid {
            inode.gid = gid;
            changed = true;
        }
        match set.atime {
            SetTime::DontChange => {}
            SetTime::ServerTime => inode.atime = self.now,
            SetTime::ClientTime(t) => inode.atime = t,
        }
        match set.mtime {
            SetTime::DontChange => {}
            SetTime::ServerTime => inode.mtime = self.now,
            SetTime::ClientTime(t) => inode.mtime = t,
        }
        changed |= set.atime != SetTime::DontChange || set.mtime != SetTime::DontChange;
        if changed {
            inode.ctime = self.now;
            // Attributes set: an EXCLUSIVE create's verifier is no longer kept.
            inode.create_verifier = None;
        }
        Ok(())
    }

    fn write(&mut self, r: &mut Reader<'_>) -> Result<(), Failure> {
        let handle = read_handle(r)?;
        let (offset, count, _stable) = (r.u64()?, r.u32()?, r.u32()?);
        let data = r.opaque(IO_BYTES_MAX as usize)?;
        if (count as usize) > data.len() {
            return Err(Failure::Garbage);
        }
        let data = &data[..count as usize];
        let (id, inode) = self.fs.resolve(handle).map_err(|s| self.fail_wcc(s, None))?;
        if inode.kind == FileType::Directory {
            return Err(self.fail_wcc(Status::IsDir, Some((id, &inode))));
        }
        if inode.kind != FileType::Regular {
            return Err(self.fail_wcc(Status::Inval, Some((id, &inode))));
        }
        if self.cred.uid != inode.uid && !permits(self.cred, &inode, W) {
            return Err(self.fail_wcc(Status::Acces, Some((id, &inode))));
        }
        let mut after = inode.clone();
        self.fs
            .write(&mut after, offset, data)
            .map_err(|s| self.fail_wcc(s, Some((id, &inode))))?;
        after.mtime = self.now;
        after.ctime = self.now;
        self.fs.put_inode(id, &after);
        self.out.u32(Status::Ok as u32);
        wcc(&mut self.out, Some(&inode), Some((id, &after)));
        self.out.u32(count).u32(FILE_SYNC).fixed(&WRITE_VERIFIER);
        Ok(())
    }

    /// The directory a `diropargs3` names, checked for adding or removing `name`: its id and
    /// inode. On failure the failure result with the directory's wcc is written.
    fn dir_for_change(&mut self, handle: &[u8], name: &str) -> Result<(u64, Inode), Failure> {
        let (dir_id, dir) = self.fs.resolve(handle).map_err(|s| self.fail_wcc(s, None))?;
        if dir.kind != FileType::Directory {
            return Err(self.fail_wcc(Status::NotDir, Some((dir_id, &dir))));
        }
        if let Err(s) = check_name(name) {
            return Err(self.fail_wcc(s, Some((dir_id, &dir))));
        }
        if !permits(self.cred, &dir, W | X) {
            return Err(self.fail_wcc(Status::Acces, Some((dir_id, &dir))));
        }
        Ok((dir_id, dir))
    }

    /// A new inode of `kind` owned by the caller (the group is the directory's when it has the
    /// set-group-id bit, else the caller's), with `set` applied.
    fn new_inode(&mut self, kind: FileType, dir: &Inode, set: &SetAttributes, body: Body) -> Result<Inode, Status> {
        let gid = if dir.mode & 0o2000 != 0 { dir.gid } else { self.cred.gid };
        let mut inode = Inode {
            generation: 0,
            kind,
            mode: set
                .mode
                .unwrap_or(if kind == FileType::Directory { 0o755 } else { 0o644 })
                & 0o7777,
            nlink: if kind == FileType::Directory { 2 } else { 1 },
            uid: self.cred.uid,
            gid,
            size: 0,
            rdev: (0, 0),
            atime: self.now,
            mtime: self.now,
            ctime: self.now,
            create_verifier: None,
            body,
        };
        let rest = SetAttributes { mode: None, ..*set };
        if rest.uid.is_some()
            || rest.gid.is_some()
            || rest.size.is_some()
            || rest.atime != SetTime::DontChange
            || rest.mtime != SetTime::DontChange
        {
            self.apply(0, &mut inode, &rest, true)?;
        }
        Ok(inode)
    }

    /// Links a new inode into `dir` and writes the success result of CREATE, MKDIR, SYMLINK and
    /// MKNOD.
    fn finish_create(
        &mut self,
        dir_id: u64,
        before: &Inode,
        mut dir: Inode,
        name: &str,
        inode: Inode,
    ) -> Result<(), Failure> {
        let is_dir = inode.kind == FileType::Directory;
        let id = self
            .fs
            .create_inode(inode)
            .map_err(|s| self.fail_wcc(s, Some((dir_id, before))))?;
        if let Err(s) = self.fs.add_entry(&mut dir, name, id) {
            // No room for the name (the directory is full): the new inode goes again.
            if let Ok(orphan) = self.fs.inode(id) {
                let _ = self.fs.free_inode(id, &orphan);
            }
            return Err(self.fail_wcc(s, Some((dir_id, before))));
        }
        if is_dir {
            dir.nlink += 1;
        }
        dir.mtime = self.now;
        dir.ctime = self.now;
        self.fs.put_inode(dir_id, &dir);
        let inode = self
            .fs
            .inode(id)
            .map_err(|s| self.fail_wcc(s, Some((dir_id, before))))?;
        self.out.u32(Status::Ok as u32);
        self.out.bool(true);
        encode_handle(&mut self.out, id, &inode);
        post_op(&mut self.out, Some((id, &inode)));
        wcc(&mut self.out, Some(before), Some((dir_id, &dir)));
        Ok(())
    }

    fn create(&mut self, r: &mut Reader<'_>) -> Result<(), Failure> {
        let handle = read_handle(r)?;
        let name = r.string(NAME_MAX + 1)?;
        let how = r.u32()?;
        let (set, verifier) = match how {
            0 | 1 => (SetAttributes::decode(r)?, None),
            2 => {
                let mut v = [0u8; 8];
                v.copy_from_slice(r.fixed(8)?);
                (SetAttributes::default(), Some(v))
            }
            _ => return Err(Failure::Garbage),
        };
        let (dir_id, dir) = self.dir_for_change(handle, name)?;
        if let Ok(existing) = self.fs.lookup(&dir, name) {
            let inode = self
                .fs
                .inode(existing)
                .map_err(|s| self.fail_wcc(s, Some((dir_id, &dir))))?;
            let reuse = match how {
                // UNCHECKED: an existing regular file is opened (and truncated if asked).
                0 => inode.kind == FileType::Regular,
                1 => false,
                // EXCLUSIVE: a retransmission of the same create succeeds.
                _ => inode.create_verifier == verifier,
            };
            if !reuse {
                return Err(self.fail_wcc(Status::Exist, Some((dir_id, &dir))));
            }
            let mut after = inode.clone();
            if how == 0 && set.size.is_some() {
                let size_only = SetAttributes {
                    size: set.size,
                    ..SetAttributes::default()
                };
                self.apply(existing, &mut after, &size_only, true)
                    .map_err(|s| self.fail_wcc(s, Some((dir_id, &dir))))?;
                self.fs.put_inode(existing, &after);
            }
            self.out.u32(Status::Ok as u32);
            self.out.bool(true);
            encode_handle(&mut self.out, existing, &after);
            post_op(&mut self.out, Some((existing, &after)));
            wcc(&mut self.out, Some(&dir), Some((dir_id, &dir)));
            return Ok(());
        }
        let body = Body::File {
            direct: Vec::new(),
            indirect: Vec::new(),
        };
        let mut inode = self
            .new_inode(FileType::Regular, &dir, &set, body)
            .map_err(|s| self.fail_wcc(s, Some((dir_id, &dir))))?;
        inode.create_verifier = verifier;
        self.finish_create(dir_id, &dir.clone(), dir, name, inode)
    }

    fn mkdir(&mut self, r: &mut Reader<'_>) -> Result<(), Failure> {
        let handle = read_handle(r)?;
        let name = r.string(NAME_MAX + 1)?;
        let set = SetAttributes::decode(r)?;
        let (dir_id, dir) = self.dir_for_change(handle, name)?;
        if name == "." || name == ".." || self.fs.lookup(&dir, name).is_ok() {
            return Err(self.fail_wcc(Status::Exist, Some((dir_id, &dir))));
        }
        let body = Body::Directory {
            parent: dir_id,
            entries: Entries::Inline(Vec::new()),
        };
        let inode = self
            .new_inode(FileType::Directory, &dir, &set, body)
            .map_err(|s| self.fail_wcc(s, Some((dir_id, &dir))))?;
        self.finish_create(dir_id, &dir.clone(), dir, name, inode)
    }

    fn symlink(&mut self, r: &mut Reader<'_>) -> Result<(), Failure> {
        let handle = read_handle(r)?;
        let name = r.string(NAME_MAX + 1)?;
        let set = SetAttributes::decode(r)?;
        let target = r.string(SYMLINK_MAX)?.to_string();
        let (dir_id, dir) = self.dir_for_change(handle, name)?;
        if name == "." || name == ".." || self.fs.lookup(&dir, name).is_ok() {
            return Err(self.fail_wcc(Status::Exist, Some((dir_id, &dir))));
        }
        let size = target.len() as u64;
        let set = SetAttributes {
            mode: Some(set.mode.unwrap_or(0o777)),
            ..set
        };
        let mut inode = self
            .new_inode(FileType::Symlink, &dir, &set, Body::Symlink { target })
            .map_err(|s| self.fail_wcc(s, Some((dir_id, &dir))))?;
        inode.size = size;
        self.finish_create(dir_id, &dir.clone(), dir, name, inode)
    }

    fn mknod(&mut self, r: &mut Reader<'_>) -> Result<(), Failure> {
        let handle = read_handle(r)?;
        let name = r.string(NAME_MAX + 1)?;
        let kind = FileType::from_u32(r.u32()?)?;
        let (set, rdev) = match kind {
            FileType::Character | FileType::Block => (SetAttributes::decode(r)?, (r.u32()?, r.u32()?)),
            FileType::Socket | FileType::Fifo => (SetAttributes::decode(r)?, (0, 0)),
            _ => (SetAttributes::default(), (0, 0)),
        };
        let (dir_id, dir) = self.dir_for_change(handle, name)?;
        if matches!(kind, FileType::Regular | FileType::Directory | FileType::Symlink) {
            return Err(self.fail_wcc(Status::BadType, Some((dir_id, &dir))));
        }
        if matches!(kind, FileType::Character | FileType::Block) && self.cred.uid != 0 {
            return Err(self.fail_wcc(Status::Perm, Some((dir_id, &dir))));
        }
        if name == "." || name == ".." || self.fs.lookup(&dir, name).is_ok() {
            return Err(self.fail_wcc(Status::Exist, Some((dir_id, &dir))));
        }
        let mut inode = self
            .new_inode(kind, &dir, &set, Body::Special)
            .map_err(|s| self.fail_wcc(s, Some((dir_id, &dir))))?;
        inode.rdev = rdev;
        self.finish_create(dir_id, &dir.clone(), dir, name, inode)
    }

    /// Whether the caller may remove or replace `name`'s `inode` in `dir` under the sticky bit.
    fn sticky_allows(&self, dir: &Inode, inode: &Inode) -> bool {
        dir.mode & 0o1000 == 0 || self.cred.uid == 0 || self.cred.uid == inode.uid || self.cred.uid == dir.uid
    }

    /// Drops one link of `inode` (removed from a directory): frees it with its last link.
    fn unlink(&mut self, id: u64, mut inode: Inode) -> Result<(), Status> {
        let last = match inode.kind {
            FileType::Directory => true,
            _ => inode.nlink <= 1,
        };
        if last {
            self.fs.free_inode(id, &inode)
        } else {
            inode.nlink -= 1;
            inode.ctime = self.now;
            self.fs.put_inode(id, &inode);
            Ok(())
        }
    }

    fn remove(&mut self, r: &mut Reader<'_>, directory: bool) -> Result<(), Failure> {
        let handle = read_handle(r)?;
        let name = r.string(NAME_MAX + 1)?;
        let (dir_id, dir) = self.fs.resolve(handle).map_err(|s| self.fail_wcc(s, None))?;
        if dir.kind != FileType::Directory {
            return Err(self.fail_wcc(Status::NotDir, Some((dir_id, &dir))));
        }
        if directory && name == "." {
            return Err(self.fail_wcc(Status::Inval, Some((dir_id, &dir))));
        }
        if directory && name == ".." {
            return Err(self.fail_wcc(Status::NotEmpty, Some((dir_id, &dir))));
        }
        if let Err(s) = check_name(name) {
            return Err(self.fail_wcc(s, Some((dir_id, &dir))));
        }
        if !permits(self.cred, &dir, W | X) {
            return Err(self.fail_wcc(Status::Acces, Some((dir_id, &dir))));
        }
        let id = self
            .fs
            .lookup(&dir, name)
            .map_err(|s| self.fail_wcc(s, Some((dir_id, &dir))))?;
        let inode = self.fs.inode(id).map_err(|s| self.fail_wcc(s, Some((dir_id, &dir))))?;
        let is_dir = inode.kind == FileType::Directory;
        if directory && !is_dir {
            return Err(self.fail_wcc(Status::NotDir, Some((dir_id, &dir))));
        }
        if !directory && is_dir {
            return Err(self.fail_wcc(Status::IsDir, Some((dir_id, &dir))));
        }
        if is_dir && inode.size != 0 {
            return Err(self.fail_wcc(Status::NotEmpty, Some((dir_id, &dir))));
        }
        if !self.sticky_allows(&dir, &inode) {
            return Err(self.fail_wcc(Status::Acces, Some((dir_id, &dir))));
        }
        let mut after = dir.clone();
        self.fs
            .remove_entry(&mut after, name)
            .map_err(|s| self.fail_wcc(s, Some((dir_id, &dir))))?;
        if is_dir {
            after.nlink -= 1;
        }
        after.mtime = self.now;
        after.ctime = self.now;
        self.fs.put_inode(dir_id, &after);
        self.unlink(id, inode)
            .map_err(|s| self.fail_wcc(s, Some((dir_id, &dir))))?;
        self.out.u32(Status::Ok as u32);
        wcc(&mut self.out, Some(&dir), Some((dir_id, &after)));
        Ok(())
    }

    /// Writes RENAME's failure: both directories' wcc.
    fn fail_rename(&mut self, status: Status, from: Option<(u64, &Inode)>, to: Option<(u64, &Inode)>) -> Failure {
        self.out.u32(status as u32);
        wcc(&mut self.out, from.map(|(_, i)| i), from);
        wcc(&mut self.out, to.map(|(_, i)| i), to);
        Failure::Answered
    }

    fn rename(&mut self, r: &mut Reader<'_>) -> Result<(), Failure> {
        let from_handle = read_handle(r)?;
        let from_name = r.string(NAME_MAX + 1)?.to_string();
        let to_handle = read_handle(r)?;
        let to_name = r.string(NAME_MAX + 1)?.to_string();
        let (from_id, from_dir) = self
            .fs
            .resolve(from_handle)
            .map_err(|s| self.fail_rename(s, None, None))?;
        let (to_id, to_dir) = self
            .fs
            .resolve(to_handle)
            .map_err(|s| self.fail_rename(s, Some((from_id, &from_dir)), None))?;
        let fail = |call: &mut Self, s: Status| call.fail_rename(s, Some((from_id, &from_dir)), Some((to_id, &to_dir)));
        if from_dir.kind != FileType::Directory || to_dir.kind != FileType::Directory {
            return Err(fail(self, Status::NotDir));
        }
        for name in [&from_name, &to_name] {
            if name == "." || name == ".." {
                return Err(fail(self, Status::Inval));
            }
            if let Err(s) = check_name(name) {
                return Err(fail(self, s));
            }
        }
        if !permits(self.cred, &from_dir, W | X) || !permits(self.cred, &to_dir, W | X) {
            return Err(fail(self, Status::Acces));
        }
        let id = match self.fs.lookup(&from_dir, &from_name) {
            Ok(id) => id,
            Err(s) => return Err(fail(self, s)),
        };
        let inode = match self.fs.inode(id) {
            Ok(i) => i,
            Err(s) => return Err(fail(self, s)),
        };
        if !self.sticky_allows(&from_dir, &inode) {
            return Err(fail(self, Status::Acces));
        }
        let is_dir = inode.kind == FileType::Directory;
        // A directory may not move into itself or below itself.
        if is_dir {
            let mut at = to_id;
            loop {
                if at == id {
                    return Err(fail(self, Status::Inval));
                }
                if at == ROOT {
                    break;
                }
                match self.fs.inode(at).map(|i| i.body) {
                    Ok(Body::Directory { parent, .. }) => at = parent,
                    _ => return Err(fail(self, Status::Io)),
                }
            }
        }
        let existing = self.fs.lookup(&to_dir, &to_name).ok();
        if existing == Some(id) {
            // Two names of one file (or the same name): nothing to do.
            self.out.u32(Status::Ok as u32);
            wcc(&mut self.out, Some(&from_dir), Some((from_id, &from_dir)));
            wcc(&mut self.out, Some(&to_dir), Some((to_id, &to_dir)));
            return Ok(());
        }
        let replaced = match existing {
            Some(old) => match self.fs.inode(old) {
                Ok(old_inode) => {
                    let old_dir = old_inode.kind == FileType::Directory;
                    if is_dir && !old_dir {
                        return Err(fail(self, Status::NotDir));
                    }
                    if !is_dir && old_dir {
                        return Err(fail(self, Status::IsDir));
                    }
                    if old_dir && old_inode.size != 0 {
                        return Err(fail(self, Status::Exist));
                    }
                    if !self.sticky_allows(&to_dir, &old_inode) {
                        return Err(fail(self, Status::Acces));
                    }
                    Some((old, old_inode))
                }
                Err(s) => return Err(fail(self, s)),
            },
            None => None,
        };
        // Apply: take the name out of the source, replace or add it in the target.
        let mut from_after = from_dir.clone();
        let mut step = || -> Result<Inode, Status> {
            self.fs.remove_entry(&mut from_after, &from_name)?;
            let mut to_after = if from_id == to_id {
                from_after.clone()
            } else {
                to_dir.clone()
            };
            if let Some((old, old_inode)) = &replaced {
                self.fs.remove_entry(&mut to_after, &to_name)?;
                if old_inode.kind == FileType::Directory {
                    to_after.nlink -= 1;
                }
                self.unlink(*old, old_inode.clone())?;
            }
            self.fs.add_entry(&mut to_after, &to_name, id)?;
            if is_dir && from_id != to_id {
                from_after.nlink -= 1;
                to_after.nlink += 1;
                let mut moved = inode.clone();
                if let Body::Directory { parent, .. } = &mut moved.body {
                    *parent = to_id;
                }
                moved.ctime = self.now;
                self.fs.put_inode(id, &moved);
            } else {
                let mut moved = inode.clone();
                moved.ctime = self.now;
                self.fs.put_inode(id, &moved);
            }
            Ok(to_after)
        };
        let to_after = match step() {
            Ok(t) => t,
            Err(s) => return Err(fail(self, s)),
        };
        let mut to_after = to_after;
        to_after.mtime = self.now;
        to_after.ctime = self.now;
        from_after.mtime = self.now;
        from_after.ctime = self.now;
        if from_id == to_id {
            self.fs.put_inode(to_id, &to_after);
            from_after = to_after.clone();
        } else {
            self.fs.put_inode(from_id, &from_after);
            self.fs.put_inode(to_id, &to_after);
        }
        self.out.u32(Status::Ok as u32);
        wcc(&mut self.out, Some(&from_dir), Some((from_id, &from_after)));
        wcc(&mut self.out, Some(&to_dir), Some((to_id, &to_after)));
        Ok(())
    }

    fn link(&mut self, r: &mut Reader<'_>) -> Result<(), Failure> {
        let handle = read_handle(r)?;
        let dir_handle = read_handle(r)?;
        let name = r.string(NAME_MAX + 1)?;
        let (id, inode) = match self.fs.resolve(handle) {
            Ok(x) => x,
            Err(s) => {
                self.out.u32(s as u32);
                post_op(&mut self.out, None);
                wcc(&mut self.out, None, None);
                return Err(Failure::Answered);
            }
        };
        let fail = |call: &mut Self, s: Status, dir: Option<(u64, &Inode)>| {
            call.out.u32(s as u32);
            post_op(&mut call.out, Some((id, &inode)));
            wcc(&mut call.out, dir.map(|(_, d)| d), dir);
            Failure::Answered
        };
        let (dir_id, dir) = match self.fs.resolve(dir_handle) {
            Ok(x) => x,
            Err(s) => return Err(fail(self, s, None)),
        };
        let checks = || -> Result<(), Status> {
            if dir.kind != FileType::Directory {
                return Err(Status::NotDir);
            }
            if inode.kind == FileType::Directory {
                return Err(Status::IsDir);
            }
            check_name(name)?;
            if name == "." || name == ".." {
                return Err(Status::Exist);
            }
            if !permits(self.cred, &dir, W | X) {
                return Err(Status::Acces);
            }
            if inode.nlink >= LINK_MAX {
                return Err(Status::MLink);
            }
            if self.fs.lookup(&dir, name).is_ok() {
                return Err(Status::Exist);
            }
            Ok(())
        };
        if let Err(s) = checks() {
            return Err(fail(self, s, Some((dir_id, &dir))));
        }
        let mut dir_after = dir.clone();
        if let Err(s) = self.fs.add_entry(&mut dir_after, name, id) {
            return Err(fail(self, s, Some((dir_id, &dir))));
        }
        dir_after.mtime = self.now;
        dir_after.ctime = self.now;
        self.fs.put_inode(dir_id, &dir_after);
        let mut after = inode.clone();
        after.nlink += 1;
        after.ctime = self.now;
        self.fs.put_inode(id, &after);
        self.out.u32(Status::Ok as u32);
        post_op(&mut self.out, Some((id, &after)));
        wcc(&mut self.out, Some(&dir), Some((dir_id, &dir_after)));
        Ok(())
    }
}

/// The root directory's handle (MOUNT's answer).
pub fn root_handle(fs: &FileSystem) -> Result<[u8; HANDLE_BYTES], Status> {
    let root = fs.inode(ROOT)?;
    Ok(FileSystem::handle(ROOT, &root))
}

#[cfg(test)]
mod tests;

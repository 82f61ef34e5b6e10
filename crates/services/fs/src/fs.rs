//! The file system kept in `Pages` (docs/SERVICES.md, "The NFS file system"): a superblock, one
//! inode page per file, directory and symlink, 64 KiB data pages reached through direct and
//! indirect index lists, directory entries inline or in entry pages by name hash, and a free
//! list threaded through freed pages. Everything here is deterministic: the same calls on the
//! same pages give the same pages.
//!
//! Page contents come from this module only, but a replica that fell behind installs pages a
//! peer sent (checked against the certified tree, yet bugs exist): every decode is checked and a
//! page that does not decode is reported as [`Status::Io`], never a panic.

use bytes::Bytes;
use upright_core::pages::Pages;

use crate::nfs3::{FileType, Status, Time, NAME_MAX};
use crate::xdr::{Reader, Writer, XdrError};

/// Bytes of file data per data page.
pub const BLOCK_BYTES: u64 = 64 * 1024;
/// Data-page indices an inode holds itself; further ones are in indirect pages.
pub const DIRECT_MAX: usize = 1024;
/// Data-page indices per indirect page: 8 bytes each after the page's tag and count, within
/// one page of at most `PAGE_BYTES_MAX` (64 KiB).
pub const PER_INDIRECT: usize = (upright_core::limits::PAGE_BYTES_MAX - 8) / 8;
/// Indirect pages an inode lists (its own page stays under 64 KiB): files up to
/// `(DIRECT_MAX + INDIRECT_MAX * PER_INDIRECT) * BLOCK_BYTES`, about 3 TiB.
pub const INDIRECT_MAX: usize = 6000;
/// Largest file size this file system stores.
pub const FILE_BYTES_MAX: u64 = (DIRECT_MAX as u64 + INDIRECT_MAX as u64 * PER_INDIRECT as u64) * BLOCK_BYTES;
/// Encoded bytes of directory entries an inode holds inline, and an entry page at most.
pub const ENTRIES_BYTES_MAX: usize = 48 * 1024;
/// Most entry pages a directory lists in its inode (16 bytes each): about 3,000 pages of 24-48
/// KiB of entries, a million entries or more.
pub const ENTRY_PAGES_MAX: usize = ENTRIES_BYTES_MAX / 16;
/// Longest symlink target.
pub const SYMLINK_MAX: usize = crate::nfs3::PATH_MAX;
/// Length of a file handle: file id and generation.
pub const HANDLE_BYTES: usize = 16;
/// The root directory's file id (its page).
pub const ROOT: u64 = 1;

const TAG_SUPER: u32 = 0x5550_0001;
const TAG_INODE: u32 = 0x5550_0002;
const TAG_ENTRIES: u32 = 0x5550_0003;
const TAG_INDIRECT: u32 = 0x5550_0004;
const TAG_FREE: u32 = 0x5550_0005;

/// Page 0: allocation state and counters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Superblock {
    /// First page never allocated.
    next_page: u64,
    /// Head of the free list (0: empty; page 0 is never free).
    free_head: u64,
    free_count: u64,
    /// Generation the next inode gets (unique over the file system's life).
    next_generation: u64,
    /// Inodes in use.
    files: u64,
}

impl Superblock {
    fn encode(&self) -> Bytes {
        let mut w = Writer::with_capacity(48);
        w.u32(TAG_SUPER)
            .u64(self.next_page)
            .u64(self.free_head)
            .u64(self.free_count);
        w.u64(self.next_generation).u64(self.files);
        w.finish()
    }

    fn decode(bytes: &[u8]) -> Result<Superblock, XdrError> {
        let mut r = Reader::new(bytes);
        expect_tag(&mut r, TAG_SUPER)?;
        Ok(Superblock {
            next_page: r.u64()?,
            free_head: r.u64()?,
            free_count: r.u64()?,
            next_generation: r.u64()?,
            files: r.u64()?,
        })
    }
}

fn expect_tag(r: &mut Reader<'_>, tag: u32) -> Result<(), XdrError> {
    match r.u32()? {
        t if t == tag => Ok(()),
        t => Err(XdrError::BadValue(t)),
    }
}

/// One directory entry; entries are kept in `(hash, name)` order.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Entry {
    /// [`name_hash`] of `name`: the entry's READDIR cookie.
    pub hash: u64,
    pub name: String,
    pub fileid: u64,
}

impl Entry {
    fn encoded_len(&self) -> usize {
        8 + 4 + self.name.len() + crate::xdr::padding(self.name.len()) + 8
    }

    fn encode(&self, w: &mut Writer) {
        w.u64(self.hash).string(&self.name).u64(self.fileid);
    }

    fn decode(r: &mut Reader<'_>) -> Result<Entry, XdrError> {
        let hash = r.u64()?;
        let name = r.string(NAME_MAX)?.to_string();
        let fileid = r.u64()?;
        Ok(Entry { hash, name, fileid })
    }
}

/// The READDIR cookies of a listing's "." and "..": a name's cookie is above both (and 0
/// starts a listing).
pub const DOT_COOKIE: u64 = 1;
pub const DOTDOT_COOKIE: u64 = 2;

/// The READDIR cookie of a name: 63 bits of its BLAKE3 hash, above [`DOTDOT_COOKIE`].
pub fn name_hash(name: &str) -> u64 {
    let digest = blake3::hash(name.as_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest.as_bytes()[..8]);
    (u64::from_be_bytes(first) >> 1).max(DOTDOT_COOKIE + 1)
}

/// What an inode holds besides its attributes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Body {
    /// A regular file: data-page indices (0: a hole) by block number.
    File {
        direct: Vec<u64>,
        indirect: Vec<u64>,
    },
    /// A directory: its parent and its entries, inline or in entry pages listed by the lowest
    /// hash each covers (the first covers everything below the second's).
    Directory {
        parent: u64,
        entries: Entries,
    },
    Symlink {
        target: String,
    },
    /// A device, socket or FIFO (MKNOD).
    Special,
}

/// A directory's entries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Entries {
    Inline(Vec<Entry>),
    /// (lowest hash covered, entry page), by hash.
    Paged(Vec<(u64, u64)>),
}

/// A file, directory or symlink: attributes and body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Inode {
    pub generation: u64,
    pub kind: FileType,
    pub mode: u32,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    /// Bytes for a file, entries for a directory, target bytes for a symlink.
    pub size: u64,
    pub rdev: (u32, u32),
    pub atime: Time,
    pub mtime: Time,
    pub ctime: Time,
    /// EXCLUSIVE CREATE's verifier, until the file's attributes are first set.
    pub create_verifier: Option<[u8; 8]>,
    pub body: Body,
}

impl Inode {
    fn encode(&self) -> Bytes {
        let mut w = Writer::with_capacity(256);
        w.u32(TAG_INODE).u64(self.generation).u32(self.kind as u32);
        w.u32(self.mode)
            .u32(self.nlink)
            .u32(self.uid)
            .u32(self.gid)
            .u64(self.size);
        w.u32(self.rdev.0).u32(self.rdev.1);
        self.atime.encode(&mut w);
        self.mtime.encode(&mut w);
        self.ctime.encode(&mut w);
        w.bool(self.create_verifier.is_some());
        if let Some(v) = &self.create_verifier {
            w.fixed(v);
        }
        match &self.body {
            Body::File { direct, indirect } => {
                w.u32(1);
                encode_u64s(&mut w, direct);
                encode_u64s(&mut w, indirect);
            }
            Body::Directory { parent, entries } => {
                w.u32(2).u64(*parent);
                match entries {
                    Entries::Inline(list) => {
                        w.u32(0).u32(list.len() as u32);
                        for e in list {
                            e.encode(&mut w);
                        }
                    }
                    Entries::Paged(pages) => {
                        w.u32(1).u32(pages.len() as u32);
                        for (hash, page) in pages {
                            w.u64(*hash).u64(*page);
                        }
                    }
                }
            }
            Body::Symlink { target } => {
                w.u32(3).string(target);
            }
            Body::Special => {
                w.u32(4);
            }
        }
        w.finish()
    }

    fn decode(bytes: &[u8]) -> Result<Inode, XdrError> {
        let mut r = Reader::new(bytes);
        expect_tag(&mut r, TAG_INODE)?;
        let generation = r.u64()?;
        let kind = FileType::from_u32(r.u32()?)?;
        let (mode, nlink, uid, gid, size) = (r.u32()?, r.u32()?, r.u32()?, r.u32()?, r.u64()?);
        let rdev = (r.u32()?, r.u32()?);
        let (atime, mtime, ctime) = (Time::decode(&mut r)?, Time::decode(&mut r)?, Time::decode(&mut r)?);
        let create_verifier = r.optional(|r| {
            let mut v = [0u8; 8];
            v.copy_from_slice(r.fixed(8)?);
            Ok(v)
        })?;
        let body = match r.u32()? {
            1 => Body::File {
                direct: decode_u64s(&mut r, DIRECT_MAX)?,
                indirect: decode_u64s(&mut r, INDIRECT_MAX)?,
            },
            2 => {
                let parent = r.u64()?;
                let entries = match r.u32()? {
                    0 => Entries::Inline(decode_entries(&mut r)?),
                    1 => {
                        let n = bounded(r.u32()?, ENTRY_PAGES_MAX)?;
                        Entries::Paged(
                            (0..n)
                                .map(|_| Ok((r.u64()?, r.u64()?)))
                                .collect::<Result<_, XdrError>>()?,
                        )
                    }
                    v => return Err(XdrError::BadValue(v)),
                };
                Body::Directory { parent, entries }
            }
            3 => Body::Symlink {
                target: r.string(SYMLINK_MAX)?.to_string(),
            },
            4 => Body::Special,
            v => return Err(XdrError::BadValue(v)),
        };
        Ok(Inode {
            generation,
            kind,
            mode,
            nlink,
            uid,
            gid,
            size,
            rdev,
            atime,
            mtime,
            ctime,
            create_verifier,
            body,
        })
    }
}

fn bounded(n: u32, max: usize) -> Result<usize, XdrError> {
    let n = n as usize;
    if n > max {
        return Err(XdrError::TooLong(n, max));
    }
    Ok(n)
}

fn encode_u64s(w: &mut Writer, list: &[u64]) {
    w.u32(list.len() as u32);
    for v in list {
        w.u64(*v);
    }
}

fn decode_u64s(r: &mut Reader<'_>, max: usize) -> Result<Vec<u64>, XdrError> {
    let n = bounded(r.u32()?, max)?;
    (0..n).map(|_| r.u64()).collect()
}

fn decode_entries(r: &mut Reader<'_>) -> Result<Vec<Entry>, XdrError> {
    let n = bounded(r.u32()?, ENTRIES_BYTES_MAX / 20)?;
    (0..n).map(|_| Entry::decode(r)).collect()
}

fn encode_entry_page(entries: &[Entry]) -> Bytes {
    let mut w = Writer::with_capacity(entries_bytes(entries) + 8);
    w.u32(TAG_ENTRIES).u32(entries.len() as u32);
    for e in entries {
        e.encode(&mut w);
    }
    w.finish()
}

fn entries_bytes(entries: &[Entry]) -> usize {
    entries.iter().map(Entry::encoded_len).sum()
}

/// A page that does not decode as what its reference says it is.
fn corrupt(_: XdrError) -> Status {
    Status::Io
}

/// The file system: its pages are the replicated state.
pub struct FileSystem {
    pages: Pages,
}

impl Default for FileSystem {
    fn default() -> Self {
        FileSystem::new()
    }
}

impl FileSystem {
    /// A new file system: the superblock and an empty root directory (mode 0777, owned by root),
    /// created at time 0.
    pub fn new() -> FileSystem {
        let mut pages = Pages::new();
        let superblock = Superblock {
            next_page: ROOT + 1,
            free_head: 0,
            free_count: 0,
            next_generation: 2,
            files: 1,
        };
        pages.set(0, superblock.encode());
        let root = Inode {
            generation: 1,
            kind: FileType::Directory,
            mode: 0o777,
            nlink: 2,
            uid: 0,
            gid: 0,
            size: 0,
            rdev: (0, 0),
            atime: Time::default(),
            mtime: Time::default(),
            ctime: Time::default(),
            create_verifier: None,
            body: Body::Directory {
                parent: ROOT,
                entries: Entries::Inline(Vec::new()),
            },
        };
        pages.set(ROOT, root.encode());
        FileSystem { pages }
    }

    /// A file system over pages restored from a checkpoint or a peer; checks the superblock and
    /// the root.
    pub fn from_pages(pages: Pages) -> Result<FileSystem, Status> {
        let fs = FileSystem { pages };
        let sb = fs.superblock()?;
        if sb.next_page > fs.pages.len() || fs.inode(ROOT)?.kind != FileType::Directory {
            return Err(Status::Io);
        }
        Ok(fs)
    }

    pub fn pages(&self) -> &Pages {
        &self.pages
    }

    pub fn pages_mut(&mut self) -> &mut Pages {
        &mut self.pages
    }

    fn superblock(&self) -> Result<Superblock, Status> {
        Superblock::decode(&self.pages.get(0).ok_or(Status::Io)?).map_err(corrupt)
    }

    fn put_superblock(&mut self, sb: &Superblock) {
        self.pages.set(0, sb.encode());
    }

    /// Inodes in use, pages allocated and pages free.
    pub fn usage(&self) -> Result<(u64, u64, u64), Status> {
        let sb = self.superblock()?;
        Ok((sb.files, sb.next_page, sb.free_count))
    }

    /// The inode at `fileid`.
    pub fn inode(&self, fileid: u64) -> Result<Inode, Status> {
        if fileid == 0 {
            return Err(Status::Stale);
        }
        let bytes = self.pages.get(fileid).ok_or(Status::Stale)?;
        let mut r = Reader::new(&bytes);
        match r.u32() {
            Ok(TAG_INODE) => Inode::decode(&bytes).map_err(corrupt),
            // A freed page (or one reused for data): the handle is stale.
            _ => Err(Status::Stale),
        }
    }

    pub fn put_inode(&mut self, fileid: u64, inode: &Inode) {
        self.pages.set(fileid, inode.encode());
    }

    /// The handle of an inode.
    pub fn handle(fileid: u64, inode: &Inode) -> [u8; HANDLE_BYTES] {
        let mut h = [0u8; HANDLE_BYTES];
        h[..8].copy_from_slice(&fileid.to_be_bytes());
        h[8..].copy_from_slice(&inode.generation.to_be_bytes());
        h
    }

    /// The inode a handle names: NFS3ERR_BADHANDLE if it is not one of ours, NFS3ERR_STALE if its
    /// file is gone.
    pub fn resolve(&self, handle: &[u8]) -> Result<(u64, Inode), Status> {
        if handle.len() != HANDLE_BYTES {
            return Err(Status::BadHandle);
        }
        let mut id = [0u8; 8];
        id.copy_from_slice(&handle[..8]);
        let fileid = u64::from_be_bytes(id);
        id.copy_from_slice(&handle[8..]);
        let generation = u64::from_be_bytes(id);
        let inode = self.inode(fileid)?;
        if inode.generation != generation {
            return Err(Status::Stale);
        }
        Ok((fileid, inode))
    }

    /// A page for new contents: the free list's head, or a new one.
    fn allocate(&mut self, sb: &mut Superblock) -> Result<u64, Status> {
        if sb.free_head != 0 {
            let page = sb.free_head;
            let bytes = self.pages.get(page).ok_or(Status::Io)?;
            let mut r = Reader::new(&bytes);
            expect_tag(&mut r, TAG_FREE).map_err(corrupt)?;
            sb.free_head = r.u64().map_err(corrupt)?;
            sb.free_count -= 1;
            Ok(page)
        } else {
            let page = sb.next_page;
            sb.next_page += 1;
            Ok(page)
        }
    }

    /// Puts `page` on the free list.
    fn release(&mut self, sb: &mut Superblock, page: u64) {
        debug_assert!(page > ROOT, "the superblock and the root are never freed");
        let mut w = Writer::with_capacity(12);
        w.u32(TAG_FREE).u64(sb.free_head);
        self.pages.set(page, w.finish());
        sb.free_head = page;
        sb.free_count += 1;
    }

    /// Writes a new inode and returns its file id.
    pub fn create_inode(&mut self, mut inode: Inode) -> Result<u64, Status> {
        let mut sb = self.superblock()?;
        let fileid = self.allocate(&mut sb)?;
        inode.generation = sb.next_generation;
        sb.next_generation += 1;
        sb.files += 1;
        self.put_inode(fileid, &inode);
        self.put_superblock(&sb);
        Ok(fileid)
    }

    /// Frees an inode that has no links left, with its data, indirect and entry pages.
    pub fn free_inode(&mut self, fileid: u64, inode: &Inode) -> Result<(), Status> {
        let mut sb = self.superblock()?;
        match &inode.body {
            Body::File { direct, indirect } => {
                for page in direct.iter().filter(|p| **p != 0) {
                    self.release(&mut sb, *page);
                }
                for ind in indirect.iter().filter(|p| **p != 0) {
                    for page in self.indirect(*ind)?.into_iter().filter(|p| *p != 0) {
                        self.release(&mut sb, page);
                    }
                    self.release(&mut sb, *ind);
                }
            }
            Body::Directory {
                entries: Entries::Paged(list),
                ..
            } => {
                for (_, page) in list {
                    self.release(&mut sb, *page);
                }
            }
            _ => {}
        }
        self.release(&mut sb, fileid);
        sb.files -= 1;
        self.put_superblock(&sb);
        Ok(())
    }

    fn indirect(&self, page: u64) -> Result<Vec<u64>, Status> {
        let bytes = self.pages.get(page).ok_or(Status::Io)?;
        let mut r = Reader::new(&bytes);
        expect_tag(&mut r, TAG_INDIRECT).map_err(corrupt)?;
        decode_u64s(&mut r, PER_INDIRECT).map_err(corrupt)
    }

    fn put_indirect(&mut self, page: u64, list: &[u64]) {
        let mut w = Writer::with_capacity(8 + list.len() * 8);
        w.u32(TAG_INDIRECT);
        encode_u64s(&mut w, list);
        self.pages.set(page, w.finish());
    }

    // ---- file data ----

    /// The data page of block `block`, if it has one (0 or missing: a hole).
    fn block_page(&self, body: &Body, block: u64) -> Result<u64, Status> {
        let Body::File { direct, indirect } = body else {
            return Err(Status::Inval);
        };
        let block = block as usize;
        if block < DIRECT_MAX {
            return Ok(direct.get(block).copied().unwrap_or(0));
        }
        let rest = block - DIRECT_MAX;
        match indirect.get(rest / PER_INDIRECT).copied() {
            None | Some(0) => Ok(0),
            Some(ind) => Ok(self.indirect(ind)?.get(rest % PER_INDIRECT).copied().unwrap_or(0)),
        }
    }

    /// Up to `count` bytes of a file from `offset`, and whether they reach its end.
    pub fn read(&self, inode: &Inode, offset: u64, count: u32) -> Result<(Vec<u8>, bool), Status> {
        if inode.kind != FileType::Regular {
            return Err(if inode.kind == FileType::Directory {
                Status::IsDir
            } else {
                Status::Inval
            });
        }
        let end = offset.saturating_add(u64::from(count)).min(inode.size);
        let mut data = Vec::with_capacity(end.saturating_sub(offset) as usize);
        let mut at = offset;
        while at < end {
            let block = at / BLOCK_BYTES;
            let within = (at % BLOCK_BYTES) as usize;
            let take = ((BLOCK_BYTES - within as u64).min(end - at)) as usize;
            let page = self.block_page(&inode.body, block)?;
            let bytes = if page == 0 {
                Bytes::new()
            } else {
                self.pages.get(page).ok_or(Status::Io)?
            };
            // A block may be shorter than BLOCK_BYTES: the rest reads as zeros.
            let have = bytes.len().saturating_sub(within).min(take);
            data.extend_from_slice(&bytes[within.min(bytes.len())..within.min(bytes.len()) + have]);
            data.resize(data.len() + (take - have), 0);
            at += take as u64;
        }
        Ok((data, end >= inode.size))
    }

    /// Writes `data` at `offset` into the file, growing it; the caller updates times and
    /// stores the inode.
    pub fn write(&mut self, inode: &mut Inode, offset: u64, data: &[u8]) -> Result<(), Status> {
        if inode.kind != FileType::Regular {
            return Err(if inode.kind == FileType::Directory {
                Status::IsDir
            } else {
                Status::Inval
            });
        }
        let end = offset.checked_add(data.len() as u64).ok_or(Status::FBig)?;
        if end > FILE_BYTES_MAX {
            return Err(Status::FBig);
        }
        let mut at = offset;
        while at < end {
            let block = at / BLOCK_BYTES;
            let within = (at % BLOCK_BYTES) as usize;
            let take = ((BLOCK_BYTES - within as u64).min(end - at)) as usize;
            let src = &data[(at - offset) as usize..(at - offset) as usize + take];
            let page = self.block_page(&inode.body, block)?;
            let mut bytes = if page == 0 {
                Vec::new()
            } else {
                self.pages.get(page).ok_or(Status::Io)?.to_vec()
            };
            if bytes.len() < within + take {
                bytes.resize(within + take, 0);
            }
            bytes[within..within + take].copy_from_slice(src);
            let page = if page == 0 { self.map_block(inode, block)? } else { page };
            self.pages.set(page, Bytes::from(bytes));
            at += take as u64;
        }
        inode.size = inode.size.max(end);
        Ok(())
    }

    /// Gives block `block` of the file a new data page and returns it.
    fn map_block(&mut self, inode: &mut Inode, block: u64) -> Result<u64, Status> {
        let mut sb = self.superblock()?;
        let page = self.allocate(&mut sb)?;
        let Body::File { direct, indirect } = &mut inode.body else {
            return Err(Status::Inval);
        };
        let block = block as usize;
        if block < DIRECT_MAX {
            if direct.len() <= block {
                direct.resize(block + 1, 0);
            }
            direct[block] = page;
        } else {
            let rest = block - DIRECT_MAX;
            let slot = rest / PER_INDIRECT;
            if indirect.len() <= slot {
                indirect.resize(slot + 1, 0);
            }
            if indirect[slot] == 0 {
                indirect[slot] = self.allocate(&mut sb)?;
                self.put_indirect(indirect[slot], &[]);
            }
            let ind = indirect[slot];
            let mut list = self.indirect(ind)?;
            if list.len() <= rest % PER_INDIRECT {
                list.resize(rest % PER_INDIRECT + 1, 0);
            }
            list[rest % PER_INDIRECT] = page;
            self.put_indirect(ind, &list);
        }
        self.put_superblock(&sb);
        Ok(page)
    }

    /// Sets the file's size: frees the blocks past the new end and cuts the last one, or
    /// extends with a hole.
    pub fn truncate(&mut self, inode: &mut Inode, size: u64) -> Result<(), Status> {
        if inode.kind != FileType::Regular {
            return Err(if inode.kind == FileType::Directory {
                Status::IsDir
            } else {
                Status::Inval
            });
        }
        if size > FILE_BYTES_MAX {
            return Err(Status::FBig);
        }
        if size < inode.size {
            let keep_blocks = size.div_ceil(BLOCK_BYTES) as usize;
            let mut sb = self.superblock()?;
            let Body::File { direct, indirect } = &mut inode.body else {
                unreachable!("checked: a regular file");
            };
            for page in direct.drain(keep_blocks.min(direct.len())..).filter(|p| *p != 0) {
                self.release(&mut sb, page);
            }
            let keep_rest = keep_blocks.saturating_sub(DIRECT_MAX);
            let keep_slots = keep_rest.div_ceil(PER_INDIRECT);
            for ind in indirect.drain(keep_slots.min(indirect.len())..).filter(|p| *p != 0) {
                for page in self.indirect(ind)?.into_iter().filter(|p| *p != 0) {
                    self.release(&mut sb, page);
                }
                self.release(&mut sb, ind);
            }
            if !keep_rest.is_multiple_of(PER_INDIRECT) {
                if let Some(&ind) = indirect.last().filter(|p| **p != 0) {
                    let mut list = self.indirect(ind)?;
                    for page in list
                        .drain((keep_rest % PER_INDIRECT).min(list.len())..)
                        .filter(|p| *p != 0)
                    {
                        self.release(&mut sb, page);
                    }
                    self.put_indirect(ind, &list);
                }
            }
            self.put_superblock(&sb);
            // The kept last block: cut it so a later extension reads zeros.
            if !size.is_multiple_of(BLOCK_BYTES) {
                let page = self.block_page(&inode.body, size / BLOCK_BYTES)?;
                if page != 0 {
                    let bytes = self.pages.get(page).ok_or(Status::Io)?;
                    let cut = (size % BLOCK_BYTES) as usize;
                    if bytes.len() > cut {
                        self.pages.set(page, bytes.slice(..cut));
                    }
                }
            }
        }
        inode.size = size;
        Ok(())
    }

    // ---- directories ----

    fn entry_page(&self, page: u64) -> Result<Vec<Entry>, Status> {
        let bytes = self.pages.get(page).ok_or(Status::Io)?;
        let mut r = Reader::new(&bytes);
        expect_tag(&mut r, TAG_ENTRIES).map_err(corrupt)?;
        decode_entries(&mut r).map_err(corrupt)
    }

    /// Which of a paged directory's entry pages covers `hash`.
    fn covering(list: &[(u64, u64)], hash: u64) -> usize {
        list.partition_point(|(low, _)| *low <= hash).saturating_sub(1)
    }

    /// The file id `name` names in directory `dir`.
    pub fn lookup(&self, dir: &Inode, name: &str) -> Result<u64, Status> {
        let Body::Directory { parent, entries } = &dir.body else {
            return Err(Status::NotDir);
        };
        if name == ".." {
            return Ok(*parent);
        }
        let hash = name_hash(name);
        let found = match entries {
            Entries::Inline(list) => list.iter().find(|e| e.hash == hash && e.name == name).map(|e| e.fileid),
            Entries::Paged(list) => {
                let page = list[Self::covering(list, hash)].1;
                self.entry_page(page)?
                    .into_iter()
                    .find(|e| e.hash == hash && e.name == name)
                    .map(|e| e.fileid)
            }
        };
        found.ok_or(Status::NoEnt)
    }

    /// Adds `name -> fileid` to directory `dir` (the caller checked that the name is free),
    /// moving its entries to pages or splitting a page that outgrows [`ENTRIES_BYTES_MAX`].
    pub fn add_entry(&mut self, dir: &mut Inode, name: &str, fileid: u64) -> Result<(), Status> {
        let entry = Entry {
            hash: name_hash(name),
            name: name.to_string(),
            fileid,
        };
        dir.size += 1;
        let Body::Directory { entries, .. } = &mut dir.body else {
            return Err(Status::NotDir);
        };
        match entries {
            Entries::Inline(list) => {
                let at = list.partition_point(|e| e < &entry);
                list.insert(at, entry);
                if entries_bytes(list) > ENTRIES_BYTES_MAX / 2 {
                    // Out of the inode into one entry page (split below as it grows).
                    let moved = std::mem::take(list);
                    let mut sb = self.superblock()?;
                    let page = self.allocate(&mut sb)?;
                    self.put_superblock(&sb);
                    self.pages.set(page, encode_entry_page(&moved));
                    *entries = Entries::Paged(vec![(0, page)]);
                }
                Ok(())
            }
            Entries::Paged(list) => {
                let index = Self::covering(list, entry.hash);
                let page = list[index].1;
                let mut items = self.entry_page(page)?;
                let at = items.partition_point(|e| e < &entry);
                items.insert(at, entry);
                if entries_bytes(&items) <= ENTRIES_BYTES_MAX || items.len() < 2 {
                    self.pages.set(page, encode_entry_page(&items));
                    return Ok(());
                }
                // Split at the middle, between two different hashes.
                let mut mid = items.len() / 2;
                while mid < items.len() && items[mid].hash == items[mid - 1].hash {
                    mid += 1;
                }
                if mid == items.len() {
                    mid = items.len() / 2;
                    while mid > 1 && items[mid].hash == items[mid - 1].hash {
                        mid -= 1;
                    }
                }
                if list.len() >= ENTRY_PAGES_MAX {
                    // The inode lists no more entry pages (it must stay within one page).
                    dir.size -= 1;
                    return Err(Status::NoSpc);
                }
                let upper = items.split_off(mid);
                let mut sb = self.superblock()?;
                let new_page = self.allocate(&mut sb)?;
                self.put_superblock(&sb);
                let low = upper[0].hash;
                self.pages.set(page, encode_entry_page(&items));
                self.pages.set(new_page, encode_entry_page(&upper));
                list.insert(index + 1, (low, new_page));
                Ok(())
            }
        }
    }

    /// Removes `name` from directory `dir`; returns the file id it named.
    pub fn remove_entry(&mut self, dir: &mut Inode, name: &str) -> Result<u64, Status> {
        let hash = name_hash(name);
        let Body::Directory { entries, .. } = &mut dir.body else {
            return Err(Status::NotDir);
        };
        let fileid = match entries {
            Entries::Inline(list) => {
                let at = list
                    .iter()
                    .position(|e| e.hash == hash && e.name == name)
                    .ok_or(Status::NoEnt)?;
                list.remove(at).fileid
            }
            Entries::Paged(list) => {
                let index = Self::covering(list, hash);
                let page = list[index].1;
                let mut items = self.entry_page(page)?;
                let at = items
                    .iter()
                    .position(|e| e.hash == hash && e.name == name)
                    .ok_or(Status::NoEnt)?;
                let fileid = items.remove(at).fileid;
                if items.is_empty() && list.len() > 1 {
                    // The page's range joins the one below it (or the first's, the one above).
                    let mut sb = self.superblock()?;
                    self.release(&mut sb, page);
                    self.put_superblock(&sb);
                    let (low, _) = list.remove(index);
                    if index == 0 {
                        list[0].0 = low;
                    }
                } else {
                    self.pages.set(page, encode_entry_page(&items));
                }
                fileid
            }
        };
        dir.size -= 1;
        Ok(fileid)
    }

    /// Entries of `dir` after cookie `cookie` (0: from the start), in cookie order, at most
    /// `max`; and whether the listing ends there.
    pub fn list(&self, dir: &Inode, cookie: u64, max: usize) -> Result<(Vec<Entry>, bool), Status> {
        let Body::Directory { entries, .. } = &dir.body else {
            return Err(Status::NotDir);
        };
        let mut out = Vec::new();
        match entries {
            Entries::Inline(list) => {
                out.extend(list.iter().filter(|e| e.hash > cookie).take(max + 1).cloned());
            }
            Entries::Paged(list) => {
                for (_, page) in &list[Self::covering(list, cookie)..] {
                    out.extend(self.entry_page(*page)?.into_iter().filter(|e| e.hash > cookie));
                    if out.len() > max {
                        break;
                    }
                }
            }
        }
        let eof = out.len() <= max;
        out.truncate(max);
        Ok((out, eof))
    }
}

#[cfg(test)]
mod tests;

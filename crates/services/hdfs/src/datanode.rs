//! A DataNode's store of block replicas (docs/HDFS.md): each block as `<id>.data` with a
//! `<id>.meta` beside it holding its length, sub-block hashes and block hash. A replica is written
//! to temporary files, synced, and made visible by renaming the meta file last, so a crash leaves
//! either the whole replica or none. Every read checks the sub-blocks it returns against the
//! stored hashes (the DataNode's background scan reads every replica so, a piece at a time); the
//! reader checks the stored hashes against the hash the NameNode committed too, so a store whose
//! meta files are corrupt is caught as well.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::block::{self, BlockHasher, SUB_BLOCK_BYTES};
use crate::namenode::{BlockReport, Hash, BLOCK_SIZE_MAX};

/// What went wrong in the store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// A disk error.
    #[error("block store: {0}")]
    Io(String),
    /// No replica of the block here.
    #[error("no replica of block {0} here")]
    NotFound(u64),
    /// The replica's bytes do not match its hashes.
    #[error("the replica of block {block} is corrupt at sub-block {sub}")]
    Corrupt {
        /// The block.
        block: u64,
        /// The first sub-block that does not match.
        sub: usize,
    },
    /// A write beyond the largest block.
    #[error("a block holds at most {BLOCK_SIZE_MAX} bytes")]
    TooLarge,
    /// A read beyond the replica's end.
    #[error("bytes {offset}..{end} are beyond block {block}'s {len} bytes")]
    OutOfRange {
        /// The block.
        block: u64,
        /// Start asked.
        offset: u64,
        /// End asked.
        end: u64,
        /// The replica's length.
        len: u64,
    },
}

fn io(what: &str, path: &Path, e: std::io::Error) -> StoreError {
    StoreError::Io(format!("{what} {}: {e}", path.display()))
}

/// What `<id>.meta` holds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Meta {
    /// Bytes in the replica.
    pub len: u64,
    /// The block hash.
    pub hash: Hash,
    /// The sub-block hashes.
    pub subs: Vec<Hash>,
}

/// The replicas one DataNode stores.
#[derive(Debug)]
pub struct BlockStore {
    dir: PathBuf,
    index: BTreeMap<u64, Meta>,
    used: u64,
}

impl BlockStore {
    /// Opens (creating) the store in `dir`: every complete replica is found again; temporary
    /// files of writes a crash cut short are removed.
    pub fn open(dir: &Path) -> Result<BlockStore, StoreError> {
        fs::create_dir_all(dir).map_err(|e| io("cannot create", dir, e))?;
        let mut index = BTreeMap::new();
        let mut used = 0;
        for entry in fs::read_dir(dir).map_err(|e| io("cannot list", dir, e))? {
            let path = entry.map_err(|e| io("cannot list", dir, e))?.path();
            let name = path
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or_default()
                .to_string();
            if name.ends_with(".tmp") {
                fs::remove_file(&path).map_err(|e| io("cannot remove", &path, e))?;
                continue;
            }
            let Some(id) = name.strip_suffix(".meta").and_then(|n| n.parse::<u64>().ok()) else {
                continue;
            };
            let bytes = fs::read(&path).map_err(|e| io("cannot read", &path, e))?;
            let Ok(meta) = upright_core::codec::from_bytes::<Meta>(&bytes) else {
                // An unreadable meta file: the replica is gone as far as anyone can tell.
                continue;
            };
            let data = dir.join(format!("{id}.data"));
            let size = fs::metadata(&data).map(|m| m.len()).ok();
            if size == Some(meta.len) {
                used += meta.len;
                index.insert(id, meta);
            }
        }
        Ok(BlockStore {
            dir: dir.to_path_buf(),
            index,
            used,
        })
    }

    fn data_path(&self, id: u64) -> PathBuf {
        self.dir.join(format!("{id}.data"))
    }

    fn meta_path(&self, id: u64) -> PathBuf {
        self.dir.join(format!("{id}.meta"))
    }

    /// Bytes of replicas stored.
    pub fn used(&self) -> u64 {
        self.used
    }

    /// Every replica as a report to the NameNode.
    pub fn reports(&self) -> Vec<BlockReport> {
        self.index
            .iter()
            .map(|(id, m)| BlockReport {
                block: *id,
                len: m.len,
                hash: m.hash,
            })
            .collect()
    }

    /// The replica's length, hashes and sub-block hashes.
    pub fn meta(&self, id: u64) -> Option<&Meta> {
        self.index.get(&id)
    }

    /// Starts writing a replica of block `id` (replacing any replica of it once finished).
    pub fn writer(&self, id: u64) -> Result<BlockWriter, StoreError> {
        let tmp = self.dir.join(format!("{id}.data.tmp"));
        let file = File::create(&tmp).map_err(|e| io("cannot create", &tmp, e))?;
        Ok(BlockWriter {
            id,
            file,
            tmp,
            dir: self.dir.clone(),
            hasher: BlockHasher::new(),
        })
    }

    /// Writes a whole replica of block `id`.
    pub fn put(&mut self, id: u64, data: &[u8]) -> Result<BlockReport, StoreError> {
        let mut w = self.writer(id)?;
        w.write(data)?;
        w.finish(self)
    }

    /// Bytes `offset .. offset + len` of block `id`, each sub-block they touch checked against
    /// its stored hash.
    pub fn read(&self, id: u64, offset: u64, len: u64) -> Result<Vec<u8>, StoreError> {
        self.read_checked(id, offset, len, true)
    }

    /// Testing only (a DataNode that does not check what it serves): like [`BlockStore::read`]
    /// without the check.
    pub fn read_unchecked(&self, id: u64, offset: u64, len: u64) -> Result<Vec<u8>, StoreError> {
        self.read_checked(id, offset, len, false)
    }

    fn read_checked(&self, id: u64, offset: u64, len: u64, check: bool) -> Result<Vec<u8>, StoreError> {
        let meta = self.index.get(&id).ok_or(StoreError::NotFound(id))?;
        let end = offset.saturating_add(len);
        if end > meta.len {
            return Err(StoreError::OutOfRange {
                block: id,
                offset,
                end,
                len: meta.len,
            });
        }
        if len == 0 {
            return Ok(Vec::new());
        }
        let sub = SUB_BLOCK_BYTES as u64;
        let (first, last) = (offset / sub, (end - 1) / sub);
        let start = first * sub;
        let stop = ((last + 1) * sub).min(meta.len);
        let path = self.data_path(id);
        let mut file = File::open(&path).map_err(|e| io("cannot open", &path, e))?;
        file.seek(SeekFrom::Start(start))
            .map_err(|e| io("cannot seek", &path, e))?;
        let mut bytes = vec![0; (stop - start) as usize];
        file.read_exact(&mut bytes).map_err(|e| io("cannot read", &path, e))?;
        for (k, chunk) in bytes.chunks(SUB_BLOCK_BYTES).enumerate() {
            let index = first as usize + k;
            if check && block::sub_hash(chunk) != meta.subs[index] {
                return Err(StoreError::Corrupt { block: id, sub: index });
            }
        }
        let from = (offset - start) as usize;
        Ok(bytes[from..from + len as usize].to_vec())
    }

    /// Drops the replica of block `id` (nothing if there is none).
    pub fn delete(&mut self, id: u64) -> Result<(), StoreError> {
        if let Some(meta) = self.index.remove(&id) {
            self.used -= meta.len;
            for path in [self.meta_path(id), self.data_path(id)] {
                match fs::remove_file(&path) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(io("cannot remove", &path, e)),
                }
            }
        }
        Ok(())
    }
}

/// Bytes after which a writer starts the disk writing back what it wrote.
pub const WRITE_BEHIND_BYTES: u64 = 8 << 20;

/// Asks the kernel to start writing `len` bytes of `file` at `offset` to disk, without waiting.
#[cfg(target_os = "linux")]
fn start_writeback(file: &File, offset: u64, len: u64) {
    use std::os::fd::AsRawFd;
    // SAFETY: a plain system call on an open descriptor; failure only loses the head start.
    unsafe {
        libc::sync_file_range(
            file.as_raw_fd(),
            offset as libc::off64_t,
            len as libc::off64_t,
            libc::SYNC_FILE_RANGE_WRITE,
        );
    }
}

#[cfg(not(target_os = "linux"))]
fn start_writeback(_file: &File, _offset: u64, _len: u64) {}

/// A replica being written.
#[derive(Debug)]
pub struct BlockWriter {
    id: u64,
    file: File,
    tmp: PathBuf,
    dir: PathBuf,
    hasher: BlockHasher,
}

impl BlockWriter {
    /// Appends `data`.
    pub fn write(&mut self, data: &[u8]) -> Result<(), StoreError> {
        if self.hasher.len() + data.len() as u64 > BLOCK_SIZE_MAX {
            return Err(StoreError::TooLarge);
        }
        self.file
            .write_all(data)
            .map_err(|e| io("cannot write", &self.tmp, e))?;
        let before = self.hasher.len();
        self.hasher.update(data);
        // Start writing back each full stretch now, so the sync at the end waits for little
        // (HDFS's dfs.datanode.sync.behind.writes).
        let written = self.hasher.len();
        if written / WRITE_BEHIND_BYTES > before / WRITE_BEHIND_BYTES {
            let end = written / WRITE_BEHIND_BYTES * WRITE_BEHIND_BYTES;
            start_writeback(&self.file, end.saturating_sub(WRITE_BEHIND_BYTES), WRITE_BEHIND_BYTES);
        }
        Ok(())
    }

    /// Syncs the replica and makes it visible: its report to the NameNode.
    pub fn finish(self, store: &mut BlockStore) -> Result<BlockReport, StoreError> {
        self.seal()?.commit(store)
    }

    /// Syncs the replica's bytes and writes its meta file beside them (both still temporary):
    /// the slow part of finishing, which needs no lock on the store.
    pub fn seal(self) -> Result<SealedBlock, StoreError> {
        let BlockWriter {
            id,
            file,
            tmp,
            dir,
            hasher,
        } = self;
        file.sync_all().map_err(|e| io("cannot sync", &tmp, e))?;
        drop(file);
        let (len, subs, hash) = hasher.finish();
        let meta = Meta { len, hash, subs };
        let meta_tmp = dir.join(format!("{id}.meta.tmp"));
        let mut f = File::create(&meta_tmp).map_err(|e| io("cannot create", &meta_tmp, e))?;
        f.write_all(&upright_core::codec::to_bytes(&meta))
            .and_then(|_| f.sync_all())
            .map_err(|e| io("cannot write", &meta_tmp, e))?;
        Ok(SealedBlock {
            id,
            tmp,
            meta_tmp,
            meta,
        })
    }
}

/// A replica whose bytes and meta file are synced, not yet visible.
#[derive(Debug)]
pub struct SealedBlock {
    id: u64,
    tmp: PathBuf,
    meta_tmp: PathBuf,
    meta: Meta,
}

impl SealedBlock {
    /// Makes the replica visible (renaming its meta file last, then syncing the directory),
    /// replacing any earlier replica of the block: its report to the NameNode.
    pub fn commit(self, store: &mut BlockStore) -> Result<BlockReport, StoreError> {
        let SealedBlock {
            id,
            tmp,
            meta_tmp,
            meta,
        } = self;
        store.delete(id)?;
        let (data, meta_path) = (store.data_path(id), store.meta_path(id));
        fs::rename(&tmp, &data).map_err(|e| io("cannot rename", &tmp, e))?;
        fs::rename(&meta_tmp, &meta_path).map_err(|e| io("cannot rename", &meta_tmp, e))?;
        if let Ok(dir) = OpenOptions::new().read(true).open(&store.dir) {
            dir.sync_all().map_err(|e| io("cannot sync", &store.dir, e))?;
        }
        let (len, hash) = (meta.len, meta.hash);
        store.used += len;
        store.index.insert(id, meta);
        Ok(BlockReport { block: id, len, hash })
    }
}

/// Testing only: flips one bit of block `id`'s stored bytes at `offset` (what the faulty
/// DataNode does), leaving its hashes as they were.
pub fn flip_stored_bit(store: &BlockStore, id: u64, offset: u64) -> Result<(), StoreError> {
    let path = store.data_path(id);
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .map_err(|e| io("cannot open", &path, e))?;
    let mut byte = [0u8];
    file.seek(SeekFrom::Start(offset))
        .and_then(|_| file.read_exact(&mut byte))
        .map_err(|e| io("cannot read", &path, e))?;
    byte[0] ^= 1;
    file.seek(SeekFrom::Start(offset))
        .and_then(|_| file.write_all(&byte))
        .and_then(|_| file.sync_all())
        .map_err(|e| io("cannot write", &path, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 13 % 251) as u8).collect()
    }

    #[test]
    fn a_replica_is_written_read_back_in_ranges_and_found_again_after_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = BlockStore::open(dir.path()).unwrap();
        let bytes = data(3 * SUB_BLOCK_BYTES + 1234);
        let mut w = store.writer(7).unwrap();
        for piece in bytes.chunks(10_000) {
            w.write(piece).unwrap();
        }
        let report = w.finish(&mut store).unwrap();
        assert_eq!(report, {
            let (len, _, hash) = block::hash_block(&bytes);
            BlockReport { block: 7, len, hash }
        });
        assert_eq!(store.read(7, 0, bytes.len() as u64).unwrap(), bytes);
        let (a, b) = (SUB_BLOCK_BYTES as u64 - 5, 2 * SUB_BLOCK_BYTES as u64 + 9);
        assert_eq!(store.read(7, a, b - a).unwrap(), bytes[a as usize..b as usize]);
        assert!(matches!(
            store.read(7, 10, bytes.len() as u64),
            Err(StoreError::OutOfRange { .. })
        ));
        assert!(matches!(store.read(8, 0, 1), Err(StoreError::NotFound(8))));
        // A write a crash cut short leaves a temporary file, which the next open removes.
        let mut cut = store.writer(9).unwrap();
        cut.write(b"half").unwrap();
        drop(cut);
        drop(store);
        let mut store = BlockStore::open(dir.path()).unwrap();
        assert_eq!(store.reports(), vec![report]);
        assert_eq!(store.used(), bytes.len() as u64);
        assert!(!dir.path().join("9.data.tmp").exists());
        store.delete(7).unwrap();
        assert!(store.reports().is_empty() && store.used() == 0);
        assert!(BlockStore::open(dir.path()).unwrap().reports().is_empty());
    }

    #[test]
    fn a_flipped_bit_is_caught_by_reads_of_its_sub_block() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = BlockStore::open(dir.path()).unwrap();
        let bytes = data(2 * SUB_BLOCK_BYTES + 100);
        store.put(1, &bytes).unwrap();
        store.put(2, &bytes).unwrap();
        flip_stored_bit(&store, 1, SUB_BLOCK_BYTES as u64 + 17).unwrap();
        assert!(matches!(
            store.read(1, 0, bytes.len() as u64),
            Err(StoreError::Corrupt { block: 1, sub: 1 })
        ));
        // Sub-blocks the flip is not in still read.
        assert_eq!(store.read(1, 0, 100).unwrap(), bytes[..100]);
        assert_eq!(store.read(2, 0, bytes.len() as u64).unwrap(), bytes);
    }
}

//! The on-disk page store of a paged service ([`upright_core::pages::PageStore`]): the pages as
//! of the last checkpoint live in a file, so a service's state may be larger than memory (the
//! execution stage caches a bounded part of it).
//!
//! Layout, in the directory the store is opened on:
//! - `data`: two slots of [`PAGE_BYTES_MAX`] bytes per page (`(2 * index + copy) *
//!   PAGE_BYTES_MAX`), a sparse file: only the bytes of written pages take disk space. A
//!   checkpoint writes a changed page into the slot its committed version does not use, so the
//!   committed version stays intact until the checkpoint commits.
//! - `record.0`, `record.1`: the checkpoint record committed with the pages (header: seqno,
//!   length, CRC-32 of the bytes; then the bytes), alternately, so that the committed one stays
//!   intact while the next is written.
//! - `journal`: records `WRITE(index, copy, len)` and `COMMIT(seqno, pages, record)` (`record`:
//!   0 none, 1 or 2 the record file), each with a CRC-32. A commit writes and syncs the record
//!   file, syncs `data`, appends the checkpoint's records and syncs the journal: the commit
//!   record is what makes a checkpoint's pages and record the committed ones. Opening replays the journal up
//!   to its last intact commit and cuts off anything after it (a torn or uncommitted tail).
//!   When the journal grows past [`JOURNAL_REWRITE_BYTES`] and four times what the committed
//!   state needs, it is rewritten (one record per page, then the commit) into a new file that
//!   replaces it atomically.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use upright_core::limits::PAGE_BYTES_MAX;
use upright_core::pages::PageStore;

use crate::storage::sync_dir;

/// Journal size past which (and past four times the committed state's records) the journal is
/// rewritten.
pub const JOURNAL_REWRITE_BYTES: u64 = 64 << 20;

const WRITE: u8 = 1;
const COMMIT: u8 = 2;
/// kind, then 17 bytes (index 8, len 8, copy 1 | seqno 8, pages 8, record file 1), CRC.
const RECORD_BYTES: usize = 1 + 17 + 4;

/// Pages on disk with their journal.
pub struct FilePageStore {
    dir: PathBuf,
    data: File,
    journal: File,
    journal_bytes: u64,
    /// Per committed page: (slot copy, length).
    committed: Vec<(u8, u32)>,
    seqno: u64,
    /// The committed record's file (0: none; 1: `record.0`; 2: `record.1`).
    record_file: u8,
    records: [File; 2],
    /// Written since the last commit: (index, copy, length).
    pending: Vec<(u64, u8, u32)>,
    rewrite_bytes: u64,
}

fn record(kind: u8, a: u64, b: u64, c: u8) -> [u8; RECORD_BYTES] {
    let mut out = [0u8; RECORD_BYTES];
    out[0] = kind;
    out[1..9].copy_from_slice(&a.to_le_bytes());
    out[9..17].copy_from_slice(&b.to_le_bytes());
    out[17] = c;
    let crc = crc32fast::hash(&out[..18]);
    out[18..].copy_from_slice(&crc.to_le_bytes());
    out
}

fn write_record(index: u64, copy: u8, len: u32) -> [u8; RECORD_BYTES] {
    record(WRITE, index, len as u64, copy)
}

fn commit_record(seqno: u64, pages: u64, record_file: u8) -> [u8; RECORD_BYTES] {
    record(COMMIT, seqno, pages, record_file)
}

/// Header of a record file: seqno, length, CRC-32 of the bytes.
const RECORD_HEADER_BYTES: usize = 8 + 8 + 4;

/// What a COMMIT does to the committed table, at commit time and when the journal is replayed:
/// the page count becomes `pages` and each write's slot and length become its page's.
fn apply_commit(committed: &mut Vec<(u8, u32)>, writes: impl Iterator<Item = (u64, u8, u32)>, pages: usize) {
    if committed.len() < pages {
        committed.resize(pages, (0, 0));
    }
    for (index, copy, len) in writes {
        if let Some(slot) = committed.get_mut(index as usize) {
            *slot = (copy, len);
        }
    }
    committed.truncate(pages);
}

fn invalid(what: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what)
}

impl FilePageStore {
    /// Opens (creating if needed) the store in `dir`, replaying its journal to the last commit.
    pub fn open(dir: &Path) -> io::Result<FilePageStore> {
        std::fs::create_dir_all(dir)?;
        let open = |name: &str| {
            OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(dir.join(name))
        };
        let data = open("data")?;
        let records = [open("record.0")?, open("record.1")?];
        // The record files' names are durable before any commit names them.
        sync_dir(dir)?;
        let mut journal = open("journal")?;
        let mut bytes = Vec::new();
        journal.read_to_end(&mut bytes)?;
        let mut committed: Vec<(u8, u32)> = Vec::new();
        let mut seqno = 0;
        let mut record_file = 0;
        let mut since_commit: Vec<(u64, u8, u32)> = Vec::new();
        let mut good_end = 0usize;
        for (n, rec) in bytes.chunks_exact(RECORD_BYTES).enumerate() {
            let crc = u32::from_le_bytes(rec[18..].try_into().expect("4 bytes"));
            if crc32fast::hash(&rec[..18]) != crc {
                break; // a torn tail
            }
            let a = u64::from_le_bytes(rec[1..9].try_into().expect("8 bytes"));
            let b = u64::from_le_bytes(rec[9..17].try_into().expect("8 bytes"));
            match rec[0] {
                WRITE if b as usize <= PAGE_BYTES_MAX && rec[17] < 2 => since_commit.push((a, rec[17], b as u32)),
                COMMIT => {
                    let pages = usize::try_from(b).map_err(|_| invalid(format!("page count {b} in the journal")))?;
                    apply_commit(&mut committed, since_commit.drain(..), pages);
                    seqno = a;
                    record_file = if rec[17] <= 2 { rec[17] } else { 0 };
                    good_end = (n + 1) * RECORD_BYTES;
                }
                kind => return Err(invalid(format!("journal record {n} has kind {kind}"))),
            }
        }
        if good_end < bytes.len() {
            journal.set_len(good_end as u64)?;
            journal.sync_data()?;
        }
        Ok(FilePageStore {
            dir: dir.to_path_buf(),
            data,
            journal,
            journal_bytes: good_end as u64,
            committed,
            seqno,
            record_file,
            records,
            pending: Vec::new(),
            rewrite_bytes: JOURNAL_REWRITE_BYTES,
        })
    }

    fn offset(index: u64, copy: u8) -> u64 {
        (2 * index + copy as u64) * PAGE_BYTES_MAX as u64
    }

    fn append(&mut self, records: &[u8]) -> io::Result<()> {
        self.journal.write_all_at(records, self.journal_bytes)?;
        self.journal_bytes += records.len() as u64;
        Ok(())
    }

    /// Rewrites the journal as one record per committed page and the commit, atomically.
    fn rewrite_journal(&mut self) -> io::Result<()> {
        let path = self.dir.join("journal.new");
        let mut out = Vec::with_capacity((self.committed.len() + 1) * RECORD_BYTES);
        for (index, (copy, len)) in self.committed.iter().enumerate() {
            if *len > 0 {
                out.extend_from_slice(&write_record(index as u64, *copy, *len));
            }
        }
        out.extend_from_slice(&commit_record(
            self.seqno,
            self.committed.len() as u64,
            self.record_file,
        ));
        let mut file = File::create(&path)?;
        file.write_all(&out)?;
        file.sync_all()?;
        std::fs::rename(&path, self.dir.join("journal"))?;
        sync_dir(&self.dir)?;
        self.journal = OpenOptions::new()
            .read(true)
            .write(true)
            .open(self.dir.join("journal"))?;
        self.journal_bytes = out.len() as u64;
        Ok(())
    }

    /// Sets the journal size past which it may be rewritten (default [`JOURNAL_REWRITE_BYTES`]).
    pub fn set_journal_rewrite_bytes(&mut self, bytes: u64) {
        self.rewrite_bytes = bytes;
    }

    /// Bytes of the journal now.
    pub fn journal_bytes(&self) -> u64 {
        self.journal_bytes
    }
}

impl PageStore for FilePageStore {
    fn committed(&self) -> (u64, Vec<u32>) {
        (self.seqno, self.committed.iter().map(|(_, len)| *len).collect())
    }

    fn read(&self, index: u64) -> io::Result<Bytes> {
        let Some(&(copy, len)) = self.committed.get(index as usize) else {
            return Ok(Bytes::new());
        };
        let mut buf = vec![0u8; len as usize];
        self.data.read_exact_at(&mut buf, Self::offset(index, copy))?;
        Ok(Bytes::from(buf))
    }

    fn committed_record(&self) -> Bytes {
        let Some(file) = self.record_file.checked_sub(1).map(|k| &self.records[k as usize]) else {
            return Bytes::new();
        };
        let mut header = [0u8; RECORD_HEADER_BYTES];
        if file.read_exact_at(&mut header, 0).is_err() {
            return Bytes::new();
        }
        let seqno = u64::from_le_bytes(header[..8].try_into().expect("8 bytes"));
        let len = u64::from_le_bytes(header[8..16].try_into().expect("8 bytes"));
        let crc = u32::from_le_bytes(header[16..].try_into().expect("4 bytes"));
        let Some(len) = usize::try_from(len)
            .ok()
            .filter(|l| *l <= usize::MAX - RECORD_HEADER_BYTES)
        else {
            return Bytes::new();
        };
        // A length the file cannot hold is a torn or corrupted header.
        let on_disk = file.metadata().map_or(0, |m| m.len());
        if seqno != self.seqno || on_disk < (RECORD_HEADER_BYTES + len) as u64 {
            return Bytes::new();
        }
        let mut bytes = vec![0u8; len];
        if file.read_exact_at(&mut bytes, RECORD_HEADER_BYTES as u64).is_err() || crc32fast::hash(&bytes) != crc {
            return Bytes::new();
        }
        Bytes::from(bytes)
    }

    fn write(&mut self, index: u64, bytes: &[u8]) -> io::Result<()> {
        if bytes.len() > PAGE_BYTES_MAX {
            return Err(invalid(format!("page {index} has {} bytes", bytes.len())));
        }
        let copy = match self.committed.get(index as usize) {
            Some((copy, len)) if *len > 0 => 1 - copy,
            _ => 0,
        };
        self.data.write_all_at(bytes, Self::offset(index, copy))?;
        self.pending.push((index, copy, bytes.len() as u32));
        Ok(())
    }

    fn commit(&mut self, seqno: u64, len: u64, record: &[u8]) -> io::Result<()> {
        let pages = usize::try_from(len).map_err(|_| invalid(format!("page count {len}")))?;
        let record_file = if record.is_empty() {
            0
        } else {
            // The file the committed record does not use.
            let file = if self.record_file == 1 { 2 } else { 1 };
            let mut out = Vec::with_capacity(RECORD_HEADER_BYTES + record.len());
            out.extend_from_slice(&seqno.to_le_bytes());
            out.extend_from_slice(&(record.len() as u64).to_le_bytes());
            out.extend_from_slice(&crc32fast::hash(record).to_le_bytes());
            out.extend_from_slice(record);
            let f = &self.records[file as usize - 1];
            f.set_len(0)?;
            f.write_all_at(&out, 0)?;
            f.sync_data()?;
            file
        };
        self.data.sync_data()?;
        let mut records = Vec::with_capacity((self.pending.len() + 1) * RECORD_BYTES);
        for (index, copy, bytes) in &self.pending {
            records.extend_from_slice(&write_record(*index, *copy, *bytes));
        }
        records.extend_from_slice(&commit_record(seqno, len, record_file));
        self.append(&records)?;
        self.journal.sync_data()?;
        apply_commit(&mut self.committed, self.pending.drain(..), pages);
        self.seqno = seqno;
        self.record_file = record_file;
        let needed = (self.committed.len() as u64 + 1) * RECORD_BYTES as u64;
        if self.journal_bytes > self.rewrite_bytes && self.journal_bytes > 4 * needed {
            self.rewrite_journal()?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use upright_core::pages::Pages;

    fn b(s: &str) -> Bytes {
        Bytes::copy_from_slice(s.as_bytes())
    }

    #[test]
    fn committed_pages_survive_a_reopen_and_uncommitted_writes_do_not() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = FilePageStore::open(dir.path()).unwrap();
        assert_eq!(store.committed(), (0, vec![]));
        store.write(0, b"zero").unwrap();
        store.write(3, b"three").unwrap();
        store.commit(8, 4, &[]).unwrap();
        store.write(0, b"ZERO!").unwrap();
        assert_eq!(
            store.read(0).unwrap(),
            b("zero"),
            "the committed version until the commit"
        );
        drop(store); // a crash before the commit
        let mut store = FilePageStore::open(dir.path()).unwrap();
        assert_eq!(store.committed(), (8, vec![4, 0, 0, 5]));
        assert_eq!(store.read(0).unwrap(), b("zero"));
        assert_eq!(store.read(3).unwrap(), b("three"));
        store.write(0, b"ZERO!").unwrap();
        store.commit(16, 2, &[]).unwrap();
        let store = FilePageStore::open(dir.path()).unwrap();
        assert_eq!(
            store.committed(),
            (16, vec![5, 0]),
            "the commit truncated pages 2 and 3"
        );
        assert_eq!(store.read(0).unwrap(), b("ZERO!"));
    }

    /// Cuts the last `bytes` off the journal in `dir` (a crash before they reached the disk).
    fn cut_journal(dir: &Path, bytes: u64) {
        let journal = dir.join("journal");
        let len = std::fs::metadata(&journal).unwrap().len();
        OpenOptions::new()
            .write(true)
            .open(&journal)
            .unwrap()
            .set_len(len - bytes)
            .unwrap();
    }

    #[test]
    fn the_record_is_committed_with_the_pages_and_survives_a_torn_next_commit() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = FilePageStore::open(dir.path()).unwrap();
        assert_eq!(store.committed_record(), Bytes::new());
        store.write(0, b"a").unwrap();
        store.commit(4, 1, b"record of 4").unwrap();
        assert_eq!(store.committed_record(), b("record of 4"));
        store.write(0, b"b").unwrap();
        store.commit(8, 1, b"record of 8").unwrap();
        drop(store);
        let mut store = FilePageStore::open(dir.path()).unwrap();
        assert_eq!((store.committed().0, store.committed_record()), (8, b("record of 8")));
        // The next commit's record is written, but its COMMIT never reaches the journal (a
        // crash in between): the committed record is still 8's, in the other file.
        store.write(0, b"c").unwrap();
        store.commit(12, 1, b"record of 12").unwrap();
        drop(store);
        cut_journal(dir.path(), 2 * RECORD_BYTES as u64);
        let store = FilePageStore::open(dir.path()).unwrap();
        assert_eq!((store.committed().0, store.committed_record()), (8, b("record of 8")));
        assert_eq!(store.read(0).unwrap(), b("b"));
        // A record file whose bytes no longer match its CRC is no record.
        drop(store);
        let file = std::fs::read(dir.path().join("record.1")).unwrap();
        let name = if file.ends_with(b"record of 8") {
            "record.1"
        } else {
            "record.0"
        };
        let f = OpenOptions::new().write(true).open(dir.path().join(name)).unwrap();
        f.write_all_at(b"X", RECORD_HEADER_BYTES as u64).unwrap();
        let store = FilePageStore::open(dir.path()).unwrap();
        assert_eq!(store.committed_record(), Bytes::new());
    }

    #[test]
    fn a_torn_journal_tail_is_cut_off_at_the_last_commit() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = FilePageStore::open(dir.path()).unwrap();
        store.write(1, b"one").unwrap();
        store.commit(1, 2, &[]).unwrap();
        store.write(1, b"uno").unwrap();
        store.commit(2, 2, &[]).unwrap();
        drop(store);
        // Tear the last commit record in half.
        cut_journal(dir.path(), 10);
        let store = FilePageStore::open(dir.path()).unwrap();
        assert_eq!(store.committed(), (1, vec![0, 3]));
        assert_eq!(
            store.read(1).unwrap(),
            b("one"),
            "the slot of the torn commit was the other one"
        );
        assert_eq!(store.journal_bytes(), 2 * RECORD_BYTES as u64);
    }

    #[test]
    fn the_journal_is_rewritten_when_it_outgrows_the_state() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = FilePageStore::open(dir.path()).unwrap();
        store.set_journal_rewrite_bytes(4096);
        // Many commits of one page: the journal grows by two records each.
        let commits = 4096 / (2 * RECORD_BYTES as u64) + 2;
        for seqno in 1..=commits {
            store.write(0, format!("v{seqno}").as_bytes()).unwrap();
            store.commit(seqno, 1, format!("r{seqno}").as_bytes()).unwrap();
        }
        assert!(store.journal_bytes() < 4096, "rewritten: {}", store.journal_bytes());
        let store = FilePageStore::open(dir.path()).unwrap();
        assert_eq!(store.committed().0, commits);
        assert_eq!(
            store.committed_record(),
            b(&format!("r{commits}")),
            "the rewrite kept the record"
        );
        assert_eq!(store.read(0).unwrap(), b(&format!("v{commits}")));
    }

    #[test]
    fn pages_over_a_store_keep_at_most_the_cache_in_memory_and_read_the_rest_back() {
        let dir = tempfile::tempdir().unwrap();
        let page = |i: u64| Bytes::from(vec![i as u8; 4096]);
        let mut pages = Pages::from_pages((0..256).map(page).collect());
        let store = FilePageStore::open(dir.path()).unwrap();
        assert_eq!(pages.attach_store(Box::new(store), 64 * 1024).unwrap(), None);
        for i in 0..256 {
            assert_eq!(pages.get(i).unwrap(), page(i));
        }
        assert!(
            pages.cached_bytes() <= 64 * 1024,
            "cache bounded: {}",
            pages.cached_bytes()
        );
        pages.set(7, b("seven"));
        assert_eq!(
            pages.checkpointed(7).unwrap(),
            page(7),
            "the stored version is the checkpointed one"
        );
        let changed = pages.freeze();
        pages.write_back(&changed, 8, b"record of 8").unwrap();
        drop(pages);
        let mut again = Pages::new();
        let store = FilePageStore::open(dir.path()).unwrap();
        assert_eq!(again.attach_store(Box::new(store), 64 * 1024).unwrap(), Some(8));
        assert_eq!(again.store_record(), Some(b("record of 8")));
        assert_eq!(again.len(), 256);
        assert_eq!(again.get(7).unwrap(), b("seven"));
        assert_eq!(again.get(200).unwrap(), page(200));
        assert_eq!(again.total_bytes(), 255 * 4096 + 5);
    }

    #[test]
    fn pages_beyond_4_gib_of_offsets_are_written_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = FilePageStore::open(dir.path()).unwrap();
        // Page 40 000's second slot starts past 4 GiB into the (sparse) data file.
        let far = 40_000u64;
        assert!(FilePageStore::offset(far, 1) > 4 << 30);
        store.write(far, b"first").unwrap();
        store.commit(1, far + 1, &[]).unwrap();
        store.write(far, b"second").unwrap();
        store.commit(2, far + 1, &[]).unwrap();
        let store = FilePageStore::open(dir.path()).unwrap();
        assert_eq!(store.read(far).unwrap(), b("second"));
        assert_eq!(store.committed().1.len() as u64, far + 1);
    }
}

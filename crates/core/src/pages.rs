//! A service's paged state (PBFT thesis 5.3): the part of a service's state that the platform
//! checkpoints incrementally and transfers by difference.
//!
//! A paged service keeps its objects in [`Pages`] (one object per page, or several packed in one)
//! and hands them to the execution stage through [`crate::service::Service::pages`]. [`Pages`]
//! records, copy-on-write, the version of every page changed since the last checkpoint, so the
//! execution stage can serve the checkpointed version to a peer while execution goes on, and knows
//! which pages a checkpoint must hash: a checkpoint costs time proportional to the pages changed
//! since the previous one, not to the state's size.
//!
//! Pages are [`Bytes`]: the checkpointed version of a page the service replaced is the old
//! `Bytes`, kept alive by reference count, not a copy.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap, VecDeque};

use bytes::Bytes;

use crate::crypto::Digest;
use crate::limits::PAGE_BYTES_MAX;
use crate::page_tree::PageTree;

/// Where a paged state lives when it does not fit in memory: the pages as of the last
/// checkpoint, durably. The runtime's is a file (`upright_node::pages::FilePageStore`); a store
/// keeps the committed version of every page readable until the next commit, so that a crash
/// while a checkpoint is being written leaves the previous one intact.
pub trait PageStore: Send {
    /// The committed state: the sequence number of the checkpoint it belongs to and each page's
    /// length (the page count is the list's length).
    fn committed(&self) -> (u64, Vec<u32>);
    /// The committed version of page `index` (empty if it has none).
    fn read(&self, index: u64) -> std::io::Result<Bytes>;
    /// The record committed with the pages (empty if none, or if it cannot be read back intact:
    /// the caller then treats the pages as no checkpoint's).
    fn committed_record(&self) -> Bytes;
    /// Writes the next version of page `index` (invisible until [`PageStore::commit`]; each page
    /// at most once per commit).
    fn write(&mut self, index: u64, bytes: &[u8]) -> std::io::Result<()>;
    /// Makes the pages written since the last commit, the page count `len` and `record` (the
    /// checkpoint's own record, which describes the pages) the committed state of checkpoint
    /// `seqno`, durably and atomically: after a crash either all of it or the previous commit
    /// is what [`PageStore::committed`] and [`PageStore::committed_record`] return.
    fn commit(&mut self, seqno: u64, len: u64, record: &[u8]) -> std::io::Result<()>;
}

/// One page: in memory (changed since it was last stored, or no store), or in the store with its
/// length (its bytes then come from the cache or the store).
#[derive(Clone, Debug)]
enum Slot {
    Memory(Bytes),
    Stored(u32),
}

impl Slot {
    fn len(&self) -> u64 {
        match self {
            Slot::Memory(b) => b.len() as u64,
            Slot::Stored(len) => *len as u64,
        }
    }
}

/// Stored pages recently read or written, least recently used dropped first.
#[derive(Default)]
struct Cache {
    pages: HashMap<u64, (Bytes, u64)>,
    order: BTreeMap<u64, u64>,
    tick: u64,
    bytes: u64,
}

impl Cache {
    fn get(&mut self, index: u64) -> Option<Bytes> {
        let (bytes, used) = self.pages.get_mut(&index)?;
        self.order.remove(used);
        self.tick += 1;
        *used = self.tick;
        self.order.insert(self.tick, index);
        Some(bytes.clone())
    }

    fn insert(&mut self, index: u64, bytes: Bytes, limit: u64) {
        self.remove(index);
        self.tick += 1;
        self.bytes += bytes.len() as u64;
        self.order.insert(self.tick, index);
        self.pages.insert(index, (bytes, self.tick));
        while self.bytes > limit {
            let Some((_, oldest)) = self.order.pop_first() else {
                break;
            };
            if let Some((b, _)) = self.pages.remove(&oldest) {
                self.bytes -= b.len() as u64;
            }
        }
    }

    fn remove(&mut self, index: u64) {
        if let Some((b, used)) = self.pages.remove(&index) {
            self.order.remove(&used);
            self.bytes -= b.len() as u64;
        }
    }
}

/// The version of a paged state as of an older checkpoint, kept as the difference from the next
/// newer one: per page changed between them, its version then (`None`: it did not exist).
#[derive(Debug, Default)]
struct Older {
    changed: BTreeMap<u64, Option<Bytes>>,
    len: u64,
}

/// Pages of a service's state, with the checkpointed version of the pages changed since the last
/// checkpoint ([`Pages::freeze`]) and, if asked ([`Pages::keep_older`]), the versions of a few
/// checkpoints before it. Without a store every page is in memory; with one
/// ([`Pages::attach_store`]) the pages as of the last checkpoint live in the store and at most
/// [`crate::limits::PAGE_CACHE_BYTES`] of them are cached, so the state may be larger than memory (the pages
/// changed since the last checkpoint stay in memory until the next one writes them).
#[derive(Default)]
pub struct Pages {
    live: Vec<Slot>,
    /// Per page changed since the last freeze, its version then (`None`: it did not exist).
    frozen: BTreeMap<u64, Option<Slot>>,
    /// Page count at the last freeze.
    frozen_len: u64,
    /// The checkpoints before the last freeze, newest first (at most `older_kept`).
    older: VecDeque<Older>,
    older_kept: usize,
    /// Sum of the live pages' lengths.
    bytes: u64,
    store: Option<Box<dyn PageStore>>,
    cache: RefCell<Cache>,
    cache_limit: u64,
}

impl std::fmt::Debug for Pages {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pages")
            .field("pages", &self.live.len())
            .field("bytes", &self.bytes)
            .field("changed", &self.frozen.len())
            .field("stored", &self.store.is_some())
            .finish()
    }
}

fn read_failed(index: u64, e: std::io::Error) -> ! {
    // A page store that cannot read back what it committed has lost state the checkpoint's
    // digest vouches for: stop rather than execute on something else.
    panic!("page store: cannot read page {index}: {e}")
}

impl Pages {
    /// No pages.
    pub fn new() -> Pages {
        Pages::default()
    }

    /// A state made of `pages` as its first checkpointed version (a service's initial state).
    pub fn from_pages(pages: Vec<Bytes>) -> Pages {
        for (i, page) in pages.iter().enumerate() {
            assert!(
                page.len() <= PAGE_BYTES_MAX,
                "page {i} has {} bytes, above PAGE_BYTES_MAX",
                page.len()
            );
        }
        let bytes = pages.iter().map(|p| p.len() as u64).sum();
        Pages {
            frozen_len: pages.len() as u64,
            live: pages.into_iter().map(Slot::Memory).collect(),
            bytes,
            ..Pages::default()
        }
    }

    /// Moves the pages into `store`, with a cache of at most `cache_bytes` (at start, before
    /// anything is frozen or changed). If the store holds a committed state, that replaces the
    /// service's initial pages and its sequence number is returned; otherwise the initial pages
    /// are written into it as the state at sequence number 0.
    pub fn attach_store(&mut self, mut store: Box<dyn PageStore>, cache_bytes: u64) -> std::io::Result<Option<u64>> {
        let (seqno, lens) = store.committed();
        self.cache = RefCell::new(Cache::default());
        self.cache_limit = cache_bytes;
        self.frozen.clear();
        self.older.clear();
        let restored = if seqno > 0 || !lens.is_empty() {
            self.live = lens.iter().map(|len| Slot::Stored(*len)).collect();
            self.bytes = lens.iter().map(|l| *l as u64).sum();
            Some(seqno)
        } else {
            for (i, slot) in self.live.iter_mut().enumerate() {
                if let Slot::Memory(bytes) = slot {
                    store.write(i as u64, bytes)?;
                    *slot = Slot::Stored(bytes.len() as u32);
                }
            }
            store.commit(0, self.live.len() as u64, &[])?;
            None
        };
        self.frozen_len = self.live.len() as u64;
        self.store = Some(store);
        Ok(restored)
    }

    /// Whether the pages live in a store.
    pub fn has_store(&self) -> bool {
        self.store.is_some()
    }

    /// The record the store committed with its pages (`None` without a store).
    pub fn store_record(&self) -> Option<Bytes> {
        self.store.as_ref().map(|s| s.committed_record())
    }

    /// Number of pages.
    pub fn len(&self) -> u64 {
        self.live.len() as u64
    }

    /// Whether there are no pages.
    pub fn is_empty(&self) -> bool {
        self.live.is_empty()
    }

    /// Sum of the pages' lengths.
    pub fn total_bytes(&self) -> u64 {
        self.bytes
    }

    /// Bytes of stored pages held in the cache now.
    pub fn cached_bytes(&self) -> u64 {
        self.cache.borrow().bytes
    }

    fn load(&self, index: u64, slot: &Slot) -> Bytes {
        match slot {
            Slot::Memory(bytes) => bytes.clone(),
            Slot::Stored(0) => Bytes::new(),
            Slot::Stored(_) => {
                if let Some(bytes) = self.cache.borrow_mut().get(index) {
                    return bytes;
                }
                let store = self.store.as_ref().expect("stored pages have a store");
                let bytes = store.read(index).unwrap_or_else(|e| read_failed(index, e));
                self.cache.borrow_mut().insert(index, bytes.clone(), self.cache_limit);
                bytes
            }
        }
    }

    /// Page `index` (an empty page if it was never written), `None` past the end.
    pub fn get(&self, index: u64) -> Option<Bytes> {
        let slot = self.live.get(usize::try_from(index).ok()?)?;
        Some(self.load(index, slot))
    }

    /// Sets page `index`, growing the state with empty pages if it is past the end.
    ///
    /// # Panics
    /// If `bytes` is longer than [`PAGE_BYTES_MAX`] (a service bug: it chooses its page size).
    pub fn set(&mut self, index: u64, bytes: Bytes) {
        assert!(
            bytes.len() <= PAGE_BYTES_MAX,
            "page of {} bytes is above PAGE_BYTES_MAX",
            bytes.len()
        );
        let i = usize::try_from(index).expect("page index fits in memory");
        while self.live.len() <= i {
            let new = self.live.len() as u64;
            self.frozen.entry(new).or_insert(None);
            self.live.push(Slot::Memory(Bytes::new()));
        }
        self.bytes = self.bytes - self.live[i].len() + bytes.len() as u64;
        let old = std::mem::replace(&mut self.live[i], Slot::Memory(bytes));
        // A stored page's checkpointed version stays in the store until the next commit; its
        // cached copy is that version, so it may stay.
        self.frozen.entry(index).or_insert(Some(old));
    }

    /// Drops the pages from `len` on.
    pub fn truncate(&mut self, len: u64) {
        while self.len() > len {
            let index = self.len() - 1;
            let old = self.live.pop().expect("not empty");
            self.bytes -= old.len();
            self.frozen.entry(index).or_insert(Some(old));
        }
    }

    /// Number of pages changed since the last checkpoint.
    pub fn changed(&self) -> usize {
        self.frozen.len()
    }

    /// The pages changed since the last checkpoint, ascending (some may be past the end).
    pub fn changed_indices(&self) -> Vec<u64> {
        self.frozen.keys().copied().collect()
    }

    /// Page `index` as of the last checkpoint (`None` if it did not exist then).
    pub fn checkpointed(&self, index: u64) -> Option<Bytes> {
        match self.frozen.get(&index) {
            Some(old) => old.as_ref().map(|slot| self.load(index, slot)),
            None if index < self.frozen_len => self.get(index),
            None => None,
        }
    }

    /// Page count as of the last checkpoint.
    pub fn checkpointed_len(&self) -> u64 {
        self.frozen_len
    }

    /// Keeps the versions of the `generations` checkpoints before the last one as well (from the
    /// next [`Pages::freeze`] on), so that a peer can be served any of them while execution goes
    /// on; costs the pages changed across those checkpoints, held in memory.
    pub fn keep_older(&mut self, generations: usize) {
        self.older_kept = generations;
        self.older.truncate(generations);
    }

    /// Forgets the older checkpoints' versions (the state was replaced: they are another
    /// history's).
    pub fn forget_older(&mut self) {
        self.older.clear();
    }

    /// How many older checkpoints' versions are kept now.
    pub fn older_count(&self) -> usize {
        self.older.len()
    }

    /// Page count as of checkpoint `generation` (0: the last one, 1: the one before, ...).
    pub fn len_at(&self, generation: usize) -> Option<u64> {
        match generation {
            0 => Some(self.frozen_len),
            g => self.older.get(g - 1).map(|o| o.len),
        }
    }

    /// Page `index` as of checkpoint `generation` (0 is [`Pages::checkpointed`]); `None` if it
    /// did not exist then or that checkpoint is not kept.
    pub fn checkpointed_at(&self, generation: usize, index: u64) -> Option<Bytes> {
        if index >= self.len_at(generation)? {
            return None;
        }
        // The first difference found walking from that checkpoint towards the newest.
        for older in self.older.iter().take(generation).rev() {
            if let Some(version) = older.changed.get(&index) {
                return version.clone();
            }
        }
        self.checkpointed(index)
    }

    /// Puts the state back as of the last checkpoint ([`Pages::freeze`]): every change since is
    /// undone (a tentatively executed batch rolled back). The older checkpoints' versions are
    /// untouched.
    pub fn revert(&mut self) {
        let frozen = std::mem::take(&mut self.frozen);
        let len = usize::try_from(self.frozen_len).expect("page count fits in memory");
        self.live.resize_with(len, || Slot::Memory(Bytes::new()));
        for (index, old) in frozen {
            if let (Some(old), Some(slot)) = (old, self.live.get_mut(index as usize)) {
                *slot = old;
            }
        }
        self.bytes = self.live.iter().map(Slot::len).sum();
    }

    /// Makes the current state the checkpointed one; returns the pages changed since the previous
    /// checkpoint, ascending (some may now be past the end: truncated).
    pub fn freeze(&mut self) -> Vec<u64> {
        let changed = std::mem::take(&mut self.frozen);
        let indices = changed.keys().copied().collect();
        if self.older_kept > 0 {
            // The previous checkpoint becomes an older one. A stored page's version is readable
            // only until the next commit: load it now.
            let changed = changed
                .into_iter()
                .map(|(index, old)| (index, old.map(|slot| self.load(index, &slot))))
                .collect();
            self.older.push_front(Older {
                changed,
                len: self.frozen_len,
            });
            self.older.truncate(self.older_kept);
        }
        self.frozen_len = self.len();
        indices
    }

    /// With a store: writes the pages in memory among `indices` (the ones the last
    /// [`Pages::freeze`] reported) and commits them as checkpoint `seqno` with the checkpoint's
    /// `record` (see [`PageStore::commit`]); they then count
    /// against the cache like any stored page. Without a store: nothing.
    pub fn write_back(&mut self, indices: &[u64], seqno: u64, record: &[u8]) -> std::io::Result<()> {
        let Some(store) = self.store.as_mut() else {
            return Ok(());
        };
        let mut written = Vec::new();
        for &index in indices {
            // A stored page is in the store already; one truncated away is dropped by the
            // commit's page count.
            if let Some(Slot::Memory(bytes)) = self.live.get(index as usize) {
                store.write(index, bytes)?;
                written.push((index, bytes.clone()));
            }
        }
        store.commit(seqno, self.live.len() as u64, record)?;
        let mut cache = self.cache.borrow_mut();
        for (index, bytes) in written {
            // Only now, committed, is the page the store's.
            self.live[index as usize] = Slot::Stored(bytes.len() as u32);
            if bytes.is_empty() {
                cache.remove(index);
            } else {
                cache.insert(index, bytes, self.cache_limit);
            }
        }
        Ok(())
    }
}

/// The digest of page `index` holding `bytes` as the page tree names it (an empty page is
/// [`crate::page_tree::EMPTY_PAGE`]).
pub fn page_digest(index: u64, bytes: &[u8]) -> Digest {
    PageTree::page_digest(index, bytes)
}

/// A page tree over every page of `pages` (hashes the whole state: at start only).
pub fn tree_of(pages: &Pages) -> PageTree {
    let mut tree = PageTree::new();
    for index in 0..pages.len() {
        let page = pages.get(index).expect("index below len");
        tree.set(index, page_digest(index, &page));
    }
    tree.root();
    tree
}

/// One incremental checkpoint of paged state: [`Pages::freeze`], then the changed pages hashed
/// into `tree`. What it costs is what a checkpoint costs (the benchmark times this).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PageCheckpoint {
    /// The new root.
    pub root: Digest,
    /// Page count.
    pub pages: u64,
    /// Sum of the pages' lengths.
    pub bytes: u64,
    /// Each changed page's new contents (`None`: truncated away), ascending: what to persist.
    pub changed: Vec<(u64, Option<Bytes>)>,
}

impl PageCheckpoint {
    /// Freezes `pages` and brings `tree` (the tree of the previous checkpoint) up to date.
    pub fn take(tree: &mut PageTree, pages: &mut Pages) -> PageCheckpoint {
        let indices = pages.freeze();
        let root = rehash(tree, pages, &indices);
        PageCheckpoint {
            root,
            pages: pages.len(),
            bytes: pages.total_bytes(),
            changed: indices.into_iter().map(|i| (i, pages.get(i))).collect(),
        }
    }
}

/// Hashes pages `indices` of `pages` into `tree`, drops the tree's pages past the end of `pages`
/// (indices there need nothing more) and returns the root.
pub fn rehash(tree: &mut PageTree, pages: &Pages, indices: &[u64]) -> Digest {
    for &index in indices {
        if let Some(page) = pages.get(index) {
            tree.set(index, page_digest(index, &page));
        }
    }
    if tree.pages() > pages.len() {
        tree.truncate(pages.len());
    }
    tree.root()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(s: &str) -> Bytes {
        Bytes::copy_from_slice(s.as_bytes())
    }

    #[test]
    fn the_checkpointed_version_survives_changes_until_the_next_freeze() {
        let mut pages = Pages::from_pages(vec![b("a"), b("b")]);
        pages.set(1, b("B"));
        pages.set(1, b("BB"));
        pages.set(3, b("d"));
        assert_eq!(pages.checkpointed(1), Some(b("b")));
        assert_eq!(pages.checkpointed(2), None);
        assert_eq!(pages.checkpointed(3), None);
        assert_eq!(pages.checkpointed(0), Some(b("a")));
        assert_eq!(pages.get(2), Some(Bytes::new()));
        assert_eq!(pages.total_bytes(), 1 + 2 + 1);
        assert_eq!(pages.freeze(), vec![1, 2, 3]);
        assert_eq!(pages.checkpointed(1), Some(b("BB")));
        assert_eq!(pages.checkpointed_len(), 4);
        pages.truncate(1);
        assert_eq!(pages.checkpointed(3), Some(b("d")));
        assert_eq!(pages.total_bytes(), 1);
        assert_eq!(pages.freeze(), vec![1, 2, 3]);
    }

    #[test]
    fn revert_undoes_every_change_since_the_last_freeze() {
        let mut pages = Pages::from_pages(vec![b("a"), b("b"), b("c")]);
        pages.set(0, b("A"));
        pages.freeze();
        let root = tree_of(&pages).root();
        pages.set(0, b("AA"));
        pages.set(1, b("B"));
        pages.truncate(1);
        pages.set(5, b("f"));
        assert_eq!(pages.len(), 6);
        pages.revert();
        assert_eq!(pages.len(), 3);
        assert_eq!(
            (0..3).map(|i| pages.get(i).unwrap()).collect::<Vec<_>>(),
            [b("A"), b("b"), b("c")]
        );
        assert_eq!(pages.total_bytes(), 3);
        assert_eq!(pages.changed(), 0);
        assert_eq!(tree_of(&pages).root(), root);
        // Growth alone is undone too.
        pages.set(3, b("d"));
        pages.revert();
        assert_eq!((pages.len(), pages.get(3)), (3, None));
    }

    #[test]
    fn an_incremental_checkpoint_has_the_root_of_a_tree_built_from_scratch() {
        let mut pages = Pages::from_pages((0..100).map(|i| b(&format!("page {i}"))).collect());
        let mut tree = tree_of(&pages);
        pages.set(7, b("seven"));
        pages.set(120, b("far"));
        let cp = PageCheckpoint::take(&mut tree, &mut pages);
        assert_eq!(cp.root, tree_of(&pages).root());
        assert_eq!(cp.changed.len(), 1 + 21);
        pages.truncate(50);
        let cp = PageCheckpoint::take(&mut tree, &mut pages);
        assert_eq!(cp.root, tree_of(&pages).root());
        assert_eq!(cp.pages, 50);
        assert!(cp.changed.iter().all(|(i, page)| *i >= 50 && page.is_none()));
    }

    /// A store that keeps exactly what [`PageStore`] promises: the committed pages, readable until
    /// the next commit replaces them.
    #[derive(Default)]
    struct StrictStore {
        committed: BTreeMap<u64, Bytes>,
        pending: BTreeMap<u64, Bytes>,
        len: u64,
        seqno: u64,
    }

    impl PageStore for StrictStore {
        fn committed(&self) -> (u64, Vec<u32>) {
            let lens = (0..self.len)
                .map(|i| self.committed.get(&i).map_or(0, |b| b.len() as u32))
                .collect();
            (self.seqno, lens)
        }
        fn read(&self, index: u64) -> std::io::Result<Bytes> {
            Ok(self.committed.get(&index).cloned().unwrap_or_default())
        }
        fn write(&mut self, index: u64, bytes: &[u8]) -> std::io::Result<()> {
            self.pending.insert(index, Bytes::copy_from_slice(bytes));
            Ok(())
        }
        fn committed_record(&self) -> Bytes {
            Bytes::new()
        }
        fn commit(&mut self, seqno: u64, len: u64, _record: &[u8]) -> std::io::Result<()> {
            self.committed.append(&mut self.pending);
            self.committed.retain(|i, _| *i < len);
            (self.len, self.seqno) = (len, seqno);
            Ok(())
        }
    }

    /// Every kept checkpoint's pages and tree nodes are served as they were, across growth,
    /// truncation and changes of the tree's height, with and without a store (whose old
    /// versions are gone after the next commit), for random histories.
    fn older_checkpoints_are_served_as_they_were(seed: u64, with_store: bool) {
        let mut rng = seed | 1;
        let mut next = move |n: u64| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng % n
        };
        let mut pages = Pages::from_pages((0..20).map(|i| b(&format!("p{i}"))).collect());
        if with_store {
            pages.attach_store(Box::new(StrictStore::default()), 64).unwrap();
        }
        pages.keep_older(2);
        let mut tree = tree_of(&pages);
        let mut older: VecDeque<crate::page_tree::OlderTree> = VecDeque::new();
        // Snapshots of every checkpoint, newest first: (pages, tree).
        let mut snapshots: VecDeque<(Vec<Bytes>, PageTree)> = VecDeque::new();
        snapshots.push_front(((0..20).map(|i| b(&format!("p{i}"))).collect(), tree.clone()));
        for round in 0..12 {
            for _ in 0..next(40) {
                match next(10) {
                    0 => pages.truncate(next(pages.len() + 1)),
                    1 => pages.set(pages.len() + next(300), b(&format!("grow {round}"))),
                    _ if pages.is_empty() => {}
                    _ => {
                        let index = next(pages.len());
                        let bytes = if next(5) == 0 {
                            Bytes::new()
                        } else {
                            b(&format!("r{round}-{index}"))
                        };
                        pages.set(index, bytes);
                    }
                }
            }
            older.push_front(crate::page_tree::OlderTree::capture(&tree, &pages.changed_indices()));
            older.truncate(2);
            let cp = PageCheckpoint::take(&mut tree, &mut pages);
            let indices: Vec<u64> = cp.changed.iter().map(|(i, _)| *i).collect();
            pages.write_back(&indices, round + 1, &[]).unwrap();
            let now: Vec<Bytes> = (0..pages.len()).map(|i| pages.get(i).unwrap()).collect();
            snapshots.push_front((now, tree.clone()));
            snapshots.truncate(3);
            assert_eq!(pages.older_count(), snapshots.len() - 1);
            for (generation, (expected, expected_tree)) in snapshots.iter().enumerate() {
                assert_eq!(pages.len_at(generation), Some(expected.len() as u64));
                for index in 0..expected.len() as u64 + 20 {
                    assert_eq!(
                        pages.checkpointed_at(generation, index),
                        expected.get(index as usize).cloned(),
                        "seed {seed} round {round} generation {generation} page {index}"
                    );
                }
                let layers: Vec<&crate::page_tree::OlderTree> = older.iter().take(generation).collect();
                let height = PageTree::height_for(expected.len() as u64);
                for level in 0..=height + 1 {
                    for index in 0..PageTree::width(expected.len() as u64, level) + 2 {
                        assert_eq!(
                            tree.children_at(&layers, (level, index)),
                            expected_tree.children((level, index)).map(<[Digest]>::to_vec),
                            "seed {seed} round {round} generation {generation} node {level}/{index}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn older_checkpoints_are_served_as_they_were_in_memory() {
        for seed in 0..40 {
            older_checkpoints_are_served_as_they_were(seed * 7919 + 1, false);
        }
    }

    #[test]
    fn older_checkpoints_are_served_as_they_were_from_a_store() {
        for seed in 0..40 {
            older_checkpoints_are_served_as_they_were(seed * 104_729 + 3, true);
        }
    }
}

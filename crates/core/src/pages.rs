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

use std::collections::BTreeMap;

use bytes::Bytes;

use crate::crypto::Digest;
use crate::limits::PAGE_BYTES_MAX;
use crate::page_tree::PageTree;

/// Pages of a service's state, with the checkpointed version of the pages changed since the last
/// checkpoint ([`Pages::freeze`]).
#[derive(Clone, Debug, Default)]
pub struct Pages {
    live: Vec<Bytes>,
    /// Per page changed since the last freeze, its version then (`None`: it did not exist).
    frozen: BTreeMap<u64, Option<Bytes>>,
    /// Page count at the last freeze.
    frozen_len: u64,
    /// Sum of the live pages' lengths.
    bytes: u64,
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
            live: pages,
            frozen: BTreeMap::new(),
            bytes,
        }
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

    /// Page `index` (an empty page if it was never written), `None` past the end.
    pub fn get(&self, index: u64) -> Option<&Bytes> {
        self.live.get(usize::try_from(index).ok()?)
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
            self.live.push(Bytes::new());
        }
        let old = std::mem::replace(&mut self.live[i], bytes);
        self.bytes = self.bytes - old.len() as u64 + self.live[i].len() as u64;
        self.frozen.entry(index).or_insert(Some(old));
    }

    /// Drops the pages from `len` on.
    pub fn truncate(&mut self, len: u64) {
        while self.len() > len {
            let index = self.len() - 1;
            let old = self.live.pop().expect("not empty");
            self.bytes -= old.len() as u64;
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
            Some(old) => old.clone(),
            None if index < self.frozen_len => self.get(index).cloned(),
            None => None,
        }
    }

    /// Page count as of the last checkpoint.
    pub fn checkpointed_len(&self) -> u64 {
        self.frozen_len
    }

    /// Makes the current state the checkpointed one; returns the pages changed since the previous
    /// checkpoint, ascending (some may now be past the end: truncated).
    pub fn freeze(&mut self) -> Vec<u64> {
        self.frozen_len = self.len();
        std::mem::take(&mut self.frozen).into_keys().collect()
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
        tree.set(index, page_digest(index, page));
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
            changed: indices.into_iter().map(|i| (i, pages.get(i).cloned())).collect(),
        }
    }
}

/// Hashes pages `indices` of `pages` into `tree`, drops the tree's pages past the end of `pages`
/// (indices there need nothing more) and returns the root.
pub fn rehash(tree: &mut PageTree, pages: &Pages, indices: &[u64]) -> Digest {
    for &index in indices {
        if let Some(page) = pages.get(index) {
            tree.set(index, page_digest(index, page));
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
        assert_eq!(pages.get(2), Some(&Bytes::new()));
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
}

//! Paged state under a Merkle tree (PBFT thesis 5.3, the partition tree): the groundwork of
//! incremental checkpoints and state transfer.
//!
//! A service's state is a sequence of pages, each named by its index. Leaves are the page
//! digests ([`PageTree::page_digest`]); every internal node is the digest of its (at most
//! [`FANOUT`]) children together with its level and index, so a digest names one position in
//! one tree. The state's identity is the root together with the page count ([`PageTree::state_digest`]).
//!
//! - **Incremental.** Setting a page marks its path; [`PageTree::root`] recomputes only marked
//!   nodes, so a checkpoint after `k` changed pages costs `O(k * height * FANOUT)` hashes, not a
//!   pass over the whole state ([`PageTree::hashes`] counts them).
//! - **Transfer.** [`TreeSync`] brings a tree to a certified root: it asks for the children of
//!   nodes from the root down, verifies each answer against the digest it expects, descends only
//!   into children that differ from the local tree, and ends with the pages to fetch, each
//!   checked against its leaf digest. It is sans-I/O: the caller sends its requests to any peers
//!   (several in parallel), and a wrong answer is an error naming nothing installed, so the caller
//!   asks another peer.
//!
//! The execution stage keeps one tree over a paged service's [`crate::pages::Pages`]
//! (`exec/paged.rs`).

use std::collections::{BTreeMap, BTreeSet};

use crate::crypto::Digest;

/// Children per internal node.
pub const FANOUT: usize = 16;

/// The digest of an absent page (past the end, or never written).
pub const EMPTY_PAGE: Digest = Digest([0; 32]);

/// A node of the tree: its level (0 = pages) and its index within the level.
pub type NodeId = (u32, u64);

/// Pages under a Merkle tree of [`FANOUT`]-ary nodes.
#[derive(Clone, Debug, Default)]
pub struct PageTree {
    /// `levels[0]`: page digests; `levels[k]`: the nodes at height `k`; the last level holds the
    /// root alone (when there is more than one page).
    levels: Vec<Vec<Digest>>,
    /// Per level above 0, the nodes whose children changed since the last [`PageTree::root`].
    dirty: Vec<BTreeSet<u64>>,
    /// Node digests computed so far (the cost measure of incremental checkpoints).
    hashes: u64,
}

impl PageTree {
    /// An empty tree.
    pub fn new() -> PageTree {
        PageTree::default()
    }

    /// The digest of page `index` holding `bytes` (the page's position is part of it); an empty
    /// page is [`EMPTY_PAGE`], like a page never written.
    pub fn page_digest(index: u64, bytes: &[u8]) -> Digest {
        if bytes.is_empty() {
            return EMPTY_PAGE;
        }
        Digest::of_parts("upright page", &[&index.to_le_bytes(), bytes])
    }

    /// The digest of node `(level, index)` (`level >= 1`) with these children, in order.
    pub fn node_digest(level: u32, index: u64, children: &[Digest]) -> Digest {
        let mut parts: Vec<&[u8]> = Vec::with_capacity(children.len() + 2);
        let level = level.to_le_bytes();
        let index = index.to_le_bytes();
        parts.push(&level);
        parts.push(&index);
        parts.extend(children.iter().map(|d| &d.0[..]));
        Digest::of_parts("upright page tree node", &parts)
    }

    /// The identity of a state: its root and its page count.
    pub fn state_digest(root: Digest, pages: u64) -> Digest {
        Digest::of_parts("upright paged state", &[&root.0, &pages.to_le_bytes()])
    }

    /// Number of pages (one past the highest index set).
    pub fn pages(&self) -> u64 {
        self.levels.first().map_or(0, |l| l.len() as u64)
    }

    /// Node digests computed since the tree was made.
    pub fn hashes(&self) -> u64 {
        self.hashes
    }

    /// The height a tree of `pages` pages has: the level of its root (0 for at most one page).
    pub fn height_for(pages: u64) -> u32 {
        let mut height = 0;
        let mut width = pages.max(1);
        while width > 1 {
            width = width.div_ceil(FANOUT as u64);
            height += 1;
        }
        height
    }

    /// Number of nodes at `level` in a tree of `pages` pages.
    pub fn width(pages: u64, level: u32) -> u64 {
        let mut width = pages;
        for _ in 0..level {
            width = width.div_ceil(FANOUT as u64);
        }
        width
    }

    /// Sets page `index`'s digest (growing the tree with empty pages if it is past the end).
    pub fn set(&mut self, index: u64, digest: Digest) {
        if self.levels.is_empty() {
            self.levels.push(Vec::new());
        }
        let leaves = &mut self.levels[0];
        if index >= leaves.len() as u64 {
            let start = leaves.len() as u64;
            leaves.resize(index as usize + 1, EMPTY_PAGE);
            // Every parent of a new page changes (the new empty ones too). A level the tree did
            // not have is covered too: `start` was at most FANOUT^height, so on every new level
            // the range starts at node 0.
            self.mark_range(start, index);
        }
        if self.levels[0][index as usize] != digest {
            self.levels[0][index as usize] = digest;
            self.mark_range(index, index);
        }
    }

    /// Drops the pages from `pages` on.
    pub fn truncate(&mut self, pages: u64) {
        if pages >= self.pages() {
            return;
        }
        self.levels[0].truncate(pages as usize);
        self.levels.truncate(1);
        self.dirty.clear();
        // A rare operation: rebuild the levels above from the pages.
        if pages > 0 {
            self.mark_range(0, pages - 1);
        }
    }

    /// Marks the parents of pages `first..=last` dirty.
    fn mark_range(&mut self, first: u64, last: u64) {
        let height = Self::height_for(self.pages());
        while self.dirty.len() < height as usize {
            self.dirty.push(BTreeSet::new());
        }
        let (mut first, mut last) = (first, last);
        for level in 1..=height {
            first /= FANOUT as u64;
            last /= FANOUT as u64;
            self.dirty[level as usize - 1].extend(first..=last);
        }
    }

    /// The root, recomputing the nodes whose pages changed since the last call ([`EMPTY_PAGE`]'s
    /// node digest for an empty tree; the page's own digest for a one-page tree).
    pub fn root(&mut self) -> Digest {
        let pages = self.pages();
        let height = Self::height_for(pages);
        self.levels.resize(height as usize + 1, Vec::new());
        self.levels.truncate(height as usize + 1);
        if self.levels[0].is_empty() {
            return Self::node_digest(0, 0, &[]);
        }
        for level in 1..=height {
            let width = Self::width(pages, level) as usize;
            self.levels[level as usize].resize(width, EMPTY_PAGE);
            let dirty = std::mem::take(&mut self.dirty[level as usize - 1]);
            for index in dirty.into_iter().filter(|&i| (i as usize) < width) {
                let below = &self.levels[level as usize - 1];
                let start = index as usize * FANOUT;
                let end = (start + FANOUT).min(below.len());
                let digest = Self::node_digest(level, index, &below[start..end]);
                self.levels[level as usize][index as usize] = digest;
                self.hashes += 1;
            }
        }
        self.dirty.truncate(height as usize);
        self.levels[height as usize][0]
    }

    /// The digest of node `(level, index)` as of the last [`PageTree::root`].
    pub fn node(&self, (level, index): NodeId) -> Option<Digest> {
        self.levels.get(level as usize)?.get(index as usize).copied()
    }

    /// The children of node `(level, index)` (`level >= 1`) as of the last [`PageTree::root`]:
    /// what a peer answers during state transfer.
    pub fn children(&self, (level, index): NodeId) -> Option<&[Digest]> {
        let below = self.levels.get((level as usize).checked_sub(1)?)?;
        let start = (index as usize).checked_mul(FANOUT)?;
        if level == 0 || start >= below.len() || self.levels.get(level as usize)?.len() <= index as usize {
            return None;
        }
        Some(&below[start..(start + FANOUT).min(below.len())])
    }
}

/// A [`PageTree`] as of an older checkpoint, kept as the difference from the next newer one: the
/// nodes (and page digests) that changed between them, as they were then, and the page count.
/// A peer can then be served the older tree's nodes ([`PageTree::children_at`]) without a copy of
/// the whole tree.
#[derive(Clone, Debug, Default)]
pub struct OlderTree {
    pages: u64,
    nodes: BTreeMap<NodeId, Digest>,
}

impl OlderTree {
    /// Taken from `tree` (its root computed) before the changes to pages `indices` are hashed
    /// into it: every node those changes can touch, as it is now.
    pub fn capture(tree: &PageTree, indices: &[u64]) -> OlderTree {
        let pages = tree.pages();
        let height = PageTree::height_for(pages);
        let mut nodes = BTreeMap::new();
        for &page in indices {
            let mut index = page;
            for level in 0..=height {
                if let Some(digest) = tree.node((level, index)) {
                    nodes.entry((level, index)).or_insert(digest);
                }
                index /= FANOUT as u64;
            }
        }
        OlderTree { pages, nodes }
    }

    /// Page count of that tree.
    pub fn pages(&self) -> u64 {
        self.pages
    }
}

impl PageTree {
    /// The children of `node` in the tree as of an older checkpoint: `older` holds the
    /// differences from the current tree back to it, newest first (the last one is that
    /// checkpoint's).
    pub fn children_at(&self, older: &[&OlderTree], (level, index): NodeId) -> Option<Vec<Digest>> {
        let Some(oldest) = older.last() else {
            return self.children((level, index)).map(<[Digest]>::to_vec);
        };
        let pages = oldest.pages;
        if level == 0 || pages == 0 || level > PageTree::height_for(pages) || index >= PageTree::width(pages, level) {
            return None;
        }
        let first = index.checked_mul(FANOUT as u64)?;
        let end = (first + FANOUT as u64).min(PageTree::width(pages, level - 1));
        (first..end)
            .map(|child| {
                let node = (level - 1, child);
                older
                    .iter()
                    .rev()
                    .find_map(|o| o.nodes.get(&node).copied())
                    .or_else(|| self.node(node))
            })
            .collect()
    }
}

/// Why an answer during state transfer was refused (the caller asks another peer).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SyncError {
    /// Not a node or page this transfer is waiting for.
    #[error("not asked for")]
    NotAsked,
    /// The answer does not hash to the digest the certified tree has there.
    #[error("does not match the certified digest")]
    Mismatch,
    /// A late answer, for a node or page another peer already answered correctly, that does not
    /// match the certified digest either: its sender lied (nothing needs asking again).
    #[error("a late answer that does not match the certified digest")]
    LateMismatch,
}

/// State transfer of a [`PageTree`] to a certified `(root, pages)`: which nodes to ask about and
/// which pages to fetch, each answer checked before it is used.
#[derive(Clone, Debug)]
pub struct TreeSync {
    pages: u64,
    /// Nodes whose children to ask for, with the digest each must have.
    nodes: BTreeMap<NodeId, Digest>,
    /// Pages to fetch, with their certified digests.
    wanted: BTreeMap<u64, Digest>,
    /// Nodes and pages already answered, with their certified digests: a late answer for one of
    /// them is still checked, so a peer that lies slowly is caught too.
    resolved_nodes: BTreeMap<NodeId, Digest>,
    resolved_pages: BTreeMap<u64, Digest>,
}

impl TreeSync {
    /// A transfer that brings `local` (whose [`PageTree::root`] was computed) to the tree with
    /// `root` over `pages` pages.
    pub fn new(local: &PageTree, root: Digest, pages: u64) -> TreeSync {
        let mut sync = TreeSync {
            pages,
            nodes: BTreeMap::new(),
            wanted: BTreeMap::new(),
            resolved_nodes: BTreeMap::new(),
            resolved_pages: BTreeMap::new(),
        };
        let height = PageTree::height_for(pages);
        if pages == 0 {
            return sync;
        }
        if height == 0 {
            if local.node((0, 0)) != Some(root) {
                sync.wanted.insert(0, root);
            }
        } else if !sync.same(local, (height, 0), root) {
            sync.nodes.insert((height, 0), root);
        }
        sync
    }

    /// Whether `local` has `digest` at `node` in a tree of the same shape.
    fn same(&self, local: &PageTree, node: NodeId, digest: Digest) -> bool {
        local.pages() == self.pages && local.node(node) == Some(digest)
    }

    /// Nodes whose children to ask a peer for (answer with [`TreeSync::on_children`]).
    pub fn nodes(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.nodes.keys().copied()
    }

    /// Pages to fetch from a peer (answer with [`TreeSync::on_page`]), once no node is left.
    pub fn pages_wanted(&self) -> impl Iterator<Item = u64> + '_ {
        self.wanted.keys().copied()
    }

    /// Whether nothing is left to ask.
    pub fn is_done(&self) -> bool {
        self.nodes.is_empty() && self.wanted.is_empty()
    }

    /// A peer's children of `node`: checked against the digest the certified tree has there; the
    /// children that differ from `local` are asked about next (or, below level 1, fetched).
    pub fn on_children(&mut self, local: &PageTree, node: NodeId, children: &[Digest]) -> Result<(), SyncError> {
        let (level, index) = node;
        // Only nodes above the pages are ever asked about (so `level >= 1` below), whatever
        // node a peer names.
        let first = index.saturating_mul(FANOUT as u64);
        let matches = |expected: Digest| {
            let count = PageTree::width(self.pages, level.saturating_sub(1))
                .saturating_sub(first)
                .min(FANOUT as u64);
            children.len() as u64 == count && PageTree::node_digest(level, index, children) == expected
        };
        let Some(expected) = self.nodes.get(&node).copied() else {
            return match self.resolved_nodes.get(&node) {
                Some(expected) if !matches(*expected) => Err(SyncError::LateMismatch),
                _ => Err(SyncError::NotAsked),
            };
        };
        if !matches(expected) {
            return Err(SyncError::Mismatch);
        }
        self.nodes.remove(&node);
        self.resolved_nodes.insert(node, expected);
        for (i, digest) in children.iter().enumerate() {
            let child = (level - 1, first + i as u64);
            if level == 1 {
                if local.node(child) != Some(*digest) {
                    self.wanted.insert(child.1, *digest);
                }
            } else if !self.same(local, child, *digest) {
                self.nodes.insert(child, *digest);
            }
        }
        Ok(())
    }

    /// Sabotage only (`Sabotage::UncheckedPages`): takes page `index` off the wanted list unchecked.
    pub fn accept_unchecked(&mut self, index: u64) -> bool {
        self.wanted.remove(&index).is_some()
    }

    /// A peer's page `index`: checked against its certified digest; `Ok` means install it.
    pub fn on_page(&mut self, index: u64, bytes: &[u8]) -> Result<(), SyncError> {
        let Some(expected) = self.wanted.get(&index).copied() else {
            return match self.resolved_pages.get(&index) {
                Some(expected) if PageTree::page_digest(index, bytes) != *expected => Err(SyncError::LateMismatch),
                _ => Err(SyncError::NotAsked),
            };
        };
        if PageTree::page_digest(index, bytes) != expected {
            return Err(SyncError::Mismatch);
        }
        self.wanted.remove(&index);
        self.resolved_pages.insert(index, expected);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn page(index: u64, version: u64) -> Vec<u8> {
        format!("page {index} v{version}").into_bytes()
    }

    fn tree(pages: u64, version: impl Fn(u64) -> u64) -> (PageTree, BTreeMap<u64, Vec<u8>>) {
        let mut t = PageTree::new();
        let mut data = BTreeMap::new();
        for i in 0..pages {
            let bytes = page(i, version(i));
            t.set(i, PageTree::page_digest(i, &bytes));
            data.insert(i, bytes);
        }
        t.root();
        (t, data)
    }

    /// Runs a transfer of `from` into `local`, answering from `from` (and `data`); returns the
    /// pages fetched.
    fn transfer(local: &mut PageTree, from: &PageTree, data: &BTreeMap<u64, Vec<u8>>) -> Vec<u64> {
        let mut from = from.clone();
        let root = from.root();
        let mut sync = TreeSync::new(local, root, from.pages());
        loop {
            let Some(node) = sync.nodes().next() else { break };
            sync.on_children(local, node, from.children(node).unwrap()).unwrap();
        }
        let wanted: Vec<u64> = sync.pages_wanted().collect();
        for &i in &wanted {
            sync.on_page(i, &data[&i]).unwrap();
            local.set(i, PageTree::page_digest(i, &data[&i]));
        }
        local.truncate(from.pages());
        assert!(sync.is_done());
        assert_eq!(local.root(), root, "the transfer reached the certified root");
        wanted
    }

    /// The cost of a checkpoint in hash computations (page digests plus node digests): after
    /// 1,000 scattered page changes in a million pages, under 1% of hashing the whole state.
    #[test]
    fn a_checkpoint_after_a_thousand_changes_in_a_million_pages_hashes_under_one_percent() {
        const PAGES: u64 = 1_000_000;
        let (mut t, _) = tree(PAGES, |_| 0);
        let whole = PAGES + t.hashes();
        let before = t.root();
        let start = t.hashes();
        let mut pages_hashed = 0;
        for i in 0..1000u64 {
            let index = (i * 7919) % PAGES;
            t.set(index, PageTree::page_digest(index, &page(index, 1)));
            pages_hashed += 1;
        }
        let after = t.root();
        let incremental = pages_hashed + (t.hashes() - start);
        assert_ne!(before, after);
        assert!(
            incremental * 100 < whole,
            "{incremental} hashes against {whole} for the whole state"
        );
    }

    #[test]
    fn transfer_fetches_only_the_changed_pages() {
        let (mut local, _) = tree(5000, |_| 0);
        let changed: BTreeSet<u64> = [3, 17, 18, 1024, 4999].into_iter().collect();
        let (remote, data) = tree(5000, |i| changed.contains(&i) as u64);
        let fetched = transfer(&mut local, &remote, &data);
        assert_eq!(fetched.into_iter().collect::<BTreeSet<_>>(), changed);
    }

    #[test]
    fn wrong_children_or_pages_are_refused_and_change_nothing() {
        let (local, _) = tree(300, |_| 0);
        let (mut remote, data) = tree(300, |i| (i == 42) as u64);
        let root = remote.root();
        let mut sync = TreeSync::new(&local, root, 300);
        let top = sync.nodes().next().unwrap();
        let mut lie = remote.children(top).unwrap().to_vec();
        lie[0] = Digest::of(b"forged");
        assert_eq!(sync.on_children(&local, top, &lie), Err(SyncError::Mismatch));
        assert_eq!(sync.on_children(&local, (0, 9), &lie), Err(SyncError::NotAsked));
        // The honest answer still works after a lie, from another peer.
        loop {
            let Some(node) = sync.nodes().next() else { break };
            sync.on_children(&local, node, remote.children(node).unwrap()).unwrap();
        }
        // A late lie about a node already answered is still caught; a late truth is ignored.
        assert_eq!(sync.on_children(&local, top, &lie), Err(SyncError::LateMismatch));
        assert_eq!(
            sync.on_children(&local, top, remote.children(top).unwrap()),
            Err(SyncError::NotAsked)
        );
        assert_eq!(sync.pages_wanted().collect::<Vec<_>>(), vec![42]);
        assert_eq!(sync.on_page(42, b"forged page"), Err(SyncError::Mismatch));
        assert_eq!(sync.on_page(41, &data[&41]), Err(SyncError::NotAsked));
        sync.on_page(42, &data[&42]).unwrap();
        // Late answers for what is already in: a correct one is ignored, a wrong one is caught.
        assert_eq!(sync.on_page(42, &data[&42]), Err(SyncError::NotAsked));
        assert_eq!(sync.on_page(42, b"forged late"), Err(SyncError::LateMismatch));
        assert!(sync.is_done());
    }

    /// A tree grown by one jump (a page far past the end) has the root of one built page by page.
    #[test]
    fn growth_by_a_jump_matches_growth_page_by_page() {
        let (mut stepwise, _) = tree(5, |_| 0);
        let mut jumped = stepwise.clone();
        let far = 5000;
        for i in 5..far {
            stepwise.set(i, EMPTY_PAGE);
        }
        stepwise.set(far, PageTree::page_digest(far, b"x"));
        jumped.set(far, PageTree::page_digest(far, b"x"));
        assert_eq!(jumped.root(), stepwise.root());
        let (mut fresh, _) = tree(0, |_| 0);
        for i in 0..5 {
            fresh.set(i, PageTree::page_digest(i, &page(i, 0)));
        }
        fresh.set(far, PageTree::page_digest(far, b"x"));
        assert_eq!(fresh.root(), jumped.root());
    }

    #[test]
    fn equal_trees_need_nothing_and_shapes_are_checked() {
        let (a, _) = tree(100, |_| 0);
        let (mut b, _) = tree(100, |_| 0);
        assert!(TreeSync::new(&a, b.root(), 100).is_done());
        assert_eq!(PageTree::height_for(0), 0);
        assert_eq!(PageTree::height_for(16), 1);
        assert_eq!(PageTree::height_for(17), 2);
        // The root binds the page count: 100 pages and the same 100 plus an empty one differ.
        let mut c = b.clone();
        c.set(100, EMPTY_PAGE);
        assert_ne!(c.root(), b.root());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// From any state to any other (more, fewer or changed pages), the transfer fetches only
        /// pages that differ and ends at the certified root; incremental roots equal roots built
        /// from scratch.
        #[test]
        fn transfer_reaches_any_state(
            base in 0u64..600,
            target in 0u64..600,
            changes in proptest::collection::btree_set(0u64..600, 0..40),
        ) {
            let (mut local, _) = tree(base, |_| 0);
            let (remote, data) = tree(target, |i| changes.contains(&i) as u64);
            let fetched = transfer(&mut local, &remote, &data);
            for i in &fetched {
                prop_assert!(*i >= base || changes.contains(i), "page {} fetched though equal", i);
            }
            let (mut rebuilt, _) = tree(target, |i| changes.contains(&i) as u64);
            prop_assert_eq!(local.root(), rebuilt.root());
        }
    }
}

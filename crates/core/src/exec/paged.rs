//! Paged state at an execution member (docs/PROTOCOL.md, "Paged state"; PBFT thesis 5.3).
//!
//! For a service with [`crate::pages::Pages`] the member keeps a [`PageTree`] over the pages as of
//! its newest checkpoint:
//! - **Checkpoint.** Only the pages changed since the previous checkpoint are hashed into the
//!   tree and persisted (`exec/page/<index>`, written before CP-TOKEN goes out like the rest of
//!   the checkpoint); the execution checkpoint names the tree's root, page count and bytes, so
//!   its digest (which the order stage certifies) binds every page.
//! - **Recovery.** The stored pages are installed over the service's initial pages, the tree is
//!   rebuilt and a stored checkpoint is restored only if its root matches.
//! - **Transfer.** After the checkpoint's small part (the manifest and chunks of
//!   `state_transfer.rs`) a [`TreeSync`] walks the certified tree from the root down, asking
//!   peers (all of them, in parallel) for the children of the nodes that differ from the local
//!   tree and then for the pages that differ. Every answer is checked against the certified tree;
//!   a peer caught answering wrongly is not asked again during this transfer and its items go
//!   to the others. Fetched pages are installed as they arrive; the member executes nothing
//!   until the tree reaches the certified root.
//! - **Serving.** Peers are answered from any kept checkpoint ([`CHECKPOINTS_KEPT`]): the
//!   newest's tree nodes from the tree and its pages from [`crate::pages::Pages::checkpointed`]
//!   (the version as of that checkpoint, kept copy-on-write while execution goes on); an older
//!   one's from the differences kept back to it ([`OlderTree`],
//!   [`crate::pages::Pages::checkpointed_at`]). The order stage's stable checkpoint, which a
//!   lagging member loads, can be two checkpoints behind a correct member's newest (the
//!   interlock lets execution run `2 * checkpoint_interval` past it), and while that member lags
//!   the newer ones may never become stable: serving only the newest would leave it waiting
//!   forever.

use std::collections::{BTreeMap, BTreeSet};

use bytes::Bytes;

use super::checkpoint::ExecCheckpoint;
use super::checkpoint::CHECKPOINTS_KEPT;
use super::ExecStage;
use crate::crypto::Digest;
use crate::ids::{Principal, ReplicaId, SeqNo};
use crate::limits::PAGE_ITEMS_PER_FETCH;
use crate::message::Message;
use crate::page_tree::{NodeId, OlderTree, PageTree, SyncError, TreeSync};
use crate::pages::{page_digest, rehash, tree_of, PageCheckpoint, Pages};
use crate::stage::{Action, Storage};

/// Prefix of the storage keys of checkpointed pages.
pub const PAGE_KEY_PREFIX: &str = "exec/page/";

pub use crate::limits::PAGE_ITEMS_IN_FLIGHT_MAX;

/// Storage key of page `index`.
pub fn page_key(index: u64) -> String {
    format!("{PAGE_KEY_PREFIX}{index}")
}

fn parse_page_key(key: &str) -> Option<u64> {
    let digits = key.strip_prefix(PAGE_KEY_PREFIX)?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// The member's view of a paged service's state.
pub(crate) struct PagedState {
    /// The tree over the pages as of the newest checkpoint (or, during a transfer, over the live
    /// pages being brought to the certified tree).
    pub tree: PageTree,
    /// Pages with a storage record.
    stored: BTreeSet<u64>,
    /// The tree and pages no longer match the newest checkpoint (a transfer installed pages into
    /// them): serve nothing until the next checkpoint or completed transfer.
    diverged: bool,
    /// The newest checkpoint the tree is of (`None` until one is taken or restored).
    newest: Option<SeqNo>,
    /// The trees of the checkpoints before it, newest first, each the difference from the next
    /// newer one; parallel to the pages' older versions.
    older: std::collections::VecDeque<(SeqNo, OlderTree)>,
}

/// Something asked for during a paged transfer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Item {
    Node(NodeId),
    Page(u64),
}

/// The paged phase of a state transfer: the checkpoint's small part is verified and decoded, the
/// pages are being brought to its tree.
pub(crate) struct PageSync {
    sync: TreeSync,
    /// The decoded checkpoint (restored once the pages are in place).
    pub checkpoint: ExecCheckpoint,
    /// Item -> index (into the transfer's peers) of the peer last asked.
    asked: BTreeMap<Item, usize>,
    /// Peers caught answering wrongly.
    distrusted: BTreeSet<usize>,
    /// Pages installed so far.
    installed: BTreeSet<u64>,
    /// Next peer to give new items to.
    next_peer: usize,
}

impl PageSync {
    /// The next peer not caught lying, from `start` on, one of the transfer's `holders` (the
    /// peers that sent the checkpoint's manifest) if one is trusted (all are trusted again if
    /// none is left).
    fn trusted_from(&mut self, start: usize, peers: usize, holders: &BTreeSet<usize>) -> usize {
        if self.distrusted.len() >= peers {
            self.distrusted.clear();
        }
        let trusted = |p: &usize| !self.distrusted.contains(p);
        let mut order = (0..peers).map(|k| (start + k) % peers);
        order
            .clone()
            .find(|p| trusted(p) && holders.contains(p))
            .or_else(|| order.find(trusted))
            .expect("at least one peer is trusted")
    }
}

impl PagedState {
    /// Installs the stored pages over the service's initial ones (unless the pages live in a
    /// page store, which holds them already) and builds the tree (hashes the whole state once).
    pub fn recover(pages: &mut Pages, storage: &Storage, bad_keys: &mut u64) -> PagedState {
        let mut stored = BTreeSet::new();
        for (key, record) in storage.range(PAGE_KEY_PREFIX.to_string()..) {
            if !key.starts_with(PAGE_KEY_PREFIX) {
                break;
            }
            match parse_page_key(key) {
                // With a page store the store holds the pages; records left from a data
                // directory written without one are deleted at the next checkpoint (a state
                // they described is brought back by transfer: its root no longer matches).
                Some(index) if pages.has_store() => {
                    stored.insert(index);
                }
                Some(index) if record.len() <= crate::limits::PAGE_BYTES_MAX => {
                    pages.set(index, record.clone());
                    stored.insert(index);
                }
                _ => *bad_keys += 1,
            }
        }
        pages.freeze();
        pages.keep_older(CHECKPOINTS_KEPT - 1);
        PagedState {
            tree: tree_of(pages),
            stored,
            diverged: false,
            newest: None,
            older: std::collections::VecDeque::new(),
        }
    }

    /// The tree is that of checkpoint `seqno` (restored at start).
    pub fn restored(&mut self, seqno: SeqNo) {
        self.newest = Some(seqno);
    }

    /// The generation (0: newest, 1: the one before, ...) of checkpoint `seqno`, if its pages and
    /// tree can be served.
    fn generation(&self, seqno: SeqNo, pages: &Pages) -> Option<usize> {
        if self.diverged {
            return None;
        }
        if self.newest == Some(seqno) {
            return Some(0);
        }
        let k = self.older.iter().position(|(s, _)| *s == seqno)?;
        (k < pages.older_count()).then_some(k + 1)
    }

    /// Children of `node` in checkpoint `generation`'s tree.
    fn children_at(&self, generation: usize, node: NodeId) -> Option<Vec<Digest>> {
        let older: Vec<&OlderTree> = self.older.iter().take(generation).map(|(_, t)| t).collect();
        self.tree.children_at(&older, node)
    }

    /// With a page store: commits the pages `cp` changed, with the checkpoint's storage `record`,
    /// as checkpoint `seqno`, before the record's storage write and CP-TOKEN. The store commits
    /// pages and record together, so that a restart after any crash finds a record describing
    /// the stored pages (with the record only in storage, a power loss between the store's commit
    /// and the storage sync left pages no record described: soak seed 200037).
    ///
    /// # Panics
    /// If the page store fails to write (a disk error: the checkpoint cannot be made durable).
    pub fn store_checkpoint(
        &mut self,
        pages: &mut Pages,
        seqno: SeqNo,
        cp: &PageCheckpoint,
        record: &[u8],
        out: &mut Vec<Action>,
    ) {
        if !pages.has_store() {
            return;
        }
        let indices: Vec<u64> = cp.changed.iter().map(|(i, _)| *i).collect();
        if let Err(e) = pages.write_back(&indices, seqno.0, record) {
            panic!("page store: cannot write checkpoint {}: {e}", seqno.0);
        }
        // Records from a data directory written without a store are superseded.
        for index in std::mem::take(&mut self.stored) {
            out.push(Action::Persist {
                key: page_key(index),
                value: None,
            });
        }
    }

    /// Whether some page has a storage record (the pages are a checkpoint's, not the service's
    /// initial ones).
    pub fn has_stored_pages(&self) -> bool {
        !self.stored.is_empty()
    }

    /// The checkpoint the pages were last frozen at (`Some(None)`: the initial or recovered
    /// pages before any checkpoint), if the pages are whole: what [`crate::pages::Pages::revert`]
    /// brings them back to.
    pub fn frozen_at(&self) -> Option<Option<SeqNo>> {
        (!self.diverged).then_some(self.newest)
    }

    /// Marks the pages as no batch's state (see [`ExecStage::state_is_partial`]).
    pub fn mark_partial(&mut self) {
        self.diverged = true;
    }

    /// Checkpoints the pages as of checkpoint `seqno`: hashes the changed ones into the tree and,
    /// without a page store, persists them as storage records (with one,
    /// [`PagedState::store_checkpoint`] writes them once the checkpoint's record is made).
    pub fn checkpoint(&mut self, pages: &mut Pages, seqno: SeqNo, out: &mut Vec<Action>) -> PageCheckpoint {
        let previous = match self.newest {
            Some(newest) if !self.diverged => Some((newest, OlderTree::capture(&self.tree, &pages.changed_indices()))),
            _ => None,
        };
        let cp = PageCheckpoint::take(&mut self.tree, pages);
        match previous {
            Some(older) => {
                self.older.push_front(older);
                self.older.truncate(CHECKPOINTS_KEPT - 1);
            }
            None => {
                // After a transfer (or before any checkpoint) the older versions are another
                // state's.
                self.older.clear();
                pages.forget_older();
            }
        }
        self.newest = Some(seqno);
        if pages.has_store() {
            // Written back by `store_checkpoint` with the checkpoint's record.
            self.diverged = false;
            return cp;
        }
        for (index, page) in &cp.changed {
            match page {
                Some(bytes) if !bytes.is_empty() => {
                    self.stored.insert(*index);
                    out.push(Action::Persist {
                        key: page_key(*index),
                        value: Some(bytes.clone()),
                    });
                }
                _ => {
                    if self.stored.remove(index) {
                        out.push(Action::Persist {
                            key: page_key(*index),
                            value: None,
                        });
                    }
                }
            }
        }
        self.diverged = false;
        cp
    }
}

impl ExecStage {
    /// Whether a transfer is in its paged phase.
    pub(super) fn installing_pages(&self) -> bool {
        self.transfer.as_ref().is_some_and(|t| t.pages.is_some())
    }

    /// Whether pages of a newer checkpoint are partly installed (from the start of a paged
    /// transfer until a checkpoint or a completed transfer): the state is no batch's, so nothing
    /// is executed, read or served from it.
    pub(super) fn state_is_partial(&self) -> bool {
        self.distrusted || self.paged.as_ref().is_some_and(|p| p.diverged)
    }

    /// The small part of a transfer arrived: bring the pages to its tree, or finish at once.
    pub(super) fn start_page_sync(&mut self, checkpoint: ExecCheckpoint, out: &mut Vec<Action>) {
        let (Some(paged), Some(pages)) = (self.paged.as_mut(), self.service.pages_mut()) else {
            if checkpoint.pages == 0 {
                self.complete_transfer(checkpoint, out);
            } else {
                self.stats.bump("state_transfer_pages_unsupported");
                self.abandon_transfer();
            }
            return;
        };
        // Compare against the live pages (execution may have changed some since the checkpoint).
        rehash(&mut paged.tree, pages, &pages.changed_indices());
        paged.mark_partial();
        let sync = TreeSync::new(&paged.tree, checkpoint.page_root, checkpoint.pages);
        let t = self.transfer.as_mut().expect("transfer in progress");
        t.pages = Some(PageSync {
            sync,
            checkpoint,
            asked: BTreeMap::new(),
            distrusted: BTreeSet::new(),
            installed: BTreeSet::new(),
            next_peer: 0,
        });
        self.stats.bump("state_transfer_paged");
        self.pump_pages(out);
    }

    /// Asks for every wanted item not yet asked, while fewer than [`PAGE_ITEMS_IN_FLIGHT_MAX`]
    /// are outstanding, spread over the trusted peers; finishes when nothing is wanted.
    fn pump_pages(&mut self, out: &mut Vec<Action>) {
        let Some(t) = self.transfer.as_mut() else { return };
        let (peers, holders) = (t.peers.len(), &t.holders);
        let Some(ps) = t.pages.as_mut() else { return };
        if ps.sync.is_done() {
            self.finish_page_sync(out);
            return;
        }
        let room = PAGE_ITEMS_IN_FLIGHT_MAX.saturating_sub(ps.asked.len());
        let fresh: Vec<Item> = ps
            .sync
            .nodes()
            .map(Item::Node)
            .chain(ps.sync.pages_wanted().map(Item::Page))
            .filter(|item| !ps.asked.contains_key(item))
            .take(room)
            .collect();
        let mut per_peer: BTreeMap<usize, Vec<Item>> = BTreeMap::new();
        for chunk in fresh.chunks(PAGE_ITEMS_PER_FETCH) {
            let peer = ps.trusted_from(ps.next_peer, peers, holders);
            ps.next_peer = peer + 1;
            for item in chunk {
                ps.asked.insert(*item, peer);
            }
            per_peer.entry(peer).or_default().extend_from_slice(chunk);
        }
        self.ask_peers(per_peer, out);
    }

    /// Sends FETCH-PAGES for the items given to each peer (by index into the transfer's peers).
    fn ask_peers(&self, per_peer: BTreeMap<usize, Vec<Item>>, out: &mut Vec<Action>) {
        let Some(t) = self.transfer.as_ref() else { return };
        for (peer, items) in per_peer {
            self.send_page_fetches(t.seqno(), t.digest, t.peers[peer], &items, out);
        }
    }

    fn send_page_fetches(&self, seqno: SeqNo, digest: Digest, peer: ReplicaId, items: &[Item], out: &mut Vec<Action>) {
        let nodes: Vec<NodeId> = items
            .iter()
            .filter_map(|i| if let Item::Node(n) = i { Some(*n) } else { None })
            .collect();
        let pages: Vec<u64> = items
            .iter()
            .filter_map(|i| if let Item::Page(p) = i { Some(*p) } else { None })
            .collect();
        let mut nodes = nodes.chunks(PAGE_ITEMS_PER_FETCH);
        let mut pages = pages.chunks(PAGE_ITEMS_PER_FETCH);
        loop {
            let (n, p) = (nodes.next(), pages.next());
            if n.is_none() && p.is_none() {
                break;
            }
            let message = Message::FetchPages {
                seqno,
                state_digest: digest,
                nodes: n.unwrap_or_default().to_vec(),
                pages: p.unwrap_or_default().to_vec(),
            };
            self.send_each(std::iter::once(Principal::Exec(peer)), &message, out);
        }
    }

    /// Retry tick during the paged phase: every outstanding item goes to the next trusted peer.
    pub(super) fn retry_pages(&mut self, out: &mut Vec<Action>) {
        let Some(t) = self.transfer.as_mut() else { return };
        let (peers, holders) = (t.peers.len(), &t.holders);
        let Some(ps) = t.pages.as_mut() else { return };
        let mut per_peer: BTreeMap<usize, Vec<Item>> = BTreeMap::new();
        let asked: Vec<(Item, usize)> = ps.asked.iter().map(|(i, p)| (*i, *p)).collect();
        for (item, last) in asked {
            let peer = ps.trusted_from(last + 1, peers, holders);
            ps.asked.insert(item, peer);
            per_peer.entry(peer).or_default().push(item);
        }
        self.stats.bump("page_fetch_retried");
        self.ask_peers(per_peer, out);
        self.pump_pages(out);
    }

    /// A peer's PAGE-ANSWER: each item checked against the certified tree.
    pub(super) fn on_page_answer(
        &mut self,
        from: ReplicaId,
        seqno: SeqNo,
        digest: Digest,
        nodes: &[(NodeId, Vec<Digest>)],
        answered: &[(u64, Bytes)],
        out: &mut Vec<Action>,
    ) {
        let Some(t) = self.transfer.as_mut() else {
            self.stats.bump("page_answer_unexpected");
            return;
        };
        if t.seqno() != seqno || t.digest != digest || t.pages.is_none() {
            self.stats.bump("page_answer_unexpected");
            return;
        }
        let sender = t.peers.iter().position(|p| *p == from);
        let (peers, holders) = (t.peers.len(), &t.holders);
        let ps = t.pages.as_mut().expect("checked");
        let paged = self.paged.as_mut().expect("paged transfer of a paged service");
        let pages = self.service.pages_mut().expect("paged service");
        let mut received = 0u64;
        let mut wrong = Vec::new();
        let mut late_wrong = 0u64;
        for (node, children) in nodes {
            received += 32 * children.len() as u64;
            match ps.sync.on_children(&paged.tree, *node, children) {
                Ok(()) => {
                    ps.asked.remove(&Item::Node(*node));
                    t.progressed = true;
                }
                Err(SyncError::Mismatch) => wrong.push(Item::Node(*node)),
                Err(SyncError::LateMismatch) => late_wrong += 1,
                Err(SyncError::NotAsked) => self.stats.bump("page_answer_not_asked"),
            }
        }
        let unchecked = self.config.knobs.sabotage == Some(crate::config::Sabotage::UncheckedPages);
        for (index, bytes) in answered {
            received += bytes.len() as u64;
            let verdict = match ps.sync.on_page(*index, bytes) {
                Err(SyncError::Mismatch) if unchecked && ps.sync.accept_unchecked(*index) => Ok(()),
                verdict => verdict,
            };
            match verdict {
                Ok(()) => {
                    ps.asked.remove(&Item::Page(*index));
                    t.progressed = true;
                    pages.set(*index, bytes.clone());
                    paged.tree.set(*index, page_digest(*index, bytes));
                    ps.installed.insert(*index);
                }
                Err(SyncError::Mismatch) => wrong.push(Item::Page(*index)),
                Err(SyncError::LateMismatch) => late_wrong += 1,
                Err(SyncError::NotAsked) => self.stats.bump("page_answer_not_asked"),
            }
        }
        self.stats.add("state_transfer_bytes", received);
        // A wrong answer, also one that came after another peer answered right (nothing to ask
        // again then), shows the sender lies.
        let caught = wrong.len() as u64 + late_wrong;
        if caught > 0 {
            self.stats.add("page_answer_wrong", caught);
            if let Some(s) = sender {
                ps.distrusted.insert(s);
            }
        }
        if !wrong.is_empty() {
            // Ask a trusted peer at once.
            let mut per_peer: BTreeMap<usize, Vec<Item>> = BTreeMap::new();
            for item in wrong {
                let peer = ps.trusted_from(sender.map_or(0, |s| s + 1), peers, holders);
                ps.asked.insert(item, peer);
                per_peer.entry(peer).or_default().push(item);
            }
            self.ask_peers(per_peer, out);
        }
        self.pump_pages(out);
    }

    /// The tree reached the certified root: persist the installed pages, freeze, restore.
    fn finish_page_sync(&mut self, out: &mut Vec<Action>) {
        let t = self.transfer.as_mut().expect("transfer in progress");
        let ps = t.pages.take().expect("paged phase");
        let paged = self.paged.as_mut().expect("paged service");
        let pages = self.service.pages_mut().expect("paged service");
        pages.truncate(ps.checkpoint.pages);
        let root = rehash(&mut paged.tree, pages, &[]);
        let unchecked = self.config.knobs.sabotage == Some(crate::config::Sabotage::UncheckedPages);
        if (root != ps.checkpoint.page_root || pages.len() != ps.checkpoint.pages) && !unchecked {
            // Every page was verified: only a shape the tree cannot express gets here.
            self.stats.bump("state_transfer_pages_mismatch");
            self.abandon_transfer();
            return;
        }
        // Persist every page now differing from storage: the installed ones, plus the live
        // changes since our last checkpoint that the certified tree kept (freeze reports both).
        let cp = paged.checkpoint(pages, ps.checkpoint.seqno, out);
        let record = t.stored.as_ref().expect("small part verified").record();
        paged.store_checkpoint(pages, ps.checkpoint.seqno, &cp, &record, out);
        self.stats.add("state_transfer_pages", ps.installed.len() as u64);
        self.complete_transfer(ps.checkpoint, out);
    }

    /// Serves FETCH-PAGES from any kept checkpoint.
    pub(super) fn on_fetch_pages(
        &mut self,
        from: ReplicaId,
        seqno: SeqNo,
        digest: Digest,
        nodes: &[NodeId],
        wanted: &[u64],
        out: &mut Vec<Action>,
    ) {
        let kept = self.checkpoints.get(seqno, digest).is_some();
        let (Some(paged), Some(pages)) = (self.paged.as_ref(), self.service.pages()) else {
            self.stats.bump("fetch_pages_unpaged");
            return;
        };
        // `generation` is `None` while the pages are partly another checkpoint's (diverged).
        let generation = paged
            .generation(seqno, pages)
            .filter(|_| kept && self.transfer.is_none());
        let Some(generation) = generation else {
            self.stats.bump("fetch_pages_stale");
            return;
        };
        let nodes: Vec<(NodeId, Vec<Digest>)> = nodes
            .iter()
            .filter_map(|n| Some((*n, paged.children_at(generation, *n)?)))
            .collect();
        let answered: Vec<(u64, Bytes)> = wanted
            .iter()
            .filter_map(|i| Some((*i, pages.checkpointed_at(generation, *i)?)))
            .collect();
        self.stats.bump("fetch_pages_served");
        if generation > 0 {
            self.stats.bump("fetch_pages_served_older");
        }
        let message = Message::PageAnswer {
            seqno,
            state_digest: digest,
            nodes,
            pages: answered,
        };
        self.send_each(std::iter::once(Principal::Exec(from)), &message, out);
    }
}

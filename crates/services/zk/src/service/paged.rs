//! The tree's nodes in the platform's pages, so that a checkpoint, a state transfer and a
//! restart cost the nodes that changed, not the whole tree.
//!
//! Node `path` belongs to bucket `hash(path) mod` [`NODE_BUCKETS`]. A bucket's nodes (path,
//! data, ACL, Stat; not their children, which the paths give) are encoded together, in path
//! order, and cut into pages of at most [`PAGE_BYTES_MAX`]: piece `k` of bucket `b` is page
//! `k * NODE_BUCKETS + b`, and a bucket ends at its first empty piece. Most buckets take one
//! page, so the pages number about [`NODE_BUCKETS`] times the largest bucket's pieces; a bucket
//! of large nodes (data up to 1 MiB each) just takes more pieces.

use std::collections::BTreeSet;

use bytes::Bytes;
use upright_core::crypto::Digest;
use upright_core::limits::PAGE_BYTES_MAX;
use upright_core::pages::Pages;

use crate::tree::{NodeRecord, Tree};

/// Buckets of nodes.
pub const NODE_BUCKETS: u64 = 4096;

/// The bucket of the node at `path`.
pub fn bucket(path: &str) -> u64 {
    let digest = Digest::of_parts("upright-zk node bucket", &[path.as_bytes()]);
    u64::from_le_bytes(digest.0[..8].try_into().expect("8 bytes")) % NODE_BUCKETS
}

/// The pages and which nodes each bucket holds.
#[derive(Debug, Default)]
pub struct NodePages {
    pub(super) pages: Pages,
    /// Each bucket's node paths (from the tree; not itself state).
    members: Vec<BTreeSet<String>>,
}

impl NodePages {
    /// The pages of `tree`'s nodes as the first checkpointed state.
    pub fn of(tree: &Tree) -> NodePages {
        let members = members_of(tree);
        let mut pages: Vec<Bytes> = vec![Bytes::new(); NODE_BUCKETS as usize];
        for (b, paths) in members.iter().enumerate() {
            for (k, piece) in encode(tree, paths).into_iter().enumerate() {
                let index = k * NODE_BUCKETS as usize + b;
                if pages.len() <= index {
                    pages.resize(index + 1, Bytes::new());
                }
                pages[index] = piece;
            }
        }
        NodePages {
            pages: Pages::from_pages(pages),
            members,
        }
    }

    /// Writes the buckets of the nodes `tree` changed since the last call into the pages.
    pub fn flush(&mut self, tree: &mut Tree) {
        let dirty = tree.take_dirty();
        if dirty.is_empty() {
            return;
        }
        if self.members.is_empty() {
            self.members = vec![BTreeSet::new(); NODE_BUCKETS as usize];
        }
        let mut buckets = BTreeSet::new();
        for path in dirty {
            let b = bucket(&path);
            if tree.get(&path).is_some() {
                self.members[b as usize].insert(path);
            } else {
                self.members[b as usize].remove(&path);
            }
            buckets.insert(b);
        }
        for b in buckets {
            let pieces = encode(tree, &self.members[b as usize]);
            let mut k = 0u64;
            for piece in &pieces {
                let index = k * NODE_BUCKETS + b;
                if self.pages.get(index).as_ref() != Some(piece) {
                    self.pages.set(index, piece.clone());
                }
                k += 1;
            }
            // Pieces the bucket no longer needs become empty (the first one ends it).
            while let Some(old) = self.pages.get(k * NODE_BUCKETS + b) {
                if old.is_empty() {
                    break;
                }
                self.pages.set(k * NODE_BUCKETS + b, Bytes::new());
                k += 1;
            }
        }
    }

    /// Every node in the pages; `Err` if a bucket does not decode.
    pub fn records(&self) -> Result<Vec<(String, NodeRecord)>, String> {
        let mut records = Vec::new();
        for b in 0..NODE_BUCKETS {
            let mut bytes = Vec::new();
            let mut k = 0;
            while let Some(piece) = self.pages.get(k * NODE_BUCKETS + b) {
                if piece.is_empty() {
                    break;
                }
                bytes.extend_from_slice(&piece);
                k += 1;
            }
            if bytes.is_empty() {
                continue;
            }
            let nodes: Vec<(String, NodeRecord)> =
                upright_core::codec::from_bytes(&bytes).map_err(|e| format!("node bucket {b}: {e}"))?;
            if nodes.iter().any(|(path, _)| bucket(path) != b) {
                return Err(format!("node bucket {b} holds a node of another bucket"));
            }
            records.extend(nodes);
        }
        Ok(records)
    }

    /// After the tree was loaded from the pages: which nodes each bucket holds.
    pub fn index(&mut self, tree: &Tree) {
        self.members = members_of(tree);
    }
}

fn members_of(tree: &Tree) -> Vec<BTreeSet<String>> {
    let mut members = vec![BTreeSet::new(); NODE_BUCKETS as usize];
    for path in tree.paths() {
        members[bucket(path) as usize].insert(path.clone());
    }
    members
}

/// A bucket's nodes, encoded and cut into pages (none if it is empty).
fn encode(tree: &Tree, paths: &BTreeSet<String>) -> Vec<Bytes> {
    if paths.is_empty() {
        return Vec::new();
    }
    let nodes: Vec<(&String, NodeRecord)> = paths
        .iter()
        .map(|p| (p, tree.record(p).expect("a member is a node")))
        .collect();
    let bytes = Bytes::from(upright_core::codec::to_bytes(&nodes));
    (0..bytes.len())
        .step_by(PAGE_BYTES_MAX)
        .map(|at| bytes.slice(at..(at + PAGE_BYTES_MAX).min(bytes.len())))
        .collect()
}

impl Clone for NodePages {
    fn clone(&self) -> NodePages {
        let pages = (0..self.pages.len())
            .map(|i| self.pages.get(i).expect("below len"))
            .collect();
        NodePages {
            pages: Pages::from_pages(pages),
            members: self.members.clone(),
        }
    }
}

impl PartialEq for NodePages {
    fn eq(&self, other: &NodePages) -> bool {
        let len = self.pages.len().max(other.pages.len());
        (0..len).all(|i| {
            let a = self.pages.get(i).unwrap_or_default();
            let b = other.pages.get(i).unwrap_or_default();
            a == b
        })
    }
}

impl Eq for NodePages {}

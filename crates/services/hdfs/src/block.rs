//! Block hashes (docs/HDFS.md, "Block hashes"): a BLAKE3 hash per 64 KiB sub-block, and the
//! block's hash over its length and the sub-block hashes. The NameNode commits the block hash; a
//! reader checks a DataNode's sub-block hashes against it, then each sub-block as it arrives, so
//! a corrupt replica is caught within 64 KiB.

use crate::namenode::Hash;

/// Bytes per sub-block (the last one of a block may be shorter).
pub const SUB_BLOCK_BYTES: usize = 64 * 1024;

/// The hash of one sub-block.
pub fn sub_hash(data: &[u8]) -> Hash {
    let mut h = blake3::Hasher::new_derive_key("upright-hdfs sub-block");
    h.update(data);
    *h.finalize().as_bytes()
}

/// The block hash of a block of `len` bytes with these sub-block hashes.
pub fn block_hash(len: u64, subs: &[Hash]) -> Hash {
    let mut h = blake3::Hasher::new_derive_key("upright-hdfs block");
    h.update(&len.to_le_bytes());
    for s in subs {
        h.update(s);
    }
    *h.finalize().as_bytes()
}

/// Sub-blocks a block of `len` bytes has.
pub fn sub_blocks(len: u64) -> usize {
    len.div_ceil(SUB_BLOCK_BYTES as u64) as usize
}

/// Whether `subs` are the sub-block hashes of a block of `len` bytes with hash `expected`.
pub fn subs_match(len: u64, subs: &[Hash], expected: &Hash) -> bool {
    subs.len() == sub_blocks(len) && block_hash(len, subs) == *expected
}

/// Hashes a block as its bytes arrive.
#[derive(Debug, Default)]
pub struct BlockHasher {
    len: u64,
    subs: Vec<Hash>,
    partial: Vec<u8>,
}

impl BlockHasher {
    /// No bytes yet.
    pub fn new() -> BlockHasher {
        BlockHasher::default()
    }

    /// Bytes so far.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether no byte came yet.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Takes the next bytes.
    pub fn update(&mut self, mut data: &[u8]) {
        self.len += data.len() as u64;
        if !self.partial.is_empty() {
            let take = (SUB_BLOCK_BYTES - self.partial.len()).min(data.len());
            self.partial.extend_from_slice(&data[..take]);
            data = &data[take..];
            if self.partial.len() == SUB_BLOCK_BYTES {
                self.subs.push(sub_hash(&self.partial));
                self.partial.clear();
            }
        }
        let mut chunks = data.chunks_exact(SUB_BLOCK_BYTES);
        for chunk in &mut chunks {
            self.subs.push(sub_hash(chunk));
        }
        self.partial.extend_from_slice(chunks.remainder());
    }

    /// The length, the sub-block hashes and the block hash.
    pub fn finish(mut self) -> (u64, Vec<Hash>, Hash) {
        if !self.partial.is_empty() {
            self.subs.push(sub_hash(&self.partial));
        }
        let hash = block_hash(self.len, &self.subs);
        (self.len, self.subs, hash)
    }
}

/// The length, sub-block hashes and block hash of `data`.
pub fn hash_block(data: &[u8]) -> (u64, Vec<Hash>, Hash) {
    let mut h = BlockHasher::new();
    h.update(data);
    h.finish()
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        /// Hashing in pieces of any sizes gives what hashing at once gives.
        #[test]
        fn streamed_hashing_matches_whole(len in 0..300_000usize, cuts in prop::collection::vec(0..70_000usize, 0..8)) {
            let data: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
            let whole = hash_block(&data);
            let mut h = BlockHasher::new();
            let mut rest = &data[..];
            for cut in cuts {
                let (a, b) = rest.split_at(cut.min(rest.len()));
                h.update(a);
                rest = b;
            }
            h.update(rest);
            prop_assert_eq!(h.finish(), whole.clone());
            prop_assert_eq!(whole.1.len(), sub_blocks(len as u64));
            prop_assert!(subs_match(whole.0, &whole.1, &whole.2));
        }
    }

    #[test]
    fn any_changed_byte_or_length_changes_the_hashes() {
        let data = vec![5u8; 3 * SUB_BLOCK_BYTES + 10];
        let (len, subs, hash) = hash_block(&data);
        let mut flipped = data.clone();
        flipped[2 * SUB_BLOCK_BYTES + 3] ^= 1;
        let (_, subs2, hash2) = hash_block(&flipped);
        assert_ne!(hash, hash2);
        assert_eq!(subs[..2], subs2[..2]);
        assert_ne!(subs[2], subs2[2], "the flip is in sub-block 2");
        assert!(!subs_match(len, &subs2, &hash));
        assert!(!subs_match(len - 1, &subs, &hash), "a length that disagrees");
        assert_ne!(hash_block(&data[..len as usize - 1]).2, hash);
    }
}

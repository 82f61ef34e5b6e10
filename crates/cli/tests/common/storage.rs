//! Damaging a replica's files the way a failing disk would.

use std::path::{Path, PathBuf};

/// Flips a byte near the start of every non-empty log and snapshot of the replica whose data
/// directory is `dir` (a damaged record with valid data after it: corruption, not a torn tail);
/// how many files it damaged.
pub fn corrupt_storage(dir: &Path) -> usize {
    let mut corrupted = 0;
    for stage in ["auth", "order", "exec"] {
        for file in ["log", "snapshot"] {
            let path: PathBuf = dir.join(stage).join(file);
            if let Ok(mut bytes) = std::fs::read(&path) {
                if bytes.len() > 64 {
                    bytes[10] ^= 0x5a;
                    std::fs::write(&path, bytes).unwrap();
                    corrupted += 1;
                }
            }
        }
    }
    corrupted
}

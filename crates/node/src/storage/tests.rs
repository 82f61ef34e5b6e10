use super::*;
use std::fs::OpenOptions;

fn opts() -> StorageOptions {
    StorageOptions {
        fsync: FsyncPolicy::Always,
        compact_log_bytes: 1 << 20,
        ..StorageOptions::default()
    }
}

fn b(s: &str) -> Bytes {
    Bytes::copy_from_slice(s.as_bytes())
}

/// The log's valid data; asserts that only zeros (allocated space) follow it.
fn data(dir: &Path) -> Vec<u8> {
    let mut bytes = fs::read(dir.join(LOG)).unwrap();
    let valid = match parse_records(&bytes).1 {
        Tail::Clean => bytes.len(),
        Tail::Zeros { valid_bytes } => valid_bytes as usize,
        other => panic!("log is not clean: {other:?}"),
    };
    bytes.truncate(valid);
    bytes
}

fn write_some(dir: &Path) -> Storage {
    let (mut log, storage, recovery) = StageLog::open(dir, opts()).unwrap();
    assert!(storage.is_empty());
    assert_eq!(recovery, Recovery::Fresh);
    log.append("order/view", Some(&b("1")));
    log.append("order/pp/1", Some(&b("batch one")));
    log.sync().unwrap();
    log.append("order/view", Some(&b("2")));
    log.append("order/pp/1", None);
    log.append("order/pp/2", Some(&b("batch two")));
    log.sync().unwrap();
    log.contents().clone()
}

#[test]
fn round_trip_recovers_the_last_value_of_every_key() {
    let dir = tempfile::tempdir().unwrap();
    let expected = write_some(dir.path());
    assert_eq!(expected.len(), 2);
    let (_, storage, recovery) = StageLog::open(dir.path(), opts()).unwrap();
    assert_eq!(recovery, Recovery::Clean);
    assert_eq!(storage, expected);
    assert_eq!(storage["order/view"], b("2"));
}

#[test]
fn unsynced_appends_are_not_on_disk_and_sync_groups_them() {
    let dir = tempfile::tempdir().unwrap();
    let (mut log, _, _) = StageLog::open(dir.path(), opts()).unwrap();
    log.append("a", Some(&b("1")));
    log.append("b", Some(&b("2")));
    assert!(log.is_dirty());
    let (_, before, _) = StageLog::open(dir.path(), opts()).unwrap();
    assert!(before.is_empty());
    assert!(log.sync().unwrap().is_some());
    assert!(!log.is_dirty());
    assert_eq!(log.stats().syncs, 1);
    assert_eq!(log.sync().unwrap(), None, "nothing pending: no fsync");
}

#[test]
fn torn_tail_is_truncated_and_earlier_records_survive() {
    let dir = tempfile::tempdir().unwrap();
    let expected = write_some(dir.path());
    let path = dir.path().join(LOG);
    let full = data(dir.path());
    // An interrupted append to a file that was not preallocated (an older log, or a file system
    // that refuses): half of a new record at the end of the file.
    let mut extra = Vec::new();
    encode_record("order/view", Some(&b("3")), &mut extra);
    let mut torn = full.clone();
    torn.extend_from_slice(&extra[..extra.len() / 2]);
    fs::write(&path, &torn).unwrap();
    let (mut log, storage, recovery) = StageLog::open(dir.path(), opts()).unwrap();
    assert_eq!(
        recovery,
        Recovery::TornTail {
            truncated_bytes: (extra.len() / 2) as u64
        }
    );
    assert_eq!(storage, expected);
    assert_eq!(data(dir.path()), full, "the torn bytes are gone");
    assert_eq!(log.log_bytes(), full.len() as u64);
    // Appending after the truncation works and recovers.
    log.append("x", Some(&b("y")));
    log.sync().unwrap();
    let (_, storage, recovery) = StageLog::open(dir.path(), opts()).unwrap();
    assert_eq!(recovery, Recovery::Clean);
    assert_eq!(storage["x"], b("y"));
}

#[test]
fn corrupted_middle_record_moves_files_aside_and_starts_empty() {
    let dir = tempfile::tempdir().unwrap();
    write_some(dir.path());
    let path = dir.path().join(LOG);
    let mut bytes = fs::read(&path).unwrap();
    bytes[12] ^= 0xff; // inside the first record's payload
    fs::write(&path, &bytes).unwrap();
    let (mut log, storage, recovery) = StageLog::open(dir.path(), opts()).unwrap();
    assert!(storage.is_empty(), "never serve from damaged data");
    match recovery {
        Recovery::Corrupted { reason, moved_to } => {
            assert!(reason.contains("checksum"), "{reason}");
            assert_eq!(fs::read(moved_to.join(LOG)).unwrap(), bytes);
        }
        other => panic!("expected corruption, got {other:?}"),
    }
    // The fresh log is usable.
    log.append("a", Some(&b("1")));
    log.sync().unwrap();
    let (_, storage, recovery) = StageLog::open(dir.path(), opts()).unwrap();
    assert_eq!(recovery, Recovery::Clean);
    assert_eq!(storage.len(), 1);
}

#[test]
fn compaction_keeps_the_state_and_shrinks_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let small = StorageOptions {
        fsync: FsyncPolicy::Never,
        compact_log_bytes: 4096,
        ..StorageOptions::default()
    };
    let (mut log, _, _) = StageLog::open(dir.path(), small).unwrap();
    for i in 0..2000u32 {
        log.append(&format!("k/{}", i % 10), Some(&Bytes::from(i.to_le_bytes().to_vec())));
        if i % 7 == 0 {
            log.append(&format!("k/{}", (i + 3) % 10), None);
        }
        log.sync().unwrap();
    }
    assert!(log.stats().compactions > 0);
    // A compaction may still be in flight, during which the log grows up to the backlog bound.
    assert!(log.log_bytes() <= COMPACTION_BACKLOG_FACTOR * 4096 + 64);
    log.wait_compaction().unwrap();
    let expected = log.contents().clone();
    drop(log);
    let (_, storage, recovery) = StageLog::open(dir.path(), small).unwrap();
    assert_eq!(recovery, Recovery::Clean);
    assert_eq!(storage, expected);
}

#[test]
fn crash_between_snapshot_write_and_rename_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let expected = write_some(dir.path());
    let (log, _, _) = StageLog::open(dir.path(), opts()).unwrap();
    // Crash after writing snapshot.tmp, before the rename: the old files are authoritative.
    log.write_snapshot_tmp().unwrap();
    drop(log);
    // Make the leftover partial, as an interrupted write would.
    let tmp = dir.path().join(SNAPSHOT_TMP);
    let bytes = fs::read(&tmp).unwrap();
    fs::write(&tmp, &bytes[..bytes.len() - 3]).unwrap();
    let (_, storage, recovery) = StageLog::open(dir.path(), opts()).unwrap();
    assert_eq!(recovery, Recovery::Clean);
    assert_eq!(storage, expected);
    assert!(!tmp.exists(), "leftover temporary file is removed");
}

#[test]
fn crash_between_snapshot_rename_and_log_reset_replays_idempotently() {
    let dir = tempfile::tempdir().unwrap();
    let expected = write_some(dir.path());
    let old_log = fs::read(dir.path().join(LOG)).unwrap();
    let (mut log, _, _) = StageLog::open(dir.path(), opts()).unwrap();
    log.compact().unwrap();
    drop(log);
    assert!(data(dir.path()).is_empty());
    // Put the old log back: the state must still be the same.
    fs::write(dir.path().join(LOG), &old_log).unwrap();
    let (_, storage, _) = StageLog::open(dir.path(), opts()).unwrap();
    assert_eq!(storage, expected);
}

#[test]
fn damaged_snapshot_is_corruption() {
    let dir = tempfile::tempdir().unwrap();
    write_some(dir.path());
    let (mut log, _, _) = StageLog::open(dir.path(), opts()).unwrap();
    log.compact().unwrap();
    drop(log);
    let path = dir.path().join(SNAPSHOT);
    let bytes = fs::read(&path).unwrap();
    // Truncated snapshot (end marker missing) and a flipped byte are both refused.
    fs::write(&path, &bytes[..bytes.len() - 1]).unwrap();
    let (_, storage, recovery) = StageLog::open(dir.path(), opts()).unwrap();
    assert!(storage.is_empty());
    assert!(matches!(recovery, Recovery::Corrupted { .. }), "{recovery:?}");
}

/// Writes `bytes` at `offset` without changing the file's length (as a write into allocated space).
fn overwrite(path: &Path, offset: u64, bytes: &[u8]) {
    use std::os::unix::fs::FileExt;
    let file = OpenOptions::new().write(true).open(path).unwrap();
    let len = file.metadata().unwrap().len();
    file.write_all_at(bytes, offset).unwrap();
    assert_eq!(
        file.metadata().unwrap().len(),
        len,
        "the write stays inside the allocated space"
    );
}

#[test]
fn restart_with_a_preallocated_tail_is_clean_keeps_every_record_and_does_not_truncate() {
    let dir = tempfile::tempdir().unwrap();
    let mut expected = write_some(dir.path());
    let path = dir.path().join(LOG);
    let mut written = data(dir.path()).len() as u64;
    assert_eq!(
        fs::metadata(&path).unwrap().len(),
        LOG_PREALLOC_BYTES,
        "one chunk allocated"
    );
    for round in 0..2 {
        let (mut log, storage, recovery) = StageLog::open(dir.path(), opts()).unwrap();
        assert_eq!(recovery, Recovery::Clean, "round {round}");
        assert_eq!(storage, expected);
        assert_eq!(
            log.log_bytes(),
            written,
            "log_bytes is the data, not the allocated size"
        );
        assert_eq!(log.allocated_bytes(), LOG_PREALLOC_BYTES);
        assert_eq!(log.stats().preallocations, 0, "nothing allocated again on restart");
        assert_eq!(fs::metadata(&path).unwrap().len(), LOG_PREALLOC_BYTES, "not truncated");
        if round == 0 {
            // An append after the restart goes right after the data.
            log.append("order/pp/3", Some(&b("batch three")));
            log.sync().unwrap();
            let mut one = Vec::new();
            encode_record("order/pp/3", Some(&b("batch three")), &mut one);
            written += one.len() as u64;
            assert_eq!(log.log_bytes(), written);
            expected.insert("order/pp/3".into(), b("batch three"));
        }
    }
}

#[test]
fn a_torn_record_inside_the_preallocated_space_is_a_torn_tail_and_later_appends_survive() {
    let dir = tempfile::tempdir().unwrap();
    let expected = write_some(dir.path());
    let path = dir.path().join(LOG);
    let valid = data(dir.path());
    // An interrupted group commit: a long record, its last bytes never written (still zeros).
    let mut extra = Vec::new();
    encode_record("order/pp/9", Some(&Bytes::from(vec![7u8; 300])), &mut extra);
    let torn = &extra[..extra.len() - 40];
    overwrite(&path, valid.len() as u64, torn);
    let (mut log, storage, recovery) = StageLog::open(dir.path(), opts()).unwrap();
    assert_eq!(
        recovery,
        Recovery::TornTail {
            truncated_bytes: torn.len() as u64
        }
    );
    assert_eq!(storage, expected);
    assert_eq!(log.log_bytes(), valid.len() as u64);
    let bytes = fs::read(&path).unwrap();
    assert_eq!(&bytes[..valid.len()], &valid[..]);
    assert!(
        bytes[valid.len()..].iter().all(|&b| b == 0),
        "the torn bytes are zeros again"
    );
    assert!(bytes.len() as u64 > log.log_bytes(), "allocated again after the cut");
    // A short append over where the torn record was, then a restart: Clean, everything read back.
    log.append("x", Some(&b("y")));
    log.sync().unwrap();
    drop(log);
    let (_, storage, recovery) = StageLog::open(dir.path(), opts()).unwrap();
    assert_eq!(recovery, Recovery::Clean);
    assert_eq!(storage["x"], b("y"));
    assert_eq!(storage.len(), expected.len() + 1);
}

#[test]
fn damage_before_more_data_inside_the_preallocated_space_is_corruption() {
    let dir = tempfile::tempdir().unwrap();
    write_some(dir.path());
    let path = dir.path().join(LOG);
    let valid = data(dir.path()).len() as u64;
    // Garbage, then a zero gap, then a valid record: not an interrupted last write.
    let mut record = Vec::new();
    encode_record("k", Some(&b("v")), &mut record);
    overwrite(&path, valid, &[0xde, 0xad, 0xbe, 0xef, 1, 2, 3, 4, 5]);
    overwrite(&path, valid + 4096, &record);
    let (_, storage, recovery) = StageLog::open(dir.path(), opts()).unwrap();
    assert!(storage.is_empty());
    assert!(matches!(recovery, Recovery::Corrupted { .. }), "{recovery:?}");
}

#[test]
fn writes_cross_chunk_boundaries_and_groups_larger_than_a_chunk_fit() {
    let dir = tempfile::tempdir().unwrap();
    let big = StorageOptions {
        fsync: FsyncPolicy::Always,
        compact_log_bytes: 64 << 20,
        ..StorageOptions::default()
    };
    let (mut log, _, _) = StageLog::open(dir.path(), big).unwrap();
    assert_eq!(log.stats().preallocations, 1, "the first chunk is allocated at open");
    let value = Bytes::from(vec![0x5au8; 64 << 10]);
    let mut written = 0u64;
    // Small groups up to past the first boundary...
    let mut i = 0;
    while written <= LOG_PREALLOC_BYTES {
        log.append(&format!("k/{i}"), Some(&value));
        log.sync().unwrap();
        written = log.log_bytes();
        i += 1;
    }
    assert_eq!(log.allocated_bytes(), 2 * LOG_PREALLOC_BYTES);
    assert_eq!(log.stats().preallocations, 2);
    // ...then one group larger than a chunk.
    for _ in 0..(LOG_PREALLOC_BYTES / value.len() as u64 + 2) {
        log.append(&format!("k/{i}"), Some(&value));
        i += 1;
    }
    log.sync().unwrap();
    assert!(log.log_bytes() > 2 * LOG_PREALLOC_BYTES);
    assert_eq!(
        log.allocated_bytes(),
        log.log_bytes().div_ceil(LOG_PREALLOC_BYTES) * LOG_PREALLOC_BYTES
    );
    assert_eq!(log.stats().compactions, 0);
    let expected = log.contents().clone();
    let log_bytes = log.log_bytes();
    drop(log);
    let (log, storage, recovery) = StageLog::open(dir.path(), big).unwrap();
    assert_eq!(recovery, Recovery::Clean);
    assert_eq!(storage.len(), i);
    assert_eq!(storage, expected);
    assert_eq!(log.log_bytes(), log_bytes);
}

#[test]
fn compaction_follows_the_data_size_and_starts_a_preallocated_log() {
    let dir = tempfile::tempdir().unwrap();
    let small = StorageOptions {
        fsync: FsyncPolicy::Always,
        compact_log_bytes: 4096,
        ..StorageOptions::default()
    };
    let (mut log, _, _) = StageLog::open(dir.path(), small).unwrap();
    log.append("a", Some(&b("1")));
    log.sync().unwrap();
    assert!(log.allocated_bytes() > 4096);
    assert_eq!(
        log.stats().compactions,
        0,
        "the allocated size does not count toward compaction"
    );
    let mut i = 0u32;
    while log.stats().compactions == 0 {
        log.append(&format!("k/{}", i % 5), Some(&Bytes::from(vec![i as u8; 100])));
        log.sync().unwrap();
        i += 1;
    }
    assert!(i > 30, "compacted only once the data passed the bound ({i} writes)");
    assert_eq!(log.log_bytes(), 0);
    assert_eq!(
        log.allocated_bytes(),
        LOG_PREALLOC_BYTES,
        "the fresh log is preallocated"
    );
    assert_eq!(fs::metadata(dir.path().join(LOG)).unwrap().len(), LOG_PREALLOC_BYTES);
    log.append("after", Some(&b("compaction")));
    log.sync().unwrap();
    let expected = log.contents().clone();
    drop(log);
    let (_, storage, recovery) = StageLog::open(dir.path(), small).unwrap();
    assert_eq!(recovery, Recovery::Clean);
    assert_eq!(storage, expected);
    assert_eq!(storage["after"], b("compaction"));
}

#[test]
fn lazy_writes_are_written_in_order_but_synced_only_with_an_eager_one() {
    let dir = tempfile::tempdir().unwrap();
    let (mut log, _, _) = StageLog::open(dir.path(), opts()).unwrap();
    log.append("a", Some(&b("1")));
    log.sync().unwrap();
    assert_eq!(log.stats().syncs, 1);
    // Only lazy writes pending: written (a restart of the process reads them back from the
    // file) but no fsync.
    log.append_lazily("b", Some(&b("2")));
    assert!(log.is_dirty());
    assert_eq!(log.sync().unwrap(), None);
    assert!(!log.is_dirty());
    assert_eq!(log.stats().syncs, 1, "no fsync for lazy writes alone");
    // An eager write after a lazy one: one fsync covers both, in order.
    log.append_lazily("b", Some(&b("3")));
    log.append("c", Some(&b("4")));
    assert!(log.sync().unwrap().is_some());
    assert_eq!(log.stats().syncs, 2);
    drop(log);
    let (_, storage, recovery) = StageLog::open(dir.path(), opts()).unwrap();
    assert_eq!(recovery, Recovery::Clean);
    assert_eq!(storage.get("b"), Some(&b("3")));
    assert_eq!(storage.get("c"), Some(&b("4")));
}

/// Appends 1-KiB values under 8 keys, syncing each, until a sync starts a compaction; returns the
/// number of appends.
fn fill_until_compaction(log: &mut StageLog) -> u32 {
    let mut i = 0u32;
    while log.stats().compactions == 0 {
        log.append(&format!("auth/body/{}", i % 8), Some(&Bytes::from(vec![i as u8; 1024])));
        log.sync()
            .expect("a sync that passes the bound does not write the snapshot itself");
        i += 1;
    }
    i
}

fn small_always() -> StorageOptions {
    StorageOptions {
        fsync: FsyncPolicy::Always,
        compact_log_bytes: 16 << 10,
        ..StorageOptions::default()
    }
}

#[test]
fn the_sync_that_passes_the_bound_only_rotates_the_log_and_the_snapshot_is_written_in_the_background() {
    // The 4/0 bench's ~500 ms tail: every authentication member wrote its tens-of-MB snapshot
    // inside `sync`, on the event loop. Here the snapshot cannot be written at all (its temporary
    // name is a directory): the triggering sync must still succeed, the failure shows up only when
    // the background work is collected, and nothing is lost.
    let dir = tempfile::tempdir().unwrap();
    let (mut log, _, _) = StageLog::open(dir.path(), small_always()).unwrap();
    fs::create_dir(dir.path().join(SNAPSHOT_TMP)).unwrap();
    fill_until_compaction(&mut log);
    assert_eq!(log.log_bytes(), 0, "a fresh log took over");
    assert!(
        dir.path().join(LOG_PREV).exists(),
        "the old log is kept until a snapshot covers it"
    );
    assert!(log.wait_compaction().is_err(), "the background snapshot failed");
    log.append("after", Some(&b("rotation")));
    log.sync().unwrap();
    let expected = log.contents().clone();
    drop(log);
    fs::remove_dir(dir.path().join(SNAPSHOT_TMP)).unwrap();
    // Recovery: no snapshot, log.prev, then log; the interrupted compaction is finished at open.
    let (log, storage, recovery) = StageLog::open(dir.path(), small_always()).unwrap();
    assert_eq!(recovery, Recovery::Clean);
    assert_eq!(storage, expected);
    assert!(!dir.path().join(LOG_PREV).exists());
    assert!(dir.path().join(SNAPSHOT).exists());
    drop(log);
    let (_, storage, _) = StageLog::open(dir.path(), small_always()).unwrap();
    assert_eq!(storage, expected);
}

#[test]
fn a_failed_background_compaction_is_not_overwritten_by_the_next_rotation() {
    let dir = tempfile::tempdir().unwrap();
    let (mut log, _, _) = StageLog::open(dir.path(), small_always()).unwrap();
    fs::create_dir(dir.path().join(SNAPSHOT_TMP)).unwrap();
    fill_until_compaction(&mut log);
    assert!(log.wait_compaction().is_err());
    fs::remove_dir(dir.path().join(SNAPSHOT_TMP)).unwrap();
    // The next compaction finds log.prev and compacts on the spot (covering and deleting it).
    let before = log.stats().compactions;
    while log.stats().compactions == before {
        log.append("k", Some(&Bytes::from(vec![7u8; 1024])));
        log.sync().unwrap();
    }
    assert!(!log.compacting());
    assert!(!dir.path().join(LOG_PREV).exists());
    let expected = log.contents().clone();
    drop(log);
    let (_, storage, recovery) = StageLog::open(dir.path(), small_always()).unwrap();
    assert_eq!(recovery, Recovery::Clean);
    assert_eq!(storage, expected);
}

#[test]
fn background_compaction_completes_and_every_crash_point_recovers_the_state() {
    let dir = tempfile::tempdir().unwrap();
    let (mut log, _, _) = StageLog::open(dir.path(), small_always()).unwrap();
    fill_until_compaction(&mut log);
    // The old log, as it was at the rotation (the thread may delete it any moment).
    let prev = fs::read(dir.path().join(LOG_PREV)).ok();
    log.wait_compaction().unwrap();
    assert!(!dir.path().join(LOG_PREV).exists());
    for i in 0..5u32 {
        log.append(&format!("auth/body/{i}"), None);
        log.append("later", Some(&Bytes::from(i.to_le_bytes().to_vec())));
        log.sync().unwrap();
    }
    let expected = log.contents().clone();
    drop(log);
    let (_, storage, recovery) = StageLog::open(dir.path(), small_always()).unwrap();
    assert_eq!(recovery, Recovery::Clean);
    assert_eq!(storage, expected);
    // Crash after the snapshot rename, before log.prev was deleted: replaying it over the new
    // snapshot is idempotent.
    if let Some(prev) = prev {
        fs::write(dir.path().join(LOG_PREV), prev).unwrap();
        let (_, storage, _) = StageLog::open(dir.path(), small_always()).unwrap();
        assert_eq!(storage, expected);
        assert!(!dir.path().join(LOG_PREV).exists());
    }
}

#[test]
fn crash_between_the_two_renames_of_a_rotation_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let expected = write_some(dir.path());
    // log -> log.prev done, fresh log not yet renamed into place.
    fs::rename(dir.path().join(LOG), dir.path().join(LOG_PREV)).unwrap();
    let (_, storage, recovery) = StageLog::open(dir.path(), opts()).unwrap();
    assert_eq!(recovery, Recovery::Clean);
    assert_eq!(storage, expected);
    assert!(!dir.path().join(LOG_PREV).exists());
}

#[test]
fn a_log_of_mostly_live_records_is_not_rewritten_at_the_bound_but_once_half_of_it_is_superseded() {
    // An authentication member logs a new 4-KiB body per request and deletes it only after
    // `3 * checkpoint_interval + 1` newer ones of the same client: for a long time nearly all of
    // its log is live, and rewriting it at every `compact_log_bytes` only doubled the disk writes.
    let dir = tempfile::tempdir().unwrap();
    let (mut log, _, _) = StageLog::open(dir.path(), small_always()).unwrap();
    let body = Bytes::from(vec![1u8; 4096]);
    for i in 0..40u32 {
        log.append(&format!("auth/body/{i:04}"), Some(&body));
        log.sync().unwrap();
    }
    assert!(log.log_bytes() > 8 * (16 << 10), "far past the bound");
    assert_eq!(log.stats().compactions, 0, "everything in the log is live");
    // Evict the oldest bodies: once the log is twice the live state, it is compacted.
    let mut evicted = 0u32;
    while log.stats().compactions == 0 {
        log.append(&format!("auth/body/{evicted:04}"), None);
        log.sync().unwrap();
        evicted += 1;
    }
    assert!(
        log.log_bytes() == 0 && (19..=21).contains(&evicted),
        "compacted when half of the bodies were gone ({evicted} evicted)"
    );
    log.wait_compaction().unwrap();
    let expected = log.contents().clone();
    assert_eq!(expected.len(), 40 - evicted as usize);
    drop(log);
    let (_, storage, recovery) = StageLog::open(dir.path(), small_always()).unwrap();
    assert_eq!(recovery, Recovery::Clean);
    assert_eq!(storage, expected);
}

#[test]
fn the_testing_fsync_delay_is_added_to_each_sync() {
    let dir = tempfile::tempdir().unwrap();
    let slow = StorageOptions {
        fsync_delay: std::time::Duration::from_millis(20),
        ..opts()
    };
    let (mut log, _, _) = StageLog::open(dir.path(), slow).unwrap();
    log.append("order/x", Some(&Bytes::from_static(b"1")));
    let took = log.sync().unwrap().expect("an eager persist is synced");
    assert!(took >= std::time::Duration::from_millis(20), "took {took:?}");
    log.append_lazily("order/y", Some(&Bytes::from_static(b"2")));
    assert_eq!(
        log.sync().unwrap(),
        None,
        "a lazy persist alone is written, not synced (no delay)"
    );
}

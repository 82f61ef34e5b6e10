use super::*;

fn opts() -> StorageOptions {
    StorageOptions {
        fsync: FsyncPolicy::Always,
        compact_log_bytes: 1 << 20,
    }
}

fn b(s: &str) -> Bytes {
    Bytes::copy_from_slice(s.as_bytes())
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
    let full = fs::read(&path).unwrap();
    // An interrupted append: half of a new record.
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
    assert_eq!(fs::read(&path).unwrap(), full, "the torn bytes are gone");
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
    assert!(log.log_bytes() <= 4096 + 64);
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
    assert!(fs::read(dir.path().join(LOG)).unwrap().is_empty());
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

//! Snapshots from a peer (state transfer) or the disk: a checkpoint of the Redis store or the
//! ZooKeeper service restored from any bytes. One that restores must checkpoint to bytes that
//! restore to the same state.
#![no_main]

use libfuzzer_sys::fuzz_target;
use upright_core::service::Service;
use upright_kv::store::RedisStore;
use upright_zk::service::ZkService;

fn round_trip<S: Service>(mut fresh: impl FnMut() -> S, data: &[u8]) {
    let mut service = fresh();
    if service.restore(data).is_err() {
        return;
    }
    let checkpoint = service.checkpoint();
    let mut again = fresh();
    again.restore(&checkpoint).expect("a checkpoint restores");
    assert_eq!(again.checkpoint(), checkpoint, "restore and checkpoint round-trip");
}

fuzz_target!(|data: &[u8]| {
    round_trip(RedisStore::new, data);
    round_trip(ZkService::new, data);
});

//! The store under selective execution: its rules (selective.rs) checked directly, and a
//! proptest of the rule everything rests on (a request's reply and the state of its keys
//! after it depend only on the state of its keys before it and on its own agreed context).

use bytes::Bytes;
use proptest::prelude::*;
use upright_core::ids::{ClientId, RequestId, SeqNo};
use upright_core::service::{BatchContext, Effects, Service, ServiceRequest};

use super::selective::EXPIRY_GRID_MS;
use super::RedisStore;
use crate::reply::Reply;

fn selective() -> RedisStore {
    let mut s = RedisStore::new();
    assert!(s.enable_selective_execution());
    s
}

fn words(line: &str) -> Vec<Bytes> {
    line.split(' ').map(|w| Bytes::copy_from_slice(w.as_bytes())).collect()
}

fn request(client: u32, id: u64, lines: &[&str]) -> ServiceRequest {
    let commands: Vec<Vec<Bytes>> = lines.iter().map(|l| words(l)).collect();
    ServiceRequest {
        client: ClientId(client),
        request_id: RequestId(id),
        operation: crate::encode_operation(&commands),
    }
}

fn context(time_ms: u64, seed: u8) -> BatchContext {
    BatchContext {
        index: 0,
        seqno: SeqNo(time_ms),
        time_us: time_ms * 1000,
        seed: [seed; 32],
    }
}

/// Runs `request` alone at `time_ms`: its replies.
fn run(s: &mut RedisStore, time_ms: u64, request: &ServiceRequest) -> Vec<Reply> {
    let out = s.execute(
        &context(time_ms, 7),
        std::slice::from_ref(request),
        &mut Effects::default(),
    );
    crate::decode_replies(&out[0]).expect("replies")
}

fn run_line(s: &mut RedisStore, time_ms: u64, id: u64, line: &str) -> Reply {
    run(s, time_ms, &request(1, id, &[line])).remove(0)
}

fn keys_of(s: &RedisStore) -> Vec<Bytes> {
    s.map.keys().cloned().collect()
}

#[test]
fn object_functions_exist_only_under_selective_execution() {
    let mut plain = RedisStore::new();
    cmd_set(&mut plain);
    assert_eq!(plain.object_state(b"k"), None);
    assert!(plain.restore_object(b"k", None).is_err());
    let mut s = selective();
    cmd_set(&mut s);
    assert!(matches!(s.object_state(b"k"), Some(Some(_))));
    assert_eq!(s.object_state(b"absent"), Some(None));
}

fn cmd_set(s: &mut RedisStore) {
    run_line(s, 1000, 1, "SET k v");
}

/// A store rebuilt key by key from another's key states has the same checkpoint, even though
/// the two ran different requests at different times last (the clock and the random draws are
/// left out of the checkpoint under selective execution).
#[test]
fn a_store_rebuilt_key_by_key_checkpoints_alike() {
    let mut a = selective();
    for (i, line) in [
        "SET s v EX 100",
        "RPUSH l a b c",
        "SADD set x y z",
        "ZADD z 1 a 2 b",
        "HSET h f v g w",
        "INCR n",
        "SPOP set",
    ]
    .iter()
    .enumerate()
    {
        run_line(&mut a, 1000 + i as u64, i as u64 + 1, line);
    }
    let mut b = selective();
    run_line(&mut b, 50_000, 99, "SET s other");
    for key in keys_of(&a).into_iter().chain([Bytes::from_static(b"s")]) {
        let state = a.object_state(&key).unwrap();
        b.restore_object(&key, state.as_deref()).unwrap();
    }
    assert_eq!(a.checkpoint(), b.checkpoint());
    assert_eq!(a.used, b.used);
    let mut c = selective();
    c.restore(&a.checkpoint()).unwrap();
    assert!(c.selective, "a restore keeps the mode");
    assert_eq!(c.checkpoint(), a.checkpoint());
}

/// A replay runs at the request's own agreed time, even after the member ran later requests: an
/// expiry set then counts from then, and a key past its expiry is gone when a request names it.
#[test]
fn a_replay_runs_at_its_own_time() {
    let set = request(1, 1, &["SET k v PX 100"]);
    let get = request(1, 2, &["GET k", "PTTL k"]);
    let mut a = selective();
    run(&mut a, 1000, &set);
    let a_get = run(&mut a, 1050, &get);
    assert_eq!(a_get, vec![Reply::text("v"), Reply::Int(50)]);
    let mut b = selective();
    run_line(&mut b, 9000, 3, "SET other x"); // a later request on another key first
    run(&mut b, 1000, &set);
    assert_eq!(run(&mut b, 1050, &get), a_get);
    assert_eq!(a.object_state(b"k"), b.object_state(b"k"));
    // Past its expiry, a request that names it finds it gone (and removes it).
    assert_eq!(run_line(&mut a, 1200, 4, "EXISTS k"), Reply::Int(0));
    assert_eq!(a.object_state(b"k"), Some(None));
}

/// Random draws come from the batch seed, the client and the request number, not from draws
/// made earlier in the batch (which a member that skipped them did not make).
#[test]
fn random_draws_do_not_depend_on_other_requests() {
    let fill = request(1, 1, &["SADD s a b c d e f g h i j k l m n o p"]);
    let spop = request(2, 5, &["SPOP s 3"]);
    let mut a = selective();
    run(&mut a, 1000, &fill);
    let mut b = a.clone();
    let ctx = context(2000, 3);
    let other = request(3, 9, &["SADD t a b c", "SPOP t"]);
    let with_other = a.execute(&ctx, &[other, spop.clone()], &mut Effects::default());
    let alone = b.execute(&ctx, std::slice::from_ref(&spop), &mut Effects::default());
    assert_eq!(with_other[1], alone[0]);
    assert_eq!(a.object_state(b"s"), b.object_state(b"s"));
}

#[test]
fn what_a_write_would_change_elsewhere_is_refused() {
    let mut s = selective();
    for line in [
        "upright.block tok BLPOP l 0",
        "upright.watch tok k",
        "upright.notify-config KEA",
    ] {
        let reply = run_line(&mut s, 1000, 1, line);
        let Reply::Error(text) = &reply else {
            panic!("{line}: {reply:?}")
        };
        assert!(
            text.contains("not available under selective execution"),
            "{line}: {text}"
        );
    }
    assert_eq!(
        run_line(&mut s, 1000, 2, "upright.notify-config "),
        Reply::ok(),
        "turning them off is fine"
    );
    assert!(s.blocked == Default::default() && s.watches.rows().is_empty() && s.notify == 0);
    // A large reply to a request on keys cannot be kept for fetching; to a global one it can.
    let big = "v".repeat(300 * 1024);
    run_line(&mut s, 1000, 3, &format!("SET big {big}"));
    let reply = run_line(&mut s, 1000, 4, "GET big");
    assert!(
        matches!(&reply, Reply::Error(t) if t.contains("selective execution")),
        "{reply:?}"
    );
    assert!(matches!(run_line(&mut s, 1000, 5, "KEYS *"), Reply::Array(_)));
    let mut plain = RedisStore::new();
    run_line(&mut plain, 1000, 3, &format!("SET big {big}"));
    assert!(matches!(run_line(&mut plain, 1000, 4, "GET big"), Reply::Large { .. }));
}

/// The memory bound is checked against the store as of the last checkpoint.
#[test]
fn the_memory_bound_counts_the_agreed_store() {
    let mut s = selective();
    run_line(&mut s, 1000, 1, "SET k v");
    assert!(s.used > 0);
    assert_eq!(s.used_for_bound(), 0, "no checkpoint yet");
    s.checkpoint();
    assert_eq!(s.used_for_bound(), s.used);
    let mut plain = RedisStore::new();
    run_line(&mut plain, 1000, 1, "SET k v");
    assert_eq!(plain.used_for_bound(), plain.used);
}

/// Keys nobody names are removed at wake-ups on the expiry grid, by the grid point, so members
/// that wake for different keys remove the same ones at the same batch.
#[test]
fn wake_ups_remove_expired_keys_by_the_grid() {
    let mut s = selective();
    let t0 = 10 * EXPIRY_GRID_MS;
    run_line(&mut s, t0, 1, "SET a v PX 100");
    run_line(&mut s, t0, 2, &format!("SET b v PX {}", EXPIRY_GRID_MS + 500));
    let first = (t0 + EXPIRY_GRID_MS) * 1000;
    assert_eq!(s.wake_at(), Some(first), "the grid point after a's expiry");
    s.wake(&context(t0 + EXPIRY_GRID_MS + 200, 0), &mut Effects::default());
    assert_eq!(
        keys_of(&s),
        vec![Bytes::from_static(b"b")],
        "a expired before the grid point; b not"
    );
    assert_eq!(s.wake_at(), Some(first + EXPIRY_GRID_MS * 1000));
    // b expired at t0 + grid + 500, after the grid point: a wake-up at + 600 leaves it.
    s.wake(&context(t0 + EXPIRY_GRID_MS + 600, 0), &mut Effects::default());
    assert_eq!(keys_of(&s).len(), 1);
    // A global request removes every expired key at its own time.
    assert_eq!(run_line(&mut s, t0 + EXPIRY_GRID_MS + 600, 3, "DBSIZE"), Reply::Int(0));
}

/// Commands drawn for the proptest: keys from a small set so requests collide.
fn command() -> impl Strategy<Value = String> {
    let key = prop::sample::select(vec!["a", "b", "c"]);
    let n = 0..5u32;
    (key.clone(), key, n, 0..18u32).prop_map(|(k, k2, n, which)| match which {
        0 => format!("SET {k} v{n}"),
        1 => format!("SET {k} v{n} PX {}", 50 + n * 40),
        2 => format!("GET {k}"),
        3 => format!("APPEND {k} x{n}"),
        4 => format!("INCR {k}"),
        5 => format!("PEXPIRE {k} {}", 30 + n * 50),
        6 => format!("PTTL {k}"),
        7 => format!("RPUSH {k} e{n} f{n}"),
        8 => format!("LPOP {k}"),
        9 => format!("SADD {k} m{n} m{} m{}", n + 1, n + 2),
        10 => format!("SPOP {k}"),
        11 => format!("SRANDMEMBER {k} -3"),
        12 => format!("ZADD {k} {n} z{n}"),
        13 => format!("HSET {k} f{n} v"),
        14 => format!("HRANDFIELD {k} 2"),
        15 => format!("DEL {k}"),
        16 => format!("RENAME {k} {k2}"),
        _ => format!("SMOVE {k} {k2} m{n}"),
    })
}

fn history() -> impl Strategy<Value = Vec<(String, u64)>> {
    prop::collection::vec((command(), 0..400u64), 0..25)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// ODRC's rule for a service: two members whose copies of a request's keys agree, whatever
    /// else they ran (other keys, other times, other random draws), give the request the same
    /// reply and leave its keys alike, at any agreed time (a replay's is older than the
    /// member's newest).
    #[test]
    fn a_reply_depends_only_on_the_keys_it_names(
        first in history(),
        second in history(),
        last in prop::collection::vec(command(), 1..3),
        at in 0..500u64,
    ) {
        let mut a = selective();
        let mut b = selective();
        for (store, history, client) in [(&mut a, &first, 1), (&mut b, &second, 2)] {
            let mut time = 1000;
            for (i, (line, step)) in history.iter().enumerate() {
                time += step;
                run(store, time, &request(client, i as u64 + 1, &[line.as_str()]));
            }
        }
        let lines: Vec<&str> = last.iter().map(String::as_str).collect();
        let req = request(5, 77, &lines);
        let access = a.access(&req.operation).expect("keyed commands");
        let named: Vec<Bytes> = access.reads.iter().chain(&access.writes).cloned().collect();
        for key in &named {
            let state = a.object_state(key).unwrap();
            b.restore_object(key, state.as_deref()).unwrap();
        }
        let time = 1000 + at * 10;
        prop_assert_eq!(run(&mut a, time, &req), run(&mut b, time, &req));
        for key in &named {
            prop_assert_eq!(a.object_state(key), b.object_state(key), "key {:?}", key);
        }
    }
}

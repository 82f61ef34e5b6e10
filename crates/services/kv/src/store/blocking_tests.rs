//! Blocking commands and transactions through `Service::execute`, as the replicas run them.

use bytes::Bytes;
use upright_core::ids::{ClientId, RequestId, SeqNo};
use upright_core::service::{BatchContext, Effects, Service, ServiceRequest};

use super::tests::{bulk, int};
use super::{encode_transaction, Pushed, RedisStore};
use crate::reply::Reply;

fn words(line: &str) -> Vec<Bytes> {
    line.split(' ').map(|w| Bytes::copy_from_slice(w.as_bytes())).collect()
}

/// Runs one request of `client` (its commands, each a line) at agreed time `ms`: its replies and
/// the pushes of the batch (client, token).
fn run(s: &mut RedisStore, ms: u64, client: u32, lines: &[&str]) -> (Vec<Reply>, Vec<(u32, Pushed)>) {
    let commands: Vec<Vec<Bytes>> = lines.iter().map(|l| words(l)).collect();
    run_argv(s, ms, client, commands)
}

fn run_argv(s: &mut RedisStore, ms: u64, client: u32, commands: Vec<Vec<Bytes>>) -> (Vec<Reply>, Vec<(u32, Pushed)>) {
    let ctx = BatchContext {
        index: 0,
        seqno: SeqNo(ms),
        time_us: ms * 1000,
        seed: [7; 32],
    };
    let req = ServiceRequest {
        client: ClientId(client),
        request_id: RequestId(ms),
        operation: crate::encode_operation(&commands),
    };
    let mut effects = Effects::default();
    let out = s.execute(&ctx, &[req], &mut effects);
    let pushes = effects
        .pushes()
        .iter()
        .map(|p| (p.client.0, Pushed::decode(&p.payload).expect("a store push")))
        .collect();
    (crate::decode_replies(&out[0]).unwrap(), pushes)
}

fn token(t: &str) -> Bytes {
    Bytes::copy_from_slice(t.as_bytes())
}

fn ready(t: &str) -> Pushed {
    Pushed::Ready(token(t))
}

fn exec_argv(watch: &str, lines: &[&str]) -> Vec<Bytes> {
    let commands: Vec<Vec<Bytes>> = lines.iter().map(|l| words(l)).collect();
    vec![token("upright.exec"), token(watch), encode_transaction(&commands)]
}

#[test]
fn a_blocked_pop_is_served_by_a_later_push_and_collected_once() {
    let s = &mut RedisStore::new();
    let (r, pushes) = run(s, 1000, 1, &["upright.block g.1 BLPOP l 0"]);
    assert_eq!(r, vec![Reply::Blocked]);
    assert!(pushes.is_empty());
    assert_eq!(run(s, 1001, 1, &["upright.collect g.1"]).0, vec![Reply::Blocked]);
    let (r, pushes) = run(s, 1002, 2, &["RPUSH l a b"]);
    assert_eq!(r, vec![int(2)]);
    assert_eq!(pushes, vec![(1, ready("g.1"))], "the token goes to the waiter's client");
    assert_eq!(
        run(s, 1003, 2, &["LRANGE l 0 -1"]).0,
        vec![Reply::Array(vec![bulk("b")])]
    );
    assert_eq!(
        run(s, 1004, 1, &["upright.collect g.1"]).0,
        vec![Reply::Array(vec![bulk("l"), bulk("a")])]
    );
    let (r, _) = run(s, 1005, 1, &["upright.collect g.1"]);
    assert!(
        matches!(&r[0], Reply::Error(e) if e.contains("no such blocked")),
        "{r:?}"
    );
    // Data already there: no wait.
    assert_eq!(
        run(s, 1006, 1, &["upright.block g.2 BRPOP l 0"]).0,
        vec![Reply::Array(vec![bulk("l"), bulk("b")])]
    );
}

#[test]
fn waiters_are_served_in_arrival_order_and_time_out_on_agreed_time() {
    let s = &mut RedisStore::new();
    run(s, 1000, 1, &["upright.block g.1 BZPOPMIN z 0"]);
    run(s, 1001, 2, &["upright.block g.2 BZPOPMIN z 2.5"]);
    assert_eq!(
        s.wake_at(),
        Some(3_501_000),
        "woken when the second waiter's timeout passes"
    );
    let (_, pushes) = run(s, 1002, 3, &["ZADD z 5 m"]);
    assert_eq!(pushes, vec![(1, ready("g.1"))], "the first to wait is served first");
    assert_eq!(
        run(s, 1003, 1, &["upright.collect g.1"]).0,
        vec![Reply::Array(vec![bulk("z"), bulk("m"), Reply::Double("5".into())])]
    );
    let mut effects = Effects::default();
    let ctx = BatchContext {
        index: 0,
        seqno: SeqNo(9),
        time_us: 3_501_000,
        seed: [0; 32],
    };
    s.wake(&ctx, &mut effects);
    assert_eq!(effects.pushes().len(), 1);
    assert_eq!(run(s, 3502, 2, &["upright.collect g.2"]).0, vec![Reply::NilArray]);
    assert_eq!(s.wake_at(), None);
}

#[test]
fn only_the_awaited_type_wakes_and_a_transaction_wakes_once_at_its_end() {
    let s = &mut RedisStore::new();
    run(s, 1000, 1, &["upright.block g.1 BLPOP l 0"]);
    // LPUSH then DEL then SET inside one transaction: nothing for the waiter at the end.
    let (r, pushes) = run_argv(s, 1001, 2, vec![exec_argv("", &["LPUSH l a", "DEL l", "SET l x"])]);
    assert_eq!(r, vec![Reply::Array(vec![int(1), int(1), Reply::ok()])]);
    assert!(pushes.is_empty());
    run(s, 1002, 2, &["DEL l"]);
    // Three pushes in one transaction: the waiter gets the last one pushed.
    let (_, pushes) = run_argv(
        s,
        1003,
        2,
        vec![exec_argv("", &["LPUSH l a", "LPUSH l b", "LPUSH l c"])],
    );
    assert_eq!(pushes.len(), 1);
    assert_eq!(
        run(s, 1004, 1, &["upright.collect g.1"]).0,
        vec![Reply::Array(vec![bulk("l"), bulk("c")])]
    );
    // Inside a transaction a blocking command does not block.
    assert_eq!(
        run_argv(
            s,
            1005,
            1,
            vec![exec_argv("", &["BLPOP nothing 0", "BLMOVE nothing x LEFT LEFT 0"])]
        )
        .0,
        vec![Reply::Array(vec![Reply::NilArray, Reply::Nil])]
    );
}

#[test]
fn a_served_error_leaves_the_element_and_unblock_ends_waits() {
    let s = &mut RedisStore::new();
    run(s, 1000, 1, &["SET target str"]);
    run(s, 1001, 1, &["upright.block g.1 BRPOPLPUSH src target 0"]);
    run(s, 1002, 2, &["RPUSH src a"]);
    let (r, _) = run(s, 1003, 1, &["upright.collect g.1"]);
    assert_eq!(r, vec![Reply::err(super::WRONGTYPE)]);
    assert_eq!(run(s, 1004, 2, &["LLEN src"]).0, vec![int(1)], "the element stays");
    run(
        s,
        1005,
        1,
        &["upright.block g.2 BLPOP empty 0", "upright.block g.3 BLPOP empty 0"],
    );
    run(s, 1006, 1, &["upright.block g.4 BLMOVE empty x LEFT LEFT 0"]);
    assert_eq!(run(s, 1007, 1, &["upright.unblock g.2 error"]).0, vec![int(1)]);
    assert_eq!(
        run(s, 1008, 1, &["upright.collect g.2"]).0,
        vec![Reply::err("UNBLOCKED client unblocked via CLIENT UNBLOCK")]
    );
    assert_eq!(run(s, 1009, 1, &["upright.unblock g.4 timeout"]).0, vec![int(1)]);
    assert_eq!(run(s, 1010, 1, &["upright.collect g.4"]).0, vec![Reply::Nil]);
    assert_eq!(run(s, 1011, 1, &["upright.unblock g.3 drop"]).0, vec![int(1)]);
    let (_, pushes) = run(s, 1012, 2, &["RPUSH empty a"]);
    assert!(pushes.is_empty(), "a dropped waiter takes nothing");
    assert_eq!(run(s, 1013, 2, &["LLEN empty"]).0, vec![int(1)]);
    // A restarted gateway drops what its predecessor left (other prefixes, its own client).
    run(
        s,
        1014,
        1,
        &["upright.block old.1 BLPOP none 0", "upright.watch old.2 k"],
    );
    run(s, 1015, 2, &["upright.block other.1 BLPOP none 0"]);
    assert_eq!(run(s, 1016, 1, &["upright.unblock-stale new."]).0, vec![int(2)]);
    assert_eq!(run(s, 1017, 2, &["upright.collect other.1"]).0, vec![Reply::Blocked]);
    let (r, _) = run(s, 1018, 1, &["upright.block old.3 BLPOP none -1"]);
    assert_eq!(r, vec![Reply::err("ERR timeout is negative")]);
}

#[test]
fn watch_aborts_exec_on_any_change_and_nothing_else() {
    let s = &mut RedisStore::new();
    run(s, 1000, 1, &["SET a 1", "SET b 1 PX 500"]);
    run(s, 1001, 1, &["upright.watch w.1 a"]);
    run(s, 1002, 2, &["SET other 1"]);
    assert_eq!(
        run_argv(s, 1003, 1, vec![exec_argv("w.1", &["INCR a"])]).0,
        vec![Reply::Array(vec![int(2)])],
        "an untouched key lets EXEC run"
    );
    run(s, 1004, 1, &["upright.watch w.2 a"]);
    run(s, 1005, 2, &["SET a 1"]);
    assert_eq!(
        run_argv(s, 1006, 1, vec![exec_argv("w.2", &["INCR a"])]).0,
        vec![Reply::NilArray]
    );
    assert_eq!(
        run(s, 1007, 1, &["GET a"]).0,
        vec![bulk("1")],
        "the aborted INCR did not run"
    );
    // An expiry counts as a change; so does FLUSHALL of an existing key, but not of a missing one.
    run(s, 1008, 1, &["upright.watch w.3 b", "upright.watch w.4 missing"]);
    assert_eq!(
        run_argv(s, 1600, 1, vec![exec_argv("w.3", &["PING"])]).0,
        vec![Reply::NilArray]
    );
    run(s, 1601, 2, &["FLUSHALL"]);
    assert_eq!(
        run_argv(s, 1602, 1, vec![exec_argv("w.4", &["SET c 1"])]).0,
        vec![Reply::Array(vec![Reply::ok()])]
    );
    // Watches and waiters survive a checkpoint.
    run(s, 1603, 1, &["upright.watch w.5 c", "upright.block g.1 BLPOP q 9"]);
    let mut copy = RedisStore::new();
    copy.restore(&s.checkpoint()).unwrap();
    assert_eq!(&copy, s);
    run(&mut copy, 1604, 2, &["SET c 2"]);
    assert_eq!(
        run_argv(&mut copy, 1605, 1, vec![exec_argv("w.5", &["PING"])]).0,
        vec![Reply::NilArray]
    );
    let (_, pushes) = run(&mut copy, 1606, 2, &["RPUSH q x"]);
    assert_eq!(pushes, vec![(1, ready("g.1"))]);
}

#[test]
fn publish_reaches_every_subscribed_gateway_once_and_counts_its_subscribers() {
    let s = &mut RedisStore::new();
    run(
        s,
        1000,
        1,
        &[
            "upright.subscribe g1. channel news",
            "upright.subscribe g1. channel news",
        ],
    );
    run(s, 1001, 2, &["upright.subscribe g2. pattern n*"]);
    let (r, pushes) = run(s, 1002, 3, &["PUBLISH news hi", "PUBLISH other x"]);
    assert_eq!(r, vec![int(3), int(0)], "two subscriptions at g1, one pattern at g2");
    let message = |c: &str| Pushed::Message {
        channel: token(c),
        message: token("hi"),
    };
    assert_eq!(
        pushes,
        vec![
            (1, message("news")),
            (
                2,
                Pushed::PMessage {
                    pattern: token("n*"),
                    channel: token("news"),
                    message: token("hi"),
                }
            ),
        ]
    );
    assert_eq!(
        run(
            s,
            1003,
            3,
            &["PUBSUB NUMSUB news none", "PUBSUB NUMPAT", "PUBSUB CHANNELS"]
        )
        .0,
        vec![
            Reply::Pairs(vec![(bulk("news"), int(2)), (bulk("none"), int(0))]),
            int(1),
            Reply::Array(vec![bulk("news")]),
        ]
    );
    let mut copy = RedisStore::new();
    copy.restore(&s.checkpoint()).unwrap();
    assert_eq!(&copy, s);
    run(
        s,
        1004,
        1,
        &[
            "upright.unsubscribe g1. channel news",
            "upright.unsubscribe g1. channel news",
        ],
    );
    run(s, 1005, 2, &["upright.unblock-stale g9."]);
    let (r, pushes) = run(s, 1006, 3, &["PUBLISH news hi"]);
    assert_eq!((r, pushes), (vec![int(0)], vec![]));
    let big = "x".repeat(super::pubsub::MESSAGE_BYTES_MAX);
    let (r, _) = run_argv(s, 1007, 3, vec![vec![token("PUBLISH"), token("c"), token(&big)]]);
    assert!(matches!(&r[0], Reply::Error(e) if e.contains("at most")), "{r:?}");
}

#[test]
fn keyspace_notifications_publish_the_enabled_events_only() {
    let s = &mut RedisStore::new();
    run(s, 1000, 1, &["upright.subscribe g1. pattern *"]);
    assert_eq!(run(s, 1001, 2, &["SET quiet 1"]).1, vec![], "off by default");
    run(s, 1002, 2, &["upright.notify-config KEl"]);
    let (_, pushes) = run(s, 1003, 2, &["SET a 1", "LPUSH l x", "SREM nothing y"]);
    let events: Vec<(Bytes, Bytes)> = pushes
        .into_iter()
        .map(|(_, p)| match p {
            Pushed::PMessage { channel, message, .. } => (channel, message),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(
        events,
        vec![
            (token("__keyspace@0__:l"), token("lpush")),
            (token("__keyevent@0__:lpush"), token("l")),
        ],
        "only the list class, and only what changed"
    );
    run(s, 1004, 2, &["upright.notify-config Exn", "SET e 1 PX 10"]);
    let mut effects = Effects::default();
    let ctx = BatchContext {
        index: 0,
        seqno: SeqNo(9),
        time_us: 2_000_000,
        seed: [0; 32],
    };
    s.wake(&ctx, &mut effects);
    let expired: Vec<Pushed> = effects
        .pushes()
        .iter()
        .map(|p| Pushed::decode(&p.payload).unwrap())
        .collect();
    assert_eq!(
        expired,
        vec![Pushed::PMessage {
            pattern: token("*"),
            channel: token("__keyevent@0__:expired"),
            message: token("e"),
        }]
    );
    assert_eq!(
        run(s, 3000, 2, &["upright.notify-config"]).0,
        vec![Reply::Map(vec![(bulk("notify-keyspace-events"), bulk("xEn"))])]
    );
    let mut copy = RedisStore::new();
    copy.restore(&s.checkpoint()).unwrap();
    assert_eq!(&copy, s, "the setting is in the checkpoint");
}

use bytes::Bytes;
use upright_core::ids::{ClientId, RequestId, SeqNo};
use upright_core::service::{BatchContext, Effects, Service, ServiceRequest};

use super::RedisStore;
use crate::reply::Reply;

pub(super) fn cmd(s: &mut RedisStore, line: &str) -> Reply {
    let argv: Vec<Bytes> = line.split(' ').map(|w| Bytes::copy_from_slice(w.as_bytes())).collect();
    s.apply(&argv)
}

pub(super) fn int(i: i64) -> Reply {
    Reply::Int(i)
}

pub(super) fn bulk(s: &str) -> Reply {
    Reply::text(s)
}

pub(super) fn err(s: &str) -> Reply {
    Reply::err(s)
}

#[test]
fn strings() {
    let s = &mut RedisStore::new();
    assert_eq!(cmd(s, "GET a"), Reply::Nil);
    assert_eq!(cmd(s, "SET a 1"), Reply::ok());
    assert_eq!(cmd(s, "get a"), bulk("1"));
    assert_eq!(cmd(s, "SET a 2 NX"), Reply::Nil);
    assert_eq!(cmd(s, "SET b 2 XX"), Reply::Nil);
    assert_eq!(cmd(s, "SET a 3 XX GET"), bulk("1"));
    assert_eq!(cmd(s, "SET a 3 NX XX"), err("ERR syntax error"));
    assert_eq!(cmd(s, "SET a 3 EX"), err("ERR syntax error"));
    assert_eq!(
        cmd(s, "SET a 3 EX x"),
        err("ERR value is not an integer or out of range")
    );
    assert_eq!(cmd(s, "SET a 3 EX 0"), err("ERR invalid expire time in 'set' command"));
    assert_eq!(cmd(s, "SET a 3 FOO"), err("ERR syntax error"));
    assert_eq!(cmd(s, "GETSET a 4"), bulk("3"));
    assert_eq!(cmd(s, "APPEND a xy"), int(3));
    assert_eq!(cmd(s, "STRLEN a"), int(3));
    assert_eq!(cmd(s, "STRLEN zz"), int(0));
    assert_eq!(cmd(s, "MSET x 1 y 2"), Reply::ok());
    assert_eq!(
        cmd(s, "MSET x 1 y"),
        err("ERR wrong number of arguments for 'mset' command")
    );
    assert_eq!(
        cmd(s, "MGET x nope y"),
        Reply::Array(vec![bulk("1"), Reply::Nil, bulk("2")])
    );
    assert_eq!(cmd(s, "EXISTS x x nope"), int(2));
    assert_eq!(cmd(s, "DEL x y nope"), int(2));
    assert_eq!(cmd(s, "SETNX x 5"), int(1));
    assert_eq!(cmd(s, "SETNX x 6"), int(0));
    assert_eq!(cmd(s, "GETDEL x"), bulk("5"));
    assert_eq!(cmd(s, "TYPE x"), Reply::Status("none".into()));
    assert_eq!(cmd(s, "DBSIZE"), int(1));
    assert_eq!(cmd(s, "FLUSHDB"), Reply::ok());
    assert_eq!(cmd(s, "DBSIZE"), int(0));
}

#[test]
fn counters() {
    let s = &mut RedisStore::new();
    assert_eq!(cmd(s, "INCR n"), int(1));
    assert_eq!(cmd(s, "INCRBY n 10"), int(11));
    assert_eq!(cmd(s, "DECR n"), int(10));
    assert_eq!(cmd(s, "DECRBY n 20"), int(-10));
    assert_eq!(cmd(s, "INCRBY n x"), err("ERR value is not an integer or out of range"));
    cmd(s, "SET t abc");
    assert_eq!(cmd(s, "INCR t"), err("ERR value is not an integer or out of range"));
    cmd(s, "SET m 9223372036854775807");
    assert_eq!(cmd(s, "INCR m"), err("ERR increment or decrement would overflow"));
    assert_eq!(
        cmd(s, "DECRBY m -9223372036854775808"),
        err("ERR decrement would overflow")
    );
    assert_eq!(cmd(s, "GET n"), bulk("-10"));
}

#[test]
fn arity_and_unknown() {
    let s = &mut RedisStore::new();
    assert_eq!(cmd(s, "GET"), err("ERR wrong number of arguments for 'get' command"));
    assert_eq!(
        cmd(s, "GET a b"),
        err("ERR wrong number of arguments for 'get' command")
    );
    assert_eq!(
        cmd(s, "NOPE a b"),
        err("ERR unknown command 'NOPE', with args beginning with: 'a' 'b' ")
    );
}

#[test]
fn expiry_follows_agreed_time_only() {
    let s = &mut RedisStore::new();
    s.advance(1_000_000_000); // t = 1,000,000 ms
    assert_eq!(cmd(s, "SET k v EX 10"), Reply::ok());
    assert_eq!(cmd(s, "TTL k"), int(10));
    assert_eq!(cmd(s, "PTTL k"), int(10_000));
    assert_eq!(cmd(s, "TTL nope"), int(-2));
    cmd(s, "SET p v");
    assert_eq!(cmd(s, "TTL p"), int(-1));
    assert_eq!(cmd(s, "EXPIRE p 5"), int(1));
    assert_eq!(cmd(s, "EXPIRE p 50 NX"), int(0));
    assert_eq!(cmd(s, "EXPIRE p 50 GT"), int(1));
    assert_eq!(
        cmd(s, "EXPIRE p 5 NX XX"),
        err("ERR NX and XX, GT or LT options at the same time are not compatible")
    );
    assert_eq!(cmd(s, "PERSIST p"), int(1));
    assert_eq!(cmd(s, "PERSIST p"), int(0));
    assert_eq!(cmd(s, "PEXPIRE p 1500"), int(1));
    assert_eq!(cmd(s, "INCR c"), int(1));
    assert_eq!(cmd(s, "EXPIRE c 3"), int(1));
    assert_eq!(cmd(s, "INCR c"), int(2)); // INCR keeps the time to live
    assert_eq!(cmd(s, "TTL c"), int(3));
    s.advance(1_001_400_000);
    assert_eq!(cmd(s, "PTTL p"), int(100));
    s.advance(1_001_500_000); // exactly at p's expiry: still there (Redis: expired when now > at)
    assert_eq!(cmd(s, "EXISTS p"), int(1));
    s.advance(1_001_501_000);
    assert_eq!(cmd(s, "EXISTS p"), int(0));
    assert_eq!(cmd(s, "DBSIZE"), int(2));
    s.advance(1_010_001_000);
    assert_eq!(cmd(s, "GET k"), Reply::Nil);
    assert_eq!(cmd(s, "DBSIZE"), int(0));
    cmd(s, "SET z v");
    assert_eq!(cmd(s, "EXPIRE z -1"), int(1)); // a past time deletes
    assert_eq!(cmd(s, "EXISTS z"), int(0));
}

#[test]
fn keys_and_scan() {
    let s = &mut RedisStore::new();
    for i in 0..50 {
        cmd(s, &format!("SET key:{i} v"));
    }
    cmd(s, "SET other v");
    let Reply::Array(keys) = cmd(s, "KEYS key:1*") else {
        panic!()
    };
    assert_eq!(keys.len(), 11);
    let mut seen = std::collections::BTreeSet::new();
    let mut cursor = "0".to_string();
    loop {
        let Reply::Array(parts) = cmd(s, &format!("SCAN {cursor} MATCH key:* COUNT 7")) else {
            panic!()
        };
        let (Reply::Bulk(next), Reply::Array(batch)) = (&parts[0], &parts[1]) else {
            panic!()
        };
        for k in batch {
            let Reply::Bulk(k) = k else { panic!() };
            seen.insert(k.clone());
        }
        // Writes between calls do not make SCAN miss keys present throughout.
        cmd(s, &format!("SET extra:{cursor} v"));
        cursor = String::from_utf8(next.to_vec()).unwrap();
        if cursor == "0" {
            break;
        }
    }
    assert_eq!(seen.len(), 50);
    assert_eq!(cmd(s, "SCAN x"), err("ERR invalid cursor"));
    assert_eq!(cmd(s, "SCAN 0 COUNT 0"), err("ERR syntax error"));
}

pub(super) fn batch(s: &mut RedisStore, time_us: u64, seq: u64, commands: &[&[&str]]) -> Vec<Reply> {
    let argvs: Vec<Vec<Bytes>> = commands
        .iter()
        .map(|c| c.iter().map(|w| Bytes::copy_from_slice(w.as_bytes())).collect())
        .collect();
    let ctx = BatchContext {
        index: 0,
        seqno: SeqNo(seq),
        time_us,
        seed: [0; 32],
    };
    let req = ServiceRequest {
        client: ClientId(0),
        request_id: RequestId(seq),
        operation: crate::encode_operation(&argvs),
    };
    let out = s.execute(&ctx, &[req], &mut Effects::default());
    crate::decode_replies(&out[0]).unwrap()
}

#[test]
fn checkpoints_are_deterministic_and_restore_exactly() {
    let mut a = RedisStore::new();
    let mut b = RedisStore::new();
    let cmds: &[&[&str]] = &[
        &["SET", "x", "1", "PX", "5000"],
        &["MSET", "b", "2", "a", "1"],
        &["INCR", "n"],
    ];
    assert_eq!(batch(&mut a, 1_000_000, 1, cmds), batch(&mut b, 1_000_000, 1, cmds));
    assert_eq!(a.checkpoint(), b.checkpoint());
    let mut c = RedisStore::new();
    c.restore(&a.checkpoint()).unwrap();
    assert_eq!(c, a);
    assert_eq!(c.checkpoint(), a.checkpoint());
    // Expiry after restore is still by agreed time.
    assert_eq!(
        batch(&mut c, 7_000_000, 2, &[&["GET", "x"], &["GET", "a"]]),
        vec![Reply::Nil, bulk("1")]
    );
    assert!(c.restore(b"\xff\xff\xff").is_err());
    // Found by `scripts/fuzz.sh` (checkpoint_restore): a checkpoint whose blocked client waits on
    // an empty command restored by indexing it.
    let empty_blocked_argv = b"\x01\x01\x01\x00\x00\x01\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x01\x00\x01\x00\x00";
    let mut d = RedisStore::new();
    if d.restore(empty_blocked_argv).is_ok() {
        let mut again = RedisStore::new();
        again.restore(&d.checkpoint()).unwrap();
        assert_eq!(again.checkpoint(), d.checkpoint());
    }
    // A malformed operation gets an error, not a panic.
    let ctx = BatchContext {
        index: 0,
        seqno: SeqNo(3),
        time_us: 8_000_000,
        seed: [0; 32],
    };
    let req = ServiceRequest {
        client: ClientId(0),
        request_id: RequestId(3),
        operation: Bytes::from_static(b"\xff\xff"),
    };
    let out = c.execute(&ctx, &[req], &mut Effects::default());
    assert!(matches!(&crate::decode_replies(&out[0]).unwrap()[0], Reply::Error(_)));
}

#[test]
fn corrupting_store_lies() {
    let s = &mut RedisStore::corrupting();
    cmd(s, "SET a 1");
    assert_ne!(cmd(s, "GET a"), bulk("1"));
}

fn argvs(lines: &[&str]) -> Vec<Vec<Bytes>> {
    lines
        .iter()
        .map(|l| l.split(' ').map(|w| Bytes::copy_from_slice(w.as_bytes())).collect())
        .collect()
}

#[test]
fn read_only_path_answers_reads_like_the_ordered_path_and_refuses_writes() {
    let s = &mut RedisStore::new();
    for line in ["SET a 1", "SET b hello", "PEXPIRE b 5000", "SET c 3"] {
        cmd(s, line);
    }
    let reads = [
        "GET a",
        "GET nope",
        "MGET a b nope",
        "EXISTS a b nope",
        "TYPE a",
        "STRLEN b",
        "PTTL b",
        "TTL a",
        "KEYS *",
        "SCAN 0",
        "DBSIZE",
        "GET",
    ];
    let checkpoint = s.checkpoint();
    let op = crate::encode_operation(&argvs(&reads));
    let read_only = s.execute_read_only(&op).expect("every command reads");
    assert_eq!(s.checkpoint(), checkpoint, "the read-only path changes nothing");
    let ordered = s.execute(
        &BatchContext {
            index: 0,
            seqno: SeqNo(1),
            time_us: 0,
            seed: [0; 32],
        },
        &[ServiceRequest {
            client: ClientId(0),
            request_id: RequestId(1),
            operation: op,
        }],
        &mut Effects::default(),
    );
    assert_eq!(read_only, ordered[0], "byte-identical replies on both paths");
    let replies = crate::decode_replies(&read_only).unwrap();
    assert_eq!(replies[0], bulk("1"));
    assert_eq!(replies[11], err("ERR wrong number of arguments for 'get' command"));
    for writes in [&["GET a", "SET a 2"][..], &["INCR a"], &["PING"], &["FLUSHDB"]] {
        let op = crate::encode_operation(&argvs(writes));
        assert_eq!(s.execute_read_only(&op), None, "{writes:?} is not read-only");
    }
    assert_eq!(s.execute_read_only(b"garbage"), None);
    let is_read = |name: &[u8]| crate::command::lookup(name).unwrap().is_read();
    assert!(is_read(b"mget"));
    assert!(!is_read(b"set"));
    assert!(!is_read(b"ping"));
}

#[test]
fn a_corrupting_store_corrupts_read_only_replies_too() {
    let s = &mut RedisStore::corrupting();
    cmd(s, "SET a 1");
    let op = crate::encode_operation(&argvs(&["GET a"]));
    let replies = crate::decode_replies(&s.execute_read_only(&op).unwrap()).unwrap();
    assert_ne!(replies[0], bulk("1"));
}

#[test]
fn access_names_the_keys_of_every_command() {
    use upright_core::service::Access;
    let s = RedisStore::new();
    let op = |commands: &[&[&str]]| {
        let commands: Vec<Vec<Bytes>> = commands
            .iter()
            .map(|c| c.iter().map(|w| Bytes::copy_from_slice(w.as_bytes())).collect())
            .collect();
        crate::encode_operation(&commands)
    };
    let b = |w: &str| Bytes::copy_from_slice(w.as_bytes());
    assert_eq!(s.access(&op(&[&["GET", "a"]])), Some(Access::reading([b("a")])));
    assert_eq!(
        s.access(&op(&[&["MGET", "a", "b", "c"]])),
        Some(Access::reading([b("a"), b("b"), b("c")]))
    );
    // MSET names every other argument; a write and a read in one operation merge.
    let mut both = Access::writing([b("k1"), b("k2")]);
    both.merge(Access::reading([b("x")]));
    assert_eq!(
        s.access(&op(&[&["MSET", "k1", "v1", "k2", "v2"], &["GET", "x"]])),
        Some(both)
    );
    assert_eq!(
        s.access(&op(&[&["DEL", "a", "b"]])),
        Some(Access::writing([b("a"), b("b")]))
    );
    assert_eq!(s.access(&op(&[&["SET", "a", "1"], &["FLUSHDB"]])), None, "whole store");
    assert_eq!(s.access(&op(&[&["KEYS", "*"]])), None);
    assert_eq!(s.access(&op(&[&["NOSUCH", "a"]])), None);
    assert_eq!(s.access(b"\xff"), None);
}

pub(super) fn arr(items: &[&str]) -> Reply {
    Reply::Array(items.iter().map(|s| bulk(s)).collect())
}

#[test]
fn hashes() {
    let s = &mut RedisStore::new();
    assert_eq!(cmd(s, "HSET h a 1 b 2"), int(2));
    assert_eq!(cmd(s, "HSET h a 10 c 3"), int(1), "a is updated, c added");
    assert_eq!(cmd(s, "HGET h a"), bulk("10"));
    assert_eq!(cmd(s, "HGET h zz"), Reply::Nil);
    assert_eq!(cmd(s, "HGET nohash a"), Reply::Nil);
    assert_eq!(
        cmd(s, "HMGET h a zz c"),
        Reply::Array(vec![bulk("10"), Reply::Nil, bulk("3")])
    );
    assert_eq!(
        cmd(s, "HGETALL h"),
        Reply::Map(vec![
            (bulk("a"), bulk("10")),
            (bulk("b"), bulk("2")),
            (bulk("c"), bulk("3"))
        ])
    );
    assert_eq!(cmd(s, "HKEYS h"), arr(&["a", "b", "c"]));
    assert_eq!(cmd(s, "HVALS h"), arr(&["10", "2", "3"]));
    assert_eq!(cmd(s, "HLEN h"), int(3));
    assert_eq!(cmd(s, "HSTRLEN h a"), int(2));
    assert_eq!(cmd(s, "HEXISTS h b"), int(1));
    assert_eq!(cmd(s, "HSETNX h b 9"), int(0));
    assert_eq!(cmd(s, "HSETNX h d 4"), int(1));
    assert_eq!(cmd(s, "HINCRBY h a 5"), int(15));
    assert_eq!(cmd(s, "HINCRBY h new -3"), int(-3));
    assert_eq!(
        cmd(s, "HINCRBY h a x"),
        err("ERR value is not an integer or out of range")
    );
    assert_eq!(cmd(s, "HSET h s abc"), int(1));
    assert_eq!(cmd(s, "HINCRBY h s 1"), err("ERR hash value is not an integer"));
    assert_eq!(cmd(s, "HSET h big 9223372036854775807"), int(1));
    assert_eq!(
        cmd(s, "HINCRBY h big 1"),
        err("ERR increment or decrement would overflow")
    );
    assert_eq!(cmd(s, "HINCRBYFLOAT h f 10.5"), bulk("10.5"));
    assert_eq!(cmd(s, "HINCRBYFLOAT h f 0.1"), bulk("10.6"));
    assert_eq!(cmd(s, "HINCRBYFLOAT h f -5.6"), bulk("5"));
    assert_eq!(cmd(s, "HINCRBYFLOAT h s 1"), err("ERR hash value is not a float"));
    assert_eq!(cmd(s, "HINCRBYFLOAT h f x"), err("ERR value is not a valid float"));
    assert_eq!(cmd(s, "HINCRBYFLOAT h f +inf"), err("ERR value is NaN or Infinity"));
    assert_eq!(
        cmd(s, "HSET h a"),
        err("ERR wrong number of arguments for 'hset' command")
    );
    assert_eq!(
        cmd(s, "HSET h a 1 b"),
        err("ERR wrong number of arguments for 'hset' command")
    );
    assert_eq!(cmd(s, "HMSET h a 1"), Reply::ok());
    assert_eq!(cmd(s, "TYPE h"), Reply::Status("hash".into()));
    assert_eq!(cmd(s, "HDEL h a b zz"), int(2));
    let len = match cmd(s, "HLEN h") {
        Reply::Int(n) => n,
        other => panic!("{other:?}"),
    };
    let fields: Vec<String> = match cmd(s, "HKEYS h") {
        Reply::Array(items) => items.iter().map(|r| format!("{r:?}")).collect(),
        other => panic!("{other:?}"),
    };
    let mut deleting = String::from("HDEL h");
    for f in ["c", "d", "new", "s", "big", "f"] {
        deleting.push(' ');
        deleting.push_str(f);
    }
    assert_eq!(cmd(s, &deleting), int(len), "{fields:?}");
    assert_eq!(cmd(s, "EXISTS h"), int(0), "a hash without fields is gone");
    assert_eq!(cmd(s, "TYPE h"), Reply::Status("none".into()));
}

#[test]
fn a_command_of_the_other_type_is_wrongtype_and_changes_nothing() {
    let s = &mut RedisStore::new();
    let wrong = err(super::WRONGTYPE);
    cmd(s, "SET str v");
    cmd(s, "HSET h f v");
    for line in [
        "HSET str f v",
        "HGET str f",
        "HGETALL str",
        "HINCRBY str f 1",
        "HDEL str f",
        "HLEN str",
    ] {
        assert_eq!(cmd(s, line), wrong, "{line}");
    }
    for line in [
        "GET h",
        "APPEND h x",
        "INCR h",
        "STRLEN h",
        "GETSET h x",
        "GETDEL h",
        "SET h x GET",
    ] {
        assert_eq!(cmd(s, line), wrong, "{line}");
    }
    assert_eq!(cmd(s, "HGET h f"), bulk("v"), "nothing was changed");
    assert_eq!(cmd(s, "MGET str h"), Reply::Array(vec![bulk("v"), Reply::Nil]));
    assert_eq!(cmd(s, "SET h plain"), Reply::ok(), "SET replaces a value of any type");
    assert_eq!(cmd(s, "GET h"), bulk("plain"));
}

#[test]
fn hscan_walks_every_field_once_and_scan_filters_by_type() {
    let s = &mut RedisStore::new();
    let mut line = String::from("HSET h");
    for i in 0..100 {
        line.push_str(&format!(" f{i} v{i}"));
    }
    cmd(s, &line);
    let mut seen = std::collections::BTreeSet::new();
    let mut cursor = "0".to_string();
    loop {
        let Reply::Array(parts) = cmd(s, &format!("HSCAN h {cursor} COUNT 7")) else {
            panic!()
        };
        let (Reply::Bulk(next), Reply::Array(items)) = (&parts[0], &parts[1]) else {
            panic!()
        };
        for pair in items.chunks(2) {
            let (Reply::Bulk(f), Reply::Bulk(v)) = (&pair[0], &pair[1]) else {
                panic!()
            };
            assert_eq!(&v[1..], &f[1..], "each field comes with its value");
            assert!(seen.insert(f.clone()), "field {f:?} twice");
        }
        cursor = String::from_utf8(next.to_vec()).unwrap();
        if cursor == "0" {
            break;
        }
    }
    assert_eq!(seen.len(), 100);
    let Reply::Array(parts) = cmd(s, "HSCAN h 0 COUNT 1000 NOVALUES MATCH f1*") else {
        panic!()
    };
    let mut expected = [
        "f1", "f10", "f11", "f12", "f13", "f14", "f15", "f16", "f17", "f18", "f19",
    ];
    expected.sort_by_key(|f| (super::slot(f.as_bytes()), *f));
    assert_eq!(
        parts[1],
        arr(&expected),
        "matching fields only, without values, in slot order"
    );
    cmd(s, "SET str v");
    assert_eq!(
        cmd(s, "SCAN 0 TYPE hash COUNT 100"),
        Reply::Array(vec![bulk("0"), arr(&["h"])])
    );
    assert_eq!(
        cmd(s, "SCAN 0 TYPE string COUNT 100"),
        Reply::Array(vec![bulk("0"), arr(&["str"])])
    );
}

#[test]
fn hrandfield_is_the_same_at_every_replica_and_honours_count() {
    let (a, b) = (&mut RedisStore::new(), &mut RedisStore::new());
    for s in [&mut *a, &mut *b] {
        cmd(s, "HSET h a 1 b 2 c 3 d 4");
    }
    for line in ["HRANDFIELD h", "HRANDFIELD h 3", "HRANDFIELD h -10 WITHVALUES"] {
        assert_eq!(cmd(a, line), cmd(b, line), "{line}");
    }
    let Reply::Array(distinct) = cmd(a, "HRANDFIELD h 10") else {
        panic!()
    };
    assert_eq!(distinct.len(), 4, "a positive count gives distinct fields, at most all");
    let mut unique = distinct.clone();
    unique.sort_by_key(|r| format!("{r:?}"));
    unique.dedup();
    assert_eq!(unique.len(), 4);
    let Reply::Array(repeated) = cmd(a, "HRANDFIELD h -10") else {
        panic!()
    };
    assert_eq!(repeated.len(), 10, "a negative count may repeat");
    assert_eq!(cmd(a, "HRANDFIELD nohash"), Reply::Nil);
    assert_eq!(cmd(a, "HRANDFIELD nohash 3"), Reply::Array(vec![]));
    assert_eq!(cmd(a, "HRANDFIELD h 1 WITHVALUES x"), err("ERR syntax error"));
}

#[test]
fn hashes_survive_a_checkpoint_with_their_expiry() {
    let s = &mut RedisStore::new();
    cmd(s, "HSET h a 1 b 2");
    cmd(s, "EXPIRE h 100");
    cmd(s, "SET str v");
    let checkpoint = s.checkpoint();
    let mut restored = RedisStore::new();
    restored.restore(&checkpoint).unwrap();
    assert_eq!(&restored, s);
    assert_eq!(cmd(&mut restored, "HGET h b"), bulk("2"));
    assert!(matches!(cmd(&mut restored, "TTL h"), Reply::Int(t) if t > 0));
}

#[test]
fn lists() {
    let s = &mut RedisStore::new();
    assert_eq!(cmd(s, "RPUSH l a b c"), int(3));
    assert_eq!(cmd(s, "LPUSH l z"), int(4));
    assert_eq!(cmd(s, "LRANGE l 0 -1"), arr(&["z", "a", "b", "c"]));
    assert_eq!(cmd(s, "LRANGE l -2 100"), arr(&["b", "c"]));
    assert_eq!(cmd(s, "LRANGE l 5 10"), arr(&[]));
    assert_eq!(cmd(s, "LINDEX l -1"), bulk("c"));
    assert_eq!(cmd(s, "LINDEX l 9"), Reply::Nil);
    assert_eq!(cmd(s, "LLEN l"), int(4));
    assert_eq!(cmd(s, "LPUSHX nolist x"), int(0));
    assert_eq!(cmd(s, "EXISTS nolist"), int(0));
    assert_eq!(cmd(s, "LINSERT l BEFORE b x"), int(5));
    assert_eq!(cmd(s, "LINSERT l AFTER nope y"), int(-1));
    assert_eq!(cmd(s, "LRANGE l 0 -1"), arr(&["z", "a", "x", "b", "c"]));
    assert_eq!(cmd(s, "LSET l 1 A"), Reply::ok());
    assert_eq!(cmd(s, "LSET l 9 A"), err("ERR index out of range"));
    assert_eq!(cmd(s, "LSET nolist 0 A"), err("ERR no such key"));
    assert_eq!(cmd(s, "RPUSH l x x"), int(7));
    assert_eq!(cmd(s, "LREM l -1 x"), int(1));
    assert_eq!(cmd(s, "LPOS l x"), int(2));
    assert_eq!(cmd(s, "LPOS l x COUNT 0"), Reply::Array(vec![int(2), int(5)]));
    assert_eq!(cmd(s, "LPOS l x RANK -1"), int(5));
    assert_eq!(cmd(s, "LREM l 0 x"), int(2));
    assert_eq!(cmd(s, "LRANGE l 0 -1"), arr(&["z", "A", "b", "c"]));
    assert_eq!(cmd(s, "LPOP l"), bulk("z"));
    assert_eq!(cmd(s, "RPOP l 2"), arr(&["c", "b"]));
    assert_eq!(cmd(s, "LPOP l -1"), err("ERR value is out of range, must be positive"));
    assert_eq!(cmd(s, "LPOP nolist 2"), Reply::NilArray);
    assert_eq!(
        cmd(s, "LPOP l 1 2"),
        err("ERR wrong number of arguments for 'lpop' command")
    );
    assert_eq!(
        cmd(s, "LPOS l x RANK -9223372036854775808"),
        err("ERR value is out of range")
    );
    assert_eq!(cmd(s, "RPUSH src 1 2 3"), int(3));
    assert_eq!(cmd(s, "LMOVE src dst RIGHT LEFT"), bulk("3"));
    assert_eq!(cmd(s, "RPOPLPUSH src dst"), bulk("2"));
    assert_eq!(cmd(s, "LRANGE dst 0 -1"), arr(&["2", "3"]));
    assert_eq!(cmd(s, "LMOVE src dst UP LEFT"), err("ERR syntax error"));
    assert_eq!(cmd(s, "LTRIM dst 1 -1"), Reply::ok());
    assert_eq!(cmd(s, "LRANGE dst 0 -1"), arr(&["3"]));
    assert_eq!(cmd(s, "LTRIM dst 5 10"), Reply::ok());
    assert_eq!(cmd(s, "EXISTS dst"), int(0), "an emptied list is gone");
    assert_eq!(cmd(s, "TYPE l"), Reply::Status("list".into()));
    assert_eq!(cmd(s, "LPOP l"), bulk("A"));
    assert_eq!(cmd(s, "TYPE l"), Reply::Status("none".into()));
    cmd(s, "SET str v");
    assert_eq!(cmd(s, "LPUSH str x"), err(super::WRONGTYPE));
    assert_eq!(cmd(s, "LMOVE src str LEFT LEFT"), err(super::WRONGTYPE));
    assert_eq!(cmd(s, "LLEN src"), int(1), "a refused LMOVE moved nothing");
    assert_eq!(cmd(s, "GET src"), err(super::WRONGTYPE));
}

#[test]
fn sets() {
    let s = &mut RedisStore::new();
    assert_eq!(cmd(s, "SADD a x y z"), int(3));
    assert_eq!(cmd(s, "SADD a x w"), int(1));
    assert_eq!(cmd(s, "SCARD a"), int(4));
    assert_eq!(
        cmd(s, "SMEMBERS a"),
        Reply::Set(vec![bulk("w"), bulk("x"), bulk("y"), bulk("z")])
    );
    assert_eq!(cmd(s, "SISMEMBER a y"), int(1));
    assert_eq!(cmd(s, "SMISMEMBER a y nope"), Reply::Array(vec![int(1), int(0)]));
    assert_eq!(cmd(s, "SADD b y z q"), int(3));
    assert_eq!(cmd(s, "SINTER a b"), Reply::Set(vec![bulk("y"), bulk("z")]));
    assert_eq!(
        cmd(s, "SUNION a b"),
        Reply::Set(["q", "w", "x", "y", "z"].iter().map(|m| bulk(m)).collect())
    );
    assert_eq!(cmd(s, "SDIFF a b"), Reply::Set(vec![bulk("w"), bulk("x")]));
    assert_eq!(cmd(s, "SINTER a nokey"), Reply::Set(vec![]));
    assert_eq!(cmd(s, "SINTERSTORE c a b"), int(2));
    assert_eq!(cmd(s, "SMEMBERS c"), Reply::Set(vec![bulk("y"), bulk("z")]));
    assert_eq!(cmd(s, "SDIFFSTORE c a a"), int(0));
    assert_eq!(cmd(s, "EXISTS c"), int(0), "an empty result deletes the destination");
    assert_eq!(cmd(s, "SINTERCARD 2 a b"), int(2));
    assert_eq!(cmd(s, "SINTERCARD 2 a b LIMIT 1"), int(1));
    assert_eq!(cmd(s, "SINTERCARD 0 a"), err("ERR numkeys should be greater than 0"));
    assert_eq!(cmd(s, "SINTERCARD x a"), err("ERR numkeys should be greater than 0"));
    assert_eq!(
        cmd(s, "SINTERCARD 3 a b"),
        err("ERR Number of keys can't be greater than number of args")
    );
    assert_eq!(cmd(s, "SINTERCARD 1 a LIMIT x"), err("ERR LIMIT can't be negative"));
    assert_eq!(cmd(s, "SMOVE a b w"), int(1));
    assert_eq!(cmd(s, "SMOVE a b nope"), int(0));
    assert_eq!(cmd(s, "SISMEMBER b w"), int(1));
    assert_eq!(cmd(s, "SREM a x y z"), int(3));
    assert_eq!(cmd(s, "EXISTS a"), int(0), "an emptied set is gone");
    assert_eq!(cmd(s, "TYPE b"), Reply::Status("set".into()));
    cmd(s, "SET str v");
    assert_eq!(cmd(s, "SADD str x"), err(super::WRONGTYPE));
    assert_eq!(cmd(s, "SUNION b str"), err(super::WRONGTYPE));
    assert_eq!(cmd(s, "SMOVE b str q"), err(super::WRONGTYPE));
    assert_eq!(cmd(s, "SCARD b"), int(4), "a refused SMOVE moved nothing");
}

#[test]
fn spop_and_srandmember_draw_alike_at_every_replica() {
    let (a, b) = (&mut RedisStore::new(), &mut RedisStore::new());
    for s in [&mut *a, &mut *b] {
        cmd(s, "SADD s 1 2 3 4 5 6 7 8");
    }
    for line in [
        "SRANDMEMBER s",
        "SRANDMEMBER s 3",
        "SRANDMEMBER s -20",
        "SPOP s",
        "SPOP s 2",
    ] {
        assert_eq!(cmd(a, line), cmd(b, line), "{line}");
    }
    assert_eq!(cmd(a, "SCARD s"), int(5));
    let Reply::Array(distinct) = cmd(a, "SRANDMEMBER s 10") else {
        panic!()
    };
    assert_eq!(distinct.len(), 5, "at most every member, each once");
    let Reply::Array(repeated) = cmd(a, "SRANDMEMBER s -10") else {
        panic!()
    };
    assert_eq!(repeated.len(), 10);
    assert_eq!(cmd(a, "SPOP s -1"), err("ERR value is out of range, must be positive"));
    assert_eq!(cmd(a, "SPOP nokey"), Reply::Nil);
    assert_eq!(cmd(a, "SPOP nokey 3"), Reply::Set(vec![]));
    assert_eq!(cmd(a, "SRANDMEMBER nokey 3"), Reply::Array(vec![]));
    let popped = cmd(a, "SPOP s 10");
    assert!(matches!(&popped, Reply::Set(m) if m.len() == 5), "{popped:?}");
    assert_eq!(cmd(a, "EXISTS s"), int(0));
}

#[test]
fn more_string_and_key_commands() {
    let s = &mut RedisStore::new();
    s.advance(1_000_000_000); // agreed time: 1,000 s
    cmd(s, "SET k Hello");
    assert_eq!(cmd(s, "GETRANGE k 0 3"), bulk("Hell"));
    assert_eq!(cmd(s, "GETRANGE k -3 -1"), bulk("llo"));
    assert_eq!(cmd(s, "GETRANGE k 10 20"), bulk(""));
    assert_eq!(cmd(s, "GETRANGE nokey 0 -1"), bulk(""));
    assert_eq!(cmd(s, "SETRANGE k 6 World"), int(11));
    assert_eq!(cmd(s, "GET k"), Reply::Bulk(Bytes::from_static(b"Hello\0World")));
    assert_eq!(cmd(s, "SETRANGE k -1 x"), err("ERR offset is out of range"));
    assert_eq!(cmd(s, "SETRANGE nokey 0 "), int(0));
    assert_eq!(cmd(s, "EXISTS nokey"), int(0), "an empty SETRANGE creates nothing");
    assert_eq!(cmd(s, "SET f 10.5"), Reply::ok());
    assert_eq!(cmd(s, "INCRBYFLOAT f 0.1"), bulk("10.6"));
    assert_eq!(cmd(s, "INCRBYFLOAT f x"), err("ERR value is not a valid float"));
    assert_eq!(
        cmd(s, "INCRBYFLOAT f +inf"),
        err("ERR increment would produce NaN or Infinity")
    );
    assert_eq!(cmd(s, "INCRBYFLOAT k 1"), err("ERR value is not a valid float"));
    assert_eq!(
        cmd(s, "GETEX k EX 100"),
        Reply::Bulk(Bytes::from_static(b"Hello\0World"))
    );
    assert_eq!(cmd(s, "TTL k"), int(100));
    assert_eq!(cmd(s, "EXPIRETIME k"), int(1_100));
    assert_eq!(cmd(s, "PEXPIRETIME k"), int(1_100_000));
    assert_eq!(
        cmd(s, "GETEX k PERSIST"),
        Reply::Bulk(Bytes::from_static(b"Hello\0World"))
    );
    assert_eq!(cmd(s, "EXPIRETIME k"), int(-1));
    assert_eq!(cmd(s, "EXPIRETIME nokey"), int(-2));
    assert_eq!(cmd(s, "GETEX k EX 1 PERSIST"), err("ERR syntax error"));
    assert_eq!(cmd(s, "EXPIREAT k 2000"), int(1));
    assert_eq!(cmd(s, "TTL k"), int(1_000));
    assert_eq!(cmd(s, "PEXPIREAT k 500"), int(1));
    assert_eq!(cmd(s, "EXISTS k"), int(0), "an expiry in the past deletes the key");
    cmd(s, "SET a 1");
    cmd(s, "EXPIRE a 50");
    assert_eq!(cmd(s, "RENAME a b"), Reply::ok());
    assert_eq!(cmd(s, "TTL b"), int(50), "RENAME keeps the time to live");
    assert_eq!(cmd(s, "RENAME a c"), err("ERR no such key"));
    cmd(s, "SET c 3");
    assert_eq!(cmd(s, "RENAMENX b c"), int(0));
    assert_eq!(cmd(s, "COPY b c"), int(0));
    assert_eq!(cmd(s, "COPY b c REPLACE"), int(1));
    assert_eq!(cmd(s, "GET c"), bulk("1"));
    assert_eq!(
        cmd(s, "COPY b b"),
        err("ERR source and destination objects are the same")
    );
    assert_eq!(cmd(s, "COPY b d DB 1"), err("ERR DB index is out of range"));
    cmd(s, "HSET h f v");
    assert_eq!(cmd(s, "COPY h h2"), int(1));
    assert_eq!(cmd(s, "HGET h2 f"), bulk("v"));
    assert_eq!(cmd(s, "TOUCH b c nokey"), int(2));
    assert_eq!(cmd(s, "OBJECT ENCODING c"), bulk("int"));
    assert_eq!(cmd(s, "OBJECT ENCODING h"), bulk("hashtable"));
    assert_eq!(cmd(s, "OBJECT ENCODING nokey"), Reply::Nil);
    let Reply::Bulk(key) = cmd(s, "RANDOMKEY") else {
        panic!("a key")
    };
    assert_eq!(cmd(s, &format!("EXISTS {}", String::from_utf8_lossy(&key))), int(1));
    assert_eq!(cmd(&mut RedisStore::new(), "RANDOMKEY"), Reply::Nil);
}

#[test]
fn the_store_asks_to_be_woken_when_its_first_key_expires_and_the_wake_removes_it() {
    let s = &mut RedisStore::new();
    s.advance(1_000_000);
    assert_eq!(s.wake_at(), None);
    cmd(s, "SET a 1 PX 500");
    cmd(s, "SET b 1 PX 100");
    assert_eq!(s.wake_at(), Some(1_101_000), "just past b's expiry at 1,100 ms");
    let context = BatchContext {
        index: 0,
        seqno: SeqNo(9),
        time_us: 1_101_000,
        seed: [0; 32],
    };
    s.wake(&context, &mut Effects::default());
    assert_eq!(cmd(s, "EXISTS a b"), int(1), "b is gone, a is not yet");
    assert_eq!(s.wake_at(), Some(1_501_000));
}

#[test]
fn large_collections_count_their_memory_alike_after_a_restore_and_return_it_all() {
    let s = &mut RedisStore::new();
    for i in 0..1000 {
        cmd(s, &format!("RPUSH big element-{i}"));
        cmd(s, &format!("HSET h field-{i} {i}"));
    }
    let used = s.used;
    assert!(used > 1000 * 16, "every element counts: {used}");
    let mut copy = RedisStore::new();
    copy.restore(&s.checkpoint()).unwrap();
    assert_eq!(&copy, s, "a restored replica counts exactly as the one that ran");
    for _ in 0..10 {
        assert_eq!(cmd(s, "RPOP big"), cmd(&mut copy, "RPOP big"));
    }
    assert_eq!(copy.used, s.used);
    cmd(s, "DEL big h");
    assert_eq!(s.used, 0, "every byte counted is returned");
}

#[test]
fn setrange_refuses_offsets_past_the_largest_string_without_overflowing() {
    let s = &mut RedisStore::new();
    for offset in ["9223372036854775807", "2147483647", "536870912"] {
        assert_eq!(
            cmd(s, &format!("SETRANGE k {offset} A")),
            err("ERR string exceeds maximum allowed size (proto-max-bulk-len)"),
            "{offset}"
        );
    }
    assert_eq!(cmd(s, "EXISTS k"), int(0));
}

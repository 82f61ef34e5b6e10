//! The sorted-set commands against Redis' documented replies.

use super::tests::{arr, bulk, cmd, err, int};
use super::RedisStore;
use crate::reply::Reply;
use upright_core::service::Service;

fn dbl(s: &str) -> Reply {
    Reply::Double(s.into())
}

fn pairs(items: &[(&str, &str)]) -> Reply {
    Reply::Pairs(items.iter().map(|(m, s)| (bulk(m), dbl(s))).collect())
}

#[test]
fn zadd_flags_follow_redis() {
    let s = &mut RedisStore::new();
    assert_eq!(cmd(s, "ZADD z 1 a 2 b 3 c"), int(3));
    assert_eq!(cmd(s, "ZADD z 5 a 2 b 9 d"), int(1), "counts only the added");
    assert_eq!(cmd(s, "ZADD z CH 6 a 2 b 1 e"), int(2), "CH counts changed too");
    assert_eq!(cmd(s, "ZADD z NX 100 a 7 f"), int(1));
    assert_eq!(cmd(s, "ZSCORE z a"), dbl("6"));
    assert_eq!(cmd(s, "ZADD z XX 1.5 a 8 nope"), int(0));
    assert_eq!(cmd(s, "ZSCORE z a"), dbl("1.5"));
    assert_eq!(cmd(s, "ZSCORE z nope"), Reply::Nil);
    assert_eq!(cmd(s, "ZADD z GT CH 1 a 10 b"), int(1), "GT keeps the higher score");
    assert_eq!(
        cmd(s, "ZMSCORE z a b nope"),
        Reply::Array(vec![dbl("1.5"), dbl("10"), Reply::Nil])
    );
    assert_eq!(cmd(s, "ZADD z LT CH 0 a 20 b"), int(1));
    assert_eq!(cmd(s, "ZADD z INCR 2.25 a"), dbl("2.25"));
    assert_eq!(cmd(s, "ZADD z INCR GT -1 a"), Reply::Nil, "not raised: nil");
    assert_eq!(cmd(s, "ZINCRBY z 1 a"), dbl("3.25"));
    assert_eq!(
        cmd(s, "ZADD z NX XX 1 a"),
        err("ERR XX and NX options at the same time are not compatible")
    );
    assert_eq!(
        cmd(s, "ZADD z GT LT 1 a"),
        err("ERR GT, LT, and/or NX options at the same time are not compatible")
    );
    assert_eq!(
        cmd(s, "ZADD z INCR 1 a 2 b"),
        err("ERR INCR option supports a single increment-element pair")
    );
    assert_eq!(cmd(s, "ZADD z 1 a 2"), err("ERR syntax error"));
    assert_eq!(cmd(s, "ZADD z 1 a nan b"), err("ERR value is not a valid float"));
    assert_eq!(cmd(s, "ZSCORE z b"), dbl("10"), "a refused ZADD adds nothing");
    assert_eq!(cmd(s, "ZADD z inf x -inf y"), int(2));
    assert_eq!(
        cmd(s, "ZINCRBY z -inf x"),
        err("ERR resulting score is not a number (NaN)")
    );
    assert_eq!(cmd(s, "ZADD nokey XX 1 a"), int(0));
    assert_eq!(cmd(s, "EXISTS nokey"), int(0), "XX never creates the key");
    assert_eq!(cmd(s, "TYPE z"), Reply::Status("zset".into()));
    cmd(s, "SET str v");
    assert_eq!(cmd(s, "ZADD str 1 a"), err(super::WRONGTYPE));
    assert_eq!(cmd(s, "ZRANGE str 0 -1"), err(super::WRONGTYPE));
}

#[test]
fn ranges_by_rank_score_and_lex() {
    let s = &mut RedisStore::new();
    cmd(s, "ZADD z 1 a 2 b 3 c 4 d 5 e");
    assert_eq!(cmd(s, "ZRANGE z 0 -1"), arr(&["a", "b", "c", "d", "e"]));
    assert_eq!(cmd(s, "ZRANGE z -2 100"), arr(&["d", "e"]));
    assert_eq!(cmd(s, "ZRANGE z 3 1"), arr(&[]));
    assert_eq!(cmd(s, "ZREVRANGE z 0 1 WITHSCORES"), pairs(&[("e", "5"), ("d", "4")]));
    assert_eq!(cmd(s, "ZRANGE z 0 1 REV"), arr(&["e", "d"]));
    assert_eq!(cmd(s, "ZRANGEBYSCORE z (1 3"), arr(&["b", "c"]));
    assert_eq!(cmd(s, "ZRANGEBYSCORE z -inf +inf LIMIT 1 2"), arr(&["b", "c"]));
    assert_eq!(cmd(s, "ZRANGEBYSCORE z -inf +inf LIMIT -1 2"), arr(&[]));
    assert_eq!(cmd(s, "ZRANGEBYSCORE z 2 inf LIMIT 1 -1"), arr(&["c", "d", "e"]));
    assert_eq!(cmd(s, "ZREVRANGEBYSCORE z 4 (2"), arr(&["d", "c"]));
    assert_eq!(
        cmd(s, "ZRANGE z (4 2 BYSCORE REV WITHSCORES"),
        pairs(&[("c", "3"), ("b", "2")])
    );
    assert_eq!(cmd(s, "ZCOUNT z (1 (5"), int(3));
    assert_eq!(cmd(s, "ZCOUNT z x 1"), err("ERR min or max is not a float"));
    assert_eq!(cmd(s, "ZRANK z c"), int(2));
    assert_eq!(cmd(s, "ZREVRANK z c"), int(2));
    assert_eq!(cmd(s, "ZRANK z e WITHSCORE"), Reply::Array(vec![int(4), dbl("5")]));
    assert_eq!(cmd(s, "ZRANK z nope"), Reply::Nil);
    assert_eq!(cmd(s, "ZRANK z nope WITHSCORE"), Reply::NilArray);
    cmd(s, "ZADD l 0 alpha 0 bar 0 cool 0 down");
    assert_eq!(cmd(s, "ZRANGEBYLEX l [bar (down"), arr(&["bar", "cool"]));
    assert_eq!(cmd(s, "ZRANGEBYLEX l - + LIMIT 1 2"), arr(&["bar", "cool"]));
    assert_eq!(cmd(s, "ZREVRANGEBYLEX l (cool -"), arr(&["bar", "alpha"]));
    assert_eq!(cmd(s, "ZRANGE l [c + BYLEX"), arr(&["cool", "down"]));
    assert_eq!(cmd(s, "ZLEXCOUNT l (alpha [cool"), int(2));
    assert_eq!(
        cmd(s, "ZRANGEBYLEX l a b"),
        err("ERR min or max not valid string range item")
    );
    assert_eq!(
        cmd(s, "ZRANGE z 0 -1 LIMIT 1 2"),
        err("ERR syntax error, LIMIT is only supported in combination with either BYSCORE or BYLEX")
    );
    assert_eq!(
        cmd(s, "ZRANGE l - + BYLEX WITHSCORES"),
        err("ERR syntax error, WITHSCORES not supported in combination with BYLEX")
    );
    assert_eq!(cmd(s, "ZREVRANGE z 0 -1 BYSCORE"), err("ERR syntax error"));
    assert_eq!(cmd(s, "ZRANGESTORE dst z 1 3 BYSCORE LIMIT 1 1"), int(1));
    assert_eq!(cmd(s, "ZRANGE dst 0 -1 WITHSCORES"), pairs(&[("b", "2")]));
    assert_eq!(cmd(s, "ZRANGESTORE dst z 10 20"), int(0));
    assert_eq!(cmd(s, "EXISTS dst"), int(0), "an empty range deletes the destination");
    assert_eq!(cmd(s, "ZRANGESTORE dst z 0 -1 WITHSCORES"), err("ERR syntax error"));
    assert_eq!(cmd(s, "ZREMRANGEBYSCORE z -inf (2"), int(1));
    assert_eq!(cmd(s, "ZREMRANGEBYRANK z -1 -1"), int(1));
    assert_eq!(cmd(s, "ZREMRANGEBYLEX l - (cool"), int(2));
    assert_eq!(cmd(s, "ZRANGE z 0 -1"), arr(&["b", "c", "d"]));
    assert_eq!(cmd(s, "ZREM z b c d nope"), int(3));
    assert_eq!(cmd(s, "EXISTS z"), int(0), "an emptied sorted set is gone");
}

#[test]
fn pops_and_combinations() {
    let s = &mut RedisStore::new();
    cmd(s, "ZADD z 1 a 2 b 3 c 4 d");
    assert_eq!(cmd(s, "ZPOPMIN z"), Reply::Array(vec![bulk("a"), dbl("1")]));
    assert_eq!(cmd(s, "ZPOPMAX z 2"), pairs(&[("d", "4"), ("c", "3")]));
    assert_eq!(
        cmd(s, "ZPOPMIN z -1"),
        err("ERR value is out of range, must be positive")
    );
    assert_eq!(cmd(s, "ZPOPMIN nokey"), Reply::Array(vec![]));
    assert_eq!(
        cmd(s, "ZMPOP 2 nokey z MIN COUNT 5"),
        Reply::Array(vec![
            bulk("z"),
            Reply::Array(vec![Reply::Array(vec![bulk("b"), dbl("2")])])
        ])
    );
    assert_eq!(cmd(s, "ZMPOP 1 z MAX"), Reply::NilArray);
    assert_eq!(cmd(s, "ZMPOP 0 z MAX"), err("ERR numkeys should be greater than 0"));
    assert_eq!(
        cmd(s, "ZMPOP 1 z MAX COUNT 0"),
        err("ERR count should be greater than 0")
    );
    assert_eq!(cmd(s, "ZMPOP 1 z SIDEWAYS"), err("ERR syntax error"));
    cmd(s, "ZADD x 1 a 2 b 3 c");
    cmd(s, "ZADD y 10 b 20 c 30 d");
    cmd(s, "SADD plain c d e");
    assert_eq!(cmd(s, "ZUNIONSTORE u 2 x y"), int(4));
    assert_eq!(
        cmd(s, "ZRANGE u 0 -1 WITHSCORES"),
        pairs(&[("a", "1"), ("b", "12"), ("c", "23"), ("d", "30")])
    );
    assert_eq!(
        cmd(s, "ZINTER 2 x y WEIGHTS 2 0.5 WITHSCORES"),
        pairs(&[("b", "9"), ("c", "16")])
    );
    assert_eq!(cmd(s, "ZINTER 2 x y AGGREGATE MAX"), arr(&["b", "c"]));
    assert_eq!(
        cmd(s, "ZINTER 2 x plain WITHSCORES"),
        pairs(&[("c", "4")]),
        "a set's members score 1"
    );
    assert_eq!(cmd(s, "ZDIFF 2 y x WITHSCORES"), pairs(&[("d", "30")]));
    assert_eq!(cmd(s, "ZDIFFSTORE dd 2 x x"), int(0));
    assert_eq!(cmd(s, "EXISTS dd"), int(0));
    assert_eq!(cmd(s, "ZINTERCARD 2 x y LIMIT 1"), int(1));
    assert_eq!(cmd(s, "ZINTERCARD 2 x y"), int(2));
    assert_eq!(
        cmd(s, "ZUNION 0 x"),
        err("ERR at least 1 input key is needed for 'zunion' command")
    );
    assert_eq!(cmd(s, "ZUNIONSTORE u 2 x y WITHSCORES"), err("ERR syntax error"));
    assert_eq!(
        cmd(s, "ZUNION 2 x y WEIGHTS 1 nan"),
        err("ERR weight value is not a float")
    );
    cmd(s, "ZADD pinf 1 k");
    cmd(s, "ZADD ninf 1 k");
    assert_eq!(
        cmd(s, "ZUNION 2 pinf ninf WEIGHTS inf -inf WITHSCORES"),
        pairs(&[("k", "0")]),
        "inf - inf sums to 0"
    );
    cmd(s, "SET str v");
    assert_eq!(cmd(s, "ZUNION 2 x str"), err(super::WRONGTYPE));
}

#[test]
fn zrandmember_and_zscan_are_the_same_at_every_replica() {
    let (a, b) = (&mut RedisStore::new(), &mut RedisStore::new());
    for s in [&mut *a, &mut *b] {
        cmd(s, "ZADD z 1 a 2 b 3 c 4 d 5 e");
    }
    for line in [
        "ZRANDMEMBER z",
        "ZRANDMEMBER z 3",
        "ZRANDMEMBER z -9 WITHSCORES",
        "ZSCAN z 0 COUNT 2",
    ] {
        assert_eq!(cmd(a, line), cmd(b, line), "{line}");
    }
    let Reply::Array(distinct) = cmd(a, "ZRANDMEMBER z 10") else {
        panic!()
    };
    assert_eq!(distinct.len(), 5, "at most every member, each once");
    assert_eq!(
        cmd(a, "ZRANDMEMBER z -9223372036854775808"),
        err("ERR value is out of range")
    );
    assert_eq!(cmd(a, "ZRANDMEMBER nokey 3"), arr(&[]));
    let Reply::Array(scan) = cmd(a, "ZSCAN z 0 COUNT 100") else {
        panic!()
    };
    let Reply::Array(items) = &scan[1] else { panic!() };
    assert_eq!(items.len(), 10, "every member with its score");
}

#[test]
fn sorted_sets_survive_a_checkpoint_and_free_their_memory() {
    let s = &mut RedisStore::new();
    cmd(s, "ZADD z 1.5 a -2 b inf c");
    let used = s.used;
    let mut copy = RedisStore::new();
    copy.restore(&s.checkpoint()).unwrap();
    assert_eq!(&copy, s);
    assert_eq!(
        cmd(&mut copy, "ZRANGE z 0 -1 WITHSCORES"),
        pairs(&[("b", "-2"), ("a", "1.5"), ("c", "inf")])
    );
    assert_eq!(copy.used, used);
    cmd(s, "ZREM z a b c");
    assert_eq!(s.used, 0, "every byte counted for the set is returned");
}

//! The sorted-set commands (ZADD with NX/XX/GT/LT/CH/INCR, ZINCRBY, ZCARD, ZSCORE, ZMSCORE,
//! ZRANK, ZREVRANK, ZRANGE with BYSCORE/BYLEX/REV/LIMIT/WITHSCORES, ZRANGESTORE, ZREVRANGE,
//! ZRANGEBYSCORE, ZREVRANGEBYSCORE, ZRANGEBYLEX, ZREVRANGEBYLEX, ZCOUNT, ZLEXCOUNT, ZREM,
//! ZREMRANGEBYRANK/SCORE/LEX, ZPOPMIN, ZPOPMAX, ZMPOP, ZUNION/ZINTER/ZDIFF and their STORE forms,
//! ZINTERCARD, ZRANDMEMBER, ZSCAN), with Redis' replies and errors.
//!
//! A sorted set keeps each member's score and the (score, member) order, so every replica walks
//! members alike; a score is never NaN and `-0` is stored as `0`. Scores print as Redis 7.2
//! prints them: the shortest digits that read back the same, laid out as `%.17g` lays them out.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Bound;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::{bulk, Collection, RedisStore, Value, FIELD_OVERHEAD};
use crate::command::{int_arg, is, parse_i64, syntax_error};
use crate::reply::Reply;

/// A score: a float that is never NaN, ordered totally (`-0` is stored as `0`, so the total
/// order is the numeric one).
#[derive(Clone, Copy, Debug)]
pub(super) struct Score(f64);

impl Score {
    fn new(value: f64) -> Score {
        debug_assert!(!value.is_nan());
        Score(value + 0.0) // -0 + 0 = +0
    }
}

impl PartialEq for Score {
    fn eq(&self, other: &Score) -> bool {
        self.cmp(other).is_eq()
    }
}
impl Eq for Score {}
impl PartialOrd for Score {
    fn partial_cmp(&self, other: &Score) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Score {
    fn cmp(&self, other: &Score) -> std::cmp::Ordering {
        self.0.total_cmp(&other.0)
    }
}

/// A sorted set: members with their scores, and the (score, member) order.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "Vec<(Bytes, f64)>", into = "Vec<(Bytes, f64)>")]
pub(super) struct ZSet {
    scores: BTreeMap<Bytes, Score>,
    order: BTreeSet<(Score, Bytes)>,
    /// Bytes held, for the memory bound (kept as members come and go).
    bytes: usize,
}

impl From<Vec<(Bytes, f64)>> for ZSet {
    fn from(rows: Vec<(Bytes, f64)>) -> ZSet {
        let mut z = ZSet::default();
        for (member, score) in rows {
            if !score.is_nan() {
                z.insert(member, score);
            }
        }
        z
    }
}

impl From<ZSet> for Vec<(Bytes, f64)> {
    fn from(z: ZSet) -> Vec<(Bytes, f64)> {
        z.order.into_iter().map(|(s, m)| (m, s.0)).collect()
    }
}

fn member_cost(member: &[u8]) -> usize {
    member.len() + 8 + FIELD_OVERHEAD
}

/// The float just above `x` (for an inclusive upper bound on the (score, member) order).
fn next_up(x: f64) -> f64 {
    if x.is_nan() || x == f64::INFINITY {
        x
    } else if x == 0.0 {
        f64::from_bits(1)
    } else if x > 0.0 {
        f64::from_bits(x.to_bits() + 1)
    } else {
        f64::from_bits(x.to_bits() - 1)
    }
}

impl ZSet {
    pub(super) fn len(&self) -> usize {
        self.scores.len()
    }

    fn score(&self, member: &[u8]) -> Option<f64> {
        self.scores.get(member).map(|s| s.0)
    }

    /// Sets `member`'s score; returns the old one.
    fn insert(&mut self, member: Bytes, score: f64) -> Option<f64> {
        let score = Score::new(score);
        let old = self.scores.insert(member.clone(), score);
        match old {
            Some(old) => {
                self.order.remove(&(old, member.clone()));
            }
            None => self.bytes += member_cost(&member),
        }
        self.order.insert((score, member));
        old.map(|s| s.0)
    }

    fn remove(&mut self, member: &[u8]) -> Option<f64> {
        let (member, score) = self.scores.remove_entry(member)?;
        self.bytes -= member_cost(&member);
        self.order.remove(&(score, member));
        Some(score.0)
    }

    /// Members, lowest score first.
    pub(super) fn members(&self) -> impl Iterator<Item = &Bytes> {
        self.order.iter().map(|(_, m)| m)
    }

    /// Members with scores, lowest first.
    fn iter(&self) -> impl DoubleEndedIterator<Item = (&Bytes, f64)> {
        self.order.iter().map(|(s, m)| (m, s.0))
    }

    /// The 0-based rank of `member` from the lowest score (from the highest if `rev`).
    fn rank(&self, member: &[u8], rev: bool) -> Option<usize> {
        let score = *self.scores.get(member)?;
        let below = self.order.range(..(score, Bytes::copy_from_slice(member))).count();
        Some(if rev { self.len() - 1 - below } else { below })
    }

    /// Members whose score is in `range`, lowest first (highest first if `rev`).
    fn by_score<'a>(&'a self, range: &ScoreRange, rev: bool) -> Box<dyn Iterator<Item = (&'a Bytes, f64)> + 'a> {
        let low = if range.min == f64::NEG_INFINITY {
            Bound::Unbounded
        } else {
            Bound::Included((Score::new(range.min), Bytes::new()))
        };
        let high = if range.max == f64::INFINITY {
            Bound::Unbounded
        } else {
            Bound::Excluded((Score::new(next_up(range.max)), Bytes::new()))
        };
        if range.min > range.max {
            return Box::new(std::iter::empty());
        }
        let inside = self.order.range((low, high)).map(|(s, m)| (m, s.0));
        let range = *range;
        if rev {
            Box::new(inside.rev().filter(move |(_, s)| range.contains(*s)))
        } else {
            Box::new(inside.filter(move |(_, s)| range.contains(*s)))
        }
    }

    /// Members in the lexical range (meaningful when all scores are equal, as in Redis: the walk
    /// starts at the first member at or past the low end and stops at the first past the high
    /// end), lowest first (highest first if `rev`).
    fn by_lex<'a>(&'a self, range: &'a LexRange, rev: bool) -> Box<dyn Iterator<Item = (&'a Bytes, f64)> + 'a> {
        if rev {
            Box::new(
                self.iter()
                    .rev()
                    .skip_while(|(m, _)| !range.below_max(m))
                    .take_while(|(m, _)| range.above_min(m)),
            )
        } else {
            Box::new(
                self.iter()
                    .skip_while(|(m, _)| !range.above_min(m))
                    .take_while(|(m, _)| range.below_max(m)),
            )
        }
    }
}

impl Collection for ZSet {
    fn of(value: &Value) -> Option<&Self> {
        if let Value::ZSet(z) = value {
            Some(z)
        } else {
            None
        }
    }
    fn of_mut(value: &mut Value) -> Option<&mut Self> {
        if let Value::ZSet(z) = value {
            Some(z)
        } else {
            None
        }
    }
    fn into_value(self) -> Value {
        Value::ZSet(self)
    }
    fn cost(&self) -> usize {
        self.bytes
    }
    fn len(&self) -> usize {
        self.scores.len()
    }
    const COST_IS_KEPT: bool = true;
}

/// A score as Redis 7.2 prints one: `inf`/`-inf`, else the shortest digits that read back the
/// same, in `%.17g`'s layout (an exponent below -4 or from 17 up goes scientific).
pub(super) fn format_score(x: f64) -> String {
    if x.is_infinite() {
        return if x > 0.0 { "inf".into() } else { "-inf".into() };
    }
    if x == 0.0 {
        return "0".into();
    }
    let sci = format!("{x:e}");
    let (mantissa, exp) = sci.split_once('e').expect("{:e} has an exponent");
    let exp: i32 = exp.parse().expect("{:e} exponent is an integer");
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mantissa),
    };
    if !(-4..17).contains(&exp) {
        return format!("{sign}{mantissa}e{}{:02}", if exp < 0 { '-' } else { '+' }, exp.abs());
    }
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    if exp >= 0 {
        let whole = exp as usize + 1;
        if digits.len() <= whole {
            format!("{sign}{digits}{}", "0".repeat(whole - digits.len()))
        } else {
            format!("{sign}{}.{}", &digits[..whole], &digits[whole..])
        }
    } else {
        format!("{sign}0.{}{digits}", "0".repeat((-exp - 1) as usize))
    }
}

fn double(x: f64) -> Reply {
    Reply::Double(format_score(x))
}

/// A score argument (`inf`, `-inf` and `+inf` read; NaN and anything else refused).
fn parse_score(b: &[u8]) -> Option<f64> {
    super::parse_float(b).filter(|x| !x.is_nan())
}

fn not_float() -> Reply {
    Reply::err("ERR value is not a valid float")
}

/// A score interval, each end inclusive or not.
#[derive(Clone, Copy, Debug)]
struct ScoreRange {
    min: f64,
    min_ex: bool,
    max: f64,
    max_ex: bool,
}

impl ScoreRange {
    fn parse(min: &[u8], max: &[u8]) -> Result<ScoreRange, Reply> {
        let end = |b: &[u8]| match b.strip_prefix(b"(") {
            Some(rest) => parse_score(rest).map(|x| (x, true)),
            None => parse_score(b).map(|x| (x, false)),
        };
        match (end(min), end(max)) {
            (Some((min, min_ex)), Some((max, max_ex))) => Ok(ScoreRange {
                min,
                min_ex,
                max,
                max_ex,
            }),
            _ => Err(Reply::err("ERR min or max is not a float")),
        }
    }

    fn contains(&self, x: f64) -> bool {
        (if self.min_ex { x > self.min } else { x >= self.min })
            && (if self.max_ex { x < self.max } else { x <= self.max })
    }
}

/// One end of a lexical range.
#[derive(Clone, Debug)]
enum LexEnd {
    /// `-`
    Lowest,
    /// `+`
    Highest,
    /// `[x` (inclusive) or `(x`.
    At(Bytes, bool),
}

#[derive(Clone, Debug)]
struct LexRange {
    min: LexEnd,
    max: LexEnd,
}

impl LexRange {
    fn parse(min: &Bytes, max: &Bytes) -> Result<LexRange, Reply> {
        let end = |b: &Bytes| match b.first() {
            Some(b'-') if b.len() == 1 => Some(LexEnd::Lowest),
            Some(b'+') if b.len() == 1 => Some(LexEnd::Highest),
            Some(b'[') => Some(LexEnd::At(b.slice(1..), true)),
            Some(b'(') => Some(LexEnd::At(b.slice(1..), false)),
            _ => None,
        };
        match (end(min), end(max)) {
            (Some(min), Some(max)) => Ok(LexRange { min, max }),
            _ => Err(Reply::err("ERR min or max not valid string range item")),
        }
    }

    fn above_min(&self, m: &[u8]) -> bool {
        match &self.min {
            LexEnd::Lowest => true,
            LexEnd::Highest => false,
            LexEnd::At(x, inclusive) => m > &x[..] || (*inclusive && m == &x[..]),
        }
    }

    fn below_max(&self, m: &[u8]) -> bool {
        match &self.max {
            LexEnd::Lowest => false,
            LexEnd::Highest => true,
            LexEnd::At(x, inclusive) => m < &x[..] || (*inclusive && m == &x[..]),
        }
    }
}

/// What a ZRANGE-family command selects.
enum Selection {
    /// Ranks `start..=stop` (negative from the end).
    Rank(i64, i64),
    Score(ScoreRange),
    Lex(LexRange),
}

/// A parsed ZRANGE-family request.
struct RangeQuery {
    selection: Selection,
    rev: bool,
    /// LIMIT offset count (count < 0: no limit).
    limit: Option<(i64, i64)>,
    with_scores: bool,
}

/// How a ZRANGE-family command reads its arguments.
#[derive(Clone, Copy, PartialEq, Eq)]
enum RangeForm {
    /// ZRANGE / ZRANGESTORE: BYSCORE, BYLEX and REV are options.
    Generic {
        store: bool,
    },
    Rank {
        rev: bool,
    },
    Score {
        rev: bool,
    },
    Lex {
        rev: bool,
    },
}

impl RangeQuery {
    /// Parses `min max [options]` for `form`.
    fn parse(form: RangeForm, a: &[Bytes]) -> Result<RangeQuery, Reply> {
        let (mut by_score, mut by_lex, mut rev) = match form {
            RangeForm::Generic { .. } => (false, false, false),
            RangeForm::Rank { rev } => (false, false, rev),
            RangeForm::Score { rev } => (true, false, rev),
            RangeForm::Lex { rev } => (false, true, rev),
        };
        let (mut limit, mut with_scores) = (None, false);
        let mut i = 2;
        while i < a.len() {
            let opt = &a[i];
            let generic = matches!(form, RangeForm::Generic { .. });
            if is(opt, "withscores") && form != (RangeForm::Generic { store: true }) {
                with_scores = true;
            } else if is(opt, "limit") && i + 2 < a.len() {
                let offset = int_arg(&a[i + 1])?;
                let count = int_arg(&a[i + 2])?;
                limit = Some((offset, count));
                i += 2;
            } else if generic && is(opt, "byscore") {
                by_score = true;
            } else if generic && is(opt, "bylex") {
                by_lex = true;
            } else if generic && is(opt, "rev") {
                rev = true;
            } else {
                return Err(syntax_error());
            }
            i += 1;
        }
        if by_score && by_lex {
            return Err(syntax_error());
        }
        if limit.is_some() && !by_score && !by_lex {
            return Err(Reply::err(
                "ERR syntax error, LIMIT is only supported in combination with either BYSCORE or BYLEX",
            ));
        }
        if with_scores && by_lex {
            return Err(Reply::err(
                "ERR syntax error, WITHSCORES not supported in combination with BYLEX",
            ));
        }
        // With REV, score and lex ranges are given high end first.
        let (low, high) = if rev && (by_score || by_lex) {
            (&a[1], &a[0])
        } else {
            (&a[0], &a[1])
        };
        let selection = if by_score {
            Selection::Score(ScoreRange::parse(low, high)?)
        } else if by_lex {
            Selection::Lex(LexRange::parse(low, high)?)
        } else {
            Selection::Rank(int_arg(&a[0])?, int_arg(&a[1])?)
        };
        Ok(RangeQuery {
            selection,
            rev,
            limit,
            with_scores,
        })
    }

    /// The selected members with their scores, in reply order.
    fn select<'a>(&'a self, z: &'a ZSet) -> Vec<(&'a Bytes, f64)> {
        let (offset, count) = match self.limit {
            Some((offset, _)) if offset < 0 => return Vec::new(),
            Some((offset, count)) => (offset as usize, if count < 0 { usize::MAX } else { count as usize }),
            None => (0, usize::MAX),
        };
        match &self.selection {
            Selection::Rank(start, stop) => {
                let len = z.len() as i64;
                let start = if *start < 0 { (len + start).max(0) } else { *start };
                let stop = if *stop < 0 { len + stop } else { (*stop).min(len - 1) };
                if start > stop || start >= len {
                    return Vec::new();
                }
                let n = (stop - start + 1) as usize;
                if self.rev {
                    z.iter().rev().skip(start as usize).take(n).collect()
                } else {
                    z.iter().skip(start as usize).take(n).collect()
                }
            }
            Selection::Score(range) => z.by_score(range, self.rev).skip(offset).take(count).collect(),
            Selection::Lex(range) => z.by_lex(range, self.rev).skip(offset).take(count).collect(),
        }
    }
}

/// Members (with scores if asked) as a range reply: flat in RESP2, pairs in RESP3.
fn range_reply(items: &[(&Bytes, f64)], with_scores: bool) -> Reply {
    if with_scores {
        Reply::Pairs(items.iter().map(|(m, s)| (bulk(m), double(*s))).collect())
    } else {
        Reply::Array(items.iter().map(|(m, _)| bulk(m)).collect())
    }
}

impl RedisStore {
    fn get_zset(&self, key: &[u8]) -> Result<Option<&ZSet>, Reply> {
        self.get_collection(key)
    }

    fn with_zset<R>(&mut self, key: &Bytes, create: bool, f: impl FnOnce(&mut ZSet) -> R) -> Result<Option<R>, Reply> {
        self.with_collection(key, create, f)
    }

    /// Replaces whatever `key` holds with `z` (nothing if `z` is empty).
    fn store_zset(&mut self, key: &Bytes, z: ZSet) {
        self.remove(key);
        if !z.is_empty() {
            self.put_value(key, Value::ZSet(z), None);
        }
    }

    /// The sorted set or set under `key` as members with scores (a set's members score 1), for
    /// ZUNION, ZINTER and ZDIFF; an absent key is empty.
    fn scored_members(&self, key: &[u8]) -> Result<Vec<(Bytes, f64)>, Reply> {
        match self.get(key).map(|e| &e.value) {
            None => Ok(Vec::new()),
            Some(Value::ZSet(z)) => Ok(z.iter().map(|(m, s)| (m.clone(), s)).collect()),
            Some(Value::Set(set)) => Ok(set.iter().map(|m| (m.clone(), 1.0)).collect()),
            Some(_) => Err(super::wrong_type()),
        }
    }
}

/// ZADD's flags.
#[derive(Default)]
struct AddFlags {
    nx: bool,
    xx: bool,
    gt: bool,
    lt: bool,
    ch: bool,
    incr: bool,
}

/// ZADD key [NX|XX] [GT|LT] [CH] [INCR] score member [score member ...]
fn zadd(s: &mut RedisStore, a: &[Bytes]) -> Reply {
    let mut f = AddFlags::default();
    let mut i = 1;
    while i < a.len() {
        let flag = &a[i];
        match () {
            _ if is(flag, "nx") => f.nx = true,
            _ if is(flag, "xx") => f.xx = true,
            _ if is(flag, "gt") => f.gt = true,
            _ if is(flag, "lt") => f.lt = true,
            _ if is(flag, "ch") => f.ch = true,
            _ if is(flag, "incr") => f.incr = true,
            _ => break,
        }
        i += 1;
    }
    let pairs = &a[i..];
    if pairs.is_empty() || !pairs.len().is_multiple_of(2) {
        return syntax_error();
    }
    if f.nx && f.xx {
        return Reply::err("ERR XX and NX options at the same time are not compatible");
    }
    if ((f.gt || f.lt) && f.nx) || (f.gt && f.lt) {
        return Reply::err("ERR GT, LT, and/or NX options at the same time are not compatible");
    }
    if f.incr && pairs.len() > 2 {
        return Reply::err("ERR INCR option supports a single increment-element pair");
    }
    let mut scored = Vec::with_capacity(pairs.len() / 2);
    for pair in pairs.chunks(2) {
        match parse_score(&pair[0]) {
            Some(score) => scored.push((score, pair[1].clone())),
            None => return not_float(),
        }
    }
    let outcome = s.with_zset(&a[0], !f.xx, |z| {
        let (mut added, mut changed, mut last) = (0i64, 0i64, None);
        for (score, member) in scored {
            match z.score(&member) {
                Some(current) => {
                    if f.nx {
                        continue;
                    }
                    let new = if f.incr { current + score } else { score };
                    if new.is_nan() {
                        return Err(Reply::err("ERR resulting score is not a number (NaN)"));
                    }
                    if (f.gt && new <= current) || (f.lt && new >= current) {
                        continue;
                    }
                    last = Some(new);
                    if new != current {
                        z.insert(member, new);
                        changed += 1;
                    }
                }
                None => {
                    if f.xx {
                        continue;
                    }
                    z.insert(member, score);
                    added += 1;
                    last = Some(score);
                }
            }
        }
        Ok((added, changed, last))
    });
    match outcome {
        Err(e) | Ok(Some(Err(e))) => e,
        Ok(None) if f.incr => Reply::Nil,
        Ok(None) => Reply::Int(0),
        Ok(Some(Ok((_, _, last)))) if f.incr => last.map_or(Reply::Nil, double),
        Ok(Some(Ok((added, changed, _)))) => Reply::Int(if f.ch { added + changed } else { added }),
    }
}

/// Runs a sorted-set command that writes; `None` if `name` is not one.
pub(super) fn dispatch(s: &mut RedisStore, name: &str, a: &[Bytes]) -> Option<Reply> {
    let reply = match name {
        "zadd" => zadd(s, a),
        "zincrby" => {
            let argv = [a[0].clone(), Bytes::from_static(b"incr"), a[1].clone(), a[2].clone()];
            zadd(s, &argv)
        }
        "zrem" => s
            .with_zset(&a[0], false, |z| {
                a[1..].iter().filter(|m| z.remove(m).is_some()).count()
            })
            .map_or_else(|e| e, |n| Reply::Int(n.unwrap_or(0) as i64)),
        "zremrangebyrank" | "zremrangebyscore" | "zremrangebylex" => {
            let form = match name {
                "zremrangebyrank" => RangeForm::Rank { rev: false },
                "zremrangebyscore" => RangeForm::Score { rev: false },
                _ => RangeForm::Lex { rev: false },
            };
            let query = match RangeQuery::parse(form, &a[1..]) {
                Ok(q) => q,
                Err(e) => return Some(e),
            };
            s.with_zset(&a[0], false, |z| {
                let doomed: Vec<Bytes> = query.select(z).into_iter().map(|(m, _)| m.clone()).collect();
                doomed.iter().for_each(|m| {
                    z.remove(m);
                });
                doomed.len()
            })
            .map_or_else(|e| e, |n| Reply::Int(n.unwrap_or(0) as i64))
        }
        "zrangestore" => {
            let query = match RangeQuery::parse(RangeForm::Generic { store: true }, &a[2..]) {
                Ok(q) => q,
                Err(e) => return Some(e),
            };
            let result: ZSet = match s.get_zset(&a[1]) {
                Err(e) => return Some(e),
                Ok(None) => ZSet::default(),
                Ok(Some(z)) => query
                    .select(z)
                    .into_iter()
                    .map(|(m, sc)| (m.clone(), sc))
                    .collect::<Vec<_>>()
                    .into(),
            };
            let n = result.len();
            s.store_zset(&a[0], result);
            Reply::Int(n as i64)
        }
        "zpopmin" | "zpopmax" => zpop(s, name == "zpopmax", a),
        "zmpop" => zmpop(s, a),
        "zunionstore" | "zinterstore" | "zdiffstore" => {
            let op = name.trim_end_matches("store");
            match combine(s, op, name, &a[1..], true) {
                Ok((result, _)) => {
                    let n = result.len();
                    s.store_zset(&a[0], result);
                    Reply::Int(n as i64)
                }
                Err(e) => e,
            }
        }
        "zrandmember" => zrandmember(s, a),
        _ => return None,
    };
    Some(reply)
}

/// Runs a sorted-set command that only reads; `None` if `name` is not one.
pub(super) fn dispatch_read(s: &RedisStore, name: &str, a: &[Bytes]) -> Option<Reply> {
    let form = match name {
        "zrange" => Some(RangeForm::Generic { store: false }),
        "zrevrange" => Some(RangeForm::Rank { rev: true }),
        "zrangebyscore" => Some(RangeForm::Score { rev: false }),
        "zrevrangebyscore" => Some(RangeForm::Score { rev: true }),
        "zrangebylex" => Some(RangeForm::Lex { rev: false }),
        "zrevrangebylex" => Some(RangeForm::Lex { rev: true }),
        _ => None,
    };
    if let Some(form) = form {
        let query = match RangeQuery::parse(form, &a[1..]) {
            Ok(q) => q,
            Err(e) => return Some(e),
        };
        return Some(match s.get_zset(&a[0]) {
            Err(e) => e,
            Ok(None) => Reply::Array(Vec::new()),
            Ok(Some(z)) => range_reply(&query.select(z), query.with_scores),
        });
    }
    if matches!(name, "zunion" | "zinter" | "zdiff") {
        return Some(match combine(s, name, name, a, false) {
            Ok((result, with_scores)) => {
                let items: Vec<(&Bytes, f64)> = result.iter().collect();
                range_reply(&items, with_scores)
            }
            Err(e) => e,
        });
    }
    if name == "zintercard" {
        return Some(zintercard(s, a));
    }
    let zset = match name {
        "zcard" | "zscore" | "zmscore" | "zrank" | "zrevrank" | "zcount" | "zlexcount" | "zscan" => {
            match s.get_zset(&a[0]) {
                Ok(z) => z,
                Err(e) => return Some(e),
            }
        }
        _ => return None,
    };
    let empty = ZSet::default();
    let z = zset.unwrap_or(&empty);
    Some(match name {
        "zcard" => Reply::Int(z.len() as i64),
        "zscore" => z.score(&a[1]).map_or(Reply::Nil, double),
        "zmscore" => Reply::Array(a[1..].iter().map(|m| z.score(m).map_or(Reply::Nil, double)).collect()),
        "zrank" | "zrevrank" => {
            let with_score = match a.get(2) {
                None => false,
                Some(w) if a.len() == 3 && is(w, "withscore") => true,
                Some(_) => return Some(syntax_error()),
            };
            match (z.rank(&a[1], name == "zrevrank"), with_score) {
                (None, false) => Reply::Nil,
                (None, true) => Reply::NilArray,
                (Some(r), false) => Reply::Int(r as i64),
                (Some(r), true) => Reply::Array(vec![Reply::Int(r as i64), double(z.score(&a[1]).unwrap_or(0.0))]),
            }
        }
        "zcount" => match ScoreRange::parse(&a[1], &a[2]) {
            Ok(range) => Reply::Int(z.by_score(&range, false).count() as i64),
            Err(e) => e,
        },
        "zlexcount" => match LexRange::parse(&a[1], &a[2]) {
            Ok(range) => Reply::Int(z.by_lex(&range, false).count() as i64),
            Err(e) => e,
        },
        "zscan" => {
            let rows: Vec<(Bytes, Bytes)> = z
                .iter()
                .map(|(m, sc)| (m.clone(), Bytes::from(format_score(sc))))
                .collect();
            super::scan_collection(rows.iter().map(|(m, sc)| (m, Some(sc))), &a[1..], false)
        }
        _ => unreachable!("listed above"),
    })
}

/// Reads `numkeys key [key ...]` from the front of `a`: the keys and the arguments after them.
fn numkeys<'a>(name: &str, a: &'a [Bytes]) -> Result<(&'a [Bytes], &'a [Bytes]), Reply> {
    let n = int_arg(&a[0])?;
    if n < 1 {
        return Err(Reply::err(format!(
            "ERR at least 1 input key is needed for '{name}' command"
        )));
    }
    let n = n as usize;
    if a.len() - 1 < n {
        return Err(syntax_error());
    }
    Ok((&a[1..1 + n], &a[1 + n..]))
}

/// ZUNION / ZINTER / ZDIFF (`op`) over `numkeys key ... [WEIGHTS w ...] [AGGREGATE SUM|MIN|MAX]
/// [WITHSCORES]` (no WEIGHTS/AGGREGATE for ZDIFF, no WITHSCORES for the STORE forms): the result
/// and whether scores were asked for.
fn combine(s: &RedisStore, op: &str, name: &str, a: &[Bytes], store: bool) -> Result<(ZSet, bool), Reply> {
    let (keys, options) = numkeys(name, a)?;
    let mut weights = vec![1.0; keys.len()];
    let mut aggregate = "sum";
    let mut with_scores = false;
    let mut i = 0;
    while i < options.len() {
        let opt = &options[i];
        if op != "zdiff" && is(opt, "weights") && options.len() - i > keys.len() {
            for (k, w) in options[i + 1..=i + keys.len()].iter().enumerate() {
                weights[k] = parse_score(w).ok_or_else(|| Reply::err("ERR weight value is not a float"))?;
            }
            i += keys.len();
        } else if op != "zdiff" && is(opt, "aggregate") && i + 1 < options.len() {
            aggregate = match &options[i + 1] {
                x if is(x, "sum") => "sum",
                x if is(x, "min") => "min",
                x if is(x, "max") => "max",
                _ => return Err(syntax_error()),
            };
            i += 1;
        } else if !store && is(opt, "withscores") {
            with_scores = true;
        } else {
            return Err(syntax_error());
        }
        i += 1;
    }
    let inputs = keys
        .iter()
        .map(|k| s.scored_members(k))
        .collect::<Result<Vec<_>, Reply>>()?;
    let weigh = |score: f64, w: f64| {
        let x = score * w;
        if x.is_nan() {
            0.0
        } else {
            x
        }
    };
    let fold = |acc: f64, x: f64| match aggregate {
        "min" => acc.min(x),
        "max" => acc.max(x),
        _ => {
            let sum = acc + x;
            if sum.is_nan() {
                0.0
            } else {
                sum
            }
        }
    };
    let mut result: BTreeMap<Bytes, f64> = BTreeMap::new();
    let mut inputs = inputs.into_iter().zip(weights);
    let (first, w0) = inputs.next().expect("at least one key");
    match op {
        "zdiff" => {
            let others: BTreeSet<Bytes> = inputs.flat_map(|(rows, _)| rows.into_iter().map(|(m, _)| m)).collect();
            result.extend(first.into_iter().filter(|(m, _)| !others.contains(m)));
        }
        "zinter" => {
            result.extend(first.into_iter().map(|(m, sc)| (m, weigh(sc, w0))));
            for (rows, w) in inputs {
                let rows: BTreeMap<Bytes, f64> = rows.into_iter().collect();
                result.retain(|m, _| rows.contains_key(m));
                for (m, acc) in result.iter_mut() {
                    *acc = fold(*acc, weigh(rows[m], w));
                }
            }
        }
        _ => {
            for (rows, w) in std::iter::once((first, w0)).chain(inputs) {
                for (m, sc) in rows {
                    let x = weigh(sc, w);
                    result.entry(m).and_modify(|acc| *acc = fold(*acc, x)).or_insert(x);
                }
            }
        }
    }
    Ok((result.into_iter().collect::<Vec<_>>().into(), with_scores))
}

/// ZINTERCARD numkeys key [key ...] [LIMIT limit]
fn zintercard(s: &RedisStore, a: &[Bytes]) -> Reply {
    let (keys, options) = match numkeys("zintercard", a) {
        Ok(split) => split,
        Err(e) => return e,
    };
    let limit = match options {
        [] => 0,
        [word, n] if is(word, "limit") => match parse_i64(n) {
            Some(n) if n >= 0 => n as usize,
            _ => return Reply::err("ERR LIMIT can't be negative"),
        },
        _ => return syntax_error(),
    };
    let mut sets = Vec::with_capacity(keys.len());
    for k in keys {
        match s.scored_members(k) {
            Ok(rows) => sets.push(rows.into_iter().map(|(m, _)| m).collect::<BTreeSet<Bytes>>()),
            Err(e) => return e,
        }
    }
    let mut sets = sets.into_iter();
    let first = sets.next().unwrap_or_default();
    let n = sets
        .fold(first, |acc, set| acc.intersection(&set).cloned().collect())
        .len();
    Reply::Int(if limit > 0 { n.min(limit) } else { n } as i64)
}

/// Pops up to `count` members from the low (or, if `max`, high) end of `key`'s sorted set.
fn pop_members(s: &mut RedisStore, key: &Bytes, max: bool, count: usize) -> Result<Vec<(Bytes, f64)>, Reply> {
    s.with_zset(key, false, |z| {
        let mut out = Vec::with_capacity(count.min(z.len()));
        while out.len() < count {
            let next = if max { z.iter().next_back() } else { z.iter().next() };
            let Some((m, sc)) = next.map(|(m, sc)| (m.clone(), sc)) else {
                break;
            };
            z.remove(&m);
            out.push((m, sc));
        }
        out
    })
    .map(Option::unwrap_or_default)
}

/// ZPOPMIN / ZPOPMAX key [count]
fn zpop(s: &mut RedisStore, max: bool, a: &[Bytes]) -> Reply {
    if a.len() > 2 {
        return syntax_error();
    }
    let count = match super::pop_count(a.get(1)) {
        Ok(count) => count,
        Err(e) => return e,
    };
    match pop_members(s, &a[0], max, count.unwrap_or(1)) {
        Err(e) => e,
        // Without a count: one flat member-score pair, in RESP3 too.
        Ok(popped) if count.is_none() => Reply::Array(
            popped
                .into_iter()
                .flat_map(|(m, sc)| [Reply::Bulk(m), double(sc)])
                .collect(),
        ),
        Ok(popped) => Reply::Pairs(popped.into_iter().map(|(m, sc)| (Reply::Bulk(m), double(sc))).collect()),
    }
}

/// ZMPOP numkeys key [key ...] MIN|MAX [COUNT count]: pops from the first non-empty sorted set.
fn zmpop(s: &mut RedisStore, a: &[Bytes]) -> Reply {
    let (keys, max, count) = match super::mpop_args(a, ["min", "max"]) {
        Ok(args) => args,
        Err(e) => return e,
    };
    for key in keys {
        match s.get_zset(key) {
            Err(e) => return e,
            Ok(None) => continue,
            Ok(Some(_)) => {}
        }
        return match pop_members(s, key, max, count) {
            Err(e) => e,
            Ok(popped) => Reply::Array(vec![
                bulk(key),
                Reply::Array(
                    popped
                        .into_iter()
                        .map(|(m, sc)| Reply::Array(vec![Reply::Bulk(m), double(sc)]))
                        .collect(),
                ),
            ]),
        };
    }
    Reply::NilArray
}

/// ZRANDMEMBER key [count [WITHSCORES]], drawn from the batch's agreed seed.
fn zrandmember(s: &RedisStore, a: &[Bytes]) -> Reply {
    let z = match s.get_zset(&a[0]) {
        Ok(z) => z,
        Err(e) => return e,
    };
    let mut rng = s.random(&a[0]);
    let Some(count_arg) = a.get(1) else {
        return match z {
            None => Reply::Nil,
            Some(z) => z.iter().nth(rng.below(z.len())).map_or(Reply::Nil, |(m, _)| bulk(m)),
        };
    };
    let count = match int_arg(count_arg) {
        Ok(n) => n,
        Err(e) => return e,
    };
    let with_scores = match a.get(2) {
        None => false,
        Some(w) if a.len() == 3 && is(w, "withscores") => true,
        Some(_) => return syntax_error(),
    };
    if count == i64::MIN || (with_scores && count < -(i64::MAX / 2)) {
        return Reply::err("ERR value is out of range");
    }
    let Some(z) = z else { return Reply::Array(Vec::new()) };
    let members: Vec<(&Bytes, f64)> = z.iter().collect();
    let picked = rng.pick(members.len(), count);
    if with_scores {
        Reply::Pairs(
            picked
                .iter()
                .map(|&i| (bulk(members[i].0), double(members[i].1)))
                .collect(),
        )
    } else {
        Reply::Array(picked.iter().map(|&i| bulk(members[i].0)).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scores_print_as_redis_does() {
        let cases = [
            (1.1, "1.1"),
            (3.0, "3"),
            (-0.0, "0"),
            (0.0001, "0.0001"),
            (1e-5, "1e-05"),
            (1e20, "1e+20"),
            (1e16, "10000000000000000"),
            (123456789012345678.0, "1.2345678901234568e+17"),
            (f64::MAX, "1.7976931348623157e+308"),
            (-2.5, "-2.5"),
            (f64::INFINITY, "inf"),
            (f64::NEG_INFINITY, "-inf"),
            (2.5e-300, "2.5e-300"),
        ];
        for (x, text) in cases {
            assert_eq!(format_score(x), text, "{x}");
        }
    }

    #[test]
    fn next_up_is_the_next_float() {
        assert_eq!(next_up(1.0), 1.0 + f64::EPSILON);
        assert_eq!(next_up(-1.0), -1.0 + f64::EPSILON / 2.0);
        assert_eq!(next_up(0.0), 5e-324);
        assert_eq!(next_up(-5e-324), 0.0);
        assert_eq!(next_up(f64::MAX), f64::INFINITY);
        assert_eq!(next_up(f64::INFINITY), f64::INFINITY);
    }
}

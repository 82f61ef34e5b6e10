//! The set commands (SADD, SREM, SMEMBERS, SISMEMBER, SMISMEMBER, SCARD, SPOP, SRANDMEMBER,
//! SINTER, SUNION, SDIFF and their STORE forms, SINTERCARD, SMOVE, SSCAN), with Redis' replies
//! and errors. Members are kept in byte order, so every replica lists them alike; SPOP and
//! SRANDMEMBER draw from the batch's agreed seed. A set left without members is deleted.

use std::collections::BTreeSet;

use bytes::Bytes;

use super::{bulk, RedisStore};
use crate::command::{int_arg, syntax_error};
use crate::reply::Reply;

type Set = BTreeSet<Bytes>;

impl RedisStore {
    fn get_set(&self, key: &[u8]) -> Result<Option<&Set>, Reply> {
        self.get_collection(key)
    }

    fn with_set<R>(&mut self, key: &Bytes, create: bool, f: impl FnOnce(&mut Set) -> R) -> Result<Option<R>, Reply> {
        self.with_collection(key, create, f)
    }

    /// The sets under `keys` (a missing key is the empty set), or WRONGTYPE if one is not a set.
    fn sets_of(&self, keys: &[Bytes]) -> Result<Vec<Set>, Reply> {
        keys.iter()
            .map(|k| Ok(self.get_set(k)?.cloned().unwrap_or_default()))
            .collect()
    }
}

/// Runs a set command that writes; `None` if `name` is not one.
pub(super) fn dispatch(s: &mut RedisStore, name: &str, a: &[Bytes]) -> Option<Reply> {
    let reply = match name {
        "sadd" => s
            .with_set(&a[0], true, |set| {
                a[1..].iter().filter(|m| set.insert((*m).clone())).count()
            })
            .map_or_else(|e| e, |n| Reply::Int(n.unwrap_or(0) as i64)),
        "srem" => s
            .with_set(&a[0], false, |set| a[1..].iter().filter(|m| set.remove(*m)).count())
            .map_or_else(|e| e, |n| Reply::Int(n.unwrap_or(0) as i64)),
        "spop" => spop(s, a),
        "srandmember" => srandmember(s, a),
        "smove" => {
            if let Err(e) = s.get_set(&a[0]).and(s.get_set(&a[1])) {
                return Some(e);
            }
            let moved = s.with_set(&a[0], false, |set| set.remove(&a[2]));
            match moved {
                Ok(Some(true)) => {
                    // A member the destination has already leaves it untouched (WATCH sees no
                    // change), as in Redis.
                    if !s.get_set(&a[1]).ok().flatten().is_some_and(|d| d.contains(&a[2])) {
                        let _ = s.with_set(&a[1], true, |set| set.insert(a[2].clone()));
                    }
                    Reply::Int(1)
                }
                Ok(_) => Reply::Int(0),
                Err(e) => e,
            }
        }
        "sinterstore" | "sunionstore" | "sdiffstore" => {
            let result = match s.sets_of(&a[1..]) {
                Ok(sets) => combine(&name[..name.len() - 5], sets),
                Err(e) => return Some(e),
            };
            let len = result.len();
            s.remove(&a[0]);
            if !result.is_empty() {
                let _ = s.with_set(&a[0], true, |set| *set = result);
            }
            Reply::Int(len as i64)
        }
        _ => return None,
    };
    Some(reply)
}

/// SINTER, SUNION or SDIFF of `sets` (the first minus the others for SDIFF).
fn combine(op: &str, sets: Vec<Set>) -> Set {
    let mut sets = sets.into_iter();
    let first = sets.next().unwrap_or_default();
    sets.fold(first, |acc, set| match op {
        "sinter" => acc.intersection(&set).cloned().collect(),
        "sunion" => acc.union(&set).cloned().collect(),
        _ => acc.difference(&set).cloned().collect(),
    })
}

fn spop(s: &mut RedisStore, a: &[Bytes]) -> Reply {
    if a.len() > 2 {
        return syntax_error();
    }
    let count = match super::pop_count(a.get(1)) {
        Ok(count) => count,
        Err(e) => return e,
    };
    let mut rng = s.random(&a[0]);
    let popped = s.with_set(&a[0], false, |set| {
        let n = count.unwrap_or(1).min(set.len());
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            let index = rng.below(set.len());
            let member = set.iter().nth(index).cloned().expect("index below len");
            set.remove(&member);
            out.push(member);
        }
        out
    });
    match (popped, count) {
        (Err(e), _) => e,
        (Ok(None), None) => Reply::Nil,
        (Ok(None), Some(_)) => Reply::Set(Vec::new()),
        (Ok(Some(out)), None) => out.first().map_or(Reply::Nil, bulk),
        (Ok(Some(out)), Some(_)) => Reply::Set(out.iter().map(bulk).collect()),
    }
}

fn srandmember(s: &mut RedisStore, a: &[Bytes]) -> Reply {
    if a.len() > 2 {
        return syntax_error();
    }
    let set = match s.get_set(&a[0]) {
        Ok(set) => set,
        Err(e) => return e,
    };
    let mut rng = s.random(&a[0]);
    let reply = match (a.get(1), set) {
        (None, None) => Reply::Nil,
        (None, Some(set)) => set.iter().nth(rng.below(set.len())).map_or(Reply::Nil, bulk),
        (Some(c), set) => {
            let count = match int_arg(c) {
                Ok(n) => n,
                Err(e) => return e,
            };
            if count == i64::MIN {
                return Reply::err("ERR value is out of range");
            }
            let Some(set) = set else {
                return Reply::Array(Vec::new());
            };
            let members: Vec<&Bytes> = set.iter().collect();
            Reply::Array(
                rng.pick(members.len(), count)
                    .into_iter()
                    .map(|i| bulk(members[i]))
                    .collect(),
            )
        }
    };
    reply
}

/// Runs a set command that only reads; `None` if `name` is not one.
pub(super) fn dispatch_read(s: &RedisStore, name: &str, a: &[Bytes]) -> Option<Reply> {
    Some(match name {
        "smembers" | "sismember" | "smismember" | "scard" | "sscan" => {
            let set = match s.get_set(&a[0]) {
                Ok(set) => set,
                Err(e) => return Some(e),
            };
            let empty = Set::new();
            let set = set.unwrap_or(&empty);
            match name {
                "smembers" => Reply::Set(set.iter().map(bulk).collect()),
                "sismember" => Reply::Int(set.contains(&a[1]) as i64),
                "smismember" => Reply::Array(a[1..].iter().map(|m| Reply::Int(set.contains(m) as i64)).collect()),
                "scard" => Reply::Int(set.len() as i64),
                _ => sscan(set, &a[1..]),
            }
        }
        "sinter" | "sunion" | "sdiff" => match s.sets_of(a) {
            Ok(sets) => Reply::Set(combine(name, sets).iter().map(bulk).collect()),
            Err(e) => e,
        },
        "sintercard" => sintercard(s, a),
        _ => return None,
    })
}

/// SINTERCARD numkeys key [key ...] [LIMIT limit].
fn sintercard(s: &RedisStore, a: &[Bytes]) -> Reply {
    let numkeys = match int_arg(&a[0]) {
        Ok(n) if n > 0 => n as usize,
        _ => return Reply::err("ERR numkeys should be greater than 0"),
    };
    if a.len() < 1 + numkeys {
        return Reply::err("ERR Number of keys can't be greater than number of args");
    }
    let mut limit = 0usize;
    let rest = &a[1 + numkeys..];
    match rest {
        [] => {}
        [word, n] if word.eq_ignore_ascii_case(b"limit") => match int_arg(n) {
            Ok(n) if n >= 0 => limit = n as usize,
            _ => return Reply::err("ERR LIMIT can't be negative"),
        },
        _ => return syntax_error(),
    }
    match s.sets_of(&a[1..1 + numkeys]) {
        Ok(sets) => {
            let n = combine("sinter", sets).len();
            Reply::Int(if limit > 0 { n.min(limit) } else { n } as i64)
        }
        Err(e) => e,
    }
}

/// SSCAN key cursor [MATCH pattern] [COUNT count].
fn sscan(set: &Set, a: &[Bytes]) -> Reply {
    super::scan_collection(set.iter().map(|m| (m, None)), a, false)
}

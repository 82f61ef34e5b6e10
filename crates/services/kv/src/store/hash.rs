//! The hash commands (HSET, HGET, HMGET, HGETALL, HDEL, HEXISTS, HINCRBY, HINCRBYFLOAT, HKEYS,
//! HVALS, HLEN, HSETNX, HSTRLEN, HRANDFIELD, HSCAN, HMSET), with Redis' replies and errors.
//! A hash's fields are kept in byte order, so every replica lists them alike; a hash left without
//! fields is deleted, as in Redis.

use std::collections::BTreeMap;

use bytes::Bytes;

use super::{bulk, RedisStore};
use crate::command::{int_arg, parse_i64, syntax_error, wrong_arity};
use crate::reply::Reply;

type Hash = BTreeMap<Bytes, Bytes>;

impl RedisStore {
    fn get_hash(&self, key: &[u8]) -> Result<Option<&Hash>, Reply> {
        self.get_collection(key)
    }

    fn with_hash<R>(&mut self, key: &Bytes, create: bool, f: impl FnOnce(&mut Hash) -> R) -> Result<Option<R>, Reply> {
        self.with_collection(key, create, f)
    }
}

/// Runs a hash command that writes; `None` if `name` is not one.
pub(super) fn dispatch(s: &mut RedisStore, name: &str, a: &[Bytes]) -> Option<Reply> {
    let reply = match name {
        "hset" | "hmset" => {
            if a.len() < 3 || a.len().is_multiple_of(2) {
                return Some(wrong_arity(name));
            }
            let added = s.with_hash(&a[0], true, |h| {
                a[1..]
                    .chunks(2)
                    .filter(|fv| h.insert(fv[0].clone(), fv[1].clone()).is_none())
                    .count()
            });
            match added {
                Err(e) => e,
                Ok(n) if name == "hset" => Reply::Int(n.unwrap_or(0) as i64),
                Ok(_) => Reply::ok(),
            }
        }
        "hsetnx" => s
            .with_hash(&a[0], true, |h| match h.contains_key(&a[1]) {
                true => 0,
                false => {
                    h.insert(a[1].clone(), a[2].clone());
                    1
                }
            })
            .map_or_else(|e| e, |n| Reply::Int(n.unwrap_or(0))),
        "hdel" => s
            .with_hash(&a[0], false, |h| {
                a[1..].iter().filter(|f| h.remove(*f).is_some()).count()
            })
            .map_or_else(|e| e, |n| Reply::Int(n.unwrap_or(0) as i64)),
        "hincrby" => {
            let by = match int_arg(&a[2]) {
                Ok(by) => by,
                Err(e) => return Some(e),
            };
            let outcome = s.with_hash(&a[0], true, |h| {
                let current = match h.get(&a[1]) {
                    None => 0,
                    Some(v) => match parse_i64(v) {
                        Some(n) => n,
                        None => return Err(Reply::err("ERR hash value is not an integer")),
                    },
                };
                let next = current
                    .checked_add(by)
                    .ok_or_else(|| Reply::err("ERR increment or decrement would overflow"))?;
                h.insert(a[1].clone(), Bytes::from(next.to_string()));
                Ok(next)
            });
            match outcome {
                Err(e) | Ok(Some(Err(e))) => e,
                Ok(Some(Ok(n))) => Reply::Int(n),
                Ok(None) => unreachable!("created"),
            }
        }
        "hincrbyfloat" => {
            let by = match super::parse_float(&a[2]) {
                Some(by) if by.is_finite() => by,
                Some(_) => return Some(Reply::err("ERR value is NaN or Infinity")),
                None => return Some(Reply::err("ERR value is not a valid float")),
            };
            let outcome = s.with_hash(&a[0], true, |h| {
                let current = match h.get(&a[1]) {
                    None => 0.0,
                    Some(v) => super::parse_float(v)
                        .filter(|f| f.is_finite())
                        .ok_or_else(|| Reply::err("ERR hash value is not a float"))?,
                };
                let next = current + by;
                if !next.is_finite() {
                    return Err(Reply::err("ERR increment would produce NaN or Infinity"));
                }
                let text = Bytes::from(super::format_float(next));
                h.insert(a[1].clone(), text.clone());
                Ok(text)
            });
            match outcome {
                Err(e) | Ok(Some(Err(e))) => e,
                Ok(Some(Ok(text))) => Reply::Bulk(text),
                Ok(None) => unreachable!("created"),
            }
        }
        _ => return None,
    };
    Some(reply)
}

/// Runs a hash command that only reads; `None` if `name` is not one.
pub(super) fn dispatch_read(s: &RedisStore, name: &str, a: &[Bytes]) -> Option<Reply> {
    let hash = match name {
        "hget" | "hmget" | "hgetall" | "hexists" | "hlen" | "hstrlen" | "hkeys" | "hvals" | "hrandfield" | "hscan" => {
            match s.get_hash(&a[0]) {
                Ok(h) => h,
                Err(e) => return Some(e),
            }
        }
        _ => return None,
    };
    let empty = Hash::new();
    let h = hash.unwrap_or(&empty);
    Some(match name {
        "hget" => h.get(&a[1]).map_or(Reply::Nil, bulk),
        "hmget" => Reply::Array(a[1..].iter().map(|f| h.get(f).map_or(Reply::Nil, bulk)).collect()),
        "hgetall" => Reply::Map(h.iter().map(|(f, v)| (bulk(f), bulk(v))).collect()),
        "hexists" => Reply::Int(h.contains_key(&a[1]) as i64),
        "hlen" => Reply::Int(h.len() as i64),
        "hstrlen" => Reply::Int(h.get(&a[1]).map_or(0, |v| v.len() as i64)),
        "hkeys" => Reply::Array(h.keys().map(bulk).collect()),
        "hvals" => Reply::Array(h.values().map(bulk).collect()),
        "hrandfield" => randfield(s, &a[0], hash, &a[1..]),
        "hscan" => hscan(h, &a[1..]),
        _ => unreachable!("listed above"),
    })
}

fn randfield(s: &RedisStore, key: &[u8], hash: Option<&Hash>, opts: &[Bytes]) -> Reply {
    let Some(count_arg) = opts.first() else {
        let Some(h) = hash else { return Reply::Nil };
        let index = s.random(key).below(h.len());
        return h.keys().nth(index).map_or(Reply::Nil, bulk);
    };
    let count = match int_arg(count_arg) {
        Ok(n) => n,
        Err(e) => return e,
    };
    let with_values = match opts.get(1) {
        None => false,
        Some(w) if opts.len() == 2 && w.eq_ignore_ascii_case(b"withvalues") => true,
        Some(_) => return syntax_error(),
    };
    // Redis' bounds: the reply's length (doubled with values) must fit.
    if count == i64::MIN || (with_values && count < -(i64::MAX / 2)) {
        return Reply::err("ERR value is out of range");
    }
    let Some(h) = hash else { return Reply::Array(Vec::new()) };
    let fields: Vec<(&Bytes, &Bytes)> = h.iter().collect();
    let picked = s.random(key).pick(fields.len(), count);
    if with_values {
        Reply::Pairs(picked.iter().map(|&i| (bulk(fields[i].0), bulk(fields[i].1))).collect())
    } else {
        Reply::Array(picked.iter().map(|&i| bulk(fields[i].0)).collect())
    }
}

/// HSCAN key cursor [MATCH pattern] [COUNT count] [NOVALUES].
fn hscan(h: &Hash, a: &[Bytes]) -> Reply {
    super::scan_collection(h.iter().map(|(f, v)| (f, Some(v))), a, true)
}

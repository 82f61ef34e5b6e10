//! The string, expiry and keyspace commands, with Redis' replies and errors (hashes are in
//! `hash.rs`).

use bytes::Bytes;

use super::{bits, hash, keys, list, set, zset, RedisStore};
use crate::command::{int_arg, is, not_integer, parse_i64, syntax_error, wrong_arity};
use crate::glob;
use crate::reply::Reply;

/// Most keys one SCAN call examines (COUNT is capped to it).
const SCAN_COUNT_MAX: usize = 10_000;

/// Runs command `name` (already checked for arity).
pub(super) fn dispatch(s: &mut RedisStore, name: &str, argv: &[Bytes]) -> Reply {
    if let Some(reply) = dispatch_read(s, name, argv) {
        return reply;
    }
    let a = &argv[1..];
    let typed = hash::dispatch(s, name, a)
        .or_else(|| bits::dispatch(s, name, a))
        .or_else(|| list::dispatch(s, name, a))
        .or_else(|| set::dispatch(s, name, a))
        .or_else(|| zset::dispatch(s, name, a))
        .or_else(|| keys::dispatch(s, name, a));
    if let Some(reply) = typed {
        return reply;
    }
    match name {
        "set" => set(s, a),
        "setnx" => {
            if s.get(&a[0]).is_some() {
                return Reply::Int(0);
            }
            s.put(&a[0], a[1].clone(), None);
            Reply::Int(1)
        }
        "setex" | "psetex" => setex(s, name, a),
        "getset" => {
            let old = match s.get_string(&a[0]) {
                Ok(old) => old.cloned(),
                Err(e) => return e,
            };
            s.put(&a[0], a[1].clone(), None);
            bulk_or_nil(old)
        }
        "getdel" => match s.get_string(&a[0]) {
            Err(e) => e,
            Ok(None) => Reply::Nil,
            Ok(Some(_)) => match s.remove(&a[0]).map(|e| e.value) {
                Some(super::Value::Str(b)) => Reply::Bulk(b),
                _ => Reply::Nil,
            },
        },
        "del" | "unlink" => Reply::Int(a.iter().filter(|k| s.remove(k).is_some()).count() as i64),
        "incr" => incr_by(s, &a[0], 1),
        "decr" => incr_by(s, &a[0], -1),
        "incrby" => int_arg(&a[1]).map_or_else(|e| e, |by| incr_by(s, &a[0], by)),
        "decrby" => match int_arg(&a[1]) {
            Err(e) => e,
            Ok(i64::MIN) => Reply::err("ERR decrement would overflow"),
            Ok(by) => incr_by(s, &a[0], -by),
        },
        "append" => {
            let mut value = match s.get_string(&a[0]) {
                Ok(v) => v.map(|v| v.to_vec()).unwrap_or_default(),
                Err(e) => return e,
            };
            value.extend_from_slice(&a[1]);
            let len = value.len() as i64;
            s.put_keep_ttl(&a[0], Bytes::from(value));
            Reply::Int(len)
        }
        "mset" | "msetnx" => mset(s, name, a),
        "expire" | "pexpire" | "expireat" | "pexpireat" => expire(s, name, a),
        "persist" => match s.get(&a[0]).and_then(|e| e.expires_ms) {
            Some(_) => {
                s.set_expiry(&a[0], None);
                Reply::Int(1)
            }
            None => Reply::Int(0),
        },
        "sort" => s.sort_store(a),
        "publish" => s.publish(&a[0], &a[1]),
        "flushdb" | "flushall" => {
            if a.len() > 1 || a.first().is_some_and(|m| !is(m, "async") && !is(m, "sync")) {
                return syntax_error();
            }
            s.clear();
            Reply::ok()
        }
        other => unreachable!("command {other} is in the table but not implemented"),
    }
}

/// Runs command `name` if it only reads (the commands flagged `readonly` in the table); `None` for
/// every other command. The ordered path and the read-only path both answer reads here, so the
/// two give byte-identical replies.
pub(super) fn dispatch_read(s: &RedisStore, name: &str, argv: &[Bytes]) -> Option<Reply> {
    let a = &argv[1..];
    let typed = hash::dispatch_read(s, name, a)
        .or_else(|| bits::dispatch_read(s, name, a))
        .or_else(|| list::dispatch_read(s, name, a))
        .or_else(|| set::dispatch_read(s, name, a))
        .or_else(|| zset::dispatch_read(s, name, a))
        .or_else(|| keys::dispatch_read(s, name, a));
    if let Some(reply) = typed {
        return Some(reply);
    }
    Some(match name {
        "get" => s.get_string(&a[0]).map_or_else(|e| e, |v| bulk_or_nil(v.cloned())),
        "exists" => Reply::Int(a.iter().filter(|k| s.get(k).is_some()).count() as i64),
        "type" => Reply::Status(s.get(&a[0]).map_or("none", |e| e.value.type_name()).into()),
        "strlen" => s
            .get_string(&a[0])
            .map_or_else(|e| e, |v| Reply::Int(v.map_or(0, |v| v.len() as i64))),
        // MGET answers nil for a key of another type (no error).
        "mget" => Reply::Array(
            a.iter()
                .map(|k| bulk_or_nil(s.get(k).and_then(|e| e.string().ok()).cloned()))
                .collect(),
        ),
        "ttl" | "pttl" => ttl(s, name == "pttl", &a[0]),
        "keys" => Reply::Array(
            s.map
                .keys()
                .filter(|k| glob::matches(&a[0], k))
                .map(|k| Reply::Bulk(k.clone()))
                .collect(),
        ),
        "scan" => scan(s, a),
        "dbsize" => Reply::Int(s.map.len() as i64),
        "sort_ro" => return s.sort_read(a, true),
        "pubsub" => s.pubsub(a),
        "memory" => memory(s, a),
        _ => return None,
    })
}

/// MEMORY USAGE key [SAMPLES n]: the bytes the store counts for the key against its memory bound
/// (nil if there is no such key). Other MEMORY subcommands describe an allocator the store does
/// not expose.
fn memory(s: &RedisStore, a: &[Bytes]) -> Reply {
    if !is(&a[0], "usage") {
        return Reply::err(format!(
            "ERR MEMORY {} is not supported by the upright store",
            String::from_utf8_lossy(&a[0]).to_uppercase()
        ));
    }
    match &a[1..] {
        [key] | [key, _, _] if a.len() == 2 || is(&a[2], "samples") => s
            .get(key)
            .map_or(Reply::Nil, |e| Reply::Int(RedisStore::cost(key, e.cost) as i64)),
        _ => syntax_error(),
    }
}

fn bulk_or_nil(value: Option<Bytes>) -> Reply {
    value.map_or(Reply::Nil, Reply::Bulk)
}

fn invalid_expire(name: &str) -> Reply {
    Reply::err(format!("ERR invalid expire time in '{name}' command"))
}

/// Absolute expiry in ms from a relative or absolute amount, or Redis' invalid-expire error.
pub(super) fn expiry_at(now_ms: u64, amount: i64, unit_ms: i64, absolute: bool, name: &str) -> Result<u64, Reply> {
    if amount <= 0 {
        return Err(invalid_expire(name));
    }
    let ms = amount.checked_mul(unit_ms).ok_or_else(|| invalid_expire(name))?;
    let at = if absolute {
        Some(ms)
    } else {
        ms.checked_add(now_ms as i64)
    };
    at.map(|at| at as u64).ok_or_else(|| invalid_expire(name))
}

fn set(s: &mut RedisStore, a: &[Bytes]) -> Reply {
    let (mut nx, mut xx, mut get, mut keep) = (false, false, false, false);
    let mut expiry: Option<(i64, i64, bool)> = None; // (amount, unit, absolute)
    let mut i = 2;
    while i < a.len() {
        let opt = &a[i];
        let unit = match () {
            _ if is(opt, "ex") => Some((1000, false)),
            _ if is(opt, "px") => Some((1, false)),
            _ if is(opt, "exat") => Some((1000, true)),
            _ if is(opt, "pxat") => Some((1, true)),
            _ => None,
        };
        if let Some((unit, absolute)) = unit {
            if expiry.is_some() || keep || i + 1 >= a.len() {
                return syntax_error();
            }
            let amount = match int_arg(&a[i + 1]) {
                Ok(n) => n,
                Err(e) => return e,
            };
            expiry = Some((amount, unit, absolute));
            i += 2;
            continue;
        }
        if is(opt, "nx") && !xx {
            nx = true;
        } else if is(opt, "xx") && !nx {
            xx = true;
        } else if is(opt, "get") {
            get = true;
        } else if is(opt, "keepttl") && expiry.is_none() {
            keep = true;
        } else {
            return syntax_error();
        }
        i += 1;
    }
    let expires_ms = match expiry {
        Some((amount, unit, absolute)) => match expiry_at(s.now_ms, amount, unit, absolute, "set") {
            Ok(at) => Some(at),
            Err(e) => return e,
        },
        None => None,
    };
    let old = s.get(&a[0]).cloned();
    if get {
        if let Some(Err(e)) = old.as_ref().map(|e| e.string()) {
            return e;
        }
    }
    let allowed = !(nx && old.is_some() || xx && old.is_none());
    if allowed {
        let ttl = if keep {
            old.as_ref().and_then(|e| e.expires_ms)
        } else {
            expires_ms
        };
        s.put(&a[0], a[1].clone(), ttl);
    }
    match (get, allowed) {
        (true, _) => bulk_or_nil(old.and_then(|e| e.string().ok().cloned())),
        (false, true) => Reply::ok(),
        (false, false) => Reply::Nil,
    }
}

fn setex(s: &mut RedisStore, name: &str, a: &[Bytes]) -> Reply {
    let unit = if name == "setex" { 1000 } else { 1 };
    let amount = match int_arg(&a[1]) {
        Ok(n) => n,
        Err(e) => return e,
    };
    match expiry_at(s.now_ms, amount, unit, false, name) {
        Ok(at) => {
            s.put(&a[0], a[2].clone(), Some(at));
            Reply::ok()
        }
        Err(e) => e,
    }
}

fn incr_by(s: &mut RedisStore, key: &Bytes, by: i64) -> Reply {
    let current = match s.get_string(key) {
        Err(e) => return e,
        Ok(Some(value)) => match parse_i64(value) {
            Some(n) => n,
            None => return not_integer(),
        },
        Ok(None) => 0,
    };
    let Some(next) = current.checked_add(by) else {
        return Reply::err("ERR increment or decrement would overflow");
    };
    s.put_keep_ttl(key, Bytes::from(next.to_string()));
    Reply::Int(next)
}

fn mset(s: &mut RedisStore, name: &str, a: &[Bytes]) -> Reply {
    if !a.len().is_multiple_of(2) {
        return wrong_arity(name);
    }
    if name == "msetnx" && a.chunks(2).any(|kv| s.get(&kv[0]).is_some()) {
        return Reply::Int(0);
    }
    for kv in a.chunks(2) {
        s.put(&kv[0], kv[1].clone(), None);
    }
    if name == "msetnx" {
        Reply::Int(1)
    } else {
        Reply::ok()
    }
}

fn expire(s: &mut RedisStore, name: &str, a: &[Bytes]) -> Reply {
    let amount = match int_arg(&a[1]) {
        Ok(n) => n,
        Err(e) => return e,
    };
    let (mut nx, mut xx, mut gt, mut lt) = (false, false, false, false);
    for opt in &a[2..] {
        match () {
            _ if is(opt, "nx") => nx = true,
            _ if is(opt, "xx") => xx = true,
            _ if is(opt, "gt") => gt = true,
            _ if is(opt, "lt") => lt = true,
            _ => return Reply::err(format!("ERR Unsupported option {}", String::from_utf8_lossy(opt))),
        }
    }
    if nx && (xx || gt || lt) {
        return Reply::err("ERR NX and XX, GT or LT options at the same time are not compatible");
    }
    if gt && lt {
        return Reply::err("ERR GT and LT options at the same time are not compatible");
    }
    let unit: i64 = if name.starts_with('p') { 1 } else { 1000 };
    let absolute = name.ends_with("at");
    let at = amount
        .checked_mul(unit)
        .and_then(|ms| {
            if absolute {
                Some(ms)
            } else {
                ms.checked_add(s.now_ms as i64)
            }
        })
        .ok_or_else(|| invalid_expire(name));
    let at = match at {
        Ok(at) => at,
        Err(e) => return e,
    };
    let Some(entry) = s.get(&a[0]) else {
        return Reply::Int(0);
    };
    let current = entry.expires_ms;
    let refuse = (nx && current.is_some())
        || (xx && current.is_none())
        || (gt && current.is_none_or(|c| at <= c as i64))
        || (lt && current.is_some_and(|c| at >= c as i64));
    if refuse {
        return Reply::Int(0);
    }
    if at <= s.now_ms as i64 {
        s.remove(&a[0]);
    } else {
        s.set_expiry(&a[0], Some(at as u64));
    }
    Reply::Int(1)
}

fn ttl(s: &RedisStore, millis: bool, key: &[u8]) -> Reply {
    match s.get(key) {
        None => Reply::Int(-2),
        Some(e) => match e.expires_ms {
            None => Reply::Int(-1),
            Some(at) => {
                let left = at.saturating_sub(s.now_ms) as i64;
                Reply::Int(if millis { left } else { (left + 500) / 1000 })
            }
        },
    }
}

fn scan(s: &RedisStore, a: &[Bytes]) -> Reply {
    let Some(cursor) = std::str::from_utf8(&a[0]).ok().and_then(|c| c.parse::<u64>().ok()) else {
        return Reply::err("ERR invalid cursor");
    };
    let (mut pattern, mut count, mut type_name) = (None, 10usize, None::<Bytes>);
    let mut i = 1;
    while i < a.len() {
        if i + 1 >= a.len() {
            return syntax_error();
        }
        let value = &a[i + 1];
        if is(&a[i], "match") {
            pattern = Some(value.clone());
        } else if is(&a[i], "count") {
            match int_arg(value) {
                Ok(n) if n >= 1 => count = (n as usize).min(SCAN_COUNT_MAX),
                Ok(_) => return syntax_error(),
                Err(e) => return e,
            }
        } else if is(&a[i], "type") {
            type_name = Some(value.clone());
        } else {
            return syntax_error();
        }
        i += 2;
    }
    let mut keys = Vec::new();
    let mut walk = s.slots.range((cursor, Bytes::new())..);
    for (_, key) in walk.by_ref().take(count) {
        let of_type = || {
            type_name
                .as_ref()
                .is_none_or(|t| s.get(key).is_some_and(|e| is(t, e.value.type_name())))
        };
        if pattern.as_ref().is_none_or(|p| glob::matches(p, key)) && of_type() {
            keys.push(Reply::Bulk(key.clone()));
        }
    }
    let next = walk.next().map_or(0, |(slot, _)| *slot);
    Reply::Array(vec![Reply::text(next.to_string()), Reply::Array(keys)])
}

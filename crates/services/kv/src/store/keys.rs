//! More string and key commands: GETEX, GETRANGE, SETRANGE, INCRBYFLOAT, EXPIRETIME,
//! PEXPIRETIME, RENAME, RENAMENX, COPY, TOUCH, RANDOMKEY, OBJECT, with Redis' replies and errors.

use bytes::Bytes;

use super::{Entry, RedisStore, Value};
use crate::command::{int_arg, is, syntax_error};
use crate::reply::Reply;

/// Redis' `proto-max-bulk-len`: the largest string SETRANGE may make.
const STRING_BYTES_MAX: i64 = 512 << 20;

/// Runs a command of this module that writes; `None` if `name` is not one.
pub(super) fn dispatch(s: &mut RedisStore, name: &str, a: &[Bytes]) -> Option<Reply> {
    Some(match name {
        "getex" => getex(s, a),
        "setrange" => setrange(s, a),
        "incrbyfloat" => incrbyfloat(s, a),
        "rename" | "renamenx" => rename(s, name == "renamenx", a),
        "copy" => copy(s, a),
        "randomkey" => match s.map.len() {
            0 => Reply::Nil,
            n => {
                let index = s.random(b"randomkey").below(n);
                s.map.keys().nth(index).map_or(Reply::Nil, |k| Reply::Bulk(k.clone()))
            }
        },
        _ => return None,
    })
}

/// Runs a command of this module that only reads; `None` if `name` is not one.
pub(super) fn dispatch_read(s: &RedisStore, name: &str, a: &[Bytes]) -> Option<Reply> {
    Some(match name {
        "getrange" | "substr" => getrange(s, a),
        "expiretime" | "pexpiretime" => match s.get(&a[0]) {
            None => Reply::Int(-2),
            Some(Entry { expires_ms: None, .. }) => Reply::Int(-1),
            Some(Entry {
                expires_ms: Some(at), ..
            }) => Reply::Int(if name == "pexpiretime" {
                *at as i64
            } else {
                (*at / 1000) as i64
            }),
        },
        "touch" => Reply::Int(a.iter().filter(|k| s.get(k).is_some()).count() as i64),
        "object" => object(s, a),
        _ => return None,
    })
}

fn getex(s: &mut RedisStore, a: &[Bytes]) -> Reply {
    let value = match s.get_string(&a[0]) {
        Ok(v) => v.cloned(),
        Err(e) => return e,
    };
    // None: leave the expiry; Some(None): PERSIST; Some(Some(at)): expire at `at`.
    let mut change: Option<Option<u64>> = None;
    let mut i = 1;
    while i < a.len() {
        let unit = match () {
            _ if is(&a[i], "ex") => Some((1000, false)),
            _ if is(&a[i], "px") => Some((1, false)),
            _ if is(&a[i], "exat") => Some((1000, true)),
            _ if is(&a[i], "pxat") => Some((1, true)),
            _ => None,
        };
        if let Some((unit, absolute)) = unit {
            if change.is_some() || i + 1 >= a.len() {
                return syntax_error();
            }
            let amount = match int_arg(&a[i + 1]) {
                Ok(n) => n,
                Err(e) => return e,
            };
            match super::commands::expiry_at(s.now_ms, amount, unit, absolute, "getex") {
                Ok(at) => change = Some(Some(at)),
                Err(e) => return e,
            }
            i += 2;
        } else if is(&a[i], "persist") && change.is_none() {
            change = Some(None);
            i += 1;
        } else {
            return syntax_error();
        }
    }
    if let (Some(_), Some(change)) = (&value, change) {
        match change {
            Some(at) if at <= s.now_ms => {
                s.remove(&a[0]);
            }
            expiry => s.set_expiry(&a[0], expiry),
        }
    }
    value.map_or(Reply::Nil, Reply::Bulk)
}

fn getrange(s: &RedisStore, a: &[Bytes]) -> Reply {
    let (start, end) = match (int_arg(&a[1]), int_arg(&a[2])) {
        (Ok(start), Ok(end)) => (start, end),
        (Err(e), _) | (_, Err(e)) => return e,
    };
    let value = match s.get_string(&a[0]) {
        Ok(v) => v.cloned().unwrap_or_default(),
        Err(e) => return e,
    };
    let len = value.len() as i64;
    if len == 0 || (start < 0 && end < 0 && start > end) {
        return Reply::Bulk(Bytes::new());
    }
    let resolve = |i: i64| if i < 0 { (len + i).max(0) } else { i };
    let (start, end) = (resolve(start), resolve(end).min(len - 1));
    if start > end || start >= len {
        return Reply::Bulk(Bytes::new());
    }
    Reply::Bulk(value.slice(start as usize..=end as usize))
}

fn setrange(s: &mut RedisStore, a: &[Bytes]) -> Reply {
    let offset = match int_arg(&a[1]) {
        Ok(n) if n >= 0 => n,
        Ok(_) => return Reply::err("ERR offset is out of range"),
        Err(e) => return e,
    };
    let current = match s.get_string(&a[0]) {
        Ok(v) => v.cloned(),
        Err(e) => return e,
    };
    let piece = &a[2];
    if piece.is_empty() {
        return Reply::Int(current.map_or(0, |v| v.len() as i64));
    }
    // Checked: an offset near i64::MAX must be refused, not wrap around (every replica would
    // then try to allocate it).
    if offset
        .checked_add(piece.len() as i64)
        .is_none_or(|end| end > STRING_BYTES_MAX)
    {
        return Reply::err("ERR string exceeds maximum allowed size (proto-max-bulk-len)");
    }
    let mut value = current.map(|v| v.to_vec()).unwrap_or_default();
    let end = offset as usize + piece.len();
    if value.len() < end {
        value.resize(end, 0);
    }
    value[offset as usize..end].copy_from_slice(piece);
    let len = value.len() as i64;
    s.put_keep_ttl(&a[0], Bytes::from(value));
    Reply::Int(len)
}

fn incrbyfloat(s: &mut RedisStore, a: &[Bytes]) -> Reply {
    let by = match super::parse_float(&a[1]) {
        Some(by) if by.is_finite() => by,
        Some(_) => return Reply::err("ERR increment would produce NaN or Infinity"),
        None => return Reply::err("ERR value is not a valid float"),
    };
    let current = match s.get_string(&a[0]) {
        Err(e) => return e,
        Ok(None) => 0.0,
        Ok(Some(v)) => match super::parse_float(v) {
            Some(f) if f.is_finite() => f,
            _ => return Reply::err("ERR value is not a valid float"),
        },
    };
    let next = current + by;
    if !next.is_finite() {
        return Reply::err("ERR increment would produce NaN or Infinity");
    }
    let text = Bytes::from(super::format_float(next));
    s.put_keep_ttl(&a[0], text.clone());
    Reply::Bulk(text)
}

fn rename(s: &mut RedisStore, nx: bool, a: &[Bytes]) -> Reply {
    let Some(entry) = s.get(&a[0]).cloned() else {
        return Reply::err("ERR no such key");
    };
    if a[0] == a[1] {
        return if nx { Reply::Int(0) } else { Reply::ok() };
    }
    if nx && s.get(&a[1]).is_some() {
        return Reply::Int(0);
    }
    s.remove(&a[0]);
    s.remove(&a[1]);
    s.put_value(&a[1], entry.value, entry.expires_ms);
    if nx {
        Reply::Int(1)
    } else {
        Reply::ok()
    }
}

fn copy(s: &mut RedisStore, a: &[Bytes]) -> Reply {
    let mut replace = false;
    let mut i = 2;
    while i < a.len() {
        if is(&a[i], "replace") {
            replace = true;
            i += 1;
        } else if is(&a[i], "db") && i + 1 < a.len() {
            match int_arg(&a[i + 1]) {
                Ok(0) => {}
                Ok(_) => return Reply::err("ERR DB index is out of range"),
                Err(e) => return e,
            }
            i += 2;
        } else {
            return syntax_error();
        }
    }
    if a[0] == a[1] {
        return Reply::err("ERR source and destination objects are the same");
    }
    let Some(entry) = s.get(&a[0]).cloned() else {
        return Reply::Int(0);
    };
    if s.get(&a[1]).is_some() {
        if !replace {
            return Reply::Int(0);
        }
        s.remove(&a[1]);
    }
    s.put_value(&a[1], entry.value, entry.expires_ms);
    Reply::Int(1)
}

/// OBJECT ENCODING / REFCOUNT / IDLETIME / FREQ / HELP for one key. The store has one
/// representation per type; ENCODING names the one Redis would use for a value of that size
/// class, so clients that print it see something familiar (never compare it: `--ignore-encoding`).
fn object(s: &RedisStore, a: &[Bytes]) -> Reply {
    let sub = &a[0];
    if is(sub, "help") {
        return Reply::Array(
            [
                "OBJECT <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
                "ENCODING <key>",
                "REFCOUNT <key>",
                "IDLETIME <key>",
            ]
            .iter()
            .map(|l| Reply::Status((*l).into()))
            .collect(),
        );
    }
    let Some(key) = a.get(1).filter(|_| a.len() == 2) else {
        return Reply::err(format!(
            "ERR unknown subcommand or wrong number of arguments for '{}'. Try OBJECT HELP.",
            String::from_utf8_lossy(sub)
        ));
    };
    let Some(entry) = s.get(key) else {
        return Reply::Nil;
    };
    if is(sub, "encoding") {
        let encoding = match &entry.value {
            Value::Str(v) if crate::command::parse_i64(v).is_some() => "int",
            Value::Str(v) if v.len() <= 44 => "embstr",
            Value::Str(_) => "raw",
            Value::Hash(_) => "hashtable",
            Value::List(_) => "quicklist",
            Value::Set(_) => "hashtable",
            Value::ZSet(_) => "skiplist",
        };
        Reply::Bulk(Bytes::from_static(encoding.as_bytes()))
    } else if is(sub, "refcount") {
        Reply::Int(1)
    } else if is(sub, "idletime") {
        Reply::Int(0)
    } else {
        Reply::err(format!(
            "ERR unknown subcommand or wrong number of arguments for '{}'. Try OBJECT HELP.",
            String::from_utf8_lossy(sub)
        ))
    }
}

//! The list commands (LPUSH, RPUSH, LPUSHX, RPUSHX, LPOP, RPOP, LRANGE, LINDEX, LINSERT, LLEN,
//! LREM, LSET, LTRIM, LPOS, LMOVE, RPOPLPUSH, LMPOP), with Redis' replies and errors. A list left
//! without elements is deleted, as in Redis. The blocking forms are in `blocking`.

use std::collections::VecDeque;

use bytes::Bytes;

use super::{bulk, RedisStore};
use crate::command::{int_arg, is, syntax_error, wrong_arity};
use crate::reply::Reply;

type List = VecDeque<Bytes>;

#[derive(Clone, Copy, PartialEq, Eq)]
enum End {
    Left,
    Right,
}

fn end_of(arg: &[u8]) -> Option<End> {
    if is(arg, "left") {
        Some(End::Left)
    } else if is(arg, "right") {
        Some(End::Right)
    } else {
        None
    }
}

impl RedisStore {
    fn get_list(&self, key: &[u8]) -> Result<Option<&List>, Reply> {
        self.get_collection(key)
    }

    fn with_list<R>(&mut self, key: &Bytes, create: bool, f: impl FnOnce(&mut List) -> R) -> Result<Option<R>, Reply> {
        self.with_collection(key, create, f)
    }
}

/// A list index as Redis reads one (negative from the end), clamped into `0..=len`; `None` if it
/// is before the start.
fn resolve(index: i64, len: usize) -> i64 {
    if index < 0 {
        len as i64 + index
    } else {
        index
    }
}

/// Runs a list command that writes; `None` if `name` is not one.
pub(super) fn dispatch(s: &mut RedisStore, name: &str, a: &[Bytes]) -> Option<Reply> {
    let reply = match name {
        "lpush" | "rpush" | "lpushx" | "rpushx" => {
            let create = !name.ends_with('x');
            let left = name.starts_with('l');
            s.with_list(&a[0], create, |l| {
                for e in &a[1..] {
                    if left {
                        l.push_front(e.clone());
                    } else {
                        l.push_back(e.clone());
                    }
                }
                l.len()
            })
            .map_or_else(|e| e, |n| Reply::Int(n.unwrap_or(0) as i64))
        }
        "lpop" | "rpop" => pop(s, name, a),
        "lmpop" => lmpop(s, a),
        "linsert" => {
            let before = match &a[1] {
                w if is(w, "before") => true,
                w if is(w, "after") => false,
                _ => return Some(syntax_error()),
            };
            s.with_list(&a[0], false, |l| match l.iter().position(|e| *e == a[2]) {
                Some(at) => {
                    l.insert(if before { at } else { at + 1 }, a[3].clone());
                    l.len() as i64
                }
                None => -1,
            })
            .map_or_else(|e| e, |n| Reply::Int(n.unwrap_or(0)))
        }
        "lrem" => {
            let count = match int_arg(&a[1]) {
                Ok(n) => n,
                Err(e) => return Some(e),
            };
            s.with_list(&a[0], false, |l| {
                let limit = if count == 0 {
                    usize::MAX
                } else {
                    count.unsigned_abs() as usize
                };
                let mut removed = 0usize;
                if count >= 0 {
                    let mut i = 0;
                    while i < l.len() && removed < limit {
                        if l[i] == a[2] {
                            l.remove(i);
                            removed += 1;
                        } else {
                            i += 1;
                        }
                    }
                } else {
                    let mut i = l.len();
                    while i > 0 && removed < limit {
                        i -= 1;
                        if l[i] == a[2] {
                            l.remove(i);
                            removed += 1;
                        }
                    }
                }
                removed as i64
            })
            .map_or_else(|e| e, |n| Reply::Int(n.unwrap_or(0)))
        }
        "lset" => {
            let index = match int_arg(&a[1]) {
                Ok(n) => n,
                Err(e) => return Some(e),
            };
            let outcome = s.with_list(&a[0], false, |l| {
                let at = resolve(index, l.len());
                if at < 0 || at as usize >= l.len() {
                    return Reply::err("ERR index out of range");
                }
                l[at as usize] = a[2].clone();
                Reply::ok()
            });
            match outcome {
                Err(e) => e,
                Ok(Some(reply)) => reply,
                Ok(None) => Reply::err("ERR no such key"),
            }
        }
        "ltrim" => {
            let (start, stop) = match (int_arg(&a[1]), int_arg(&a[2])) {
                (Ok(start), Ok(stop)) => (start, stop),
                (Err(e), _) | (_, Err(e)) => return Some(e),
            };
            s.with_list(&a[0], false, |l| {
                let (from, to) = range(start, stop, l.len());
                if from > to {
                    l.clear();
                } else {
                    l.truncate(to + 1);
                    l.drain(..from);
                }
            })
            .map_or_else(|e| e, |_| Reply::ok())
        }
        "lmove" | "rpoplpush" => {
            let (from, to) = if name == "rpoplpush" {
                (End::Right, End::Left)
            } else {
                match (end_of(&a[2]), end_of(&a[3])) {
                    (Some(f), Some(t)) => (f, t),
                    _ => return Some(syntax_error()),
                }
            };
            lmove(s, &a[0], &a[1], from, to)
        }
        _ => return None,
    };
    Some(reply)
}

/// The inclusive index range `start..=stop` of a list of `len` as LRANGE and LTRIM read it;
/// `from > to` when it is empty.
fn range(start: i64, stop: i64, len: usize) -> (usize, usize) {
    let len = len as i64;
    let start = resolve(start, len as usize).max(0);
    let stop = resolve(stop, len as usize).min(len - 1);
    if start > stop || start >= len {
        (1, 0)
    } else {
        (start as usize, stop as usize)
    }
}

fn pop(s: &mut RedisStore, name: &str, a: &[Bytes]) -> Reply {
    let count = match super::pop_count(a.get(1)) {
        Ok(count) => count,
        Err(e) => return e,
    };
    if a.len() > 2 {
        return wrong_arity(name);
    }
    let left = name == "lpop";
    let outcome = s.with_list(&a[0], false, |l| {
        let n = count.unwrap_or(1).min(l.len());
        let popped: Vec<Bytes> = (0..n)
            .filter_map(|_| if left { l.pop_front() } else { l.pop_back() })
            .collect();
        popped
    });
    match (outcome, count) {
        (Err(e), _) => e,
        (Ok(None), None) => Reply::Nil,
        // Redis 7: a missing key with a count is the null array.
        (Ok(None), Some(_)) => Reply::NilArray,
        (Ok(Some(popped)), None) => popped.first().map_or(Reply::Nil, bulk),
        (Ok(Some(popped)), Some(_)) => Reply::Array(popped.iter().map(bulk).collect()),
    }
}

/// LMPOP numkeys key [key ...] LEFT|RIGHT [COUNT count]: pops from the first non-empty list.
fn lmpop(s: &mut RedisStore, a: &[Bytes]) -> Reply {
    let (keys, right, count) = match super::mpop_args(a, ["left", "right"]) {
        Ok(args) => args,
        Err(e) => return e,
    };
    for key in keys {
        match s.get_list(key) {
            Err(e) => return e,
            Ok(None) => continue,
            Ok(Some(_)) => {}
        }
        let popped = s.with_list(key, false, |l| {
            let n = count.min(l.len());
            (0..n)
                .filter_map(|_| if right { l.pop_back() } else { l.pop_front() })
                .collect::<Vec<Bytes>>()
        });
        return match popped {
            Err(e) => e,
            Ok(popped) => Reply::Array(vec![
                bulk(key),
                Reply::Array(popped.unwrap_or_default().iter().map(bulk).collect()),
            ]),
        };
    }
    Reply::NilArray
}

fn lmove(s: &mut RedisStore, source: &Bytes, destination: &Bytes, from: End, to: End) -> Reply {
    // An absent source moves nothing, whatever the destination holds (as in Redis); otherwise
    // both types are checked before anything changes.
    match s.get_list(source) {
        Err(e) => return e,
        Ok(None) => return Reply::Nil,
        Ok(Some(_)) => {}
    }
    if let Err(e) = s.get_list(destination) {
        return e;
    }
    let popped = s.with_list(source, false, |l| {
        if from == End::Left {
            l.pop_front()
        } else {
            l.pop_back()
        }
    });
    let Ok(Some(Some(element))) = popped else {
        return Reply::Nil;
    };
    let pushed = s.with_list(destination, true, |l| {
        if to == End::Left {
            l.push_front(element.clone());
        } else {
            l.push_back(element.clone());
        }
    });
    match pushed {
        Err(e) => e,
        Ok(_) => Reply::Bulk(element),
    }
}

/// Runs a list command that only reads; `None` if `name` is not one.
pub(super) fn dispatch_read(s: &RedisStore, name: &str, a: &[Bytes]) -> Option<Reply> {
    let list = match name {
        "lrange" | "lindex" | "llen" | "lpos" => match s.get_list(&a[0]) {
            Ok(l) => l,
            Err(e) => return Some(e),
        },
        _ => return None,
    };
    let empty = List::new();
    let l = list.unwrap_or(&empty);
    Some(match name {
        "llen" => Reply::Int(l.len() as i64),
        "lindex" => match int_arg(&a[1]) {
            Err(e) => e,
            Ok(index) => {
                let at = resolve(index, l.len());
                if at < 0 {
                    Reply::Nil
                } else {
                    l.get(at as usize).map_or(Reply::Nil, bulk)
                }
            }
        },
        "lrange" => match (int_arg(&a[1]), int_arg(&a[2])) {
            (Err(e), _) | (_, Err(e)) => e,
            (Ok(start), Ok(stop)) => {
                let (from, to) = range(start, stop, l.len());
                if from > to {
                    Reply::Array(Vec::new())
                } else {
                    Reply::Array(l.range(from..=to).map(bulk).collect())
                }
            }
        },
        "lpos" => lpos(l, &a[1..]),
        _ => unreachable!("listed above"),
    })
}

/// LPOS key element [RANK rank] [COUNT num-matches] [MAXLEN len].
fn lpos(l: &List, a: &[Bytes]) -> Reply {
    let (mut rank, mut count, mut maxlen) = (1i64, None::<usize>, 0usize);
    let mut i = 1;
    while i < a.len() {
        if i + 1 >= a.len() {
            return syntax_error();
        }
        let value = match int_arg(&a[i + 1]) {
            Ok(n) => n,
            Err(e) => return e,
        };
        if is(&a[i], "rank") {
            if value == i64::MIN {
                return Reply::err("ERR value is out of range");
            }
            if value == 0 {
                return Reply::err(
                    "ERR RANK can't be zero: use 1 to start from the first match, 2 from the second ... or use negative to start from the end of the list",
                );
            }
            rank = value;
        } else if is(&a[i], "count") {
            if value < 0 {
                return Reply::err("ERR COUNT can't be negative");
            }
            count = Some(value as usize);
        } else if is(&a[i], "maxlen") {
            if value < 0 {
                return Reply::err("ERR MAXLEN can't be negative");
            }
            maxlen = value as usize;
        } else {
            return syntax_error();
        }
        i += 2;
    }
    let element = &a[0];
    let limit = if maxlen == 0 { l.len() } else { maxlen.min(l.len()) };
    let indices: Box<dyn Iterator<Item = usize>> = if rank > 0 {
        Box::new(0..limit)
    } else {
        Box::new((l.len() - limit..l.len()).rev())
    };
    let wanted = count.map(|c| if c == 0 { usize::MAX } else { c }).unwrap_or(1);
    let skip = (rank.unsigned_abs() - 1) as usize;
    let found: Vec<Reply> = indices
        .filter(|&i| l[i] == *element)
        .skip(skip)
        .take(wanted)
        .map(|i| Reply::Int(i as i64))
        .collect();
    match count {
        Some(_) => Reply::Array(found),
        None => found.into_iter().next().unwrap_or(Reply::Nil),
    }
}

//! SORT and SORT_RO: `SORT key [BY pattern] [LIMIT offset count] [GET pattern [GET pattern ...]]
//! [ASC|DESC] [ALPHA] [STORE destination]` over a list, set or sorted set, with Redis' replies
//! and errors. Patterns name other keys (`weight_*`, `object_*->field`), so SORT declares no
//! keys to the replicas' object analysis (it may read any).

use bytes::Bytes;

use super::{RedisStore, Value};
use crate::command::{int_arg, is, syntax_error};
use crate::reply::Reply;

/// Most elements SORT orders (the reply and STORE are bounded by the store's own limits too).
pub const SORT_ELEMENTS_MAX: usize = 1 << 20;

struct Options {
    by: Option<Bytes>,
    limit: Option<(i64, i64)>,
    get: Vec<Bytes>,
    desc: bool,
    alpha: bool,
    store: Option<Bytes>,
}

fn parse(a: &[Bytes], read_only: bool) -> Result<Options, Reply> {
    let mut o = Options {
        by: None,
        limit: None,
        get: Vec::new(),
        desc: false,
        alpha: false,
        store: None,
    };
    let mut i = 1;
    while i < a.len() {
        let left = a.len() - i - 1;
        match &a[i] {
            w if is(w, "asc") => o.desc = false,
            w if is(w, "desc") => o.desc = true,
            w if is(w, "alpha") => o.alpha = true,
            w if is(w, "limit") && left >= 2 => {
                o.limit = Some((int_arg(&a[i + 1])?, int_arg(&a[i + 2])?));
                i += 2;
            }
            w if is(w, "store") && left >= 1 && !read_only => {
                o.store = Some(a[i + 1].clone());
                i += 1;
            }
            w if is(w, "by") && left >= 1 => {
                o.by = Some(a[i + 1].clone());
                i += 1;
            }
            w if is(w, "get") && left >= 1 => {
                o.get.push(a[i + 1].clone());
                i += 1;
            }
            _ => return Err(syntax_error()),
        }
        i += 1;
    }
    Ok(o)
}

impl RedisStore {
    /// The value a SORT pattern names for `element`: `#` is the element itself; otherwise the
    /// first `*` is replaced by it, and a `->field` suffix reads that hash field. `None` if there
    /// is no such string (or field), or the pattern has no `*`.
    fn sort_lookup(&self, pattern: &[u8], element: &[u8]) -> Option<Bytes> {
        if pattern == b"#" {
            return Some(Bytes::copy_from_slice(element));
        }
        let star = pattern.iter().position(|&b| b == b'*')?;
        let arrow = pattern[star..].windows(2).position(|w| w == b"->").map(|p| p + star);
        let (key_pattern, field) = match arrow {
            Some(at) if at + 2 < pattern.len() => (&pattern[..at], Some(&pattern[at + 2..])),
            _ => (pattern, None),
        };
        let mut key = Vec::with_capacity(key_pattern.len() + element.len());
        key.extend_from_slice(&key_pattern[..star]);
        key.extend_from_slice(element);
        key.extend_from_slice(&key_pattern[star + 1..]);
        match (&self.get(&key)?.value, field) {
            (Value::Str(v), None) => Some(v.clone()),
            (Value::Hash(h), Some(f)) => h.get(f).cloned(),
            _ => None,
        }
    }

    /// SORT_RO, and SORT without STORE.
    pub(super) fn sort_read(&self, a: &[Bytes], read_only: bool) -> Option<Reply> {
        match self.sort_rows(a, read_only) {
            Err(e) => Some(e),
            Ok((rows, None)) => Some(Reply::Array(
                rows.into_iter().map(|r| r.map_or(Reply::Nil, Reply::Bulk)).collect(),
            )),
            Ok((_, Some(_))) => None,
        }
    }

    /// SORT with STORE (any other SORT is answered by [`RedisStore::sort_read`]).
    pub(super) fn sort_store(&mut self, a: &[Bytes]) -> Reply {
        let (rows, dst) = match self.sort_rows(a, false) {
            Ok((rows, Some(dst))) => (rows, dst),
            Ok((rows, None)) => {
                return Reply::Array(rows.into_iter().map(|r| r.map_or(Reply::Nil, Reply::Bulk)).collect())
            }
            Err(e) => return e,
        };
        let n = rows.len();
        self.remove(&dst);
        // Redis counts the destination as written even when the result is empty.
        self.watches.touch(&dst);
        if n > 0 {
            let list = rows.into_iter().map(Option::unwrap_or_default).collect();
            self.put_value(&dst, Value::List(list), None);
        }
        Reply::Int(n as i64)
    }

    /// The sorted (and looked-up) rows, and the STORE destination if any.
    #[allow(clippy::type_complexity)]
    fn sort_rows(&self, a: &[Bytes], read_only: bool) -> Result<(Vec<Option<Bytes>>, Option<Bytes>), Reply> {
        let o = parse(a, read_only)?;
        let mut elements: Vec<Bytes> = match self.get(&a[0]).map(|e| &e.value) {
            None => Vec::new(),
            Some(Value::List(l)) => l.iter().cloned().collect(),
            Some(Value::Set(m)) => m.iter().cloned().collect(),
            Some(Value::ZSet(z)) => z.members().cloned().collect(),
            Some(_) => return Err(super::wrong_type()),
        };
        if elements.len() > SORT_ELEMENTS_MAX {
            return Err(Reply::err("ERR upright: too many elements to SORT"));
        }
        // BY a pattern without `*` skips sorting (a set keeps its byte order, so the result is
        // the same at every replica).
        let sorting = o.by.as_ref().is_none_or(|p| p.contains(&b'*'));
        if sorting {
            let weights: Vec<Option<Bytes>> = elements
                .iter()
                .map(|e| match &o.by {
                    Some(p) => self.sort_lookup(p, e),
                    None => Some(e.clone()),
                })
                .collect();
            let mut order: Vec<usize> = (0..elements.len()).collect();
            if o.alpha {
                order.sort_by(|&x, &y| weights[x].cmp(&weights[y]).then_with(|| elements[x].cmp(&elements[y])));
            } else {
                let mut scores = Vec::with_capacity(weights.len());
                for w in &weights {
                    match w {
                        None => scores.push(0.0),
                        Some(w) => match super::parse_float(w).filter(|x| !x.is_nan()) {
                            Some(x) => scores.push(x),
                            None => return Err(Reply::err("ERR One or more scores can't be converted into double")),
                        },
                    }
                }
                order.sort_by(|&x, &y| {
                    scores[x]
                        .total_cmp(&scores[y])
                        .then_with(|| elements[x].cmp(&elements[y]))
                });
            }
            if o.desc {
                order.reverse();
            }
            elements = order.into_iter().map(|i| elements[i].clone()).collect();
        } else if o.desc {
            elements.reverse();
        }
        if let Some((offset, count)) = o.limit {
            let start = offset.max(0) as usize;
            let count = if count < 0 { usize::MAX } else { count as usize };
            elements = elements.into_iter().skip(start).take(count).collect();
        }
        let rows: Vec<Option<Bytes>> = if o.get.is_empty() {
            elements.into_iter().map(Some).collect()
        } else {
            elements
                .iter()
                .flat_map(|e| o.get.iter().map(move |p| (p, e)))
                .map(|(p, e)| self.sort_lookup(p, e))
                .collect()
        };
        Ok((rows, o.store))
    }
}

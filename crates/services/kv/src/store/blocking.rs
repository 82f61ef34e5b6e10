//! The blocking commands (BLPOP, BRPOP, BRPOPLPUSH, BLMOVE, BLMPOP, BZPOPMIN, BZPOPMAX, BZMPOP),
//! waiting on agreed state and agreed time.
//!
//! A gateway sends a blocking command wrapped as `upright.block TOKEN command...`, the token
//! unique to one waiting connection. If the command can be served at once, its reply is the
//! command's reply. Otherwise the store keeps a *waiter* (the command, its client, its token and
//! its deadline on agreed time) and replies [`Reply::Blocked`]. Every write to a key that
//! waiters wait on marks the key ready; after each command (after the whole transaction inside
//! MULTI) the waiters of ready keys are tried again in the order they came, each by running the
//! command's non-blocking form (as Redis 7 re-runs the command), and the first whose key holds
//! data is served. A waiter whose deadline passed is served with the command's timeout reply.
//!
//! A served waiter's reply is kept under its token and the store pushes the token to the
//! waiter's client, which then fetches the reply with `upright.collect TOKEN` through the ordered
//! path (so a reply of any size travels as a normal reply, and a lost push costs only a poll).
//! `upright.unblock TOKEN TIMEOUT|ERROR|DROP` ends a wait early (CLIENT UNBLOCK, or a connection
//! that closed); `upright.unblock-stale PREFIX` drops the caller's waiters and kept replies whose
//! tokens do not start with PREFIX (a restarted gateway's leftovers).
//!
//! Everything here is part of the agreed state: waiters and kept replies are in the checkpoint.
//! A command sent without the wrapper (a client of the cluster that is not a gateway) is served
//! at once or answered with its timeout reply, as inside MULTI.

use std::collections::{BTreeMap, BTreeSet};

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use upright_core::ids::ClientId;

use super::RedisStore;
use crate::command::{is, parse_i64};
use crate::reply::Reply;

/// Most waiters plus kept replies the store holds; a blocking command beyond it is refused.
pub const WAITERS_MAX: usize = 10_000;
/// Longest token a gateway may use.
pub const TOKEN_BYTES_MAX: usize = 64;

/// The type of value a waiter waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
enum Kind {
    List,
    ZSet,
}

/// A blocking command waiting for data.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Waiter {
    client: ClientId,
    token: Bytes,
    /// The blocking command as the client sent it.
    argv: Vec<Bytes>,
    /// Agreed time (ms) at which it gets its timeout reply; `None`: never.
    deadline_ms: Option<u64>,
}

/// Waiters, and the replies served to them but not yet collected.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct Blocked {
    /// By arrival: the order in which waiters of one key are served.
    waiters: BTreeMap<u64, Waiter>,
    next: u64,
    by_key: BTreeMap<Bytes, BTreeSet<u64>>,
    by_token: BTreeMap<Bytes, u64>,
    deadlines: BTreeSet<(u64, u64)>,
    /// Replies served and not yet collected, by token, with their client.
    served: BTreeMap<Bytes, (ClientId, Reply)>,
    /// Keys written since waiters were last tried (transient: empty between commands).
    ready: BTreeSet<Bytes>,
    /// Tokens to push to their clients (transient: drained after each request).
    outbox: Vec<(ClientId, Bytes)>,
}

/// The checkpointed part: waiters in arrival order and the kept replies.
pub(super) type BlockedRows = (u64, Vec<(u64, Waiter)>, Vec<(Bytes, ClientId, Reply)>);

impl Blocked {
    pub(super) fn rows(&self) -> BlockedRows {
        (
            self.next,
            self.waiters.iter().map(|(id, w)| (*id, w.clone())).collect(),
            self.served
                .iter()
                .map(|(t, (c, r))| (t.clone(), *c, r.clone()))
                .collect(),
        )
    }

    pub(super) fn from_rows((next, waiters, served): BlockedRows) -> Blocked {
        let mut b = Blocked {
            next,
            ..Blocked::default()
        };
        for (id, w) in waiters {
            b.insert(id, w);
        }
        b.served = served.into_iter().map(|(t, c, r)| (t, (c, r))).collect();
        b
    }

    /// Whether some waiter waits on `key`.
    pub(super) fn waits_on(&self, key: &[u8]) -> bool {
        !self.by_key.is_empty() && self.by_key.contains_key(key)
    }

    /// Marks `key` written (for [`RedisStore::serve_ready`]).
    pub(super) fn touch(&mut self, key: &Bytes) {
        if self.waits_on(key) {
            self.ready.insert(key.clone());
        }
    }

    /// The earliest waiter deadline (agreed ms).
    pub(super) fn first_deadline(&self) -> Option<u64> {
        self.deadlines.first().map(|(at, _)| *at)
    }

    /// Waiters and kept replies.
    pub(super) fn len(&self) -> usize {
        self.waiters.len() + self.served.len()
    }

    /// Tokens to push, with their clients, emptied.
    pub(super) fn take_outbox(&mut self) -> Vec<(ClientId, Bytes)> {
        std::mem::take(&mut self.outbox)
    }

    fn insert(&mut self, id: u64, w: Waiter) {
        for key in form(&w.argv).map(|f| f.keys).unwrap_or_default() {
            self.by_key.entry(key).or_default().insert(id);
        }
        self.by_token.insert(w.token.clone(), id);
        if let Some(at) = w.deadline_ms {
            self.deadlines.insert((at, id));
        }
        self.waiters.insert(id, w);
    }

    fn remove(&mut self, id: u64) -> Option<Waiter> {
        let w = self.waiters.remove(&id)?;
        for key in form(&w.argv).map(|f| f.keys).unwrap_or_default() {
            if let Some(ids) = self.by_key.get_mut(&key) {
                ids.remove(&id);
                if ids.is_empty() {
                    self.by_key.remove(&key);
                }
            }
        }
        self.by_token.remove(&w.token);
        if let Some(at) = w.deadline_ms {
            self.deadlines.remove(&(at, id));
        }
        Some(w)
    }

    /// Ends waiter `id` with `reply`, kept for collection, and queues the push of its token.
    fn serve(&mut self, id: u64, reply: Reply) {
        if let Some(w) = self.remove(id) {
            self.outbox.push((w.client, w.token.clone()));
            self.served.insert(w.token, (w.client, reply));
        }
    }
}

/// A blocking command read: its keys, the type they must hold, its non-blocking form and what
/// it answers on timeout.
struct Form {
    keys: Vec<Bytes>,
    kind: Kind,
    timeout: Bytes,
    /// The command that serves it now (nil or null-array reply: nothing there yet).
    now: Vec<Bytes>,
    /// BLPOP/BRPOP/BZPOPMIN/BZPOPMAX answer `[key, element...]` where the *MPOP form answers
    /// `[key, [elements]]`.
    flatten: bool,
    timeout_reply: Reply,
}

fn word(w: &str) -> Bytes {
    Bytes::copy_from_slice(w.as_bytes())
}

/// Reads a blocking command (arity already checked); `None` if `argv` is not one.
fn form(argv: &[Bytes]) -> Option<Form> {
    let name = std::str::from_utf8(argv.first()?).ok()?.to_ascii_lowercase();
    let a = &argv[1..];
    let last = a.last()?.clone();
    let keys_then = |keys: &[Bytes], end: &str, mpop: &str| {
        let mut now = vec![word(mpop), word(&keys.len().to_string())];
        now.extend(keys.iter().cloned());
        now.push(word(end));
        now
    };
    // `numkeys key ...` after the timeout: the keys, if numkeys reads.
    let counted_keys = |a: &[Bytes]| -> Vec<Bytes> {
        match a.get(1).and_then(|n| parse_i64(n)) {
            Some(n) if n > 0 && (n as usize) < a.len() - 1 => a[2..2 + n as usize].to_vec(),
            _ => Vec::new(),
        }
    };
    Some(match name.as_str() {
        "blpop" | "brpop" | "bzpopmin" | "bzpopmax" => {
            let keys = a[..a.len() - 1].to_vec();
            let (kind, mpop, end) = match name.as_str() {
                "blpop" => (Kind::List, "lmpop", "left"),
                "brpop" => (Kind::List, "lmpop", "right"),
                "bzpopmin" => (Kind::ZSet, "zmpop", "min"),
                _ => (Kind::ZSet, "zmpop", "max"),
            };
            Form {
                now: keys_then(&keys, end, mpop),
                keys,
                kind,
                timeout: last,
                flatten: true,
                timeout_reply: Reply::NilArray,
            }
        }
        "brpoplpush" | "blmove" => {
            let mut now = vec![word(if name == "blmove" { "lmove" } else { "rpoplpush" })];
            now.extend(a[..a.len() - 1].iter().cloned());
            Form {
                keys: vec![a[0].clone()],
                kind: Kind::List,
                timeout: last,
                now,
                flatten: false,
                timeout_reply: Reply::Nil,
            }
        }
        "blmpop" | "bzmpop" => {
            let mut now = vec![word(if name == "blmpop" { "lmpop" } else { "zmpop" })];
            now.extend(a[1..].iter().cloned());
            Form {
                keys: counted_keys(a),
                kind: if name == "blmpop" { Kind::List } else { Kind::ZSet },
                timeout: a[0].clone(),
                now,
                flatten: false,
                timeout_reply: Reply::NilArray,
            }
        }
        _ => return None,
    })
}

/// A timeout in seconds as Redis reads one (a float, or a hex integer as `strtold` reads it):
/// the deadline in agreed ms after `now_ms`, `None` for 0 (wait forever).
fn deadline(timeout: &[u8], now_ms: u64) -> Result<Option<u64>, Reply> {
    let text = std::str::from_utf8(timeout).unwrap_or("");
    let seconds = match text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16).ok().map(|n| n as f64),
        None => super::parse_float(timeout).filter(|x| x.is_finite()),
    };
    let Some(seconds) = seconds else {
        return Err(Reply::err("ERR timeout is not a float or out of range"));
    };
    if seconds < 0.0 {
        return Err(Reply::err("ERR timeout is negative"));
    }
    if seconds == 0.0 {
        return Ok(None);
    }
    let ms = (seconds * 1000.0).ceil();
    if ms + now_ms as f64 >= i64::MAX as f64 {
        return Err(Reply::err("ERR timeout is out of range"));
    }
    Ok(Some(now_ms + (ms as u64).max(1)))
}

impl RedisStore {
    /// Runs blocking command `argv` now: `Ok(reply)` if served (or refused), `Err(())` if it has
    /// to wait.
    fn try_blocking(&mut self, f: &Form) -> Result<Reply, ()> {
        let name = String::from_utf8_lossy(&f.now[0]).into_owned();
        let reply = super::commands::dispatch(self, &name, &f.now);
        match reply {
            Reply::Nil | Reply::NilArray => Err(()),
            Reply::Array(mut items) if f.flatten && items.len() == 2 => {
                let Reply::Array(mut popped) = items.pop().expect("two") else {
                    return Ok(Reply::Array(items));
                };
                let key = items.pop().expect("one");
                Ok(match popped.pop() {
                    // BZPOPMIN: [key, member, score]; BLPOP: [key, element].
                    Some(Reply::Array(pair)) => Reply::Array(std::iter::once(key).chain(pair).collect()),
                    Some(element) => Reply::Array(vec![key, element]),
                    None => Reply::NilArray,
                })
            }
            other => Ok(other),
        }
    }

    /// A blocking command sent without a token, or inside MULTI: served now or answered with its
    /// timeout reply.
    pub(super) fn blocking_now(&mut self, argv: &[Bytes]) -> Reply {
        let Some(f) = form(argv) else {
            return Reply::err("ERR not a blocking command");
        };
        if let Err(e) = deadline(&f.timeout, self.now_ms) {
            return e;
        }
        self.try_blocking(&f).unwrap_or(f.timeout_reply)
    }

    /// `upright.block TOKEN command...` from `client`.
    pub(super) fn block(&mut self, client: ClientId, token: &Bytes, argv: &[Bytes]) -> Reply {
        let spec = match crate::command::check(argv) {
            Ok(spec) => spec,
            Err(e) => return e,
        };
        let Some(f) = form(argv) else {
            return Reply::err(format!("ERR '{}' is not a blocking command", spec.name));
        };
        let deadline_ms = match deadline(&f.timeout, self.now_ms) {
            Ok(d) => d,
            Err(e) => return e,
        };
        if let Ok(reply) = self.try_blocking(&f) {
            return reply;
        }
        if token.is_empty() || token.len() > TOKEN_BYTES_MAX || self.blocked.by_token.contains_key(token) {
            return Reply::err("ERR upright: bad blocking token");
        }
        if self.blocked.len() >= WAITERS_MAX {
            return Reply::err("ERR upright: too many blocked clients");
        }
        let id = self.blocked.next;
        self.blocked.next += 1;
        self.blocked.insert(
            id,
            Waiter {
                client,
                token: token.clone(),
                argv: argv.to_vec(),
                deadline_ms,
            },
        );
        Reply::Blocked
    }

    /// `upright.collect TOKEN`: the reply served to the waiter, [`Reply::Blocked`] if it still
    /// waits.
    pub(super) fn collect(&mut self, token: &[u8]) -> Reply {
        if let Some((_, reply)) = self.blocked.served.remove(token) {
            return reply;
        }
        if self.blocked.by_token.contains_key(token) {
            return Reply::Blocked;
        }
        Reply::err("ERR upright: no such blocked command")
    }

    /// `upright.unblock TOKEN TIMEOUT|ERROR|DROP`: ends a wait early with the timeout reply, the
    /// CLIENT UNBLOCK error, or nothing (and forgets a reply already served); 1 if it waited.
    pub(super) fn unblock(&mut self, token: &[u8], how: &[u8]) -> Reply {
        let Some(&id) = self.blocked.by_token.get(token) else {
            if is(how, "drop") {
                self.blocked.served.remove(token);
            }
            return Reply::Int(0);
        };
        let timeout_reply = self
            .blocked
            .waiters
            .get(&id)
            .and_then(|w| form(&w.argv))
            .map(|f| f.timeout_reply);
        match () {
            _ if is(how, "drop") => {
                self.blocked.remove(id);
            }
            _ if is(how, "error") => self
                .blocked
                .serve(id, Reply::err("UNBLOCKED client unblocked via CLIENT UNBLOCK")),
            _ => self.blocked.serve(id, timeout_reply.unwrap_or(Reply::NilArray)),
        }
        Reply::Int(1)
    }

    /// `upright.unblock-stale PREFIX` from `client`: drops its waiters, kept replies, WATCH
    /// tokens and subscriptions whose tokens (prefixes) do not start with PREFIX; the number
    /// dropped.
    pub(super) fn unblock_stale(&mut self, client: ClientId, prefix: &[u8]) -> Reply {
        let stale = |c: ClientId, t: &Bytes| c == client && !t.starts_with(prefix);
        let ids: Vec<u64> = self
            .blocked
            .waiters
            .iter()
            .filter(|(_, w)| stale(w.client, &w.token))
            .map(|(id, _)| *id)
            .collect();
        ids.iter().for_each(|id| {
            self.blocked.remove(*id);
        });
        let before = self.blocked.served.len();
        self.blocked.served.retain(|t, (c, _)| !stale(*c, t));
        let watches = self.watches.forget_stale(client, prefix);
        let subscriptions = self.pubsub.forget_stale(client, prefix);
        let large = self.large.forget_stale(client, prefix);
        Reply::Int((ids.len() + before - self.blocked.served.len() + watches + subscriptions + large) as i64)
    }

    /// Tries the waiters of every key written since the last call, in arrival order, until no
    /// key is ready (serving one may write another: BLMOVE).
    pub(super) fn serve_ready(&mut self) {
        while let Some(key) = self.blocked.ready.pop_first() {
            let ids: Vec<u64> = self
                .blocked
                .by_key
                .get(&key)
                .map(|s| s.iter().copied().collect())
                .unwrap_or_default();
            for id in ids {
                let Some(f) = self.blocked.waiters.get(&id).and_then(|w| form(&w.argv)) else {
                    continue;
                };
                // Only a key that holds the awaited type wakes (a SET over it does not).
                let holds = match self.get(&key).map(|e| &e.value) {
                    Some(super::Value::List(_)) => f.kind == Kind::List,
                    Some(super::Value::ZSet(_)) => f.kind == Kind::ZSet,
                    _ => false,
                };
                if !holds {
                    break;
                }
                if let Ok(reply) = self.try_blocking(&f) {
                    let reply = if self.corrupt {
                        super::corrupt_reply(reply)
                    } else {
                        reply
                    };
                    self.blocked.serve(id, reply);
                }
            }
        }
    }

    /// Serves every waiter whose deadline is not after the agreed time with its timeout reply.
    pub(super) fn expire_waiters(&mut self) {
        while let Some(&(at, id)) = self.blocked.deadlines.first() {
            if at > self.now_ms {
                break;
            }
            let reply = self
                .blocked
                .waiters
                .get(&id)
                .and_then(|w| form(&w.argv))
                .map_or(Reply::NilArray, |f| f.timeout_reply);
            self.blocked.serve(id, reply);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_read_as_redis_reads_them() {
        assert_eq!(deadline(b"0", 1000), Ok(None));
        assert_eq!(deadline(b"1.5", 1000), Ok(Some(2500)));
        assert_eq!(deadline(b"0.0001", 1000), Ok(Some(1001)), "rounded up to a millisecond");
        assert_eq!(deadline(b"-1", 0), Err(Reply::err("ERR timeout is negative")));
        assert_eq!(
            deadline(b"abc", 0),
            Err(Reply::err("ERR timeout is not a float or out of range"))
        );
        assert_eq!(
            deadline(b"0x7FFFFFFFFFFFFF", 0),
            Err(Reply::err("ERR timeout is out of range"))
        );
    }
}

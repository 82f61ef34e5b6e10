//! The replicated state machine: Redis strings, hashes, lists, sets and sorted sets with expiry by
//! agreed time.
//!
//! Time is the agreed batch time `BatchContext::time_us` (in milliseconds, as Redis counts); a key
//! whose expiry time is before the batch's time is gone: every batch starts by removing all such
//! keys, so no command, reply or checkpoint depends on when a replica happens to run. All tables
//! are `BTreeMap`/`BTreeSet`, so iteration order (KEYS, SCAN, checkpoints) is the same everywhere.

mod bits;
mod blocking;
#[cfg(test)]
mod blocking_tests;
mod commands;
mod hash;
mod keys;
mod large;
mod list;
mod multi;
mod notify;
mod pubsub;
mod selective;
#[cfg(test)]
mod selective_tests;
mod set;
mod sort;
#[cfg(test)]
mod tests;
mod zset;
#[cfg(test)]
mod zset_tests;

use std::collections::{BTreeMap, BTreeSet};

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use upright_core::ids::ClientId;
use upright_core::service::{Access, BatchContext, Effects, RestoreError, Service, ServiceRequest};

use crate::command;
use crate::reply::Reply;

pub use large::{PIECE_BYTES_MAX, STAGED_COMMAND_BYTES_MAX, STAGE_THRESHOLD};
pub use multi::{encode_transaction, MULTI_COMMANDS_MAX};
pub use pubsub::Pushed;

/// Most bytes of keys and values (plus a per-key overhead) the store holds; writes that could
/// grow it beyond get Redis' OOM error (Redis' `maxmemory` with the `noeviction` policy).
pub const STORE_BYTES_MAX: usize = 1 << 30;
/// Accounting overhead of one key.
const ENTRY_OVERHEAD: usize = 64;
/// Largest encoded reply list of one operation (below the cluster's `reply_bytes_max` default of
/// 1 MiB); a reply that would cross it is replaced by an error.
pub const REPLY_BYTES_MAX: usize = (1 << 20) - 4096;

/// A key's value: one of Redis' types.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
enum Value {
    Str(Bytes),
    /// Fields in byte order (HGETALL, HKEYS and HSCAN walk this order at every replica).
    Hash(BTreeMap<Bytes, Bytes>),
    List(std::collections::VecDeque<Bytes>),
    /// Members in byte order.
    Set(BTreeSet<Bytes>),
    /// Members with scores, in (score, member) order.
    ZSet(zset::ZSet),
}

impl Value {
    /// Its name as TYPE gives it.
    fn type_name(&self) -> &'static str {
        match self {
            Value::Str(_) => "string",
            Value::Hash(_) => "hash",
            Value::List(_) => "list",
            Value::Set(_) => "set",
            Value::ZSet(_) => "zset",
        }
    }

    /// Bytes it holds, for the memory bound (a per-field overhead as for keys).
    fn bytes(&self) -> usize {
        match self {
            Value::Str(b) => b.len(),
            Value::Hash(h) => h.cost(),
            Value::List(l) => l.cost(),
            Value::Set(m) => m.cost(),
            Value::ZSet(z) => z.cost(),
        }
    }
}

/// Accounting overhead of one hash field.
const FIELD_OVERHEAD: usize = 16;

/// Redis' error for a command applied to a key of another type.
pub const WRONGTYPE: &str = "WRONGTYPE Operation against a key holding the wrong kind of value";

/// A bulk reply of `b`.
fn bulk(b: &Bytes) -> Reply {
    Reply::Bulk(b.clone())
}

fn wrong_type() -> Reply {
    Reply::err(WRONGTYPE)
}

/// A collection type a key may hold (hash, list, set, sorted set): how to find it in a [`Value`] and what it
/// costs against the memory bound.
trait Collection: Default {
    fn of(value: &Value) -> Option<&Self>;
    fn of_mut(value: &mut Value) -> Option<&mut Self>;
    fn into_value(self) -> Value;
    /// Bytes held (an iteration over the elements unless [`Collection::COST_IS_KEPT`]).
    fn cost(&self) -> usize;
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Whether [`Collection::cost`] is kept as elements change (O(1)).
    const COST_IS_KEPT: bool = false;
}

/// Collections up to this many elements have their cost counted exactly after every change;
/// larger ones every `len / 16` changes, and by the average element in between (O(1)
/// amortized per change instead of O(len); deterministic, so every replica counts alike).
const EXACT_COST_LEN: usize = 64;

impl Collection for BTreeMap<Bytes, Bytes> {
    fn of(value: &Value) -> Option<&Self> {
        if let Value::Hash(h) = value {
            Some(h)
        } else {
            None
        }
    }
    fn of_mut(value: &mut Value) -> Option<&mut Self> {
        if let Value::Hash(h) = value {
            Some(h)
        } else {
            None
        }
    }
    fn into_value(self) -> Value {
        Value::Hash(self)
    }
    fn cost(&self) -> usize {
        self.iter().map(|(f, v)| f.len() + v.len() + FIELD_OVERHEAD).sum()
    }
    fn len(&self) -> usize {
        BTreeMap::len(self)
    }
}

impl Collection for std::collections::VecDeque<Bytes> {
    fn of(value: &Value) -> Option<&Self> {
        if let Value::List(l) = value {
            Some(l)
        } else {
            None
        }
    }
    fn of_mut(value: &mut Value) -> Option<&mut Self> {
        if let Value::List(l) = value {
            Some(l)
        } else {
            None
        }
    }
    fn into_value(self) -> Value {
        Value::List(self)
    }
    fn cost(&self) -> usize {
        self.iter().map(|e| e.len() + FIELD_OVERHEAD).sum()
    }
    fn len(&self) -> usize {
        std::collections::VecDeque::len(self)
    }
}

impl Collection for BTreeSet<Bytes> {
    fn of(value: &Value) -> Option<&Self> {
        if let Value::Set(m) = value {
            Some(m)
        } else {
            None
        }
    }
    fn of_mut(value: &mut Value) -> Option<&mut Self> {
        if let Value::Set(m) = value {
            Some(m)
        } else {
            None
        }
    }
    fn into_value(self) -> Value {
        Value::Set(self)
    }
    fn cost(&self) -> usize {
        self.iter().map(|m| m.len() + FIELD_OVERHEAD).sum()
    }
    fn len(&self) -> usize {
        BTreeSet::len(self)
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Entry {
    value: Value,
    /// Absolute expiry time in agreed milliseconds.
    expires_ms: Option<u64>,
    /// The value's bytes as counted against the memory bound (see [`EXACT_COST_LEN`]).
    cost: usize,
    /// Changes since `cost` was last counted exactly.
    estimated: u32,
}

impl Entry {
    /// The value if it is a string; WRONGTYPE otherwise.
    fn string(&self) -> Result<&Bytes, Reply> {
        match &self.value {
            Value::Str(b) => Ok(b),
            _ => Err(wrong_type()),
        }
    }
}

/// The key-value store (strings, hashes, lists, sets and sorted sets).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RedisStore {
    map: BTreeMap<Bytes, Entry>,
    /// (expiry time, key) of every key with a time to live.
    expiries: BTreeSet<(u64, Bytes)>,
    /// (scan slot, key) of every key: SCAN walks this order, so its cursors survive writes.
    slots: BTreeSet<(u64, Bytes)>,
    used: usize,
    /// Agreed time of the batch being executed, in milliseconds.
    now_ms: u64,
    /// The agreed seed of the batch being executed (its first 8 bytes), for HRANDFIELD.
    seed: u64,
    /// Random draws made in this batch so far (so two HRANDFIELDs of one batch differ).
    random_calls: u64,
    /// Blocking commands waiting, and their served replies not yet collected.
    blocked: blocking::Blocked,
    /// WATCH tokens and their keys.
    watches: multi::Watches,
    /// The gateways' pub/sub subscriptions.
    pubsub: pubsub::PubSub,
    /// Commands being staged and replies kept for fetching (values above one operation).
    large: large::Large,
    /// notify-keyspace-events: the enabled classes (see `notify`).
    notify: u16,
    /// Messages to push to clients, in order (transient: drained after each request).
    outbox: Vec<(ClientId, Bytes)>,
    /// The client whose request is executing (for the blocking commands' waiters); `None`
    /// between batches.
    client: Option<ClientId>,
    /// Testing only: behave as a Byzantine replica that corrupts stored values and replies.
    corrupt: bool,
    /// Run under selective execution (`selective.rs`).
    selective: bool,
    /// The current request is global (runs on every execution member; selective execution only).
    global_request: bool,
    /// Under selective execution: the bytes used as of the last checkpoint, against which writes
    /// are checked (every member holds the same whole state there).
    used_agreed: std::cell::Cell<usize>,
}

/// The SCAN slot of a key: a fixed 63-bit hash, never 0 (0 is the cursor that ends a scan).
pub fn slot(key: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in key {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    (h >> 1).max(1)
}

impl RedisStore {
    /// An empty store.
    pub fn new() -> RedisStore {
        RedisStore::default()
    }

    /// Testing only: a store that corrupts every value it stores and every reply it gives, to
    /// stand for a Byzantine replica's service in tests.
    pub fn corrupting() -> RedisStore {
        RedisStore {
            corrupt: true,
            ..RedisStore::default()
        }
    }

    /// Number of keys.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether the store is empty.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Starts a batch at agreed time `time_us`: removes every key that expired before it and
    /// answers every blocked command whose timeout passed.
    pub fn advance(&mut self, time_us: u64) {
        self.now_ms = self.now_ms.max(time_us / 1000);
        self.remove_expired_before(self.now_ms);
        self.expire_waiters();
    }

    /// Removes every key whose expiry time is before `ms`.
    fn remove_expired_before(&mut self, ms: u64) {
        while let Some((at, key)) = self.expiries.first().cloned() {
            if at >= ms {
                break;
            }
            self.remove(&key);
            self.notify('x', "expired", &key);
        }
    }

    /// Executes one command (an argument vector) at the current agreed time, then serves the
    /// blocked commands its writes woke.
    pub fn apply(&mut self, argv: &[Bytes]) -> Reply {
        let reply = self.apply_one(argv);
        self.serve_ready();
        if argv.first().is_some_and(|name| &name[..] == b"upright.fetch") {
            return reply; // a piece of a kept reply: bounded by the piece size
        }
        self.bounded(reply)
    }

    /// The commands a gateway sends besides Redis' (`upright.block`, `upright.collect`,
    /// `upright.unblock`, `upright.unblock-stale`: see `blocking`; `upright.watch`,
    /// `upright.unwatch`, `upright.exec`: see `multi`; `upright.subscribe`,
    /// `upright.unsubscribe`: see `pubsub`); `None` for any other.
    fn internal(&mut self, argv: &[Bytes]) -> Option<Reply> {
        let name = argv.first()?;
        if !name.starts_with(b"upright.") {
            return None;
        }
        let a = &argv[1..];
        Some(match (&name[8..], a) {
            (b"block" | b"watch", _) if self.selective => selective::unavailable(
                "blocking commands (their waiters are served by other clients' writes) and WATCH are",
            ),
            (b"notify-config", [value]) if self.selective && notify::parse(value).is_some_and(|flags| flags != 0) => {
                selective::unavailable("keyspace notifications are")
            }
            (b"block", [token, command @ ..]) if !command.is_empty() => self.block(self.caller(), token, command),
            (b"collect", [token]) => self.collect(token),
            (b"unblock", [token, how]) => self.unblock(token, how),
            (b"unblock-stale", [prefix]) => self.unblock_stale(self.caller(), prefix),
            (b"watch", [token, keys @ ..]) if !keys.is_empty() => self.watch(token, keys),
            (b"unwatch", [token]) => self.unwatch(token),
            (b"exec", [token, commands]) => self.exec(token, commands),
            (b"stage", [token, offset, piece]) => self.stage(token, offset, piece),
            (b"run", [token]) => self.run_staged(token),
            (b"drop", [token]) => self.drop_staged_command(token),
            (b"fetch", [_, _, _]) => self.fetch(a),
            (b"release", [n]) => self.release(n),
            (b"notify-config", []) => self.notify_config(None),
            (b"notify-config", [value]) => self.notify_config(Some(value)),
            (b"subscribe", rest) => self.gateway_subscription(true, rest),
            (b"unsubscribe", rest) => self.gateway_subscription(false, rest),
            _ => command::unknown_command(argv),
        })
    }

    /// The client whose request is executing (client 0 outside a batch: tests).
    fn caller(&self) -> ClientId {
        self.client.unwrap_or(ClientId(0))
    }

    fn apply_one(&mut self, argv: &[Bytes]) -> Reply {
        if let Some(reply) = self.internal(argv) {
            return if self.corrupt { corrupt_reply(reply) } else { reply };
        }
        let spec = match command::check(argv) {
            Ok(spec) => spec,
            Err(reply) => return reply,
        };
        if spec.place != command::Place::Replicated {
            // Connection commands are the gateway's; a client sending one here gets an error.
            return Reply::err(format!("ERR '{}' is answered by the gateway", spec.name));
        }
        if spec.flags.contains(&"denyoom") && self.used_for_bound() > STORE_BYTES_MAX {
            return Reply::err("OOM command not allowed when used memory > 'maxmemory'.");
        }
        let existed = if self.notifying() && matches!(spec.name, "del" | "unlink" | "getdel") {
            self.existing_keys(spec, argv)
        } else {
            Vec::new()
        };
        let reply = if spec.flags.contains(&"blocking") {
            // Sent without a gateway's token: served now or answered as on timeout.
            self.blocking_now(argv)
        } else {
            commands::dispatch(self, spec.name, argv)
        };
        if self.notifying() {
            self.notify_command(spec, argv, &reply, existed);
        }
        if spec.flags.contains(&"random") || spec.name == "spop" {
            // The next draw of this batch differs from this one.
            self.random_calls += 1;
        }
        if self.corrupt {
            corrupt_reply(reply)
        } else {
            reply
        }
    }

    /// Answers one command without changing anything, if it only reads (`None` otherwise). Argument
    /// errors are state-independent and answered too.
    pub fn apply_read(&self, argv: &[Bytes]) -> Option<Reply> {
        if argv.first().is_some_and(|name| name.starts_with(b"upright.")) {
            // Pieces of kept replies are read on the read-only path; nothing else of the
            // gateway's is.
            return (argv.len() == 4 && &argv[0][..] == b"upright.fetch").then(|| self.fetch(&argv[1..]));
        }
        let spec = match command::check(argv) {
            Ok(spec) => spec,
            Err(reply) => return Some(reply),
        };
        if !spec.is_read() {
            return None;
        }
        let reply = commands::dispatch_read(self, spec.name, argv)?;
        Some(if self.corrupt { corrupt_reply(reply) } else { reply })
    }

    fn get(&self, key: &[u8]) -> Option<&Entry> {
        self.map.get(key)
    }

    /// The collection under `key`: `Ok(None)` if there is none, WRONGTYPE if it holds another
    /// type.
    fn get_collection<C: Collection>(&self, key: &[u8]) -> Result<Option<&C>, Reply> {
        match self.get(key) {
            None => Ok(None),
            Some(e) => C::of(&e.value).map(Some).ok_or_else(wrong_type),
        }
    }

    /// Runs `f` on the collection under `key` (created empty if absent and `create`), keeping
    /// the memory count; deletes the key if the collection ends up empty, as Redis does.
    /// `Ok(None)`: none there and not created.
    fn with_collection<C: Collection, R>(
        &mut self,
        key: &Bytes,
        create: bool,
        f: impl FnOnce(&mut C) -> R,
    ) -> Result<Option<R>, Reply> {
        match self.get(key) {
            None if !create => return Ok(None),
            None => self.put_value(key, C::default().into_value(), None),
            Some(e) if C::of(&e.value).is_none() => return Err(wrong_type()),
            Some(_) => {}
        }
        self.touched(key);
        let entry = self.map.get_mut(key).expect("present");
        let collection = C::of_mut(&mut entry.value).expect("checked");
        let (before, before_len) = (entry.cost, collection.len());
        let result = f(collection);
        let (after_len, empty) = (collection.len(), collection.is_empty());
        entry.estimated += 1;
        let exact = C::COST_IS_KEPT
            || after_len <= EXACT_COST_LEN
            || before_len == 0
            || entry.estimated as usize * 16 >= after_len;
        let after = if exact {
            entry.estimated = 0;
            collection.cost()
        } else {
            (before as u128 * after_len as u128 / before_len as u128) as usize
        };
        entry.cost = after;
        self.used = self.used - before + after;
        if empty {
            self.remove(key);
        }
        Ok(Some(result))
    }

    /// A pseudo-random sequence for HRANDFIELD, SPOP and SRANDMEMBER: from the agreed seed of
    /// the last batch, the key and the draws made so far in it (the same at every replica in the
    /// same state).
    fn random(&self, key: &[u8]) -> SplitMix {
        SplitMix(self.seed ^ slot(key) ^ self.random_calls.rotate_left(32))
    }

    /// The string under `key`: `Ok(None)` if there is none, WRONGTYPE if it holds another type.
    fn get_string(&self, key: &[u8]) -> Result<Option<&Bytes>, Reply> {
        self.get(key).map(Entry::string).transpose()
    }

    fn cost(key: &[u8], value_cost: usize) -> usize {
        key.len() + value_cost + ENTRY_OVERHEAD
    }

    /// Stores the string `value` under `key` with expiry `expires_ms` (`None`: no expiry).
    fn put(&mut self, key: &Bytes, value: Bytes, expires_ms: Option<u64>) {
        let value = if self.corrupt {
            let mut v = value.to_vec();
            v.extend_from_slice(b"<corrupted>");
            Bytes::from(v)
        } else {
            value
        };
        self.put_value(key, Value::Str(value), expires_ms);
    }

    /// Stores `value` (of any type) under `key` with expiry `expires_ms`.
    fn put_value(&mut self, key: &Bytes, value: Value, expires_ms: Option<u64>) {
        self.put_entry(key, value, expires_ms, None);
    }

    /// Stores `value` under `key`, its cost counted (or, from a checkpoint, as counted there).
    fn put_entry(&mut self, key: &Bytes, value: Value, expires_ms: Option<u64>, counted: Option<(usize, u32)>) {
        self.touched(key);
        let (cost, estimated) = counted.unwrap_or_else(|| (value.bytes(), 0));
        self.used += Self::cost(key, cost);
        let entry = Entry {
            value,
            expires_ms,
            cost,
            estimated,
        };
        let old = self.map.insert(key.clone(), entry);
        match old {
            Some(old) => {
                self.used -= Self::cost(key, old.cost);
                if let Some(at) = old.expires_ms {
                    self.expiries.remove(&(at, key.clone()));
                }
            }
            None => {
                self.slots.insert((slot(key), key.clone()));
                if counted.is_none() {
                    self.notify('n', "new", key);
                }
            }
        }
        if let Some(at) = expires_ms {
            self.expiries.insert((at, key.clone()));
        }
    }

    /// Replaces the value, keeping the time to live.
    fn put_keep_ttl(&mut self, key: &Bytes, value: Bytes) {
        let ttl = self.get(key).and_then(|e| e.expires_ms);
        self.put(key, value, ttl);
    }

    /// `key` is being written: blocked commands waiting on it may now be served, and WATCHes
    /// on it are broken.
    fn touched(&mut self, key: &Bytes) {
        self.blocked.touch(key);
        self.watches.touch(key);
    }

    fn remove(&mut self, key: &[u8]) -> Option<Entry> {
        let (key, old) = self.map.remove_entry(key)?;
        self.watches.touch(&key);
        self.used -= Self::cost(&key, old.cost);
        self.slots.remove(&(slot(&key), key.clone()));
        if let Some(at) = old.expires_ms {
            self.expiries.remove(&(at, key));
        }
        Some(old)
    }

    fn set_expiry(&mut self, key: &Bytes, expires_ms: Option<u64>) {
        if self.map.contains_key(key) {
            self.watches.touch(key);
        }
        if let Some(entry) = self.map.get_mut(key) {
            if let Some(at) = entry.expires_ms.take() {
                self.expiries.remove(&(at, key.clone()));
            }
            entry.expires_ms = expires_ms;
            if let Some(at) = expires_ms {
                self.expiries.insert((at, key.clone()));
            }
        }
    }

    fn clear(&mut self) {
        let watched: Vec<Bytes> = self.map.keys().filter(|k| self.watches.watched(k)).cloned().collect();
        watched.iter().for_each(|k| self.watches.touch(k));
        self.map.clear();
        self.expiries.clear();
        self.slots.clear();
        self.used = 0;
    }
}

/// splitmix64: a small deterministic generator (not for secrets).
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    /// Indices into `len` elements as Redis' random-member commands pick them: for a count of
    /// `n >= 0`, up to `n` distinct ones (a partial Fisher-Yates shuffle); for a negative count,
    /// that many with repetition (at most [`REPLY_BYTES_MAX`], far past what a reply can hold).
    fn pick(&mut self, len: usize, count: i64) -> Vec<usize> {
        if count >= 0 {
            let n = (count as usize).min(len);
            let mut order: Vec<usize> = (0..len).collect();
            for i in 0..n {
                let j = i + self.below(len - i);
                order.swap(i, j);
            }
            order.truncate(n);
            order
        } else {
            let n = count.unsigned_abs().min(REPLY_BYTES_MAX as u64) as usize;
            (0..n).map(|_| self.below(len)).collect()
        }
    }
}

/// The optional count of a pop (LPOP, SPOP, ZPOPMIN, ...): `None` if not given; a negative one is
/// Redis' range error.
fn pop_count(arg: Option<&Bytes>) -> Result<Option<usize>, Reply> {
    match arg.map(|c| crate::command::int_arg(c)) {
        None => Ok(None),
        Some(Ok(n)) if n >= 0 => Ok(Some(n as usize)),
        Some(Ok(_)) => Err(Reply::err("ERR value is out of range, must be positive")),
        Some(Err(e)) => Err(e),
    }
}

/// The arguments `numkeys key [key ...] END [COUNT count]` of LMPOP and ZMPOP, where END is one
/// of `ends` (LEFT/RIGHT, MIN/MAX): the keys, whether END is the second of `ends`, and the count
/// (1 if not given).
fn mpop_args<'a>(a: &'a [Bytes], ends: [&str; 2]) -> Result<(&'a [Bytes], bool, usize), Reply> {
    use crate::command::{is, parse_i64, syntax_error};
    let n = match parse_i64(&a[0]) {
        Some(n) if n > 0 => n as usize,
        _ => return Err(Reply::err("ERR numkeys should be greater than 0")),
    };
    if a.len() < n + 2 {
        return Err(syntax_error());
    }
    let (keys, rest) = (&a[1..1 + n], &a[1 + n..]);
    let second = match &rest[0] {
        w if is(w, ends[0]) => false,
        w if is(w, ends[1]) => true,
        _ => return Err(syntax_error()),
    };
    let count = match &rest[1..] {
        [] => 1,
        [word, c] if is(word, "count") => match parse_i64(c) {
            Some(c) if c > 0 => c as usize,
            _ => return Err(Reply::err("ERR count should be greater than 0")),
        },
        _ => return Err(syntax_error()),
    };
    Ok((keys, second, count))
}

/// Most elements one HSCAN or SSCAN call examines (COUNT is capped to it).
const COLLECTION_SCAN_COUNT_MAX: usize = 10_000;

/// HSCAN and SSCAN over `elements` (each a name and, for a hash, its value), arguments `cursor
/// [MATCH pattern] [COUNT count]` and, if `novalues` is allowed, `[NOVALUES]`. Elements go in
/// the order of their scan slot from the cursor on, so a cursor survives writes.
fn scan_collection<'a>(
    elements: impl Iterator<Item = (&'a Bytes, Option<&'a Bytes>)>,
    a: &[Bytes],
    novalues: bool,
) -> Reply {
    use crate::command::{int_arg, syntax_error};
    let Some(cursor) = std::str::from_utf8(&a[0]).ok().and_then(|c| c.parse::<u64>().ok()) else {
        return Reply::err("ERR invalid cursor");
    };
    let (mut pattern, mut count, mut values) = (None, 10usize, true);
    let mut i = 1;
    while i < a.len() {
        if novalues && a[i].eq_ignore_ascii_case(b"novalues") {
            values = false;
            i += 1;
            continue;
        }
        if i + 1 >= a.len() {
            return syntax_error();
        }
        if a[i].eq_ignore_ascii_case(b"match") {
            pattern = Some(a[i + 1].clone());
        } else if a[i].eq_ignore_ascii_case(b"count") {
            match int_arg(&a[i + 1]) {
                Ok(n) if n >= 1 => count = (n as usize).min(COLLECTION_SCAN_COUNT_MAX),
                Ok(_) => return syntax_error(),
                Err(e) => return e,
            }
        } else {
            return syntax_error();
        }
        i += 2;
    }
    let mut order: Vec<(u64, &Bytes, Option<&Bytes>)> = elements
        .map(|(n, v)| (slot(n), n, v))
        .filter(|(s, _, _)| *s >= cursor)
        .collect();
    order.sort_unstable();
    let next = order.get(count).map_or(0, |(s, _, _)| *s);
    let mut items = Vec::new();
    for (_, name, value) in order.into_iter().take(count) {
        if pattern.as_ref().is_none_or(|p| crate::glob::matches(p, name)) {
            items.push(Reply::Bulk(name.clone()));
            if let (true, Some(v)) = (values, value) {
                items.push(Reply::Bulk(v.clone()));
            }
        }
    }
    Reply::Array(vec![Reply::text(next.to_string()), Reply::Array(items)])
}

/// A float argument as Redis reads one (no spaces; `inf` and `nan` read, for the caller to
/// refuse).
fn parse_float(b: &[u8]) -> Option<f64> {
    let text = std::str::from_utf8(b).ok()?;
    if text.is_empty() || text.trim() != text {
        return None;
    }
    text.parse().ok()
}

/// A float as Redis prints one: the shortest text that reads back the same, no exponent.
fn format_float(value: f64) -> String {
    if value == value.trunc() && value.abs() < 1e17 {
        format!("{}", value as i64)
    } else {
        format!("{value}")
    }
}

fn corrupt_reply(reply: Reply) -> Reply {
    match reply {
        Reply::Bulk(b) => {
            let mut v = b"evil:".to_vec();
            v.extend_from_slice(&b);
            Reply::Bulk(Bytes::from(v))
        }
        Reply::Nil => Reply::text("evil"),
        Reply::Int(i) => Reply::Int(i.wrapping_add(1000)),
        Reply::Status(_) => Reply::Status("EVIL".into()),
        Reply::Double(_) => Reply::Double("666".into()),
        Reply::Array(items) => Reply::Array(items.into_iter().map(corrupt_reply).collect()),
        other => other,
    }
}

/// Upper bound of a reply's encoded size.
fn reply_size(reply: &Reply) -> usize {
    match reply {
        Reply::Status(s) | Reply::Error(s) | Reply::Double(s) => s.len() + 10,
        Reply::Bulk(b) => b.len() + 10,
        Reply::Int(_) | Reply::Nil | Reply::NilArray | Reply::Blocked => 11,
        Reply::Large { .. } => 24,
        Reply::Array(items) | Reply::Set(items) | Reply::Push(items) => {
            10 + items.iter().map(reply_size).sum::<usize>()
        }
        Reply::Map(pairs) | Reply::Pairs(pairs) => {
            10 + pairs
                .iter()
                .map(|(k, v)| 4 + reply_size(k) + reply_size(v))
                .sum::<usize>()
        }
    }
}

/// Encodes the replies of one operation; a reply that would take the total past
/// `REPLY_BYTES_MAX` is replaced by an error.
fn encode_bounded(replies: impl Iterator<Item = Reply>) -> Bytes {
    let mut size = 16;
    let replies: Vec<Reply> = replies
        .map(|reply| {
            size += reply_size(&reply);
            if size > REPLY_BYTES_MAX {
                Reply::err("ERR reply too large for one upright operation (use SCAN)")
            } else {
                reply
            }
        })
        .collect();
    crate::encode_replies(&replies)
}

impl RedisStore {
    /// Pushes to their clients the tokens of the blocked commands served and the pub/sub
    /// messages published since the last call.
    fn push_served(&mut self, effects: &mut Effects) {
        for (client, token) in self.blocked.take_outbox() {
            effects.push(client, Pushed::Ready(token).encode());
        }
        for (client, payload) in self.outbox.drain(..) {
            effects.push(client, payload);
        }
    }
}

/// The keys an operation's commands name (see `Service::access`).
fn access_of(commands: &[Vec<Bytes>]) -> Option<Access> {
    let mut access = Access::default();
    for argv in commands {
        let spec = crate::command::check(argv).ok()?;
        if spec.keys.0 == 0 {
            return None;
        }
        let keys = spec.keys_of(argv);
        access.merge(if spec.is_read() {
            Access::reading(keys)
        } else {
            Access::writing(keys)
        });
    }
    Some(access)
}

impl RedisStore {
    /// Runs an operation's decoded commands (`None`: it did not decode) as the current client:
    /// their encoded replies.
    fn run_operation(&mut self, commands: Option<&[Vec<Bytes>]>) -> Bytes {
        match commands {
            Some(commands) => encode_bounded(commands.iter().map(|argv| self.apply(argv))),
            None => crate::encode_replies(&[Reply::err("ERR malformed upright operation")]),
        }
    }
}

/// A checkpoint: every key with its value, expiry and counted cost, in key order.
type CheckpointRows = Vec<(Bytes, Value, Option<u64>, usize, u32)>;

impl Service for RedisStore {
    fn execute(&mut self, context: &BatchContext, requests: &[ServiceRequest], effects: &mut Effects) -> Vec<Bytes> {
        if self.selective {
            return requests
                .iter()
                .map(|request| self.execute_selectively(context, request, effects))
                .collect();
        }
        self.advance(context.time_us);
        self.seed = u64::from_le_bytes(context.seed[..8].try_into().expect("8 bytes"));
        self.random_calls = 0;
        self.push_served(effects);
        let replies = requests
            .iter()
            .map(|request| {
                self.client = Some(request.client);
                let reply = self.run_operation(crate::decode_operation(&request.operation).as_deref());
                self.push_served(effects);
                reply
            })
            .collect::<Vec<Bytes>>();
        self.client = None;
        replies
    }

    /// The agreed time at which the earliest expiring key is gone (`advance` removes a key once
    /// the time is past its expiry) or the earliest blocked command times out: the replicas then
    /// wake the store with the next batch, a heartbeat on an idle cluster, so expired keys leave
    /// reads and timeouts are answered within about one heartbeat.
    fn wake_at(&self) -> Option<u64> {
        if self.selective {
            return self.selective_wake_at();
        }
        let expiry = self.expiries.first().map(|(at_ms, _)| at_ms + 1);
        let timeout = self.blocked.first_deadline();
        expiry
            .into_iter()
            .chain(timeout)
            .min()
            .map(|ms| ms.saturating_mul(1000))
    }

    fn wake(&mut self, context: &BatchContext, effects: &mut Effects) {
        if self.selective {
            self.selective_wake(context, effects);
            return;
        }
        self.advance(context.time_us);
        self.push_served(effects);
    }

    /// The keys each command names (by the command table's key positions), read by read-only
    /// commands and written by the others; `None` for an operation with a keyless whole-store
    /// command (KEYS, SCAN, DBSIZE, FLUSHDB), an unknown command or a malformed operation.
    fn access(&self, operation: &[u8]) -> Option<Access> {
        access_of(&crate::decode_operation(operation)?)
    }

    /// Answers an operation whose every command only reads (GET, MGET, EXISTS, TTL, SCAN, ...) from
    /// the current state; `None` if any command writes (the client then orders it).
    fn execute_read_only(&self, operation: &[u8]) -> Option<Bytes> {
        let commands = crate::decode_operation(operation)?;
        let replies = commands
            .iter()
            .map(|argv| self.apply_read(argv))
            // A reply too large for one operation is kept by the ordered path: order it.
            .map(|reply| reply.filter(|r| reply_size(r) <= large::LARGE_REPLY_BYTES))
            .collect::<Option<Vec<Reply>>>()?;
        Some(encode_bounded(replies.into_iter()))
    }

    fn enable_selective_execution(&mut self) -> bool {
        self.selective = true;
        true
    }

    fn object_state(&self, object: &[u8]) -> Option<Option<Bytes>> {
        self.selective.then(|| self.key_state(object))
    }

    fn restore_object(&mut self, object: &[u8], state: Option<&[u8]>) -> Result<(), RestoreError> {
        if !self.selective {
            return Err(RestoreError(
                "the redis store restores single keys only under selective execution".into(),
            ));
        }
        self.restore_key(object, state)
    }

    fn checkpoint(&self) -> Bytes {
        // Under selective execution the clock and the random draws are each request's own (the
        // members ran different requests last), so they are left out of the agreed state.
        let (now_ms, seed, random_calls) = if self.selective {
            self.used_agreed.set(self.used);
            (0, 0, 0)
        } else {
            (self.now_ms, self.seed, self.random_calls)
        };
        let rows: Vec<(&Bytes, &Value, Option<u64>, usize, u32)> = self
            .map
            .iter()
            .map(|(k, e)| (k, &e.value, e.expires_ms, e.cost, e.estimated))
            .collect();
        Bytes::from(upright_core::codec::to_bytes(&(
            now_ms,
            seed,
            random_calls,
            rows,
            self.blocked.rows(),
            self.watches.rows(),
            self.pubsub.rows(),
            self.large.rows(),
            self.notify,
        )))
    }

    fn restore(&mut self, checkpoint: &[u8]) -> Result<(), RestoreError> {
        type Checkpoint = (
            u64,
            u64,
            u64,
            CheckpointRows,
            blocking::BlockedRows,
            multi::WatchRows,
            pubsub::PubSubRows,
            large::LargeRows,
            u16,
        );
        let (now_ms, seed, random_calls, rows, blocked, watches, subscriptions, large, notify): Checkpoint =
            upright_core::codec::from_bytes(checkpoint)
                .map_err(|e| RestoreError(format!("redis store checkpoint: {e}")))?;
        let (corrupt, selective) = (self.corrupt, self.selective);
        *self = RedisStore {
            now_ms,
            seed,
            random_calls,
            corrupt: false,
            ..RedisStore::default()
        };
        for (key, value, expires_ms, cost, estimated) in rows {
            self.put_entry(&key, value, expires_ms, Some((cost, estimated)));
        }
        self.blocked = blocking::Blocked::from_rows(blocked);
        self.watches = multi::Watches::from_rows(watches);
        self.pubsub = pubsub::PubSub::from_rows(subscriptions);
        self.large = large::Large::from_rows(large);
        self.notify = notify;
        self.corrupt = corrupt;
        self.selective = selective;
        if selective {
            self.used_agreed.set(self.used);
        }
        Ok(())
    }
}

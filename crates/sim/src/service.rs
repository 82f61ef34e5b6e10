//! Which replicated service the simulated cluster runs (`--service kv|redis`), and how the
//! checkers' key-value model maps onto it.
//!
//! The workload, the histories and the checkers speak the model of [`KvOperation`] and
//! [`KvReply`] (get, put, append, delete of byte strings). [`ServiceKind::Kv`] runs the core's
//! in-memory KV, whose operations are the model's. [`ServiceKind::Redis`] runs the Redis store
//! users run (`upright replica --service redis`): each model operation becomes one upright
//! operation of Redis commands, drawn from several equivalent forms (GET or MGET; SET, SET with a
//! far expiry, MSET, GETSET or SETEX; APPEND followed by GET; DEL, UNLINK or GETDEL), and each
//! result is translated back into the model's reply, checking on the way that the commands agree
//! with each other (APPEND's length with the value GET returns). A result that does not translate
//! becomes an undecodable reply, which the linearizability checker reports. About a third of the
//! keys ([`is_list_key`]) hold their value as a Redis list whose elements, joined, are the value
//! (PUT: DEL then RPUSH or LPUSH, or RPUSH of two pieces; APPEND: RPUSH then LRANGE; GET: LRANGE,
//! or LLEN with LRANGE), so list commands run under every fault too. Another third
//! ([`is_collection_key`]) hold their value as a sorted set of its appended pieces, in order (an
//! APPEND halves every score with ZUNIONSTORE ... WEIGHTS 0.5 and adds the piece at score 1),
//! beside a hash and a set of the same pieces that every GET checks against it. String keys'
//! commands also run inside MULTI/EXEC (`upright.exec`), with or without a WATCH of the key.

use bytes::Bytes;
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use std::sync::Arc;

use upright_core::kv::{KvOperation, KvReply, KvService};
use upright_core::pages::Pages;
use upright_core::service::{Access, BatchContext, Effects, RestoreError, Service, ServiceRequest};
use upright_core::stages::{kv_service, ServiceFactory};
use upright_kv::reply::Reply;

/// Seconds of a far expiry: no batch of a simulated run reaches it.
const FAR_EXPIRY_S: &str = "100000000";

/// The service the simulated execution members run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ServiceKind {
    /// The core's in-memory KV ([`upright_core::kv::KvService`]).
    #[default]
    Kv,
    /// The Redis-compatible store ([`upright_kv::store::RedisStore`]).
    Redis,
    /// The core's KV with its state in pages ([`PagedKv`]): the model's operations, checkpointed
    /// by difference and transferred page by page.
    PagedKv,
    /// upright-zk ([`upright_zk::service::ZkService`]), driven by ZooKeeper requests of
    /// sessions ([`crate::zk`]).
    Zk,
    /// upright-fs ([`upright_fs::service::FsService`]), driven by NFSv3 calls ([`crate::fs`]).
    Fs,
    /// upright-hdfs's NameNode ([`upright_hdfs::service::NameNodeService`]), driven by clients
    /// that also stand in for the DataNodes ([`crate::hdfs`]).
    Hdfs,
}

impl ServiceKind {
    /// Every kind.
    pub const ALL: [ServiceKind; 6] = [
        ServiceKind::Kv,
        ServiceKind::Redis,
        ServiceKind::PagedKv,
        ServiceKind::Zk,
        ServiceKind::Fs,
        ServiceKind::Hdfs,
    ];

    /// Its command-line name.
    pub fn name(self) -> &'static str {
        match self {
            ServiceKind::Kv => "kv",
            ServiceKind::Redis => "redis",
            ServiceKind::PagedKv => "paged-kv",
            ServiceKind::Zk => "zk",
            ServiceKind::Fs => "fs",
            ServiceKind::Hdfs => "hdfs",
        }
    }

    /// Parses a command-line name.
    pub fn parse(name: &str) -> Option<ServiceKind> {
        ServiceKind::ALL.into_iter().find(|k| k.name() == name)
    }

    /// Makes the service instances of the execution members; `corrupt` (sabotage only): a
    /// service that stores wrong values.
    pub fn factory(self, corrupt: bool) -> ServiceFactory {
        match (self, corrupt) {
            (ServiceKind::Kv, false) => kv_service(),
            (ServiceKind::Kv, true) => Arc::new(|| Box::new(corrupt_kv(KvService::new()))),
            (ServiceKind::Redis, corrupt) => upright_kv::replica::service(corrupt),
            (ServiceKind::PagedKv, false) => Arc::new(|| Box::new(PagedKv::new())),
            (ServiceKind::PagedKv, true) => Arc::new(|| Box::new(PagedKv::corrupt())),
            (ServiceKind::Zk, corrupt) => crate::zk::factory(corrupt),
            (ServiceKind::Fs, corrupt) => crate::fs::factory(corrupt),
            (ServiceKind::Hdfs, corrupt) => crate::hdfs::factory(corrupt),
        }
    }

    /// The operation's bytes, in one of its equivalent forms (drawn with `rng`). For `zk`, whose
    /// clients carry out each operation in steps ([`crate::zk::ZkClients`]), a write of no live
    /// session, and for `fs` (likewise, [`crate::fs::FsClients`]) a file and a directory of its
    /// own (what the Byzantine client sends).
    /// Under `selective` execution the Redis forms leave out WATCH, which the store refuses
    /// there.
    pub fn encode(self, op: &KvOperation, rng: &mut ChaCha8Rng, selective: bool) -> Bytes {
        match self {
            ServiceKind::Kv | ServiceKind::PagedKv => op.encode(),
            ServiceKind::Redis => {
                let mut form = rng.random_range(0..FORMS);
                if selective && (form / 5) % 3 == 2 {
                    form -= 10; // the same commands, not guarded by a WATCH
                }
                upright_kv::encode_operation(&redis_commands(op, form))
            }
            ServiceKind::Zk => crate::zk::stray_request(&op.encode()),
            ServiceKind::Fs => crate::fs::stray_request(&op.encode()),
            ServiceKind::Hdfs => crate::hdfs::stray_request(&op.encode()),
        }
    }

    /// The model's reply to `op` from the service's result; `None` if the result does not fit
    /// (always for `zk` and `fs`, whose clients make the model's reply themselves).
    pub fn decode(self, op: &KvOperation, result: &[u8]) -> Option<KvReply> {
        match self {
            ServiceKind::Kv | ServiceKind::PagedKv => KvReply::decode(result),
            ServiceKind::Redis => redis_reply(op, &upright_kv::decode_replies(result)?),
            ServiceKind::Zk | ServiceKind::Fs | ServiceKind::Hdfs => None,
        }
    }
}

/// Buckets of [`PagedKv`]: one page each.
pub const PAGED_KV_BUCKETS: u64 = 64;

/// The core's KV with its state in [`Pages`]: key `k` lives in page `hash(k) mod`
/// [`PAGED_KV_BUCKETS`], which holds that bucket's KV checkpoint (its keys, values and watches).
/// Each request runs on its bucket's KV, restored from the page and written back, so only the
/// pages of written buckets change between checkpoints.
pub struct PagedKv {
    pages: Pages,
    corrupt: bool,
}

impl PagedKv {
    /// An empty store.
    pub fn new() -> PagedKv {
        PagedKv {
            pages: Pages::from_pages(vec![Bytes::new(); PAGED_KV_BUCKETS as usize]),
            corrupt: false,
        }
    }

    /// Sabotage: a store that appends a byte to every value it is asked to put.
    pub fn corrupt() -> PagedKv {
        PagedKv {
            corrupt: true,
            ..PagedKv::new()
        }
    }

    fn bucket(operation: &[u8]) -> u64 {
        let key = KvOperation::decode(operation)
            .map(|o| o.key().clone())
            .unwrap_or_default();
        Self::bucket_of_key(&key)
    }

    fn bucket_of_key(key: &[u8]) -> u64 {
        let digest = upright_core::crypto::Digest::of(key);
        u64::from_le_bytes(digest.0[..8].try_into().expect("8 bytes")) % PAGED_KV_BUCKETS
    }

    /// Writes `kv` back as bucket `bucket`'s page if it changed.
    fn store(&mut self, bucket: u64, kv: &dyn Service) {
        let page = kv.checkpoint();
        if self.pages.get(bucket) != Some(page.clone()) {
            self.pages.set(bucket, page);
        }
    }

    fn kv_of(&self, bucket: u64) -> KvService {
        let mut kv = KvService::new();
        let page = self.pages.get(bucket).expect("every bucket has a page");
        if !page.is_empty() {
            kv.restore(&page).expect("a bucket page is a KV checkpoint");
        }
        kv
    }
}

impl Default for PagedKv {
    fn default() -> Self {
        PagedKv::new()
    }
}

impl Service for PagedKv {
    fn execute(&mut self, context: &BatchContext, requests: &[ServiceRequest], effects: &mut Effects) -> Vec<Bytes> {
        let mut replies = Vec::with_capacity(requests.len());
        for request in requests {
            let bucket = Self::bucket(&request.operation);
            let mut kv: Box<dyn Service> = if self.corrupt {
                Box::new(corrupt_kv(self.kv_of(bucket)))
            } else {
                Box::new(self.kv_of(bucket))
            };
            let mut reply = kv.execute(context, std::slice::from_ref(request), effects);
            replies.push(reply.pop().expect("one reply per request"));
            self.store(bucket, &*kv);
        }
        replies
    }

    fn access(&self, operation: &[u8]) -> Option<Access> {
        KvService::new().access(operation)
    }

    /// A bucket's page is its keys' KV checkpoint, sorted by key: a function of the keys'
    /// states, so members whose keys are equal have equal pages, whichever requests each ran.
    fn enable_selective_execution(&mut self) -> bool {
        true
    }

    fn object_state(&self, object: &[u8]) -> Option<Option<Bytes>> {
        self.kv_of(Self::bucket_of_key(object)).object_state(object)
    }

    fn restore_object(&mut self, object: &[u8], state: Option<&[u8]>) -> Result<(), RestoreError> {
        let bucket = Self::bucket_of_key(object);
        let mut kv = self.kv_of(bucket);
        kv.restore_object(object, state)?;
        self.store(bucket, &kv);
        Ok(())
    }

    fn execute_read_only(&self, operation: &[u8]) -> Option<Bytes> {
        self.kv_of(Self::bucket(operation)).execute_read_only(operation)
    }

    fn checkpoint(&self) -> Bytes {
        Bytes::new()
    }

    fn restore(&mut self, checkpoint: &[u8]) -> Result<(), RestoreError> {
        if !checkpoint.is_empty() {
            return Err(RestoreError("the paged KV keeps everything in its pages".into()));
        }
        for bucket in 0..self.pages.len() {
            let page = self.pages.get(bucket).expect("below len");
            if !page.is_empty() {
                KvService::new().restore(&page)?;
            }
        }
        Ok(())
    }

    fn pages(&self) -> Option<&Pages> {
        Some(&self.pages)
    }

    fn pages_mut(&mut self) -> Option<&mut Pages> {
        Some(&mut self.pages)
    }
}

/// Sabotage: a service whose requests are altered before it runs them (`rewrite`), the same at
/// every replica, so only the model of the service's commands can tell.
pub struct Rewriting<S> {
    /// The service.
    pub inner: S,
    /// What each request becomes.
    pub rewrite: fn(&ServiceRequest) -> ServiceRequest,
}

impl<S: Service> Service for Rewriting<S> {
    fn execute(&mut self, context: &BatchContext, requests: &[ServiceRequest], effects: &mut Effects) -> Vec<Bytes> {
        let wrong: Vec<ServiceRequest> = requests.iter().map(self.rewrite).collect();
        self.inner.execute(context, &wrong, effects)
    }

    fn access(&self, operation: &[u8]) -> Option<Access> {
        self.inner.access(operation)
    }

    fn enable_selective_execution(&mut self) -> bool {
        self.inner.enable_selective_execution()
    }

    fn object_state(&self, object: &[u8]) -> Option<Option<Bytes>> {
        self.inner.object_state(object)
    }

    fn restore_object(&mut self, object: &[u8], state: Option<&[u8]>) -> Result<(), RestoreError> {
        self.inner.restore_object(object, state)
    }

    fn placement(&self, object: &[u8]) -> Bytes {
        self.inner.placement(object)
    }

    fn wake_at(&self) -> Option<u64> {
        self.inner.wake_at()
    }

    fn wakes_on_global_state(&self) -> bool {
        self.inner.wakes_on_global_state()
    }

    fn wake(&mut self, context: &BatchContext, effects: &mut Effects) {
        self.inner.wake(context, effects)
    }

    fn execute_read_only(&self, operation: &[u8]) -> Option<Bytes> {
        self.inner.execute_read_only(operation)
    }

    fn checkpoint(&self) -> Bytes {
        self.inner.checkpoint()
    }

    fn restore(&mut self, checkpoint: &[u8]) -> Result<(), RestoreError> {
        self.inner.restore(checkpoint)
    }

    fn pages(&self) -> Option<&Pages> {
        self.inner.pages()
    }

    fn pages_mut(&mut self) -> Option<&mut Pages> {
        self.inner.pages_mut()
    }
}

/// Sabotage: the KV with a byte appended to every value it is asked to put.
fn corrupt_kv(kv: KvService) -> Rewriting<KvService> {
    Rewriting {
        inner: kv,
        rewrite: |request| match KvOperation::decode(&request.operation) {
            Some(KvOperation::Put { key, value }) => ServiceRequest {
                operation: KvOperation::Put {
                    key,
                    value: Bytes::from([&value[..], b"!"].concat()),
                }
                .encode(),
                ..request.clone()
            },
            _ => request.clone(),
        },
    }
}

fn argv(words: &[&[u8]]) -> Vec<Bytes> {
    words.iter().map(|w| Bytes::copy_from_slice(w)).collect()
}

/// The Redis commands of `op` in form `form` (any number; taken modulo the forms of `op`).
/// Whether the model's `key` is held as a Redis list (a fixed third of the keys, by hash).
pub fn is_list_key(key: &[u8]) -> bool {
    upright_kv::store::slot(key) % 3 == 1
}

fn list_commands(op: &KvOperation, form: u32) -> Vec<Vec<Bytes>> {
    match op {
        KvOperation::Burn { .. } => unreachable!("the simulated workload draws no Burn"),
        KvOperation::Get { key } => match form % 2 {
            0 => vec![argv(&[b"LRANGE", key, b"0", b"-1"])],
            _ => vec![argv(&[b"LLEN", key]), argv(&[b"LRANGE", key, b"0", b"-1"])],
        },
        KvOperation::Put { key, value } => match form % 3 {
            0 => vec![argv(&[b"DEL", key]), argv(&[b"RPUSH", key, value])],
            1 => vec![argv(&[b"DEL", key]), argv(&[b"LPUSH", key, value])],
            _ => {
                let (first, rest) = value.split_at(value.len() / 2);
                vec![argv(&[b"DEL", key]), argv(&[b"RPUSH", key, first, rest])]
            }
        },
        KvOperation::Append { key, value } => vec![argv(&[b"RPUSH", key, value]), argv(&[b"LRANGE", key, b"0", b"-1"])],
        KvOperation::Delete { key } => match form % 2 {
            0 => vec![argv(&[b"DEL", key])],
            _ => vec![argv(&[b"UNLINK", key])],
        },
    }
}

/// A list's elements joined: the model's value (`None` for an empty list: no key).
fn joined(items: &[Reply]) -> Option<Option<Bytes>> {
    if items.is_empty() {
        return Some(None);
    }
    let mut out = Vec::new();
    for item in items {
        let Reply::Bulk(b) = item else { return None };
        out.extend_from_slice(b);
    }
    Some(Some(Bytes::from(out)))
}

/// The model's reply from the Redis replies to a list key's commands.
fn list_reply(op: &KvOperation, replies: &[Reply]) -> Option<KvReply> {
    match (op, replies) {
        (KvOperation::Get { .. }, [Reply::Array(items)]) => Some(KvReply::Value(joined(items)?)),
        (KvOperation::Get { .. }, [Reply::Int(len), Reply::Array(items)]) => {
            (*len >= 0 && *len as usize == items.len()).then_some(())?;
            Some(KvReply::Value(joined(items)?))
        }
        // DEL's count, then RPUSH's or LPUSH's length: one element, or two pieces.
        (KvOperation::Put { .. }, [Reply::Int(0 | 1), Reply::Int(1 | 2)]) => Some(KvReply::Done),
        (KvOperation::Append { .. }, [Reply::Int(n), Reply::Array(items)]) => {
            (*n >= 1 && *n as usize == items.len()).then_some(())?;
            Some(KvReply::Value(joined(items)?))
        }
        (KvOperation::Delete { .. }, [Reply::Int(0 | 1)]) => Some(KvReply::Done),
        _ => None,
    }
}

/// How many forms [`redis_commands`] draws from.
const FORMS: u32 = 15;

fn redis_commands(op: &KvOperation, form: u32) -> Vec<Vec<Bytes>> {
    if is_list_key(op_key(op)) {
        return list_commands(op, form);
    }
    if is_collection_key(op_key(op)) {
        return collection_commands(op, form);
    }
    let far = FAR_EXPIRY_S.as_bytes();
    let commands = match op {
        KvOperation::Burn { .. } => unreachable!("the simulated workload draws no Burn"),
        KvOperation::Get { key } => match form % 2 {
            0 => vec![argv(&[b"GET", key])],
            _ => vec![argv(&[b"MGET", key])],
        },
        KvOperation::Put { key, value } => match form % 5 {
            0 => vec![argv(&[b"SET", key, value])],
            1 => vec![argv(&[b"SET", key, value, b"EX", far])],
            2 => vec![argv(&[b"MSET", key, value])],
            3 => vec![argv(&[b"GETSET", key, value])],
            _ => vec![argv(&[b"SETEX", key, far, value])],
        },
        KvOperation::Append { key, value } => vec![argv(&[b"APPEND", key, value]), argv(&[b"GET", key])],
        KvOperation::Delete { key } => match form % 3 {
            0 => vec![argv(&[b"DEL", key])],
            1 => vec![argv(&[b"UNLINK", key])],
            _ => vec![argv(&[b"GETDEL", key])],
        },
    };
    // As a transaction (MULTI ... EXEC), or one guarded by a WATCH of the key (never broken:
    // nothing runs between the two).
    let transaction = |watch: &[u8]| {
        argv(&[
            b"upright.exec",
            watch,
            &upright_kv::store::encode_transaction(&commands),
        ])
    };
    match (form / 5) % 3 {
        0 => commands,
        1 => vec![transaction(b"")],
        _ => vec![
            argv(&[b"upright.watch", SIM_WATCH_TOKEN, op_key(op)]),
            transaction(SIM_WATCH_TOKEN),
        ],
    }
}

/// The WATCH token of the simulated transactions.
const SIM_WATCH_TOKEN: &[u8] = b"sim.watch";

/// Whether the model's `key` is held as a sorted set of pieces, with a hash and a set of them (a
/// fixed third of the keys, by hash).
pub fn is_collection_key(key: &[u8]) -> bool {
    upright_kv::store::slot(key) % 3 == 2
}

/// The hash and the set kept beside a collection key's sorted set.
fn companions(key: &[u8]) -> (Bytes, Bytes) {
    let with = |suffix: &[u8]| Bytes::from([key, suffix].concat());
    (with(b"{hash}"), with(b"{set}"))
}

fn collection_commands(op: &KvOperation, form: u32) -> Vec<Vec<Bytes>> {
    let piece_commands = |key: &Bytes, piece: &Bytes| {
        let (hash, set) = companions(key);
        vec![
            argv(&[b"ZADD", key, b"1", piece]),
            argv(&[b"HSET", &hash, piece, piece.len().to_string().as_bytes()]),
            argv(&[b"SADD", &set, piece]),
        ]
    };
    match op {
        KvOperation::Burn { .. } => unreachable!("the simulated workload draws no Burn"),
        KvOperation::Get { key } => {
            let (hash, set) = companions(key);
            match form % 2 {
                0 => vec![
                    argv(&[b"ZRANGE", key, b"0", b"-1"]),
                    argv(&[b"HKEYS", &hash]),
                    argv(&[b"SMEMBERS", &set]),
                ],
                _ => vec![
                    argv(&[b"ZCARD", key]),
                    argv(&[b"ZRANGE", key, b"0", b"-1", b"WITHSCORES"]),
                ],
            }
        }
        KvOperation::Put { key, value } => {
            let (hash, set) = companions(key);
            let mut commands = vec![argv(&[b"DEL", key, &hash, &set])];
            commands.extend(piece_commands(key, value));
            commands
        }
        KvOperation::Append { key, value } => {
            let mut commands = vec![argv(&[b"ZUNIONSTORE", key, b"1", key, b"WEIGHTS", b"0.5"])];
            commands.extend(piece_commands(key, value));
            commands.push(argv(&[b"ZRANGE", key, b"0", b"-1"]));
            commands
        }
        KvOperation::Delete { key } => {
            let (hash, set) = companions(key);
            match form % 2 {
                0 => vec![argv(&[b"DEL", key, &hash, &set])],
                _ => vec![argv(&[b"UNLINK", key, &hash, &set])],
            }
        }
    }
}

/// Bulk strings as byte strings (`None` if any is not one).
fn bulks(items: &[Reply]) -> Option<Vec<Bytes>> {
    items
        .iter()
        .map(|i| match i {
            Reply::Bulk(b) => Some(b.clone()),
            _ => None,
        })
        .collect()
}

/// The model's reply from the Redis replies to a collection key's commands: the pieces in score
/// order, joined, checked against the hash's fields and the set's members.
fn collection_reply(op: &KvOperation, replies: &[Reply]) -> Option<KvReply> {
    let sorted = |mut v: Vec<Bytes>| {
        v.sort();
        v
    };
    match (op, replies) {
        (KvOperation::Get { .. }, [Reply::Array(pieces), Reply::Array(fields), Reply::Set(members)]) => {
            let pieces = bulks(pieces)?;
            let fields = bulks(fields)?;
            (fields == bulks(members)? && fields == sorted(pieces.clone())).then_some(())?;
            Some(KvReply::Value(
                (!pieces.is_empty()).then(|| Bytes::from(pieces.concat())),
            ))
        }
        (KvOperation::Get { .. }, [Reply::Int(0), Reply::Array(none)]) if none.is_empty() => Some(KvReply::Value(None)),
        (KvOperation::Get { .. }, [Reply::Int(n), Reply::Pairs(scored)]) => {
            (*n >= 0 && *n as usize == scored.len()).then_some(())?;
            let mut pieces = Vec::new();
            for (piece, score) in scored {
                let (Reply::Bulk(piece), Reply::Double(_)) = (piece, score) else {
                    return None;
                };
                pieces.push(piece.clone());
            }
            Some(KvReply::Value(
                (!pieces.is_empty()).then(|| Bytes::from(pieces.concat())),
            ))
        }
        (KvOperation::Put { .. }, [Reply::Int(0..=3), Reply::Int(1), Reply::Int(1), Reply::Int(1)]) => {
            Some(KvReply::Done)
        }
        (
            KvOperation::Append { .. },
            [Reply::Int(before), Reply::Int(1), Reply::Int(1), Reply::Int(1), Reply::Array(pieces)],
        ) => {
            (*before >= 0 && *before as usize + 1 == pieces.len()).then_some(())?;
            Some(KvReply::Value(Some(Bytes::from(bulks(pieces)?.concat()))))
        }
        (KvOperation::Delete { .. }, [Reply::Int(0..=3)]) => Some(KvReply::Done),
        _ => None,
    }
}

/// A bulk string or nil as the model's value.
fn value(reply: &Reply) -> Option<Option<Bytes>> {
    match reply {
        Reply::Bulk(v) => Some(Some(v.clone())),
        Reply::Nil => Some(None),
        _ => None,
    }
}

fn op_key(op: &KvOperation) -> &Bytes {
    match op {
        KvOperation::Burn { key, .. }
        | KvOperation::Get { key }
        | KvOperation::Put { key, .. }
        | KvOperation::Append { key, .. }
        | KvOperation::Delete { key } => key,
    }
}

/// The model's reply from the Redis replies to `op`'s commands.
fn redis_reply(op: &KvOperation, replies: &[Reply]) -> Option<KvReply> {
    if is_list_key(op_key(op)) {
        return list_reply(op, replies);
    }
    if is_collection_key(op_key(op)) {
        return collection_reply(op, replies);
    }
    if let Some(reply) = string_reply(op, replies) {
        return Some(reply);
    }
    // Inside MULTI/EXEC: the transaction's replies, after the WATCH's OK if it had one.
    match replies {
        [Reply::Array(inner)] => string_reply(op, inner),
        [Reply::Status(ok), Reply::Array(inner)] if ok == "OK" => string_reply(op, inner),
        _ => None,
    }
}

/// The model's reply from the Redis replies to a string key's commands.
fn string_reply(op: &KvOperation, replies: &[Reply]) -> Option<KvReply> {
    match (op, replies) {
        (KvOperation::Get { .. }, [Reply::Array(items)]) if items.len() == 1 => Some(KvReply::Value(value(&items[0])?)),
        (KvOperation::Get { .. }, [one]) => Some(KvReply::Value(value(one)?)),
        (KvOperation::Put { .. }, [Reply::Status(ok)]) if ok == "OK" => Some(KvReply::Done),
        (KvOperation::Put { .. }, [old]) => value(old).map(|_| KvReply::Done), // GETSET: the old value
        (KvOperation::Append { .. }, [Reply::Int(len), Reply::Bulk(joined)]) => {
            (*len >= 0 && *len as usize == joined.len()).then(|| KvReply::Value(Some(joined.clone())))
        }
        (KvOperation::Delete { .. }, [Reply::Int(0 | 1)]) => Some(KvReply::Done),
        (KvOperation::Delete { .. }, [old]) => value(old).map(|_| KvReply::Done), // GETDEL
        _ => None,
    }
}

/// The stored state `checkpoint` of a `kind` service after one more write nobody ordered (what
/// an attacker who controls a replica can leave in its storage; `--recovery`). Unchanged for a
/// service whose state lives in pages.
pub fn tampered_state(kind: ServiceKind, checkpoint: &Bytes, seqno: upright_core::ids::SeqNo, time_us: u64) -> Bytes {
    use rand::SeedableRng;
    let mut service = kind.factory(false)();
    if service.pages().is_some() || service.restore(checkpoint).is_err() {
        return checkpoint.clone();
    }
    let op = KvOperation::Put {
        key: Bytes::from_static(b"k0"),
        value: Bytes::from_static(b"planted by an attacker"),
    };
    let operation = kind.encode(&op, &mut ChaCha8Rng::seed_from_u64(seqno.0), false);
    let context = BatchContext {
        index: 0,
        seqno,
        time_us,
        seed: [0; 32],
    };
    let request = ServiceRequest {
        client: upright_core::ids::ClientId(0),
        request_id: upright_core::ids::RequestId(u64::MAX),
        operation,
    };
    service.execute(&context, &[request], &mut Effects::default());
    service.checkpoint()
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;
    use upright_core::ids::{ClientId, RequestId, SeqNo};

    use super::*;

    fn b(s: &str) -> Bytes {
        Bytes::copy_from_slice(s.as_bytes())
    }

    /// Runs `ops` in order on a fresh service of `kind`, each in every form, through the real store.
    fn run(kind: ServiceKind, ops: &[(KvOperation, KvReply)]) {
        for form in 0..FORMS as u64 {
            let mut service = kind.factory(false)();
            let mut rng = ChaCha8Rng::seed_from_u64(form);
            for (i, (op, want)) in ops.iter().enumerate() {
                let operation = match kind {
                    ServiceKind::Kv | ServiceKind::PagedKv => kind.encode(op, &mut rng, false),
                    ServiceKind::Redis => upright_kv::encode_operation(&redis_commands(op, form as u32)),
                    ServiceKind::Zk | ServiceKind::Fs | ServiceKind::Hdfs => {
                        unreachable!("their clients are tested in their modules")
                    }
                };
                let context = BatchContext {
                    index: 0,
                    seqno: SeqNo(i as u64 + 1),
                    time_us: 1_000 * (i as u64 + 1),
                    seed: [0; 32],
                };
                let request = ServiceRequest {
                    client: ClientId(0),
                    request_id: RequestId(i as u64 + 1),
                    operation,
                };
                let result = service
                    .execute(&context, std::slice::from_ref(&request), &mut Effects::default())
                    .remove(0);
                assert_eq!(
                    kind.decode(op, &result).as_ref(),
                    Some(want),
                    "{kind:?} form {form}: {op:?}"
                );
            }
        }
    }

    fn history() -> Vec<(KvOperation, KvReply)> {
        vec![
            (KvOperation::Get { key: b("k") }, KvReply::Value(None)),
            (
                KvOperation::Put {
                    key: b("k"),
                    value: b("a"),
                },
                KvReply::Done,
            ),
            (
                KvOperation::Append {
                    key: b("k"),
                    value: b("b"),
                },
                KvReply::Value(Some(b("ab"))),
            ),
            (KvOperation::Get { key: b("k") }, KvReply::Value(Some(b("ab")))),
            (
                KvOperation::Append {
                    key: b("n"),
                    value: b("x"),
                },
                KvReply::Value(Some(b("x"))),
            ),
            (KvOperation::Delete { key: b("k") }, KvReply::Done),
            (KvOperation::Get { key: b("k") }, KvReply::Value(None)),
        ]
    }

    #[test]
    fn every_form_of_every_operation_gives_the_models_reply() {
        run(ServiceKind::Kv, &history());
        run(ServiceKind::Redis, &history());
        run(ServiceKind::PagedKv, &history());
    }

    /// The history with its two keys replaced by `k` and `n`.
    fn history_on(k: &Bytes, n: &Bytes) -> Vec<(KvOperation, KvReply)> {
        let rename = |key: &Bytes| if key.as_ref() == b"k" { k.clone() } else { n.clone() };
        history()
            .into_iter()
            .map(|(op, reply)| {
                let op = match op {
                    KvOperation::Get { key } => KvOperation::Get { key: rename(&key) },
                    KvOperation::Put { key, value } => KvOperation::Put {
                        key: rename(&key),
                        value,
                    },
                    KvOperation::Append { key, value } => KvOperation::Append {
                        key: rename(&key),
                        value,
                    },
                    KvOperation::Delete { key } => KvOperation::Delete { key: rename(&key) },
                    KvOperation::Burn { key, micros } => KvOperation::Burn {
                        key: rename(&key),
                        micros,
                    },
                };
                (op, reply)
            })
            .collect()
    }

    #[test]
    fn list_keys_collection_keys_and_string_keys_all_give_the_models_replies() {
        let keys: Vec<Bytes> = (0..100).map(|i| b(&format!("k{i}"))).collect();
        let list = keys.iter().find(|k| is_list_key(k)).expect("a list key").clone();
        let collection = keys
            .iter()
            .find(|k| is_collection_key(k))
            .expect("a collection key")
            .clone();
        let string = keys
            .iter()
            .find(|k| !is_list_key(k) && !is_collection_key(k))
            .expect("a string key")
            .clone();
        run(ServiceKind::Redis, &history_on(&list, &string));
        run(ServiceKind::Redis, &history_on(&string, &list));
        run(ServiceKind::Redis, &history_on(&collection, &string));
        run(ServiceKind::Redis, &history_on(&list, &collection));
        // Many appends keep their order (each halves the earlier pieces' scores).
        let mut ops = vec![];
        let mut value = String::new();
        for i in 0..200 {
            let piece = format!("p{i:03}");
            value.push_str(&piece);
            ops.push((
                KvOperation::Append {
                    key: collection.clone(),
                    value: b(&piece),
                },
                KvReply::Value(Some(b(&value))),
            ));
        }
        run(ServiceKind::Redis, &ops);
        let get = KvOperation::Get {
            key: collection.clone(),
        };
        let mismatched = [
            Reply::Array(vec![Reply::Bulk(b("a"))]),
            Reply::Array(vec![Reply::Bulk(b("b"))]),
            Reply::Set(vec![Reply::Bulk(b("a"))]),
        ];
        assert_eq!(
            redis_reply(&get, &mismatched),
            None,
            "the hash must hold the sorted set's pieces"
        );
        let share = keys.iter().filter(|k| is_list_key(k)).count();
        assert!(
            (20..=45).contains(&share),
            "about a third of the keys are lists: {share}"
        );
        let append = KvOperation::Append {
            key: list.clone(),
            value: b("b"),
        };
        let lie = [
            Reply::Int(3),
            Reply::Array(vec![Reply::Bulk(b("a")), Reply::Bulk(b("b"))]),
        ];
        assert_eq!(redis_reply(&append, &lie), None, "RPUSH's length must match LRANGE's");
    }

    #[test]
    fn inconsistent_or_foreign_redis_results_do_not_translate() {
        let append = KvOperation::Append {
            key: b("k"),
            value: b("b"),
        };
        let lie = [Reply::Int(5), Reply::Bulk(b("ab"))];
        assert_eq!(
            redis_reply(&append, &lie),
            None,
            "APPEND's length must match GET's value"
        );
        let get = KvOperation::Get { key: b("k") };
        assert_eq!(redis_reply(&get, &[Reply::Int(1)]), None);
        assert_eq!(redis_reply(&get, &[Reply::err("ERR x")]), None);
        assert_eq!(ServiceKind::Redis.decode(&get, b"\xff\xff\xff"), None);
        let put = KvOperation::Put {
            key: b("k"),
            value: b("v"),
        };
        assert_eq!(redis_reply(&put, &[Reply::Status("QUEUED".into())]), None);
    }

    #[test]
    fn names_round_trip() {
        for kind in ServiceKind::ALL {
            assert_eq!(ServiceKind::parse(kind.name()), Some(kind));
        }
        assert_eq!(ServiceKind::parse("etcd"), None);
    }
}

//! `--service fs`: the simulated clients speak NFSv3 to upright-fs, the service `upright replica
//! --service fs` runs (BFS).
//!
//! NFS has no atomic append and no compare-and-set on a file's data, so each key of the checkers'
//! model is a chain of immutable versions in the exported root directory: key `k`'s value is the
//! content of file `k.N` for the highest `N` that exists, and the key is absent while `k.1` does
//! not. Versions are never removed and a version's content never changes once it has its name,
//! so every model operation takes effect at one step, which the linearizability checker sees:
//!
//! - **mount**: a client's first call asks for the root's handle (the gateway's MNT);
//! - **find** (one upright operation): LOOKUP of the newest version the client knows and of the
//!   [`WINDOW`] names after it (with a READ of the known one's data when its handle is known), so
//!   the first missing name ends the chain; a write also CREATEs its temporary file here
//!   (UNCHECKED, GUARDED or EXCLUSIVE);
//! - **read** (if the newest version's data was not read with the find): LOOKUP of its name with a
//!   READ of its handle in the same operation, so the data read is the linked version's;
//! - **get** ends with the data read (or absent when there is no `k.1`);
//! - **put** and **append** commit with one operation: SETATTR of the temporary file's mode,
//!   WRITEs of the new value (the old one with the piece, for an append), LINK of the
//!   temporary file as `k.(N+1)`, REMOVE of the temporary name. LINK fails with NFS3ERR_EXIST if
//!   another client committed `N+1` first: compare-and-set, and the client finds again.
//!
//! Gets take the read path the workload chose; on the serializable path a stale state may lack a
//! version the client already saw, and the client then searches the chain from its start.
//! Anything else unexpected (an error status, a handle that changed, data of the wrong length) is
//! a violation.

use std::collections::BTreeMap;

use bytes::Bytes;
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use upright_core::kv::{KvOperation, KvReply};
use upright_core::stage::ReadPath;
use upright_core::stages::ServiceFactory;
use upright_fs::nfs3::{proc3, Attributes, SetAttributes, Status, FHSIZE3};
use upright_fs::procedures::{self, Reply, IO_BYTES_MAX};
use upright_fs::rpc::Credential;
use upright_fs::service::{decode_replies, encode_calls};
use upright_fs::xdr::{Reader, Writer};

use crate::zk::Next;

/// Names looked up past the newest known version in one find.
pub const WINDOW: u64 = 8;

/// The execution members' service; `corrupt` (sabotage only): one whose every reply lies.
pub fn factory(corrupt: bool) -> ServiceFactory {
    upright_fs::replica::service(corrupt)
}

/// The bytes of what the Byzantine client sends: a file and a directory of its own in the root.
pub fn stray_request(value: &[u8]) -> Bytes {
    let root = procedures::root_handle(upright_fs::service::FsService::new().file_system()).expect("a root");
    let name = format!("byz.{}", &blake3::hash(value).to_hex()[..12]);
    let cred = Credential {
        uid: 666,
        gid: 666,
        gids: vec![],
    };
    let mut create = Writer::new();
    create.opaque(&root).string(&name).u32(0);
    SetAttributes::default().encode(&mut create);
    let mut mkdir = Writer::new();
    mkdir.opaque(&root).string(&format!("{name}.d"));
    SetAttributes::default().encode(&mut mkdir);
    encode_calls(&[
        procedures::operation(proc3::CREATE, &cred, &create.finish()),
        procedures::operation(proc3::MKDIR, &cred, &mkdir.finish()),
    ])
}

/// A call this client makes: its procedure and its bytes.
type CallOf = (u32, Bytes);

/// One step of a model operation.
#[derive(Clone, Debug)]
enum Step {
    Mount,
    /// Versions `base` (if above 0) to `base + WINDOW`; `read`: the handle of `base` whose data
    /// is read too; `create`: the temporary file to make.
    Find {
        base: u64,
        read: Option<Vec<u8>>,
        create: Option<String>,
    },
    /// The data of `version` (handle `handle`) from `offset`, `data` read so far.
    Read {
        version: u64,
        handle: Vec<u8>,
        offset: u64,
        data: Vec<u8>,
    },
    /// Link the temporary file as `version` with `data`.
    Commit {
        version: u64,
        data: Bytes,
    },
}

/// The model operation in progress.
struct Task {
    op: KvOperation,
    path: ReadPath,
    step: Step,
    /// The temporary file made for a write: name and handle.
    tmp: Option<(String, Vec<u8>)>,
}

/// One client's NFS state.
#[derive(Default)]
struct Client {
    root: Option<Vec<u8>>,
    /// Key -> the newest version seen on a linearizable path and its handle.
    newest: BTreeMap<Bytes, (u64, Vec<u8>)>,
    /// Temporary files made so far.
    tmps: u64,
    task: Option<Task>,
}

impl Client {
    /// `version` of `key` exists, with `handle`: remember it if it is the newest seen.
    fn learn(&mut self, key: &Bytes, version: u64, handle: &[u8]) {
        let known = self.newest.entry(key.clone()).or_insert((0, Vec::new()));
        if version > known.0 {
            *known = (version, handle.to_vec());
        }
    }

    /// The name of client `client`'s next temporary file.
    fn next_tmp(&mut self, client: u32) -> String {
        self.tmps += 1;
        format!("t{client}.{}", self.tmps)
    }
}

/// The NFS clients of one run and what they found.
pub struct FsClients {
    clients: BTreeMap<u32, Client>,
    violations: Vec<String>,
    /// Commits that lost the race for their version (LINK answered NFS3ERR_EXIST).
    pub conflicts: u64,
}

impl Default for FsClients {
    fn default() -> Self {
        FsClients::new()
    }
}

fn credential(client: u32) -> Credential {
    Credential {
        uid: 1000 + client,
        gid: 100,
        gids: vec![100],
    }
}

fn version_name(key: &[u8], version: u64) -> String {
    format!("{}.{version}", String::from_utf8_lossy(key))
}

fn call(client: u32, procedure: u32, args: Writer) -> CallOf {
    (
        procedure,
        procedures::operation(procedure, &credential(client), &args.finish()),
    )
}

fn lookup(client: u32, dir: &[u8], name: &str) -> CallOf {
    let mut w = Writer::new();
    w.opaque(dir).string(name);
    call(client, proc3::LOOKUP, w)
}

fn read(client: u32, handle: &[u8], offset: u64) -> CallOf {
    let mut w = Writer::new();
    w.opaque(handle).u64(offset).u32(IO_BYTES_MAX);
    call(client, proc3::READ, w)
}

/// A reply's status and the rest of its result, or why it is not one.
fn status_of(reply: &Reply) -> Result<(u32, Reader<'_>), String> {
    match reply {
        Reply::Result(bytes) => {
            let mut r = Reader::new(bytes);
            let status = r.u32().map_err(|_| "an empty result".to_string())?;
            Ok((status, r))
        }
        other => Err(format!("{other:?}")),
    }
}

/// A LOOKUP's answer: the handle, or `None` for NFS3ERR_NOENT.
fn lookup_result(reply: &Reply) -> Result<Option<Vec<u8>>, String> {
    let (status, mut r) = status_of(reply)?;
    match status {
        s if s == Status::Ok as u32 => Ok(Some(
            r.opaque(FHSIZE3)
                .map_err(|_| "an unreadable handle".to_string())?
                .to_vec(),
        )),
        s if s == Status::NoEnt as u32 => Ok(None),
        s => Err(format!("LOOKUP answered status {s}")),
    }
}

/// A READ's answer: the data and whether it ends the file, or the failure status.
fn read_result(reply: &Reply) -> Result<Result<(Vec<u8>, bool), u32>, String> {
    let (status, mut r) = status_of(reply)?;
    if status != Status::Ok as u32 {
        return Ok(Err(status));
    }
    let parsed = (|| {
        let attributes = r.optional(Attributes::decode)?;
        let count = r.u32()?;
        let eof = r.bool()?;
        let data = r.opaque(IO_BYTES_MAX as usize)?.to_vec();
        Ok::<_, upright_fs::xdr::XdrError>((attributes, count, eof, data))
    })();
    let (attributes, count, eof, data) = parsed.map_err(|e| format!("an unreadable READ result: {e:?}"))?;
    if count as usize != data.len() {
        return Err(format!("READ said {count} bytes and sent {}", data.len()));
    }
    if eof && attributes.is_some_and(|a| a.size < data.len() as u64) {
        return Err("READ sent more bytes than the file's size".into());
    }
    Ok(Ok((data, eof)))
}

/// The handle of a CREATE that succeeded.
fn create_result(reply: &Reply) -> Result<Vec<u8>, String> {
    let (status, mut r) = status_of(reply)?;
    if status != Status::Ok as u32 {
        return Err(format!("CREATE answered status {status}"));
    }
    match r.optional(|r| r.opaque(FHSIZE3).map(<[u8]>::to_vec)) {
        Ok(Some(handle)) => Ok(handle),
        _ => Err("CREATE gave no handle".to_string()),
    }
}

impl FsClients {
    /// Clients with nothing done yet.
    pub fn new() -> FsClients {
        FsClients {
            clients: BTreeMap::new(),
            violations: Vec::new(),
            conflicts: 0,
        }
    }

    /// What the clients found wrong.
    pub fn violations(&self) -> &[String] {
        &self.violations
    }

    /// Starts model operation `op` of `client` on `path` (the workload's choice, for a get).
    pub fn begin(&mut self, client: u32, op: KvOperation, path: ReadPath, rng: &mut ChaCha8Rng) -> (Bytes, ReadPath) {
        let c = self.clients.entry(client).or_default();
        let mut task = Task {
            op,
            path,
            step: Step::Mount,
            tmp: None,
        };
        if c.root.is_some() {
            task.step = find_from_newest(c, &task, client, rng);
        }
        c.task = Some(task);
        request(c, client)
    }

    /// A result was delivered to `client`.
    pub fn deliver(&mut self, client: u32, result: &[u8], rng: &mut ChaCha8Rng) -> Next {
        let replies = match decode_replies(result) {
            Ok(replies) => replies,
            Err(_) => return self.wrong(client, "a result that is not NFS replies".into()),
        };
        match self.step(client, &replies, rng) {
            Ok(next) => next,
            Err(what) => self.wrong(client, what),
        }
    }

    fn wrong(&mut self, client: u32, what: String) -> Next {
        let doing = self
            .clients
            .get_mut(&client)
            .and_then(|c| c.task.take())
            .map(|t| format!("{:?} in {:?}", t.op, t.step))
            .unwrap_or_default();
        self.violations.push(format!("fs: client {client}: {what} ({doing})"));
        Next::Done(Bytes::new())
    }

    /// The next step after `replies` to the current one.
    fn step(&mut self, client: u32, replies: &[Reply], rng: &mut ChaCha8Rng) -> Result<Next, String> {
        let c = self.clients.get_mut(&client).ok_or("a result for an unknown client")?;
        let mut task = c.task.take().ok_or("a result with no request outstanding")?;
        let key = task.op.key().clone();
        let next = match task.step.clone() {
            Step::Mount => {
                let (status, mut r) = status_of(replies.first().ok_or("no reply to the mount")?)?;
                if status != Status::Ok as u32 {
                    return Err(format!("the mount answered status {status}"));
                }
                c.root = Some(r.opaque(FHSIZE3).map_err(|_| "an unreadable root handle")?.to_vec());
                After::Step(find_from_newest(c, &task, client, rng))
            }
            Step::Find { base, read, create } => {
                let mut replies = replies.iter();
                let mut base_handle = None;
                let mut data = None;
                if base > 0 {
                    let reply = replies.next().ok_or("a short find")?;
                    match known_version(reply, read.as_deref(), task.path, version_name(&key, base))? {
                        Known::Linked(h) => base_handle = Some(h),
                        Known::Stale => return Ok(search_from_start(c, task, client)),
                    }
                    if read.is_some() {
                        match read_result(replies.next().ok_or("a short find")?)? {
                            Ok(read) => data = Some(read),
                            Err(s) => return Err(format!("READ of a linked version answered status {s}")),
                        }
                    }
                }
                // The first missing name ends the chain.
                let mut newest = (base, base_handle);
                let mut ended = false;
                for i in 1..=WINDOW {
                    match lookup_result(replies.next().ok_or("a short find")?)? {
                        Some(h) if !ended => newest = (base + i, Some(h)),
                        Some(_) => return Err(format!("{} exists after a gap", version_name(&key, base + i))),
                        None => ended = true,
                    }
                }
                if let Some(name) = create {
                    task.tmp = Some((name, create_result(replies.next().ok_or("a short find")?)?));
                }
                if replies.next().is_some() {
                    return Err("more replies than calls".into());
                }
                let (version, handle) = newest;
                if let (true, Some(h)) = (task.path != ReadPath::Serializable, &handle) {
                    c.learn(&key, version, h);
                }
                if !ended {
                    After::Step(Step::Find {
                        base: version,
                        read: None,
                        create: None,
                    })
                } else if version == 0 {
                    after_newest(&task, 0, None)?
                } else {
                    let handle = handle.expect("a found version has a handle");
                    match data {
                        Some((data, true)) if version == base => after_newest(&task, version, Some(data))?,
                        _ if matches!(task.op, KvOperation::Put { .. }) => {
                            after_newest(&task, version, Some(Vec::new()))?
                        }
                        _ => After::Step(Step::Read {
                            version,
                            handle,
                            offset: 0,
                            data: Vec::new(),
                        }),
                    }
                }
            }
            Step::Read {
                version,
                handle,
                offset,
                mut data,
            } => {
                let [linked, got] = replies else {
                    return Err(format!("{} replies to a read", replies.len()));
                };
                if let Known::Stale = known_version(linked, Some(&handle), task.path, version_name(&key, version))? {
                    return Ok(search_from_start(c, task, client));
                }
                let (more, eof) = match read_result(got)? {
                    Ok(read) => read,
                    Err(s) => return Err(format!("READ of a linked version answered status {s}")),
                };
                data.extend_from_slice(&more);
                if eof {
                    after_newest(&task, version, Some(data))?
                } else if more.is_empty() {
                    return Err("READ returned nothing before the end of the file".into());
                } else {
                    After::Step(Step::Read {
                        version,
                        handle,
                        offset: offset + more.len() as u64,
                        data,
                    })
                }
            }
            Step::Commit { version, data } => {
                let mut replies = replies.iter();
                let (status, _) = status_of(replies.next().ok_or("a short commit")?)?;
                if status != Status::Ok as u32 {
                    return Err(format!("SETATTR of the temporary file answered status {status}"));
                }
                // SETATTR, the WRITEs, LINK, REMOVE.
                let mut written = 0;
                for _ in 0..replies.len().saturating_sub(2) {
                    let (status, mut r) = status_of(replies.next().ok_or("a short commit")?)?;
                    if status != Status::Ok as u32 {
                        return Err(format!("WRITE answered status {status}"));
                    }
                    let skipped = (|| {
                        r.optional(|r| r.fixed(24).map(|_| ()))?;
                        r.optional(Attributes::decode)?;
                        r.u32()
                    })();
                    written += skipped.map_err(|_| "an unreadable WRITE result")? as usize;
                }
                if written != data.len() {
                    return Err(format!("WRITEs took {written} of {} bytes", data.len()));
                }
                let (link, _) = status_of(replies.next().ok_or("a short commit")?)?;
                let (remove, _) = status_of(replies.next().ok_or("a short commit")?)?;
                if remove != Status::Ok as u32 {
                    return Err(format!("REMOVE of the temporary name answered status {remove}"));
                }
                let tmp = task.tmp.take().ok_or("a commit without a temporary file")?;
                if link == Status::Ok as u32 {
                    c.learn(&key, version, &tmp.1);
                    let reply = match &task.op {
                        KvOperation::Append { .. } => KvReply::Value(Some(data)),
                        _ => KvReply::Done,
                    };
                    return Ok(Next::Done(reply.encode()));
                }
                if link != Status::Exist as u32 {
                    return Err(format!("LINK answered status {link}"));
                }
                // Another client committed this version first: find again, from it.
                self.conflicts += 1;
                After::Step(Step::Find {
                    base: version,
                    read: None,
                    create: Some(c.next_tmp(client)),
                })
            }
        };
        match next {
            After::Step(step) => {
                task.step = step;
                c.task = Some(task);
                Ok(invoke(c, client))
            }
            After::Done(reply) => Ok(Next::Done(reply.encode())),
        }
    }
}

/// What a LOOKUP of a version the client knows found.
enum Known {
    /// The version, with this handle.
    Linked(Vec<u8>),
    /// Not there: a stale state on the serializable path.
    Stale,
}

/// Checks a LOOKUP of version `name`, which the client knows exists (with handle `expected`, if
/// it knows that too): versions are never removed or replaced, except from a state that is
/// behind on the serializable path.
fn known_version(reply: &Reply, expected: Option<&[u8]>, path: ReadPath, name: String) -> Result<Known, String> {
    match lookup_result(reply)? {
        Some(h) if expected.is_none_or(|e| e == h) => Ok(Known::Linked(h)),
        Some(_) => Err(format!("{name} has a new handle")),
        None if path == ReadPath::Serializable => Ok(Known::Stale),
        None => Err(format!("version {name} is gone")),
    }
}

/// The get goes on from a stale state: it searches the chain from its start.
fn search_from_start(c: &mut Client, task: Task, client: u32) -> Next {
    c.task = Some(Task {
        step: Step::Find {
            base: 0,
            read: None,
            create: None,
        },
        ..task
    });
    invoke(c, client)
}

/// What follows once the newest version is known.
enum After {
    /// The model operation is over with this reply.
    Done(KvReply),
    /// This step next.
    Step(Step),
}

/// After the newest version (`version`, 0 for none) and its data are known: a get is finished,
/// a write goes on to its commit of the next version.
fn after_newest(task: &Task, version: u64, data: Option<Vec<u8>>) -> Result<After, String> {
    let new = match &task.op {
        KvOperation::Get { .. } if version == 0 => return Ok(After::Done(KvReply::Value(None))),
        KvOperation::Get { .. } => {
            let data = data.ok_or("a get finished without the data")?;
            return Ok(After::Done(KvReply::Value(Some(Bytes::from(data)))));
        }
        KvOperation::Put { value, .. } => value.clone(),
        KvOperation::Append { value, .. } => {
            let mut new = data.unwrap_or_default();
            new.extend_from_slice(value);
            Bytes::from(new)
        }
        other => return Err(format!("the workload asked for {other:?}")),
    };
    if task.tmp.is_none() {
        return Err("a write without its temporary file".into());
    }
    Ok(After::Step(Step::Commit {
        version: version + 1,
        data: new,
    }))
}

/// The first find of a model operation, from the newest version the client knows.
fn find_from_newest(c: &mut Client, task: &Task, client: u32, rng: &mut ChaCha8Rng) -> Step {
    let key = task.op.key();
    let (base, handle) = c.newest.get(key).cloned().unwrap_or((0, Vec::new()));
    let create = (!task.op.is_read_only()).then(|| c.next_tmp(client));
    Step::Find {
        base,
        read: (base > 0 && rng.random_bool(0.8)).then_some(handle),
        create,
    }
}

/// The current step's calls.
fn calls(c: &Client, task: &Task, client: u32, rng_bits: u64) -> Vec<CallOf> {
    let root = c.root.as_deref().unwrap_or(&[]);
    let key = task.op.key();
    match &task.step {
        Step::Mount => {
            let mut w = Writer::new();
            w.string("/");
            vec![call(client, procedures::MOUNT_RESOLVE, w)]
        }
        Step::Find { base, read: r, create } => {
            let mut out = Vec::new();
            if *base > 0 {
                out.push(lookup(client, root, &version_name(key, *base)));
                if let Some(handle) = r {
                    out.push(read(client, handle, 0));
                }
            }
            for i in 1..=WINDOW {
                out.push(lookup(client, root, &version_name(key, base + i)));
            }
            if let Some(name) = create {
                let mut w = Writer::new();
                w.opaque(root).string(name);
                match rng_bits % 3 {
                    0 | 1 => {
                        w.u32((rng_bits % 3) as u32); // UNCHECKED, GUARDED
                        SetAttributes {
                            mode: Some(0o600),
                            ..SetAttributes::default()
                        }
                        .encode(&mut w);
                    }
                    _ => {
                        w.u32(2).fixed(&rng_bits.to_be_bytes()); // EXCLUSIVE
                    }
                }
                out.push(call(client, proc3::CREATE, w));
            }
            out
        }
        Step::Read {
            version,
            handle,
            offset,
            ..
        } => vec![
            lookup(client, root, &version_name(key, *version)),
            read(client, handle, *offset),
        ],
        Step::Commit { version, data } => {
            let (tmp, handle) = task
                .tmp
                .as_ref()
                .map(|(n, h)| (n.as_str(), &h[..]))
                .unwrap_or(("", &[]));
            let mut out = Vec::new();
            let mut w = Writer::new();
            w.opaque(handle);
            SetAttributes {
                mode: Some(0o644),
                ..SetAttributes::default()
            }
            .encode(&mut w);
            w.bool(false); // no guard
            out.push(call(client, proc3::SETATTR, w));
            // The data in pieces of at most IO_BYTES_MAX, the first split in two (written last
            // piece first when the bits say so: WRITE at an offset past the end).
            let mut pieces: Vec<(usize, usize)> = Vec::new();
            let mut at = 0;
            while at < data.len() || pieces.is_empty() {
                let end = (at + IO_BYTES_MAX as usize).min(data.len());
                pieces.push((at, end));
                at = end;
            }
            let (start, end) = pieces[0];
            if end - start >= 2 {
                let cut = start + 1 + (rng_bits as usize >> 8) % (end - start - 1);
                pieces[0] = (start, cut);
                pieces.insert(1, (cut, end));
                if rng_bits & 1 == 1 {
                    pieces.swap(0, 1);
                }
            }
            for (start, end) in pieces {
                let mut w = Writer::new();
                w.opaque(handle)
                    .u64(start as u64)
                    .u32((end - start) as u32)
                    .u32(if rng_bits & 2 == 0 { 2 } else { 0 }) // FILE_SYNC or UNSTABLE
                    .opaque(&data[start..end]);
                out.push(call(client, proc3::WRITE, w));
            }
            let mut w = Writer::new();
            w.opaque(handle).opaque(root).string(&version_name(key, *version));
            out.push(call(client, proc3::LINK, w));
            let mut w = Writer::new();
            w.opaque(root).string(tmp);
            out.push(call(client, proc3::REMOVE, w));
            out
        }
    }
}

/// The path of the current step: a get's on the workload's path, everything else ordered.
fn path(task: &Task) -> ReadPath {
    match (&task.step, &task.op) {
        (Step::Find { create: None, .. } | Step::Read { .. }, KvOperation::Get { .. }) => task.path,
        _ => ReadPath::Ordered,
    }
}

fn request(c: &mut Client, client: u32) -> (Bytes, ReadPath) {
    let task = c.task.as_ref().expect("a task");
    // The step's random choices come from the client's count of temporary files and the step,
    // so a retransmitted step is the same calls.
    let bits = blake3::hash(format!("{client}/{}/{:?}", c.tmps, task.step).as_bytes());
    let bits = u64::from_le_bytes(bits.as_bytes()[..8].try_into().expect("8 bytes"));
    let calls: Vec<Bytes> = calls(c, task, client, bits).into_iter().map(|(_, b)| b).collect();
    (encode_calls(&calls), path(task))
}

fn invoke(c: &mut Client, client: u32) -> Next {
    let (operation, path) = request(c, client);
    Next::Invoke(operation, path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use upright_core::ids::{ClientId, RequestId, SeqNo};
    use upright_core::service::{BatchContext, Effects, Service, ServiceRequest};
    use upright_fs::service::FsService;

    /// Runs `operation` on `fs` as the ordered batch `n`.
    fn execute(fs: &mut FsService, n: u64, operation: Bytes) -> Bytes {
        let context = BatchContext {
            index: 0,
            seqno: SeqNo(n),
            time_us: 1_000 * n,
            seed: [0; 32],
        };
        let request = ServiceRequest {
            client: ClientId(0),
            request_id: RequestId(n),
            operation,
        };
        fs.execute(&context, &[request], &mut Effects::default()).remove(0)
    }

    /// Steps `client` from `first` until its model operation is done; its reply.
    fn run_to_end(clients: &mut FsClients, fs: &mut FsService, n: &mut u64, client: u32, first: Bytes) -> Bytes {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let mut operation = first;
        loop {
            *n += 1;
            let result = execute(fs, *n, operation);
            match clients.deliver(client, &result, &mut rng) {
                Next::Invoke(next, _) => operation = next,
                Next::Done(reply) => return reply,
                Next::Hold => panic!("NFS clients never hold"),
            }
        }
    }

    fn append(key: &str, value: &str) -> KvOperation {
        KvOperation::Append {
            key: Bytes::from(key.to_string()),
            value: Bytes::from(value.to_string()),
        }
    }

    fn get(key: &str) -> KvOperation {
        KvOperation::Get {
            key: Bytes::from(key.to_string()),
        }
    }

    #[test]
    fn two_appends_racing_for_one_version_both_land_in_order() {
        let (mut fs, mut clients, mut rng, mut n) =
            (FsService::new(), FsClients::new(), ChaCha8Rng::seed_from_u64(7), 0);
        // Both clients mount and find k0 absent, each with a temporary file made.
        let (a, _) = clients.begin(0, append("k0", "<a>"), ReadPath::Ordered, &mut rng);
        let (b, _) = clients.begin(1, append("k0", "<b>"), ReadPath::Ordered, &mut rng);
        n += 1;
        let Next::Invoke(a_find, _) = clients.deliver(0, &execute(&mut fs, n, a), &mut rng) else {
            panic!()
        };
        n += 1;
        let Next::Invoke(b_find, _) = clients.deliver(1, &execute(&mut fs, n, b), &mut rng) else {
            panic!()
        };
        n += 1;
        let Next::Invoke(a_commit, _) = clients.deliver(0, &execute(&mut fs, n, a_find), &mut rng) else {
            panic!()
        };
        n += 1;
        let Next::Invoke(b_commit, _) = clients.deliver(1, &execute(&mut fs, n, b_find), &mut rng) else {
            panic!()
        };
        // A links k0.1 first; B's LINK finds it taken, B finds again and appends to A's value.
        n += 1;
        assert_eq!(
            clients.deliver(0, &execute(&mut fs, n, a_commit), &mut rng),
            Next::Done(KvReply::Value(Some(Bytes::from("<a>"))).encode())
        );
        let reply = run_to_end(&mut clients, &mut fs, &mut n, 1, b_commit);
        assert_eq!(reply, KvReply::Value(Some(Bytes::from("<a><b>"))).encode());
        assert_eq!(clients.conflicts, 1);
        // A reads B's version through the chain, on the read-only path's answers too.
        let (op, path) = clients.begin(0, get("k0"), ReadPath::ReadOnly, &mut rng);
        assert_eq!(path, ReadPath::ReadOnly);
        assert!(fs.execute_read_only(&op).is_some(), "a get's find is read-only");
        let reply = run_to_end(&mut clients, &mut fs, &mut n, 0, op);
        assert_eq!(reply, KvReply::Value(Some(Bytes::from("<a><b>"))).encode());
        assert!(clients.violations().is_empty(), "{:?}", clients.violations());
    }

    #[test]
    fn a_value_past_one_read_is_read_in_pieces_and_a_missing_key_is_absent() {
        let (mut fs, mut clients, mut rng, mut n) =
            (FsService::new(), FsClients::new(), ChaCha8Rng::seed_from_u64(3), 0);
        let (op, _) = clients.begin(0, get("k1"), ReadPath::Ordered, &mut rng);
        assert_eq!(
            run_to_end(&mut clients, &mut fs, &mut n, 0, op),
            KvReply::Value(None).encode()
        );
        let big = "<0.1>".to_string() + &"-".repeat(150_000);
        let put = KvOperation::Put {
            key: Bytes::from("k1"),
            value: Bytes::from(big.clone()),
        };
        let (op, _) = clients.begin(0, put, ReadPath::Ordered, &mut rng);
        assert_eq!(run_to_end(&mut clients, &mut fs, &mut n, 0, op), KvReply::Done.encode());
        // Another client, which knows no version yet, reads it in three READs.
        let (op, _) = clients.begin(1, get("k1"), ReadPath::Ordered, &mut rng);
        let reply = run_to_end(&mut clients, &mut fs, &mut n, 1, op);
        assert_eq!(reply, KvReply::Value(Some(Bytes::from(big))).encode());
        assert!(clients.violations().is_empty(), "{:?}", clients.violations());
    }

    #[test]
    fn a_version_that_vanishes_from_an_ordered_read_is_a_violation() {
        let (mut fs, mut clients, mut rng, mut n) =
            (FsService::new(), FsClients::new(), ChaCha8Rng::seed_from_u64(5), 0);
        let (op, _) = clients.begin(0, append("k2", "<x>"), ReadPath::Ordered, &mut rng);
        run_to_end(&mut clients, &mut fs, &mut n, 0, op);
        // A fresh file system stands in for a replica that lost k2.1: the client knew it.
        let mut other = FsService::new();
        let (op, _) = clients.begin(0, get("k2"), ReadPath::Ordered, &mut rng);
        assert_eq!(run_to_end(&mut clients, &mut other, &mut n, 0, op), Bytes::new());
        assert!(
            clients.violations()[0].contains("version k2.1 is gone"),
            "{:?}",
            clients.violations()
        );
    }
}

//! `--service hdfs`: the simulated clients use the UpRight-HDFS NameNode (docs/HDFS.md) as the
//! WebHDFS gateway does, and stand in for the DataNodes themselves.
//!
//! HDFS has no atomic overwrite of a file's data, so each key of the checkers' model is a chain of
//! immutable versions: key `k`'s value is the content of file `/d/<hex k>/<N>` for the highest
//! `N` (ten digits, so names sort by number), and the key is absent while there is none. A
//! version is written under a temporary name (`/t/c<client>.<n>`: CREATE, ADDBLOCK, the block
//! reported by the client as its own DataNode, COMPLETE), then RENAMEd to `N + 1`; the rename
//! fails if another client took `N + 1` first (compare-and-set), and the client lists again.
//! Versions are never removed or changed once named, so every model operation takes effect at
//! one step: a get at its LISTSTATUS, a put or append at its successful RENAME.
//!
//! The block's bytes never reach the NameNode, only its hash: the clients keep every value they
//! wrote by its block hash (standing in for the DataNodes' stores), and a get reads the committed
//! hash from GETBLOCKLOCATIONS and takes the value from there. A committed hash nobody wrote, a
//! version whose length differs from its value's, any error where none can be: violations.

use std::collections::BTreeMap;

use bytes::Bytes;
use upright_core::kv::{KvOperation, KvReply};
use upright_core::stage::ReadPath;
use upright_core::stages::ServiceFactory;
use upright_hdfs::namenode::{Answer, BlockReport, Command, Hash, HdfsError};
use upright_hdfs::service::{decode_answer, encode};

use crate::zk::Next;

/// Heartbeats a client (as a DataNode) sends: one every this many operations.
const HEARTBEAT_EVERY: u64 = 16;

/// The execution members' service (`corrupt`: a NameNode whose every answer lies).
pub fn factory(corrupt: bool) -> ServiceFactory {
    upright_hdfs::replica::service(corrupt)
}

/// The bytes of what the Byzantine client sends: a directory and a file of its own.
pub fn stray_request(value: &[u8]) -> Bytes {
    let name = blake3::hash(value).to_hex()[..12].to_string();
    encode(&Command::Create {
        path: format!("/byz/{name}"),
        overwrite: true,
        replication: Some(1),
        block_size: None,
        permission: None,
        user: "mallory".into(),
        holder: format!("byz-{name}"),
    })
}

fn dir_of(key: &[u8]) -> String {
    let hex: String = key.iter().map(|b| format!("{b:02x}")).collect();
    format!("/d/{hex}")
}

fn version_path(key: &[u8], version: u64) -> String {
    format!("{}/{version:010}", dir_of(key))
}

/// One step of a model operation.
#[derive(Clone, Debug)]
enum Step {
    /// Register as a DataNode (a client's first step).
    Register,
    /// Heartbeat as a DataNode.
    Heartbeat,
    /// Make the key's directory (writes).
    Dir,
    /// List the key's versions after `after`; `best` the highest so far.
    List { after: Option<String>, best: u64 },
    /// The content of `version`.
    Locate { version: u64 },
    /// Create the temporary file for `new`, to become version `base + 1`.
    Create { new: Bytes, base: u64 },
    /// Its block.
    AddBlock { new: Bytes, base: u64 },
    /// Report the block as the client's own DataNode.
    Report { new: Bytes, base: u64, report: BlockReport },
    /// Close the temporary file.
    Complete {
        new: Bytes,
        base: u64,
        report: Option<BlockReport>,
    },
    /// Rename the temporary file to `version`.
    Rename { new: Bytes, version: u64 },
}

struct Task {
    op: KvOperation,
    path: ReadPath,
    step: Step,
    tmp: String,
}

#[derive(Default)]
struct Client {
    registered: bool,
    tmps: u64,
    ops: u64,
    task: Option<Task>,
}

/// The HDFS clients of one run, the values they wrote by block hash, and what they found wrong.
#[derive(Default)]
pub struct HdfsClients {
    clients: BTreeMap<u32, Client>,
    values: BTreeMap<Hash, Bytes>,
    violations: Vec<String>,
    /// Renames that lost the race for their version.
    pub conflicts: u64,
}

impl HdfsClients {
    /// Clients with nothing done yet.
    pub fn new() -> HdfsClients {
        HdfsClients::default()
    }

    /// What the clients found wrong.
    pub fn violations(&self) -> &[String] {
        &self.violations
    }

    /// Starts model operation `op` of `client` (`path`: the workload's read path for a get).
    pub fn begin(&mut self, client: u32, op: KvOperation, path: ReadPath) -> (Bytes, ReadPath) {
        let c = self.clients.entry(client).or_default();
        c.tmps += 1;
        c.ops += 1;
        let step = if !c.registered {
            Step::Register
        } else if c.ops.is_multiple_of(HEARTBEAT_EVERY) {
            Step::Heartbeat
        } else {
            first_step(&op)
        };
        let task = Task {
            op,
            path,
            step,
            tmp: format!("/t/c{client}.{}", c.tmps),
        };
        let request = request(&task, client);
        c.task = Some(task);
        request
    }

    /// A result was delivered to `client`.
    pub fn deliver(&mut self, client: u32, result: &[u8]) -> Next {
        let Some(answer) = decode_answer(result) else {
            return self.wrong(client, "a result that is not a NameNode answer".into());
        };
        match self.step(client, answer) {
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
        self.violations.push(format!("hdfs: client {client}: {what} ({doing})"));
        Next::Done(Bytes::new())
    }

    fn step(&mut self, client: u32, answer: Answer) -> Result<Next, String> {
        let c = self.clients.get_mut(&client).ok_or("a result for an unknown client")?;
        let mut task = c.task.take().ok_or("a result with no request outstanding")?;
        let key = task.op.key().clone();
        let unexpected = |what: &str, answer: &Answer| format!("{what} answered {answer:?}");
        let next = match (task.step.clone(), answer) {
            (Step::Register, Answer::Ok) => {
                c.registered = true;
                first_step(&task.op)
            }
            (Step::Heartbeat, Answer::Commands(_)) => first_step(&task.op),
            (Step::Dir, Answer::Done(true)) => match &task.op {
                KvOperation::Put { value, .. } => Step::Create {
                    new: value.clone(),
                    base: 0,
                },
                _ => Step::List { after: None, best: 0 },
            },
            (Step::List { .. }, Answer::Error(HdfsError::NotFound(_)))
                if matches!(task.op, KvOperation::Get { .. }) =>
            {
                return Ok(Next::Done(KvReply::Value(None).encode()));
            }
            (Step::List { best, .. }, Answer::Listing { entries, remaining }) => {
                let mut best = best;
                let mut last = None;
                for e in &entries {
                    let version: u64 = e
                        .path_suffix
                        .parse()
                        .map_err(|_| format!("a stranger in {}: {}", dir_of(&key), e.path_suffix))?;
                    if e.is_dir {
                        return Err(format!("version {version} of {} is a directory", dir_of(&key)));
                    }
                    best = best.max(version);
                    last = Some(e.path_suffix.clone());
                }
                if remaining > 0 {
                    Step::List { after: last, best }
                } else {
                    match &task.op {
                        KvOperation::Get { .. } if best == 0 => {
                            return Ok(Next::Done(KvReply::Value(None).encode()));
                        }
                        KvOperation::Put { value, .. } => Step::Rename {
                            new: value.clone(),
                            version: best + 1,
                        },
                        KvOperation::Append { value, .. } if best == 0 => Step::Create {
                            new: value.clone(),
                            base: 0,
                        },
                        _ => Step::Locate { version: best },
                    }
                }
            }
            (
                Step::Locate { version },
                Answer::Locations {
                    blocks,
                    length,
                    complete,
                },
            ) => {
                if !complete {
                    return Err(format!("version {version} is not closed"));
                }
                let mut value = Vec::new();
                for b in &blocks {
                    let hash = b.hash.ok_or("a located block without its hash")?;
                    let bytes = self
                        .values
                        .get(&hash)
                        .ok_or_else(|| format!("block {} has a hash nobody wrote", b.block))?;
                    if bytes.len() as u64 != b.len {
                        return Err(format!(
                            "block {} has length {} for a value of {}",
                            b.block,
                            b.len,
                            bytes.len()
                        ));
                    }
                    value.extend_from_slice(bytes);
                }
                if value.len() as u64 != length {
                    return Err(format!("length {length} for {} bytes of blocks", value.len()));
                }
                match &task.op {
                    KvOperation::Get { .. } => {
                        return Ok(Next::Done(KvReply::Value(Some(Bytes::from(value))).encode()));
                    }
                    KvOperation::Append { value: piece, .. } => {
                        value.extend_from_slice(piece);
                        Step::Create {
                            new: Bytes::from(value),
                            base: version,
                        }
                    }
                    other => return Err(format!("a locate in {other:?}")),
                }
            }
            (Step::Create { new, base }, Answer::Ok) => Step::AddBlock { new, base },
            (Step::AddBlock { new, base }, Answer::Block(located)) => {
                if located.datanodes.is_empty() {
                    return Err("a block with no DataNode to write to".into());
                }
                let (len, _, hash) = upright_hdfs::block::hash_block(&new);
                self.values.insert(hash, new.clone());
                Step::Report {
                    new,
                    base,
                    report: BlockReport {
                        block: located.block,
                        len,
                        hash,
                    },
                }
            }
            (Step::Report { new, base, report }, Answer::Ok) => Step::Complete {
                new,
                base,
                report: Some(report),
            },
            (Step::Complete { new, base, .. }, Answer::Done(false)) => Step::Complete {
                new,
                base,
                report: None,
            },
            (Step::Complete { new, base, .. }, Answer::Done(true)) => match task.op {
                KvOperation::Put { .. } => Step::List { after: None, best: 0 },
                _ => Step::Rename { new, version: base + 1 },
            },
            (Step::Rename { new, .. }, Answer::Done(true)) => {
                let reply = match task.op {
                    KvOperation::Append { .. } => KvReply::Value(Some(new)),
                    _ => KvReply::Done,
                };
                return Ok(Next::Done(reply.encode()));
            }
            (Step::Rename { .. }, Answer::Done(false)) => {
                // Another client took this version: list again (an append reads again and
                // writes a new temporary file).
                self.conflicts += 1;
                if matches!(task.op, KvOperation::Append { .. }) {
                    c.tmps += 1;
                    task.tmp = format!("/t/c{client}.{}", c.tmps);
                }
                Step::List { after: None, best: 0 }
            }
            (step, answer) => return Err(unexpected(&format!("{step:?}"), &answer)),
        };
        task.step = next;
        let request = request(&task, client);
        c.task = Some(task);
        Ok(Next::Invoke(request.0, request.1))
    }
}

/// A model operation's first step after registration.
fn first_step(op: &KvOperation) -> Step {
    match op {
        KvOperation::Get { .. } => Step::List { after: None, best: 0 },
        _ => Step::Dir,
    }
}

/// The current step's command and read path.
fn request(task: &Task, client: u32) -> (Bytes, ReadPath) {
    let key = task.op.key();
    let holder = format!("c{client}");
    let (command, path) = match &task.step {
        Step::Register => (
            Command::RegisterDataNode {
                id: client,
                addr: format!("sim-datanode-{client}:9866"),
                capacity: 1 << 40,
            },
            ReadPath::Ordered,
        ),
        Step::Heartbeat => (Command::Heartbeat { id: client, used: 0 }, ReadPath::Ordered),
        Step::Dir => (
            Command::Mkdirs {
                path: dir_of(key),
                permission: None,
                user: holder,
            },
            ReadPath::Ordered,
        ),
        Step::List { after, .. } => (
            Command::ListStatus {
                path: dir_of(key),
                after: after.clone(),
            },
            if matches!(task.op, KvOperation::Get { .. }) {
                task.path
            } else {
                ReadPath::Ordered
            },
        ),
        Step::Locate { version } => (
            Command::GetBlockLocations {
                path: version_path(key, *version),
            },
            ReadPath::Ordered,
        ),
        Step::Create { .. } => (
            Command::Create {
                path: task.tmp.clone(),
                overwrite: false,
                replication: Some(1),
                block_size: None,
                permission: None,
                user: holder.clone(),
                holder,
            },
            ReadPath::Ordered,
        ),
        Step::AddBlock { .. } => (
            Command::AddBlock {
                path: task.tmp.clone(),
                holder,
                previous: None,
            },
            ReadPath::Ordered,
        ),
        Step::Report { report, .. } => (
            Command::BlockReceived {
                id: client,
                report: *report,
            },
            ReadPath::Ordered,
        ),
        Step::Complete { report, .. } => (
            Command::Complete {
                path: task.tmp.clone(),
                holder,
                last: *report,
            },
            ReadPath::Ordered,
        ),
        Step::Rename { version, .. } => (
            Command::Rename {
                src: task.tmp.clone(),
                dst: version_path(key, *version),
            },
            ReadPath::Ordered,
        ),
    };
    (encode(&command), path)
}

#[cfg(test)]
mod tests {
    use upright_core::ids::{ClientId, RequestId, SeqNo};
    use upright_core::service::{BatchContext, Effects, Service, ServiceRequest};
    use upright_hdfs::service::NameNodeService;

    use super::*;

    /// Runs model operations of two clients against one NameNode, their steps interleaved one for
    /// one, until both finish; the model replies in order of completion.
    fn run(ops: [KvOperation; 2]) -> (Vec<(u32, KvReply)>, HdfsClients) {
        let mut nn = NameNodeService::new();
        let mut clients = HdfsClients::new();
        let done = run_on(&mut nn, &mut clients, ops);
        (done, clients)
    }

    fn run_on(nn: &mut NameNodeService, clients: &mut HdfsClients, ops: [KvOperation; 2]) -> Vec<(u32, KvReply)> {
        let mut pending: Vec<(u32, Bytes)> = ops
            .into_iter()
            .enumerate()
            .map(|(c, op)| (c as u32, clients.begin(c as u32, op, ReadPath::Ordered).0))
            .collect();
        let mut done = Vec::new();
        let mut seq = 0;
        while !pending.is_empty() {
            let mut next = Vec::new();
            for (client, operation) in pending {
                seq += 1;
                let context = BatchContext {
                    index: 0,
                    seqno: SeqNo(seq),
                    time_us: seq * 1000,
                    seed: [seq as u8; 32],
                };
                let request = ServiceRequest {
                    client: ClientId(client),
                    request_id: RequestId(seq),
                    operation,
                };
                let result = nn.execute(&context, &[request], &mut Effects::default()).remove(0);
                match clients.deliver(client, &result) {
                    Next::Invoke(op, _) => next.push((client, op)),
                    Next::Done(reply) => done.push((client, KvReply::decode(&reply).expect("a model reply"))),
                    Next::Hold => panic!("nothing holds"),
                }
            }
            pending = next;
        }
        done
    }

    fn key() -> Bytes {
        Bytes::from_static(b"k\x01")
    }

    #[test]
    fn puts_race_for_a_version_and_gets_read_the_newest() {
        let put = |v: &'static [u8]| KvOperation::Put {
            key: key(),
            value: Bytes::from_static(v),
        };
        let get = KvOperation::Get { key: key() };
        let (mut nn, mut clients) = (NameNodeService::new(), HdfsClients::new());
        let before = run_on(&mut nn, &mut clients, [get.clone(), get.clone()]);
        assert!(
            before.iter().all(|(_, r)| *r == KvReply::Value(None)),
            "no key yet: {before:?}"
        );
        let done = run_on(&mut nn, &mut clients, [put(b"one"), put(b"two")]);
        assert!(clients.violations().is_empty(), "{:?}", clients.violations());
        assert_eq!(done.len(), 2);
        assert!(done.iter().all(|(_, r)| *r == KvReply::Done));
        assert_eq!(clients.conflicts, 1, "both listed version 0; one rename lost");
        // The put that finished last took the newer version.
        let last = if done[1].0 == 0 { b"one" } else { b"two" };
        let after = run_on(&mut nn, &mut clients, [get.clone(), get]);
        let want = KvReply::Value(Some(Bytes::from_static(last)));
        assert!(after.iter().all(|(_, r)| *r == want), "{after:?}");
        assert!(clients.violations().is_empty(), "{:?}", clients.violations());
    }

    #[test]
    fn appends_build_on_the_version_they_read() {
        let append = |v: &'static [u8]| KvOperation::Append {
            key: key(),
            value: Bytes::from_static(v),
        };
        let (done, clients) = run([append(b"a"), append(b"b")]);
        assert!(clients.violations().is_empty(), "{:?}", clients.violations());
        let values: Vec<&KvReply> = done.iter().map(|(_, r)| r).collect();
        // One appended to nothing, the other (after losing the race) to it.
        let lens: Vec<usize> = values
            .iter()
            .map(|r| match r {
                KvReply::Value(Some(v)) => v.len(),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(lens.iter().sum::<usize>(), 3, "{values:?}");
    }
}

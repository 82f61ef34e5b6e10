//! The NameNode as an upright service: each request is one postcard-encoded [`Command`], each
//! reply one [`Answer`]; agreed time and seed drive it; it asks to be woken for leases, DataNode
//! deadlines and late copies.

use bytes::Bytes;
use upright_core::codec;
use upright_core::service::{BatchContext, Effects, RestoreError, Service, ServiceRequest};

use crate::namenode::{Answer, Command, HdfsError, NameNode};

/// Encodes a command (what a gateway or DataNode submits).
pub fn encode(command: &Command) -> Bytes {
    Bytes::from(codec::to_bytes(command))
}

/// Decodes an answer.
pub fn decode_answer(bytes: &[u8]) -> Option<Answer> {
    codec::from_bytes(bytes).ok()
}

/// The replicated NameNode.
#[derive(Debug, Default)]
pub struct NameNodeService {
    namenode: NameNode,
}

impl NameNodeService {
    /// An empty namespace.
    pub fn new() -> NameNodeService {
        NameNodeService::default()
    }

    /// The state (tests, status).
    pub fn namenode(&self) -> &NameNode {
        &self.namenode
    }
}

/// The randomness of request `index` of a batch: the batch's seed and the position.
fn seed_of(context: &BatchContext, index: usize) -> u64 {
    let batch = u64::from_le_bytes(context.seed[..8].try_into().expect("8 bytes"));
    batch ^ (index as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

/// A DataNode speaks for itself only: its id is its upright client id, so a client cannot
/// register, heartbeat or report replicas in another DataNode's name.
fn impersonated(command: &Command, client: u32) -> Option<HdfsError> {
    let id = match command {
        Command::RegisterDataNode { id, .. } | Command::Heartbeat { id, .. } | Command::BlockReceived { id, .. } => *id,
        _ => return None,
    };
    (id != client).then(|| {
        HdfsError::BadArgument(format!(
            "client {client} cannot speak for DataNode {id} (a DataNode's id is its client id)"
        ))
    })
}

fn malformed() -> Bytes {
    Bytes::from(codec::to_bytes(&Answer::Error(HdfsError::BadArgument(
        "malformed NameNode command".into(),
    ))))
}

impl Service for NameNodeService {
    fn execute(&mut self, context: &BatchContext, requests: &[ServiceRequest], _effects: &mut Effects) -> Vec<Bytes> {
        let now_ms = context.time_us / 1000;
        requests
            .iter()
            .enumerate()
            .map(|(i, request)| match codec::from_bytes::<Command>(&request.operation) {
                Ok(command) => match impersonated(&command, request.client.0) {
                    Some(error) => Bytes::from(codec::to_bytes(&Answer::Error(error))),
                    None => Bytes::from(codec::to_bytes(&self.namenode.apply(
                        now_ms,
                        seed_of(context, i),
                        &command,
                    ))),
                },
                Err(_) => malformed(),
            })
            .collect()
    }

    fn wake_at(&self) -> Option<u64> {
        self.namenode.wake_at_ms().map(|ms| ms.saturating_mul(1000))
    }

    fn wake(&mut self, context: &BatchContext, _effects: &mut Effects) {
        self.namenode.wake(context.time_us / 1000, seed_of(context, usize::MAX));
    }

    fn execute_read_only(&self, operation: &[u8]) -> Option<Bytes> {
        let command = codec::from_bytes::<Command>(operation).ok()?;
        self.namenode.read(&command).map(|a| Bytes::from(codec::to_bytes(&a)))
    }

    fn checkpoint(&self) -> Bytes {
        Bytes::from(codec::to_bytes(&self.namenode))
    }

    fn restore(&mut self, checkpoint: &[u8]) -> Result<(), RestoreError> {
        self.namenode = codec::from_bytes(checkpoint).map_err(|e| RestoreError(format!("namenode checkpoint: {e}")))?;
        Ok(())
    }
}

/// Testing only: a NameNode whose every answer lies (a Byzantine replica's stand-in): a yes for a
/// no, an extra directory entry, a changed block hash, a failure for anything else.
#[derive(Debug, Default)]
pub struct Corrupting(pub NameNodeService);

fn lie(answer: Answer) -> Answer {
    match answer {
        Answer::Done(b) => Answer::Done(!b),
        Answer::Ok => Answer::Done(true),
        Answer::Listing { mut entries, remaining } => {
            if let Some(first) = entries.first().cloned() {
                entries.push(crate::namenode::FileStatus {
                    path_suffix: format!("{}.forged", first.path_suffix),
                    ..first
                });
            }
            Answer::Listing {
                entries,
                remaining: remaining + 1,
            }
        }
        Answer::Locations {
            mut blocks,
            length,
            complete,
        } => {
            for b in &mut blocks {
                if let Some(h) = &mut b.hash {
                    h[0] ^= 1;
                }
            }
            Answer::Locations {
                blocks,
                length: length + 1,
                complete,
            }
        }
        Answer::Block(mut b) => {
            b.block += 1;
            Answer::Block(b)
        }
        _ => Answer::Error(HdfsError::Limit("corrupted by a Byzantine NameNode".into())),
    }
}

impl Service for Corrupting {
    fn execute(&mut self, context: &BatchContext, requests: &[ServiceRequest], effects: &mut Effects) -> Vec<Bytes> {
        self.0
            .execute(context, requests, effects)
            .into_iter()
            .map(|reply| match decode_answer(&reply) {
                Some(answer) => Bytes::from(codec::to_bytes(&lie(answer))),
                None => reply,
            })
            .collect()
    }

    fn wake_at(&self) -> Option<u64> {
        self.0.wake_at()
    }

    fn wake(&mut self, context: &BatchContext, effects: &mut Effects) {
        self.0.wake(context, effects)
    }

    fn execute_read_only(&self, operation: &[u8]) -> Option<Bytes> {
        let reply = self.0.execute_read_only(operation)?;
        Some(match decode_answer(&reply) {
            Some(answer) => Bytes::from(codec::to_bytes(&lie(answer))),
            None => reply,
        })
    }

    fn checkpoint(&self) -> Bytes {
        self.0.checkpoint()
    }

    fn restore(&mut self, checkpoint: &[u8]) -> Result<(), RestoreError> {
        self.0.restore(checkpoint)
    }
}

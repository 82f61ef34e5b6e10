//! A toy crash-tolerant protocol that exercises the simulator's machinery (network, timers,
//! storage, crashes, checkers) independently of the real stages: authentication member 0 is a sequencer
//! that persists each request before broadcasting it; execution members apply requests in
//! sequence order and reply; a client accepts the first full reply. Correct with `r = 0` under
//! crash, partition and network faults (it stalls while replica 0 is down). Seals are not checked.
//!
//! [`Toy::forgetful`] is a deliberately broken variant whose sequencer does not persist its log,
//! so after a crash it reuses sequence numbers: the checkers must catch it.

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use upright_core::codec;
use upright_core::config::{ClusterConfig, ConfigError};
use upright_core::crypto::{Digest, KeyRing};
use upright_core::ids::{ClientId, Principal, ReplicaId, RequestId, SeqNo, View};
use upright_core::kv::{KvOperation, KvService};
use upright_core::message::{history_digest, Envelope, Message, ReplyBody, RequestBody, RequestEntry, SealFor};
use upright_core::quorum::Quorums;
use upright_core::service::Service;
use upright_core::stage::{Action, Event, Input, Stage, Stats, Storage, Time, Timer};

use crate::protocol::Protocol;

/// Most log entries one catch-up answer carries.
pub const CATCH_UP_MAX: usize = 64;
/// Most out-of-order entries an execution member buffers.
pub const BUFFER_MAX: u64 = 1024;

/// The toy protocol.
#[derive(Clone, Copy, Debug, Default)]
pub struct Toy {
    /// Broken: the sequencer keeps its log only in memory.
    pub forgetful: bool,
}

impl Toy {
    /// The broken variant.
    pub fn forgetful() -> Toy {
        Toy { forgetful: true }
    }
}

impl Protocol for Toy {
    fn stage(
        &self,
        config: &Arc<ClusterConfig>,
        principal: Principal,
        keys: &Arc<KeyRing>,
        storage: &Storage,
        _page_store: Option<Box<dyn upright_core::pages::PageStore>>,
    ) -> Result<Box<dyn Stage + Send>, ConfigError> {
        let quorums = config.validate()?;
        let ctx = Ctx {
            principal,
            keys: keys.clone(),
            quorums,
            stats: Stats::default(),
        };
        Ok(match principal {
            Principal::Client(_) => Box::new(ToyClient {
                ctx,
                last: 0,
                outstanding: None,
            }),
            Principal::Auth(ReplicaId(0)) => Box::new(Sequencer::new(ctx, storage, self.forgetful)),
            Principal::Exec(_) => Box::new(ToyExec {
                ctx,
                next: 1,
                history: Digest::default(),
                kv: KvService::new(),
                buffer: BTreeMap::new(),
                replies: BTreeMap::new(),
            }),
            _ => Box::new(Idle { ctx }),
        })
    }
}

struct Ctx {
    principal: Principal,
    keys: Arc<KeyRing>,
    quorums: Quorums,
    stats: Stats,
}

impl Ctx {
    fn send(&self, to: Vec<Principal>, message: Message, out: &mut Vec<Action>) {
        let envelope = Envelope::seal(&self.keys, &self.quorums, self.principal, message, SealFor::Nothing);
        out.push(Action::Send {
            to,
            envelope: Arc::new(envelope),
        });
    }

    fn execs(&self) -> Vec<Principal> {
        (0..self.quorums.n_exec as u32)
            .map(|i| Principal::Exec(ReplicaId(i)))
            .collect()
    }
}

macro_rules! stage_basics {
    () => {
        fn principal(&self) -> Principal {
            self.ctx.principal
        }
        fn stats(&self) -> &Stats {
            &self.ctx.stats
        }
    };
}

struct Idle {
    ctx: Ctx,
}

impl Stage for Idle {
    stage_basics!();
    fn handle(&mut self, _now: Time, _input: Input, _out: &mut Vec<Action>) {}
}

struct ToyClient {
    ctx: Ctx,
    last: u64,
    outstanding: Option<(u64, Bytes)>,
}

/// The sequencer runs as authentication member 0: the host of a replica hands each message to
/// the member its kind belongs to, and clients' requests belong to authentication.
const SEQUENCER: Principal = Principal::Auth(ReplicaId(0));

impl ToyClient {
    fn request(&self) -> Option<Message> {
        let (id, op) = self.outstanding.as_ref()?;
        let Principal::Client(client) = self.ctx.principal else {
            return None;
        };
        Some(Message::ClientRequest {
            client,
            request_id: RequestId(*id),
            operation: op.clone(),
            read_only: false,
            signature: None,
            config_epoch: 0,
        })
    }
}

impl Stage for ToyClient {
    stage_basics!();
    fn handle(&mut self, now: Time, input: Input, out: &mut Vec<Action>) {
        match input {
            Input::Invoke { operation, .. } => {
                self.last += 1;
                self.outstanding = Some((self.last, operation));
            }
            Input::Timer(Timer::ClientRetransmit) => {}
            Input::Message(env) => {
                if let Message::Reply {
                    request_id,
                    result: ReplyBody::Full(result),
                    ..
                } = &env.message
                {
                    if self.outstanding.as_ref().is_some_and(|(id, _)| *id == request_id.0) {
                        self.outstanding = None;
                        out.push(Action::CancelTimer {
                            timer: Timer::ClientRetransmit,
                        });
                        out.push(Action::Deliver {
                            request_id: *request_id,
                            result: result.clone(),
                        });
                    }
                }
                return;
            }
            _ => return,
        }
        if let Some(message) = self.request() {
            self.ctx.send(vec![SEQUENCER], message, out);
            out.push(Action::SetTimer {
                timer: Timer::ClientRetransmit,
                at: now + 100_000,
            });
        }
    }
}

type LogEntry = (u32, u64, Vec<u8>);

struct Sequencer {
    ctx: Ctx,
    forgetful: bool,
    log: Vec<LogEntry>,
    last: BTreeMap<u32, u64>,
}

impl Sequencer {
    fn new(ctx: Ctx, storage: &Storage, forgetful: bool) -> Sequencer {
        let log: Vec<LogEntry> = storage.values().filter_map(|v| codec::from_bytes(v).ok()).collect();
        let mut last = BTreeMap::new();
        for (c, id, _) in &log {
            last.insert(*c, *id);
        }
        Sequencer {
            ctx,
            forgetful,
            log,
            last,
        }
    }

    fn batch(&self, seqno: usize) -> Message {
        let (c, id, op) = &self.log[seqno - 1];
        Message::NextBatch {
            view: View(0),
            seqno: SeqNo(seqno as u64),
            history: Digest::default(),
            time_us: seqno as u64,
            entries: vec![RequestEntry {
                client: ClientId(*c),
                request_id: RequestId(*id),
                body: RequestBody::Inline(Bytes::copy_from_slice(op)),
            }],
        }
    }
}

impl Stage for Sequencer {
    stage_basics!();
    fn handle(&mut self, _now: Time, input: Input, out: &mut Vec<Action>) {
        let envelope = match input {
            Input::Start if !self.log.is_empty() => {
                self.ctx.send(self.ctx.execs(), self.batch(self.log.len()), out);
                return;
            }
            Input::Message(envelope) => envelope,
            _ => return,
        };
        match &envelope.message {
            Message::ClientRequest {
                client,
                request_id,
                operation,
                ..
            } => {
                let last = self.last.get(&client.0).copied().unwrap_or(0);
                if request_id.0 == last + 1 {
                    self.last.insert(client.0, request_id.0);
                    self.log.push((client.0, request_id.0, operation.to_vec()));
                    if !self.forgetful {
                        let key = format!("order/log/{:010}", self.log.len());
                        out.push(Action::Persist {
                            key,
                            value: Some(codec::to_bytes(self.log.last().unwrap()).into()),
                        });
                    }
                    self.ctx.send(self.ctx.execs(), self.batch(self.log.len()), out);
                } else if request_id.0 <= last {
                    let at = self
                        .log
                        .iter()
                        .rposition(|(c, id, _)| *c == client.0 && *id == request_id.0);
                    if let Some(i) = at {
                        self.ctx.send(self.ctx.execs(), self.batch(i + 1), out);
                    }
                }
            }
            // An execution member's catch-up request: "I executed up to `seqno`".
            Message::BatchComplete { seqno, .. } => {
                let from = seqno.0 as usize + 1;
                for s in from..=self.log.len().min(from + CATCH_UP_MAX - 1) {
                    self.ctx.send(vec![envelope.from], self.batch(s), out);
                }
            }
            _ => self.ctx.stats.bump("unexpected"),
        }
    }
}

struct ToyExec {
    ctx: Ctx,
    next: u64,
    history: Digest,
    kv: KvService,
    buffer: BTreeMap<u64, RequestEntry>,
    replies: BTreeMap<u32, (u64, Bytes)>,
}

impl ToyExec {
    fn reply(&self, client: u32, out: &mut Vec<Action>) {
        if let Some((id, result)) = self.replies.get(&client) {
            let message = Message::Reply {
                request_id: RequestId(*id),
                result: ReplyBody::Full(result.clone()),
                read_only: false,
                pushes_sent: 0,
            };
            self.ctx.send(vec![Principal::Client(ClientId(client))], message, out);
        }
    }

    fn execute(&mut self, entry: RequestEntry, out: &mut Vec<Action>) {
        let RequestBody::Inline(op) = &entry.body else { return };
        self.history = history_digest(&self.history, &entry.digest());
        out.push(Action::Note(Event::Executed {
            seqno: SeqNo(self.next),
            history: self.history,
        }));
        let c = entry.client.0;
        if self.replies.get(&c).is_none_or(|(id, _)| *id < entry.request_id.0) {
            let result = match KvOperation::decode(op) {
                Some(operation) => self.kv.apply(&operation).encode(),
                None => Bytes::new(),
            };
            self.replies.insert(c, (entry.request_id.0, result));
            self.reply(c, out);
        }
        if self.next.is_multiple_of(4) {
            let state_digest = Digest::of(&self.kv.checkpoint());
            out.push(Action::Note(Event::Checkpointed {
                seqno: SeqNo(self.next),
                state_digest,
            }));
        }
        self.next += 1;
    }
}

impl Stage for ToyExec {
    stage_basics!();
    fn handle(&mut self, _now: Time, input: Input, out: &mut Vec<Action>) {
        let Input::Message(envelope) = input else { return };
        let Message::NextBatch { seqno, entries, .. } = &envelope.message else {
            return;
        };
        let Some(entry) = entries.first() else { return };
        if seqno.0 < self.next {
            if self
                .replies
                .get(&entry.client.0)
                .is_some_and(|(id, _)| *id == entry.request_id.0)
            {
                self.reply(entry.client.0, out);
            }
            return;
        }
        if seqno.0 >= self.next + BUFFER_MAX {
            return;
        }
        self.buffer.insert(seqno.0, entry.clone());
        while let Some(entry) = self.buffer.remove(&self.next) {
            self.execute(entry, out);
        }
        if !self.buffer.is_empty() {
            let message = Message::BatchComplete {
                seqno: SeqNo(self.next - 1),
                requests: Vec::new(),
            };
            self.ctx.send(vec![SEQUENCER], message, out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::options::SimOptions;
    use crate::sim::Sim;

    fn toy_opts(seed: u64) -> SimOptions {
        let mut o = SimOptions::new(seed, 1, 0);
        o.workload_us = 1_500_000;
        o
    }

    #[test]
    fn toy_without_faults_passes_every_checker() {
        let mut o = toy_opts(7);
        o.faults = false;
        let report = Sim::new(o, Toy::default()).run();
        assert!(report.violations.is_empty(), "{:?}", report.violations);
        assert!(report.ops_completed > 100, "{}", report.ops_completed);
    }

    #[test]
    fn toy_with_benign_faults_passes_and_faults_are_injected() {
        let mut total = crate::faults::FaultCounts::default();
        for seed in 0..40 {
            let report = Sim::new(toy_opts(seed), Toy::default()).run();
            assert!(report.violations.is_empty(), "seed {seed}: {:?}", report.violations);
            total.add(&crate::faults::FaultCounts(report.fault_counts));
        }
        for class in [
            "loss",
            "duplication",
            "reordering",
            "delay",
            "crash",
            "partition",
            "power_loss",
            "clock_skew",
        ] {
            assert!(total.get(class) > 0, "{class} never injected: {total:?}");
        }
    }

    #[test]
    fn forgetful_toy_is_caught() {
        let caught = (0..40)
            .filter(|&seed| !Sim::new(toy_opts(seed), Toy::forgetful()).run().violations.is_empty())
            .count();
        assert!(caught > 0);
    }

    #[test]
    fn same_seed_same_trace() {
        let a = Sim::new(toy_opts(3), Toy::default()).run();
        let b = Sim::new(toy_opts(3), Toy::default()).run();
        let c = Sim::new(toy_opts(4), Toy::default()).run();
        assert_eq!(a, b);
        assert_ne!(a.trace_hash, c.trace_hash);
    }
}

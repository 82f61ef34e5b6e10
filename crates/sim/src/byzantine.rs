//! Byzantine replicas: a wrapper around the honest stages of a replica that rewrites, drops,
//! delays, forges or replays what they send. It holds only that replica's own [`KeyRing`], so
//! anything it re-seals carries a valid MAC only where the replica itself may speak; forged
//! senders carry MACs that do not verify (unless the protocol is sabotaged with `skip-mac`).
//!
//! Also the Byzantine client, whose request authenticators are valid for some authentication
//! members and garbage for others.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use upright_core::message::PbftMessage;

use bytes::Bytes;
use rand::seq::IndexedRandom;
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use upright_core::config::ClusterConfig;
use upright_core::crypto::{Digest, KeyRing, MatrixRow};
use upright_core::ids::{ClientId, Principal, ReplicaId, RequestId, SeqNo, StageKind, View};
use upright_core::kv::KvReply;
use upright_core::message::{AuthItem, Batch, Envelope, Message, ReplyBody, RequestBody, RequestEntry, Seal, SealFor};
use upright_core::quorum::Quorums;
use upright_core::stage::Time;

use crate::faults::{Behaviour, FaultCounts};

/// The fault class counted for each forged push (the wrong-replies behaviour forges pushes).
pub const FORGED_PUSH_CLASS: &str = "byz_forged_push";

/// The fault class counted for each wrong state-transfer answer (the wrong-checkpoint-token
/// behaviour also serves wrong state).
pub const WRONG_STATE_CLASS: &str = "byz_wrong_state";

/// Envelopes kept for replay.
pub const REPLAY_BUFFER_MAX: usize = 64;
/// Equivocations remembered (to send matching PREPARE/COMMITs for each variant).
pub const VARIANTS_MAX: usize = 256;
/// The client a starving primary ignores.
pub const VICTIM: ClientId = ClientId(0);
/// Junk messages a flooding replica adds to each message it sends.
pub const FLOOD_PER_MESSAGE: usize = 2;

/// One copy to put on the network.
#[derive(Clone, Debug)]
pub struct Outgoing {
    /// Recipients.
    pub to: Vec<Principal>,
    /// The (possibly rewritten) envelope.
    pub envelope: Arc<Envelope>,
    /// Added on top of the network delay.
    pub extra_delay: Time,
}

/// A Byzantine replica.
pub struct Byzantine {
    /// What it does.
    pub behaviour: Behaviour,
    replica: ReplicaId,
    keys: Arc<KeyRing>,
    quorums: Quorums,
    recorded: VecDeque<Arc<Envelope>>,
    /// `(view, seqno) -> (honest digest, variant digest)`.
    variants: BTreeMap<(u64, u64), (Digest, Digest)>,
    /// How long a slow primary holds a PRE-PREPARE (three quarters of the view-change timeout).
    hold_us: Time,
    /// Newest view and seqno seen in its own order member's messages (aims the flood).
    seen: (View, SeqNo),
    /// The honest history digests of the NEXT-BATCHes it sent lately (a fabricated batch
    /// chains onto them).
    histories: BTreeMap<SeqNo, upright_core::crypto::Digest>,
    /// A wrong-state member lies about pages only (for `--sabotage unchecked-pages`, which
    /// only a member still trusted for pages exposes).
    pages_only: bool,
}

fn flip(bytes: &mut [u8]) {
    if let Some(b) = bytes.first_mut() {
        *b ^= 0x5a;
    }
}

impl Byzantine {
    /// Replica `replica` behaving as `behaviour`, with its own keys.
    pub fn new(behaviour: Behaviour, replica: ReplicaId, keys: Arc<KeyRing>, quorums: Quorums) -> Byzantine {
        Byzantine {
            behaviour,
            replica,
            keys,
            quorums,
            recorded: VecDeque::new(),
            variants: BTreeMap::new(),
            hold_us: 150_000,
            seen: (View(0), SeqNo(0)),
            histories: BTreeMap::new(),
            pages_only: false,
        }
    }

    /// A wrong-state member that lies about pages only.
    pub fn lying_about_pages_only(mut self, yes: bool) -> Byzantine {
        self.pages_only = yes;
        self
    }

    /// With the cluster's view-change timeout (a slow primary holds its PRE-PREPAREs for three
    /// quarters of it).
    pub fn with_view_change_timeout(mut self, timeout_us: Time) -> Byzantine {
        self.hold_us = timeout_us / 4 * 3;
        self
    }

    /// What its own member `to` gets of a received envelope (`None`: it ignores it), and
    /// remembers envelopes for replay. A starving primary's order member never sees the
    /// victim's AUTH-REQ items (each item carries its own row, so dropping some leaves the others
    /// valid).
    pub fn incoming(
        &mut self,
        rng: &mut ChaCha8Rng,
        to: Principal,
        envelope: Arc<Envelope>,
        counts: &mut FaultCounts,
    ) -> Option<Arc<Envelope>> {
        if self.behaviour == Behaviour::Replay && rng.random_bool(0.2) {
            self.record(envelope.clone());
        }
        if self.behaviour != Behaviour::StarveClient || !matches!(to, Principal::Order(_)) {
            return Some(envelope);
        }
        let Message::AuthRequest { items } = &envelope.message else {
            return Some(envelope);
        };
        if !items.iter().any(|i| i.entry.client == VICTIM) {
            return Some(envelope);
        }
        counts.bump(Behaviour::StarveClient.class());
        let kept: Vec<AuthItem> = items.iter().filter(|i| i.entry.client != VICTIM).cloned().collect();
        if kept.is_empty() {
            return None;
        }
        let mut filtered = (*envelope).clone();
        filtered.message = Message::AuthRequest { items: kept };
        Some(Arc::new(filtered))
    }

    fn record(&mut self, envelope: Arc<Envelope>) {
        if self.recorded.len() == REPLAY_BUFFER_MAX {
            self.recorded.pop_front();
        }
        self.recorded.push_back(envelope);
    }

    /// Seals `message` as `from` the way `like` was sealed, for recipients `to` (a MAC seal gives
    /// one envelope per recipient).
    fn reseal(&self, from: Principal, message: &Message, like: &Seal, to: &[Principal]) -> Vec<Outgoing> {
        let one = |to: Vec<Principal>, seal_for: SealFor| Outgoing {
            to,
            envelope: Arc::new(Envelope::seal(
                &self.keys,
                &self.quorums,
                from,
                message.clone(),
                seal_for,
            )),
            extra_delay: 0,
        };
        match like {
            Seal::None => vec![one(to.to_vec(), SealFor::Nothing)],
            Seal::Mac(_) => to.iter().map(|&t| one(vec![t], SealFor::One(t))).collect(),
            Seal::Authenticator(_) => {
                let stage = to.first().and_then(|t| t.stage()).unwrap_or(StageKind::Order);
                vec![one(to.to_vec(), SealFor::Stage(stage))]
            }
        }
    }

    /// What actually goes out when the honest stage `from` sends `envelope` to `to`.
    pub fn outgoing(
        &mut self,
        rng: &mut ChaCha8Rng,
        from: Principal,
        to: Vec<Principal>,
        envelope: Arc<Envelope>,
        counts: &mut FaultCounts,
    ) -> Vec<Outgoing> {
        // Messages between its own co-located members pass untouched.
        let (local, remote): (Vec<Principal>, Vec<Principal>) = to
            .into_iter()
            .partition(|p| p.process_index(self.quorums.exec_process_base()) == Some(self.replica.0));
        let mut out = Vec::new();
        if !local.is_empty() {
            out.push(Outgoing {
                to: local,
                envelope: envelope.clone(),
                extra_delay: 0,
            });
        }
        if remote.is_empty() {
            return out;
        }
        let class = self.behaviour.class();
        let honest = Outgoing {
            to: remote.clone(),
            envelope: envelope.clone(),
            extra_delay: 0,
        };
        if let Message::Pbft(
            PbftMessage::PrePrepare { view, seqno, .. }
            | PbftMessage::Prepare { view, seqno, .. }
            | PbftMessage::Commit { view, seqno, .. },
        ) = &envelope.message
        {
            self.seen = self.seen.max((*view, *seqno));
        }
        match self.behaviour {
            Behaviour::Silence => counts.bump(class),
            Behaviour::SlowPrimary => match &envelope.message {
                Message::Pbft(PbftMessage::PrePrepare { batch, .. }) if !batch.entries.is_empty() => {
                    counts.bump(class);
                    out.push(Outgoing {
                        extra_delay: self.hold_us,
                        ..honest
                    });
                }
                _ => out.push(honest),
            },
            // It acts on what it receives (`incoming`).
            Behaviour::StarveClient => out.push(honest),
            Behaviour::LyingViewChange => match &envelope.message {
                Message::Pbft(PbftMessage::ViewChange(signed)) if signed.signer == self.replica => {
                    counts.bump(class);
                    let vc = lie_about_prepared(&signed.value);
                    let message = Message::Pbft(PbftMessage::ViewChange(upright_core::message::Signed::sign(
                        &self.keys,
                        self.replica,
                        vc,
                    )));
                    out.extend(self.reseal(from, &message, &envelope.seal, &remote));
                }
                _ => out.push(honest),
            },
            Behaviour::NewViewDropsCommitted => match &envelope.message {
                Message::Pbft(PbftMessage::NewView(msg)) if msg.new_view.signer == self.replica => {
                    let mut nv = msg.new_view.value.clone();
                    match nv.batches.iter_mut().find(|(_, b)| !b.entries.is_empty()) {
                        Some((_, batch)) => {
                            counts.bump(class);
                            *batch = Batch {
                                time_us: 0,
                                entries: Vec::new(),
                            };
                            let message = Message::Pbft(PbftMessage::NewView(upright_core::message::NewViewMessage {
                                new_view: upright_core::message::Signed::sign(&self.keys, self.replica, nv),
                                view_changes: msg.view_changes.clone(),
                            }));
                            out.extend(self.reseal(from, &message, &envelope.seal, &remote));
                        }
                        None => out.push(honest),
                    }
                }
                _ => out.push(honest),
            },
            Behaviour::WrongState => match &envelope.message {
                // Manifests are lied about only now and then: a member caught at the manifest is
                // not asked for pages, and the page checks must be exercised too.
                Message::StateManifest { .. } | Message::StateChunk { .. } if self.pages_only => out.push(honest),
                Message::StateManifest { .. } if rng.random_bool(0.7) => out.push(honest),
                Message::StateChunk { .. }
                | Message::PageAnswer { .. }
                | Message::StateManifest { .. }
                | Message::ObjectCheckpoint { .. } => {
                    counts.bump(class);
                    let message = wrong_state(&envelope.message, !self.pages_only && rng.random_bool(0.3));
                    out.extend(self.reseal(from, &message, &envelope.seal, &remote));
                }
                _ => out.push(honest),
            },
            Behaviour::FloodPeers => {
                out.push(honest);
                for _ in 0..FLOOD_PER_MESSAGE {
                    if let Some(junk) = self.junk(rng, from, &remote) {
                        counts.bump(class);
                        out.push(junk);
                    }
                }
            }
            Behaviour::ForgedAuth => match &envelope.message {
                Message::AuthRequest { items } if !items.is_empty() => {
                    counts.bump(class);
                    let mut items = items.clone();
                    let forged = self.forge_item(&items[0].entry);
                    items.push(forged);
                    let message = Message::AuthRequest { items };
                    out.extend(self.reseal(from, &message, &envelope.seal, &remote));
                }
                _ => out.push(honest),
            },
            Behaviour::Slowness => {
                counts.bump(class);
                out.push(Outgoing {
                    extra_delay: rng.random_range(50_000..300_000),
                    ..honest
                });
            }
            Behaviour::CorruptMacs => {
                if let Some(bad) = corrupt_auth_items(rng, &envelope) {
                    counts.bump("byz_corrupt_auth_item");
                    out.push(Outgoing {
                        envelope: Arc::new(bad),
                        ..honest
                    });
                } else if rng.random_bool(0.5) {
                    counts.bump(class);
                    out.push(Outgoing {
                        envelope: Arc::new(corrupt(&envelope)),
                        ..honest
                    });
                } else {
                    out.push(honest);
                }
            }
            Behaviour::ForgeSender => {
                out.push(honest);
                out.extend(self.forge(rng, &envelope, &remote, counts));
            }
            Behaviour::WrongReplies => match &envelope.message {
                Message::Reply {
                    request_id,
                    result,
                    read_only,
                    pushes_sent,
                } => {
                    counts.bump(class);
                    // A read-only reply is either a wrong result or the right digest without
                    // its body (which must never be accepted on its own).
                    let result = if *read_only && rng.random_bool(0.5) {
                        ReplyBody::Digest(result.result_digest())
                    } else {
                        wrong(result)
                    };
                    let message = Message::Reply {
                        request_id: *request_id,
                        result,
                        read_only: *read_only,
                        pushes_sent: *pushes_sent,
                    };
                    out.extend(self.reseal(from, &message, &envelope.seal, &remote));
                }
                Message::TentativeReply {
                    request_id,
                    result,
                    view,
                    history,
                    pushes_sent,
                } => {
                    // A wrong result, or the right one for a batch of another view or history
                    // (a tentative execution nobody else did).
                    counts.bump(class);
                    let (result, view, history) = if rng.random_bool(0.5) {
                        (wrong(result), *view, *history)
                    } else {
                        let mut other = *history;
                        other.0[0] ^= 1;
                        (result.clone(), upright_core::ids::View(view.0 + 1), other)
                    };
                    let message = Message::TentativeReply {
                        request_id: *request_id,
                        result,
                        view,
                        history,
                        pushes_sent: *pushes_sent,
                    };
                    out.extend(self.reseal(from, &message, &envelope.seal, &remote));
                }
                Message::Push { stream, seq, payload } => {
                    // A forged push under the same number, and now and then a false claim that
                    // the next pushes are gone.
                    counts.bump(FORGED_PUSH_CLASS);
                    let forged = Message::Push {
                        stream: stream.clone(),
                        seq: *seq,
                        payload: Bytes::from([&payload[..], b"<forged>"].concat()),
                    };
                    out.extend(self.reseal(from, &forged, &envelope.seal, &remote));
                    if rng.random_bool(0.3) {
                        let gap = Message::PushGap {
                            stream: stream.clone(),
                            next: *seq,
                            resume_at: seq + 5,
                        };
                        out.extend(self.reseal(from, &gap, &envelope.seal, &remote));
                    }
                }
                _ => out.push(honest),
            },
            Behaviour::WrongCheckpointTokens => match &envelope.message {
                Message::CheckpointToken { seqno, exec_state } => {
                    counts.bump(class);
                    let message = Message::CheckpointToken {
                        seqno: *seqno,
                        exec_state: Digest::of(&exec_state.0),
                    };
                    out.extend(self.reseal(from, &message, &envelope.seal, &remote));
                }
                // It asks the order stage for wake-ups earlier than its service wants (hoping
                // to hasten agreed time), and for one when the service wants none.
                Message::WakeAt { seqno, at_us } => {
                    counts.bump(class);
                    let message = Message::WakeAt {
                        seqno: *seqno,
                        at_us: Some(at_us.map_or(1, |at| at / 2 + 1)),
                    };
                    out.extend(self.reseal(from, &message, &envelope.seal, &remote));
                }
                _ => out.push(honest),
            },
            Behaviour::Replay => {
                self.record(envelope.clone());
                out.push(honest);
                if rng.random_bool(0.1) {
                    if let Some(old) = self.recorded.get(rng.random_range(0..self.recorded.len())) {
                        counts.bump(class);
                        let extra_delay = rng.random_range(0..500_000);
                        out.push(Outgoing {
                            to: remote,
                            envelope: old.clone(),
                            extra_delay,
                        });
                    }
                }
            }
            Behaviour::EquivocatingPrimary => out.extend(self.equivocate(from, &envelope, remote, counts)),
            Behaviour::FabricatedBatch => match self.fabricate_batch(&envelope.message) {
                Some(message) => {
                    counts.bump(class);
                    out.extend(self.reseal(from, &message, &envelope.seal, &remote));
                }
                None => out.push(honest),
            },
            Behaviour::Mutate => {
                // Mostly the mutated message alone, now and then beside the honest one.
                let mutated = rng
                    .random_bool(0.7)
                    .then(|| crate::mutate::mutate(rng, &self.keys, self.replica, &envelope.message))
                    .flatten();
                match mutated {
                    Some((message, kind)) => {
                        counts.bump(class);
                        counts.bump(kind);
                        if rng.random_bool(0.2) {
                            out.push(honest);
                        }
                        out.extend(self.reseal(from, &message, &envelope.seal, &remote));
                    }
                    None => out.push(honest),
                }
            }
        }
        out
    }

    /// [`Behaviour::FabricatedBatch`]: for a NEXT-BATCH with requests, the same batch without
    /// its last request, under the history digest that chains it onto the honest history of the
    /// slot before (remembered from the NEXT-BATCHes this member sent), so an execution member
    /// that checks one copy against its own history finds nothing wrong.
    fn fabricate_batch(&mut self, message: &Message) -> Option<Message> {
        let Message::NextBatch {
            view,
            seqno,
            history,
            time_us,
            entries,
        } = message
        else {
            return None;
        };
        self.histories.insert(*seqno, *history);
        while self.histories.len() > 64 {
            self.histories.pop_first();
        }
        let previous = if seqno.0 == 1 {
            upright_core::crypto::Digest::default()
        } else {
            *self.histories.get(&SeqNo(seqno.0 - 1))?
        };
        if entries.is_empty() {
            return None;
        }
        let fewer = entries[..entries.len() - 1].to_vec();
        let digest = upright_core::message::batch_digest(*time_us, fewer.iter().map(RequestEntry::digest));
        Some(Message::NextBatch {
            view: *view,
            seqno: *seqno,
            history: upright_core::message::history_digest(&previous, &digest),
            time_us: *time_us,
            entries: fewer,
        })
    }

    /// An AUTH-REQ item for the request after `real` of the same client, which the client never
    /// sent: another operation, under this member's own valid row.
    fn forge_item(&self, real: &RequestEntry) -> AuthItem {
        let operation = match &real.body {
            RequestBody::Inline(op) => Bytes::from([&op[..], b"<forged>"].concat()),
            RequestBody::Digest(d) => Bytes::copy_from_slice(&Digest::of(&d.0).0),
        };
        let entry = RequestEntry {
            client: real.client,
            request_id: RequestId(real.request_id.0 + 1),
            body: RequestBody::Inline(operation),
        };
        let row = MatrixRow {
            signer: self.replica,
            authenticator: self
                .keys
                .authenticator(ClusterConfig::order_members(&self.quorums), &entry.digest()),
        };
        AuthItem { entry, row }
    }

    /// One junk message from its stage `from` to `to`, well-formed and under its own valid
    /// MACs: a vote for a digest nobody proposed near the seqnos in use, a checkpoint token for
    /// a state nobody has, a fetch of state or pages that do not exist, a LAST-EXEC.
    fn junk(&self, rng: &mut ChaCha8Rng, from: Principal, to: &[Principal]) -> Option<Outgoing> {
        let (view, seqno) = self.seen;
        let near = SeqNo(seqno.0 + rng.random_range(0..40));
        let digest = Digest::of(&rng.random::<u64>().to_le_bytes());
        let (message, seal_for) = match (from, to.first()?) {
            (Principal::Order(_), Principal::Order(_)) => match rng.random_range(0..3) {
                0 => (
                    Message::Pbft(PbftMessage::Prepare {
                        view,
                        seqno: near,
                        digest,
                    }),
                    SealFor::Stage(StageKind::Order),
                ),
                1 => (
                    Message::Pbft(PbftMessage::Commit {
                        view,
                        seqno: near,
                        digest,
                    }),
                    SealFor::Stage(StageKind::Order),
                ),
                _ => (
                    Message::Pbft(PbftMessage::FetchOrderCheckpoint { seqno: near, digest }),
                    SealFor::Nothing,
                ),
            },
            (Principal::Exec(_), Principal::Order(_)) => match rng.random_range(0..2) {
                0 => (
                    Message::CheckpointToken {
                        seqno: near,
                        exec_state: digest,
                    },
                    SealFor::Stage(StageKind::Order),
                ),
                _ => (Message::LastExecuted { seqno: near }, SealFor::Stage(StageKind::Order)),
            },
            (Principal::Exec(_), Principal::Exec(_)) => match rng.random_range(0..2) {
                0 => (
                    Message::FetchState {
                        seqno: near,
                        state_digest: digest,
                        chunk: Some(rng.random_range(0..8)),
                    },
                    SealFor::Stage(StageKind::Exec),
                ),
                _ => (
                    Message::FetchPages {
                        seqno: near,
                        state_digest: digest,
                        nodes: vec![(1, rng.random_range(0..4))],
                        pages: vec![rng.random_range(0..64)],
                    },
                    SealFor::Stage(StageKind::Exec),
                ),
            },
            _ => return None,
        };
        Some(Outgoing {
            to: to.to_vec(),
            envelope: Arc::new(Envelope::seal(&self.keys, &self.quorums, from, message, seal_for)),
            extra_delay: 0,
        })
    }

    /// Copies claiming another member of the same stage as sender; reply copies carry a wrong
    /// result and claim every other execution member.
    fn forge(
        &self,
        rng: &mut ChaCha8Rng,
        envelope: &Envelope,
        remote: &[Principal],
        counts: &mut FaultCounts,
    ) -> Vec<Outgoing> {
        let others: Vec<u32> = (0..self.quorums.n_order as u32)
            .filter(|&i| i != self.replica.0)
            .collect();
        let claim = |i: u32| match envelope.from {
            Principal::Auth(_) => Principal::Auth(ReplicaId(i)),
            Principal::Order(_) => Principal::Order(ReplicaId(i)),
            Principal::Exec(_) => Principal::Exec(ReplicaId(i)),
            client => client,
        };
        let mut out = Vec::new();
        match &envelope.message {
            Message::Reply {
                request_id,
                result,
                read_only,
                pushes_sent,
            } => {
                let message = Message::Reply {
                    request_id: *request_id,
                    result: wrong(result),
                    read_only: *read_only,
                    pushes_sent: *pushes_sent,
                };
                for &i in others.iter().filter(|&&i| (i as usize) < self.quorums.n_exec) {
                    counts.bump(Behaviour::ForgeSender.class());
                    out.extend(self.reseal(claim(i), &message, &envelope.seal, remote));
                }
            }
            message => {
                if let Some(&i) = others.choose(rng) {
                    counts.bump(Behaviour::ForgeSender.class());
                    out.extend(self.reseal(claim(i), message, &envelope.seal, remote));
                }
            }
        }
        out
    }

    fn equivocate(
        &mut self,
        from: Principal,
        envelope: &Arc<Envelope>,
        remote: Vec<Principal>,
        counts: &mut FaultCounts,
    ) -> Vec<Outgoing> {
        let honest = Outgoing {
            to: remote.clone(),
            envelope: envelope.clone(),
            extra_delay: 0,
        };
        if !matches!(from, Principal::Order(_)) {
            return vec![honest];
        }
        // Backups split into two halves by index.
        let half = |p: &Principal| match p {
            Principal::Order(r) => {
                let position = if r.0 > self.replica.0 { r.0 - 1 } else { r.0 };
                position < (self.quorums.n_order as u32 - 1) / 2
            }
            _ => true,
        };
        let (a, b): (Vec<Principal>, Vec<Principal>) = remote.iter().partition(|p| half(p));
        let mut out = Vec::new();
        let split = |this: &Self, honest_msg: Message, variant: Message, out: &mut Vec<Outgoing>| {
            if !a.is_empty() {
                out.extend(this.reseal(from, &honest_msg, &envelope.seal, &a));
            }
            if !b.is_empty() {
                out.extend(this.reseal(from, &variant, &envelope.seal, &b));
            }
        };
        match &envelope.message {
            Message::Pbft(PbftMessage::PrePrepare { view, seqno, batch }) if !b.is_empty() => {
                counts.bump(Behaviour::EquivocatingPrimary.class());
                let variant_batch = vary(batch);
                let variant_digest = variant_batch.digest();
                if self.variants.len() == VARIANTS_MAX {
                    self.variants.pop_first();
                }
                self.variants
                    .insert((view.0, seqno.0), (batch.digest(), variant_digest));
                let (view, seqno) = (*view, *seqno);
                split(
                    self,
                    envelope.message.clone(),
                    Message::Pbft(PbftMessage::PrePrepare {
                        view,
                        seqno,
                        batch: variant_batch,
                    }),
                    &mut out,
                );
                // Matching votes for the variant to its half.
                let prepare = Message::Pbft(PbftMessage::Prepare {
                    view,
                    seqno,
                    digest: variant_digest,
                });
                let commit = Message::Pbft(PbftMessage::Commit {
                    view,
                    seqno,
                    digest: variant_digest,
                });
                let seal_like = Seal::Authenticator(upright_core::crypto::Authenticator { macs: Vec::new() });
                for message in [prepare, commit] {
                    out.extend(self.reseal(from, &message, &seal_like, &b));
                }
            }
            Message::Pbft(PbftMessage::Prepare { view, seqno, digest })
            | Message::Pbft(PbftMessage::Commit { view, seqno, digest }) => {
                match self.variants.get(&(view.0, seqno.0)) {
                    Some(&(orig, variant)) if orig == *digest => {
                        let variant_msg = match &envelope.message {
                            Message::Pbft(PbftMessage::Prepare { .. }) => Message::Pbft(PbftMessage::Prepare {
                                view: *view,
                                seqno: *seqno,
                                digest: variant,
                            }),
                            _ => Message::Pbft(PbftMessage::Commit {
                                view: *view,
                                seqno: *seqno,
                                digest: variant,
                            }),
                        };
                        split(self, envelope.message.clone(), variant_msg, &mut out);
                    }
                    _ => out.push(honest),
                }
            }
            _ => out.push(honest),
        }
        out
    }
}

/// A different batch for the same slot: one entry fewer, or a later time.
fn vary(batch: &Batch) -> Batch {
    let mut variant = batch.clone();
    if variant.entries.len() > 1 {
        variant.entries.pop();
    } else {
        variant.time_us += 1;
    }
    variant
}

/// A VIEW-CHANGE that lies about prepared certificates: every claim names another batch (with
/// that batch's digest, so only the quorum rules can tell), and a batch that never prepared is
/// claimed at the seqno after them, in the highest view below the new one.
fn lie_about_prepared(vc: &upright_core::message::ViewChange) -> upright_core::message::ViewChange {
    let mut vc = vc.clone();
    for claim in &mut vc.prepared {
        claim.batch = vary(&claim.batch);
        claim.digest = claim.batch.digest();
    }
    let after = vc
        .prepared
        .iter()
        .map(|c| c.seqno)
        .chain(vc.stable.as_ref().map(|s| s.checkpoint.seqno))
        .max()
        .unwrap_or(SeqNo(0));
    let invented = Batch {
        time_us: 1,
        entries: Vec::new(),
    };
    vc.prepared.push(upright_core::message::PreparedClaim {
        seqno: SeqNo(after.0 + 1),
        view: View(vc.new_view.0.saturating_sub(1)),
        digest: invented.digest(),
        batch: invented,
    });
    vc
}

/// A state-transfer answer with its data altered (tree nodes too if `nodes`: a member caught
/// with a wrong node is not asked for pages, and the page checks must be exercised too).
fn wrong_state(message: &Message, nodes: bool) -> Message {
    let mut message = message.clone();
    match &mut message {
        Message::StateManifest {
            total_bytes,
            chunk_digests,
            ..
        } => {
            if let Some(first) = chunk_digests.first_mut() {
                *first = Digest::of(&first.0);
            } else {
                *total_bytes += 1;
            }
        }
        Message::StateChunk { data, .. } => {
            let mut bytes = data.to_vec();
            bytes.push(0);
            flip(&mut bytes);
            *data = Bytes::from(bytes);
        }
        Message::PageAnswer {
            nodes: answered_nodes,
            pages,
            ..
        } => {
            for (_, children) in answered_nodes.iter_mut().filter(|_| nodes) {
                if let Some(first) = children.first_mut() {
                    *first = Digest::of(&first.0);
                }
            }
            // Well-formed lies: each page answered with another's contents (an empty page when
            // only one was asked), so only the digest check tells them apart.
            if pages.len() == 1 {
                pages[0].1 = Bytes::new();
            } else if let Some(first) = pages.first().map(|(_, p)| p.clone()) {
                for k in 0..pages.len() {
                    pages[k].1 = pages.get(k + 1).map_or(first.clone(), |(_, p)| p.clone());
                }
            }
        }
        Message::ObjectCheckpoint { objects, replies, .. } => {
            // Well-formed lies: each object holds a value nobody wrote (as the core KV encodes
            // an object), each reply a value nobody wrote.
            let planted = Bytes::from(upright_core::codec::to_bytes(&(
                Some(Bytes::from_static(b"byzantine")),
                Vec::<upright_core::ids::ClientId>::new(),
            )));
            for (_, state) in objects.iter_mut() {
                *state = Some(planted.clone());
            }
            for (_, _, reply) in replies.iter_mut() {
                *reply = KvReply::Value(Some(Bytes::from_static(b"byzantine"))).encode();
            }
        }
        _ => {}
    }
    message
}

fn wrong(result: &ReplyBody) -> ReplyBody {
    match result {
        ReplyBody::Full(_) => ReplyBody::Full(KvReply::Value(Some(Bytes::from_static(b"byzantine"))).encode()),
        ReplyBody::Digest(d) => ReplyBody::Digest(Digest::of(&d.0)),
    }
}

/// The envelope with bits flipped in every MAC, authenticator, matrix row or signature it carries.
/// The envelope with its MACs, authenticator, matrix rows or signature flipped.
pub fn corrupt(envelope: &Envelope) -> Envelope {
    let mut e = envelope.clone();
    match &mut e.seal {
        Seal::Mac(mac) => flip(&mut mac.0),
        Seal::Authenticator(a) => a.macs.iter_mut().for_each(|m| flip(&mut m.0)),
        Seal::None => {}
    }
    match &mut e.message {
        Message::AuthRequest { items } => items
            .iter_mut()
            .for_each(|i| i.row.authenticator.macs.iter_mut().for_each(|m| flip(&mut m.0))),
        Message::Pbft(PbftMessage::Checkpoint(s)) => flip(&mut s.signature.0),
        Message::Pbft(PbftMessage::ViewChange(s)) => flip(&mut s.signature.0),
        Message::Pbft(PbftMessage::NewView(s)) => flip(&mut s.new_view.signature.0),
        Message::Pbft(PbftMessage::OrderCheckpointState(s)) => {
            s.votes.iter_mut().for_each(|v| flip(&mut v.signature.0))
        }
        _ => {}
    }
    e
}

/// Half of the multi-item AUTH-REQs: one item's row corrupted (the others intact) and, half of
/// those times, an item duplicated. `None` for other messages.
fn corrupt_auth_items(rng: &mut ChaCha8Rng, envelope: &Envelope) -> Option<Envelope> {
    match &envelope.message {
        Message::AuthRequest { items } if items.len() > 1 && rng.random_bool(0.5) => {
            let mut items = items.clone();
            let victim = rng.random_range(0..items.len());
            items[victim]
                .row
                .authenticator
                .macs
                .iter_mut()
                .for_each(|m| flip(&mut m.0));
            if items.len() < upright_core::limits::AUTH_ITEMS_MAX && rng.random_bool(0.5) {
                let copy = items[rng.random_range(0..items.len())].clone();
                items.push(copy);
            }
            Some(Envelope::new(
                envelope.from,
                Message::AuthRequest { items },
                envelope.seal.clone(),
            ))
        }
        _ => None,
    }
}

/// The Byzantine client's authenticator: garbage for a random subset of authentication members.
pub fn inconsistent_authenticator(rng: &mut ChaCha8Rng, envelope: &Envelope) -> Option<Envelope> {
    let Seal::Authenticator(a) = &envelope.seal else {
        return None;
    };
    let mut e = envelope.clone();
    let mut bad = a.macs.iter().map(|_| rng.random_bool(0.5)).collect::<Vec<bool>>();
    if !bad.iter().any(|&b| b) {
        bad[0] = true;
    }
    if let Seal::Authenticator(a) = &mut e.seal {
        for (mac, bad) in a.macs.iter_mut().zip(bad) {
            if bad {
                flip(&mut mac.0);
            }
        }
    }
    Some(e)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use rand::SeedableRng;
    use upright_core::config::{ClientInfo, ClusterConfig, Knobs, ReplicaInfo};
    use upright_core::crypto::SecretKeys;
    use upright_core::ids::{ClientId, Process, RequestId, SeqNo, View};

    pub(crate) fn setup() -> (ClusterConfig, Vec<Arc<KeyRing>>, Quorums) {
        let q = Quorums::new(1, 1).unwrap();
        let secrets: Vec<SecretKeys> = (0..5).map(|i| SecretKeys::from_seed([i as u8 + 9; 32])).collect();
        let config = ClusterConfig {
            cluster_name: "t".into(),
            u: 1,
            r: 1,
            replicas: (0..4)
                .map(|i| ReplicaInfo {
                    id: ReplicaId(i),
                    keys: secrets[i as usize].public(),
                })
                .collect(),
            clients: vec![ClientInfo {
                id: ClientId(0),
                keys: secrets[4].public(),
            }],
            knobs: Knobs::default(),
            admin: None,
            epoch: 0,
            origin: None,
            protocol: Default::default(),
            selective_execution: false,
            separate_stages: false,
            exec_u: None,
        };
        let mut rings: Vec<Arc<KeyRing>> = (0..4)
            .map(|i| {
                Arc::new(KeyRing::new(
                    &config,
                    Process::Replica(ReplicaId(i)),
                    &secrets[i as usize],
                ))
            })
            .collect();
        rings.push(Arc::new(KeyRing::new(
            &config,
            Process::Client(ClientId(0)),
            &secrets[4],
        )));
        (config, rings, q)
    }

    fn order(i: u32) -> Principal {
        Principal::Order(ReplicaId(i))
    }

    #[test]
    fn equivocating_primary_sends_two_valid_batches_and_votes() {
        let (_c, rings, q) = setup();
        let mut rng = ChaCha8Rng::seed_from_u64(0);
        let mut counts = FaultCounts::default();
        let mut byz = Byzantine::new(Behaviour::EquivocatingPrimary, ReplicaId(0), rings[0].clone(), q);
        let batch = Batch {
            time_us: 10,
            entries: vec![],
        };
        let pp = Message::Pbft(PbftMessage::PrePrepare {
            view: View(0),
            seqno: SeqNo(1),
            batch: batch.clone(),
        });
        let env = Arc::new(Envelope::seal(
            &rings[0],
            &q,
            order(0),
            pp,
            SealFor::Stage(StageKind::Order),
        ));
        let out = byz.outgoing(&mut rng, order(0), vec![order(1), order(2), order(3)], env, &mut counts);
        assert_eq!(counts.get("byz_equivocation"), 1);
        let mut digests = std::collections::BTreeSet::new();
        for o in &out {
            for &to in &o.to {
                let i = to.replica().unwrap().0 as usize;
                assert!(
                    o.envelope.open(&rings[i], to, None).is_ok(),
                    "re-sealed with its own keys"
                );
                if let Message::Pbft(PbftMessage::PrePrepare { batch, .. }) = &o.envelope.message {
                    digests.insert(batch.digest());
                }
            }
        }
        assert_eq!(digests.len(), 2, "two different batches");
        assert!(out
            .iter()
            .any(|o| matches!(o.envelope.message, Message::Pbft(PbftMessage::Commit { .. }))));
    }

    #[test]
    fn forged_and_corrupted_copies_do_not_verify_but_wrong_replies_do() {
        let (_c, rings, q) = setup();
        let mut rng = ChaCha8Rng::seed_from_u64(0);
        let mut counts = FaultCounts::default();
        let client = Principal::Client(ClientId(0));
        let exec0 = Principal::Exec(ReplicaId(0));
        let reply = Message::Reply {
            request_id: RequestId(1),
            result: ReplyBody::Full(KvReply::Done.encode()),
            read_only: false,
            pushes_sent: 0,
        };
        let env = Arc::new(Envelope::seal(&rings[0], &q, exec0, reply, SealFor::One(client)));
        let mut forge = Byzantine::new(Behaviour::ForgeSender, ReplicaId(0), rings[0].clone(), q);
        let out = forge.outgoing(&mut rng, exec0, vec![client], env.clone(), &mut counts);
        assert_eq!(out.len(), 3, "honest + two forged exec members");
        assert!(out[0].envelope.open(&rings[4], client, None).is_ok());
        for o in &out[1..] {
            assert_ne!(o.envelope.from, exec0);
            assert!(o.envelope.open(&rings[4], client, None).is_err());
            assert!(o
                .envelope
                .open(&rings[4], client, Some(upright_core::config::Sabotage::SkipMac))
                .is_ok());
        }
        let mut wrong = Byzantine::new(Behaviour::WrongReplies, ReplicaId(0), rings[0].clone(), q);
        let out = wrong.outgoing(&mut rng, exec0, vec![client], env.clone(), &mut counts);
        assert!(out[0].envelope.open(&rings[4], client, None).is_ok());
        assert_ne!(out[0].envelope.message, env.message);
        let bad = corrupt(&env);
        assert!(bad.open(&rings[4], client, None).is_err());
    }

    #[test]
    fn corrupted_auth_request_batches_spoil_one_item_and_sometimes_duplicate_one() {
        use upright_core::config::ClusterConfig;
        use upright_core::crypto::{MatrixRow, MatrixSignature};
        use upright_core::message::{AuthItem, RequestBody, RequestEntry};
        let (_c, rings, q) = setup();
        let auth0 = Principal::Auth(ReplicaId(0));
        let items: Vec<AuthItem> = (1..=4u64)
            .map(|rid| {
                let entry = RequestEntry {
                    client: ClientId(0),
                    request_id: RequestId(rid),
                    body: RequestBody::Inline(Bytes::from(vec![rid as u8])),
                };
                let row = MatrixRow {
                    signer: ReplicaId(0),
                    authenticator: rings[0].authenticator(ClusterConfig::order_members(&q), &entry.digest()),
                };
                AuthItem { entry, row }
            })
            .collect();
        let env = Arc::new(Envelope::seal(
            &rings[0],
            &q,
            auth0,
            Message::AuthRequest { items },
            SealFor::Nothing,
        ));
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let mut counts = FaultCounts::default();
        let mut byz = Byzantine::new(Behaviour::CorruptMacs, ReplicaId(0), rings[0].clone(), q);
        let (mut duplicated, mut one_spoiled) = (false, false);
        for _ in 0..40 {
            let out = byz.outgoing(&mut rng, auth0, vec![order(1)], env.clone(), &mut counts);
            let Message::AuthRequest { items } = &out[0].envelope.message else {
                panic!("still an AUTH-REQ")
            };
            let valid = items
                .iter()
                .filter(|i| {
                    let matrix = MatrixSignature {
                        rows: vec![i.row.clone()],
                    };
                    rings[1].count_valid_matrix_rows(1, q.n_auth, &i.entry.digest(), &matrix) == 1
                })
                .count();
            if out[0].envelope.message == env.message {
                assert_eq!(valid, 4, "honest copy");
            } else if items.len() == 5 {
                duplicated = true;
                assert!(valid == 3 || valid == 4, "one spoiled, maybe the copy of a good one");
            } else {
                assert!(
                    valid == 3 || valid == 0,
                    "one item spoiled, or every row (whole message)"
                );
                one_spoiled |= valid == 3;
            }
        }
        assert!(counts.get("byz_corrupt_auth_item") > 0 && duplicated && one_spoiled);
    }

    #[test]
    fn inconsistent_authenticator_is_bad_for_some_members_only_sometimes() {
        let (_c, rings, q) = setup();
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let client = Principal::Client(ClientId(0));
        let request = Message::ClientRequest {
            client: ClientId(0),
            request_id: RequestId(1),
            operation: Bytes::from_static(b"x"),
            read_only: false,
            signature: None,
            config_epoch: 0,
        };
        let env = Envelope::seal(&rings[4], &q, client, request, SealFor::Stage(StageKind::Auth));
        let mut some_good = false;
        for _ in 0..10 {
            let bad = inconsistent_authenticator(&mut rng, &env).unwrap();
            let ok: Vec<bool> = (0..4)
                .map(|i| bad.open(&rings[i], Principal::Auth(ReplicaId(i as u32)), None).is_ok())
                .collect();
            assert!(ok.iter().any(|&o| !o));
            some_good |= ok.iter().any(|&o| o);
        }
        assert!(some_good);
    }
}

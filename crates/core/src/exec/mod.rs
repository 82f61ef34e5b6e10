//! The execution stage (UpRight's execution replicas; PROTOCOL.md normal case steps 5-7,
//! checkpoints, catch-up of execution members).
//!
//! Layout by concept:
//! - `batches`: NEXT-BATCH quorum collection per sequence number;
//! - [`fetch`]: bodies of requests ordered by digest, fetched from the authentication stage;
//! - `execute`: in-order execution of whole batches, replies, BATCH-COMPLETE, RETRANSMIT;
//! - [`reply_cache`]: last reply per client and the full/digest reply rule;
//! - [`checkpoint`]: the execution checkpoint, its chunking, digest and storage;
//! - `state_transfer`: LOAD-CP quorum, fetching a checkpoint from peers, serving ours;
//! - `read_only`: READ-ONLY requests answered at once from the current state, outside the order;
//! - [`pushes`]: messages the service pushes to clients, numbered per client, kept for resends;
//! - [`paged`]: a paged service's page tree: incremental checkpoints, transfer by difference;
//! - [`keys`]: the key schedule of an execution-only process (separate stages);
//! - [`selector`]: ODRC's selector, which requests a member runs under selective execution
//!   (docs/ODRC.md);
//! - `selective`: selective execution with the selector, OBJECT-CP and the checkpoint wait.

pub mod checkpoint;
mod execute;
pub mod fetch;
pub mod keys;
pub mod paged;
pub mod pushes;
mod read_only;
mod recovery;
pub mod reply_cache;
mod selective;
pub mod selector;
mod state_transfer;
mod tentative;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_cpu;
#[cfg(test)]
mod tests_paged;
#[cfg(test)]
mod tests_read_only;
#[cfg(test)]
mod tests_recovery;
#[cfg(test)]
mod tests_selective;
#[cfg(test)]
mod tests_tentative;

use std::collections::BTreeSet;
use std::sync::Arc;

use crate::config::{ClusterConfig, ConfigError};
use crate::contract::load::LoadVotes;
use crate::contract::next_batch::{BatchCollector, Offered};
use crate::contract::{self, ExecSide, Routed};
use crate::crypto::{Digest, KeyRing};
use crate::ids::{ClientId, Principal, ReplicaId, RequestId, SeqNo, View};
use crate::message::{Envelope, Message, SealFor};
use crate::quorum::Quorums;
use crate::service::Service;
use crate::stage::{Action, Input, Stage, Stats, Storage, Time, Timer};

use checkpoint::CheckpointStore;
use fetch::Fetcher;
use pushes::PushLog;
use read_only::ReadOnlyNonces;
use reply_cache::ReplyCache;
use state_transfer::Transfer;

pub use checkpoint::ExecCheckpoint;

/// The execution stage: member `id` of the execution stage, running one replica of the service.
pub struct ExecStage {
    config: Arc<ClusterConfig>,
    q: Quorums,
    id: ReplicaId,
    keys: Arc<KeyRing>,
    service: Box<dyn Service + Send>,
    /// NEW-KEYs sent in answer to bad seals (`crate::session::KeyRepair`).
    key_repair: crate::session::KeyRepair,
    /// The process's key schedule, when this member is its key member (an execution-only
    /// process: `keys.rs`).
    key_schedule: Option<crate::session::ReplicaKeys>,
    stats: Stats,
    /// Configured clients; requests of others are skipped (bounds the reply cache).
    clients: BTreeSet<ClientId>,
    /// Last executed batch.
    last_executed: SeqNo,
    /// History digest `H_last_executed`.
    history: Digest,
    /// Time of the last executed non-empty batch.
    last_time_us: u64,
    /// The service's `wake_at` last reported to the order stage (WAKE-AT); `None` before the
    /// first report.
    wake_reported: Option<Option<u64>>,
    replies: ReplyCache,
    batches: BatchCollector,
    fetcher: Fetcher,
    /// A body is fetched first from authentication member `(client + fetch_from) mod n_auth`;
    /// moved on by one at each retry tick that finds a body still missing, so a member that is
    /// down (or does not answer) costs one retry interval, not one per fetch.
    fetch_from: u32,
    /// Authentication members that left a first FETCH unanswered until the retry tick: first
    /// FETCHes skip them until one of them answers a COMMAND (a member that is down or silent
    /// otherwise costs a retry interval on every body first asked of it).
    fetch_suspects: std::collections::BTreeSet<u32>,
    checkpoints: CheckpointStore,
    load_votes: LoadVotes,
    transfer: Option<Transfer>,
    /// `last_executed` at the previous retry tick (no change = no progress).
    progress_mark: SeqNo,
    /// Read-only path: newest read-only nonce answered per client.
    read_only_nonces: ReadOnlyNonces,
    /// Pushed messages: numbering and the kept ones.
    pushes: PushLog,
    /// A paged service's page tree (`None` for a service without pages).
    paged: Option<paged::PagedState>,
    /// A proactive recovery distrusts the stored state until a certified checkpoint is
    /// installed (`recovery.rs`).
    distrusted: bool,
    /// The batch executed tentatively and not yet committed (`tentative.rs`).
    tentative: Option<tentative::Tentative>,
    /// The service's checkpoint of its initial state, taken at a first start when tentative
    /// execution is configured: what a tentative batch before the first checkpoint is rolled
    /// back to.
    initial: Option<bytes::Bytes>,
    /// Selective execution (`selective_execution = true`; `selective.rs`).
    selective: Option<selective::Selective>,
}

impl ExecStage {
    /// Member `id` of this stage, restored from `storage` (empty on first start): the newest stored
    /// checkpoint that verifies against its own digest is loaded into `service`.
    pub fn new(
        config: Arc<ClusterConfig>,
        id: ReplicaId,
        keys: Arc<KeyRing>,
        storage: &Storage,
        service: Box<dyn Service + Send>,
    ) -> Result<ExecStage, ConfigError> {
        ExecStage::with_page_store(config, id, keys, storage, service, None)
    }

    /// [`ExecStage::new`], with a paged service's pages kept in `page_store` (so they may exceed
    /// memory) instead of the stage's storage records; ignored for a service without pages.
    ///
    /// # Panics
    /// If the page store fails to take the service's initial pages (a disk error at start).
    pub fn with_page_store(
        config: Arc<ClusterConfig>,
        id: ReplicaId,
        keys: Arc<KeyRing>,
        storage: &Storage,
        service: Box<dyn Service + Send>,
        page_store: Option<Box<dyn crate::pages::PageStore>>,
    ) -> Result<ExecStage, ConfigError> {
        let q = config.validate()?;
        assert!((id.0 as usize) < q.n_exec, "replica {} hosts no execution member", id.0);
        let mut service = service;
        if config.selective_execution && (!service.enable_selective_execution() || service.object_state(b"").is_none())
        {
            return Err(ConfigError::SelectiveExecutionUnsupported);
        }
        let selective = config
            .selective_execution
            .then(|| selective::Selective::new(id.0 as usize, q.n_exec, q.reply()));
        let clients = config.clients.iter().map(|c| c.id).collect();
        let buffered_max = config.knobs.log_window as usize;
        let key_schedule = keys::restore(&q, Principal::Exec(id), storage);
        let mut stage = ExecStage {
            key_schedule,
            q,
            id,
            keys,
            service,
            key_repair: Default::default(),
            stats: Stats::default(),
            clients,
            last_executed: SeqNo(0),
            history: Digest::default(),
            last_time_us: 0,
            replies: ReplyCache::default(),
            // Exec(i) and Order(i) are one process (PROTOCOL.md, placement; n_exec <= n_order, so
            // every exec member has one): see `batches`. With separate stages no order member
            // shares our process, and every batch needs `q.next_batch()` matching copies.
            batches: BatchCollector::new(
                q.next_batch(),
                (!q.separate_stages || config.knobs.sabotage == Some(crate::config::Sabotage::SeparateNextBatch))
                    .then_some(id),
                buffered_max,
            ),
            fetcher: Fetcher::default(),
            fetch_from: 0,
            fetch_suspects: std::collections::BTreeSet::new(),
            checkpoints: CheckpointStore::default(),
            load_votes: LoadVotes::default(),
            transfer: None,
            progress_mark: SeqNo(0),
            read_only_nonces: ReadOnlyNonces::default(),
            pushes: PushLog::default(),
            paged: None,
            distrusted: false,
            wake_reported: None,
            tentative: None,
            initial: None,
            selective,
            config,
        };
        stage.recover(storage, page_store);
        let first_start = stage.last_executed == SeqNo(0) && stage.checkpoints.newest().is_none();
        if (stage.config.knobs.tentative_entries_max > 0 || stage.config.protocol.speculates())
            && first_start
            && !stage.state_is_partial()
        {
            stage.initial = Some(stage.service.checkpoint());
        }
        stage.progress_mark = stage.last_executed;
        Ok(stage)
    }

    /// The last executed batch and its history digest `H_seqno`.
    pub fn last_executed(&self) -> (SeqNo, Digest) {
        (self.last_executed, self.history)
    }

    fn me(&self) -> Principal {
        Principal::Exec(self.id)
    }

    /// Seals `message` and sends it to `to`.
    fn send(&self, to: Vec<Principal>, message: Message, seal: SealFor, out: &mut Vec<Action>) {
        let envelope = Envelope::seal(&self.keys, &self.q, self.me(), message, seal);
        out.push(Action::Send {
            to,
            envelope: Arc::new(envelope),
        });
    }

    /// Sends `message` to each of `to`, each copy with a MAC for its recipient.
    fn send_each(&self, to: impl Iterator<Item = Principal>, message: &Message, out: &mut Vec<Action>) {
        for recipient in to {
            self.send(vec![recipient], message.clone(), SealFor::One(recipient), out);
        }
    }

    /// LAST-EXEC to every order member.
    fn send_last_executed(&mut self, out: &mut Vec<Action>) {
        self.stats.bump("last_executed_sent");
        let message = contract::last_executed(self.reported_last_executed());
        self.send_each(ClusterConfig::order_members(&self.q), &message, out);
    }

    /// WAKE-AT to every order member when the service's `wake_at` changed since the last report
    /// (or, if `again`, whenever it waits for a time): an idle primary then orders an empty batch
    /// at that time rather than at the next heartbeat.
    fn report_wake(&mut self, again: bool, out: &mut Vec<Action>) {
        let at = self.service.wake_at();
        if self.wake_reported == Some(at) && !(again && at.is_some()) {
            return;
        }
        self.wake_reported = Some(at);
        let message = contract::wake_at(self.last_executed, at);
        self.send_each(ClusterConfig::order_members(&self.q), &message, out);
    }

    fn set_retry_timer(&self, now: Time, out: &mut Vec<Action>) {
        out.push(Action::SetTimer {
            timer: Timer::ExecRetry,
            at: now.saturating_add(self.config.knobs.exec_retry_us),
        });
    }

    /// Retry tick: resend fetches, LAST-EXEC when not progressing, state-transfer requests.
    fn on_retry(&mut self, now: Time, out: &mut Vec<Action>) {
        self.retry_fetches(out);
        self.selective_tick(out);
        if self.last_executed == self.progress_mark {
            self.send_last_executed(out);
            self.resend_newest_checkpoint_token(out);
            self.report_wake(true, out);
        }
        self.progress_mark = self.last_executed;
        self.retry_transfer(out);
        self.set_retry_timer(now, out);
    }

    /// Whether `from` is a configured stage member (its index within its stage's size).
    fn is_member(&self, from: Principal) -> bool {
        self.config.contains(from, &self.q) && !matches!(from, Principal::Client(_))
    }

    /// Checks the seal as received by this member; a bad one is counted.
    fn seal_ok(&mut self, envelope: &Envelope, out: &mut Vec<Action>) -> bool {
        let ok = envelope.open(&self.keys, self.me(), self.config.knobs.sabotage).is_ok();
        if !ok {
            self.stats.reject("bad_seal");
            let me = self.me();
            self.key_repair.after_bad_seal(&self.keys, &self.q, me, envelope, out);
        }
        ok
    }

    fn on_message(&mut self, now: Time, envelope: &Envelope, out: &mut Vec<Action>) {
        if matches!(envelope.message, Message::ReadOnlyRequest { .. }) {
            // From a client, not a member: its own checks (sender, seal, nonce) come first.
            self.on_read_only_request(envelope, out);
            return;
        }
        if matches!(envelope.message, Message::PushResume { .. }) {
            self.on_push_resume(envelope, out);
            return;
        }
        if !self.seal_ok(envelope, out) {
            return;
        }
        let from = envelope.from;
        if !self.is_member(from) {
            self.stats.bump("wrong_sender");
            return;
        }
        self.dispatch(now, from, &envelope.message, out);
    }

    /// Hands an authenticated message from a configured member to its handler, if that member's
    /// stage may send it.
    fn dispatch(&mut self, now: Time, from: Principal, message: &Message, out: &mut Vec<Action>) {
        match contract::route_to_exec(self, now, from, message, out) {
            Routed::Handled => return,
            Routed::WrongSender => return self.stats.bump("wrong_sender"),
            Routed::NotContract => {}
        }
        match (message, from) {
            (
                Message::Command {
                    client,
                    request_id,
                    operation,
                },
                Principal::Auth(a),
            ) => {
                self.fetch_suspects.remove(&a.0);
                self.on_command(*client, *request_id, operation, out)
            }
            (
                Message::FetchState {
                    seqno,
                    state_digest,
                    chunk,
                },
                Principal::Exec(r),
            ) if r != self.id => self.on_fetch_state(r, *seqno, *state_digest, *chunk, out),
            (
                Message::StateManifest {
                    seqno,
                    total_bytes,
                    chunk_digests,
                },
                Principal::Exec(r),
            ) if r != self.id => self.on_state_manifest(r, *seqno, *total_bytes, chunk_digests, out),
            (
                Message::StateChunk {
                    seqno,
                    state_digest,
                    index,
                    data,
                },
                Principal::Exec(r),
            ) if r != self.id => self.on_state_chunk(*seqno, *state_digest, *index, data, out),
            (
                Message::FetchPages {
                    seqno,
                    state_digest,
                    nodes,
                    pages,
                },
                Principal::Exec(r),
            ) if r != self.id => self.on_fetch_pages(r, *seqno, *state_digest, nodes, pages, out),
            (
                Message::PageAnswer {
                    seqno,
                    state_digest,
                    nodes,
                    pages,
                },
                Principal::Exec(r),
            ) if r != self.id => self.on_page_answer(r, *seqno, *state_digest, nodes, pages, out),
            (message @ Message::ObjectCheckpoint { .. }, Principal::Exec(r)) if r != self.id => {
                self.on_object_checkpoint(r, message, out)
            }
            (
                Message::Command { .. }
                | Message::FetchState { .. }
                | Message::StateManifest { .. }
                | Message::StateChunk { .. }
                | Message::FetchPages { .. }
                | Message::PageAnswer { .. }
                | Message::ObjectCheckpoint { .. },
                _,
            ) => self.stats.bump("wrong_sender"),
            _ => self.stats.bump("unexpected_message"),
        }
    }
}

/// The execution stage's side of the contract with ordering ([`crate::contract`]).
impl ExecSide for ExecStage {
    fn next_batch(&mut self, _now: Time, o: Offered<'_>, out: &mut Vec<Action>) {
        self.on_next_batch(o.from, o.seqno, o.history, o.time_us, o.entries, out)
    }

    fn load_checkpoint(
        &mut self,
        _now: Time,
        from: ReplicaId,
        seqno: SeqNo,
        exec_state: Digest,
        out: &mut Vec<Action>,
    ) {
        self.on_load_checkpoint(from, seqno, exec_state, out)
    }

    fn retransmit(&mut self, now: Time, client: ClientId, request_id: RequestId, out: &mut Vec<Action>) {
        self.on_retransmit(now, client, request_id, out)
    }

    fn tentative_batch(&mut self, _now: Time, view: View, o: Offered<'_>, out: &mut Vec<Action>) {
        self.on_tentative_batch(o.from, view, o.seqno, o.history, o.time_us, o.entries, out)
    }
}

impl Stage for ExecStage {
    fn principal(&self) -> Principal {
        self.me()
    }

    fn handle(&mut self, now: Time, input: Input, out: &mut Vec<Action>) {
        match input {
            Input::Start | Input::Recover => {
                let recover = matches!(input, Input::Recover);
                if recover {
                    self.begin_recovery();
                }
                self.start_keys(now, recover, out);
                self.send_last_executed(out);
                self.report_wake(false, out);
                self.set_retry_timer(now, out);
            }
            Input::Timer(Timer::ExecRetry) => self.on_retry(now, out),
            Input::Timer(Timer::KeyRefresh) => self.key_timer(now, out),
            Input::Message(envelope) if matches!(envelope.message, Message::NewKey { .. }) => {
                self.on_new_key(&envelope, out)
            }
            Input::Timer(_) => self.stats.bump("unexpected_timer"),
            Input::Message(envelope) => self.on_message(now, &envelope, out),
            Input::Invoke { .. } => self.stats.bump("unexpected_invoke"),
        }
    }

    fn stats(&self) -> &Stats {
        &self.stats
    }
}

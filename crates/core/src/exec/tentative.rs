//! Tentative execution (PBFT thesis 5.1.3; docs/PROTOCOL.md "Tentative execution").
//!
//! The co-located order member hands over a batch it has prepared, with every batch before it
//! committed (TENTATIVE-BATCH). The member executes it at once and answers with
//! TENTATIVE-REPLYs; a client accepts `q.tentative_reply()` matching ones. Until the batch commits
//! nothing reports it executed: no BATCH-COMPLETE, no Executed note, no checkpoint (the order
//! stage never hands over a checkpoint's sequence number), no WAKE-AT; its pushes are held;
//! retransmissions, read-only requests and push resends wait. When the committed NEXT-BATCH for
//! that sequence number arrives with the same history the batch is confirmed: the held effects go
//! out and every request gets its committed REPLY as well (the tentative quorum needs
//! `u + r + 1` execution members up; `r + 1` committed replies do not). When another batch commits
//! there (a view change replaced it), or the member is to load a checkpoint, the state is rolled
//! back: the newest checkpoint's small part is restored (an in-memory copy of the initial state
//! before the first), a paged service's pages are reverted to that checkpoint's
//! ([`crate::pages::Pages::revert`]), and the batches since are executed again as the co-located
//! order member resends them (LAST-EXEC). A member executes tentatively only when it can roll
//! back that way.

use std::collections::BTreeSet;

use bytes::Bytes;

use super::checkpoint::ExecCheckpoint;
use super::ExecStage;
use crate::codec;
use crate::config::Sabotage;
use crate::contract::next_batch::AgreedBatch;
use crate::crypto::Digest;
use crate::ids::{ClientId, ReplicaId, RequestId, SeqNo, View};
use crate::message::{history_digest, RequestEntry};
use crate::stage::Action;

/// A batch executed tentatively and not yet committed.
pub(super) struct Tentative {
    seqno: SeqNo,
    history: Digest,
    /// Clients with a request in it (their retransmissions wait for the commit).
    clients: BTreeSet<ClientId>,
    /// Each executed request's result, answered again as committed when the batch commits.
    results: Vec<(ClientId, RequestId, Bytes)>,
    /// The pushes it emitted (sends and notes), released when it commits.
    held: Vec<Action>,
}

impl ExecStage {
    /// Whether the batch at `seqno` was executed tentatively and awaits its commit.
    pub(super) fn tentative_at(&self, seqno: SeqNo) -> bool {
        self.tentative.as_ref().is_some_and(|t| t.seqno == seqno)
    }

    /// Whether `client` has a tentatively executed request.
    pub(super) fn tentative_client(&self, client: ClientId) -> bool {
        self.tentative.as_ref().is_some_and(|t| t.clients.contains(&client))
    }

    /// The first push number to `client` that the outstanding tentative batch emitted, if any:
    /// kept pushes from it on are not sent until the batch commits.
    pub(super) fn tentative_first_push(&self, client: ClientId) -> Option<u64> {
        self.tentative.as_ref()?.held.iter().find_map(|action| match action {
            Action::Note(crate::stage::Event::Pushed { client: c, seq, .. }) if *c == client => Some(*seq),
            _ => None,
        })
    }

    /// Whether a tentative batch is outstanding (the state is ahead of the committed prefix).
    pub(super) fn tentative_outstanding(&self) -> bool {
        self.tentative.is_some()
    }

    /// Whether the state can be rolled back to the newest checkpoint (or the initial state):
    /// nothing is being loaded, the state is whole and trusted, and a paged service's pages
    /// still differ from that checkpoint's only by what was executed since.
    fn can_roll_back(&self) -> bool {
        if self.transfer.is_some() || self.state_is_partial() {
            return false;
        }
        let newest = self.checkpoints.newest().map(|c| c.seqno);
        if newest.is_none() && self.initial.is_none() {
            return false;
        }
        self.paged.as_ref().is_none_or(|p| p.frozen_at() == Some(newest))
    }

    /// TENTATIVE-BATCH from the co-located order member: execute it now if it is the next batch,
    /// its bodies are here and the state can be rolled back.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn on_tentative_batch(
        &mut self,
        from: ReplicaId,
        view: View,
        seqno: SeqNo,
        history: Digest,
        time_us: u64,
        entries: &[RequestEntry],
        out: &mut Vec<Action>,
    ) {
        if from != self.id {
            // Only our own order member's word that it prepared the batch counts.
            self.stats.bump("tentative_wrong_sender");
            return;
        }
        if let Some(t) = &self.tentative {
            if t.seqno != seqno || t.history == history {
                self.stats.bump("tentative_ignored");
                return;
            }
            // Another batch prepared at that number in a later view: the first will not commit.
            self.roll_back(out);
        }
        if seqno != self.last_executed.next()
            || seqno.0.is_multiple_of(self.config.knobs.checkpoint_interval)
            || time_us == 0
            || entries.is_empty()
        {
            self.stats.bump("tentative_not_next");
            return;
        }
        let batch_digest = crate::message::batch_digest(time_us, entries.iter().map(|e| e.digest()));
        if history_digest(&self.history, &batch_digest) != history {
            self.stats.bump("tentative_history_mismatch");
            return;
        }
        let batch = AgreedBatch {
            seqno,
            history,
            batch_digest,
            time_us,
            entries: entries.to_vec(),
        };
        if !self.bodies_complete(&batch) {
            self.stats.bump("tentative_bodies_missing");
            return;
        }
        if !self.can_roll_back() {
            self.stats.bump("tentative_no_rollback_point");
            return;
        }
        self.stats.bump("tentative_executed");
        self.execute_batch(batch, Some(view), out);
    }

    /// Records the tentatively executed `batch` (called by `execute_batch`).
    pub(super) fn hold_tentative(
        &mut self,
        batch: &AgreedBatch,
        results: Vec<(ClientId, RequestId, Bytes)>,
        held: Vec<Action>,
    ) {
        self.tentative = Some(Tentative {
            seqno: batch.seqno,
            history: batch.history,
            clients: batch.entries.iter().map(|e| e.client).collect(),
            results,
            held,
        });
    }

    /// Whether the committed batch with history `history` at the tentative batch's sequence
    /// number is the tentatively executed one.
    pub(super) fn tentative_matches(&self, history: Digest) -> bool {
        let sabotaged = self.config.knobs.sabotage == Some(Sabotage::TentativeNoRollback);
        self.tentative.as_ref().is_some_and(|t| t.history == history) || sabotaged
    }

    /// The tentatively executed batch committed as `batch`: the held pushes, the committed
    /// replies and everything that reports the batch executed go out.
    pub(super) fn confirm_tentative(&mut self, batch: AgreedBatch, out: &mut Vec<Action>) {
        let tentative = self.tentative.take().expect("caller checked");
        self.stats.bump("tentative_committed");
        out.extend(tentative.held);
        for (client, request_id, result) in &tentative.results {
            self.send_reply(*client, *request_id, result, false, out);
        }
        self.finish_batch(&batch, out);
    }

    /// Rolls the state back to the newest checkpoint (or the initial state) and asks the
    /// co-located order member for the committed batches since (LAST-EXEC).
    pub(super) fn roll_back(&mut self, out: &mut Vec<Action>) {
        if self.tentative.take().is_none() {
            return;
        }
        self.stats.bump("tentative_rolled_back");
        let base = match self.checkpoints.newest() {
            Some(stored) => codec::from_bytes::<ExecCheckpoint>(&stored.blob).expect("a kept checkpoint decodes"),
            None => ExecCheckpoint {
                seqno: SeqNo(0),
                history: Digest::default(),
                time_us: 0,
                service: self.initial.clone().expect("can_roll_back checked"),
                replies: Vec::new(),
                pushes: Vec::new(),
                streams: Vec::new(),
                pages: 0,
                page_root: Digest::default(),
                page_bytes: 0,
            },
        };
        if let Some(pages) = self.service.pages_mut() {
            pages.revert();
        }
        self.restore_checkpoint(&base)
            .expect("the member's own checkpoint restores");
        self.progress_mark = self.last_executed;
        self.send_last_executed(out);
        self.request_bodies(out);
    }
}

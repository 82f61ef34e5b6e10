//! Proactive recovery at an execution member (docs/PROTOCOL.md "Proactive recovery"; PBFT
//! thesis 4.3.2, "check and fetch state").
//!
//! Whoever controlled this process before the recovery may have rewritten its stored state
//! consistently with its own digests, so a stored checkpoint that verifies proves nothing. From
//! `Input::Recover` until a state transfer installs a checkpoint certified by the order stage
//! (LOAD-CP from `r + 1` order members), the member distrusts its state: it executes nothing,
//! answers no read, resends no cached reply or push, serves no checkpoint, and reports
//! LAST-EXEC 0 so that the order members answer with LOAD-CP. The transfer compares the
//! certified page tree with the tree hashed from the stored pages' contents and fetches only
//! the pages that differ; a service without pages fetches its whole checkpoint.

use super::ExecStage;
use crate::ids::SeqNo;

impl ExecStage {
    /// `Input::Recover`: distrust the stored state until a certified checkpoint is installed.
    pub(super) fn begin_recovery(&mut self) {
        self.stats.bump("recovery_started");
        let skip = self.config.knobs.sabotage == Some(crate::config::Sabotage::SkipRecoveryCheck);
        if skip || (self.last_executed == SeqNo(0) && !self.state_is_partial()) {
            // The service's initial state, made by its code, not read from storage.
            self.stats.bump("recovery_state_checked");
            return;
        }
        self.distrusted = true;
        self.checkpoints.forget_kept();
        if let Some(paged) = self.paged.as_mut() {
            paged.mark_partial();
        }
    }

    /// The sequence number LAST-EXEC reports: 0 while the state is distrusted.
    pub(super) fn reported_last_executed(&self) -> SeqNo {
        if self.distrusted {
            SeqNo(0)
        } else {
            self.last_executed
        }
    }

    /// A transfer installed a certified checkpoint: the state is checked.
    pub(super) fn state_checked(&mut self) {
        if std::mem::take(&mut self.distrusted) {
            self.stats.bump("recovery_state_checked");
        }
    }
}

//! A client learns a new configuration (docs/PROTOCOL.md "Reconfiguration"): its requests name
//! the configuration epoch it knows, and a replica in a later one answers with CONFIGURATION (the
//! administrator's signed change, MACed). The client adopts a change on `r + 1` matching copies
//! from distinct replicas of the configuration it knows: one of them is correct, so the change is
//! in effect (a correct replica only ever reports the configuration it runs in). The signature
//! alone would not do: an administrator may sign a change that loses to another one.

use std::sync::Arc;

use super::Client;
use crate::config::ClusterConfig;
use crate::ids::{Principal, Process, ReplicaId};
use crate::message::{Envelope, Message, SealFor};
use crate::reconfig::{self, SignedReconfiguration};
use crate::stage::{Action, Time, Timer};

impl Client {
    /// A CONFIGURATION from authentication member `from` (seal already checked).
    pub(super) fn on_configuration(
        &mut self,
        now: Time,
        from: ReplicaId,
        change: &SignedReconfiguration,
        out: &mut Vec<Action>,
    ) {
        let Ok(next) = reconfig::successor(&self.config, change, true) else {
            return self.stats.bump("configuration_refused");
        };
        let digest = change.digest();
        self.config_votes.insert(from, digest);
        let matching = self.config_votes.values().filter(|d| **d == digest).count();
        if matching < self.quorums.small() {
            return self.stats.bump("configuration_vote");
        }
        self.adopt(now, next, out);
    }

    /// Switches to `next`: new replicas and keys; the request in progress goes again, to every
    /// authentication member of the new configuration.
    fn adopt(&mut self, now: Time, next: ClusterConfig, out: &mut Vec<Action>) {
        let quorums = next.validate().expect("checked by reconfig::successor");
        let next = Arc::new(next);
        self.keys = Arc::new(self.keys.successor(&next, Process::Client(self.id), true));
        self.config = next;
        self.quorums = quorums;
        self.config_votes.clear();
        self.preferred_start = self.id.0 as usize % quorums.n_auth;
        self.stats.bump("configuration_adopted");
        self.start_keys(now, out);
        if let Some(outstanding) = self.outstanding.as_mut() {
            let mut message = outstanding.envelope.message.clone();
            if let Message::ClientRequest { config_epoch, .. } = &mut message {
                *config_epoch = self.config.epoch();
            }
            outstanding.envelope = Arc::new(Envelope::seal(
                &self.keys,
                &self.quorums,
                Principal::Client(self.id),
                message,
                SealFor::Stage(crate::ids::StageKind::Auth),
            ));
            outstanding.replies.clear();
            out.push(Action::Send {
                to: ClusterConfig::auth_members(&self.quorums).collect(),
                envelope: outstanding.envelope.clone(),
            });
            out.push(Action::SetTimer {
                timer: Timer::ClientRetransmit,
                at: now + outstanding.timeout_us,
            });
        }
    }

    /// The configuration this client uses (the runtime connects to its replicas).
    pub fn config(&self) -> &Arc<ClusterConfig> {
        &self.config
    }
}

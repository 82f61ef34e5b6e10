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
        let Some(next) = self.told(change) else {
            return self.stats.bump("configuration_refused");
        };
        let digest = change.digest();
        self.config_votes.insert(from, digest);
        let matching = self.config_votes.values().filter(|d| **d == digest).count();
        if matching < self.quorums.small() {
            return self.stats.bump("configuration_vote");
        }
        self.adopt(now, (*next).clone(), out);
    }

    /// The configuration `change` makes from ours, checked once per change (the copies of every
    /// member carry the same one; the check verifies the administrator's signature).
    fn told(&mut self, change: &SignedReconfiguration) -> Option<Arc<ClusterConfig>> {
        let digest = change.digest();
        if let Some(trial) = self.config_trial.as_ref().filter(|t| t.digest == digest) {
            return Some(trial.config.clone());
        }
        let next = Arc::new(reconfig::successor(&self.config, change, true).ok()?);
        self.config_trial = Some(super::ConfigTrial {
            digest,
            config: next.clone(),
            keys: None,
        });
        Some(next)
    }

    /// A CONFIGURATION from a replica the change renumbered (a shrink gives removed replicas'
    /// ids to members above the new size): it is sealed as the sender's id in the configuration
    /// the change makes, with the keys of that id. It counts as the vote of the replica of our
    /// configuration with the same long-term keys (the same process). `None` if the sender's id
    /// is the same in both, or the copy does not verify that way.
    pub(super) fn renumbered_voter(
        &mut self,
        envelope: &Envelope,
        change: &SignedReconfiguration,
    ) -> Option<ReplicaId> {
        let Principal::Auth(sender) = envelope.from else {
            return None;
        };
        let next = self.told(change)?;
        let sender_keys = next.replicas.get(sender.0 as usize)?.keys;
        if self.config.replicas.get(sender.0 as usize).map(|r| r.keys) == Some(sender_keys) {
            return None;
        }
        let ours = self.config.replica_with(&sender_keys)?;
        if sender.0 as usize >= next.validate().ok()?.n_auth {
            return None;
        }
        // Our keys in the new configuration: built once per change, for renumbered senders only.
        let trial = self.config_trial.as_mut().expect("set by told");
        let keys = trial
            .keys
            .get_or_insert_with(|| Arc::new(self.keys.successor(&next, Process::Client(self.id), false)))
            .clone();
        if envelope.open_static(&keys, self.config.knobs.sabotage).is_err() {
            return None;
        }
        self.stats.bump("configuration_renumbered_vote");
        Some(ours)
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
        self.config_trial = None;
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

    /// This client's keys in that configuration (the runtime's hellos to new replicas).
    pub fn keys(&self) -> &Arc<crate::crypto::KeyRing> {
        &self.keys
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;
    use crate::config::{Knobs, PublicKeys};
    use crate::crypto::SecretKeys;
    use crate::ids::{ClientId, RequestId};
    use crate::reconfig::Reconfiguration;
    use crate::stage::{Input, ReadPath, Stage};
    use crate::testing::{fixture, Fixture};

    /// A fixture whose client 1 is the administrator, and the change that grows it to u = 2.
    fn setup() -> (Fixture, ClusterConfig, SignedReconfiguration) {
        let f = fixture(1, 1, 2, Knobs::default());
        let mut config = (*f.config).clone();
        config.admin = Some(ClientId(1));
        let mut replicas: Vec<PublicKeys> = config.replicas.iter().map(|r| r.keys).collect();
        let from_replicas = replicas.clone();
        replicas.extend((0..2).map(|i| SecretKeys::from_seed([210 + i; 32]).public()));
        let change = Reconfiguration {
            epoch: 1,
            from_u: 1,
            from_r: 1,
            from_replicas,
            u: 2,
            r: 1,
            endpoints: vec![String::new(); replicas.len()],
            replicas,
        }
        .sign(&config.cluster_name, &SecretKeys::from_seed([101; 32]));
        (f, config, change)
    }

    fn told(f: &Fixture, auth: u32, change: &SignedReconfiguration) -> Arc<Envelope> {
        let to = Principal::Client(ClientId(0));
        Arc::new(Envelope::seal_static(
            &f.replicas[auth as usize],
            Principal::Auth(ReplicaId(auth)),
            Message::Configuration {
                change: Box::new(change.clone()),
            },
            to,
        ))
    }

    #[test]
    fn a_client_adopts_a_change_on_r_plus_1_matching_copies_and_sends_its_request_again() {
        let (f, config, change) = setup();
        let mut c = Client::new(Arc::new(config), ClientId(0), f.clients[0].clone()).unwrap();
        let mut out = Vec::new();
        let operation = Bytes::from_static(b"op");
        c.handle(
            0,
            Input::Invoke {
                operation,
                path: ReadPath::Ordered,
            },
            &mut out,
        );
        // One copy is not enough (one replica may lie), nor the same replica twice.
        let mut out = Vec::new();
        c.handle(10, Input::Message(told(&f, 0, &change)), &mut out);
        c.handle(11, Input::Message(told(&f, 0, &change)), &mut out);
        assert_eq!(c.config().epoch(), 0);
        assert!(out.is_empty());
        // A copy under a MAC that does not verify does not count.
        let mut forged = (*told(&f, 2, &change)).clone();
        forged.from = Principal::Auth(ReplicaId(3));
        c.handle(12, Input::Message(Arc::new(forged)), &mut out);
        assert_eq!(c.config().epoch(), 0);
        // A second replica: adopted, and the request goes again to the six new members.
        c.handle(13, Input::Message(told(&f, 2, &change)), &mut out);
        assert_eq!((c.config().epoch(), c.config().replicas.len()), (1, 6));
        let resent = out.iter().find_map(|a| match a {
            Action::Send { to, envelope } => Some((to.clone(), envelope.clone())),
            _ => None,
        });
        let (to, envelope) = resent.expect("the request is sent again");
        assert_eq!(to.len(), 6);
        assert!(matches!(
            envelope.message,
            Message::ClientRequest {
                request_id: RequestId(1),
                config_epoch: 1,
                ..
            }
        ));
        assert_eq!(c.stats().get("configuration_adopted"), 1);
    }

    #[test]
    fn a_change_signed_by_anyone_else_is_refused() {
        let (f, config, change) = setup();
        let mut c = Client::new(Arc::new(config.clone()), ClientId(0), f.clients[0].clone()).unwrap();
        let mut forged = change.clone();
        forged.signature = change
            .change
            .clone()
            .sign(&config.cluster_name, &SecretKeys::from_seed([9; 32]))
            .signature;
        let mut out = Vec::new();
        for auth in 0..4 {
            c.handle(auth, Input::Message(told(&f, auth as u32, &forged)), &mut out);
        }
        assert_eq!(c.config().epoch(), 0);
        assert_eq!(c.stats().get("configuration_refused"), 4);
    }

    #[test]
    fn a_renumbered_replicas_copy_counts_as_the_vote_of_the_replica_with_its_keys() {
        let (f, config, _) = setup();
        let change = crate::testing::swap_change(&config, 0, 3);
        let next = reconfig::successor(&config, &change, false).expect("valid");
        // Replica 3's process, now replica 0, tells the client as Auth(0) of the new
        // configuration, under its keys there.
        let as_new_0 = |ring: &crate::crypto::KeyRing| {
            Arc::new(Envelope::seal_static(
                &ring.successor(&next, Process::Replica(ReplicaId(0)), false),
                Principal::Auth(ReplicaId(0)),
                Message::Configuration {
                    change: Box::new(change.clone()),
                },
                Principal::Client(ClientId(0)),
            ))
        };
        let mut c = Client::new(Arc::new(config), ClientId(0), f.clients[0].clone()).unwrap();
        let mut out = Vec::new();
        c.handle(10, Input::Message(as_new_0(&f.replicas[3])), &mut out);
        assert_eq!(c.stats().get("configuration_renumbered_vote"), 1);
        assert_eq!(c.config().epoch(), 0, "one copy is not enough");
        // The same process again as its old id: still one vote.
        c.handle(11, Input::Message(told(&f, 3, &change)), &mut out);
        assert_eq!(c.config().epoch(), 0, "one process, one vote");
        // A forged renumbered copy (replica 1's process claiming to be new replica 0) counts
        // for nobody.
        c.handle(12, Input::Message(as_new_0(&f.replicas[1])), &mut out);
        assert_eq!(c.stats().get("configuration_renumbered_vote"), 1);
        assert_eq!(c.config().epoch(), 0);
        // Replica 0's process (at id 3 now) sealing as new replica 0 is not the renumbered
        // replica (the keys there are replica 3's); its MAC is the one it had as replica 0 of
        // our configuration, so it counts as that: a second process, adopted.
        c.handle(13, Input::Message(as_new_0(&f.replicas[0])), &mut out);
        assert_eq!(c.stats().get("configuration_renumbered_vote"), 1);
        assert_eq!(c.config().epoch(), 1);
        assert_eq!(c.config().replicas[0].keys, f.config.replicas[3].keys);
    }
}

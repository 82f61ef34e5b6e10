//! The simulator's Byzantine replicas on the real runtime: a testing switch of `upright replica`
//! (`upright_node::replica::BYZANTINE_ENV`, read with [`parse_request`]) wraps each of the replica's real stages in a [`ByzantineStage`] that runs
//! the same [`Byzantine`] filter the simulator puts between a Byzantine replica and its network.
//! `upright bench --attack` uses it to measure throughput under attack on real processes.
//!
//! Messages the filter holds back (a slow primary's PRE-PREPAREs) wait in the wrapper and go out
//! when the wrapper's own timer ([`Timer::Held`]) fires.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use upright_core::crypto::KeyRing;
use upright_core::ids::{Principal, ReplicaId};
use upright_core::message::Envelope;
use upright_core::quorum::Quorums;
use upright_core::stage::{Action, Input, Stage, Stats, Time, Timer};

use crate::byzantine::Byzantine;
use crate::faults::{Behaviour, FaultCounts};

/// Most messages a wrapper holds back at once (beyond it, the oldest go out at once).
pub const HELD_MAX: usize = 100_000;

/// The behaviour a testing switch value `ID:BEHAVIOUR` (`upright_node::replica::BYZANTINE_ENV`)
/// gives replica `id`: `Ok(None)` if it names another replica, an error if it is malformed or
/// names no behaviour.
pub fn parse_request(value: &str, id: u32) -> Result<Option<Behaviour>, String> {
    let bad = || format!("{value:?}: expected ID:BEHAVIOUR, e.g. 0:slow-primary");
    let (who, name) = value.trim().split_once(':').ok_or_else(bad)?;
    let who: u32 = who.trim().parse().map_err(|_| bad())?;
    let behaviour = Behaviour::ALL
        .into_iter()
        .find(|b| b.name() == name.trim())
        .ok_or_else(|| format!("no behaviour named {:?}", name.trim()))?;
    Ok((who == id).then_some(behaviour))
}

/// What the wrappers of one replica share: the filter, its randomness and its counts.
pub struct Shared {
    byzantine: Byzantine,
    rng: ChaCha8Rng,
    counts: FaultCounts,
}

impl Shared {
    /// Replica `replica` behaving as `behaviour`, with its own keys; a slow primary holds its
    /// PRE-PREPAREs for three quarters of `view_change_timeout_us`.
    pub fn new(
        behaviour: Behaviour,
        replica: ReplicaId,
        keys: Arc<KeyRing>,
        quorums: Quorums,
        view_change_timeout_us: Time,
    ) -> Arc<Mutex<Shared>> {
        let byzantine =
            Byzantine::new(behaviour, replica, keys, quorums).with_view_change_timeout(view_change_timeout_us);
        Arc::new(Mutex::new(Shared {
            byzantine,
            rng: ChaCha8Rng::seed_from_u64(u64::from(replica.0) ^ 0x6279_7a61),
            counts: FaultCounts::default(),
        }))
    }

    /// Injections so far, by fault class.
    pub fn counts(&self) -> &FaultCounts {
        &self.counts
    }
}

/// One real stage behind the Byzantine filter of its replica.
pub struct ByzantineStage {
    inner: Box<dyn Stage + Send>,
    principal: Principal,
    shared: Arc<Mutex<Shared>>,
    /// Held-back sends by release time (and arrival order within one time).
    held: BTreeMap<(Time, u64), (Vec<Principal>, Arc<Envelope>)>,
    next: u64,
    /// The release time the host's timer is set to.
    timer_at: Option<Time>,
}

impl ByzantineStage {
    /// `inner` behind `shared`'s filter.
    pub fn new(inner: Box<dyn Stage + Send>, shared: Arc<Mutex<Shared>>) -> ByzantineStage {
        ByzantineStage {
            principal: inner.principal(),
            inner,
            shared,
            held: BTreeMap::new(),
            next: 0,
            timer_at: None,
        }
    }

    /// Messages held back now.
    pub fn held(&self) -> usize {
        self.held.len()
    }

    /// Passes the inner stage's actions through the filter into `out`.
    fn filter(&mut self, now: Time, actions: Vec<Action>, out: &mut Vec<Action>) {
        let mut shared = self.shared.lock().unwrap_or_else(|e| e.into_inner());
        let Shared { byzantine, rng, counts } = &mut *shared;
        for action in actions {
            let Action::Send { to, envelope } = action else {
                out.push(action);
                continue;
            };
            for o in byzantine.outgoing(rng, self.principal, to, envelope, counts) {
                if o.extra_delay == 0 {
                    out.push(Action::Send {
                        to: o.to,
                        envelope: o.envelope,
                    });
                } else {
                    if self.held.len() >= HELD_MAX {
                        if let Some((_, (to, envelope))) = self.held.pop_first() {
                            out.push(Action::Send { to, envelope });
                        }
                    }
                    self.held.insert((now + o.extra_delay, self.next), (o.to, o.envelope));
                    self.next += 1;
                }
            }
        }
        drop(shared);
        self.arm(out);
    }

    /// Sends every held message that is due.
    fn release(&mut self, now: Time, out: &mut Vec<Action>) {
        self.timer_at = None;
        while let Some(entry) = self.held.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let (to, envelope) = entry.remove();
            out.push(Action::Send { to, envelope });
        }
        self.arm(out);
    }

    /// Points the host's timer at the earliest held message.
    fn arm(&mut self, out: &mut Vec<Action>) {
        let first = self.held.keys().next().map(|k| k.0);
        if first != self.timer_at {
            match first {
                Some(at) => out.push(Action::SetTimer { timer: Timer::Held, at }),
                None => out.push(Action::CancelTimer { timer: Timer::Held }),
            }
            self.timer_at = first;
        }
    }
}

impl Stage for ByzantineStage {
    fn principal(&self) -> Principal {
        self.principal
    }

    fn handle(&mut self, now: Time, input: Input, out: &mut Vec<Action>) {
        let input = match input {
            Input::Timer(Timer::Held) => return self.release(now, out),
            Input::Message(envelope) => {
                let mut shared = self.shared.lock().unwrap_or_else(|e| e.into_inner());
                let Shared { byzantine, rng, counts } = &mut *shared;
                match byzantine.incoming(rng, self.principal, envelope, counts) {
                    Some(envelope) => Input::Message(envelope),
                    None => return,
                }
            }
            other => other,
        };
        let mut actions = Vec::new();
        self.inner.handle(now, input, &mut actions);
        self.filter(now, actions, out);
    }

    fn flush(&mut self, now: Time, out: &mut Vec<Action>) {
        let mut actions = Vec::new();
        self.inner.flush(now, &mut actions);
        if !actions.is_empty() {
            self.filter(now, actions, out);
        }
    }

    fn stats(&self) -> &Stats {
        self.inner.stats()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use upright_core::ids::{SeqNo, View};
    use upright_core::message::{Batch, Message, PbftMessage, SealFor};

    /// A stage that sends what it is told to (its message inputs, re-sealed as its own).
    struct Echo {
        me: Principal,
        keys: Arc<KeyRing>,
        q: Quorums,
        stats: Stats,
    }

    impl Stage for Echo {
        fn principal(&self) -> Principal {
            self.me
        }
        fn handle(&mut self, _now: Time, input: Input, out: &mut Vec<Action>) {
            if let Input::Message(e) = input {
                let to = vec![Principal::Order(ReplicaId(1)), Principal::Order(ReplicaId(0))];
                let sealed = Envelope::seal(
                    &self.keys,
                    &self.q,
                    self.me,
                    e.message.clone(),
                    SealFor::Stage(upright_core::ids::StageKind::Order),
                );
                out.push(Action::Persist {
                    key: "k".into(),
                    value: Some(Bytes::from_static(b"v")),
                });
                out.push(Action::Send {
                    to,
                    envelope: Arc::new(sealed),
                });
            }
        }
        fn stats(&self) -> &Stats {
            &self.stats
        }
    }

    fn pre_prepare(entries: usize) -> Arc<Envelope> {
        use upright_core::crypto::MatrixSignature;
        use upright_core::ids::{ClientId, RequestId};
        use upright_core::message::{RequestBody, RequestEntry, SignedEntry};
        let entry = |i: u32| SignedEntry {
            entry: RequestEntry {
                client: ClientId(i),
                request_id: RequestId(1),
                body: RequestBody::Inline(Bytes::from_static(b"op")),
            },
            matrix: MatrixSignature { rows: Vec::new() },
        };
        let batch = Batch {
            time_us: 1,
            entries: (0..entries as u32).map(entry).collect(),
        };
        Arc::new(Envelope::new(
            Principal::Order(ReplicaId(0)),
            Message::Pbft(PbftMessage::PrePrepare {
                view: View(0),
                seqno: SeqNo(1),
                batch,
            }),
            upright_core::message::Seal::None,
        ))
    }

    fn sends(actions: &[Action]) -> Vec<Vec<Principal>> {
        actions
            .iter()
            .filter_map(|a| match a {
                Action::Send { to, .. } => Some(to.clone()),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn parses_the_switch() {
        assert_eq!(parse_request("0:slow-primary", 0), Ok(Some(Behaviour::SlowPrimary)));
        assert_eq!(parse_request(" 2 : silence ", 2), Ok(Some(Behaviour::Silence)));
        assert_eq!(parse_request("1:silence", 2), Ok(None));
        assert!(parse_request("silence", 0).is_err());
        assert!(parse_request("x:silence", 0).is_err());
        assert!(parse_request("0:no-such", 0)
            .unwrap_err()
            .contains("no behaviour named"));
    }

    /// An echoing order member of replica 0 behind the filter for `behaviour`.
    fn wrapped(behaviour: Behaviour) -> (ByzantineStage, Arc<Mutex<Shared>>) {
        let (_, keys, q) = crate::byzantine::tests::setup();
        let echo = Echo {
            me: Principal::Order(ReplicaId(0)),
            keys: keys[0].clone(),
            q,
            stats: Stats::default(),
        };
        let shared = Shared::new(behaviour, ReplicaId(0), keys[0].clone(), q, 200_000);
        (ByzantineStage::new(Box::new(echo), shared.clone()), shared)
    }

    #[test]
    fn a_slow_primary_holds_pre_prepares_until_its_timer_fires() {
        let me = Principal::Order(ReplicaId(0));
        let (mut stage, shared) = wrapped(Behaviour::SlowPrimary);
        let mut out = Vec::new();
        stage.handle(1_000, Input::Message(pre_prepare(2)), &mut out);
        // The persist and the local copy go at once; the remote copy waits 150 ms.
        assert!(matches!(out[0], Action::Persist { .. }));
        assert_eq!(sends(&out), vec![vec![me]]);
        assert!(out.iter().any(|a| matches!(
            a,
            Action::SetTimer {
                timer: Timer::Held,
                at: 151_000
            }
        )));
        assert_eq!(stage.held(), 1);
        let mut early = Vec::new();
        stage.handle(100_000, Input::Timer(Timer::Held), &mut early);
        assert!(sends(&early).is_empty(), "released early: {early:?}");
        assert!(early.iter().any(|a| matches!(
            a,
            Action::SetTimer {
                timer: Timer::Held,
                at: 151_000
            }
        )));
        let mut due = Vec::new();
        stage.handle(151_000, Input::Timer(Timer::Held), &mut due);
        assert_eq!(sends(&due), vec![vec![Principal::Order(ReplicaId(1))]]);
        // The timer that fired is gone, and nothing else is held: no new one.
        assert!(!due.iter().any(|a| matches!(a, Action::SetTimer { .. })));
        assert_eq!(stage.held(), 0);
        assert_eq!(shared.lock().unwrap().counts().get(Behaviour::SlowPrimary.class()), 1);
        // An empty batch (a heartbeat) is not held.
        let mut out = Vec::new();
        stage.handle(200_000, Input::Message(pre_prepare(0)), &mut out);
        assert_eq!(sends(&out).len(), 2);
    }

    #[test]
    fn a_silent_replica_sends_only_to_itself() {
        let me = Principal::Order(ReplicaId(0));
        let (mut stage, _) = wrapped(Behaviour::Silence);
        let mut out = Vec::new();
        stage.handle(1_000, Input::Message(pre_prepare(1)), &mut out);
        assert_eq!(sends(&out), vec![vec![me]]);
    }
}

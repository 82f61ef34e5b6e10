use std::path::PathBuf;
use upright_core::message::PbftMessage;
use upright_core::stage::PbftTimer;

use bytes::Bytes;
use std::sync::Arc;
use upright_core::ids::{ClientId, SeqNo};
use upright_core::ids::{Principal, Process, ReplicaId, StageKind};
use upright_core::message::Envelope;
use upright_core::message::{Message, Seal};
use upright_core::stage::{Action, Input, Stage, Stats, Time, Timer};

use crate::storage::StageLog;

use super::*;
use crate::storage::{parse_records, StorageOptions};

/// A stage that, on its timer, persists and sends to a remote order member and to its co-located
/// auth member; the auth member persists and replies to a client.
struct Fake {
    me: Principal,
    stats: Stats,
}

fn env(from: Principal, seqno: u64) -> Arc<Envelope> {
    Arc::new(Envelope::new(
        from,
        Message::LastExecuted { seqno: SeqNo(seqno) },
        Seal::None,
    ))
}

impl Stage for Fake {
    fn principal(&self) -> Principal {
        self.me
    }
    fn handle(&mut self, now: Time, input: Input, out: &mut Vec<Action>) {
        match input {
            Input::Start | Input::Recover => out.push(Action::SetTimer {
                timer: Timer::Pbft(PbftTimer::OrderTick),
                at: 10,
            }),
            Input::Timer(_) => {
                out.push(Action::Persist {
                    key: "order/x".into(),
                    value: Some(Bytes::from_static(b"1")),
                });
                out.push(Action::Send {
                    to: vec![Principal::Order(ReplicaId(1)), Principal::Auth(ReplicaId(0))],
                    envelope: env(self.me, now),
                });
            }
            Input::Message(_) => {
                out.push(Action::Persist {
                    key: "auth/y".into(),
                    value: Some(Bytes::from_static(b"2")),
                });
                out.push(Action::Send {
                    to: vec![Principal::Client(ClientId(0))],
                    envelope: env(self.me, now),
                });
            }
            Input::Invoke { .. } => {}
        }
    }
    fn stats(&self) -> &Stats {
        &self.stats
    }
}

/// Records each send with what the sender's log held on disk at that moment.
struct Checker {
    dirs: Vec<PathBuf>,
    sends: Vec<(Process, Vec<usize>)>,
}

impl Router for Checker {
    fn send(&mut self, _from: Principal, to: Vec<Principal>, _envelope: Arc<Envelope>) {
        for to in to {
            let on_disk = self
                .dirs
                .iter()
                .map(|d| parse_records(&std::fs::read(d.join("log")).unwrap()).0.len())
                .collect();
            self.sends.push((to.process_at(0), on_disk));
        }
    }
}

#[test]
fn persists_are_durable_before_sends_and_local_messages_go_through_memory() {
    let dir = tempfile::tempdir().unwrap();
    let mut members = Vec::new();
    let mut dirs = Vec::new();
    for (kind, principal) in [
        (StageKind::Auth, Principal::Auth(ReplicaId(0))),
        (StageKind::Order, Principal::Order(ReplicaId(0))),
    ] {
        let path = dir.path().join(format!("{kind:?}"));
        let (log, _, _) = StageLog::open(&path, StorageOptions::default()).unwrap();
        dirs.push(path);
        members.push(Member {
            kind,
            stage: Box::new(Fake {
                me: principal,
                stats: Stats::default(),
            }),
            log,
        });
    }
    let mut host = Host::new(ReplicaId(0), members);
    let mut router = Checker {
        dirs,
        sends: Vec::new(),
    };
    host.start(0);
    assert_eq!(host.next_timer(), Some(10));
    host.fire_timers(5);
    host.flush(5, &mut router).unwrap();
    assert!(router.sends.is_empty(), "timer not due yet");
    host.fire_timers(10);
    assert_eq!(host.next_timer(), None, "both members' timers fired");
    host.flush(10, &mut router).unwrap();
    // Both members fired: each sent once to order 1 (one copy per process) after its persist was
    // on disk; each local delivery made the auth member persist and answer the client, also after
    // its persist was durable.
    let to_order: Vec<_> = router
        .sends
        .iter()
        .filter(|(p, _)| *p == Process::Replica(ReplicaId(1)))
        .collect();
    assert_eq!(to_order.len(), 2);
    for (_, on_disk) in &to_order {
        assert!(on_disk.iter().sum::<usize>() >= 1);
    }
    let to_client: Vec<_> = router
        .sends
        .iter()
        .filter(|(p, _)| *p == Process::Client(ClientId(0)))
        .collect();
    assert_eq!(to_client.len(), 2);
    assert!(
        to_client.last().unwrap().1[0] >= 2,
        "auth's two persists synced before its reply"
    );
    assert_eq!(host.stats.local, 2);
    assert!(host.stats.group_commits >= 2);
}

/// An auth-like member that persists each message at once but only answers, once for all of
/// them, from its flush hook.
struct Buffering {
    stats: Stats,
    buffered: u64,
    flushes: u64,
}

impl Stage for Buffering {
    fn principal(&self) -> Principal {
        Principal::Auth(ReplicaId(0))
    }
    fn handle(&mut self, _now: Time, input: Input, out: &mut Vec<Action>) {
        if let Input::Message(_) = input {
            self.buffered += 1;
            out.push(Action::Persist {
                key: format!("auth/{}", self.buffered),
                value: Some(Bytes::from_static(b"1")),
            });
        }
    }
    fn flush(&mut self, now: Time, out: &mut Vec<Action>) {
        self.flushes += 1;
        if std::mem::take(&mut self.buffered) > 0 {
            out.push(Action::Send {
                to: vec![Principal::Client(ClientId(0))],
                envelope: env(self.principal(), now),
            });
        }
    }
    fn stats(&self) -> &Stats {
        &self.stats
    }
}

#[test]
fn the_flush_hook_sends_once_per_round_after_the_round_is_durable() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("auth");
    let (log, _, _) = StageLog::open(&path, StorageOptions::default()).unwrap();
    let (order_log, _, _) = StageLog::open(&dir.path().join("order"), StorageOptions::default()).unwrap();
    let members = vec![
        Member {
            kind: StageKind::Auth,
            stage: Box::new(Buffering {
                stats: Stats::default(),
                buffered: 0,
                flushes: 0,
            }),
            log,
        },
        Member {
            kind: StageKind::Order,
            stage: Box::new(Fake {
                me: Principal::Order(ReplicaId(0)),
                stats: Stats::default(),
            }),
            log: order_log,
        },
    ];
    let mut host = Host::new(ReplicaId(0), members);
    let mut router = Checker {
        dirs: vec![path],
        sends: Vec::new(),
    };
    host.start(0);
    for seqno in 0..3 {
        // A kind the host routes to the auth member.
        host.deliver(
            1,
            Arc::new(Envelope::new(
                Principal::Exec(ReplicaId(1)),
                Message::BatchComplete {
                    seqno: SeqNo(seqno),
                    requests: Vec::new(),
                },
                Seal::None,
            )),
        );
    }
    host.flush(1, &mut router).unwrap();
    assert_eq!(router.sends.len(), 1, "one send for the round's three inputs");
    assert_eq!(router.sends[0].1, vec![3], "after all three persists were on disk");
    host.flush(2, &mut router).unwrap();
    assert_eq!(router.sends.len(), 1, "nothing buffered, nothing sent");
    // The order member's timer sends to the co-located auth member: that local delivery is
    // flushed within the same host flush.
    host.fire_timers(10);
    host.flush(10, &mut router).unwrap();
    let to_client = router
        .sends
        .iter()
        .filter(|(p, _)| *p == Process::Client(ClientId(0)))
        .count();
    assert_eq!(to_client, 2);
}

/// An order-like member: each message makes it send a "PREPARE" to replica 1 (no persist), then
/// persist a "certificate" eagerly and send a "COMMIT" to replica 2 that depends on it; or, with
/// `lazy`, persist lazily and send to replica 1 only.
struct Preparer {
    stats: Stats,
    lazy: bool,
    handled: u64,
}

impl Stage for Preparer {
    fn principal(&self) -> Principal {
        Principal::Order(ReplicaId(0))
    }
    fn handle(&mut self, now: Time, input: Input, out: &mut Vec<Action>) {
        let Input::Message(_) = input else { return };
        self.handled += 1;
        let key = format!("order/{}", self.handled);
        if self.lazy {
            out.push(Action::PersistLazily {
                key,
                value: Some(Bytes::from_static(b"accepted")),
            });
            out.push(Action::Send {
                to: vec![Principal::Order(ReplicaId(1))],
                envelope: env(self.principal(), now),
            });
            return;
        }
        out.push(Action::Send {
            to: vec![Principal::Order(ReplicaId(1))],
            envelope: env(self.principal(), now),
        });
        out.push(Action::Persist {
            key,
            value: Some(Bytes::from_static(b"prepared")),
        });
        out.push(Action::Send {
            to: vec![Principal::Order(ReplicaId(2))],
            envelope: env(self.principal(), now),
        });
    }
    fn stats(&self) -> &Stats {
        &self.stats
    }
}

fn preparer_host(dir: &std::path::Path, lazy: bool) -> (Host<StageLog>, Checker) {
    let path = dir.join("order");
    let (log, _, _) = StageLog::open(&path, StorageOptions::default()).unwrap();
    let members = vec![Member {
        kind: StageKind::Order,
        stage: Box::new(Preparer {
            stats: Stats::default(),
            lazy,
            handled: 0,
        }),
        log,
    }];
    let router = Checker {
        dirs: vec![path],
        sends: Vec::new(),
    };
    (Host::new(ReplicaId(0), members), router)
}

fn prepare_message() -> Arc<Envelope> {
    // A kind the host routes to the order member.
    Arc::new(Envelope::new(
        Principal::Order(ReplicaId(1)),
        Message::Pbft(PbftMessage::Prepare {
            view: upright_core::ids::View(0),
            seqno: SeqNo(1),
            digest: upright_core::crypto::Digest::default(),
        }),
        Seal::None,
    ))
}

#[test]
fn a_send_emitted_before_an_eager_persist_goes_ahead_of_the_sync() {
    let dir = tempfile::tempdir().unwrap();
    let (mut host, mut router) = preparer_host(dir.path(), false);
    host.start(0);
    host.deliver(1, prepare_message());
    assert!(host.send_ahead(1, &mut router), "a send went ahead while a sync is due");
    assert_eq!(
        router.sends,
        vec![(Process::Replica(ReplicaId(1)), vec![0])],
        "before the sync"
    );
    host.flush(1, &mut router).unwrap();
    assert_eq!(
        router.sends[1],
        (Process::Replica(ReplicaId(2)), vec![1]),
        "the send after the persist waited for it"
    );
    assert_eq!(host.stats.sent_ahead, 1);
    // Two inputs in one round: the first one's persist holds back every later send, the second
    // input's "PREPARE" too (emission order is kept).
    host.deliver(2, prepare_message());
    host.deliver(2, prepare_message());
    host.flush(2, &mut router).unwrap();
    let round: Vec<_> = router.sends[2..].to_vec();
    assert_eq!(
        round,
        vec![
            (Process::Replica(ReplicaId(1)), vec![1]),
            (Process::Replica(ReplicaId(2)), vec![3]),
            (Process::Replica(ReplicaId(1)), vec![3]),
            (Process::Replica(ReplicaId(2)), vec![3]),
        ]
    );
    assert_eq!(host.stats.sent_ahead, 2);
    assert_eq!(host.stats.group_commits, 2);
}

#[test]
fn with_only_lazy_persists_nothing_waits_and_nothing_counts_as_ahead() {
    let dir = tempfile::tempdir().unwrap();
    let (mut host, mut router) = preparer_host(dir.path(), true);
    host.start(0);
    host.deliver(1, prepare_message());
    assert!(!host.send_ahead(1, &mut router), "no sync is due: no reason to yield");
    assert_eq!(router.sends, vec![(Process::Replica(ReplicaId(1)), vec![0])]);
    host.flush(1, &mut router).unwrap();
    assert_eq!(router.sends.len(), 1);
    assert_eq!(host.stats.sent_ahead, 0);
    assert_eq!(host.stats.group_commits, 0, "lazy persists are written, not synced");
}

/// A member that, on its timer, notes a commit after an eager persist (`behind`) or with
/// nothing to sync.
struct Noting {
    stats: Stats,
    behind: bool,
}

impl Stage for Noting {
    fn principal(&self) -> Principal {
        Principal::Order(ReplicaId(0))
    }
    fn handle(&mut self, _now: Time, input: Input, out: &mut Vec<Action>) {
        match input {
            Input::Start => out.push(Action::SetTimer {
                timer: Timer::Pbft(PbftTimer::OrderTick),
                at: 10,
            }),
            Input::Timer(_) => {
                if self.behind {
                    out.push(Action::Persist {
                        key: "order/prepared".into(),
                        value: Some(Bytes::from_static(b"1")),
                    });
                }
                out.push(Action::Note(upright_core::stage::Event::Committed {
                    seqno: SeqNo(1),
                    view: upright_core::ids::View(0),
                    history: upright_core::crypto::Digest::of(b"h"),
                }));
            }
            _ => {}
        }
    }
    fn stats(&self) -> &Stats {
        &self.stats
    }
}

/// A batch noted committed after an eager persist is durably so: the note takes effect (for
/// `take_notes`, progress) at the sync, and a crash before it loses the note with the persist
/// (simulator seed 152 at u = 1, r = 0 with recoveries: a member noted a commit, crashed
/// before its prepare was durable, and the next view ordered another batch there). With nothing
/// to sync the note takes effect at once.
#[test]
fn a_note_of_progress_takes_effect_when_what_it_reports_is_durable() {
    for behind in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let (log, _, _) = StageLog::open(dir.path(), StorageOptions::default()).unwrap();
        let member = Member {
            kind: StageKind::Order,
            stage: Box::new(Noting {
                stats: Stats::default(),
                behind,
            }) as Box<dyn Stage + Send>,
            log,
        };
        let mut host = Host::new(ReplicaId(0), vec![member]);
        host.keep_notes();
        host.start(0);
        host.fire_timers(10);
        let at_once = host.take_notes();
        assert_eq!(at_once.len(), usize::from(!behind), "behind {behind}: {at_once:?}");
        assert_eq!(host.progress.committed, u64::from(!behind));
        let mut router = Checker {
            dirs: Vec::new(),
            sends: Vec::new(),
        };
        host.flush(10, &mut router).unwrap();
        let after_sync = host.take_notes();
        assert_eq!(after_sync.len(), usize::from(behind), "behind {behind}: {after_sync:?}");
        assert_eq!(host.progress.committed, 1);
    }
}

//! Structure-aware: well-formed message sequences into one order stage (a backup of a u = r = 1
//! cluster with small windows). The bytes are a program: PRE-PREPAREs, PREPAREs and COMMITs from
//! any member for small views, sequence numbers and a few batches (so that they meet in the same
//! slots), any message the wire codec can decode sealed by any member (view changes, new views,
//! checkpoints, fetches), time moving on with the stage's timers firing, and crashes after which
//! the stage restarts from what it persisted. Checked: no panic (the stage's own assertions are
//! on), a bound on the actions of one input, and on what it keeps durably.
#![no_main]

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};

use libfuzzer_sys::fuzz_target;
use upright_core::config::Knobs;
use upright_core::ids::{Principal, ReplicaId, SeqNo, StageKind, View};
use upright_core::message::{Batch, Envelope, Message, PbftMessage, SealFor};
use upright_core::order::OrderStage;
use upright_core::stage::{Action, Input, Stage, Storage, Time, Timer};
use upright_core::testing::{fixture, Fixture};

/// The member under test: a backup in view 0.
const ME: u32 = 1;
const LOG_WINDOW: u64 = 8;
/// Most actions one input may cause (a NEW-VIEW may re-propose a window of slots to everyone).
const ACTIONS_PER_INPUT_MAX: usize = 4_096;
/// Most durable keys: a few per slot of the window, the view, the checkpoints.
const STORAGE_KEYS_MAX: usize = 64 * LOG_WINDOW as usize;

struct Run {
    f: &'static Fixture,
    stage: OrderStage,
    storage: Storage,
    timers: BTreeMap<Timer, Time>,
    now: Time,
}

impl Run {
    fn input(&mut self, input: Input) {
        let mut out = Vec::new();
        self.stage.handle(self.now, input, &mut out);
        assert!(
            out.len() <= ACTIONS_PER_INPUT_MAX,
            "{} actions for one input",
            out.len()
        );
        for action in out {
            match action {
                Action::Persist { key, value } | Action::PersistLazily { key, value } => {
                    match value {
                        Some(v) => self.storage.insert(key, v),
                        None => self.storage.remove(&key),
                    };
                }
                Action::SetTimer { timer, at } => {
                    self.timers.insert(timer, at);
                }
                Action::CancelTimer { timer } => {
                    self.timers.remove(&timer);
                }
                _ => {}
            }
        }
        assert!(
            self.storage.len() <= STORAGE_KEYS_MAX,
            "{} durable keys",
            self.storage.len()
        );
    }

    fn from(&mut self, sender: u8, message: Message) {
        let sender = sender as usize % self.f.replicas.len();
        let from = Principal::Order(ReplicaId(sender as u32));
        let envelope = Envelope::seal(
            &self.f.replicas[sender],
            &self.f.quorums,
            from,
            message,
            SealFor::Stage(StageKind::Order),
        );
        self.input(Input::Message(Arc::new(envelope)));
    }

    fn advance(&mut self, by: Time) {
        self.now += by;
        while let Some((&timer, &at)) = self.timers.iter().min_by_key(|(_, at)| **at) {
            if at > self.now {
                break;
            }
            self.timers.remove(&timer);
            self.input(Input::Timer(timer));
        }
    }

    fn restart(&mut self) {
        self.stage = OrderStage::new(
            self.f.config.clone(),
            ReplicaId(ME),
            self.f.replicas[ME as usize].clone(),
            &self.storage,
        )
        .expect("a restart from its own writes");
        self.timers.clear();
        self.input(Input::Start);
    }
}

/// The cluster's keys, made once (deriving the pairwise keys is most of a small input's time).
fn cluster() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let knobs = Knobs {
            checkpoint_interval: 4,
            log_window: LOG_WINDOW,
            pipeline_window: 4,
            view_change_timeout_us: 100_000,
            heartbeat_interval_us: 0,
            ..Knobs::default()
        };
        fixture(1, 1, 3, knobs)
    })
}

fuzz_target!(|data: &[u8]| {
    let f = cluster();
    let storage = Storage::new();
    let stage = OrderStage::new(
        f.config.clone(),
        ReplicaId(ME),
        f.replicas[ME as usize].clone(),
        &storage,
    )
    .expect("a stage");
    let mut run = Run {
        f,
        stage,
        storage,
        timers: BTreeMap::new(),
        now: 1_000_000,
    };
    run.input(Input::Start);
    let batches: Vec<Batch> = (0..3u64)
        .map(|k| Batch {
            time_us: 1_000_000 + k,
            entries: Vec::new(),
        })
        .collect();
    let mut bytes = data.iter().copied();
    while let Some(op) = bytes.next() {
        let mut arg = || bytes.next().unwrap_or(0);
        let (sender, view, seqno, pick) = (arg(), View(arg() as u64 % 3), SeqNo(arg() as u64 % 20), arg());
        let digest = batches[pick as usize % batches.len()].digest();
        match op % 8 {
            0 => run.from(
                view.0 as u8,
                Message::Pbft(PbftMessage::PrePrepare {
                    view,
                    seqno,
                    batch: batches[pick as usize % batches.len()].clone(),
                }),
            ),
            1 | 2 => run.from(sender, Message::Pbft(PbftMessage::Prepare { view, seqno, digest })),
            3 | 4 => run.from(sender, Message::Pbft(PbftMessage::Commit { view, seqno, digest })),
            5 => {
                let len = (pick as usize).min(bytes.len());
                let raw: Vec<u8> = bytes.by_ref().take(len).collect();
                if let Ok(message) = upright_core::codec::from_bytes::<Message>(&raw) {
                    run.from(sender, message);
                }
            }
            6 => run.advance(pick as Time * 1_000),
            _ => {
                if pick % 4 == 0 {
                    run.restart();
                } else {
                    run.advance(pick as Time * 50);
                }
            }
        }
    }
    run.advance(1_000_000);
});

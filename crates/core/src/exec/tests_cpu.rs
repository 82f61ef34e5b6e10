//! CPU cost of the reply path, as an ignored test (Linux only: it reads the thread's CPU time from
//! `/proc/thread-self/schedstat`, which unlike wall time does not count time spent descheduled on a
//! busy machine). Run with
//! `cargo test -p upright-core --lib cpu_cost -- --ignored --nocapture`.
//!
//! - exec: an execution member takes NEXT-BATCHes of 128 inline requests from two order members
//!   (its co-located one, which agrees the batch, and another, dropped as old), executes them on
//!   the KV service and replies; ns per request.
//! - client: a client seals a request and handles the three replies of `u = 1, r = 1`; ns per
//!   request.

use std::sync::Arc;

use bytes::Bytes;

use super::tests::chain;
use super::ExecStage;
use crate::client::Client;
use crate::config::Knobs;
use crate::ids::{ClientId, Principal, ReplicaId, RequestId, SeqNo, StageKind, View};
use crate::kv::KvService;
use crate::message::{Envelope, Message, ReplyBody, RequestBody, RequestEntry, SealFor};
use crate::stage::{Action, Input, Stage, Storage};
use crate::testing::{fixture, Fixture};

/// CPU time this thread has run, in nanoseconds.
fn cpu_ns() -> u128 {
    let stat = std::fs::read_to_string("/proc/thread-self/schedstat").expect("Linux schedstat");
    stat.split_whitespace()
        .next()
        .and_then(|t| t.parse().ok())
        .expect("run time in ns")
}

/// Requests per batch, as the bench's primary fills them at 256 clients.
const BATCH: u32 = 128;

/// NEXT-BATCHes from order members 0 and 1 for `rounds` batches of [`BATCH`] inline requests.
fn next_batches(f: &Fixture, rounds: u64) -> Vec<Input> {
    let op = Bytes::from_static(b"12345678");
    let batches: Vec<Vec<RequestEntry>> = (0..rounds)
        .map(|k| {
            (0..BATCH)
                .map(|c| RequestEntry {
                    client: ClientId(c),
                    request_id: RequestId(k + 1),
                    body: RequestBody::Inline(op.clone()),
                })
                .collect()
        })
        .collect();
    let mut inputs = Vec::new();
    for b in chain(batches) {
        for o in 0..2u32 {
            let message = Message::NextBatch {
                view: View(0),
                seqno: b.seqno,
                history: b.history,
                time_us: b.time_us,
                entries: b.entries.clone(),
            };
            let envelope = Envelope::seal(
                &f.replicas[o as usize],
                &f.quorums,
                Principal::Order(ReplicaId(o)),
                message,
                SealFor::Stage(StageKind::Exec),
            );
            inputs.push(Input::Message(Arc::new(envelope)));
        }
    }
    inputs
}

/// Execution member 0's CPU ns per request over `rounds` batches.
fn exec_cost(f: &Fixture, rounds: u64) -> f64 {
    let inputs = next_batches(f, rounds);
    let service = Box::new(KvService::new());
    let mut stage = ExecStage::new(
        f.config.clone(),
        ReplicaId(0),
        f.replicas[0].clone(),
        &Storage::new(),
        service,
    )
    .expect("valid configuration");
    let mut out = Vec::new();
    stage.handle(0, Input::Start, &mut out);
    let start = cpu_ns();
    for input in inputs {
        out.clear();
        stage.handle(1, input, &mut out);
    }
    let ns = (cpu_ns() - start) as f64 / (rounds * BATCH as u64) as f64;
    assert_eq!(stage.last_executed().0, SeqNo(rounds));
    ns
}

/// Client 0's CPU ns per request over `n` requests, each answered by all three execution members.
fn client_cost(f: &Fixture, n: u64) -> f64 {
    let reply = |id: u64, e: u32| {
        let message = Message::Reply {
            request_id: RequestId(id),
            result: ReplyBody::Full(Bytes::from_static(b"ok")),
            read_only: false,
            pushes_sent: 0,
        };
        let to = SealFor::One(Principal::Client(ClientId(0)));
        let envelope = Envelope::seal(
            &f.replicas[e as usize],
            &f.quorums,
            Principal::Exec(ReplicaId(e)),
            message,
            to,
        );
        Input::Message(Arc::new(envelope))
    };
    let replies: Vec<[Input; 3]> = (1..=n).map(|id| [0, 1, 2].map(|e| reply(id, e))).collect();
    let mut client = Client::new(f.config.clone(), ClientId(0), f.clients[0].clone()).expect("valid configuration");
    let mut out = Vec::new();
    let mut delivered = 0;
    let start = cpu_ns();
    for three in replies {
        let invoke = Input::Invoke {
            operation: Bytes::from_static(b"12345678"),
            path: crate::stage::ReadPath::Ordered,
        };
        client.handle(0, invoke, &mut out);
        for reply in three {
            client.handle(0, reply, &mut out);
        }
        delivered += out.iter().filter(|a| matches!(a, Action::Deliver { .. })).count();
        out.clear();
    }
    let ns = (cpu_ns() - start) as f64 / n as f64;
    assert_eq!(delivered as u64, n);
    ns
}

#[test]
#[ignore]
fn cpu_cost_of_the_reply_path() {
    let knobs = Knobs {
        checkpoint_interval: 1 << 20,
        log_window: 1 << 21,
        ..Knobs::default()
    };
    let f = fixture(1, 1, BATCH, knobs);
    for _ in 0..3 {
        println!("exec: {:.0} ns CPU per request", exec_cost(&f, 1000));
    }
    for _ in 0..3 {
        println!("client: {:.0} ns CPU per request", client_cost(&f, 20_000));
    }
}

//! What the service fuzz targets share: two replicas executing the same batch must agree, and a
//! checkpoint must restore to a service with the same checkpoint.

use bytes::Bytes;
use upright_core::ids::{ClientId, RequestId, SeqNo};
use upright_core::service::{BatchContext, Effects, Service, ServiceRequest};

/// Batch `n` of a run: its sequence number, agreed time `n * step_us` and a seed of its own.
pub fn batch(n: u64, step_us: u64) -> BatchContext {
    BatchContext {
        index: 0,
        seqno: SeqNo(n),
        time_us: step_us * n,
        seed: [n as u8; 32],
    }
}

/// `operations` (each with its client) as requests numbered on from `*last_id`.
pub fn requests(last_id: &mut u64, operations: Vec<(u32, Bytes)>) -> Vec<ServiceRequest> {
    operations
        .into_iter()
        .map(|(client, operation)| {
            *last_id += 1;
            ServiceRequest {
                client: ClientId(client),
                request_id: RequestId(*last_id),
                operation,
            }
        })
        .collect()
}

/// Executes `requests` on both replicas and checks that they return one reply per request and the
/// same replies and pushes; returns the replies.
pub fn execute_on_both<S: Service>(
    a: &mut S,
    b: &mut S,
    context: &BatchContext,
    requests: &[ServiceRequest],
) -> Vec<Bytes> {
    let (mut ea, mut eb) = (Effects::default(), Effects::default());
    let replies = a.execute(context, requests, &mut ea);
    assert_eq!(replies.len(), requests.len(), "one reply per request");
    assert_eq!(
        replies,
        b.execute(context, requests, &mut eb),
        "replies are deterministic"
    );
    assert_eq!(ea, eb, "pushes are deterministic");
    replies
}

/// Checks that both replicas' checkpoints are equal and that one restores, in a fresh service, to
/// a service with the same checkpoint.
pub fn checkpoints_agree_and_restore<S: Service>(a: &S, b: &S, fresh: impl Fn() -> S) {
    let checkpoint = a.checkpoint();
    assert_eq!(checkpoint, b.checkpoint(), "checkpoints are deterministic");
    let mut restored = fresh();
    restored.restore(&checkpoint).expect("a checkpoint restores");
    assert_eq!(
        restored.checkpoint(),
        checkpoint,
        "a restored service has the same checkpoint"
    );
}

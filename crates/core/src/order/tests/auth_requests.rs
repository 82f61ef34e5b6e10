//! Batched AUTH-REQs: every item is handled as a single request was; bad items are dropped alone.

use std::sync::Arc;

use super::cluster::{small_knobs, Cluster, CLIENTS};
use crate::ids::{ClientId, Principal, ReplicaId, RequestId};
use crate::message::{AuthItem, Envelope, Message, RequestBody, RequestEntry, Seal};

fn entry(client: u32, request_id: u64) -> RequestEntry {
    RequestEntry {
        client: ClientId(client),
        request_id: RequestId(request_id),
        body: RequestBody::Inline(format!("op {client} {request_id}").into_bytes().into()),
    }
}

fn auth_request(from: u32, items: Vec<AuthItem>) -> Arc<Envelope> {
    Arc::new(Envelope::new(
        Principal::Auth(ReplicaId(from)),
        Message::AuthRequest { items },
        Seal::None,
    ))
}

#[test]
fn a_batch_with_one_bad_row_keeps_the_good_items() {
    let mut c = Cluster::new(1, 1, small_knobs());
    let mut items: Vec<AuthItem> = (0..3)
        .map(|client| {
            let entry = entry(client, 1);
            AuthItem {
                row: c.row(0, &entry),
                entry,
            }
        })
        .collect();
    items[1].row.authenticator.macs[1].0[0] ^= 0x5a;
    c.deliver(1, auth_request(0, items));
    c.pump();
    assert_eq!(c.stat(1, "drop_bad_matrix_row"), 1);
    assert_eq!(c.stat(1, "request_rows"), 2);
    let pool = &c.member(1).pool;
    assert_eq!(pool.len(), 2);
    assert!(pool.ready(ClientId(0), RequestId(1), 1).is_some());
    assert!(
        pool.ready(ClientId(1), RequestId(1), 1).is_none(),
        "the bad row is not pooled"
    );
    assert!(pool.ready(ClientId(2), RequestId(1), 1).is_some());
}

#[test]
fn duplicated_and_forged_items_are_counted_and_dropped() {
    let mut c = Cluster::new(1, 1, small_knobs());
    let first = entry(0, 1);
    let item = AuthItem {
        row: c.row(0, &first),
        entry: first,
    };
    // The same item twice in one message: the second is a duplicate row.
    c.deliver(1, auth_request(0, vec![item.clone(), item.clone()]));
    // Auth member 0's row claimed by auth member 2: wrong signer.
    c.deliver(1, auth_request(2, vec![item]));
    c.deliver(1, auth_request(2, vec![]));
    c.pump();
    assert_eq!(c.stat(1, "request_rows"), 1);
    assert_eq!(c.stat(1, "drop_duplicate_row"), 1);
    assert_eq!(c.stat(1, "drop_row_signer_mismatch"), 1);
    assert_eq!(c.stat(1, "drop_empty_auth_request"), 1);
}

#[test]
fn one_message_per_auth_member_orders_every_client() {
    let mut c = Cluster::new(1, 1, small_knobs());
    let entries: Vec<RequestEntry> = (0..CLIENTS).map(|client| entry(client, 1)).collect();
    for a in 0..c.q.n_auth {
        let items = entries
            .iter()
            .map(|e| AuthItem {
                entry: e.clone(),
                row: c.row(a, e),
            })
            .collect();
        let envelope = auth_request(a as u32, items);
        for o in 0..c.q.n_order {
            c.deliver(o, envelope.clone());
        }
    }
    c.pump();
    let ordered = c.ordered_requests();
    for client in 0..CLIENTS {
        assert!(ordered.contains(&(ClientId(client), RequestId(1))), "client {client}");
    }
}

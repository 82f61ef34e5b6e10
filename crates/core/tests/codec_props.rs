//! Property tests of the wire codec: decoding arbitrary bytes never panics, and every message
//! round-trips.

use bytes::Bytes;
use proptest::prelude::*;
use upright_core::codec::DecodeError;
use upright_core::crypto::{Authenticator, Digest, Mac, MatrixRow, MatrixSignature};
use upright_core::ids::{ClientId, Principal, ReplicaId, RequestId, SeqNo, View};
use upright_core::limits::AUTH_ITEMS_MAX;
use upright_core::message::PbftMessage;
use upright_core::message::{AuthItem, Batch, Envelope, Message, RequestBody, RequestEntry, Seal, SignedEntry};
use upright_core::wire::{decode, encode, WIRE_VERSION};

fn principal() -> impl Strategy<Value = Principal> {
    prop_oneof![
        any::<u32>().prop_map(|i| Principal::Client(ClientId(i))),
        (0u32..8).prop_map(|i| Principal::Auth(ReplicaId(i))),
        (0u32..8).prop_map(|i| Principal::Order(ReplicaId(i))),
        (0u32..8).prop_map(|i| Principal::Exec(ReplicaId(i))),
    ]
}

fn digest() -> impl Strategy<Value = Digest> {
    any::<[u8; 32]>().prop_map(Digest)
}

fn entry() -> impl Strategy<Value = RequestEntry> {
    (
        any::<u32>(),
        any::<u64>(),
        prop::collection::vec(any::<u8>(), 0..100),
        any::<bool>(),
        digest(),
    )
        .prop_map(|(c, n, op, inline, d)| RequestEntry {
            client: ClientId(c),
            request_id: RequestId(n),
            body: if inline {
                RequestBody::Inline(Bytes::from(op))
            } else {
                RequestBody::Digest(d)
            },
        })
}

fn authenticator() -> impl Strategy<Value = Authenticator> {
    prop::collection::vec(any::<[u8; 16]>().prop_map(Mac), 0..5).prop_map(|macs| Authenticator { macs })
}

fn message() -> impl Strategy<Value = Message> {
    prop_oneof![
        (
            any::<u32>(),
            any::<u64>(),
            prop::collection::vec(any::<u8>(), 0..200),
            any::<bool>(),
            prop::option::of(any::<u8>())
        )
            .prop_map(|(c, n, op, ro, sig)| Message::ClientRequest {
                client: ClientId(c),
                request_id: RequestId(n),
                operation: Bytes::from(op),
                read_only: ro,
                signature: sig.map(|b| upright_core::crypto::Signature([b; 64])),
                config_epoch: n % 3,
            }),
        prop::collection::vec((entry(), 0u32..8, authenticator()), 0..6).prop_map(|items| Message::AuthRequest {
            items: items
                .into_iter()
                .map(|(entry, s, authenticator)| AuthItem {
                    entry,
                    row: MatrixRow {
                        signer: ReplicaId(s),
                        authenticator
                    }
                })
                .collect()
        }),
        (
            any::<u64>(),
            any::<u64>(),
            any::<u64>(),
            prop::collection::vec((entry(), authenticator()), 0..4)
        )
            .prop_map(|(v, n, t, entries)| Message::Pbft(PbftMessage::PrePrepare {
                view: View(v),
                seqno: SeqNo(n),
                batch: Batch {
                    time_us: t,
                    entries: entries
                        .into_iter()
                        .map(|(entry, a)| SignedEntry {
                            entry,
                            matrix: MatrixSignature {
                                rows: vec![MatrixRow {
                                    signer: ReplicaId(0),
                                    authenticator: a
                                }]
                            }
                        })
                        .collect()
                }
            })),
        (any::<u64>(), any::<u64>(), digest()).prop_map(|(v, n, d)| Message::Pbft(PbftMessage::Commit {
            view: View(v),
            seqno: SeqNo(n),
            digest: d
        })),
        (
            any::<u64>(),
            any::<u64>(),
            digest(),
            any::<u64>(),
            prop::collection::vec(entry(), 0..4)
        )
            .prop_map(|(v, n, h, t, entries)| Message::NextBatch {
                view: View(v),
                seqno: SeqNo(n),
                history: h,
                time_us: t,
                entries
            }),
        (any::<u64>(), any::<Option<u64>>()).prop_map(|(n, at)| Message::WakeAt {
            seqno: SeqNo(n),
            at_us: at
        }),
        (
            any::<u64>(),
            digest(),
            any::<u32>(),
            prop::collection::vec(any::<u8>(), 0..300)
        )
            .prop_map(|(n, d, i, data)| Message::StateChunk {
                seqno: SeqNo(n),
                state_digest: d,
                index: i,
                data: Bytes::from(data)
            }),
    ]
}

fn seal() -> impl Strategy<Value = Seal> {
    prop_oneof![
        Just(Seal::None),
        any::<[u8; 16]>().prop_map(|m| Seal::Mac(Mac(m))),
        authenticator().prop_map(Seal::Authenticator),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        let _ = decode(&bytes);
        let mut versioned = vec![WIRE_VERSION];
        versioned.extend_from_slice(&bytes);
        let _ = decode(&versioned);
    }

    #[test]
    fn envelopes_round_trip(from in principal(), message in message(), seal in seal()) {
        let envelope = Envelope::new(from, message, seal);
        let bytes = encode(&envelope);
        prop_assert_eq!(decode(&bytes).unwrap(), envelope);
    }

    #[test]
    fn corrupted_frames_never_panic(from in principal(), message in message(), flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8)) {
        let mut bytes = encode(&Envelope::new(from, message, Seal::None));
        for (index, value) in flips {
            let i = index.index(bytes.len());
            bytes[i] ^= value;
        }
        let _ = decode(&bytes);
        bytes.truncate(bytes.len() / 2);
        let _ = decode(&bytes);
    }
}

#[test]
fn version_length_and_trailing_bytes_are_checked() {
    let envelope = Envelope::new(
        Principal::Client(ClientId(1)),
        Message::Pbft(PbftMessage::Commit {
            view: View(1),
            seqno: SeqNo(2),
            digest: Digest::of(b"x"),
        }),
        Seal::None,
    );
    let mut bytes = encode(&envelope);
    assert_eq!(decode(&[]), Err(DecodeError::Empty));
    bytes[0] = 99;
    assert_eq!(decode(&bytes), Err(DecodeError::Version(99)));
    bytes[0] = WIRE_VERSION;
    bytes.push(0);
    assert_eq!(decode(&bytes), Err(DecodeError::Trailing));
    // A length prefix claiming 2^32 bytes of operation must fail without allocating it.
    let mut huge = vec![WIRE_VERSION, 0, 1, 0]; // from = Client(1), message = ClientRequest
    huge.extend_from_slice(&[1, 1, 0xff, 0xff, 0xff, 0xff, 0x0f]);
    assert!(decode(&huge).is_err());
}

#[test]
fn auth_requests_above_the_item_limit_are_refused() {
    let item = AuthItem {
        entry: RequestEntry {
            client: ClientId(1),
            request_id: RequestId(1),
            body: RequestBody::Inline(Bytes::from_static(b"op")),
        },
        row: MatrixRow {
            signer: ReplicaId(0),
            authenticator: Authenticator {
                macs: vec![Mac([7; 16]); 4],
            },
        },
    };
    let envelope = |n: usize| {
        Envelope::new(
            Principal::Auth(ReplicaId(0)),
            Message::AuthRequest {
                items: vec![item.clone(); n],
            },
            Seal::None,
        )
    };
    let full = envelope(AUTH_ITEMS_MAX);
    assert_eq!(decode(&encode(&full)).unwrap(), full);
    assert_eq!(
        decode(&encode(&envelope(AUTH_ITEMS_MAX + 1))),
        Err(DecodeError::Limit("auth items"))
    );
}

/// The fast phases' messages are bounded like PRE-PREPARE: a CHAIN's batch and a VIEW-CHANGE's
/// speculative claims (batch entries and the number of claims) are refused past their limits.
#[test]
fn chain_batches_and_speculative_claims_above_the_limits_are_refused() {
    use upright_core::crypto::Signature;
    use upright_core::limits::BATCH_REQUESTS_MAX;
    use upright_core::message::{Signed, SpeculativeClaim, ViewChange};
    let entry = |i: u32| SignedEntry {
        entry: RequestEntry {
            client: ClientId(i),
            request_id: RequestId(1),
            body: RequestBody::Inline(Bytes::from_static(b"op")),
        },
        matrix: MatrixSignature { rows: vec![] },
    };
    let batch = |n: usize| Batch {
        time_us: 1,
        entries: (0..n as u32).map(entry).collect(),
    };
    let chain = |n: usize| {
        let message = Message::Pbft(PbftMessage::Chain {
            view: View(1),
            seqno: SeqNo(3),
            batch: batch(n),
        });
        Envelope::new(Principal::Order(ReplicaId(1)), message, Seal::None)
    };
    let full = chain(BATCH_REQUESTS_MAX);
    assert_eq!(decode(&encode(&full)).unwrap(), full);
    assert_eq!(
        decode(&encode(&chain(BATCH_REQUESTS_MAX + 1))),
        Err(DecodeError::Limit("batch entries"))
    );
    let view_change = |claims: Vec<SpeculativeClaim>| {
        let body = ViewChange {
            new_view: View(2),
            stable: None,
            prepared: vec![],
            pre_prepared: vec![],
            speculative: claims,
        };
        let signed = Signed {
            value: body,
            signer: ReplicaId(1),
            signature: Signature([0; 64]),
        };
        Envelope::new(
            Principal::Order(ReplicaId(1)),
            Message::Pbft(PbftMessage::ViewChange(signed)),
            Seal::None,
        )
    };
    let claim = |n: usize| SpeculativeClaim {
        seqno: SeqNo(3),
        view: View(1),
        history: Digest::of(b"h"),
        batch: batch(n),
    };
    let fine = view_change(vec![claim(2)]);
    assert_eq!(decode(&encode(&fine)).unwrap(), fine);
    assert_eq!(
        decode(&encode(&view_change(vec![claim(BATCH_REQUESTS_MAX + 1)]))),
        Err(DecodeError::Limit("batch entries"))
    );
}

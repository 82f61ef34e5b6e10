//! Message mutation in the ByzzFuzz style (`--mutate`): a faulty replica's outgoing messages get
//! small structured changes — a sequence number or view one off, a digest with a flipped bit, an
//! element dropped from or repeated in a set, a length or time nudged, a payload byte flipped —
//! and are re-sealed (re-MACed, and re-signed where the replica signed them) with that replica's
//! own keys, so they pass authentication and reach the protocol's logic. A message whose content
//! the replica did not author (a signature of another member inside it) keeps that part.

use bytes::Bytes;
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use upright_core::crypto::{Digest, KeyRing};
use upright_core::ids::{ReplicaId, RequestId, SeqNo, View};
use upright_core::message::{Message, PbftMessage, ReplyBody, Signed};

/// Which of its fields a mutation changed (a fault-class name for the counts).
pub type Kind = &'static str;

fn flip_digest(d: &Digest) -> Digest {
    let mut out = *d;
    out.0[0] ^= 0x01;
    out
}

fn flip_bytes(b: &Bytes, rng: &mut ChaCha8Rng) -> Bytes {
    if b.is_empty() {
        return Bytes::from_static(b"\x00");
    }
    let mut v = b.to_vec();
    let i = rng.random_range(0..v.len());
    v[i] ^= 1 << rng.random_range(0..8);
    Bytes::from(v)
}

fn nudge(n: u64, rng: &mut ChaCha8Rng) -> u64 {
    if rng.random_bool(0.5) {
        n.wrapping_add(1)
    } else {
        n.wrapping_sub(1)
    }
}

fn seqno(s: SeqNo, rng: &mut ChaCha8Rng) -> SeqNo {
    SeqNo(nudge(s.0, rng))
}

fn view(v: View, rng: &mut ChaCha8Rng) -> View {
    View(nudge(v.0, rng))
}

/// Drops one element, or repeats one (a set or list of the message); `None` if it is empty.
fn reshape<T: Clone>(items: &[T], rng: &mut ChaCha8Rng) -> Option<(Vec<T>, Kind)> {
    if items.is_empty() {
        return None;
    }
    let mut v = items.to_vec();
    let i = rng.random_range(0..v.len());
    if rng.random_bool(0.5) {
        v.remove(i);
        Some((v, "mutate_drop"))
    } else {
        let copy = v[i].clone();
        v.insert(i, copy);
        Some((v, "mutate_repeat"))
    }
}

/// A small structured change to `message` sent by replica `me`, and what it changed; `None` if
/// the message has nothing this module changes.
pub fn mutate(rng: &mut ChaCha8Rng, keys: &KeyRing, me: ReplicaId, message: &Message) -> Option<(Message, Kind)> {
    let pick = rng.random_range(0..4u32);
    let out = match message.clone() {
        Message::Pbft(PbftMessage::PrePrepare {
            view: v,
            seqno: s,
            batch,
        }) => {
            let mut batch = batch;
            let kind = match pick {
                0 => {
                    return Some((
                        pbft(PbftMessage::PrePrepare {
                            view: view(v, rng),
                            seqno: s,
                            batch,
                        }),
                        "mutate_view",
                    ))
                }
                1 => {
                    return Some((
                        pbft(PbftMessage::PrePrepare {
                            view: v,
                            seqno: seqno(s, rng),
                            batch,
                        }),
                        "mutate_seqno",
                    ))
                }
                2 => {
                    batch.time_us = nudge(batch.time_us, rng);
                    "mutate_time"
                }
                _ => {
                    let (entries, kind) = reshape(&batch.entries, rng)?;
                    batch.entries = entries;
                    kind
                }
            };
            (
                pbft(PbftMessage::PrePrepare {
                    view: v,
                    seqno: s,
                    batch,
                }),
                kind,
            )
        }
        Message::Pbft(PbftMessage::Chain {
            view: v,
            seqno: s,
            mut batch,
        }) => {
            let (v, s, kind) = match pick {
                0 => (view(v, rng), s, "mutate_view"),
                1 => (v, seqno(s, rng), "mutate_seqno"),
                2 => {
                    batch.time_us = nudge(batch.time_us, rng);
                    (v, s, "mutate_time")
                }
                _ => {
                    let (entries, kind) = reshape(&batch.entries, rng)?;
                    batch.entries = entries;
                    (v, s, kind)
                }
            };
            (
                pbft(PbftMessage::Chain {
                    view: v,
                    seqno: s,
                    batch,
                }),
                kind,
            )
        }
        Message::Pbft(PbftMessage::Prepare {
            view: v,
            seqno: s,
            digest,
        }) => {
            let (v, s, digest, kind) = vote(rng, pick, v, s, digest);
            (
                pbft(PbftMessage::Prepare {
                    view: v,
                    seqno: s,
                    digest,
                }),
                kind,
            )
        }
        Message::Pbft(PbftMessage::Commit {
            view: v,
            seqno: s,
            digest,
        }) => {
            let (v, s, digest, kind) = vote(rng, pick, v, s, digest);
            (
                pbft(PbftMessage::Commit {
                    view: v,
                    seqno: s,
                    digest,
                }),
                kind,
            )
        }
        // Only what it signed itself can be changed and signed again.
        Message::Pbft(PbftMessage::Checkpoint(signed)) if signed.signer == me => {
            let mut vote = signed.value.clone();
            let kind = if pick % 2 == 0 {
                vote.seqno = seqno(vote.seqno, rng);
                "mutate_seqno"
            } else {
                vote.digest = flip_digest(&vote.digest);
                "mutate_digest"
            };
            (pbft(PbftMessage::Checkpoint(Signed::sign(keys, me, vote))), kind)
        }
        Message::Pbft(PbftMessage::ViewChange(signed)) if signed.signer == me => {
            let mut vc = signed.value.clone();
            let kind = match pick {
                0 => {
                    vc.new_view = view(vc.new_view, rng);
                    "mutate_view"
                }
                1 => {
                    let (prepared, kind) = reshape(&vc.prepared, rng)?;
                    vc.prepared = prepared;
                    kind
                }
                2 => {
                    let (pre_prepared, kind) = reshape(&vc.pre_prepared, rng)?;
                    vc.pre_prepared = pre_prepared;
                    kind
                }
                _ => {
                    vc.stable.take()?;
                    "mutate_drop"
                }
            };
            (pbft(PbftMessage::ViewChange(Signed::sign(keys, me, vc))), kind)
        }
        Message::Pbft(PbftMessage::NewView(msg)) if msg.new_view.signer == me => {
            let mut nv = msg.new_view.value.clone();
            let mut attached = msg.view_changes;
            let kind = match pick {
                0 => {
                    nv.view = view(nv.view, rng);
                    "mutate_view"
                }
                1 if !attached.is_empty() && rng.random_bool(0.5) => {
                    // The VIEW-CHANGEs a relayed NEW-VIEW carries (it names the same ones).
                    let (view_changes, kind) = reshape(&attached, rng)?;
                    attached = view_changes;
                    kind
                }
                1 => {
                    let (view_changes, kind) = reshape(&nv.view_changes, rng)?;
                    nv.view_changes = view_changes;
                    kind
                }
                _ => {
                    let (batches, kind) = reshape(&nv.batches, rng)?;
                    nv.batches = batches;
                    kind
                }
            };
            let new_view = Signed::sign(keys, me, nv);
            (
                pbft(PbftMessage::NewView(upright_core::message::NewViewMessage {
                    new_view,
                    view_changes: attached,
                })),
                kind,
            )
        }
        Message::Pbft(PbftMessage::FetchOrderCheckpoint { seqno: s, digest }) => {
            if pick % 2 == 0 {
                (
                    pbft(PbftMessage::FetchOrderCheckpoint {
                        seqno: seqno(s, rng),
                        digest,
                    }),
                    "mutate_seqno",
                )
            } else {
                let digest = flip_digest(&digest);
                (
                    pbft(PbftMessage::FetchOrderCheckpoint { seqno: s, digest }),
                    "mutate_digest",
                )
            }
        }
        Message::Pbft(PbftMessage::OrderCheckpointState(mut stable)) => {
            let (votes, kind) = reshape(&stable.votes, rng)?;
            stable.votes = votes;
            (pbft(PbftMessage::OrderCheckpointState(stable)), kind)
        }
        Message::NextBatch {
            view: v,
            seqno: s,
            history,
            time_us,
            entries,
        } => {
            let (mut v, mut s, mut history, mut time_us, mut entries) = (v, s, history, time_us, entries);
            let kind = match pick {
                0 => {
                    s = seqno(s, rng);
                    "mutate_seqno"
                }
                1 => {
                    history = flip_digest(&history);
                    "mutate_digest"
                }
                2 => {
                    time_us = nudge(time_us, rng);
                    v = view(v, rng);
                    "mutate_time"
                }
                _ => {
                    let (e, kind) = reshape(&entries, rng)?;
                    entries = e;
                    kind
                }
            };
            let m = Message::NextBatch {
                view: v,
                seqno: s,
                history,
                time_us,
                entries,
            };
            (m, kind)
        }
        Message::CheckpointToken { seqno: s, exec_state } => {
            if pick % 2 == 0 {
                (
                    Message::CheckpointToken {
                        seqno: seqno(s, rng),
                        exec_state,
                    },
                    "mutate_seqno",
                )
            } else {
                let exec_state = flip_digest(&exec_state);
                (Message::CheckpointToken { seqno: s, exec_state }, "mutate_digest")
            }
        }
        Message::LastExecuted { seqno: s } => (Message::LastExecuted { seqno: seqno(s, rng) }, "mutate_seqno"),
        Message::BatchComplete { seqno: s, requests } => {
            if pick % 2 == 0 {
                (
                    Message::BatchComplete {
                        seqno: seqno(s, rng),
                        requests,
                    },
                    "mutate_seqno",
                )
            } else {
                let (requests, kind) = reshape(&requests, rng)?;
                (Message::BatchComplete { seqno: s, requests }, kind)
            }
        }
        Message::Reply {
            request_id,
            result,
            read_only,
            pushes_sent,
        } => {
            let (mut request_id, mut result, mut pushes_sent) = (request_id, result, pushes_sent);
            let kind = match pick {
                0 => {
                    request_id = RequestId(nudge(request_id.0, rng));
                    "mutate_request_id"
                }
                1 => {
                    pushes_sent = pushes_sent.wrapping_add(rng.random_range(1..100));
                    "mutate_count"
                }
                _ => {
                    result = match result {
                        ReplyBody::Full(bytes) => ReplyBody::Full(flip_bytes(&bytes, rng)),
                        ReplyBody::Digest(d) => ReplyBody::Digest(flip_digest(&d)),
                    };
                    "mutate_payload"
                }
            };
            let m = Message::Reply {
                request_id,
                result,
                read_only,
                pushes_sent,
            };
            (m, kind)
        }
        Message::TentativeReply {
            request_id,
            result,
            view,
            history,
            pushes_sent,
        } => {
            let (mut request_id, mut result, mut view, mut history) = (request_id, result, view, history);
            let kind = match pick {
                0 => {
                    request_id = RequestId(nudge(request_id.0, rng));
                    "mutate_request_id"
                }
                1 => {
                    view = upright_core::ids::View(nudge(view.0, rng));
                    "mutate_view"
                }
                2 => {
                    history = flip_digest(&history);
                    "mutate_digest"
                }
                _ => {
                    result = match result {
                        ReplyBody::Full(bytes) => ReplyBody::Full(flip_bytes(&bytes, rng)),
                        ReplyBody::Digest(d) => ReplyBody::Digest(flip_digest(&d)),
                    };
                    "mutate_payload"
                }
            };
            let m = Message::TentativeReply {
                request_id,
                result,
                view,
                history,
                pushes_sent,
            };
            (m, kind)
        }
        Message::StateManifest {
            seqno: s,
            total_bytes,
            chunk_digests,
        } => {
            if pick % 2 == 0 {
                let total_bytes = nudge(total_bytes, rng);
                (
                    Message::StateManifest {
                        seqno: s,
                        total_bytes,
                        chunk_digests,
                    },
                    "mutate_length",
                )
            } else {
                let (chunk_digests, kind) = reshape(&chunk_digests, rng)?;
                (
                    Message::StateManifest {
                        seqno: s,
                        total_bytes,
                        chunk_digests,
                    },
                    kind,
                )
            }
        }
        Message::StateChunk {
            seqno: s,
            state_digest,
            index,
            data,
        } => {
            if pick % 2 == 0 {
                let index = index.wrapping_add(1);
                (
                    Message::StateChunk {
                        seqno: s,
                        state_digest,
                        index,
                        data,
                    },
                    "mutate_index",
                )
            } else {
                let data = flip_bytes(&data, rng);
                (
                    Message::StateChunk {
                        seqno: s,
                        state_digest,
                        index,
                        data,
                    },
                    "mutate_payload",
                )
            }
        }
        Message::PageAnswer {
            seqno: s,
            state_digest,
            nodes,
            pages,
        } => {
            let mut pages = pages;
            let kind = if pick % 2 == 0 {
                let (p, kind) = reshape(&pages, rng)?;
                pages = p;
                kind
            } else {
                let i = rng.random_range(0..pages.len().max(1));
                let page = pages.get_mut(i)?;
                page.1 = flip_bytes(&page.1, rng);
                "mutate_payload"
            };
            (
                Message::PageAnswer {
                    seqno: s,
                    state_digest,
                    nodes,
                    pages,
                },
                kind,
            )
        }
        Message::Push { stream, seq, payload } => {
            if pick % 2 == 0 {
                (
                    Message::Push {
                        stream,
                        seq: nudge(seq, rng),
                        payload,
                    },
                    "mutate_seqno",
                )
            } else {
                let payload = flip_bytes(&payload, rng);
                (Message::Push { stream, seq, payload }, "mutate_payload")
            }
        }
        Message::PushGap {
            stream,
            next,
            resume_at,
        } => {
            let resume_at = nudge(resume_at, rng);
            (
                Message::PushGap {
                    stream,
                    next,
                    resume_at,
                },
                "mutate_seqno",
            )
        }
        Message::WakeAt { seqno: s, at_us } => {
            let at_us = match at_us {
                Some(at) if pick % 2 == 0 => Some(at.saturating_sub(rng.random_range(1..1_000_000))),
                Some(_) => None,
                None => Some(0),
            };
            (Message::WakeAt { seqno: s, at_us }, "mutate_time")
        }
        Message::ObjectCheckpoint {
            seqno: s,
            mut objects,
            mut replies,
            mut streams,
            ask,
        } => {
            let kind = match pick % 4 {
                3 if !streams.is_empty() => {
                    // A kept push of one of the object streams.
                    let i = rng.random_range(0..streams.len());
                    let per_client = &mut streams[i].1;
                    let j = rng.random_range(0..per_client.len().max(1));
                    let stream = &mut per_client.get_mut(j)?.1;
                    let kept = stream.kept.back_mut()?;
                    kept.1 = flip_bytes(&kept.1, rng);
                    "mutate_payload"
                }
                0 => {
                    let (reshaped, kind) = reshape(&objects, rng)?;
                    objects = reshaped;
                    kind
                }
                1 => {
                    let i = rng.random_range(0..objects.len().max(1));
                    let state = &mut objects.get_mut(i)?.1;
                    *state = Some(flip_bytes(&state.clone().unwrap_or_default(), rng));
                    "mutate_payload"
                }
                _ => {
                    let i = rng.random_range(0..replies.len().max(1));
                    let reply = &mut replies.get_mut(i)?.2;
                    *reply = flip_bytes(reply, rng);
                    "mutate_payload"
                }
            };
            let message = Message::ObjectCheckpoint {
                seqno: s,
                objects,
                replies,
                streams,
                ask,
            };
            (message, kind)
        }
        _ => return None,
    };
    Some(out)
}

fn pbft(m: PbftMessage) -> Message {
    Message::Pbft(m)
}

/// A PREPARE's or COMMIT's view, sequence number or digest changed.
fn vote(rng: &mut ChaCha8Rng, pick: u32, v: View, s: SeqNo, digest: Digest) -> (View, SeqNo, Digest, Kind) {
    match pick % 3 {
        0 => (view(v, rng), s, digest, "mutate_view"),
        1 => (v, seqno(s, rng), digest, "mutate_seqno"),
        _ => (v, s, flip_digest(&digest), "mutate_digest"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn votes_and_replies_change_one_field_and_foreign_signatures_are_left_alone() {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let (_, rings, _) = crate::byzantine::tests::setup();
        let keys = &rings[0];
        let prepare = Message::Pbft(PbftMessage::Prepare {
            view: View(3),
            seqno: SeqNo(10),
            digest: Digest([7; 32]),
        });
        for _ in 0..20 {
            let (m, kind) = mutate(&mut rng, keys, ReplicaId(0), &prepare).expect("a PREPARE mutates");
            assert_ne!(m, prepare, "{kind}");
        }
        let vote = upright_core::message::CheckpointVote {
            seqno: SeqNo(64),
            digest: Digest([1; 32]),
        };
        let theirs = Message::Pbft(PbftMessage::Checkpoint(Signed::sign(
            &rings[1],
            ReplicaId(1),
            vote.clone(),
        )));
        assert!(
            mutate(&mut rng, keys, ReplicaId(0), &theirs).is_none(),
            "cannot sign as replica 1"
        );
        let mine = Message::Pbft(PbftMessage::Checkpoint(Signed::sign(keys, ReplicaId(0), vote)));
        let (m, _) = mutate(&mut rng, keys, ReplicaId(0), &mine).unwrap();
        let Message::Pbft(PbftMessage::Checkpoint(signed)) = m else {
            panic!("still a checkpoint vote")
        };
        assert_eq!(
            signed,
            Signed::sign(keys, ReplicaId(0), signed.value.clone()),
            "re-signed"
        );
        assert!(mutate(
            &mut rng,
            keys,
            ReplicaId(0),
            &Message::PushResume {
                client: upright_core::ids::ClientId(0),
                next: 1,
                streams: Vec::new(),
            }
        )
        .is_none());
    }
}

//! The wire format: a version byte followed by the postcard encoding of an [`Envelope`].
//!
//! Decoding is bounded: frames longer than [`MESSAGE_BYTES_MAX`] are refused before any work,
//! postcard never pre-allocates more than the input can fill, and [`validate`] checks every list
//! and byte string against its named limit ([`crate::limits`]) before a stage sees the message.
//! Decoding arbitrary bytes never panics (the `decode_never_panics` property test).

use bytes::Bytes;

use crate::codec::{from_bytes, DecodeError};
use crate::limits::*;
use crate::message::PbftMessage;
use crate::message::*;

/// Version of the wire format; the first byte of every frame.
/// Version 2: AUTH-REQ carries a list of items.
/// Version 3: [`crate::crypto::Digest`], [`crate::crypto::Mac`] (and, as before,
/// [`crate::crypto::Signature`]) are byte strings: a length varint (32, 16, 64) then the bytes,
/// instead of 32 / 16 raw bytes (a fixed-size tuple). Storage records that contain them changed
/// the same way.
/// Version 4: the order stage's own messages nest in `Message::Pbft` (a second ordering protocol
/// adds a variant), which renumbers the message variants.
pub const WIRE_VERSION: u8 = 4;

/// Encodes an envelope as a frame body (version byte + postcard). An envelope sealed with a MAC or
/// an authenticator by [`Envelope::seal`] reuses the encoding of its sender and message that the
/// seal hashed: only the seal is serialized here.
pub fn encode(envelope: &Envelope) -> Vec<u8> {
    match envelope.encoded_prefix() {
        Some(prefix) => {
            let mut out = Vec::with_capacity(1 + prefix.len() + seal_size_hint(&envelope.seal));
            out.push(WIRE_VERSION);
            out.extend_from_slice(prefix);
            postcard::to_extend(&envelope.seal, out).expect("encoding to a Vec cannot fail")
        }
        None => {
            let mut out = Vec::with_capacity(128);
            out.push(WIRE_VERSION);
            postcard::to_extend(envelope, out).expect("encoding to a Vec cannot fail")
        }
    }
}

/// Bytes the encoding of `seal` takes (at most; enough to avoid a reallocation).
fn seal_size_hint(seal: &Seal) -> usize {
    match seal {
        Seal::None => 1,
        Seal::Mac(_) => 2 + 16,
        Seal::Authenticator(a) => 2 + 2 + a.macs.len() * 17,
    }
}

/// Decodes and validates a frame body. The envelope remembers the digest its seal covers, computed
/// from the received bytes of its sender and message (postcard writes the fields of an envelope in
/// order), so that [`Envelope::open`] does not encode them again.
pub fn decode(frame: &[u8]) -> Result<Envelope, DecodeError> {
    let (&version, body) = frame.split_first().ok_or(DecodeError::Empty)?;
    if frame.len() > MESSAGE_BYTES_MAX {
        return Err(DecodeError::TooLong(frame.len()));
    }
    if version != WIRE_VERSION {
        return Err(DecodeError::Version(version));
    }
    let ((from, message), rest): ((crate::ids::Principal, Message), &[u8]) =
        postcard::take_from_bytes(body).map_err(|_| DecodeError::Malformed)?;
    let prefix = &body[..body.len() - rest.len()];
    let seal: Seal = from_bytes(rest)?;
    validate_parts(&message, &seal)?;
    Ok(Envelope::received(from, message, seal, prefix))
}

fn limit(ok: bool, what: &'static str) -> Result<(), DecodeError> {
    if ok {
        Ok(())
    } else {
        Err(DecodeError::Limit(what))
    }
}

fn validate_matrix(matrix: &crate::crypto::MatrixSignature) -> Result<(), DecodeError> {
    limit(matrix.rows.len() <= MAX_FAULTS * 3 + 1, "matrix rows")?;
    for row in &matrix.rows {
        limit(row.authenticator.macs.len() <= MAX_FAULTS * 3 + 1, "authenticator")?;
    }
    Ok(())
}

fn validate_entry(entry: &RequestEntry) -> Result<(), DecodeError> {
    if let RequestBody::Inline(op) = &entry.body {
        limit(op.len() <= OPERATION_BYTES_MAX, "inline operation")?;
    }
    Ok(())
}

fn validate_batch(batch: &Batch) -> Result<(), DecodeError> {
    limit(batch.entries.len() <= BATCH_REQUESTS_MAX, "batch entries")?;
    for signed in &batch.entries {
        validate_entry(&signed.entry)?;
        validate_matrix(&signed.matrix)?;
    }
    Ok(())
}

fn validate_stable(stable: &StableCheckpoint) -> Result<(), DecodeError> {
    limit(stable.votes.len() <= MAX_FAULTS * 3 + 1, "checkpoint votes")?;
    limit(stable.checkpoint.last_ordered.len() <= LIST_ENTRIES_MAX, "client table")?;
    if let Some(p) = &stable.checkpoint.reconfiguration {
        let change = &p.change.change;
        limit(
            change.replicas.len() <= LIST_ENTRIES_MAX && change.endpoints.len() <= LIST_ENTRIES_MAX,
            "reconfiguration",
        )?;
    }
    Ok(())
}

fn validate_view_change(vc: &ViewChange) -> Result<(), DecodeError> {
    if let Some(stable) = &vc.stable {
        validate_stable(stable)?;
    }
    limit(vc.prepared.len() <= LIST_ENTRIES_MAX, "prepared set")?;
    limit(vc.pre_prepared.len() <= LIST_ENTRIES_MAX, "pre-prepared set")?;
    limit(vc.speculative.len() <= LIST_ENTRIES_MAX, "speculative set")?;
    for claim in &vc.prepared {
        validate_batch(&claim.batch)?;
    }
    for claim in &vc.speculative {
        validate_batch(&claim.batch)?;
    }
    Ok(())
}

/// Checks every bounded field of a decoded envelope.
pub fn validate(envelope: &Envelope) -> Result<(), DecodeError> {
    validate_parts(&envelope.message, &envelope.seal)
}

fn validate_parts(message: &Message, seal: &Seal) -> Result<(), DecodeError> {
    if let Seal::Authenticator(a) = seal {
        limit(a.macs.len() <= MAX_FAULTS * 3 + 1, "authenticator")?;
    }
    match message {
        Message::ClientRequest { operation, .. }
        | Message::Command { operation, .. }
        | Message::ReadOnlyRequest { operation, .. } => limit(operation.len() <= OPERATION_BYTES_MAX, "operation"),
        Message::AuthRequest { items } => {
            limit(items.len() <= AUTH_ITEMS_MAX, "auth items")?;
            for item in items {
                validate_entry(&item.entry)?;
                limit(item.row.authenticator.macs.len() <= MAX_FAULTS * 3 + 1, "authenticator")?;
            }
            Ok(())
        }
        Message::Pbft(PbftMessage::PrePrepare { batch, .. }) | Message::Pbft(PbftMessage::Chain { batch, .. }) => {
            validate_batch(batch)
        }
        Message::Pbft(PbftMessage::ViewChange(vc)) => validate_view_change(&vc.value),
        Message::Pbft(PbftMessage::NewView(msg)) => {
            let nv = &msg.new_view;
            limit(nv.value.view_changes.len() <= MAX_FAULTS * 3 + 1, "view changes")?;
            limit(msg.view_changes.len() <= MAX_FAULTS * 3 + 1, "attached view changes")?;
            for vc in &msg.view_changes {
                validate_view_change(&vc.value)?;
            }
            if let Some(stable) = &nv.value.stable {
                validate_stable(stable)?;
            }
            limit(nv.value.batches.len() <= LIST_ENTRIES_MAX, "new-view batches")?;
            for (_, batch) in &nv.value.batches {
                validate_batch(batch)?;
            }
            Ok(())
        }
        Message::Pbft(PbftMessage::OrderCheckpointState(stable)) => validate_stable(stable),
        Message::Pbft(PbftMessage::ReplyStable { stable, .. }) => stable.as_ref().map_or(Ok(()), validate_stable),
        Message::NextBatch { entries, .. } | Message::TentativeBatch { entries, .. } => {
            limit(entries.len() <= BATCH_REQUESTS_MAX, "batch entries")?;
            entries.iter().try_for_each(validate_entry)
        }
        Message::BatchComplete { requests, .. } => limit(requests.len() <= BATCH_REQUESTS_MAX, "batch entries"),
        Message::Reply { result, .. } | Message::TentativeReply { result, .. } => match result {
            ReplyBody::Full(bytes) => limit(bytes.len() <= OPERATION_BYTES_MAX, "reply"),
            ReplyBody::Digest(_) => Ok(()),
        },
        Message::Configuration { change } => {
            let change = &change.change;
            limit(
                change.replicas.len() <= LIST_ENTRIES_MAX
                    && change.endpoints.len() <= LIST_ENTRIES_MAX
                    && change
                        .endpoints
                        .iter()
                        .all(|e| e.len() <= crate::reconfig::ENDPOINT_BYTES_MAX),
                "reconfiguration",
            )
        }
        Message::StateManifest { chunk_digests, .. } => limit(chunk_digests.len() <= STATE_CHUNKS_MAX, "manifest"),
        Message::StateChunk { data, .. } => limit(data.len() <= STATE_CHUNK_BYTES_MAX, "state chunk"),
        Message::Push { payload, stream, .. } => {
            limit(payload.len() <= crate::limits::PUSH_BYTES_MAX, "push")?;
            limit(stream_name_ok(stream.as_ref()), "push stream")
        }
        Message::PushGap { stream, .. } => limit(stream_name_ok(stream.as_ref()), "push stream"),
        Message::PushResume { streams, .. } => {
            limit(streams.len() <= crate::limits::PUSH_STREAMS_MAX, "push streams")?;
            limit(streams.iter().all(|(s, _)| stream_name_ok(Some(s))), "push stream")
        }
        Message::FetchPages { nodes, pages, .. } => {
            limit(nodes.len() <= PAGE_ITEMS_PER_FETCH, "fetched nodes")?;
            limit(pages.len() <= PAGE_ITEMS_PER_FETCH, "fetched pages")
        }
        Message::PageAnswer { nodes, pages, .. } => {
            limit(nodes.len() <= PAGE_ITEMS_PER_FETCH, "answered nodes")?;
            limit(
                nodes
                    .iter()
                    .all(|(_, children)| children.len() <= crate::page_tree::FANOUT),
                "node children",
            )?;
            limit(pages.len() <= PAGE_ITEMS_PER_FETCH, "answered pages")?;
            limit(pages.iter().all(|(_, page)| page.len() <= PAGE_BYTES_MAX), "page")
        }
        Message::ObjectCheckpoint {
            objects,
            replies,
            streams,
            ..
        } => {
            limit(objects.len() <= LIST_ENTRIES_MAX, "checkpointed objects")?;
            limit(replies.len() <= LIST_ENTRIES_MAX, "checkpointed replies")?;
            limit(streams.len() <= LIST_ENTRIES_MAX, "checkpointed streams")?;
            limit(
                streams.iter().all(|(_, per_client)| {
                    per_client.len() <= LIST_ENTRIES_MAX
                        && per_client
                            .iter()
                            .all(|(_, s)| s.kept.len() <= crate::limits::PUSHES_KEPT_PER_STREAM)
                }),
                "checkpointed stream",
            )?;
            let stream_bytes = (streams.iter())
                .map(|(name, per_client)| name.len() + per_client.iter().map(|(_, s)| s.bytes()).sum::<usize>());
            let bytes: usize = objects
                .iter()
                .map(|(name, state)| name.len() + state.as_ref().map_or(0, |s| s.len()))
                .chain(replies.iter().map(|(_, _, reply)| reply.len()))
                .chain(stream_bytes)
                .sum();
            limit(bytes <= crate::limits::OBJECT_CP_BYTES_MAX, "object checkpoint")
        }
        Message::Lcr(lcr) => validate_lcr(lcr),
        Message::Pbft(PbftMessage::Prepare { .. })
        | Message::Pbft(PbftMessage::Commit { .. })
        | Message::Pbft(PbftMessage::Checkpoint(_))
        | Message::Pbft(PbftMessage::FetchOrderCheckpoint { .. })
        | Message::Pbft(PbftMessage::Suspect { .. })
        | Message::Pbft(PbftMessage::QueryStable { .. })
        | Message::LoadCheckpoint { .. }
        | Message::Retransmit { .. }
        | Message::CheckpointToken { .. }
        | Message::LastExecuted { .. }
        | Message::WakeAt { .. }
        | Message::Fetch { .. }
        | Message::FetchState { .. }
        | Message::PrimaryHint { .. }
        | Message::NewKey { .. } => Ok(()),
    }
}

/// Whether a push stream's name is within [`crate::limits::PUSH_STREAM_NAME_MAX`].
fn stream_name_ok(stream: Option<&Bytes>) -> bool {
    stream.is_none_or(|s| s.len() <= crate::limits::PUSH_STREAM_NAME_MAX)
}

fn validate_broadcast(b: &crate::message::lcr::Broadcast) -> Result<(), DecodeError> {
    limit(b.clock.len() <= MAX_FAULTS * 3 + 1, "vector clock")?;
    limit(b.entries.len() <= BATCH_REQUESTS_MAX, "broadcast entries")?;
    b.entries.iter().try_for_each(validate_entry)
}

fn validate_decided(
    log: &[crate::message::lcr::Decided],
    low: &crate::message::lcr::Snapshot,
) -> Result<(), DecodeError> {
    limit(log.len() <= LIST_ENTRIES_MAX, "decided batches")?;
    limit(low.last_ordered.len() <= LIST_ENTRIES_MAX, "snapshot clients")?;
    for d in log {
        limit(d.entries.len() <= BATCH_REQUESTS_MAX, "decided entries")?;
        d.entries.iter().try_for_each(validate_entry)?;
    }
    Ok(())
}

fn validate_lcr(message: &crate::message::lcr::LcrMessage) -> Result<(), DecodeError> {
    use crate::message::lcr::{LcrMessage, RingRecord};
    match message {
        LcrMessage::Ring { records, .. } => {
            limit(records.len() <= LIST_ENTRIES_MAX, "ring records")?;
            records.iter().try_for_each(|r| match r {
                RingRecord::Data(b) => validate_broadcast(b),
                RingRecord::Ack(_) => Ok(()),
            })
        }
        LcrMessage::Recover(r) => {
            validate_decided(&r.log, &r.low)?;
            limit(r.pending.len() <= LIST_ENTRIES_MAX, "pending broadcasts")?;
            r.pending.iter().try_for_each(validate_broadcast)
        }
        LcrMessage::NewView(nv) => {
            limit(nv.ring.len() <= MAX_FAULTS * 3 + 1, "ring")?;
            validate_decided(&nv.entries, &nv.low)
        }
        LcrMessage::LinkAck { .. }
        | LcrMessage::Change { .. }
        | LcrMessage::Accepted { .. }
        | LcrMessage::End { .. } => Ok(()),
    }
}

//! The encoding an envelope remembers: reused on the wire, trusted only where it was computed, and
//! never a way around the seal.

use super::*;
use crate::codec::to_bytes;
use crate::config::Knobs;
use crate::ids::ClientId;
use crate::message::PbftMessage;
use crate::testing::{fixture, Fixture};
use crate::wire::{decode, encode};

fn prepare() -> Message {
    Message::Pbft(PbftMessage::Prepare {
        view: View(3),
        seqno: SeqNo(41),
        digest: Digest::of(b"batch"),
    })
}

fn reply() -> Message {
    Message::Reply {
        request_id: RequestId(9),
        result: ReplyBody::Full(Bytes::from_static(b"a result of some length")),
        read_only: false,
        pushes_sent: 0,
    }
}

/// PREPARE from order member 0 with an authenticator for the order stage.
fn sealed_prepare(f: &Fixture) -> Envelope {
    Envelope::seal(
        &f.replicas[0],
        &f.quorums,
        Principal::Order(ReplicaId(0)),
        prepare(),
        SealFor::Stage(StageKind::Order),
    )
}

/// REPLY from execution member 1 with a MAC for client 0.
fn sealed_reply(f: &Fixture) -> Envelope {
    Envelope::seal(
        &f.replicas[1],
        &f.quorums,
        Principal::Exec(ReplicaId(1)),
        reply(),
        SealFor::One(Principal::Client(ClientId(0))),
    )
}

/// Bytes of a frame before its seal: the version byte and the encoded `(from, message)`.
fn prefix_len(envelope: &Envelope) -> usize {
    1 + to_bytes(&(envelope.from, &envelope.message)).len()
}

#[test]
fn the_wire_encoding_of_a_sealed_envelope_is_the_encoding_of_its_fields() {
    let f = fixture(1, 1, 1, Knobs::default());
    for sealed in [sealed_prepare(&f), sealed_reply(&f)] {
        assert!(sealed.encoded_prefix().is_some(), "seal keeps the bytes it hashed");
        let fresh = sealed.clone();
        assert!(fresh.encoded_prefix().is_none(), "a clone forgets them");
        assert_eq!(encode(&sealed), encode(&fresh));
        assert_eq!(encode(&sealed), postcard_frame(&sealed));
        assert_eq!(decode(&encode(&sealed)).unwrap(), sealed);
    }
    let nothing = Envelope::seal(
        &f.replicas[0],
        &f.quorums,
        Principal::Order(ReplicaId(0)),
        prepare(),
        SealFor::Nothing,
    );
    assert!(nothing.encoded_prefix().is_none());
    assert_eq!(decode(&encode(&nothing)).unwrap(), nothing);
}

/// The frame as version 2 built it: the version byte, then postcard of the whole envelope.
fn postcard_frame(envelope: &Envelope) -> Vec<u8> {
    let mut out = vec![crate::wire::WIRE_VERSION];
    out.extend(to_bytes(envelope));
    out
}

#[test]
fn a_decoded_envelope_remembers_the_digest_of_the_bytes_it_came_from() {
    let f = fixture(1, 1, 1, Knobs::default());
    let sealed = sealed_prepare(&f);
    let received = decode(&encode(&sealed)).unwrap();
    let expected = Envelope::auth_digest(sealed.from, &sealed.message);
    assert_eq!(received.encoding.digest, Some((Trust::Received, expected)));
    assert!(received.encoding.prefix.is_none());
    for i in 0..f.quorums.n_order as u32 {
        assert_eq!(
            received.open(&f.replicas[i as usize], Principal::Order(ReplicaId(i)), None),
            Ok(())
        );
    }
    // Self-authenticating messages need no digest.
    let unsealed = decode(&encode(&Envelope::new(sealed.from, prepare(), Seal::None))).unwrap();
    assert_eq!(unsealed.encoding.digest, None);
}

/// Every frame with one byte flipped at a position in `positions`: it must not decode, or must not
/// open at `me` (no flip that still decodes may pass the seal).
fn assert_flips_rejected(frame: &[u8], positions: std::ops::Range<usize>, keys: &KeyRing, me: Principal) {
    for i in positions {
        for bit in [0x01u8, 0x80] {
            let mut bad = frame.to_vec();
            bad[i] ^= bit;
            if let Ok(envelope) = decode(&bad) {
                assert!(
                    envelope.open(keys, me, None).is_err(),
                    "flip of bit {bit:#x} at byte {i} of {} opened: {envelope:?}",
                    frame.len()
                );
            }
        }
    }
}

#[test]
fn a_frame_with_a_byte_flipped_in_from_message_or_mac_is_rejected() {
    let f = fixture(1, 1, 1, Knobs::default());
    // MAC seal: every byte of the frame matters (from, message, seal tag, MAC length, MAC).
    let frame = encode(&sealed_reply(&f));
    let client = Principal::Client(ClientId(0));
    assert_eq!(decode(&frame).unwrap().open(&f.clients[0], client, None), Ok(()));
    assert_flips_rejected(&frame, 1..frame.len(), &f.clients[0], client);
    // `from` alone: the first bytes after the version (principal tag and replica id).
    let sealed = sealed_prepare(&f);
    let frame = encode(&sealed);
    let member = Principal::Order(ReplicaId(2));
    assert_eq!(decode(&frame).unwrap().open(&f.replicas[2], member, None), Ok(()));
    assert_flips_rejected(&frame, 1..3, &f.replicas[2], member);
    // Authenticator seal: every byte of from and message, and the receiver's own MAC.
    assert_flips_rejected(&frame, 1..prefix_len(&sealed), &f.replicas[2], member);
    let Seal::Authenticator(authenticator) = &sealed.seal else {
        panic!("sealed for a stage")
    };
    let macs_start = frame.len() - authenticator.macs.len() * 17;
    let own_mac = macs_start + 2 * 17 + 1; // entry 2: a length byte, then 16 bytes
    assert_eq!(&frame[own_mac..own_mac + 16], &authenticator.macs[2].0[..]);
    assert_flips_rejected(&frame, own_mac..own_mac + 16, &f.replicas[2], member);
}

#[test]
fn a_local_delivery_verifies_with_the_digest_seal_computed() {
    let f = fixture(1, 1, 1, Knobs::default());
    let sealed = sealed_prepare(&f);
    // Co-located: order member 0 receives its own PREPARE (same process as the sealer).
    assert!(matches!(sealed.encoding.digest, Some((Trust::SealedBy(p), _)) if p == f.replicas[0].me()));
    assert_eq!(
        sealed.open(&f.replicas[0], Principal::Order(ReplicaId(0)), None),
        Ok(())
    );
    // Another process that got the value (the simulator) verifies by encoding it again.
    assert_eq!(
        sealed.open(&f.replicas[1], Principal::Order(ReplicaId(1)), None),
        Ok(())
    );
    // A changed copy is checked against its own content.
    let mut changed = sealed.clone();
    changed.message = Message::Pbft(PbftMessage::Prepare {
        view: View(3),
        seqno: SeqNo(42),
        digest: Digest::of(b"batch"),
    });
    assert!(changed
        .open(&f.replicas[0], Principal::Order(ReplicaId(0)), None)
        .is_err());
    assert_eq!(
        encode(&changed),
        postcard_frame(&changed),
        "the wire carries the change"
    );
    let mut impostor = sealed.clone();
    impostor.from = Principal::Order(ReplicaId(1));
    assert!(impostor
        .open(&f.replicas[0], Principal::Order(ReplicaId(0)), None)
        .is_err());
}

#[test]
fn a_remembered_digest_is_trusted_only_by_the_process_that_computed_it() {
    let f = fixture(1, 1, 1, Knobs::default());
    let mut sealed = sealed_prepare(&f);
    // A wrong digest claimed as sealed by replica 0 is ignored at replica 1, which encodes again.
    sealed.encoding.digest = Some((Trust::SealedBy(f.replicas[0].me()), Digest::of(b"wrong")));
    assert_eq!(
        sealed.open(&f.replicas[1], Principal::Order(ReplicaId(1)), None),
        Ok(())
    );
    let mut reply = sealed_reply(&f);
    reply.encoding.digest = Some((Trust::SealedBy(f.replicas[1].me()), Digest::of(b"wrong")));
    assert_eq!(reply.open(&f.clients[0], Principal::Client(ClientId(0)), None), Ok(()));
}

#[test]
fn digests_and_macs_encode_as_byte_strings() {
    let digest = Digest::of(b"x");
    let bytes = to_bytes(&digest);
    assert_eq!(bytes.len(), 33);
    assert_eq!(bytes[0], 32);
    assert_eq!(&bytes[1..], &digest.0[..]);
    assert_eq!(crate::codec::from_bytes::<Digest>(&bytes), Ok(digest));
    let mac = Mac([7; 16]);
    let bytes = to_bytes(&mac);
    assert_eq!((bytes.len(), bytes[0]), (17, 16));
    assert_eq!(crate::codec::from_bytes::<Mac>(&bytes), Ok(mac));
    // A byte string of another length is refused.
    let short = [15u8; 16]; // length 15, then 15 bytes
    assert!(crate::codec::from_bytes::<Mac>(&short).is_err());
    let mut long = to_bytes(&digest);
    long[0] = 33;
    long.push(0);
    assert!(crate::codec::from_bytes::<Digest>(&long).is_err());
}

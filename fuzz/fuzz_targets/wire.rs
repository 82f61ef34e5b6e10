//! The wire codec: every message kind a peer or a client can send, decoded from any bytes. A
//! frame that decodes must encode to bytes that decode to the same envelope.
#![no_main]

use libfuzzer_sys::fuzz_target;
use upright_core::wire;

fuzz_target!(|data: &[u8]| {
    let Ok(envelope) = wire::decode(data) else { return };
    let again = wire::decode(&wire::encode(&envelope)).expect("a re-encoded envelope decodes");
    assert_eq!(
        format!("{envelope:?}"),
        format!("{again:?}"),
        "re-encoding changed the envelope"
    );
});

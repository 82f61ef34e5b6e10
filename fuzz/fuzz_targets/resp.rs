//! The Redis gateway's RESP parser over a client's byte stream, fed in two pieces (a command split
//! across reads): every command it returns consumed bytes, and the stream ends in a need for more
//! bytes or a protocol error.
#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use upright_kv::resp;

fuzz_target!(|data: &[u8]| {
    let split = data.first().map_or(0, |&b| b as usize).min(data.len());
    let mut buf = BytesMut::new();
    for piece in [&data[..split], &data[split..]] {
        buf.extend_from_slice(piece);
        loop {
            let before = buf.len();
            match resp::parse(&mut buf) {
                Ok(Some(command)) => {
                    assert!(!command.is_empty(), "empty commands are skipped");
                    assert!(buf.len() < before, "a command consumes bytes");
                }
                Ok(None) => break,
                Err(_) => return,
            }
        }
    }
});

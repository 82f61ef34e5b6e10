//! The transport's first bytes from a stranger: a hello (peer) or a hello list (a gateway's
//! multiplexed connection), and the length-prefixed frames that follow, read through the
//! buffered frame reader with a small bound.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use upright_node::transport::{FrameReader, Hello, HelloList};

/// The bound the reader is given: small, so that the fuzzer reaches it.
const FRAME_MAX: usize = 512;

fuzz_target!(|data: &[u8]| {
    let _ = upright_core::codec::from_bytes::<Hello>(data);
    let _ = upright_core::codec::from_bytes::<HelloList>(data);
    // One runtime for every input (building one is most of a small input's time).
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    let runtime = RUNTIME.get_or_init(|| tokio::runtime::Builder::new_current_thread().build().expect("runtime"));
    runtime.block_on(async {
        let mut reader = FrameReader::new(data, FRAME_MAX);
        let mut taken = 0usize;
        loop {
            match reader.next_frame() {
                Ok(Some(frame)) => {
                    assert!(!frame.is_empty() && frame.len() <= FRAME_MAX, "frame within its bounds");
                    taken += 4 + frame.len();
                    assert!(taken <= data.len(), "no frame made of bytes that were not read");
                }
                Ok(None) => {
                    if reader.fill().await.is_err() {
                        break;
                    }
                }
                Err(_) => break,
            }
        }
    });
});

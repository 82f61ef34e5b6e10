//! ZooKeeper's jute records as the gateway and the service decode them from a client: the first
//! four bytes pick the operation code, the rest is its record.
#![no_main]

use libfuzzer_sys::fuzz_target;
use upright_zk::jute::Reader;
use upright_zk::proto::{Acl, Op, Stat};

fuzz_target!(|data: &[u8]| {
    let Some((code, body)) = data.split_first_chunk::<4>() else {
        return;
    };
    let code = i32::from_be_bytes(*code) % 128;
    if let Some(Ok(_)) = Op::read(code, &mut Reader::new(body)) {
        // Decoded: a second decode of the same bytes agrees.
        assert!(matches!(Op::read(code, &mut Reader::new(body)), Some(Ok(_))));
    }
    let _ = Stat::read(&mut Reader::new(body));
    let _ = Acl::read_all(&mut Reader::new(body));
    let mut r = Reader::new(body);
    while r.remaining() > 0 {
        if r.ustring().is_err() || r.buffer().is_err() || r.long().is_err() {
            break;
        }
    }
});

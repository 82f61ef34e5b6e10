//! ONC RPC as the NFS gateway reads it from a client: record-marking fragments reassembled
//! within the bound, then each record's call header and credential decoded (or refused with the
//! reply RFC 5531 gives). Nothing may panic, and a decoded call's arguments are the record's tail.
#![no_main]

use libfuzzer_sys::fuzz_target;
use upright_fs::rpc::{decode_call, denied_reply, Records, RECORD_BYTES_MAX};

fuzz_target!(|data: &[u8]| {
    let mut records = Records::default();
    let mut rest = data;
    while rest.len() >= 4 {
        let header = u32::from_be_bytes([rest[0], rest[1], rest[2], rest[3]]);
        rest = &rest[4..];
        let Ok(len) = records.fragment_len(header) else { return };
        let take = len.min(rest.len());
        let (fragment, tail) = rest.split_at(take);
        rest = tail;
        match records.fragment(header, fragment) {
            Ok(Some(record)) => {
                assert!(record.len() <= RECORD_BYTES_MAX);
                match decode_call(&record) {
                    Ok((_, args)) => assert!(record.ends_with(args)),
                    Err(error) => {
                        let _ = denied_reply(error);
                    }
                }
            }
            Ok(None) => {}
            Err(_) => return,
        }
    }
});

//! The on-disk log: a file's bytes as found after a crash (torn, zero-filled or corrupt), and a
//! record payload behind a valid checksum (so that the payload decoder itself is reached). Parsed
//! records must encode back to the bytes they came from.
#![no_main]

use libfuzzer_sys::fuzz_target;
use upright_node::storage::{encode_record, parse_records, Tail};

fuzz_target!(|data: &[u8]| {
    let (records, tail) = parse_records(data);
    let mut encoded = Vec::new();
    for record in &records {
        encode_record(&record.key, record.value.as_ref(), &mut encoded);
    }
    assert!(
        data.starts_with(&encoded),
        "parsed records re-encode to the bytes they came from"
    );
    if let Tail::Clean = tail {
        assert_eq!(encoded.len(), data.len(), "a clean tail leaves no byte unparsed");
    }
    // The same bytes as one record's payload, behind a valid header.
    let mut framed = Vec::with_capacity(data.len() + 8);
    framed.extend_from_slice(&(data.len() as u32).to_be_bytes());
    framed.extend_from_slice(&crc32fast::hash(data).to_be_bytes());
    framed.extend_from_slice(data);
    let (records, _) = parse_records(&framed);
    assert!(records.len() <= 1);
});

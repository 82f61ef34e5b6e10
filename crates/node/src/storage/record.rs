//! The on-disk record format shared by the write-ahead log and the snapshot.
//!
//! A record is `[payload length: u32 BE][CRC32 of payload: u32 BE][payload]`, the payload being the
//! postcard encoding of `(key, Option<value>)`. Parsing stops at the first record that does not
//! check out and says whether that looks like a torn tail (an interrupted last write) or damage in
//! the middle of the file.

use bytes::Bytes;

/// Largest record payload accepted when reading (checked before allocating or trusting a length).
pub const RECORD_BYTES_MAX: usize = 1 << 30;

/// Bytes of a record header.
pub const HEADER_BYTES: usize = 8;

/// One durable write: set `key` to `value`, or delete it (`None`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// Key.
    pub key: String,
    /// Value, `None` = deleted.
    pub value: Option<Bytes>,
}

/// Appends the encoding of one record to `out`.
pub fn encode_record(key: &str, value: Option<&Bytes>, out: &mut Vec<u8>) {
    let payload = upright_core::codec::to_bytes(&(key, value));
    assert!(
        payload.len() <= RECORD_BYTES_MAX,
        "record for {key} is larger than RECORD_BYTES_MAX"
    );
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    out.extend_from_slice(&crc32fast::hash(&payload).to_be_bytes());
    out.extend_from_slice(&payload);
}

/// How a file's record sequence ends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Tail {
    /// Every byte belongs to a valid record.
    Clean,
    /// The last record is incomplete or damaged and nothing valid follows: an interrupted write.
    /// The file should be truncated to `valid_bytes`.
    Torn {
        /// Length of the valid prefix.
        valid_bytes: u64,
    },
    /// A damaged record with more data after it: the file is corrupt from `offset` on.
    Corrupt {
        /// Offset of the first bad record.
        offset: u64,
        /// What was wrong.
        why: &'static str,
    },
}

/// Parses records until the end of `bytes` or the first bad one.
pub fn parse_records(bytes: &[u8]) -> (Vec<Record>, Tail) {
    let mut records = Vec::new();
    let mut offset = 0usize;
    while offset < bytes.len() {
        match parse_one(&bytes[offset..]) {
            Ok((record, used)) => {
                records.push(record);
                offset += used;
            }
            Err(why) => return (records, classify(bytes, offset, why)),
        }
    }
    (records, Tail::Clean)
}

fn parse_one(bytes: &[u8]) -> Result<(Record, usize), &'static str> {
    if bytes.len() < HEADER_BYTES {
        return Err("incomplete header");
    }
    let len = u32::from_be_bytes(bytes[0..4].try_into().expect("4 bytes")) as usize;
    let crc = u32::from_be_bytes(bytes[4..8].try_into().expect("4 bytes"));
    if len > RECORD_BYTES_MAX {
        return Err("length above RECORD_BYTES_MAX");
    }
    if bytes.len() - HEADER_BYTES < len {
        return Err("incomplete payload");
    }
    let payload = &bytes[HEADER_BYTES..HEADER_BYTES + len];
    if crc32fast::hash(payload) != crc {
        return Err("checksum mismatch");
    }
    let (key, value): (String, Option<Bytes>) =
        upright_core::codec::from_bytes(payload).map_err(|_| "undecodable payload")?;
    Ok((Record { key, value }, HEADER_BYTES + len))
}

/// A bad record is a torn tail if nothing after it could be valid data: the header or payload
/// runs past the end of the file, the bad record is exactly the last one, or only zeros follow
/// (space the file system allocated but the interrupted write never filled).
fn classify(bytes: &[u8], offset: usize, why: &'static str) -> Tail {
    let rest = &bytes[offset..];
    let torn = match why {
        "incomplete header" | "incomplete payload" => true,
        _ if rest.iter().all(|&b| b == 0) => true,
        "length above RECORD_BYTES_MAX" => false,
        _ => {
            let len = u32::from_be_bytes(rest[0..4].try_into().expect("4 bytes")) as usize;
            HEADER_BYTES + len == rest.len()
        }
    };
    if torn {
        Tail::Torn {
            valid_bytes: offset as u64,
        }
    } else {
        Tail::Corrupt {
            offset: offset as u64,
            why,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<u8> {
        let mut out = Vec::new();
        encode_record("a", Some(&Bytes::from_static(b"1")), &mut out);
        encode_record("b", None, &mut out);
        encode_record("c", Some(&Bytes::from_static(b"333")), &mut out);
        out
    }

    #[test]
    fn round_trip_and_clean_tail() {
        let (records, tail) = parse_records(&sample());
        assert_eq!(tail, Tail::Clean);
        assert_eq!(records.len(), 3);
        assert_eq!(
            records[1],
            Record {
                key: "b".into(),
                value: None
            }
        );
    }

    #[test]
    fn every_truncation_is_a_torn_tail() {
        let bytes = sample();
        for cut in 1..bytes.len() {
            let (records, tail) = parse_records(&bytes[..cut]);
            match tail {
                Tail::Clean => assert!(records.len() < 3 || cut == bytes.len()),
                Tail::Torn { valid_bytes } => assert!(valid_bytes as usize <= cut),
                Tail::Corrupt { .. } => panic!("truncation at {cut} classified as corruption"),
            }
        }
    }

    #[test]
    fn flipped_byte_in_the_middle_is_corruption_and_at_the_end_is_torn() {
        let bytes = sample();
        let mut middle = bytes.clone();
        middle[HEADER_BYTES + 1] ^= 0x40;
        assert!(matches!(parse_records(&middle).1, Tail::Corrupt { offset: 0, .. }));
        let mut last = bytes.clone();
        let n = last.len();
        last[n - 1] ^= 0x40;
        assert!(matches!(parse_records(&last), (r, Tail::Torn { .. }) if r.len() == 2));
        let mut zeros = bytes.clone();
        zeros.extend_from_slice(&[0u8; 100]);
        assert!(matches!(parse_records(&zeros), (r, Tail::Torn { .. }) if r.len() == 3));
    }
}

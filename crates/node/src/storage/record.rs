//! The on-disk record format shared by the write-ahead log and the snapshot.
//!
//! A record is `[payload length: u32 BE][CRC32 of payload: u32 BE][payload]`, the payload being the
//! postcard encoding of `(key, Option<value>)`. Parsing stops at the first record that does not
//! check out and says whether that is the end of the data in a preallocated file (only zeros
//! follow), a torn tail (an interrupted last write) or damage in the middle of the file.
//!
//! A valid record never starts with eight zero bytes (its payload is never empty, so its length is
//! not zero), so zeros at a record boundary are unambiguously space allocated ahead of the data.

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
    /// Every record is valid and only zeros follow the last one: space allocated ahead of the data
    /// (a preallocated log). Not damage.
    Zeros {
        /// Length of the valid data (where the next record goes).
        valid_bytes: u64,
    },
    /// The last record is incomplete or damaged and nothing but zeros follows it: an interrupted
    /// write. The file should be truncated to `valid_bytes`.
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
            Err(_) if bytes[offset..].iter().all(|&b| b == 0) => {
                let valid_bytes = offset as u64;
                return (records, Tail::Zeros { valid_bytes });
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

/// A bad record (not all zeros) is a torn tail if nothing after it could be valid data: its header
/// or payload runs past the end of the file, or only zeros follow the extent its header claims
/// (space allocated ahead, or by the file system, that the interrupted write never filled). A length
/// above [`RECORD_BYTES_MAX`] is not trusted: then only zeros may follow the header.
fn classify(bytes: &[u8], offset: usize, why: &'static str) -> Tail {
    let rest = &bytes[offset..];
    let torn = match why {
        "incomplete header" | "incomplete payload" => true,
        _ => {
            let len = u32::from_be_bytes(rest[0..4].try_into().expect("4 bytes")) as usize;
            let claimed = if len > RECORD_BYTES_MAX { 0 } else { len };
            let extent = (HEADER_BYTES + claimed).min(rest.len());
            rest[extent..].iter().all(|&b| b == 0)
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
                // A cut inside a header can leave only its zero bytes: indistinguishable from space
                // allocated ahead, and just as harmless (the next record overwrites them).
                Tail::Torn { valid_bytes } | Tail::Zeros { valid_bytes } => assert!(valid_bytes as usize <= cut),
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
    }

    #[test]
    fn zeros_after_the_last_record_are_preallocated_space_not_damage() {
        let bytes = sample();
        let mut zeros = bytes.clone();
        zeros.extend_from_slice(&[0u8; 100]);
        let valid_bytes = bytes.len() as u64;
        assert!(
            matches!(parse_records(&zeros), (r, Tail::Zeros { valid_bytes: v }) if r.len() == 3 && v == valid_bytes)
        );
        // A file that is nothing but allocated space has no records.
        assert_eq!(parse_records(&[0u8; 64]), (vec![], Tail::Zeros { valid_bytes: 0 }));
        // Even a few zeros (shorter than a header) are allocated space.
        assert_eq!(parse_records(&[0u8; 3]).1, Tail::Zeros { valid_bytes: 0 });
    }

    #[test]
    fn a_torn_record_inside_preallocated_space_is_torn_and_data_after_it_is_corruption() {
        let bytes = sample();
        let mut extra = Vec::new();
        encode_record("d", Some(&Bytes::from_static(b"a longer value 4444")), &mut extra);
        let valid = bytes.len() as u64;
        // Header and the start of the payload written, the rest still zeros.
        let mut torn = bytes.clone();
        torn.extend_from_slice(&extra[..extra.len() - 6]);
        torn.extend_from_slice(&[0u8; 200]);
        assert!(
            matches!(parse_records(&torn), (r, Tail::Torn { valid_bytes }) if r.len() == 3 && valid_bytes == valid)
        );
        // Only part of the header written (a length above the bound): still torn.
        let mut header = bytes.clone();
        header.extend_from_slice(&[0xff, 0xff, 0, 0]);
        header.extend_from_slice(&[0u8; 200]);
        assert!(matches!(parse_records(&header).1, Tail::Torn { valid_bytes } if valid_bytes == valid));
        // A damaged record followed by non-zero data after its extent is corruption.
        let mut middle = bytes.clone();
        middle[HEADER_BYTES + 1] ^= 0x40;
        middle.extend_from_slice(&[0u8; 200]);
        assert!(matches!(parse_records(&middle).1, Tail::Corrupt { offset: 0, .. }));
        // Garbage after a run of zeros is not allocated space: corruption.
        let mut late = bytes.clone();
        late.extend_from_slice(&[0u8; 64]);
        late.extend_from_slice(&extra);
        assert!(
            matches!(parse_records(&late).1, Tail::Corrupt { .. }),
            "{:?}",
            parse_records(&late).1
        );
    }
}

//! String commands on bits and subsequences: SETBIT, GETBIT and LCS, with Redis' replies and
//! errors. (SUBSTR is GETRANGE's old name, answered by `keys`.)

use bytes::Bytes;

use super::RedisStore;
use crate::command::{is, parse_i64, syntax_error};
use crate::reply::Reply;

/// Largest bit offset: a string of Redis' proto-max-bulk-len (512 MB).
const BIT_OFFSET_MAX: i64 = (512 << 20) * 8 - 1;
/// Most cells of LCS's table (4 bytes each): beyond, Redis refuses for the memory.
const LCS_CELLS_MAX: u64 = 64 << 20;

fn bit_offset(arg: &[u8]) -> Result<usize, Reply> {
    match parse_i64(arg) {
        Some(n) if (0..=BIT_OFFSET_MAX).contains(&n) => Ok(n as usize),
        _ => Err(Reply::err("ERR bit offset is not an integer or out of range")),
    }
}

/// Runs SETBIT; `None` for any other command.
pub(super) fn dispatch(s: &mut RedisStore, name: &str, a: &[Bytes]) -> Option<Reply> {
    if name != "setbit" {
        return None;
    }
    let offset = match bit_offset(&a[1]) {
        Ok(o) => o,
        Err(e) => return Some(e),
    };
    let on = match &a[2][..] {
        b"0" => false,
        b"1" => true,
        _ => return Some(Reply::err("ERR bit is not an integer or out of range")),
    };
    let current = match s.get_string(&a[0]) {
        Ok(v) => v.cloned().unwrap_or_default(),
        Err(e) => return Some(e),
    };
    let (byte, mask) = (offset / 8, 0x80u8 >> (offset % 8));
    let mut value = current.to_vec();
    if value.len() <= byte {
        value.resize(byte + 1, 0);
    }
    let old = value[byte] & mask != 0;
    if on {
        value[byte] |= mask;
    } else {
        value[byte] &= !mask;
    }
    s.put_keep_ttl(&a[0], Bytes::from(value));
    Some(Reply::Int(i64::from(old)))
}

/// Runs GETBIT or LCS; `None` for any other command.
pub(super) fn dispatch_read(s: &RedisStore, name: &str, a: &[Bytes]) -> Option<Reply> {
    Some(match name {
        "getbit" => {
            let offset = match bit_offset(&a[1]) {
                Ok(o) => o,
                Err(e) => return Some(e),
            };
            match s.get_string(&a[0]) {
                Err(e) => e,
                Ok(v) => {
                    let byte = v.and_then(|v| v.get(offset / 8)).copied().unwrap_or(0);
                    Reply::Int(i64::from(byte & (0x80 >> (offset % 8)) != 0))
                }
            }
        }
        "lcs" => lcs(s, a),
        _ => return None,
    })
}

/// LCS key1 key2 [LEN] [IDX] [MINMATCHLEN len] [WITHMATCHLEN]
fn lcs(s: &RedisStore, a: &[Bytes]) -> Reply {
    let (mut len_only, mut idx, mut with_len, mut min_len) = (false, false, false, 0usize);
    let mut i = 2;
    while i < a.len() {
        match &a[i] {
            w if is(w, "len") => len_only = true,
            w if is(w, "idx") => idx = true,
            w if is(w, "withmatchlen") => with_len = true,
            w if is(w, "minmatchlen") && i + 1 < a.len() => {
                min_len = match parse_i64(&a[i + 1]) {
                    Some(n) => n.max(0) as usize,
                    None => return crate::command::not_integer(),
                };
                i += 1;
            }
            _ => return syntax_error(),
        }
        i += 1;
    }
    if len_only && idx {
        return Reply::err("ERR If you want both the length and indexes, please just use IDX.");
    }
    let string = |k: &Bytes| match s.get(k).map(|e| &e.value) {
        None => Ok(Bytes::new()),
        Some(super::Value::Str(v)) => Ok(v.clone()),
        Some(_) => Err(Reply::err("ERR The specified keys must contain string values")),
    };
    let (x, y) = match (string(&a[0]), string(&a[1])) {
        (Ok(x), Ok(y)) => (x, y),
        (Err(e), _) | (_, Err(e)) => return e,
    };
    let (n, m) = (x.len(), y.len());
    if (n as u64 + 1) * (m as u64 + 1) > LCS_CELLS_MAX {
        return Reply::err("ERR Insufficient memory, transient memory for LCS exceeds proto-max-bulk-len");
    }
    // table[i * (m + 1) + j]: the LCS length of x[..i] and y[..j].
    let width = m + 1;
    let mut table = vec![0u32; (n + 1) * width];
    for i in 1..=n {
        for j in 1..=m {
            table[i * width + j] = if x[i - 1] == y[j - 1] {
                table[(i - 1) * width + j - 1] + 1
            } else {
                table[(i - 1) * width + j].max(table[i * width + j - 1])
            };
        }
    }
    let total = table[n * width + m] as usize;
    if len_only {
        return Reply::Int(total as i64);
    }
    // Walk back from the ends, as Redis does: the common subsequence, and its runs (matching
    // ranges of both strings), last first.
    let mut common = vec![0u8; total];
    let mut ranges = Vec::new();
    let (mut i, mut j, mut k) = (n, m, total);
    let mut run: Option<(usize, usize, usize, usize)> = None; // a start, a end, b start, b end
    while i > 0 && j > 0 {
        let mut emit = false;
        if x[i - 1] == y[j - 1] {
            common[k - 1] = x[i - 1];
            run = Some(match run {
                None => (i - 1, i - 1, j - 1, j - 1),
                Some((a_start, a_end, b_start, b_end)) if a_start == i && b_start == j => {
                    (a_start - 1, a_end, b_start - 1, b_end)
                }
                Some(r) => {
                    emit = true;
                    r
                }
            });
            if run.is_some_and(|(a_start, _, b_start, _)| a_start == 0 || b_start == 0) {
                emit = true;
            }
            k -= 1;
            i -= 1;
            j -= 1;
        } else {
            if table[(i - 1) * width + j] > table[i * width + j - 1] {
                i -= 1;
            } else {
                j -= 1;
            }
            emit = run.is_some();
        }
        if let (true, Some((a_start, a_end, b_start, b_end))) = (emit, run) {
            let matched = a_end - a_start + 1;
            if min_len == 0 || matched >= min_len {
                let pair = |from: usize, to: usize| Reply::Array(vec![Reply::Int(from as i64), Reply::Int(to as i64)]);
                let mut item = vec![pair(a_start, a_end), pair(b_start, b_end)];
                if with_len {
                    item.push(Reply::Int(matched as i64));
                }
                ranges.push(Reply::Array(item));
            }
            run = None;
        }
    }
    if idx {
        Reply::Map(vec![
            (Reply::text("matches"), Reply::Array(ranges)),
            (Reply::text("len"), Reply::Int(total as i64)),
        ])
    } else {
        Reply::Bulk(Bytes::from(common))
    }
}

#[cfg(test)]
mod tests {
    use crate::reply::Reply;
    use crate::store::tests::{cmd, int};
    use crate::store::RedisStore;

    #[test]
    fn bits_set_and_read_from_the_high_bit_of_each_byte() {
        let s = &mut RedisStore::new();
        assert_eq!(cmd(s, "SETBIT k 1 1"), int(0));
        assert_eq!(cmd(s, "SETBIT k 7 1"), int(0));
        assert_eq!(cmd(s, "GET k"), Reply::text("A"), "0b0100_0001");
        assert_eq!(cmd(s, "SETBIT k 1 0"), int(1));
        assert_eq!(cmd(s, "GETBIT k 7"), int(1));
        assert_eq!(cmd(s, "GETBIT k 100000"), int(0));
        assert_eq!(cmd(s, "SETBIT k 17 1"), int(0));
        assert_eq!(cmd(s, "STRLEN k"), int(3), "grown with zero bytes");
        assert_eq!(
            cmd(s, "SETBIT k 0 2"),
            Reply::err("ERR bit is not an integer or out of range")
        );
        assert_eq!(
            cmd(s, "SETBIT k 4294967296 1"),
            Reply::err("ERR bit offset is not an integer or out of range")
        );
        assert_eq!(cmd(s, "SUBSTR k 0 0"), Reply::Bulk(bytes::Bytes::from_static(b"\x01")));
    }

    #[test]
    fn lcs_finds_the_subsequence_its_length_and_its_ranges() {
        let s = &mut RedisStore::new();
        cmd(s, "MSET a ohmytext b mynewtext");
        assert_eq!(cmd(s, "LCS a b"), Reply::text("mytext"));
        assert_eq!(cmd(s, "LCS a b LEN"), int(6));
        let pair = |x: i64, y: i64| Reply::Array(vec![int(x), int(y)]);
        assert_eq!(
            cmd(s, "LCS a b IDX MINMATCHLEN 2 WITHMATCHLEN"),
            Reply::Map(vec![
                (
                    Reply::text("matches"),
                    Reply::Array(vec![
                        Reply::Array(vec![pair(4, 7), pair(5, 8), int(4)]),
                        Reply::Array(vec![pair(2, 3), pair(0, 1), int(2)]),
                    ])
                ),
                (Reply::text("len"), int(6)),
            ])
        );
        assert_eq!(
            cmd(s, "LCS a b LEN IDX"),
            Reply::err("ERR If you want both the length and indexes, please just use IDX.")
        );
    }
}

//! Replies and their RESP2 / RESP3 encodings.

use bytes::Bytes;
use serde::{Deserialize, Serialize};

/// A Redis reply, independent of the protocol version.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Reply {
    /// A simple string (`+OK`).
    Status(String),
    /// An error; the text includes its code (`ERR ...`).
    Error(String),
    /// An integer.
    Int(i64),
    /// A bulk string.
    Bulk(Bytes),
    /// The null bulk string (RESP2 `$-1`, RESP3 `_`).
    Nil,
    /// An array.
    Array(Vec<Reply>),
    /// A map (RESP3 `%`; a flat array of pairs in RESP2).
    Map(Vec<(Reply, Reply)>),
    /// A set (RESP3 `~`; an array in RESP2).
    Set(Vec<Reply>),
    /// The null array (RESP2 `*-1`, RESP3 `_`).
    NilArray,
    /// Pairs that may repeat (HRANDFIELD WITHVALUES): an array of two-element arrays in RESP3, a
    /// flat array in RESP2.
    Pairs(Vec<(Reply, Reply)>),
    /// A floating-point number, already in Redis' text form (RESP3 `,1.5`; a bulk string in
    /// RESP2).
    Double(String),
    /// An out-of-band message (pub/sub): RESP3 push `>`, an array in RESP2.
    Push(Vec<Reply>),
    /// Between the store and its gateway only: a reply too large for one operation, kept by the
    /// store as number `id` (`len` encoded bytes) for the gateway to fetch in pieces. Never sent
    /// to a Redis client.
    Large {
        /// The number it is kept under.
        id: u64,
        /// Its encoded length.
        len: u64,
    },
    /// Between the store and its gateway only: a blocking command is waiting (the gateway
    /// collects its reply once the store pushes its token). Never sent to a Redis client.
    Blocked,
}

impl Reply {
    /// `+OK`.
    pub fn ok() -> Reply {
        Reply::Status("OK".into())
    }

    /// An error reply.
    pub fn err(text: impl Into<String>) -> Reply {
        Reply::Error(text.into())
    }

    /// A bulk string from text.
    pub fn text(s: impl AsRef<str>) -> Reply {
        Reply::Bulk(Bytes::copy_from_slice(s.as_ref().as_bytes()))
    }

    /// Appends the encoding for protocol version `proto` (2 or 3) to `out`.
    pub fn write(&self, proto: u8, out: &mut Vec<u8>) {
        match self {
            Reply::Status(s) => line(out, b'+', s.as_bytes()),
            Reply::Error(s) => line(out, b'-', s.as_bytes()),
            Reply::Int(i) => number(out, b':', *i),
            Reply::Double(s) if proto >= 3 => line(out, b',', s.as_bytes()),
            Reply::Double(s) => Reply::Bulk(Bytes::copy_from_slice(s.as_bytes())).write(proto, out),
            Reply::Bulk(b) => {
                number(out, b'$', b.len() as i64);
                out.extend_from_slice(b);
                out.extend_from_slice(b"\r\n");
            }
            Reply::Nil if proto >= 3 => out.extend_from_slice(b"_\r\n"),
            Reply::Nil => out.extend_from_slice(b"$-1\r\n"),
            Reply::NilArray | Reply::Blocked if proto >= 3 => out.extend_from_slice(b"_\r\n"),
            Reply::NilArray | Reply::Blocked => out.extend_from_slice(b"*-1\r\n"),
            Reply::Large { .. } => line(out, b'-', b"ERR upright: a large reply was not fetched"),
            Reply::Array(items) => {
                number(out, b'*', items.len() as i64);
                items.iter().for_each(|i| i.write(proto, out));
            }
            Reply::Push(items) => {
                number(out, if proto >= 3 { b'>' } else { b'*' }, items.len() as i64);
                items.iter().for_each(|i| i.write(proto, out));
            }
            Reply::Set(items) => {
                number(out, if proto >= 3 { b'~' } else { b'*' }, items.len() as i64);
                items.iter().for_each(|i| i.write(proto, out));
            }
            Reply::Pairs(pairs) => {
                number(out, b'*', (pairs.len() * if proto >= 3 { 1 } else { 2 }) as i64);
                for (k, v) in pairs {
                    if proto >= 3 {
                        out.extend_from_slice(b"*2\r\n");
                    }
                    k.write(proto, out);
                    v.write(proto, out);
                }
            }
            Reply::Map(pairs) => {
                if proto >= 3 {
                    number(out, b'%', pairs.len() as i64);
                } else {
                    number(out, b'*', (pairs.len() * 2) as i64);
                }
                for (k, v) in pairs {
                    k.write(proto, out);
                    v.write(proto, out);
                }
            }
        }
    }

    /// The encoding as a fresh buffer.
    pub fn to_resp(&self, proto: u8) -> Vec<u8> {
        let mut out = Vec::new();
        self.write(proto, &mut out);
        out
    }
}

/// A tagged decimal line (`:42`, `$5`, `*3`), formatted without a temporary string.
fn number(out: &mut Vec<u8>, tag: u8, n: i64) {
    use std::io::Write;
    out.push(tag);
    let _ = write!(out, "{n}\r\n"); // writing to a Vec cannot fail
}

fn line(out: &mut Vec<u8>, tag: u8, body: &[u8]) {
    out.push(tag);
    // Simple strings and errors never carry CR or LF (Redis replaces them with spaces).
    out.extend(body.iter().map(|&b| if b == b'\r' || b == b'\n' { b' ' } else { b }));
    out.extend_from_slice(b"\r\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodings_match_redis() {
        assert_eq!(Reply::ok().to_resp(2), b"+OK\r\n");
        assert_eq!(Reply::Nil.to_resp(2), b"$-1\r\n");
        assert_eq!(Reply::Nil.to_resp(3), b"_\r\n");
        assert_eq!(Reply::NilArray.to_resp(2), b"*-1\r\n");
        assert_eq!(Reply::NilArray.to_resp(3), b"_\r\n");
        assert_eq!(Reply::Int(-3).to_resp(2), b":-3\r\n");
        assert_eq!(Reply::text("hi").to_resp(2), b"$2\r\nhi\r\n");
        let map = Reply::Map(vec![(Reply::text("a"), Reply::Int(1))]);
        assert_eq!(map.to_resp(2), b"*2\r\n$1\r\na\r\n:1\r\n");
        assert_eq!(map.to_resp(3), b"%1\r\n$1\r\na\r\n:1\r\n");
        assert_eq!(Reply::err("ERR a\r\nb").to_resp(2), b"-ERR a  b\r\n");
        assert_eq!(Reply::Double("1.5".into()).to_resp(2), b"$3\r\n1.5\r\n");
        assert_eq!(Reply::Double("-inf".into()).to_resp(3), b",-inf\r\n");
        let pairs = Reply::Pairs(vec![
            (Reply::text("a"), Reply::Int(1)),
            (Reply::text("a"), Reply::Int(1)),
        ]);
        assert_eq!(pairs.to_resp(2), b"*4\r\n$1\r\na\r\n:1\r\n$1\r\na\r\n:1\r\n");
        assert_eq!(
            pairs.to_resp(3),
            b"*2\r\n*2\r\n$1\r\na\r\n:1\r\n*2\r\n$1\r\na\r\n:1\r\n"
        );
    }
}

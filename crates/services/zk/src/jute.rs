//! Jute, the encoding of ZooKeeper's wire protocol (`zookeeper.jute`): big-endian `int` (4 bytes)
//! and `long` (8), `boolean` as one byte, `buffer` and `ustring` as an `int` length (`-1`: null)
//! followed by the bytes, `vector` as an `int` count (`-1`: null) followed by the elements, and a
//! record as its fields in order. Decoding is bounded: a length never reads past the input, and
//! no buffer, string or vector passes the limits ZooKeeper itself applies (`jute.maxbuffer`).

use bytes::{BufMut, Bytes};

/// ZooKeeper's default `jute.maxbuffer` (0xfffff): the largest data a znode may hold, and the
/// largest packet a server accepts from a client.
pub const MAX_BUFFER: usize = 0xfffff;
/// Most elements of one decoded vector (a multi's operations, an ACL, a watch list): bounded by
/// what fits in [`MAX_BUFFER`] bytes anyway; this stops a count from reserving memory first.
pub const MAX_VECTOR: usize = MAX_BUFFER / 4;

/// Bytes that are not a well-formed record.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum JuteError {
    /// The input ended inside a field.
    #[error("record truncated")]
    Truncated,
    /// A length below -1, or above the limit.
    #[error("bad length {0}")]
    BadLength(i64),
    /// A `ustring` that is not UTF-8.
    #[error("string is not UTF-8")]
    NotUtf8,
    /// A `boolean` other than 0 or 1.
    #[error("bad boolean {0}")]
    BadBool(u8),
    /// Bytes left after the record.
    #[error("{0} trailing bytes")]
    Trailing(usize),
}

/// Reads fields from the front of a record.
#[derive(Clone, Debug)]
pub struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    /// A reader over `bytes`.
    pub fn new(bytes: &'a [u8]) -> Reader<'a> {
        Reader { bytes }
    }

    /// Bytes not read yet.
    pub fn remaining(&self) -> usize {
        self.bytes.len()
    }

    /// Fails unless everything was read.
    pub fn finish(self) -> Result<(), JuteError> {
        match self.bytes.len() {
            0 => Ok(()),
            n => Err(JuteError::Trailing(n)),
        }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], JuteError> {
        if self.bytes.len() < n {
            return Err(JuteError::Truncated);
        }
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Ok(head)
    }

    /// `int`.
    pub fn int(&mut self) -> Result<i32, JuteError> {
        Ok(i32::from_be_bytes(self.take(4)?.try_into().expect("4 bytes")))
    }

    /// `long`.
    pub fn long(&mut self) -> Result<i64, JuteError> {
        Ok(i64::from_be_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }

    /// `boolean`.
    pub fn boolean(&mut self) -> Result<bool, JuteError> {
        match self.take(1)?[0] {
            0 => Ok(false),
            1 => Ok(true),
            b => Err(JuteError::BadBool(b)),
        }
    }

    /// A length: `-1` is `None`; anything else must be in `0..=max` and, times `unit` bytes per
    /// element at least, fit in what is left.
    fn length(&mut self, max: usize, unit: usize) -> Result<Option<usize>, JuteError> {
        let n = self.int()?;
        if n == -1 {
            return Ok(None);
        }
        let len = usize::try_from(n).map_err(|_| JuteError::BadLength(n.into()))?;
        if len > max || len.saturating_mul(unit) > self.bytes.len() {
            return Err(JuteError::BadLength(n.into()));
        }
        Ok(Some(len))
    }

    /// `buffer` (`None`: null).
    pub fn buffer(&mut self) -> Result<Option<Bytes>, JuteError> {
        match self.length(MAX_BUFFER, 1)? {
            None => Ok(None),
            Some(n) => Ok(Some(Bytes::copy_from_slice(self.take(n)?))),
        }
    }

    /// `buffer`, null read as empty (how ZooKeeper's server treats a null data buffer).
    pub fn data(&mut self) -> Result<Bytes, JuteError> {
        Ok(self.buffer()?.unwrap_or_default())
    }

    /// `ustring` (`None`: null).
    pub fn ustring(&mut self) -> Result<Option<String>, JuteError> {
        match self.length(MAX_BUFFER, 1)? {
            None => Ok(None),
            Some(n) => {
                let bytes = self.take(n)?;
                String::from_utf8(bytes.to_vec())
                    .map(Some)
                    .map_err(|_| JuteError::NotUtf8)
            }
        }
    }

    /// `ustring`, null read as empty.
    pub fn string(&mut self) -> Result<String, JuteError> {
        Ok(self.ustring()?.unwrap_or_default())
    }

    /// `vector<T>`, each element read by `element` (at least `unit` bytes each); null read as
    /// empty.
    pub fn vector<T>(
        &mut self,
        unit: usize,
        mut element: impl FnMut(&mut Reader<'a>) -> Result<T, JuteError>,
    ) -> Result<Vec<T>, JuteError> {
        let Some(n) = self.length(MAX_VECTOR, unit.max(1))? else {
            return Ok(Vec::new());
        };
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            out.push(element(self)?);
        }
        Ok(out)
    }

    /// `vector<ustring>`.
    pub fn strings(&mut self) -> Result<Vec<String>, JuteError> {
        self.vector(4, Reader::string)
    }
}

/// Writes fields of a record.
pub trait Writer {
    /// `int`.
    fn int(&mut self, v: i32);
    /// `long`.
    fn long(&mut self, v: i64);
    /// `boolean`.
    fn boolean(&mut self, v: bool);
    /// `buffer` (`None`: null).
    fn buffer(&mut self, v: Option<&[u8]>);
    /// `ustring`.
    fn string(&mut self, v: &str) {
        self.buffer(Some(v.as_bytes()));
    }
    /// `vector<ustring>`.
    fn strings(&mut self, v: &[String]) {
        self.int(v.len() as i32);
        for s in v {
            self.string(s);
        }
    }
}

impl<B: BufMut> Writer for B {
    fn int(&mut self, v: i32) {
        self.put_i32(v);
    }
    fn long(&mut self, v: i64) {
        self.put_i64(v);
    }
    fn boolean(&mut self, v: bool) {
        self.put_u8(v.into());
    }
    fn buffer(&mut self, v: Option<&[u8]>) {
        match v {
            None => self.put_i32(-1),
            Some(b) => {
                self.put_i32(b.len() as i32);
                self.put_slice(b);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_round_trip_in_jute_layout() {
        let mut out = Vec::new();
        out.int(-2);
        out.long(0x0102_0304_0506_0708);
        out.boolean(true);
        out.buffer(None);
        out.string("/a");
        out.strings(&["x".into(), "yz".into()]);
        assert_eq!(
            out,
            [
                &[0xff, 0xff, 0xff, 0xfe][..],
                &[1, 2, 3, 4, 5, 6, 7, 8],
                &[1],
                &[0xff, 0xff, 0xff, 0xff],
                &[0, 0, 0, 2, b'/', b'a'],
                &[0, 0, 0, 2, 0, 0, 0, 1, b'x', 0, 0, 0, 2, b'y', b'z'],
            ]
            .concat()
        );
        let mut r = Reader::new(&out);
        assert_eq!(r.int(), Ok(-2));
        assert_eq!(r.long(), Ok(0x0102_0304_0506_0708));
        assert_eq!(r.boolean(), Ok(true));
        assert_eq!(r.buffer(), Ok(None));
        assert_eq!(r.string(), Ok("/a".to_string()));
        assert_eq!(r.strings(), Ok(vec!["x".to_string(), "yz".to_string()]));
        r.finish().unwrap();
    }

    #[test]
    fn lengths_are_checked_before_anything_is_read() {
        let read = |bytes: &[u8]| Reader::new(bytes).buffer();
        assert_eq!(read(&[0, 0, 0, 5, 1, 2]), Err(JuteError::BadLength(5)), "past the end");
        assert_eq!(read(&[0xff, 0xff, 0xff, 0xfe]), Err(JuteError::BadLength(-2)));
        assert_eq!(
            read(&[0, 0x10, 0, 0]),
            Err(JuteError::BadLength(0x10_0000)),
            "above jute.maxbuffer"
        );
        let mut huge = Reader::new(&[0x7f, 0xff, 0xff, 0xff]);
        assert!(huge.strings().is_err(), "a count is bounded by the bytes left");
        assert_eq!(Reader::new(&[2]).boolean(), Err(JuteError::BadBool(2)));
        assert_eq!(Reader::new(&[0, 0, 0, 1, 0xff]).ustring(), Err(JuteError::NotUtf8));
        assert_eq!(Reader::new(&[0, 0, 0]).int(), Err(JuteError::Truncated));
        assert_eq!(Reader::new(&[0]).finish(), Err(JuteError::Trailing(1)));
    }

    proptest::proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64)) {
            let mut r = Reader::new(&bytes);
            let _ = r.strings();
            let mut r = Reader::new(&bytes);
            let _ = r.vector(8, |r| Ok((r.int()?, r.buffer()?)));
        }
    }
}

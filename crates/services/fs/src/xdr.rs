//! XDR (RFC 4506), the encoding of ONC RPC and NFS: big-endian 4-byte units, variable-length
//! data prefixed by its length and padded with zeros to a multiple of four bytes.
//!
//! [`Reader`] decodes from a peer's bytes and never panics: every read checks the bytes left and
//! the caller's bound on a length before it allocates.

use bytes::{BufMut, Bytes, BytesMut};

/// Why bytes do not decode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum XdrError {
    /// The bytes end before the value does.
    #[error("the message ends inside a value")]
    Short,
    /// A length above the bound the protocol (or this server) sets.
    #[error("a length of {0} bytes is above the limit of {1}")]
    TooLong(usize, usize),
    /// A boolean or discriminant that is not one of its values.
    #[error("{0} is not a valid value here")]
    BadValue(u32),
    /// A string that is not UTF-8 (file names: NFS leaves the encoding open; this server keeps
    /// them as UTF-8).
    #[error("a name that is not UTF-8")]
    NotUtf8,
}

/// Padding after `len` bytes of opaque data.
pub fn padding(len: usize) -> usize {
    (4 - len % 4) % 4
}

/// Reads XDR values in sequence from a borrowed buffer.
pub struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    pub fn new(bytes: &'a [u8]) -> Reader<'a> {
        Reader { bytes, at: 0 }
    }

    /// Bytes not read yet.
    pub fn remaining(&self) -> usize {
        self.bytes.len() - self.at
    }

    /// The bytes not read yet, without consuming them.
    pub fn rest(&self) -> &'a [u8] {
        &self.bytes[self.at..]
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], XdrError> {
        if self.remaining() < n {
            return Err(XdrError::Short);
        }
        let slice = &self.bytes[self.at..self.at + n];
        self.at += n;
        Ok(slice)
    }

    pub fn u32(&mut self) -> Result<u32, XdrError> {
        let b = self.take(4)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    pub fn i32(&mut self) -> Result<i32, XdrError> {
        Ok(self.u32()? as i32)
    }

    pub fn u64(&mut self) -> Result<u64, XdrError> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_be_bytes(a))
    }

    pub fn bool(&mut self) -> Result<bool, XdrError> {
        match self.u32()? {
            0 => Ok(false),
            1 => Ok(true),
            v => Err(XdrError::BadValue(v)),
        }
    }

    /// Fixed-length opaque data of `n` bytes (and its padding).
    pub fn fixed(&mut self, n: usize) -> Result<&'a [u8], XdrError> {
        let data = self.take(n)?;
        self.take(padding(n))?;
        Ok(data)
    }

    /// Variable-length opaque data of at most `max` bytes.
    pub fn opaque(&mut self, max: usize) -> Result<&'a [u8], XdrError> {
        let len = self.u32()? as usize;
        if len > max {
            return Err(XdrError::TooLong(len, max));
        }
        self.fixed(len)
    }

    /// A string of at most `max` bytes, which must be UTF-8.
    pub fn string(&mut self, max: usize) -> Result<&'a str, XdrError> {
        std::str::from_utf8(self.opaque(max)?).map_err(|_| XdrError::NotUtf8)
    }

    /// An optional value (`*T`: a boolean, then the value if true).
    pub fn optional<T>(&mut self, read: impl FnOnce(&mut Self) -> Result<T, XdrError>) -> Result<Option<T>, XdrError> {
        if self.bool()? {
            Ok(Some(read(self)?))
        } else {
            Ok(None)
        }
    }
}

/// Writes XDR values into a growing buffer.
#[derive(Default)]
pub struct Writer {
    buf: BytesMut,
}

impl Writer {
    pub fn new() -> Writer {
        Writer::default()
    }

    pub fn with_capacity(n: usize) -> Writer {
        Writer {
            buf: BytesMut::with_capacity(n),
        }
    }

    pub fn len(&self) -> usize {
        self.buf.len()
    }

    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.buf.put_u32(v);
        self
    }

    pub fn i32(&mut self, v: i32) -> &mut Self {
        self.buf.put_i32(v);
        self
    }

    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.buf.put_u64(v);
        self
    }

    pub fn bool(&mut self, v: bool) -> &mut Self {
        self.u32(u32::from(v))
    }

    /// Fixed-length opaque data (its length is known to the reader) and its padding.
    pub fn fixed(&mut self, data: &[u8]) -> &mut Self {
        self.buf.put_slice(data);
        self.buf.put_bytes(0, padding(data.len()));
        self
    }

    /// Variable-length opaque data: its length, the bytes, the padding.
    pub fn opaque(&mut self, data: &[u8]) -> &mut Self {
        let len = u32::try_from(data.len()).expect("XDR data is shorter than 4 GiB");
        self.u32(len);
        self.fixed(data)
    }

    pub fn string(&mut self, s: &str) -> &mut Self {
        self.opaque(s.as_bytes())
    }

    /// Bytes already encoded (a nested value), appended as they are.
    pub fn raw(&mut self, data: &[u8]) -> &mut Self {
        self.buf.put_slice(data);
        self
    }

    pub fn finish(self) -> Bytes {
        self.buf.freeze()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn values_are_big_endian_and_opaque_data_is_padded_to_four_bytes() {
        let mut w = Writer::new();
        w.u32(1)
            .i32(-2)
            .u64(3)
            .bool(true)
            .opaque(b"abcde")
            .string("xy")
            .fixed(b"z");
        let bytes = w.finish();
        assert_eq!(
            &bytes[..],
            &[
                0, 0, 0, 1, 0xff, 0xff, 0xff, 0xfe, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 1, 0, 0, 0, 5, b'a', b'b', b'c',
                b'd', b'e', 0, 0, 0, 0, 0, 0, 2, b'x', b'y', 0, 0, b'z', 0, 0, 0
            ][..]
        );
        let mut r = Reader::new(&bytes);
        assert_eq!(r.u32(), Ok(1));
        assert_eq!(r.i32(), Ok(-2));
        assert_eq!(r.u64(), Ok(3));
        assert_eq!(r.bool(), Ok(true));
        assert_eq!(r.opaque(5), Ok(&b"abcde"[..]));
        assert_eq!(r.string(2), Ok("xy"));
        assert_eq!(r.fixed(1), Ok(&b"z"[..]));
        assert_eq!(r.remaining(), 0);
        assert_eq!(r.u32(), Err(XdrError::Short));
    }

    #[test]
    fn bad_input_is_refused_not_trusted() {
        // A length above the caller's bound is refused before anything is read.
        let mut w = Writer::new();
        w.opaque(&[7; 10]);
        let bytes = w.finish();
        assert_eq!(Reader::new(&bytes).opaque(9), Err(XdrError::TooLong(10, 9)));
        // A length beyond the message.
        assert_eq!(Reader::new(&[0, 0, 0, 8, 1, 2, 3, 4]).opaque(100), Err(XdrError::Short));
        // Missing padding.
        assert_eq!(Reader::new(&[0, 0, 0, 1, 1]).opaque(100), Err(XdrError::Short));
        assert_eq!(Reader::new(&[0, 0, 0, 2]).bool(), Err(XdrError::BadValue(2)));
        assert_eq!(
            Reader::new(&[0, 0, 0, 1, 0xff, 0, 0, 0]).string(4),
            Err(XdrError::NotUtf8)
        );
    }

    proptest! {
        #[test]
        fn opaque_data_round_trips(data in proptest::collection::vec(any::<u8>(), 0..64), n in any::<u64>()) {
            let mut w = Writer::new();
            w.opaque(&data).u64(n);
            let bytes = w.finish();
            prop_assert_eq!(bytes.len() % 4, 0);
            let mut r = Reader::new(&bytes);
            prop_assert_eq!(r.opaque(64).unwrap(), &data[..]);
            prop_assert_eq!(r.u64().unwrap(), n);
            prop_assert_eq!(r.remaining(), 0);
        }

        #[test]
        fn any_bytes_decode_or_fail_without_panic(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            let mut r = Reader::new(&bytes);
            let _ = r.opaque(16).and_then(|_| r.string(16)).and_then(|_| r.u64());
        }
    }
}

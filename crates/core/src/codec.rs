//! Deterministic, bounded encoding of any value (postcard): digests, storage records, service
//! operations and replies, and the body of every frame ([`crate::wire`]). Equal values encode to
//! equal bytes; decoding never pre-allocates more than the input can fill (serde's cautious size
//! hints) and refuses trailing bytes. It depends on nothing else of the core.

use serde::Serialize;

/// Why bytes could not be decoded into a message.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// Empty input.
    #[error("empty frame")]
    Empty,
    /// Longer than [`crate::limits::MESSAGE_BYTES_MAX`].
    #[error("frame of {0} bytes exceeds the limit")]
    TooLong(usize),
    /// Unknown wire version.
    #[error("unsupported wire version {0}")]
    Version(u8),
    /// Not a valid encoding.
    #[error("malformed frame")]
    Malformed,
    /// Trailing bytes after the message.
    #[error("trailing bytes after message")]
    Trailing,
    /// A field exceeds its limit.
    #[error("{0} exceeds its limit")]
    Limit(&'static str),
}

/// Encodes any serializable value with postcard (used for digests and for storage records).
pub fn to_bytes<T: Serialize + ?Sized>(value: &T) -> Vec<u8> {
    postcard::to_allocvec(value).expect("encoding to a Vec cannot fail")
}

/// Decodes a value written by [`to_bytes`], refusing trailing bytes.
pub fn from_bytes<'a, T: serde::Deserialize<'a>>(bytes: &'a [u8]) -> Result<T, DecodeError> {
    let (value, rest) = postcard::take_from_bytes(bytes).map_err(|_| DecodeError::Malformed)?;
    if !rest.is_empty() {
        return Err(DecodeError::Trailing);
    }
    Ok(value)
}

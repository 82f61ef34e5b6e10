//! Frames: a 4-byte big-endian length, then that many bytes. The length is checked against the
//! bound before anything is allocated.

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Bytes requested from the socket per read: many small frames arrive with one system call.
pub const READ_CHUNK_BYTES: usize = 64 << 10;

/// Why a frame could not be read.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// The connection failed or closed.
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    /// The announced length exceeds the bound.
    #[error("frame of {0} bytes exceeds the maximum")]
    TooLong(usize),
    /// Zero-length frame.
    #[error("empty frame")]
    Empty,
}

impl FrameError {
    /// The counter bumped when a connection closes on this error.
    pub fn closing_counter(&self) -> &'static str {
        match self {
            FrameError::TooLong(_) => "net_closed_oversized",
            FrameError::Empty => "net_closed_garbage",
            FrameError::Io(_) => "net_closed_io",
        }
    }
}

/// The body length a frame header announces, refused if above `max` or zero.
fn checked_len(header: [u8; 4], max: usize) -> Result<usize, FrameError> {
    match u32::from_be_bytes(header) as usize {
        len if len > max => Err(FrameError::TooLong(len)),
        0 => Err(FrameError::Empty),
        len => Ok(len),
    }
}

/// Reads one frame of at most `max` bytes.
pub async fn read_frame<R: AsyncRead + Unpin>(reader: &mut R, max: usize) -> Result<Vec<u8>, FrameError> {
    let mut header = [0u8; 4];
    reader.read_exact(&mut header).await?;
    let len = checked_len(header, max)?;
    let mut body = vec![0u8; len];
    reader.read_exact(&mut body).await?;
    Ok(body)
}

/// Reads frames from a stream through one buffer: each read takes whatever the socket holds (up to
/// [`READ_CHUNK_BYTES`] or the rest of a large frame), and the complete frames in it are handed out
/// as zero-copy slices of that buffer.
pub struct FrameReader<R> {
    reader: R,
    buf: BytesMut,
    max: usize,
}

impl<R: AsyncRead + Unpin> FrameReader<R> {
    /// A reader of frames of at most `max` bytes.
    pub fn new(reader: R, max: usize) -> FrameReader<R> {
        FrameReader {
            reader,
            buf: BytesMut::new(),
            max,
        }
    }

    /// Waits for more bytes (at least one); a closed connection is an error.
    pub async fn fill(&mut self) -> Result<(), FrameError> {
        if self.buf.capacity() - self.buf.len() < READ_CHUNK_BYTES / 4 {
            self.buf.reserve(READ_CHUNK_BYTES);
        }
        let n = self.reader.read_buf(&mut self.buf).await?;
        if n == 0 {
            return Err(FrameError::Io(std::io::ErrorKind::UnexpectedEof.into()));
        }
        Ok(())
    }

    /// The next complete frame already buffered, if any. A length above the bound or a zero length
    /// is an error (before anything is allocated for it).
    pub fn next_frame(&mut self) -> Result<Option<Bytes>, FrameError> {
        if self.buf.len() < 4 {
            return Ok(None);
        }
        let len = checked_len([self.buf[0], self.buf[1], self.buf[2], self.buf[3]], self.max)?;
        if self.buf.len() < 4 + len {
            self.buf.reserve(4 + len - self.buf.len());
            return Ok(None);
        }
        self.buf.advance(4);
        Ok(Some(self.buf.split_to(len).freeze()))
    }
}

/// Writes one frame (the caller flushes if it buffers).
pub async fn write_frame<W: AsyncWrite + Unpin>(writer: &mut W, body: &[u8]) -> std::io::Result<()> {
    write_tagged_frame(writer, &[], body).await
}

/// Writes one frame whose body is `tag` followed by `body`, without joining them first (the
/// caller flushes if it buffers).
pub async fn write_tagged_frame<W: AsyncWrite + Unpin>(writer: &mut W, tag: &[u8], body: &[u8]) -> std::io::Result<()> {
    let len = u32::try_from(tag.len() + body.len()).map_err(|_| std::io::Error::other("frame too long"))?;
    writer.write_all(&len.to_be_bytes()).await?;
    if !tag.is_empty() {
        writer.write_all(tag).await?;
    }
    writer.write_all(body).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn frames_round_trip_and_oversized_lengths_are_refused_before_reading() {
        let mut buf = Vec::new();
        write_frame(&mut buf, b"hello").await.unwrap();
        write_frame(&mut buf, b"world!").await.unwrap();
        let mut r = &buf[..];
        assert_eq!(read_frame(&mut r, 16).await.unwrap(), b"hello");
        assert_eq!(read_frame(&mut r, 16).await.unwrap(), b"world!");
        assert!(matches!(read_frame(&mut r, 16).await, Err(FrameError::Io(_))));
        let huge = (u32::MAX).to_be_bytes();
        let mut r = &huge[..];
        assert!(matches!(read_frame(&mut r, 1 << 20).await, Err(FrameError::TooLong(_))));
    }

    #[tokio::test]
    async fn the_frame_reader_splits_one_read_into_frames_and_waits_for_partial_ones() {
        let mut buf = Vec::new();
        write_frame(&mut buf, b"one").await.unwrap();
        write_frame(&mut buf, b"two!").await.unwrap();
        write_frame(&mut buf, &[7u8; 100]).await.unwrap();
        let (mut tx, rx) = tokio::io::duplex(1 << 16);
        let mut reader = FrameReader::new(rx, 128);
        // Everything but the last 10 bytes of the third frame.
        tx.write_all(&buf[..buf.len() - 10]).await.unwrap();
        reader.fill().await.unwrap();
        assert_eq!(&reader.next_frame().unwrap().unwrap()[..], b"one");
        assert_eq!(&reader.next_frame().unwrap().unwrap()[..], b"two!");
        assert!(reader.next_frame().unwrap().is_none());
        tx.write_all(&buf[buf.len() - 10..]).await.unwrap();
        reader.fill().await.unwrap();
        assert_eq!(&reader.next_frame().unwrap().unwrap()[..], &[7u8; 100][..]);
        assert!(reader.next_frame().unwrap().is_none());
        drop(tx);
        assert!(matches!(reader.fill().await, Err(FrameError::Io(_))));
    }

    #[tokio::test]
    async fn the_frame_reader_refuses_oversized_and_empty_frames() {
        let (mut tx, rx) = tokio::io::duplex(1 << 16);
        let mut reader = FrameReader::new(rx, 128);
        tx.write_all(&1000u32.to_be_bytes()).await.unwrap();
        reader.fill().await.unwrap();
        assert!(matches!(reader.next_frame(), Err(FrameError::TooLong(1000))));
        let (mut tx, rx) = tokio::io::duplex(1 << 16);
        let mut reader = FrameReader::new(rx, 128);
        tx.write_all(&0u32.to_be_bytes()).await.unwrap();
        reader.fill().await.unwrap();
        assert!(matches!(reader.next_frame(), Err(FrameError::Empty)));
    }
}

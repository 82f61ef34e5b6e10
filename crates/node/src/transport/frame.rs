//! Frames: a 4-byte big-endian length, then that many bytes. The length is checked against the
//! bound before anything is allocated.

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

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

/// Reads one frame of at most `max` bytes.
pub async fn read_frame<R: AsyncRead + Unpin>(reader: &mut R, max: usize) -> Result<Vec<u8>, FrameError> {
    let mut header = [0u8; 4];
    reader.read_exact(&mut header).await?;
    let len = u32::from_be_bytes(header) as usize;
    if len > max {
        return Err(FrameError::TooLong(len));
    }
    if len == 0 {
        return Err(FrameError::Empty);
    }
    let mut body = vec![0u8; len];
    reader.read_exact(&mut body).await?;
    Ok(body)
}

/// Writes one frame (the caller flushes if it buffers).
pub async fn write_frame<W: AsyncWrite + Unpin>(writer: &mut W, body: &[u8]) -> std::io::Result<()> {
    let len = u32::try_from(body.len()).map_err(|_| std::io::Error::other("frame too long"))?;
    writer.write_all(&len.to_be_bytes()).await?;
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
}

//! Where a connection goes: a TCP address (`host:port`) or, for processes on one host, a
//! Unix-domain socket (`unix:/path`).
//!
//! A Unix-domain socket skips the TCP/IP stack: on the development VM a loopback ping-pong costs
//! about two thirds of the CPU and latency over one as over TCP (docs/PERFORMANCE.md), and a local
//! cluster sends a few dozen messages per batch. It reaches only processes of the same host (and
//! file system), so it is for single-host clusters (`upright demo`, tests, development) and for a
//! client shim co-located with a replica; a cluster spread over machines uses TCP. Both carry the
//! same frames and hellos, so peers are authenticated the same way.
//!
//! A listener's socket file is removed when the listener is dropped. One left behind by a process
//! that was killed is replaced at the next bind, after a connection attempt shows that nothing
//! listens on it any more; a path in use by a live listener, or a file that is not a socket, is
//! an error, never removed.

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{tcp, unix, TcpListener, TcpStream, UnixListener, UnixStream};

/// The prefix that marks a Unix-domain socket path in an address.
pub const UNIX_PREFIX: &str = "unix:";

/// Longest Unix-domain socket path in bytes (Linux's `sun_path` holds 108 bytes with the final
/// NUL).
pub const UNIX_PATH_BYTES_MAX: usize = 107;

/// A parsed address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Endpoint {
    /// A TCP socket address.
    Tcp(SocketAddr),
    /// A Unix-domain socket path (absolute).
    Unix(PathBuf),
}

impl Endpoint {
    /// Parses `unix:/absolute/path` or `host:port` (a host name is resolved, first address).
    pub fn parse(addr: &str) -> Result<Endpoint, String> {
        if let Some(path) = addr.strip_prefix(UNIX_PREFIX) {
            let path = Path::new(path);
            if !path.is_absolute() {
                return Err(format!(
                    "{addr:?}: a Unix socket path must be absolute (unix:/dir/name.sock)"
                ));
            }
            if path.as_os_str().len() > UNIX_PATH_BYTES_MAX {
                return Err(format!(
                    "{addr:?}: a Unix socket path may have at most {UNIX_PATH_BYTES_MAX} bytes"
                ));
            }
            return Ok(Endpoint::Unix(path.to_path_buf()));
        }
        resolve_tcp(addr)
            .map(Endpoint::Tcp)
            .map_err(|e| format!("{e} (host:port or unix:/path)"))
    }
}

/// Resolves `host:port` (names allowed) to its first socket address.
pub fn resolve_tcp(addr: &str) -> Result<SocketAddr, String> {
    use std::net::ToSocketAddrs;
    addr.to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .ok_or_else(|| format!("cannot resolve address {addr:?}"))
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Endpoint::Tcp(a) => write!(f, "{a}"),
            Endpoint::Unix(p) => write!(f, "{UNIX_PREFIX}{}", p.display()),
        }
    }
}

/// A listening socket of either kind.
pub enum Listener {
    /// TCP.
    Tcp(TcpListener),
    /// Unix-domain, with the path it removes when dropped.
    Unix(UnixListener, PathBuf),
}

impl Listener {
    /// Listens on `endpoint`. A Unix socket file left by a process that no longer listens is
    /// replaced; anything else at the path is an error.
    pub async fn bind(endpoint: &Endpoint) -> io::Result<Listener> {
        match endpoint {
            Endpoint::Tcp(addr) => Ok(Listener::Tcp(TcpListener::bind(addr).await?)),
            Endpoint::Unix(path) => {
                remove_stale(path).await?;
                Ok(Listener::Unix(UnixListener::bind(path)?, path.clone()))
            }
        }
    }

    /// The next inbound connection.
    pub async fn accept(&self) -> io::Result<Stream> {
        match self {
            Listener::Tcp(l) => Ok(Stream::Tcp(l.accept().await?.0)),
            Listener::Unix(l, _) => Ok(Stream::Unix(l.accept().await?.0)),
        }
    }

    /// The bound address (a TCP port of 0 is resolved).
    pub fn local_endpoint(&self) -> io::Result<Endpoint> {
        match self {
            Listener::Tcp(l) => Ok(Endpoint::Tcp(l.local_addr()?)),
            Listener::Unix(_, path) => Ok(Endpoint::Unix(path.clone())),
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        if let Listener::Unix(_, path) = self {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// Removes a socket file at `path` that nothing listens on (a connection attempt is refused).
async fn remove_stale(path: &Path) -> io::Result<()> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    if !meta.file_type().is_socket() {
        return Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            format!("{} exists and is not a socket", path.display()),
        ));
    }
    match UnixStream::connect(path).await {
        Ok(_) => Err(io::Error::new(
            io::ErrorKind::AddrInUse,
            format!("another process listens on {}", path.display()),
        )),
        Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => std::fs::remove_file(path),
        Err(e) => Err(e),
    }
}

/// A connected stream of either kind.
pub enum Stream {
    /// TCP (with `TCP_NODELAY`: frames are written whole, and latency matters more than segments).
    Tcp(TcpStream),
    /// Unix-domain.
    Unix(UnixStream),
}

impl Stream {
    /// Connects to `endpoint`.
    pub async fn connect(endpoint: &Endpoint) -> io::Result<Stream> {
        match endpoint {
            Endpoint::Tcp(addr) => Ok(Stream::Tcp(TcpStream::connect(addr).await?)),
            Endpoint::Unix(path) => Ok(Stream::Unix(UnixStream::connect(path).await?)),
        }
    }

    /// Splits into halves that can be used from different tasks (no lock between them).
    pub fn into_split(self) -> (ReadHalf, WriteHalf) {
        match self {
            Stream::Tcp(s) => {
                let _ = s.set_nodelay(true);
                let (r, w) = s.into_split();
                (ReadHalf::Tcp(r), WriteHalf::Tcp(w))
            }
            Stream::Unix(s) => {
                let (r, w) = s.into_split();
                (ReadHalf::Unix(r), WriteHalf::Unix(w))
            }
        }
    }
}

/// The reading half of a [`Stream`].
pub enum ReadHalf {
    /// TCP.
    Tcp(tcp::OwnedReadHalf),
    /// Unix-domain.
    Unix(unix::OwnedReadHalf),
}

/// The writing half of a [`Stream`] (dropping it shuts the connection down for writing).
pub enum WriteHalf {
    /// TCP.
    Tcp(tcp::OwnedWriteHalf),
    /// Unix-domain.
    Unix(unix::OwnedWriteHalf),
}

impl AsyncRead for ReadHalf {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ReadHalf::Tcp(r) => Pin::new(r).poll_read(cx, buf),
            ReadHalf::Unix(r) => Pin::new(r).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for WriteHalf {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            WriteHalf::Tcp(w) => Pin::new(w).poll_write(cx, buf),
            WriteHalf::Unix(w) => Pin::new(w).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            WriteHalf::Tcp(w) => Pin::new(w).poll_write_vectored(cx, bufs),
            WriteHalf::Unix(w) => Pin::new(w).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            WriteHalf::Tcp(w) => w.is_write_vectored(),
            WriteHalf::Unix(w) => w.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            WriteHalf::Tcp(w) => Pin::new(w).poll_flush(cx),
            WriteHalf::Unix(w) => Pin::new(w).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            WriteHalf::Tcp(w) => Pin::new(w).poll_shutdown(cx),
            WriteHalf::Unix(w) => Pin::new(w).poll_shutdown(cx),
        }
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    #[test]
    fn addresses_parse_as_tcp_or_unix_and_bad_ones_are_refused_with_the_reason() {
        assert_eq!(
            Endpoint::parse("127.0.0.1:7000").unwrap(),
            Endpoint::Tcp("127.0.0.1:7000".parse().unwrap())
        );
        assert_eq!(
            Endpoint::parse("unix:/run/upright/r0.sock").unwrap(),
            Endpoint::Unix(PathBuf::from("/run/upright/r0.sock"))
        );
        assert_eq!(Endpoint::parse("unix:/a/b.sock").unwrap().to_string(), "unix:/a/b.sock");
        let relative = Endpoint::parse("unix:r0.sock").unwrap_err();
        assert!(relative.contains("must be absolute"), "{relative}");
        let long = format!("unix:/{}", "x".repeat(UNIX_PATH_BYTES_MAX));
        assert!(Endpoint::parse(&long).unwrap_err().contains("at most 107 bytes"));
        assert!(Endpoint::parse("no-port").unwrap_err().contains("cannot resolve"));
    }

    #[tokio::test]
    async fn a_unix_listener_carries_bytes_and_removes_its_socket_when_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let at = Endpoint::Unix(dir.path().join("s.sock"));
        let listener = Listener::bind(&at).await.unwrap();
        assert_eq!(listener.local_endpoint().unwrap(), at);
        let (mut r, mut w) = Stream::connect(&at).await.unwrap().into_split();
        let (mut sr, mut sw) = listener.accept().await.unwrap().into_split();
        w.write_all(b"ping").await.unwrap();
        let mut buf = [0u8; 4];
        sr.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"ping");
        sw.write_all(b"pong").await.unwrap();
        r.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"pong");
        drop(listener);
        assert!(!dir.path().join("s.sock").exists());
    }

    #[tokio::test]
    async fn a_socket_left_by_a_dead_listener_is_replaced_and_a_live_one_or_a_file_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.sock");
        // What a killed process leaves: the socket file, nobody listening.
        drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
        assert!(path.exists());
        let at = Endpoint::Unix(path.clone());
        let live = Listener::bind(&at).await.expect("the stale socket is replaced");
        let e = Listener::bind(&at)
            .await
            .err()
            .expect("a live listener is not replaced");
        assert_eq!(e.kind(), io::ErrorKind::AddrInUse, "{e}");
        assert!(Stream::connect(&at).await.is_ok(), "the first listener still serves");
        drop(live);
        let file = dir.path().join("not-a-socket");
        std::fs::write(&file, b"data").unwrap();
        let e = Listener::bind(&Endpoint::Unix(file.clone())).await.err().unwrap();
        assert!(e.to_string().contains("is not a socket"), "{e}");
        assert_eq!(std::fs::read(&file).unwrap(), b"data", "left alone");
    }
}

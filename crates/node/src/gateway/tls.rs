//! A gateway's listener: TCP, and TLS (rustls) on every connection when the gateway is given a
//! certificate and its key (`--tls-cert FILE --tls-key FILE`, PEM). The handshake runs in the
//! connection's own task ([`Accepted::open`]), bounded by [`HANDSHAKE_TIMEOUT`], so a client that
//! connects and says nothing holds up nobody else. Either way a connection is read and written
//! through the boxed halves [`ReadHalf`] and [`WriteHalf`], so a gateway's protocol code does not
//! care which it got. Writers must flush after writing (TLS keeps a record until then).

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::{self, ServerConfig};
use tokio_rustls::TlsAcceptor;

use crate::files::FileError;

/// Time a client has to finish its TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The reading half of a gateway connection.
pub type ReadHalf = Box<dyn AsyncRead + Send + Unpin>;
/// The writing half of a gateway connection.
pub type WriteHalf = Box<dyn AsyncWrite + Send + Unpin>;

/// What a gateway presents to TLS clients: its certificate chain and private key.
#[derive(Clone)]
pub struct Tls(TlsAcceptor);

impl Tls {
    /// Loads the PEM certificate chain at `cert` (leaf first) and the PEM private key at `key`
    /// (PKCS#8, PKCS#1 or SEC1); TLS 1.2 and 1.3, no client certificates.
    pub fn load(cert: &Path, key: &Path) -> Result<Tls, FileError> {
        let bad =
            |what: &str, path: &Path, e: &dyn std::fmt::Display| FileError(format!("{what} {}: {e}", path.display()));
        let chain = CertificateDer::pem_file_iter(cert)
            .map_err(|e| bad("cannot read the TLS certificate", cert, &e))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| bad("cannot read the TLS certificate", cert, &e))?;
        if chain.is_empty() {
            return Err(FileError(format!(
                "{} holds no PEM certificate (-----BEGIN CERTIFICATE-----)",
                cert.display()
            )));
        }
        let key_der = PrivateKeyDer::from_pem_file(key).map_err(|e| bad("cannot read the TLS key", key, &e))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| FileError(format!("TLS: {e}")))?
            .with_no_client_auth()
            .with_single_cert(chain, key_der)
            .map_err(|e| {
                FileError(format!(
                    "TLS: {} and {} do not go together: {e}",
                    cert.display(),
                    key.display()
                ))
            })?;
        Ok(Tls(TlsAcceptor::from(Arc::new(config))))
    }
}

/// A gateway's listening socket, with TLS on its connections when configured.
pub struct GatewayListener {
    tcp: TcpListener,
    tls: Option<Tls>,
}

impl From<TcpListener> for GatewayListener {
    /// Plain TCP.
    fn from(tcp: TcpListener) -> GatewayListener {
        GatewayListener { tcp, tls: None }
    }
}

impl GatewayListener {
    /// `tcp`, with TLS on every connection if `tls` is given.
    pub fn new(tcp: TcpListener, tls: Option<Tls>) -> GatewayListener {
        GatewayListener { tcp, tls }
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.tcp.local_addr()
    }

    /// Whether its connections speak TLS.
    pub fn is_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// The next connection, not yet set up: call [`Accepted::open`] in its own task.
    pub async fn accept(&self) -> std::io::Result<Accepted> {
        let (stream, _) = self.tcp.accept().await?;
        Ok(Accepted {
            stream,
            tls: self.tls.as_ref().map(|t| t.0.clone()),
        })
    }
}

/// An accepted connection before its set-up.
pub struct Accepted {
    stream: TcpStream,
    tls: Option<TlsAcceptor>,
}

impl Accepted {
    /// Sets the connection up (no Nagle delay; the TLS handshake, if any, within
    /// [`HANDSHAKE_TIMEOUT`]) and splits it into its halves.
    pub async fn open(self) -> std::io::Result<(ReadHalf, WriteHalf)> {
        let _ = self.stream.set_nodelay(true);
        match self.tls {
            None => {
                let (read, write) = self.stream.into_split();
                Ok((Box::new(read), Box::new(write)))
            }
            Some(acceptor) => {
                let stream = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(self.stream))
                    .await
                    .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "TLS handshake timed out"))??;
                let (read, write) = tokio::io::split(stream);
                Ok((Box::new(read), Box::new(write)))
            }
        }
    }
}

//! The HTTP/1.1 pieces the DataNode and the WebHDFS gateway share (hyper underneath): a body type,
//! a body fed from a channel, a server loop with a bound on connections, and one request to a
//! peer over a connection of its own.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::{Frame, Incoming};
use hyper::header::{HeaderValue, CONTENT_TYPE, HOST};
use hyper::{Method, Request, Response};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, Semaphore};

/// Every body this crate sends.
pub type Body = BoxBody<Bytes, io::Error>;

/// Connections one server serves at once; more wait to be accepted.
pub const CONNECTIONS_MAX: usize = 1024;
/// How long connecting to a peer may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Chunks waiting in a channel body.
pub const CHANNEL_CHUNKS: usize = 16;

/// A body of these bytes.
pub fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into()).map_err(|never| match never {}).boxed()
}

/// An empty body.
pub fn empty() -> Body {
    Empty::new().map_err(|never| match never {}).boxed()
}

/// A body whose chunks come from a channel; an `Err` sent into it aborts the message (the peer
/// sees the connection end before the body did, never a short body that looks whole).
pub struct ChannelBody {
    rx: mpsc::Receiver<Result<Bytes, io::Error>>,
}

impl hyper::body::Body for ChannelBody {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        self.rx
            .poll_recv(cx)
            .map(|item| item.map(|chunk| chunk.map(Frame::data)))
    }
}

/// A channel and the body it feeds.
pub fn channel() -> (mpsc::Sender<Result<Bytes, io::Error>>, Body) {
    let (tx, rx) = mpsc::channel(CHANNEL_CHUNKS);
    (tx, ChannelBody { rx }.boxed())
}

/// Serves HTTP/1.1 on `listener` with `handle` until accepting fails; at most
/// [`CONNECTIONS_MAX`] connections at once.
pub async fn serve<H, F>(listener: TcpListener, handle: H) -> io::Result<()>
where
    H: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<Body>> + Send + 'static,
{
    let slots = Arc::new(Semaphore::new(CONNECTIONS_MAX));
    loop {
        let permit = slots.clone().acquire_owned().await.expect("never closed");
        let (stream, _) = match listener.accept().await {
            Ok(accepted) => accepted,
            // Out of file descriptors and the like: wait and go on rather than stop serving.
            Err(e) if is_transient(&e) => {
                tracing::warn!("accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
            Err(e) => return Err(e),
        };
        let _ = stream.set_nodelay(true);
        let handle = handle.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request| {
                let answer = handle(request);
                async move { Ok::<_, std::convert::Infallible>(answer.await) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
            drop(permit);
        });
    }
}

fn is_transient(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionAborted | io::ErrorKind::ConnectionReset | io::ErrorKind::Interrupted
    ) || matches!(e.raw_os_error(), Some(EMFILE | ENFILE))
}

/// Too many open files (of the process, of the system).
const EMFILE: i32 = 24;
const ENFILE: i32 = 23;

/// Sends `request` to `addr` (`host:port`) over a new connection.
async fn request_to(addr: &str, request: Request<Body>) -> io::Result<Response<Incoming>> {
    let stream = tokio::time::timeout(CONNECT_TIMEOUT, tokio::net::TcpStream::connect(addr))
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, format!("connecting to {addr} timed out")))??;
    let _ = stream.set_nodelay(true);
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(io::Error::other)?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    sender.send_request(request).await.map_err(io::Error::other)
}

/// Sends `method path` with `body` to `addr` (`host:port`, also the `Host` header) over a new
/// connection; the response (its body streams on while the caller reads it).
pub async fn send(addr: &str, method: Method, path: &str, body: Body) -> io::Result<Response<Incoming>> {
    let request = Request::builder()
        .method(method)
        .uri(path)
        .header(HOST, addr)
        .body(body)
        .map_err(io::Error::other)?;
    request_to(addr, request).await
}

/// A response with this JSON body.
pub fn json(value: &serde_json::Value) -> Response<Body> {
    let mut response = Response::new(full(value.to_string()));
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

/// The whole body of a response, refused past `limit` bytes.
pub async fn read_body(body: Incoming, limit: usize) -> io::Result<Bytes> {
    let limited = http_body_util::Limited::new(body, limit);
    limited
        .collect()
        .await
        .map(|c| c.to_bytes())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))
}

/// The next data chunk of a body (`None` at its end); trailers are skipped.
pub async fn next_chunk(body: &mut Incoming) -> io::Result<Option<Bytes>> {
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(io::Error::other)?;
        if let Ok(data) = frame.into_data() {
            if !data.is_empty() {
                return Ok(Some(data));
            }
        }
    }
    Ok(None)
}

/// The decoded query parameters of a request.
pub fn query(uri: &hyper::Uri) -> Vec<(String, String)> {
    uri.query()
        .map(|q| form_urlencoded::parse(q.as_bytes()).into_owned().collect())
        .unwrap_or_default()
}

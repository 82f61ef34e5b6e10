//! Connections: dialing with reconnect and backoff, accepting with a checked hello, reading frames
//! into the inbox, writing from a bounded queue.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncWriteExt, BufWriter};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, Semaphore};
use upright_core::crypto::KeyRing;
use upright_core::ids::{ClientId, Process};

use super::{read_frame, write_frame, Counters, FrameError, FrameReader, Hello, Inbox, HELLO_BYTES_MAX};

/// Most frames waiting to be written to one peer.
pub const OUTBOUND_QUEUE_MAX: usize = 4096;
/// Most queued frames written before one flush.
const WRITE_BATCH_FRAMES_MAX: usize = 1024;
/// Write buffer per connection: the frames queued since the last write go out in one system call.
const WRITE_BUFFER_BYTES: usize = 64 << 10;
/// Most simultaneous inbound connections per listener.
pub const CONNECTIONS_MAX: usize = 1024;
/// Time a new connection has to present its hello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(5);
const BACKOFF_MIN: Duration = Duration::from_millis(50);
const BACKOFF_MAX: Duration = Duration::from_secs(2);

type Frame = Arc<Vec<u8>>;

/// The sending end of one outbound connection (reconnects by itself).
#[derive(Clone)]
pub struct Dialer {
    tx: mpsc::Sender<Frame>,
    counters: Arc<Counters>,
}

impl Dialer {
    /// Queues a frame body; drops it (counted) if the queue is full.
    pub fn send(&self, frame: Frame) {
        if self.tx.try_send(frame).is_err() {
            self.counters.bump("net_dropped_outbound_full");
        }
    }

    /// Frames waiting.
    pub fn queue_depth(&self) -> usize {
        self.tx.max_capacity() - self.tx.capacity()
    }
}

/// Dials `addr` (and redials on failure) presenting `hello`. If `inbox` is given, frames read from
/// the connection are decoded and queued there as coming from `hello.to` (clients receive replies
/// this way); otherwise the connection is write-only.
pub fn dial(
    addr: SocketAddr,
    hello: Hello,
    inbox: Option<Arc<Inbox>>,
    max_frame: usize,
    counters: Arc<Counters>,
) -> Dialer {
    let (tx, rx) = mpsc::channel(OUTBOUND_QUEUE_MAX);
    tokio::spawn(run_dial(addr, hello, rx, inbox, max_frame, counters.clone()));
    Dialer { tx, counters }
}

async fn run_dial(
    addr: SocketAddr,
    hello: Hello,
    mut rx: mpsc::Receiver<Frame>,
    inbox: Option<Arc<Inbox>>,
    max_frame: usize,
    counters: Arc<Counters>,
) {
    let hello_bytes = upright_core::codec::to_bytes(&hello);
    let mut backoff = BACKOFF_MIN;
    loop {
        let stream = match TcpStream::connect(addr).await {
            Ok(stream) => stream,
            Err(_) => {
                counters.bump("net_connect_failures");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(BACKOFF_MAX);
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let (reader, writer) = stream.into_split();
        let mut writer = BufWriter::with_capacity(WRITE_BUFFER_BYTES, writer);
        if write_frame(&mut writer, &hello_bytes).await.is_err() || writer.flush().await.is_err() {
            tokio::time::sleep(backoff).await;
            continue;
        }
        backoff = BACKOFF_MIN;
        counters.bump("net_connects");
        let mut reading = match &inbox {
            Some(inbox) => tokio::spawn(read_loop(reader, hello.to, inbox.clone(), max_frame, counters.clone())),
            None => tokio::spawn(drain_until_closed(reader)),
        };
        loop {
            tokio::select! {
                frame = rx.recv() => {
                    let Some(frame) = frame else {
                        reading.abort();
                        return;
                    };
                    if write_batch(&mut writer, &frame, &mut rx).await.is_err() {
                        break;
                    }
                }
                _ = &mut reading => break,
            }
        }
        reading.abort();
        counters.bump("net_disconnects");
    }
}

/// Writes `first` and whatever else is already queued, then flushes once.
async fn write_batch(
    writer: &mut BufWriter<OwnedWriteHalf>,
    first: &[u8],
    rx: &mut mpsc::Receiver<Frame>,
) -> std::io::Result<()> {
    write_frame(writer, first).await?;
    for _ in 0..WRITE_BATCH_FRAMES_MAX {
        match rx.try_recv() {
            Ok(frame) => write_frame(writer, &frame).await?,
            Err(_) => break,
        }
    }
    writer.flush().await
}

/// For write-only connections: notices when the peer closes.
async fn drain_until_closed(mut reader: OwnedReadHalf) {
    use tokio::io::AsyncReadExt;
    let mut buf = [0u8; 256];
    while let Ok(n) = reader.read(&mut buf).await {
        if n == 0 {
            break;
        }
    }
}

/// Reads frames from `peer` until the connection fails or misbehaves. Every frame that one read
/// brought in is decoded and queued with one inbox operation.
async fn read_loop(reader: OwnedReadHalf, peer: Process, inbox: Arc<Inbox>, max_frame: usize, counters: Arc<Counters>) {
    let mut frames = FrameReader::new(reader, max_frame);
    let mut batch = Vec::new();
    loop {
        if frames.fill().await.is_err() {
            return;
        }
        let mut wrong_sender = 0;
        let closing = loop {
            match frames.next_frame() {
                Ok(Some(body)) => match upright_core::codec::decode(&body) {
                    Ok(envelope) if envelope.from.process() == peer => batch.push(Arc::new(envelope)),
                    Ok(_) => wrong_sender += 1,
                    Err(_) => break Some("net_closed_garbage"),
                },
                Ok(None) => break None,
                Err(FrameError::TooLong(_)) => break Some("net_closed_oversized"),
                Err(FrameError::Empty) => break Some("net_closed_garbage"),
                Err(FrameError::Io(_)) => break Some("net_closed_io"),
            }
        };
        if wrong_sender > 0 {
            counters.add("net_dropped_wrong_sender", wrong_sender);
        }
        if !batch.is_empty() {
            counters.add("net_frames_in", batch.len() as u64);
            inbox.push_many(peer, batch.drain(..));
        }
        if let Some(reason) = closing {
            counters.bump(reason);
            return;
        }
    }
}

/// Where replies to clients go: the latest connection of each client.
#[derive(Default)]
pub struct ClientRoutes {
    routes: Mutex<BTreeMap<ClientId, (u64, mpsc::Sender<Frame>)>>,
    generation: AtomicU64,
}

impl ClientRoutes {
    /// Queues a frame to `client`; returns false (and the caller counts) if it is not connected
    /// or its queue is full.
    pub fn send(&self, client: ClientId, frame: Frame) -> bool {
        let routes = self.routes.lock().expect("routes lock");
        match routes.get(&client) {
            Some((_, tx)) => tx.try_send(frame).is_ok(),
            None => false,
        }
    }

    fn register(&self, client: ClientId, tx: mpsc::Sender<Frame>) -> u64 {
        let generation = self.generation.fetch_add(1, Ordering::Relaxed);
        self.routes
            .lock()
            .expect("routes lock")
            .insert(client, (generation, tx));
        generation
    }

    fn unregister(&self, client: ClientId, generation: u64) {
        let mut routes = self.routes.lock().expect("routes lock");
        if routes.get(&client).is_some_and(|(g, _)| *g == generation) {
            routes.remove(&client);
        }
    }
}

/// Accepts connections on `listener`. A connection must present a valid hello from a process
/// `admit` accepts; its envelopes then go to `inbox`. With `routes`, the connection also carries
/// frames back to the (client) peer.
#[allow(clippy::too_many_arguments)] // the listener's whole context, passed once at start-up
pub async fn serve(
    listener: TcpListener,
    keys: Arc<KeyRing>,
    cluster_name: String,
    admit: fn(Process) -> bool,
    inbox: Arc<Inbox>,
    routes: Option<Arc<ClientRoutes>>,
    max_frame: usize,
    counters: Arc<Counters>,
) {
    let slots = Arc::new(Semaphore::new(CONNECTIONS_MAX));
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            counters.bump("net_refused_too_many_connections");
            continue;
        };
        let (keys, name, inbox, routes, counters) = (
            keys.clone(),
            cluster_name.clone(),
            inbox.clone(),
            routes.clone(),
            counters.clone(),
        );
        tokio::spawn(async move {
            let _permit = permit;
            accept_one(stream, &keys, &name, admit, inbox, routes, max_frame, counters).await;
        });
    }
}

#[allow(clippy::too_many_arguments)]
async fn accept_one(
    stream: TcpStream,
    keys: &KeyRing,
    cluster_name: &str,
    admit: fn(Process) -> bool,
    inbox: Arc<Inbox>,
    routes: Option<Arc<ClientRoutes>>,
    max_frame: usize,
    counters: Arc<Counters>,
) {
    let _ = stream.set_nodelay(true);
    let (mut reader, writer) = stream.into_split();
    let hello = match tokio::time::timeout(HELLO_TIMEOUT, read_frame(&mut reader, HELLO_BYTES_MAX)).await {
        Ok(Ok(body)) => upright_core::codec::from_bytes::<Hello>(&body).ok(),
        _ => None,
    };
    let Some(hello) = hello else {
        counters.bump("net_closed_bad_hello");
        return;
    };
    if let Err(reason) = hello.check(keys, cluster_name) {
        counters.bump(reason);
        return;
    }
    if !admit(hello.from) {
        counters.bump("net_closed_wrong_listener");
        return;
    }
    let peer = hello.from;
    let registered = match (&routes, peer) {
        (Some(routes), Process::Client(client)) => {
            let (tx, rx) = mpsc::channel(OUTBOUND_QUEUE_MAX);
            let generation = routes.register(client, tx);
            tokio::spawn(write_loop(writer, rx));
            Some((routes.clone(), client, generation))
        }
        _ => None,
    };
    read_loop(reader, peer, inbox, max_frame, counters).await;
    if let Some((routes, client, generation)) = registered {
        routes.unregister(client, generation);
    }
}

async fn write_loop(writer: OwnedWriteHalf, mut rx: mpsc::Receiver<Frame>) {
    let mut writer = BufWriter::with_capacity(WRITE_BUFFER_BYTES, writer);
    while let Some(frame) = rx.recv().await {
        if write_batch(&mut writer, &frame, &mut rx).await.is_err() {
            return;
        }
    }
}

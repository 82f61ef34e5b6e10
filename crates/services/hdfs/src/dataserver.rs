//! The DataNode process (`upright datanode`, docs/HDFS.md): a [`BlockStore`] served over HTTP to
//! writers, readers and other DataNodes, and an upright client of the NameNode cluster that
//! registers, reports every replica it finalizes, heartbeats and does what the heartbeat's answer
//! asks (copy a block to another DataNode, delete replicas), and scans its replicas in the
//! background, reporting and dropping any whose bytes no longer match their hashes.
//!
//! Its HTTP interface (used by the WebHDFS gateway and by other DataNodes copying blocks):
//!
//! - `PUT /block/<id>`: the body is the block's bytes; the replica is synced and made visible,
//!   reported to the NameNode, and the answer is `{"block":..,"length":..,"hash":"<hex>"}`.
//! - `GET /block/<id>/hashes`: the replica's length (8 bytes, little-endian) and its sub-block
//!   hashes (32 bytes each), which a reader checks against the hash the NameNode committed.
//! - `GET /block/<id>?offset=O&length=L`: bytes of the replica, checked against its sub-block
//!   hashes as they are read (a corrupt replica answers 500 and is reported and dropped).

use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use bytes::Bytes;
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use tokio::net::TcpListener;
use tokio::sync::Mutex;

use crate::block::SUB_BLOCK_BYTES;
use crate::client::NameNodeClient;
use crate::datanode::{BlockStore, StoreError};
use crate::http::{self, Body};
use crate::namenode::{Answer, BlockReport, Command, DataNodeCommand, HdfsError};

/// How often a DataNode heartbeats (HDFS: `dfs.heartbeat.interval`, 3 s).
pub const HEARTBEAT_INTERVAL: Duration = Duration::from_secs(3);
/// How often the background scan reads every replica (HDFS scans over weeks; ours are small).
pub const SCAN_INTERVAL_DEFAULT: Duration = Duration::from_secs(600);
/// Bytes read from disk per piece of a read's answer.
pub const READ_PIECE_BYTES: u64 = 16 * SUB_BLOCK_BYTES as u64;
/// Reports of finalized replicas waiting for the NameNode (resent each heartbeat until taken).
pub const UNREPORTED_MAX: usize = 100_000;

/// How a DataNode runs.
#[derive(Clone, Debug)]
pub struct DataNodeConfig {
    /// Its id: the id of its upright client.
    pub id: u32,
    /// The `host:port` readers, writers and other DataNodes reach it on.
    pub advertise: String,
    /// Where its replicas live.
    pub dir: PathBuf,
    /// Bytes it offers.
    pub capacity: u64,
    /// How often it reads all its replicas to find corrupt ones.
    pub scan_interval: Duration,
    /// Testing only: the first replica it stores gets one bit flipped on disk after it is
    /// reported, and reads are served without checking, so a reader gets the flipped bit (a
    /// faulty disk behind a DataNode that does not check: what the gateway's own check is for).
    pub flip_first_block: bool,
}

struct DataNode {
    config: DataNodeConfig,
    store: RwLock<BlockStore>,
    namenode: NameNodeClient,
    /// Finalized replicas the NameNode has not taken yet.
    unreported: Mutex<Vec<BlockReport>>,
    /// The testing fault has been done.
    flipped: std::sync::atomic::AtomicBool,
}

/// Opens the store in `config.dir`, registers with the NameNode cluster (waiting for it),
/// reports every stored replica, and serves on `listener` until it fails.
pub async fn run(listener: TcpListener, namenode: NameNodeClient, config: DataNodeConfig) -> std::io::Result<()> {
    let store = BlockStore::open(&config.dir).map_err(std::io::Error::other)?;
    let stored = store.reports();
    let node = Arc::new(DataNode {
        config,
        store: RwLock::new(store),
        namenode,
        unreported: Mutex::new(stored),
        flipped: std::sync::atomic::AtomicBool::new(false),
    });
    node.register().await;
    node.report_unreported().await;
    tokio::spawn(node.clone().heartbeats());
    tokio::spawn(node.clone().scans());
    let handler = node.clone();
    http::serve(listener, move |request| {
        let node = handler.clone();
        async move { node.handle(request).await }
    })
    .await
}

fn status(code: StatusCode, text: impl Into<String>) -> Response<Body> {
    let mut response = Response::new(http::full(text.into()));
    *response.status_mut() = code;
    response
}

/// Keeps a report for the next heartbeat, up to [`UNREPORTED_MAX`].
fn keep_unreported(unreported: &mut Vec<BlockReport>, report: BlockReport) {
    if unreported.len() < UNREPORTED_MAX {
        unreported.push(report);
    }
}

/// `/block/<id>` and what follows it.
fn block_path(path: &str) -> Option<(u64, &str)> {
    let rest = path.strip_prefix("/block/")?;
    let (id, tail) = rest.split_once('/').map_or((rest, ""), |(a, b)| (a, b));
    Some((id.parse().ok()?, tail))
}

impl DataNode {
    fn id(&self) -> u32 {
        self.config.id
    }

    async fn register(&self) {
        let command = Command::RegisterDataNode {
            id: self.id(),
            addr: self.config.advertise.clone(),
            capacity: self.config.capacity,
        };
        let mut warned = false;
        loop {
            match self.namenode.call(&command).await {
                Ok(Answer::Ok) => {
                    tracing::info!(id = self.id(), addr = %self.config.advertise, "registered with the NameNode");
                    return;
                }
                Ok(other) => {
                    if !warned {
                        tracing::warn!("the NameNode refused the registration: {other:?}; retrying");
                    }
                }
                Err(e) => {
                    if !warned {
                        tracing::warn!("cannot register with the NameNode yet ({e}); retrying");
                    }
                }
            }
            warned = true;
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }

    /// Sends the reports waiting; those the NameNode does not take stay for the next heartbeat.
    async fn report_unreported(&self) {
        let waiting = std::mem::take(&mut *self.unreported.lock().await);
        let mut left = Vec::new();
        for report in waiting {
            let command = Command::BlockReceived { id: self.id(), report };
            match self.namenode.call(&command).await {
                Ok(Answer::Ok) => {}
                Ok(Answer::Error(HdfsError::UnknownDataNode(_))) | Err(_) => left.push(report),
                Ok(other) => tracing::warn!(block = report.block, "the NameNode refused a replica report: {other:?}"),
            }
        }
        let mut unreported = self.unreported.lock().await;
        for report in left {
            keep_unreported(&mut unreported, report);
        }
    }

    async fn report(&self, report: BlockReport) {
        let command = Command::BlockReceived { id: self.id(), report };
        match self.namenode.call(&command).await {
            Ok(Answer::Ok) => {}
            other => {
                tracing::warn!(
                    block = report.block,
                    "replica report not taken ({other:?}); resent with the next heartbeat"
                );
                keep_unreported(&mut *self.unreported.lock().await, report);
            }
        }
    }

    async fn heartbeats(self: Arc<Self>) {
        loop {
            tokio::time::sleep(HEARTBEAT_INTERVAL).await;
            let used = self.store.read().unwrap_or_else(|e| e.into_inner()).used();
            match self.namenode.call(&Command::Heartbeat { id: self.id(), used }).await {
                Ok(Answer::Commands(commands)) => {
                    for command in commands {
                        self.clone().obey(command);
                    }
                }
                // The NameNode does not know this DataNode (a new namespace): join again and
                // report every replica.
                Ok(Answer::Error(HdfsError::UnknownDataNode(_))) => {
                    self.register().await;
                    let all = self.store.read().unwrap_or_else(|e| e.into_inner()).reports();
                    *self.unreported.lock().await = all;
                }
                Ok(other) => tracing::warn!("unexpected heartbeat answer: {other:?}"),
                Err(e) => tracing::warn!("heartbeat: {e}"),
            }
            self.report_unreported().await;
        }
    }

    fn obey(self: Arc<Self>, command: DataNodeCommand) {
        match command {
            DataNodeCommand::Delete { blocks } => {
                let mut store = self.store.write().unwrap_or_else(|e| e.into_inner());
                for block in blocks {
                    if let Err(e) = store.delete(block) {
                        tracing::warn!(block, "cannot delete a replica: {e}");
                    }
                }
            }
            DataNodeCommand::Copy { report, target } => {
                tokio::spawn(async move {
                    if let Err(e) = self.copy(report, &target.addr).await {
                        tracing::warn!(block = report.block, target = %target.addr, "copy failed: {e}");
                    }
                });
            }
        }
    }

    /// Sends the replica of `report.block` to the DataNode at `target`, checked as it is read.
    async fn copy(&self, report: BlockReport, target: &str) -> std::io::Result<()> {
        let matches = {
            let store = self.store.read().unwrap_or_else(|e| e.into_inner());
            store.meta(report.block).map(|m| (m.len, m.hash)) == Some((report.len, report.hash))
        };
        if !matches {
            return Err(std::io::Error::other("the replica here is not the committed one"));
        }
        let (tx, body) = http::channel();
        let path = format!("/block/{}", report.block);
        let sending = http::send(target, Method::PUT, &path, body);
        let reading = async move {
            let mut offset = 0;
            while offset < report.len {
                let len = READ_PIECE_BYTES.min(report.len - offset);
                let piece = self.read_piece(report.block, offset, len);
                let piece = match piece {
                    Ok(piece) => Ok(Bytes::from(piece)),
                    Err(e) => {
                        self.corrupt_here(report.block, &e).await;
                        Err(std::io::Error::other(e.to_string()))
                    }
                };
                let failed = piece.is_err();
                if tx.send(piece).await.is_err() || failed {
                    return;
                }
                offset += len;
            }
        };
        let (response, ()) = tokio::join!(sending, reading);
        let response = response?;
        if !response.status().is_success() {
            return Err(std::io::Error::other(format!(
                "the target answered {}",
                response.status()
            )));
        }
        tracing::info!(block = report.block, target, "copied a replica");
        Ok(())
    }

    fn read_piece(&self, block: u64, offset: u64, len: u64) -> Result<Vec<u8>, StoreError> {
        tokio::task::block_in_place(|| {
            let store = self.store.read().unwrap_or_else(|e| e.into_inner());
            if self.config.flip_first_block {
                store.read_unchecked(block, offset, len)
            } else {
                store.read(block, offset, len)
            }
        })
    }

    /// A replica here does not match its hashes: report it and drop it.
    async fn corrupt_here(&self, block: u64, error: &StoreError) {
        if !matches!(error, StoreError::Corrupt { .. }) {
            return;
        }
        tracing::warn!(block, "{error}: reporting and dropping the replica");
        let _ = self
            .namenode
            .call(&Command::BadReplica {
                block,
                datanode: self.id(),
            })
            .await;
        let _ = self.store.write().unwrap_or_else(|e| e.into_inner()).delete(block);
    }

    async fn scans(self: Arc<Self>) {
        loop {
            tokio::time::sleep(self.config.scan_interval).await;
            if self.config.flip_first_block {
                continue; // the faulty DataNode of the tests does not look
            }
            self.scan().await;
        }
    }

    /// Reads every replica, a piece at a time (the store's lock is held for one piece only, so
    /// writes and reads go on meanwhile), reporting and dropping those that do not match their
    /// hashes; how many it found.
    async fn scan(&self) -> usize {
        let blocks: Vec<(u64, u64)> = {
            let store = self.store.read().unwrap_or_else(|e| e.into_inner());
            store.reports().iter().map(|r| (r.block, r.len)).collect()
        };
        let mut bad = 0;
        for (block, len) in blocks {
            let mut offset = 0;
            while offset < len {
                let n = READ_PIECE_BYTES.min(len - offset);
                match self.read_piece(block, offset, n) {
                    Ok(_) => offset += n,
                    Err(e @ StoreError::Corrupt { .. }) => {
                        self.corrupt_here(block, &e).await;
                        bad += 1;
                        break;
                    }
                    Err(_) => break, // deleted or replaced meanwhile
                }
                tokio::task::yield_now().await;
            }
        }
        bad
    }

    async fn handle(self: Arc<Self>, request: Request<Incoming>) -> Response<Body> {
        let path = request.uri().path().to_string();
        let Some((block, tail)) = block_path(&path) else {
            return status(StatusCode::NOT_FOUND, "DataNode paths are /block/<id>[/hashes]\n");
        };
        match (request.method().clone(), tail) {
            (Method::PUT, "") => self.receive(block, request.into_body()).await,
            (Method::GET, "hashes") => self.hashes(block),
            (Method::GET, "") => {
                let query = http::query(request.uri());
                let number = |name: &str| {
                    query
                        .iter()
                        .find(|(k, _)| k == name)
                        .and_then(|(_, v)| v.parse::<u64>().ok())
                };
                self.serve_read(block, number("offset").unwrap_or(0), number("length"))
            }
            _ => status(StatusCode::METHOD_NOT_ALLOWED, "PUT or GET\n"),
        }
    }

    async fn receive(&self, block: u64, mut body: Incoming) -> Response<Body> {
        let writer = self.store.read().unwrap_or_else(|e| e.into_inner()).writer(block);
        let mut writer = match writer {
            Ok(w) => w,
            Err(e) => return status(StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")),
        };
        loop {
            match http::next_chunk(&mut body).await {
                // Into the page cache (the writer starts writing back every 8 MiB); the sync at
                // the end is the part that waits for the disk.
                Ok(Some(chunk)) => {
                    if let Err(e) = writer.write(&chunk) {
                        return status(StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n"));
                    }
                }
                Ok(None) => break,
                // The writer went away mid-block: nothing is kept (the temporary file goes at the
                // next start, or is replaced by the next write of this block).
                Err(e) => {
                    return status(
                        StatusCode::BAD_REQUEST,
                        format!("the block's bytes did not all arrive: {e}\n"),
                    )
                }
            }
        }
        let sealed = match tokio::task::spawn_blocking(move || writer.seal()).await {
            Ok(sealed) => sealed,
            Err(e) => return status(StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")),
        };
        let report = sealed.and_then(|sealed| {
            let mut store = self.store.write().unwrap_or_else(|e| e.into_inner());
            sealed.commit(&mut store)
        });
        let report = match report {
            Ok(r) => r,
            Err(e) => return status(StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")),
        };
        // The NameNode counts the replica before the writer hears of it, so the writer's commit
        // finds it.
        self.report(report).await;
        if self.config.flip_first_block
            && report.len > 0
            && !self.flipped.swap(true, std::sync::atomic::Ordering::SeqCst)
        {
            let store = self.store.read().unwrap_or_else(|e| e.into_inner());
            match crate::datanode::flip_stored_bit(&store, block, report.len / 2) {
                Ok(()) => tracing::warn!(block, "TESTING: flipped a bit of this replica on disk"),
                Err(e) => tracing::warn!(block, "TESTING: could not flip a bit: {e}"),
            }
        }
        http::json(&serde_json::json!({
            "block": report.block,
            "length": report.len,
            "hash": hex::encode(report.hash),
        }))
    }

    fn hashes(&self, block: u64) -> Response<Body> {
        let store = self.store.read().unwrap_or_else(|e| e.into_inner());
        let Some(meta) = store.meta(block) else {
            return status(StatusCode::NOT_FOUND, format!("no replica of block {block} here\n"));
        };
        let mut out = Vec::with_capacity(8 + 32 * meta.subs.len());
        out.extend_from_slice(&meta.len.to_le_bytes());
        for sub in &meta.subs {
            out.extend_from_slice(sub);
        }
        Response::new(http::full(out))
    }

    fn serve_read(self: Arc<Self>, block: u64, offset: u64, length: Option<u64>) -> Response<Body> {
        let len = {
            let store = self.store.read().unwrap_or_else(|e| e.into_inner());
            match store.meta(block) {
                Some(meta) => meta.len,
                None => return status(StatusCode::NOT_FOUND, format!("no replica of block {block} here\n")),
            }
        };
        if offset > len {
            return status(
                StatusCode::RANGE_NOT_SATISFIABLE,
                format!("offset {offset} is past the block's {len} bytes\n"),
            );
        }
        let end = length.map_or(len, |l| offset.saturating_add(l).min(len));
        // The first piece is read before answering, so a replica found corrupt at once answers
        // 500 instead of a body that breaks off.
        let first_len = READ_PIECE_BYTES.min(end - offset);
        let first = match self.read_piece(block, offset, first_len) {
            Ok(bytes) => bytes,
            Err(e) => {
                let node = self.clone();
                let text = e.to_string();
                tokio::spawn(async move { node.corrupt_here(block, &e).await });
                return status(StatusCode::INTERNAL_SERVER_ERROR, format!("{text}\n"));
            }
        };
        let (tx, body) = http::channel();
        tokio::spawn(async move {
            if tx.send(Ok(Bytes::from(first))).await.is_err() {
                return;
            }
            let mut at = offset + first_len;
            while at < end {
                let n = READ_PIECE_BYTES.min(end - at);
                match self.read_piece(block, at, n) {
                    Ok(bytes) => {
                        if tx.send(Ok(Bytes::from(bytes))).await.is_err() {
                            return;
                        }
                    }
                    Err(e) => {
                        let _ = tx.send(Err(std::io::Error::other(e.to_string()))).await;
                        self.corrupt_here(block, &e).await;
                        return;
                    }
                }
                at += n;
            }
        });
        let mut response = Response::new(body);
        response.headers_mut().insert(
            hyper::header::CONTENT_LENGTH,
            hyper::header::HeaderValue::from(end - offset),
        );
        response
    }
}

#[cfg(test)]
mod tests {
    use super::block_path;

    #[test]
    fn block_paths_parse() {
        assert_eq!(block_path("/block/17"), Some((17, "")));
        assert_eq!(block_path("/block/17/hashes"), Some((17, "hashes")));
        assert_eq!(block_path("/block/x"), None);
        assert_eq!(block_path("/other/17"), None);
    }
}

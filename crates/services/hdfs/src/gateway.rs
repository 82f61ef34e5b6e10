//! The WebHDFS gateway (`upright hdfs`, docs/HDFS.md): HDFS's REST API under `/webhdfs/v1/`,
//! served as an upright client of the NameNode cluster.
//!
//! Metadata operations are NameNode commands. CREATE and APPEND answer their first request with
//! a 307 to the same URL plus `data=true` (WebHDFS's two-step write; the gateway itself takes
//! the data), then stream the body into blocks: each block is sent to the DataNodes the NameNode
//! chose while the gateway hashes it, and committed with the gateway's own length and hash, which
//! a DataNode's report must match. OPEN fetches a DataNode's sub-block hashes, checks them
//! against the committed block hash, checks every 64 KiB as it arrives, and on a mismatch
//! reports the replica and goes on from the same sub-block at another DataNode: a client never
//! gets a byte the writer did not write (a read that cannot be completed breaks off).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONTENT_LENGTH, CONTENT_TYPE, HOST, LOCATION};
use hyper::{Method, Request, Response, StatusCode};
use md5::{Digest, Md5};
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio::sync::mpsc;

use crate::block::{self, BlockHasher, SUB_BLOCK_BYTES};
use crate::client::{CallError, NameNodeClient, CALL_TIMEOUT};
use crate::http::{self, Body};
use crate::namenode::{
    Answer, BlockReport, Command, ContentSummary, DataNodeAddr, FileStatus, Hash, HdfsError, LocatedBlock,
    BLOCK_SIZE_DEFAULT, BLOCK_SIZE_MAX, BLOCK_SIZE_MIN,
};

/// Where WebHDFS lives.
pub const PREFIX: &str = "/webhdfs/v1";
/// The user of a request without `user.name` (Hadoop's static web user).
pub const DEFAULT_USER: &str = "dr.who";
/// Bytes per checksum of GETFILECHECKSUM (HDFS's `dfs.bytes-per-checksum`).
pub const BYTES_PER_CRC: usize = 512;
/// Most entries one LISTSTATUS answer gathers (a directory holds at most a million).
pub const LISTING_MAX: usize = 1 << 20;
/// Largest sub-block hash list a DataNode may send (a block of [`BLOCK_SIZE_MAX`]).
const HASHES_BYTES_MAX: usize = 8 + 32 * (BLOCK_SIZE_MAX as usize / SUB_BLOCK_BYTES + 1);

/// A failure as WebHDFS reports it: a status and a `RemoteException`.
#[derive(Debug)]
pub enum WebError {
    /// The NameNode's answer.
    Hdfs(HdfsError),
    /// A bad parameter (400, IllegalArgumentException).
    BadRequest(String),
    /// Something else that failed (403, IOException, as WebHDFS reports IOExceptions).
    Io(String),
    /// The NameNode cluster did not answer (500).
    Unavailable(String),
}

impl From<CallError> for WebError {
    fn from(e: CallError) -> WebError {
        WebError::Unavailable(e.to_string())
    }
}

impl WebError {
    /// The Java exception, its class, the message and the status.
    fn parts(&self) -> (&'static str, &'static str, String, StatusCode) {
        match self {
            WebError::Hdfs(e) => {
                let exception = e.exception();
                let status = match exception {
                    "FileNotFoundException" => StatusCode::NOT_FOUND,
                    "IllegalArgumentException" => StatusCode::BAD_REQUEST,
                    _ => StatusCode::FORBIDDEN,
                };
                (exception, java_class(exception), e.to_string(), status)
            }
            WebError::BadRequest(m) => (
                "IllegalArgumentException",
                "java.lang.IllegalArgumentException",
                m.clone(),
                StatusCode::BAD_REQUEST,
            ),
            WebError::Io(m) => ("IOException", "java.io.IOException", m.clone(), StatusCode::FORBIDDEN),
            WebError::Unavailable(m) => (
                "IOException",
                "java.io.IOException",
                m.clone(),
                StatusCode::INTERNAL_SERVER_ERROR,
            ),
        }
    }

    /// The response WebHDFS sends for it.
    pub fn response(&self) -> Response<Body> {
        let (exception, class, message, status) = self.parts();
        let body = json!({"RemoteException": {"exception": exception, "javaClassName": class, "message": message}});
        let mut response = http::json(&body);
        *response.status_mut() = status;
        response
    }
}

/// The Java class of an exception WebHDFS names (Hadoop's client re-creates it by class).
fn java_class(exception: &str) -> &'static str {
    match exception {
        "FileNotFoundException" => "java.io.FileNotFoundException",
        "FileAlreadyExistsException" => "org.apache.hadoop.fs.FileAlreadyExistsException",
        "ParentNotDirectoryException" => "org.apache.hadoop.fs.ParentNotDirectoryException",
        "PathIsNotEmptyDirectoryException" => "org.apache.hadoop.fs.PathIsNotEmptyDirectoryException",
        "AlreadyBeingCreatedException" => "org.apache.hadoop.hdfs.protocol.AlreadyBeingCreatedException",
        "LeaseExpiredException" => "org.apache.hadoop.hdfs.server.namenode.LeaseExpiredException",
        "IllegalArgumentException" => "java.lang.IllegalArgumentException",
        _ => "java.io.IOException",
    }
}

type Result<T> = std::result::Result<T, WebError>;

/// A request's query parameters.
struct Params(Vec<(String, String)>);

impl Params {
    fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .rev()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    fn flag(&self, name: &str) -> Result<Option<bool>> {
        match self.get(name) {
            None | Some("") => Ok(None),
            Some(v) if v.eq_ignore_ascii_case("true") => Ok(Some(true)),
            Some(v) if v.eq_ignore_ascii_case("false") => Ok(Some(false)),
            Some(v) => Err(WebError::BadRequest(format!(
                "Invalid value for webhdfs parameter \"{name}\": {v} is not true or false"
            ))),
        }
    }

    fn number<T: std::str::FromStr>(&self, name: &str) -> Result<Option<T>> {
        match self.get(name) {
            None | Some("") => Ok(None),
            Some(v) => v
                .parse()
                .map(Some)
                .map_err(|_| WebError::BadRequest(format!("Invalid value for webhdfs parameter \"{name}\": {v}"))),
        }
    }

    fn permission(&self) -> Result<Option<u16>> {
        match self.get("permission") {
            None | Some("") => Ok(None),
            Some(v) => u16::from_str_radix(v, 8)
                .ok()
                .filter(|p| *p <= 0o1777)
                .map(Some)
                .ok_or_else(|| {
                    WebError::BadRequest(format!(
                        "Invalid value for webhdfs parameter \"permission\": {v} is not an octal permission up to 1777"
                    ))
                }),
        }
    }

    fn required(&self, name: &str) -> Result<&str> {
        self.get(name)
            .filter(|v| !v.is_empty())
            .ok_or_else(|| WebError::BadRequest(format!("Required param {name} for op is null or empty")))
    }
}

/// The gateway.
struct Gateway {
    namenode: NameNodeClient,
    /// Lease holders are this plus a number: unique across restarts of the gateway.
    holder_prefix: String,
    next_holder: AtomicU64,
    /// Spreads reads over a block's DataNodes.
    next_read: AtomicU64,
}

/// Serves WebHDFS on `listener` through `namenode` until accepting fails.
pub async fn serve(listener: TcpListener, namenode: NameNodeClient) -> std::io::Result<()> {
    let nonce = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
        ^ u64::from(std::process::id()).rotate_left(32);
    let gateway = Arc::new(Gateway {
        holder_prefix: format!("webhdfs-{}-{nonce:016x}", namenode.name()),
        namenode,
        next_holder: AtomicU64::new(0),
        next_read: AtomicU64::new(0),
    });
    http::serve(listener, move |request| {
        let gateway = gateway.clone();
        async move {
            match gateway.dispatch(request).await {
                Ok(response) => response,
                Err(e) => e.response(),
            }
        }
    })
    .await
}

/// The HDFS path of a request path (`/webhdfs/v1/a%20b` is `/a b`).
fn hdfs_path(uri_path: &str) -> Result<String> {
    let rest = uri_path
        .strip_prefix(PREFIX)
        .filter(|r| r.is_empty() || r.starts_with('/'))
        .ok_or_else(|| WebError::BadRequest(format!("{uri_path} is not under {PREFIX}/")))?;
    let decoded = percent_encoding::percent_decode_str(rest)
        .decode_utf8()
        .map_err(|_| WebError::BadRequest("the path is not UTF-8".into()))?;
    let trimmed = decoded.trim_end_matches('/');
    Ok(if trimmed.is_empty() {
        "/".to_string()
    } else {
        trimmed.to_string()
    })
}

fn permission_text(p: u16) -> String {
    format!("{p:o}")
}

fn status_json(s: &FileStatus) -> Value {
    json!({
        "accessTime": s.access_time,
        "blockSize": s.block_size,
        "childrenNum": s.children,
        "fileId": s.file_id,
        "group": s.group,
        "length": s.length,
        "modificationTime": s.modification_time,
        "owner": s.owner,
        "pathSuffix": s.path_suffix,
        "permission": permission_text(s.permission),
        "replication": s.replication,
        "storagePolicy": 0,
        "type": if s.is_dir { "DIRECTORY" } else { "FILE" },
    })
}

fn summary_json(s: &ContentSummary) -> Value {
    json!({"ContentSummary": {
        "directoryCount": s.directories,
        "fileCount": s.files,
        "length": s.length,
        "quota": -1,
        "spaceConsumed": s.space_consumed,
        "spaceQuota": -1,
    }})
}

fn unexpected(answer: Answer) -> WebError {
    match answer {
        Answer::Error(e) => WebError::Hdfs(e),
        other => WebError::Io(format!("unexpected NameNode answer {other:?}")),
    }
}

/// One block being written: its DataNodes' PUTs in flight and the hash so far.
struct OpenBlock {
    located: LocatedBlock,
    hasher: BlockHasher,
    sinks: Vec<Sink>,
}

struct Sink {
    datanode: DataNodeAddr,
    tx: Option<mpsc::Sender<std::result::Result<Bytes, std::io::Error>>>,
    done: tokio::task::JoinHandle<std::result::Result<(u64, Hash), String>>,
}

/// A read stopped because its client went away.
const CLIENT_GONE: &str = "the client went away";

/// Why one DataNode's read of a block stopped.
enum ReadFail {
    /// Its bytes or hashes do not match what the NameNode committed.
    Corrupt(String),
    /// It could not be reached or broke off.
    Io(String),
    /// The client went away: stop.
    ClientGone,
}

impl Gateway {
    async fn call(&self, command: Command) -> Result<Answer> {
        Ok(self.namenode.call(&command).await?)
    }

    async fn dispatch(self: Arc<Self>, request: Request<Incoming>) -> Result<Response<Body>> {
        let path = hdfs_path(request.uri().path())?;
        let params = Params(http::query(request.uri()));
        let op = params
            .get("op")
            .ok_or_else(|| WebError::BadRequest("Required param op for op is null or empty".into()))?
            .to_ascii_uppercase();
        let user = params.get("user.name").unwrap_or(DEFAULT_USER).to_string();
        let method = request.method().clone();
        match (method, op.as_str()) {
            (Method::GET, "OPEN") => {
                let offset = params.number::<u64>("offset")?.unwrap_or(0);
                let length = params.number::<u64>("length")?;
                self.open(&path, offset, length).await
            }
            (Method::GET, "GETFILESTATUS") => match self.call(Command::GetFileStatus { path }).await? {
                Answer::Status(s) => Ok(http::json(&json!({"FileStatus": status_json(&s)}))),
                other => Err(unexpected(other)),
            },
            (Method::GET, "LISTSTATUS") => {
                let entries = self.list_all(&path).await?;
                let list: Vec<Value> = entries.iter().map(status_json).collect();
                Ok(http::json(&json!({"FileStatuses": {"FileStatus": list}})))
            }
            (Method::GET, "LISTSTATUS_BATCH") => {
                let after = params.get("startAfter").filter(|s| !s.is_empty()).map(str::to_string);
                match self.call(Command::ListStatus { path, after }).await? {
                    Answer::Listing { entries, remaining } => {
                        let list: Vec<Value> = entries.iter().map(status_json).collect();
                        Ok(http::json(&json!({"DirectoryListing": {
                            "partialListing": {"FileStatuses": {"FileStatus": list}},
                            "remainingEntries": remaining,
                        }})))
                    }
                    other => Err(unexpected(other)),
                }
            }
            (Method::GET, "GETCONTENTSUMMARY") => match self.call(Command::GetContentSummary { path }).await? {
                Answer::Summary(s) => Ok(http::json(&summary_json(&s))),
                other => Err(unexpected(other)),
            },
            (Method::GET, "GETFILECHECKSUM") => self.checksum(&path).await,
            (Method::GET, "GETHOMEDIRECTORY") => Ok(http::json(&json!({"Path": format!("/user/{user}")}))),
            (Method::GET, "GETTRASHROOT") => Ok(http::json(&json!({"Path": format!("/user/{user}/.Trash")}))),
            // What Hadoop's client asks before deleting (trash) and writing: HDFS's defaults,
            // with the trash off (a delete deletes) and CRC32C checksums (id 2) per 512 bytes.
            (Method::GET, "GETSERVERDEFAULTS") => Ok(http::json(&json!({"FsServerDefaults": {
                "blockSize": BLOCK_SIZE_DEFAULT,
                "bytesPerChecksum": BYTES_PER_CRC,
                "writePacketSize": 64 * 1024,
                "replication": crate::namenode::REPLICATION_DEFAULT,
                "fileBufferSize": 4096,
                "encryptDataTransfer": false,
                "trashInterval": 0,
                "checksumType": 2,
                "keyProviderUri": "",
                "defaultStoragePolicyId": 7,
            }}))),
            (Method::GET, "GETFILEBLOCKLOCATIONS") => {
                let offset = params.number::<u64>("offset")?.unwrap_or(0);
                let length = params.number::<u64>("length")?.unwrap_or(u64::MAX);
                self.block_locations(&path, offset, length).await
            }
            (Method::PUT, "CREATE") | (Method::POST, "APPEND") => {
                if params.flag("data")? != Some(true) {
                    return Ok(redirect(&request, params.flag("noredirect")? == Some(true)));
                }
                let create = op == "CREATE";
                let (command, block_size) = if create {
                    let block_size = params.number::<u64>("blocksize")?;
                    if let Some(b) = block_size {
                        if !(BLOCK_SIZE_MIN..=BLOCK_SIZE_MAX).contains(&b) {
                            return Err(WebError::BadRequest(format!(
                                "Invalid value for webhdfs parameter \"blocksize\": {b} is not between {BLOCK_SIZE_MIN} and {BLOCK_SIZE_MAX}"
                            )));
                        }
                    }
                    let command = Command::Create {
                        path: path.clone(),
                        overwrite: params.flag("overwrite")?.unwrap_or(false),
                        replication: params.number("replication")?,
                        block_size,
                        permission: params.permission()?,
                        user,
                        holder: self.holder(),
                    };
                    (command, block_size)
                } else {
                    let command = Command::Append {
                        path: path.clone(),
                        holder: self.holder(),
                    };
                    (command, None)
                };
                let host = request_host(&request);
                self.write(&path, command, block_size, request.into_body()).await?;
                let mut response = Response::new(http::empty());
                if create {
                    *response.status_mut() = StatusCode::CREATED;
                    if let Ok(v) = HeaderValue::from_str(&format!("webhdfs://{host}{path}")) {
                        response.headers_mut().insert(LOCATION, v);
                    }
                }
                response.headers_mut().insert(CONTENT_LENGTH, HeaderValue::from(0));
                Ok(response)
            }
            (Method::PUT, "MKDIRS") => {
                let permission = params.permission()?;
                match self.call(Command::Mkdirs { path, permission, user }).await? {
                    Answer::Done(b) => Ok(http::json(&json!({"boolean": b}))),
                    other => Err(unexpected(other)),
                }
            }
            (Method::PUT, "RENAME") => {
                let dst = params.required("destination")?.to_string();
                match self.call(Command::Rename { src: path, dst }).await? {
                    Answer::Done(b) => Ok(http::json(&json!({"boolean": b}))),
                    other => Err(unexpected(other)),
                }
            }
            (Method::PUT, "SETPERMISSION") => {
                let permission = params.permission()?.unwrap_or(0o755);
                match self.call(Command::SetPermission { path, permission }).await? {
                    Answer::Ok => Ok(ok_empty()),
                    other => Err(unexpected(other)),
                }
            }
            (Method::PUT, "SETOWNER") => {
                let owner = params.get("owner").filter(|s| !s.is_empty()).map(str::to_string);
                let group = params.get("group").filter(|s| !s.is_empty()).map(str::to_string);
                if owner.is_none() && group.is_none() {
                    return Err(WebError::BadRequest("Both owner and group are empty.".into()));
                }
                match self.call(Command::SetOwner { path, owner, group }).await? {
                    Answer::Ok => Ok(ok_empty()),
                    other => Err(unexpected(other)),
                }
            }
            (Method::PUT, "SETREPLICATION") => {
                let replication = params.number::<u16>("replication")?.unwrap_or(crate::namenode::REPLICATION_DEFAULT);
                match self.call(Command::SetReplication { path, replication }).await? {
                    Answer::Done(b) => Ok(http::json(&json!({"boolean": b}))),
                    other => Err(unexpected(other)),
                }
            }
            (Method::DELETE, "DELETE") => {
                let recursive = params.flag("recursive")?.unwrap_or(false);
                match self.call(Command::Delete { path, recursive }).await? {
                    Answer::Done(b) => Ok(http::json(&json!({"boolean": b}))),
                    other => Err(unexpected(other)),
                }
            }
            (method, op) => Err(WebError::BadRequest(format!(
                "Invalid value for webhdfs parameter \"op\": {method} {op} is not served by upright-hdfs (see docs/HDFS.md)"
            ))),
        }
    }

    fn holder(&self) -> String {
        format!(
            "{}-{}",
            self.holder_prefix,
            self.next_holder.fetch_add(1, Ordering::Relaxed)
        )
    }

    /// Every entry of a directory (LISTSTATUS pages through the NameNode's listings).
    async fn list_all(&self, path: &str) -> Result<Vec<FileStatus>> {
        let mut all = Vec::new();
        let mut after = None;
        loop {
            match self
                .call(Command::ListStatus {
                    path: path.to_string(),
                    after: after.clone(),
                })
                .await?
            {
                Answer::Listing { entries, remaining } => {
                    after = entries.last().map(|e| e.path_suffix.clone());
                    all.extend(entries);
                    if remaining == 0 || after.is_none() || after.as_deref() == Some("") {
                        return Ok(all);
                    }
                    if all.len() >= LISTING_MAX {
                        return Err(WebError::Io(format!("{path} lists more than {LISTING_MAX} entries")));
                    }
                }
                other => return Err(unexpected(other)),
            }
        }
    }

    async fn locations(&self, path: &str) -> Result<(Vec<LocatedBlock>, u64)> {
        match self.call(Command::GetBlockLocations { path: path.to_string() }).await? {
            Answer::Locations { blocks, length, .. } => {
                Ok((blocks.into_iter().filter(|b| b.hash.is_some()).collect(), length))
            }
            other => Err(unexpected(other)),
        }
    }

    async fn block_locations(&self, path: &str, offset: u64, length: u64) -> Result<Response<Body>> {
        let (blocks, _) = self.locations(path).await?;
        let end = offset.saturating_add(length);
        let list: Vec<Value> = blocks
            .iter()
            .filter(|b| b.offset < end && b.offset + b.len > offset)
            .map(|b| {
                let names: Vec<&str> = b.datanodes.iter().map(|d| d.addr.as_str()).collect();
                let hosts: Vec<&str> = names
                    .iter()
                    .map(|n| n.rsplit_once(':').map_or(*n, |(h, _)| h))
                    .collect();
                let topology: Vec<String> = names.iter().map(|n| format!("/default-rack/{n}")).collect();
                json!({
                    "cachedHosts": [],
                    "corrupt": false,
                    "hosts": hosts,
                    "length": b.len,
                    "names": names,
                    "offset": b.offset,
                    "storageIds": [],
                    "storageTypes": vec!["DISK"; names.len()],
                    "topologyPaths": topology,
                })
            })
            .collect();
        Ok(http::json(&json!({"BlockLocations": {"BlockLocation": list}})))
    }

    async fn open(self: Arc<Self>, path: &str, offset: u64, length: Option<u64>) -> Result<Response<Body>> {
        let (blocks, file_len) = self.locations(path).await?;
        if offset > file_len {
            return Err(WebError::Io(format!(
                "Offset={offset} out of the range [0, {file_len}) of {path}"
            )));
        }
        let end = length.map_or(file_len, |l| offset.saturating_add(l).min(file_len));
        let (tx, body) = http::channel();
        let gateway = self.clone();
        let path = path.to_string();
        tokio::spawn(async move {
            if let Err(e) = gateway.read_range(&blocks, offset, end, &tx).await {
                if e == CLIENT_GONE {
                    return; // the client closed the stream early (Hadoop's client seeks so)
                }
                tracing::warn!(path, "read broke off: {e}");
                let _ = tx.send(Err(std::io::Error::other(e))).await;
            }
        });
        let mut response = Response::new(body);
        let headers = response.headers_mut();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/octet-stream"));
        headers.insert(CONTENT_LENGTH, HeaderValue::from(end - offset));
        Ok(response)
    }

    /// Sends the checked bytes `offset..end` of the file of `blocks` into `tx`.
    async fn read_range(
        &self,
        blocks: &[LocatedBlock],
        offset: u64,
        end: u64,
        tx: &mpsc::Sender<std::result::Result<Bytes, std::io::Error>>,
    ) -> std::result::Result<(), String> {
        for b in blocks {
            let (start, stop) = (offset.max(b.offset), end.min(b.offset + b.len));
            if start >= stop {
                continue;
            }
            self.read_block(b, start - b.offset, stop - b.offset, tx).await?;
        }
        Ok(())
    }

    /// Bytes `from..to` (`from < to`) of block `b`, from its DataNodes in turn until every
    /// sub-block arrived checked.
    async fn read_block(
        &self,
        b: &LocatedBlock,
        from: u64,
        to: u64,
        tx: &mpsc::Sender<std::result::Result<Bytes, std::io::Error>>,
    ) -> std::result::Result<(), String> {
        let sub = SUB_BLOCK_BYTES as u64;
        let mut next = from / sub;
        let last = (to - 1) / sub;
        let n = b.datanodes.len();
        let first = self.next_read.fetch_add(1, Ordering::Relaxed) as usize;
        let mut failures = Vec::new();
        for k in 0..n {
            let dn = &b.datanodes[(first + k) % n];
            match self.read_from(dn, b, (&mut next, last), (from, to), tx).await {
                Ok(()) => return Ok(()),
                Err(ReadFail::ClientGone) => return Err(CLIENT_GONE.into()),
                Err(ReadFail::Corrupt(why)) => {
                    tracing::warn!(
                        block = b.block,
                        datanode = dn.id,
                        "corrupt replica: {why}; reading another"
                    );
                    let namenode = self.namenode.clone();
                    let (block, datanode) = (b.block, dn.id);
                    tokio::spawn(async move {
                        let _ = namenode.call(&Command::BadReplica { block, datanode }).await;
                    });
                    failures.push(format!("DataNode {} ({}): {why}", dn.id, dn.addr));
                }
                Err(ReadFail::Io(why)) => failures.push(format!("DataNode {} ({}): {why}", dn.id, dn.addr)),
            }
        }
        if n == 0 {
            failures.push("no live DataNode holds a good replica".into());
        }
        Err(format!(
            "Could not obtain block {} with its committed hash: {}",
            b.block,
            failures.join("; ")
        ))
    }

    async fn read_from(
        &self,
        dn: &DataNodeAddr,
        b: &LocatedBlock,
        (next, last): (&mut u64, u64),
        (from, to): (u64, u64),
        tx: &mpsc::Sender<std::result::Result<Bytes, std::io::Error>>,
    ) -> std::result::Result<(), ReadFail> {
        let hash = b
            .hash
            .ok_or_else(|| ReadFail::Io("the block is not committed".into()))?;
        let sub = SUB_BLOCK_BYTES as u64;
        let subs = fetch_hashes(&dn.addr, b.block).await?;
        if !block::subs_match(b.len, &subs, &hash) {
            return Err(ReadFail::Corrupt(
                "its sub-block hashes do not give the committed block hash".into(),
            ));
        }
        let start = *next * sub;
        let stop = ((last + 1) * sub).min(b.len);
        let path = format!("/block/{}?offset={start}&length={}", b.block, stop - start);
        let response = http::send(&dn.addr, Method::GET, &path, http::empty())
            .await
            .map_err(|e| ReadFail::Io(e.to_string()))?;
        if !response.status().is_success() {
            return Err(ReadFail::Io(format!("answered {}", response.status())));
        }
        let mut body = response.into_body();
        let mut buf = BytesMut::new();
        loop {
            let sub_len = sub.min(b.len - *next * sub) as usize;
            while buf.len() >= sub_len {
                let piece = buf.split_to(sub_len).freeze();
                if block::sub_hash(&piece) != subs[*next as usize] {
                    return Err(ReadFail::Corrupt(format!(
                        "sub-block {} does not match its hash",
                        *next
                    )));
                }
                let piece_start = *next * sub;
                let lo = (from.max(piece_start) - piece_start) as usize;
                let hi = (to.min(piece_start + sub_len as u64) - piece_start) as usize;
                if tx.send(Ok(piece.slice(lo..hi))).await.is_err() {
                    return Err(ReadFail::ClientGone);
                }
                *next += 1;
                if *next > last {
                    return Ok(());
                }
                let sub_len_next = sub.min(b.len - *next * sub) as usize;
                if buf.len() < sub_len_next {
                    break;
                }
            }
            match http::next_chunk(&mut body).await {
                Ok(Some(chunk)) => buf.extend_from_slice(&chunk),
                Ok(None) => return Err(ReadFail::Io("the replica's bytes ended early".into())),
                Err(e) => return Err(ReadFail::Io(e.to_string())),
            }
        }
    }

    /// Writes the request body as the file's new blocks: CREATE or APPEND first, then a block at
    /// a time, then COMPLETE until every block has committed.
    async fn write(&self, path: &str, open: Command, block_size: Option<u64>, mut body: Incoming) -> Result<()> {
        let holder = match &open {
            Command::Create { holder, .. } | Command::Append { holder, .. } => holder.clone(),
            _ => unreachable!("create or append"),
        };
        match self.call(open).await? {
            Answer::Ok => {}
            other => return Err(unexpected(other)),
        }
        let block_size = match block_size {
            Some(b) => b,
            None => match self.call(Command::GetFileStatus { path: path.to_string() }).await? {
                Answer::Status(s) if s.block_size > 0 => s.block_size,
                Answer::Status(_) => BLOCK_SIZE_DEFAULT,
                other => return Err(unexpected(other)),
            },
        };
        let mut previous: Option<BlockReport> = None;
        let mut current: Option<OpenBlock> = None;
        loop {
            let chunk = match http::next_chunk(&mut body).await {
                Ok(Some(chunk)) => chunk,
                Ok(None) => break,
                Err(e) => {
                    return Err(WebError::Io(format!(
                        "the data of {path} did not all arrive ({e}); the file keeps its committed blocks and its lease runs out"
                    )))
                }
            };
            let mut chunk = chunk;
            while !chunk.is_empty() {
                if current.is_none() {
                    current = Some(self.add_block(path, &holder, previous.take()).await?);
                }
                let block = current.as_mut().expect("opened");
                let room = (block_size - block.hasher.len()) as usize;
                let piece = chunk.split_to(room.min(chunk.len()));
                feed(block, piece).await;
                if block.hasher.len() == block_size {
                    previous = Some(finish_block(current.take().expect("open")).await?);
                }
            }
        }
        let last = match current {
            Some(block) => Some(finish_block(block).await?),
            None => previous,
        };
        self.complete(path, &holder, last).await
    }

    async fn add_block(&self, path: &str, holder: &str, previous: Option<BlockReport>) -> Result<OpenBlock> {
        let located = match self
            .call(Command::AddBlock {
                path: path.to_string(),
                holder: holder.to_string(),
                previous,
            })
            .await?
        {
            Answer::Block(located) => located,
            other => return Err(unexpected(other)),
        };
        let sinks = located
            .datanodes
            .iter()
            .map(|dn| {
                let (tx, body) = http::channel();
                let addr = dn.addr.clone();
                let block = located.block;
                let done = tokio::spawn(async move { put_block(&addr, block, body).await });
                Sink {
                    datanode: dn.clone(),
                    tx: Some(tx),
                    done,
                }
            })
            .collect();
        Ok(OpenBlock {
            located,
            hasher: BlockHasher::new(),
            sinks,
        })
    }

    async fn complete(&self, path: &str, holder: &str, last: Option<BlockReport>) -> Result<()> {
        let deadline = tokio::time::Instant::now() + CALL_TIMEOUT;
        let mut wait = Duration::from_millis(10);
        loop {
            match self
                .call(Command::Complete {
                    path: path.to_string(),
                    holder: holder.to_string(),
                    last,
                })
                .await?
            {
                Answer::Done(true) => return Ok(()),
                Answer::Done(false) if tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(Duration::from_millis(500));
                }
                Answer::Done(false) => {
                    return Err(WebError::Io(format!(
                    "Unable to close file {path}: its last block was not confirmed by a DataNode in {CALL_TIMEOUT:?}"
                )))
                }
                other => return Err(unexpected(other)),
            }
        }
    }

    /// GETFILECHECKSUM as HDFS computes it (MD5 of the blocks' MD5s of their CRC32Cs per 512
    /// bytes), over the bytes read back through the checked path.
    async fn checksum(self: Arc<Self>, path: &str) -> Result<Response<Body>> {
        let (blocks, _) = self.locations(path).await?;
        let mut file_md5 = Md5::new();
        let mut crc_per_block = 0u64;
        for (i, b) in blocks.iter().enumerate() {
            let (tx, mut rx) = mpsc::channel(http::CHANNEL_CHUNKS);
            let gateway = self.clone();
            let one = vec![b.clone()];
            let reader = tokio::spawn(async move { gateway.read_range(&one, 0, u64::MAX, &tx).await });
            let mut crcs = Md5::new();
            let mut partial: Vec<u8> = Vec::with_capacity(BYTES_PER_CRC);
            let mut chunks = 0u64;
            while let Some(chunk) = rx.recv().await {
                let chunk: Bytes = chunk.map_err(|e| WebError::Io(e.to_string()))?;
                let mut data = &chunk[..];
                while !data.is_empty() {
                    let take = (BYTES_PER_CRC - partial.len()).min(data.len());
                    partial.extend_from_slice(&data[..take]);
                    data = &data[take..];
                    if partial.len() == BYTES_PER_CRC {
                        crcs.update(crc32c::crc32c(&partial).to_be_bytes());
                        partial.clear();
                        chunks += 1;
                    }
                }
            }
            if !partial.is_empty() {
                crcs.update(crc32c::crc32c(&partial).to_be_bytes());
                chunks += 1;
            }
            reader
                .await
                .map_err(|e| WebError::Io(e.to_string()))?
                .map_err(WebError::Io)?;
            if i == 0 && blocks.len() > 1 {
                crc_per_block = chunks;
            }
            file_md5.update(crcs.finalize());
        }
        let md5 = file_md5.finalize();
        let mut bytes = Vec::with_capacity(28);
        bytes.extend_from_slice(&(BYTES_PER_CRC as u32).to_be_bytes());
        bytes.extend_from_slice(&crc_per_block.to_be_bytes());
        bytes.extend_from_slice(&md5);
        Ok(http::json(&json!({"FileChecksum": {
            "algorithm": format!("MD5-of-{crc_per_block}MD5-of-{BYTES_PER_CRC}CRC32C"),
            "bytes": hex::encode(&bytes),
            "length": bytes.len(),
        }})))
    }
}

fn ok_empty() -> Response<Body> {
    let mut response = Response::new(http::empty());
    response.headers_mut().insert(CONTENT_LENGTH, HeaderValue::from(0));
    response
}

fn request_host(request: &Request<Incoming>) -> String {
    request
        .headers()
        .get(HOST)
        .and_then(|h| h.to_str().ok())
        .map(str::to_string)
        .or_else(|| request.uri().authority().map(|a| a.to_string()))
        .unwrap_or_else(|| "127.0.0.1".to_string())
}

/// The first step of CREATE or APPEND: where to send the data (this gateway, `data=true`).
fn redirect(request: &Request<Incoming>, noredirect: bool) -> Response<Body> {
    let host = request_host(request);
    let query = request.uri().query().unwrap_or("");
    let query: Vec<&str> = query
        .split('&')
        .filter(|p| !p.is_empty() && !p.to_ascii_lowercase().starts_with("noredirect="))
        .collect();
    let location = format!("http://{host}{}?{}&data=true", request.uri().path(), query.join("&"));
    if noredirect {
        return http::json(&json!({"Location": location}));
    }
    let mut response = Response::new(http::empty());
    *response.status_mut() = StatusCode::TEMPORARY_REDIRECT;
    if let Ok(v) = HeaderValue::from_str(&location) {
        response.headers_mut().insert(LOCATION, v);
    }
    response.headers_mut().insert(CONTENT_LENGTH, HeaderValue::from(0));
    response
}

/// Feeds `piece` to the hash and to every DataNode still taking the block.
async fn feed(block: &mut OpenBlock, piece: Bytes) {
    block.hasher.update(&piece);
    for sink in &mut block.sinks {
        if let Some(tx) = &sink.tx {
            if tx.send(Ok(piece.clone())).await.is_err() {
                sink.tx = None; // that DataNode failed; the others go on
            }
        }
    }
}

/// Ends the block's PUTs and checks what the DataNodes stored against the gateway's own hash:
/// the block's report if at least one DataNode holds it.
async fn finish_block(block: OpenBlock) -> Result<BlockReport> {
    let OpenBlock { located, hasher, sinks } = block;
    let (len, _, hash) = hasher.finish();
    let mut stored = 0;
    let mut failures = Vec::new();
    for mut sink in sinks {
        sink.tx = None;
        match sink.done.await {
            Ok(Ok(got)) if got == (len, hash) => stored += 1,
            Ok(Ok(_)) => failures.push(format!("DataNode {} stored other bytes", sink.datanode.id)),
            Ok(Err(e)) => failures.push(format!("DataNode {}: {e}", sink.datanode.id)),
            Err(e) => failures.push(format!("DataNode {}: {e}", sink.datanode.id)),
        }
    }
    if stored == 0 {
        return Err(WebError::Io(format!(
            "block {} could not be written to any of its DataNodes: {}",
            located.block,
            if failures.is_empty() {
                "none was chosen".to_string()
            } else {
                failures.join("; ")
            }
        )));
    }
    if !failures.is_empty() {
        tracing::warn!(
            block = located.block,
            "some DataNodes did not store the block: {}",
            failures.join("; ")
        );
    }
    Ok(BlockReport {
        block: located.block,
        len,
        hash,
    })
}

/// PUTs a block's bytes from `body` to the DataNode at `addr`; its stored length and hash.
async fn put_block(addr: &str, block: u64, body: Body) -> std::result::Result<(u64, Hash), String> {
    let response = http::send(addr, Method::PUT, &format!("/block/{block}"), body)
        .await
        .map_err(|e| e.to_string())?;
    let status = response.status();
    let bytes = http::read_body(response.into_body(), 64 * 1024)
        .await
        .map_err(|e| e.to_string())?;
    if !status.is_success() {
        return Err(format!("answered {status}: {}", String::from_utf8_lossy(&bytes).trim()));
    }
    let value: Value = serde_json::from_slice(&bytes).map_err(|e| format!("a bad answer: {e}"))?;
    let len = value["length"].as_u64().ok_or("no length in its answer")?;
    let hash: Hash = value["hash"]
        .as_str()
        .and_then(|h| hex::decode(h).ok())
        .and_then(|h| h.try_into().ok())
        .ok_or("no hash in its answer")?;
    Ok((len, hash))
}

/// A DataNode's sub-block hashes of `block`.
async fn fetch_hashes(addr: &str, block: u64) -> std::result::Result<Vec<Hash>, ReadFail> {
    let response = http::send(addr, Method::GET, &format!("/block/{block}/hashes"), http::empty())
        .await
        .map_err(|e| ReadFail::Io(e.to_string()))?;
    if !response.status().is_success() {
        return Err(ReadFail::Io(format!("answered {} for the hashes", response.status())));
    }
    let bytes = http::read_body(response.into_body(), HASHES_BYTES_MAX)
        .await
        .map_err(|e| ReadFail::Io(e.to_string()))?;
    if bytes.len() < 8 || (bytes.len() - 8) % 32 != 0 {
        return Err(ReadFail::Corrupt("a malformed hash list".into()));
    }
    Ok(bytes[8..].chunks(32).map(|c| c.try_into().expect("32 bytes")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_decode_under_the_prefix() {
        assert_eq!(hdfs_path("/webhdfs/v1").unwrap(), "/");
        assert_eq!(hdfs_path("/webhdfs/v1/").unwrap(), "/");
        assert_eq!(hdfs_path("/webhdfs/v1/a%20b/c/").unwrap(), "/a b/c");
        assert!(hdfs_path("/webhdfs/v2/a").is_err());
        assert!(hdfs_path("/webhdfs/v1x").is_err());
    }

    #[test]
    fn errors_carry_hadoop_classes_and_statuses() {
        let (e, class, _, status) = WebError::Hdfs(HdfsError::NotFound("/x".into())).parts();
        assert_eq!(
            (e, class, status),
            (
                "FileNotFoundException",
                "java.io.FileNotFoundException",
                StatusCode::NOT_FOUND
            )
        );
        let (e, class, _, status) = WebError::Hdfs(HdfsError::AlreadyExists("/x".into())).parts();
        assert_eq!(
            (e, class, status),
            (
                "FileAlreadyExistsException",
                "org.apache.hadoop.fs.FileAlreadyExistsException",
                StatusCode::FORBIDDEN
            )
        );
        let (_, _, _, status) = WebError::BadRequest("x".into()).parts();
        assert_eq!(status, StatusCode::BAD_REQUEST);
    }

    #[test]
    fn permissions_are_octal_up_to_1777() {
        let p = |v: &str| Params(vec![("permission".into(), v.into())]).permission();
        assert_eq!(p("755").unwrap(), Some(0o755));
        assert_eq!(p("1777").unwrap(), Some(0o1777));
        assert!(p("2000").is_err());
        assert!(p("9").is_err());
    }
}

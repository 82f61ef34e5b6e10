//! `upright zk-bench`: one closed-loop ZooKeeper load generator for upright-zk and for Apache
//! ZooKeeper alike (it speaks the wire protocol, so the same program measures both).
//!
//! Each client is one session on its own TCP connection to server `i mod n` of `--servers`, with
//! one request outstanding: it sends, waits for the reply, sends again. Workloads: `create`
//! (1 KiB persistent nodes, a new path each time), `set` (setData of the client's own node),
//! `get` (getData of it, no watch) and `mix` (90% getData, 10% setData over 64 shared nodes).
//! After a warm-up, a window of `--seconds` counts completed requests and their latencies.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::{BufMut, Bytes, BytesMut};
use hdrhistogram::Histogram;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use upright_node::files::FileError;
use upright_zk::jute::{Reader, Writer};
use upright_zk::proto::{op, request, Acl, Code};

/// Nodes the `mix` workload reads and writes.
const SHARED_NODES: usize = 64;
/// Where the benchmark's nodes live.
const ROOT: &str = "/zkbench";
/// Most clients of one point.
pub const CLIENTS_MAX: u32 = 1_024;

/// Options of `upright zk-bench`.
#[derive(clap::Args, Debug)]
pub struct ZkBenchArgs {
    /// ZooKeeper servers (host:port), comma-separated; client i connects to server i mod n.
    #[arg(long, value_delimiter = ',', default_value = "127.0.0.1:2181")]
    servers: Vec<String>,
    /// Concurrent clients (sessions), comma-separated (a sweep).
    #[arg(long, value_delimiter = ',', default_value = "1,16,64",
          value_parser = clap::value_parser!(u32).range(1..=i64::from(CLIENTS_MAX)))]
    clients: Vec<u32>,
    /// Workloads, comma-separated: create, set, get, mix (90% getData, 10% setData).
    #[arg(long, value_delimiter = ',', default_value = "create,set,get,mix",
          value_parser = ["create", "set", "get", "mix"])]
    workload: Vec<String>,
    /// Bytes of data per create and setData.
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u32).range(0..=1_000_000))]
    size: u32,
    /// Seconds of each measurement window.
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
    /// Seconds of warm-up before each window.
    #[arg(long, default_value_t = 1.0)]
    warmup: f64,
    /// A name for the system measured, printed with each result (e.g. upright-zk, zookeeper).
    #[arg(long, default_value = "zk")]
    label: String,
    /// Append the results as JSON lines to this file.
    #[arg(long)]
    json: Option<std::path::PathBuf>,
}

/// One connection's session.
struct Session {
    stream: TcpStream,
    xid: i32,
}

/// What went wrong talking to a server.
#[derive(Debug)]
struct BenchError(String);

impl From<std::io::Error> for BenchError {
    fn from(e: std::io::Error) -> BenchError {
        BenchError(e.to_string())
    }
}

impl Session {
    async fn open(server: &str) -> Result<Session, BenchError> {
        let stream = TcpStream::connect(server)
            .await
            .map_err(|e| BenchError(format!("cannot connect to {server}: {e}")))?;
        stream.set_nodelay(true)?;
        let mut session = Session { stream, xid: 0 };
        session.send(&request::connect(30_000, 0, &[0u8; 16])).await?;
        let response = session.frame().await?;
        let mut r = Reader::new(&response);
        let (_, timeout, id) = (|| Ok::<_, upright_zk::jute::JuteError>((r.int()?, r.int()?, r.long()?)))()
            .map_err(|e| BenchError(format!("bad ConnectResponse from {server}: {e:?}")))?;
        if timeout <= 0 || id == 0 {
            return Err(BenchError(format!("{server} refused a session")));
        }
        Ok(session)
    }

    async fn send(&mut self, body: &[u8]) -> Result<(), BenchError> {
        let mut frame = BytesMut::with_capacity(body.len() + 4);
        frame.put_u32(body.len() as u32);
        frame.put_slice(body);
        self.stream.write_all(&frame).await?;
        Ok(())
    }

    async fn frame(&mut self) -> Result<Bytes, BenchError> {
        let len = self.stream.read_u32().await? as usize;
        if len > upright_zk::jute::MAX_BUFFER + 1024 {
            return Err(BenchError(format!("frame of {len} bytes")));
        }
        let mut buf = vec![0u8; len];
        self.stream.read_exact(&mut buf).await?;
        Ok(Bytes::from(buf))
    }

    /// Sends request `opcode` with `body` and returns its error code (events and pings skipped).
    async fn call(&mut self, opcode: i32, body: &[u8]) -> Result<i32, BenchError> {
        self.xid += 1;
        let mut request = Vec::with_capacity(body.len() + 8);
        request.int(self.xid);
        request.int(opcode);
        request.extend_from_slice(body);
        self.send(&request).await?;
        loop {
            let reply = self.frame().await?;
            let mut r = Reader::new(&reply);
            let header = (|| Ok::<_, upright_zk::jute::JuteError>((r.int()?, r.long()?, r.int()?)))();
            let (xid, _, err) = header.map_err(|e| BenchError(format!("bad reply header: {e:?}")))?;
            if xid == self.xid {
                return Ok(err);
            }
        }
    }

    async fn close(mut self) {
        let _ = self.call(op::CLOSE_SESSION, &[]).await;
    }
}

/// Creates `path` unless it exists.
async fn ensure(session: &mut Session, path: &str, data: &[u8]) -> Result<(), BenchError> {
    let err = session
        .call(op::CREATE, &request::create(path, data, &Acl::open(), 0))
        .await?;
    if err == Code::Ok.value() || err == Code::NodeExists.value() {
        Ok(())
    } else {
        Err(BenchError(format!("create {path}: error {err}")))
    }
}

/// One measured point.
struct Point {
    ops: u64,
    errors: u64,
    seconds: f64,
    histogram: Histogram<u64>,
}

/// Runs `workload` with `clients` sessions.
async fn point(args: &ZkBenchArgs, workload: &str, clients: u32, run: u64) -> Result<Point, BenchError> {
    let data = vec![b'x'; args.size as usize];
    let mut sessions = Vec::new();
    for i in 0..clients {
        sessions.push(Session::open(&args.servers[i as usize % args.servers.len()]).await?);
    }
    // The nodes the workload needs.
    let setup = &mut sessions[0];
    ensure(setup, ROOT, b"").await?;
    match workload {
        "set" | "get" => {
            for i in 0..clients {
                ensure(setup, &format!("{ROOT}/own-{i}"), &data).await?;
            }
        }
        "mix" => {
            for i in 0..SHARED_NODES {
                ensure(setup, &format!("{ROOT}/shared-{i}"), &data).await?;
            }
        }
        _ => {}
    }
    let start = Instant::now();
    let measure_from = start + Duration::from_secs_f64(args.warmup);
    let stop_at = measure_from + Duration::from_secs_f64(args.seconds);
    let ops = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicBool::new(false));
    let histogram = Arc::new(Mutex::new(Histogram::<u64>::new(3).expect("histogram")));
    let mut tasks = Vec::new();
    for (i, mut session) in sessions.into_iter().enumerate() {
        let (ops, errors, failed, histogram) = (ops.clone(), errors.clone(), failed.clone(), histogram.clone());
        let data = data.clone();
        let workload = workload.to_string();
        tasks.push(tokio::spawn(async move {
            let mut local = Histogram::<u64>::new(3).expect("histogram");
            let mut n: u64 = 0;
            let mut rng = (i as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
            let result: Result<(), BenchError> = async {
                while Instant::now() < stop_at {
                    n += 1;
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    let (opcode, body) = match workload.as_str() {
                        "create" => (
                            op::CREATE,
                            request::create(&format!("{ROOT}/r{run}-x{clients}-c{i}-{n}"), &data, &Acl::open(), 0),
                        ),
                        "set" => (op::SET_DATA, request::set_data(&format!("{ROOT}/own-{i}"), &data, -1)),
                        "get" => (op::GET_DATA, request::path_watch(&format!("{ROOT}/own-{i}"), false)),
                        _ => {
                            let node = format!("{ROOT}/shared-{}", rng % SHARED_NODES as u64);
                            if rng.is_multiple_of(10) {
                                (op::SET_DATA, request::set_data(&node, &data, -1))
                            } else {
                                (op::GET_DATA, request::path_watch(&node, false))
                            }
                        }
                    };
                    let sent = Instant::now();
                    let err = session.call(opcode, &body).await?;
                    let done = Instant::now();
                    if sent >= measure_from && done <= stop_at {
                        if err == Code::Ok.value() {
                            local
                                .record(done.duration_since(sent).as_micros() as u64)
                                .expect("in range");
                            ops.fetch_add(1, Ordering::Relaxed);
                        } else {
                            if errors.fetch_add(1, Ordering::Relaxed) == 0 {
                                eprintln!("zk-bench: client {i}: first failed request: error {err} (op {opcode})");
                            }
                        }
                    }
                }
                Ok(())
            }
            .await;
            if let Err(e) = result {
                eprintln!("zk-bench: client {i}: {}", e.0);
                failed.store(true, Ordering::Relaxed);
            }
            histogram
                .lock()
                .expect("not poisoned")
                .add(&local)
                .expect("same bounds");
            session.close().await;
        }));
    }
    for task in tasks {
        let _ = task.await;
    }
    if failed.load(Ordering::Relaxed) {
        return Err(BenchError("a client failed (above)".into()));
    }
    let histogram = Arc::try_unwrap(histogram)
        .map(|m| m.into_inner().expect("not poisoned"))
        .unwrap_or_else(|a| a.lock().expect("not poisoned").clone());
    Ok(Point {
        ops: ops.load(Ordering::Relaxed),
        errors: errors.load(Ordering::Relaxed),
        seconds: args.seconds,
        histogram,
    })
}

/// Runs `upright zk-bench`.
pub async fn run(args: ZkBenchArgs) -> Result<std::process::ExitCode, FileError> {
    if args.servers.is_empty() || args.servers.iter().any(|s| s.trim().is_empty()) {
        return Err(FileError("--servers: give at least one host:port".into()));
    }
    let valid = args.seconds > 0.0 && args.seconds <= 3_600.0 && (0.0..=600.0).contains(&args.warmup);
    if !valid {
        return Err(FileError(
            "--seconds must be in (0, 3600] and --warmup in [0, 600]".into(),
        ));
    }
    let run = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let mut lines = Vec::new();
    for workload in &args.workload {
        for &clients in &args.clients {
            eprintln!(
                "zk-bench: {} {workload} with {clients} client(s): {:.0} s warm-up, {:.0} s measured",
                args.label, args.warmup, args.seconds
            );
            let p = point(&args, workload, clients, run)
                .await
                .map_err(|e| FileError(format!("{} {workload} x{clients}: {}", args.label, e.0)))?;
            let throughput = p.ops as f64 / p.seconds;
            let ms = |q: f64| p.histogram.value_at_quantile(q) as f64 / 1_000.0;
            println!(
                "zk-bench: {} workload={workload} clients={clients} ops/s={throughput:.0} p50={:.2}ms p99={:.2}ms errors={}",
                args.label,
                ms(0.5),
                ms(0.99),
                p.errors
            );
            lines.push(format!(
                "{{\"label\":\"{}\",\"workload\":\"{workload}\",\"clients\":{clients},\"ops_per_s\":{throughput:.1},\"p50_ms\":{:.3},\"p99_ms\":{:.3},\"errors\":{}}}",
                args.label.replace('"', ""),
                ms(0.5),
                ms(0.99),
                p.errors
            ));
        }
    }
    if let Some(path) = &args.json {
        append_json_lines(path, &lines)?;
    }
    Ok(std::process::ExitCode::SUCCESS)
}

/// Appends `lines` (JSON objects, one per line) to the file at `path`.
pub(crate) fn append_json_lines(path: &std::path::Path, lines: &[String]) -> Result<(), FileError> {
    use std::io::Write;
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|e| FileError(format!("cannot open {}: {e}", path.display())))?;
    for line in lines {
        writeln!(file, "{line}").map_err(|e| FileError(format!("cannot write {}: {e}", path.display())))?;
    }
    Ok(())
}

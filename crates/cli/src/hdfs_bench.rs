//! `upright hdfs-bench`: a WebHDFS load generator for upright-hdfs and for Apache HDFS alike (it
//! speaks WebHDFS's REST API and follows its redirects, so the same program measures both).
//!
//! `--clients` clients each write `--files` files of `--file-mib` MiB at once (CREATE's two
//! steps, the body streamed in 1 MiB chunks), then each reads its files back (OPEN, following a
//! redirect to a DataNode as HDFS gives one) and compares every byte with what it wrote; the
//! files are deleted at the end.
//! Throughput is the bytes of a phase over its wall time; with `--server-pid`, the CPU time of
//! that process and every process below it during the phase is reported too.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use bytes::Bytes;
use hyper::header::LOCATION;
use hyper::{Method, StatusCode};
use upright_hdfs::http;
use upright_node::files::FileError;

/// Bytes of the pattern every file repeats (pseudo-random, so nothing compresses it).
const PATTERN_BYTES: usize = 4 << 20;
/// Bytes per chunk a writer sends.
const CHUNK_BYTES: usize = 1 << 20;
/// Most clients.
pub const CLIENTS_MAX: u32 = 64;

/// Options of `upright hdfs-bench`.
#[derive(clap::Args, Debug)]
pub struct HdfsBenchArgs {
    /// The WebHDFS server (the NameNode's HTTP address, or upright's gateway).
    #[arg(long, default_value = "http://127.0.0.1:9870")]
    url: String,
    /// Concurrent clients.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=i64::from(CLIENTS_MAX)))]
    clients: u32,
    /// Files each client writes and reads.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1000))]
    files: u32,
    /// MiB per file.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..=16_384))]
    file_mib: u64,
    /// The files' replication factor.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u16).range(1..=16))]
    replication: u16,
    /// A name for the system measured, printed with each result (e.g. upright-hdfs, hdfs).
    #[arg(long, default_value = "webhdfs")]
    label: String,
    /// The server's process: its CPU time and its descendants' is measured per phase.
    #[arg(long)]
    server_pid: Option<u32>,
    /// Append the results as JSON lines to this file.
    #[arg(long)]
    json: Option<std::path::PathBuf>,
}

/// `http://host:port` and the path and query after it.
fn split_url(url: &str) -> Result<(String, String), String> {
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| format!("{url} is not an http:// URL"))?;
    let (host, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    if host.is_empty() {
        return Err(format!("{url} names no host"));
    }
    Ok((
        host.to_string(),
        if path.is_empty() { "/".into() } else { path.to_string() },
    ))
}

/// Sends a request to `url` (an `http://` URL) and follows one 307 redirect (WebHDFS's second
/// step) with `body` for the second request; the final status and the response body.
async fn webhdfs(
    method: Method,
    url: &str,
    body: Option<Box<dyn Fn() -> http::Body + Send + Sync>>,
) -> Result<(StatusCode, hyper::body::Incoming), String> {
    let mut url = url.to_string();
    let mut first = true;
    loop {
        let (host, path) = split_url(&url)?;
        let request_body = match (&body, first) {
            (Some(make), false) => make(),
            _ => http::empty(),
        };
        let response = http::send(&host, method.clone(), &path, request_body)
            .await
            .map_err(|e| format!("{url}: {e}"))?;
        if response.status() == StatusCode::TEMPORARY_REDIRECT && first {
            url = response
                .headers()
                .get(LOCATION)
                .and_then(|l| l.to_str().ok())
                .ok_or("a redirect without a Location")?
                .to_string();
            first = false;
            continue;
        }
        return Ok((response.status(), response.into_body()));
    }
}

/// The pattern's bytes, pseudo-random.
fn pattern() -> Bytes {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut out = Vec::with_capacity(PATTERN_BYTES);
    while out.len() < PATTERN_BYTES {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    Bytes::from(out)
}

/// Where file `seed`'s byte at `offset` is in the pattern.
fn pattern_at(seed: u64, offset: u64) -> usize {
    ((offset + seed * 4099) % PATTERN_BYTES as u64) as usize
}

/// Whether `data` is file `seed`'s bytes at `offset` (compared in place, nothing allocated).
fn matches(pattern: &Bytes, seed: u64, offset: u64, mut data: &[u8]) -> bool {
    let mut at = pattern_at(seed, offset);
    while !data.is_empty() {
        let take = data.len().min(PATTERN_BYTES - at);
        if data[..take] != pattern[at..at + take] {
            return false;
        }
        data = &data[take..];
        at = 0;
    }
    true
}

/// The bytes of file `seed` at `offset..offset + len`.
#[cfg(test)]
fn expected(pattern: &Bytes, seed: u64, offset: u64, len: usize) -> Vec<u8> {
    let start = pattern_at(seed, offset);
    let mut out = Vec::with_capacity(len);
    let mut at = start;
    while out.len() < len {
        let take = (len - out.len()).min(PATTERN_BYTES - at);
        out.extend_from_slice(&pattern[at..at + take]);
        at = 0;
    }
    out
}

/// CPU seconds (user + system) of `pid` and every process below it.
fn tree_cpu_seconds(pid: u32) -> f64 {
    let tick = 100.0; // USER_HZ on Linux
    let mut children: std::collections::HashMap<u32, Vec<u32>> = std::collections::HashMap::new();
    let mut cpu: std::collections::HashMap<u32, f64> = std::collections::HashMap::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(p) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        let Some(close) = stat.rfind(')') else { continue };
        let fields: Vec<&str> = stat[close + 2..].split_whitespace().collect();
        if fields.len() < 13 {
            continue;
        }
        let parent: u32 = fields[1].parse().unwrap_or(0);
        let ticks: f64 = fields[11].parse::<f64>().unwrap_or(0.0) + fields[12].parse::<f64>().unwrap_or(0.0);
        children.entry(parent).or_default().push(p);
        cpu.insert(p, ticks / tick);
    }
    let mut total = 0.0;
    let mut stack = vec![pid];
    while let Some(p) = stack.pop() {
        total += cpu.get(&p).copied().unwrap_or(0.0);
        stack.extend(children.get(&p).into_iter().flatten());
    }
    total
}

struct Phase {
    name: &'static str,
    bytes: u64,
    seconds: f64,
    per_file: Vec<f64>,
    cpu: Option<f64>,
}

impl Phase {
    fn mib_per_s(&self) -> f64 {
        self.bytes as f64 / (1 << 20) as f64 / self.seconds
    }
}

async fn write_file(
    base: &str,
    path: &str,
    pattern: Bytes,
    seed: u64,
    size: u64,
    replication: u16,
) -> Result<(), String> {
    let url = format!("{base}/webhdfs/v1{path}?op=CREATE&overwrite=true&replication={replication}&user.name=bench");
    let make = move || {
        let (tx, body) = http::channel();
        let pattern = pattern.clone();
        tokio::spawn(async move {
            let mut offset = 0u64;
            while offset < size {
                // A slice of the pattern (no copy), never across its end.
                let at = pattern_at(seed, offset);
                let len = (CHUNK_BYTES as u64).min(size - offset).min((PATTERN_BYTES - at) as u64) as usize;
                let chunk = pattern.slice(at..at + len);
                if tx.send(Ok(chunk)).await.is_err() {
                    return;
                }
                offset += len as u64;
            }
        });
        body
    };
    let (status, body) = webhdfs(Method::PUT, &url, Some(Box::new(make))).await?;
    let text = http::read_body(body, 1 << 16).await.unwrap_or_default();
    if status != StatusCode::CREATED {
        return Err(format!("CREATE {path}: {status} {}", String::from_utf8_lossy(&text)));
    }
    Ok(())
}

async fn read_file(base: &str, path: &str, pattern: &Bytes, seed: u64, size: u64) -> Result<(), String> {
    let url = format!("{base}/webhdfs/v1{path}?op=OPEN&user.name=bench");
    let (status, mut body) = webhdfs(Method::GET, &url, None).await?;
    if status != StatusCode::OK {
        let text = http::read_body(body, 1 << 16).await.unwrap_or_default();
        return Err(format!("OPEN {path}: {status} {}", String::from_utf8_lossy(&text)));
    }
    let mut offset = 0u64;
    while let Some(chunk) = http::next_chunk(&mut body)
        .await
        .map_err(|e| format!("OPEN {path}: {e}"))?
    {
        if !matches(pattern, seed, offset, &chunk) {
            return Err(format!("OPEN {path}: bytes at {offset}.. differ from those written"));
        }
        offset += chunk.len() as u64;
    }
    if offset != size {
        return Err(format!("OPEN {path}: {offset} bytes, not {size}"));
    }
    Ok(())
}

async fn phase(args: &HdfsBenchArgs, name: &'static str, write: bool, run_id: u64) -> Result<Phase, String> {
    let size = args.file_mib << 20;
    let pattern = pattern();
    let times = Arc::new(Mutex::new(Vec::new()));
    let cpu_before = args.server_pid.map(tree_cpu_seconds);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..args.clients {
        let (base, pattern, times) = (
            args.url.trim_end_matches('/').to_string(),
            pattern.clone(),
            times.clone(),
        );
        let (files, replication) = (args.files, args.replication);
        tasks.push(tokio::spawn(async move {
            for f in 0..files {
                let seed = u64::from(c) * 1000 + u64::from(f);
                let path = format!("/hdfs-bench-{run_id}/c{c}/f{f}");
                let t = Instant::now();
                if write {
                    write_file(&base, &path, pattern.clone(), seed, size, replication).await?;
                } else {
                    read_file(&base, &path, &pattern, seed, size).await?;
                }
                times
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(t.elapsed().as_secs_f64());
            }
            Ok::<(), String>(())
        }));
    }
    for task in tasks {
        task.await.map_err(|e| e.to_string())??;
    }
    let seconds = started.elapsed().as_secs_f64();
    let cpu = args.server_pid.map(|p| tree_cpu_seconds(p) - cpu_before.unwrap_or(0.0));
    let mut per_file = std::mem::take(&mut *times.lock().unwrap_or_else(|e| e.into_inner()));
    per_file.sort_by(f64::total_cmp);
    Ok(Phase {
        name,
        bytes: size * u64::from(args.clients) * u64::from(args.files),
        seconds,
        per_file,
        cpu,
    })
}

/// Runs the benchmark: the write phase, then the read phase.
pub async fn run(args: HdfsBenchArgs) -> Result<std::process::ExitCode, FileError> {
    split_url(&args.url).map_err(FileError)?;
    let run_id = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    println!(
        "{}: {} clients x {} files x {} MiB (replication {}) at {}",
        args.label, args.clients, args.files, args.file_mib, args.replication, args.url
    );
    let mut results = Vec::new();
    for (name, write) in [("write", true), ("read", false)] {
        let p = phase(&args, name, write, run_id)
            .await
            .map_err(|e| FileError(format!("{name} phase failed: {e}")))?;
        let gib = p.bytes as f64 / (1u64 << 30) as f64;
        let cpu = p
            .cpu
            .map(|c| format!("; server CPU {c:.1} s ({:.2} s per GiB)", c / gib))
            .unwrap_or_default();
        let median = p.per_file[p.per_file.len() / 2];
        let max = p.per_file.last().copied().unwrap_or(0.0);
        println!(
            "{} {}: {:.0} MiB in {:.2} s = {:.1} MiB/s; per file p50 {:.2} s, max {:.2} s{cpu}",
            args.label,
            p.name,
            p.bytes as f64 / (1 << 20) as f64,
            p.seconds,
            p.mib_per_s(),
            median,
            max
        );
        results.push(p);
    }
    // The files go (a long benchmark would fill the disk otherwise).
    let url = format!(
        "{}/webhdfs/v1/hdfs-bench-{run_id}?op=DELETE&recursive=true&user.name=bench",
        args.url.trim_end_matches('/')
    );
    match webhdfs(Method::DELETE, &url, None).await {
        Ok((status, _)) if status.is_success() => {}
        Ok((status, _)) => eprintln!("warning: deleting /hdfs-bench-{run_id} answered {status}"),
        Err(e) => eprintln!("warning: deleting /hdfs-bench-{run_id}: {e}"),
    }
    if let Some(path) = &args.json {
        let lines: Vec<String> = results
            .iter()
            .map(|p| {
                format!(
                    "{{\"label\":\"{}\",\"phase\":\"{}\",\"clients\":{},\"files\":{},\"file_mib\":{},\"replication\":{},\"bytes\":{},\"seconds\":{:.3},\"mib_per_s\":{:.2},\"file_p50_s\":{:.3},\"file_max_s\":{:.3},\"server_cpu_s\":{}}}",
                    args.label.replace('"', ""),
                    p.name,
                    args.clients,
                    args.files,
                    args.file_mib,
                    args.replication,
                    p.bytes,
                    p.seconds,
                    p.mib_per_s(),
                    p.per_file[p.per_file.len() / 2],
                    p.per_file.last().copied().unwrap_or(0.0),
                    p.cpu.map_or("null".to_string(), |c| format!("{c:.2}"))
                )
            })
            .collect();
        crate::zk_bench::append_json_lines(path, &lines)?;
    }
    Ok(std::process::ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_split_into_host_and_path() {
        assert_eq!(
            split_url("http://127.0.0.1:9870/webhdfs/v1/x?op=OPEN").unwrap(),
            ("127.0.0.1:9870".to_string(), "/webhdfs/v1/x?op=OPEN".to_string())
        );
        assert_eq!(split_url("http://h:1").unwrap(), ("h:1".to_string(), "/".to_string()));
        assert!(split_url("https://h:1/").is_err());
        assert!(split_url("http:///x").is_err());
    }

    #[test]
    fn expected_bytes_wrap_around_the_pattern() {
        let p = pattern();
        let whole = expected(&p, 3, 0, 3 * CHUNK_BYTES);
        let wrapped = expected(&p, 0, (PATTERN_BYTES - 10) as u64, 20);
        assert_eq!(&wrapped[..10], &p[PATTERN_BYTES - 10..]);
        assert_eq!(&wrapped[10..], &p[..10]);
        assert_eq!(&whole[100..200], &expected(&p, 3, 100, 100)[..]);
        // Offsets past the pattern wrap.
        assert_eq!(expected(&p, 0, PATTERN_BYTES as u64, 8), expected(&p, 0, 0, 8));
        // The in-place comparison agrees, across the wrap too, and sees a changed byte.
        let mut bytes = expected(&p, 5, (PATTERN_BYTES - 100) as u64, 300);
        assert!(matches(&p, 5, (PATTERN_BYTES - 100) as u64, &bytes));
        bytes[150] ^= 1;
        assert!(!matches(&p, 5, (PATTERN_BYTES - 100) as u64, &bytes));
    }
}

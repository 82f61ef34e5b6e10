//! The closed-loop load: each client keeps one operation outstanding; latencies go into a
//! histogram while the measurement window is open; a progress line is printed every second.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use hdrhistogram::Histogram;
use upright_core::kv::{KvOperation, KvReply};

use super::launch::cpu_us_sum;
use crate::client::ClientHandle;

/// Time one operation may take before it counts as an error.
pub const OP_TIMEOUT: Duration = Duration::from_secs(10);
/// Bytes of a "0 KiB" request or reply (the PBFT/BFT-SMaRt convention).
pub const EMPTY_BYTES: usize = 8;

/// A microbenchmark `A/B`: requests carry `A` KiB, replies `B` KiB (`0` = 8 bytes).
///
/// Suffixes: `A/Bro` reads a `B`-KiB value with a GET on the read-only path; `A/Bget` does the same
/// GET on the ordered path (so `0/0get` vs `0/0ro` compares the two paths for one 8-byte read;
/// plain `0/0` is an 8-byte PUT).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Workload {
    /// Request size in KiB.
    pub request_kib: u32,
    /// Reply size in KiB.
    pub reply_kib: u32,
    /// The operation is a GET even with `B = 0` (suffix `get` or `ro`).
    pub get: bool,
    /// The GET takes the read-only path (suffix `ro`).
    pub read_only: bool,
    /// `cpuN`: the operation burns this many microseconds of CPU on the client's key
    /// (`KvOperation::Burn`; 0: an `A/B` workload).
    pub burn_us: u32,
    /// `cpuNxK`: each client's operations go to its `K` keys in turn (1: one key per client), so
    /// that under selective execution the work spreads over the execution members as a large key
    /// space would spread it, not by where a few keys happen to be placed.
    pub keys: u32,
}

/// Most keys per client of a `cpuNxK` workload.
pub const KEYS_PER_CLIENT_MAX: u32 = 100_000;

impl Workload {
    /// Parses `A/B`.
    pub fn parse(text: &str) -> Result<Workload, String> {
        let bad = || {
            format!("workload {text:?}: expected A/B with A, B in KiB (0 = 8 bytes), e.g. 0/0, 0/4, 4/0, 0/0ro, 0/0get, or cpuN with N microseconds, e.g. cpu200, or cpuNxK with K keys per client, e.g. cpu200x64")
        };
        if let Some(rest) = text.trim().strip_prefix("cpu") {
            let (micros, keys) = rest.split_once('x').unwrap_or((rest, "1"));
            let burn_us: u32 = micros.parse().map_err(|_| bad())?;
            let keys: u32 = keys.parse().map_err(|_| bad())?;
            if burn_us == 0 || burn_us > upright_core::kv::BURN_MICROS_MAX {
                return Err(format!("workload {text:?}: N must be 1 to 1000000 microseconds"));
            }
            if keys == 0 || keys > KEYS_PER_CLIENT_MAX {
                return Err(format!("workload {text:?}: K must be 1 to {KEYS_PER_CLIENT_MAX} keys"));
            }
            return Ok(Workload {
                request_kib: 0,
                reply_kib: 0,
                get: false,
                read_only: false,
                burn_us,
                keys,
            });
        }
        let (a, b) = text.trim().split_once('/').ok_or_else(bad)?;
        let (b, get, read_only) = if let Some(b) = b.strip_suffix("ro") {
            (b, true, true)
        } else if let Some(b) = b.strip_suffix("get") {
            (b, true, false)
        } else {
            (b, false, false)
        };
        let parse = |s: &str| s.trim().parse::<u32>().map_err(|_| bad());
        let w = Workload {
            request_kib: parse(a)?,
            reply_kib: parse(b)?,
            get,
            read_only,
            burn_us: 0,
            keys: 1,
        };
        if w.request_kib > 512 || w.reply_kib > 512 {
            return Err(format!("workload {text:?}: sizes above 512 KiB are not supported"));
        }
        Ok(w)
    }

    /// `A/B`, with its suffix.
    pub fn name(&self) -> String {
        if self.burn_us > 0 && self.keys > 1 {
            return format!("cpu{}x{}", self.burn_us, self.keys);
        }
        if self.burn_us > 0 {
            return format!("cpu{}", self.burn_us);
        }
        let suffix = match (self.get, self.read_only) {
            (_, true) => "ro",
            (true, false) => "get",
            (false, false) => "",
        };
        format!("{}/{}{suffix}", self.request_kib, self.reply_kib)
    }

    /// Whether the measured operation is a GET.
    fn reads(&self) -> bool {
        self.reply_kib > 0 || self.get
    }

    fn bytes(kib: u32) -> usize {
        if kib == 0 {
            EMPTY_BYTES
        } else {
            kib as usize * 1024
        }
    }

    /// The key client `c` uses: 8 bytes, or `A` KiB for a read with a big request.
    fn key(&self, c: usize) -> Bytes {
        let mut key = format!("k{c:07}").into_bytes();
        if self.reads() {
            key.resize(Workload::bytes(self.request_kib), b'.');
        }
        Bytes::from(key)
    }

    /// The operations to run once before measuring (a value of `B` KiB to read back).
    pub fn setup(&self, c: usize) -> Option<Bytes> {
        self.reads().then(|| {
            let value = Bytes::from(vec![b'v'; Workload::bytes(self.reply_kib)]);
            KvOperation::Put {
                key: self.key(c),
                value,
            }
            .encode()
        })
    }

    /// The measured operation of client `c`: with `B = 0` a PUT of an `A`-KiB value (reply: a
    /// short "done"); with `B > 0` a GET of a `B`-KiB value under an `A`-KiB key.
    pub fn operation(&self, c: usize) -> Bytes {
        self.operation_at(c, 0)
    }

    /// Client `c`'s `n`-th operation (of `cpuNxK`: on its key `n mod K`; otherwise the same
    /// every time).
    pub fn operation_at(&self, c: usize, n: u64) -> Bytes {
        if self.burn_us > 0 {
            let key = if self.keys > 1 {
                Bytes::from(format!("k{c:07}.{}", n % u64::from(self.keys)))
            } else {
                self.key(c)
            };
            KvOperation::Burn {
                key,
                micros: self.burn_us,
            }
            .encode()
        } else if self.reads() {
            KvOperation::Get { key: self.key(c) }.encode()
        } else {
            let value = Bytes::from(vec![b'x'; Workload::bytes(self.request_kib)]);
            KvOperation::Put {
                key: self.key(c),
                value,
            }
            .encode()
        }
    }

    /// Whether `reply` is the expected answer.
    fn check(&self, reply: &[u8]) -> bool {
        match KvReply::decode(reply) {
            Some(KvReply::Value(Some(v))) if self.burn_us > 0 => v.len() == 32,
            Some(KvReply::Done) => !self.reads() && self.burn_us == 0,
            Some(KvReply::Value(Some(v))) => self.reads() && v.len() == Workload::bytes(self.reply_kib),
            _ => false,
        }
    }
}

/// What one measurement found.
#[derive(Clone, Debug, Default)]
pub struct Measurement {
    /// Operations completed inside the window.
    pub ops: u64,
    /// Failed or timed-out operations inside the window.
    pub errors: u64,
    /// Length of the window.
    pub seconds: f64,
    /// Operations per second.
    pub throughput: f64,
    /// Latency percentiles in microseconds: p50, p99, p99.9, and the mean.
    pub p50_us: u64,
    /// p99.
    pub p99_us: u64,
    /// p99.9.
    pub p999_us: u64,
    /// Mean.
    pub mean_us: f64,
    /// CPU time of the server processes per operation, microseconds.
    pub cpu_us_per_op: f64,
    /// CPU time of the benchmark's own process (the clients) per operation, microseconds.
    pub client_cpu_us_per_op: f64,
    /// Operations completed by the client that completed the fewest inside the window (a
    /// starved client shows here).
    pub client_ops_min: u64,
    /// Throughput of each second of the window (as the progress lines print it).
    pub per_second: Vec<f64>,
}

#[derive(Default)]
struct Shared {
    stop: AtomicBool,
    measuring: AtomicBool,
    completed: AtomicU64,
}

async fn client_loop(
    handle: ClientHandle,
    c: usize,
    workload: Workload,
    shared: Arc<Shared>,
) -> (Histogram<u64>, u64, u64) {
    let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("histogram bounds");
    let (mut ops, mut errors) = (0u64, 0u64);
    let mut operation = workload.operation(c);
    let mut sent = 0u64;
    while !shared.stop.load(Ordering::Relaxed) {
        if workload.keys > 1 {
            operation = workload.operation_at(c, sent);
        }
        sent += 1;
        let start = Instant::now();
        let result = handle
            .invoke_timeout(operation.clone(), workload.read_only, OP_TIMEOUT)
            .await;
        let ok = matches!(&result, Ok(reply) if workload.check(reply));
        shared.completed.fetch_add(1, Ordering::Relaxed);
        if !shared.measuring.load(Ordering::Relaxed) {
            continue;
        }
        if ok {
            ops += 1;
            let _ = hist.record((start.elapsed().as_micros() as u64).max(1));
        } else {
            errors += 1;
        }
    }
    (hist, ops, errors)
}

/// Runs `workload` with the given clients: `warmup`, then a `duration` window that is measured,
/// with a progress line per second labelled `label`. `pids` are the server processes.
pub async fn measure(
    label: &str,
    clients: &[ClientHandle],
    workload: Workload,
    pids: &[u32],
    warmup: Duration,
    duration: Duration,
) -> Measurement {
    let shared = Arc::new(Shared::default());
    let tasks: Vec<_> = clients
        .iter()
        .enumerate()
        .map(|(c, h)| tokio::spawn(client_loop(h.clone(), c, workload, shared.clone())))
        .collect();
    tokio::time::sleep(warmup).await;
    let me = [std::process::id()];
    let (cpu0, own0) = (cpu_us_sum(pids), cpu_us_sum(&me));
    let t0 = Instant::now();
    shared.measuring.store(true, Ordering::Relaxed);
    let per_second = progress(label, &shared, t0, duration).await;
    shared.measuring.store(false, Ordering::Relaxed);
    let seconds = t0.elapsed().as_secs_f64();
    let (cpu1, own1) = (cpu_us_sum(pids), cpu_us_sum(&me));
    shared.stop.store(true, Ordering::Relaxed);
    let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("histogram bounds");
    let (mut ops, mut errors, mut client_ops_min) = (0, 0, u64::MAX);
    for task in tasks {
        if let Ok((h, o, e)) = task.await {
            let _ = hist.add(h);
            ops += o;
            errors += e;
            client_ops_min = client_ops_min.min(o);
        }
    }
    let per_op = |us: u64| if ops > 0 { us as f64 / ops as f64 } else { 0.0 };
    Measurement {
        ops,
        errors,
        seconds,
        throughput: ops as f64 / seconds,
        p50_us: hist.value_at_quantile(0.5),
        p99_us: hist.value_at_quantile(0.99),
        p999_us: hist.value_at_quantile(0.999),
        mean_us: hist.mean(),
        cpu_us_per_op: per_op(cpu1.saturating_sub(cpu0)),
        client_cpu_us_per_op: per_op(own1.saturating_sub(own0)),
        client_ops_min: if client_ops_min == u64::MAX { 0 } else { client_ops_min },
        per_second,
    }
}

/// Prints a progress line per second until the window ends; returns each second's rate.
async fn progress(label: &str, shared: &Shared, t0: Instant, duration: Duration) -> Vec<f64> {
    let end = t0 + duration;
    let mut rates = Vec::new();
    let mut last = shared.completed.load(Ordering::Relaxed);
    let mut last_at = Instant::now();
    loop {
        let now = Instant::now();
        if now >= end {
            return rates;
        }
        tokio::time::sleep((end - now).min(Duration::from_secs(1))).await;
        let done = shared.completed.load(Ordering::Relaxed);
        let rate = (done - last) as f64 / last_at.elapsed().as_secs_f64().max(1e-6);
        (last, last_at) = (done, Instant::now());
        rates.push(rate);
        println!("  {label}  t={:>4.1}s  {rate:>9.0} ops/s", t0.elapsed().as_secs_f64());
    }
}

/// Runs each client's setup operation (if the workload has one).
pub async fn prepare(clients: &[ClientHandle], workload: Workload) -> Result<(), String> {
    for (c, handle) in clients.iter().enumerate() {
        if let Some(op) = workload.setup(c) {
            handle
                .invoke_timeout(op, false, OP_TIMEOUT * 3)
                .await
                .map_err(|e| format!("setup of workload {} failed: {e}", workload.name()))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workloads_parse_and_size_their_operations() {
        assert!(Workload::parse("0-0").is_err());
        let w = Workload::parse("4/0").unwrap();
        let KvOperation::Put { value, key } = KvOperation::decode(&w.operation(3)).unwrap() else {
            panic!("4/0 writes")
        };
        assert_eq!((value.len(), key.len()), (4096, 8));
        let r = Workload::parse("0/4").unwrap();
        assert!(matches!(KvOperation::decode(&r.operation(1)).unwrap(), KvOperation::Get { key } if key.len() == 8));
        assert!(r.check(&KvReply::Value(Some(Bytes::from(vec![0; 4096]))).encode()));
        assert!(!r.check(&KvReply::Done.encode()));
        assert!(Workload::parse("0/0").unwrap().check(&KvReply::Done.encode()));
        let ro = Workload::parse("0/0ro").unwrap();
        assert!(ro.read_only && ro.get && ro.name() == "0/0ro");
        assert!(matches!(KvOperation::decode(&ro.operation(1)).unwrap(), KvOperation::Get { key } if key.len() == 8));
        assert!(ro.check(&KvReply::Value(Some(Bytes::from(vec![0; 8]))).encode()));
        assert!(ro.setup(1).is_some());
        let get = Workload::parse("0/0get").unwrap();
        assert!(get.get && !get.read_only && get.name() == "0/0get");
        assert!(Workload::parse("0/0xx").is_err());
    }

    #[test]
    fn cpu_workloads_burn_on_the_clients_key_and_check_the_digest() {
        let w = Workload::parse("cpu200").unwrap();
        assert_eq!(w.name(), "cpu200");
        assert!(w.setup(1).is_none());
        let op = KvOperation::decode(&w.operation(3)).unwrap();
        assert!(matches!(op, KvOperation::Burn { micros: 200, ref key } if key.as_ref() == b"k0000003"));
        let mut kv = upright_core::kv::KvService::new();
        let reply = kv.apply(&op).encode();
        assert!(w.check(&reply));
        assert!(!w.check(&KvReply::Done.encode()));
        assert!(Workload::parse("cpu0").is_err() && Workload::parse("cpux").is_err());
        // cpuNxK: K keys per client, in turn.
        let spread = Workload::parse("cpu200x64").unwrap();
        assert_eq!((spread.name(), spread.keys), ("cpu200x64".to_string(), 64));
        let key_of = |n| match KvOperation::decode(&spread.operation_at(3, n)).unwrap() {
            KvOperation::Burn { key, .. } => key,
            _ => panic!("a burn"),
        };
        assert_eq!(key_of(1), key_of(65));
        assert_ne!(key_of(1), key_of(2));
        assert!(Workload::parse("cpu200x0").is_err() && Workload::parse("cpu200x100001").is_err());
    }
}

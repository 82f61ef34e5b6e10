//! What a replica reports: a status snapshot published by the event loop, rendered as Prometheus
//! text (`GET /metrics`) or as `key=value` lines (`GET /status`, read by `upright status`), served
//! over plain HTTP, on loopback unless the cluster file says otherwise, and only to requests that
//! carry the cluster's metrics token (`Authorization: Bearer <token>`) when it has one.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use crate::host::{HostStats, Progress};
use crate::storage::LogStats;

/// Snapshot of one replica, refreshed by its event loop.
#[derive(Clone, Debug, Default)]
pub struct Status {
    /// Replica id.
    pub replica: u32,
    /// Progress from the stages' notes.
    pub progress: Progress,
    /// Each stage's counters (dropped messages by reason, work done), by stage name.
    pub stage_stats: BTreeMap<String, BTreeMap<&'static str, u64>>,
    /// Each stage's log counters.
    pub log_stats: BTreeMap<String, LogStats>,
    /// Host counters.
    pub host: HostStats,
    /// Transport counters.
    pub net: BTreeMap<&'static str, u64>,
    /// Envelopes waiting in the inbox.
    pub inbox_depth: usize,
    /// Frames waiting per peer replica.
    pub outbound_depth: BTreeMap<u32, usize>,
    /// Storage recovery outcome per stage at start.
    pub recovery: BTreeMap<String, String>,
    /// Stages that started from empty storage because their files were corrupt.
    pub corrupt_recoveries: u64,
    /// `ok`, or `recovering` while a stage that lost its storage has not yet loaded state.
    pub health: String,
    /// Proactive recovery ([`crate::recovery`]).
    pub proactive: Proactive,
    /// Set by `POST /recover`; the event loop takes it.
    pub recover_requested: bool,
    /// The configuration epoch the replica runs in (docs/PROTOCOL.md "Reconfiguration").
    pub config_epoch: u64,
}

/// What the status says of proactive recovery.
#[derive(Clone, Debug, Default)]
pub struct Proactive {
    /// `none` (no recovery since this process started), `recovering` or `recovered`.
    pub state: String,
    /// The recovery's id: when it was asked for (Unix milliseconds); 0 if none.
    pub id: u64,
    /// Why: `command` or `schedule`.
    pub reason: String,
    /// Milliseconds from the request to completion (once recovered).
    pub millis: u64,
    /// The recovery point `H` the order member estimated (0 until then).
    pub point: u64,
    /// Bytes of state the execution member fetched to check and repair its state.
    pub state_bytes: u64,
    /// Pages it fetched (paged services).
    pub state_pages: u64,
    /// The next scheduled recovery (Unix milliseconds; 0: no schedule).
    pub next_scheduled_unix_ms: u64,
}

fn metric_name(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect()
}

impl Status {
    /// Prometheus text exposition format.
    pub fn prometheus(&self) -> String {
        let mut o = String::new();
        let r = self.replica;
        let p = &self.progress;
        let mut gauge = |name: &str, help: &str, value: u64| {
            let _ = writeln!(o, "# HELP upright_{name} {help}\n# TYPE upright_{name} gauge");
            let _ = writeln!(o, "upright_{name}{{replica=\"{r}\"}} {value}");
        };
        gauge("view", "Current view of the order member.", p.view);
        gauge("committed_seqno", "Highest committed batch.", p.committed);
        gauge(
            "batches_ordered_total",
            "Batches committed since start.",
            p.batches_committed,
        );
        gauge(
            "stable_checkpoint",
            "Highest stable order checkpoint.",
            p.stable_checkpoint,
        );
        gauge("executed_seqno", "Last executed batch.", p.executed);
        gauge("exec_checkpoint", "Last execution checkpoint.", p.exec_checkpoint);
        gauge("state_transfers_total", "Completed state transfers.", p.state_loads);
        gauge("pushes_total", "Messages the service pushed to clients.", p.pushes);
        gauge(
            "inbox_depth",
            "Envelopes waiting to be handled.",
            self.inbox_depth as u64,
        );
        gauge("group_commits_total", "Syncs before sends.", self.host.group_commits);
        gauge(
            "fsync_seconds_max_micros",
            "Longest fsync in microseconds.",
            self.host.fsync_max.as_micros() as u64,
        );
        gauge(
            "fsync_micros_total",
            "Total fsync time in microseconds.",
            self.host.fsync_total.as_micros() as u64,
        );
        gauge("sent_total", "Envelopes sent to other processes.", self.host.sent);
        gauge("local_total", "Envelopes between co-located stages.", self.host.local);
        gauge(
            "sent_ahead_total",
            "Envelopes sent ahead of a sync they did not depend on.",
            self.host.sent_ahead,
        );
        gauge(
            "corrupt_storage_recoveries",
            "Stages started empty after finding corrupt storage.",
            self.corrupt_recoveries,
        );
        let pr = &self.proactive;
        gauge(
            "proactive_recovering",
            "1 while a proactive recovery is in progress.",
            (pr.state == "recovering") as u64,
        );
        gauge(
            "proactive_recovery_millis",
            "Duration of the last completed proactive recovery.",
            pr.millis,
        );
        gauge(
            "proactive_recovery_state_bytes",
            "State bytes the last proactive recovery fetched.",
            pr.state_bytes,
        );
        let _ = writeln!(
            o,
            "# HELP upright_outbound_depth Frames waiting per peer.\n# TYPE upright_outbound_depth gauge"
        );
        for (peer, depth) in &self.outbound_depth {
            let _ = writeln!(o, "upright_outbound_depth{{replica=\"{r}\",peer=\"{peer}\"}} {depth}");
        }
        let _ = writeln!(o, "# HELP upright_stage_counter Stage counters (drops by reason, work done).\n# TYPE upright_stage_counter counter");
        for (stage, counters) in &self.stage_stats {
            for (name, value) in counters {
                let name = metric_name(name);
                let _ = writeln!(
                    o,
                    "upright_stage_counter{{replica=\"{r}\",stage=\"{stage}\",name=\"{name}\"}} {value}"
                );
            }
        }
        let _ = writeln!(o, "# HELP upright_net_counter Transport counters (drops and closes by reason).\n# TYPE upright_net_counter counter");
        let host_drops = self.host.dropped.iter();
        for (name, value) in self.net.iter().chain(host_drops) {
            let _ = writeln!(
                o,
                "upright_net_counter{{replica=\"{r}\",name=\"{}\"}} {value}",
                metric_name(name)
            );
        }
        o
    }

    /// `key=value` lines.
    pub fn key_values(&self) -> String {
        let p = &self.progress;
        let mut o = String::new();
        let _ = writeln!(o, "replica={}", self.replica);
        let _ = writeln!(o, "health={}", self.health);
        let _ = writeln!(o, "config_epoch={}", self.config_epoch);
        let _ = writeln!(o, "view={}", p.view);
        let _ = writeln!(o, "committed={}", p.committed);
        let _ = writeln!(o, "executed={}", p.executed);
        let _ = writeln!(o, "stable_checkpoint={}", p.stable_checkpoint);
        let _ = writeln!(o, "exec_checkpoint={}", p.exec_checkpoint);
        let _ = writeln!(o, "exec_checkpoint_digest={}", p.exec_checkpoint_digest);
        let _ = writeln!(o, "state_transfers={}", p.state_loads);
        let _ = writeln!(o, "corrupt_storage_recoveries={}", self.corrupt_recoveries);
        let pr = &self.proactive;
        let state = if pr.state.is_empty() { "none" } else { &pr.state };
        let _ = writeln!(o, "proactive_recovery={state}");
        let _ = writeln!(o, "proactive_recovery_id={}", pr.id);
        let _ = writeln!(o, "proactive_recovery_reason={}", pr.reason);
        let _ = writeln!(o, "proactive_recovery_millis={}", pr.millis);
        let _ = writeln!(o, "proactive_recovery_point={}", pr.point);
        let _ = writeln!(o, "proactive_recovery_state_bytes={}", pr.state_bytes);
        let _ = writeln!(o, "proactive_recovery_state_pages={}", pr.state_pages);
        let _ = writeln!(o, "proactive_recovery_next_unix_ms={}", pr.next_scheduled_unix_ms);
        for (stage, outcome) in &self.recovery {
            let _ = writeln!(o, "recovery_{stage}={outcome}");
        }
        for (stage, stats) in &self.stage_stats {
            for (name, value) in stats {
                let _ = writeln!(o, "stat_{stage}_{name}={value}");
            }
        }
        o
    }
}

/// Parses `key=value` lines.
pub fn parse_key_values(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect()
}

/// The samples of Prometheus text: each `series value` line with an integer value, as
/// `(series, value)`; comments and other lines are skipped.
pub fn prometheus_samples(text: &str) -> impl Iterator<Item = (&str, u64)> {
    text.lines().filter(|l| !l.starts_with('#')).filter_map(|line| {
        let (series, value) = line.rsplit_once(' ')?;
        Some((series, value.trim().parse().ok()?))
    })
}

/// The value of label `key` in a series `metric{key="value",...}`.
pub fn prometheus_label<'a>(series: &'a str, key: &str) -> Option<&'a str> {
    let labels = &series[series.find('{')? + 1..];
    labels
        .split(',')
        .find_map(|pair| pair.strip_prefix(key)?.strip_prefix("=\""))
        .and_then(|rest| rest.split('"').next())
}

/// Most bytes of a request head the endpoint reads.
const REQUEST_HEAD_BYTES_MAX: usize = 4096;

/// Whether the request head `request` carries `Authorization: Bearer <token>` (header name in any
/// case; the token compared in constant time).
fn authorized(request: &str, token: &str) -> bool {
    request.lines().skip(1).any(|line| {
        let Some((name, value)) = line.split_once(':') else {
            return false;
        };
        let Some(given) = value.trim().strip_prefix("Bearer ") else {
            return false;
        };
        name.trim().eq_ignore_ascii_case("authorization")
            && given.len() == token.len()
            && given.bytes().zip(token.bytes()).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
    })
}

/// Serves `GET /metrics` and `GET /status` from the published snapshot; with `token`, only to
/// requests that carry it (others get 401).
pub async fn serve_http(listener: TcpListener, status: Arc<Mutex<Status>>, token: Option<String>) {
    let token: Option<Arc<str>> = token.map(Arc::from);
    loop {
        let Ok((mut stream, _)) = listener.accept().await else {
            continue;
        };
        let status = status.clone();
        let token = token.clone();
        tokio::spawn(async move {
            // The request head, however it was split, up to its blank line (or 4 KiB, or 2 s).
            let mut buf = Vec::with_capacity(1024);
            let head = async {
                let mut chunk = [0u8; 1024];
                while !buf.windows(4).any(|w| w == b"\r\n\r\n") && buf.len() < REQUEST_HEAD_BYTES_MAX {
                    match stream.read(&mut chunk).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
            };
            if tokio::time::timeout(Duration::from_secs(2), head).await.is_err() || buf.is_empty() {
                return;
            }
            let request = String::from_utf8_lossy(&buf);
            let method = request.split_whitespace().next().unwrap_or("GET");
            let path = request.split_whitespace().nth(1).unwrap_or("/");
            let allowed = token.as_deref().is_none_or(|t| authorized(&request, t));
            let (code, body) = match (method, path) {
                _ if !allowed => ("401 Unauthorized", "a metrics token is required\n".to_string()),
                ("POST", "/recover") => {
                    let mut s = status.lock().expect("status lock");
                    if s.proactive.state == "recovering" {
                        ("409 Conflict", format!("recovery {} is in progress\n", s.proactive.id))
                    } else {
                        s.recover_requested = true;
                        ("202 Accepted", "recovery requested\n".to_string())
                    }
                }
                (_, path) => match path {
                    "/metrics" => ("200 OK", status.lock().expect("status lock").clone().prometheus()),
                    "/status" | "/" => ("200 OK", status.lock().expect("status lock").clone().key_values()),
                    _ => ("404 Not Found", "not found\n".to_string()),
                },
            };
            let challenge = if allowed { "" } else { "WWW-Authenticate: Bearer\r\n" };
            let response = format!(
                "HTTP/1.1 {code}\r\n{challenge}Content-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = stream.write_all(response.as_bytes()).await;
        });
    }
}

/// Fetches `path` from a metrics endpoint (used by `upright status` and tests), presenting
/// `token` if given; a status other than 200 is an error naming it.
pub async fn http_get(addr: std::net::SocketAddr, path: &str, token: Option<&str>) -> std::io::Result<String> {
    let (code, status, body) = http_request(addr, "GET", path, token).await?;
    if code != 200 {
        return Err(std::io::Error::other(format!("the endpoint answered {status:?}")));
    }
    Ok(body)
}

/// Sends `method path` to a metrics endpoint (`upright recover` POSTs `/recover`), presenting
/// `token` if given: the status code, the status line and the body.
pub async fn http_request(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    token: Option<&str>,
) -> std::io::Result<(u16, String, String)> {
    let mut stream = tokio::time::timeout(Duration::from_secs(2), tokio::net::TcpStream::connect(addr))
        .await
        .map_err(|_| std::io::Error::other("connect timed out"))??;
    let authorization = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    stream
        .write_all(
            format!(
                "{method} {path} HTTP/1.1\r\nHost: upright\r\n{authorization}Content-Length: 0\r\nConnection: close\r\n\r\n"
            )
            .as_bytes(),
        )
        .await?;
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(2), stream.read_to_end(&mut out))
        .await
        .map_err(|_| std::io::Error::other("read timed out"))??;
    let text = String::from_utf8_lossy(&out).to_string();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head.lines().next().unwrap_or_default();
    let code = status
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("not an HTTP answer: {status:?}")))?;
    Ok((code, status.to_string(), body.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_is_taken_only_from_an_authorization_bearer_header() {
        let head = |h: &str| format!("GET /status HTTP/1.1\r\nHost: x\r\n{h}\r\n\r\n");
        assert!(authorized(&head("Authorization: Bearer abc123"), "abc123"));
        assert!(authorized(&head("authorization:   Bearer abc123"), "abc123"));
        assert!(!authorized(&head("Authorization: Bearer abc124"), "abc123"));
        assert!(!authorized(&head("Authorization: Bearer abc12"), "abc123"));
        assert!(!authorized(&head("Authorization: Basic abc123"), "abc123"));
        assert!(!authorized(&head("X-Token: Bearer abc123"), "abc123"));
        // The request line is not a header.
        assert!(!authorized(
            "GET /Authorization:Bearer abc123 HTTP/1.1\r\n\r\n",
            "abc123"
        ));
    }

    #[tokio::test]
    async fn with_a_token_the_endpoint_answers_only_requests_that_carry_it() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let status = Arc::new(Mutex::new(Status {
            replica: 3,
            health: "ok".into(),
            config_epoch: 2,
            ..Status::default()
        }));
        tokio::spawn(serve_http(listener, status, Some("s3cret".into())));
        let refused = http_get(addr, "/status", None).await.unwrap_err().to_string();
        assert!(refused.contains("401"), "{refused}");
        assert!(http_get(addr, "/metrics", Some("wrong!")).await.is_err());
        let body = http_get(addr, "/status", Some("s3cret")).await.unwrap();
        assert!(body.contains("health=ok"), "{body}");
        assert!(body.contains("config_epoch=2"), "{body}");
        let metrics = http_get(addr, "/metrics", Some("s3cret")).await.unwrap();
        assert!(metrics.contains("upright_view{replica=\"3\"}"), "{metrics}");
    }

    #[test]
    fn prometheus_samples_and_labels_are_read_from_the_text() {
        let text = "# HELP upright_view View.\n\
                    upright_view{replica=\"2\"} 7\n\
                    upright_net_counter{replica=\"2\",name=\"net_dropped_stale\"} 2330\n\
                    upright_bad{replica=\"2\"} not-a-number\n";
        let samples: Vec<(&str, u64)> = prometheus_samples(text).collect();
        assert_eq!(samples.len(), 2);
        assert_eq!(samples[0], ("upright_view{replica=\"2\"}", 7));
        let (series, value) = samples[1];
        assert_eq!(value, 2330);
        assert_eq!(prometheus_label(series, "name"), Some("net_dropped_stale"));
        assert_eq!(prometheus_label(series, "replica"), Some("2"));
        assert_eq!(prometheus_label(series, "nam"), None);
        assert_eq!(prometheus_label("upright_view 7", "name"), None);
    }
}

//! A timeline of every message and disk flush, for latency analysis. Off unless the environment
//! variable [`ENV_DIR`] names a directory.
//!
//! When it is set, each process that calls [`start`] (replicas, and the process that hosts
//! upright clients, such as the Redis gateway of `upright demo`) appends one line per event to
//! `<dir>/<label>-<pid>.timeline`:
//!
//! ```text
//! <CLOCK_MONOTONIC nanoseconds> <event> <a> <b> <c>
//! ```
//!
//! All processes of one machine share that clock, so the files of a local cluster merge into one
//! timeline (one file per process: a process that hosts clients and then a replica keeps the
//! first label). `scripts/timeline.py <dir>` prints where a request's time goes, hop by hop
//! (docs/PERFORMANCE.md has a reading of it). Lines are buffered and appended in blocks of
//! [`BLOCK_BYTES`]; a process that is killed loses its last block, which a measurement can
//! ignore. While on, an event costs about a microsecond (a lock and a formatted line), which slows
//! a Redis SET benchmark by a few percent; while off, an atomic load.
//!
//! Events (peers are written `1000 + replica id`, or the client id):
//!
//! | event | a | b | c |
//! |---|---|---|---|
//! | `recv-<kind>`, `send-<kind>`, `local-<kind>` | sequence number, or client id | entries, or request id | sending or receiving peer (0 for local) |
//! | `recv-view-change`, `send-view-change` | the view it moves to | its signer | peer |
//! | `recv-new-view`, `send-new-view` | the view | the VIEW-CHANGEs attached (0: by reference) | peer |
//! | `entry` (after `send-pre-prepare`) | sequence number | client id | request id |
//! | `auth-item` (after `*-auth-request`) | client id | request id | peer |
//! | `wake` (a replica's event loop starts a round) | inputs waiting | 0 | 0 |
//! | `sync-start`, `sync-end` (a log's write and fsync) | 0 | 0 | 0 |
//! | `client-send` (a new request or a retransmission) | client id | request id | replicas sent to |
//! | `client-recv-<kind>` (e.g. `client-recv-reply`) | as for `recv-<kind>` | | sending replica |
//! | `client-deliver` (the client accepted a result) | client id | request id | 0 |
//!
//! Services add their own. The Redis gateway: `gateway-op` (an operation of `a` commands goes to
//! the cluster), `gateway-answer` (its result is back), `gateway-write` (`a` reply bytes written
//! to a connection), `gateway-read` (`a` bytes read from connection `b`).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use upright_core::message::PbftMessage;

use upright_core::ids::Principal;
use upright_core::message::Message;

/// The environment variable that switches the timeline on: the directory to write into.
pub const ENV_DIR: &str = "UPRIGHT_TIMELINE_DIR";

/// Buffered bytes appended to the file at once.
pub const BLOCK_BYTES: usize = 64 * 1024;

static ON: AtomicBool = AtomicBool::new(false);
static RECORDER: Mutex<Option<Recorder>> = Mutex::new(None);

struct Recorder {
    path: PathBuf,
    buf: Vec<u8>,
}

impl Recorder {
    fn write_out(&mut self) {
        if self.buf.is_empty() {
            return;
        }
        let written = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)
            .and_then(|mut f| f.write_all(&self.buf));
        if let Err(e) = written {
            tracing::warn!(path = %self.path.display(), error = %e, "timeline: cannot write; switched off");
            ON.store(false, Ordering::Relaxed);
        }
        self.buf.clear();
    }
}

/// Switches the timeline on for this process if [`ENV_DIR`] is set (once; later calls keep the
/// first label). `label` names the file, e.g. `replica-0` or `client`.
pub fn start(label: &str) {
    if let Some(dir) = std::env::var_os(ENV_DIR) {
        start_in(Path::new(&dir), label);
    }
}

fn start_in(dir: &Path, label: &str) {
    let mut recorder = RECORDER.lock().unwrap_or_else(|e| e.into_inner());
    if recorder.is_none() {
        *recorder = Some(Recorder {
            path: dir.join(format!("{label}-{}.timeline", std::process::id())),
            buf: Vec::with_capacity(BLOCK_BYTES + 256),
        });
        ON.store(true, Ordering::Relaxed);
    }
}

/// Whether events are recorded.
pub fn is_on() -> bool {
    ON.load(Ordering::Relaxed)
}

fn now_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: writes only into `ts`, which lives for the call.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(ts.tv_nsec as u64)
}

/// Records one event (nothing while off).
pub fn event(name: &str, a: u64, b: u64, c: u64) {
    if !is_on() {
        return;
    }
    let t = now_ns();
    let mut recorder = RECORDER.lock().unwrap_or_else(|e| e.into_inner());
    let Some(r) = recorder.as_mut() else { return };
    let _ = writeln!(r.buf, "{t} {name} {a} {b} {c}");
    if r.buf.len() >= BLOCK_BYTES {
        r.write_out();
    }
}

/// Appends what is buffered (at a clean shutdown).
pub fn flush() {
    if let Some(r) = RECORDER.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
        r.write_out();
    }
}

/// A principal as a timeline peer: `1000 + replica id`, or the client id.
pub fn peer(p: &Principal) -> u64 {
    match (p.replica(), p) {
        (Some(r), _) => 1000 + u64::from(r.0),
        (None, Principal::Client(c)) => u64::from(c.0),
        _ => u64::MAX,
    }
}

/// Records a message event `<direction>-<kind>` (nothing while off). A sent PRE-PREPARE is
/// followed by one `entry` event per request in its batch (once per receiver), an AUTH-REQ by one
/// `auth-item` (client id, request id, peer) per request.
pub fn message(direction: &str, m: &Message, peer: u64) {
    if !is_on() {
        return;
    }
    let (kind, a, b) = match m {
        Message::Pbft(PbftMessage::PrePrepare { seqno, batch, .. }) => {
            ("pre-prepare", seqno.0, batch.entries.len() as u64)
        }
        Message::Pbft(PbftMessage::Chain { seqno, batch, .. }) => ("chain", seqno.0, batch.entries.len() as u64),
        Message::Pbft(PbftMessage::Prepare { seqno, .. }) => ("prepare", seqno.0, 0),
        Message::Pbft(PbftMessage::Commit { seqno, .. }) => ("commit", seqno.0, 0),
        Message::Pbft(PbftMessage::ViewChange(vc)) => ("view-change", vc.value.new_view.0, u64::from(vc.signer.0)),
        Message::Pbft(PbftMessage::NewView(m)) => ("new-view", m.new_view.value.view.0, m.view_changes.len() as u64),
        Message::NextBatch { seqno, .. } => ("next-batch", seqno.0, 0),
        Message::BatchComplete { seqno, .. } => ("batch-complete", seqno.0, 0),
        Message::ClientRequest { client, request_id, .. } => ("client-request", u64::from(client.0), request_id.0),
        Message::AuthRequest { items } => ("auth-request", items.len() as u64, 0),
        Message::Reply { request_id, .. } => ("reply", 0, request_id.0),
        _ => ("other", 0, 0),
    };
    event(&format!("{direction}-{kind}"), a, b, peer);
    match m {
        Message::AuthRequest { items } => {
            for item in items {
                event(
                    "auth-item",
                    u64::from(item.entry.client.0),
                    item.entry.request_id.0,
                    peer,
                );
            }
        }
        Message::Pbft(PbftMessage::PrePrepare { seqno, batch, .. }) if direction == "send" => {
            for e in &batch.entries {
                event("entry", seqno.0, u64::from(e.entry.client.0), e.entry.request_id.0);
            }
        }
        _ => {}
    }
}

/// Switches the timeline off and forgets its file (tests: the switch is process-wide).
#[cfg(test)]
fn stop() {
    ON.store(false, Ordering::Relaxed);
    *RECORDER.lock().unwrap_or_else(|e| e.into_inner()) = None;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The switch is process-wide, so other tests running meanwhile may add lines of their own:
    /// only this test's lines are looked at.
    #[test]
    fn events_are_lines_of_monotonic_time_name_and_three_numbers() {
        let dir = tempfile::tempdir().unwrap();
        event("timeline-test-while-off", 1, 2, 3);
        start_in(dir.path(), "replica-7");
        start_in(Path::new("/nonexistent"), "second-start-keeps-the-first");
        assert!(is_on());
        event("timeline-test-wake", 4, 0, 0);
        let prepare = Message::Pbft(PbftMessage::Prepare {
            view: upright_core::ids::View(0),
            seqno: upright_core::ids::SeqNo(4242),
            digest: upright_core::crypto::Digest::default(),
        });
        message("recv", &prepare, 1002);
        flush();
        stop();
        assert!(!is_on());
        let path = dir.path().join(format!("replica-7-{}.timeline", std::process::id()));
        let text = std::fs::read_to_string(path).unwrap();
        let find = |rest: &str| -> u64 {
            let line = text.lines().find(|l| l.split_once(' ').map(|(_, r)| r) == Some(rest));
            let line = line.unwrap_or_else(|| panic!("no line `<time> {rest}` in:\n{text}"));
            line.split(' ').next().unwrap().parse().unwrap()
        };
        let wake = find("timeline-test-wake 4 0 0");
        let recv = find("recv-prepare 4242 0 1002");
        assert!(wake > 0 && recv >= wake);
        assert!(!text.contains("timeline-test-while-off"));
    }
}

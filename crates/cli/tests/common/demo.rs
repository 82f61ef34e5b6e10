//! `upright demo` for the tests of real clients (Redis, ZooKeeper): four replicas and the gateway,
//! replica 2 Byzantine (its service corrupts its replies).
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A free loopback port (starting from one derived from the process id).
pub fn free_port() -> u16 {
    let start = std::process::id().wrapping_mul(7919) % 10_000;
    (0..10_000)
        .map(|i| 21_000 + ((start + i) % 10_000) as u16)
        .find(|p| std::net::TcpListener::bind(("127.0.0.1", *p)).is_ok())
        .expect("a free loopback port")
}

/// A running `upright demo`; stopped with SIGINT when dropped.
pub struct Demo {
    /// The demo process.
    pub child: Child,
    /// The log file of replica 2 (the corrupting one).
    pub log_dir: String,
    /// Every line the demo printed so far.
    pub lines: Arc<Mutex<Vec<String>>>,
}

impl Demo {
    /// SIGKILLs replica `id`'s process (the demo restarts it); false if none was found.
    pub fn kill_replica(&self, id: u32) -> bool {
        let dir = std::path::Path::new(&self.log_dir)
            .parent()
            .expect("log in the demo's directory");
        let config = dir.join("cluster.toml").display().to_string();
        let want = ["replica", "--config", config.as_str(), "--id", &id.to_string()].join("\0");
        let Ok(entries) = std::fs::read_dir("/proc") else {
            return false;
        };
        for entry in entries.flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
                continue;
            };
            let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
            if String::from_utf8_lossy(&cmdline).contains(&want) {
                unsafe { libc::kill(pid, libc::SIGKILL) };
                return true;
            }
        }
        false
    }

    /// Waits up to `timeout` for a line of the demo's containing `text`.
    pub fn wait_for_line(&self, text: &str, timeout: Duration) -> bool {
        let until = Instant::now() + timeout;
        while Instant::now() < until {
            if self.lines.lock().unwrap().iter().any(|l| l.contains(text)) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        false
    }
}

impl Drop for Demo {
    fn drop(&mut self) {
        // SIGINT: the demo stops its replicas on Ctrl-C.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGINT) };
        let until = Instant::now() + Duration::from_secs(10);
        while Instant::now() < until {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `upright demo --port PORT` with replica 2 running a corrupting store
/// (`UPRIGHT_TEST_CORRUPT_REPLICA=2`) and waits until it serves.
pub fn start_demo(port: u16) -> Demo {
    start_service_demo(
        "redis",
        port,
        &format!("Redis protocol (RESP2/RESP3) on 127.0.0.1:{port}"),
    )
}

/// Starts `upright demo --service SERVICE --port PORT` with replica 2 corrupting (as
/// [`start_demo`]) and waits for the line `ready` that says the gateway serves.
pub fn start_service_demo(service: &str, port: u16, ready: &str) -> Demo {
    start_demo_running(service, port, ready, &["--env", "UPRIGHT_TEST_CORRUPT_REPLICA=2"])
}

/// Starts `upright demo --service SERVICE --port PORT` with `extra` arguments (`--env NAME=VALUE`
/// sets an environment variable of the demo instead) and waits for the line `ready`.
#[allow(dead_code)]
pub fn start_demo_running(service: &str, port: u16, ready: &str, extra: &[&str]) -> Demo {
    let mut command = Command::new(env!("CARGO_BIN_EXE_upright"));
    command.args(["demo", "--service", service, "--port", &port.to_string()]);
    let mut rest = extra.iter();
    while let Some(arg) = rest.next() {
        if *arg == "--env" {
            let (name, value) = rest
                .next()
                .expect("--env NAME=VALUE")
                .split_once('=')
                .expect("NAME=VALUE");
            command.env(name, value);
        } else {
            command.arg(arg);
        }
    }
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start upright demo");
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let lines = Arc::new(Mutex::new(Vec::new()));
    let kept = lines.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            println!("demo: {line}");
            kept.lock().unwrap().push(line.clone());
            let _ = tx.send(line);
        }
    });
    let mut log_dir = String::new();
    let until = Instant::now() + Duration::from_secs(120);
    loop {
        let line = rx
            .recv_timeout(until.saturating_duration_since(Instant::now()))
            .expect("upright demo did not announce its gateway's port within 120 s");
        if let Some(i) = line.find("log ") {
            if line.contains("replica 2:") {
                log_dir = line[i + 4..].trim().to_string();
            }
        }
        if line.contains(ready) {
            break;
        }
    }
    Demo { child, log_dir, lines }
}

/// Runs the Python client script `tests/NAME` against the gateway on `port` and returns its
/// output; fails the test (with the script's output) unless it exits 0.
pub fn run_python_checks(name: &str, port: u16, what: &str) -> String {
    let script = format!("{}/tests/{name}", env!("CARGO_MANIFEST_DIR"));
    let out = Command::new("python3")
        .arg(&script)
        .arg(port.to_string())
        .output()
        .expect("run python3");
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    print!("{stdout}");
    assert!(
        out.status.success(),
        "{what} checks failed: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// Counter `name` of the `/status` page served at `addr` (a replica's metrics address); 0 if
/// the page cannot be read or lacks it.
#[allow(dead_code)]
pub fn status_counter_at(addr: &str, name: &str) -> u64 {
    use std::io::{Read, Write};
    let Ok(mut stream) = std::net::TcpStream::connect(addr) else {
        return 0;
    };
    let _ = write!(stream, "GET /status HTTP/1.0\r\nHost: {addr}\r\n\r\n");
    let mut body = String::new();
    let _ = stream.read_to_string(&mut body);
    body.lines()
        .filter_map(|l| l.split_once([' ', '=', ':']))
        .find(|(k, _)| k.trim() == name)
        .and_then(|(_, v)| v.trim().trim_matches('"').parse().ok())
        .unwrap_or(0)
}

impl Demo {
    /// Counter `name` of replica `id`'s `/status` page (the metrics address the demo printed).
    #[allow(dead_code)]
    pub fn status_counter(&self, id: u32, name: &str) -> u64 {
        let lines = self.lines.lock().unwrap().clone();
        lines
            .iter()
            .find(|l| l.contains(&format!("replica {id}:")))
            .and_then(|l| l.split("metrics http://").nth(1))
            .and_then(|rest| rest.split('/').next())
            .map_or(0, |addr| status_counter_at(addr, name))
    }
}

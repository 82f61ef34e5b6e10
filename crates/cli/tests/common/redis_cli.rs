//! Running the real Redis command-line client from a test (shared by the Redis test files).

use std::process::Command;

/// Whether `cmd --version` runs.
pub fn have(cmd: &str) -> bool {
    Command::new(cmd)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// `redis-cli -p port args...`: its output without the trailing newline; redis-cli must exit 0.
pub fn cli(port: u16, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args(["-p", &port.to_string()])
        .args(args)
        .output()
        .expect("run redis-cli");
    assert!(out.status.success(), "redis-cli {args:?} failed: {out:?}");
    String::from_utf8_lossy(&out.stdout).trim_end().to_string()
}

//! Redis's own test suite (Redis 7.2, in its external-server mode) against `upright demo`, with
//! replica 2 Byzantine (its store corrupts every value and reply): the units that pass fully,
//! with the tests they skip named and the reason for each in docs/SERVICES.md.
//!
//! The suite is not part of this repository: it is read from `$UPRIGHT_REDIS_TESTS`, or
//! `../shared/redis-tests` beside the workspace. It needs `tclsh` (Debian `tcl8.6`, which
//! `.ci/run` installs). Without either the test says loudly that it skipped.

use std::path::{Path, PathBuf};
use std::process::Command;

#[path = "common/demo.rs"]
mod demo;
use demo::{free_port, start_demo};

/// Units that pass fully, each with the tests skipped in it (and why, in a comment).
const UNITS: &[(&str, &[&str])] = &[
    (
        "unit/type/hash",
        // Both serialize values with DUMP/RESTORE (Redis' RDB format), which the store does not speak.
        &[
            "Hash ziplist of various encodings",
            "Hash ziplist of various encodings - sanitize dump",
        ],
    ),
    ("unit/type/incr", &[]),
    ("unit/type/string", &[]),
    ("unit/type/set", &[]),
    (
        "unit/type/list",
        &[
            // DUMP/RESTORE (Redis' RDB format).
            "List of various encodings",
            "List of various encodings - sanitize dump",
            // Reads rdb_changes_since_last_save from INFO persistence: the store has no RDB.
            "BLPOP/BLMOVE should increase dirty",
        ],
    ),
    ("unit/type/zset", &[]),
    (
        "unit/multi",
        &[
            // Lua scripting (EVAL) with CONFIG SET lua-time-limit.
            "MULTI and script timeout",
            "EXEC and script timeout",
            "MULTI-EXEC body and script timeout",
            "just EXEC and script timeout",
            // Streams (XREADGROUP): not a type the store keeps.
            "Blocking commands ignores the timeout",
        ],
    ),
    (
        "unit/pubsub",
        &[
            // Lua scripting (EVAL).
            "publish to self inside script",
            // Streams: not a type the store keeps.
            "Keyspace notifications: stream events test",
        ],
    ),
    (
        "unit/keyspace",
        // Streams: not a type the store keeps.
        &["COPY basic usage for stream", "COPY basic usage for stream-cgroups"],
    ),
    ("unit/expire", &[]),
    ("unit/scan", &[]),
    ("unit/protocol", &[]),
];

fn suite() -> Option<PathBuf> {
    let from_env = std::env::var_os("UPRIGHT_REDIS_TESTS").map(PathBuf::from);
    let beside = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/redis-tests");
    [from_env, Some(beside)]
        .into_iter()
        .flatten()
        .find(|p| p.join("runtest").is_file())
}

/// The harness' output without its terminal colour sequences (`ESC [ ... m`).
fn strip_colors(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for d in chars.by_ref() {
                if d == 'm' {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

fn have_tclsh() -> bool {
    Command::new("tclsh")
        .arg("/dev/null")
        .status()
        .is_ok_and(|s| s.success())
}

#[test]
fn redis_own_suite_passes_its_units_against_the_demo() {
    let Some(suite) = suite() else {
        println!("SKIPPED: Redis' test suite not found (set UPRIGHT_REDIS_TESTS or provide ../shared/redis-tests)");
        return;
    };
    if !have_tclsh() {
        println!("SKIPPED: tclsh missing (Debian tcl8.6)");
        return;
    }
    // The harness writes under tests/tmp: run a copy.
    let work = tempfile::tempdir().unwrap();
    let copy = work.path().join("redis-tests");
    let status = Command::new("cp").arg("-r").arg(&suite).arg(&copy).status().unwrap();
    assert!(status.success(), "cannot copy the suite from {}", suite.display());

    let port = free_port();
    let _demo = start_demo(port);
    for (unit, skipped) in UNITS {
        let mut cmd = Command::new("./runtest");
        cmd.current_dir(&copy).args([
            "--host",
            "127.0.0.1",
            "--port",
            &port.to_string(),
            "--singledb",
            "--ignore-encoding",
            "--ignore-digest",
            "--single",
            unit,
            "--tags",
            "-needs:debug",
            "--tags",
            "-needs:repl",
            "--tags",
            "-needs:save",
            // CONFIG SET maxmemory: a server internal the gateway does not expose.
            "--tags",
            "-needs:config-maxmemory",
        ]);
        for name in *skipped {
            cmd.args(["--skiptest", name]);
        }
        let started = std::time::Instant::now();
        let out = cmd.output().expect("run the suite");
        let text = strip_colors(&String::from_utf8_lossy(&out.stdout));
        let count = |tag: &str| text.lines().filter(|l| l.starts_with(&format!("[{tag}]:"))).count();
        let (ok, err, exception) = (count("ok"), count("err"), count("exception"));
        println!(
            "{unit}: {ok} passed, {err} failed, {exception} exceptions, {} skipped by name, in {:.1} s",
            skipped.len(),
            started.elapsed().as_secs_f64()
        );
        assert!(
            out.status.success() && err == 0 && exception == 0 && ok > 0,
            "{unit} did not pass fully against upright demo:\n{text}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

//! Per-command statistics for INFO commandstats, as Redis keeps them: calls, time, calls
//! refused before running (wrong arity) and calls answered with an error. The time is what the
//! gateway measures from reading a command to having its reply: agreement included, so it is
//! the latency a client sees, not Redis' execution time alone.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Instant;

#[derive(Clone, Copy, Debug, Default)]
struct Stat {
    calls: u64,
    usec: u64,
    rejected: u64,
    failed: u64,
}

/// The gateway's command statistics (reset by CONFIG RESETSTAT).
#[derive(Debug, Default)]
pub struct CommandStats {
    table: Mutex<BTreeMap<&'static str, Stat>>,
}

impl CommandStats {
    fn with(&self, name: &'static str, f: impl FnOnce(&mut Stat)) {
        f(self
            .table
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(name)
            .or_default());
    }

    /// `name` was refused before it ran (wrong number of arguments).
    pub fn rejected(&self, name: &'static str) {
        self.with(name, |s| s.rejected += 1);
    }

    /// `name` was called (counted when read, so a blocked call counts at once, and once).
    pub fn called(&self, name: &'static str) {
        self.with(name, |s| s.calls += 1);
    }

    /// A call of `name` read at `started` was answered (`failed`: with an error).
    pub fn answered(&self, name: &'static str, started: Instant, failed: bool) {
        let usec = started.elapsed().as_micros() as u64;
        self.with(name, |s| {
            s.usec += usec;
            s.failed += u64::from(failed);
        });
    }

    /// Forgets everything (CONFIG RESETSTAT).
    pub fn reset(&self) {
        self.table.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }

    /// The `# Commandstats` section of INFO.
    pub fn render(&self) -> String {
        let table = self.table.lock().unwrap_or_else(|e| e.into_inner());
        let mut out = String::from("# Commandstats\r\n");
        for (name, s) in table.iter() {
            let per_call = if s.calls == 0 {
                0.0
            } else {
                s.usec as f64 / s.calls as f64
            };
            out.push_str(&format!(
                "cmdstat_{name}:calls={},usec={},usec_per_call={per_call:.2},rejected_calls={},failed_calls={}\r\n",
                s.calls, s.usec, s.rejected, s.failed
            ));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_calls_refusals_and_failures_per_command() {
        let stats = CommandStats::default();
        let t = Instant::now();
        for _ in 0..2 {
            stats.called("get");
        }
        stats.answered("get", t, false);
        stats.answered("get", t, true);
        stats.rejected("get");
        stats.called("blpop");
        let text = stats.render();
        assert!(text.contains("\r\ncmdstat_get:calls=2,usec="), "{text}");
        assert!(text.contains(",rejected_calls=1,failed_calls=1\r\n"), "{text}");
        assert!(text.contains("cmdstat_blpop:calls=1,"), "{text}");
        stats.reset();
        assert_eq!(stats.render(), "# Commandstats\r\n");
    }
}

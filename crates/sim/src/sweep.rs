//! Running many seeds: the shared driver of the CLI and the seed-sweep tests.

use crate::faults::{expected_classes, FaultCounts};
use crate::options::SimOptions;
use crate::report::{SimReport, Summary};

/// The outcome of a sweep.
#[derive(Clone, Debug, Default)]
pub struct Sweep {
    /// Totals.
    pub summary: Summary,
    /// Reports of the seeds with violations.
    pub failures: Vec<(SimOptions, SimReport)>,
}

impl Sweep {
    /// Fault classes the configuration should inject that never were.
    pub fn missing_classes(&self, r: usize) -> Vec<&'static str> {
        expected_classes(r)
            .into_iter()
            .filter(|c| self.summary.counts.get(c) == 0)
            .collect()
    }

    /// A readable account of the failures: each seed's first violations and its replay command.
    pub fn describe_failures(&self, per_seed: usize) -> String {
        let mut text = String::new();
        for (opts, report) in &self.failures {
            for v in report.violations.iter().take(per_seed) {
                text.push_str(&format!("seed {}: {v}\n", report.seed));
            }
            text.push_str(&format!("replay: {}\n", opts.replay_command()));
        }
        text
    }

    /// Total fault counts.
    pub fn counts(&self) -> &FaultCounts {
        &self.summary.counts
    }
}

/// Runs seeds `first..first + n` with options built by `make(seed)`.
pub fn sweep(first: u64, n: u64, make: impl Fn(u64) -> SimOptions) -> Sweep {
    let mut out = Sweep::default();
    for seed in first..first + n {
        let opts = make(seed);
        let report = crate::sim::run(opts.clone());
        out.summary.add(&report);
        if !report.violations.is_empty() {
            out.failures.push((opts, report));
        }
    }
    out
}

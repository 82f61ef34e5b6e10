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

    /// No violation, fault class `class` injected at least `n` times, and at least `20 n`
    /// operations done (for runs whose fault generator draws only some classes: Twins,
    /// mutation).
    pub fn assert_clean_with(&self, class: &str, n: u64) {
        let line = self.summary.line(&[]);
        println!("{line}");
        assert!(self.failures.is_empty(), "{}\n{line}", self.describe_failures(3));
        assert!(self.counts().get(class) >= n, "too little {class}: {line}");
        assert!(self.summary.ops_completed > n * 20, "too little work done: {line}");
    }

    /// The seed-sweep tests' verdict on `seeds` seeds of a configuration with `r` Byzantine
    /// faults: no violation, every fault class the configuration should inject injected, and at
    /// least 20 operations completed per seed. Prints the summary line; panics with the failures
    /// (and their replay commands) otherwise.
    pub fn assert_clean(&self, r: usize, seeds: u64) {
        let line = self.summary.line(&expected_classes(r));
        println!("{line}");
        assert!(self.failures.is_empty(), "{}\n{line}", self.describe_failures(3));
        let missing = self.missing_classes(r);
        assert!(missing.is_empty(), "fault classes never injected: {missing:?}\n{line}");
        assert!(self.summary.ops_completed > seeds * 20, "too little work done: {line}");
        // Where the service pushed and replicas lied, some lied in pushes too.
        if r > 0 && self.summary.tallies.pushes_delivered > 0 {
            let forged = self.summary.counts.get(crate::byzantine::FORGED_PUSH_CLASS);
            assert!(forged > 0, "pushes flowed but none was forged: {line}");
        }
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

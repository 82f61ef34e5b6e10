//! The outcome of one run and the summary over many.

use std::collections::BTreeMap;

use upright_core::ids::Principal;

use crate::faults::FaultCounts;

/// What one seed produced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SimReport {
    /// The seed.
    pub seed: u64,
    /// Every checker violation (empty = the run passed).
    pub violations: Vec<String>,
    /// Injections by fault class.
    pub fault_counts: BTreeMap<&'static str, u64>,
    /// Operations correct clients completed.
    pub ops_completed: u64,
    /// The same, per correct client.
    pub ops_by_client: Vec<u64>,
    /// BLAKE3 over every delivered message and fired timer, in order.
    pub trace_hash: [u8; 32],
    /// Virtual time at the end of the run, microseconds.
    pub end_us: u64,
    /// Counters of every stage that was up at the end (for diagnosis).
    pub stage_stats: Vec<(Principal, BTreeMap<&'static str, u64>)>,
    /// What the run did besides operations (read paths, pushes, heartbeats, transfers).
    pub tallies: Tallies,
}

/// Counts of one run, or summed over runs, shown at the end of the summary line.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tallies {
    /// Results correct clients accepted on the read-only path.
    pub read_only_delivered: u64,
    /// Read-only attempts of correct clients that fell back to the ordered path.
    pub read_only_fallbacks: u64,
    /// Serializable reads correct clients got answers to.
    pub serializable_reads: u64,
    /// Pushed messages correct clients received.
    pub pushes_delivered: u64,
    /// Those of them in object streams (selective execution).
    pub stream_pushes_delivered: u64,
    /// Ordered reads of a watched key that found a new value after its watch event, as the
    /// watch-order checker requires (the KV under selective execution).
    pub watch_order_checks: u64,
    /// Push gaps correct clients were told of.
    pub push_gaps: u64,
    /// Heartbeat batches ordered, as counted by the order members up at the end of the run.
    pub heartbeats: u64,
    /// State transfers completed by the execution members up at the end of the run.
    pub state_transfers: u64,
    /// Pages those transfers fetched (paged services only).
    pub pages_transferred: u64,
    /// ZooKeeper sessions the clients were told had expired (`--service zk` only).
    pub sessions_expired: u64,
    /// ZooKeeper watch events the clients received (`--service zk` only).
    pub watch_events: u64,
    /// NFS commits that lost the race for their version and found again (`--service fs` only).
    pub version_conflicts: u64,
    /// Key refreshes (NEW-KEYs started) of the replicas up at the end (since their last start)
    /// and the clients (`--key-refresh` only).
    pub keys_refreshed: u64,
    /// Replicas that began a proactive recovery (`--recovery`), and those that completed it
    /// (order member at its recovery point, execution member's state checked).
    pub recoveries: u64,
    /// See `recoveries`.
    pub recoveries_completed: u64,
    /// Model operations the correct clients completed.
    pub ops_completed: u64,
}

impl Tallies {
    /// Adds another run's.
    pub fn add(&mut self, other: &Tallies) {
        self.read_only_delivered += other.read_only_delivered;
        self.read_only_fallbacks += other.read_only_fallbacks;
        self.serializable_reads += other.serializable_reads;
        self.pushes_delivered += other.pushes_delivered;
        self.stream_pushes_delivered += other.stream_pushes_delivered;
        self.watch_order_checks += other.watch_order_checks;
        self.push_gaps += other.push_gaps;
        self.heartbeats += other.heartbeats;
        self.state_transfers += other.state_transfers;
        self.pages_transferred += other.pages_transferred;
        self.sessions_expired += other.sessions_expired;
        self.watch_events += other.watch_events;
        self.version_conflicts += other.version_conflicts;
        self.keys_refreshed += other.keys_refreshed;
        self.recoveries += other.recoveries;
        self.recoveries_completed += other.recoveries_completed;
        self.ops_completed += other.ops_completed;
    }

    /// `, read_only_delivered: N, ...`: the end of the summary line.
    fn line(&self) -> String {
        let mut line = format!(
            ", read_only_delivered: {}, read_only_fallbacks: {}, serializable_reads: {}, pushes_delivered: {}, push_gaps: {}, heartbeats: {}, state_transfers: {}, pages_transferred: {}",
            self.read_only_delivered,
            self.read_only_fallbacks,
            self.serializable_reads,
            self.pushes_delivered,
            self.push_gaps,
            self.heartbeats,
            self.state_transfers,
            self.pages_transferred
        );
        if self.sessions_expired + self.watch_events > 0 {
            line.push_str(&format!(
                ", sessions_expired: {}, watch_events: {}",
                self.sessions_expired, self.watch_events
            ));
        }
        if self.stream_pushes_delivered > 0 {
            line.push_str(&format!(
                ", stream_pushes_delivered: {}, watch_order_checks: {}",
                self.stream_pushes_delivered, self.watch_order_checks
            ));
        }
        if self.version_conflicts > 0 {
            line.push_str(&format!(", version_conflicts: {}", self.version_conflicts));
        }
        if self.keys_refreshed > 0 {
            line.push_str(&format!(", keys_refreshed: {}", self.keys_refreshed));
        }
        if self.recoveries > 0 {
            line.push_str(&format!(
                ", recoveries: {}, recoveries_completed: {}",
                self.recoveries, self.recoveries_completed
            ));
        }
        line.push_str(&format!(", ops_completed: {}", self.ops_completed));
        line
    }
}

/// Totals over many seeds.
#[derive(Clone, Debug, Default)]
pub struct Summary {
    /// Seeds run.
    pub seeds: u64,
    /// Seeds with at least one violation.
    pub violations: u64,
    /// Injections by class, summed.
    pub counts: FaultCounts,
    /// Operations completed, summed.
    pub ops_completed: u64,
    /// The runs' tallies, summed.
    pub tallies: Tallies,
}

impl Summary {
    /// Adds one run.
    pub fn add(&mut self, report: &SimReport) {
        self.seeds += 1;
        self.violations += (!report.violations.is_empty()) as u64;
        self.counts.add(&FaultCounts(report.fault_counts.clone()));
        self.ops_completed += report.ops_completed;
        self.tallies.add(&report.tallies);
    }

    /// The final line: `seeds: N, violations: V, loss: X, duplication: X, ...` with every class in
    /// `classes` (in that order) and any other class that was counted.
    pub fn line(&self, classes: &[&'static str]) -> String {
        let mut line = format!("seeds: {}, violations: {}", self.seeds, self.violations);
        for class in classes {
            line.push_str(&format!(", {class}: {}", self.counts.get(class)));
        }
        for (class, n) in &self.counts.0 {
            if !classes.contains(class) {
                line.push_str(&format!(", {class}: {n}"));
            }
        }
        line.push_str(&self.tallies.line());
        line
    }
}

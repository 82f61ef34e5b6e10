//! What one simulated run is: seed, fault model, size, length, sabotage.

use upright_core::config::{Knobs, Sabotage};

use crate::service::ServiceKind;

/// A deliberately broken protocol mode (`--sabotage NAME`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SabotageMode {
    /// Commit with one vote short of the quorum.
    ShortQuorum,
    /// Accept messages without checking their MACs.
    SkipMac,
    /// Execute before commit.
    EarlyExecute,
    /// Accept read-only results on `r + 1` matching replies instead of all execution members.
    WeakReadQuorum,
    /// Accept serializable reads on one answer instead of `r + 1` matching ones.
    WeakSerializableQuorum,
    /// Accept pushed messages on one copy instead of `r + 1` matching ones.
    WeakPushQuorum,
    /// Every execution member runs a service that stores wrong values (a bug all replicas share,
    /// so only the model of the service's commands can see it): the Redis store's corrupting
    /// stand-in, or a KV that stores every put's value with a byte appended.
    CorruptService,
    /// Install pages fetched during state transfer without checking them (a replica serving
    /// wrong state is placed on an execution member; run with `--service paged-kv`).
    UncheckedPages,
    /// Every replica's disk acknowledges syncs without writing anything (the host's group
    /// commit then protects nothing), and the plan holds a power loss: acknowledged state is
    /// lost.
    LyingDisk,
    /// The ZooKeeper clients (`--service zk`) hand a reply on without waiting for the watch
    /// events its session was sent before it: a client can see a watched node change before the
    /// event.
    UnorderedEvents,
    /// Order members count the primary once for each distinct batch it proposed for a slot
    /// (`Sabotage::CountProposalsTwice`): a mutating primary (`--mutate`), which now and then
    /// sends an altered PRE-PREPARE beside the honest one, is counted twice.
    CountProposalsTwice,
    /// A recovering execution member keeps trusting its stored state
    /// (`Sabotage::SkipRecoveryCheck`); the plan recovers every replica in turn, each after an
    /// attacker rewrote its stored checkpoint (`--recovery`).
    SkipRecoveryCheck,
    /// Key rings keep retired keys (`Sabotage::KeepRetiredKeys`), with key refresh on, lossy
    /// links and a replica replaying old envelopes.
    KeepRetiredKeys,
    /// Replicas' keys do not bind the configuration epoch
    /// (`Sabotage::SharedConfigurationKeys`); the run reconfigures (`--reconfiguration`).
    SharedConfigurationKeys,
    /// LCR members decide a broadcast as soon as it arrives, before it is stable and in arrival
    /// order (`Sabotage::UnstableDelivery`); the run uses `--protocol lcr` (`r = 0`).
    LcrDeliverUnstable,
    /// Clients accept tentative replies on `r + 1` matching ones instead of
    /// `q.tentative_reply()` (`Sabotage::TentativeSmallQuorum`).
    TentativeSmallQuorum,
    /// Execution members keep a tentatively executed batch that a view change replaced
    /// (`Sabotage::TentativeNoRollback`).
    TentativeNoRollback,
    /// Under `--protocol quorum`, the view change leaves the speculative claims out
    /// (`Sabotage::QuorumDropSpeculative`): what clients committed in a Quorum phase may be
    /// replaced. The run uses `--protocol quorum`.
    QuorumDropSpeculative,
    /// Under `--protocol chain`, a member accepts its predecessor's CHAIN without the votes of
    /// the rest of its predecessor set (`Sabotage::ChainSkipCheck`), so a faulty member can hand
    /// its successors a batch the members before it never accepted. The run uses `--protocol
    /// chain`, with a faulty member mutating what it forwards.
    ChainSkipCheck,
    /// Clients accept an ordered reply on `r` matching copies (`Sabotage::WeakReplyQuorum`);
    /// the run uses selective execution, where only an object's `r + 1` maintainers answer,
    /// with an execution member sending wrong replies.
    WeakReplyQuorum,
    /// Members install an object's state from one maintainer's OBJECT-CP
    /// (`Sabotage::SingleObjectCopy`); the run uses selective execution with an execution
    /// member lying in its object checkpoints.
    SingleObjectCopy,
    /// Under separate stages, an execution member accepts its same-index order member's
    /// NEXT-BATCH alone (`Sabotage::SeparateNextBatch`); the run separates the stages, with an
    /// order member sending fabricated batches.
    SeparateNextBatch,
    /// Members installing an object from OBJECT-CP keep their own stale push streams of it
    /// (`Sabotage::StaleStreams`); the run uses selective execution with the KV's watches.
    StaleStreams,
    /// Clients deliver a reply without waiting for the pushes before it of the streams its
    /// request announced (`Sabotage::UnheldReplies`); the run uses selective execution with the
    /// KV's watches.
    UnheldReplies,
}

impl SabotageMode {
    /// Every mode.
    pub const ALL: [SabotageMode; 24] = [
        SabotageMode::ShortQuorum,
        SabotageMode::SkipMac,
        SabotageMode::EarlyExecute,
        SabotageMode::WeakReadQuorum,
        SabotageMode::WeakSerializableQuorum,
        SabotageMode::WeakPushQuorum,
        SabotageMode::CorruptService,
        SabotageMode::UncheckedPages,
        SabotageMode::LyingDisk,
        SabotageMode::UnorderedEvents,
        SabotageMode::CountProposalsTwice,
        SabotageMode::SkipRecoveryCheck,
        SabotageMode::KeepRetiredKeys,
        SabotageMode::SharedConfigurationKeys,
        SabotageMode::LcrDeliverUnstable,
        SabotageMode::TentativeSmallQuorum,
        SabotageMode::TentativeNoRollback,
        SabotageMode::QuorumDropSpeculative,
        SabotageMode::ChainSkipCheck,
        SabotageMode::WeakReplyQuorum,
        SabotageMode::SingleObjectCopy,
        SabotageMode::SeparateNextBatch,
        SabotageMode::StaleStreams,
        SabotageMode::UnheldReplies,
    ];

    /// Its command-line name.
    pub fn name(self) -> &'static str {
        match self {
            SabotageMode::ShortQuorum => "short-quorum",
            SabotageMode::SkipMac => "skip-mac",
            SabotageMode::EarlyExecute => "early-execute",
            SabotageMode::WeakReadQuorum => "weak-read-quorum",
            SabotageMode::WeakSerializableQuorum => "weak-serializable-quorum",
            SabotageMode::WeakPushQuorum => "weak-push-quorum",
            SabotageMode::CorruptService => "corrupt-service",
            SabotageMode::UncheckedPages => "unchecked-pages",
            SabotageMode::LyingDisk => "lying-disk",
            SabotageMode::UnorderedEvents => "unordered-events",
            SabotageMode::CountProposalsTwice => "count-proposals-twice",
            SabotageMode::SkipRecoveryCheck => "skip-recovery-check",
            SabotageMode::KeepRetiredKeys => "keep-retired-keys",
            SabotageMode::SharedConfigurationKeys => "shared-configuration-keys",
            SabotageMode::LcrDeliverUnstable => "lcr-deliver-unstable",
            SabotageMode::TentativeSmallQuorum => "tentative-small-quorum",
            SabotageMode::TentativeNoRollback => "tentative-no-rollback",
            SabotageMode::QuorumDropSpeculative => "quorum-drop-speculative",
            SabotageMode::ChainSkipCheck => "chain-skip-check",
            SabotageMode::WeakReplyQuorum => "weak-reply-quorum",
            SabotageMode::SingleObjectCopy => "single-object-copy",
            SabotageMode::SeparateNextBatch => "separate-next-batch",
            SabotageMode::StaleStreams => "stale-streams",
            SabotageMode::UnheldReplies => "unheld-replies",
        }
    }

    /// Parses a command-line name.
    pub fn parse(name: &str) -> Option<SabotageMode> {
        SabotageMode::ALL.into_iter().find(|m| m.name() == name)
    }

    /// The protocol knob that breaks the protocol, if this mode breaks the protocol (not the
    /// service).
    pub fn knob(self) -> Option<Sabotage> {
        match self {
            SabotageMode::ShortQuorum => Some(Sabotage::ShortQuorum),
            SabotageMode::SkipMac => Some(Sabotage::SkipMac),
            SabotageMode::EarlyExecute => Some(Sabotage::EarlyExecute),
            SabotageMode::WeakReadQuorum => Some(Sabotage::WeakReadQuorum),
            SabotageMode::WeakSerializableQuorum => Some(Sabotage::WeakSerializableQuorum),
            SabotageMode::WeakPushQuorum => Some(Sabotage::WeakPushQuorum),
            SabotageMode::CorruptService | SabotageMode::LyingDisk | SabotageMode::UnorderedEvents => None,
            SabotageMode::UncheckedPages => Some(Sabotage::UncheckedPages),
            SabotageMode::CountProposalsTwice => Some(Sabotage::CountProposalsTwice),
            SabotageMode::SkipRecoveryCheck => Some(Sabotage::SkipRecoveryCheck),
            SabotageMode::KeepRetiredKeys => Some(Sabotage::KeepRetiredKeys),
            SabotageMode::SharedConfigurationKeys => Some(Sabotage::SharedConfigurationKeys),
            SabotageMode::LcrDeliverUnstable => Some(Sabotage::UnstableDelivery),
            SabotageMode::TentativeSmallQuorum => Some(Sabotage::TentativeSmallQuorum),
            SabotageMode::TentativeNoRollback => Some(Sabotage::TentativeNoRollback),
            SabotageMode::QuorumDropSpeculative => Some(Sabotage::QuorumDropSpeculative),
            SabotageMode::ChainSkipCheck => Some(Sabotage::ChainSkipCheck),
            SabotageMode::WeakReplyQuorum => Some(Sabotage::WeakReplyQuorum),
            SabotageMode::SingleObjectCopy => Some(Sabotage::SingleObjectCopy),
            SabotageMode::SeparateNextBatch => Some(Sabotage::SeparateNextBatch),
            SabotageMode::StaleStreams => Some(Sabotage::StaleStreams),
            SabotageMode::UnheldReplies => Some(Sabotage::UnheldReplies),
        }
    }
}

/// Parameters of one run.
#[derive(Clone, Debug)]
pub struct SimOptions {
    /// The seed: all randomness of the run comes from it.
    pub seed: u64,
    /// Failures tolerated.
    pub u: usize,
    /// Byzantine failures tolerated.
    pub r: usize,
    /// Correct clients.
    pub clients: u32,
    /// Keys of the workload (2 to 4 make conflicts likely).
    pub keys: u32,
    /// Virtual microseconds during which clients issue random operations; faults happen in the
    /// first [`SimOptions::fault_fraction`] of it, then the final reads.
    pub workload_us: u64,
    /// Fraction of the workload time with faults.
    pub fault_fraction: f64,
    /// Client think time between operations, microseconds (uniform in this range).
    pub think_us: (u64, u64),
    /// Whether faults are injected at all.
    pub faults: bool,
    /// A deliberately broken protocol.
    pub sabotage: Option<SabotageMode>,
    /// The replicated service the execution members run.
    pub service: ServiceKind,
    /// Every Byzantine replica mutates what it sends ([`crate::mutate`]), and every seed with
    /// `r > 0` has one.
    pub mutate: bool,
    /// The faulty replica runs as two correct copies sharing its identity ([`crate::twins`]),
    /// and every seed with `r > 0` has one.
    pub twins: bool,
    /// One attack and nothing else ([`crate::attack`]).
    pub attack: Option<crate::attack::Attack>,
    /// The order stage watches the primary beyond PBFT's timer (`knobs.watch_primary`).
    pub defences: bool,
    /// Clients sign their requests (`knobs.client_signatures`): every fourth seed.
    pub client_signatures: bool,
    /// Processing time of each message a replica receives, microseconds (0: none). Messages that
    /// arrive while their replica is busy wait their turn, so enough clients saturate the
    /// replicas and a run measures throughput (the attack runs, [`crate::attack`]).
    pub cpu_us_per_message: upright_core::stage::Time,
    /// `knobs.state_chunk_bytes`: 256 by default, so that the small simulated states still
    /// transfer in many chunks and the chunk logic is exercised.
    pub state_chunk_bytes: usize,
    /// `knobs.peer_cut_off`: a replica cuts off a peer whose messages keep proving it faulty
    /// ([`upright_core::cutoff`], as the runtime does). Off by default, so that a Byzantine
    /// replica keeps testing the checks all run long; on in the attack runs with the defences.
    pub peer_cut_off: bool,
    /// Key refresh (`knobs.key_refresh_us`): every process refreshes its receive keys every
    /// 200-350 ms of virtual time and retires the previous ones 80 ms later.
    pub key_refresh: bool,
    /// Proactive recovery: the correct replicas recover one after another during the fault
    /// phase (restart, new key, estimation, state check), half of them after an attacker
    /// rewrote their stored checkpoint ([`crate::faults::FaultPlan::draw_recovering`]).
    pub recovery: bool,
    /// Reconfiguration: the administrator grows the cluster by two replicas and shrinks it back
    /// during the fault phase ([`crate::reconfig`]).
    pub reconfiguration: bool,
    /// With `reconfiguration`: two thirds of the shrinks remove any two replicas (the ones
    /// above the new size take the removed ids, [`upright_core::reconfig::without`]) instead
    /// of the two added ones.
    pub shrink_any: bool,
    /// The ordering protocol the order members run.
    pub protocol: upright_core::config::OrderProtocol,
    /// Selective execution (`selective_execution = true`, docs/ODRC.md); no tentative
    /// execution then.
    pub selective_execution: bool,
    /// Separate stages (`separate_stages = true`, docs/ODRC.md): the execution members run in
    /// processes of their own, sized for this many failures (`exec_u`); none: co-located.
    pub separate_stages: Option<usize>,
}

impl SimOptions {
    /// Defaults for seed `seed` and `(u, r)`: 3 clients, 3 keys, 3 s of workload.
    pub fn new(seed: u64, u: usize, r: usize) -> SimOptions {
        SimOptions {
            seed,
            u,
            r,
            clients: 3,
            keys: 3,
            workload_us: 3_000_000,
            fault_fraction: 0.65,
            think_us: (1_000, 20_000),
            faults: true,
            sabotage: None,
            service: ServiceKind::Kv,
            mutate: false,
            twins: false,
            attack: None,
            defences: true,
            client_signatures: seed % 4 == 3,
            cpu_us_per_message: 0,
            state_chunk_bytes: 256,
            peer_cut_off: false,
            key_refresh: false,
            recovery: false,
            reconfiguration: false,
            shrink_any: false,
            protocol: Default::default(),
            selective_execution: false,
            separate_stages: None,
        }
    }

    /// The end of the fault phase.
    pub fn heal_at(&self) -> u64 {
        (self.workload_us as f64 * self.fault_fraction) as u64
    }

    /// Knobs scaled for short runs (valid per `ClusterConfig::validate`).
    pub fn knobs(&self) -> Knobs {
        Knobs {
            batch_size_max: 16,
            pipeline_window: 4,
            checkpoint_interval: 8,
            log_window: 16,
            inline_request_bytes_max: 48,
            client_retransmit_initial_us: 100_000,
            client_retransmit_max_us: 800_000,
            view_change_timeout_us: 200_000,
            batch_time_skew_us_max: 1_000_000,
            exec_retry_us: 100_000,
            auth_retransmit_interval_us: 400_000,
            state_chunk_bytes: self.state_chunk_bytes,
            // Simulated one-way delays are up to 5 ms (plus injected ones).
            read_only_timeout_us: 20_000,
            // Shorter than the clients' pauses now and then, so heartbeats interleave with
            // requests and faults (ticks come every view_change_timeout_us / 4 = 50 ms).
            heartbeat_interval_us: 40_000,
            sabotage: self.sabotage.and_then(SabotageMode::knob),
            watch_primary: self.defences,
            client_signatures: self.client_signatures,
            peer_cut_off: self.peer_cut_off,
            key_refresh_us: if self.key_refresh || self.sabotage == Some(SabotageMode::KeepRetiredKeys) {
                200_000 + (self.seed % 4) * 50_000
            } else {
                0
            },
            key_overlap_us: 80_000,
            // Aliph's return from Chain to Quorum within a seed's few seconds.
            aliph_one_client_us: 150_000,
            tentative_entries_max: self.tentative_entries_max(),
            ..Knobs::default()
        }
    }

    /// Tentative execution (off by default in deployments: docs/PERFORMANCE.md "Session 37")
    /// runs in every even seed, and always under its sabotage modes, so both paths stay proven.
    pub fn tentative_entries_max(&self) -> usize {
        let sabotaged = matches!(
            self.sabotage,
            Some(SabotageMode::TentativeSmallQuorum | SabotageMode::TentativeNoRollback)
        );
        if self.selective_execution || self.separate_stages.is_some() {
            0
        } else if sabotaged || self.seed.is_multiple_of(2) {
            8
        } else {
            0
        }
    }

    /// The command that replays this run.
    pub fn replay_command(&self) -> String {
        let mut cmd = format!(
            "cargo run --release -p upright-sim -- --seeds 1 --first-seed {} --u {} --r {}",
            self.seed, self.u, self.r
        );
        if let Some(s) = self.sabotage {
            cmd.push_str(&format!(" --sabotage {}", s.name()));
        }
        if !self.protocol.is_default() {
            cmd.push_str(&format!(" --protocol {}", self.protocol.name()));
        }
        if self.service != ServiceKind::Kv {
            cmd.push_str(&format!(" --service {}", self.service.name()));
        }
        if self.mutate {
            cmd.push_str(" --mutate");
        }
        if self.selective_execution {
            cmd.push_str(" --selective-execution");
        }
        if let Some(exec_u) = self.separate_stages {
            cmd.push_str(&format!(" --separate-stages --exec-u {exec_u}"));
        }
        if self.twins {
            cmd.push_str(" --twins");
        }
        if self.key_refresh {
            cmd.push_str(" --key-refresh");
        }
        if self.recovery {
            cmd.push_str(" --recovery");
        }
        if self.reconfiguration {
            cmd.push_str(" --reconfiguration");
        }
        if self.shrink_any {
            cmd.push_str(" --shrink-any");
        }
        if let Some(attack) = self.attack {
            // The attack's own workload comes with it.
            cmd.push_str(&format!(" --attack {}", attack.name()));
            if !self.defences {
                cmd.push_str(" --defences off");
            }
            return cmd;
        }
        if !self.defences {
            cmd.push_str(" --defences off");
        }
        let defaults = SimOptions::new(self.seed, self.u, self.r);
        if self.workload_us != defaults.workload_us {
            cmd.push_str(&format!(" --seconds {}", self.workload_us as f64 / 1e6));
        }
        if self.clients != defaults.clients {
            cmd.push_str(&format!(" --clients {}", self.clients));
        }
        cmd
    }
}

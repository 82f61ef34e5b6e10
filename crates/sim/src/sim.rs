//! The deterministic simulator: one seed gives one exact run of the clients and every stage of
//! the cluster, with the faults of the seed's [`FaultPlan`], observed by the checkers.

use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use upright_core::config::{ClientInfo, ClusterConfig, PublicKeys, ReplicaInfo};
use upright_core::crypto::{Digest, KeyRing, SecretKeys};
use upright_core::fair::FairQueues;
use upright_core::host::{Host, Log, Member, Router};
use upright_core::ids::{ClientId, Principal, Process, ReplicaId, StageKind};
use upright_core::kv::KvOperation;
use upright_core::message::{Envelope, Message, SealFor};
use upright_core::pages::PageStore;
use upright_core::quorum::Quorums;
use upright_core::stage::{Action, Input, ReadPath, Stage, Time};
use upright_core::wire;

use crate::byzantine::{corrupt, inconsistent_authenticator, Byzantine, Outgoing};
use crate::checkers::agreement::Agreement;
use crate::checkers::pushes::Pushes;
use crate::checkers::{durability, linearizability, liveness, serializable};
use crate::events::{Event, EventQueue, Timers};
use crate::faults::{Behaviour, ClientBehaviour, FaultCounts, FaultPlan, FaultStep, PlanShape};
use crate::fs::FsClients;
use crate::hdfs::HdfsClients;
use crate::network::Network;
use crate::options::{SabotageMode, SimOptions};
use crate::protocol::Protocol;
use crate::reconfig::Admin;
use crate::report::{SimReport, Tallies};
use crate::service::ServiceKind;
use crate::storage::{SimLog, SimPageStore, SimPages};
use crate::twins::{Node, Twins};
use crate::workload::Workload;
use crate::zk::{Next, ZkClients};

/// Most events one run may process (a bound against message storms).
pub const EVENTS_MAX: u64 = 20_000_000;
/// Copies under bad MACs the flooding client sends with each request.
pub const CLIENT_FLOOD_COPIES: usize = 3;
/// Earlier requests the flooding client keeps to replay.
pub const CLIENT_REPLAYS_MAX: usize = 32;
/// Share of seeds with a lagging execution member during the fault phase.
pub const LAGGING_PROBABILITY: f64 = 0.3;
/// Share of the workload's reads that take the read-only path (the others are ordered).
pub const READ_ONLY_SHARE: f64 = 0.7;
/// Of those, the share that are serializable reads (`r + 1` matching answers).
pub const SERIALIZABLE_SHARE: f64 = 0.3;
/// How long a client that reached the final phase waits before looking again whether every
/// workload operation has been answered (its final reads start only then).
pub const FINAL_READ_WAIT_US: Time = 1_000;
/// Probability that a replica host's flush (the end of its round: flush hooks, group commit,
/// sends) is deferred after a delivery, so several deliveries share one round; otherwise the
/// round ends right after the delivery.
pub const FLUSH_DEFER_PROBABILITY: f64 = 0.3;
/// Most deliveries to one replica whose flush is deferred; the next one flushes.
pub const FLUSH_DEFER_DELIVERIES_MAX: u32 = 8;
/// Probability that the disk writes a member's pending writes in the background after a host
/// call (a crash then loses less).
pub const BACKGROUND_SYNC_PROBABILITY: f64 = 0.5;
/// Longest a deferred flush waits (virtual microseconds) when no further delivery flushes it.
pub const FLUSH_DEFER_US_MAX: Time = 5_000;

/// One replica process: the runtime's host over the simulated disk while it is up; only the
/// disk while it is down.
struct ReplicaNode {
    /// The identity it runs as: its replica id in the configuration it runs in (its index at
    /// first, but for a twin's second copy; a shrink renumbers replicas above the new size).
    id: u32,
    /// Its process identity: the index of its keys in `replica_secrets` and `replica_keys` (its
    /// first id; the twin's second copy shares its identity's).
    slot: u32,
    /// The next configuration while its order member hands over to it
    /// ([`upright_core::stage::Event::HandingOver`]): it routes to that configuration's members.
    handing_over: Option<Arc<ClusterConfig>>,
    host: Option<Host<SimLog>>,
    /// The members' logs while the replica is down (what survived the crash).
    disk: Vec<(StageKind, SimLog)>,
    /// The execution member's page store (it survives crashes but for uncommitted writes).
    pages: Arc<Mutex<SimPages>>,
    skew: Time,
    /// The generation of the host's pending wake-up (older wake events are stale).
    wake_generation: u64,
    /// When (virtual time) that wake-up is due.
    wake_at: Option<Time>,
    /// The configuration it runs in (the one its storage records; `--reconfiguration`).
    config: Arc<ClusterConfig>,
    /// Not started yet: a replica a later configuration adds.
    dormant: bool,
    /// Removed by a reconfiguration: stays down.
    retired: bool,
    /// Its order member ended its configuration; a `Switch` event is due.
    switching: bool,
}

impl ReplicaNode {
    fn up(&self) -> bool {
        self.host.is_some()
    }
}

/// What a host call routed to other processes.
#[derive(Default)]
struct Routed {
    sends: Vec<(Principal, Vec<Principal>, Arc<Envelope>)>,
}

impl Router for Routed {
    fn send(&mut self, from: Principal, to: Vec<Principal>, envelope: Arc<Envelope>) {
        self.sends.push((from, to, envelope));
    }
}

/// One run in progress.
pub struct Sim<P: Protocol> {
    opts: SimOptions,
    protocol: P,
    rng: ChaCha8Rng,
    now: Time,
    queue: EventQueue,
    timers: Timers,
    config: Arc<ClusterConfig>,
    quorums: Quorums,
    replica_keys: Vec<Arc<KeyRing>>,
    /// Every replica process's long-term secrets (key rings for new configurations).
    replica_secrets: Vec<SecretKeys>,
    /// Their public keys (the routing of messages to a configuration's members).
    replica_public: Vec<PublicKeys>,
    /// `--reconfiguration`: the administrator's changes and progress.
    admin: Option<Admin>,
    /// The change each correct replica switched to, by epoch (the agreement of reconfigurations).
    switched_to: BTreeMap<u64, (Digest, upright_core::ids::SeqNo)>,
    /// Every client's keys (the Byzantine client's last).
    client_keys: Vec<Arc<KeyRing>>,
    /// Replica processes: replica `i` at index `i`, and a twin's second copy last.
    replicas: Vec<ReplicaNode>,
    /// The twin's copies and the current round's sides (`--twins`).
    twins: Option<Twins>,
    clients: Vec<Box<dyn Stage>>,
    correct_clients: Vec<u32>,
    byz_client: Option<u32>,
    byz_client_busy: bool,
    /// The Byzantine client's keys (it re-seals what it changes).
    byz_client_keys: Option<Arc<KeyRing>>,
    /// The flooding client's earlier requests (replayed), at most [`CLIENT_REPLAYS_MAX`].
    byz_client_sent: std::collections::VecDeque<Arc<Envelope>>,
    network: Network,
    plan: FaultPlan,
    counts: FaultCounts,
    byzantine: BTreeMap<u32, Byzantine>,
    /// Replicas whose flush is deferred: deliveries handled since their last flush.
    unflushed: BTreeMap<u32, u32>,
    /// Per replica, until when it is busy with the messages it received
    /// ([`SimOptions::cpu_us_per_message`]).
    busy_until: Vec<Time>,
    /// Per replica, the messages waiting for it to be free, one queue per sender served
    /// round-robin (each [`Event::CpuFree`] hands it the next one).
    cpu_queue: Vec<FairQueues<Process, (Principal, Arc<Envelope>)>>,
    /// Per replica, its cut-off of peer replicas (`knobs.peer_cut_off`), as the runtime applies it.
    cut_off: Vec<Option<upright_core::cutoff::CutOff>>,
    /// `UPRIGHT_SIM_TRACE` is set: print every stage event (read once, not per event).
    trace_events: bool,
    workload: Workload,
    /// `--service zk`: the clients' ZooKeeper sessions, which carry out each model operation.
    zk: Option<ZkClients>,
    /// `--service fs`: the clients' NFS calls, which carry out each model operation.
    fs: Option<FsClients>,
    hdfs: Option<HdfsClients>,
    agreement: Agreement,
    pushes: Pushes,
    /// Watch events before the data they announce (the KV under selective execution).
    watch_order: crate::checkers::watch_order::WatchOrder,
    trace: blake3::Hasher,
    errors: Vec<String>,
    events: u64,
    ops_completed: u64,
    ops_by_client: Vec<u64>,
    /// Replica processes that began a proactive recovery (`--recovery`).
    recovering: std::collections::BTreeSet<usize>,
    /// Recoveries that completed before their replica switched configuration (their host, and
    /// its counters, went with the switch).
    recoveries_before_switch: usize,
}

/// How long a planned proactive recovery waits while another one is in progress before it looks
/// again.
const RECOVERY_WAIT_US: Time = 50_000;

fn principal_bytes(p: Principal) -> [u8; 5] {
    let (tag, id) = match p {
        Principal::Client(c) => (0u8, c.0),
        Principal::Auth(r) => (1, r.0),
        Principal::Order(r) => (2, r.0),
        Principal::Exec(r) => (3, r.0),
    };
    let mut out = [tag, 0, 0, 0, 0];
    out[1..].copy_from_slice(&id.to_le_bytes());
    out
}

/// Runs one seed of the real protocol.
pub fn run(opts: SimOptions) -> SimReport {
    let protocol = crate::protocol::Upright {
        service: opts.service,
        corrupt: opts.sabotage == Some(SabotageMode::CorruptService),
    };
    Sim::new(opts, protocol).run()
}

impl<P: Protocol> Sim<P> {
    /// Sets up the cluster of `opts` hosting `protocol`'s stages.
    pub fn new(mut opts: SimOptions, protocol: P) -> Sim<P> {
        // Broken configuration keys show only where configurations change.
        if opts.sabotage == Some(SabotageMode::SharedConfigurationKeys) {
            opts.reconfiguration = true;
        }
        if opts.sabotage == Some(SabotageMode::LcrDeliverUnstable) && opts.r == 0 {
            opts.protocol = upright_core::config::OrderProtocol::Lcr;
        }
        // The fast phases' sabotage modes run their protocol, or Aliph, which has both phases.
        let aliph = opts.protocol == upright_core::config::OrderProtocol::Aliph;
        if opts.sabotage == Some(SabotageMode::QuorumDropSpeculative) && opts.u == opts.r && !aliph {
            opts.protocol = upright_core::config::OrderProtocol::Quorum;
        }
        if opts.sabotage == Some(SabotageMode::ChainSkipCheck) && opts.r > 0 && !aliph {
            opts.protocol = upright_core::config::OrderProtocol::Chain;
        }
        if matches!(
            opts.sabotage,
            Some(
                SabotageMode::WeakReplyQuorum
                    | SabotageMode::SingleObjectCopy
                    | SabotageMode::StaleStreams
                    | SabotageMode::UnheldReplies
            )
        ) && opts.r > 0
        {
            opts.selective_execution = true;
            // The push-stream sabotage modes run with ZooKeeper's watches too when asked.
            let streams = matches!(
                opts.sabotage,
                Some(SabotageMode::StaleStreams | SabotageMode::UnheldReplies)
            );
            if !(streams && opts.service == crate::ServiceKind::Zk) {
                opts.service = crate::ServiceKind::Kv;
            }
        }
        if opts.sabotage == Some(SabotageMode::SeparateNextBatch) && opts.r > 0 {
            opts.separate_stages.get_or_insert(opts.u + 1);
            opts.protocol = upright_core::config::OrderProtocol::Pbft;
        }
        let mut rng = ChaCha8Rng::seed_from_u64(opts.seed);
        let mut quorums = opts.protocol.quorums(opts.u, opts.r).expect("valid (u, r)");
        if let Some(exec_u) = opts.separate_stages {
            quorums = quorums.with_separate_stages(exec_u).expect("valid exec_u");
        }
        let n = quorums.n_replicas();
        let mut secret = || {
            let mut s = [0u8; 32];
            rng.fill(&mut s);
            SecretKeys::from_seed(s)
        };
        let replica_secrets: Vec<SecretKeys> = (0..n).map(|_| secret()).collect();
        // Correct clients 0..C, plus client C that may behave Byzantine (and, reconfiguring, the
        // administrator C + 1).
        let last_client = opts.clients + u32::from(opts.reconfiguration);
        let client_secrets: Vec<SecretKeys> = (0..=last_client).map(|_| secret()).collect();
        let added_secrets: Vec<SecretKeys> = if opts.reconfiguration {
            (0..crate::reconfig::ADDED_REPLICAS).map(|_| secret()).collect()
        } else {
            Vec::new()
        };
        let config = Arc::new(ClusterConfig {
            cluster_name: "sim".into(),
            u: opts.u,
            r: opts.r,
            replicas: (0..n)
                .map(|i| ReplicaInfo {
                    id: ReplicaId(i as u32),
                    keys: replica_secrets[i].public(),
                })
                .collect(),
            clients: (0..=last_client)
                .map(|i| ClientInfo {
                    id: ClientId(i),
                    keys: client_secrets[i as usize].public(),
                })
                .collect(),
            knobs: opts.knobs(),
            admin: opts.reconfiguration.then_some(ClientId(last_client)),
            epoch: 0,
            origin: None,
            protocol: opts.protocol,
            selective_execution: opts.selective_execution,
            separate_stages: opts.separate_stages.is_some(),
            exec_u: opts.separate_stages,
        });
        config.validate().expect("simulator configuration is valid");
        let admin = opts.reconfiguration.then(|| {
            let added: Vec<_> = added_secrets.iter().map(SecretKeys::public).collect();
            // The shrink removes the two added replicas, or with --shrink-any (two times in
            // three) any two, renumbering the ones above the new size.
            let grown = n + crate::reconfig::ADDED_REPLICAS;
            let added_only = rng.random_bool(1.0 / 3.0);
            let first = rng.random_range(0..grown);
            let second = (first + rng.random_range(1..grown)) % grown;
            let removed: Vec<usize> = if added_only || !opts.shrink_any {
                (n..grown).collect()
            } else {
                vec![first, second]
            };
            Admin::new(
                last_client,
                &config,
                &client_secrets[last_client as usize],
                &added,
                &removed,
            )
        });
        let replica_secrets: Vec<SecretKeys> = replica_secrets.into_iter().chain(added_secrets).collect();
        let replica_keys: Vec<Arc<KeyRing>> = (0..replica_secrets.len())
            .map(|i| {
                let ring = Arc::new(KeyRing::new(
                    &config,
                    Process::Replica(ReplicaId(i as u32)),
                    &replica_secrets[i],
                ));
                seeded_entropy(&ring, opts.seed, i as u64);
                ring
            })
            .collect();
        let shape = PlanShape {
            u: opts.u,
            r: opts.r,
            n_replicas: n,
            n_exec: quorums.n_exec,
            exec_base: quorums.exec_process_base(),
            heal_at: opts.heal_at(),
        };
        let plan = Self::plan(&opts, &mut rng, shape);
        let mut clients: Vec<Box<dyn Stage>> = Vec::new();
        let mut errors = Vec::new();
        let mut byz_client_keys = None;
        let mut client_keys = Vec::new();
        for c in 0..=last_client {
            let keys = Arc::new(KeyRing::new(
                &config,
                Process::Client(ClientId(c)),
                &client_secrets[c as usize],
            ));
            seeded_entropy(&keys, opts.seed, 1_000 + c as u64);
            client_keys.push(keys.clone());
            if c == opts.clients {
                byz_client_keys = Some(keys.clone());
            }
            match protocol.stage(
                &config,
                Principal::Client(ClientId(c)),
                &keys,
                &Default::default(),
                None,
            ) {
                Ok(stage) => clients.push(stage),
                Err(e) => errors.push(format!("simulator: client {c} refused the configuration: {e}")),
            }
        }
        let byzantine = plan
            .byzantine
            .iter()
            .map(|(&r, &b)| {
                (
                    r,
                    Byzantine::new(b, ReplicaId(r), replica_keys[r as usize].clone(), quorums)
                        .with_view_change_timeout(config.knobs.view_change_timeout_us)
                        .lying_about_pages_only(opts.sabotage == Some(SabotageMode::UncheckedPages)),
                )
            })
            .collect();
        let twins = plan.twin.map(|t| Twins::new(t, n, opts.clients as usize + 1));
        // The twin's second copy runs with its identity's clock offset; replicas a
        // reconfiguration adds come after the others.
        let added = admin.as_ref().map_or(0, |_| crate::reconfig::ADDED_REPLICAS as u32);
        let processes: Vec<u32> = (0..n as u32 + added)
            .chain(twins.as_ref().map(|t| t.identity))
            .collect();
        let grown = admin.as_ref().map(|a| a.configs[0].clone());
        Sim {
            replicas: processes
                .iter()
                .map(|&i| ReplicaNode {
                    id: i,
                    slot: i,
                    handing_over: None,
                    host: None,
                    disk: Vec::new(),
                    pages: Arc::default(),
                    skew: plan.skew.get(i as usize).copied().unwrap_or(0),
                    wake_generation: 0,
                    wake_at: None,
                    config: match &grown {
                        Some(grown) if i as usize >= n => grown.clone(),
                        _ => config.clone(),
                    },
                    dormant: i as usize >= n,
                    retired: false,
                    switching: false,
                })
                .collect(),
            correct_clients: (0..opts.clients).collect(),
            byz_client: plan.byzantine_client.map(|_| opts.clients),
            byz_client_busy: false,
            byz_client_sent: std::collections::VecDeque::new(),
            byz_client_keys,
            network: Network {
                exec_base: quorums.exec_process_base(),
                ..Network::default()
            },
            workload: Workload::new(opts.keys),
            zk: (opts.service == ServiceKind::Zk).then(|| {
                ZkClients::new(
                    opts.sabotage != Some(SabotageMode::UnorderedEvents),
                    opts.selective_execution,
                )
            }),
            fs: (opts.service == ServiceKind::Fs).then(FsClients::new),
            hdfs: (opts.service == ServiceKind::Hdfs).then(HdfsClients::new),
            counts: FaultCounts::default(),
            agreement: Agreement::default(),
            pushes: Pushes::default(),
            watch_order: Default::default(),
            trace: blake3::Hasher::new(),
            queue: EventQueue::default(),
            timers: Timers::default(),
            now: 0,
            events: 0,
            ops_completed: 0,
            ops_by_client: vec![0; opts.clients as usize],
            recovering: Default::default(),
            recoveries_before_switch: 0,
            byzantine,
            unflushed: BTreeMap::new(),
            busy_until: vec![0; processes.len()],
            cpu_queue: processes
                .iter()
                .map(|_| FairQueues::new(CPU_INBOX_PER_SENDER_MAX))
                .collect(),
            cut_off: processes
                .iter()
                .map(|_| config.knobs.peer_cut_off.then(upright_core::cutoff::CutOff::default))
                .collect(),
            trace_events: std::env::var_os("UPRIGHT_SIM_TRACE").is_some(),
            clients,
            errors,
            twins,
            plan,
            replica_keys,
            replica_public: replica_secrets.iter().map(SecretKeys::public).collect(),
            replica_secrets,
            admin,
            switched_to: BTreeMap::new(),
            client_keys,
            config,
            quorums,
            protocol,
            rng,
            opts,
        }
    }

    fn plan(opts: &SimOptions, rng: &mut ChaCha8Rng, shape: PlanShape) -> FaultPlan {
        if let Some(attack) = opts.attack {
            let mut plan = FaultPlan::quiet(shape);
            match attack {
                crate::attack::Attack::Replica(b) => {
                    let replica = b.place(rng, shape.n_replicas, (shape.exec_base, shape.n_exec));
                    plan.byzantine.insert(replica, b);
                }
                crate::attack::Attack::Client(c) => plan.byzantine_client = Some(c),
            }
            return plan;
        }
        match opts.sabotage {
            _ if !opts.faults => FaultPlan::quiet(shape),
            // The fault generator asked for comes first, sabotage or not.
            _ if opts.twins => FaultPlan::draw_twins(rng, shape),
            _ if opts.mutate => FaultPlan::draw_mutating(rng, shape),
            // Every replica recovers after an attacker rewrote its stored checkpoint.
            Some(SabotageMode::SkipRecoveryCheck) => FaultPlan::draw_recovering(rng, shape, 1.0, false),
            Some(SabotageMode::KeepRetiredKeys) => {
                // Senders that miss NEW-KEYs (lossy links) and a replica that replays old
                // envelopes: both send under keys their receivers retired.
                let mut plan = FaultPlan::draw(rng, shape);
                plan.byzantine = [(1, Behaviour::Replay)].into_iter().collect();
                plan
            }
            _ if opts.recovery => FaultPlan::draw_recovering(rng, shape, 0.5, true),
            Some(SabotageMode::LyingDisk) => {
                // A quiet run but for one power loss in the middle of the workload.
                let mut plan = FaultPlan::quiet(shape);
                let all: Vec<u32> = (0..shape.n_replicas as u32).collect();
                let at = rng.random_range(300_000..600_000);
                plan.steps = vec![(at, FaultStep::PowerLoss), (at + 50_000, FaultStep::Restart(all))];
                plan
            }
            Some(
                SabotageMode::TentativeSmallQuorum
                | SabotageMode::TentativeNoRollback
                | SabotageMode::QuorumDropSpeculative,
            ) => {
                // Batches prepared at some members and then replaced: lossy links, and the
                // primaries of views 0, 1, 2, ... cut off in turn while the workload runs, so
                // view changes come while batches are prepared but not committed.
                let mut plan = FaultPlan::quiet(shape);
                plan.network.loss = 0.15;
                plan.network.reordering = 0.05;
                let mut t: u64 = rng.random_range(50_000..150_000);
                let mut replica = 0;
                let crash = opts.sabotage != Some(SabotageMode::TentativeNoRollback);
                while t + 100_000 < shape.heal_at {
                    let back = t + rng.random_range(30_000..80_000);
                    if crash {
                        // A backup that executed a batch alone crashes: the others may
                        // replace it.
                        plan.steps.push((t, FaultStep::Crash(vec![replica])));
                        plan.steps.push((back, FaultStep::Restart(vec![replica])));
                    } else {
                        plan.steps.push((t, FaultStep::Partition(vec![replica])));
                        plan.steps.push((back, FaultStep::Heal));
                    }
                    replica = (replica + 1) % shape.n_replicas as u32;
                    t += rng.random_range(100_000..200_000);
                }
                plan
            }
            Some(SabotageMode::ChainSkipCheck) if opts.r > 0 => {
                // A member inside the chain of the first views forwards altered batches (and
                // now and then the true one too): with the check skipped, its successors accept
                // what the members before it never did.
                let mut plan = FaultPlan::quiet(shape);
                plan.byzantine.insert(1, Behaviour::Mutate);
                plan
            }
            Some(SabotageMode::SeparateNextBatch) if opts.r > 0 => {
                // Order member 1 fabricates the batches it hands to the execution members;
                // execution member 1 takes them on its word alone.
                let mut plan = FaultPlan::quiet(shape);
                plan.byzantine.insert(1, Behaviour::FabricatedBatch);
                plan
            }
            Some(SabotageMode::SingleObjectCopy) if opts.r > 0 => {
                // The usual faults, with one execution member lying in its object checkpoints.
                let mut plan = FaultPlan::draw(rng, shape);
                plan.byzantine = [(1, Behaviour::WrongState)].into_iter().collect();
                plan
            }
            Some(SabotageMode::UncheckedPages) => {
                // The usual crashes and partitions (so members fall behind and transfer state),
                // with one execution member serving wrong state.
                let mut plan = FaultPlan::draw(rng, shape);
                plan.byzantine = [(1, Behaviour::WrongState)].into_iter().collect();
                plan
            }
            Some(mode)
                if opts.r > 0
                    && !matches!(
                        mode,
                        SabotageMode::WeakReadQuorum
                            | SabotageMode::CorruptService
                            | SabotageMode::LyingDisk
                            | SabotageMode::UnorderedEvents
                            | SabotageMode::CountProposalsTwice
                            | SabotageMode::SkipRecoveryCheck
                            | SabotageMode::KeepRetiredKeys
                            | SabotageMode::SharedConfigurationKeys
                            | SabotageMode::LcrDeliverUnstable
                            | SabotageMode::TentativeSmallQuorum
                            | SabotageMode::TentativeNoRollback
                            | SabotageMode::QuorumDropSpeculative
                            | SabotageMode::ChainSkipCheck
                            | SabotageMode::SingleObjectCopy
                            | SabotageMode::SeparateNextBatch
                            | SabotageMode::StaleStreams
                            | SabotageMode::UnheldReplies
                    ) =>
            {
                // A fault mix that exposes the broken rule: an equivocating primary for the
                // quorum and commit rules, a sender forger (with wrong replies) for the MAC check.
                let behaviour = match mode {
                    SabotageMode::ShortQuorum | SabotageMode::EarlyExecute => Behaviour::EquivocatingPrimary,
                    SabotageMode::SkipMac => Behaviour::ForgeSender,
                    // Forged pushes and made-up read answers come from a replica that sends
                    // wrong replies.
                    SabotageMode::WeakPushQuorum
                    | SabotageMode::WeakSerializableQuorum
                    | SabotageMode::WeakReplyQuorum => Behaviour::WrongReplies,
                    SabotageMode::WeakReadQuorum
                    | SabotageMode::CorruptService
                    | SabotageMode::UncheckedPages
                    | SabotageMode::LyingDisk
                    | SabotageMode::UnorderedEvents
                    | SabotageMode::CountProposalsTwice
                    | SabotageMode::SkipRecoveryCheck
                    | SabotageMode::KeepRetiredKeys
                    | SabotageMode::SharedConfigurationKeys
                    | SabotageMode::LcrDeliverUnstable
                    | SabotageMode::TentativeSmallQuorum
                    | SabotageMode::TentativeNoRollback
                    | SabotageMode::QuorumDropSpeculative
                    | SabotageMode::ChainSkipCheck
                    | SabotageMode::SingleObjectCopy
                    | SabotageMode::SeparateNextBatch
                    | SabotageMode::StaleStreams
                    | SabotageMode::UnheldReplies => {
                        unreachable!("guarded above")
                    }
                };
                FaultPlan::with_byzantine(shape, [(0, behaviour)].into_iter().collect())
            }
            _ => FaultPlan::draw(rng, shape),
        }
    }

    /// Runs to the end and checks the outcome.
    pub fn run(mut self) -> SimReport {
        self.start();
        let limit = self.opts.workload_us.max(self.opts.heal_at()) + liveness::PROGRESS_BOUND_US;
        while let Some(t) = self.queue.peek_time() {
            if t > limit
                || !self.errors.is_empty()
                || (self.all_finished() && self.recoveries_done() && self.reconfigurations_done())
            {
                break;
            }
            let (t, event) = self.queue.pop().expect("peeked");
            self.now = t;
            self.events += 1;
            if self.events > EVENTS_MAX {
                self.errors.push(format!("simulator: more than {EVENTS_MAX} events"));
                break;
            }
            self.dispatch(event);
        }
        self.finish()
    }

    fn all_finished(&self) -> bool {
        self.correct_clients.iter().all(|&c| self.workload.finished(c))
    }

    /// The replicas that began a proactive recovery and have completed it (or that the last
    /// configuration does not have: nothing more is asked of them).
    fn recoveries_completed(&self) -> usize {
        self.recovering
            .iter()
            .filter(|&&r| self.recovered_or_removed(r))
            .count()
    }

    fn recovered_or_removed(&self, r: usize) -> bool {
        let removed = self
            .admin
            .as_ref()
            .is_some_and(|a| !a.stays(&self.replica_public[self.replicas[r].slot as usize]));
        removed || self.replicas[r].host.as_ref().is_some_and(|h| h.recovery_complete())
    }

    fn recoveries_done(&self) -> bool {
        self.recoveries_completed() == self.recovering.len()
    }

    /// Whether a replica that began a proactive recovery is still recovering: not completed,
    /// and not stopped by a change that removed it. (One the last configuration will not have
    /// but that is still a member recovers like any other: counting it as done, as
    /// [`Self::recovered_or_removed`] does for the end of the run, let the next recovery
    /// start beside it, and three execution members recovered at once with `--shrink-any`.)
    fn a_recovery_runs(&self) -> bool {
        self.recovering.iter().any(|&r| {
            let node = &self.replicas[r];
            !node.retired && !node.host.as_ref().is_some_and(|h| h.recovery_complete())
        })
    }

    /// Whether the administrator's changes are all ordered and every correct replica ended up
    /// where they put it (in the last configuration, or stopped if it removed it).
    fn reconfigurations_done(&self) -> bool {
        self.reconfiguration_lag().is_empty()
    }

    /// What keeps `--reconfiguration` from being done, one line per straggler.
    fn reconfiguration_lag(&self) -> Vec<String> {
        let Some(admin) = &self.admin else { return Vec::new() };
        let mut lag = Vec::new();
        if !admin.done() {
            lag.push(format!(
                "the administrator's changes were not all ordered ({} of {}, {} refused)",
                admin.ordered,
                admin.changes.len(),
                admin.refused
            ));
        }
        let last = admin.final_epoch();
        let last_size = admin.configs[admin.configs.len() - 1].replicas.len();
        for (r, node) in self.replicas.iter().enumerate() {
            if !self.is_correct_node(r) || node.dormant {
                continue;
            }
            if !admin.stays(&self.replica_public[node.slot as usize]) {
                // A removed replica that missed the old configuration's last certificate learns
                // it from the members that switched, whose answers go to its id: not when the
                // change gave its id to another replica (docs/PROTOCOL.md "Reconfiguration").
                let id_reused = (node.id as usize) < last_size;
                if !node.retired && !id_reused {
                    lag.push(format!(
                        "replica {} was removed in epoch {last} but still runs (epoch {})",
                        node.id,
                        node.config.epoch()
                    ));
                }
            } else if (node.host.is_none() || node.config.epoch() != last) && self.can_find_the_cluster(r) {
                lag.push(format!(
                    "replica {} is in epoch {} at the end of the run, not {last}{}",
                    node.id,
                    node.config.epoch(),
                    if node.host.is_none() { " (down)" } else { "" }
                ));
            }
        }
        lag
    }

    /// Whether replica process `r` can learn of the configurations after its own: some other
    /// member of its configuration is in the last one, to answer its probes. A replica that was
    /// down while the changes removed all the others cannot: the operator starts it again with
    /// an empty data directory (docs/OPERATING.md "Reconfiguration").
    fn can_find_the_cluster(&self, r: usize) -> bool {
        let Some(admin) = &self.admin else { return true };
        let me = self.replica_public[self.replicas[r].slot as usize];
        self.replicas[r]
            .config
            .replicas
            .iter()
            .any(|m| m.keys != me && admin.stays(&m.keys))
    }

    fn start(&mut self) {
        for r in 0..self.replicas.len() {
            if self.replicas[r].skew != 0 {
                self.counts.bump("clock_skew");
            }
            if !self.replicas[r].dormant {
                self.restart(r);
            }
        }
        if self.admin.is_some() {
            // Within the first half of the fault phase, however short the run.
            let (lo, hi) = crate::reconfig::FIRST_CHANGE_US;
            let hi = hi.min(self.opts.heal_at() / 2).max(lo + 1);
            let at = self.rng.random_range(lo..hi);
            self.push(at, Event::AdminStep);
        }
        for c in 0..self.clients.len() as u32 {
            self.client_input(c, Input::Start);
        }
        for i in 0..=self.plan.steps.len() {
            let at = self.plan.steps.get(i).map_or(self.plan.heal_at, |(t, _)| *t);
            self.push(at, Event::Fault(i));
        }
        self.network.faults = self.plan.network;
        if self.twins.is_some() {
            self.counts.bump("twins");
            self.push(0, Event::TwinsRound);
        }
        // A lagging execution member during the fault phase: always under weak-read-quorum (so
        // the sabotage has stale state to read from), and always when an execution member serves
        // wrong state, then a correct one (so that some transfer may ask the liar).
        let weak_reads = self.opts.sabotage == Some(SabotageMode::WeakReadQuorum);
        let liar = self
            .plan
            .byzantine
            .iter()
            .find(|(_, b)| **b == Behaviour::WrongState)
            .map(|(r, _)| *r);
        if self.opts.faults && (weak_reads || liar.is_some() || self.rng.random_bool(LAGGING_PROBABILITY)) {
            let n_exec = self.quorums.n_exec as u32;
            let base = self.quorums.exec_process_base();
            let mut lagging = self.rng.random_range(0..n_exec);
            if Some(base + lagging) == liar {
                lagging = (lagging + 1) % n_exec;
            }
            self.network.lagging = Some(base + lagging);
        }
        let waking: Vec<u32> = self
            .correct_clients
            .iter()
            .chain(self.byz_client.iter())
            .copied()
            .collect();
        for c in waking {
            let at = self.rng.random_range(0..5_000);
            self.push(at, Event::ClientWake(c));
        }
    }

    fn push(&mut self, at: Time, event: Event) {
        if !self.queue.push(at, event) && self.errors.is_empty() {
            self.errors.push("simulator: event queue full".into());
        }
    }

    fn dispatch(&mut self, event: Event) {
        match event {
            Event::Deliver {
                from,
                to,
                process,
                envelope,
                digest,
                sealed_in,
            } => {
                self.trace.update(&self.now.to_le_bytes());
                self.trace.update(&principal_bytes(from));
                self.trace.update(&principal_bytes(to));
                self.trace.update(&digest.0);
                match to {
                    Principal::Client(c) => self.client_input(c.0, Input::Message(envelope)),
                    _ => {
                        let r = process;
                        let from = self.quorums.process_of(from);
                        if !self.replicas[r as usize].up() || self.cut_off_drops(r, from) {
                            return;
                        }
                        if let Some(epoch) = sealed_in {
                            self.check_configuration_seal(r, to, epoch, &envelope);
                        }
                        let cost = self.opts.cpu_us_per_message;
                        if cost > 0 {
                            // Busy: the message waits its turn in its sender's queue (one per
                            // process, served round-robin, as the runtime's inbox keeps them).
                            let queue = &mut self.cpu_queue[r as usize];
                            let busy = self.busy_until[r as usize];
                            if busy > self.now || !queue.is_empty() {
                                let was_empty = queue.is_empty();
                                if !queue.push(from, (to, envelope)) {
                                    self.counts.bump("sim_inbox_full");
                                    return;
                                }
                                if was_empty {
                                    self.push(busy.max(self.now), Event::CpuFree(r));
                                }
                                return;
                            }
                            self.busy_until[r as usize] = self.now + cost;
                        }
                        self.handle_at_replica(r, from, to, envelope);
                    }
                }
            }
            Event::CpuFree(r) => {
                // Messages of a peer cut off meanwhile are dropped unread, at no cost.
                let next = loop {
                    match self.cpu_queue[r as usize].pop() {
                        None => break None,
                        Some((from, _)) if self.cut_off_drops(r, from) => continue,
                        Some(next) => break Some(next),
                    }
                };
                let Some((from, (to, envelope))) = next else {
                    return;
                };
                self.busy_until[r as usize] = self.now + self.opts.cpu_us_per_message;
                if !self.cpu_queue[r as usize].is_empty() {
                    self.push(self.busy_until[r as usize], Event::CpuFree(r));
                }
                if self.replicas[r as usize].up() {
                    self.handle_at_replica(r, from, to, envelope);
                }
            }
            Event::Timer {
                principal,
                timer,
                generation,
            } => {
                if !self.timers.fire(principal, timer, generation) {
                    return;
                }
                self.trace.update(&self.now.to_le_bytes());
                self.trace.update(&principal_bytes(principal));
                self.trace.update(format!("{timer:?}").as_bytes());
                if let Principal::Client(c) = principal {
                    self.client_input(c.0, Input::Timer(timer));
                }
            }
            Event::HostWake { replica, generation } => {
                let node = &mut self.replicas[replica as usize];
                if !node.up() || node.wake_generation != generation {
                    return;
                }
                node.wake_at = None;
                self.trace.update(&self.now.to_le_bytes());
                self.trace.update(&[0xff]);
                self.trace.update(&replica.to_le_bytes());
                self.with_host(replica as usize, |host, local, _| host.fire_timers(local));
                self.flush_replica(replica);
            }
            Event::Flush(replica) => {
                if self.unflushed.contains_key(&replica) {
                    self.flush_replica(replica);
                }
            }
            Event::Fault(i) => self.apply_fault(i),
            Event::TwinsRound => self.twins_round(),
            Event::ClientWake(c) => self.wake(c),
            Event::AdminStep => self.admin_step(),
            Event::Switch(r) => self.switch(r as usize),
        }
    }

    /// The peer replica `from` whose messages to replica `r` pass its cut-off
    /// ([`upright_core::cutoff`], with `knobs.peer_cut_off`), with that cut-off.
    fn cut_off_of(&mut self, r: u32, from: Process) -> Option<(ReplicaId, &mut upright_core::cutoff::CutOff)> {
        match from {
            Process::Replica(peer) if peer.0 != self.replicas[r as usize].id => {
                self.cut_off[r as usize].as_mut().map(|c| (peer, c))
            }
            _ => None,
        }
    }

    /// Whether replica `r` drops a message from network sender `from` unread: `from` is a peer
    /// replica it has cut off.
    fn cut_off_drops(&mut self, r: u32, from: Process) -> bool {
        let now = self.now;
        let cut = self.cut_off_of(r, from).is_some_and(|(peer, c)| c.is_cut(peer, now));
        if cut {
            self.counts.bump("sim_dropped_cut_off");
        }
        cut
    }

    /// Replica `r` handles a message from network sender `from` now (after the Byzantine incoming
    /// filter, if any); a peer replica's message counts toward cutting that peer off.
    fn handle_at_replica(&mut self, r: u32, from: Process, to: Principal, envelope: Arc<Envelope>) {
        let envelope = match self.byzantine.get_mut(&r) {
            Some(byz) => match byz.incoming(&mut self.rng, to, envelope, &mut self.counts) {
                Some(envelope) => envelope,
                None => return,
            },
            None => envelope,
        };
        let mut rejected = 0;
        self.with_host(r as usize, |host, local, _| rejected = host.deliver(local, envelope));
        let now = self.now;
        if self
            .cut_off_of(r, from)
            .is_some_and(|(peer, c)| c.observe(peer, now, rejected).is_some())
        {
            self.counts.bump("sim_peer_cut_off");
        }
        self.after_delivery(r);
    }

    fn apply_fault(&mut self, i: usize) {
        let Some((_, step)) = self.plan.steps.get(i).cloned() else {
            // The heal point: everything recovers; the network stops misbehaving.
            self.network.faults = Default::default();
            self.network.partition = None;
            self.network.lagging = None;
            for r in 0..self.replicas.len() {
                let node = &self.replicas[r];
                if !node.up() && !node.dormant && !node.retired {
                    self.restart(r);
                }
            }
            return;
        };
        match step {
            FaultStep::Crash(list) => {
                for r in list {
                    if self.replicas[r as usize].up() {
                        self.counts.bump("crash");
                        self.crash(r as usize);
                    }
                }
            }
            FaultStep::PowerLoss => {
                self.counts.bump("power_loss");
                for r in 0..self.replicas.len() {
                    self.crash(r);
                }
                // A restart of the power-loss plan brings back only the replicas it lists:
                // those a reconfiguration added come back with them.
                for r in 0..self.replicas.len() {
                    let node = &self.replicas[r];
                    if !node.dormant && !node.retired && r >= self.quorums.n_replicas() {
                        self.restart(r);
                    }
                }
            }
            FaultStep::Restart(list) => {
                for r in list {
                    let node = &self.replicas[r as usize];
                    if !node.up() && !node.dormant && !node.retired {
                        self.restart(r as usize);
                    }
                }
            }
            FaultStep::Partition(list) => {
                self.counts.bump("partition");
                self.network.partition = Some(list.into_iter().collect());
            }
            FaultStep::Heal => self.network.partition = None,
            // One recovery at a time (staggered, as the runtime's schedule does): a replica
            // recovering is faulty until it has recovered.
            FaultStep::Recover { .. } if self.a_recovery_runs() => {
                if self.now + RECOVERY_WAIT_US < self.opts.heal_at() {
                    self.push(self.now + RECOVERY_WAIT_US, Event::Fault(i));
                }
            }
            FaultStep::Recover { replica, damage } => self.recover(replica as usize, damage),
        }
    }

    /// Proactive recovery of replica process `r` (a correct one that is up): it restarts from
    /// its synced storage, which an attacker rewrote first if `damage`, and recovers.
    fn recover(&mut self, r: usize, damage: bool) {
        if !self.replicas[r].up() {
            return;
        }
        self.counts.bump("recovery");
        self.crash(r);
        if damage && self.damage_stored_checkpoint(r) {
            self.counts.bump("recovery_damage");
        }
        self.restart_as(r, true);
        self.recovering.insert(r);
    }

    /// Rewrites the newest stored checkpoint of replica process `r`'s execution member (it is
    /// down) so that it verifies on its own but holds another state: the service's state after
    /// one more write nobody ordered (or, for a service that ignores that write, a cached reply
    /// changed). Returns whether there was one to rewrite.
    fn damage_stored_checkpoint(&mut self, r: usize) -> bool {
        use upright_core::exec::checkpoint::{tampered_record, CHECKPOINT_KEY_PREFIX};
        let chunk_bytes = self.config.knobs.state_chunk_bytes;
        let service = self.opts.service;
        let Some((_, log)) = self.replicas[r].disk.iter_mut().find(|(k, _)| *k == StageKind::Exec) else {
            return false;
        };
        let storage = log.durable_mut();
        let newest = storage
            .range(CHECKPOINT_KEY_PREFIX.to_string()..)
            .take_while(|(k, _)| k.starts_with(CHECKPOINT_KEY_PREFIX))
            .filter_map(|(k, v)| {
                Some((
                    k[CHECKPOINT_KEY_PREFIX.len()..].parse::<u64>().ok()?,
                    k.clone(),
                    v.clone(),
                ))
            })
            .max_by_key(|(seqno, _, _)| *seqno);
        let Some((seqno, key, record)) = newest else {
            return false;
        };
        let tampered = tampered_record(upright_core::ids::SeqNo(seqno), &record, chunk_bytes, |cp| {
            let before = cp.service.clone();
            cp.service = crate::service::tampered_state(service, &cp.service, cp.seqno, cp.time_us);
            if cp.service == before {
                let Some(reply) = cp.replies.first_mut() else {
                    return false;
                };
                let mut bytes = reply.2.to_vec();
                bytes.push(b'!');
                reply.2 = bytes.into();
            }
            true
        });
        match tampered {
            Some(record) => {
                storage.insert(key, record);
                true
            }
            None => false,
        }
    }

    /// The administrator orders its next change (`--reconfiguration`).
    fn admin_step(&mut self) {
        let Some(admin) = self.admin.as_mut() else { return };
        if admin.busy {
            return;
        }
        let Some(operation) = admin.next().map(|c| Bytes::from(c.to_operation())) else {
            return;
        };
        admin.busy = true;
        let client = admin.client;
        self.counts.bump("reconfiguration");
        self.client_input(
            client,
            Input::Invoke {
                operation,
                path: ReadPath::Ordered,
            },
        );
    }

    /// The administrator's reply: the change was ordered (the next one follows after a pause;
    /// the replicas it adds start now) or refused (tried again shortly).
    fn admin_reply(&mut self, result: &Bytes) {
        let Some(admin) = self.admin.as_mut() else { return };
        admin.busy = false;
        let text = String::from_utf8_lossy(result);
        if text.starts_with("ordered") {
            let epoch = admin.ordered as u64 + 1;
            admin.ordered += 1;
            let more = !admin.done();
            if epoch == 1 {
                for r in 0..self.replicas.len() {
                    if self.replicas[r].dormant && self.replicas[r].id as usize >= self.quorums.n_replicas() {
                        self.restart(r);
                    }
                }
            }
            if more {
                let (lo, hi) = crate::reconfig::NEXT_CHANGE_US;
                let at = self.now + self.rng.random_range(lo..hi);
                self.push(at, Event::AdminStep);
            }
        } else {
            admin.refused += 1;
            self.push(self.now + crate::reconfig::RETRY_US, Event::AdminStep);
        }
    }

    /// Replica process `r`'s order member ended its configuration: its logs are flushed and it
    /// starts again in the next one (as the runtime does), or stays down if removed.
    fn switch(&mut self, r: usize) {
        self.flush_replica(r as u32);
        let node = &mut self.replicas[r];
        node.switching = false;
        let Some(mut host) = node.host.take() else { return };
        let member = host.progress.reconfigured.is_none_or(|(_, member)| member);
        // A recovery that completed is done; one in progress goes on in the next configuration
        // (the runtime finds its marker again), or ends with a removed replica.
        let recovering = self.recovering.contains(&r);
        let recovered = recovering && host.recovery_complete();
        if recovered || (recovering && !member) {
            self.recovering.remove(&r);
            self.recoveries_before_switch += usize::from(recovered);
        }
        for m in host.members_mut() {
            m.log.sync().expect("the simulated disk does not fail");
        }
        node.disk = host.into_members().into_iter().map(|m| (m.kind, m.log)).collect();
        node.wake_generation += 1;
        node.wake_at = None;
        self.cpu_queue[r].clear();
        self.unflushed.remove(&(r as u32));
        if member {
            self.counts.bump("reconfiguration_switch");
            self.restart_as(r, recovering && !recovered);
        } else {
            self.counts.bump("reconfiguration_removed");
            node_retire(&mut self.replicas[r]);
        }
    }

    /// The old-configuration checker: an envelope a correct replica sealed (MAC or
    /// authenticator) in configuration epoch `epoch` must not open at a replica in another one.
    fn check_configuration_seal(&mut self, r: u32, to: Principal, epoch: u64, envelope: &Envelope) {
        let node = &self.replicas[r as usize];
        let here = node.config.epoch();
        if here == epoch
            || !self.is_correct(to)
            || matches!(envelope.seal, upright_core::message::Seal::None)
            || matches!(envelope.from, Principal::Client(_))
        {
            return;
        }
        let keys = &self.replica_keys[node.slot as usize];
        if envelope.open(keys, to, None).is_ok() && self.errors.len() < 10 {
            self.errors.push(format!(
                "configuration: {to:?} in epoch {here} accepted a {} from {:?} sealed in epoch {epoch}",
                message_name(&envelope.message),
                envelope.from
            ));
        }
    }

    /// The members replica process `r` hosts.
    /// The members replica process `r` hosts in its configuration.
    fn members_of(&self, r: usize) -> Vec<Principal> {
        let q = self.replicas[r].config.validate().unwrap_or(self.quorums);
        q.members_of(ReplicaId(self.replicas[r].id))
    }

    fn crash(&mut self, r: usize) {
        if self.trace_events {
            eprintln!("{:>9} process {r} (replica {}) crashes", self.now, self.replicas[r].id);
        }
        // What waited in its queue is lost with it, and so is its cut-off state.
        self.cpu_queue[r].clear();
        if let Some(cut_off) = self.cut_off[r].as_mut() {
            *cut_off = Default::default();
        }
        let node = &mut self.replicas[r];
        if let Some(host) = node.host.take() {
            node.disk = host
                .into_members()
                .into_iter()
                .map(|mut m| {
                    m.log.crash();
                    (m.kind, m.log)
                })
                .collect();
        }
        node.pages.lock().expect("not poisoned").crash();
        node.wake_generation += 1;
        node.wake_at = None;
        // The session keys were in the process's memory.
        let slot = node.slot as usize;
        self.replica_keys[slot].reset_session();
        self.unflushed.remove(&(r as u32));
    }

    fn restart(&mut self, r: usize) {
        self.restart_as(r, false);
    }

    /// Restarts replica process `r`; `recovering`: for a proactive recovery.
    fn restart_as(&mut self, r: usize, recovering: bool) {
        if self.trace_events {
            let how = if recovering { " for a proactive recovery" } else { "" };
            eprintln!(
                "{:>9} process {r} (replica {}) restarts{how}",
                self.now, self.replicas[r].id
            );
        }
        let slot = self.replicas[r].slot as usize;
        self.replicas[r].dormant = false;
        self.replicas[r].handing_over = None;
        // The configuration its order log records (or the one it was started in).
        if let Some((_, log)) = self.replicas[r].disk.iter().find(|(k, _)| *k == StageKind::Order) {
            match upright_core::order::configured(&self.config, log.durable()) {
                Ok(config) if config.epoch() > self.replicas[r].config.epoch() => {
                    self.replicas[r].config = Arc::new(config);
                }
                Ok(_) => {}
                Err(e) => self.errors.push(format!(
                    "simulator: replica {}'s stored configuration: {e}",
                    self.replicas[r].id
                )),
            }
        }
        let config = self.replicas[r].config.clone();
        // Its id in that configuration: the position of its keys (a shrink renumbers).
        let id = match config.replica_with(&self.replica_public[slot]) {
            Some(id) => id,
            None => {
                self.errors.push(format!(
                    "simulator: replica process {slot} restarted in epoch {}, which does not have it",
                    config.epoch()
                ));
                return;
            }
        };
        if self.replicas[r].id != id.0 {
            self.counts.bump("reconfiguration_renumbered");
        }
        self.replicas[r].id = id.0;
        if self.replica_keys[slot].config_epoch() != config.epoch()
            || self.replica_keys[slot].me() != Process::Replica(id)
        {
            let ring = Arc::new(KeyRing::new(&config, Process::Replica(id), &self.replica_secrets[slot]));
            seeded_entropy(&ring, self.opts.seed, slot as u64 + 100 * config.epoch());
            self.replica_keys[slot] = ring;
        }
        let mut disk = std::mem::take(&mut self.replicas[r].disk);
        let mut members = Vec::new();
        for p in self.members_of(r) {
            let kind = p.stage().expect("replica members have a stage");
            let mut log = match disk.iter().position(|(k, _)| *k == kind) {
                Some(i) => disk.swap_remove(i).1,
                None => SimLog::default(),
            };
            log.lies = self.opts.sabotage == Some(SabotageMode::LyingDisk);
            let page_store: Option<Box<dyn PageStore>> =
                (kind == StageKind::Exec).then(|| Box::new(SimPageStore(self.replicas[r].pages.clone())) as _);
            match self
                .protocol
                .stage(&config, p, &self.replica_keys[slot], log.durable(), page_store)
            {
                Ok(stage) => members.push(Member { kind, stage, log }),
                Err(e) => self.errors.push(format!("simulator: {p:?} refused to start: {e}")),
            }
        }
        let mut host = Host::new(id, members).with_exec_base(config.exec_process_base());
        host.keep_notes();
        self.replicas[r].host = Some(host);
        if recovering {
            self.with_host(r, |host, local, _| host.start_recovering(local));
        } else {
            self.with_host(r, |host, local, _| host.start(local));
        }
        self.flush_replica(r as u32);
    }

    /// The end of a replica's round after a delivery: at once, or (seeded, sometimes) only after
    /// more deliveries or a short while, so rounds hold one or several inputs (AUTH-REQs then
    /// carry one or several items, and one group commit covers several inputs).
    fn after_delivery(&mut self, r: u32) {
        let pending = self.unflushed.get(&r).copied().unwrap_or(0);
        if pending < FLUSH_DEFER_DELIVERIES_MAX && self.rng.random_bool(FLUSH_DEFER_PROBABILITY) {
            if pending == 0 {
                let at = self.now + self.rng.random_range(0..=FLUSH_DEFER_US_MAX);
                self.push(at, Event::Flush(r));
            }
            self.unflushed.insert(r, pending + 1);
        } else {
            self.flush_replica(r);
        }
    }

    /// Ends replica `r`'s round: flush hooks, group commit, then the sends.
    fn flush_replica(&mut self, r: u32) {
        self.unflushed.remove(&r);
        self.with_host(r as usize, |host, local, routed| {
            host.flush(local, routed).expect("the simulated disk does not fail")
        });
    }

    /// Runs `call` on replica `r`'s host (if it is up) at its local time, then performs what the
    /// call routed and observed: sends go through the network (and a Byzantine replica's filter),
    /// notes to the checkers; the disk may write in the background; the host's next timer is
    /// scheduled.
    fn with_host(&mut self, r: usize, call: impl FnOnce(&mut Host<SimLog>, Time, &mut Routed)) {
        let local = self.now + self.replicas[r].skew;
        let Some(mut host) = self.replicas[r].host.take() else {
            return;
        };
        let mut routed = Routed::default();
        let outcome = catch_unwind(AssertUnwindSafe(|| call(&mut host, local, &mut routed)));
        if let Err(panic) = outcome {
            self.errors
                .push(format!("panic in replica {r}: {}", panic_text(&panic)));
            return; // the replica is gone; the run ends with the panic as its finding
        }
        let correct = self.is_correct_node(r);
        for (p, event) in host.take_notes() {
            self.observe(p, correct, event);
        }
        if let Some(change) = host.progress.handing_over.take() {
            match upright_core::reconfig::successor(&self.replicas[r].config, &change, false) {
                Ok(next) => self.replicas[r].handing_over = Some(Arc::new(next)),
                Err(e) => self.errors.push(format!(
                    "simulator: replica {r} hands over to a change that does not follow: {e}"
                )),
            }
        }
        for member in host.members_mut() {
            if member.log.is_dirty() && self.rng.random_bool(BACKGROUND_SYNC_PROBABILITY) {
                member.log.sync().expect("the simulated disk does not fail");
            }
        }
        let next = host
            .next_timer()
            .map(|at| at.saturating_sub(self.replicas[r].skew).max(self.now));
        let reconfigured = host.progress.reconfigured.is_some();
        self.replicas[r].host = Some(host);
        if reconfigured && !self.replicas[r].switching {
            self.replicas[r].switching = true;
            self.push(self.now, Event::Switch(r as u32));
        }
        for (from, to, envelope) in routed.sends {
            self.send(Some(r as u32), from, to, envelope);
        }
        let node = &mut self.replicas[r];
        if let Some(at) = next.filter(|_| next != node.wake_at) {
            node.wake_generation += 1;
            node.wake_at = next;
            let event = Event::HostWake {
                replica: r as u32,
                generation: node.wake_generation,
            };
            self.push(at, event);
        }
    }

    fn client_input(&mut self, c: u32, input: Input) {
        let Some(stage) = self.clients.get_mut(c as usize) else {
            return;
        };
        let mut out = Vec::new();
        let now = self.now;
        if let Err(panic) = catch_unwind(AssertUnwindSafe(|| stage.handle(now, input, &mut out))) {
            self.errors.push(format!("panic in client {c}: {}", panic_text(&panic)));
            return;
        }
        self.perform(Principal::Client(ClientId(c)), out);
    }

    fn is_correct(&self, p: Principal) -> bool {
        match p {
            Principal::Client(c) => Some(c.0) != self.byz_client,
            // Every process that now runs as that replica (two for a moment after a shrink
            // renumbered one into a removed one's id).
            _ => self.nodes_of(self.process_index(p)).all(|r| self.is_correct_node(r)),
        }
    }

    /// The id of the replica process hosting member `p` (`u32::MAX` for a client).
    fn process_index(&self, p: Principal) -> u32 {
        p.process_index(self.quorums.exec_process_base()).unwrap_or(u32::MAX)
    }

    /// Whether replica process `r` is correct (faults belong to processes, not ids).
    fn is_correct_node(&self, r: usize) -> bool {
        let slot = self.replicas[r].slot;
        !self.byzantine.contains_key(&slot) && self.twins.as_ref().is_none_or(|t| t.identity != slot)
    }

    /// The replica processes (not a twin's second copy) that run as replica `id` now: the one
    /// with that id in its configuration, started and not removed; by default process `id`.
    fn nodes_of(&self, id: u32) -> impl Iterator<Item = usize> + '_ {
        let claim = move |r: &usize| {
            let node = &self.replicas[*r];
            node.slot as usize == *r && node.id == id && !node.dormant && !node.retired
        };
        let any = (0..self.replicas.len()).any(|r| claim(&r));
        (0..self.replicas.len()).filter(move |r| if any { claim(r) } else { *r == id as usize })
    }

    /// The replica processes a message from process `process` (a client's: `None`) to replica
    /// `id` goes to: a replica routes by the keys its configuration names for that id, or,
    /// handing over, the next one for the ids above its configuration's (the members the
    /// change adds), as the runtime's connections go to addresses; a client's message goes to
    /// every process that runs as `id` now (after a shrink that renumbered, for a while both
    /// the removed replica and the one given its id: each reads what is sealed for its
    /// configuration).
    fn route_nodes(&self, process: Option<u32>, id: u32) -> Vec<u32> {
        let sender = process.map(|p| &self.replicas[p as usize]);
        let config = sender.map(|s| match &s.handing_over {
            Some(next) if id as usize >= s.config.replicas.len() => next,
            _ => &s.config,
        });
        if let Some(keys) = config.and_then(|c| c.replicas.get(id as usize)).map(|m| m.keys) {
            if let Some(slot) = self.replica_public.iter().position(|k| *k == keys) {
                return vec![slot as u32];
            }
        }
        self.nodes_of(id).map(|r| r as u32).collect()
    }

    /// Carries out a client's actions (replicas' go through their host).
    fn perform(&mut self, p: Principal, actions: Vec<Action>) {
        for action in actions {
            match action {
                // A client stage keeps nothing on disk.
                Action::Persist { .. } | Action::PersistLazily { .. } => {}
                Action::Send { to, envelope } => self.send(None, p, to, envelope),
                Action::SetTimer { timer, at } => {
                    let generation = self.timers.set(p, timer);
                    let at = at.max(self.now);
                    self.push(
                        at,
                        Event::Timer {
                            principal: p,
                            timer,
                            generation,
                        },
                    );
                }
                Action::CancelTimer { timer } => self.timers.cancel(p, timer),
                Action::Deliver { result, .. } => {
                    if let Principal::Client(c) = p {
                        self.on_deliver(c.0, result);
                    }
                }
                Action::DeliverPush { stream, seq, payload } => {
                    if let (Principal::Client(c), true) = (p, self.is_correct(p)) {
                        self.pushes.delivered(c, stream.as_ref(), seq, &payload);
                        if let Some(key) = &stream {
                            self.watch_order.event(c.0, key);
                        }
                        let next = self.zk.as_mut().and_then(|zk| zk.pushed(c.0, &payload, &mut self.rng));
                        if let Some(next) = next {
                            self.zk_next(c.0, next);
                        }
                    }
                }
                Action::PushGap {
                    stream,
                    missed_from,
                    resume_at,
                } => {
                    if let (Principal::Client(c), true) = (p, self.is_correct(p)) {
                        self.pushes.gap(c, stream.as_ref(), missed_from, resume_at);
                        if let Some(key) = &stream {
                            self.watch_order.event(c.0, key);
                        }
                        let next = self.zk.as_mut().and_then(|zk| zk.gap(c.0, &mut self.rng));
                        if let Some(next) = next {
                            self.zk_next(c.0, next);
                        }
                    }
                }
                Action::Note(event) => self.observe(p, self.is_correct(p), event),
            }
        }
    }

    /// A stage's note: traced if asked, and observed by the checkers if the stage is correct.
    fn observe(&mut self, p: Principal, correct: bool, event: upright_core::stage::Event) {
        if self.trace_events {
            let byzantine: Vec<&u32> = self.byzantine.keys().collect();
            eprintln!("{:>9} {p:?} {event:?} (byzantine replicas: {byzantine:?})", self.now);
        }
        if correct {
            if let upright_core::stage::Event::Pushed {
                client,
                ref stream,
                seq,
                digest,
            } = event
            {
                self.pushes.emitted(p, self.now, client, stream.as_ref(), seq, digest);
            }
            if let upright_core::stage::Event::Reconfigured {
                epoch,
                change,
                boundary,
                ..
            } = event
            {
                let first = *self.switched_to.entry(epoch).or_insert((change, boundary));
                if first != (change, boundary) {
                    self.errors.push(format!(
                        "agreement: {p:?} switched to epoch {epoch} by change {change:?} after batch {}, another correct replica by {:?} after batch {}",
                        boundary.0, first.0, first.1 .0
                    ));
                }
                if self.admin.as_ref().and_then(|a| a.digest_of(epoch)) != Some(change) {
                    self.errors.push(format!(
                        "configuration: {p:?} switched to epoch {epoch} by a change nobody made"
                    ));
                }
            }
            self.agreement.observe(p, &event);
        }
    }

    /// The Byzantine client's request with its signature spoiled (or, unsigned, a garbage one),
    /// under a valid MAC.
    fn bad_signature(&mut self, envelope: Arc<Envelope>) -> Arc<Envelope> {
        let (Some(keys), Message::ClientRequest { read_only: false, .. }) = (&self.byz_client_keys, &envelope.message)
        else {
            return envelope;
        };
        let mut message = envelope.message.clone();
        if let Message::ClientRequest { signature, .. } = &mut message {
            let mut bad = signature.unwrap_or(upright_core::crypto::Signature([7; 64]));
            bad.0[0] ^= 0x5a;
            *signature = Some(bad);
        }
        self.counts.bump(ClientBehaviour::BadSignature.class());
        Arc::new(Envelope::seal(
            keys,
            &self.quorums,
            envelope.from,
            message,
            SealFor::Stage(upright_core::ids::StageKind::Auth),
        ))
    }

    /// The flooding client: its request, copies of it under bad MACs, and a replay of one of
    /// its earlier requests.
    fn client_flood(&mut self, to: Vec<Principal>, envelope: Arc<Envelope>) -> Vec<Outgoing> {
        let mut out = vec![Outgoing {
            to: to.clone(),
            envelope: envelope.clone(),
            extra_delay: 0,
        }];
        for _ in 0..CLIENT_FLOOD_COPIES {
            self.counts.bump(ClientBehaviour::Flood.class());
            out.push(Outgoing {
                to: to.clone(),
                envelope: Arc::new(corrupt(&envelope)),
                extra_delay: self.rng.random_range(0..5_000),
            });
        }
        if !self.byz_client_sent.is_empty() {
            let old = self.byz_client_sent[self.rng.random_range(0..self.byz_client_sent.len())].clone();
            self.counts.bump(ClientBehaviour::Flood.class());
            out.push(Outgoing {
                to,
                envelope: old,
                extra_delay: self.rng.random_range(0..50_000),
            });
        }
        if self.byz_client_sent.len() == CLIENT_REPLAYS_MAX {
            self.byz_client_sent.pop_front();
        }
        self.byz_client_sent.push_back(envelope);
        out
    }

    /// Sends `envelope` from `from` (hosted by replica process `process`, if a member) to each
    /// of `to` through the network (and a Byzantine sender's filter, and the twins' sides).
    fn send(&mut self, process: Option<u32>, from: Principal, to: Vec<Principal>, envelope: Arc<Envelope>) {
        let envelope_sent = envelope.clone();
        let byz_replica = match (process, from.replica()) {
            (Some(p), Some(_)) => self.byzantine.get_mut(&self.replicas[p as usize].slot),
            (None, Some(_)) => {
                let index = self.process_index(from);
                self.byzantine.get_mut(&index)
            }
            _ => None,
        };
        let outgoing = if let Some(byz) = byz_replica {
            byz.outgoing(&mut self.rng, from, to, envelope, &mut self.counts)
        } else if let Some(behaviour) = self
            .plan
            .byzantine_client
            .filter(|_| from == Principal::Client(ClientId(self.byz_client.unwrap_or(u32::MAX))))
        {
            match behaviour {
                ClientBehaviour::Flood => self.client_flood(to, envelope),
                ClientBehaviour::BadSignature => vec![Outgoing {
                    to,
                    envelope: self.bad_signature(envelope),
                    extra_delay: 0,
                }],
                ClientBehaviour::InconsistentAuth => {
                    let envelope = match inconsistent_authenticator(&mut self.rng, &envelope) {
                        Some(bad) => {
                            self.counts.bump(ClientBehaviour::InconsistentAuth.class());
                            Arc::new(bad)
                        }
                        None => envelope,
                    };
                    vec![Outgoing {
                        to,
                        envelope,
                        extra_delay: 0,
                    }]
                }
            }
        } else {
            vec![Outgoing {
                to,
                envelope,
                extra_delay: 0,
            }]
        };
        // The configuration a correct replica sealed its own envelope in (a Byzantine sender's,
        // or a copy it forged or replays, is not checked).
        let sealed_in = process
            .filter(|&p| {
                from.replica().is_some()
                    && self.is_correct(from)
                    && self.replicas[p as usize].id == self.process_index(from)
            })
            .map(|p| self.replicas[p as usize].config.epoch());
        for o in outgoing {
            let digest = Digest::of(&wire::encode(&o.envelope));
            let sealed_in = sealed_in.filter(|_| Arc::ptr_eq(&o.envelope, &envelope_sent));
            for to in o.to {
                let processes = self.twin_route(process, from, to);
                if processes.is_empty() {
                    self.counts.bump("twins_cut");
                }
                for process in processes {
                    for delay in self.network.route(&mut self.rng, from, to, &mut self.counts) {
                        let event = Event::Deliver {
                            from,
                            to,
                            process,
                            envelope: o.envelope.clone(),
                            digest,
                            sealed_in,
                        };
                        self.push(self.now + o.extra_delay + delay, event);
                    }
                }
            }
        }
    }

    /// The replica processes a message from `from` (at replica process `process`) to `to`
    /// arrives at (for a client recipient: one entry, unused, if it arrives): replica
    /// `to.replica()`, or under `--twins` what the round's sides let through.
    fn twin_route(&self, process: Option<u32>, from: Principal, to: Principal) -> Vec<u32> {
        let usual = match to {
            Principal::Client(_) => vec![0],
            _ => self.route_nodes(process, self.process_index(to)),
        };
        let Some(twins) = &self.twins else {
            return usual;
        };
        let src = Twins::node(
            from,
            process
                .or(from.process_index(self.quorums.exec_process_base()))
                .unwrap_or(0),
        );
        let targets = match to {
            Principal::Client(c) => vec![(Node::Client(c.0), 0)],
            _ => usual
                .into_iter()
                .flat_map(|usual| twins.destinations(src, usual))
                .map(|p| (Node::Replica(p), p))
                .collect(),
        };
        targets
            .into_iter()
            .filter(|(dest, _)| twins.connected(src, *dest))
            .map(|(_, p)| p)
            .collect()
    }

    /// A new round of the twins' sides (until the faults heal, then the last one).
    fn twins_round(&mut self) {
        let heal_at = self.plan.heal_at;
        let healed = self.now >= heal_at;
        let Some(twins) = self.twins.as_mut() else { return };
        if twins.new_round(&mut self.rng, healed) {
            self.counts.bump("twins_partition");
        }
        if !healed {
            self.counts.bump("twins_round");
            let next = self.now + Twins::round_length(&mut self.rng);
            self.push(next.min(heal_at), Event::TwinsRound);
        }
    }

    fn think(&mut self) -> Time {
        let (lo, hi) = self.opts.think_us;
        self.rng.random_range(lo..=hi.max(lo))
    }

    fn wake(&mut self, c: u32) {
        if Some(c) == self.byz_client {
            if self.byz_client_busy {
                return;
            }
            self.byz_client_busy = true;
            let op = KvOperation::Put {
                key: "byz".into(),
                value: format!("{}", self.rng.random::<u64>()).into(),
            };
            let operation = self
                .opts
                .service
                .encode(&op, &mut self.rng, self.opts.selective_execution);
            self.client_input(
                c,
                Input::Invoke {
                    operation,
                    path: ReadPath::Ordered,
                },
            );
            return;
        }
        if self.workload.busy(c) {
            return;
        }
        let final_read = self.now >= self.opts.workload_us;
        if final_read && self.workload.workload_outstanding() {
            // The final reads start once every workload operation is answered: a read that ran
            // concurrently with a write may rightly miss it, and the durability checker takes
            // the final reads as later than every acknowledged write.
            self.push(self.now + FINAL_READ_WAIT_US, Event::ClientWake(c));
            return;
        }
        let op = if final_read {
            match self.workload.next_final_read(c) {
                Some(op) => op,
                None => return,
            }
        } else {
            self.workload.random_op(&mut self.rng, c)
        };
        // Reads take the read-only path now and then, some of them serializable (never a final
        // read, which the durability checker takes as linearizable).
        let path = if op.is_read_only() && self.rng.random_bool(READ_ONLY_SHARE) {
            if !final_read && self.rng.random_bool(SERIALIZABLE_SHARE) {
                ReadPath::Serializable
            } else {
                ReadPath::ReadOnly
            }
        } else {
            ReadPath::Ordered
        };
        let serializable = path == ReadPath::Serializable;
        let (operation, path) = match (self.zk.as_mut(), self.fs.as_mut(), self.hdfs.as_mut()) {
            (Some(zk), _, _) => zk.begin(c, op.clone(), path, &mut self.rng),
            (_, Some(fs), _) => fs.begin(c, op.clone(), path, &mut self.rng),
            (_, _, Some(hdfs)) => hdfs.begin(c, op.clone(), path),
            _ => (
                self.opts
                    .service
                    .encode(&op, &mut self.rng, self.opts.selective_execution),
                path,
            ),
        };
        self.workload.invoke(c, op, self.now, final_read, serializable);
        self.client_input(c, Input::Invoke { operation, path });
    }

    fn on_deliver(&mut self, c: u32, result: Bytes) {
        if self.admin.as_ref().is_some_and(|a| a.client == c) {
            return self.admin_reply(&result);
        }
        if Some(c) == self.byz_client {
            self.byz_client_busy = false;
        } else if let Some(zk) = self.zk.as_mut() {
            let next = zk.deliver(c, &result, &mut self.rng);
            self.zk_next(c, next);
            return;
        } else if let Some(fs) = self.fs.as_mut() {
            let next = fs.deliver(c, &result, &mut self.rng);
            self.zk_next(c, next);
            return;
        } else if let Some(hdfs) = self.hdfs.as_mut() {
            let next = hdfs.deliver(c, &result);
            self.zk_next(c, next);
            return;
        } else if let Some(op) = self.workload.outstanding_op(c).map(|o| (o.op.clone(), o.serializable)) {
            let watched = self.opts.selective_execution && self.opts.service == crate::ServiceKind::Kv;
            if watched {
                self.watch_order_after(c, &op.0, op.1, &result);
            }
            let completed = self
                .workload
                .complete(c, self.now, |op| model_reply(self.opts.service, op, result));
            debug_assert!(completed, "an operation was outstanding");
            self.op_completed(c);
        } else {
            self.errors
                .push(format!("client {c} delivered a result with no operation outstanding"));
        }
        self.client_pause(c);
    }

    /// What correct client `c` completing `op` (its result `result`) tells the watch-order
    /// checker: an ordered `Get`'s value, or a write.
    fn watch_order_after(&mut self, c: u32, op: &KvOperation, serializable: bool, result: &Bytes) {
        match op {
            KvOperation::Get { key } if !serializable => {
                if let Some(upright_core::kv::KvReply::Value(value)) = upright_core::kv::KvReply::decode(result) {
                    self.watch_order.read(c, key, value);
                }
            }
            KvOperation::Get { .. } => {}
            KvOperation::Put { key, .. }
            | KvOperation::Append { key, .. }
            | KvOperation::Delete { key }
            | KvOperation::Burn { key, .. } => self.watch_order.wrote(c, key),
        }
    }

    /// Client `c` completed an operation.
    fn op_completed(&mut self, c: u32) {
        self.ops_completed += 1;
        if let Some(n) = self.ops_by_client.get_mut(c as usize) {
            *n += 1;
        }
    }

    /// Wakes client `c` for its next operation after a think time (during the workload).
    fn client_pause(&mut self, c: u32) {
        let pause = if self.now < self.opts.workload_us {
            let long = self.zk.is_some() && self.rng.random_bool(crate::zk::EXPIRY_PAUSE_PROBABILITY);
            if long {
                crate::zk::EXPIRY_PAUSE_US
            } else {
                self.think()
            }
        } else {
            1
        };
        self.push(self.now + pause, Event::ClientWake(c));
    }

    /// Carries out a ZooKeeper or NFS client's next step.
    fn zk_next(&mut self, c: u32, next: Next) {
        match next {
            Next::Invoke(operation, path) => self.client_input(c, Input::Invoke { operation, path }),
            Next::Hold => {}
            Next::Done(reply) => {
                if self.workload.complete(c, self.now, |_| reply) {
                    self.op_completed(c);
                } else {
                    self.errors
                        .push(format!("client {c} completed an operation with none outstanding"));
                }
                self.client_pause(c);
            }
        }
    }

    fn finish(self) -> SimReport {
        let history = &self.workload.history;
        let mut violations = self.errors.clone();
        violations.extend(self.agreement.violations().iter().cloned());
        violations.extend(linearizability::check(history));
        violations.extend(durability::check(history));
        violations.extend(serializable::check(history));
        violations.extend(self.pushes.check(&self.correct_clients, self.opts.heal_at()));
        violations.extend(self.watch_order.violations());
        if let Some(zk) = &self.zk {
            violations.extend(zk.violations().iter().cloned());
        }
        if let Some(fs) = &self.fs {
            violations.extend(fs.violations().iter().cloned());
        }
        if let Some(hdfs) = &self.hdfs {
            violations.extend(hdfs.violations().iter().cloned());
        }
        if self.errors.is_empty() {
            // A run stopped by a panic cannot make progress; the panic is the finding.
            violations.extend(liveness::check(history, &self.correct_clients, self.opts.heal_at()));
            // Nothing authenticated under a retired key was accepted by a correct process.
            let correct_replicas = (0..self.replica_keys.len() as u32)
                .filter(|r| !self.plan.byzantine.contains_key(r) && self.plan.twin != Some(*r))
                .map(|r| (Principal::Auth(ReplicaId(r)), &self.replica_keys[r as usize]));
            let correct_clients = self
                .correct_clients
                .iter()
                .map(|&c| (Principal::Client(ClientId(c)), &self.client_keys[c as usize]));
            for (who, keys) in correct_replicas.chain(correct_clients) {
                if keys.accepted_retired() > 0 {
                    violations.push(format!(
                        "keys: {:?}'s process accepted {} MACs under keys it had retired",
                        self.quorums.process_of(who),
                        keys.accepted_retired()
                    ));
                }
            }
            violations.extend(self.reconfiguration_lag().into_iter().map(|l| format!("liveness: {l}")));
            for &r in &self.recovering {
                if !self.recovered_or_removed(r) {
                    violations.push(format!(
                        "liveness: replica {}'s proactive recovery did not complete by the end of the run",
                        self.replicas[r].id
                    ));
                }
            }
        }
        let mut stage_stats: Vec<_> = self
            .replicas
            .iter()
            .flat_map(|n| {
                n.host.iter().flat_map(|h| {
                    h.members()
                        .iter()
                        .enumerate()
                        .map(move |(i, m)| (h.principal(i), m.stage.stats().counters.clone()))
                })
            })
            .collect();
        stage_stats.extend(self.clients.iter().map(|s| (s.principal(), s.stats().counters.clone())));
        let correct_client_total = |name: &str| -> u64 {
            self.correct_clients
                .iter()
                .filter_map(|&c| self.clients.get(c as usize))
                .map(|s| s.stats().get(name))
                .sum()
        };
        let stat_total =
            |name: &str| -> u64 { stage_stats.iter().map(|(_, s)| s.get(name).copied().unwrap_or(0)).sum() };
        let tallies = Tallies {
            read_only_delivered: correct_client_total("read_only_delivered"),
            read_only_fallbacks: correct_client_total("read_only_fallback"),
            serializable_reads: history
                .iter()
                .filter(|o| o.serializable && o.response.is_some())
                .count() as u64,
            pushes_delivered: self.pushes.delivered_count(),
            stream_pushes_delivered: self.pushes.delivered_in_streams(),
            watch_order_checks: self.watch_order.checked,
            push_gaps: self.pushes.gap_count(),
            heartbeats: stat_total("heartbeat_sent"),
            state_transfers: stat_total("state_transfer_completed"),
            pages_transferred: stat_total("state_transfer_pages"),
            sessions_expired: self.zk.as_ref().map_or(0, |zk| zk.sessions_expired),
            watch_events: self.zk.as_ref().map_or(0, |zk| zk.watch_events),
            version_conflicts: self.fs.as_ref().map_or(0, |fs| fs.conflicts)
                + self.hdfs.as_ref().map_or(0, |hdfs| hdfs.conflicts),
            keys_refreshed: stat_total("keys_refreshed"),
            recoveries: (self.recovering.len() + self.recoveries_before_switch) as u64,
            recoveries_completed: (self.recoveries_completed() + self.recoveries_before_switch) as u64,
            ops_completed: self.ops_completed,
        };
        SimReport {
            tallies,
            stage_stats,
            seed: self.opts.seed,
            violations,
            fault_counts: self.counts.0.clone(),
            ops_completed: self.ops_completed,
            ops_by_client: self.ops_by_client.clone(),
            trace_hash: *self.trace.finalize().as_bytes(),
            end_us: self.now,
        }
    }
}

/// The result in the model's encoding ([`KvReply`]); empty (undecodable: the linearizability
/// checker reports it) if it does not translate.
fn model_reply(service: ServiceKind, op: &KvOperation, result: Bytes) -> Bytes {
    if matches!(service, ServiceKind::Kv | ServiceKind::PagedKv) {
        return result;
    }
    service
        .decode(op, &result)
        .map(|reply| reply.encode())
        .unwrap_or_default()
}

fn node_retire(node: &mut ReplicaNode) {
    node.retired = true;
    node.host = None;
}

/// A message's variant name (for violations).
fn message_name(message: &Message) -> String {
    let text = format!("{message:?}");
    let end = text.find([' ', '(', '{']).unwrap_or(text.len());
    text[..end].to_string()
}

fn panic_text(panic: &Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic".into()
    }
}

/// Most messages waiting at a busy replica from one sender (the runtime's `INBOX_PER_PEER_MAX`).
const CPU_INBOX_PER_SENDER_MAX: usize = 4096;

/// Makes `ring` draw its ephemeral secrets from a generator seeded by the run's seed and `salt`
/// (one per process), so that runs with key refresh replay exactly.
fn seeded_entropy(ring: &KeyRing, seed: u64, salt: u64) {
    use rand::{RngCore, SeedableRng};
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed ^ salt.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    ring.set_entropy(Box::new(move || {
        let mut bytes = [0u8; 32];
        rng.fill_bytes(&mut bytes);
        bytes
    }));
}

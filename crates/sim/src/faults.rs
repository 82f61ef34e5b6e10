//! The fault model of one run: which fault classes exist, how a seed's fault plan is drawn within
//! the `(u, r)` budget, and the per-class injection counters.
//!
//! Budget: at any instant at most `u` replicas are faulty (crashed, partitioned away and Byzantine
//! count together), and at most `r` replicas are Byzantine for the whole run. The exception is a
//! whole-cluster power loss, which is transient: every replica restarts from its synced storage.
//! Faults happen during the fault phase `[0, heal_at)`; afterwards every crashed replica is up,
//! every partition healed and the network loses nothing (Byzantine replicas stay Byzantine).

use std::collections::BTreeMap;

use rand::seq::{IndexedRandom, SliceRandom};
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use upright_core::stage::Time;

/// A Byzantine replica's behaviour (one drawn per Byzantine replica per seed).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Behaviour {
    /// As order primary, sends PRE-PREPAREs with different batches to the two halves of the
    /// backups, plus matching PREPARE/COMMITs for each variant.
    EquivocatingPrimary,
    /// Flips bits in the MACs, authenticators, matrix rows and signatures it sends.
    CorruptMacs,
    /// Also sends copies of its messages claiming another member as sender (reply copies carry
    /// an altered result).
    ForgeSender,
    /// Execution replies with altered results.
    WrongReplies,
    /// CP-TOKENs with altered state digests.
    WrongCheckpointTokens,
    /// Drops everything it would send.
    Silence,
    /// Delays everything it sends by 50 to 300 ms.
    Slowness,
    /// Re-sends old envelopes (its own and others') later.
    Replay,
    /// Sends its messages with small structured changes, re-sealed with its own keys
    /// (`--mutate` only; [`crate::mutate`]).
    Mutate,
    /// As primary, holds every PRE-PREPARE that carries requests for three quarters of the
    /// view-change timeout: a commit arrives just before each timeout, so PBFT's timer never
    /// fires (Aardvark's slow primary).
    SlowPrimary,
    /// As primary, ignores one client's requests (client 0's items in the AUTH-REQs it
    /// receives) while it orders everyone else's (Aardvark's unfair primary).
    StarveClient,
    /// Its VIEW-CHANGEs lie about prepared certificates: claims carry another batch than the one
    /// that prepared, and a batch that never prepared is claimed above them (re-signed).
    LyingViewChange,
    /// As the primary of a new view, its NEW-VIEW replaces a batch that its view-change quorum
    /// shows committed with a null batch (re-signed).
    NewViewDropsCommitted,
    /// Serves wrong state: manifests with altered chunk digests or sizes, chunks and pages that
    /// do not match the certified digests, tree nodes with a forged child.
    WrongState,
    /// Floods its peers: with every message it sends, well-formed junk under its own valid
    /// MACs (votes for seqnos and digests nobody proposed, checkpoint tokens, fetches of state
    /// and pages that do not exist, LAST-EXECs).
    FloodPeers,
    /// Its authentication member vouches for requests their clients never sent: with every
    /// AUTH-REQ it adds an item for a correct client's next request with an invented
    /// operation, under its own valid row.
    ForgedAuth,
    /// Its order member's NEXT-BATCHes to execution members carry a batch that was never
    /// agreed (one request left out) under a history digest made to chain onto the honest one,
    /// re-sealed with its own keys: one copy can pass every check an execution member makes on
    /// a single NEXT-BATCH. Not drawn for random seeds: the sabotage run
    /// `separate-next-batch` places it.
    FabricatedBatch,
}

/// How the Byzantine client (an extra client beside the correct ones) misbehaves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClientBehaviour {
    /// Request authenticators valid for some authentication members and garbage for others.
    InconsistentAuth,
    /// With every request, copies under bad MACs and replays of its earlier requests.
    Flood,
    /// Its requests carry a valid MAC but a bad signature (caught where the cluster asks for
    /// signed requests; otherwise the signature is ignored).
    BadSignature,
}

impl ClientBehaviour {
    /// Every client behaviour, in a fixed order.
    pub const ALL: [ClientBehaviour; 3] = [
        ClientBehaviour::InconsistentAuth,
        ClientBehaviour::Flood,
        ClientBehaviour::BadSignature,
    ];

    /// The fault-class name counted for it.
    pub fn class(self) -> &'static str {
        match self {
            ClientBehaviour::InconsistentAuth => "byz_client_auth",
            ClientBehaviour::Flood => "byz_client_flood",
            ClientBehaviour::BadSignature => "byz_client_bad_signature",
        }
    }

    /// Its name (`--list-behaviours`, `--attack`).
    pub fn name(self) -> &'static str {
        match self {
            ClientBehaviour::InconsistentAuth => "client-inconsistent-auth",
            ClientBehaviour::Flood => "client-flood",
            ClientBehaviour::BadSignature => "client-bad-signature",
        }
    }
}

impl Behaviour {
    /// Every behaviour drawn for random seeds, in a fixed order (not [`Behaviour::Mutate`],
    /// which `--mutate` runs alone).
    pub const ALL: [Behaviour; 15] = [
        Behaviour::EquivocatingPrimary,
        Behaviour::CorruptMacs,
        Behaviour::ForgeSender,
        Behaviour::WrongReplies,
        Behaviour::WrongCheckpointTokens,
        Behaviour::Silence,
        Behaviour::Slowness,
        Behaviour::Replay,
        Behaviour::SlowPrimary,
        Behaviour::StarveClient,
        Behaviour::LyingViewChange,
        Behaviour::NewViewDropsCommitted,
        Behaviour::WrongState,
        Behaviour::FloodPeers,
        Behaviour::ForgedAuth,
    ];

    /// Its name (`--list-behaviours`, `--attack`).
    pub fn name(self) -> &'static str {
        match self {
            Behaviour::EquivocatingPrimary => "equivocating-primary",
            Behaviour::CorruptMacs => "corrupt-macs",
            Behaviour::ForgeSender => "forge-sender",
            Behaviour::WrongReplies => "wrong-replies",
            Behaviour::WrongCheckpointTokens => "wrong-checkpoint-tokens",
            Behaviour::Silence => "silence",
            Behaviour::Slowness => "slowness",
            Behaviour::Replay => "replay",
            Behaviour::Mutate => "mutate",
            Behaviour::SlowPrimary => "slow-primary",
            Behaviour::StarveClient => "starve-client",
            Behaviour::LyingViewChange => "lying-view-change",
            Behaviour::NewViewDropsCommitted => "new-view-drops-committed",
            Behaviour::WrongState => "wrong-state",
            Behaviour::FloodPeers => "flood-peers",
            Behaviour::ForgedAuth => "forged-auth",
            Behaviour::FabricatedBatch => "fabricated-batch",
        }
    }

    /// The replica it is placed on when drawn: the view-0 primary for the primary's attacks,
    /// the view-1 primary for the NEW-VIEW liar, an execution member for those that act there.
    pub fn place(self, rng: &mut ChaCha8Rng, n_replicas: usize, (exec_base, n_exec): (u32, usize)) -> u32 {
        match self {
            Behaviour::EquivocatingPrimary | Behaviour::SlowPrimary | Behaviour::StarveClient => 0,
            Behaviour::NewViewDropsCommitted | Behaviour::FabricatedBatch => 1,
            Behaviour::WrongReplies
            | Behaviour::WrongCheckpointTokens
            | Behaviour::ForgeSender
            | Behaviour::WrongState => exec_base + rng.random_range(0..n_exec as u32),
            _ => rng.random_range(0..n_replicas as u32),
        }
    }

    /// The fault-class name counted for it.
    pub fn class(self) -> &'static str {
        match self {
            Behaviour::EquivocatingPrimary => "byz_equivocation",
            Behaviour::CorruptMacs => "byz_corrupt_mac",
            Behaviour::ForgeSender => "byz_forge_sender",
            Behaviour::WrongReplies => "byz_wrong_reply",
            Behaviour::WrongCheckpointTokens => "byz_wrong_cp_token",
            Behaviour::Silence => "byz_silence",
            Behaviour::Slowness => "byz_slowness",
            Behaviour::Replay => "byz_replay",
            Behaviour::Mutate => "byz_mutate",
            Behaviour::SlowPrimary => "byz_slow_primary",
            Behaviour::StarveClient => "byz_starve_client",
            Behaviour::LyingViewChange => "byz_lying_view_change",
            Behaviour::NewViewDropsCommitted => "byz_new_view_drop",
            Behaviour::WrongState => "byz_wrong_state",
            Behaviour::FloodPeers => "byz_flood",
            Behaviour::ForgedAuth => "byz_forged_auth",
            Behaviour::FabricatedBatch => "byz_fabricated_batch",
        }
    }
}

/// Fault classes injected without Byzantine replicas (always present in every configuration;
/// the Byzantine client's too).
pub const BENIGN_CLASSES: [&str; 11] = [
    "loss",
    "duplication",
    "reordering",
    "delay",
    "partition",
    "crash",
    "power_loss",
    "clock_skew",
    "byz_client_auth",
    "byz_client_flood",
    "byz_client_bad_signature",
];

/// Every fault class that a run with this `r` must inject somewhere among its seeds.
pub fn expected_classes(r: usize) -> Vec<&'static str> {
    let mut classes: Vec<&'static str> = BENIGN_CLASSES.to_vec();
    if r > 0 {
        classes.extend(Behaviour::ALL.iter().map(|b| b.class()));
    }
    classes
}

/// Injection counters by fault class.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FaultCounts(pub BTreeMap<&'static str, u64>);

impl FaultCounts {
    /// Counts one injection.
    pub fn bump(&mut self, class: &'static str) {
        *self.0.entry(class).or_insert(0) += 1;
    }

    /// Adds another run's counts.
    pub fn add(&mut self, other: &FaultCounts) {
        for (class, n) in &other.0 {
            *self.0.entry(class).or_insert(0) += n;
        }
    }

    /// A class's count.
    pub fn get(&self, class: &str) -> u64 {
        self.0.get(class).copied().unwrap_or(0)
    }
}

/// What a fault step does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FaultStep {
    /// Crash these replicas (drop their unsynced writes and timers).
    Crash(Vec<u32>),
    /// Whole-cluster power loss: every replica crashes at the same instant.
    PowerLoss,
    /// Restart these replicas from their synced storage.
    Restart(Vec<u32>),
    /// Cut these replicas off from everyone else.
    Partition(Vec<u32>),
    /// Heal the current partition.
    Heal,
    /// Proactive recovery of this replica: it restarts from its synced storage and recovers
    /// (`Input::Recover`); with `damage`, an attacker first rewrote its stored checkpoint.
    Recover {
        /// The replica.
        replica: u32,
        /// Whether its stored state was rewritten.
        damage: bool,
    },
}

/// Network misbehaviour probabilities during the fault phase.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct NetworkFaults {
    /// Probability that a copy is lost.
    pub loss: f64,
    /// Probability that a copy is duplicated.
    pub duplication: f64,
    /// Probability that a copy takes a long detour (5-40 ms), overtaking later ones.
    pub reordering: f64,
    /// Probability that a copy is delayed a lot (50-200 ms).
    pub delay: f64,
}

/// Everything drawn for one seed before the run starts.
#[derive(Clone, Debug)]
pub struct FaultPlan {
    /// End of the fault phase.
    pub heal_at: Time,
    /// Scheduled steps, by time.
    pub steps: Vec<(Time, FaultStep)>,
    /// Network faults during the fault phase.
    pub network: NetworkFaults,
    /// Clock offset of each replica (microseconds added to the simulator's clock).
    pub skew: Vec<u64>,
    /// Byzantine replicas and their behaviours.
    pub byzantine: BTreeMap<u32, Behaviour>,
    /// The Byzantine client, if one runs.
    pub byzantine_client: Option<ClientBehaviour>,
    /// The replica that runs as two correct copies sharing its identity (`--twins`,
    /// [`crate::twins`]); it is one of the `r` faulty replicas.
    pub twin: Option<u32>,
}

/// Largest clock offset of a replica.
pub const SKEW_MAX_US: u64 = 50_000;

/// Inputs of [`FaultPlan::draw`].
#[derive(Clone, Copy, Debug)]
pub struct PlanShape {
    /// Failures tolerated.
    pub u: usize,
    /// Byzantine failures tolerated.
    pub r: usize,
    /// Replicas.
    pub n_replicas: usize,
    /// Execution members (replicas `exec_base .. exec_base + n_exec`).
    pub n_exec: usize,
    /// The first replica process hosting an execution member (0 unless the stages run apart).
    pub exec_base: u32,
    /// End of the fault phase.
    pub heal_at: Time,
}

impl FaultPlan {
    /// A plan without any fault.
    pub fn quiet(shape: PlanShape) -> FaultPlan {
        FaultPlan {
            heal_at: shape.heal_at,
            steps: Vec::new(),
            network: NetworkFaults::default(),
            skew: vec![0; shape.n_replicas],
            byzantine: BTreeMap::new(),
            byzantine_client: None,
            twin: None,
        }
    }

    /// Draws a plan: each fault class is switched on with some probability, so that over many
    /// seeds every class is injected often, alone and in combination.
    pub fn draw(rng: &mut ChaCha8Rng, shape: PlanShape) -> FaultPlan {
        FaultPlan::draw_with(rng, shape, 0, |rng, shape| {
            if shape.r > 0 && rng.random_bool(0.5) {
                draw_byzantine(rng, shape)
            } else {
                BTreeMap::new()
            }
        })
    }

    /// [`FaultPlan::draw`] with every Byzantine replica (1 to `r` of them, anywhere, the view-0
    /// primary among them half the time) mutating what it sends (`--mutate`).
    pub fn draw_mutating(rng: &mut ChaCha8Rng, shape: PlanShape) -> FaultPlan {
        FaultPlan::draw_with(rng, shape, 0, |rng, shape| {
            let mut out = BTreeMap::new();
            if shape.r == 0 {
                return out;
            }
            let count = rng.random_range(1..=shape.r);
            if rng.random_bool(0.5) {
                out.insert(0, Behaviour::Mutate);
            }
            while out.len() < count {
                out.insert(rng.random_range(0..shape.n_replicas as u32), Behaviour::Mutate);
            }
            out
        })
    }

    /// [`FaultPlan::draw`] with the one faulty replica a twin (`--twins`; the view-0 primary
    /// half the time) instead of a Byzantine behaviour; none when `r = 0`.
    pub fn draw_twins(rng: &mut ChaCha8Rng, shape: PlanShape) -> FaultPlan {
        let twin = (shape.r > 0).then(|| {
            if rng.random_bool(0.5) {
                0
            } else {
                rng.random_range(0..shape.n_replicas as u32)
            }
        });
        // The twin spends one fault of the budget.
        let mut plan = FaultPlan::draw_with(rng, shape, twin.is_some() as usize, |_, _| BTreeMap::new());
        plan.twin = twin;
        plan
    }

    /// A plan whose Byzantine replicas `byzantine` draws; `twins` more replicas are faulty.
    fn draw_with(
        rng: &mut ChaCha8Rng,
        shape: PlanShape,
        twins: usize,
        byzantine: impl FnOnce(&mut ChaCha8Rng, PlanShape) -> BTreeMap<u32, Behaviour>,
    ) -> FaultPlan {
        let mut plan = FaultPlan::quiet(shape);
        let chance = |rng: &mut ChaCha8Rng, p: f64, lo: f64, hi: f64| {
            if rng.random_bool(p) {
                rng.random_range(lo..hi)
            } else {
                0.0
            }
        };
        plan.network = NetworkFaults {
            loss: chance(rng, 0.6, 0.005, 0.05),
            duplication: chance(rng, 0.6, 0.005, 0.05),
            reordering: chance(rng, 0.6, 0.01, 0.1),
            delay: chance(rng, 0.5, 0.002, 0.02),
        };
        if rng.random_bool(0.5) {
            plan.skew = (0..shape.n_replicas)
                .map(|_| rng.random_range(0..=2 * SKEW_MAX_US))
                .collect();
        }
        plan.byzantine = byzantine(rng, shape);
        plan.byzantine_client = rng
            .random_bool(0.3)
            .then(|| *ClientBehaviour::ALL.choose(rng).expect("non-empty"));
        plan.steps = draw_episodes(rng, shape, plan.byzantine.len() + twins);
        plan
    }

    /// A plan for `--recovery`: network faults and a Byzantine client as [`FaultPlan::draw`]
    /// draws them, and instead of crash and partition episodes, the correct replicas recovering
    /// proactively one after another (every 150 to 350 ms, shuffled), each with its stored
    /// checkpoint rewritten by an attacker with probability `damage` (the replica was
    /// compromised: the recovery must repair it). A recovering replica is faulty until it has
    /// recovered, so it spends one fault of the budget: Byzantine replicas (half the time) only
    /// where `u` leaves room beside it (`u > r`, up to `u - 1` of them). Without `faulty`,
    /// nothing else goes wrong (the sabotage run).
    pub fn draw_recovering(rng: &mut ChaCha8Rng, shape: PlanShape, damage: f64, faulty: bool) -> FaultPlan {
        let room = shape.u.saturating_sub(1).min(shape.r);
        let mut plan = if faulty {
            FaultPlan::draw_with(rng, shape, 1, |rng, shape| {
                if room > 0 && rng.random_bool(0.5) {
                    let mut out = draw_byzantine(rng, shape);
                    while out.len() > room {
                        out.pop_last();
                    }
                    out
                } else {
                    BTreeMap::new()
                }
            })
        } else {
            FaultPlan::quiet(shape)
        };
        let mut order: Vec<u32> = (0..shape.n_replicas as u32)
            .filter(|r| !plan.byzantine.contains_key(r))
            .collect();
        order.shuffle(rng);
        let mut steps = Vec::new();
        let mut t: Time = rng.random_range(100_000..300_000);
        for replica in order {
            if t + 100_000 >= shape.heal_at {
                break;
            }
            let damage = rng.random_bool(damage);
            steps.push((t, FaultStep::Recover { replica, damage }));
            t += rng.random_range(150_000..350_000);
        }
        plan.steps = steps;
        plan
    }

    /// The plan for a fixed set of Byzantine replicas (sabotage runs), with benign network faults.
    pub fn with_byzantine(shape: PlanShape, byzantine: BTreeMap<u32, Behaviour>) -> FaultPlan {
        let mut plan = FaultPlan::quiet(shape);
        plan.byzantine = byzantine;
        plan
    }
}

fn draw_byzantine(rng: &mut ChaCha8Rng, shape: PlanShape) -> BTreeMap<u32, Behaviour> {
    let count = rng.random_range(1..=shape.r);
    let mut out = BTreeMap::new();
    for _ in 0..count {
        let behaviour = *Behaviour::ALL.choose(rng).expect("non-empty");
        let replica = behaviour.place(rng, shape.n_replicas, (shape.exec_base, shape.n_exec));
        out.entry(replica).or_insert(behaviour);
    }
    out
}

/// Crash, partition and power-loss episodes, one after another within the fault phase, each
/// touching at most `u - byzantine` replicas (power loss touches all, transiently).
fn draw_episodes(rng: &mut ChaCha8Rng, shape: PlanShape, byzantine: usize) -> Vec<(Time, FaultStep)> {
    let budget = shape.u.saturating_sub(byzantine);
    let mut steps = Vec::new();
    let mut t: Time = rng.random_range(50_000..300_000);
    let episodes = rng.random_range(0..=3);
    for _ in 0..episodes {
        let kind = rng.random_range(0..10);
        let all: Vec<u32> = (0..shape.n_replicas as u32).collect();
        let (start, end): (FaultStep, FaultStep);
        let duration: Time;
        if kind == 0 {
            duration = rng.random_range(20_000..300_000);
            start = FaultStep::PowerLoss;
            end = FaultStep::Restart(all);
        } else if budget == 0 {
            continue;
        } else {
            let k = rng.random_range(1..=budget);
            let mut chosen = all;
            chosen.shuffle(rng);
            chosen.truncate(k);
            chosen.sort_unstable();
            duration = rng.random_range(100_000..700_000);
            if kind < 6 {
                start = FaultStep::Crash(chosen.clone());
                end = FaultStep::Restart(chosen);
            } else {
                start = FaultStep::Partition(chosen);
                end = FaultStep::Heal;
            }
        }
        if t + duration + 10_000 >= shape.heal_at {
            break;
        }
        steps.push((t, start));
        steps.push((t + duration, end));
        t += duration + rng.random_range(50_000..400_000);
    }
    steps
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn plans_respect_the_budget() {
        for (u, r, n, n_exec) in [(1, 0, 3, 3), (1, 1, 4, 3), (2, 1, 6, 5)] {
            let shape = PlanShape {
                u,
                r,
                n_replicas: n,
                n_exec,
                exec_base: 0,
                heal_at: 2_000_000,
            };
            let mut seen_byz = 0;
            for seed in 0..300 {
                let mut rng = ChaCha8Rng::seed_from_u64(seed);
                let plan = FaultPlan::draw(&mut rng, shape);
                assert!(plan.byzantine.len() <= r);
                seen_byz += plan.byzantine.len();
                for (t, step) in &plan.steps {
                    assert!(*t < plan.heal_at);
                    let touched = match step {
                        FaultStep::Crash(v) | FaultStep::Partition(v) => v.len(),
                        _ => 0,
                    };
                    assert!(touched + plan.byzantine.len() <= u, "seed {seed}: {step:?}");
                }
            }
            assert_eq!(seen_byz > 0, r > 0);
        }
    }

    #[test]
    fn a_twin_spends_one_fault_of_the_budget() {
        for (u, r, n, n_exec) in [(1, 0, 3, 3), (1, 1, 4, 3), (2, 1, 6, 5)] {
            let shape = PlanShape {
                u,
                r,
                n_replicas: n,
                n_exec,
                exec_base: 0,
                heal_at: 2_000_000,
            };
            let mut primary = 0;
            for seed in 0..300 {
                let plan = FaultPlan::draw_twins(&mut ChaCha8Rng::seed_from_u64(seed), shape);
                assert!(plan.byzantine.is_empty(), "no hand-written behaviour beside the twin");
                assert_eq!(plan.twin.is_some(), r > 0);
                primary += (plan.twin == Some(0)) as u32;
                for (_, step) in &plan.steps {
                    if let FaultStep::Crash(v) | FaultStep::Partition(v) = step {
                        let twins = plan.twin.is_some() as usize;
                        assert!(v.len() + twins <= u, "seed {seed}: {step:?} beside the twin");
                    }
                }
            }
            if r > 0 {
                assert!(
                    (130..=220).contains(&primary),
                    "the view-0 primary about half the time: {primary}"
                );
            }
        }
    }
}

//! The throughput-under-attack checker (`upright-sim --attack NAME|all`; issue 24, Aardvark).
//!
//! Safety under Byzantine faults is what the other checkers see; this one sees whether the
//! cluster stays *fast*. A seed runs twice on the same cluster, clients and workload, without
//! benign faults, with every replica spending [`ATTACK_CPU_US_PER_MESSAGE`] on each message it
//! receives and enough clients to keep it busy (so the runs measure throughput, as Aardvark
//! did): once with one attack (one Byzantine replica with a [`Behaviour`], placed where it hurts
//! most, or the Byzantine client with a [`ClientBehaviour`]) and once without. The
//! attacked run must complete at least [`ATTACK_THROUGHPUT_MIN`] of the operations of the run
//! without the attack, besides passing every other checker. A busy replica serves the messages
//! waiting for it round-robin by sender, as the runtime's inbox does, and with the defences it
//! cuts off a peer whose messages keep being refused, as the runtime does. With `defences: false`
//! the order stage watches the primary only with PBFT's timer (`knobs.watch_primary = false`) and
//! no peer is cut off: the slow and starving primaries then stay in place, and the checker says so.

use crate::faults::{Behaviour, ClientBehaviour};
use crate::options::SimOptions;
use crate::report::SimReport;

/// Least fraction of the fault-free run's operations an attacked run must complete.
pub const ATTACK_THROUGHPUT_MIN: f64 = 0.9;
/// Least fraction of its fault-free operations each correct client must complete under attack
/// (a starved client completes none).
pub const ATTACK_CLIENT_MIN: f64 = 0.5;
/// Virtual seconds of workload of an attack run: long enough that detecting an attacker and
/// changing views is a small part of it.
pub const ATTACK_WORKLOAD_US: u64 = 6_000_000;
/// Correct clients of an attack run, each with a short think time ([`ATTACK_THINK_US`]): with
/// [`ATTACK_CPU_US_PER_MESSAGE`] they keep the replicas busy, so a run measures throughput.
pub const ATTACK_CLIENTS: u32 = 24;
/// Keys of an attack run's workload: one per client, so that the linearizability checker's
/// search per key stays small with [`ATTACK_CLIENTS`] concurrent clients.
pub const ATTACK_KEYS: u32 = ATTACK_CLIENTS;
/// Think time between a client's operations in an attack run, microseconds.
pub const ATTACK_THINK_US: (u64, u64) = (0, 500);
/// Processing time of each message a replica receives in an attack run, microseconds
/// ([`SimOptions::cpu_us_per_message`]). Without it the simulated replicas are infinitely fast and
/// a run measures only latency: an attack that takes one replica's contribution away (silence)
/// then costs what the slowest of the remaining quorum members adds on the simulated network's
/// 0.1-5 ms delays, about a quarter, whatever the protocol does; Aardvark's figures are saturated
/// throughput. With [`ATTACK_CLIENTS`] clients, 200 us keeps the fault-free run's replicas 80-100%
/// busy (50 us with 16 clients, before session 26, kept them 26-38% busy).
pub const ATTACK_CPU_US_PER_MESSAGE: upright_core::stage::Time = 200;

/// One attack: a Byzantine replica's behaviour or the Byzantine client's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Attack {
    /// One Byzantine replica.
    Replica(Behaviour),
    /// The Byzantine client.
    Client(ClientBehaviour),
}

impl Attack {
    /// Every attack: each replica behaviour a random seed can draw, then each client one.
    pub fn all() -> Vec<Attack> {
        Behaviour::ALL
            .iter()
            .map(|b| Attack::Replica(*b))
            .chain(ClientBehaviour::ALL.iter().map(|c| Attack::Client(*c)))
            .collect()
    }

    /// Its name (the behaviour's).
    pub fn name(self) -> &'static str {
        match self {
            Attack::Replica(b) => b.name(),
            Attack::Client(c) => c.name(),
        }
    }

    /// Parses a name.
    pub fn parse(name: &str) -> Option<Attack> {
        Attack::all().into_iter().find(|a| a.name() == name)
    }

    /// Whether it can run with `r` Byzantine replicas allowed (a client attack always can).
    pub fn fits(self, r: usize) -> bool {
        matches!(self, Attack::Client(_)) || r > 0
    }
}

/// The options of seed `seed`'s run under `attack` (or, with `None`, without it).
pub fn attack_options(seed: u64, u: usize, r: usize, attack: Option<Attack>, defences: bool) -> SimOptions {
    let mut opts = SimOptions::new(seed, u, r);
    opts.faults = false;
    opts.workload_us = ATTACK_WORKLOAD_US;
    opts.clients = ATTACK_CLIENTS;
    opts.keys = ATTACK_KEYS;
    // The runtime's chunk size: a state transfer is then a manifest and a chunk or two, as it
    // would be for a state this small, rather than dozens of 256-byte messages that each wait
    // their sender's turn at a saturated replica.
    opts.state_chunk_bytes = upright_core::config::Knobs::default().state_chunk_bytes;
    opts.think_us = ATTACK_THINK_US;
    opts.cpu_us_per_message = ATTACK_CPU_US_PER_MESSAGE;
    opts.attack = attack;
    opts.defences = defences;
    opts.peer_cut_off = defences;
    // Robust mode: signed requests, so that a bad signature is something to catch.
    opts.client_signatures = true;
    opts
}

/// One seed under one attack, beside the same seed without it.
#[derive(Clone, Debug)]
pub struct AttackOutcome {
    /// The attacked run (its violations include the throughput checker's).
    pub attacked: SimReport,
    /// Operations the run without the attack completed.
    pub fault_free_ops: u64,
}

impl AttackOutcome {
    /// Attacked operations over fault-free ones.
    pub fn ratio(&self) -> f64 {
        self.attacked.ops_completed as f64 / self.fault_free_ops.max(1) as f64
    }
}

/// Runs seed `seed` under `attack` and without it, and checks the throughput.
pub fn run_attack(seed: u64, u: usize, r: usize, attack: Attack, defences: bool) -> AttackOutcome {
    let fault_free = crate::run(attack_options(seed, u, r, None, defences));
    let mut attacked = crate::run(attack_options(seed, u, r, Some(attack), defences));
    let outcome_ratio = attacked.ops_completed as f64 / fault_free.ops_completed.max(1) as f64;
    if outcome_ratio < ATTACK_THROUGHPUT_MIN {
        attacked.violations.push(format!(
            "throughput under attack {}: {} operations, {:.1}% of the {} without it (at least {:.0}% expected)",
            attack.name(),
            attacked.ops_completed,
            outcome_ratio * 100.0,
            fault_free.ops_completed,
            ATTACK_THROUGHPUT_MIN * 100.0
        ));
    }
    for (c, (&under, &without)) in attacked
        .ops_by_client
        .clone()
        .iter()
        .zip(&fault_free.ops_by_client)
        .enumerate()
    {
        if (under as f64) < without as f64 * ATTACK_CLIENT_MIN {
            attacked.violations.push(format!(
                "throughput under attack {}: client {c} completed {under} operations, {without} without it (at least {:.0}% expected)",
                attack.name(),
                ATTACK_CLIENT_MIN * 100.0
            ));
        }
    }
    AttackOutcome {
        attacked,
        fault_free_ops: fault_free.ops_completed,
    }
}

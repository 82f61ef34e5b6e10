//! `upright-sim --soak MINUTES`: seeds across every configuration the simulator runs — each
//! (u, r) of [`SOAK_CONFIGURATIONS`], each service of [`ServiceKind::ALL`], and where a replica
//! may be Byzantine each way of drawing it (a random behaviour, message mutation, twins), and
//! each with proactive recoveries and with key refresh, and each other ordering protocol where it
//! applies (LCR at r = 0, Quorum at u = r), selective execution with the services that declare
//! their objects, and the stages in processes of their own — on several threads until the time
//! is up.
//! Seed number k goes to lane `k mod lanes` as that lane's seed `first_seed + k / lanes`, so a
//! soak's seeds do not depend on the threads or the machine's speed, only on how many it reached.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use upright_core::config::OrderProtocol;

use crate::{SabotageMode, ServiceKind, SimOptions, Summary};

/// The (u, r) configurations a soak covers.
pub const SOAK_CONFIGURATIONS: [(usize, usize); 3] = [(1, 0), (1, 1), (2, 1)];

/// One kind of run of a soak: a configuration, a service, how the faulty replica is drawn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lane {
    /// Failures tolerated.
    pub u: usize,
    /// Byzantine failures tolerated.
    pub r: usize,
    /// The replicated service.
    pub service: ServiceKind,
    /// Byzantine replicas mutate what they send (`--mutate`; only with r > 0).
    pub mutate: bool,
    /// The faulty replica runs as two correct copies (`--twins`; only with r > 0).
    pub twins: bool,
    /// Correct replicas recover proactively in turn (`--recovery`).
    pub recovery: bool,
    /// Key refresh (`--key-refresh`).
    pub key_refresh: bool,
    /// The administrator grows the cluster and shrinks it back (`--reconfiguration`).
    pub reconfiguration: bool,
    /// The ordering protocol (`--protocol`).
    pub protocol: OrderProtocol,
    /// Selective execution (`--selective-execution`; the services that declare objects).
    pub selective: bool,
    /// The execution members in processes of their own, sized for `u + 1` failures
    /// (`--separate-stages`).
    pub separate: bool,
}

impl Lane {
    /// Every lane, in the order seeds are dealt to them.
    pub fn all() -> Vec<Lane> {
        let mut lanes = Vec::new();
        for (u, r) in SOAK_CONFIGURATIONS {
            for service in ServiceKind::ALL {
                let lane = Lane {
                    u,
                    r,
                    service,
                    mutate: false,
                    twins: false,
                    recovery: false,
                    key_refresh: false,
                    reconfiguration: false,
                    protocol: OrderProtocol::Pbft,
                    selective: false,
                    separate: false,
                };
                lanes.push(lane);
                if r == 0 {
                    // LCR, crash-only: plain and with key refresh.
                    let lcr = Lane {
                        protocol: OrderProtocol::Lcr,
                        ..lane
                    };
                    lanes.push(lcr);
                    lanes.push(Lane {
                        key_refresh: true,
                        ..lcr
                    });
                }
                if r > 0 {
                    lanes.push(Lane { mutate: true, ..lane });
                    lanes.push(Lane { twins: true, ..lane });
                }
                if r == u {
                    // Aliph's Quorum over PBFT: plain, Twins and mutation.
                    let quorum = Lane {
                        protocol: OrderProtocol::Quorum,
                        ..lane
                    };
                    lanes.push(quorum);
                    lanes.push(Lane { twins: true, ..quorum });
                    lanes.push(Lane { mutate: true, ..quorum });
                    // Aliph: Quorum and Chain in turn.
                    let aliph = Lane {
                        protocol: OrderProtocol::Aliph,
                        ..lane
                    };
                    lanes.push(aliph);
                    lanes.push(Lane { twins: true, ..aliph });
                    lanes.push(Lane { mutate: true, ..aliph });
                }
                if r > 0 {
                    // Aliph's Chain over PBFT: plain, Twins and mutation.
                    let chain = Lane {
                        protocol: OrderProtocol::Chain,
                        ..lane
                    };
                    lanes.push(chain);
                    lanes.push(Lane { twins: true, ..chain });
                    lanes.push(Lane { mutate: true, ..chain });
                }
                lanes.push(Lane { recovery: true, ..lane });
                lanes.push(Lane {
                    key_refresh: true,
                    ..lane
                });
                lanes.push(Lane {
                    reconfiguration: true,
                    ..lane
                });
                if matches!(
                    service,
                    ServiceKind::Kv | ServiceKind::Redis | ServiceKind::PagedKv | ServiceKind::Zk
                ) {
                    // Selective execution (ODRC): plain, with each way of drawing the faulty
                    // replica, with recoveries and with key refresh.
                    let selective = Lane {
                        selective: true,
                        ..lane
                    };
                    lanes.extend(Lane::drawn_ways(selective));
                }
                // Separate stages: every service plain; the KV also with each way of drawing
                // the faulty process, recoveries, key refresh and selective execution (ODRC-6).
                let separate = Lane { separate: true, ..lane };
                if service == ServiceKind::Kv {
                    lanes.extend(Lane::drawn_ways(separate));
                    lanes.push(Lane {
                        selective: true,
                        ..separate
                    });
                } else {
                    lanes.push(separate);
                }
            }
        }
        lanes
    }

    /// `lane` plain, with mutation and with twins where r > 0, with recoveries and with key
    /// refresh.
    fn drawn_ways(lane: Lane) -> Vec<Lane> {
        let mut ways = vec![lane];
        if lane.r > 0 {
            ways.push(Lane { mutate: true, ..lane });
            ways.push(Lane { twins: true, ..lane });
        }
        ways.push(Lane { recovery: true, ..lane });
        ways.push(Lane {
            key_refresh: true,
            ..lane
        });
        ways
    }

    /// The lane's name, as the totals print it: `u1r1 redis mutate`, `u2r1 zk twins`,
    /// `u1r0 fs recovery`, `u1r1 kv key-refresh`, `u2r1 zk reconfiguration`,
    /// `u1r1 kv selective separate twins`.
    pub fn name(&self) -> String {
        let drawn = match (self.mutate, self.twins, self.recovery, self.key_refresh) {
            (true, ..) => " mutate",
            (_, true, ..) => " twins",
            (_, _, true, _) => " recovery",
            (_, _, _, true) => " key-refresh",
            _ if self.reconfiguration => " reconfiguration",
            _ => "",
        };
        let protocol = match self.protocol {
            OrderProtocol::Pbft => "",
            OrderProtocol::Lcr => " lcr",
            OrderProtocol::Quorum => " quorum",
            OrderProtocol::Chain => " chain",
            OrderProtocol::Aliph => " aliph",
        };
        let selective = if self.selective { " selective" } else { "" };
        let separate = if self.separate { " separate" } else { "" };
        format!(
            "u{}r{} {}{protocol}{selective}{separate}{drawn}",
            self.u,
            self.r,
            self.service.name()
        )
    }
}

/// What a soak is told.
#[derive(Clone, Debug)]
pub struct SoakOptions {
    /// How long to start new seeds.
    pub duration: Duration,
    /// Threads running seeds.
    pub threads: usize,
    /// The first seed of every lane.
    pub first_seed: u64,
    /// Virtual microseconds of client workload per seed.
    pub workload_us: u64,
    /// Correct clients per seed.
    pub clients: u32,
    /// Stop after this many seeds even if time is left (tests).
    pub max_seeds: Option<u64>,
    /// A deliberately broken protocol or service in every seed (to see that the checkers catch
    /// it in every lane it applies to).
    pub sabotage: Option<SabotageMode>,
}

/// A failing seed.
#[derive(Clone, Debug)]
pub struct Failure {
    /// Its lane.
    pub lane: Lane,
    /// Its seed.
    pub seed: u64,
    /// Its first violation.
    pub violation: String,
    /// The command that replays it.
    pub replay: String,
}

/// What a soak found.
#[derive(Debug)]
pub struct SoakResult {
    /// Totals over every seed (fault classes, operations, violations).
    pub total: Summary,
    /// Totals per lane, in [`Lane::all`]'s order.
    pub lanes: Vec<(Lane, Summary)>,
    /// Every failing seed.
    pub failures: Vec<Failure>,
    /// Wall time it took.
    pub elapsed: Duration,
}

impl SoakResult {
    /// Seeds per second of wall time.
    pub fn seeds_per_second(&self) -> f64 {
        self.total.seeds as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// Runs the soak. `progress` is called from one thread about every `every` with the seeds done so
/// far and the wall time; `on_failure` as each failing seed is found.
pub fn soak(
    options: &SoakOptions,
    every: Duration,
    mut progress: impl FnMut(u64, Duration),
    on_failure: impl Fn(&Failure) + Sync,
) -> SoakResult {
    let lanes = Lane::all();
    let next = AtomicU64::new(0);
    let done = AtomicU64::new(0);
    let totals = Mutex::new((Summary::default(), vec![Summary::default(); lanes.len()], Vec::new()));
    let start = Instant::now();
    let deadline = start + options.duration;
    std::thread::scope(|scope| {
        for _ in 0..options.threads.max(1) {
            scope.spawn(|| loop {
                if Instant::now() >= deadline {
                    return;
                }
                let k = next.fetch_add(1, Ordering::Relaxed);
                if options.max_seeds.is_some_and(|max| k >= max) {
                    return;
                }
                let index = (k % lanes.len() as u64) as usize;
                let lane = lanes[index];
                let seed = options.first_seed + k / lanes.len() as u64;
                let mut opts = SimOptions::new(seed, lane.u, lane.r);
                opts.service = lane.service;
                opts.mutate = lane.mutate;
                opts.twins = lane.twins;
                opts.recovery = lane.recovery;
                opts.key_refresh = lane.key_refresh;
                opts.reconfiguration = lane.reconfiguration;
                opts.protocol = lane.protocol;
                opts.selective_execution = lane.selective;
                opts.separate_stages = lane.separate.then_some(lane.u + 1);
                opts.workload_us = options.workload_us;
                opts.clients = options.clients;
                opts.sabotage = options.sabotage;
                let report = crate::run(opts.clone());
                let failure = report.violations.first().map(|v| Failure {
                    lane,
                    seed,
                    violation: v.clone(),
                    replay: opts.replay_command(),
                });
                if let Some(f) = &failure {
                    on_failure(f);
                }
                let mut t = totals.lock().expect("no thread panics holding it");
                t.0.add(&report);
                t.1[index].add(&report);
                t.2.extend(failure);
                drop(t);
                done.fetch_add(1, Ordering::Relaxed);
            });
        }
        // Progress from this thread while the workers run.
        let mut last = Instant::now();
        loop {
            std::thread::sleep(Duration::from_millis(50));
            let out_of_seeds = options.max_seeds.is_some_and(|max| done.load(Ordering::Relaxed) >= max);
            if Instant::now() >= deadline || out_of_seeds {
                break;
            }
            if last.elapsed() >= every {
                last = Instant::now();
                progress(done.load(Ordering::Relaxed), start.elapsed());
            }
        }
    });
    let (total, per_lane, failures) = totals.into_inner().expect("no thread panics holding it");
    SoakResult {
        total,
        lanes: lanes.into_iter().zip(per_lane).collect(),
        failures,
        elapsed: start.elapsed(),
    }
}

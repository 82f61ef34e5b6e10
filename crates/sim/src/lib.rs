//! upright's deterministic simulator: one seed gives one exact run of the clients and every stage
//! of a cluster with injected faults (message loss, duplication, reordering, delay, partitions,
//! crashes and restarts losing unsynced writes, whole-cluster power loss, clock skew, Byzantine
//! replicas and a Byzantine client), checked for linearizability, agreement, durability and
//! progress after the faults heal.
//!
//! Layout: [`events`] (queue and timers), [`network`], [`storage`], [`faults`] (fault plan and
//! budget), [`byzantine`] (Byzantine behaviours), [`mutate`] (message mutation), [`twins`] (a faulty replica as two correct copies), [`workload`] and [`history`] (clients),
//! [`checkers`], [`sim`] (the run), [`report`], [`options`], [`protocol`] (which stage code runs),
//! [`service`] (which replicated service runs, and its mapping onto the checkers' model),
//! [`toy`] (a toy protocol that tests the machinery), [`zk`] (ZooKeeper clients for
//! `--service zk`), [`fs`] (NFS clients for `--service fs`), [`soak`] (`--soak`: seeds across every configuration until the time is up).
#![warn(missing_docs)]

pub mod attack;
pub mod byzantine;
pub mod checkers;
pub mod events;
pub mod faults;
pub mod fs;
pub mod hdfs;
pub mod history;
pub mod mutate;
pub mod network;
pub mod options;
pub mod protocol;
pub mod reconfig;
pub mod report;
pub mod runtime;
pub mod service;
pub mod sim;
pub mod soak;
pub mod storage;
pub mod sweep;
pub mod toy;
pub mod twins;
pub mod workload;
pub mod zk;

pub use options::{SabotageMode, SimOptions};
pub use report::{SimReport, Summary, Tallies};
pub use service::ServiceKind;
pub use sim::{run, Sim};

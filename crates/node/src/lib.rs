//! upright's runtime: hosts the protocol stages of `upright-core` in real processes.
//!
//! - [`storage`]: per-stage write-ahead logs with checksums, group commit, snapshots, recovery;
//! - [`files`]: cluster config (TOML), key files, client config;
//! - [`transport`]: length-prefixed frames over TCP, per-peer bounded queues, fair inbound service;
//! - [`replica`]: one replica process (its co-located stages on one task) and its metrics;
//! - cutting off a peer replica whose messages keep proving it faulty: `upright_core::cutoff`, applied in [`replica`];
//! - [`client`]: an async client API over the core's client protocol;
//! - [`gateway`]: what every protocol gateway shares: the pool of upright clients that packs many
//!   connections' commands into one operation, and its client identities;
//! - [`norep`]: the unreplicated NO-REP server, the benchmarks' baseline;
//! - [`bench`](mod@bench): `upright bench`, closed-loop benchmarks beside the NO-REP baseline.
#![warn(missing_docs)]

pub mod bench;
pub mod client;
pub mod files;
pub mod gateway;
pub mod host;
pub mod metrics;
pub mod norep;
pub mod pages;
pub mod recovery;
pub mod replica;
pub mod spin;
pub mod storage;
pub mod timeline;
pub mod transport;

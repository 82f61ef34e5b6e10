//! upright's replication protocol as pure state machines: no clock, socket, file or random source
//! is touched here. The simulator (`upright-sim`) and the runtime (`upright-node`) host the same
//! code.
//!
//! Layout, by concept (names follow the papers):
//! - [`ids`], [`config`], [`quorum`]: who is who, the fault model `(u, r)` and every quorum size;
//!   [`limits`]: named limits;
//! - [`crypto`], [`message`], [`codec`], [`wire`]: digests, MACs, authenticators, matrix
//!   signatures, signatures; every message; bounded encoding of values, and the wire format of
//!   envelopes;
//! - [`page_tree`], [`pages`]: a service's paged state under a Merkle tree, checkpointed by
//!   difference and transferred by verified difference;
//! - [`stage`]: the `handle(now, input) -> actions` shape; [`host`]: a replica's co-located
//!   stages with the durability rule (group commit, persist before send); [`service`]: the
//!   application trait;
//!   [`stages`]: the one factory of every principal's stage for any service;
//! - [`client`], [`auth`], [`order`], [`exec`]: the four roles; [`kv`]: an in-memory key-value
//!   service used by the simulator and tests; [`objects`]: a paged test service of fixed-size
//!   objects.
#![warn(missing_docs)]

pub mod codec;
pub mod config;
pub mod contract;
pub mod crypto;
pub mod cutoff;
pub mod fair;
pub mod ids;
pub mod limits;
pub mod message;
pub mod page_tree;
pub mod pages;
pub mod quorum;
pub mod reconfig;
pub mod service;
pub mod session;
pub mod stage;
pub mod stages;
pub mod wire;

pub mod auth;
pub mod client;
pub mod exec;
pub mod host;
pub mod kv;
pub mod lcr;
pub mod objects;
pub mod order;

pub mod testing;

//! A Byzantine-fault-tolerant key-value store that real Redis clients use unchanged.
//!
//! - [`store`]: the replicated state machine ([`store::RedisStore`], an
//!   [`upright_core::service::Service`]): Redis strings with expiry driven by the agreed batch time
//!   (`BatchContext::time_us`), never a local clock; deterministic checkpoints;
//! - [`command`]: the command table (names, arities) and argument parsing shared by the store and
//!   the gateway, so unknown commands and wrong arity get Redis' exact errors without a round trip;
//! - [`reply`]: replies and their RESP2/RESP3 encodings;
//! - [`resp`]: a bounded RESP request parser;
//! - [`gateway`]: the Redis-protocol gateway, an upright client (UpRight's client shim).
//!
//! An upright operation is a batch of commands (each an argument vector), postcard-encoded; its
//! result is the list of their replies. The gateway packs the commands pipelined by its
//! connections into one operation, so one agreement round serves many Redis commands.
#![warn(missing_docs)]

pub mod command;
pub mod gateway;
pub mod glob;
pub mod reply;
pub mod resp;
pub mod store;

use bytes::Bytes;

/// Most commands in one upright operation.
pub const COMMANDS_PER_OPERATION_MAX: usize = 512;

/// Encodes a batch of commands as one upright operation.
pub fn encode_operation(commands: &[Vec<Bytes>]) -> Bytes {
    Bytes::from(upright_core::codec::to_bytes(commands))
}

/// Decodes an operation; `None` if malformed or too long.
pub fn decode_operation(bytes: &[u8]) -> Option<Vec<Vec<Bytes>>> {
    let commands: Vec<Vec<Bytes>> = upright_core::codec::from_bytes(bytes).ok()?;
    (commands.len() <= COMMANDS_PER_OPERATION_MAX && commands.iter().all(|c| !c.is_empty())).then_some(commands)
}

/// Encodes the replies of one operation.
pub fn encode_replies(replies: &[reply::Reply]) -> Bytes {
    Bytes::from(upright_core::codec::to_bytes(replies))
}

/// Decodes the replies of one operation.
pub fn decode_replies(bytes: &[u8]) -> Option<Vec<reply::Reply>> {
    upright_core::codec::from_bytes(bytes).ok()
}

/// Replica-side wiring: the service factory that runs this store as the execution stage's service.
pub mod replica {
    use std::sync::Arc;

    use upright_core::stages::ServiceFactory;

    use crate::store::RedisStore;

    /// Environment variable (testing only): a replica whose id it names runs a corrupting store
    /// that lies in its replies and stores wrong values, standing in for a Byzantine replica.
    pub const CORRUPT_REPLICA_ENV: &str = "UPRIGHT_TEST_CORRUPT_REPLICA";

    /// Whether replica `id` is told by [`CORRUPT_REPLICA_ENV`] to corrupt (testing only).
    pub fn corrupt_requested(id: u32) -> bool {
        std::env::var(CORRUPT_REPLICA_ENV).is_ok_and(|v| v.trim() == id.to_string())
    }

    /// The Redis-compatible store as a replica's service (`corrupt`: the lying stand-in).
    pub fn service(corrupt: bool) -> ServiceFactory {
        Arc::new(move || {
            if corrupt {
                Box::new(RedisStore::corrupting())
            } else {
                Box::new(RedisStore::new())
            }
        })
    }
}

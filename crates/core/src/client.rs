//! The client library's protocol: request ids, preferred quorum then all, retransmission with a
//! doubling timeout, and `r + 1` matching replies.
//! (Placeholder: implemented in the client/auth change.)

use std::sync::Arc;

use crate::config::{ClusterConfig, ConfigError};
use crate::crypto::KeyRing;
use crate::ids::{ClientId, Principal};
use crate::stage::{Action, Input, Stage, Stats, Time};

/// A client's protocol state machine.
pub struct Client {
    id: ClientId,
    stats: Stats,
}

impl Client {
    /// A client `id` of `config` with its key ring.
    pub fn new(config: Arc<ClusterConfig>, id: ClientId, keys: Arc<KeyRing>) -> Result<Client, ConfigError> {
        let _ = (config, keys);
        Ok(Client { id, stats: Stats::default() })
    }
}

impl Stage for Client {
    fn principal(&self) -> Principal {
        Principal::Client(self.id)
    }
    fn handle(&mut self, _now: Time, _input: Input, _out: &mut Vec<Action>) {
        unimplemented!("client stage")
    }
    fn stats(&self) -> &Stats {
        &self.stats
    }
}

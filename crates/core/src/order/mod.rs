//! The order stage: PBFT agreement on batches.
//! (Placeholder: implemented in its own change.)

use std::sync::Arc;

use crate::config::{ClusterConfig, ConfigError};
use crate::crypto::KeyRing;
use crate::ids::{Principal, ReplicaId};
use crate::stage::{Action, Input, Stage, Stats, Storage, Time};

/// The order stage: PBFT agreement on batches.
pub struct OrderStage {
    id: ReplicaId,
    stats: Stats,
}

impl OrderStage {
    /// Member `id` of this stage, restored from `storage` (empty on first start).
    pub fn new(
        config: Arc<ClusterConfig>,
        id: ReplicaId,
        keys: Arc<KeyRing>,
        storage: &Storage,
    ) -> Result<OrderStage, ConfigError> {
        let _ = (config, keys, storage);
        Ok(OrderStage {
            id,
            stats: Stats::default(),
        })
    }
}

impl Stage for OrderStage {
    fn principal(&self) -> Principal {
        Principal::Order(self.id)
    }
    fn handle(&mut self, _now: Time, _input: Input, _out: &mut Vec<Action>) {
        unimplemented!("order stage")
    }
    fn stats(&self) -> &Stats {
        &self.stats
    }
}

//! The execution stage.
//! (Placeholder: implemented in its own change.)

use std::sync::Arc;

use crate::config::{ClusterConfig, ConfigError};
use crate::crypto::KeyRing;
use crate::ids::{Principal, ReplicaId};
use crate::service::Service;
use crate::stage::{Action, Input, Stage, Stats, Storage, Time};

/// The execution stage.
pub struct ExecStage {
    id: ReplicaId,
    stats: Stats,
}

impl ExecStage {
    /// Member `id` of this stage, restored from `storage` (empty on first start).
    pub fn new(
        config: Arc<ClusterConfig>,
        id: ReplicaId,
        keys: Arc<KeyRing>,
        storage: &Storage,
        service: Box<dyn Service + Send>,
    ) -> Result<ExecStage, ConfigError> {
        let _ = (config, keys, storage, service);
        Ok(ExecStage {
            id,
            stats: Stats::default(),
        })
    }
}

impl Stage for ExecStage {
    fn principal(&self) -> Principal {
        Principal::Exec(self.id)
    }
    fn handle(&mut self, _now: Time, _input: Input, _out: &mut Vec<Action>) {
        unimplemented!("exec stage")
    }
    fn stats(&self) -> &Stats {
        &self.stats
    }
}

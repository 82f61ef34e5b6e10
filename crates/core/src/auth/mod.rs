//! The authentication stage (UpRight thesis 5.2).
//! (Placeholder: implemented in its own change.)

use std::sync::Arc;

use crate::config::{ClusterConfig, ConfigError};
use crate::crypto::KeyRing;
use crate::ids::{Principal, ReplicaId};
use crate::stage::{Action, Input, Stage, Stats, Storage, Time};


/// The authentication stage (UpRight thesis 5.2).
pub struct AuthStage {
    id: ReplicaId,
    stats: Stats,
}

impl AuthStage {
    /// Member `id` of this stage, restored from `storage` (empty on first start).
    pub fn new(config: Arc<ClusterConfig>, id: ReplicaId, keys: Arc<KeyRing>, storage: &Storage) -> Result<AuthStage, ConfigError> {
        let _ = (config, keys, storage);
        Ok(AuthStage { id, stats: Stats::default() })
    }
}

impl Stage for AuthStage {
    fn principal(&self) -> Principal {
        Principal::Auth(self.id)
    }
    fn handle(&mut self, _now: Time, _input: Input, _out: &mut Vec<Action>) {
        unimplemented!("auth stage")
    }
    fn stats(&self) -> &Stats {
        &self.stats
    }
}

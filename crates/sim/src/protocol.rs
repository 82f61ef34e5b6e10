//! Which stage code the simulator hosts. [`Upright`] is the real protocol; tests can plug in toy
//! protocols to exercise the simulator's machinery.

use std::sync::Arc;

use upright_core::auth::AuthStage;
use upright_core::client::Client;
use upright_core::config::{ClusterConfig, ConfigError};
use upright_core::crypto::KeyRing;
use upright_core::exec::ExecStage;
use upright_core::ids::Principal;
use upright_core::kv::KvService;
use upright_core::order::OrderStage;
use upright_core::stage::{Stage, Storage};

/// Builds the stage for a principal (clients get empty storage).
pub trait Protocol {
    /// The stage of `principal`, restored from `storage`.
    fn stage(
        &self,
        config: &Arc<ClusterConfig>,
        principal: Principal,
        keys: &Arc<KeyRing>,
        storage: &Storage,
    ) -> Result<Box<dyn Stage>, ConfigError>;
}

/// The real upright stages with the key-value service.
#[derive(Clone, Copy, Debug, Default)]
pub struct Upright;

impl Protocol for Upright {
    fn stage(
        &self,
        config: &Arc<ClusterConfig>,
        principal: Principal,
        keys: &Arc<KeyRing>,
        storage: &Storage,
    ) -> Result<Box<dyn Stage>, ConfigError> {
        let (config, keys) = (config.clone(), keys.clone());
        Ok(match principal {
            Principal::Client(c) => Box::new(Client::new(config, c, keys)?),
            Principal::Auth(r) => Box::new(AuthStage::new(config, r, keys, storage)?),
            Principal::Order(r) => Box::new(OrderStage::new(config, r, keys, storage)?),
            Principal::Exec(r) => Box::new(ExecStage::new(config, r, keys, storage, Box::new(KvService::new()))?),
        })
    }
}

//! Which stage code the simulator hosts. [`Upright`] is the real protocol; tests can plug in toy
//! protocols to exercise the simulator's machinery.

use std::sync::Arc;

use upright_core::config::{ClusterConfig, ConfigError};
use upright_core::crypto::KeyRing;
use upright_core::ids::Principal;
use upright_core::pages::PageStore;
use upright_core::stage::{Stage, Storage};

use crate::service::ServiceKind;

/// Builds the stage for a principal (clients get empty storage).
pub trait Protocol {
    /// The stage of `principal`, restored from `storage`.
    fn stage(
        &self,
        config: &Arc<ClusterConfig>,
        principal: Principal,
        keys: &Arc<KeyRing>,
        storage: &Storage,
        page_store: Option<Box<dyn PageStore>>,
    ) -> Result<Box<dyn Stage + Send>, ConfigError>;
}

/// The real upright stages, built by the runtime's factory ([`upright_core::stages::build`]),
/// with the execution members running `service`.
#[derive(Clone, Copy, Debug, Default)]
pub struct Upright {
    /// The replicated service.
    pub service: ServiceKind,
    /// Sabotage: every execution member runs a service that stores wrong values.
    pub corrupt: bool,
}

impl Protocol for Upright {
    fn stage(
        &self,
        config: &Arc<ClusterConfig>,
        principal: Principal,
        keys: &Arc<KeyRing>,
        storage: &Storage,
        page_store: Option<Box<dyn PageStore>>,
    ) -> Result<Box<dyn Stage + Send>, ConfigError> {
        let factory = self.service.factory(self.corrupt);
        let stage = upright_core::stages::build_with_pages(config, principal, keys, storage, &factory, page_store)?;
        Ok(stage)
    }
}

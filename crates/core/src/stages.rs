//! One factory for the stages of any principal, whatever the service: the simulator and the
//! runtime both build a replica's authentication, order and execution members (and the simulator
//! its clients) here, so the stages the simulator proves are the stages that run.

use std::sync::Arc;

use crate::auth::AuthStage;
use crate::client::Client;
use crate::config::{ClusterConfig, ConfigError};
use crate::crypto::KeyRing;
use crate::exec::ExecStage;
use crate::ids::Principal;
use crate::order::OrderStage;
use crate::pages::PageStore;
use crate::service::Service;
use crate::stage::{Stage, Storage};

/// Makes a fresh instance of the replicated service (its state is then restored from the
/// execution member's checkpoint, if it has one). Every replica of a cluster must run the same
/// service.
pub type ServiceFactory = Arc<dyn Fn() -> Box<dyn Service + Send> + Send + Sync>;

/// A service crate's factory (its `replica::service(corrupt)`): a fresh `S` per execution
/// member, or with `corrupt` (testing only) a fresh `C`, the crate's stand-in for a Byzantine
/// replica's service.
pub fn service_factory<S, C>(corrupt: bool) -> ServiceFactory
where
    S: Service + Default + Send + 'static,
    C: Service + Default + Send + 'static,
{
    if corrupt {
        Arc::new(|| Box::new(C::default()))
    } else {
        Arc::new(|| Box::new(S::default()))
    }
}

/// The factory of the core's in-memory key-value service ([`crate::kv::KvService`]).
pub fn kv_service() -> ServiceFactory {
    Arc::new(|| Box::new(crate::kv::KvService::new()))
}

/// The stage of `principal`, restored from `storage` (empty for a client or a fresh member);
/// an execution member runs a service made by `service`.
pub fn build(
    config: &Arc<ClusterConfig>,
    principal: Principal,
    keys: &Arc<KeyRing>,
    storage: &Storage,
    service: &ServiceFactory,
) -> Result<Box<dyn Stage + Send>, ConfigError> {
    build_with_pages(config, principal, keys, storage, service, None)
}

/// [`build`], with an execution member's paged service kept in `page_store` (so its state may
/// exceed memory; see [`crate::pages::PageStore`]). Other principals ignore it.
pub fn build_with_pages(
    config: &Arc<ClusterConfig>,
    principal: Principal,
    keys: &Arc<KeyRing>,
    storage: &Storage,
    service: &ServiceFactory,
    page_store: Option<Box<dyn PageStore>>,
) -> Result<Box<dyn Stage + Send>, ConfigError> {
    let (config, keys) = (config.clone(), keys.clone());
    Ok(match principal {
        Principal::Client(c) => Box::new(Client::new(config, c, keys)?),
        Principal::Auth(r) => Box::new(AuthStage::new(config, r, keys, storage)?),
        Principal::Order(r) => match config.protocol {
            crate::config::OrderProtocol::Pbft
            | crate::config::OrderProtocol::Quorum
            | crate::config::OrderProtocol::Chain
            | crate::config::OrderProtocol::Aliph => Box::new(OrderStage::new(config, r, keys, storage)?),
            crate::config::OrderProtocol::Lcr => Box::new(crate::lcr::LcrStage::new(config, r, keys, storage)?),
        },
        Principal::Exec(r) => Box::new(ExecStage::with_page_store(
            config,
            r,
            keys,
            storage,
            service(),
            page_store,
        )?),
    })
}

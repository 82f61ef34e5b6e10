//! upright-zk: ZooKeeper's data model and wire protocol, replicated by upright (issue 23).
//!
//! The jute encoding ([`jute`]); ZooKeeper's records, codes and modes ([`proto`]); the znode
//! tree with ZooKeeper's rules for every write and read ([`tree`]); watches ([`watches`]); the
//! replicated service with sessions on agreed time ([`service`]); and the gateway that serves
//! ZooKeeper clients as an upright client of the cluster ([`gateway`]). docs/SERVICES.md says
//! how it is built and what is checked.

#![warn(missing_docs)]

pub mod gateway;
pub mod jute;
pub mod proto;
pub mod service;
pub mod tree;
pub mod watches;

/// What `upright replica --service zk` runs.
pub mod replica {
    use upright_core::stages::ServiceFactory;

    /// A fresh ZooKeeper service per execution member; `corrupt` (testing only): one that
    /// answers and pushes wrongly ([`crate::service::Corrupting`]).
    pub fn service(corrupt: bool) -> ServiceFactory {
        upright_core::stages::service_factory::<crate::service::ZkService, crate::service::Corrupting>(corrupt)
    }
}

//! upright-zk: ZooKeeper's data model and wire protocol, replicated by upright (issue 23).
//!
//! What is here so far: the jute encoding ([`jute`]), ZooKeeper's records, codes and modes
//! ([`proto`]), and the znode tree with ZooKeeper's rules for every write and read ([`tree`]).
//! The replicated service (sessions, watches, agreed time), the gateway and the clients' tests
//! come next; nothing serves ZooKeeper clients yet.

#![warn(missing_docs)]

pub mod gateway;
pub mod jute;
pub mod proto;
pub mod service;
pub mod tree;
pub mod watches;

/// What `upright replica --service zk` runs.
pub mod replica {
    use std::sync::Arc;

    use upright_core::stages::ServiceFactory;

    /// A fresh ZooKeeper service per execution member; `corrupt` (testing only): one that
    /// answers and pushes wrongly ([`crate::service::Corrupting`]).
    pub fn service(corrupt: bool) -> ServiceFactory {
        Arc::new(move || {
            if corrupt {
                Box::new(crate::service::Corrupting::default())
            } else {
                Box::new(crate::service::ZkService::new())
            }
        })
    }
}

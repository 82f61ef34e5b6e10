//! UpRight-HDFS (docs/HDFS.md): the NameNode as a replicated upright service. DataNodes stay
//! outside agreement and every block's hash is committed by the NameNode, so a reader catches a
//! DataNode that returns other bytes.
//!
//! [`namenode`] is the state machine (namespace, leases, block map, DataNodes); [`service`] runs it
//! as an upright [`upright_core::service::Service`]; [`block`] hashes blocks; [`datanode`] is a
//! DataNode's store of block replicas.

pub mod block;
pub mod client;
pub mod datanode;
pub mod dataserver;
pub mod gateway;
pub mod http;
pub mod namenode;
pub mod service;

/// What `upright replica --service hdfs` runs.
pub mod replica {
    use upright_core::stages::ServiceFactory;

    /// A fresh NameNode per execution member; `corrupt` (testing only): one that lies in every
    /// answer ([`crate::service::Corrupting`]).
    pub fn service(corrupt: bool) -> ServiceFactory {
        upright_core::stages::service_factory::<crate::service::NameNodeService, crate::service::Corrupting>(corrupt)
    }
}

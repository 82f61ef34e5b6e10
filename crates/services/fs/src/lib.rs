//! BFS: a Byzantine-fault-tolerant NFS version 3 file system (PBFT's showcase service, RFC 1813
//! over ONC RPC, RFC 5531), replicated by upright (docs/SERVICES.md, "The NFS file system").
//!
//! The layers: [`xdr`] and [`rpc`] (the wire), [`nfs3`] (the protocol's types), [`fs`] (the file
//! system in pages), [`procedures`] (every NFSv3 procedure on it), [`service`] (the replicated
//! service: a batch of calls per operation) and [`gateway`] (NFS and MOUNT clients on one TCP
//! port).

pub mod fs;
pub mod gateway;
pub mod nfs3;
pub mod procedures;
pub mod rpc;
pub mod service;
pub mod xdr;

/// What `upright replica --service fs` runs.
pub mod replica {
    use upright_core::stages::ServiceFactory;

    /// A fresh file system per execution member; `corrupt` (testing only): one that lies in
    /// every reply ([`crate::service::Corrupting`]).
    pub fn service(corrupt: bool) -> ServiceFactory {
        upright_core::stages::service_factory::<crate::service::FsService, crate::service::Corrupting>(corrupt)
    }
}

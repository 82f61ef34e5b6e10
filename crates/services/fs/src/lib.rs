//! BFS: a Byzantine-fault-tolerant NFS version 3 file system (PBFT's showcase service, RFC 1813
//! over ONC RPC, RFC 5531), replicated by upright (docs/SERVICES.md, "The NFS file system").
//!
//! Built in steps: the XDR and ONC RPC codecs first ([`xdr`], [`rpc`]).

pub mod fs;
pub mod nfs3;
pub mod procedures;
pub mod rpc;
pub mod xdr;

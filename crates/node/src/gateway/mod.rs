//! What every gateway shares: a gateway speaks its users' protocol (Redis, ZooKeeper, NFS,
//! WebHDFS) on one side and is an upright client of the cluster on the other (the UpRight
//! client shim).
//!
//! - [`pool`]: a small pool of upright clients that packs the commands of many connections into
//!   one upright operation, so one agreement round serves many commands, while each connection's
//!   commands run and are answered in the order it sent them. A gateway plugs in with a
//!   [`Protocol`]: what a command is, how a batch of them is encoded as one operation, and how
//!   the result is split back into answers.
//! - [`clients`]: the pool's client identities, loaded from the files `upright init` writes, each
//!   with a request-id lease so that a restarted gateway never reuses a request id.
//! - [`tls`]: the listening side: TCP, or TLS (rustls) when the gateway has a certificate.
//!
//! Trust model: a gateway is a client of the cluster. It accepts a result only with `r + 1`
//! matching replies (a read-only result only when every execution replica agrees), so a lying
//! replica cannot fool it. The applications that talk to a gateway trust it, so it runs beside
//! them (the same host or the same trust domain), not beside the replicas.

pub mod clients;
pub mod pool;
pub mod tls;

use bytes::Bytes;

pub use pool::{Pool, Queue};

/// How a gateway's commands travel as upright operations.
pub trait Protocol: 'static {
    /// One command of a connection, as the pool queues it.
    type Command: Send + 'static;
    /// The answer to one command.
    type Answer: Send + 'static;
    /// Most commands in one operation.
    const COMMANDS_MAX: usize;
    /// Most bytes of commands (as [`Protocol::command_bytes`] counts them) in one operation; it
    /// must leave room under the cluster's `request_bytes_max` for the encoding's overhead. An
    /// operation carries at least one command, however large.
    const BYTES_MAX: usize;

    /// What one command adds to an operation's size.
    fn command_bytes(command: &Self::Command) -> usize;
    /// One upright operation carrying `commands` in order.
    fn encode(commands: &[Self::Command]) -> Bytes;
    /// The answers to an operation of `commands` commands from its result, in order; `None` if
    /// the result is malformed. The pool fails every command of a result that does not decode
    /// to exactly `commands` answers, so an implementation need not check the count.
    fn decode(result: &[u8], commands: usize) -> Option<Vec<Self::Answer>>;
    /// The answer to a command whose operation failed, saying why.
    fn failed(why: &str) -> Self::Answer;
}

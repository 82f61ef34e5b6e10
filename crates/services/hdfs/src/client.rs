//! The NameNode cluster as the gateway and the DataNodes call it: a pool of upright clients,
//! each with one command at the cluster at a time, every answer accepted only on matching
//! replies of enough replicas.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Semaphore;
use upright_node::client::ClientHandle;

use crate::namenode::{Answer, Command};
use crate::service::{decode_answer, encode};

/// How long one command may take before the caller gives up (a cluster that lost more replicas
/// than it tolerates stops answering; the caller reports it rather than wait for ever).
pub const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// Why a command got no answer.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// The cluster did not answer in time, or the client stopped.
    #[error("the NameNode cluster did not answer: {0}")]
    Unavailable(String),
    /// Replies that matched but do not decode (a service of another kind).
    #[error(
        "the NameNode cluster answered with bytes that are not a NameNode answer (do its replicas run --service hdfs?)"
    )]
    Malformed,
}

/// A pool of upright clients of the NameNode cluster; cheap to clone.
#[derive(Clone)]
pub struct NameNodeClient {
    inner: Arc<Inner>,
}

struct Inner {
    free: Mutex<Vec<ClientHandle>>,
    permits: Semaphore,
    first_id: String,
}

impl NameNodeClient {
    /// The pool (at least one client); `name` tells the pool's owner apart in lease names.
    pub fn new(handles: Vec<ClientHandle>, name: impl Into<String>) -> NameNodeClient {
        assert!(
            !handles.is_empty(),
            "a NameNode client needs at least one upright client"
        );
        NameNodeClient {
            inner: Arc::new(Inner {
                permits: Semaphore::new(handles.len()),
                free: Mutex::new(handles),
                first_id: name.into(),
            }),
        }
    }

    /// The name given at [`NameNodeClient::new`].
    pub fn name(&self) -> &str {
        &self.inner.first_id
    }

    /// Runs `command`: commands that only read take the read-only path (answered by every
    /// execution replica at once, ordered when they disagree), the others are ordered.
    pub async fn call(&self, command: &Command) -> Result<Answer, CallError> {
        let read_only = is_read(command);
        let _permit = self.inner.permits.acquire().await.expect("never closed");
        let handle = self
            .inner
            .free
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop()
            .expect("a permit means a free client");
        let result = handle.invoke_timeout(encode(command), read_only, CALL_TIMEOUT).await;
        self.inner.free.lock().unwrap_or_else(|e| e.into_inner()).push(handle);
        let reply = result.map_err(|e| CallError::Unavailable(e.to_string()))?;
        decode_answer(&reply).ok_or(CallError::Malformed)
    }
}

/// Whether a command only reads the namespace.
pub fn is_read(command: &Command) -> bool {
    matches!(
        command,
        Command::GetFileStatus { .. }
            | Command::ListStatus { .. }
            | Command::GetContentSummary { .. }
            | Command::GetBlockLocations { .. }
            | Command::ListDataNodes
    )
}

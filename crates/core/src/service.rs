//! The application interface (UpRight thesis Appendix B, reduced): a deterministic service.

use bytes::Bytes;

use crate::ids::{ClientId, RequestId, SeqNo};

/// Agreed context of a batch: the same at every correct execution member.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchContext {
    /// Sequence number of the batch.
    pub seqno: SeqNo,
    /// Agreed time in microseconds (strictly increasing across batches). Use it instead of the
    /// local clock.
    pub time_us: u64,
    /// Agreed random seed. Use it instead of local randomness.
    pub seed: [u8; 32],
}

/// One request of a batch, as the service sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceRequest {
    /// Client that sent it.
    pub client: ClientId,
    /// Its request number.
    pub request_id: RequestId,
    /// The operation bytes.
    pub operation: Bytes,
}

/// Error restoring a checkpoint.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("checkpoint could not be restored: {0}")]
pub struct RestoreError(pub String);

/// A deterministic replicated service.
///
/// Determinism is the contract: given the same sequence of batches (with their contexts), every
/// replica must return the same replies and produce byte-identical checkpoints.
pub trait Service {
    /// Executes a whole batch in order, returning one reply per request.
    fn execute(&mut self, context: &BatchContext, requests: &[ServiceRequest]) -> Vec<Bytes>;

    /// Answers a read-only operation from the current state, or `None` if the operation is not
    /// read-only (the client then uses the ordered path).
    fn execute_read_only(&self, operation: &[u8]) -> Option<Bytes>;

    /// Deterministic serialization of the whole state.
    fn checkpoint(&self) -> Bytes;

    /// Replaces the state with a checkpoint's.
    fn restore(&mut self, checkpoint: &[u8]) -> Result<(), RestoreError>;
}

//! The checkers run over one simulated run: linearizability of the client histories, agreement of
//! correct replicas, durability of acknowledged writes, and progress after the faults heal.

pub mod agreement;
pub mod durability;
pub mod linearizability;
pub mod liveness;

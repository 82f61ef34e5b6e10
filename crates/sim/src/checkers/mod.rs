//! The checkers run over one simulated run: linearizability of the client histories, agreement of
//! correct replicas, durability of acknowledged writes, progress after the faults heal, and pushed
//! messages delivered in order, once, unforged; serializable reads return only written values.

pub mod agreement;
pub mod durability;
pub mod linearizability;
pub mod liveness;
pub mod pushes;
pub mod serializable;
pub mod watch_order;

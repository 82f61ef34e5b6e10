//! Unit tests of the execution stage: checkpoints, restart and state transfer.

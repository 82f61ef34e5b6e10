//! Tests: a deterministic in-test cluster of order members.

//! The Redis-protocol gateway (placeholder, filled in next).

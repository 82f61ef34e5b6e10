//! RESP request parser (placeholder).

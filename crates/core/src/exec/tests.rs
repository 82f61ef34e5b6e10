//! Unit tests of the execution stage: normal case.

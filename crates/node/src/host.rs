//! The replica host ([`upright_core::host`]) over the runtime's logs: files that fsync. The host
//! itself lives in core so that the simulator runs the same code over its simulated disk.

use std::time::Duration;

use bytes::Bytes;
pub use upright_core::host::{stage_for, Host, HostStats, Log, Member, Progress, Router, LOCAL_ROUNDS_MAX};

use crate::storage::StageLog;
use crate::timeline;

impl Log for StageLog {
    fn append(&mut self, key: &str, value: Option<&Bytes>) {
        StageLog::append(self, key, value)
    }
    fn append_lazily(&mut self, key: &str, value: Option<&Bytes>) {
        StageLog::append_lazily(self, key, value)
    }
    fn needs_sync(&self) -> bool {
        StageLog::needs_sync(self)
    }
    fn is_dirty(&self) -> bool {
        StageLog::is_dirty(self)
    }
    fn sync(&mut self) -> std::io::Result<Option<Duration>> {
        timeline::event("sync-start", 0, 0, 0);
        let took = StageLog::sync(self);
        timeline::event("sync-end", 0, 0, 0);
        took
    }
    fn syncs(&self) -> u64 {
        self.stats().syncs
    }
}

#[cfg(test)]
mod tests;

//! The store under selective execution (ODRC; docs/ODRC.md, "The Redis store").
//!
//! Each request runs only on the `r + 1` execution members that maintain the keys it names
//! (`Service::access`: the command table's key positions; whole-store commands such as KEYS,
//! SCAN, DBSIZE, FLUSHALL, PUBLISH, SORT and the gateway's `upright.*` commands are global and
//! run everywhere, after every key is brought up to date). The other members skip it and later
//! install the key's state from its maintainers ([`RedisStore::key_state`],
//! [`RedisStore::restore_key`]) or replay the request at its own agreed time. So a request's
//! reply, and what it leaves in the store, may depend only on the keys it names and on its own
//! agreed context, never on what else a member happened to run:
//!
//! - Time is the request's batch time, not the newest a member saw (a replay runs at the time
//!   the request was agreed at). A key past its expiry is removed when a request naming it runs
//!   (or by a global request or a wake-up, which run where every key is current), not at the
//!   start of every batch: a member's stale copy of a key it does not maintain must stay as it
//!   was for a replay.
//! - Random draws (SPOP, SRANDMEMBER, HRANDFIELD, ZRANDMEMBER) come from the batch's seed,
//!   the client and its request number, not from a count of earlier draws in the batch.
//! - The memory bound (`STORE_BYTES_MAX`) is checked against the store as of the last
//!   checkpoint, where every member holds the same whole state.
//! - What a write would change outside its keys is refused with an error instead: blocking
//!   commands (their waiters are served by other clients' writes), WATCH (broken by writes),
//!   keyspace notifications (pushed by writes), and replies above the large-reply size of a
//!   request that is not global (kept in a store-wide table). Pub/sub works: PUBLISH and the
//!   subscriptions are global, so every member pushes the same messages in the same order.

use bytes::Bytes;
use upright_core::service::{BatchContext, Effects, RestoreError, ServiceRequest};

use super::{RedisStore, Value};
use crate::reply::Reply;

/// Under selective execution expired keys nobody names are removed at wake-ups on this grid
/// of agreed time (milliseconds): at the first batch past each multiple of it, the keys that
/// expired before that multiple. A wake-up makes a member replay every request it stored since
/// the last checkpoint, so waking at every key's expiry would take away what skipping gave.
pub const EXPIRY_GRID_MS: u64 = 10_000;

/// The error of a command selective execution cannot run (`what` names it).
pub(super) fn unavailable(what: &str) -> Reply {
    Reply::err(format!(
        "ERR upright: {what} not available under selective execution (selective_execution = true in cluster.toml)"
    ))
}

/// One key's state: value, expiry and counted cost.
type KeyState = (Value, Option<u64>, usize, u32);

impl RedisStore {
    /// Runs one request under selective execution (see the module's rules).
    pub(super) fn execute_selectively(
        &mut self,
        context: &BatchContext,
        request: &ServiceRequest,
        effects: &mut Effects,
    ) -> Bytes {
        self.now_ms = context.time_us / 1000;
        self.seed = request_seed(context, request);
        self.random_calls = 0;
        self.client = Some(request.client);
        let commands = crate::decode_operation(&request.operation);
        match commands.as_deref().and_then(super::access_of) {
            None => {
                // Global: every member runs it with every key current.
                self.global_request = true;
                self.advance(context.time_us);
            }
            Some(access) => {
                for key in access.reads.iter().chain(&access.writes) {
                    self.expire_key(key);
                }
            }
        }
        let reply = self.run_operation(commands.as_deref());
        self.push_served(effects);
        self.client = None;
        self.global_request = false;
        reply
    }

    /// The wake-up of the earliest expiry: the first grid point after it.
    pub(super) fn selective_wake_at(&self) -> Option<u64> {
        let (at_ms, _) = self.expiries.first()?;
        Some(
            (at_ms / EXPIRY_GRID_MS + 1)
                .saturating_mul(EXPIRY_GRID_MS)
                .saturating_mul(1000),
        )
    }

    /// A wake-up under selective execution (every key is current here: the execution stage
    /// replayed what it stored first): removes the keys that expired before the last grid
    /// point. By the grid, not the batch's time, so every member removes a key it did not see
    /// change at the same batch, whichever member's keys woke it (each member holding the key
    /// wakes at the first batch past the grid point after its expiry).
    pub(super) fn selective_wake(&mut self, context: &BatchContext, effects: &mut Effects) {
        self.now_ms = context.time_us / 1000;
        self.remove_expired_before(self.now_ms / EXPIRY_GRID_MS * EXPIRY_GRID_MS);
        self.push_served(effects);
    }

    /// Removes `key` if its expiry time is before the current time.
    fn expire_key(&mut self, key: &[u8]) {
        let expired = self
            .map
            .get(key)
            .and_then(|e| e.expires_ms)
            .is_some_and(|at| at < self.now_ms);
        if expired {
            let key = Bytes::copy_from_slice(key);
            self.remove(&key);
            self.notify('x', "expired", &key);
        }
    }

    /// The bytes used, as the memory bound checks them.
    pub(super) fn used_for_bound(&self) -> usize {
        if self.selective {
            self.used_agreed.get()
        } else {
            self.used
        }
    }

    /// Whether a reply too large for one operation may be kept for fetching: always without
    /// selective execution; under it only for a global request (every member keeps it alike).
    pub(super) fn may_keep_large_reply(&self) -> bool {
        !self.selective || self.global_request
    }

    /// ODRC's object checkpoint of `key`: its value, expiry and counted cost (`None`: absent).
    pub(super) fn key_state(&self, key: &[u8]) -> Option<Bytes> {
        let e = self.map.get(key)?;
        Some(Bytes::from(upright_core::codec::to_bytes(&(
            &e.value,
            e.expires_ms,
            e.cost,
            e.estimated,
        ))))
    }

    /// Replaces `key` with a state [`RedisStore::key_state`] gave.
    pub(super) fn restore_key(&mut self, key: &[u8], state: Option<&[u8]>) -> Result<(), RestoreError> {
        let state: Option<KeyState> = state
            .map(upright_core::codec::from_bytes)
            .transpose()
            .map_err(|e| RestoreError(format!("redis key state: {e}")))?;
        self.remove(key);
        if let Some((value, expires_ms, cost, estimated)) = state {
            self.put_entry(&Bytes::copy_from_slice(key), value, expires_ms, Some((cost, estimated)));
        }
        Ok(())
    }
}

/// The seed of one request's random draws: the batch's, the client's and the request's.
fn request_seed(context: &BatchContext, request: &ServiceRequest) -> u64 {
    let batch = u64::from_le_bytes(context.seed[..8].try_into().expect("8 bytes"));
    let mut mix = super::SplitMix(batch ^ u64::from(request.client.0).rotate_left(32) ^ request.request_id.0);
    mix.next()
}

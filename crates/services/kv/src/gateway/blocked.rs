//! Connections waiting in a blocking command (BLPOP, BZPOPMIN, ...), by token.
//!
//! The gateway sends a blocking command as `upright.block TOKEN command...` (see the store's
//! `blocking` module). When the store answers that it waits, the connection's writer waits for
//! the store to push the token (or for [`POLL`] to pass, in case a push was lost) and then
//! collects the reply with `upright.collect TOKEN`. Tokens start with a prefix drawn at random
//! when the gateway starts, so a restarted gateway can drop its predecessor's waiters
//! (`upright.unblock-stale PREFIX`) and a token is hard to guess.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::Notify;

/// How long a waiting connection waits for its token's push before it asks the store anyway.
pub const POLL: Duration = Duration::from_secs(10);

/// What the connection's reader and writer share about its wait.
#[derive(Debug, Default)]
pub struct Wait {
    /// Woken by the token's push, a gap in the pushes, or the connection closing.
    pub wake: Notify,
    /// The connection closed: stop waiting.
    pub closed: AtomicBool,
}

/// The gateway's waiting connections.
#[derive(Debug)]
pub struct Blocked {
    prefix: String,
    next: AtomicU64,
    waits: Mutex<HashMap<Bytes, (u64, Arc<Wait>)>>,
    /// Connections the store confirmed as waiting (INFO `blocked_clients`).
    pub confirmed: AtomicU64,
    /// Pushes whose token no connection waits for (it closed, or was answered by a poll).
    pub unclaimed: AtomicU64,
}

impl Default for Blocked {
    fn default() -> Blocked {
        // A fresh random 64-bit prefix per gateway process (the standard library's hasher keys
        // are drawn from the operating system's randomness).
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
                .as_nanos(),
        );
        Blocked {
            prefix: format!("{:016x}.", h.finish()),
            next: AtomicU64::new(1),
            waits: Mutex::new(HashMap::new()),
            confirmed: AtomicU64::new(0),
            unclaimed: AtomicU64::new(0),
        }
    }
}

impl Blocked {
    fn waits(&self) -> std::sync::MutexGuard<'_, HashMap<Bytes, (u64, Arc<Wait>)>> {
        self.waits.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// This gateway's token prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// A fresh token with this gateway's prefix (blocking commands, WATCH).
    pub fn new_token(&self) -> Bytes {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        Bytes::from(format!("{}{n}", self.prefix))
    }

    /// A new token for connection `conn`'s blocking command, and its wait.
    pub fn register(&self, conn: u64) -> (Bytes, Arc<Wait>) {
        let token = self.new_token();
        let wait = Arc::new(Wait::default());
        self.waits().insert(token.clone(), (conn, wait.clone()));
        (token, wait)
    }

    /// The wait of `token` is over.
    pub fn finish(&self, token: &[u8]) {
        self.waits().remove(token);
    }

    /// The token connection `conn` waits on, if it waits.
    pub fn token_of(&self, conn: u64) -> Option<Bytes> {
        self.waits()
            .iter()
            .find(|(_, (c, _))| *c == conn)
            .map(|(t, _)| t.clone())
    }

    /// The store pushed `token`: its reply is ready.
    pub fn pushed(&self, token: &[u8]) {
        match self.waits().get(token) {
            Some((_, wait)) => wait.wake.notify_one(),
            None => {
                self.unclaimed.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Pushes were lost: every waiting connection asks the store.
    pub fn wake_all(&self) {
        self.waits().values().for_each(|(_, wait)| wait.wake.notify_one());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_unique_carry_the_prefix_and_find_their_connection() {
        let b = Blocked::default();
        let (t1, _) = b.register(7);
        let (t2, w2) = b.register(8);
        assert_ne!(t1, t2);
        assert!(t1.starts_with(b.prefix().as_bytes()));
        assert_ne!(
            Blocked::default().prefix(),
            b.prefix(),
            "each gateway draws its own prefix"
        );
        assert_eq!(b.token_of(8), Some(t2.clone()));
        b.pushed(&t2);
        // The push left a permit: the writer's wait ends at once.
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        rt.block_on(async { tokio::time::timeout(Duration::from_secs(1), w2.wake.notified()).await })
            .expect("woken by the push");
        b.finish(&t2);
        assert_eq!(b.token_of(8), None);
        b.pushed(&t2);
        assert_eq!(b.unclaimed.load(Ordering::Relaxed), 1);
    }
}

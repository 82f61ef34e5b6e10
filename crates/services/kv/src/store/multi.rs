//! Transactions: MULTI/EXEC as one command, and WATCH on agreed state.
//!
//! The gateway queues a connection's commands between MULTI and EXEC and sends them as
//! `upright.exec TOKEN COMMANDS` (COMMANDS: the encoded list, TOKEN: the connection's watch token
//! or empty). The store runs them one after another with nothing in between (blocked commands
//! are served only after the last), so the transaction is atomic at every replica; a blocking
//! command inside it does not block. WATCH is `upright.watch TOKEN key...`: from then on every
//! change to one of the keys (a write, a delete, an expiry, FLUSHALL of an existing key) marks
//! the token dirty, and an EXEC with a dirty token runs nothing and answers the null array, as
//! Redis does. EXEC, DISCARD (`upright.unwatch TOKEN`) and UNWATCH forget the token.
//!
//! Watches are agreed state, in the checkpoint; a restarted gateway's leftovers go with
//! `upright.unblock-stale`.

use std::collections::{BTreeMap, BTreeSet};

use bytes::Bytes;
use upright_core::ids::ClientId;

use super::RedisStore;
use crate::reply::Reply;

/// Most watch tokens the store keeps; a WATCH beyond it is refused.
pub const WATCHES_MAX: usize = 10_000;
/// Most keys one token watches.
pub const WATCH_KEYS_MAX: usize = 10_000;
/// Most commands in one transaction.
pub const MULTI_COMMANDS_MAX: usize = 10_000;

#[derive(Clone, Debug, PartialEq, Eq)]
struct Watch {
    client: ClientId,
    keys: BTreeSet<Bytes>,
    dirty: bool,
}

/// Every watch token with its keys, and the tokens watching each key.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct Watches {
    by_token: BTreeMap<Bytes, Watch>,
    by_key: BTreeMap<Bytes, BTreeSet<Bytes>>,
}

/// The checkpointed form: (token, client, keys, dirty), in token order.
pub(super) type WatchRows = Vec<(Bytes, ClientId, Vec<Bytes>, bool)>;

impl Watches {
    /// `key` changed: every token watching it is dirty.
    pub(super) fn touch(&mut self, key: &[u8]) {
        if self.by_key.is_empty() {
            return;
        }
        if let Some(tokens) = self.by_key.get(key) {
            for token in tokens {
                if let Some(w) = self.by_token.get_mut(token) {
                    w.dirty = true;
                }
            }
        }
    }

    /// Whether some token watches `key`.
    pub(super) fn watched(&self, key: &[u8]) -> bool {
        !self.by_key.is_empty() && self.by_key.contains_key(key)
    }

    fn forget(&mut self, token: &[u8]) -> Option<Watch> {
        let w = self.by_token.remove(token)?;
        for key in &w.keys {
            if let Some(tokens) = self.by_key.get_mut(key) {
                tokens.remove(token);
                if tokens.is_empty() {
                    self.by_key.remove(key);
                }
            }
        }
        Some(w)
    }

    fn add(&mut self, token: &Bytes, client: ClientId, keys: &[Bytes]) -> Result<(), Reply> {
        if !self.by_token.contains_key(token) && self.by_token.len() >= WATCHES_MAX {
            return Err(Reply::err("ERR upright: too many watching clients"));
        }
        let w = self.by_token.entry(token.clone()).or_insert_with(|| Watch {
            client,
            keys: BTreeSet::new(),
            dirty: false,
        });
        if w.keys.len() + keys.len() > WATCH_KEYS_MAX {
            return Err(Reply::err("ERR upright: too many watched keys"));
        }
        for key in keys {
            w.keys.insert(key.clone());
            self.by_key.entry(key.clone()).or_default().insert(token.clone());
        }
        Ok(())
    }

    /// Drops `client`'s tokens that do not start with `prefix`; how many.
    pub(super) fn forget_stale(&mut self, client: ClientId, prefix: &[u8]) -> usize {
        let stale: Vec<Bytes> = self
            .by_token
            .iter()
            .filter(|(t, w)| w.client == client && !t.starts_with(prefix))
            .map(|(t, _)| t.clone())
            .collect();
        stale.iter().for_each(|t| {
            self.forget(t);
        });
        stale.len()
    }

    pub(super) fn rows(&self) -> WatchRows {
        self.by_token
            .iter()
            .map(|(t, w)| (t.clone(), w.client, w.keys.iter().cloned().collect(), w.dirty))
            .collect()
    }

    pub(super) fn from_rows(rows: WatchRows) -> Watches {
        let mut watches = Watches::default();
        for (token, client, keys, dirty) in rows {
            // Restoring what was accepted once: the bounds held then.
            let _ = watches.add(&token, client, &keys);
            if let Some(w) = watches.by_token.get_mut(&token) {
                w.dirty = dirty;
            }
        }
        watches
    }
}

/// Encodes a transaction's commands for `upright.exec`.
pub fn encode_transaction(commands: &[Vec<Bytes>]) -> Bytes {
    Bytes::from(upright_core::codec::to_bytes(commands))
}

fn decode_transaction(bytes: &[u8]) -> Option<Vec<Vec<Bytes>>> {
    let commands: Vec<Vec<Bytes>> = upright_core::codec::from_bytes(bytes).ok()?;
    (commands.len() <= MULTI_COMMANDS_MAX && commands.iter().all(|c| !c.is_empty())).then_some(commands)
}

impl RedisStore {
    /// `upright.watch TOKEN key...`
    pub(super) fn watch(&mut self, token: &Bytes, keys: &[Bytes]) -> Reply {
        if token.is_empty() || token.len() > super::blocking::TOKEN_BYTES_MAX {
            return Reply::err("ERR upright: bad watch token");
        }
        let client = self.caller();
        match self.watches.add(token, client, keys) {
            Ok(()) => Reply::ok(),
            Err(e) => e,
        }
    }

    /// `upright.unwatch TOKEN`
    pub(super) fn unwatch(&mut self, token: &[u8]) -> Reply {
        self.watches.forget(token);
        Reply::ok()
    }

    /// `upright.exec TOKEN COMMANDS`: the replies of the commands, run back to back; the null
    /// array if the token (when given) saw a change.
    pub(super) fn exec(&mut self, token: &[u8], commands: &[u8]) -> Reply {
        let Some(commands) = decode_transaction(commands) else {
            return Reply::err("ERR upright: malformed transaction");
        };
        if !token.is_empty() {
            // A token the store does not know was never watched here: refuse rather than run
            // unguarded.
            let clean = self.watches.forget(token).is_some_and(|w| !w.dirty);
            if !clean {
                return Reply::NilArray;
            }
        }
        let replies = commands
            .iter()
            .map(|argv| {
                // A gateway's (un)subscriptions may be part of a transaction; nothing else of its.
                let internal = argv[0].starts_with(b"upright.")
                    && !matches!(&argv[0][..], b"upright.subscribe" | b"upright.unsubscribe");
                if internal {
                    crate::command::unknown_command(argv)
                } else {
                    self.apply_one(argv)
                }
            })
            .collect();
        Reply::Array(replies)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_touched_key_dirties_every_token_watching_it_and_rows_round_trip() {
        let mut w = Watches::default();
        let (t1, t2) = (Bytes::from_static(b"p.1"), Bytes::from_static(b"q.2"));
        w.add(&t1, ClientId(1), &[Bytes::from_static(b"a"), Bytes::from_static(b"b")])
            .unwrap();
        w.add(&t2, ClientId(2), &[Bytes::from_static(b"b")]).unwrap();
        w.touch(b"a");
        let copy = Watches::from_rows(w.rows());
        assert_eq!(copy, w);
        assert!(w.by_token[&t1].dirty && !w.by_token[&t2].dirty);
        assert_eq!(w.forget_stale(ClientId(2), b"q."), 0, "its own prefix stays");
        assert_eq!(w.forget_stale(ClientId(1), b"q."), 1);
        assert!(w.watched(b"b") && !w.watched(b"a"));
        w.forget(&t2);
        assert_eq!(w, Watches::default());
    }
}

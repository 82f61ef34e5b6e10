//! Pub/sub: PUBLISH, PUBSUB, and the gateways' subscriptions as agreed state.
//!
//! A gateway keeps its connections' subscriptions itself and tells the store how many of its
//! connections subscribe to each channel and pattern (`upright.subscribe PREFIX channel|pattern
//! name...`, `upright.unsubscribe ...`; PREFIX names the gateway, as its blocking tokens do).
//! PUBLISH pushes the message once to every gateway with subscribers (to the client identity it
//! subscribed with), which hands it to its connections, and answers the number of subscriptions
//! that receive it, as Redis counts them. Like every push, a message reaches a gateway only on
//! `r + 1` matching copies, in order.

use std::collections::BTreeMap;

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use upright_core::ids::ClientId;

use super::RedisStore;
use crate::command::{is, syntax_error};
use crate::reply::Reply;

/// Most (gateway, channel or pattern) subscriptions the store keeps.
pub const SUBSCRIPTIONS_MAX: usize = 100_000;
/// Longest message PUBLISH takes: a message travels as one push, which is bounded
/// ([`upright_core::limits::PUSH_BYTES_MAX`]), with room for the channel and pattern.
pub const MESSAGE_BYTES_MAX: usize = upright_core::limits::PUSH_BYTES_MAX / 2;

/// What the store pushes to a gateway.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Pushed {
    /// The blocked command with this token has its reply (collect it).
    Ready(Bytes),
    /// A message on a channel the gateway subscribes to.
    Message {
        /// The channel.
        channel: Bytes,
        /// What was published.
        message: Bytes,
    },
    /// A message on a channel matching a pattern the gateway subscribes to.
    PMessage {
        /// The pattern subscribed to.
        pattern: Bytes,
        /// The channel published to.
        channel: Bytes,
        /// What was published.
        message: Bytes,
    },
}

impl Pushed {
    /// Its encoding as a push payload.
    pub fn encode(&self) -> Bytes {
        Bytes::from(upright_core::codec::to_bytes(self))
    }

    /// Decodes a push payload.
    pub fn decode(bytes: &[u8]) -> Option<Pushed> {
        upright_core::codec::from_bytes(bytes).ok()
    }
}

/// Subscriptions by channel (or pattern), then by gateway prefix: the client to push to and how
/// many of the gateway's connections subscribe.
type Table = BTreeMap<Bytes, BTreeMap<Bytes, (ClientId, u64)>>;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct PubSub {
    channels: Table,
    patterns: Table,
    entries: usize,
}

/// The checkpointed form: (is pattern, name, gateway prefix, client, count).
pub(super) type PubSubRows = Vec<(bool, Bytes, Bytes, ClientId, u64)>;

impl PubSub {
    fn table(&mut self, pattern: bool) -> &mut Table {
        if pattern {
            &mut self.patterns
        } else {
            &mut self.channels
        }
    }

    fn add(&mut self, pattern: bool, name: &Bytes, prefix: &Bytes, client: ClientId, n: u64) -> bool {
        let known = self.table(pattern).get(name).is_some_and(|g| g.contains_key(prefix));
        if !known && self.entries >= SUBSCRIPTIONS_MAX {
            return false;
        }
        let entry = self
            .table(pattern)
            .entry(name.clone())
            .or_default()
            .entry(prefix.clone())
            .or_insert((client, 0));
        entry.1 += n;
        if !known {
            self.entries += 1;
        }
        true
    }

    fn sub(&mut self, pattern: bool, name: &[u8], prefix: &[u8]) {
        let table = self.table(pattern);
        let Some(gateways) = table.get_mut(name) else { return };
        let Some(entry) = gateways.get_mut(prefix) else { return };
        entry.1 = entry.1.saturating_sub(1);
        if entry.1 == 0 {
            gateways.remove(prefix);
            if gateways.is_empty() {
                table.remove(name);
            }
            self.entries -= 1;
        }
    }

    /// Drops `client`'s subscriptions under prefixes other than `prefix`; how many.
    pub(super) fn forget_stale(&mut self, client: ClientId, prefix: &[u8]) -> usize {
        let mut dropped = 0;
        for table in [&mut self.channels, &mut self.patterns] {
            table.retain(|_, gateways| {
                gateways.retain(|p, (c, _)| {
                    let stale = *c == client && !p.starts_with(prefix);
                    dropped += usize::from(stale);
                    !stale
                });
                !gateways.is_empty()
            });
        }
        self.entries -= dropped;
        dropped
    }

    pub(super) fn rows(&self) -> PubSubRows {
        let mut rows = Vec::new();
        for (pattern, table) in [(false, &self.channels), (true, &self.patterns)] {
            for (name, gateways) in table {
                for (prefix, (client, n)) in gateways {
                    rows.push((pattern, name.clone(), prefix.clone(), *client, *n));
                }
            }
        }
        rows
    }

    pub(super) fn from_rows(rows: PubSubRows) -> PubSub {
        let mut p = PubSub::default();
        for (pattern, name, prefix, client, n) in rows {
            p.add(pattern, &name, &prefix, client, n);
        }
        p
    }
}

impl RedisStore {
    /// `upright.subscribe` / `upright.unsubscribe PREFIX channel|pattern name...`
    pub(super) fn gateway_subscription(&mut self, add: bool, a: &[Bytes]) -> Reply {
        let [prefix, kind, names @ ..] = a else {
            return syntax_error();
        };
        let pattern = match kind {
            k if is(k, "pattern") => true,
            k if is(k, "channel") => false,
            _ => return syntax_error(),
        };
        let client = self.caller();
        for name in names {
            if add {
                if !self.pubsub.add(pattern, name, prefix, client, 1) {
                    return Reply::err("ERR upright: too many subscriptions");
                }
            } else {
                self.pubsub.sub(pattern, name, prefix);
            }
        }
        Reply::ok()
    }

    /// PUBLISH channel message
    pub(super) fn publish(&mut self, channel: &Bytes, message: &Bytes) -> Reply {
        if message.len() + channel.len() > MESSAGE_BYTES_MAX {
            return Reply::err(format!(
                "ERR upright: PUBLISH takes at most {MESSAGE_BYTES_MAX} bytes of channel and message"
            ));
        }
        let mut receivers = 0u64;
        if let Some(gateways) = self.pubsub.channels.get(channel) {
            for (client, n) in gateways.values() {
                receivers += n;
                let push = Pushed::Message {
                    channel: channel.clone(),
                    message: message.clone(),
                };
                self.outbox.push((*client, push.encode()));
            }
        }
        for (pattern, gateways) in &self.pubsub.patterns {
            if !crate::glob::matches(pattern, channel) {
                continue;
            }
            for (client, n) in gateways.values() {
                receivers += n;
                let push = Pushed::PMessage {
                    pattern: pattern.clone(),
                    channel: channel.clone(),
                    message: message.clone(),
                };
                self.outbox.push((*client, push.encode()));
            }
        }
        Reply::Int(receivers as i64)
    }

    /// PUBSUB CHANNELS [pattern] | NUMSUB [channel ...] | NUMPAT (and their SHARD forms, which
    /// are the same here: the store is one shard).
    pub(super) fn pubsub(&self, a: &[Bytes]) -> Reply {
        let sub = &a[0];
        let count = |gateways: Option<&BTreeMap<Bytes, (ClientId, u64)>>| {
            gateways.map_or(0, |g| g.values().map(|(_, n)| n).sum::<u64>()) as i64
        };
        match &a[1..] {
            rest if (is(sub, "channels") || is(sub, "shardchannels")) && rest.len() <= 1 => Reply::Array(
                self.pubsub
                    .channels
                    .keys()
                    .filter(|c| rest.first().is_none_or(|p| crate::glob::matches(p, c)))
                    .map(|c| Reply::Bulk(c.clone()))
                    .collect(),
            ),
            rest if is(sub, "numsub") || is(sub, "shardnumsub") => Reply::Pairs(
                rest.iter()
                    .map(|c| (Reply::Bulk(c.clone()), Reply::Int(count(self.pubsub.channels.get(c)))))
                    .collect(),
            ),
            [] if is(sub, "numpat") => Reply::Int(self.pubsub.patterns.len() as i64),
            _ => Reply::err(format!(
                "ERR unknown subcommand or wrong number of arguments for '{}'. Try PUBSUB HELP.",
                String::from_utf8_lossy(sub)
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_follow_subscribes_and_unsubscribes_and_rows_round_trip() {
        let mut p = PubSub::default();
        let (g1, g2) = (Bytes::from_static(b"g1."), Bytes::from_static(b"g2."));
        let ch = Bytes::from_static(b"news");
        assert!(p.add(false, &ch, &g1, ClientId(1), 1));
        assert!(p.add(false, &ch, &g1, ClientId(1), 1));
        assert!(p.add(true, &Bytes::from_static(b"n*"), &g2, ClientId(2), 1));
        assert_eq!(p.entries, 2);
        assert_eq!(PubSub::from_rows(p.rows()), p);
        p.sub(false, &ch, &g1);
        assert_eq!(p.channels[&ch][&g1].1, 1);
        p.sub(false, &ch, &g1);
        assert!(p.channels.is_empty());
        assert_eq!(p.forget_stale(ClientId(2), b"g3."), 1);
        assert_eq!(p, PubSub::default());
    }
}

//! The gateway's side of pub/sub: which of its connections subscribe to what, and the delivery
//! of the messages the store pushes (see the store's `pubsub` module).
//!
//! A connection's SUBSCRIBE, PSUBSCRIBE (SSUBSCRIBE is SUBSCRIBE here: one shard) and their
//! UNSUBSCRIBEs change its own sets and this gateway's [`Hub`] at once, and tell the store how
//! many of this gateway's connections now subscribe (`upright.subscribe` /
//! `upright.unsubscribe`); the confirmations go to the client once the store has the change, so
//! a PUBLISH ordered after them reaches the connection. Each connection has a bounded queue of
//! messages ([`MESSAGES_MAX`]); a connection that falls that far behind is closed, as Redis
//! closes a subscriber past its output buffer limit.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use tokio::sync::mpsc;

use crate::reply::Reply;
use crate::store::Pushed;

/// Most messages waiting to be written to one connection.
pub const MESSAGES_MAX: usize = 4096;

/// Where a connection's messages go.
#[derive(Debug)]
pub struct Outbox {
    tx: mpsc::Sender<Reply>,
    /// The connection's protocol version (messages are RESP3 pushes or RESP2 arrays).
    pub proto: AtomicU8,
    /// Set when a message did not fit: the connection is closed.
    pub overflowed: AtomicBool,
}

impl Outbox {
    /// An outbox and the receiver its connection's writer drains.
    pub fn new() -> (Arc<Outbox>, mpsc::Receiver<Reply>) {
        let (tx, rx) = mpsc::channel(MESSAGES_MAX);
        let outbox = Outbox {
            tx,
            proto: AtomicU8::new(2),
            overflowed: AtomicBool::new(false),
        };
        (Arc::new(outbox), rx)
    }

    fn send(&self, message: Reply) {
        if self.tx.try_send(message).is_err() {
            self.overflowed.store(true, Ordering::Relaxed);
        }
    }
}

/// A connection's subscriptions.
#[derive(Debug, Default)]
pub struct Subscriptions {
    /// Channels (SUBSCRIBE).
    pub channels: BTreeSet<Bytes>,
    /// Patterns (PSUBSCRIBE).
    pub patterns: BTreeSet<Bytes>,
}

impl Subscriptions {
    /// Channels plus patterns (the count Redis reports).
    pub fn count(&self) -> usize {
        self.channels.len() + self.patterns.len()
    }
}

type Subscribers = HashMap<Bytes, HashMap<u64, Arc<Outbox>>>;

/// This gateway's subscriptions, by channel and pattern.
#[derive(Debug, Default)]
pub struct Hub {
    inner: Mutex<(Subscribers, Subscribers)>,
    /// Messages pushed for which no connection subscribes any more.
    pub undelivered: AtomicU64,
}

impl Hub {
    fn with<R>(&self, f: impl FnOnce(&mut (Subscribers, Subscribers)) -> R) -> R {
        f(&mut self.inner.lock().unwrap_or_else(|e| e.into_inner()))
    }

    fn add(&self, pattern: bool, name: &Bytes, conn: u64, outbox: &Arc<Outbox>) {
        self.with(|(channels, patterns)| {
            let table = if pattern { patterns } else { channels };
            table.entry(name.clone()).or_default().insert(conn, outbox.clone());
        });
    }

    fn remove(&self, pattern: bool, name: &[u8], conn: u64) {
        self.with(|(channels, patterns)| {
            let table = if pattern { patterns } else { channels };
            if let Some(conns) = table.get_mut(name) {
                conns.remove(&conn);
                if conns.is_empty() {
                    table.remove(name);
                }
            }
        });
    }

    /// Hands a message the store pushed to the connections subscribed to it.
    pub fn deliver(&self, pushed: Pushed) {
        let (pattern, name, message) = match pushed {
            Pushed::Message { channel, message } => (
                false,
                channel.clone(),
                vec![Reply::text("message"), Reply::Bulk(channel), Reply::Bulk(message)],
            ),
            Pushed::PMessage {
                pattern,
                channel,
                message,
            } => (
                true,
                pattern.clone(),
                vec![
                    Reply::text("pmessage"),
                    Reply::Bulk(pattern),
                    Reply::Bulk(channel),
                    Reply::Bulk(message),
                ],
            ),
            Pushed::Ready(_) => return,
        };
        let outboxes: Vec<Arc<Outbox>> = self.with(|(channels, patterns)| {
            let table = if pattern { patterns } else { channels };
            table
                .get(&name)
                .map(|c| c.values().cloned().collect())
                .unwrap_or_default()
        });
        if outboxes.is_empty() {
            self.undelivered.fetch_add(1, Ordering::Relaxed);
        }
        for outbox in outboxes {
            outbox.send(Reply::Push(message.clone()));
        }
    }
}

/// SUBSCRIBE / PSUBSCRIBE / SSUBSCRIBE and their UNSUBSCRIBEs for connection `conn`: the
/// confirmations to send, and the store command that records the change (`None` if nothing
/// changed).
pub fn change(
    name: &str,
    args: &[Bytes],
    subs: &mut Subscriptions,
    conn: u64,
    outbox: &Arc<Outbox>,
    hub: &Hub,
    prefix: &str,
) -> (Vec<Reply>, Option<Vec<Bytes>>) {
    let pattern = name.starts_with('p');
    let subscribing = !name.contains("unsub");
    let mut replies = Vec::new();
    let mut changed = Vec::new();
    let targets: Vec<Bytes> = if subscribing || !args.is_empty() {
        args.to_vec()
    } else if pattern {
        subs.patterns.iter().cloned().collect()
    } else {
        subs.channels.iter().cloned().collect()
    };
    for target in &targets {
        let set = if pattern {
            &mut subs.patterns
        } else {
            &mut subs.channels
        };
        let did = if subscribing {
            set.insert(target.clone())
        } else {
            set.remove(target)
        };
        if did {
            if subscribing {
                hub.add(pattern, target, conn, outbox);
            } else {
                hub.remove(pattern, target, conn);
            }
            changed.push(target.clone());
        }
        replies.push(Reply::Push(vec![
            Reply::text(name),
            Reply::Bulk(target.clone()),
            Reply::Int(subs.count() as i64),
        ]));
    }
    if targets.is_empty() {
        // UNSUBSCRIBE with nothing subscribed still answers.
        replies.push(Reply::Push(vec![
            Reply::text(name),
            Reply::Nil,
            Reply::Int(subs.count() as i64),
        ]));
    }
    let command = (!changed.is_empty()).then(|| {
        let verb: &'static [u8] = if subscribing {
            b"upright.subscribe"
        } else {
            b"upright.unsubscribe"
        };
        let kind: &'static [u8] = if pattern { b"pattern" } else { b"channel" };
        let mut command = vec![
            Bytes::from_static(verb),
            Bytes::copy_from_slice(prefix.as_bytes()),
            Bytes::from_static(kind),
        ];
        command.extend(changed);
        command
    });
    (replies, command)
}

/// Unsubscribes connection `conn` from everything (it closed, or RESET): the store commands.
pub fn drop_all(subs: &mut Subscriptions, conn: u64, outbox: &Arc<Outbox>, hub: &Hub, prefix: &str) -> Vec<Vec<Bytes>> {
    ["unsubscribe", "punsubscribe"]
        .iter()
        .filter_map(|name| change(name, &[], subs, conn, outbox, hub, prefix).1)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subscriptions_count_confirm_and_deliver() {
        let hub = Hub::default();
        let (outbox, mut rx) = Outbox::new();
        let mut subs = Subscriptions::default();
        let b = |s: &str| Bytes::copy_from_slice(s.as_bytes());
        let (replies, command) = change(
            "subscribe",
            &[b("a"), b("a"), b("b")],
            &mut subs,
            1,
            &outbox,
            &hub,
            "g.",
        );
        assert_eq!(replies.len(), 3);
        assert_eq!(
            replies[2],
            Reply::Push(vec![Reply::text("subscribe"), Reply::text("b"), Reply::Int(2)])
        );
        assert_eq!(command.unwrap().len(), 5, "verb, prefix, kind and the two new channels");
        hub.deliver(Pushed::Message {
            channel: b("a"),
            message: b("hi"),
        });
        assert_eq!(
            rx.try_recv().unwrap(),
            Reply::Push(vec![Reply::text("message"), Reply::text("a"), Reply::text("hi")])
        );
        let commands = drop_all(&mut subs, 1, &outbox, &hub, "g.");
        assert_eq!(commands.len(), 1, "only channels were subscribed");
        hub.deliver(Pushed::Message {
            channel: b("a"),
            message: b("hi"),
        });
        assert!(rx.try_recv().is_err());
        assert_eq!(hub.undelivered.load(Ordering::Relaxed), 1);
        let (replies, command) = change("punsubscribe", &[], &mut subs, 1, &outbox, &hub, "g.");
        assert_eq!(
            replies,
            vec![Reply::Push(vec![
                Reply::text("punsubscribe"),
                Reply::Nil,
                Reply::Int(0)
            ])]
        );
        assert!(command.is_none());
    }
}

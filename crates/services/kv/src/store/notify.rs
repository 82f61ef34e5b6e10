//! Keyspace notifications (`CONFIG SET notify-keyspace-events`): each change to a key published
//! on `__keyspace@0__:<key>` (the event as the message) and `__keyevent@0__:<event>` (the key),
//! for the classes the setting enables, as Redis does. The setting is agreed state (the gateway
//! sends it as `upright.notify-config [VALUE]`), so every replica publishes the same messages.

use bytes::Bytes;

use super::RedisStore;
use crate::reply::Reply;

/// The event classes, in Redis' order, with their flag characters.
const CLASSES: &[(char, u16)] = &[
    ('g', 1 << 0),
    ('$', 1 << 1),
    ('l', 1 << 2),
    ('s', 1 << 3),
    ('h', 1 << 4),
    ('z', 1 << 5),
    ('x', 1 << 6),
    ('e', 1 << 7),
    ('t', 1 << 8),
    ('d', 1 << 9),
];
const KEYSPACE: u16 = 1 << 10;
const KEYEVENT: u16 = 1 << 11;
const MISS: u16 = 1 << 12;
const NEW: u16 = 1 << 13;
/// `A`: every class above.
const ALL: u16 = (1 << 10) - 1;

fn class_bit(class: char) -> u16 {
    match class {
        'n' => NEW,
        'm' => MISS,
        c => CLASSES.iter().find(|(f, _)| *f == c).map_or(0, |(_, b)| *b),
    }
}

/// Parses a setting (`KEA`, `Elg$`, ...); `None` for an unknown character.
pub(super) fn parse(value: &[u8]) -> Option<u16> {
    let mut flags = 0;
    for &c in value {
        flags |= match c as char {
            'A' => ALL,
            'K' => KEYSPACE,
            'E' => KEYEVENT,
            'm' => MISS,
            'n' => NEW,
            c => match class_bit(c) {
                0 => return None,
                bit => bit,
            },
        };
    }
    Some(flags)
}

/// The setting as Redis prints it back.
fn format(flags: u16) -> String {
    let mut out = String::new();
    if flags & ALL == ALL {
        out.push('A');
    } else {
        CLASSES
            .iter()
            .filter(|(_, b)| flags & b != 0)
            .for_each(|(c, _)| out.push(*c));
    }
    for (bit, c) in [(KEYSPACE, 'K'), (KEYEVENT, 'E'), (MISS, 'm'), (NEW, 'n')] {
        if flags & bit != 0 {
            out.push(c);
        }
    }
    out
}

/// The event a successful write command causes on its keys: (class, event name), or `None` for
/// commands that name none here.
fn event_of(name: &str) -> Option<(char, &'static str)> {
    Some(match name {
        "set" | "setnx" | "setex" | "psetex" | "getset" | "mset" | "msetnx" => ('$', "set"),
        "append" => ('$', "append"),
        "incr" | "incrby" => ('$', "incrby"),
        "decr" | "decrby" => ('$', "decrby"),
        "incrbyfloat" => ('$', "incrbyfloat"),
        "setrange" => ('$', "setrange"),
        "setbit" => ('$', "setbit"),
        "del" | "unlink" | "getdel" => ('g', "del"),
        "expire" | "pexpire" | "expireat" | "pexpireat" => ('g', "expire"),
        "persist" => ('g', "persist"),
        "lpush" | "lpushx" => ('l', "lpush"),
        "rpush" | "rpushx" => ('l', "rpush"),
        "lpop" => ('l', "lpop"),
        "rpop" => ('l', "rpop"),
        "linsert" => ('l', "linsert"),
        "lset" => ('l', "lset"),
        "ltrim" => ('l', "ltrim"),
        "lrem" => ('l', "lrem"),
        "sadd" => ('s', "sadd"),
        "srem" => ('s', "srem"),
        "spop" => ('s', "spop"),
        "hset" | "hmset" | "hsetnx" => ('h', "hset"),
        "hdel" => ('h', "hdel"),
        "hincrby" => ('h', "hincrby"),
        "hincrbyfloat" => ('h', "hincrbyfloat"),
        "zadd" => ('z', "zadd"),
        "zincrby" => ('z', "zincr"),
        "zrem" => ('z', "zrem"),
        "zpopmin" => ('z', "zpopmin"),
        "zpopmax" => ('z', "zpopmax"),
        _ => return None,
    })
}

/// Whether `reply` says the command changed something (a count above 0, OK, a value).
fn changed(reply: &Reply) -> bool {
    match reply {
        Reply::Int(n) => *n > 0,
        Reply::Status(_) | Reply::Bulk(_) | Reply::Double(_) => true,
        Reply::Array(items) => !items.is_empty(),
        _ => false,
    }
}

impl RedisStore {
    /// `upright.notify-config [VALUE]`: sets the classes, or answers them as CONFIG GET does.
    pub(super) fn notify_config(&mut self, value: Option<&Bytes>) -> Reply {
        match value {
            None => Reply::Map(vec![(
                Reply::text("notify-keyspace-events"),
                Reply::text(format(self.notify)),
            )]),
            Some(v) => match parse(v) {
                Some(flags) => {
                    self.notify = flags;
                    Reply::ok()
                }
                None => Reply::err(
                    "ERR CONFIG SET failed (possibly related to argument 'notify-keyspace-events') - Invalid event class character. Use 'Ag$lshzxeKEtmdn'.",
                ),
            },
        }
    }

    /// Publishes `event` on `key` if its class is enabled.
    pub(super) fn notify(&mut self, class: char, event: &str, key: &Bytes) {
        let flags = self.notify;
        if flags & class_bit(class) == 0 || flags & (KEYSPACE | KEYEVENT) == 0 {
            return;
        }
        if flags & KEYSPACE != 0 {
            let channel = Bytes::from([b"__keyspace@0__:".as_slice(), key].concat());
            self.publish_quietly(&channel, &Bytes::copy_from_slice(event.as_bytes()));
        }
        if flags & KEYEVENT != 0 {
            let channel = Bytes::from(format!("__keyevent@0__:{event}"));
            self.publish_quietly(&channel, key);
        }
    }

    fn publish_quietly(&mut self, channel: &Bytes, message: &Bytes) {
        let _ = self.publish(channel, message);
    }

    /// Whether notifications are on at all (a cheap test before working out a command's events).
    pub(super) fn notifying(&self) -> bool {
        self.notify & (KEYSPACE | KEYEVENT) != 0
    }

    /// The keys of `argv` (spec key positions) that exist now: for DEL-like commands, whose
    /// events name only the keys they removed.
    pub(super) fn existing_keys(&self, spec: &crate::command::CommandSpec, argv: &[Bytes]) -> Vec<Bytes> {
        spec.keys_of(argv)
            .into_iter()
            .filter(|k| self.get(k).is_some())
            .collect()
    }

    /// Publishes the events of command `argv` that answered `reply` (`existed`: its keys that
    /// existed before it ran).
    pub(super) fn notify_command(
        &mut self,
        spec: &crate::command::CommandSpec,
        argv: &[Bytes],
        reply: &Reply,
        existed: Vec<Bytes>,
    ) {
        let Some((class, event)) = event_of(spec.name) else {
            return;
        };
        if !changed(reply) {
            return;
        }
        let keys = match spec.name {
            "del" | "unlink" | "getdel" => existed.into_iter().filter(|k| self.get(k).is_none()).collect(),
            _ => spec.keys_of(argv),
        };
        for key in keys {
            self.notify(class, event, &key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_print_back_as_redis_prints_them() {
        for (set, get) in [
            ("gKE", "gKE"),
            ("$lshzxeKE", "$lshzxeKE"),
            ("KA", "AK"),
            ("EA", "AE"),
            ("", ""),
        ] {
            assert_eq!(format(parse(set.as_bytes()).unwrap()), get, "{set}");
        }
        assert_eq!(parse(b"KEq"), None);
    }
}

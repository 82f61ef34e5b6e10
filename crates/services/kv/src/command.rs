//! The command table and argument helpers shared by the store and the gateway.

use bytes::Bytes;

use crate::reply::Reply;

/// Where a command is answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Place {
    /// By the replicated store, through agreement.
    Replicated,
    /// By the gateway itself (connection state and introspection: PING, HELLO, INFO, ...).
    Gateway,
}

/// One command of the table.
#[derive(Clone, Copy, Debug)]
pub struct CommandSpec {
    /// Lower-case name.
    pub name: &'static str,
    /// Redis arity: `n` exactly n arguments (with the name), `-n` at least n.
    pub arity: i32,
    /// Redis command flags (for COMMAND).
    pub flags: &'static [&'static str],
    /// First key argument, last key argument (-1: the last one), step (for COMMAND; 0 = no keys).
    pub keys: (i64, i64, i64),
    /// Where it is answered.
    pub place: Place,
}

impl CommandSpec {
    /// Whether the command only reads the replicated store (flagged `readonly`), so it may take
    /// the read-only path. Connection commands answered by the gateway are not.
    pub fn is_read(&self) -> bool {
        self.place == Place::Replicated && self.flags.contains(&"readonly")
    }

    /// The keys `argv` names by the table's key positions (none for a command without them).
    pub fn keys_of(&self, argv: &[Bytes]) -> Vec<Bytes> {
        let (first, last, step) = self.keys;
        if first == 0 {
            return Vec::new();
        }
        let last = if last < 0 { argv.len() as i64 + last } else { last };
        (first..=last)
            .step_by(step.max(1) as usize)
            .filter_map(|i| argv.get(i as usize).cloned())
            .collect()
    }
}

const fn spec(name: &'static str, arity: i32, flags: &'static [&'static str], keys: (i64, i64, i64)) -> CommandSpec {
    CommandSpec {
        name,
        arity,
        flags,
        keys,
        place: Place::Replicated,
    }
}

const fn local(name: &'static str, arity: i32, flags: &'static [&'static str]) -> CommandSpec {
    CommandSpec {
        name,
        arity,
        flags,
        keys: (0, 0, 0),
        place: Place::Gateway,
    }
}

const W: &[&str] = &["write", "denyoom"];
const WF: &[&str] = &["write", "denyoom", "fast"];
const R: &[&str] = &["readonly"];
const RF: &[&str] = &["readonly", "fast"];
const WK: &[&str] = &["write"];
const WKF: &[&str] = &["write", "fast"];
const L: &[&str] = &["fast", "loading", "stale"];
const B: &[&str] = &["write", "blocking"];
const PS: &[&str] = &["pubsub", "noscript", "loading", "stale"];
const BF: &[&str] = &["write", "fast", "blocking"];
const BD: &[&str] = &["write", "denyoom", "blocking"];

/// Every supported command.
pub const COMMANDS: &[CommandSpec] = &[
    spec("get", 2, RF, (1, 1, 1)),
    spec("set", -3, W, (1, 1, 1)),
    spec("setnx", 3, WF, (1, 1, 1)),
    spec("setex", 4, W, (1, 1, 1)),
    spec("psetex", 4, W, (1, 1, 1)),
    spec("getset", 3, WF, (1, 1, 1)),
    spec("getdel", 2, WKF, (1, 1, 1)),
    spec("del", -2, WK, (1, -1, 1)),
    spec("unlink", -2, WKF, (1, -1, 1)),
    spec("exists", -2, RF, (1, -1, 1)),
    spec("type", 2, RF, (1, 1, 1)),
    spec("incr", 2, WF, (1, 1, 1)),
    spec("decr", 2, WF, (1, 1, 1)),
    spec("incrby", 3, WF, (1, 1, 1)),
    spec("decrby", 3, WF, (1, 1, 1)),
    spec("append", 3, W, (1, 1, 1)),
    spec("strlen", 2, RF, (1, 1, 1)),
    spec("mget", -2, RF, (1, -1, 1)),
    spec("mset", -3, W, (1, -1, 2)),
    spec("msetnx", -3, W, (1, -1, 2)),
    spec("expire", -3, WKF, (1, 1, 1)),
    spec("pexpire", -3, WKF, (1, 1, 1)),
    spec("ttl", 2, RF, (1, 1, 1)),
    spec("pttl", 2, RF, (1, 1, 1)),
    spec("persist", 2, WKF, (1, 1, 1)),
    spec("hset", -4, WF, (1, 1, 1)),
    spec("hmset", -4, WF, (1, 1, 1)),
    spec("hsetnx", 4, WF, (1, 1, 1)),
    spec("hget", 3, RF, (1, 1, 1)),
    spec("hmget", -3, RF, (1, 1, 1)),
    spec("hgetall", 2, R, (1, 1, 1)),
    spec("hdel", -3, WKF, (1, 1, 1)),
    spec("hexists", 3, RF, (1, 1, 1)),
    spec("hincrby", 4, WF, (1, 1, 1)),
    spec("hincrbyfloat", 4, WF, (1, 1, 1)),
    spec("hkeys", 2, R, (1, 1, 1)),
    spec("hvals", 2, R, (1, 1, 1)),
    spec("hlen", 2, RF, (1, 1, 1)),
    spec("hstrlen", 3, RF, (1, 1, 1)),
    // Not `readonly` here (Redis flags it so): each call is ordered, so each draws from a fresh
    // agreed seed, where every replica in the same state would answer a read the same.
    spec("hrandfield", -2, &["random"], (1, 1, 1)),
    spec("hscan", -3, R, (1, 1, 1)),
    spec("lpush", -3, WF, (1, 1, 1)),
    spec("rpush", -3, WF, (1, 1, 1)),
    spec("lpushx", -3, WF, (1, 1, 1)),
    spec("rpushx", -3, WF, (1, 1, 1)),
    spec("lpop", -2, WKF, (1, 1, 1)),
    spec("rpop", -2, WKF, (1, 1, 1)),
    spec("lrange", 4, R, (1, 1, 1)),
    spec("lindex", 3, R, (1, 1, 1)),
    spec("linsert", 5, W, (1, 1, 1)),
    spec("llen", 2, RF, (1, 1, 1)),
    spec("lrem", 4, WK, (1, 1, 1)),
    spec("lset", 4, W, (1, 1, 1)),
    spec("ltrim", 4, WK, (1, 1, 1)),
    spec("lpos", -3, R, (1, 1, 1)),
    spec("lmove", 5, W, (1, 2, 1)),
    spec("rpoplpush", 3, W, (1, 2, 1)),
    spec("sadd", -3, WF, (1, 1, 1)),
    spec("srem", -3, WKF, (1, 1, 1)),
    spec("smembers", 2, R, (1, 1, 1)),
    spec("sismember", 3, RF, (1, 1, 1)),
    spec("smismember", -3, RF, (1, 1, 1)),
    spec("scard", 2, RF, (1, 1, 1)),
    spec("spop", -2, WKF, (1, 1, 1)),
    // Ordered, like HRANDFIELD: each call draws from a fresh agreed seed.
    spec("srandmember", -2, &["random"], (1, 1, 1)),
    spec("sinter", -2, R, (1, -1, 1)),
    spec("sunion", -2, R, (1, -1, 1)),
    spec("sdiff", -2, R, (1, -1, 1)),
    spec("sinterstore", -3, W, (1, -1, 1)),
    spec("sunionstore", -3, W, (1, -1, 1)),
    spec("sdiffstore", -3, W, (1, -1, 1)),
    spec("sintercard", -3, R, (2, -1, 1)),
    spec("smove", 4, WF, (1, 2, 1)),
    spec("sscan", -3, R, (1, 1, 1)),
    spec("lmpop", -4, WK, (2, -1, 1)),
    spec("blpop", -3, B, (1, -2, 1)),
    spec("brpop", -3, B, (1, -2, 1)),
    spec("brpoplpush", 4, BD, (1, 2, 1)),
    spec("blmove", 6, BD, (1, 2, 1)),
    spec("blmpop", -5, B, (3, -1, 1)),
    spec("bzpopmin", -3, BF, (1, -2, 1)),
    spec("bzpopmax", -3, BF, (1, -2, 1)),
    spec("bzmpop", -5, B, (3, -1, 1)),
    spec("zadd", -4, WF, (1, 1, 1)),
    spec("zincrby", 4, WF, (1, 1, 1)),
    spec("zcard", 2, RF, (1, 1, 1)),
    spec("zscore", 3, RF, (1, 1, 1)),
    spec("zmscore", -3, RF, (1, 1, 1)),
    spec("zrank", -3, RF, (1, 1, 1)),
    spec("zrevrank", -3, RF, (1, 1, 1)),
    spec("zrange", -4, R, (1, 1, 1)),
    spec("zrangestore", -5, W, (1, 2, 1)),
    spec("zrevrange", -4, R, (1, 1, 1)),
    spec("zrangebyscore", -4, R, (1, 1, 1)),
    spec("zrevrangebyscore", -4, R, (1, 1, 1)),
    spec("zrangebylex", -4, R, (1, 1, 1)),
    spec("zrevrangebylex", -4, R, (1, 1, 1)),
    spec("zcount", 4, RF, (1, 1, 1)),
    spec("zlexcount", 4, RF, (1, 1, 1)),
    spec("zrem", -3, WKF, (1, 1, 1)),
    spec("zremrangebyrank", 4, WK, (1, 1, 1)),
    spec("zremrangebyscore", 4, WK, (1, 1, 1)),
    spec("zremrangebylex", 4, WK, (1, 1, 1)),
    spec("zpopmin", -2, WKF, (1, 1, 1)),
    spec("zpopmax", -2, WKF, (1, 1, 1)),
    // Keys follow a count: every argument after it is named (conservative, as access allows).
    spec("zmpop", -4, WK, (2, -1, 1)),
    spec("zunionstore", -4, W, (1, -1, 1)),
    spec("zinterstore", -4, W, (1, -1, 1)),
    spec("zdiffstore", -4, W, (1, -1, 1)),
    spec("zunion", -3, R, (2, -1, 1)),
    spec("zinter", -3, R, (2, -1, 1)),
    spec("zdiff", -3, R, (2, -1, 1)),
    spec("zintercard", -3, R, (2, -1, 1)),
    // Ordered, like HRANDFIELD: each call draws from a fresh agreed seed.
    spec("zrandmember", -2, &["random"], (1, 1, 1)),
    spec("zscan", -3, R, (1, 1, 1)),
    spec("getex", -2, WKF, (1, 1, 1)),
    spec("getrange", 4, R, (1, 1, 1)),
    spec("substr", 4, R, (1, 1, 1)),
    spec("setbit", 4, W, (1, 1, 1)),
    spec("getbit", 3, RF, (1, 1, 1)),
    spec("lcs", -3, R, (1, 2, 1)),
    spec("setrange", 4, W, (1, 1, 1)),
    spec("incrbyfloat", 3, WF, (1, 1, 1)),
    spec("expireat", -3, WKF, (1, 1, 1)),
    spec("pexpireat", -3, WKF, (1, 1, 1)),
    spec("expiretime", 2, RF, (1, 1, 1)),
    spec("pexpiretime", 2, RF, (1, 1, 1)),
    spec("rename", 3, WK, (1, 2, 1)),
    spec("renamenx", 3, WKF, (1, 2, 1)),
    spec("copy", -3, W, (1, 2, 1)),
    spec("touch", -2, RF, (1, -1, 1)),
    // Ordered, like HRANDFIELD: each call draws from a fresh agreed seed.
    spec("randomkey", 1, &["random"], (0, 0, 0)),
    spec("object", -2, R, (2, 2, 1)),
    spec("memory", -2, R, (2, 2, 1)),
    // Patterns (BY, GET) name other keys: no key positions, so the object analysis says
    // "anything" for SORT.
    spec("sort", -2, W, (0, 0, 0)),
    spec("sort_ro", -2, R, (0, 0, 0)),
    spec("publish", 3, &["pubsub", "loading", "stale", "fast"], (0, 0, 0)),
    spec("pubsub", -2, &["readonly", "pubsub", "loading", "stale"], (0, 0, 0)),
    spec("keys", 2, R, (0, 0, 0)),
    spec("scan", -2, R, (0, 0, 0)),
    spec("dbsize", 1, RF, (0, 0, 0)),
    spec("flushdb", -1, WK, (0, 0, 0)),
    spec("flushall", -1, WK, (0, 0, 0)),
    local("ping", -1, L),
    local("echo", 2, &["fast"]),
    local("select", 2, L),
    local("client", -2, &["noscript", "loading", "stale"]),
    local("command", -1, &["loading", "stale"]),
    local("info", -1, &["loading", "stale"]),
    local("hello", -1, &["noscript", "loading", "stale", "fast"]),
    local("config", -2, &["admin", "noscript", "loading", "stale"]),
    local("function", -2, &["noscript"]),
    local("time", 1, &["loading", "stale", "fast"]),
    local("quit", -1, &["noscript", "loading", "stale", "fast"]),
    local(
        "auth",
        -2,
        &["noscript", "loading", "stale", "fast", "no-auth", "allow-busy"],
    ),
    local("save", 1, &["admin", "noscript", "no-async-loading", "no-multi"]),
    local("bgsave", -1, &["admin", "noscript", "no-async-loading"]),
    local("shutdown", -1, &["admin", "noscript", "loading", "stale", "no-multi"]),
    local("subscribe", -2, PS),
    local("unsubscribe", -1, PS),
    local("psubscribe", -2, PS),
    local("punsubscribe", -1, PS),
    local("ssubscribe", -2, PS),
    local("sunsubscribe", -1, PS),
    local("multi", 1, &["noscript", "loading", "stale", "fast", "allow-busy"]),
    local("exec", 1, &["noscript", "loading", "stale", "skip-slowlog"]),
    local("discard", 1, &["noscript", "loading", "stale", "fast", "allow-busy"]),
    local("watch", -2, &["noscript", "loading", "stale", "fast", "allow-busy"]),
    local("unwatch", 1, &["noscript", "loading", "stale", "fast", "allow-busy"]),
    local("reset", 1, &["noscript", "loading", "stale", "fast"]),
];

/// Whether argument `arg` is the keyword `word` (Redis compares keywords case-insensitively).
pub fn is(arg: &[u8], word: &str) -> bool {
    arg.eq_ignore_ascii_case(word.as_bytes())
}

/// Looks a command up by name, case-insensitively.
pub fn lookup(name: &[u8]) -> Option<&'static CommandSpec> {
    COMMANDS.iter().find(|c| c.name.as_bytes().eq_ignore_ascii_case(name))
}

/// Redis' reply for an unknown command.
pub fn unknown_command(argv: &[Bytes]) -> Reply {
    let mut args = String::new();
    for arg in argv.iter().skip(1) {
        if args.len() >= 128 {
            break;
        }
        let room = 128 - args.len();
        let text = String::from_utf8_lossy(arg);
        let cut: String = text.chars().take(room).collect();
        args.push_str(&format!("'{cut}' "));
    }
    let name: String = String::from_utf8_lossy(&argv[0]).chars().take(128).collect();
    Reply::err(format!(
        "ERR unknown command '{name}', with args beginning with: {args}"
    ))
}

/// Redis' reply for a wrong number of arguments.
pub fn wrong_arity(name: &str) -> Reply {
    Reply::err(format!("ERR wrong number of arguments for '{name}' command"))
}

/// Checks the name and arity: the command, or the error reply Redis gives.
pub fn check(argv: &[Bytes]) -> Result<&'static CommandSpec, Reply> {
    let Some(first) = argv.first() else {
        return Err(Reply::err("ERR empty command"));
    };
    let spec = lookup(first).ok_or_else(|| unknown_command(argv))?;
    let n = argv.len() as i32;
    let ok = if spec.arity >= 0 {
        n == spec.arity
    } else {
        n >= -spec.arity
    };
    if ok {
        Ok(spec)
    } else {
        Err(wrong_arity(spec.name))
    }
}

/// "ERR value is not an integer or out of range".
pub fn not_integer() -> Reply {
    Reply::err("ERR value is not an integer or out of range")
}

/// "ERR syntax error".
pub fn syntax_error() -> Reply {
    Reply::err("ERR syntax error")
}

/// Parses a signed 64-bit integer exactly as Redis' `string2ll` does: optional `-`, no `+`, no
/// leading zeros, no spaces, at most 20 characters.
pub fn parse_i64(bytes: &[u8]) -> Option<i64> {
    if bytes.is_empty() || bytes.len() > 20 {
        return None;
    }
    if bytes == b"0" {
        return Some(0);
    }
    let (negative, digits) = match bytes[0] {
        b'-' => (true, &bytes[1..]),
        _ => (false, bytes),
    };
    if digits.is_empty() || digits[0] == b'0' || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let mut value: i128 = 0;
    for &d in digits {
        value = value * 10 + i128::from(d - b'0');
        if value > i128::from(i64::MAX) + 1 {
            return None;
        }
    }
    let value = if negative { -value } else { value };
    i64::try_from(value).ok()
}

/// Parses an integer argument or gives Redis' error.
pub fn int_arg(bytes: &[u8]) -> Result<i64, Reply> {
    parse_i64(bytes).ok_or_else(not_integer)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(words: &[&str]) -> Vec<Bytes> {
        words.iter().map(|w| Bytes::copy_from_slice(w.as_bytes())).collect()
    }

    #[test]
    fn integers_parse_like_string2ll() {
        assert_eq!(parse_i64(b"0"), Some(0));
        assert_eq!(parse_i64(b"-12"), Some(-12));
        assert_eq!(parse_i64(b"9223372036854775807"), Some(i64::MAX));
        assert_eq!(parse_i64(b"-9223372036854775808"), Some(i64::MIN));
        for bad in [
            &b"9223372036854775808"[..],
            b"01",
            b"-0",
            b"+1",
            b" 1",
            b"1 ",
            b"",
            b"-",
            b"1.5",
        ] {
            assert_eq!(parse_i64(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn errors_match_redis() {
        assert_eq!(
            check(&argv(&["FOO", "a", "b"])).unwrap_err(),
            Reply::err("ERR unknown command 'FOO', with args beginning with: 'a' 'b' ")
        );
        assert_eq!(
            check(&argv(&["foo"])).unwrap_err(),
            Reply::err("ERR unknown command 'foo', with args beginning with: ")
        );
        assert_eq!(
            check(&argv(&["GET"])).unwrap_err(),
            Reply::err("ERR wrong number of arguments for 'get' command")
        );
        assert_eq!(check(&argv(&["Set", "k", "v"])).unwrap().name, "set");
    }
}

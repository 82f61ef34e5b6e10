//! Commands the gateway answers itself: connection state and introspection.

use std::sync::atomic::Ordering;

use bytes::Bytes;

use super::Shared;
use crate::command::{self, is, parse_i64, wrong_arity, CommandSpec, Place, COMMANDS};
use crate::reply::Reply;

/// The Redis version the gateway reports (the command set and replies follow Redis 7.0).
pub const REDIS_VERSION: &str = "7.0.0";
/// Longest client name.
const CLIENT_NAME_MAX: usize = 256;

/// Per-connection state.
pub struct Session {
    /// Connection id.
    pub id: u64,
    /// Protocol version (2 or 3).
    pub proto: u8,
    /// CLIENT SETNAME.
    pub name: Option<Bytes>,
    /// Commands queued since MULTI.
    pub multi: Option<Transaction>,
    /// The token of this connection's WATCHes at the store, if it watches.
    pub watch: Option<Bytes>,
    /// Channels and patterns it subscribes to.
    pub subs: super::pubsub::Subscriptions,
    /// Where its pub/sub messages go.
    pub outbox: std::sync::Arc<super::pubsub::Outbox>,
    /// CLIENT REPLY: whether answers are written.
    pub reply: ReplyMode,
    /// The gateway user it is authenticated as (`None`: not yet).
    pub user: Option<usize>,
}

/// CLIENT REPLY ON | OFF | SKIP.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplyMode {
    /// Every answer is written.
    On,
    /// No answer is written (pub/sub pushes still are).
    Off,
    /// The next command's answer is not written.
    SkipNext,
}

/// A transaction being queued.
#[derive(Debug, Default)]
pub struct Transaction {
    /// The commands, in order.
    pub commands: Vec<Vec<Bytes>>,
    /// Their argument bytes.
    pub bytes: usize,
    /// A command was refused while queueing: EXEC discards the transaction.
    pub failed: bool,
}

impl Session {
    /// A fresh RESP2 session whose messages go to `outbox`.
    pub fn new(id: u64, outbox: std::sync::Arc<super::pubsub::Outbox>) -> Session {
        Session {
            id,
            subs: Default::default(),
            outbox,
            reply: ReplyMode::On,
            user: None,
            proto: 2,
            name: None,
            multi: None,
            watch: None,
        }
    }
}

fn unknown_subcommand(sub: &[u8], cmd: &str) -> Reply {
    Reply::err(format!(
        "ERR unknown subcommand '{}'. Try {} HELP.",
        String::from_utf8_lossy(sub),
        cmd.to_uppercase()
    ))
}

/// Answers a gateway command; the flag asks to close the connection after the reply.
pub fn answer(session: &mut Session, name: &str, argv: &[Bytes], shared: &Shared) -> (Reply, bool) {
    let a = &argv[1..];
    let reply = match name {
        "ping" => match a {
            [] => Reply::Status("PONG".into()),
            [msg] => Reply::Bulk(msg.clone()),
            _ => wrong_arity("ping"),
        },
        "echo" => Reply::Bulk(a[0].clone()),
        "select" => match parse_i64(&a[0]) {
            None => command::not_integer(),
            Some(0) => Reply::ok(),
            Some(_) => Reply::err("ERR DB index is out of range"),
        },
        "quit" => return (Reply::ok(), true),
        "reset" => {
            // The caller ends the connection's WATCH and subscriptions at the store first, and
            // sets its user back.
            *session = Session::new(session.id, session.outbox.clone());
            Reply::Status("RESET".into())
        }
        "hello" => hello(session, a, shared),
        "client" => client(session, a),
        "command" => command_cmd(a),
        "info" => {
            let mut text = info(shared, session);
            if a.iter()
                .any(|s| is(s, "commandstats") || is(s, "all") || is(s, "everything"))
            {
                text.push_str("\r\n");
                text.push_str(&shared.stats.render());
            }
            Reply::Bulk(Bytes::from(text))
        }
        "config" if is(&a[0], "resetstat") => {
            shared.stats.reset();
            Reply::ok()
        }
        "config" => config(a),
        "function" => function(a),
        "time" => time_now(),
        "save" | "bgsave" => Reply::err(
            "ERR upright: the store takes no snapshots of its own (its state is in the replicas' logs and checkpoints)",
        ),
        "shutdown" => Reply::err("ERR upright: the gateway does not shut the cluster down (stop its processes)"),
        // Queued inside MULTI: EXEC forgets the connection's WATCH anyway.
        "unwatch" => Reply::ok(),
        other => unreachable!("{other} is not a gateway command"),
    };
    (reply, false)
}

fn set_name(session: &mut Session, name: &Bytes) -> Result<(), Reply> {
    if name.len() > CLIENT_NAME_MAX || name.iter().any(|&b| !(b'!'..=b'~').contains(&b)) {
        return Err(Reply::err(
            "ERR Client names cannot contain spaces, newlines or special characters.",
        ));
    }
    session.name = (!name.is_empty()).then(|| name.clone());
    Ok(())
}

fn hello(session: &mut Session, a: &[Bytes], shared: &Shared) -> Reply {
    let mut proto = session.proto;
    if let Some(v) = a.first() {
        match parse_i64(v) {
            Some(v @ 2..=3) => proto = v as u8,
            Some(_) => return Reply::err("NOPROTO unsupported protocol version"),
            None => return Reply::err("ERR Protocol version is not an integer or out of range"),
        }
    }
    let mut i = 1;
    while i < a.len() {
        if is(&a[i], "setname") && i + 1 < a.len() {
            if let Err(e) = set_name(session, &a[i + 1]) {
                return e;
            }
            i += 2;
        } else {
            return Reply::err(format!(
                "ERR Syntax error in HELLO option '{}'",
                String::from_utf8_lossy(&a[i])
            ));
        }
    }
    session.proto = proto;
    let _ = shared;
    Reply::Map(vec![
        (Reply::text("server"), Reply::text("redis")),
        (Reply::text("version"), Reply::text(REDIS_VERSION)),
        (Reply::text("proto"), Reply::Int(i64::from(proto))),
        (Reply::text("id"), Reply::Int(session.id as i64)),
        (Reply::text("mode"), Reply::text("standalone")),
        (Reply::text("role"), Reply::text("master")),
        (Reply::text("modules"), Reply::Array(vec![])),
    ])
}

fn client(session: &mut Session, a: &[Bytes]) -> Reply {
    let sub = &a[0];
    if is(sub, "setname") {
        if a.len() != 2 {
            return wrong_arity("client|setname");
        }
        return set_name(session, &a[1]).map_or_else(|e| e, |_| Reply::ok());
    }
    if is(sub, "getname") {
        return session.name.clone().map_or(Reply::Nil, Reply::Bulk);
    }
    if is(sub, "id") {
        return Reply::Int(session.id as i64);
    }
    if is(sub, "setinfo") || is(sub, "no-evict") || is(sub, "no-touch") {
        return Reply::ok();
    }
    if is(sub, "info") || is(sub, "list") {
        let name = session
            .name
            .as_ref()
            .map(|n| String::from_utf8_lossy(n).into_owned())
            .unwrap_or_default();
        return Reply::text(format!("id={} name={name} db=0 resp={}\n", session.id, session.proto));
    }
    unknown_subcommand(sub, "client")
}

fn set_of(words: &[&str]) -> Reply {
    Reply::Set(words.iter().map(|w| Reply::Status((*w).into())).collect())
}

fn command_info(c: &CommandSpec) -> Reply {
    let category = if c.place == Place::Gateway {
        "@connection"
    } else {
        "@string"
    };
    Reply::Array(vec![
        Reply::text(c.name),
        Reply::Int(i64::from(c.arity)),
        set_of(c.flags),
        Reply::Int(c.keys.0),
        Reply::Int(c.keys.1),
        Reply::Int(c.keys.2),
        set_of(&[category]),
        set_of(&[]),
        Reply::Array(vec![]),
        Reply::Array(vec![]),
    ])
}

fn command_docs(c: &CommandSpec) -> Reply {
    let group = if c.place == Place::Gateway {
        "connection"
    } else {
        "string"
    };
    Reply::Map(vec![
        (
            Reply::text("summary"),
            Reply::text(format!("Redis {} (upright)", c.name.to_uppercase())),
        ),
        (Reply::text("since"), Reply::text("1.0.0")),
        (Reply::text("group"), Reply::text(group)),
    ])
}

fn command_cmd(a: &[Bytes]) -> Reply {
    let Some(sub) = a.first() else {
        return Reply::Array(COMMANDS.iter().map(command_info).collect());
    };
    let named = |f: fn(&CommandSpec) -> Reply| -> Vec<(Reply, Reply)> {
        let specs: Vec<&CommandSpec> = if a.len() > 1 {
            a[1..].iter().filter_map(|n| command::lookup(n)).collect()
        } else {
            COMMANDS.iter().collect()
        };
        specs.into_iter().map(|c| (Reply::text(c.name), f(c))).collect()
    };
    if is(sub, "count") {
        Reply::Int(COMMANDS.len() as i64)
    } else if is(sub, "docs") {
        Reply::Map(named(command_docs))
    } else if is(sub, "info") {
        if a.len() == 1 {
            return Reply::Array(COMMANDS.iter().map(command_info).collect());
        }
        Reply::Array(
            a[1..]
                .iter()
                .map(|n| command::lookup(n).map_or(Reply::Nil, command_info))
                .collect(),
        )
    } else if is(sub, "list") {
        Reply::Array(COMMANDS.iter().map(|c| Reply::text(c.name)).collect())
    } else {
        unknown_subcommand(sub, "command")
    }
}

fn config(a: &[Bytes]) -> Reply {
    let sub = &a[0];
    if is(sub, "get") {
        if a.len() < 2 {
            return wrong_arity("config|get");
        }
        let known = [
            ("save", ""),
            ("appendonly", "no"),
            ("databases", "1"),
            ("maxmemory-policy", "noeviction"),
        ];
        let pairs = known
            .iter()
            .filter(|(k, _)| {
                a[1..]
                    .iter()
                    .any(|p| crate::glob::matches(&p.to_ascii_lowercase(), k.as_bytes()))
            })
            .map(|(k, v)| (Reply::text(k), Reply::text(v)))
            .collect();
        return Reply::Map(pairs);
    }
    if is(sub, "resetstat") {
        return Reply::ok();
    }
    if is(sub, "set") && a.len() >= 3 && a.len() % 2 == 1 && a[1..].chunks(2).all(|kv| changes_nothing(&kv[0], &kv[1]))
    {
        // The store has one representation per type, and no snapshots of its own (its state is
        // in the replicas' logs): the encoding thresholds Redis tunes and `save ""` (no RDB
        // snapshots) have nothing to change, so setting them is accepted and does nothing.
        return Reply::ok();
    }
    if is(sub, "set") {
        return Reply::err(format!(
            "ERR CONFIG SET failed (possibly related to argument '{}') - not supported by the upright gateway",
            String::from_utf8_lossy(a.get(1).map_or(&b""[..], |p| &p[..]))
        ));
    }
    if is(sub, "rewrite") {
        return Reply::err("ERR CONFIG REWRITE is not supported by the upright gateway");
    }
    unknown_subcommand(sub, "config")
}

/// Whether setting a CONFIG parameter to `value` would change nothing in the store: a parameter
/// that only chooses an in-memory encoding (listpack, intset, ziplist thresholds, list
/// compression), which the store does not have, or `save ""` (no RDB snapshots, which it never
/// takes).
fn changes_nothing(name: &[u8], value: &[u8]) -> bool {
    let name = name.to_ascii_lowercase();
    let types = ["hash-max-", "set-max-", "zset-max-", "list-max-"];
    types.iter().any(|t| name.starts_with(t.as_bytes()))
        || name == b"list-compress-depth"
        || (name == b"save" && value.is_empty())
}

/// TIME: the gateway's wall clock (seconds and microseconds), as a client expects from the
/// server it talks to. The replicated store never reads a clock: its time is the agreed batch
/// time, which runs up to a heartbeat behind this one.
fn time_now() -> Reply {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    Reply::Array(vec![
        Reply::text(now.as_secs().to_string()),
        Reply::text(now.subsec_micros().to_string()),
    ])
}

/// FUNCTION: the store runs no server-side functions, so there are none to list or flush (FLUSH
/// is a no-op that succeeds, which is what Redis' own test harness sends before each file).
fn function(a: &[Bytes]) -> Reply {
    let sub = &a[0];
    if is(sub, "flush") {
        return match a.get(1) {
            None => Reply::ok(),
            Some(mode) if a.len() == 2 && (is(mode, "async") || is(mode, "sync")) => Reply::ok(),
            Some(_) => command::syntax_error(),
        };
    }
    if is(sub, "list") {
        return Reply::Array(Vec::new());
    }
    Reply::err(format!(
        "ERR FUNCTION {} is not supported by the upright store (it runs no server-side functions)",
        String::from_utf8_lossy(sub).to_uppercase()
    ))
}

fn info(shared: &Shared, session: &Session) -> String {
    let n = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
    let uptime = shared.started.elapsed().as_secs();
    let mut text = format!(
        "# Server\r\nredis_version:{REDIS_VERSION}\r\nredis_mode:standalone\r\nupright_version:{}\r\n\
         process_id:{}\r\ntcp_port:{}\r\nuptime_in_seconds:{uptime}\r\nuptime_in_days:{}\r\n\r\n\
         # Clients\r\nconnected_clients:{}\r\nblocked_clients:{}\r\n\r\n\
         # Stats\r\ntotal_connections_received:{}\r\ntotal_commands_processed:{}\r\nrejected_connections:{}\r\n\
         protocol_errors:{}\r\n\r\n\
         # Replication\r\nrole:master\r\nconnected_slaves:0\r\n\r\n\
         # Upright\r\nupright_service:redis-kv\r\nupright_client_pool:{}\r\nupright_operations:{}\r\n\
         upright_read_path:read-only-with-fallback\r\nupright_unclaimed_pushes:{}\r\nconnection_resp:{}\r\n",
        env!("CARGO_PKG_VERSION"),
        std::process::id(),
        shared.port,
        uptime / 86_400,
        n(&shared.connected),
        n(&shared.blocked.confirmed),
        n(&shared.total_connections),
        n(&shared.commands),
        n(&shared.rejected),
        n(&shared.protocol_errors),
        shared.users.iter().map(|u| u.pool.size()).sum::<usize>(),
        shared.users.iter().map(|u| u.pool.operations()).sum::<u64>(),
        n(&shared.blocked.unclaimed),
        session.proto,
    );
    for user in &shared.users {
        text.push_str(&format!(
            "upright_user_{}:clients={},operations={}\r\n",
            user.name,
            user.pool.size(),
            user.pool.operations()
        ));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_is_the_wall_clock_in_seconds_and_microseconds() {
        let before = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        let Reply::Array(parts) = time_now() else {
            panic!("an array")
        };
        let number = |r: &Reply| match r {
            Reply::Bulk(b) => std::str::from_utf8(b).unwrap().parse::<u64>().unwrap(),
            other => panic!("{other:?}"),
        };
        assert_eq!(parts.len(), 2);
        assert!((before..=before + 1).contains(&number(&parts[0])));
        assert!(number(&parts[1]) < 1_000_000);
    }

    #[test]
    fn only_settings_that_change_nothing_may_be_set() {
        let set = |k: &str, v: &str| {
            config(&[
                Bytes::from_static(b"set"),
                Bytes::copy_from_slice(k.as_bytes()),
                Bytes::copy_from_slice(v.as_bytes()),
            ])
        };
        assert_eq!(set("hash-max-listpack-value", "8"), Reply::ok());
        assert_eq!(set("save", ""), Reply::ok());
        assert!(
            matches!(set("save", "900 1"), Reply::Error(_)),
            "snapshots cannot be turned on"
        );
        assert!(matches!(set("maxmemory", "10"), Reply::Error(_)));
        assert_eq!(function(&[Bytes::from_static(b"flush")]), Reply::ok());
        assert!(matches!(function(&[Bytes::from_static(b"load")]), Reply::Error(_)));
    }
}

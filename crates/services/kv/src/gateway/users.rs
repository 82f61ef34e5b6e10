//! Gateway users: AUTH and `HELLO ... AUTH` select one; each has its own upright client
//! identities (its commands reach the cluster as that client's requests) and a set of commands it
//! may run, so a gateway shared by several applications does not let one act as another.
//!
//! A gateway started without users has one, `default`, with no password and every command: the
//! behaviour of a Redis server without `requirepass`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use upright_node::client::ClientHandle;

use crate::command::{CommandSpec, Place, COMMANDS};

/// What any connection may run, authenticated or not.
pub const ALWAYS_ALLOWED: &[&str] = &["auth", "hello", "quit", "reset"];

/// The commands a user may run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommandSet {
    allowed: BTreeSet<&'static str>,
}

fn in_category(spec: &CommandSpec, category: &str) -> Option<bool> {
    Some(match category {
        "all" => true,
        "read" => spec.is_read(),
        "write" => spec.flags.contains(&"write"),
        "connection" => spec.place == Place::Gateway,
        "pubsub" => spec.flags.contains(&"pubsub"),
        "blocking" => spec.flags.contains(&"blocking"),
        "admin" | "dangerous" => {
            spec.flags.contains(&"admin") || matches!(spec.name, "flushall" | "flushdb" | "keys" | "sort")
        }
        _ => return None,
    })
}

impl CommandSet {
    /// Every command.
    pub fn all() -> CommandSet {
        CommandSet {
            allowed: COMMANDS.iter().map(|c| c.name).collect(),
        }
    }

    /// Applies `rules` in order to the empty set: `@category` or `name` (optionally `+`) adds,
    /// `-@category` or `-name` removes. Categories: `all`, `read`, `write`, `connection`,
    /// `pubsub`, `blocking`, `admin` (alias `dangerous`: FLUSHALL, FLUSHDB, KEYS, SORT, CONFIG).
    pub fn parse(rules: &[String]) -> Result<CommandSet, String> {
        let mut allowed = BTreeSet::new();
        for rule in rules {
            let (add, body) = match rule.strip_prefix('-') {
                Some(body) => (false, body),
                None => (true, rule.strip_prefix('+').unwrap_or(rule)),
            };
            let body = body.to_ascii_lowercase();
            let matched: Vec<&'static str> = match body.strip_prefix('@') {
                Some(category) => {
                    let mut names = Vec::new();
                    for spec in COMMANDS {
                        match in_category(spec, category) {
                            Some(true) => names.push(spec.name),
                            Some(false) => {}
                            None => return Err(format!("unknown command category @{category} in {rule:?}")),
                        }
                    }
                    names
                }
                None => match crate::command::lookup(body.as_bytes()) {
                    Some(spec) => vec![spec.name],
                    None => return Err(format!("unknown command {body:?} in {rule:?}")),
                },
            };
            for name in matched {
                if add {
                    allowed.insert(name);
                } else {
                    allowed.remove(name);
                }
            }
        }
        Ok(CommandSet { allowed })
    }

    /// Whether `name` (a command table name) may run.
    pub fn allows(&self, name: &str) -> bool {
        ALWAYS_ALLOWED.contains(&name) || self.allowed.contains(name)
    }
}

/// One gateway user.
pub struct GatewayUser {
    /// Its name (AUTH's first argument; `default` for AUTH with a password alone).
    pub name: String,
    /// Its password; `None`: none needed (only for `default`).
    pub password: Option<String>,
    /// Its upright clients (a pool of one or more identities).
    pub clients: Vec<ClientHandle>,
    /// What it may run.
    pub commands: CommandSet,
}

impl GatewayUser {
    /// The user of a gateway without users: `default`, no password, every command.
    pub fn open(clients: Vec<ClientHandle>) -> GatewayUser {
        GatewayUser {
            name: "default".into(),
            password: None,
            clients,
            commands: CommandSet::all(),
        }
    }
}

/// One user of a users file (`upright redis --users FILE`):
///
/// ```toml
/// [[user]]
/// name = "orders"                 # AUTH orders <password>
/// password = "a long secret"      # optional only for a user named "default"
/// client = "client-1.toml"        # its upright identity (relative to this file)
/// pool = 1                        # upright clients from that one on (default 1)
/// commands = ["@all", "-@admin"]  # what it may run (default: everything)
/// ```
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UserSpec {
    /// Its name.
    pub name: String,
    /// Its password.
    #[serde(default)]
    pub password: Option<String>,
    /// Its first upright client file.
    pub client: PathBuf,
    /// How many upright clients (client files numbered on from `client`).
    #[serde(default = "one")]
    pub pool: u32,
    /// Its command rules ([`CommandSet::parse`]).
    #[serde(default = "everything")]
    pub commands: Vec<String>,
}

fn one() -> u32 {
    1
}

fn everything() -> Vec<String> {
    vec!["@all".into()]
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct UsersFile {
    user: Vec<UserSpec>,
}

/// Reads and checks a users file: at least one user, distinct names, a password for every user
/// but `default`, command rules that parse; client paths made relative to the file's directory.
pub fn read_users(path: &Path) -> Result<Vec<(UserSpec, CommandSet)>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let file: UsersFile = toml::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    if file.user.is_empty() {
        return Err(format!("{}: no [[user]]", path.display()));
    }
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut names = BTreeSet::new();
    let mut users = Vec::new();
    for mut spec in file.user {
        if !names.insert(spec.name.clone()) {
            return Err(format!("{}: user {:?} appears twice", path.display(), spec.name));
        }
        if spec.password.is_none() && spec.name != "default" {
            return Err(format!(
                "{}: user {:?} has no password (only \"default\" may go without)",
                path.display(),
                spec.name
            ));
        }
        let commands =
            CommandSet::parse(&spec.commands).map_err(|e| format!("{}: user {:?}: {e}", path.display(), spec.name))?;
        if spec.client.is_relative() {
            spec.client = dir.join(&spec.client);
        }
        users.push((spec, commands));
    }
    Ok(users)
}

/// Compares two secrets in time independent of where they differ.
pub fn same_secret(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_apply_in_order() {
        let set = CommandSet::parse(&["@all".into(), "-@write".into(), "+set".into()]).unwrap();
        assert!(set.allows("get") && set.allows("set") && !set.allows("del") && !set.allows("lpush"));
        assert!(set.allows("auth"), "AUTH is always allowed");
        let reads = CommandSet::parse(&["@read".into(), "ping".into()]).unwrap();
        assert!(reads.allows("get") && reads.allows("ping") && !reads.allows("publish"));
        assert!(CommandSet::parse(&["@nope".into()]).is_err());
        assert!(CommandSet::parse(&["nosuchcommand".into()]).is_err());
        let safe = CommandSet::parse(&["@all".into(), "-@admin".into()]).unwrap();
        assert!(!safe.allows("flushall") && !safe.allows("config") && safe.allows("get"));
        assert!(same_secret(b"abc", b"abc") && !same_secret(b"abc", b"abd") && !same_secret(b"ab", b"abc"));
    }

    #[test]
    fn users_files_are_checked() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("users.toml");
        let write = |text: &str| std::fs::write(&file, text).unwrap();
        write("[[user]]\nname = \"a\"\npassword = \"p\"\nclient = \"client-1.toml\"\ncommands = [\"@read\"]\n");
        let users = read_users(&file).unwrap();
        assert_eq!(users[0].0.client, dir.path().join("client-1.toml"));
        assert!(users[0].1.allows("get") && !users[0].1.allows("set"));
        write("[[user]]\nname = \"a\"\nclient = \"c.toml\"\n");
        assert!(read_users(&file).unwrap_err().contains("no password"));
        write("[[user]]\nname = \"default\"\nclient = \"c.toml\"\n[[user]]\nname = \"default\"\nclient = \"d.toml\"\n");
        assert!(read_users(&file).unwrap_err().contains("twice"));
        write("[[user]]\nname = \"a\"\npassword = \"p\"\nclient = \"c.toml\"\ncolour = 1\n");
        assert!(read_users(&file).is_err(), "unknown fields are refused");
    }
}

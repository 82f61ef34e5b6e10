//! Commands and replies larger than one upright operation (values up to Redis'
//! proto-max-bulk-len, 512 MB).
//!
//! A gateway uploads a command whose arguments pass [`STAGE_THRESHOLD`] in pieces, as it reads
//! them from its client: `upright.stage TOKEN OFFSET piece` appends a piece of the command's
//! RESP bytes to the staging area under TOKEN (the gateway's, as its blocking tokens are), and
//! `upright.run TOKEN` takes the whole command out and runs it like any other, atomically at
//! every replica. A reply larger than
//! [`LARGE_REPLY_BYTES`] is kept in the store under a number and answered as
//! [`Reply::Large`]; the gateway reads it back in pieces with `upright.fetch N OFFSET LENGTH`
//! (on the read-only path: every execution replica answers each piece from the same agreed
//! state) and frees it with `upright.release N`. Staged commands and kept replies are agreed
//! state (in the checkpoint), bounded by [`LARGE_BYTES_MAX`] together; a restarted gateway's
//! leftovers go with `upright.unblock-stale`.

use std::collections::BTreeMap;

use bytes::{Bytes, BytesMut};
use upright_core::ids::ClientId;

use super::RedisStore;
use crate::command::parse_i64;
use crate::reply::Reply;

/// Commands whose arguments pass this many bytes are staged by the gateway.
pub const STAGE_THRESHOLD: usize = 256 * 1024;
/// Largest piece of one `upright.stage` or `upright.fetch`.
pub const PIECE_BYTES_MAX: usize = 512 * 1024;
/// Replies larger than this are kept and fetched in pieces.
pub const LARGE_REPLY_BYTES: usize = 256 * 1024;
/// Most bytes of staged commands and kept replies together.
pub const LARGE_BYTES_MAX: usize = 1 << 30;
/// Largest command a gateway may stage: Redis' proto-max-bulk-len plus room for the other
/// arguments.
pub const STAGED_COMMAND_BYTES_MAX: usize = (512 << 20) + (1 << 20);

/// Staged commands and kept replies.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct Large {
    /// Pieces of commands being uploaded, by token.
    staged: BTreeMap<Bytes, BytesMut>,
    /// Encoded replies kept for fetching, by number, with the client whose command made them.
    kept: BTreeMap<u64, (ClientId, Bytes)>,
    next: u64,
    bytes: usize,
}

/// The checkpointed form.
pub(super) type LargeRows = (u64, Vec<(Bytes, Bytes)>, Vec<(u64, ClientId, Bytes)>);

impl Large {
    pub(super) fn rows(&self) -> LargeRows {
        (
            self.next,
            self.staged
                .iter()
                .map(|(t, b)| (t.clone(), Bytes::copy_from_slice(b)))
                .collect(),
            self.kept.iter().map(|(n, (c, b))| (*n, *c, b.clone())).collect(),
        )
    }

    pub(super) fn from_rows((next, staged, kept): LargeRows) -> Large {
        let mut large = Large {
            next,
            ..Large::default()
        };
        for (token, bytes) in staged {
            large.bytes += bytes.len();
            large.staged.insert(token, BytesMut::from(&bytes[..]));
        }
        for (n, client, bytes) in kept {
            large.bytes += bytes.len();
            large.kept.insert(n, (client, bytes));
        }
        large
    }

    /// Keeps `encoded` (a reply too large for an operation) for `client`; its number, or `None`
    /// if the bound is reached.
    pub(super) fn keep(&mut self, client: ClientId, encoded: Bytes) -> Option<u64> {
        if self.bytes + encoded.len() > LARGE_BYTES_MAX {
            return None;
        }
        let n = self.next;
        self.next += 1;
        self.bytes += encoded.len();
        self.kept.insert(n, (client, encoded));
        Some(n)
    }

    /// Drops `client`'s kept replies and the staged commands under other prefixes than `prefix`
    /// (a restarted gateway's leftovers); how many.
    pub(super) fn forget_stale(&mut self, client: ClientId, prefix: &[u8]) -> usize {
        let before = self.staged.len() + self.kept.len();
        let mut freed = 0;
        self.staged.retain(|t, b| {
            let keep = t.starts_with(prefix);
            if !keep {
                freed += b.len();
            }
            keep
        });
        self.kept.retain(|_, (c, b)| {
            let keep = *c != client;
            if !keep {
                freed += b.len();
            }
            keep
        });
        self.bytes -= freed;
        before - self.staged.len() - self.kept.len()
    }
}

fn number(arg: &[u8]) -> Option<u64> {
    parse_i64(arg).and_then(|n| u64::try_from(n).ok())
}

impl RedisStore {
    /// `upright.stage TOKEN OFFSET piece`: appends `piece`, which must start where the staged
    /// bytes end (so that after a refused piece, which drops what was staged, no later piece can
    /// start a command of its own from the middle of the client's bytes).
    pub(super) fn stage(&mut self, token: &Bytes, offset: &[u8], piece: &Bytes) -> Reply {
        if token.is_empty() || token.len() > super::blocking::TOKEN_BYTES_MAX || piece.len() > PIECE_BYTES_MAX {
            return Reply::err("ERR upright: bad staged piece");
        }
        let staged_len = self.large.staged.get(token).map_or(0, |b| b.len());
        if number(offset) != Some(staged_len as u64) {
            self.drop_staged(token);
            return Reply::err("ERR upright: staged piece out of place");
        }
        if staged_len + piece.len() > STAGED_COMMAND_BYTES_MAX {
            self.drop_staged(token);
            return Reply::err("ERR Protocol error: invalid bulk length");
        }
        if self.large.bytes + piece.len() > LARGE_BYTES_MAX {
            self.drop_staged(token);
            return Reply::err("ERR upright: too many large commands in flight");
        }
        self.large.bytes += piece.len();
        self.large
            .staged
            .entry(token.clone())
            .or_default()
            .extend_from_slice(piece);
        Reply::ok()
    }

    fn drop_staged(&mut self, token: &[u8]) {
        if let Some(b) = self.large.staged.remove(token) {
            self.large.bytes -= b.len();
        }
    }

    /// `upright.run TOKEN`: the staged command, run.
    pub(super) fn run_staged(&mut self, token: &[u8]) -> Reply {
        let Some(bytes) = self.large.staged.remove(token) else {
            return Reply::err("ERR upright: nothing staged under this token");
        };
        self.large.bytes -= bytes.len();
        let mut bytes = bytes;
        let argv = match crate::resp::parse(&mut bytes) {
            Ok(Some(argv)) if bytes.is_empty() && !argv[0].starts_with(b"upright.") => argv,
            _ => return Reply::err("ERR upright: malformed staged command"),
        };
        self.apply_one(&argv)
    }

    /// `upright.drop TOKEN`: forgets a staged command (its connection closed).
    pub(super) fn drop_staged_command(&mut self, token: &[u8]) -> Reply {
        self.drop_staged(token);
        Reply::ok()
    }

    /// `upright.fetch N OFFSET LENGTH`: a piece of kept reply N.
    pub(super) fn fetch(&self, a: &[Bytes]) -> Reply {
        let (Some(n), Some(offset), Some(len)) = (number(&a[0]), number(&a[1]), number(&a[2])) else {
            return Reply::err("ERR upright: bad fetch");
        };
        let Some((_, bytes)) = self.large.kept.get(&n) else {
            return Reply::err("ERR upright: no such kept reply");
        };
        let start = (offset as usize).min(bytes.len());
        let end = start
            .saturating_add((len as usize).min(PIECE_BYTES_MAX))
            .min(bytes.len());
        Reply::Bulk(bytes.slice(start..end))
    }

    /// `upright.release N`
    pub(super) fn release(&mut self, n: &[u8]) -> Reply {
        if let Some((_, bytes)) = number(n).and_then(|n| self.large.kept.remove(&n)) {
            self.large.bytes -= bytes.len();
        }
        Reply::ok()
    }

    /// `reply`, or, if it is too large for an operation, the number under which it is kept.
    pub(super) fn bounded(&mut self, reply: Reply) -> Reply {
        if super::reply_size(&reply) <= LARGE_REPLY_BYTES {
            return reply;
        }
        if !self.may_keep_large_reply() {
            return super::selective::unavailable("replies larger than 256 KiB (except to whole-store commands) are");
        }
        let encoded = Bytes::from(upright_core::codec::to_bytes(&reply));
        let len = encoded.len() as u64;
        match self.large.keep(self.caller(), encoded) {
            Some(id) => Reply::Large { id, len },
            None => Reply::err("ERR upright: too many large replies waiting to be read"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::tests::{bulk, cmd};

    fn argv(words: &[&[u8]]) -> Vec<Bytes> {
        words.iter().map(|w| Bytes::copy_from_slice(w)).collect()
    }

    #[test]
    fn a_staged_command_runs_whole_and_a_large_reply_is_fetched_in_pieces() {
        let s = &mut RedisStore::new();
        let value = Bytes::from(vec![b'v'; 3 * PIECE_BYTES_MAX]);
        let command = Bytes::from(crate::resp::encode_command(&[
            Bytes::from_static(b"SET"),
            Bytes::from_static(b"big"),
            value.clone(),
        ]));
        for (i, piece) in command.chunks(PIECE_BYTES_MAX).enumerate() {
            let offset = (i * PIECE_BYTES_MAX).to_string();
            let staged = s.apply(&argv(&[b"upright.stage", b"g.1", offset.as_bytes(), piece]));
            assert_eq!(staged, Reply::ok());
        }
        assert!(s.large.bytes >= command.len());
        assert_eq!(s.apply(&argv(&[b"upright.run", b"g.1"])), Reply::ok());
        assert_eq!(s.large.bytes, 0, "the staged command is gone");
        assert_eq!(cmd(s, "STRLEN big"), Reply::Int(value.len() as i64));
        let Reply::Large { id, len } = s.apply(&argv(&[b"GET", b"big"])) else {
            panic!("a GET this large is kept")
        };
        let mut copy = RedisStore::new();
        upright_core::service::Service::restore(&mut copy, &upright_core::service::Service::checkpoint(s)).unwrap();
        assert_eq!(&copy, s, "kept replies are in the checkpoint");
        let mut encoded = Vec::new();
        while (encoded.len() as u64) < len {
            let offset = encoded.len().to_string();
            let piece = PIECE_BYTES_MAX.to_string();
            let Reply::Bulk(b) = s.apply(&argv(&[
                b"upright.fetch",
                id.to_string().as_bytes(),
                offset.as_bytes(),
                piece.as_bytes(),
            ])) else {
                panic!("a piece")
            };
            encoded.extend_from_slice(&b);
        }
        let reply: Reply = upright_core::codec::from_bytes(&encoded).unwrap();
        assert_eq!(reply, Reply::Bulk(value));
        s.apply(&argv(&[b"upright.release", id.to_string().as_bytes()]));
        assert_eq!(s.large.bytes, 0);
        assert_eq!(cmd(s, "GET small"), Reply::Nil);
        cmd(s, "SET small x");
        assert_eq!(cmd(s, "GET small"), bulk("x"), "small replies are not kept");
    }

    #[test]
    fn staging_is_bounded_and_a_restarted_gateway_drops_its_leftovers() {
        let s = &mut RedisStore::new();
        let piece = vec![b'x'; PIECE_BYTES_MAX + 1];
        assert!(matches!(
            s.apply(&argv(&[b"upright.stage", b"g.1", b"0", &piece])),
            Reply::Error(_)
        ));
        s.apply(&argv(&[b"upright.stage", b"old.1", b"0", b"abc"]));
        s.apply(&argv(&[b"upright.stage", b"new.1", b"0", b"abc"]));
        assert_eq!(s.apply(&argv(&[b"upright.unblock-stale", b"new."])), Reply::Int(1));
        assert!(matches!(s.apply(&argv(&[b"upright.run", b"old.1"])), Reply::Error(_)));
        assert_eq!(s.apply(&argv(&[b"upright.drop", b"new.1"])), Reply::ok());
        assert_eq!(s.large.bytes, 0);
        assert!(matches!(s.apply(&argv(&[b"upright.run", b"new.1"])), Reply::Error(_)));
    }

    /// A piece that does not continue the staged bytes is refused and drops them, so the pieces
    /// after a refused one cannot run a command cut out of the middle of the client's value (one
    /// its user may not be allowed to run).
    #[test]
    fn a_piece_out_of_place_drops_the_staged_command() {
        let s = &mut RedisStore::new();
        let inner = crate::resp::encode_command(&[Bytes::from_static(b"FLUSHALL")]);
        cmd(s, "SET keep me");
        assert_eq!(
            s.apply(&argv(&[b"upright.stage", b"g.1", b"0", b"*3\r\n$3\r\nSET"])),
            Reply::ok()
        );
        assert!(matches!(
            s.apply(&argv(&[b"upright.stage", b"g.1", b"3", b"..."])),
            Reply::Error(e) if e.contains("out of place")
        ));
        assert!(matches!(
            s.apply(&argv(&[b"upright.stage", b"g.1", b"14", &inner])),
            Reply::Error(_)
        ));
        assert!(matches!(s.apply(&argv(&[b"upright.run", b"g.1"])), Reply::Error(_)));
        assert_eq!(s.large.bytes, 0);
        assert_eq!(cmd(s, "GET keep"), bulk("me"));
        // Bytes that are not one whole command do not run.
        s.apply(&argv(&[b"upright.stage", b"g.2", b"0", b"*1\r\n$4\r\nPING\r\n*1\r\n"]));
        assert!(matches!(s.apply(&argv(&[b"upright.run", b"g.2"])), Reply::Error(e) if e.contains("malformed")));
    }
}

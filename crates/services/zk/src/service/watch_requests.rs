//! The requests that manage watches and multiRead: setWatches/setWatches2 (a reconnected client
//! re-states its watches and learns what it missed), addWatch, removeWatches, checkWatches.

use bytes::Bytes;
use upright_core::service::Effects;

use super::{read_multi_ops, reply, write_multi_end, write_multi_error, write_read, ZkService};
use crate::jute::{JuteError, Reader, Writer};
use crate::proto::{op, Code, Op};
use crate::tree::{validate_path, Read};
use crate::watches::{event, Kind};

/// `removeWatches` / `checkWatches` watcher types (`Watcher.WatcherType`).
const WATCHER_CHILDREN: i32 = 1;
const WATCHER_DATA: i32 = 2;
const WATCHER_ANY: i32 = 3;
const WATCHER_PERSISTENT: i32 = 4;
const WATCHER_PERSISTENT_RECURSIVE: i32 = 5;
/// `addWatch` modes (`AddWatchMode`).
const MODE_PERSISTENT: i32 = 0;
const MODE_PERSISTENT_RECURSIVE: i32 = 1;

impl ZkService {
    /// setWatches (`persistent`: setWatches2): the session's watches become exactly the ones
    /// listed; a one-shot watch whose event the client missed (the node changed after
    /// `relativeZxid`, or was created or deleted) fires now instead, as ZooKeeper's
    /// `DataTree.setWatches` does.
    pub(super) fn set_watches(
        &mut self,
        session: i64,
        xid: i32,
        r: &mut Reader<'_>,
        persistent: bool,
        effects: &mut Effects,
    ) -> Bytes {
        let parsed = (|| -> Result<_, JuteError> {
            let relative = r.long()?;
            let (data, exist, child) = (r.strings()?, r.strings()?, r.strings()?);
            let (kept, recursive) = if persistent {
                (r.strings()?, r.strings()?)
            } else {
                (Vec::new(), Vec::new())
            };
            Ok((relative, data, exist, child, kept, recursive))
        })();
        let Ok((relative, data, exist, child, kept, recursive)) = parsed else {
            return reply(xid, self.shown_zxid(), Code::MarshallingError, |_| {});
        };
        if r.remaining() != 0 {
            return reply(xid, self.shown_zxid(), Code::MarshallingError, |_| {});
        }
        self.watches.drop_session(session);
        if self.positions {
            // Each re-stated watch's stream is announced (from before this request's own
            // events, so a missed event fired below comes to a gateway that did not follow
            // the stream yet); persistent-recursive watches are not offered.
            for path in data.iter().chain(&exist).chain(&child).chain(&kept) {
                self.announce_watch(session, path, effects);
            }
        }
        let recursive = if self.positions { Vec::new() } else { recursive };
        let mut missed: Vec<(i32, String)> = Vec::new();
        // In ZooKeeper's order: data, exist, then child watches.
        self.restate(session, data, Kind::Data, relative, &mut missed);
        for path in exist {
            if self.tree.get(&path).is_some() {
                missed.push((event::NODE_CREATED, path));
            } else {
                self.watches.add(session, Kind::Exist, &path);
            }
        }
        self.restate(session, child, Kind::Child, relative, &mut missed);
        for path in kept {
            self.watches.add(session, Kind::Persistent, &path);
        }
        for path in recursive {
            self.watches.add(session, Kind::Recursive, &path);
        }
        for (kind, path) in missed {
            self.push_event(session, kind, &path, effects);
        }
        reply(xid, self.shown_zxid(), Code::Ok, |_| {})
    }

    /// Data or child watches (`kind`) a reconnected client re-states: one on a node that is gone,
    /// or changed after `relative` (its data for a data watch, its children for a child watch),
    /// goes into `missed` with its event; the others are watched again.
    fn restate(
        &mut self,
        session: i64,
        paths: Vec<String>,
        kind: Kind,
        relative: i64,
        missed: &mut Vec<(i32, String)>,
    ) {
        let changed = if kind == Kind::Data {
            event::NODE_DATA_CHANGED
        } else {
            event::NODE_CHILDREN_CHANGED
        };
        for path in paths {
            let Some(node) = self.tree.get(&path) else {
                missed.push((event::NODE_DELETED, path));
                continue;
            };
            let zxid = if kind == Kind::Data {
                node.stat.mzxid
            } else {
                node.stat.pzxid
            };
            if zxid > relative {
                missed.push((changed, path));
            } else {
                self.watches.add(session, kind, &path);
            }
        }
    }

    /// addWatch: a persistent or persistent-recursive watch on `path` (which need not exist).
    pub(super) fn add_watch(&mut self, session: i64, xid: i32, r: &mut Reader<'_>, effects: &mut Effects) -> Bytes {
        let parsed = (|| -> Result<_, JuteError> { Ok((r.string()?, r.int()?)) })();
        let Ok((path, mode)) = parsed else {
            return reply(xid, self.shown_zxid(), Code::MarshallingError, |_| {});
        };
        let kind = match mode {
            MODE_PERSISTENT => Kind::Persistent,
            // Under selective execution the events of a node below go in that node's stream,
            // which no reply announced to the watcher: not offered (docs/ODRC.md).
            MODE_PERSISTENT_RECURSIVE if self.positions => {
                return reply(xid, self.shown_zxid(), Code::Unimplemented, |_| {})
            }
            MODE_PERSISTENT_RECURSIVE => Kind::Recursive,
            _ => return reply(xid, self.shown_zxid(), Code::BadArguments, |_| {}),
        };
        if let Err(code) = validate_path(&path, false) {
            return reply(xid, self.shown_zxid(), code, |_| {});
        }
        if !self.watches.add(session, kind, &path) {
            return reply(xid, self.shown_zxid(), Code::QuotaExceeded, |_| {});
        }
        self.announce_watch(session, &path, effects);
        reply(xid, self.shown_zxid(), Code::Ok, |_| {})
    }

    /// removeWatches (`remove`) or checkWatches: NoWatcher unless the session watches `path`
    /// with a watch of the type asked for.
    pub(super) fn remove_watches(&mut self, session: i64, xid: i32, r: &mut Reader<'_>, remove: bool) -> Bytes {
        let parsed = (|| -> Result<_, JuteError> { Ok((r.string()?, r.int()?)) })();
        let Ok((path, kind)) = parsed else {
            return reply(xid, self.shown_zxid(), Code::MarshallingError, |_| {});
        };
        let kinds: &[Kind] = match kind {
            WATCHER_CHILDREN => &[Kind::Child],
            WATCHER_DATA => &[Kind::Data, Kind::Exist],
            WATCHER_ANY => &[Kind::Child, Kind::Data, Kind::Exist, Kind::Persistent, Kind::Recursive],
            WATCHER_PERSISTENT => &[Kind::Persistent],
            WATCHER_PERSISTENT_RECURSIVE => &[Kind::Recursive],
            _ => return reply(xid, self.shown_zxid(), Code::BadArguments, |_| {}),
        };
        let found = kinds.iter().any(|&k| self.watches.has(session, k, &path));
        if !found {
            return reply(xid, self.shown_zxid(), Code::NoWatcher, |_| {});
        }
        if remove {
            self.watches.remove_kinds(session, &path, kinds);
        }
        reply(xid, self.shown_zxid(), Code::Ok, |_| {})
    }

    /// multiRead: getChildren and getData operations, each answered on its own (an error is that
    /// operation's result, not the whole request's), with the same layout as a multi's results.
    pub(super) fn multi_read(&self, session: i64, xid: i32, r: &mut Reader<'_>) -> Bytes {
        let reads = |opcode, _: &Op| matches!(opcode, op::GET_CHILDREN | op::GET_DATA);
        let Some(ops) = read_multi_ops(r, reads) else {
            return reply(xid, self.shown_zxid(), Code::MarshallingError, |_| {});
        };
        let auth = self
            .sessions
            .get(&session)
            .map(|s| s.auth.as_slice())
            .unwrap_or_default();
        reply(xid, self.shown_zxid(), Code::Ok, |out| {
            for (opcode, operation) in &ops {
                match self.tree.read(operation, session, auth) {
                    Ok(read @ (Read::Data(..) | Read::Children(..))) => {
                        out.int(*opcode);
                        out.boolean(false);
                        out.int(0);
                        write_read(out, *opcode, read);
                    }
                    Ok(_) => write_multi_error(out, Code::SystemError), // not for these two reads
                    Err(code) => write_multi_error(out, code),
                }
            }
            write_multi_end(out);
        })
    }
}

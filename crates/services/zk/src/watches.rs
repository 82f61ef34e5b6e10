//! Watches as agreed state: which session watches what, and which sessions an event reaches.
//! One-shot data, exists and child watches go when they fire; persistent and
//! persistent-recursive watches (addWatch) stay until removed or their session ends.

use std::collections::{BTreeMap, BTreeSet};

use crate::tree::parent_of;

/// Most watches one session may hold (each kind counted); a request that would pass it is
/// refused, so no session can grow the agreed state without bound.
pub const WATCHES_PER_SESSION_MAX: usize = 65_536;

/// Watcher event types (`Watcher.Event.EventType`).
#[allow(missing_docs)]
pub mod event {
    pub const NONE: i32 = -1;
    pub const NODE_CREATED: i32 = 1;
    pub const NODE_DELETED: i32 = 2;
    pub const NODE_DATA_CHANGED: i32 = 3;
    pub const NODE_CHILDREN_CHANGED: i32 = 4;
}

/// The kinds of watch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub enum Kind {
    /// getData, or exists on a node that exists (fires on change, delete).
    Data,
    /// exists on a node that does not exist (fires on create); kept with the data watches, as
    /// ZooKeeper keeps them.
    Exist,
    /// getChildren (fires on a child created or deleted, or the node deleted).
    Child,
    /// addWatch PERSISTENT: every event on the node, kept.
    Persistent,
    /// addWatch PERSISTENT_RECURSIVE: created, deleted and changed on the node and below, kept.
    Recursive,
}

/// What changed in the tree (the input of [`Watches::fire`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// A node was created.
    Created(String),
    /// A node was deleted.
    Deleted(String),
    /// A node's data was set.
    DataChanged(String),
}

/// Every watch, by kind and path.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Watches {
    by_path: BTreeMap<(Kind, String), BTreeSet<i64>>,
    /// Each session's watches.
    by_session: BTreeMap<i64, BTreeSet<(Kind, String)>>,
}

impl Watches {
    /// Adds a watch; `false` if the session holds [`WATCHES_PER_SESSION_MAX`] already.
    pub fn add(&mut self, session: i64, kind: Kind, path: &str) -> bool {
        let mine = self.by_session.entry(session).or_default();
        let key = (kind, path.to_string());
        if !mine.contains(&key) && mine.len() >= WATCHES_PER_SESSION_MAX {
            return false;
        }
        mine.insert(key.clone());
        self.by_path.entry(key).or_default().insert(session);
        true
    }

    /// Adds a one-shot watch without the per-session bound (under selective execution's rules,
    /// where a session's count across nodes is not state a request on one node may read; a path
    /// holds at most one watch of a kind per session, so its watches are bounded by the
    /// sessions).
    pub fn add_unbounded(&mut self, session: i64, kind: Kind, path: &str) {
        let key = (kind, path.to_string());
        self.by_session.entry(session).or_default().insert(key.clone());
        self.by_path.entry(key).or_default().insert(session);
    }

    /// The sessions watching each path in `from..to` with `kind`, in path order.
    pub fn watching_in<'a>(
        &'a self,
        kind: Kind,
        from: &str,
        to: &str,
    ) -> impl Iterator<Item = (&'a String, &'a BTreeSet<i64>)> + 'a {
        self.by_path
            .range((kind, from.to_string())..(kind, to.to_string()))
            .map(|((_, path), sessions)| (path, sessions))
    }

    /// Replaces the sessions watching `path` with `kind` (an object's certified state under
    /// selective execution).
    pub fn set_watching(&mut self, kind: Kind, path: &str, sessions: BTreeSet<i64>) {
        let key = (kind, path.to_string());
        for session in self.by_path.remove(&key).into_iter().flatten() {
            if let Some(mine) = self.by_session.get_mut(&session) {
                mine.remove(&key);
                if mine.is_empty() {
                    self.by_session.remove(&session);
                }
            }
        }
        for &session in &sessions {
            self.by_session.entry(session).or_default().insert(key.clone());
        }
        if !sessions.is_empty() {
            self.by_path.insert(key, sessions);
        }
    }

    /// Whether `session` watches `path` with `kind`.
    pub fn has(&self, session: i64, kind: Kind, path: &str) -> bool {
        self.by_session
            .get(&session)
            .is_some_and(|s| s.contains(&(kind, path.to_string())))
    }

    fn remove(&mut self, session: i64, kind: Kind, path: &str) {
        let key = (kind, path.to_string());
        if let Some(sessions) = self.by_path.get_mut(&key) {
            sessions.remove(&session);
            if sessions.is_empty() {
                self.by_path.remove(&key);
            }
        }
        if let Some(mine) = self.by_session.get_mut(&session) {
            mine.remove(&key);
            if mine.is_empty() {
                self.by_session.remove(&session);
            }
        }
    }

    /// Removes `session`'s watches of the given kinds on `path`; how many.
    pub fn remove_kinds(&mut self, session: i64, path: &str, kinds: &[Kind]) -> usize {
        let mut n = 0;
        for &kind in kinds {
            if self.has(session, kind, path) {
                self.remove(session, kind, path);
                n += 1;
            }
        }
        n
    }

    /// Drops every watch of `session` (it closed or expired).
    pub fn drop_session(&mut self, session: i64) {
        for (kind, path) in self.by_session.remove(&session).into_iter().flatten() {
            let key = (kind, path);
            if let Some(sessions) = self.by_path.get_mut(&key) {
                sessions.remove(&session);
                if sessions.is_empty() {
                    self.by_path.remove(&key);
                }
            }
        }
    }

    /// The sessions watching `path` with `kind`; one-shot watches are removed.
    fn take(&mut self, kind: Kind, path: &str, out: &mut BTreeSet<i64>) {
        let key = (kind, path.to_string());
        let Some(sessions) = self.by_path.get(&key) else { return };
        out.extend(sessions.iter().copied());
        if matches!(kind, Kind::Persistent | Kind::Recursive) {
            return;
        }
        for session in self.by_path.remove(&key).into_iter().flatten() {
            if let Some(mine) = self.by_session.get_mut(&session) {
                mine.remove(&key);
                if mine.is_empty() {
                    self.by_session.remove(&session);
                }
            }
        }
    }

    /// The events `change` causes: `(session, event type, path)`, each session at most once per
    /// event, in session order; the one-shot watches that fired are gone.
    pub fn fire(&mut self, change: &Change) -> Vec<(i64, i32, String)> {
        let (path, on_node, on_parent) = match change {
            Change::Created(p) => (p, event::NODE_CREATED, true),
            Change::Deleted(p) => (p, event::NODE_DELETED, true),
            Change::DataChanged(p) => (p, event::NODE_DATA_CHANGED, false),
        };
        let mut node = BTreeSet::new();
        self.take(Kind::Data, path, &mut node);
        self.take(Kind::Exist, path, &mut node);
        self.take(Kind::Persistent, path, &mut node);
        if on_node == event::NODE_DELETED {
            self.take(Kind::Child, path, &mut node);
        }
        // Recursive watches on the node and every ancestor.
        let mut at = path.as_str();
        loop {
            self.take(Kind::Recursive, at, &mut node);
            if at == "/" {
                break;
            }
            at = parent_of(at);
        }
        let mut events: Vec<(i64, i32, String)> = node.into_iter().map(|s| (s, on_node, path.clone())).collect();
        if on_parent && path != "/" {
            let parent = parent_of(path);
            let mut children = BTreeSet::new();
            self.take(Kind::Child, parent, &mut children);
            self.take(Kind::Persistent, parent, &mut children);
            events.extend(
                children
                    .into_iter()
                    .map(|s| (s, event::NODE_CHILDREN_CHANGED, parent.to_string())),
            );
        }
        events
    }

    /// How many watches there are in all.
    pub fn len(&self) -> usize {
        self.by_session.values().map(BTreeSet::len).sum()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.by_session.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_shot_watches_fire_once_and_persistent_ones_stay() {
        let mut w = Watches::default();
        w.add(1, Kind::Data, "/a");
        w.add(2, Kind::Persistent, "/a");
        w.add(3, Kind::Child, "/");
        w.add(4, Kind::Recursive, "/");
        let events = w.fire(&Change::DataChanged("/a".into()));
        assert_eq!(
            events,
            [
                (1, event::NODE_DATA_CHANGED, "/a".to_string()),
                (2, event::NODE_DATA_CHANGED, "/a".to_string()),
                (4, event::NODE_DATA_CHANGED, "/a".to_string()),
            ]
        );
        assert!(!w.has(1, Kind::Data, "/a"), "a one-shot watch is gone once fired");
        let events = w.fire(&Change::Deleted("/a".into()));
        assert_eq!(
            events,
            [
                (2, event::NODE_DELETED, "/a".to_string()),
                (4, event::NODE_DELETED, "/a".to_string()),
                (3, event::NODE_CHILDREN_CHANGED, "/".to_string()),
            ]
        );
        assert!(
            w.fire(&Change::Created("/b".into())).iter().all(|e| e.0 == 4),
            "child watch was one-shot"
        );
        w.add(5, Kind::Exist, "/c");
        w.add(5, Kind::Recursive, "/c");
        assert_eq!(
            w.fire(&Change::Created("/c/d".into())).len(),
            2,
            "recursive on /c and on /"
        );
        assert_eq!(
            w.fire(&Change::Created("/c".into()))[0],
            (4, event::NODE_CREATED, "/c".to_string())
        );
        w.drop_session(4);
        w.drop_session(2);
        assert_eq!(w.len(), 1, "5's recursive watch");
        assert_eq!(w.remove_kinds(5, "/c", &[Kind::Recursive, Kind::Data]), 1);
        assert!(w.is_empty());
    }

    #[test]
    fn a_session_holds_a_bounded_number_of_watches() {
        let mut w = Watches::default();
        for i in 0..WATCHES_PER_SESSION_MAX {
            assert!(w.add(7, Kind::Data, &format!("/n{i}")));
        }
        assert!(!w.add(7, Kind::Data, "/one-more"));
        assert!(w.add(7, Kind::Data, "/n0"), "again on a watched path is no new watch");
        assert!(
            w.add(8, Kind::Data, "/one-more"),
            "another session is not limited by it"
        );
    }
}

//! ODRC's selector (docs/ODRC.md): which agreed requests this execution member runs now, which
//! it stores, and which stored ones a request needs run first.
//!
//! Each object is maintained by `r + 1` of the `n_exec` execution members ([`maintainers`]). The
//! selector sees every agreed request in order ([`Selector::insert`]): one that touches an
//! object this member maintains, or whose objects are unknown (global), runs here, after the
//! stored requests it depends on (those touching its objects that this member does not maintain,
//! and transitively theirs: ODRC's `update_objects`, Fig. 3); any other request is stored. A
//! stored request runs when a later request needs it or when it is forced ([`Selector::force`]:
//! a client's vote did not complete).
//!
//! Garbage collection differs from the paper's: stored requests are dropped only through a
//! sequence number at which *every* object has a certified state ([`Selector::checkpoint_stable`],
//! the whole-state checkpoint), and an object whose dropped requests never ran here is restored
//! from that checkpoint before the next replay that needs it ([`Update::restore`]). ODRC drops a
//! request once each of its objects has a stable checkpoint at or after it, object by object;
//! with requests on several objects that loses states a replay still needs (a stored `{a, b}` at
//! 2 kept for `b` must read `a` as of 2, but `a`'s requests before it were dropped against `a`'s
//! checkpoint at 3, and restoring that checkpoint gives `a` as of 3).
//!
//! Pure and deterministic: it decides, the execution stage runs. A correct selector never runs a
//! request twice (a stored request leaves the store when it is handed out) and never one that
//! was not agreed (only what [`Selector::insert`] received can be handed out).

use std::collections::{BTreeMap, BTreeSet};

use bytes::Bytes;

use crate::ids::SeqNo;

/// Where an agreed request stands in the agreed order: its batch and its index in the batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Position {
    /// The batch.
    pub seqno: SeqNo,
    /// The request's index in the batch.
    pub index: u32,
}

/// The objects a request may touch: named, or unknown (every object).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Objects {
    /// Unknown: the request may touch anything (it runs everywhere, after everything).
    All,
    /// These (at least one).
    These(BTreeSet<Bytes>),
}

impl Objects {
    /// Whether the two sets share an object (`All` shares with anything).
    fn meets(&self, others: &Objects) -> bool {
        match (self, others) {
            (Objects::All, _) | (_, Objects::All) => true,
            (Objects::These(a), Objects::These(b)) => a.iter().any(|o| b.contains(o)),
        }
    }

    fn extend(&mut self, others: &Objects) {
        match (&mut *self, others) {
            (Objects::All, _) => {}
            (_, Objects::All) => *self = Objects::All,
            (Objects::These(a), Objects::These(b)) => a.extend(b.iter().cloned()),
        }
    }
}

/// The execution members that maintain object `name` (placed by `placement`, the object itself
/// unless the service groups objects): `copies` consecutive members from a hash of the
/// placement, modulo `n_exec`.
pub fn maintainers(placement: &[u8], n_exec: usize, copies: usize) -> Vec<usize> {
    let n = n_exec.max(1);
    let digest = blake3::Hasher::new()
        .update(b"upright odrc placement v1")
        .update(placement)
        .finalize();
    let first = u64::from_le_bytes(digest.as_bytes()[..8].try_into().expect("8 bytes")) % n as u64;
    (0..copies.min(n)).map(|i| (first as usize + i) % n).collect()
}

/// A stored request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stored<T> {
    /// Its position in the agreed order.
    pub at: Position,
    /// The objects it may touch.
    pub objects: Objects,
    /// What the execution stage needs to run it (the request and its batch's context).
    pub item: T,
}

/// What must run before a request (or to bring objects up to date): objects to restore from the
/// stable checkpoint, then stored requests, in agreed order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Update<T> {
    /// Objects to restore from the stable checkpoint at [`Selector::base`] first (requests on
    /// them that never ran here were dropped).
    pub restore: Vec<Bytes>,
    /// Stored requests to run, oldest first (all after the stable checkpoint).
    pub replay: Vec<Stored<T>>,
}

impl<T> Default for Update<T> {
    fn default() -> Update<T> {
        Update {
            restore: Vec::new(),
            replay: Vec::new(),
        }
    }
}

/// What [`Selector::insert`] decided.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision<T> {
    /// Run the update, then the request.
    Run(Update<T>),
    /// Stored.
    Stored,
}

/// The selector of one execution member.
#[derive(Debug)]
pub struct Selector<T> {
    me: usize,
    n_exec: usize,
    copies: usize,
    /// Skipped requests by position (ODRC's `R_store`), all after `base`.
    store: BTreeMap<Position, Stored<T>>,
    /// The newest stable whole-state checkpoint: every object has a certified state there.
    base: SeqNo,
    /// Objects with dropped requests that never ran here: restored from `base` before use.
    lost: BTreeSet<Bytes>,
    /// How each object is placed (the service's grouping).
    placement: fn(&[u8]) -> Bytes,
}

fn same(object: &[u8]) -> Bytes {
    Bytes::copy_from_slice(object)
}

impl<T> Selector<T> {
    /// Member `me` of `n_exec`, each object kept by `copies` (`r + 1`) members, objects placed by
    /// themselves.
    pub fn new(me: usize, n_exec: usize, copies: usize) -> Selector<T> {
        Selector::with_placement(me, n_exec, copies, same)
    }

    /// [`Selector::new`] with objects placed by `placement` (ODRC's locality policy: objects
    /// with the same placement have the same maintainers).
    pub fn with_placement(me: usize, n_exec: usize, copies: usize, placement: fn(&[u8]) -> Bytes) -> Selector<T> {
        Selector {
            me,
            n_exec,
            copies,
            store: BTreeMap::new(),
            base: SeqNo(0),
            lost: BTreeSet::new(),
            placement,
        }
    }

    /// Whether this member maintains `object`.
    pub fn maintains(&self, object: &[u8]) -> bool {
        maintainers(&(self.placement)(object), self.n_exec, self.copies).contains(&self.me)
    }

    /// `(me, n_exec, copies)`.
    pub fn shape(&self) -> (usize, usize, usize) {
        (self.me, self.n_exec, self.copies)
    }

    /// Stored requests.
    pub fn stored(&self) -> usize {
        self.store.len()
    }

    /// The newest stable checkpoint restores start from.
    pub fn base(&self) -> SeqNo {
        self.base
    }

    /// The next agreed request, at `at` (after every position inserted before), touching
    /// `objects`.
    pub fn insert(&mut self, at: Position, objects: Objects, item: T) -> Decision<T> {
        let (me, n_exec, copies, placement) = (self.me, self.n_exec, self.copies, self.placement);
        self.insert_by(at, objects, item, |o| {
            maintainers(&placement(o), n_exec, copies).contains(&me)
        })
    }

    /// [`Selector::insert`], with whether this member maintains an object said by `maintains`
    /// (a service's own placement, [`crate::service::Service::placement`]).
    pub fn insert_by(
        &mut self,
        at: Position,
        objects: Objects,
        item: T,
        maintains: impl Fn(&[u8]) -> bool,
    ) -> Decision<T> {
        let foreign = match &objects {
            Objects::All => Some(Objects::All),
            Objects::These(set) => {
                // One placement hash per object.
                let (mine, foreign): (Vec<&Bytes>, Vec<&Bytes>) = set.iter().partition(|o| maintains(o));
                (!mine.is_empty()).then(|| Objects::These(foreign.into_iter().cloned().collect()))
            }
        };
        match foreign {
            Some(foreign) => Decision::Run(self.update(foreign, at)),
            None => {
                self.store.insert(at, Stored { at, objects, item });
                Decision::Stored
            }
        }
    }

    /// Forces the stored request at `at` to run (with what it needs before it), if it is still
    /// stored; `None` if it ran already, was dropped, or was never inserted here.
    pub fn force(&mut self, at: Position) -> Option<Update<T>> {
        let stored = self.store.remove(&at)?;
        let mut update = self.update(stored.objects.clone(), at);
        update.replay.push(stored);
        Some(update)
    }

    /// Brings `objects` up to date as of just before `before`: ODRC's `update_objects`. Walks back
    /// through the stored requests before `before`, taking every one that touches the set and
    /// adding its objects; lists the lost objects among them (to restore from the checkpoint
    /// first); hands out the taken requests in order.
    pub fn update(&mut self, objects: Objects, before: Position) -> Update<T> {
        let mut wanted = objects;
        if matches!(&wanted, Objects::These(set) if set.is_empty()) {
            return Update::default();
        }
        let mut taken = Vec::new();
        for (at, stored) in self.store.range(..before).rev() {
            if stored.objects.meets(&wanted) {
                taken.push(*at);
                wanted.extend(&stored.objects);
            }
        }
        let replay = taken
            .iter()
            .rev()
            .map(|at| self.store.remove(at).expect("taken from the store"))
            .collect();
        let restore = match &wanted {
            Objects::All => std::mem::take(&mut self.lost).into_iter().collect(),
            Objects::These(set) => set.iter().filter(|o| self.lost.remove(*o)).cloned().collect(),
        };
        Update { restore, replay }
    }

    /// The stored requests at or before `seqno`, oldest first, taken out of the store (to run
    /// them all: every object is then up to date as of `seqno`).
    pub fn take_through(&mut self, seqno: SeqNo) -> Vec<Stored<T>> {
        let later = self.store.split_off(&Position {
            seqno: seqno.next(),
            index: 0,
        });
        std::mem::replace(&mut self.store, later).into_values().collect()
    }

    /// Every stored request, oldest first.
    pub fn stored_requests(&self) -> impl Iterator<Item = &Stored<T>> {
        self.store.values()
    }

    /// The stored requests at or before `seqno`, oldest first (still stored).
    pub fn stored_through(&self, seqno: SeqNo) -> impl Iterator<Item = &Stored<T>> {
        self.store
            .range(
                ..Position {
                    seqno: seqno.next(),
                    index: 0,
                },
            )
            .map(|(_, stored)| stored)
    }

    /// `objects` and every object that shares a stored request at or before `seqno` with one of
    /// them, transitively: the set whose requests must all be replayed to bring it up to date
    /// as of `seqno` without touching any object outside it.
    pub fn closure_through(&self, seqno: SeqNo, objects: &BTreeSet<Bytes>) -> BTreeSet<Bytes> {
        let mut closure = objects.clone();
        loop {
            let before = closure.len();
            for stored in self.stored_through(seqno) {
                if let Objects::These(set) = &stored.objects {
                    if set.iter().any(|o| closure.contains(o)) {
                        closure.extend(set.iter().cloned());
                    }
                }
            }
            if closure.len() == before {
                return closure;
            }
        }
    }

    /// The stored requests at or before `seqno` that touch `objects`, oldest first, taken out of
    /// the store.
    pub fn take_touching_through(&mut self, seqno: SeqNo, objects: &BTreeSet<Bytes>) -> Vec<Stored<T>> {
        let positions: Vec<Position> = self
            .stored_through(seqno)
            .filter(|s| match &s.objects {
                Objects::These(set) => set.iter().any(|o| objects.contains(o)),
                Objects::All => true,
            })
            .map(|s| s.at)
            .collect();
        positions
            .iter()
            .map(|at| self.store.remove(at).expect("listed above"))
            .collect()
    }

    /// Every object the stored requests at or before `seqno` touch was brought to its state as
    /// of `seqno` by other means (certified object checkpoints installed): those requests are
    /// dropped, and nothing is lost.
    pub fn discard_through(&mut self, seqno: SeqNo) {
        drop(self.take_through(seqno));
        self.base = self.base.max(seqno);
    }

    /// Every object has a certified state at `seqno` (a stable whole-state checkpoint): stored
    /// requests at or before it are dropped, and their objects are lost here until restored.
    pub fn checkpoint_stable(&mut self, seqno: SeqNo) {
        if seqno <= self.base {
            return;
        }
        self.base = seqno;
        let later = self.store.split_off(&Position {
            seqno: seqno.next(),
            index: 0,
        });
        for stored in std::mem::replace(&mut self.store, later).into_values() {
            match stored.objects {
                Objects::These(set) => self.lost.extend(set),
                Objects::All => unreachable!("a global request runs everywhere"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seqno: u64, index: u32) -> Position {
        Position {
            seqno: SeqNo(seqno),
            index,
        }
    }

    /// The items of an update's replay, in order.
    fn items<T: Copy>(update: &Update<T>) -> Vec<T> {
        update.replay.iter().map(|r| r.item).collect()
    }

    fn objs(names: &[&str]) -> Objects {
        Objects::These(names.iter().map(|n| Bytes::copy_from_slice(n.as_bytes())).collect())
    }

    /// An object name that `member` maintains and `other` does not (n_exec 3, 2 copies).
    fn kept_by(member: usize, other: usize) -> String {
        (0..)
            .map(|i| format!("o{i}"))
            .find(|o| {
                let m = maintainers(o.as_bytes(), 3, 2);
                m.contains(&member) && !m.contains(&other)
            })
            .expect("some object")
    }

    #[test]
    fn every_object_has_r_plus_one_distinct_maintainers_spread_over_the_members() {
        let mut load = [0usize; 5];
        for i in 0..5000 {
            let m = maintainers(format!("key{i}").as_bytes(), 5, 2);
            assert_eq!(m.len(), 2);
            assert_ne!(m[0], m[1]);
            for x in m {
                load[x] += 1;
            }
        }
        // 2000 each on average.
        assert!(load.iter().all(|&l| (1700..2300).contains(&l)), "{load:?}");
        assert_eq!(maintainers(b"k", 3, 5).len(), 3, "never more copies than members");
    }

    #[test]
    fn a_request_on_an_object_kept_elsewhere_is_stored_and_a_later_cross_border_one_replays_it() {
        let mine = kept_by(0, 2);
        let theirs = kept_by(2, 0);
        let mut s: Selector<&str> = Selector::new(0, 3, 2);
        assert!(s.maintains(mine.as_bytes()) && !s.maintains(theirs.as_bytes()));
        assert_eq!(s.insert(at(1, 0), objs(&[&theirs]), "w1"), Decision::Stored);
        assert_eq!(
            s.insert(at(1, 1), objs(&[&mine]), "m1"),
            Decision::Run(Update::default())
        );
        assert_eq!(s.stored(), 1);
        // A request on both: the stored write runs first, then it.
        let Decision::Run(update) = s.insert(at(2, 0), objs(&[&mine, &theirs]), "x") else {
            panic!("runs here")
        };
        assert_eq!(items(&update), vec!["w1"]);
        assert!(update.restore.is_empty());
        assert_eq!(s.stored(), 0, "handed out once");
        assert_eq!(s.force(at(1, 0)), None, "never twice");
    }

    #[test]
    fn the_walk_back_follows_dependencies_transitively_and_keeps_the_agreed_order() {
        let mine = kept_by(0, 2);
        let a = kept_by(2, 0);
        let b = (0..)
            .map(|i| format!("b{i}"))
            .find(|o| !maintainers(o.as_bytes(), 3, 2).contains(&0))
            .unwrap();
        let c = (0..)
            .map(|i| format!("c{i}"))
            .find(|o| !maintainers(o.as_bytes(), 3, 2).contains(&0))
            .unwrap();
        let mut s: Selector<&str> = Selector::new(0, 3, 2);
        s.insert(at(1, 0), objs(&[&b]), "b1");
        s.insert(at(1, 1), objs(&[&c]), "c1 (unrelated)");
        s.insert(at(2, 0), objs(&[&a, &b]), "ab");
        s.insert(at(3, 0), objs(&[&a]), "a1");
        let Decision::Run(update) = s.insert(at(4, 0), objs(&[&mine, &a]), "x") else {
            panic!()
        };
        // a1 needs a; "ab" wrote a, so b must be current for it: b1 too. c1 stays stored.
        assert_eq!(items(&update), vec!["b1", "ab", "a1"]);
        assert_eq!(s.stored(), 1);
    }

    #[test]
    fn a_global_request_runs_everywhere_after_everything_stored() {
        let theirs = kept_by(2, 0);
        let mut s: Selector<u32> = Selector::new(0, 3, 2);
        s.insert(at(1, 0), objs(&[&theirs]), 1);
        s.insert(at(1, 1), objs(&[&theirs]), 2);
        let Decision::Run(update) = s.insert(at(2, 0), Objects::All, 3) else {
            panic!()
        };
        assert_eq!(items(&update), vec![1, 2]);
        assert_eq!(s.stored(), 0);
    }

    #[test]
    fn a_stable_checkpoint_drops_what_it_covers_and_an_update_restores_the_objects_first() {
        let mine = kept_by(0, 2);
        let theirs = kept_by(2, 0);
        let mut s: Selector<u32> = Selector::new(0, 3, 2);
        for i in 1..=5 {
            s.insert(at(i, 0), objs(&[&theirs]), i as u32);
        }
        s.checkpoint_stable(SeqNo(3));
        assert_eq!(s.stored(), 2, "1-3 dropped");
        assert_eq!(s.base(), SeqNo(3));
        let Decision::Run(update) = s.insert(at(6, 0), objs(&[&mine, &theirs]), 6) else {
            panic!()
        };
        assert_eq!(update.restore, vec![Bytes::from(theirs.clone())]);
        assert_eq!(items(&update), vec![4, 5]);
        // Current now: not restored again.
        let Decision::Run(again) = s.insert(at(7, 0), objs(&[&mine, &theirs]), 7) else {
            panic!()
        };
        assert!(again.restore.is_empty() && again.replay.is_empty());
    }

    #[test]
    fn forcing_a_stored_request_runs_its_dependencies_first_and_only_once() {
        let theirs = kept_by(2, 0);
        let mut s: Selector<u32> = Selector::new(0, 3, 2);
        s.insert(at(1, 0), objs(&[&theirs]), 1);
        s.insert(at(2, 0), objs(&[&theirs]), 2);
        let forced = s.force(at(2, 0)).expect("stored");
        assert_eq!(items(&forced), vec![1, 2]);
        assert_eq!(s.force(at(1, 0)), None);
        assert_eq!(s.force(at(9, 9)), None, "never inserted");
    }

    /// The selector against a reference that runs every request on one copy: objects are logs,
    /// a request appends its id to each of its objects and answers what they held before. Every
    /// answer a member gives equals the reference's, each member runs a request at most once,
    /// and after a global request every member's copy equals the reference.
    mod model {
        use super::*;
        use proptest::prelude::*;

        type State = BTreeMap<Bytes, Vec<u32>>;
        /// A member: its selector, its copy of the objects, the requests it ran.
        type Member = (Selector<(u32, Objects)>, State, BTreeSet<u32>);

        fn apply(state: &mut State, objects: &Objects, id: u32) -> Vec<Vec<u32>> {
            let Objects::These(set) = objects else {
                return state.values().cloned().collect();
            };
            set.iter()
                .map(|o| {
                    let log = state.entry(o.clone()).or_default();
                    let before = log.clone();
                    log.push(id);
                    before
                })
                .collect()
        }

        /// Applies `update` to a member: restores its objects from the certified `snapshot`,
        /// then runs the replay (each request at most once).
        fn apply_update(
            state: &mut State,
            ran: &mut BTreeSet<u32>,
            update: Update<(u32, Objects)>,
            snapshot: &State,
        ) -> Result<(), TestCaseError> {
            for o in &update.restore {
                match snapshot.get(o).cloned() {
                    Some(log) => state.insert(o.clone(), log),
                    None => state.remove(o),
                };
            }
            for stored in update.replay {
                let (id, objects) = stored.item;
                prop_assert!(ran.insert(id), "request {} ran twice", id);
                apply(state, &objects, id);
            }
            Ok(())
        }

        fn objects_of(picks: &[u8]) -> Objects {
            Objects::These(picks.iter().map(|p| Bytes::from(format!("o{}", p % 8))).collect())
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(256))]
            #[test]
            fn members_answer_as_the_reference_and_converge(
                n_exec in 3usize..6,
                batches in proptest::collection::vec(
                    (proptest::collection::vec(proptest::collection::vec(any::<u8>(), 1..4), 1..4), any::<bool>()),
                    1..30,
                ),
            ) {
                let copies = 2;
                let mut reference = State::new();
                // The certified states by checkpoint: the initial one is empty.
                let mut snapshots: BTreeMap<SeqNo, State> = BTreeMap::from([(SeqNo(0), State::new())]);
                let mut members: Vec<Member> =
                    (0..n_exec).map(|m| (Selector::new(m, n_exec, copies), State::new(), BTreeSet::new())).collect();
                let mut id = 0u32;
                for (b, (requests, checkpoint)) in batches.iter().enumerate() {
                    let seqno = SeqNo(b as u64 + 1);
                    for (index, picks) in requests.iter().enumerate() {
                        id += 1;
                        let objects = objects_of(picks);
                        let want = apply(&mut reference, &objects, id);
                        let at = Position { seqno, index: index as u32 };
                        let mut ran_by = 0;
                        for (selector, state, ran) in members.iter_mut() {
                            if let Decision::Run(update) = selector.insert(at, objects.clone(), (id, objects.clone())) {
                                apply_update(state, ran, update, &snapshots[&selector.base()])?;
                                prop_assert!(ran.insert(id), "request {} ran twice", id);
                                let got = apply(state, &objects, id);
                                prop_assert_eq!(&got, &want, "request {}", id);
                                ran_by += 1;
                            }
                        }
                        prop_assert!(ran_by >= copies.min(n_exec), "request {} ran on {} members", id, ran_by);
                    }
                    if *checkpoint {
                        snapshots.insert(seqno, reference.clone());
                        for (selector, ..) in members.iter_mut() {
                            selector.checkpoint_stable(seqno);
                        }
                    }
                }
                for (selector, state, ran) in members.iter_mut() {
                    let update = selector.update(Objects::All, Position { seqno: SeqNo(u64::MAX), index: 0 });
                    apply_update(state, ran, update, &snapshots[&selector.base()])?;
                    prop_assert_eq!(&*state, &reference);
                    prop_assert_eq!(selector.stored(), 0);
                }
            }
        }
    }
}

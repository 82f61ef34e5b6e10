//! Selective execution at an execution member (ODRC; docs/ODRC.md): each agreed request runs
//! only on the members that maintain an object it touches (`r + 1` per object,
//! [`super::selector::maintainers`]); the others store it in the [`Selector`] and run it when a
//! later request they do run needs it, or when its client's vote did not complete and the
//! request is forced (a RETRANSMIT). Requests whose objects the service does not know run
//! everywhere, after every stored request.
//!
//! At each checkpoint the members bring every object up to date, so that their states, and so
//! the agreed checkpoint digest, are equal again: each sends OBJECT-CP with the state of the
//! objects it maintains that requests touched in the interval and its replies to them (each
//! client's newest); a member that skipped requests installs each object they touched once the
//! object's `r + 1` maintainers sent the same state, and takes each skipped reply on `r + 1`
//! matching copies. Execution waits at the checkpoint for that. Objects whose maintainers
//! disagree (one lies), or include a suspected one (silent at an earlier checkpoint), or that
//! are still missing after two retry ticks, are brought up to date by replaying the stored
//! requests that touch them instead (`Selector::closure_through`). Then the member drops the
//! stored requests and takes the checkpoint as without selective execution: every member's
//! state and reply cache are then the same. Replies travel in full, not as digests, so that a reply stays
//! available when every member that executed its request restarts from the checkpoint.
//!
//! Pushes (docs/ODRC.md, "Per-object push streams"): a push the service emits on an object the
//! request declares ([`Effects::push_on`]) goes in the client's stream on that object, numbered
//! whenever a member runs the request (live, replayed or forced: the selector runs it only on
//! current objects) and carried with the object's state in OBJECT-CP, so every member numbers it
//! alike; a global request's pushes go in the client's own stream (every member runs it after
//! everything). Other pushes would be numbered differently on different members and are dropped
//! (counted `pushes_dropped_selective`): a request's pushes that name no object, a wake-up's
//! (members wake at different batches). The reply to a request that announced streams
//! ([`Effects::announce_stream`]) carries their positions ([`crate::message::wrap_announced`]).

use std::collections::{BTreeMap, BTreeSet};

use bytes::Bytes;

use super::reply_cache::CachedResult;
use super::selector::{maintainers, Decision, Objects, Position, Selector, Stored, Update};
use super::ExecStage;
use crate::config::ClusterConfig;
use crate::ids::{ClientId, Principal, ReplicaId, RequestId, SeqNo};
use crate::limits::OBJECT_CP_BYTES_MAX;
use crate::message::{wrap_announced, Message, PushStream, SealFor};
use crate::service::{BatchContext, Effects, ServiceRequest};
use crate::stage::Action;

/// A request this member skipped: what running it later needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Skipped {
    request: ServiceRequest,
    context: BatchContext,
}

/// An object's copy in an OBJECT-CP: its state (`None`: absent) and its push streams.
type ObjectCopy = (Option<Bytes>, Vec<(ClientId, PushStream)>);

/// One member's OBJECT-CP for a checkpoint.
#[derive(Debug, Default)]
struct Received {
    objects: BTreeMap<Bytes, ObjectCopy>,
    replies: BTreeMap<(ClientId, RequestId), Bytes>,
}

/// A checkpoint waiting for certified objects and replies.
#[derive(Debug)]
struct Sync {
    seqno: SeqNo,
    objects: BTreeSet<Bytes>,
    replies: BTreeSet<(ClientId, RequestId)>,
    /// Retry ticks since it started: the first asks the others again, the second gives up
    /// waiting and replays.
    ticks: u32,
}

/// The selective-execution state of an execution member.
#[derive(Debug)]
pub(super) struct Selective {
    selector: Selector<Skipped>,
    /// Objects this member maintains that requests it ran touched since the last checkpoint.
    dirty: BTreeSet<Bytes>,
    /// Per client, the newest request it ran at its turn since then, with the reply.
    given: BTreeMap<ClientId, (RequestId, Bytes)>,
    /// OBJECT-CPs of the others, by checkpoint and sender (checkpoints within the window).
    received: BTreeMap<SeqNo, BTreeMap<ReplicaId, Received>>,
    /// This member's own OBJECT-CPs of the newest checkpoints (answers to `ask`).
    sent: BTreeMap<SeqNo, Message>,
    sync: Option<Sync>,
    /// The newest checkpoint at which every object was up to date here.
    synced: SeqNo,
    /// Members that sent no OBJECT-CP for a checkpoint this member finished: objects they
    /// maintain are replayed at once rather than waited for, until they send one again.
    suspects: BTreeSet<ReplicaId>,
    /// Requests a RETRANSMIT asked for before this member had them (one per client, the
    /// newest): run rather than stored when they come, and answered. Without it, a client whose
    /// object's maintainer lies waits for the order members' next RETRANSMIT of the request,
    /// which they pace at `auth_retransmit_interval_us` (4 s by default): the client's conflict
    /// retransmission usually reaches the members that skip the request before they have it.
    wanted: BTreeMap<ClientId, RequestId>,
}

/// Own OBJECT-CPs kept for resending.
const SENT_KEPT: usize = 2;

impl Selective {
    /// A RETRANSMIT for `client`'s request `request_id`, which this member has not yet seen
    /// agreed: remembered, so it is run and answered when it comes
    /// ([`ExecStage::answer_wanted`]). At most one per configured client.
    pub(super) fn want(&mut self, client: ClientId, request_id: RequestId) {
        let newer = self.wanted.get(&client).is_none_or(|r| *r < request_id);
        if newer {
            self.wanted.insert(client, request_id);
        }
    }

    /// Member `me` of `n_exec`, each object kept by `copies` members.
    pub(super) fn new(me: usize, n_exec: usize, copies: usize) -> Selective {
        Selective {
            selector: Selector::new(me, n_exec, copies),
            dirty: BTreeSet::new(),
            given: BTreeMap::new(),
            received: BTreeMap::new(),
            sent: BTreeMap::new(),
            sync: None,
            wanted: BTreeMap::new(),
            synced: SeqNo(0),
            suspects: BTreeSet::new(),
        }
    }

    /// The state was replaced by a checkpoint's at `seqno` (every object up to date).
    pub(super) fn reset(&mut self, seqno: SeqNo) {
        let (me, n_exec, copies) = self.selector.shape();
        self.selector = Selector::new(me, n_exec, copies);
        self.dirty.clear();
        self.given.clear();
        self.sync = None;
        self.synced = seqno;
        self.received.retain(|s, _| *s > seqno);
    }

    /// The stored request `request_id` of `client`, if it is stored here.
    fn stored_request(&self, client: ClientId, request_id: RequestId) -> Option<&Stored<Skipped>> {
        self.selector
            .stored_requests()
            .find(|s| (s.item.request.client, s.item.request.request_id) == (client, request_id))
    }
}

/// Whether member `me` runs requests on an object kept by `keepers` (consecutive members, from
/// [`maintainers`]): it keeps it, or one of its keepers is suspected (silent at a checkpoint) and
/// `me` is the first member after the keepers that is neither a keeper nor suspected, standing in
/// for it so that clients still get `r + 1` replies. Running a request it does not keep is always
/// safe (the selector runs what it depends on first); only the CPU is spent.
fn runs_here(keepers: &[usize], me: usize, n_exec: usize, suspects: &BTreeSet<ReplicaId>) -> bool {
    if keepers.contains(&me) {
        return true;
    }
    let suspected = |m: &usize| suspects.contains(&ReplicaId(*m as u32));
    if !keepers.iter().any(suspected) {
        return false;
    }
    let last = *keepers.last().expect("at least one keeper");
    let stand_in = (1..n_exec)
        .map(|k| (last + k) % n_exec)
        .find(|m| !keepers.contains(m) && !suspected(m));
    stand_in == Some(me)
}

impl ExecStage {
    /// Every execution member but this one.
    fn other_exec_members(&self) -> impl Iterator<Item = Principal> + use<> {
        let me = Principal::Exec(self.id);
        ClusterConfig::exec_members(&self.q).filter(move |p| *p != me)
    }

    /// Whether execution waits at a checkpoint for certified objects.
    pub(super) fn selective_waiting(&self) -> bool {
        self.selective.as_ref().is_some_and(|s| s.sync.is_some())
    }

    /// The objects `operation` may touch.
    fn objects_of(&self, operation: &[u8]) -> Objects {
        match self.service.access(operation) {
            None => Objects::All,
            Some(access) => Objects::These(access.reads.into_iter().chain(access.writes).collect()),
        }
    }

    /// Whether this member maintains `object`.
    pub(super) fn maintains(&self, object: &[u8]) -> bool {
        self.keepers(object).contains(&(self.id.0 as usize))
    }

    /// The execution members that maintain `object`.
    fn keepers(&self, object: &[u8]) -> Vec<usize> {
        maintainers(&self.service.placement(object), self.q.n_exec, self.q.reply())
    }

    /// Whether a read-only `operation` reads only objects this member maintains (it may then
    /// answer it: its copies of them are up to date).
    pub(super) fn reads_maintained(&self, operation: &[u8]) -> bool {
        match self.objects_of(operation) {
            Objects::All => false,
            Objects::These(set) => !set.is_empty() && set.iter().all(|o| self.maintains(o)),
        }
    }

    /// Runs one request on the service.
    fn run_one(&mut self, request: &ServiceRequest, context: &BatchContext, effects: &mut Effects) -> Bytes {
        let mut results = self.service.execute(context, std::slice::from_ref(request), effects);
        assert_eq!(results.len(), 1, "the service must return one reply per request");
        results.pop().expect("one reply")
    }

    /// Runs an update's stored requests in order (ODRC's `update_objects`); a forced request is
    /// the update's last and its reply goes to its client.
    fn run_update(&mut self, update: Update<Skipped>, effects: &mut Effects, out: &mut Vec<Action>) {
        if !update.restore.is_empty() {
            // Objects are never lost here: stored requests are dropped only once certified
            // states of their objects are installed (`Selector::discard_through`).
            unreachable!("selective execution drops no stored request it has not replaced");
        }
        for stored in update.replay {
            let Skipped { request, context } = stored.item;
            let result = self.run_one(&request, &context, effects);
            let result = self.after_run(&request, &stored.objects, result, effects, out, false);
            self.replies.record_replayed(request.client, request.request_id, result);
            self.stats.bump("requests_replayed");
        }
    }

    /// A wake-up's pushes under selective execution: numbered as a global request's when the
    /// service wakes on global state only (every member wakes at the same batch, after bringing
    /// every object up to date), otherwise dropped (members may wake at different batches and
    /// would number them differently).
    pub(super) fn wake_pushes(&mut self, effects: &mut Effects, out: &mut Vec<Action>) {
        if self.service.wakes_on_global_state() {
            effects.take_announced();
            return self.number_pushes(&Objects::All, effects, out, true);
        }
        self.drop_pushes(effects);
    }

    /// Drops a wake-up's pushes under selective execution: members wake at different batches,
    /// so they would number them differently.
    pub(super) fn drop_pushes(&mut self, effects: &mut Effects) {
        let dropped = effects.take_pushes().len() as u64;
        effects.take_announced();
        if dropped > 0 {
            self.stats.add("pushes_dropped_selective", dropped);
        }
    }

    /// What running `request` (on `objects`) left in `effects`, under selective execution: its
    /// pushes on declared objects are numbered in their object streams, a global request's other
    /// pushes in their clients' own streams, the rest dropped; sent if `live` (not a replay).
    /// Returns the reply as sent and cached: `result` with the positions of the streams the
    /// request announced to its client.
    fn after_run(
        &mut self,
        request: &ServiceRequest,
        objects: &Objects,
        result: Bytes,
        effects: &mut Effects,
        out: &mut Vec<Action>,
        live: bool,
    ) -> Bytes {
        let (always, if_pushed): (Vec<_>, Vec<_>) = effects
            .take_announced()
            .into_iter()
            .filter(|(client, object, _)| {
                *client == request.client && object.len() <= crate::limits::PUSH_STREAM_NAME_MAX
            })
            .partition(|&(_, _, always)| always);
        // A stream announced outright (the request leaves a watch) stands where it stood
        // before the request's own pushes: a client that starts to follow it there gets them
        // (a reconnected ZooKeeper client's missed events); one announced if pushed stands
        // after them (a write's event on the writer's own watch comes before its reply).
        let mut announced: BTreeMap<Bytes, u64> = always
            .into_iter()
            .map(|(_, object, _)| {
                let next = self.pushes.next_on(&object, request.client);
                (object, next)
            })
            .collect();
        self.number_pushes(objects, effects, out, live);
        for (_, object, _) in if_pushed {
            let next = self.pushes.next_on(&object, request.client);
            if next > 1 && !announced.contains_key(&object) {
                announced.insert(object, next);
            }
        }
        let announced: Vec<(Bytes, u64)> = announced.into_iter().collect();
        wrap_announced(&result, &announced)
    }

    /// Numbers (and sends, if `live`) the pushes a request on `objects` or a wake-up left in
    /// `effects`, under selective execution: those on declared objects in their object streams,
    /// a global request's (or a wake-up's) other pushes in their clients' own streams; the rest
    /// are dropped.
    fn number_pushes(&mut self, objects: &Objects, effects: &mut Effects, out: &mut Vec<Action>, live: bool) {
        let everywhere = match objects {
            Objects::All => true,
            Objects::These(set) => set.is_empty(),
        };
        let declared = |o: &Bytes| everywhere || matches!(objects, Objects::These(set) if set.contains(o));
        for push in effects.take_pushes() {
            match &push.object {
                Some(object) if declared(object) => {
                    self.emit_on_stream(object, push.client, push.payload, out, live);
                }
                Some(_) => self.stats.bump("push_object_undeclared"),
                // Every member runs every global request, in agreed order, after everything:
                // its pushes are numbered alike everywhere (before its reply, as without
                // selective execution).
                None if everywhere => {
                    assert!(live, "a global request is never replayed");
                    self.send_pushes(vec![push], out);
                }
                None => self.stats.bump("pushes_dropped_selective"),
            }
        }
    }

    /// Brings every object up to date before the service's wake-up (it may touch any).
    pub(super) fn selective_before_wake(&mut self, seqno: SeqNo, effects: &mut Effects, out: &mut Vec<Action>) {
        let Some(sel) = self.selective.as_mut() else { return };
        let update = sel.selector.update(Objects::All, Position { seqno, index: 0 });
        self.run_update(update, effects, out);
    }

    /// Runs the requests of batch `seqno` (agreed context `context`) that this member runs,
    /// stores the others, replies to the ones it ran.
    pub(super) fn execute_selectively(
        &mut self,
        seqno: SeqNo,
        context: &BatchContext,
        requests: Vec<ServiceRequest>,
        effects: &mut Effects,
        out: &mut Vec<Action>,
    ) {
        let mut sel = self.selective.take().expect("selective execution is on");
        let (n_exec, copies, me) = (self.q.n_exec, self.q.reply(), self.id.0 as usize);
        for (index, request) in requests.into_iter().enumerate() {
            let at = Position {
                seqno,
                index: index as u32,
            };
            // Run (or stored, and replayed later) alone, at its own position in the batch.
            let context = &BatchContext {
                index: index as u32,
                ..*context
            };
            let objects = self.objects_of(&request.operation);
            let decision = if matches!(&objects, Objects::These(set) if set.is_empty()) {
                // Touches nothing: runs everywhere, needing nothing before it.
                Decision::Run(Update::default())
            } else {
                let service = &self.service;
                let item = Skipped {
                    request: request.clone(),
                    context: *context,
                };
                let suspects = &sel.suspects;
                sel.selector.insert_by(at, objects.clone(), item, |o| {
                    runs_here(
                        &maintainers(&service.placement(o), n_exec, copies),
                        me,
                        n_exec,
                        suspects,
                    )
                })
            };
            match decision {
                Decision::Stored => {
                    self.replies.record_skipped(request.client, request.request_id);
                    self.stats.bump("requests_skipped");
                }
                Decision::Run(update) => {
                    self.run_update(update, effects, out);
                    let result = self.run_one(&request, context, effects);
                    let result = self.after_run(&request, &objects, result, effects, out, true);
                    // A global request runs everywhere after everything: every member's copy
                    // of every object is current after it, so it dirties nothing.
                    if let Objects::These(set) = &objects {
                        sel.dirty.extend(set.iter().filter(|o| self.maintains(o)).cloned());
                    }
                    sel.given.insert(request.client, (request.request_id, result.clone()));
                    self.send_reply(request.client, request.request_id, &result, true, out);
                    self.replies.record(request.client, request.request_id, result);
                    self.stats.bump("requests_executed");
                }
            }
        }
        self.selective = Some(sel);
    }

    /// The checkpoint at `last_executed` under selective execution: OBJECT-CP to the other
    /// execution members, then wait for what this member needs (or take it at once if it
    /// skipped nothing).
    pub(super) fn checkpoint_selectively(&mut self, out: &mut Vec<Action>) {
        let seqno = self.last_executed;
        let mut sel = self.selective.take().expect("selective execution is on");
        let (mut objects, mut streams) = (Vec::new(), Vec::new());
        let mut bytes = 0;
        for name in std::mem::take(&mut sel.dirty) {
            let state = self.service.object_state(&name).flatten();
            let object_streams = self.pushes.object_streams(&name);
            let stream_bytes: usize = object_streams.iter().map(|(_, s)| s.bytes()).sum();
            let size = 2 * name.len() + state.as_ref().map_or(0, |s| s.len()) + stream_bytes;
            if bytes + size > OBJECT_CP_BYTES_MAX {
                // Left out: those who need it replay instead.
                self.stats.bump("object_cp_full");
                continue;
            }
            bytes += size;
            if !object_streams.is_empty() {
                streams.push((name.clone(), object_streams));
            }
            objects.push((name, state));
        }
        self.stats.add("object_cp_objects_sent", objects.len() as u64);
        let message = Message::ObjectCheckpoint {
            seqno,
            objects,
            streams,
            replies: std::mem::take(&mut sel.given)
                .into_iter()
                .map(|(client, (id, result))| (client, id, result))
                .collect(),
            ask: false,
        };
        self.send_each(self.other_exec_members(), &message, out);
        sel.sent.insert(seqno, message);
        while sel.sent.len() > SENT_KEPT {
            sel.sent.pop_first();
        }
        let mut needed = BTreeSet::new();
        for stored in sel.selector.stored_through(seqno) {
            match &stored.objects {
                Objects::These(set) => needed.extend(set.iter().cloned()),
                Objects::All => unreachable!("a global request runs everywhere"),
            }
        }
        let replies: BTreeSet<_> = self.replies.skipped().collect();
        sel.received.retain(|s, _| *s >= seqno);
        sel.sync = Some(Sync {
            seqno,
            objects: needed,
            replies,
            ticks: 0,
        });
        self.selective = Some(sel);
        self.try_finish_sync(false, out);
    }

    /// Finishes the waiting checkpoint once every object its stored requests touch is either
    /// certified (all `r + 1` maintainers sent the same state) or to be brought up to date by
    /// replay here: when its maintainers disagree (one lies), when a maintainer that sent
    /// nothing is suspected (it sent nothing for an earlier checkpoint either), or when `give_up`
    /// (the wait timed out). Likewise each skipped reply: `r + 1` equal copies, or its request is
    /// replayed. Then the replayed objects' stored requests run here (with every object they
    /// share a request with), the other objects are installed, and the checkpoint is taken.
    fn try_finish_sync(&mut self, give_up: bool, out: &mut Vec<Action>) {
        let Some(sel) = self.selective.as_ref() else { return };
        let Some(sync) = sel.sync.as_ref() else { return };
        let seqno = sync.seqno;
        let empty = BTreeMap::new();
        let received = sel.received.get(&seqno).unwrap_or(&empty);
        let one_copy = self.config.knobs.sabotage == Some(crate::config::Sabotage::SingleObjectCopy);
        let heard = |k: &usize| received.contains_key(&ReplicaId(*k as u32));
        let suspected = |k: &usize| !heard(k) && sel.suspects.contains(&ReplicaId(*k as u32));
        let mut states: BTreeMap<Bytes, ObjectCopy> = BTreeMap::new();
        let mut replay: BTreeSet<Bytes> = BTreeSet::new();
        // Members whose copies this checkpoint needed and did not get: suspected after it.
        let mut unheard: BTreeSet<ReplicaId> = BTreeSet::new();
        let mut waiting = false;
        for name in &sync.objects {
            let keepers = self.keepers(name);
            let copies: Vec<_> = keepers
                .iter()
                .map(|k| received.get(&ReplicaId(*k as u32)).and_then(|r| r.objects.get(name)))
                .collect();
            if one_copy {
                if let Some(state) = copies.iter().flatten().next() {
                    states.insert(name.clone(), (*state).clone());
                    continue;
                }
            } else if let Some(first) = copies.first().copied().flatten() {
                if copies.iter().all(|c| c == &Some(first)) {
                    states.insert(name.clone(), first.clone());
                    continue;
                }
            }
            let all_heard = keepers.iter().all(heard);
            if give_up || all_heard || keepers.iter().any(suspected) {
                // Disagreeing or unreachable maintainers: bring it up to date here.
                replay.insert(name.clone());
                unheard.extend(keepers.iter().filter(|k| !heard(k)).map(|k| ReplicaId(*k as u32)));
            } else {
                waiting = true;
            }
        }
        let reply_quorum = if one_copy { 1 } else { self.q.reply() };
        let mut certified = Vec::with_capacity(sync.replies.len());
        for key in &sync.replies {
            let mut votes: BTreeMap<&Bytes, usize> = BTreeMap::new();
            for r in received.values() {
                if let Some(d) = r.replies.get(key) {
                    *votes.entry(d).or_default() += 1;
                }
            }
            if let Some((result, _)) = votes.into_iter().find(|(_, n)| *n >= reply_quorum) {
                certified.push((*key, result.clone()));
                continue;
            }
            let objects = sel.stored_request(key.0, key.1).map(|s| s.objects.clone());
            let Some(Objects::These(objects)) = objects else {
                // Not stored (it ran here after all): nothing to certify.
                continue;
            };
            let executors: BTreeSet<usize> = objects.iter().flat_map(|o| self.keepers(o)).collect();
            if give_up || executors.iter().all(heard) || executors.iter().any(suspected) {
                replay.extend(objects);
                unheard.extend(executors.iter().filter(|k| !heard(k)).map(|k| ReplicaId(*k as u32)));
            } else {
                waiting = true;
            }
        }
        if waiting {
            return;
        }
        let closure = sel.selector.closure_through(seqno, &replay);
        let stored = (self.selective.as_mut().expect("checked above").selector).take_touching_through(seqno, &closure);
        let replayed = stored.len() as u64;
        let mut effects = Effects::default();
        self.run_update(
            Update {
                restore: Vec::new(),
                replay: stored,
            },
            &mut effects,
            out,
        );
        let mut installed = 0u64;
        let keep_streams = self.config.knobs.sabotage == Some(crate::config::Sabotage::StaleStreams);
        for (name, (state, streams)) in states.iter().filter(|(name, _)| !closure.contains(*name)) {
            if let Err(e) = self.service.restore_object(name, state.as_deref()) {
                // The state of a correct maintainer, which the service itself made.
                panic!("the service cannot restore an object that r + 1 maintainers certified: {e}");
            }
            if !keep_streams {
                self.pushes.set_object_streams(name, streams);
            }
            installed += 1;
        }
        for ((client, request_id), result) in certified {
            self.replies.certify(client, request_id, result);
        }
        self.stats.add("objects_installed", installed);
        if replayed > 0 {
            self.stats.bump("selective_sync_replayed");
            self.stats.add("requests_replayed_at_checkpoint", replayed);
        } else {
            self.stats.bump("selective_sync_certified");
        }
        self.finish_sync(seqno, unheard, out);
    }

    /// Drops the stored requests through the waiting checkpoint and takes it. `unheard`, the
    /// members whose copies it needed and went without, are suspected until they send an
    /// OBJECT-CP again (members it did not need are not: a member that stored nothing finishes
    /// before anyone's copy arrives).
    fn finish_sync(&mut self, seqno: SeqNo, unheard: BTreeSet<ReplicaId>, out: &mut Vec<Action>) {
        let sel = self.selective.as_mut().expect("selective execution is on");
        sel.suspects.extend(unheard);
        sel.selector.discard_through(seqno);
        sel.sync = None;
        sel.synced = seqno;
        sel.received.retain(|s, _| *s > seqno);
        self.take_checkpoint(out);
    }

    /// Retry tick while waiting at a checkpoint: ask the others again, then replay.
    pub(super) fn selective_tick(&mut self, out: &mut Vec<Action>) {
        let Some(sel) = self.selective.as_mut() else { return };
        let Some(sync) = sel.sync.as_mut() else { return };
        sync.ticks += 1;
        if sync.ticks == 1 {
            if let Some(Message::ObjectCheckpoint {
                seqno,
                objects,
                replies,
                streams,
                ..
            }) = sel.sent.get(&sync.seqno)
            {
                let message = Message::ObjectCheckpoint {
                    seqno: *seqno,
                    objects: objects.clone(),
                    replies: replies.clone(),
                    streams: streams.clone(),
                    ask: true,
                };
                self.stats.bump("object_cp_asked");
                self.send_each(self.other_exec_members(), &message, out);
            }
            return;
        }
        self.try_finish_sync(true, out);
        self.execute_ready(out);
    }

    /// OBJECT-CP (`message`) from execution member `from`.
    pub(super) fn on_object_checkpoint(&mut self, from: ReplicaId, message: &Message, out: &mut Vec<Action>) {
        let Message::ObjectCheckpoint {
            seqno,
            objects,
            replies,
            streams,
            ask,
        } = message
        else {
            unreachable!("dispatched on message kind");
        };
        let (seqno, ask) = (*seqno, *ask);
        let interval = self.config.knobs.checkpoint_interval;
        let horizon = self.window_base().0.saturating_add(self.config.knobs.log_window);
        let Some(sel) = self.selective.as_mut() else {
            return self.stats.bump("object_cp_not_selective");
        };
        // Any authenticated OBJECT-CP shows the member is not silent.
        sel.suspects.remove(&from);
        if !seqno.0.is_multiple_of(interval) || seqno <= sel.synced || seqno.0 > horizon {
            return self.stats.bump("object_cp_out_of_window");
        }
        let answer = ask.then(|| sel.sent.get(&seqno).cloned()).flatten();
        let mut streams: BTreeMap<&Bytes, &Vec<(ClientId, PushStream)>> =
            streams.iter().map(|(name, s)| (name, s)).collect();
        sel.received.entry(seqno).or_default().insert(
            from,
            Received {
                objects: objects
                    .iter()
                    .map(|(name, state)| {
                        let streams = streams.remove(name).cloned().unwrap_or_default();
                        (name.clone(), (state.clone(), streams))
                    })
                    .collect(),
                replies: replies.iter().map(|(c, id, r)| ((*c, *id), r.clone())).collect(),
            },
        );
        self.stats.bump("object_cp_received");
        if let Some(mine) = answer {
            let to = Principal::Exec(from);
            self.send(vec![to], mine, SealFor::One(to), out);
        }
        if self.selective.as_ref().and_then(|s| s.sync.as_ref()).map(|s| s.seqno) == Some(seqno) {
            self.try_finish_sync(false, out);
            if !self.selective_waiting() {
                self.execute_ready(out);
            }
        }
    }

    /// After a batch: every wanted request now stored here is run and answered; wanted requests
    /// at or below a client's newest agreed one are forgotten.
    pub(super) fn answer_wanted(&mut self, out: &mut Vec<Action>) {
        let Some(sel) = self.selective.as_mut() else { return };
        if sel.wanted.is_empty() {
            return;
        }
        let mut due = Vec::new();
        sel.wanted.retain(|client, request_id| match self.replies.get(*client) {
            Some(cached) if cached.request_id >= *request_id => {
                if cached.request_id == *request_id {
                    due.push((*client, *request_id));
                }
                false
            }
            _ => true,
        });
        for (client, request_id) in due {
            if self.resend_cached_reply(client, request_id, out) {
                self.stats.bump("retransmit_answered_later");
            }
        }
    }

    /// RETRANSMIT for a request this member skipped: run it now (with what it needs first), so
    /// its reply can go out. `false` if it is not stored here.
    pub(super) fn force_skipped(&mut self, client: ClientId, request_id: RequestId, out: &mut Vec<Action>) -> bool {
        let Some(sel) = self.selective.as_mut() else {
            return false;
        };
        let Some(update) = sel
            .stored_request(client, request_id)
            .map(|s| s.at)
            .and_then(|at| sel.selector.force(at))
        else {
            return false;
        };
        let mut effects = Effects::default();
        self.run_update(update, &mut effects, out);
        self.stats.bump("requests_forced");
        matches!(self.replies.get(client).map(|c| &c.result), Some(CachedResult::Full(_)))
    }
}

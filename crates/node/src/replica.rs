//! One replica process: opens its stages' logs, builds Auth, Order and (if `id < n_exec`) Exec with
//! the spec's service (through the one factory, [`upright_core::stages::build`]), listens for
//! replicas, clients and metrics, dials its peers, and runs
//! the [`Host`] on one task: network inputs round-robin per peer, timers, group commit, sends.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use tokio::net::TcpListener;
use upright_core::config::ConfigError;
use upright_core::config::PublicKeys;
use upright_core::crypto::{KeyRing, SecretKeys};
use upright_core::ids::{Principal, Process, ReplicaId, StageKind};
use upright_core::limits::MESSAGE_BYTES_MAX;
use upright_core::message::Envelope;
use upright_core::pages::Pages;
use upright_core::service::{Access, BatchContext, Effects, Push, RestoreError, Service, ServiceRequest};
use upright_core::stage::{Stage, Storage, Time};
use upright_core::stages::ServiceFactory;

use crate::files::{endpoint, resolve, Cluster, FileError};
use crate::host::{Host, Member, Router};
use crate::metrics::{serve_http, Status};
use crate::storage::{Recovery, StageLog, StorageOptions};
use crate::timeline;
use crate::transport::{
    dial_peer_as, serve, ClientRoutes, Counters, Dialer, Identities, Identity, Inbox, Listener, PeerLinks,
};

/// Most inbound envelopes handled between two flushes (bounds the group-commit batch).
pub const INPUTS_PER_ROUND_MAX: usize = 256;
/// How often the status snapshot is refreshed.
const PUBLISH_EVERY: Duration = Duration::from_millis(250);

/// Everything needed to run one replica.
pub struct ReplicaSpec {
    /// The cluster.
    pub cluster: Cluster,
    /// Which replica: its slot, the name its key file and data directory carry
    /// ([`Cluster::slots`]); its id in the protocol is the position of its keys in the
    /// configuration it runs in.
    pub id: u32,
    /// Its secret keys (checked against the config by the loader).
    pub keys: SecretKeys,
    /// Log settings (fsync policy from the config unless overridden).
    pub storage: StorageOptions,
    /// The replicated service its execution member runs (every replica of a cluster runs the
    /// same one); [`upright_core::stages::kv_service`] is the core's in-memory KV.
    pub service: ServiceFactory,
    /// Stand-in stages instead of the real Auth, Order and Exec (tests only); `None` builds the
    /// real ones.
    pub stages: Option<StageFactory>,
    /// Wraps each stage once it is built (testing only: the Byzantine stand-ins of
    /// `upright bench --attack`); `None` runs the stages as built.
    pub wrap: Option<StageWrapper>,
}

/// Wraps one built stage; given the replica's key ring (see [`ReplicaSpec::wrap`]).
pub type StageWrapper = Arc<dyn Fn(Box<dyn Stage + Send>, &Arc<KeyRing>) -> Box<dyn Stage + Send> + Send + Sync>;

/// Environment variable (testing only): a replica whose id it names alters the payload of every
/// message its service pushes, standing in for a Byzantine replica that forges pushes (the
/// numbering stays right, so the forgeries compete with the honest pushes for acceptance).
pub const FORGE_PUSHES_ENV: &str = "UPRIGHT_TEST_FORGE_PUSHES";

/// Whether replica `id` is told by [`FORGE_PUSHES_ENV`] to forge its pushes (testing only).
pub fn forge_pushes_requested(id: u32) -> bool {
    std::env::var(FORGE_PUSHES_ENV).is_ok_and(|v| v.trim() == id.to_string())
}

/// Testing only: `service` with every pushed payload altered (see [`FORGE_PUSHES_ENV`]).
pub fn forging_pushes(service: ServiceFactory) -> ServiceFactory {
    struct Forging(Box<dyn Service + Send>);
    impl Service for Forging {
        fn execute(
            &mut self,
            context: &BatchContext,
            requests: &[ServiceRequest],
            effects: &mut Effects,
        ) -> Vec<Bytes> {
            let replies = self.0.execute(context, requests, effects);
            for push in effects.take_pushes() {
                let payload = Bytes::from([&push.payload[..], b"<forged>"].concat());
                effects.add_push(Push { payload, ..push });
            }
            replies
        }
        // Everything else is the service's own, so only the pushes differ.
        fn access(&self, operation: &[u8]) -> Option<Access> {
            self.0.access(operation)
        }
        fn enable_selective_execution(&mut self) -> bool {
            self.0.enable_selective_execution()
        }
        fn object_state(&self, object: &[u8]) -> Option<Option<Bytes>> {
            self.0.object_state(object)
        }
        fn restore_object(&mut self, object: &[u8], state: Option<&[u8]>) -> Result<(), RestoreError> {
            self.0.restore_object(object, state)
        }
        fn placement(&self, object: &[u8]) -> Bytes {
            self.0.placement(object)
        }
        fn wake_at(&self) -> Option<u64> {
            self.0.wake_at()
        }
        fn wakes_on_global_state(&self) -> bool {
            self.0.wakes_on_global_state()
        }
        fn wake(&mut self, context: &BatchContext, effects: &mut Effects) {
            self.0.wake(context, effects)
        }
        fn execute_read_only(&self, operation: &[u8]) -> Option<Bytes> {
            self.0.execute_read_only(operation)
        }
        fn checkpoint(&self) -> Bytes {
            self.0.checkpoint()
        }
        fn restore(&mut self, checkpoint: &[u8]) -> Result<(), RestoreError> {
            self.0.restore(checkpoint)
        }
        fn pages(&self) -> Option<&Pages> {
            self.0.pages()
        }
        fn pages_mut(&mut self) -> Option<&mut Pages> {
            self.0.pages_mut()
        }
    }
    Arc::new(move || Box::new(Forging(service())))
}

/// Environment variable (testing only): `ID:BEHAVIOUR` makes replica `ID` Byzantine with the
/// named behaviour of the simulator (a name of `upright-sim --list-behaviours`, e.g.
/// `0:slow-primary`); `upright replica` wraps its stages in the simulator's filter
/// (`upright_sim::runtime`), and `upright bench --attack` sets it.
pub const BYZANTINE_ENV: &str = "UPRIGHT_TEST_BYZANTINE";

/// Environment variable (testing only): a replica whose id it names answers every state-transfer
/// request (manifest, chunk, pages, tree nodes) with altered data, standing in for a Byzantine
/// replica that sends wrong chunks; everything else it does is correct.
pub const WRONG_STATE_ENV: &str = "UPRIGHT_TEST_WRONG_STATE";

/// Whether replica `id` is told by [`WRONG_STATE_ENV`] to send wrong state (testing only).
pub fn wrong_state_requested(id: u32) -> bool {
    std::env::var(WRONG_STATE_ENV).is_ok_and(|v| v.trim() == id.to_string())
}

/// Testing only: the real stages of replica `id`, its execution member altering every
/// state-transfer answer it sends (see [`WRONG_STATE_ENV`]).
pub fn wrong_state_stages(
    config: Arc<upright_core::config::ClusterConfig>,
    id: u32,
    service: ServiceFactory,
) -> StageFactory {
    use upright_core::message::{Envelope, Message, SealFor};
    use upright_core::stage::{Action, Input, Stats};

    struct Lying {
        inner: Box<dyn Stage + Send>,
        keys: Arc<KeyRing>,
        q: upright_core::quorum::Quorums,
    }
    fn alter(message: &Message) -> Option<Message> {
        let flip = |b: &Bytes| {
            let mut v = b.to_vec();
            match v.first_mut() {
                Some(x) => *x ^= 0xff,
                None => v.push(1),
            }
            Bytes::from(v)
        };
        Some(match message.clone() {
            Message::StateChunk {
                seqno,
                state_digest,
                index,
                data,
            } => Message::StateChunk {
                seqno,
                state_digest,
                index,
                data: flip(&data),
            },
            Message::PageAnswer {
                seqno,
                state_digest,
                nodes,
                pages,
            } => Message::PageAnswer {
                seqno,
                state_digest,
                nodes: nodes
                    .into_iter()
                    .map(|(n, mut children)| {
                        if let Some(first) = children.first_mut() {
                            first.0[0] ^= 0xff;
                        }
                        (n, children)
                    })
                    .collect(),
                pages: pages.into_iter().map(|(i, p)| (i, flip(&p))).collect(),
            },
            _ => return None,
        })
    }
    impl Stage for Lying {
        fn principal(&self) -> upright_core::ids::Principal {
            self.inner.principal()
        }
        fn handle(&mut self, now: Time, input: Input, out: &mut Vec<Action>) {
            let start = out.len();
            self.inner.handle(now, input, out);
            for action in &mut out[start..] {
                let Action::Send { to, envelope } = action else {
                    continue;
                };
                let (Some(lie), [recipient]) = (alter(&envelope.message), &to[..]) else {
                    continue;
                };
                let sealed = Envelope::seal(&self.keys, &self.q, envelope.from, lie, SealFor::One(*recipient));
                *envelope = Arc::new(sealed);
            }
        }
        fn stats(&self) -> &Stats {
            self.inner.stats()
        }
    }
    Arc::new(move |kind, storage, keys| {
        let q = config.validate()?;
        let Some(principal) = q
            .members_of(ReplicaId(id))
            .into_iter()
            .find(|p| p.stage() == Some(kind))
        else {
            return Err(ConfigError::BadKnob {
                name: "stages",
                value: id as u64,
                why: "this replica hosts no member of that stage",
            });
        };
        let stage = upright_core::stages::build(&config, principal, &keys, storage, &service)?;
        if kind != StageKind::Exec {
            return Ok(stage);
        }
        Ok(Box::new(Lying { inner: stage, keys, q }))
    })
}

/// Builds the stage of one kind from its recovered storage and the replica's key ring.
pub type StageFactory =
    Arc<dyn Fn(StageKind, &Storage, Arc<KeyRing>) -> Result<Box<dyn Stage + Send>, ConfigError> + Send + Sync>;

/// The host clock: wall-clock microseconds (so a restarted replica agrees with its peers on batch
/// times), never going backwards within the process.
pub struct Clock {
    last: Time,
}

impl Clock {
    /// A new clock.
    pub fn new() -> Clock {
        Clock { last: 0 }
    }

    /// Current time.
    pub fn now(&mut self) -> Time {
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_micros() as u64)
            .unwrap_or(0);
        self.last = self.last.max(wall);
        self.last
    }

    /// The `tokio::time::Instant` at which host time `at` is reached.
    pub fn instant_of(&mut self, at: Time) -> tokio::time::Instant {
        let now = self.now();
        tokio::time::Instant::now() + Duration::from_micros(at.saturating_sub(now))
    }
}

impl Default for Clock {
    fn default() -> Self {
        Clock::new()
    }
}

struct NetRouter {
    peers: BTreeMap<ReplicaId, Dialer>,
    routes: Arc<ClientRoutes>,
    counters: Arc<Counters>,
    /// What connecting to the members a hand-over adds takes.
    growth: Growth,
}

/// A replica's configuration and identity, for [`NetRouter::connect_added`].
struct Growth {
    config: Arc<upright_core::config::ClusterConfig>,
    secret: SecretKeys,
    name: String,
    inbox: Arc<Inbox>,
    identities: Arc<Identities>,
    links: Arc<PeerLinks>,
    /// The epoch this replica connected for, once it hands over.
    handing_over: Option<u64>,
}

/// Whether a replica with keys `mine` dials the one with `theirs` (else that one dials it): the
/// lower Ed25519 key dials. Not the lower id: a shrink may renumber replicas, and the two ends
/// of a link may run in different configurations for a while (one switched, one not yet).
fn dials(mine: &PublicKeys, theirs: &PublicKeys) -> bool {
    mine.ed25519 < theirs.ed25519
}

/// The identity of the replica with `secret` in `other`, a configuration next to `current` (the
/// one before it, or the one it hands over to): its key ring there, and the peers `other` names,
/// each routed to its id in `current`, or, for members `current` does not have, to its id in
/// `other` if that is above `current`'s ids (members a hand-over adds, addressed so by the
/// order stage). `None` if `other` does not have this replica.
fn identity_in(
    other: &upright_core::config::ClusterConfig,
    current: &upright_core::config::ClusterConfig,
    secret: &SecretKeys,
) -> Option<Identity> {
    let me = other.replica_with(&secret.public())?;
    let keys = Arc::new(KeyRing::new(other, Process::Replica(me), secret));
    let peers = other
        .replicas
        .iter()
        .enumerate()
        .filter(|(j, _)| *j != me.0 as usize)
        .filter_map(|(j, r)| {
            let routed = match current.replica_with(&r.keys) {
                Some(here) => here,
                None if j >= current.replicas.len() => ReplicaId(j as u32),
                None => return None,
            };
            Some((Process::Replica(ReplicaId(j as u32)), Process::Replica(routed)))
        })
        .collect();
    Some(Identity {
        keys,
        peers: Some(peers),
    })
}

impl Router for NetRouter {
    fn send(&mut self, _from: Principal, to: Vec<Principal>, envelope: Arc<Envelope>) {
        let frame = Arc::new(upright_core::wire::encode(&envelope));
        let exec_base = self.growth.config.exec_process_base();
        for principal in to {
            timeline::message("send", &envelope.message, timeline::peer(&principal));
            self.send_frame(principal.process_at(exec_base), frame.clone());
        }
    }

    fn local(&mut self, envelope: &Envelope) {
        timeline::message("local", &envelope.message, 0);
    }
}

impl NetRouter {
    /// The order member hands over to `change`'s configuration: connect to the members it adds
    /// (not in this configuration), whose hand-over votes this member needs when one of the old
    /// members is down, and answer hellos from the next configuration's members as that
    /// configuration names us (one that switched first and may have renumbered us). Before
    /// this, nothing connected the added members: an old member's configuration does not know
    /// their keys.
    fn connect_added(&mut self, change: &upright_core::reconfig::SignedReconfiguration) {
        let growth = &mut self.growth;
        let next = match upright_core::reconfig::successor(&growth.config, change, false) {
            Ok(next) => next,
            Err(e) => {
                tracing::error!(error = %e, "the change this replica hands over to does not follow its configuration");
                return;
            }
        };
        if growth.handing_over == Some(next.epoch()) {
            return;
        }
        growth.handing_over = Some(next.epoch());
        let Some(identity) = identity_in(&next, &growth.config, &growth.secret) else {
            // Removed: it serves the boundary's state to the others until they start.
            return;
        };
        let keys = identity.keys.clone();
        growth.identities.add(identity);
        let mine = growth.secret.public();
        let current = growth.config.replicas.len();
        let mut dialled = Vec::new();
        for (j, replica) in next.replicas.iter().enumerate().skip(current) {
            let id = ReplicaId(j as u32);
            if growth.config.replica_with(&replica.keys).is_some() || self.peers.contains_key(&id) {
                continue;
            }
            if !dials(&mine, &replica.keys) {
                // It dials us, as the next configuration names us.
                let link = growth.links.register(Process::Replica(id), self.counters.clone());
                self.peers.insert(id, link);
                continue;
            }
            let Some(addr) = change
                .change
                .endpoints
                .get(j)
                .and_then(|e| crate::files::endpoint_replica_addr(e))
                .and_then(|a| endpoint(a).ok())
            else {
                tracing::warn!(
                    replica = j,
                    "an added replica's endpoint is not an address: not dialling it"
                );
                continue;
            };
            let dialer = dial_peer_as(
                addr,
                vec![(keys.clone(), Process::Replica(id))],
                Process::Replica(id),
                growth.name.clone(),
                growth.inbox.clone(),
                MESSAGE_BYTES_MAX,
                self.counters.clone(),
            );
            self.peers.insert(id, dialer);
            dialled.push(j);
        }
        tracing::info!(
            epoch = next.epoch(),
            dialled = ?dialled,
            "handing over to the next configuration: connected to the replicas it adds"
        );
    }

    fn send_frame(&mut self, to: Process, frame: Arc<Vec<u8>>) {
        match to {
            Process::Replica(r) => match self.peers.get(&r) {
                Some(peer) => peer.send(frame),
                None => self.counters.bump("net_dropped_unknown_peer"),
            },
            Process::Client(c) => {
                if !self.routes.send(c, frame) {
                    self.counters.bump("net_dropped_client_unreachable");
                }
            }
        }
    }
}

fn stage_name(kind: StageKind) -> &'static str {
    match kind {
        StageKind::Auth => "auth",
        StageKind::Order => "order",
        StageKind::Exec => "exec",
    }
}

/// The stages of a replica as built from storage.
pub struct Built {
    /// The members.
    pub members: Vec<Member<StageLog>>,
    /// Storage recovery outcome per stage name.
    pub recovery: BTreeMap<String, String>,
    /// Stages whose storage was corrupt.
    pub corrupt: u64,
}

/// Opens the logs (in replica `spec.id`'s data directory) and builds the co-located stages of
/// member `id` of the configuration. Corrupt storage is logged and the stage starts
/// empty (it then recovers from its peers).
pub fn build_members(spec: &ReplicaSpec, id: ReplicaId, keys: &Arc<KeyRing>) -> Result<Built, FileError> {
    let config = spec.cluster.config.clone();
    let q = config.validate().map_err(|e| FileError(e.to_string()))?;
    let mut members = Vec::new();
    let mut outcomes = BTreeMap::new();
    let mut corrupt = 0;
    for principal in q.members_of(id) {
        let kind = principal.stage().expect("a replica hosts stage members");
        let dir = spec.cluster.data_dir(spec.id).join(stage_name(kind));
        let (log, storage, recovery) = StageLog::open(&dir, spec.storage)
            .map_err(|e| FileError(format!("cannot open storage {}: {e}", dir.display())))?;
        match &recovery {
            Recovery::Corrupted { reason, moved_to } => {
                corrupt += 1;
                tracing::warn!(
                    stage = stage_name(kind),
                    %reason,
                    moved_to = %moved_to.display(),
                    "storage is corrupt: starting this stage empty; it recovers its state from its peers"
                );
            }
            Recovery::TornTail { truncated_bytes } => {
                tracing::info!(stage = stage_name(kind), truncated_bytes, "truncated a torn log tail");
            }
            _ => {}
        }
        outcomes.insert(
            stage_name(kind).to_string(),
            format!("{recovery:?}").replace(['\n', ' '], ""),
        );
        let bad = |e: ConfigError| FileError(e.to_string());
        let stage: Box<dyn Stage + Send> = match &spec.stages {
            Some(factory) => factory(kind, &storage, keys.clone()).map_err(bad)?,
            None => {
                let page_store: Option<Box<dyn upright_core::pages::PageStore>> = if kind == StageKind::Exec {
                    let dir = spec.cluster.data_dir(spec.id).join("exec-pages");
                    let store = crate::pages::FilePageStore::open(&dir)
                        .map_err(|e| FileError(format!("cannot open the page store {}: {e}", dir.display())))?;
                    Some(Box::new(store))
                } else {
                    None
                };
                upright_core::stages::build_with_pages(&config, principal, keys, &storage, &spec.service, page_store)
                    .map_err(bad)?
            }
        };
        let stage = match &spec.wrap {
            Some(wrap) => wrap(stage, keys),
            None => stage,
        };
        members.push(Member { kind, stage, log });
    }
    Ok(Built {
        members,
        recovery: outcomes,
        corrupt,
    })
}

async fn bind(addr: &str, what: &str) -> Result<Listener, FileError> {
    Listener::bind(&endpoint(addr)?)
        .await
        .map_err(|e| FileError(format!("cannot listen on {addr} ({what}): {e}")))
}

async fn bind_tcp(addr: &str, what: &str) -> Result<TcpListener, FileError> {
    let resolved = resolve(addr)?;
    TcpListener::bind(resolved)
        .await
        .map_err(|e| FileError(format!("cannot listen on {addr} ({what}): {e}")))
}

/// Largest frame a client may send: its largest request plus envelope overhead.
pub fn client_frame_max(cluster: &Cluster) -> usize {
    (cluster.config.knobs.request_bytes_max + (64 << 10)).min(MESSAGE_BYTES_MAX)
}

/// Why a replica's run ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ended {
    /// `shutdown` completed.
    Shutdown,
    /// A proactive recovery begins: its marker is written; the caller replaces the process
    /// ([`crate::recovery::exec_fresh`]).
    Recover,
    /// The replica's configuration ended (docs/PROTOCOL.md "Reconfiguration") and its log
    /// records the next one: the caller replaces the process, which starts in it.
    Reconfigure,
    /// A reconfiguration removed this replica: it stops for good.
    Removed,
}

/// The configuration replica `spec` runs in: the one its order log records (a replica that has
/// not switched yet runs in its old configuration even if `cluster.toml` lists newer changes), or,
/// with an empty log (a new member), the latest one `cluster.toml` knows.
pub fn running_config(spec: &ReplicaSpec) -> Result<Arc<upright_core::config::ClusterConfig>, FileError> {
    let dir = spec.cluster.data_dir(spec.id).join(stage_name(StageKind::Order));
    if !dir.exists() {
        return Ok(spec.cluster.config.clone());
    }
    let (_, storage, _) = StageLog::open(&dir, spec.storage)
        .map_err(|e| FileError(format!("cannot open storage {}: {e}", dir.display())))?;
    if storage.is_empty() {
        return Ok(spec.cluster.config.clone());
    }
    let config = upright_core::order::configured(&spec.cluster.initial, &storage)
        .map_err(|e| FileError(format!("replica {}: {e}", spec.id)))?;
    Ok(Arc::new(config))
}

/// Proactive recovery as the event loop sees it ([`crate::recovery`]).
struct RecoveryCtl {
    /// The replica's data directory (where the marker lives).
    dir: std::path::PathBuf,
    id: u32,
    n: u32,
    /// The schedule's period `T_w` in milliseconds (0: none).
    period_ms: u64,
    next_due_ms: Option<u64>,
    /// The recovery this process runs, if it started for one.
    marker: Option<crate::recovery::Marker>,
    completed: bool,
}

impl RecoveryCtl {
    /// Once per status publication: completes a recovery that finished, and begins one that is
    /// asked for or due (returns `Ended::Recover` once its marker is written).
    fn poll(&mut self, host: &Host<StageLog>, status: &Mutex<Status>) -> Option<Ended> {
        use crate::recovery::{next_scheduled, remove_marker, unix_ms, write_marker};
        let now = unix_ms();
        let mut s = status.lock().expect("status lock");
        let stat = |kind: StageKind, name: &str| {
            host.members()
                .iter()
                .find(|m| m.kind == kind)
                .map_or(0, |m| m.stage.stats().get(name))
        };
        if let Some(marker) = self.marker.as_ref().filter(|_| !self.completed) {
            s.proactive.point = stat(StageKind::Order, "recovery_point");
            s.proactive.state_bytes = stat(StageKind::Exec, "state_transfer_bytes");
            s.proactive.state_pages = stat(StageKind::Exec, "state_transfer_pages");
            if host.recovery_complete() {
                if let Err(e) = remove_marker(&self.dir) {
                    tracing::error!(error = %e, "cannot remove the recovery marker; the next start recovers again");
                }
                self.completed = true;
                let millis = now.saturating_sub(marker.started_unix_ms);
                s.proactive.state = "recovered".into();
                s.proactive.millis = millis;
                tracing::info!(
                    seconds = millis as f64 / 1e3,
                    recovery_point = s.proactive.point,
                    state_bytes = s.proactive.state_bytes,
                    state_pages = s.proactive.state_pages,
                    "proactive recovery complete: state checked against a certified checkpoint, recovery point stable"
                );
                let slot = self.period_ms / u64::from(self.n.max(1));
                if self.period_ms > 0 && millis > slot {
                    tracing::warn!(
                        seconds = millis as f64 / 1e3,
                        slot_seconds = slot as f64 / 1e3,
                        "the recovery took longer than this replica's slot of the schedule: the next replica's may overlap it (raise recovery_interval_secs, or look for what slowed it)"
                    );
                }
            }
        }
        let due = self.next_due_ms.is_some_and(|at| now >= at);
        if due {
            self.next_due_ms = Some(next_scheduled(now, self.period_ms, self.id, self.n));
            s.proactive.next_scheduled_unix_ms = self.next_due_ms.unwrap_or(0);
        }
        let requested = std::mem::take(&mut s.recover_requested);
        if !(due || requested) {
            return None;
        }
        if self.marker.is_some() && !self.completed {
            tracing::warn!("a proactive recovery was asked for while one is in progress: ignored");
            return None;
        }
        let reason = if requested { "command" } else { "schedule" };
        match write_marker(&self.dir, reason) {
            Ok(marker) => {
                tracing::info!(
                    reason,
                    id = marker.started_unix_ms,
                    "proactive recovery: restarting from the binary on disk"
                );
                Some(Ended::Recover)
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot write the recovery marker: not recovering");
                None
            }
        }
    }
}

/// Runs replica `spec.id` until `shutdown` completes or a proactive recovery begins.
pub async fn run_replica(mut spec: ReplicaSpec, shutdown: impl Future<Output = ()>) -> Result<Ended, FileError> {
    let running = running_config(&spec)?;
    if running.epoch() != spec.cluster.config.epoch() || running.epoch() > 0 {
        spec.cluster = spec.cluster.in_config(running.clone())?;
    }
    let Some(me) = running.replica_with(&spec.keys.public()) else {
        tracing::warn!(
            epoch = running.epoch(),
            "this replica is not a member of its configuration: it was removed"
        );
        return Ok(Ended::Removed);
    };
    if me.0 != spec.id {
        tracing::info!(
            slot = spec.id,
            id = me.0,
            epoch = running.epoch(),
            "a reconfiguration renumbered this replica: it is member {} of its configuration",
            me.0
        );
    }
    if running.epoch() > 0 {
        tracing::info!(
            epoch = running.epoch(),
            replicas = running.replicas.len(),
            u = running.u,
            r = running.r,
            "running in a reconfigured configuration"
        );
    }
    let cluster = spec.cluster.clone();
    let config = cluster.config.clone();
    crate::timeline::start(&format!("replica-{}", spec.id));
    let entry = cluster.file.replica(me.0)?.clone();
    let keys = Arc::new(KeyRing::new(&config, Process::Replica(me), &spec.keys));
    let Built {
        members,
        recovery,
        corrupt,
    } = build_members(&spec, me, &keys)?;
    let counters = Arc::new(Counters::default());
    let inbox = Arc::new(Inbox::new(counters.clone()));
    let routes = Arc::new(ClientRoutes::default());
    let replica_listener = bind(&entry.replica_addr, "replicas").await?;
    let client_listener = bind(&entry.client_addr, "clients").await?;
    let metrics_listener = bind_tcp(&entry.metrics_addr, "metrics").await?;
    let metrics_token = cluster.metrics_token()?;
    let metrics_on_loopback = metrics_listener.local_addr().is_ok_and(|a| a.ip().is_loopback());
    if metrics_token.is_none() && !metrics_on_loopback {
        tracing::warn!(
            metrics = %entry.metrics_addr,
            "the metrics endpoint is reachable beyond this host and needs no token: set metrics_token_file in cluster.toml (upright init --metrics-token writes one)"
        );
    }
    let name = config.cluster_name.clone();
    let data_dir = cluster.data_dir(spec.id);
    let marker = crate::recovery::read_marker(&data_dir);
    let period_ms = cluster.file.recovery_interval_secs.saturating_mul(1000);
    let n = cluster.file.replicas.len() as u32;
    let mut proactive = RecoveryCtl {
        next_due_ms: (period_ms > 0)
            .then(|| crate::recovery::next_scheduled(crate::recovery::unix_ms(), period_ms, me.0, n)),
        dir: data_dir,
        id: me.0,
        n,
        period_ms,
        marker: marker.clone(),
        completed: false,
    };
    if let Some(marker) = &marker {
        tracing::info!(
            id = marker.started_unix_ms,
            reason = %marker.reason,
            "proactive recovery: started fresh; new key epoch, recovery point from the peers, state to be checked against a certified checkpoint"
        );
    }
    // One connection per replica pair, dialled by the lower key and carrying both directions
    // (transport::PeerLinks): the queues for those that dial us exist before the listener runs.
    // A replica that runs in a reconfigured configuration also speaks as the previous one names
    // it, to the members that have not switched yet (transport::Identities).
    let previous = upright_core::reconfig::predecessor(&config).and_then(|p| identity_in(&p, &config, &spec.keys));
    let mut identities = vec![Identity {
        keys: keys.clone(),
        peers: None,
    }];
    identities.extend(previous.clone());
    let identities = Arc::new(Identities::new(identities));
    let links = Arc::new(PeerLinks::default());
    let mine = spec.keys.public();
    let mut peers = BTreeMap::new();
    for (j, peer) in cluster.file.replicas.iter().enumerate() {
        let id = ReplicaId(j as u32);
        let theirs = config.replicas[j].keys;
        if id == me {
            continue;
        }
        if !dials(&mine, &theirs) {
            peers.insert(id, links.register(Process::Replica(id), counters.clone()));
            continue;
        }
        let mut named = vec![(keys.clone(), Process::Replica(id))];
        if let Some(previous) = &previous {
            let before = previous
                .peers
                .iter()
                .flatten()
                .find(|(_, routed)| **routed == Process::Replica(id))
                .map(|(there, _)| *there);
            named.extend(before.map(|there| (previous.keys.clone(), there)));
        }
        let addr = endpoint(&peer.replica_addr)?;
        let dialer = dial_peer_as(
            addr,
            named,
            Process::Replica(id),
            name.clone(),
            inbox.clone(),
            MESSAGE_BYTES_MAX,
            counters.clone(),
        );
        peers.insert(id, dialer);
    }
    tokio::spawn(serve(
        replica_listener,
        identities.clone(),
        name.clone(),
        |p| matches!(p, Process::Replica(_)),
        inbox.clone(),
        None,
        Some(links.clone()),
        MESSAGE_BYTES_MAX,
        counters.clone(),
    ));
    // Clients too may name this replica as the previous configuration does (one that has not
    // learnt of the change yet): it learns of it once connected.
    tokio::spawn(serve(
        client_listener,
        identities.clone(),
        name.clone(),
        |p| matches!(p, Process::Client(_)),
        inbox.clone(),
        Some(routes.clone()),
        None,
        client_frame_max(&cluster),
        counters.clone(),
    ));
    let status = Arc::new(Mutex::new(Status {
        replica: spec.id,
        config_epoch: config.epoch(),
        recovery,
        corrupt_recoveries: corrupt,
        health: "starting".into(),
        proactive: crate::metrics::Proactive {
            state: if marker.is_some() { "recovering" } else { "none" }.into(),
            id: marker.as_ref().map_or(0, |m| m.started_unix_ms),
            reason: marker.as_ref().map(|m| m.reason.clone()).unwrap_or_default(),
            next_scheduled_unix_ms: proactive.next_due_ms.unwrap_or(0),
            ..Default::default()
        },
        ..Status::default()
    }));
    tokio::spawn(serve_http(metrics_listener, status.clone(), metrics_token));
    tracing::info!(
        replica = spec.id,
        replicas = %entry.replica_addr,
        clients = %entry.client_addr,
        metrics = %entry.metrics_addr,
        "replica started"
    );
    let mut router = NetRouter {
        peers,
        routes,
        counters: counters.clone(),
        growth: Growth {
            config: config.clone(),
            secret: spec.keys.clone(),
            name: name.clone(),
            inbox: inbox.clone(),
            identities,
            links,
            handing_over: None,
        },
    };
    let host = Host::new(me, members).with_exec_base(config.exec_process_base());
    let idle_spin = Duration::from_micros(cluster.file.idle_spin_us);
    let result = event_loop(
        host,
        &mut router,
        inbox,
        status,
        counters,
        corrupt > 0,
        idle_spin,
        config.knobs.peer_cut_off.then(upright_core::cutoff::CutOff::default),
        &mut proactive,
        shutdown,
    )
    .await;
    crate::timeline::flush();
    result
}

#[allow(clippy::too_many_arguments)]
async fn event_loop(
    mut host: Host<StageLog>,
    router: &mut NetRouter,
    inbox: Arc<Inbox>,
    status: Arc<Mutex<Status>>,
    counters: Arc<Counters>,
    lost_storage: bool,
    idle_spin: Duration,
    mut cutoff: Option<upright_core::cutoff::CutOff>,
    recovery: &mut RecoveryCtl,
    shutdown: impl Future<Output = ()>,
) -> Result<Ended, FileError> {
    let mut clock = Clock::new();
    let epoch = router.growth.config.epoch();
    let io = |e: std::io::Error| FileError(format!("storage failure: {e}"));
    if recovery.marker.is_some() {
        host.start_recovering(clock.now());
    } else {
        host.start(clock.now());
    }
    host.flush(clock.now(), router).map_err(io)?;
    let mut next_publish = tokio::time::Instant::now();
    tokio::pin!(shutdown);
    // One sleep for the whole loop, moved to each round's deadline. A new `sleep_until` per
    // round registered a fresh timer after the runtime had parked with none, and the runtime then
    // woke itself through its eventfd (a write and an extra `epoll_wait`). Moving the deadline
    // earlier still does that (a new hold timer per batch): on the Redis SET benchmark a backup
    // went from 0.87 to 0.75 such writes per batch.
    let sleep = tokio::time::sleep_until(next_publish);
    tokio::pin!(sleep);
    loop {
        // Publish on a deadline, not only when idle, so status stays fresh under sustained load.
        if tokio::time::Instant::now() >= next_publish {
            publish_status(&host, router, &inbox, &status, &counters, lost_storage);
            if let Some(ended) = recovery.poll(&host, &status) {
                return Ok(ended);
            }
            next_publish = tokio::time::Instant::now() + PUBLISH_EVERY;
        }
        let wake = host.next_timer().map(|at| clock.instant_of(at));
        let wake = wake.map_or(next_publish, |w| w.min(next_publish));
        if sleep.deadline() != wake {
            sleep.as_mut().reset(wake);
        }
        // Out of input: spin a little before sleeping (crate::spin). Each turn yields the CPU to
        // any other runnable thread, then lets the runtime poll the sockets without blocking, so
        // the connection tasks fill the inbox; a due timer ends the spin too. It spins after
        // every round, also one that only answered a client: spinning only after rounds that
        // sent to another replica (when a reply is expected soon) measured 18% slower, the
        // CPUs then going idle between the client's operations.
        if inbox.is_empty() && !idle_spin.is_zero() {
            let until = (tokio::time::Instant::now() + idle_spin).min(wake);
            while inbox.is_empty() && tokio::time::Instant::now() < until {
                crate::spin::yield_cpu();
                tokio::task::yield_now().await;
            }
        }
        if inbox.is_empty() {
            tokio::select! {
                _ = inbox.notified() => {}
                _ = &mut sleep => {}
                _ = &mut shutdown => return Ok(Ended::Shutdown),
            }
        } else if futures_poll_ready(&mut shutdown).await {
            return Ok(Ended::Shutdown);
        }
        let now = clock.now();
        crate::timeline::event("wake", inbox.len() as u64, 0, 0);
        host.fire_timers(now);
        for (from, envelope) in inbox.pop_round_robin(INPUTS_PER_ROUND_MAX) {
            timeline::message("recv", &envelope.message, timeline::peer(&envelope.from));
            // Peer replicas' messages pass the cut-off (`upright_core::cutoff`), if it is on;
            // not those of a peer running in another configuration (during a reconfiguration,
            // its messages fail our checks without proving it faulty; its hello said so).
            let (Process::Replica(peer), Some(cutoff)) = (from, cutoff.as_mut()) else {
                host.deliver(now, envelope);
                continue;
            };
            if inbox.peer_epoch(from).is_some_and(|e| e != epoch) {
                host.deliver(now, envelope);
                continue;
            }
            if cutoff.is_cut(peer, now) {
                counters.bump("net_dropped_cut_off");
                continue;
            }
            let rejected = host.deliver(now, envelope);
            if let Some(cut) = cutoff.observe(peer, now, rejected) {
                counters.bump("net_peer_cut_off");
                tracing::warn!(
                    peer = peer.0,
                    seconds = cut as f64 / 1e6,
                    "peer replica cut off: its messages keep failing checks that prove it faulty"
                );
            }
        }
        // Sends that do not depend on this round's sync (a PREPARE next to the COMMIT that does)
        // are handed to the connection tasks first, and a yield lets them write before the sync
        // blocks this thread.
        if host.send_ahead(now, router) {
            tokio::task::yield_now().await;
        }
        host.flush(now, router).map_err(io)?;
        if let Some(change) = host.progress.handing_over.take() {
            router.connect_added(&change);
        }
        if let Some((epoch, member)) = host.progress.reconfigured {
            // The order member wrote its epoch record (synced by the flush): start again in
            // the new configuration, or stop if the change removed this replica.
            for m in host.members_mut() {
                m.log.sync().map_err(io)?;
            }
            tracing::info!(
                epoch,
                member,
                "configuration ended: the replica starts again in the next one"
            );
            return Ok(if member { Ended::Reconfigure } else { Ended::Removed });
        }
        // More input waiting: let the connection tasks write this round's sends (and read) first.
        // Nothing waiting: the wait above parks this task, which runs them anyway; a yield here
        // would only cost the runtime an extra zero-timeout poll of the OS per round.
        if !inbox.is_empty() {
            tokio::task::yield_now().await;
        }
    }
}

/// Whether `shutdown` has completed, without waiting.
async fn futures_poll_ready<F: Future<Output = ()>>(shutdown: &mut std::pin::Pin<&mut F>) -> bool {
    tokio::select! {
        biased;
        _ = shutdown.as_mut() => true,
        _ = std::future::ready(()) => false,
    }
}

fn publish_status(
    host: &Host<StageLog>,
    router: &NetRouter,
    inbox: &Inbox,
    status: &Mutex<Status>,
    counters: &Counters,
    lost_storage: bool,
) {
    let mut s = status.lock().expect("status lock");
    s.progress = host.progress.clone();
    s.host = host.stats.clone();
    s.net = counters.snapshot();
    s.inbox_depth = inbox.len();
    s.outbound_depth = router.peers.iter().map(|(r, d)| (r.0, d.queue_depth())).collect();
    for member in host.members() {
        let name = stage_name(member.kind).to_string();
        s.stage_stats
            .insert(name.clone(), member.stage.stats().counters.clone());
        s.log_stats.insert(name, member.log.stats());
    }
    s.health = if lost_storage && host.progress.state_loads == 0 && host.progress.executed == 0 {
        "recovering".into()
    } else {
        "ok".into()
    };
}

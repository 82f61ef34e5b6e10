//! Digests, MACs, MAC authenticators, matrix signatures (UpRight thesis Appendix A), Ed25519
//! signatures for control messages, and pairwise MAC keys derived from long-term X25519 keys.
//!
//! Choices: BLAKE3 for digests (32 bytes) and, in keyed mode, for MACs (truncated to 16 bytes:
//! 128-bit tags, as PBFT's UMAC32 tags were far shorter); Ed25519 (ed25519-dalek) for signatures;
//! X25519 Diffie-Hellman plus BLAKE3's key derivation mode for pairwise keys, bound to the cluster
//! name and both processes.
//!
//! Measured cost of each primitive (`cargo bench -p upright-core --bench crypto`) is recorded in
//! `crates/core/README.md`.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, RwLock};

use serde::{Deserialize, Serialize};

use crate::config::{ClusterConfig, PublicKeys};
use crate::ids::{Principal, Process, ReplicaId};

/// A 32-byte BLAKE3 digest. Encoded as a byte string (see [`fixed_bytes`]).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize)]
pub struct Digest(#[serde(with = "fixed_bytes")] pub [u8; 32]);

impl std::fmt::Debug for Digest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for byte in &self.0[..6] {
            write!(f, "{byte:02x}")?;
        }
        Ok(())
    }
}

impl Digest {
    /// Digest of `bytes`.
    pub fn of(bytes: &[u8]) -> Digest {
        Digest(*blake3::hash(bytes).as_bytes())
    }

    /// Digest of several parts, each length-prefixed so that part boundaries are unambiguous.
    pub fn of_parts(domain: &str, parts: &[&[u8]]) -> Digest {
        let mut hasher = blake3::Hasher::new();
        hasher.update(&(domain.len() as u64).to_le_bytes());
        hasher.update(domain.as_bytes());
        for part in parts {
            hasher.update(&(part.len() as u64).to_le_bytes());
            hasher.update(part);
        }
        Digest(*hasher.finalize().as_bytes())
    }
}

/// A 16-byte MAC tag. Encoded as a byte string (see [`fixed_bytes`]).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub struct Mac(#[serde(with = "fixed_bytes")] pub [u8; 16]);

impl std::fmt::Debug for Mac {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "mac:{:02x}{:02x}", self.0[0], self.0[1])
    }
}

/// A symmetric key shared by two processes.
#[derive(Clone)]
pub struct MacKey([u8; 32]);

impl MacKey {
    /// MAC over a message digest.
    pub fn mac(&self, digest: &Digest) -> Mac {
        let full = blake3::keyed_hash(&self.0, &digest.0);
        let mut tag = [0u8; 16];
        tag.copy_from_slice(&full.as_bytes()[..16]);
        Mac(tag)
    }

    /// Checks a MAC in constant time.
    pub fn verify(&self, digest: &Digest, mac: &Mac) -> bool {
        let expected = self.mac(digest);
        // Constant-time comparison: fold the XOR of all bytes.
        expected
            .0
            .iter()
            .zip(mac.0.iter())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
    }

    /// [`MacKey::verify`] as a result: `BadTag` if the MAC does not verify.
    pub fn check(&self, digest: &Digest, mac: &Mac) -> Result<(), AuthError> {
        if self.verify(digest, mac) {
            Ok(())
        } else {
            Err(AuthError::BadTag)
        }
    }
}

/// A MAC authenticator: one MAC per recipient, all over the same digest (PBFT section 3.3).
///
/// Entries are indexed by replica index of the receiving stage: `macs[i]` is for member `i`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Authenticator {
    /// One MAC per member of the receiving stage, by index.
    pub macs: Vec<Mac>,
}

/// One row of a matrix signature: an authentication member's authenticator for all order
/// members over the digest of a request entry.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct MatrixRow {
    /// The authentication member that checked the client's request.
    pub signer: ReplicaId,
    /// Its MACs for each order member, over the entry digest.
    pub authenticator: Authenticator,
}

/// A matrix signature (Aiyer et al., DISC 2008; UpRight Appendix A): rows from distinct
/// authentication members. Valid at order member `o` when at least `matrix_accept` rows carry a
/// MAC that verifies for `o`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct MatrixSignature {
    /// The rows, from distinct signers.
    pub rows: Vec<MatrixRow>,
}

/// An Ed25519 signature. Encoded as a byte string (see [`fixed_bytes`]).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Signature(#[serde(with = "fixed_bytes")] pub [u8; 64]);

impl std::fmt::Debug for Signature {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "sig:{:02x}{:02x}", self.0[0], self.0[1])
    }
}

/// Serde for the fixed-size byte arrays of [`Digest`], [`Mac`] and [`Signature`]: one byte string
/// (postcard: a length varint, then the bytes, copied in one piece) instead of serde's default of an
/// `N`-element tuple walked element by element. Decoding borrows the bytes where the format allows
/// and refuses any other length; it also accepts a sequence of `N` bytes (what human-readable
/// formats such as JSON write for a byte string).
pub mod fixed_bytes {
    use serde::de::{Error, SeqAccess, Visitor};
    use serde::{Deserializer, Serializer};

    /// Writes the array as one byte string.
    pub fn serialize<S: Serializer, const N: usize>(bytes: &[u8; N], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(bytes)
    }

    /// Reads a byte string of exactly `N` bytes.
    pub fn deserialize<'de, D: Deserializer<'de>, const N: usize>(d: D) -> Result<[u8; N], D::Error> {
        d.deserialize_bytes(FixedVisitor::<N>)
    }

    struct FixedVisitor<const N: usize>;

    impl<'de, const N: usize> Visitor<'de> for FixedVisitor<N> {
        type Value = [u8; N];

        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            write!(f, "{N} bytes")
        }

        fn visit_bytes<E: Error>(self, bytes: &[u8]) -> Result<[u8; N], E> {
            bytes.try_into().map_err(|_| E::invalid_length(bytes.len(), &self))
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<[u8; N], A::Error> {
            let mut out = [0u8; N];
            for (i, byte) in out.iter_mut().enumerate() {
                *byte = seq.next_element()?.ok_or_else(|| A::Error::invalid_length(i, &self))?;
            }
            if seq.next_element::<u8>()?.is_some() {
                return Err(A::Error::invalid_length(N + 1, &self));
            }
            Ok(out)
        }
    }
}

/// A principal's long-term secret keys.
#[derive(Clone)]
pub struct SecretKeys {
    x25519: x25519_dalek::StaticSecret,
    ed25519: ed25519_dalek::SigningKey,
}

impl SecretKeys {
    /// Derives a key pair from 32 bytes of secret randomness (the runtime reads them from the OS;
    /// the simulator from its seed).
    pub fn from_seed(seed: [u8; 32]) -> SecretKeys {
        let x_seed = blake3::derive_key("upright x25519 secret v1", &seed);
        let e_seed = blake3::derive_key("upright ed25519 secret v1", &seed);
        SecretKeys {
            x25519: x25519_dalek::StaticSecret::from(x_seed),
            ed25519: ed25519_dalek::SigningKey::from_bytes(&e_seed),
        }
    }

    /// Signs a digest with the Ed25519 key (an administrator's reconfiguration).
    pub fn sign(&self, digest: &Digest) -> Signature {
        use ed25519_dalek::Signer;
        Signature(self.ed25519.sign(&digest.0).to_bytes())
    }

    /// The matching public keys.
    pub fn public(&self) -> PublicKeys {
        PublicKeys {
            x25519: x25519_dalek::PublicKey::from(&self.x25519).to_bytes(),
            ed25519: self.ed25519.verifying_key().to_bytes(),
        }
    }

    /// The 32 secret seed bytes cannot be recovered; this exports the raw secret keys for storage.
    pub fn to_bytes(&self) -> [u8; 64] {
        let mut out = [0u8; 64];
        out[..32].copy_from_slice(&self.x25519.to_bytes());
        out[32..].copy_from_slice(&self.ed25519.to_bytes());
        out
    }

    /// Inverse of [`SecretKeys::to_bytes`].
    pub fn from_bytes(bytes: &[u8; 64]) -> SecretKeys {
        let mut x = [0u8; 32];
        x.copy_from_slice(&bytes[..32]);
        let mut e = [0u8; 32];
        e.copy_from_slice(&bytes[32..]);
        SecretKeys {
            x25519: x25519_dalek::StaticSecret::from(x),
            ed25519: ed25519_dalek::SigningKey::from_bytes(&e),
        }
    }
}

/// Checks an Ed25519 signature over `digest` by the holder of the verifying key `public`.
pub fn verify_with_public(public: &[u8; 32], digest: &Digest, signature: &Signature) -> Result<(), AuthError> {
    let key = ed25519_dalek::VerifyingKey::from_bytes(public).map_err(|_| AuthError::UnknownSender)?;
    let sig = ed25519_dalek::Signature::from_bytes(&signature.0);
    key.verify_strict(&digest.0, &sig).map_err(|_| AuthError::BadTag)
}

/// Why a signature or MAC check failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AuthError {
    /// The sender is not part of the configuration.
    UnknownSender,
    /// The authentication block is of the wrong kind or has no entry for us.
    Malformed,
    /// The MAC or signature does not verify.
    BadTag,
}

/// Everything one process needs to authenticate its messages and check others': pairwise MAC
/// keys with every process it can talk to, its signing key, their verifying keys.
///
/// Clients talk only to replicas, so a client's ring holds keys for the replicas alone; a
/// replica's ring holds keys for every replica and every client.
pub struct KeyRing {
    me: Process,
    /// The first replica process hosting an execution member (`Principal::process_at`).
    exec_base: u32,
    /// The long-term pairwise keys of the transport's hello (whatever either side's session or
    /// configuration epoch).
    macs: BTreeMap<Process, MacKey>,
    /// The pairwise keys of key epoch 0: the hello keys, except between two replicas of a
    /// reconfigured cluster, whose keys also bind the configuration epoch (so nothing a replica
    /// MACed in one configuration verifies in another).
    base: BTreeMap<Process, MacKey>,
    /// The configuration epoch these keys are for ([`ClusterConfig::epoch`]).
    config_epoch: u64,
    signing: ed25519_dalek::SigningKey,
    verifying: BTreeMap<Process, ed25519_dalek::VerifyingKey>,
    /// Signatures verified lately (see [`VERIFIED_CACHE_MAX`]).
    verified: std::sync::Mutex<VerifiedCache>,
    /// Our long-term X25519 secret and every peer's public key (session keys, `session.rs`).
    x25519: x25519_dalek::StaticSecret,
    statics: BTreeMap<Process, [u8; 32]>,
    cluster_name: String,
    /// The session keys in use.
    session: RwLock<Session>,
    /// Where ephemeral secrets come from (the OS unless [`KeyRing::set_entropy`] says otherwise).
    entropy: Mutex<Option<Entropy>>,
    /// MACs accepted under the retiring keys (a sender that had not yet seen our NEW-KEY).
    accepted_retiring: AtomicU64,
    /// MACs accepted under keys already retired: always 0 unless retirement is broken (the
    /// simulator's invariant, `Sabotage::KeepRetiredKeys`).
    accepted_retired: AtomicU64,
    /// `Sabotage::KeepRetiredKeys`: [`KeyRing::retire`] keeps the keys (and still records that
    /// they are retired).
    keep_retired: bool,
}

/// A source of 32 secret random bytes.
pub type Entropy = Box<dyn FnMut() -> [u8; 32] + Send>;

/// Signatures a key ring remembers as verified. The same signed message comes back again and
/// again: a checkpoint vote alone, then in the stable certificate of every VIEW-CHANGE and
/// ORDER-CP-STATE that carries it, a VIEW-CHANGE alone and then inside the NEW-VIEW. Checking
/// one costs tens of microseconds of curve arithmetic (40% of a simulator run's time before the
/// cache); remembering it costs a hash and a set lookup.
pub const VERIFIED_CACHE_MAX: usize = 4096;

/// The key of a `(signer, digest, signature)` triple in a [`VerifiedCache`].
fn verified_id(from: Process, digest: &Digest, signature: &Signature) -> [u8; 32] {
    let mut id = blake3::Hasher::new();
    id.update(&process_bytes(from));
    id.update(&digest.0);
    id.update(&signature.0);
    id.finalize().into()
}

/// Hashes of verified `(signer, digest, signature)` triples, oldest dropped first.
#[derive(Default)]
struct VerifiedCache {
    set: std::collections::HashSet<[u8; 32]>,
    order: std::collections::VecDeque<[u8; 32]>,
}

impl VerifiedCache {
    fn contains(&self, key: &[u8; 32]) -> bool {
        self.set.contains(key)
    }

    fn insert(&mut self, key: [u8; 32]) {
        if self.set.insert(key) {
            self.order.push_back(key);
            if self.order.len() > VERIFIED_CACHE_MAX {
                if let Some(old) = self.order.pop_front() {
                    self.set.remove(&old);
                }
            }
        }
    }
}

impl KeyRing {
    /// Derives the pairwise keys of process `me` with the processes it can talk to: every replica
    /// in `config`, and, if `me` is a replica, every client too (clients never talk to each other,
    /// so a client's ring has no client keys: MACs to or from another client never verify).
    ///
    /// Cost: one X25519 exchange per such process, paid once at start-up (for a client, one per
    /// replica, however many clients the configuration lists).
    pub fn new(config: &ClusterConfig, me: Process, secret: &SecretKeys) -> KeyRing {
        let mut others: Vec<(Process, PublicKeys)> = config
            .replicas
            .iter()
            .map(|r| (Process::Replica(r.id), r.keys))
            .collect();
        if matches!(me, Process::Replica(_)) {
            others.extend(config.clients.iter().map(|c| (Process::Client(c.id), c.keys)));
        }
        // `Sabotage::SharedConfigurationKeys`: keys as if every configuration were the first.
        let config_epoch = match config.knobs.sabotage {
            Some(crate::config::Sabotage::SharedConfigurationKeys) => 0,
            _ => config.epoch(),
        };
        let mut macs = BTreeMap::new();
        let mut base = BTreeMap::new();
        let mut verifying = BTreeMap::new();
        let mut statics = BTreeMap::new();
        for (process, keys) in others {
            statics.insert(process, keys.x25519);
            let shared = secret
                .x25519
                .diffie_hellman(&x25519_dalek::PublicKey::from(keys.x25519));
            let (low, high) = if me <= process { (me, process) } else { (process, me) };
            let mut material = Vec::with_capacity(64 + config.cluster_name.len());
            material.extend_from_slice(shared.as_bytes());
            material.extend_from_slice(&process_bytes(low));
            material.extend_from_slice(&process_bytes(high));
            material.extend_from_slice(config.cluster_name.as_bytes());
            let hello = MacKey(blake3::derive_key("upright pairwise mac key v1", &material));
            if config_epoch > 0 && both_replicas(me, process) {
                material.extend_from_slice(&config_epoch.to_le_bytes());
                let key = blake3::derive_key("upright pairwise mac key of a configuration v1", &material);
                base.insert(process, MacKey(key));
            } else {
                base.insert(process, hello.clone());
            }
            macs.insert(process, hello);
            if let Ok(key) = ed25519_dalek::VerifyingKey::from_bytes(&keys.ed25519) {
                verifying.insert(process, key);
            }
        }
        let session = Session {
            epoch: 0,
            announcement: None,
            incoming: base.clone(),
            retiring: None,
            retired: false,
            outgoing: base.clone(),
            peer_epochs: BTreeMap::new(),
        };
        KeyRing {
            me,
            exec_base: config.exec_process_base(),
            macs,
            base,
            config_epoch,
            signing: secret.ed25519.clone(),
            verifying,
            verified: std::sync::Mutex::default(),
            x25519: secret.x25519.clone(),
            statics,
            cluster_name: config.cluster_name.clone(),
            session: RwLock::new(session),
            entropy: Mutex::new(None),
            accepted_retiring: AtomicU64::new(0),
            accepted_retired: AtomicU64::new(0),
            keep_retired: config.knobs.sabotage == Some(crate::config::Sabotage::KeepRetiredKeys),
        }
    }

    /// The first replica process hosting an execution member in this ring's configuration.
    pub fn exec_base(&self) -> u32 {
        self.exec_base
    }

    /// The process that holds `principal`'s keys in this ring's configuration.
    pub fn process_of(&self, principal: Principal) -> Process {
        principal.process_at(self.exec_base)
    }

    fn session(&self) -> std::sync::RwLockReadGuard<'_, Session> {
        self.session.read().expect("session keys lock")
    }

    /// Our MAC for `to` under the session's outgoing key (a zero tag that never verifies for an
    /// unknown recipient: sending to one is a bug of the caller, caught by the receiver's check).
    fn outgoing_mac(&self, session: &Session, to: Principal, digest: &Digest) -> Mac {
        session
            .outgoing
            .get(&self.process_of(to))
            .map_or(Mac::default(), |key| key.mac(digest))
    }

    /// MAC for one recipient under the long-term pairwise key (the transport's hello: a
    /// connection must be possible whatever either side's session epoch).
    pub fn static_mac_for(&self, to: Principal, digest: &Digest) -> Mac {
        self.macs
            .get(&self.process_of(to))
            .map_or(Mac::default(), |key| key.mac(digest))
    }

    /// Checks a MAC from `from` under the long-term pairwise key.
    pub fn verify_static_mac(&self, from: Principal, digest: &Digest, mac: &Mac) -> Result<(), AuthError> {
        self.macs
            .get(&self.process_of(from))
            .ok_or(AuthError::UnknownSender)?
            .check(digest, mac)
    }

    /// Where ephemeral secrets come from (the simulator: its seed; default: the OS).
    pub fn set_entropy(&self, entropy: Entropy) {
        *self.entropy.lock().expect("entropy lock") = Some(entropy);
    }

    fn fresh_secret(&self) -> [u8; 32] {
        let mut source = self.entropy.lock().expect("entropy lock");
        match source.as_mut() {
            Some(f) => f(),
            None => {
                let mut bytes = [0u8; 32];
                getrandom::fill(&mut bytes).expect("the OS gives random bytes");
                bytes
            }
        }
    }

    /// The configuration epoch of these keys.
    pub fn config_epoch(&self) -> u64 {
        self.config_epoch
    }

    /// The key ring of the same process in configuration `config` (after a reconfiguration; `me`
    /// is its id there): keys derived afresh from the same long-term secrets, session keys
    /// starting over as after a restart. With `take_entropy`, the entropy source moves to the new
    /// ring (a client that adopts a new configuration keeps refreshing from it).
    pub fn successor(&self, config: &ClusterConfig, me: Process, take_entropy: bool) -> KeyRing {
        let secret = SecretKeys {
            x25519: self.x25519.clone(),
            ed25519: self.signing.clone(),
        };
        let ring = KeyRing::new(config, me, &secret);
        if take_entropy {
            if let Some(entropy) = self.entropy.lock().expect("entropy lock").take() {
                ring.set_entropy(entropy);
            }
        }
        ring
    }

    /// What session keys with `peer` are bound to besides the two processes and the epoch: the
    /// cluster, and between replicas of a reconfigured cluster the configuration epoch.
    fn domain(&self, peer: Process) -> std::borrow::Cow<'_, str> {
        if self.config_epoch > 0 && both_replicas(self.me, peer) {
            std::borrow::Cow::Owned(format!("{}\0configuration {}", self.cluster_name, self.config_epoch))
        } else {
            std::borrow::Cow::Borrowed(&self.cluster_name)
        }
    }

    /// Whether `process` is one we hold keys for.
    pub fn knows(&self, process: Process) -> bool {
        self.statics.contains_key(&process)
    }

    /// Our receive epoch (0 until the first refresh).
    pub fn epoch(&self) -> u64 {
        self.session().epoch
    }

    /// Our latest NEW-KEY, if we refreshed.
    pub fn announcement(&self) -> Option<NewKey> {
        self.session().announcement.clone()
    }

    /// `peer`'s latest epoch we installed (0: none).
    pub fn peer_epoch(&self, peer: Process) -> u64 {
        self.session().peer_epochs.get(&peer).copied().unwrap_or(0)
    }

    /// MACs accepted so far under keys being retired.
    pub fn accepted_retiring(&self) -> u64 {
        self.accepted_retiring.load(Ordering::Relaxed)
    }

    /// MACs accepted so far under keys that were already retired: 0 in a correct key ring
    /// (checked by the simulator for every process; see `Sabotage::KeepRetiredKeys`).
    pub fn accepted_retired(&self) -> u64 {
        self.accepted_retired.load(Ordering::Relaxed)
    }

    /// Starts receive epoch `epoch` (greater than ours; `None` otherwise): a fresh ephemeral key,
    /// new keys for every incoming channel, the current ones kept as the retiring ones (any older
    /// retiring keys are dropped), and the signed NEW-KEY to send every peer. Costs one X25519
    /// exchange per peer.
    pub fn refresh(&self, epoch: u64) -> Option<NewKey> {
        if epoch <= self.epoch() {
            return None;
        }
        let ephemeral = x25519_dalek::StaticSecret::from(blake3::derive_key(
            "upright ephemeral x25519 secret v1",
            &self.fresh_secret(),
        ));
        let public = x25519_dalek::PublicKey::from(&ephemeral).to_bytes();
        let incoming: BTreeMap<Process, MacKey> = self
            .statics
            .iter()
            .map(|(peer, key)| {
                let shared = ephemeral.diffie_hellman(&x25519_dalek::PublicKey::from(*key));
                let key = session_key(shared.as_bytes(), *peer, self.me, epoch, &self.domain(*peer));
                (*peer, MacKey(key))
            })
            .collect();
        let signature = self.sign(&NewKey::digest(&self.cluster_name, self.me, epoch, &public));
        let announcement = NewKey {
            epoch,
            public,
            signature,
        };
        let mut session = self.session.write().expect("session keys lock");
        // Messages between co-located members (our process to itself) use the new key at once.
        if let Some(own) = incoming.get(&self.me) {
            session.outgoing.insert(self.me, own.clone());
            session.peer_epochs.insert(self.me, epoch);
        }
        session.retiring = Some(std::mem::replace(&mut session.incoming, incoming));
        session.retired = false;
        session.epoch = epoch;
        session.announcement = Some(announcement.clone());
        Some(announcement)
    }

    /// Forgets every session key (a restart: they lived in memory); the long-term keys are used
    /// until the next refresh and the peers' next NEW-KEYs.
    pub fn reset_session(&self) {
        let mut session = self.session.write().expect("session keys lock");
        session.epoch = 0;
        session.announcement = None;
        session.incoming = self.base.clone();
        session.retiring = None;
        session.retired = false;
        session.outgoing = self.base.clone();
        session.peer_epochs.clear();
    }

    /// Drops the previous epoch's incoming keys: messages under them are refused from now on.
    pub fn retire(&self) {
        let mut session = self.session.write().expect("session keys lock");
        session.retired = true;
        if !self.keep_retired {
            session.retiring = None;
        }
    }

    /// Whether keys of a previous epoch are still accepted.
    pub fn retiring(&self) -> bool {
        let session = self.session();
        session.retiring.is_some() && !session.retired
    }

    /// A NEW-KEY from `from`: checks its signature and, if its epoch is newer than any seen from
    /// `from`, makes our messages to `from` use its key.
    pub fn accept_new_key(&self, from: Process, new_key: &NewKey) -> Result<Accepted, AuthError> {
        let (Some(verifying), Some(_)) = (self.verifying.get(&from), self.statics.get(&from)) else {
            return Err(AuthError::UnknownSender);
        };
        if new_key.epoch <= self.peer_epoch(from) {
            return Ok(Accepted::Stale);
        }
        let digest = NewKey::digest(&self.cluster_name, from, new_key.epoch, &new_key.public);
        let sig = ed25519_dalek::Signature::from_bytes(&new_key.signature.0);
        verifying
            .verify_strict(&digest.0, &sig)
            .map_err(|_| AuthError::BadTag)?;
        let shared = self
            .x25519
            .diffie_hellman(&x25519_dalek::PublicKey::from(new_key.public));
        let key = session_key(shared.as_bytes(), self.me, from, new_key.epoch, &self.domain(from));
        let mut session = self.session.write().expect("session keys lock");
        if new_key.epoch <= session.peer_epochs.get(&from).copied().unwrap_or(0) {
            return Ok(Accepted::Stale);
        }
        session.peer_epochs.insert(from, new_key.epoch);
        session.outgoing.insert(from, MacKey(key));
        Ok(Accepted::Installed)
    }

    /// The process these keys belong to.
    pub fn me(&self) -> Process {
        self.me
    }

    /// MAC for one recipient.
    pub fn mac_for(&self, to: Principal, digest: &Digest) -> Mac {
        self.outgoing_mac(&self.session(), to, digest)
    }

    /// Checks a MAC from `from` over `digest`.
    pub fn verify_mac(&self, from: Principal, digest: &Digest, mac: &Mac) -> Result<(), AuthError> {
        let session = self.session();
        let process = self.process_of(from);
        let key = session.incoming.get(&process).ok_or(AuthError::UnknownSender)?;
        if key.verify(digest, mac) {
            return Ok(());
        }
        let retiring = session.retiring.as_ref().and_then(|keys| keys.get(&process));
        if retiring.is_some_and(|key| key.verify(digest, mac)) {
            let counter = if session.retired {
                &self.accepted_retired
            } else {
                &self.accepted_retiring
            };
            counter.fetch_add(1, Ordering::Relaxed);
            return Ok(());
        }
        Err(AuthError::BadTag)
    }

    /// An authenticator with one MAC for each of `recipients` (member `i` of a stage at index `i`).
    pub fn authenticator(&self, recipients: impl Iterator<Item = Principal>, digest: &Digest) -> Authenticator {
        let session = self.session();
        Authenticator {
            macs: recipients.map(|to| self.outgoing_mac(&session, to, digest)).collect(),
        }
    }

    /// One authenticator per digest, each with a MAC for every one of `recipients` (one lock
    /// taken for all).
    pub fn authenticator_many(
        &self,
        recipients: impl Iterator<Item = Principal> + Clone,
        digests: impl Iterator<Item = Digest>,
    ) -> Vec<Authenticator> {
        let session = self.session();
        digests
            .map(|digest| Authenticator {
                macs: recipients
                    .clone()
                    .map(|to| self.outgoing_mac(&session, to, &digest))
                    .collect(),
            })
            .collect()
    }

    /// Checks our entry (index `my_index`) of an authenticator from `from`.
    pub fn verify_authenticator(
        &self,
        from: Principal,
        my_index: usize,
        digest: &Digest,
        authenticator: &Authenticator,
    ) -> Result<(), AuthError> {
        let mac = authenticator.macs.get(my_index).ok_or(AuthError::Malformed)?;
        self.verify_mac(from, digest, mac)
    }

    /// Signs a digest with our Ed25519 key.
    pub fn sign(&self, digest: &Digest) -> Signature {
        use ed25519_dalek::Signer;
        Signature(self.signing.sign(&digest.0).to_bytes())
    }

    /// Checks an Ed25519 signature by `from` over `digest`.
    pub fn verify_signature(&self, from: Principal, digest: &Digest, signature: &Signature) -> Result<(), AuthError> {
        let process = self.process_of(from);
        let key = self.verifying.get(&process).ok_or(AuthError::UnknownSender)?;
        let id = verified_id(process, digest, signature);
        if self.verified.lock().expect("verified cache lock").contains(&id) {
            return Ok(());
        }
        let sig = ed25519_dalek::Signature::from_bytes(&signature.0);
        key.verify_strict(&digest.0, &sig).map_err(|_| AuthError::BadTag)?;
        self.verified.lock().expect("verified cache lock").insert(id);
        Ok(())
    }

    /// Checks many Ed25519 signatures at once (`ed25519_dalek::verify_batch`: one multiscalar
    /// multiplication for all; measured here, 40 us a signature one by one, 29 us each in a batch
    /// of 2, 23 us at 4, 19 us at 8 to 64). True when
    /// every one verifies; each is then remembered as verified, so that checking it alone with
    /// [`KeyRing::verify_signature`] costs a lookup. False when any fails or a signer is unknown:
    /// nothing is remembered, and the caller checks them one by one to find the bad ones.
    ///
    /// The batch equation may accept a crafted signature that the one-by-one check refuses (a
    /// torsion component in `R`; it passes with probability about 1/8). Only a client can sign a
    /// request with its key, so such a signature is a faulty client's, and all it can do is make
    /// some authentication members accept a request that others refuse and blacklist it for, as
    /// inconsistent authenticators already can.
    pub fn verify_signatures(&self, items: &[(Principal, Digest, Signature)]) -> bool {
        let mut keys = Vec::with_capacity(items.len());
        for (from, _, _) in items {
            match self.verifying.get(&self.process_of(*from)) {
                Some(key) => keys.push(*key),
                None => return false,
            }
        }
        let messages: Vec<&[u8]> = items.iter().map(|(_, digest, _)| &digest.0[..]).collect();
        let signatures: Vec<ed25519_dalek::Signature> = items
            .iter()
            .map(|(_, _, signature)| ed25519_dalek::Signature::from_bytes(&signature.0))
            .collect();
        if ed25519_dalek::verify_batch(&messages, &signatures, &keys).is_err() {
            return false;
        }
        let mut cache = self.verified.lock().expect("verified cache lock");
        for (from, digest, signature) in items {
            cache.insert(verified_id(self.process_of(*from), digest, signature));
        }
        true
    }

    /// Counts matrix-signature rows from distinct authentication members whose MAC for order
    /// member `my_index` verifies over `digest`.
    pub fn count_valid_matrix_rows(
        &self,
        my_index: usize,
        n_auth: usize,
        digest: &Digest,
        matrix: &MatrixSignature,
    ) -> usize {
        let mut seen = std::collections::BTreeSet::new();
        matrix
            .rows
            .iter()
            .filter(|row| (row.signer.0 as usize) < n_auth && seen.insert(row.signer))
            .filter(|row| {
                self.verify_authenticator(Principal::Auth(row.signer), my_index, digest, &row.authenticator)
                    .is_ok()
            })
            .count()
    }
}

// ---- session keys (key refresh: `crate::session`) ----

/// A signed announcement of a process's next receive epoch.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct NewKey {
    /// The epoch (greater than every earlier one of the same process).
    pub epoch: u64,
    /// The ephemeral X25519 public key of the epoch.
    #[serde(with = "fixed_bytes")]
    pub public: [u8; 32],
    /// Ed25519 signature of the announcing process over [`NewKey::digest`].
    pub signature: Signature,
}

impl NewKey {
    /// What the signature covers: the cluster, the announcing process, the epoch, the key.
    pub fn digest(cluster_name: &str, from: Process, epoch: u64, public: &[u8; 32]) -> Digest {
        Digest::of_parts(
            "upright new-key v1",
            &[
                cluster_name.as_bytes(),
                &process_bytes(from),
                &epoch.to_le_bytes(),
                public,
            ],
        )
    }
}

/// The key of messages from `sender` to `receiver` under the receiver's epoch `epoch`, from the
/// X25519 shared secret of the sender's static key and the receiver's ephemeral key.
pub(crate) fn session_key(
    shared: &[u8; 32],
    sender: Process,
    receiver: Process,
    epoch: u64,
    cluster: &str,
) -> [u8; 32] {
    let mut material = Vec::with_capacity(32 + 10 + 8 + cluster.len());
    material.extend_from_slice(shared);
    material.extend_from_slice(&process_bytes(sender));
    material.extend_from_slice(&process_bytes(receiver));
    material.extend_from_slice(&epoch.to_le_bytes());
    material.extend_from_slice(cluster.as_bytes());
    blake3::derive_key("upright session mac key v1", &material)
}

fn both_replicas(a: Process, b: Process) -> bool {
    matches!((a, b), (Process::Replica(_), Process::Replica(_)))
}

/// The bytes that name a process in key material and signed digests.
pub(crate) fn process_bytes(process: Process) -> [u8; 5] {
    let (tag, id) = match process {
        Process::Replica(r) => (0u8, r.0),
        Process::Client(c) => (1u8, c.0),
    };
    let mut out = [0u8; 5];
    out[0] = tag;
    out[1..].copy_from_slice(&id.to_le_bytes());
    out
}

/// What a [`KeyRing`] knows of session keys: its own receive epoch and the keys
/// of its incoming channels (the previous epoch's too, until retired), and per peer the peer's
/// latest epoch and the key of our messages to it.
pub(crate) struct Session {
    /// Our receive epoch (0: the long-term keys).
    pub epoch: u64,
    /// Our latest announcement.
    pub announcement: Option<NewKey>,
    /// Per peer, the key of its messages to us in our current epoch.
    pub incoming: BTreeMap<Process, MacKey>,
    /// The previous epoch's incoming keys, accepted until [`KeyRing::retire`].
    pub retiring: Option<BTreeMap<Process, MacKey>>,
    /// [`KeyRing::retire`] was called since the last refresh (the keys in `retiring`, if any,
    /// are there only under `Sabotage::KeepRetiredKeys`).
    pub retired: bool,
    /// Per peer, the key of our messages to it (in its latest announced epoch).
    pub outgoing: BTreeMap<Process, MacKey>,
    /// Per peer, its latest announced epoch (absent: 0).
    pub peer_epochs: BTreeMap<Process, u64>,
}

/// The outcome of a NEW-KEY.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Accepted {
    /// A newer epoch: our messages to the peer now use its key.
    Installed,
    /// An epoch we have seen or one before it (a replay or a reordered duplicate): ignored.
    Stale,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{ClientInfo, Knobs, ReplicaInfo};
    use crate::ids::ClientId;

    pub(crate) fn test_config(n: u32) -> (ClusterConfig, Vec<SecretKeys>, SecretKeys) {
        let secrets: Vec<SecretKeys> = (0..n).map(|i| SecretKeys::from_seed([i as u8 + 1; 32])).collect();
        let client = SecretKeys::from_seed([200; 32]);
        let config = ClusterConfig {
            cluster_name: "test".into(),
            u: 1,
            r: 1,
            replicas: secrets
                .iter()
                .enumerate()
                .map(|(i, s)| ReplicaInfo {
                    id: ReplicaId(i as u32),
                    keys: s.public(),
                })
                .collect(),
            clients: vec![ClientInfo {
                id: ClientId(7),
                keys: client.public(),
            }],
            knobs: Knobs::default(),
            admin: None,
            epoch: 0,
            origin: None,
            protocol: Default::default(),
            selective_execution: false,
            separate_stages: false,
            exec_u: None,
        };
        (config, secrets, client)
    }

    /// A remembered signature verifies again without the curve arithmetic, only for the same
    /// signer, digest and signature; a bad one is never remembered.
    #[test]
    fn verified_signatures_are_remembered_exactly() {
        let (config, secrets, _) = test_config(4);
        let r0 = KeyRing::new(&config, Process::Replica(ReplicaId(0)), &secrets[0]);
        let r1 = KeyRing::new(&config, Process::Replica(ReplicaId(1)), &secrets[1]);
        let from = Principal::Order(ReplicaId(0));
        let (d, other) = (Digest::of(b"vote"), Digest::of(b"other vote"));
        let sig = r0.sign(&d);
        let mut bad = sig;
        bad.0[5] ^= 1;
        for _ in 0..2 {
            assert_eq!(r1.verify_signature(from, &d, &sig), Ok(()));
            assert_eq!(r1.verify_signature(from, &d, &bad), Err(AuthError::BadTag));
            assert_eq!(r1.verify_signature(from, &other, &sig), Err(AuthError::BadTag));
            assert_eq!(
                r1.verify_signature(Principal::Order(ReplicaId(2)), &d, &sig),
                Err(AuthError::BadTag)
            );
        }
        assert_eq!(r1.verified.lock().unwrap().order.len(), 1);
        // Bounded.
        for i in 0..VERIFIED_CACHE_MAX as u64 + 10 {
            let d = Digest::of(&i.to_le_bytes());
            assert_eq!(r1.verify_signature(from, &d, &r0.sign(&d)), Ok(()));
        }
        let cache = r1.verified.lock().unwrap();
        assert_eq!(
            (cache.order.len(), cache.set.len()),
            (VERIFIED_CACHE_MAX, VERIFIED_CACHE_MAX)
        );
    }

    #[test]
    fn pairwise_keys_agree_and_differ() {
        let (config, secrets, client) = test_config(4);
        let r0 = KeyRing::new(&config, Process::Replica(ReplicaId(0)), &secrets[0]);
        let r1 = KeyRing::new(&config, Process::Replica(ReplicaId(1)), &secrets[1]);
        let c = KeyRing::new(&config, Process::Client(ClientId(7)), &client);
        let d = Digest::of(b"hello");
        let mac = r0.mac_for(Principal::Order(ReplicaId(1)), &d);
        assert_eq!(r1.verify_mac(Principal::Auth(ReplicaId(0)), &d, &mac), Ok(()));
        // Not valid as if it came from the client, nor over another digest.
        assert_eq!(
            r1.verify_mac(Principal::Client(ClientId(7)), &d, &mac),
            Err(AuthError::BadTag)
        );
        assert_eq!(
            r1.verify_mac(Principal::Auth(ReplicaId(0)), &Digest::of(b"x"), &mac),
            Err(AuthError::BadTag)
        );
        let auth = c.authenticator(ClusterConfig::auth_members(&config.validate().unwrap()), &d);
        assert_eq!(auth.macs.len(), 4);
        assert!(r1
            .verify_authenticator(Principal::Client(ClientId(7)), 1, &d, &auth)
            .is_ok());
        assert!(r1
            .verify_authenticator(Principal::Client(ClientId(7)), 0, &d, &auth)
            .is_err());
    }

    #[test]
    fn a_client_ring_has_replica_keys_only() {
        let (mut config, secrets, client) = test_config(4);
        let other = SecretKeys::from_seed([201; 32]);
        config.clients.push(ClientInfo {
            id: ClientId(8),
            keys: other.public(),
        });
        let r2 = KeyRing::new(&config, Process::Replica(ReplicaId(2)), &secrets[2]);
        let c7 = KeyRing::new(&config, Process::Client(ClientId(7)), &client);
        let c8 = KeyRing::new(&config, Process::Client(ClientId(8)), &other);
        assert_eq!(c7.macs.len(), 4, "one key per replica, none for clients");
        assert!(c7.macs.keys().all(|p| matches!(p, Process::Replica(_))));
        assert!(c7.verifying.keys().all(|p| matches!(p, Process::Replica(_))));
        assert_eq!(r2.macs.len(), 6, "a replica keeps every replica and client");
        // Replica to client and back still verify.
        let d = Digest::of(b"reply");
        let mac = r2.mac_for(Principal::Client(ClientId(7)), &d);
        assert_eq!(c7.verify_mac(Principal::Exec(ReplicaId(2)), &d, &mac), Ok(()));
        let mac = c7.mac_for(Principal::Auth(ReplicaId(2)), &d);
        assert_eq!(r2.verify_mac(Principal::Client(ClientId(7)), &d, &mac), Ok(()));
        // Client to client: no key, a zero tag, refused as an unknown sender.
        assert_eq!(c7.mac_for(Principal::Client(ClientId(8)), &d), Mac::default());
        assert_eq!(
            c8.verify_mac(Principal::Client(ClientId(7)), &d, &Mac::default()),
            Err(AuthError::UnknownSender)
        );
    }

    #[test]
    fn signatures_verify_only_for_signer_and_digest() {
        let (config, secrets, _) = test_config(4);
        let r0 = KeyRing::new(&config, Process::Replica(ReplicaId(0)), &secrets[0]);
        let r2 = KeyRing::new(&config, Process::Replica(ReplicaId(2)), &secrets[2]);
        let d = Digest::of(b"view change");
        let sig = r0.sign(&d);
        assert!(r2.verify_signature(Principal::Order(ReplicaId(0)), &d, &sig).is_ok());
        assert!(r2.verify_signature(Principal::Order(ReplicaId(1)), &d, &sig).is_err());
        assert!(r2
            .verify_signature(Principal::Order(ReplicaId(0)), &Digest::of(b"other"), &sig)
            .is_err());
    }

    #[test]
    fn matrix_rows_count_distinct_valid_signers() {
        let (config, secrets, _) = test_config(4);
        let q = config.validate().unwrap();
        let rings: Vec<KeyRing> = (0..4)
            .map(|i| KeyRing::new(&config, Process::Replica(ReplicaId(i)), &secrets[i as usize]))
            .collect();
        let d = Digest::of(b"entry");
        let row = |i: usize| MatrixRow {
            signer: ReplicaId(i as u32),
            authenticator: rings[i].authenticator(ClusterConfig::order_members(&q), &d),
        };
        let mut matrix = MatrixSignature {
            rows: vec![row(0), row(1), row(1)],
        };
        assert_eq!(rings[2].count_valid_matrix_rows(2, 4, &d, &matrix), 2);
        matrix.rows[0].authenticator.macs[2].0[0] ^= 1;
        assert_eq!(rings[2].count_valid_matrix_rows(2, 4, &d, &matrix), 1);
        assert_eq!(rings[3].count_valid_matrix_rows(3, 4, &d, &matrix), 2);
    }

    /// Key refresh (`session.rs`): a receiver's new epoch takes effect for a sender once it has
    /// the NEW-KEY; until then the sender's MACs verify under the retiring keys, and after the
    /// retirement they are refused.
    #[test]
    fn a_refresh_retires_the_old_keys_after_the_overlap() {
        let (config, secrets, client) = test_config(4);
        let r0 = KeyRing::new(&config, Process::Replica(ReplicaId(0)), &secrets[0]);
        let r1 = KeyRing::new(&config, Process::Replica(ReplicaId(1)), &secrets[1]);
        let r2 = KeyRing::new(&config, Process::Replica(ReplicaId(2)), &secrets[2]);
        let c = KeyRing::new(&config, Process::Client(ClientId(7)), &client);
        for (i, ring) in [&r0, &r1, &r2, &c].into_iter().enumerate() {
            let mut n = i as u8;
            ring.set_entropy(Box::new(move || {
                n = n.wrapping_add(10);
                [n; 32]
            }));
        }
        let d = Digest::of(b"prepare");
        let to_r1 = Principal::Order(ReplicaId(1));
        let from_r0 = Principal::Order(ReplicaId(0));
        let old = r0.mac_for(to_r1, &d);
        let new_key = r1.refresh(5).unwrap();
        assert_eq!(
            (r1.epoch(), r1.refresh(5), r1.refresh(4)),
            (5, None, None),
            "epochs only grow"
        );
        // r0 has not seen the NEW-KEY: its MAC is under r1's retiring keys, still accepted.
        assert_eq!(r1.verify_mac(from_r0, &d, &old), Ok(()));
        assert_eq!(r1.accepted_retiring(), 1);
        assert_eq!(
            r0.accept_new_key(Process::Replica(ReplicaId(1)), &new_key),
            Ok(Accepted::Installed)
        );
        let fresh = r0.mac_for(to_r1, &d);
        assert_ne!(fresh, old);
        assert_eq!(r1.verify_mac(from_r0, &d, &fresh), Ok(()));
        assert_eq!(r1.accepted_retiring(), 1, "the new key is the current one");
        // The client and r2 each have their own key into r1's new epoch.
        assert_eq!(
            c.accept_new_key(Process::Replica(ReplicaId(1)), &new_key),
            Ok(Accepted::Installed)
        );
        assert_eq!(
            r2.accept_new_key(Process::Replica(ReplicaId(1)), &new_key),
            Ok(Accepted::Installed)
        );
        let from_c = c.mac_for(Principal::Auth(ReplicaId(1)), &d);
        assert_eq!(r1.verify_mac(Principal::Client(ClientId(7)), &d, &from_c), Ok(()));
        assert_eq!(
            r1.verify_mac(Principal::Client(ClientId(7)), &d, &fresh),
            Err(AuthError::BadTag)
        );
        assert_ne!(r2.mac_for(to_r1, &d), fresh);
        // Retired: the old key is refused, the new one still verifies.
        r1.retire();
        assert!(!r1.retiring());
        assert_eq!(r1.verify_mac(from_r0, &d, &old), Err(AuthError::BadTag));
        assert_eq!(r1.verify_mac(from_r0, &d, &fresh), Ok(()));
        // Messages the other way are unaffected until r0 refreshes.
        let back = r1.mac_for(from_r0, &d);
        assert_eq!(r0.verify_mac(to_r1, &d, &back), Ok(()));
        // The transport's hello keeps the long-term keys whatever the epochs.
        let hello = r0.static_mac_for(to_r1, &d);
        assert_eq!(r1.verify_static_mac(from_r0, &d, &hello), Ok(()));
        // A restart forgets the session: long-term keys again, until the peers' next NEW-KEYs.
        r0.reset_session();
        assert_eq!(r0.mac_for(to_r1, &d), old);
        assert_eq!(r0.peer_epoch(Process::Replica(ReplicaId(1))), 0);
        assert_eq!(r1.accepted_retired(), 0, "nothing accepted under retired keys");
    }

    /// `Sabotage::KeepRetiredKeys` keeps what `retire` drops, and the key ring counts each MAC
    /// it then accepts under retired keys (the simulator's invariant is that the count stays 0).
    #[test]
    fn a_key_ring_that_keeps_retired_keys_counts_what_they_let_in() {
        let (mut config, secrets, _) = test_config(4);
        config.knobs.sabotage = Some(crate::config::Sabotage::KeepRetiredKeys);
        let r0 = KeyRing::new(&config, Process::Replica(ReplicaId(0)), &secrets[0]);
        let r1 = KeyRing::new(&config, Process::Replica(ReplicaId(1)), &secrets[1]);
        r1.set_entropy(Box::new(|| [9; 32]));
        let d = Digest::of(b"commit");
        let (to_r1, from_r0) = (Principal::Order(ReplicaId(1)), Principal::Order(ReplicaId(0)));
        let old = r0.mac_for(to_r1, &d);
        r1.refresh(3).unwrap();
        assert_eq!(r1.verify_mac(from_r0, &d, &old), Ok(()));
        assert_eq!((r1.accepted_retiring(), r1.accepted_retired()), (1, 0));
        r1.retire();
        assert!(!r1.retiring(), "retired, as far as the key ring is told");
        assert_eq!(r1.verify_mac(from_r0, &d, &old), Ok(()), "the sabotage lets it in");
        assert_eq!((r1.accepted_retiring(), r1.accepted_retired()), (1, 1));
        // The next refresh makes the current keys the retiring ones again.
        r1.refresh(4).unwrap();
        assert_eq!(r1.verify_mac(from_r0, &d, &old), Err(AuthError::BadTag));
    }

    /// A NEW-KEY is accepted once, from the process that signed it, for a newer epoch only: a
    /// replay, an older epoch, a forged or re-attributed announcement change nothing.
    #[test]
    fn new_keys_are_accepted_only_fresh_and_from_their_signer() {
        let (config, secrets, _) = test_config(4);
        let r0 = KeyRing::new(&config, Process::Replica(ReplicaId(0)), &secrets[0]);
        let r1 = KeyRing::new(&config, Process::Replica(ReplicaId(1)), &secrets[1]);
        let r1_id = Process::Replica(ReplicaId(1));
        let first = r1.refresh(10).unwrap();
        let second = r1.refresh(20).unwrap();
        assert_eq!(r0.accept_new_key(r1_id, &second), Ok(Accepted::Installed));
        let d = Digest::of(b"commit");
        let mac = r0.mac_for(Principal::Order(ReplicaId(1)), &d);
        // The older announcement, replayed after the newer one: ignored, keys unchanged.
        assert_eq!(r0.accept_new_key(r1_id, &first), Ok(Accepted::Stale));
        assert_eq!(r0.accept_new_key(r1_id, &second), Ok(Accepted::Stale));
        assert_eq!(r0.mac_for(Principal::Order(ReplicaId(1)), &d), mac);
        assert_eq!(r0.peer_epoch(r1_id), 20);
        // A newer epoch with a key r1 did not sign, or r1's announcement claimed by r2.
        let mut forged = second.clone();
        forged.epoch = 30;
        assert_eq!(r0.accept_new_key(r1_id, &forged), Err(AuthError::BadTag));
        let mut swapped = r1.refresh(30).unwrap();
        assert_eq!(
            r0.accept_new_key(Process::Replica(ReplicaId(2)), &swapped),
            Err(AuthError::BadTag)
        );
        swapped.public[0] ^= 1;
        assert_eq!(r0.accept_new_key(r1_id, &swapped), Err(AuthError::BadTag));
        assert_eq!(r0.peer_epoch(r1_id), 20);
        assert_eq!(
            r0.accept_new_key(Process::Client(ClientId(99)), &second),
            Err(AuthError::UnknownSender)
        );
    }
}

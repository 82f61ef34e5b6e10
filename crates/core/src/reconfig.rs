//! Reconfiguration (docs/PROTOCOL.md "Reconfiguration"): an administrator-signed change of the
//! replicas and of `(u, r)`, ordered like any request and applied at a checkpoint boundary.
//!
//! The administrator is one of the configured clients ([`ClusterConfig::admin`]); every ordered
//! request of that client is a [`SignedReconfiguration`] (never a service operation). The
//! change names the configuration epoch it creates (the current one plus one), the new fault
//! model and the whole new replica list with each replica's public keys and an endpoint string
//! the runtime interprets (its addresses); clients and knobs carry over. The signature (the
//! admin client's Ed25519 key, over the cluster name and the change) makes the change
//! self-certifying: a client that learns it from replicas checks it alone, and a new member
//! started from it knows its peers.
//!
//! Every check here is a pure function of the current configuration and the bytes, so every
//! correct order and execution member decides alike on the same agreed request.

use serde::{Deserialize, Serialize};

use crate::codec;
use crate::config::{ClusterConfig, ConfigError, PublicKeys, ReplicaInfo};
use crate::crypto::{Digest, Signature};
use crate::ids::{ReplicaId, SeqNo};

/// Longest endpoint string of a replica in a change (the runtime's addresses).
pub const ENDPOINT_BYTES_MAX: usize = 512;

/// A new configuration, as the administrator signs it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Reconfiguration {
    /// The configuration epoch this change creates.
    pub epoch: u64,
    /// The `u` of the configuration it changes (it applies to that configuration only).
    pub from_u: usize,
    /// The `r` of the configuration it changes.
    pub from_r: usize,
    /// The replicas of the configuration it changes: a new member checks the old
    /// configuration's last certificate with them ([`predecessor`]).
    pub from_replicas: Vec<PublicKeys>,
    /// The new `u`.
    pub u: usize,
    /// The new `r`.
    pub r: usize,
    /// The new replicas, by new id, with their keys.
    pub replicas: Vec<PublicKeys>,
    /// For each replica, where the runtime finds it (opaque to the protocol).
    pub endpoints: Vec<String>,
}

/// A change with the administrator's signature.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SignedReconfiguration {
    /// The change.
    pub change: Reconfiguration,
    /// Ed25519 signature of the admin client over [`Reconfiguration::digest`].
    pub signature: Signature,
}

impl Reconfiguration {
    /// What the administrator signs: the cluster name and the encoded change.
    pub fn digest(&self, cluster_name: &str) -> Digest {
        Digest::of_parts(
            "upright reconfiguration v1",
            &[cluster_name.as_bytes(), &codec::to_bytes(self)],
        )
    }

    /// Signs the change with the administrator's key.
    pub fn sign(self, cluster_name: &str, admin: &crate::crypto::SecretKeys) -> SignedReconfiguration {
        let signature = admin.sign(&self.digest(cluster_name));
        SignedReconfiguration {
            change: self,
            signature,
        }
    }
}

impl SignedReconfiguration {
    /// The operation a client orders to apply it.
    pub fn to_operation(&self) -> Vec<u8> {
        codec::to_bytes(self)
    }

    /// Digest of the signed change (identifies it in status and tallies).
    pub fn digest(&self) -> Digest {
        Digest::of_parts("upright signed reconfiguration v1", &[&codec::to_bytes(self)])
    }
}

/// Why an ordered reconfiguration is refused (every correct member refuses it alike).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ReconfigError {
    /// The configuration names no administrator.
    #[error("the cluster has no administrator (cluster.toml names no admin client)")]
    NoAdmin,
    /// Not a signed change.
    #[error("not a reconfiguration")]
    Malformed,
    /// The signature is not the administrator's.
    #[error("the signature is not the administrator's")]
    BadSignature,
    /// The change was made for another membership.
    #[error("the change was made for another configuration than the cluster's (its replicas or (u, r) differ)")]
    OtherConfiguration,
    /// The change is for another epoch.
    #[error("the change creates epoch {got}, the cluster is in epoch {current}")]
    WrongEpoch {
        /// The change's epoch.
        got: u64,
        /// The current epoch.
        current: u64,
    },
    /// One endpoint per replica, each bounded.
    #[error(
        "the change lists {replicas} replicas and {endpoints} endpoints (one each, at most {ENDPOINT_BYTES_MAX} bytes)"
    )]
    Endpoints {
        /// Replicas.
        replicas: usize,
        /// Endpoints.
        endpoints: usize,
    },
    /// The new configuration is not valid.
    #[error("the new configuration is invalid: {0}")]
    Invalid(#[from] ConfigError),
    /// Too few of the next configuration's execution members are execution members now: the
    /// hand-over needs that many of them to vote (they hold the boundary's state), so it could
    /// never complete.
    #[error(
        "only {holders} of the new configuration's execution replicas execute now, and the hand-over needs {needed} of them (keep execution replicas at the lowest ids)"
    )]
    TooFewHolders {
        /// Execution members of both configurations.
        holders: usize,
        /// [`holders_needed`].
        needed: usize,
    },
}

/// Execution members of both `old` and `next` (the same long-term keys), by their id in `next`:
/// the members whose hand-over votes say they hold the boundary's state.
pub fn holders(old: &ClusterConfig, next: &ClusterConfig) -> std::collections::BTreeSet<crate::ids::ReplicaId> {
    let (Ok(q_old), Ok(q_next)) = (old.validate(), next.validate()) else {
        return Default::default();
    };
    next.replicas
        .iter()
        .take(q_next.n_exec)
        .filter(|r| old.replicas.iter().take(q_old.n_exec).any(|o| o.keys == r.keys))
        .map(|r| r.id)
        .collect()
}

/// How many [`holders`] must vote in the hand-over from `old` to `next`: `min(u_old, u_new) + 1`
/// (one of them correct, so the state stays served).
pub fn holders_needed(old: &ClusterConfig, next: &ClusterConfig) -> usize {
    old.u.min(next.u) + 1
}

/// The members after removing the ids `removed` from `members` (ids are positions), for a
/// configuration whose first `n_exec_new` members execute (of `members`, the first
/// `n_exec_old`). A member keeps its id where it can; the execution ids left empty are filled
/// first with execution members (those above the new size first, who move anyway), then the
/// other empty ids with the rest. So the hand-over has as many [`holders`] as it can, and few
/// members change id.
pub fn without(members: &[PublicKeys], removed: &[usize], n_exec_old: usize, n_exec_new: usize) -> Vec<PublicKeys> {
    let size = members.len() - removed.iter().filter(|i| **i < members.len()).count();
    let stays = |i: usize| i < members.len() && !removed.contains(&i);
    let mut slots: Vec<Option<usize>> = vec![None; size];
    let mut placed = vec![false; members.len()];
    for (i, slot) in slots.iter_mut().enumerate().take(n_exec_new.min(size)) {
        if stays(i) {
            *slot = Some(i);
            placed[i] = true;
        }
    }
    let mut candidates: Vec<usize> = (0..members.len()).filter(|&i| stays(i) && !placed[i]).collect();
    candidates.sort_by_key(|&i| (i >= n_exec_old, i < size, i));
    for slot in slots.iter_mut().take(n_exec_new).filter(|s| s.is_none()) {
        if !candidates.is_empty() {
            let pos = candidates.remove(0);
            *slot = Some(pos);
            placed[pos] = true;
        }
    }
    for (i, slot) in slots.iter_mut().enumerate().skip(n_exec_new) {
        if stays(i) && !placed[i] {
            *slot = Some(i);
            placed[i] = true;
        }
    }
    let mut rest = (0..members.len()).filter(|&i| stays(i) && !placed[i]);
    for slot in slots.iter_mut().filter(|s| s.is_none()) {
        *slot = rest.next();
    }
    slots
        .into_iter()
        .map(|i| members[i.expect("as many members as ids")])
        .collect()
}

/// Checks `signed` against `current` and returns the configuration it creates. `jump`: accept a
/// change to any later epoch (a client catching up over several changes; the administrator's key
/// and the clients never change, so the latest change alone is enough); otherwise only to the
/// next epoch (ordered requests).
pub fn successor(
    current: &ClusterConfig,
    signed: &SignedReconfiguration,
    jump: bool,
) -> Result<ClusterConfig, ReconfigError> {
    let admin = current
        .admin
        .and_then(|a| current.client_keys(a))
        .ok_or(ReconfigError::NoAdmin)?;
    let change = &signed.change;
    let epoch = current.epoch();
    if !(change.epoch == epoch + 1 || (jump && change.epoch > epoch)) {
        return Err(ReconfigError::WrongEpoch {
            got: change.epoch,
            current: epoch,
        });
    }
    let current_replicas = current.replicas.iter().map(|r| r.keys);
    if change.epoch == epoch + 1
        && (change.from_u != current.u
            || change.from_r != current.r
            || !change.from_replicas.iter().copied().eq(current_replicas))
    {
        return Err(ReconfigError::OtherConfiguration);
    }
    if change.endpoints.len() != change.replicas.len() || change.endpoints.iter().any(|e| e.len() > ENDPOINT_BYTES_MAX)
    {
        return Err(ReconfigError::Endpoints {
            replicas: change.replicas.len(),
            endpoints: change.endpoints.len(),
        });
    }
    crate::crypto::verify_with_public(&admin.ed25519, &change.digest(&current.cluster_name), &signed.signature)
        .map_err(|_| ReconfigError::BadSignature)?;
    let next = with_members(
        current,
        (change.u, change.r, &change.replicas),
        change.epoch,
        Some(codec::to_bytes(signed)),
    );
    next.validate()?;
    if change.epoch == epoch + 1 {
        let (holders, needed) = (holders(current, &next).len(), holders_needed(current, &next));
        if holders < needed {
            return Err(ReconfigError::TooFewHolders { holders, needed });
        }
    }
    Ok(next)
}

/// `base`'s clients, knobs and administrator with other members: `(u, r, replica keys)`.
fn with_members(
    base: &ClusterConfig,
    (u, r, replicas): (usize, usize, &[PublicKeys]),
    epoch: u64,
    origin: Option<Vec<u8>>,
) -> ClusterConfig {
    ClusterConfig {
        cluster_name: base.cluster_name.clone(),
        u,
        r,
        replicas: replicas
            .iter()
            .enumerate()
            .map(|(i, keys)| ReplicaInfo {
                id: ReplicaId(i as u32),
                keys: *keys,
            })
            .collect(),
        clients: base.clients.clone(),
        knobs: base.knobs.clone(),
        admin: base.admin,
        epoch,
        origin,
        protocol: base.protocol,
        selective_execution: false,
        separate_stages: false,
        exec_u: None,
    }
}

/// The configuration `config` was made from (its replicas and fault model as the change names
/// them; clients, knobs and the administrator carry over). Its own origin is not known, so only
/// what needs no origin can be checked with it: the signatures of its members, and certificates
/// whose pending change is the one that made `config`.
pub fn predecessor(config: &ClusterConfig) -> Option<ClusterConfig> {
    let change = origin(config)?.change;
    let members = (change.from_u, change.from_r, &change.from_replicas[..]);
    let previous = with_members(config, members, change.epoch - 1, None);
    previous.validate().ok()?;
    Some(previous)
}

/// The change that made `config` (none for epoch 0).
pub fn origin(config: &ClusterConfig) -> Option<SignedReconfiguration> {
    config.origin.as_deref().and_then(|b| codec::from_bytes(b).ok())
}

/// An ordered operation of the admin client: the configuration it creates, or why not.
pub fn decode_and_check(current: &ClusterConfig, operation: &[u8]) -> Result<ClusterConfig, ReconfigError> {
    let signed: SignedReconfiguration = codec::from_bytes(operation).map_err(|_| ReconfigError::Malformed)?;
    successor(current, &signed, false)
}

/// A reconfiguration ordered in the current epoch and not yet in effect: the order stage records
/// it in its checkpoints (so a member that catches up by state transfer learns it too) and stops
/// ordering at `boundary`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Pending {
    /// The change.
    pub change: SignedReconfiguration,
    /// Batch it was ordered in.
    pub ordered_at: SeqNo,
    /// The last sequence number of the current epoch: the first checkpoint at or after
    /// `ordered_at`, plus the log window `L`. No member ordered anything past the first
    /// checkpoint plus `L` before that checkpoint became stable, and none orders past it after.
    pub boundary: SeqNo,
}

/// The boundary of a change ordered in batch `seqno`.
pub fn boundary(seqno: SeqNo, checkpoint_interval: u64, log_window: u64) -> SeqNo {
    SeqNo(seqno.0.div_ceil(checkpoint_interval) * checkpoint_interval + log_window)
}

/// The reply the execution stage gives the admin client for an ordered change (deterministic).
pub fn reply_text(current: &ClusterConfig, seqno: SeqNo, operation: &[u8]) -> String {
    let knobs = &current.knobs;
    match decode_and_check(current, operation) {
        Ok(next) => format!(
            "ordered in batch {}: epoch {} takes effect after batch {} unless an earlier change of this epoch did",
            seqno.0,
            next.epoch(),
            boundary(seqno, knobs.checkpoint_interval, knobs.log_window).0
        ),
        Err(e) => format!("refused: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crypto::SecretKeys;
    use crate::ids::ClientId;
    use crate::testing::fixture;

    fn setup() -> (ClusterConfig, SecretKeys) {
        let f = fixture(1, 1, 2, Default::default());
        let mut config = (*f.config).clone();
        config.admin = Some(ClientId(1));
        // The fixture's client 1 (`testing::fixture` seeds client i with 100 + i).
        (config, SecretKeys::from_seed([101; 32]))
    }

    fn grow(config: &ClusterConfig) -> Reconfiguration {
        let mut replicas: Vec<PublicKeys> = config.replicas.iter().map(|r| r.keys).collect();
        let from_replicas = replicas.clone();
        replicas.extend((0..2).map(|i| SecretKeys::from_seed([200 + i; 32]).public()));
        Reconfiguration {
            epoch: 1,
            from_u: config.u,
            from_r: config.r,
            from_replicas,
            u: 2,
            r: 1,
            endpoints: vec![String::new(); replicas.len()],
            replicas,
        }
    }

    #[test]
    fn a_signed_change_makes_the_next_epoch() {
        let (config, admin) = setup();
        let signed = grow(&config).sign(&config.cluster_name, &admin);
        let next = decode_and_check(&config, &signed.to_operation()).expect("valid");
        assert_eq!((next.epoch(), next.u, next.r, next.replicas.len()), (1, 2, 1, 6));
        assert_eq!(next.clients, config.clients);
        let back = predecessor(&next).expect("known");
        assert_eq!(
            (back.u, back.r, &back.replicas, back.epoch),
            (1, 1, &config.replicas, 0)
        );
        // Not twice, and not by anyone else.
        assert!(matches!(
            successor(&next, &signed, false),
            Err(ReconfigError::WrongEpoch { got: 1, current: 1 })
        ));
        let forged = grow(&config).sign(&config.cluster_name, &SecretKeys::from_seed([9; 32]));
        assert_eq!(successor(&config, &forged, false), Err(ReconfigError::BadSignature));
        let mut tampered = signed.clone();
        tampered.change.u = 1;
        assert_eq!(successor(&config, &tampered, false), Err(ReconfigError::BadSignature));
        let mut unadministered = config.clone();
        unadministered.admin = None;
        assert_eq!(successor(&unadministered, &signed, false), Err(ReconfigError::NoAdmin));
        assert_eq!(decode_and_check(&config, b"set x 1"), Err(ReconfigError::Malformed));
    }

    #[test]
    fn removing_any_replica_keeps_ids_where_it_can_and_execution_replicas_at_execution_ids() {
        let keys: Vec<PublicKeys> = (0..6).map(|i| SecretKeys::from_seed([40 + i; 32]).public()).collect();
        let ids = |out: Vec<PublicKeys>| -> Vec<usize> {
            out.iter().map(|k| keys.iter().position(|x| x == k).unwrap()).collect()
        };
        // (2, 1) to (1, 1): 5 execution replicas to 3. The highest two: nobody moves.
        assert_eq!(ids(without(&keys, &[4, 5], 5, 3)), vec![0, 1, 2, 3]);
        // An execution id left empty takes an execution replica that moves anyway (4)...
        assert_eq!(ids(without(&keys, &[0, 5], 5, 3)), vec![4, 1, 2, 3]);
        // ...or one from a non-execution id (3) rather than a non-execution replica (5).
        assert_eq!(ids(without(&keys, &[0, 4], 5, 3)), vec![3, 1, 2, 5]);
        assert_eq!(ids(without(&keys, &[0, 2], 5, 3)), vec![4, 1, 3, 5]);
    }

    #[test]
    fn a_change_that_leaves_too_few_execution_replicas_in_place_is_refused() {
        let (config, _) = setup();
        // (1, 1): execution replicas 0, 1, 2. Two new replicas take ids 0 and 1: one execution
        // replica of both configurations, and the hand-over needs min(1, 1) + 1 = 2.
        let mut replicas: Vec<PublicKeys> = config.replicas.iter().map(|r| r.keys).collect();
        replicas[0] = SecretKeys::from_seed([210; 32]).public();
        replicas[1] = SecretKeys::from_seed([211; 32]).public();
        let signed = crate::testing::membership_change(&config, replicas.clone());
        assert_eq!(
            successor(&config, &signed, false),
            Err(ReconfigError::TooFewHolders { holders: 1, needed: 2 })
        );
        // One replaced execution replica leaves two in place: accepted.
        replicas[1] = config.replicas[1].keys;
        let signed = crate::testing::membership_change(&config, replicas);
        let next = successor(&config, &signed, false).expect("two holders");
        assert_eq!(holders(&config, &next).len(), 2);
    }

    #[test]
    fn invalid_changes_are_refused_and_clients_may_jump() {
        let (config, admin) = setup();
        let mut change = grow(&config);
        change.u = 1; // 6 replicas for u = 1, r = 1
        let signed = change.sign(&config.cluster_name, &admin);
        assert!(matches!(
            successor(&config, &signed, false),
            Err(ReconfigError::Invalid(ConfigError::WrongReplicaCount { .. }))
        ));
        let mut change = grow(&config);
        change.epoch = 3;
        let signed = change.sign(&config.cluster_name, &admin);
        assert!(successor(&config, &signed, false).is_err());
        assert_eq!(successor(&config, &signed, true).map(|c| c.epoch()), Ok(3));
        let mut change = grow(&config);
        change.from_replicas.pop();
        let signed = change.sign(&config.cluster_name, &admin);
        assert_eq!(
            successor(&config, &signed, false),
            Err(ReconfigError::OtherConfiguration)
        );
        let mut change = grow(&config);
        change.endpoints.pop();
        let signed = change.sign(&config.cluster_name, &admin);
        assert!(matches!(
            successor(&config, &signed, false),
            Err(ReconfigError::Endpoints { .. })
        ));
    }

    #[test]
    fn replica_keys_and_signatures_bind_the_configuration_epoch_and_client_keys_do_not() {
        use crate::crypto::{Digest, KeyRing};
        use crate::ids::{Principal, Process};
        let f = fixture(1, 1, 2, Default::default());
        let (config, admin) = setup();
        let next = successor(&config, &grow(&config).sign(&config.cluster_name, &admin), false).unwrap();
        let old0 = &f.replicas[0];
        let new1 = KeyRing::new(&next, Process::Replica(ReplicaId(1)), &SecretKeys::from_seed([2; 32]));
        let client = &f.clients[0];
        let digest = Digest::of(b"m");
        // Replica 0 (old configuration) to replica 1 (new): refused, both MAC and signature.
        let mac = old0.mac_for(Principal::Order(ReplicaId(1)), &digest);
        assert!(new1.verify_mac(Principal::Order(ReplicaId(0)), &digest, &mac).is_err());
        let vote = crate::message::Signed::sign(old0, ReplicaId(0), 7u64);
        let new_sees = KeyRing::new(&next, Process::Replica(ReplicaId(2)), &SecretKeys::from_seed([3; 32]));
        assert!(vote.verify(&new_sees, None).is_err());
        assert!(vote.verify(&f.replicas[2], None).is_ok());
        // A client's MAC verifies in either configuration (its keys do not bind the epoch).
        let mac = client.mac_for(Principal::Auth(ReplicaId(1)), &digest);
        assert!(new1.verify_mac(Principal::Client(ClientId(0)), &digest, &mac).is_ok());
        // So does the transport's hello key between the replicas.
        let hello = old0.static_mac_for(Principal::Order(ReplicaId(1)), &digest);
        assert!(new1
            .verify_static_mac(Principal::Order(ReplicaId(0)), &digest, &hello)
            .is_ok());
    }

    #[test]
    fn the_boundary_is_a_checkpoint_plus_the_window() {
        assert_eq!(boundary(SeqNo(1), 64, 128), SeqNo(192));
        assert_eq!(boundary(SeqNo(64), 64, 128), SeqNo(192));
        assert_eq!(boundary(SeqNo(65), 64, 128), SeqNo(256));
    }
}

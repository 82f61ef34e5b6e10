//! Cost of each cryptographic primitive and of the codec on typical messages.
//! Run: `cargo bench -p upright-core --bench crypto`.

use std::hint::black_box;

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, Criterion};
use upright_core::config::{ClientInfo, ClusterConfig, Knobs, ReplicaInfo};
use upright_core::crypto::{Digest, KeyRing, SecretKeys};
use upright_core::ids::{ClientId, Principal, Process, ReplicaId, RequestId, StageKind};
use upright_core::message::{Envelope, Message, SealFor};
use upright_core::wire;

fn cluster() -> (ClusterConfig, Vec<SecretKeys>) {
    let secrets: Vec<SecretKeys> = (0..5u8).map(|i| SecretKeys::from_seed([i + 1; 32])).collect();
    let config = ClusterConfig {
        cluster_name: "bench".into(),
        u: 1,
        r: 1,
        replicas: (0..4)
            .map(|i| ReplicaInfo {
                id: ReplicaId(i as u32),
                keys: secrets[i].public(),
            })
            .collect(),
        clients: vec![ClientInfo {
            id: ClientId(0),
            keys: secrets[4].public(),
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
    (config, secrets)
}

fn primitives(c: &mut Criterion) {
    let (config, secrets) = cluster();
    let quorums = config.validate().unwrap();
    let r0 = KeyRing::new(&config, Process::Replica(ReplicaId(0)), &secrets[0]);
    let r1 = KeyRing::new(&config, Process::Replica(ReplicaId(1)), &secrets[1]);
    let payload_64 = vec![7u8; 64];
    let payload_4k = vec![7u8; 4096];
    let digest = Digest::of(&payload_64);
    c.bench_function("digest 64 B", |b| b.iter(|| Digest::of(black_box(&payload_64))));
    c.bench_function("digest 4 KiB", |b| b.iter(|| Digest::of(black_box(&payload_4k))));
    let mac = r0.mac_for(Principal::Order(ReplicaId(1)), &digest);
    c.bench_function("mac", |b| {
        b.iter(|| r0.mac_for(Principal::Order(ReplicaId(1)), black_box(&digest)))
    });
    c.bench_function("mac verify", |b| {
        b.iter(|| r1.verify_mac(Principal::Order(ReplicaId(0)), black_box(&digest), &mac))
    });
    c.bench_function("authenticator for 4", |b| {
        b.iter(|| r0.authenticator(ClusterConfig::order_members(&quorums), black_box(&digest)))
    });
    let signature = r0.sign(&digest);
    c.bench_function("ed25519 sign", |b| b.iter(|| r0.sign(black_box(&digest))));
    c.bench_function("ed25519 verify", |b| {
        b.iter(|| r1.verify_signature(Principal::Order(ReplicaId(0)), black_box(&digest), &signature))
    });
    c.bench_function("pairwise key derivation (1 X25519 + KDF per peer, 5 peers)", |b| {
        b.iter(|| KeyRing::new(black_box(&config), Process::Replica(ReplicaId(0)), &secrets[0]))
    });
    let client = KeyRing::new(&config, Process::Client(ClientId(0)), &secrets[4]);
    let request = Message::ClientRequest {
        client: ClientId(0),
        request_id: RequestId(1),
        operation: Bytes::from(payload_64.clone()),
        read_only: false,
        signature: None,
        config_epoch: 0,
    };
    c.bench_function("seal client request (authenticator for 4)", |b| {
        b.iter(|| {
            Envelope::seal(
                &client,
                &quorums,
                Principal::Client(ClientId(0)),
                black_box(request.clone()),
                SealFor::Stage(StageKind::Auth),
            )
        })
    });
    let sealed = Envelope::seal(
        &client,
        &quorums,
        Principal::Client(ClientId(0)),
        request,
        SealFor::Stage(StageKind::Auth),
    );
    c.bench_function("open client request", |b| {
        b.iter(|| black_box(&sealed).open(&r1, Principal::Auth(ReplicaId(1)), None))
    });
    let frame = wire::encode(&sealed);
    c.bench_function("encode client request", |b| b.iter(|| wire::encode(black_box(&sealed))));
    c.bench_function("decode client request", |b| b.iter(|| wire::decode(black_box(&frame))));
}

criterion_group!(benches, primitives);
criterion_main!(benches);

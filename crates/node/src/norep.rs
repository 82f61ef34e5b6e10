//! NO-REP: the benchmark baseline. One unreplicated server process runs the same service (the KV
//! of `upright bench`, or any service a replica runs: `upright norep --service fs` is BFS's
//! NO-REP) behind the same transport and the same client code, without agreement, authentication
//! stage, execution quorum or logs. Its state is in memory.
//!
//! The server uses a cluster config with `u = r = 0` (one replica), so the ordinary client sends
//! each request to that one server and accepts its single reply (`r + 1 = 1` matching replies):
//! no client-side special case and no change to the core protocol. The server checks each
//! request's MAC, executes everything that arrived in one round as one batch through
//! [`Service::execute`], and answers with a MACed full reply. It keeps each client's last reply so
//! a retransmitted request is answered again, not executed twice.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;

use bytes::Bytes;
use upright_core::crypto::{KeyRing, SecretKeys};
use upright_core::ids::{ClientId, Principal, Process, ReplicaId, RequestId, SeqNo};
use upright_core::message::{Envelope, Message, ReplyBody, SealFor};
use upright_core::service::{BatchContext, Effects, Service, ServiceRequest};

use crate::files::{endpoint, Cluster, FileError};
use crate::replica::{client_frame_max, Clock, INPUTS_PER_ROUND_MAX};
use crate::transport::{serve, ClientRoutes, Counters, Inbox, Listener};

/// Runs the NO-REP server of `cluster` (which must have `u = r = 0`) with `service` until
/// `shutdown` completes.
pub async fn run_norep_server(
    cluster: Cluster,
    secret: SecretKeys,
    service: Box<dyn Service + Send>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), FileError> {
    if cluster.file.u != 0 || cluster.file.r != 0 {
        return Err(FileError(
            "the NO-REP server needs a cluster config with u = r = 0".into(),
        ));
    }
    let config = cluster.config.clone();
    let entry = cluster.file.replica(0)?.clone();
    let keys = Arc::new(KeyRing::new(&config, Process::Replica(ReplicaId(0)), &secret));
    let counters = Arc::new(Counters::default());
    let inbox = Arc::new(Inbox::new(counters.clone()));
    let routes = Arc::new(ClientRoutes::default());
    let addr = endpoint(&entry.client_addr)?;
    let listener = Listener::bind(&addr)
        .await
        .map_err(|e| FileError(format!("cannot listen on {addr} (clients): {e}")))?;
    tokio::spawn(serve(
        listener,
        Arc::new(crate::transport::Identities::single(keys.clone())),
        config.cluster_name.clone(),
        |p| matches!(p, Process::Client(_)),
        inbox.clone(),
        Some(routes.clone()),
        None,
        client_frame_max(&cluster),
        counters.clone(),
    ));
    tracing::info!(clients = %entry.client_addr, "NO-REP server started");
    let mut server = NoRep {
        keys,
        quorums: config.validate().map_err(|e| FileError(e.to_string()))?,
        service,
        last: BTreeMap::new(),
        seqno: 0,
        clock: Clock::new(),
    };
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = inbox.notified() => {}
            _ = &mut shutdown => return Ok(()),
        }
        loop {
            let round = inbox.pop_round_robin(INPUTS_PER_ROUND_MAX);
            if round.is_empty() {
                break;
            }
            for (client, frame) in server.execute_round(round.iter().map(|(_, e)| e.as_ref())) {
                if !routes.send(client, Arc::new(frame)) {
                    counters.bump("net_dropped_client_unreachable");
                }
            }
        }
    }
}

/// The unreplicated server's state.
struct NoRep {
    keys: Arc<KeyRing>,
    quorums: upright_core::quorum::Quorums,
    service: Box<dyn Service + Send>,
    /// Per client: the last executed request id and its reply (bounded by the configured clients).
    last: BTreeMap<ClientId, (RequestId, Bytes)>,
    seqno: u64,
    clock: Clock,
}

/// A read-only answer: client, nonce, result, `true`.
type ReadOnlyAnswer = (ClientId, RequestId, Bytes, bool);

impl NoRep {
    /// A READ-ONLY request answered from the current state (as each execution member does), or
    /// `None` if `envelope` is not a valid one.
    fn read_only(&self, envelope: &Envelope) -> Option<ReadOnlyAnswer> {
        let Message::ReadOnlyRequest {
            client,
            request_id,
            operation,
        } = &envelope.message
        else {
            return None;
        };
        let me = Principal::Exec(ReplicaId(0));
        if envelope.from != Principal::Client(*client) || envelope.open(&self.keys, me, None).is_err() {
            return None;
        }
        let result = self.service.execute_read_only(operation)?;
        Some((*client, *request_id, result, true))
    }

    /// Executes the new requests among `envelopes` as one batch; returns the reply frames.
    fn execute_round<'a>(&mut self, envelopes: impl Iterator<Item = &'a Envelope>) -> Vec<(ClientId, Vec<u8>)> {
        let me = Principal::Auth(ReplicaId(0));
        let mut batch = Vec::new();
        let mut answers = Vec::new();
        let mut read_only = Vec::new();
        for envelope in envelopes {
            if let Some(answer) = self.read_only(envelope) {
                read_only.push(answer);
                continue;
            }
            let Message::ClientRequest {
                client,
                request_id,
                operation,
                ..
            } = &envelope.message
            else {
                continue;
            };
            if envelope.from != Principal::Client(*client) || envelope.open(&self.keys, me, None).is_err() {
                continue;
            }
            match self.last.get(client) {
                Some((last, reply)) if *last == *request_id => answers.push((*client, *request_id, reply.clone())),
                Some((last, _)) if *last > *request_id => {}
                _ if batch.iter().any(|r: &ServiceRequest| r.client == *client) => {}
                _ => batch.push(ServiceRequest {
                    client: *client,
                    request_id: *request_id,
                    operation: operation.clone(),
                }),
            }
        }
        if !batch.is_empty() {
            self.seqno += 1;
            let context = BatchContext {
                index: 0,
                seqno: SeqNo(self.seqno),
                time_us: self.clock.now(),
                seed: [0; 32],
            };
            // NO-REP serves the benchmark's puts and gets, whose pushes (watches) it does not send.
            let results = self.service.execute(&context, &batch, &mut Effects::default());
            for (request, result) in batch.iter().zip(results) {
                self.last.insert(request.client, (request.request_id, result.clone()));
                answers.push((request.client, request.request_id, result));
            }
        }
        answers
            .into_iter()
            .map(|(client, request_id, result)| (client, request_id, result, false))
            .chain(read_only)
            .map(|(client, request_id, result, read_only)| {
                let message = Message::Reply {
                    request_id,
                    result: ReplyBody::Full(result),
                    read_only,
                    pushes_sent: 0,
                };
                let to = Principal::Client(client);
                let envelope = Envelope::seal(
                    &self.keys,
                    &self.quorums,
                    Principal::Exec(ReplicaId(0)),
                    message,
                    SealFor::One(to),
                );
                (client, upright_core::wire::encode(&envelope))
            })
            .collect()
    }
}

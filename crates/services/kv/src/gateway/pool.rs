//! The pool of upright clients: each member batches its connections' queued commands into one
//! operation at a time.

use std::sync::Arc;

use bytes::Bytes;
use tokio::sync::{mpsc, oneshot};
use upright_node::client::ClientHandle;

use super::{Shared, OPERATION_TIMEOUT};
use crate::reply::Reply;
use crate::COMMANDS_PER_OPERATION_MAX;

/// Most commands waiting for one pool member (connections wait when it is full).
pub const JOBS_QUEUED_MAX: usize = 4096;
/// Most argument bytes of one operation (below the cluster's `request_bytes_max` default of
/// 1 MiB, with room for the encoding's overhead; one command is at most
/// [`crate::resp::COMMAND_BYTES_MAX`]).
pub const OPERATION_ARG_BYTES_MAX: usize = 768 * 1024;

/// One command for the cluster and where its reply goes.
pub struct Job {
    /// The command.
    pub argv: Vec<Bytes>,
    /// Its reply.
    pub reply: oneshot::Sender<Reply>,
}

impl Job {
    fn bytes(&self) -> usize {
        self.argv.iter().map(|a| a.len() + 8).sum()
    }
}

/// The pool.
pub struct Pool {
    workers: Vec<mpsc::Sender<Job>>,
}

impl Pool {
    /// Starts one worker task per client handle.
    pub fn start(clients: Vec<ClientHandle>, shared: Arc<Shared>) -> Pool {
        let workers = clients
            .into_iter()
            .map(|client| {
                let (tx, rx) = mpsc::channel(JOBS_QUEUED_MAX);
                tokio::spawn(worker(client, rx, shared.clone()));
                tx
            })
            .collect();
        Pool { workers }
    }

    /// The worker that serves connection `id`.
    pub fn worker_for(&self, id: u64) -> mpsc::Sender<Job> {
        self.workers[(id as usize) % self.workers.len()].clone()
    }
}

async fn worker(client: ClientHandle, mut rx: mpsc::Receiver<Job>, shared: Arc<Shared>) {
    let mut carry: Option<Job> = None;
    loop {
        let first = match carry.take() {
            Some(job) => job,
            None => match rx.recv().await {
                Some(job) => job,
                None => return,
            },
        };
        let mut bytes = first.bytes();
        let mut jobs = vec![first];
        while jobs.len() < COMMANDS_PER_OPERATION_MAX {
            let Ok(job) = rx.try_recv() else { break };
            if bytes + job.bytes() > OPERATION_ARG_BYTES_MAX {
                carry = Some(job);
                break;
            }
            bytes += job.bytes();
            jobs.push(job);
        }
        run_operation(&client, jobs, &shared).await;
    }
}

async fn run_operation(client: &ClientHandle, jobs: Vec<Job>, shared: &Shared) {
    let argvs: Vec<Vec<Bytes>> = jobs.iter().map(|j| j.argv.clone()).collect();
    let operation = crate::encode_operation(&argvs);
    Shared::bump(&shared.operations);
    let result = client.invoke_timeout(operation, false, OPERATION_TIMEOUT).await;
    let replies = match result {
        Ok(bytes) => match crate::decode_replies(&bytes) {
            Some(replies) if replies.len() == jobs.len() => replies,
            _ => vec![Reply::err("ERR upright: the cluster returned a malformed result"); jobs.len()],
        },
        Err(e) => vec![Reply::err(format!("ERR upright: no result from the cluster ({e})")); jobs.len()],
    };
    for (job, reply) in jobs.into_iter().zip(replies) {
        let _ = job.reply.send(reply); // the connection may have gone
    }
}

//! The pool of upright clients and the queues of the connections it serves.
//!
//! Every connection has a [`Queue`] of commands waiting for the cluster. A connection with queued
//! commands and nothing at the cluster is *ready*; an idle pool member takes every ready
//! connection's queued commands (up to the operation limits) and sends them as one upright
//! operation. A connection is in at most one operation at a time, so its commands execute in the
//! order it sent them; different connections' commands share operations, so one agreement round
//! serves many commands. An idle member is woken by the first command queued.
//!
//! Gathering after an answer: the connections an operation just answered usually send their next
//! commands within tens of microseconds (a client waiting for its reply). Sending the first of
//! them alone would split them over two operations, and each would wait for the other's agreement
//! round. So a member whose operation was answered gives those connections up to [`GATHER_WAIT`]
//! to come back before it sends the next operation ([`Expectation`]); it waits only for as many
//! as came back promptly the last time, so connections that go quiet cost one wait, not one per
//! operation.

use std::collections::VecDeque;
use std::mem;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::sync::Notify;
use upright_node::client::{ClientError, ClientHandle};

use super::{Shared, OPERATION_TIMEOUT};
use crate::command::CommandSpec;
use crate::reply::Reply;
use crate::COMMANDS_PER_OPERATION_MAX;

/// Most argument bytes of one operation (below the cluster's `request_bytes_max` default of
/// 1 MiB, with room for the encoding's overhead; one command is at most
/// [`crate::resp::COMMAND_BYTES_MAX`]).
pub const OPERATION_ARG_BYTES_MAX: usize = 768 * 1024;

/// Longest a member waits, after its operation is answered, for the connections it answered to
/// queue their next commands (see the module documentation). A few loopback round trips of a
/// client; far below one agreement round (about 1 ms), which is what it saves.
pub const GATHER_WAIT: Duration = Duration::from_micros(150);

/// Whether a command only reads the store. The one place the gateway classifies commands as
/// reads or writes.
pub fn is_read(spec: &CommandSpec) -> bool {
    spec.is_read()
}

/// The operation's bytes a command adds (its arguments plus an allowance for the encoding).
fn command_bytes(argv: &[Bytes]) -> usize {
    argv.iter().map(|a| a.len() + 8).sum()
}

/// Locks a mutex; the gateway never panics while holding one, so poisoning is not expected, and
/// the data stays consistent if it happens.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[derive(Default)]
struct QueueState {
    /// Commands not yet sent, in order.
    commands: Vec<Vec<Bytes>>,
    /// Argument bytes of `commands` (as [`command_bytes`] counts them).
    bytes: usize,
    /// Whether every queued command is a read.
    reads_only: bool,
    /// Ready (in the pool's list) or in an operation: the connection must not be listed again.
    busy: bool,
    /// Replies received from the cluster, not yet taken by the connection's writer, in order.
    replies: VecDeque<Reply>,
}

/// One connection's commands for the cluster and their replies. The connection bounds both by
/// the answers it may owe ([`super::conn::PENDING_MAX`]).
#[derive(Default)]
pub struct Queue {
    state: Mutex<QueueState>,
    answered: Notify,
}

impl Queue {
    /// The next reply, in command order; waits until the cluster answered.
    pub async fn next_reply(&self) -> Reply {
        loop {
            if let Some(reply) = self.try_reply() {
                return reply;
            }
            self.answered.notified().await;
        }
    }

    /// The next reply if it is already here.
    pub fn try_reply(&self) -> Option<Reply> {
        lock(&self.state).replies.pop_front()
    }

    fn answer(&self, replies: impl Iterator<Item = Reply>, pool: &PoolShared, me: &Arc<Queue>) {
        let mut state = lock(&self.state);
        state.replies.extend(replies);
        let more = !state.commands.is_empty();
        state.busy = more;
        drop(state); // never lock the ready list while holding a queue (gather locks in that order)
        if more {
            pool.make_ready(me.clone());
        }
        self.answered.notify_one();
    }
}

struct PoolShared {
    /// Connections with queued commands and none at the cluster, oldest first.
    ready: Mutex<VecDeque<Arc<Queue>>>,
    /// Wakes an idle member.
    work: Notify,
}

impl PoolShared {
    fn make_ready(&self, queue: Arc<Queue>) {
        lock(&self.ready).push_back(queue);
        self.work.notify_one();
    }
}

/// The pool: one task per upright client, all serving one list of ready connections.
pub struct Pool {
    shared: Arc<PoolShared>,
}

impl Pool {
    /// Starts one member task per client handle (each a distinct client identity).
    pub fn start(clients: Vec<ClientHandle>, stats: Arc<Shared>) -> Pool {
        let shared = Arc::new(PoolShared {
            ready: Mutex::new(VecDeque::new()),
            work: Notify::new(),
        });
        for client in clients {
            tokio::spawn(member(client, shared.clone(), stats.clone()));
        }
        Pool { shared }
    }

    /// Queues commands of connection `queue` (in order; `reads_only` if all of them are reads,
    /// see [`is_read`]).
    pub fn submit(&self, queue: &Arc<Queue>, commands: &mut Vec<Vec<Bytes>>, reads_only: bool) {
        if commands.is_empty() {
            return;
        }
        let mut state = lock(&queue.state);
        state.reads_only = reads_only && (state.commands.is_empty() || state.reads_only);
        state.bytes += commands.iter().map(|c| command_bytes(c)).sum::<usize>();
        state.commands.append(commands);
        let list = !state.busy;
        state.busy = true;
        drop(state); // never lock the ready list while holding a queue (gather locks in that order)
        if list {
            self.shared.make_ready(queue.clone());
        }
    }
}

/// One operation being put together: the commands and whose they are.
#[derive(Default)]
struct Operation {
    commands: Vec<Vec<Bytes>>,
    bytes: usize,
    reads_only: bool,
    /// Each connection in the operation and how many of its commands, in operation order.
    owners: Vec<(Arc<Queue>, usize)>,
}

impl Operation {
    fn full(&self) -> bool {
        self.commands.len() >= COMMANDS_PER_OPERATION_MAX || self.bytes >= OPERATION_ARG_BYTES_MAX
    }

    /// Moves as many of the connection's queued commands as fit (at least its first if the
    /// operation is empty): how many it moved and whether any are left. Leftovers stay queued
    /// and go after this operation is answered.
    fn take_from(&mut self, queue: &Arc<Queue>) -> (usize, bool) {
        let mut state = lock(&queue.state);
        let (mut n, mut bytes) = (0, 0);
        if self.fits(state.commands.len(), state.bytes) {
            (n, bytes) = (state.commands.len(), state.bytes);
        } else {
            for c in &state.commands {
                let b = command_bytes(c);
                let first = self.commands.is_empty() && n == 0; // an operation carries at least one
                if !first && !self.fits(n + 1, bytes + b) {
                    break;
                }
                n += 1;
                bytes += b;
            }
        }
        if n == 0 {
            return (0, true);
        }
        self.reads_only = state.reads_only && (self.commands.is_empty() || self.reads_only);
        self.bytes += bytes;
        state.bytes -= bytes;
        if n == state.commands.len() && self.commands.is_empty() {
            self.commands = mem::take(&mut state.commands);
        } else {
            self.commands.extend(state.commands.drain(..n));
        }
        self.owners.push((queue.clone(), n));
        (n, !state.commands.is_empty())
    }

    fn fits(&self, n: usize, bytes: usize) -> bool {
        self.commands.len() + n <= COMMANDS_PER_OPERATION_MAX && self.bytes + bytes <= OPERATION_ARG_BYTES_MAX
    }
}

/// Takes ready connections into one operation until it is full; `None` if none is ready.
fn gather(shared: &PoolShared) -> Option<Operation> {
    let mut op = Operation::default();
    let mut ready = lock(&shared.ready);
    while !op.full() {
        let Some(queue) = ready.pop_front() else { break };
        match op.take_from(&queue) {
            (0, _) => {
                // Nothing of it fits: it stays first in line for the next operation.
                ready.push_front(queue);
                break;
            }
            // Some of it is left: it stays busy (in this operation) and its rest is listed
            // again when this operation is answered.
            (_, true) => break,
            (_, false) => {}
        }
    }
    (!op.commands.is_empty()).then_some(op)
}

/// How many ready connections a member waits for after an answer, learnt from the operations
/// before: the connections of the last operation, but no more than one above how many came back
/// within [`GATHER_WAIT`] the last time the wait ran out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Expectation {
    want: usize,
}

impl Expectation {
    fn new() -> Expectation {
        Expectation { want: 1 }
    }

    /// Updates after a wait that saw `reached` ready connections (`timed_out` if fewer than
    /// wanted) and sent an operation for `owners` connections.
    fn update(&mut self, reached: usize, timed_out: bool, owners: usize) {
        self.want = if timed_out { owners.min(reached + 1) } else { owners }.max(1);
    }
}

/// Waits until `want` connections are ready or `deadline` passed, yielding to the connection
/// tasks meanwhile (the wait is far shorter than the runtime's timer resolution); sleeps on
/// `work` when nothing is ready after the deadline. Returns how many were ready and whether the
/// wait ran out before `want`.
async fn await_ready(shared: &PoolShared, want: usize, deadline: Instant) -> (usize, bool) {
    loop {
        let ready = lock(&shared.ready).len();
        if ready >= want {
            return (ready, false);
        }
        if Instant::now() < deadline {
            tokio::task::yield_now().await;
        } else if ready > 0 {
            return (ready, true);
        } else {
            shared.work.notified().await;
        }
    }
}

async fn member(client: ClientHandle, shared: Arc<PoolShared>, stats: Arc<Shared>) {
    let mut expectation = Expectation::new();
    let mut answered = Instant::now();
    loop {
        let (reached, timed_out) = await_ready(&shared, expectation.want, answered + GATHER_WAIT).await;
        let Some(op) = gather(&shared) else {
            continue; // another member took them
        };
        expectation.update(reached, timed_out, op.owners.len());
        let n = op.commands.len();
        let result = invoke(&client, crate::encode_operation(&op.commands), op.reads_only).await;
        Shared::bump(&stats.operations);
        let replies = match result {
            Ok(bytes) => match crate::decode_replies(&bytes) {
                Some(replies) if replies.len() == n => replies,
                _ => vec![Reply::err("ERR upright: the cluster returned a malformed result"); n],
            },
            Err(e) => vec![Reply::err(format!("ERR upright: no result from the cluster ({e})")); n],
        };
        let mut replies = replies.into_iter();
        for (queue, count) in &op.owners {
            queue.answer(replies.by_ref().take(*count), &shared, queue);
        }
        answered = Instant::now();
    }
}

/// Sends one operation: an operation of reads only takes the read-only path (every execution
/// member answers from its state; the client accepts only matching answers from all of them and
/// otherwise orders the operation, so the result is linearizable either way); anything with a
/// write is ordered.
async fn invoke(client: &ClientHandle, operation: Bytes, reads_only: bool) -> Result<Bytes, ClientError> {
    client.invoke_timeout(operation, reads_only, OPERATION_TIMEOUT).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool() -> Pool {
        Pool {
            shared: Arc::new(PoolShared {
                ready: Mutex::new(VecDeque::new()),
                work: Notify::new(),
            }),
        }
    }

    fn cmd(words: &[&str]) -> Vec<Bytes> {
        words.iter().map(|w| Bytes::copy_from_slice(w.as_bytes())).collect()
    }

    fn submit(pool: &Pool, queue: &Arc<Queue>, commands: &[&[&str]], reads_only: bool) {
        let mut batch: Vec<Vec<Bytes>> = commands.iter().map(|c| cmd(c)).collect();
        pool.submit(queue, &mut batch, reads_only);
        assert!(batch.is_empty());
    }

    fn answer(pool: &Pool, op: &Operation, texts: &[&str]) {
        let mut replies = texts.iter().map(Reply::text);
        for (queue, count) in &op.owners {
            queue.answer(replies.by_ref().take(*count), &pool.shared, queue);
        }
    }

    #[test]
    fn classification() {
        assert!(is_read(crate::command::lookup(b"GET").unwrap()));
        assert!(is_read(crate::command::lookup(b"mget").unwrap()));
        assert!(!is_read(crate::command::lookup(b"set").unwrap()));
        assert!(!is_read(crate::command::lookup(b"getdel").unwrap()));
    }

    #[test]
    fn connections_share_one_operation_in_order() {
        let pool = pool();
        let (a, b) = (Arc::new(Queue::default()), Arc::new(Queue::default()));
        submit(&pool, &a, &[&["get", "x"], &["get", "y"]], true);
        submit(&pool, &b, &[&["set", "x", "1"]], false);
        let op = gather(&pool.shared).unwrap();
        assert_eq!(
            op.commands,
            vec![cmd(&["get", "x"]), cmd(&["get", "y"]), cmd(&["set", "x", "1"])]
        );
        assert!(!op.reads_only);
        assert_eq!(op.owners.iter().map(|(_, n)| *n).collect::<Vec<_>>(), vec![2, 1]);
        assert!(gather(&pool.shared).is_none());
        answer(&pool, &op, &["1", "2", "3"]);
        assert_eq!(a.try_reply(), Some(Reply::text("1")));
        assert_eq!(a.try_reply(), Some(Reply::text("2")));
        assert_eq!(a.try_reply(), None);
        assert_eq!(b.try_reply(), Some(Reply::text("3")));
        assert!(gather(&pool.shared).is_none());
    }

    #[test]
    fn reads_only_when_every_command_reads() {
        let pool = pool();
        let (a, b) = (Arc::new(Queue::default()), Arc::new(Queue::default()));
        submit(&pool, &a, &[&["get", "x"]], true);
        submit(&pool, &b, &[&["mget", "x", "y"]], true);
        assert!(gather(&pool.shared).unwrap().reads_only);
        let c = Arc::new(Queue::default());
        submit(&pool, &c, &[&["get", "x"]], true);
        submit(&pool, &c, &[&["incr", "x"]], false);
        assert!(!gather(&pool.shared).unwrap().reads_only);
    }

    #[test]
    fn a_connection_is_in_one_operation_at_a_time() {
        let pool = pool();
        let a = Arc::new(Queue::default());
        submit(&pool, &a, &[&["set", "k", "1"]], false);
        let first = gather(&pool.shared).unwrap();
        submit(&pool, &a, &[&["set", "k", "2"]], false);
        // Its second command waits for the first operation, even with members idle.
        assert!(gather(&pool.shared).is_none());
        answer(&pool, &first, &["OK"]);
        let second = gather(&pool.shared).unwrap();
        assert_eq!(second.commands, vec![cmd(&["set", "k", "2"])]);
        answer(&pool, &second, &["OK2"]);
        assert_eq!(a.try_reply(), Some(Reply::text("OK")));
        assert_eq!(a.try_reply(), Some(Reply::text("OK2")));
        assert!(gather(&pool.shared).is_none());
    }

    #[test]
    fn operations_respect_the_command_limit() {
        let pool = pool();
        let (a, b) = (Arc::new(Queue::default()), Arc::new(Queue::default()));
        let many: Vec<Vec<Bytes>> = (0..COMMANDS_PER_OPERATION_MAX + 5)
            .map(|i| cmd(&["get", &i.to_string()]))
            .collect();
        pool.submit(&a, &mut many.clone(), true);
        submit(&pool, &b, &[&["get", "b"]], true);
        let first = gather(&pool.shared).unwrap();
        assert_eq!(first.commands, many[..COMMANDS_PER_OPERATION_MAX]);
        // `b` was not reached; `a`'s rest waits for the answer.
        let second = gather(&pool.shared).unwrap();
        assert_eq!(second.commands, vec![cmd(&["get", "b"])]);
        assert!(gather(&pool.shared).is_none());
        let texts: Vec<String> = (0..COMMANDS_PER_OPERATION_MAX).map(|i| i.to_string()).collect();
        answer(&pool, &first, &texts.iter().map(String::as_str).collect::<Vec<_>>());
        let third = gather(&pool.shared).unwrap();
        assert_eq!(third.commands, many[COMMANDS_PER_OPERATION_MAX..]);
    }

    #[test]
    fn operations_respect_the_byte_limit() {
        let pool = pool();
        let (a, b) = (Arc::new(Queue::default()), Arc::new(Queue::default()));
        let big = "v".repeat(500 * 1024);
        submit(&pool, &a, &[&["set", "a", &big]], false);
        submit(&pool, &b, &[&["set", "b", &big]], false);
        let first = gather(&pool.shared).unwrap();
        assert_eq!(first.commands.len(), 1);
        let second = gather(&pool.shared).unwrap();
        assert_eq!(second.commands, vec![cmd(&["set", "b", &big])]);
        assert!(first.bytes <= OPERATION_ARG_BYTES_MAX && second.bytes <= OPERATION_ARG_BYTES_MAX);
    }

    #[test]
    fn the_expectation_follows_the_connections_that_come_back() {
        let mut e = Expectation::new();
        assert_eq!(e.want, 1);
        // Everyone came back in time: wait for all 16 of the last operation next time.
        e.update(16, false, 16);
        assert_eq!(e.want, 16);
        // Only 3 came back before the wait ran out, 5 went in the operation (2 queued just
        // after): next time wait for one more than came back, not for all 5.
        e.update(3, true, 5);
        assert_eq!(e.want, 4);
        e.update(4, false, 6);
        assert_eq!(e.want, 6);
        // A lone connection never waits.
        e.update(1, true, 1);
        assert_eq!(e.want, 1);
        e.update(0, true, 0);
        assert_eq!(e.want, 1);
    }

    #[tokio::test]
    async fn a_member_waits_for_the_expected_connections_within_the_bound() {
        let pool = pool();
        let (a, b) = (Arc::new(Queue::default()), Arc::new(Queue::default()));
        submit(&pool, &a, &[&["set", "a", "1"]], false);
        // Enough ready: no wait at all, even with the deadline far away.
        let far = Instant::now() + Duration::from_secs(60);
        assert_eq!(await_ready(&pool.shared, 1, far).await, (1, false));
        // Two wanted, one ready: `b` queues while the member waits, and both share the operation.
        let late = tokio::spawn({
            let (shared, b) = (pool.shared.clone(), b.clone());
            async move {
                tokio::task::yield_now().await;
                let mut commands = vec![cmd(&["set", "b", "2"])];
                Pool { shared }.submit(&b, &mut commands, false);
            }
        });
        assert_eq!(await_ready(&pool.shared, 2, far).await, (2, false));
        late.await.unwrap();
        assert_eq!(gather(&pool.shared).unwrap().owners.len(), 2);
        // Nobody else comes: the wait runs out at its deadline with what is ready.
        submit(&pool, &a, &[&["set", "a", "3"]], false);
        let c = Arc::new(Queue::default());
        submit(&pool, &c, &[&["set", "c", "4"]], false);
        let started = Instant::now();
        let (reached, timed_out) = await_ready(&pool.shared, 5, started + GATHER_WAIT).await;
        assert!(timed_out && reached >= 1 && reached < 5);
        assert!(started.elapsed() >= GATHER_WAIT);
        assert!(started.elapsed() < Duration::from_secs(5));
    }

    #[tokio::test]
    async fn an_idle_member_sleeps_until_a_command_is_queued() {
        let pool = pool();
        let a = Arc::new(Queue::default());
        let past = Instant::now();
        let waiter = tokio::spawn({
            let shared = pool.shared.clone();
            async move { await_ready(&shared, 3, past).await }
        });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        submit(&pool, &a, &[&["get", "x"]], true);
        // The deadline passed long ago: one ready connection is sent at once.
        assert_eq!(waiter.await.unwrap(), (1, true));
    }

    #[tokio::test]
    async fn a_waiting_writer_is_woken_by_the_answer() {
        let pool = pool();
        let a = Arc::new(Queue::default());
        submit(&pool, &a, &[&["get", "x"]], true);
        let op = gather(&pool.shared).unwrap();
        let waiter = tokio::spawn({
            let a = a.clone();
            async move { a.next_reply().await }
        });
        tokio::task::yield_now().await;
        answer(&pool, &op, &["v"]);
        assert_eq!(waiter.await.unwrap(), Reply::text("v"));
    }
}

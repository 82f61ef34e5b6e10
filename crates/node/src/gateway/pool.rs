//! The pool of upright clients and the queues of the connections it serves.
//!
//! Every connection has a [`Queue`] of commands waiting for the cluster. A connection with queued
//! commands and nothing at the cluster is *ready*; an idle pool member takes every ready
//! connection's queued commands (up to the operation limits) and sends them as one upright
//! operation. A connection is in at most one operation at a time, so its commands execute in the
//! order it sent them; different connections' commands share operations, so one agreement round
//! serves many commands. An idle member is woken by the first command queued.
//!
//! Gathering after an answer: a client waiting for its reply sends its next command within tens
//! of microseconds of getting it. A member that sent the next operation at once, with only the
//! connections that were already waiting, would split the connections into two groups that take
//! turns, each command waiting for two agreement rounds (with `redis-benchmark -c 16`, about 8
//! commands per operation). So before its next operation a member waits, on the submissions
//! themselves (no spinning, no timer unless they are late), for the connections it just answered
//! to queue again, bounded by [`GATHER_WAIT`]. It waits only for connections that came back in
//! time before ([`Queue`]'s `prompt`): a client that thinks between commands, or has closed,
//! costs one bounded wait, not one per operation, and is waited for again once it is seen back
//! in time.

use std::collections::VecDeque;
use std::mem;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::Notify;

use super::Protocol;
use crate::client::{ClientError, ClientHandle};

/// Longest a member waits, after its operation is answered, for the connections it answered to
/// queue their next commands (see the module documentation). The runtime's timer counts in whole
/// milliseconds, so this is also its resolution; it matters only for a client that does not come
/// back promptly, and such a client is not waited for again until it does.
pub const GATHER_WAIT: Duration = Duration::from_millis(1);

/// Locks a mutex; the gateway never panics while holding one, so poisoning is not expected, and
/// the data stays consistent if it happens.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

struct QueueState<P: Protocol> {
    /// Commands not yet sent, in order.
    commands: Vec<P::Command>,
    /// Bytes of `commands` (as [`Protocol::command_bytes`] counts them).
    bytes: usize,
    /// Whether every queued command is a read.
    reads_only: bool,
    /// Ready (in the pool's list) or in an operation: the connection must not be listed again.
    busy: bool,
    /// Answers received from the cluster, not yet taken by the connection's writer, in order.
    replies: VecDeque<P::Answer>,
}

impl<P: Protocol> Default for QueueState<P> {
    fn default() -> QueueState<P> {
        QueueState {
            commands: Vec::new(),
            bytes: 0,
            reads_only: false,
            busy: false,
            replies: VecDeque::new(),
        }
    }
}

/// One connection's commands for the cluster and their answers. The connection bounds both by
/// the answers it may owe.
pub struct Queue<P: Protocol> {
    state: Mutex<QueueState<P>>,
    answered: Notify,
    /// Notified whenever queued commands are taken into an operation.
    taken: Notify,
    /// Whether the connection queued its next commands within [`GATHER_WAIT`] of its last answer
    /// (or has not been answered yet): only such connections are waited for.
    prompt: AtomicBool,
}

impl<P: Protocol> Default for Queue<P> {
    fn default() -> Queue<P> {
        Queue {
            state: Mutex::default(),
            answered: Notify::new(),
            taken: Notify::new(),
            prompt: AtomicBool::new(true),
        }
    }
}

impl<P: Protocol> Queue<P> {
    /// The connection will queue nothing more (it closed): members stop waiting for it.
    pub fn closed(&self) {
        self.prompt.store(false, Ordering::Relaxed);
    }

    /// Queued commands, or in an operation.
    fn busy(&self) -> bool {
        lock(&self.state).busy
    }

    /// The next answer, in command order; waits until the cluster answered.
    pub async fn next_reply(&self) -> P::Answer {
        loop {
            if let Some(reply) = self.try_reply() {
                return reply;
            }
            self.answered.notified().await;
        }
    }

    /// Waits until fewer than `bytes` of the connection's commands wait to be sent (as
    /// [`Protocol::command_bytes`] counts them): a connection streaming a large command to the
    /// cluster keeps only so much of it ahead of what the pool has sent.
    pub async fn unsent_below(&self, bytes: usize) {
        loop {
            let taken = self.taken.notified();
            tokio::pin!(taken);
            taken.as_mut().enable();
            if lock(&self.state).bytes < bytes {
                return;
            }
            taken.await;
        }
    }

    /// The next answer if it is already here.
    pub fn try_reply(&self) -> Option<P::Answer> {
        lock(&self.state).replies.pop_front()
    }

    fn answer(&self, replies: impl Iterator<Item = P::Answer>, pool: &PoolShared<P>, me: &Arc<Queue<P>>) {
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

struct PoolShared<P: Protocol> {
    /// Connections with queued commands and none at the cluster, oldest first.
    ready: Mutex<VecDeque<Arc<Queue<P>>>>,
    /// Wakes an idle member.
    work: Notify,
    /// Operations sent to the cluster (answered or failed).
    operations: AtomicU64,
}

impl<P: Protocol> PoolShared<P> {
    fn new() -> PoolShared<P> {
        PoolShared {
            ready: Mutex::new(VecDeque::new()),
            work: Notify::new(),
            operations: AtomicU64::new(0),
        }
    }

    fn make_ready(&self, queue: Arc<Queue<P>>) {
        lock(&self.ready).push_back(queue);
        self.work.notify_one();
    }
}

/// The pool: one task per upright client, all serving one list of ready connections.
pub struct Pool<P: Protocol> {
    shared: Arc<PoolShared<P>>,
    size: usize,
}

impl<P: Protocol> std::fmt::Debug for Pool<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("size", &self.size)
            .field("operations", &self.operations())
            .finish()
    }
}

impl<P: Protocol> Pool<P> {
    /// Starts one member task per client handle (each a distinct client identity); an operation
    /// not answered within `timeout` fails each of its commands with [`Protocol::failed`].
    pub fn start(clients: Vec<ClientHandle>, timeout: Duration) -> Pool<P> {
        assert!(!clients.is_empty(), "a gateway pool needs at least one upright client");
        let shared = Arc::new(PoolShared::new());
        let size = clients.len();
        for client in clients {
            tokio::spawn(member(client, shared.clone(), timeout));
        }
        Pool { shared, size }
    }

    /// Upright clients (members) in the pool: the most operations in flight at once.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Operations the pool has sent to the cluster so far.
    pub fn operations(&self) -> u64 {
        self.shared.operations.load(Ordering::Relaxed)
    }

    /// Queues commands of connection `queue` (in order; `reads_only` if all of them only read,
    /// as the protocol classifies them).
    pub fn submit(&self, queue: &Arc<Queue<P>>, commands: &mut Vec<P::Command>, reads_only: bool) {
        if commands.is_empty() {
            return;
        }
        let mut state = lock(&queue.state);
        state.reads_only = reads_only && (state.commands.is_empty() || state.reads_only);
        state.bytes += commands.iter().map(P::command_bytes).sum::<usize>();
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
struct Operation<P: Protocol> {
    commands: Vec<P::Command>,
    bytes: usize,
    reads_only: bool,
    /// Each connection in the operation and how many of its commands, in operation order.
    owners: Vec<(Arc<Queue<P>>, usize)>,
}

impl<P: Protocol> Operation<P> {
    fn new() -> Operation<P> {
        Operation {
            commands: Vec::new(),
            bytes: 0,
            reads_only: false,
            owners: Vec::new(),
        }
    }

    fn full(&self) -> bool {
        self.commands.len() >= P::COMMANDS_MAX || self.bytes >= P::BYTES_MAX
    }

    /// Moves as many of the connection's queued commands as fit (at least its first if the
    /// operation is empty): how many it moved and whether any are left. Leftovers stay queued
    /// and go after this operation is answered.
    fn take_from(&mut self, queue: &Arc<Queue<P>>) -> (usize, bool) {
        let mut state = lock(&queue.state);
        let (mut n, mut bytes) = (0, 0);
        if self.fits(state.commands.len(), state.bytes) {
            (n, bytes) = (state.commands.len(), state.bytes);
        } else {
            for c in &state.commands {
                let b = P::command_bytes(c);
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
        let left = !state.commands.is_empty();
        drop(state);
        queue.taken.notify_waiters();
        (n, left)
    }

    fn fits(&self, n: usize, bytes: usize) -> bool {
        self.commands.len() + n <= P::COMMANDS_MAX && self.bytes + bytes <= P::BYTES_MAX
    }
}

/// Takes ready connections into one operation until it is full; `None` if none is ready.
fn gather<P: Protocol>(shared: &PoolShared<P>) -> Option<Operation<P>> {
    let mut op = Operation::new();
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

/// Waits until every prompt connection of `answered` has queued commands again, or until
/// `deadline`; woken by the submissions themselves. Afterwards a connection is prompt if it had
/// queued again by the end of the wait.
async fn await_return<P: Protocol>(shared: &PoolShared<P>, answered: &[Arc<Queue<P>>], deadline: tokio::time::Instant) {
    while !answered.iter().all(|q| !q.prompt.load(Ordering::Relaxed) || q.busy()) {
        if tokio::time::timeout_at(deadline, shared.work.notified()).await.is_err() {
            break;
        }
    }
    for q in answered {
        let back = q.busy();
        q.prompt.store(back, Ordering::Relaxed);
    }
}

/// The answers to an operation of `n` commands: decoded from its result, or, if the cluster gave
/// none or one that does not decode to exactly `n` answers, a failure for each command.
fn answers<P: Protocol>(result: Result<Bytes, ClientError>, n: usize) -> Vec<P::Answer> {
    let why = match result {
        Ok(bytes) => match P::decode(&bytes, n) {
            Some(replies) if replies.len() == n => return replies,
            _ => "the cluster returned a malformed result".to_string(),
        },
        Err(e) => format!("no result from the cluster ({e})"),
    };
    (0..n).map(|_| P::failed(&why)).collect()
}

async fn member<P: Protocol>(client: ClientHandle, shared: Arc<PoolShared<P>>, timeout: Duration) {
    // The connections of the last operation, and when it was answered.
    let mut answered: Vec<Arc<Queue<P>>> = Vec::new();
    let mut answered_at = tokio::time::Instant::now();
    loop {
        // Nothing to gather while nothing is ready: the first command queued wakes this member,
        // and the wait (still bounded from the answer) runs then.
        if !answered.is_empty() && !lock(&shared.ready).is_empty() {
            await_return(&shared, &answered, answered_at + GATHER_WAIT).await;
            answered.clear();
        }
        let Some(op) = gather(&shared) else {
            shared.work.notified().await;
            continue;
        };
        let n = op.commands.len();
        crate::timeline::event("gateway-op", n as u64, 0, 0);
        // An operation of reads only takes the read-only path (the client accepts only matching
        // answers from every execution member and otherwise orders it, so the result is
        // linearizable either way); anything with a write is ordered.
        let result = client
            .invoke_timeout(P::encode(&op.commands), op.reads_only, timeout)
            .await;
        shared.operations.fetch_add(1, Ordering::Relaxed);
        let replies = answers::<P>(result, n);
        crate::timeline::event("gateway-answer", n as u64, 0, 0);
        let mut replies = replies.into_iter();
        for (queue, count) in &op.owners {
            queue.answer(replies.by_ref().take(*count), &shared, queue);
        }
        answered = op.owners.into_iter().map(|(queue, _)| queue).collect();
        answered_at = tokio::time::Instant::now();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Commands are argument vectors, answers strings; the limits are the Redis gateway's.
    struct Test;

    impl Protocol for Test {
        type Command = Vec<Bytes>;
        type Answer = String;
        const COMMANDS_MAX: usize = 512;
        const BYTES_MAX: usize = 768 * 1024;

        fn command_bytes(argv: &Vec<Bytes>) -> usize {
            argv.iter().map(|a| a.len() + 8).sum()
        }

        fn encode(commands: &[Vec<Bytes>]) -> Bytes {
            Bytes::from(commands.concat().concat())
        }

        /// Comma-separated answers; `None` for bytes that are not UTF-8.
        fn decode(result: &[u8], _commands: usize) -> Option<Vec<String>> {
            let text = std::str::from_utf8(result).ok()?;
            Some(text.split(',').map(str::to_string).collect())
        }

        fn failed(why: &str) -> String {
            why.to_string()
        }
    }

    type Q = Queue<Test>;

    fn pool() -> Pool<Test> {
        Pool {
            shared: Arc::new(PoolShared::new()),
            size: 1,
        }
    }

    fn txt(s: &str) -> String {
        s.to_string()
    }

    fn cmd(words: &[&str]) -> Vec<Bytes> {
        words.iter().map(|w| Bytes::copy_from_slice(w.as_bytes())).collect()
    }

    fn submit(pool: &Pool<Test>, queue: &Arc<Q>, commands: &[&[&str]], reads_only: bool) {
        let mut batch: Vec<Vec<Bytes>> = commands.iter().map(|c| cmd(c)).collect();
        pool.submit(queue, &mut batch, reads_only);
        assert!(batch.is_empty());
    }

    fn answer(pool: &Pool<Test>, op: &Operation<Test>, texts: &[&str]) {
        let mut replies = texts.iter().map(|t| t.to_string());
        for (queue, count) in &op.owners {
            queue.answer(replies.by_ref().take(*count), &pool.shared, queue);
        }
    }

    #[test]
    fn a_result_that_does_not_decode_to_one_answer_per_command_fails_each_command() {
        let ok = |text: &'static str| Ok(Bytes::from_static(text.as_bytes()));
        assert_eq!(answers::<Test>(ok("a,b"), 2), vec!["a", "b"]);
        let malformed = vec!["the cluster returned a malformed result"; 2];
        assert_eq!(answers::<Test>(ok("a,b,c"), 2), malformed, "too many answers");
        assert_eq!(answers::<Test>(ok("a"), 2), malformed, "too few answers");
        assert_eq!(answers::<Test>(Ok(Bytes::from_static(b"\xff")), 2), malformed);
        assert_eq!(
            answers::<Test>(Err(ClientError::TimedOut), 1),
            vec!["no result from the cluster (timed out)"]
        );
    }

    #[test]
    fn connections_share_one_operation_in_order() {
        let pool = pool();
        let (a, b) = (Arc::new(Q::default()), Arc::new(Q::default()));
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
        assert_eq!(a.try_reply(), Some(txt("1")));
        assert_eq!(a.try_reply(), Some(txt("2")));
        assert_eq!(a.try_reply(), None);
        assert_eq!(b.try_reply(), Some(txt("3")));
        assert!(gather(&pool.shared).is_none());
    }

    #[test]
    fn reads_only_when_every_command_reads() {
        let pool = pool();
        let (a, b) = (Arc::new(Q::default()), Arc::new(Q::default()));
        submit(&pool, &a, &[&["get", "x"]], true);
        submit(&pool, &b, &[&["mget", "x", "y"]], true);
        assert!(gather(&pool.shared).unwrap().reads_only);
        let c = Arc::new(Q::default());
        submit(&pool, &c, &[&["get", "x"]], true);
        submit(&pool, &c, &[&["incr", "x"]], false);
        assert!(!gather(&pool.shared).unwrap().reads_only);
    }

    #[test]
    fn a_connection_is_in_one_operation_at_a_time() {
        let pool = pool();
        let a = Arc::new(Q::default());
        submit(&pool, &a, &[&["set", "k", "1"]], false);
        let first = gather(&pool.shared).unwrap();
        submit(&pool, &a, &[&["set", "k", "2"]], false);
        // Its second command waits for the first operation, even with members idle.
        assert!(gather(&pool.shared).is_none());
        answer(&pool, &first, &["OK"]);
        let second = gather(&pool.shared).unwrap();
        assert_eq!(second.commands, vec![cmd(&["set", "k", "2"])]);
        answer(&pool, &second, &["OK2"]);
        assert_eq!(a.try_reply(), Some(txt("OK")));
        assert_eq!(a.try_reply(), Some(txt("OK2")));
        assert!(gather(&pool.shared).is_none());
    }

    #[test]
    fn operations_respect_the_command_limit() {
        let pool = pool();
        let (a, b) = (Arc::new(Q::default()), Arc::new(Q::default()));
        let many: Vec<Vec<Bytes>> = (0..Test::COMMANDS_MAX + 5)
            .map(|i| cmd(&["get", &i.to_string()]))
            .collect();
        pool.submit(&a, &mut many.clone(), true);
        submit(&pool, &b, &[&["get", "b"]], true);
        let first = gather(&pool.shared).unwrap();
        assert_eq!(first.commands, many[..Test::COMMANDS_MAX]);
        // `b` was not reached; `a`'s rest waits for the answer.
        let second = gather(&pool.shared).unwrap();
        assert_eq!(second.commands, vec![cmd(&["get", "b"])]);
        assert!(gather(&pool.shared).is_none());
        let texts: Vec<String> = (0..Test::COMMANDS_MAX).map(|i| i.to_string()).collect();
        answer(&pool, &first, &texts.iter().map(String::as_str).collect::<Vec<_>>());
        let third = gather(&pool.shared).unwrap();
        assert_eq!(third.commands, many[Test::COMMANDS_MAX..]);
    }

    #[test]
    fn operations_respect_the_byte_limit() {
        let pool = pool();
        let (a, b) = (Arc::new(Q::default()), Arc::new(Q::default()));
        let big = "v".repeat(500 * 1024);
        submit(&pool, &a, &[&["set", "a", &big]], false);
        submit(&pool, &b, &[&["set", "b", &big]], false);
        let first = gather(&pool.shared).unwrap();
        assert_eq!(first.commands.len(), 1);
        let second = gather(&pool.shared).unwrap();
        assert_eq!(second.commands, vec![cmd(&["set", "b", &big])]);
        assert!(first.bytes <= Test::BYTES_MAX && second.bytes <= Test::BYTES_MAX);
    }

    /// A connection streaming large commands waits while too many of its bytes are unsent, and
    /// goes on as soon as the pool takes enough into operations.
    #[tokio::test]
    async fn a_streaming_connection_waits_for_the_pool_to_take_its_pieces() {
        let pool = pool();
        let a = Arc::new(Q::default());
        let big = "v".repeat(500 * 1024);
        submit(
            &pool,
            &a,
            &[&["stage", &big], &["stage", &big], &["stage", &big]],
            false,
        );
        let waiter = {
            let a = a.clone();
            tokio::spawn(async move { a.unsent_below(600 * 1024).await })
        };
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished(), "1.5 MB unsent");
        let first = gather(&pool.shared).unwrap();
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished(), "1 MB unsent");
        answer(&pool, &first, &["OK"]);
        let _second = gather(&pool.shared).unwrap();
        tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("woken once the second piece was taken")
            .unwrap();
        assert!(
            tokio::time::timeout(Duration::from_millis(1), a.unsent_below(600 * 1024))
                .await
                .is_ok(),
            "below the bound: no wait"
        );
    }

    /// A connection whose one command was sent and answered.
    fn answered_once(pool: &Pool<Test>) -> Arc<Q> {
        let a = Arc::new(Q::default());
        submit(pool, &a, &[&["get", "x"]], true);
        let op = gather(&pool.shared).unwrap();
        answer(pool, &op, &["v"]);
        a
    }

    fn far() -> tokio::time::Instant {
        tokio::time::Instant::now() + Duration::from_secs(60)
    }

    #[tokio::test]
    async fn the_connections_just_answered_share_the_next_operation() {
        let pool = pool();
        let (a, b) = (Arc::new(Q::default()), Arc::new(Q::default()));
        submit(&pool, &a, &[&["set", "a", "1"]], false);
        let first = gather(&pool.shared).unwrap();
        submit(&pool, &b, &[&["set", "b", "1"]], false); // queues while `a` is at the cluster
        answer(&pool, &first, &["OK"]);
        // Sent at once, the next operation would carry `b` alone and `a` would wait for it: the
        // two would take turns. The member waits for `a` instead (woken by its submission).
        let back = tokio::spawn({
            let (shared, a) = (pool.shared.clone(), a.clone());
            async move {
                tokio::task::yield_now().await;
                Pool { shared, size: 1 }.submit(&a, &mut vec![cmd(&["set", "a", "2"])], false);
            }
        });
        let started = std::time::Instant::now();
        await_return(&pool.shared, std::slice::from_ref(&a), far()).await;
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "woken by the submission, not the deadline"
        );
        back.await.unwrap();
        let second = gather(&pool.shared).unwrap();
        assert_eq!(second.owners.len(), 2);
        assert_eq!(second.commands, vec![cmd(&["set", "b", "1"]), cmd(&["set", "a", "2"])]);
        assert!(a.prompt.load(Ordering::Relaxed));
    }

    #[tokio::test]
    async fn a_connection_that_does_not_come_back_is_waited_for_once() {
        let pool = pool();
        let a = answered_once(&pool);
        // `a` thinks: the wait runs to its deadline and `a` is no longer prompt.
        let started = std::time::Instant::now();
        await_return(
            &pool.shared,
            std::slice::from_ref(&a),
            tokio::time::Instant::now() + Duration::from_millis(20),
        )
        .await;
        assert!(started.elapsed() >= Duration::from_millis(20));
        assert!(!a.prompt.load(Ordering::Relaxed));
        // Next time it is not waited for, however far the deadline.
        let started = std::time::Instant::now();
        await_return(&pool.shared, std::slice::from_ref(&a), far()).await;
        assert!(started.elapsed() < Duration::from_secs(10));
        // Seen back by the end of a wait, it is prompt again.
        submit(&pool, &a, &[&["get", "x"]], true);
        await_return(&pool.shared, std::slice::from_ref(&a), far()).await;
        assert!(a.prompt.load(Ordering::Relaxed));
    }

    #[tokio::test]
    async fn a_closed_connection_is_not_waited_for() {
        let pool = pool();
        let a = answered_once(&pool);
        let b = Arc::new(Q::default());
        a.closed();
        submit(&pool, &b, &[&["get", "y"]], true);
        let started = std::time::Instant::now();
        await_return(&pool.shared, std::slice::from_ref(&a), far()).await;
        assert!(started.elapsed() < Duration::from_secs(10));
        assert_eq!(gather(&pool.shared).unwrap().commands, vec![cmd(&["get", "y"])]);
    }

    #[tokio::test]
    async fn a_waiting_writer_is_woken_by_the_answer() {
        let pool = pool();
        let a = Arc::new(Q::default());
        submit(&pool, &a, &[&["get", "x"]], true);
        let op = gather(&pool.shared).unwrap();
        let waiter = tokio::spawn({
            let a = a.clone();
            async move { a.next_reply().await }
        });
        tokio::task::yield_now().await;
        answer(&pool, &op, &["v"]);
        assert_eq!(waiter.await.unwrap(), txt("v"));
    }
}

//! Watching the primary (Aardvark, UpRight thesis 3.3; docs/PROTOCOL.md "Watching the primary").
//!
//! PBFT's view-change timer restarts at every commit, so a primary that commits a batch just
//! before each timeout, or that leaves one client's requests out of its batches while ordering
//! everyone else's, is never replaced: throughput falls to nearly nothing, or to nothing for the
//! victim, and no timer fires. Each backup therefore also watches, on its order tick
//! (`view_change_timeout_us / 4`), while it is in an installed view:
//!
//! - **Waiting requests.** A request that is ready here (the next of its client, with enough
//!   matrix rows) waits at most `order_wait_max` (`view_change_timeout / 5`,
//!   doubling with each consecutive view change like the timeout itself) for a PRE-PREPARE that
//!   orders it, while the primary has room to order it (its pipeline and the log window are not
//!   full). Backups learn of a request only when it is still unordered
//!   [`crate::auth::BACKUP_DELAY_FRACTION`] after the primary, so under a correct primary almost
//!   none ever waits here. This is Aardvark's heartbeat timer and its fairness rule in one: a
//!   slow primary and a primary that starves a client are both replaced
//!   (`view_change_primary_slow`).
//! - **Throughput.** Requests committed per window (`view_change_timeout_us`), compared with the
//!   best window of the last [`THROUGHPUT_VIEWS`] views. After a grace period of
//!   [`GRACE_WINDOWS`] windows in a new view, a window in which requests waited here (demand the
//!   primary did not keep up with) must reach [`THROUGHPUT_PERCENT`] of that best, and the
//!   requirement rises by one point per window, so a primary that stays just fast enough is
//!   replaced in time too (`view_change_primary_throughput`). Windows without waiting requests
//!   are not judged: a cluster with little load is not slow. Without any measured view to
//!   compare with, a view whose requests wait through its whole grace period is replaced once,
//!   so that a Byzantine primary of the first view cannot hide behind the missing history.
//!
//! Both are off with `knobs.watch_primary = false` (the attack benchmarks' and the simulator's
//! "defences off" runs); PBFT's view-change timer runs either way.

use std::collections::{BTreeMap, VecDeque};

use super::OrderStage;
use crate::ids::{ClientId, ReplicaId, RequestId, SeqNo, View};
use crate::message::{Message, PbftMessage};
use crate::stage::{Action, Time};

/// Recent views whose best window sets the throughput expected of the current primary.
pub const THROUGHPUT_VIEWS: usize = 5;
/// Windows after a view is installed before its throughput is judged.
pub const GRACE_WINDOWS: u64 = 3;
/// Percent of the best recent window a judged window must reach (plus one per window after the
/// grace period).
pub const THROUGHPUT_PERCENT: u64 = 90;
/// A new primary's requests start to wait at the earliest `view_change_timeout /
/// NEW_VIEW_GRACE_FRACTION` after its view is installed here: it first re-proposes what the
/// view change carried and works through the backlog of the change (under load its inbox holds
/// the requests' rows longer than `order_wait_max`), and blaming it then makes the next primary
/// start with a larger backlog still. A slow primary is still replaced within
/// `grace + order_wait_max` (0.7 of the timeout), before it commits anything just under the
/// timeout.
pub const NEW_VIEW_GRACE_FRACTION: u64 = 2;
/// `order_wait_max = view_change_timeout / ORDER_WAIT_FRACTION`.
pub const ORDER_WAIT_FRACTION: u64 = 5;

/// Why a backup gave up on the primary.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Suspicion {
    /// A ready request waited longer than the bound.
    Slow,
    /// A judged window fell short of the recent views' best.
    Throughput,
}

impl Suspicion {
    /// The statistic counted for it.
    pub fn counter(self) -> &'static str {
        match self {
            Suspicion::Slow => "view_change_primary_slow",
            Suspicion::Throughput => "view_change_primary_throughput",
        }
    }
}

/// A backup's watch on the primary of its installed view.
#[derive(Debug, Default)]
pub(crate) struct Monitor {
    /// The view being watched and when it was installed here.
    view: Option<(View, Time)>,
    /// Per client with a request ready here: the request and since when it waits.
    waiting: BTreeMap<ClientId, (RequestId, Time)>,
    /// Per client, its newest request with a row here and when its latest row arrived: a
    /// request that became ready (its last needed row arrived) waits from then, not from the
    /// tick that noticed it, nor from its first row (the others may come much later, through
    /// no fault of the primary's).
    arrivals: BTreeMap<ClientId, (RequestId, Time)>,
    /// The Watch timer's deadline, if armed.
    pub(super) watch_armed: Option<Time>,
    /// Start of the current window, requests committed in it, and whether a request waited.
    window_start: Time,
    window_requests: u64,
    window_demand: bool,
    /// Windows completed in this view.
    windows: u64,
    /// Judged windows since the grace period ended in this view, each demanding one point more.
    demanding: u64,
    /// Best window (requests per second) of each recent view, the current one last.
    best: VecDeque<(View, u64)>,
    /// Per other member, the highest seqno it voted for (PREPARE, COMMIT) in the watched view,
    /// inside the log window or beyond it.
    votes: BTreeMap<ReplicaId, SeqNo>,
}

impl Monitor {
    /// View `view` is installed here at `now`: a new primary to watch.
    pub fn view_installed(&mut self, view: View, now: Time) {
        self.view = Some((view, now));
        self.waiting.clear();
        self.votes.clear();
        self.window_start = now;
        self.window_requests = 0;
        self.window_demand = false;
        self.windows = 0;
        self.demanding = 0;
        if self.best.back().is_none_or(|(v, _)| *v != view) {
            self.best.push_back((view, 0));
            while self.best.len() > THROUGHPUT_VIEWS {
                self.best.pop_front();
            }
        }
    }

    /// A view change started: nothing is watched until the next view is installed.
    pub fn view_changing(&mut self) {
        self.view = None;
        self.waiting.clear();
        self.votes.clear();
    }

    /// Member `from` voted for `seqno` in the watched view.
    pub fn voted(&mut self, from: ReplicaId, seqno: SeqNo) {
        if self.view.is_some() {
            let highest = self.votes.entry(from).or_default();
            *highest = (*highest).max(seqno);
        }
    }

    /// Whether this member is behind: at least `vouchers` other members (so one correct one)
    /// voted for a seqno at or beyond `beyond`, which the primary must then have proposed.
    pub fn behind(&self, beyond: SeqNo, vouchers: usize) -> bool {
        self.votes.values().filter(|s| **s >= beyond).count() >= vouchers
    }

    /// A row for `client`'s request `request` arrived at `now`.
    pub fn arrived(&mut self, client: ClientId, request: RequestId, now: Time) {
        match self.arrivals.get(&client) {
            Some((r, _)) if *r > request => {}
            _ => {
                self.arrivals.insert(client, (request, now));
            }
        }
    }

    /// When the request waiting longest here reaches `wait_max` (the Watch timer's deadline).
    pub fn deadline(&self, wait_max: Time) -> Option<Time> {
        self.waiting.values().map(|(_, since)| since + wait_max + 1).min()
    }

    /// Requests committed (in the watched view).
    pub fn committed(&mut self, requests: usize) {
        if self.view.is_some() {
            self.window_requests += requests as u64;
        }
    }

    /// Best window of the recent views, the current one included.
    fn best_recent(&self) -> u64 {
        self.best.iter().map(|(_, b)| *b).max().unwrap_or(0)
    }

    /// The watch at a tick: `ready` are the requests ready here now (`None` if the primary has
    /// no room to order them: they are not its fault), `wait_max` the bound on waiting,
    /// `grace` how long after the view's installation waiting starts to count at the earliest,
    /// and `window` the window length.
    pub fn tick(
        &mut self,
        now: Time,
        ready: Option<Vec<(ClientId, RequestId)>>,
        wait_max: Time,
        grace: Time,
        window: Time,
    ) -> Option<Suspicion> {
        let (_, installed) = self.view?;
        let mut suspicion = None;
        match ready {
            Some(ready) => {
                let mut waiting = BTreeMap::new();
                for (client, request) in ready {
                    let since = match (self.waiting.get(&client), self.arrivals.get(&client)) {
                        (Some((r, since)), _) if *r == request => *since,
                        // Its rows came in this view: it waits from the latest.
                        (_, Some((r, at))) if *r == request => (*at).max(installed + grace),
                        _ => now.max(installed + grace),
                    };
                    waiting.insert(client, (request, since));
                }
                self.waiting = waiting;
                if !self.waiting.is_empty() {
                    self.window_demand = true;
                }
                if self
                    .waiting
                    .values()
                    .any(|(_, since)| now.saturating_sub(*since) > wait_max)
                {
                    suspicion = Some(Suspicion::Slow);
                }
            }
            None => self.waiting.clear(),
        }
        let elapsed = now.saturating_sub(self.window_start);
        if window > 0 && elapsed >= window {
            let rate = self.window_requests.saturating_mul(1_000_000) / elapsed.max(1);
            let judged = self.windows >= GRACE_WINDOWS && self.window_demand;
            let best = self.best_recent();
            if judged {
                let percent = THROUGHPUT_PERCENT + self.demanding;
                self.demanding += 1;
                let short = if best == 0 {
                    // Nothing measured yet: requests waited through the grace period.
                    now.saturating_sub(installed) >= window.saturating_mul(GRACE_WINDOWS + 1)
                } else {
                    rate.saturating_mul(100) < best.saturating_mul(percent)
                };
                if short {
                    suspicion = suspicion.or(Some(Suspicion::Throughput));
                }
            }
            if let Some((_, b)) = self.best.back_mut() {
                *b = (*b).max(rate);
            }
            self.windows += 1;
            self.window_start = now;
            self.window_requests = 0;
            self.window_demand = false;
        }
        suspicion
    }
}

impl OrderStage {
    /// How long a ready request may wait here for the primary to order it.
    pub(super) fn order_wait_max(&self) -> Time {
        (self.view_change_timeout() / ORDER_WAIT_FRACTION).max(1)
    }

    /// The requests ready here now, or `None` if the primary has no room to order them (its
    /// pipeline or the log window is full).
    fn ready_for_primary(&self) -> Option<Vec<(ClientId, RequestId)>> {
        let n = self.next_with_room()?;
        let p = self.projection(n);
        Some(self.all_ready(&p))
    }

    /// The watch on the primary, at each order tick of a backup in an installed view.
    pub(super) fn watch_primary(&mut self, now: Time, out: &mut Vec<Action>) {
        if !self.config.knobs.watch_primary
            || self.changing
            || self.is_primary()
            || self.is_abstaining()
            || self.speculating() && !self.chain_protocol()
        {
            return;
        }
        let (wait_max, window) = (self.order_wait_max(), self.config.knobs.view_change_timeout_us);
        // A member that is behind (its peers vote for batches past what it could accept, even
        // allowing for a full pipeline in flight) misses PRE-PREPAREs that exist: the primary is
        // not the one to blame. It judges again once it has caught up; until then it looks
        // again every bound.
        let beyond = SeqNo(self.next_accept().0 + self.config.knobs.pipeline_window);
        if self.monitor.behind(beyond, self.q.r + 1) {
            self.stats.bump("watch_skipped_behind");
            self.arm_watch(now, now + wait_max, out);
            return;
        }
        let ready = self.ready_for_primary();
        let grace = self.config.knobs.view_change_timeout_us / NEW_VIEW_GRACE_FRACTION;
        if let Some(suspicion) = self.monitor.tick(now, ready, wait_max, grace, window) {
            self.stats.bump(suspicion.counter());
            self.suspect(now, out);
            if self.changing {
                return;
            }
        }
        // Look again when the longest-waiting request reaches the bound; once this member
        // suspects the primary (and waits for others to), a bound already passed would fire at
        // once and forever: then again a bound from now.
        if let Some(at) = self.monitor.deadline(wait_max) {
            let at = if self.suspects_primary() {
                at.max(now + wait_max)
            } else {
                at
            };
            self.arm_watch(now, at.max(now + 1), out);
        }
    }

    /// The watch gave up on the primary: SUSPECT to the other order members (once per view; the
    /// order tick resends it), and the view change if enough members suspect it.
    fn suspect(&mut self, now: Time, out: &mut Vec<Action>) {
        if self.suspects_primary() {
            return;
        }
        self.suspects.insert(self.id, self.view);
        self.stats.bump("suspect_sent");
        let view = self.view;
        self.send_to_order(out, Message::Pbft(PbftMessage::Suspect { view }));
        self.change_if_suspected(now, out);
    }

    /// Whether this member suspects the primary of its current view.
    fn suspects_primary(&self) -> bool {
        self.suspects.get(&self.id) == Some(&self.view)
    }

    /// SUSPECT from order member `from` for `view`.
    pub(super) fn on_suspect(&mut self, now: Time, from: ReplicaId, view: View, out: &mut Vec<Action>) {
        if view < self.view {
            // The sender is behind (it missed our NEW-VIEW and still watches an old primary;
            // its own view-change timer may have nothing to count): it gets our NEW-VIEW, as an
            // old VIEW-CHANGE would get it. Simulator seed 1000138 (Aliph, twins): a member two
            // views back kept suspecting while the two correct members ahead of it could not
            // commit without it and only one of them was changing views.
            if !self.changing && self.view_change.new_view.is_some() && self.may_help(now, from) {
                self.stats.bump("new_view_relayed_to_old_suspect");
                self.relay_new_view(from, out);
            }
            return self.stats.bump("drop_old_suspect");
        }
        if self.suspects.get(&from).is_some_and(|v| *v >= view) {
            return self.stats.bump("drop_old_suspect");
        }
        self.suspects.insert(from, view);
        self.stats.bump("suspect_received");
        self.change_if_suspected(now, out);
    }

    /// Starts the view change once `view_change_join()` members suspect the primary of the
    /// installed view (at least one of them correct).
    pub(super) fn change_if_suspected(&mut self, now: Time, out: &mut Vec<Action>) {
        if self.changing || !self.config.knobs.watch_primary {
            return;
        }
        let view = self.view;
        let suspecting = self.suspects.values().filter(|v| **v == view).count();
        if suspecting >= self.q.view_change_join() {
            self.stats.bump("view_change_suspected");
            self.start_view_change(now, view.next(), out);
        }
    }

    /// Order tick: this member's SUSPECT again while it still suspects the installed view's
    /// primary (a lost one must not leave the others short of the count).
    pub(super) fn resend_suspicion(&self, out: &mut Vec<Action>) {
        if !self.changing && self.suspects_primary() {
            let view = self.view;
            self.send_to_order(out, Message::Pbft(PbftMessage::Suspect { view }));
        }
    }

    /// A row of a request arrived at a backup: watch the request from now on.
    pub(super) fn note_arrival(&mut self, now: Time, client: ClientId, request: RequestId, out: &mut Vec<Action>) {
        if !self.config.knobs.watch_primary || self.changing || self.is_primary() {
            return;
        }
        self.monitor.arrived(client, request, now);
        let at = now + self.order_wait_max() + 1;
        self.arm_watch(now, at, out);
    }

    /// Arms the Watch timer for `at` unless it is armed for earlier (and still ahead).
    fn arm_watch(&mut self, now: Time, at: Time, out: &mut Vec<Action>) {
        if self.monitor.watch_armed.is_none_or(|armed| armed > at || armed <= now) {
            self.monitor.watch_armed = Some(at);
            out.push(Action::SetTimer {
                timer: crate::stage::Timer::Pbft(crate::message::PbftTimer::Watch),
                at,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Time = 1_000;

    fn req(c: u32, r: u64) -> (ClientId, RequestId) {
        (ClientId(c), RequestId(r))
    }

    #[test]
    fn a_new_primary_gets_a_grace_period_before_requests_count_as_waiting() {
        let mut m = Monitor::default();
        m.view_installed(View(1), 100 * MS);
        // Ready from the installation on: it waits from 100 + 50 ms.
        m.arrived(ClientId(1), RequestId(5), 90 * MS);
        assert_eq!(m.tick(120 * MS, Some(vec![req(1, 5)]), 40 * MS, 50 * MS, 0), None);
        assert_eq!(m.deadline(40 * MS), Some(190 * MS + 1));
        assert_eq!(m.tick(190 * MS, Some(vec![req(1, 5)]), 40 * MS, 50 * MS, 0), None);
        assert_eq!(
            m.tick(191 * MS, Some(vec![req(1, 5)]), 40 * MS, 50 * MS, 0),
            Some(Suspicion::Slow)
        );
    }

    #[test]
    fn a_member_is_behind_only_when_enough_others_voted_past_it() {
        let mut m = Monitor::default();
        m.voted(ReplicaId(1), SeqNo(9));
        assert!(!m.behind(SeqNo(5), 1), "votes before a view is watched are ignored");
        m.view_installed(View(1), 0);
        m.voted(ReplicaId(1), SeqNo(9));
        m.voted(ReplicaId(1), SeqNo(3));
        assert!(m.behind(SeqNo(5), 1));
        assert!(!m.behind(SeqNo(5), 2), "one member alone (maybe faulty) is not enough");
        m.voted(ReplicaId(2), SeqNo(5));
        assert!(m.behind(SeqNo(5), 2));
        assert!(!m.behind(SeqNo(6), 2));
        m.view_installed(View(2), 10);
        assert!(!m.behind(SeqNo(1), 1), "a new view starts afresh");
    }

    #[test]
    fn a_request_waiting_past_the_bound_is_the_primarys_fault_unless_it_had_no_room() {
        let mut m = Monitor::default();
        m.view_installed(View(0), 0);
        assert_eq!(m.tick(10 * MS, Some(vec![req(1, 5)]), 40 * MS, 0, 0), None);
        assert_eq!(m.tick(40 * MS, Some(vec![req(1, 5)]), 40 * MS, 0, 0), None);
        // Ordered in time, and the client's next one waits from when it was first seen.
        assert_eq!(m.tick(60 * MS, Some(vec![req(1, 6)]), 40 * MS, 0, 0), None);
        assert_eq!(m.tick(90 * MS, Some(vec![req(1, 6)]), 40 * MS, 0, 0), None);
        assert_eq!(
            m.tick(101 * MS, Some(vec![req(1, 6)]), 40 * MS, 0, 0),
            Some(Suspicion::Slow)
        );
        // With no room (pipeline or window full) the wait starts again.
        m.tick(110 * MS, None, 40 * MS, 0, 0);
        assert_eq!(m.tick(140 * MS, Some(vec![req(1, 6)]), 40 * MS, 0, 0), None);
        // A starved client while others are ordered: its request keeps waiting.
        assert_eq!(m.tick(170 * MS, Some(vec![req(1, 6), req(2, 1)]), 40 * MS, 0, 0), None);
        assert_eq!(
            m.tick(200 * MS, Some(vec![req(1, 6), req(2, 2)]), 40 * MS, 0, 0),
            Some(Suspicion::Slow)
        );
        // Nothing is watched during a view change.
        m.view_changing();
        assert_eq!(m.tick(900 * MS, Some(vec![req(1, 6)]), 40 * MS, 0, 0), None);
    }

    /// Windows of 100 ms; a view delivering 1,000 requests per window is followed by one
    /// delivering 500 while requests wait: replaced after the grace period, not before.
    #[test]
    fn a_primary_below_the_recent_best_is_replaced_after_the_grace_period() {
        let window = 100 * MS;
        let mut m = Monitor::default();
        m.view_installed(View(0), 0);
        let mut now = 0;
        for _ in 0..10 {
            m.committed(1_000);
            now += window;
            assert_eq!(m.tick(now, Some(vec![]), 10 * window, 0, window), None);
        }
        assert_eq!(m.best_recent(), 10_000);
        m.view_changing();
        m.view_installed(View(1), now);
        let mut suspected_at = None;
        for w in 1..=10 {
            m.committed(500);
            now += window;
            if let Some(s) = m.tick(now, Some(vec![req(1, w)]), 10 * window, 0, window) {
                suspected_at = Some((w, s));
                break;
            }
        }
        assert_eq!(suspected_at, Some((GRACE_WINDOWS + 1, Suspicion::Throughput)));
    }

    /// A view at 95% of the best is kept while the requirement is below that and replaced when
    /// the rising requirement passes it; windows without waiting requests are never judged.
    #[test]
    fn the_requirement_rises_and_only_windows_with_waiting_requests_are_judged() {
        let window = 100 * MS;
        let mut m = Monitor::default();
        m.view_installed(View(0), 0);
        let mut now = window;
        m.committed(1_000);
        m.tick(now, Some(vec![]), 10 * window, 0, window);
        m.view_installed(View(1), now);
        for _ in 0..50 {
            m.committed(100);
            now += window;
            assert_eq!(
                m.tick(now, Some(vec![]), 10 * window, 0, window),
                None,
                "no demand, not judged"
            );
        }
        m.view_installed(View(2), now);
        let mut judged_windows = 0;
        loop {
            m.committed(950);
            now += window;
            let s = m.tick(now, Some(vec![req(1, judged_windows + 1)]), 10 * window, 0, window);
            if m.windows > GRACE_WINDOWS {
                judged_windows += 1;
            }
            if s.is_some() {
                assert_eq!(s, Some(Suspicion::Throughput));
                break;
            }
            assert!(judged_windows < 20, "never replaced");
        }
        // The k-th judged window (from 0) needs 90 + k percent: 95 is still met (k = 5), 96 is
        // not (k = 6, the seventh).
        assert_eq!(judged_windows, 7);
    }

    #[test]
    fn without_history_a_view_whose_requests_always_wait_is_replaced_once() {
        let window = 100 * MS;
        let mut m = Monitor::default();
        m.view_installed(View(0), 0);
        let mut now = 0;
        let mut result = None;
        for w in 1..=10 {
            now += window;
            result = m.tick(now, Some(vec![req(1, w)]), 10 * window, 0, window);
            if result.is_some() {
                assert_eq!(w, GRACE_WINDOWS + 1);
                break;
            }
        }
        assert_eq!(result, Some(Suspicion::Throughput));
    }
}

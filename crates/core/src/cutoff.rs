//! Cutting off a peer replica that keeps sending messages that prove it faulty (Aardvark's
//! answer to a replica flooding its peers).
//!
//! Every peer already gets its own bounded queue, served round-robin with the others (the
//! runtime's inbox, `upright-node`'s `transport::Inbox`), so a flood cannot take more than its
//! share of the event loop; but each flooded message still costs its decoding and its checks. A
//! peer whose messages the stages refuse as proof of a fault ([`crate::stage::Stats::reject`]: a seal that does not
//! verify, conflicting votes) at least [`REJECTS_MIN`] times within a [`WINDOW_US`] window, and
//! for at least a quarter of what it sent in it, is cut off: its messages are dropped unread for
//! [`CUT_FIRST_US`], doubling at each new cut up to [`CUT_MAX_US`]. A correct replica never sends
//! such a message, so it is never cut off; a cut-off faulty one counts as silent, which the
//! protocol tolerates.
//!
//! The runtime applies it to every peer replica's message (`upright-node`'s replica loop); the
//! simulator's throughput runs apply it the same way.

use std::collections::BTreeMap;

use crate::ids::ReplicaId;
use crate::stage::Time;

/// Length of the window in which a peer's refused messages are counted, microseconds.
pub const WINDOW_US: Time = 1_000_000;
/// Least refused messages in one window before a peer is cut off.
pub const REJECTS_MIN: u64 = 16;
/// The first cut-off, microseconds.
pub const CUT_FIRST_US: Time = 1_000_000;
/// The longest cut-off (ten minutes), microseconds.
pub const CUT_MAX_US: Time = 600_000_000;

#[derive(Debug, Default)]
struct Peer {
    window_start: Time,
    delivered: u64,
    rejected: u64,
    cut_until: Time,
    /// The next cut-off's length (0: none yet).
    next_cut: Time,
}

/// The cut-off state of a replica's peers.
#[derive(Debug, Default)]
pub struct CutOff {
    peers: BTreeMap<ReplicaId, Peer>,
}

impl CutOff {
    /// Whether `peer`'s messages are dropped unread at `now`.
    pub fn is_cut(&self, peer: ReplicaId, now: Time) -> bool {
        self.peers.get(&peer).is_some_and(|p| now < p.cut_until)
    }

    /// Records one message of `peer` handled at `now`, of which the stages refused `rejected`
    /// inputs as proof of a fault. Returns the length of the cut-off it starts, if it starts one.
    pub fn observe(&mut self, peer: ReplicaId, now: Time, rejected: u64) -> Option<Time> {
        let p = self.peers.entry(peer).or_default();
        if now >= p.window_start + WINDOW_US {
            p.window_start = now;
            p.delivered = 0;
            p.rejected = 0;
        }
        p.delivered += 1;
        p.rejected += rejected;
        if rejected == 0 || p.rejected < REJECTS_MIN || p.rejected * 4 < p.delivered {
            return None;
        }
        let cut = if p.next_cut == 0 { CUT_FIRST_US } else { p.next_cut };
        p.next_cut = (cut * 2).min(CUT_MAX_US);
        p.cut_until = now + cut;
        p.window_start = p.cut_until;
        p.delivered = 0;
        p.rejected = 0;
        Some(cut)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PEER: ReplicaId = ReplicaId(3);

    /// Feeds `n` messages of `PEER` from `start`, every `every` microseconds, each refused if
    /// `bad`; returns the cut-offs started.
    fn feed(c: &mut CutOff, start: Time, n: u64, every: Time, bad: bool) -> Vec<Time> {
        (0..n)
            .filter_map(|i| c.observe(PEER, start + i * every, u64::from(bad)))
            .collect()
    }

    #[test]
    fn a_flood_of_refused_messages_is_cut_off_for_growing_periods() {
        let mut c = CutOff::default();
        assert_eq!(feed(&mut c, 0, REJECTS_MIN - 1, 10, true), vec![]);
        assert!(!c.is_cut(PEER, 1_000));
        assert_eq!(feed(&mut c, 1_000, 1, 10, true), vec![CUT_FIRST_US]);
        assert!(c.is_cut(PEER, 1_000 + CUT_FIRST_US - 1));
        assert!(!c.is_cut(PEER, 1_000 + CUT_FIRST_US));
        assert!(!c.is_cut(ReplicaId(1), 2_000), "only the flooding peer");
        let after = 1_000 + CUT_FIRST_US;
        assert_eq!(feed(&mut c, after, REJECTS_MIN, 10, true), vec![2 * CUT_FIRST_US]);
        let mut now = after + 10 * REJECTS_MIN + 2 * CUT_FIRST_US;
        let mut last = 0;
        for _ in 0..20 {
            let cuts = feed(&mut c, now, REJECTS_MIN, 10, true);
            last = cuts[0];
            now += 10 * REJECTS_MIN + last;
        }
        assert_eq!(last, CUT_MAX_US);
    }

    #[test]
    fn good_messages_and_old_refusals_do_not_cut_a_peer_off() {
        let mut c = CutOff::default();
        // A few refusals among many good messages: under a quarter.
        for i in 0..1_000u64 {
            assert_eq!(c.observe(PEER, i * 100, u64::from(i % 8 == 0)), None);
        }
        // Refusals spread over many windows never reach the minimum in one.
        let mut c = CutOff::default();
        assert_eq!(feed(&mut c, 0, 100, WINDOW_US / 4, true), vec![]);
        assert!(!c.is_cut(PEER, 100 * WINDOW_US / 4));
    }
}

//! Pushed messages: what correct clients received against what correct execution members
//! emitted, per stream (a client's own, and under selective execution each object stream,
//! numbered on its own). Correct members must agree on every push (`(client, stream, seq)`
//! names one payload); each correct client must receive each stream's pushes in order, each
//! once, with the payload correct members emitted (never a forged one), skipping only across an
//! explicit gap; and a client must, by the end of the run, have received (or been told it
//! missed) every push emitted to it before the faults healed: in its own stream once it
//! received any (every copy of a client's first push can be lost for good only while it has no
//! reply saying it was sent), in an object stream always (the reply that set the watch
//! announced the stream).

use std::collections::BTreeMap;

use bytes::Bytes;
use upright_core::crypto::Digest;
use upright_core::ids::{ClientId, Principal};
use upright_core::stage::Time;

/// One thing a client was given.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Delivery {
    Push { seq: u64, digest: Digest },
    Gap { missed_from: u64, resume_at: u64 },
}

/// A client's stream: `None` for its own, `Some(object)` for an object stream.
type StreamKey = (ClientId, Option<Bytes>);

/// The pushes of one run.
#[derive(Default)]
pub struct Pushes {
    /// `(client, stream)` -> `seq` -> the payload's digest and when it was first emitted.
    emitted: BTreeMap<StreamKey, BTreeMap<u64, (Digest, Time)>>,
    delivered: BTreeMap<StreamKey, Vec<Delivery>>,
    violations: Vec<String>,
}

/// How a stream is named in a violation.
fn describe(stream: &Option<Bytes>) -> String {
    match stream {
        None => String::new(),
        Some(object) => format!(" in the stream of object {:?}", String::from_utf8_lossy(object)),
    }
}

impl Pushes {
    /// A correct execution member pushed `seq` of `stream` to `client`.
    pub fn emitted(
        &mut self,
        who: Principal,
        now: Time,
        client: ClientId,
        stream: Option<&Bytes>,
        seq: u64,
        digest: Digest,
    ) {
        let key = (client, stream.cloned());
        let first = *self.emitted.entry(key).or_default().entry(seq).or_insert((digest, now));
        if first.0 != digest {
            self.violations.push(format!(
                "pushes: correct members pushed different messages as push {seq}{} to client {} ({who:?})",
                describe(&stream.cloned()),
                client.0
            ));
        }
    }

    /// A correct client was given push `seq` of `stream`.
    pub fn delivered(&mut self, client: ClientId, stream: Option<&Bytes>, seq: u64, payload: &Bytes) {
        let digest = Digest::of(payload);
        self.delivered
            .entry((client, stream.cloned()))
            .or_default()
            .push(Delivery::Push { seq, digest });
    }

    /// A correct client was told pushes `missed_from .. resume_at` of `stream` will not come.
    pub fn gap(&mut self, client: ClientId, stream: Option<&Bytes>, missed_from: u64, resume_at: u64) {
        self.delivered
            .entry((client, stream.cloned()))
            .or_default()
            .push(Delivery::Gap { missed_from, resume_at });
    }

    /// Pushes delivered to correct clients.
    pub fn delivered_count(&self) -> u64 {
        let pushes = self.delivered.values().flatten();
        pushes.filter(|d| matches!(d, Delivery::Push { .. })).count() as u64
    }

    /// Pushes delivered to correct clients in object streams.
    pub fn delivered_in_streams(&self) -> u64 {
        let streams = self.delivered.iter().filter(|((_, s), _)| s.is_some());
        let pushes = streams.flat_map(|(_, d)| d);
        pushes.filter(|d| matches!(d, Delivery::Push { .. })).count() as u64
    }

    /// Gaps delivered to correct clients.
    pub fn gap_count(&self) -> u64 {
        let gaps = self.delivered.values().flatten();
        gaps.filter(|d| matches!(d, Delivery::Gap { .. })).count() as u64
    }

    /// Every violation, for the correct clients `clients`; `heal_at`: when the faults healed.
    pub fn check(&self, clients: &[u32], heal_at: Time) -> Vec<String> {
        let mut violations = self.violations.clone();
        let keys: std::collections::BTreeSet<&StreamKey> = self.emitted.keys().chain(self.delivered.keys()).collect();
        for key in keys {
            let (client, stream) = key;
            let c = client.0;
            if !clients.contains(&c) {
                continue;
            }
            let on = describe(stream);
            let emitted = self.emitted.get(key);
            let mut next = 1;
            for d in self.delivered.get(key).into_iter().flatten() {
                match *d {
                    Delivery::Push { seq, digest } => {
                        if seq != next {
                            violations.push(format!(
                                "pushes: client {c} was given push {seq}{on} when {next} was next"
                            ));
                        }
                        match emitted.and_then(|e| e.get(&seq)) {
                            Some((emitted, _)) if *emitted == digest => {}
                            Some(_) => violations.push(format!(
                                "pushes: client {c} was given a push {seq}{on} no correct member emitted (forged)"
                            )),
                            None => violations.push(format!(
                                "pushes: client {c} was given push {seq}{on} before any correct member emitted it"
                            )),
                        }
                        next = seq + 1;
                    }
                    Delivery::Gap { missed_from, resume_at } => {
                        if missed_from != next || resume_at <= missed_from {
                            violations.push(format!(
                                "pushes: client {c} was given a gap {missed_from}..{resume_at}{on} when {next} was next"
                            ));
                        }
                        next = resume_at;
                    }
                }
            }
            if stream.is_some() || self.delivered.contains_key(key) {
                let owed = emitted
                    .into_iter()
                    .flat_map(|e| e.range(next..))
                    .find(|(_, (_, at))| *at <= heal_at);
                if let Some((seq, (_, at))) = owed {
                    violations.push(format!(
                        "pushes: client {c} never received push {seq}{on}, emitted at {at} before the faults healed ({heal_at})"
                    ));
                }
            }
        }
        violations
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(s: &str) -> Bytes {
        Bytes::copy_from_slice(s.as_bytes())
    }

    fn run(deliveries: &[(u64, &str)], gaps: &[(u64, u64)]) -> Vec<String> {
        let mut p = Pushes::default();
        let exec = Principal::Exec(upright_core::ids::ReplicaId(0));
        for seq in 1..=4 {
            p.emitted(exec, 10, ClientId(0), None, seq, Digest::of(&b(&seq.to_string())));
        }
        for (seq, payload) in deliveries {
            p.delivered(ClientId(0), None, *seq, &b(payload));
        }
        for (from, to) in gaps {
            p.gap(ClientId(0), None, *from, *to);
        }
        p.check(&[0], 100)
    }

    #[test]
    fn in_order_once_and_complete_passes() {
        assert!(run(&[(1, "1"), (2, "2"), (3, "3"), (4, "4")], &[]).is_empty());
    }

    #[test]
    fn forged_duplicated_reordered_and_missing_pushes_are_caught() {
        assert!(run(&[(1, "1"), (2, "two"), (3, "3"), (4, "4")], &[])[0].contains("forged"));
        assert!(run(&[(1, "1"), (1, "1"), (2, "2"), (3, "3"), (4, "4")], &[])[0].contains("when 2 was next"));
        assert!(run(&[(2, "2"), (1, "1"), (3, "3"), (4, "4")], &[])[0].contains("when 1 was next"));
        assert!(run(&[(1, "1"), (2, "2")], &[])[0].contains("never received push 3"));
        let mut p = Pushes::default();
        let e = |i| Principal::Exec(upright_core::ids::ReplicaId(i));
        p.emitted(e(0), 1, ClientId(0), None, 1, Digest::of(b"a"));
        p.emitted(e(1), 2, ClientId(0), None, 1, Digest::of(b"b"));
        assert!(p.check(&[], 0)[0].contains("pushed different messages"));
    }

    #[test]
    fn an_explicit_gap_may_skip() {
        let mut p = Pushes::default();
        let exec = Principal::Exec(upright_core::ids::ReplicaId(0));
        for seq in 1..=4 {
            p.emitted(exec, 10, ClientId(0), None, seq, Digest::of(&b(&seq.to_string())));
        }
        p.gap(ClientId(0), None, 1, 3);
        p.delivered(ClientId(0), None, 3, &b("3"));
        p.delivered(ClientId(0), None, 4, &b("4"));
        assert!(p.check(&[0], 100).is_empty());
    }
}

//! Key refresh at a client (`crate::session`): the client refreshes the keys of the replicas'
//! messages to it every `knobs.key_refresh_us` (NEW-KEY to every replica process's key member:
//! its authentication member, or the execution member of an execution-only process),
//! retires the previous ones `knobs.key_overlap_us` later, and installs the replicas' NEW-KEYs.
//! A client keeps no storage: its epochs are its clock in microseconds, which a restart does not
//! take back (the runtime's clock is the wall clock).

use super::Client;
use crate::ids::Principal;
use crate::message::Envelope;
use crate::session::{self, NewKey};
use crate::stage::{Action, Time, Timer};

impl Client {
    /// At start: refresh at once if refresh is on, asking every replica for its NEW-KEY.
    pub(super) fn start_keys(&mut self, now: Time, out: &mut Vec<Action>) {
        if self.config.knobs.key_refresh_us > 0 {
            self.refresh_keys(now, true, out);
        }
    }

    /// The KeyRefresh timer: retire, refresh when due, arm for the next deadline.
    pub(super) fn key_timer(&mut self, now: Time, out: &mut Vec<Action>) {
        let (retired, refresh) = self.key_schedule.tick(&self.keys, now);
        if retired {
            self.stats.bump("keys_retired");
        }
        if refresh {
            self.refresh_keys(now, false, out);
        } else {
            self.arm_key_timer(out);
        }
    }

    fn arm_key_timer(&self, out: &mut Vec<Action>) {
        if let Some(at) = self.key_schedule.due() {
            out.push(Action::SetTimer {
                timer: Timer::KeyRefresh,
                at,
            });
        }
    }

    fn refresh_keys(&mut self, now: Time, hello: bool, out: &mut Vec<Action>) {
        let last = self.keys.epoch();
        let Some(key) = self.key_schedule.refresh(&self.keys, last, now, &self.config.knobs) else {
            return;
        };
        self.stats.bump("keys_refreshed");
        let to = self.quorums.key_members().collect();
        self.send_new_key(key, hello, to, out);
        self.arm_key_timer(out);
    }

    /// Our NEW-KEY again, asking every replica for its own (on a retransmission).
    pub(super) fn hello_again(&mut self, out: &mut Vec<Action>) {
        if let Some(ours) = self.keys.announcement() {
            let to = self.quorums.key_members().collect();
            self.stats.bump("new_key_hello_again");
            self.send_new_key(ours, true, to, out);
        }
    }

    fn send_new_key(&self, key: NewKey, hello: bool, to: Vec<Principal>, out: &mut Vec<Action>) {
        out.push(session::send_new_key(
            &self.keys,
            &self.quorums,
            Principal::Client(self.id),
            key,
            hello,
            to,
        ));
    }

    /// A replica's NEW-KEY (from any of its members): install it; answer a hello.
    pub(super) fn on_new_key(&mut self, envelope: &Envelope, out: &mut Vec<Action>) {
        let known = envelope
            .from
            .replica()
            .is_some_and(|r| (r.0 as usize) < self.config.replicas.len());
        let (stat, answer) = session::receive(&self.keys, envelope, known);
        self.stats.bump(stat);
        if let Some((ours, to)) = answer {
            self.send_new_key(ours, false, vec![to], out);
        }
    }
}

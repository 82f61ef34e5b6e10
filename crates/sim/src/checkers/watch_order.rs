//! Watch events before the data they announce (the core KV under selective execution, whose
//! clients hold a reply until the pushes before it of the streams its request announced have
//! come; docs/ODRC.md, "Per-object push streams"). An ordered `Get` of a key sets the client's
//! watch on it; if the client's next ordered `Get` of that key returns another value and the
//! client wrote nothing to the key in between, a write fired the watch before that `Get` ran,
//! so the client must have been given a push (or a gap) of the key's stream before the reply.

use std::collections::BTreeMap;

use bytes::Bytes;

/// What one client saw of one key since its last ordered `Get` of it.
#[derive(Default)]
struct Seen {
    /// The value that `Get` returned (`None`: no `Get` yet).
    value: Option<Option<Bytes>>,
    /// Pushes or gaps of the key's stream given to the client since.
    events: u64,
    /// Whether the client completed a write to the key since.
    wrote: bool,
}

/// The check over one run.
#[derive(Default)]
pub struct WatchOrder {
    seen: BTreeMap<(u32, Bytes), Seen>,
    violations: Vec<String>,
    /// Reads that found a new value after an event, as the rule asks (how often it was tested).
    pub checked: u64,
}

impl WatchOrder {
    /// Correct client `client` completed an ordered `Get` of `key` returning `value`.
    pub fn read(&mut self, client: u32, key: &Bytes, value: Option<Bytes>) {
        let seen = self.seen.entry((client, key.clone())).or_default();
        if let Some(before) = &seen.value {
            if *before != value && !seen.wrote {
                if seen.events == 0 {
                    self.violations.push(format!(
                        "watch order: client {client} read a new value of {:?} before the watch event of the write that made it",
                        String::from_utf8_lossy(key)
                    ));
                } else {
                    self.checked += 1;
                }
            }
        }
        *seen = Seen {
            value: Some(value),
            events: 0,
            wrote: false,
        };
    }

    /// Correct client `client` completed a write to `key`.
    pub fn wrote(&mut self, client: u32, key: &Bytes) {
        self.seen.entry((client, key.clone())).or_default().wrote = true;
    }

    /// Correct client `client` was given a push or a gap of `key`'s stream.
    pub fn event(&mut self, client: u32, key: &Bytes) {
        self.seen.entry((client, key.clone())).or_default().events += 1;
    }

    /// The violations found.
    pub fn violations(&self) -> Vec<String> {
        self.violations.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(s: &str) -> Bytes {
        Bytes::copy_from_slice(s.as_bytes())
    }

    #[test]
    fn a_new_value_needs_an_event_unless_the_client_wrote_it() {
        let mut w = WatchOrder::default();
        w.read(0, &b("k"), None);
        w.read(0, &b("k"), Some(b("1")));
        assert_eq!(w.violations().len(), 1, "new value, no event");
        w.event(0, &b("k"));
        w.read(0, &b("k"), Some(b("2")));
        assert_eq!(w.violations().len(), 1, "the event came first");
        assert_eq!(w.checked, 1);
        w.wrote(0, &b("k"));
        w.read(0, &b("k"), Some(b("3")));
        w.read(0, &b("k"), Some(b("3")));
        w.read(1, &b("k"), Some(b("3")));
        assert_eq!(w.violations().len(), 1, "own write, same value, first read");
    }
}

//! Bodies of requests ordered by digest (`RequestBody::Digest`), fetched from the authentication
//! stage with FETCH and answered with COMMAND (PROTOCOL.md, normal case step 5). The first COMMAND
//! whose operation hashes to the ordered digest is kept.

use std::collections::BTreeMap;

use bytes::Bytes;

use crate::crypto::Digest;
use crate::ids::{ClientId, RequestId, SeqNo};

pub use crate::limits::FETCHES_OUTSTANDING_MAX;

/// Key of a wanted body: the request and the digest its operation must hash to.
pub(crate) type FetchKey = (ClientId, RequestId, Digest);

#[derive(Clone, Debug)]
struct Wanted {
    seqno: SeqNo,
    body: Option<Bytes>,
}

/// Outcome of registering a wanted body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Want {
    /// Newly registered: send a FETCH.
    Registered,
    /// Already wanted or held.
    Known,
    /// The table is full; try again after progress.
    Full,
}

/// The table of wanted and received bodies.
#[derive(Default)]
pub(crate) struct Fetcher {
    wanted: BTreeMap<FetchKey, Wanted>,
}

impl Fetcher {
    /// Registers a body needed by batch `seqno`. `next` says the batch is the next to execute,
    /// which bypasses the bound (see [`FETCHES_OUTSTANDING_MAX`]).
    pub fn want(&mut self, seqno: SeqNo, key: FetchKey, next: bool) -> Want {
        if self.wanted.contains_key(&key) {
            return Want::Known;
        }
        if !next && self.wanted.len() >= FETCHES_OUTSTANDING_MAX {
            return Want::Full;
        }
        self.wanted.insert(key, Wanted { seqno, body: None });
        Want::Registered
    }

    /// A COMMAND arrived. Returns the stats reason when it is dropped.
    pub fn deliver(&mut self, client: ClientId, request_id: RequestId, operation: &Bytes) -> Result<(), &'static str> {
        let key = (client, request_id, Digest::of(operation));
        match self.wanted.get_mut(&key) {
            Some(wanted) if wanted.body.is_none() => {
                wanted.body = Some(operation.clone());
                Ok(())
            }
            Some(_) => Err("command_duplicate"),
            None => {
                let low = (client, request_id, Digest([0; 32]));
                let high = (client, request_id, Digest([0xff; 32]));
                if self.wanted.range(low..=high).next().is_some() {
                    Err("command_wrong_digest")
                } else {
                    Err("command_unexpected")
                }
            }
        }
    }

    /// The fetched body, if it arrived.
    pub fn body(&self, key: &FetchKey) -> Option<&Bytes> {
        self.wanted.get(key).and_then(|w| w.body.as_ref())
    }

    /// Bodies still missing, in key order.
    pub fn missing(&self) -> impl Iterator<Item = &FetchKey> {
        self.wanted.iter().filter(|(_, w)| w.body.is_none()).map(|(k, _)| k)
    }

    /// Forgets everything wanted by batches at or below `seqno`.
    pub fn prune_through(&mut self, seqno: SeqNo) {
        self.wanted.retain(|_, w| w.seqno > seqno);
    }

    /// Number of table entries.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.wanted.len()
    }
}

//! Client histories: every operation a correct client invoked, with invocation and response times
//! (virtual) and the result it received.

use bytes::Bytes;
use upright_core::kv::{KvOperation, KvReply};
use upright_core::stage::Time;

/// One operation of a correct client.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Operation {
    /// The client.
    pub client: u32,
    /// What it asked.
    pub op: KvOperation,
    /// When it was invoked.
    pub invoke: Time,
    /// When the result was delivered, and the raw result; `None` if it never was.
    pub response: Option<(Time, Bytes)>,
    /// Whether this is one of the final reads after the quiet phase.
    pub final_read: bool,
    /// A serializable read (`r + 1` matching answers): not linearizable, so the linearizability
    /// checker leaves it out and the serializable checker looks at it.
    pub serializable: bool,
}

impl Operation {
    /// The key it touches.
    pub fn key(&self) -> &Bytes {
        self.op.key()
    }

    /// Whether it writes.
    pub fn is_write(&self) -> bool {
        !matches!(self.op, KvOperation::Get { .. })
    }

    /// The decoded reply, if it completed and decodes.
    pub fn reply(&self) -> Option<KvReply> {
        self.response.as_ref().and_then(|(_, bytes)| KvReply::decode(bytes))
    }
}

/// A short human description, for violation messages.
pub fn describe(op: &Operation) -> String {
    let text = |b: &Bytes| String::from_utf8_lossy(b).into_owned();
    let what = match &op.op {
        KvOperation::Get { key } => format!("get({})", text(key)),
        KvOperation::Put { key, value } => format!("put({}, {})", text(key), text(value)),
        KvOperation::Append { key, value } => format!("append({}, {})", text(key), text(value)),
        KvOperation::Delete { key } => format!("delete({})", text(key)),
        KvOperation::Burn { key, micros } => format!("burn({}, {micros} us)", text(key)),
    };
    let result = match (&op.response, op.reply()) {
        (None, _) => "pending".to_string(),
        (Some((t, _)), Some(KvReply::Value(Some(v)))) => format!("-> {} @{t}", text(&v)),
        (Some((t, _)), Some(reply)) => format!("-> {reply:?} @{t}"),
        (Some((t, _)), None) => format!("-> undecodable @{t}"),
    };
    format!("client {} {what} @{} {result}", op.client, op.invoke)
}

//! ONC RPC version 2 (RFC 5531) as an NFS server sees it: record marking on TCP, call headers
//! with AUTH_NONE or AUTH_SYS credentials, and reply headers.

use bytes::Bytes;

use crate::xdr::{Reader, Writer, XdrError};

/// `msg_type` of a call.
pub const CALL: u32 = 0;
/// `msg_type` of a reply.
pub const REPLY: u32 = 1;
/// The RPC protocol version this speaks.
pub const RPC_VERSION: u32 = 2;
/// Credential and verifier flavors.
pub const AUTH_NONE: u32 = 0;
pub const AUTH_SYS: u32 = 1;
/// Largest credential or verifier body (RFC 5531: 400 bytes).
pub const AUTH_BODY_MAX: usize = 400;
/// Largest AUTH_SYS machine name (RFC 5531: 255 bytes).
pub const MACHINE_NAME_MAX: usize = 255;
/// Most supplementary groups in an AUTH_SYS credential (RFC 5531: 16).
pub const GIDS_MAX: usize = 16;
/// Largest RPC record this server accepts: a 1 MiB WRITE plus its headers.
pub const RECORD_BYTES_MAX: usize = (1 << 20) + 4096;
/// The last-fragment bit of a record-marking header.
pub const LAST_FRAGMENT: u32 = 0x8000_0000;

/// Who makes a call, as the server checks permissions: AUTH_SYS's uid and groups, or nobody
/// (AUTH_NONE, mapped to the anonymous uid and gid).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Credential {
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups (at most [`GIDS_MAX`]).
    pub gids: Vec<u32>,
}

/// The uid and gid AUTH_NONE calls act as (the customary `nobody`).
pub const ANONYMOUS_ID: u32 = 65534;

impl Credential {
    /// The caller of an AUTH_NONE call.
    pub fn anonymous() -> Credential {
        Credential {
            uid: ANONYMOUS_ID,
            gid: ANONYMOUS_ID,
            gids: Vec::new(),
        }
    }

    /// Whether the caller is in group `gid`.
    pub fn in_group(&self, gid: u32) -> bool {
        self.gid == gid || self.gids.contains(&gid)
    }

    pub fn encode(&self, w: &mut Writer) {
        w.u32(self.uid).u32(self.gid).u32(self.gids.len() as u32);
        for g in &self.gids {
            w.u32(*g);
        }
    }

    pub fn decode(r: &mut Reader<'_>) -> Result<Credential, XdrError> {
        let (uid, gid) = (r.u32()?, r.u32()?);
        let n = r.u32()? as usize;
        if n > GIDS_MAX {
            return Err(XdrError::TooLong(n, GIDS_MAX));
        }
        let gids = (0..n).map(|_| r.u32()).collect::<Result<_, _>>()?;
        Ok(Credential { uid, gid, gids })
    }
}

/// The header of an RPC call; its arguments follow it in the record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Call {
    pub xid: u32,
    pub program: u32,
    pub version: u32,
    pub procedure: u32,
    pub credential: Credential,
}

/// A record that is not an acceptable call, and how to answer it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CallError {
    /// Not even a call header: nothing to answer (the connection is closed).
    Garbage,
    /// A reply, not a call (a server ignores it).
    NotACall,
    /// RPC version other than 2: MSG_DENIED / RPC_MISMATCH.
    RpcMismatch { xid: u32 },
    /// A credential this server does not accept: MSG_DENIED / AUTH_ERROR with this `auth_stat`.
    Auth { xid: u32, stat: u32 },
}

/// `auth_stat` values.
pub const AUTH_BADCRED: u32 = 1;
pub const AUTH_TOOWEAK: u32 = 5;

/// Decodes a call header from the start of `record`; returns it and the arguments' bytes.
pub fn decode_call(record: &[u8]) -> Result<(Call, &[u8]), CallError> {
    let mut r = Reader::new(record);
    let xid = r.u32().map_err(|_| CallError::Garbage)?;
    match r.u32().map_err(|_| CallError::Garbage)? {
        CALL => {}
        REPLY => return Err(CallError::NotACall),
        _ => return Err(CallError::Garbage),
    }
    let header = (|| -> Result<_, XdrError> {
        let rpcvers = r.u32()?;
        let (program, version, procedure) = (r.u32()?, r.u32()?, r.u32()?);
        let flavor = r.u32()?;
        let body = r.opaque(AUTH_BODY_MAX)?;
        let (_verf_flavor, _verf) = (r.u32()?, r.opaque(AUTH_BODY_MAX)?);
        Ok((rpcvers, program, version, procedure, flavor, body))
    })();
    let (rpcvers, program, version, procedure, flavor, body) = header.map_err(|_| CallError::Garbage)?;
    if rpcvers != RPC_VERSION {
        return Err(CallError::RpcMismatch { xid });
    }
    let credential = match flavor {
        AUTH_NONE => Credential::anonymous(),
        AUTH_SYS => decode_auth_sys(body).map_err(|_| CallError::Auth {
            xid,
            stat: AUTH_BADCRED,
        })?,
        _ => {
            return Err(CallError::Auth {
                xid,
                stat: AUTH_TOOWEAK,
            })
        }
    };
    let call = Call {
        xid,
        program,
        version,
        procedure,
        credential,
    };
    Ok((call, r.rest()))
}

/// An AUTH_SYS credential body: stamp, machine name, uid, gid, groups.
fn decode_auth_sys(body: &[u8]) -> Result<Credential, XdrError> {
    let mut r = Reader::new(body);
    let _stamp = r.u32()?;
    let _machine = r.opaque(MACHINE_NAME_MAX)?;
    let credential = Credential::decode(&mut r)?;
    if r.remaining() != 0 {
        return Err(XdrError::BadValue(r.remaining() as u32));
    }
    Ok(credential)
}

/// `accept_stat` of an accepted call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Accepted {
    /// The results follow.
    Success,
    ProgUnavail,
    /// The versions of the program this server has.
    ProgMismatch {
        low: u32,
        high: u32,
    },
    ProcUnavail,
    GarbageArgs,
    SystemErr,
}

/// A reply header for an accepted call (AUTH_NONE verifier); the caller appends the results
/// after a `Success` header.
pub fn accepted_reply(xid: u32, stat: Accepted) -> Writer {
    let mut w = Writer::with_capacity(128);
    w.u32(xid).u32(REPLY).u32(0).u32(AUTH_NONE).opaque(&[]);
    match stat {
        Accepted::Success => w.u32(0),
        Accepted::ProgUnavail => w.u32(1),
        Accepted::ProgMismatch { low, high } => w.u32(2).u32(low).u32(high),
        Accepted::ProcUnavail => w.u32(3),
        Accepted::GarbageArgs => w.u32(4),
        Accepted::SystemErr => w.u32(5),
    };
    w
}

/// The reply to a call refused by [`decode_call`], if it gets one.
pub fn denied_reply(error: CallError) -> Option<Bytes> {
    let mut w = Writer::with_capacity(32);
    match error {
        CallError::Garbage | CallError::NotACall => return None,
        CallError::RpcMismatch { xid } => w.u32(xid).u32(REPLY).u32(1).u32(0).u32(RPC_VERSION).u32(RPC_VERSION),
        CallError::Auth { xid, stat } => w.u32(xid).u32(REPLY).u32(1).u32(1).u32(stat),
    };
    Some(w.finish())
}

/// Frames `record` for TCP: one last fragment.
pub fn frame(record: &[u8]) -> Bytes {
    let mut w = Writer::with_capacity(record.len() + 4);
    let len = u32::try_from(record.len()).expect("a record is shorter than 2 GiB");
    assert!(len < LAST_FRAGMENT, "a record fits one fragment");
    w.u32(LAST_FRAGMENT | len).raw(record);
    w.finish()
}

/// Reassembles records from record-marking fragments.
#[derive(Debug, Default)]
pub struct Records {
    partial: Vec<u8>,
}

/// A record above [`RECORD_BYTES_MAX`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("an RPC record of more than {RECORD_BYTES_MAX} bytes")]
pub struct RecordTooLong;

impl Records {
    /// Adds one fragment (`header` is its record-marking word); returns the record when this
    /// fragment was its last.
    pub fn fragment(&mut self, header: u32, data: &[u8]) -> Result<Option<Vec<u8>>, RecordTooLong> {
        if self.partial.len() + data.len() > RECORD_BYTES_MAX {
            self.partial.clear();
            return Err(RecordTooLong);
        }
        self.partial.extend_from_slice(data);
        if header & LAST_FRAGMENT != 0 {
            Ok(Some(std::mem::take(&mut self.partial)))
        } else {
            Ok(None)
        }
    }

    /// The length of the fragment a header announces, if it is acceptable.
    pub fn fragment_len(&self, header: u32) -> Result<usize, RecordTooLong> {
        let len = (header & !LAST_FRAGMENT) as usize;
        if self.partial.len() + len > RECORD_BYTES_MAX {
            return Err(RecordTooLong);
        }
        Ok(len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(flavor: u32, body: &[u8], rpcvers: u32) -> Bytes {
        let mut w = Writer::new();
        w.u32(0x1234).u32(CALL).u32(rpcvers).u32(100003).u32(3).u32(1);
        w.u32(flavor).opaque(body).u32(AUTH_NONE).opaque(&[]);
        w.u32(0xabcd);
        w.finish()
    }

    fn auth_sys(uid: u32, gid: u32, gids: &[u32]) -> Bytes {
        let mut w = Writer::new();
        w.u32(7).string("host");
        Credential {
            uid,
            gid,
            gids: gids.to_vec(),
        }
        .encode(&mut w);
        w.finish()
    }

    #[test]
    fn an_auth_sys_call_decodes_with_its_credential_and_arguments() {
        let record = call(AUTH_SYS, &auth_sys(1000, 100, &[4, 27]), 2);
        let (header, args) = decode_call(&record).unwrap();
        assert_eq!(header.xid, 0x1234);
        assert_eq!((header.program, header.version, header.procedure), (100003, 3, 1));
        assert_eq!(header.credential.uid, 1000);
        assert!(header.credential.in_group(27) && header.credential.in_group(100) && !header.credential.in_group(5));
        assert_eq!(args, &[0, 0, 0xab, 0xcd]);
        let (none, _) = decode_call(&call(AUTH_NONE, &[], 2)).unwrap();
        assert_eq!(none.credential, Credential::anonymous());
    }

    #[test]
    fn unacceptable_calls_get_the_rfc_5531_refusals() {
        assert_eq!(
            decode_call(&call(AUTH_SYS, &auth_sys(0, 0, &[]), 3)),
            Err(CallError::RpcMismatch { xid: 0x1234 })
        );
        assert_eq!(
            decode_call(&call(6, &[], 2)),
            Err(CallError::Auth {
                xid: 0x1234,
                stat: AUTH_TOOWEAK
            })
        );
        let too_many_groups = auth_sys(0, 0, &[1; 17]);
        assert_eq!(
            decode_call(&call(AUTH_SYS, &too_many_groups, 2)),
            Err(CallError::Auth {
                xid: 0x1234,
                stat: AUTH_BADCRED
            })
        );
        assert_eq!(decode_call(&[0, 0, 0, 1]), Err(CallError::Garbage));
        let denied = denied_reply(CallError::RpcMismatch { xid: 9 }).unwrap();
        assert_eq!(
            &denied[..],
            &[0, 0, 0, 9, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 2]
        );
        assert!(denied_reply(CallError::Garbage).is_none());
        let mismatch = accepted_reply(9, Accepted::ProgMismatch { low: 3, high: 3 }).finish();
        assert_eq!(
            &mismatch[..],
            &[0, 0, 0, 9, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0, 3]
        );
    }

    #[test]
    fn records_are_reassembled_from_fragments_within_the_bound() {
        let mut records = Records::default();
        assert_eq!(records.fragment(3, b"abc"), Ok(None));
        assert_eq!(records.fragment(LAST_FRAGMENT | 2, b"de"), Ok(Some(b"abcde".to_vec())));
        assert_eq!(records.fragment_len(LAST_FRAGMENT | 5), Ok(5));
        assert_eq!(records.fragment_len(RECORD_BYTES_MAX as u32 + 1), Err(RecordTooLong));
        let framed = frame(b"xyz");
        assert_eq!(&framed[..4], &(LAST_FRAGMENT | 3).to_be_bytes());
    }
}

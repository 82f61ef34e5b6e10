//! The replicated service: an operation is a batch of NFS calls (as the gateway's pool packs
//! them, [`encode_calls`]), each run in order by [`procedures::execute`]; the result is their
//! replies in the same order. All of the state is in pages, so a checkpoint carries only the
//! changed pages and a replica that fell behind fetches only those.

use bytes::Bytes;
use upright_core::pages::Pages;
use upright_core::service::{BatchContext, Effects, RestoreError, Service, ServiceRequest};

use crate::fs::FileSystem;
use crate::procedures::{self, Reply};
use crate::xdr::{Reader, Writer, XdrError};

/// Most NFS calls in one operation.
pub const CALLS_PER_OPERATION_MAX: usize = 256;
/// Most bytes of calls in one operation: under the cluster's default `request_bytes_max` (1 MiB)
/// with room for the encoding (a 64 KiB WRITE always fits alone).
pub const OPERATION_CALL_BYTES_MAX: usize = 768 * 1024;
/// Largest encoded call (a WRITE of `IO_BYTES_MAX` with its handle, credential and headers).
pub const CALL_BYTES_MAX: usize = procedures::IO_BYTES_MAX as usize + 4096;

/// One operation carrying `calls` (each from [`procedures::operation`]).
pub fn encode_calls(calls: &[Bytes]) -> Bytes {
    let mut w = Writer::with_capacity(calls.iter().map(|c| c.len() + 8).sum::<usize>() + 4);
    w.u32(calls.len() as u32);
    for c in calls {
        w.opaque(c);
    }
    w.finish()
}

/// The calls of an operation, or why it does not decode.
pub fn decode_calls(op: &[u8]) -> Result<Vec<&[u8]>, XdrError> {
    let mut r = Reader::new(op);
    let n = r.u32()? as usize;
    if n > CALLS_PER_OPERATION_MAX {
        return Err(XdrError::TooLong(n, CALLS_PER_OPERATION_MAX));
    }
    let calls = (0..n)
        .map(|_| r.opaque(CALL_BYTES_MAX))
        .collect::<Result<Vec<_>, _>>()?;
    if r.remaining() != 0 {
        return Err(XdrError::BadValue(r.remaining() as u32));
    }
    Ok(calls)
}

/// The result of an operation: each call's [`Reply`], in order.
pub fn encode_replies(replies: &[Reply]) -> Bytes {
    let mut w = Writer::with_capacity(64 * replies.len() + 4);
    w.u32(replies.len() as u32);
    for reply in replies {
        w.opaque(&reply.encode());
    }
    w.finish()
}

/// The replies in an operation's result.
pub fn decode_replies(result: &[u8]) -> Result<Vec<Reply>, XdrError> {
    let mut r = Reader::new(result);
    let n = r.u32()? as usize;
    if n > CALLS_PER_OPERATION_MAX {
        return Err(XdrError::TooLong(n, CALLS_PER_OPERATION_MAX));
    }
    (0..n).map(|_| Reply::decode(r.opaque(CALL_BYTES_MAX)?)).collect()
}

/// BFS's state machine.
#[derive(Default)]
pub struct FsService {
    fs: FileSystem,
}

impl FsService {
    pub fn new() -> FsService {
        FsService::default()
    }

    /// The file system (for the gateway's MOUNT answer and for tests).
    pub fn file_system(&self) -> &FileSystem {
        &self.fs
    }
}

/// The reply to an operation that does not decode: an empty list (the gateway fails its calls).
fn undecodable() -> Bytes {
    encode_replies(&[])
}

impl Service for FsService {
    fn execute(&mut self, context: &BatchContext, requests: &[ServiceRequest], _effects: &mut Effects) -> Vec<Bytes> {
        requests
            .iter()
            .map(|request| match decode_calls(&request.operation) {
                Ok(calls) => {
                    let replies: Vec<Reply> = calls
                        .into_iter()
                        .map(|call| procedures::execute(&mut self.fs, context.time_us, call))
                        .collect();
                    encode_replies(&replies)
                }
                Err(_) => undecodable(),
            })
            .collect()
    }

    fn execute_read_only(&self, operation: &[u8]) -> Option<Bytes> {
        let Ok(calls) = decode_calls(operation) else {
            return Some(undecodable());
        };
        let replies = calls
            .into_iter()
            .map(|call| procedures::execute_read_only(&self.fs, call))
            .collect::<Option<Vec<Reply>>>()?;
        Some(encode_replies(&replies))
    }

    /// Everything is in pages.
    fn checkpoint(&self) -> Bytes {
        Bytes::new()
    }

    fn restore(&mut self, checkpoint: &[u8]) -> Result<(), RestoreError> {
        if !checkpoint.is_empty() {
            return Err(RestoreError(format!(
                "a file-system checkpoint carries nothing outside its pages, not {} bytes",
                checkpoint.len()
            )));
        }
        // The pages are in place: check that they hold a file system.
        let pages = std::mem::replace(self.fs.pages_mut(), Pages::new());
        match FileSystem::from_pages(pages) {
            Ok(fs) => {
                self.fs = fs;
                Ok(())
            }
            Err(status) => Err(RestoreError(format!("the pages hold no file system ({status:?})"))),
        }
    }

    fn pages(&self) -> Option<&Pages> {
        Some(self.fs.pages())
    }

    fn pages_mut(&mut self) -> Option<&mut Pages> {
        Some(self.fs.pages_mut())
    }
}

/// Testing only: a Byzantine stand-in that runs the file system correctly but lies in every
/// reply (the last byte of each call's result flipped: a READ's data, an attribute, a handle),
/// with replies of the right length, so only the replies' votes can catch it.
#[derive(Default)]
pub struct Corrupting(FsService);

fn corrupt_replies(result: Bytes) -> Bytes {
    let Ok(replies) = decode_replies(&result) else {
        return result;
    };
    let lies: Vec<Reply> = replies
        .into_iter()
        .map(|reply| match reply {
            Reply::Result(bytes) if !bytes.is_empty() => {
                let mut bytes = bytes.to_vec();
                let last = bytes.len() - 1;
                bytes[last] ^= 0x20;
                Reply::Result(Bytes::from(bytes))
            }
            other => other,
        })
        .collect();
    encode_replies(&lies)
}

impl Service for Corrupting {
    fn execute(&mut self, context: &BatchContext, requests: &[ServiceRequest], effects: &mut Effects) -> Vec<Bytes> {
        self.0
            .execute(context, requests, effects)
            .into_iter()
            .map(corrupt_replies)
            .collect()
    }

    fn execute_read_only(&self, operation: &[u8]) -> Option<Bytes> {
        self.0.execute_read_only(operation).map(corrupt_replies)
    }

    fn checkpoint(&self) -> Bytes {
        self.0.checkpoint()
    }

    fn restore(&mut self, checkpoint: &[u8]) -> Result<(), RestoreError> {
        self.0.restore(checkpoint)
    }

    fn pages(&self) -> Option<&Pages> {
        self.0.pages()
    }

    fn pages_mut(&mut self) -> Option<&mut Pages> {
        self.0.pages_mut()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nfs3::proc3;
    use crate::rpc::Credential;
    use upright_core::ids::SeqNo;

    fn context(time_us: u64) -> BatchContext {
        BatchContext {
            index: 0,
            seqno: SeqNo(1),
            time_us,
            seed: [0; 32],
        }
    }

    fn request(operation: Bytes) -> ServiceRequest {
        ServiceRequest {
            client: upright_core::ids::ClientId(0),
            request_id: upright_core::ids::RequestId(1),
            operation,
        }
    }

    #[test]
    fn an_operation_runs_its_calls_in_order_and_reads_take_the_read_only_path() {
        let mut service = FsService::new();
        let root = procedures::root_handle(service.file_system()).unwrap();
        let cred = Credential {
            uid: 7,
            gid: 7,
            gids: vec![],
        };
        let mut mkdir = Writer::new();
        mkdir.opaque(&root).string("d");
        crate::nfs3::SetAttributes::default().encode(&mut mkdir);
        let mut lookup = Writer::new();
        lookup.opaque(&root).string("d");
        let lookup = procedures::operation(proc3::LOOKUP, &cred, &lookup.finish());
        // The LOOKUP after the MKDIR in one operation sees the directory.
        let op = encode_calls(&[
            procedures::operation(proc3::MKDIR, &cred, &mkdir.finish()),
            lookup.clone(),
        ]);
        let results = service.execute(&context(1), &[request(op.clone())], &mut Effects::default());
        let replies = decode_replies(&results[0]).unwrap();
        assert_eq!(replies.len(), 2);
        for reply in &replies {
            let Reply::Result(r) = reply else { panic!("{reply:?}") };
            assert_eq!(&r[..4], &[0, 0, 0, 0], "NFS3_OK");
        }
        // A write is not answered on the read-only path; a read is, as the ordered path does.
        assert!(service.execute_read_only(&op).is_none());
        let read = encode_calls(&[lookup]);
        let quick = service.execute_read_only(&read).unwrap();
        let ordered = service.execute(&context(2), &[request(read)], &mut Effects::default());
        assert_eq!(quick, ordered[0]);
        // Garbage gets an empty reply list, never a panic.
        let garbage = service.execute(
            &context(3),
            &[request(Bytes::from_static(b"\0\0\0\x05junk"))],
            &mut Effects::default(),
        );
        assert_eq!(decode_replies(&garbage[0]).unwrap(), vec![]);
    }

    #[test]
    fn restore_takes_pages_that_hold_a_file_system_and_refuses_others() {
        let mut service = FsService::new();
        assert!(service.checkpoint().is_empty());
        assert!(service.restore(&[]).is_ok());
        assert!(service.restore(b"x").is_err());
        *service.pages_mut().unwrap() = Pages::from_pages(vec![Bytes::from_static(b"junk")]);
        assert!(service.restore(&[]).is_err());
    }
}

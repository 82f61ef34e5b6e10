//! BFS executing what NFS clients sent: the bytes are calls (a length byte, a procedure byte, a
//! caller byte, a handle byte, the arguments), in batches with agreed time moving on. Unless the
//! procedure byte's high bit is set, the arguments start with a handle the file system gave out
//! earlier (the root's, or one a CREATE, MKDIR, SYMLINK, MKNOD or LOOKUP returned), so the calls
//! reach the procedures rather than stop at NFS3ERR_BADHANDLE. Two replicas must agree on every
//! reply and every page, a read-only call must answer as the ordered one, and the pages must
//! restore to a file system.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use upright_core::ids::{ClientId, RequestId, SeqNo};
use upright_core::pages::Pages;
use upright_core::service::{BatchContext, Service, ServiceRequest};
use upright_fs::nfs3::proc3;
use upright_fs::procedures::{self, Reply};
use upright_fs::rpc::Credential;
use upright_fs::service::{decode_replies, encode_calls, FsService};
use upright_fs::xdr::{Reader, Writer};
use upright_fuzz::execute_on_both;

const BATCH: usize = 4;

/// A handle from a successful reply of a procedure that returns one.
fn handle_of(procedure: u32, reply: &Reply) -> Option<Vec<u8>> {
    let Reply::Result(result) = reply else { return None };
    let mut r = Reader::new(result);
    if r.u32().ok()? != 0 {
        return None;
    }
    match procedure {
        proc3::LOOKUP => Some(r.opaque(64).ok()?.to_vec()),
        proc3::CREATE | proc3::MKDIR | proc3::SYMLINK | proc3::MKNOD => {
            r.bool().ok()?.then_some(())?;
            Some(r.opaque(64).ok()?.to_vec())
        }
        _ => None,
    }
}

fuzz_target!(|data: &[u8]| {
    let (mut a, mut b) = (FsService::new(), FsService::new());
    let mut handles = vec![procedures::root_handle(a.file_system()).expect("a root").to_vec()];
    let mut rest = data;
    let mut calls: Vec<(u32, Bytes)> = Vec::new();
    let mut n = 1u64;
    let mut request_id = 0u64;
    let mut run =
        |a: &mut FsService, b: &mut FsService, n: u64, calls: Vec<(u32, Bytes)>, handles: &mut Vec<Vec<u8>>| {
            let context = BatchContext {
                index: 0,
                seqno: SeqNo(n),
                time_us: 1_000_000 * n,
                seed: [n as u8; 32],
            };
            request_id += 1;
            let procs: Vec<u32> = calls.iter().map(|(p, _)| *p).collect();
            let op = encode_calls(&calls.into_iter().map(|(_, c)| c).collect::<Vec<_>>());
            // The read-only path answers as the ordered one would (it changes nothing either way).
            let quick = a.execute_read_only(&op);
            let request = ServiceRequest {
                client: ClientId(0),
                request_id: RequestId(request_id),
                operation: op,
            };
            let replies = execute_on_both(a, b, &context, &[request]);
            if let Some(quick) = quick {
                assert_eq!(quick, replies[0], "read-only answers as ordered");
            }
            let replies = decode_replies(&replies[0]).expect("replies decode");
            assert_eq!(replies.len(), procs.len(), "one reply per call");
            for (p, reply) in procs.iter().zip(&replies) {
                if let Some(h) = handle_of(*p, reply) {
                    if handles.len() < 64 {
                        handles.push(h);
                    }
                }
            }
        };
    while let Some((&len, tail)) = rest.split_first() {
        let len = (len as usize).min(tail.len());
        let (call, tail) = tail.split_at(len);
        rest = tail;
        let [code, who, which, args @ ..] = call else { continue };
        let procedure = match code & 0x7f {
            c if u32::from(c) < proc3::COUNT => u32::from(c),
            c if c % 2 == 0 => procedures::MOUNT_RESOLVE,
            c => u32::from(c),
        };
        let uid = [0, 1000, 1001, 65534][*who as usize % 4];
        let credential = Credential {
            uid,
            gid: uid,
            gids: vec![],
        };
        let mut w = Writer::new();
        if code & 0x80 == 0 {
            w.opaque(&handles[*which as usize % handles.len()]);
        }
        w.raw(args);
        calls.push((procedure, procedures::operation(procedure, &credential, &w.finish())));
        if calls.len() == BATCH {
            run(&mut a, &mut b, n, std::mem::take(&mut calls), &mut handles);
            n += 1;
        }
    }
    if !calls.is_empty() {
        run(&mut a, &mut b, n, calls, &mut handles);
    }
    // Both replicas hold the same pages, and they restore to a file system.
    let (pa, pb) = (a.pages().expect("paged"), b.pages().expect("paged"));
    assert_eq!(pa.len(), pb.len());
    let copy: Vec<Bytes> = (0..pa.len()).map(|i| pa.get(i).expect("a page")).collect();
    for (i, page) in copy.iter().enumerate() {
        assert_eq!(Some(page.clone()), pb.get(i as u64), "page {i}");
        assert!(page.len() <= upright_core::limits::PAGE_BYTES_MAX, "page {i} too large");
    }
    let mut restored = FsService::new();
    *restored.pages_mut().expect("paged") = Pages::from_pages(copy);
    restored.restore(&a.checkpoint()).expect("the pages hold a file system");
});

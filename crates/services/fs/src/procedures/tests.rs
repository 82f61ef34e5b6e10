use super::*;
use crate::nfs3::Attributes;

const ALICE: u32 = 1000;
const BOB: u32 = 1001;

fn cred(uid: u32) -> Credential {
    Credential {
        uid,
        gid: uid,
        gids: Vec::new(),
    }
}

/// One ordered call at agreed time `now` (seconds): the status and the rest of the result.
fn call(fs: &mut FileSystem, now: u64, uid: u32, procedure: u32, args: Writer) -> (Status, Bytes) {
    let op = operation(procedure, &cred(uid), &args.finish());
    let Reply::Result(result) = execute(fs, now * 1_000_000, &op) else {
        panic!("procedure {procedure} did not decode");
    };
    let status = Reader::new(&result).u32().unwrap();
    (status_of(status), result.slice(4..))
}

fn status_of(v: u32) -> Status {
    [
        Status::Ok,
        Status::Perm,
        Status::NoEnt,
        Status::Acces,
        Status::Exist,
        Status::NotDir,
        Status::IsDir,
        Status::Inval,
        Status::NameTooLong,
        Status::NotEmpty,
        Status::Stale,
        Status::BadHandle,
        Status::NotSync,
        Status::BadCookie,
        Status::TooSmall,
        Status::BadType,
        Status::FBig,
        Status::MLink,
    ]
    .into_iter()
    .find(|s| *s as u32 == v)
    .unwrap_or_else(|| panic!("status {v}"))
}

fn args() -> Writer {
    Writer::new()
}

fn dirop(handle: &[u8], name: &str) -> Writer {
    let mut w = args();
    w.opaque(handle).string(name);
    w
}

fn root(fs: &FileSystem) -> Vec<u8> {
    root_handle(fs).unwrap().to_vec()
}

/// CREATE (UNCHECKED, mode) as `uid`: the new file's handle.
fn create(fs: &mut FileSystem, uid: u32, dir: &[u8], name: &str, mode: u32) -> Result<Vec<u8>, Status> {
    let mut w = dirop(dir, name);
    w.u32(0);
    SetAttributes {
        mode: Some(mode),
        ..SetAttributes::default()
    }
    .encode(&mut w);
    let (status, rest) = call(fs, 10, uid, proc3::CREATE, w);
    if status != Status::Ok {
        return Err(status);
    }
    let mut r = Reader::new(&rest);
    assert!(r.bool().unwrap());
    Ok(r.opaque(FHSIZE3).unwrap().to_vec())
}

fn mkdir(fs: &mut FileSystem, uid: u32, dir: &[u8], name: &str, mode: u32) -> Result<Vec<u8>, Status> {
    let mut w = dirop(dir, name);
    SetAttributes {
        mode: Some(mode),
        ..SetAttributes::default()
    }
    .encode(&mut w);
    let (status, rest) = call(fs, 11, uid, proc3::MKDIR, w);
    if status != Status::Ok {
        return Err(status);
    }
    let mut r = Reader::new(&rest);
    assert!(r.bool().unwrap());
    Ok(r.opaque(FHSIZE3).unwrap().to_vec())
}

fn write(fs: &mut FileSystem, uid: u32, file: &[u8], offset: u64, data: &[u8]) -> Status {
    let mut w = args();
    w.opaque(file).u64(offset).u32(data.len() as u32).u32(0).opaque(data);
    let (status, rest) = call(fs, 12, uid, proc3::WRITE, w);
    if status == Status::Ok {
        let mut r = Reader::new(&rest);
        skip_wcc(&mut r);
        assert_eq!(r.u32().unwrap(), data.len() as u32);
        assert_eq!(r.u32().unwrap(), 2, "FILE_SYNC");
        assert_eq!(r.fixed(8).unwrap(), &WRITE_VERIFIER);
    }
    status
}

fn skip_wcc(r: &mut Reader<'_>) {
    if r.bool().unwrap() {
        r.u64().unwrap();
        Time::decode(r).unwrap();
        Time::decode(r).unwrap();
    }
    if r.bool().unwrap() {
        Attributes::decode(r).unwrap();
    }
}

fn post_op_attr(r: &mut Reader<'_>) -> Option<Attributes> {
    r.optional(Attributes::decode).unwrap()
}

/// READ through the read-only path, checked against the ordered one.
fn read(fs: &mut FileSystem, uid: u32, file: &[u8], offset: u64, count: u32) -> Result<(Vec<u8>, bool), Status> {
    let mut w = args();
    w.opaque(file).u64(offset).u32(count);
    let bytes = w.finish();
    let op = operation(proc3::READ, &cred(uid), &bytes);
    let quick = execute_read_only(fs, &op).expect("READ is read-only");
    let mut w = args();
    w.raw(&bytes);
    let (status, rest) = call(fs, 13, uid, proc3::READ, w);
    let Reply::Result(quick) = quick else { panic!("decodes") };
    assert_eq!(&quick[4..], &rest[..], "the read-only path answers as the ordered one");
    if status != Status::Ok {
        return Err(status);
    }
    let mut r = Reader::new(&rest);
    post_op_attr(&mut r);
    let count = r.u32().unwrap();
    let eof = r.bool().unwrap();
    let data = r.opaque(IO_BYTES_MAX as usize).unwrap().to_vec();
    assert_eq!(count as usize, data.len());
    Ok((data, eof))
}

fn getattr(fs: &mut FileSystem, handle: &[u8]) -> Result<Attributes, Status> {
    let mut w = args();
    w.opaque(handle);
    let (status, rest) = call(fs, 14, 0, proc3::GETATTR, w);
    if status != Status::Ok {
        return Err(status);
    }
    Ok(Attributes::decode(&mut Reader::new(&rest)).unwrap())
}

fn lookup(fs: &mut FileSystem, uid: u32, dir: &[u8], name: &str) -> Result<Vec<u8>, Status> {
    let (status, rest) = call(fs, 15, uid, proc3::LOOKUP, dirop(dir, name));
    if status != Status::Ok {
        return Err(status);
    }
    Ok(Reader::new(&rest).opaque(FHSIZE3).unwrap().to_vec())
}

fn remove(fs: &mut FileSystem, uid: u32, procedure: u32, dir: &[u8], name: &str) -> Status {
    call(fs, 16, uid, procedure, dirop(dir, name)).0
}

fn rename(fs: &mut FileSystem, uid: u32, from: &[u8], from_name: &str, to: &[u8], to_name: &str) -> Status {
    let mut w = dirop(from, from_name);
    w.opaque(to).string(to_name);
    call(fs, 17, uid, proc3::RENAME, w).0
}

#[test]
fn files_are_created_written_read_and_their_attributes_follow_agreed_time() {
    let mut fs = FileSystem::new();
    let root = root(&fs);
    let file = create(&mut fs, ALICE, &root, "notes.txt", 0o640).unwrap();
    let data: Vec<u8> = (0..150_000u32).map(|i| (i % 251) as u8).collect();
    for (i, chunk) in data.chunks(IO_BYTES_MAX as usize).enumerate() {
        assert_eq!(
            write(&mut fs, ALICE, &file, i as u64 * u64::from(IO_BYTES_MAX), chunk),
            Status::Ok
        );
    }
    let attrs = getattr(&mut fs, &file).unwrap();
    assert_eq!(
        (attrs.kind, attrs.mode, attrs.uid, attrs.gid, attrs.size, attrs.nlink),
        (1, 0o640, ALICE, ALICE, 150_000, 1)
    );
    assert_eq!(
        attrs.mtime,
        Time {
            seconds: 12,
            nseconds: 0
        },
        "the last WRITE's agreed time"
    );
    let mut back = Vec::new();
    loop {
        let (chunk, eof) = read(&mut fs, ALICE, &file, back.len() as u64, IO_BYTES_MAX).unwrap();
        back.extend_from_slice(&chunk);
        if eof {
            break;
        }
    }
    assert_eq!(back, data);
    // A READ larger than rtmax gets rtmax.
    assert_eq!(
        read(&mut fs, ALICE, &file, 0, 1 << 20).unwrap().0.len(),
        IO_BYTES_MAX as usize
    );
    // Bob is neither owner nor in the group: no read, no write.
    assert_eq!(read(&mut fs, BOB, &file, 0, 10), Err(Status::Acces));
    assert_eq!(write(&mut fs, BOB, &file, 0, b"x"), Status::Acces);
    // Root reads anything.
    assert!(read(&mut fs, 0, &file, 0, 10).is_ok());
}

#[test]
fn setattr_checks_its_guard_and_who_may_change_what() {
    let mut fs = FileSystem::new();
    let root = root(&fs);
    let file = create(&mut fs, ALICE, &root, "f", 0o644).unwrap();
    write(&mut fs, ALICE, &file, 0, b"hello world");
    let ctime = getattr(&mut fs, &file).unwrap().ctime;
    let setattr = |fs: &mut FileSystem, uid: u32, set: SetAttributes, guard: Option<Time>| {
        let mut w = args();
        w.opaque(&file);
        set.encode(&mut w);
        w.bool(guard.is_some());
        if let Some(g) = guard {
            g.encode(&mut w);
        }
        call(fs, 20, uid, proc3::SETATTR, w).0
    };
    let chmod = SetAttributes {
        mode: Some(0o600),
        ..SetAttributes::default()
    };
    assert_eq!(
        setattr(
            &mut fs,
            ALICE,
            chmod,
            Some(Time {
                seconds: 1,
                nseconds: 0
            })
        ),
        Status::NotSync
    );
    assert_eq!(setattr(&mut fs, BOB, chmod, None), Status::Perm);
    assert_eq!(setattr(&mut fs, ALICE, chmod, Some(ctime)), Status::Ok);
    let attrs = getattr(&mut fs, &file).unwrap();
    assert_eq!((attrs.mode, attrs.ctime.seconds), (0o600, 20));
    // Only root gives a file away; the owner may change the group to one it is in only.
    let chown = SetAttributes {
        uid: Some(BOB),
        ..SetAttributes::default()
    };
    assert_eq!(setattr(&mut fs, ALICE, chown, None), Status::Perm);
    let chgrp = SetAttributes {
        gid: Some(4242),
        ..SetAttributes::default()
    };
    assert_eq!(setattr(&mut fs, ALICE, chgrp, None), Status::Perm);
    assert_eq!(setattr(&mut fs, 0, chown, None), Status::Ok);
    assert_eq!(getattr(&mut fs, &file).unwrap().uid, BOB);
    // Truncation through the size.
    let truncate = SetAttributes {
        size: Some(5),
        ..SetAttributes::default()
    };
    assert_eq!(setattr(&mut fs, BOB, truncate, None), Status::Ok);
    assert_eq!(read(&mut fs, BOB, &file, 0, 100).unwrap(), (b"hello".to_vec(), true));
    let on_dir = SetAttributes {
        size: Some(0),
        ..SetAttributes::default()
    };
    let mut w = args();
    w.opaque(&root);
    on_dir.encode(&mut w);
    w.bool(false);
    assert_eq!(call(&mut fs, 21, 0, proc3::SETATTR, w).0, Status::IsDir);
}

#[test]
fn creation_modes_and_name_errors_follow_rfc_1813() {
    let mut fs = FileSystem::new();
    let root = root(&fs);
    create(&mut fs, ALICE, &root, "a", 0o644).unwrap();
    // UNCHECKED over an existing file opens it; GUARDED fails.
    assert!(create(&mut fs, ALICE, &root, "a", 0o644).is_ok());
    let mut w = dirop(&root, "a");
    w.u32(1);
    SetAttributes::default().encode(&mut w);
    assert_eq!(call(&mut fs, 30, ALICE, proc3::CREATE, w).0, Status::Exist);
    // EXCLUSIVE: the same verifier again succeeds (a retransmission), another fails.
    let exclusive = |fs: &mut FileSystem, verifier: &[u8; 8]| {
        let mut w = dirop(&root, "x");
        w.u32(2).fixed(verifier);
        call(fs, 31, ALICE, proc3::CREATE, w).0
    };
    assert_eq!(exclusive(&mut fs, b"verifie1"), Status::Ok);
    assert_eq!(exclusive(&mut fs, b"verifie1"), Status::Ok);
    assert_eq!(exclusive(&mut fs, b"verifie2"), Status::Exist);
    assert_eq!(
        create(&mut fs, ALICE, &root, &"n".repeat(256), 0o644),
        Err(Status::NameTooLong)
    );
    assert_eq!(create(&mut fs, ALICE, &root, "a/b", 0o644), Err(Status::Inval));
    assert_eq!(mkdir(&mut fs, ALICE, &root, "a", 0o755), Err(Status::Exist));
    let file = lookup(&mut fs, ALICE, &root, "a").unwrap();
    assert_eq!(create(&mut fs, ALICE, &file, "c", 0o644), Err(Status::NotDir));
    assert_eq!(lookup(&mut fs, ALICE, &root, "missing"), Err(Status::NoEnt));
    // Bob may not create in Alice's 0755 directory.
    let private = mkdir(&mut fs, ALICE, &root, "alice", 0o755).unwrap();
    assert_eq!(create(&mut fs, BOB, &private, "b", 0o644), Err(Status::Acces));
    let closed = mkdir(&mut fs, ALICE, &root, "closed", 0o700).unwrap();
    assert_eq!(lookup(&mut fs, BOB, &closed, "anything"), Err(Status::Acces));
    // MKNOD: a FIFO yes, a regular file through MKNOD no.
    let mut w = dirop(&root, "fifo");
    w.u32(FileType::Fifo as u32);
    SetAttributes::default().encode(&mut w);
    assert_eq!(call(&mut fs, 32, ALICE, proc3::MKNOD, w).0, Status::Ok);
    let mut w = dirop(&root, "reg");
    w.u32(FileType::Regular as u32);
    assert_eq!(call(&mut fs, 33, ALICE, proc3::MKNOD, w).0, Status::BadType);
    // A handle that is not ours, and one whose file is gone.
    assert_eq!(getattr(&mut fs, b"short"), Err(Status::BadHandle));
    assert_eq!(remove(&mut fs, ALICE, proc3::REMOVE, &root, "a"), Status::Ok);
    assert_eq!(getattr(&mut fs, &file), Err(Status::Stale));
}

#[test]
fn remove_rmdir_rename_and_link_keep_names_and_link_counts_right() {
    let mut fs = FileSystem::new();
    let root = root(&fs);
    let dir = mkdir(&mut fs, ALICE, &root, "d", 0o755).unwrap();
    let sub = mkdir(&mut fs, ALICE, &dir, "sub", 0o755).unwrap();
    assert_eq!(getattr(&mut fs, &dir).unwrap().nlink, 3);
    assert_eq!(getattr(&mut fs, &root).unwrap().nlink, 3);
    let file = create(&mut fs, ALICE, &dir, "f", 0o644).unwrap();
    write(&mut fs, ALICE, &file, 0, b"first");
    let other = create(&mut fs, ALICE, &dir, "g", 0o644).unwrap();
    write(&mut fs, ALICE, &other, 0, b"second");

    assert_eq!(remove(&mut fs, ALICE, proc3::RMDIR, &root, "d"), Status::NotEmpty);
    assert_eq!(remove(&mut fs, ALICE, proc3::REMOVE, &dir, "sub"), Status::IsDir);
    assert_eq!(remove(&mut fs, ALICE, proc3::RMDIR, &dir, "f"), Status::NotDir);
    assert_eq!(remove(&mut fs, ALICE, proc3::RMDIR, &dir, "."), Status::Inval);

    // A hard link: two names, nlink 2; removing one keeps the data.
    let mut w = args();
    w.opaque(&file).opaque(&root).string("hard");
    assert_eq!(call(&mut fs, 40, ALICE, proc3::LINK, w).0, Status::Ok);
    assert_eq!(getattr(&mut fs, &file).unwrap().nlink, 2);
    let mut w = args();
    w.opaque(&dir).opaque(&root).string("dirlink");
    assert_eq!(call(&mut fs, 41, ALICE, proc3::LINK, w).0, Status::IsDir);
    assert_eq!(remove(&mut fs, ALICE, proc3::REMOVE, &dir, "f"), Status::Ok);
    assert_eq!(getattr(&mut fs, &file).unwrap().nlink, 1);
    assert_eq!(read(&mut fs, ALICE, &file, 0, 100).unwrap().0, b"first");

    // Rename over an existing file: the target's old file is gone, the name now has the data.
    assert_eq!(rename(&mut fs, ALICE, &root, "hard", &dir, "g"), Status::Ok);
    assert_eq!(getattr(&mut fs, &other), Err(Status::Stale));
    let g = lookup(&mut fs, ALICE, &dir, "g").unwrap();
    assert_eq!(read(&mut fs, ALICE, &g, 0, 100).unwrap().0, b"first");
    assert_eq!(lookup(&mut fs, ALICE, &root, "hard"), Err(Status::NoEnt));
    // A directory may not move below itself; it moves elsewhere with its ".." and counts.
    assert_eq!(rename(&mut fs, ALICE, &root, "d", &sub, "d2"), Status::Inval);
    assert_eq!(rename(&mut fs, ALICE, &dir, "sub", &root, "top"), Status::Ok);
    assert_eq!(getattr(&mut fs, &dir).unwrap().nlink, 2);
    assert_eq!(getattr(&mut fs, &root).unwrap().nlink, 4);
    assert_eq!(lookup(&mut fs, ALICE, &sub, "..").unwrap(), root);
    // A file over a directory and back are refused.
    assert_eq!(rename(&mut fs, ALICE, &dir, "g", &root, "top"), Status::IsDir);
    assert_eq!(rename(&mut fs, ALICE, &root, "top", &dir, "g"), Status::NotDir);
    assert_eq!(remove(&mut fs, ALICE, proc3::RMDIR, &root, "top"), Status::Ok);
    assert_eq!(getattr(&mut fs, &root).unwrap().nlink, 3);
    // The sticky bit: Bob may not remove Alice's file from a shared 1777 directory.
    let shared = mkdir(&mut fs, 0, &root, "tmp", 0o1777).unwrap();
    create(&mut fs, ALICE, &shared, "mine", 0o644).unwrap();
    assert_eq!(remove(&mut fs, BOB, proc3::REMOVE, &shared, "mine"), Status::Acces);
    assert_eq!(remove(&mut fs, ALICE, proc3::REMOVE, &shared, "mine"), Status::Ok);
}

#[test]
fn symlinks_readdir_and_readdirplus_page_through_a_directory() {
    let mut fs = FileSystem::new();
    let root = root(&fs);
    let mut w = dirop(&root, "link");
    SetAttributes::default().encode(&mut w);
    w.string("target/path");
    assert_eq!(call(&mut fs, 50, ALICE, proc3::SYMLINK, w).0, Status::Ok);
    let link = lookup(&mut fs, ALICE, &root, "link").unwrap();
    let mut w = args();
    w.opaque(&link);
    let (status, rest) = call(&mut fs, 51, ALICE, proc3::READLINK, w);
    assert_eq!(status, Status::Ok);
    let mut r = Reader::new(&rest);
    assert_eq!(post_op_attr(&mut r).unwrap().kind, FileType::Symlink as u32);
    assert_eq!(r.string(1024).unwrap(), "target/path");

    for i in 0..500 {
        create(&mut fs, ALICE, &root, &format!("entry-{i}"), 0o644).unwrap();
    }
    for plus in [false, true] {
        let (mut cookie, mut names) = (0u64, Vec::new());
        loop {
            let mut w = args();
            w.opaque(&root).u64(cookie).fixed(&COOKIE_VERIFIER).u32(4096);
            if plus {
                w.u32(8192);
            }
            let procedure = if plus { proc3::READDIRPLUS } else { proc3::READDIR };
            let bytes = w.finish();
            let op = operation(procedure, &cred(ALICE), &bytes);
            let Some(Reply::Result(result)) = execute_read_only(&fs, &op) else {
                panic!("read-only")
            };
            assert!(result.len() <= 8192 + 4, "within maxcount");
            let mut r = Reader::new(&result);
            assert_eq!(r.u32().unwrap(), 0);
            post_op_attr(&mut r);
            r.fixed(8).unwrap();
            while r.bool().unwrap() {
                let _fileid = r.u64().unwrap();
                names.push(r.string(255).unwrap().to_string());
                cookie = r.u64().unwrap();
                if plus {
                    assert!(post_op_attr(&mut r).is_some());
                    assert!(r.bool().unwrap());
                    r.opaque(FHSIZE3).unwrap();
                }
            }
            if r.bool().unwrap() {
                break;
            }
        }
        assert_eq!(names.len(), 503, "., .., link and 500 entries");
        assert_eq!(&names[..2], &[".", ".."]);
        let mut sorted = names.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), 503, "no entry twice");
    }
    // A reply too small for one entry, and a stale verifier.
    let mut w = args();
    w.opaque(&root).u64(0).fixed(&COOKIE_VERIFIER).u32(40);
    assert_eq!(call(&mut fs, 52, ALICE, proc3::READDIR, w).0, Status::TooSmall);
    let mut w = args();
    w.opaque(&root).u64(5).fixed(b"otherver").u32(4096);
    assert_eq!(call(&mut fs, 53, ALICE, proc3::READDIR, w).0, Status::BadCookie);
}

#[test]
fn bad_calls_get_rpc_errors_and_writes_never_take_the_read_only_path() {
    let mut fs = FileSystem::new();
    assert_eq!(execute(&mut fs, 0, &operation(99, &cred(0), &[])), Reply::ProcUnavail);
    assert_eq!(
        execute(&mut fs, 0, &operation(proc3::GETATTR, &cred(0), &[0, 0])),
        Reply::GarbageArgs
    );
    assert_eq!(execute(&mut fs, 0, &[1, 2]), Reply::GarbageArgs);
    assert!(execute_read_only(&fs, &operation(proc3::WRITE, &cred(0), &[])).is_none());
    // Both paths answer a call without a credential alike, whatever its procedure.
    assert_eq!(execute_read_only(&fs, &[0, 0, 0, 99]), Some(Reply::GarbageArgs));
    assert_eq!(execute(&mut fs, 0, &[0, 0, 0, 99]), Reply::GarbageArgs);
    for reply in [
        Reply::ProcUnavail,
        Reply::GarbageArgs,
        Reply::Result(Bytes::from_static(b"\0\0\0\0")),
    ] {
        assert_eq!(Reply::decode(&reply.encode()), Ok(reply));
    }
    // FSINFO offers at least 64 KiB transfers.
    let mut w = args();
    w.opaque(&root(&fs));
    let (status, rest) = call(&mut fs, 1, 0, proc3::FSINFO, w);
    assert_eq!(status, Status::Ok);
    let mut r = Reader::new(&rest);
    post_op_attr(&mut r);
    assert!(r.u32().unwrap() >= 64 * 1024);
}

#[test]
fn commit_takes_the_read_only_path_and_answers_as_the_ordered_one() {
    let mut fs = FileSystem::new();
    let root = root(&fs);
    let file = create(&mut fs, ALICE, &root, "f", 0o644).unwrap();
    assert_eq!(write(&mut fs, ALICE, &file, 0, b"data"), Status::Ok);
    assert!(is_read_only(proc3::COMMIT));
    for (handle, status) in [(&file, Status::Ok), (&root, Status::IsDir)] {
        let mut w = args();
        w.opaque(handle).u64(0).u32(0);
        let op = operation(proc3::COMMIT, &cred(ALICE), &w.finish());
        let quick = execute_read_only(&fs, &op).expect("COMMIT is read-only");
        assert_eq!(Some(quick.clone()), Some(execute(&mut fs, 9_000_000, &op)));
        let Reply::Result(result) = quick else {
            panic!("COMMIT decodes")
        };
        let mut r = Reader::new(&result);
        assert_eq!(status_of(r.u32().unwrap()), status);
        if status == Status::Ok {
            skip_wcc(&mut r);
            assert_eq!(r.fixed(8).unwrap(), &WRITE_VERIFIER[..]);
        }
    }
}

use super::*;

fn file(mode: u32) -> Inode {
    Inode {
        generation: 0,
        kind: FileType::Regular,
        mode,
        nlink: 1,
        uid: 1000,
        gid: 1000,
        size: 0,
        rdev: (0, 0),
        atime: Time::default(),
        mtime: Time::default(),
        ctime: Time::default(),
        create_verifier: None,
        body: Body::File {
            direct: Vec::new(),
            indirect: Vec::new(),
        },
    }
}

/// Deterministic bytes for a test file.
fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[test]
fn handles_name_live_inodes_and_go_stale_when_the_page_is_reused() {
    let mut fs = FileSystem::new();
    let root = fs.inode(ROOT).unwrap();
    let handle = FileSystem::handle(ROOT, &root);
    assert_eq!(fs.resolve(&handle).unwrap().0, ROOT);
    assert_eq!(fs.resolve(&handle[..15]).unwrap_err(), Status::BadHandle);
    assert_eq!(fs.resolve(&[0; HANDLE_BYTES]).unwrap_err(), Status::Stale);

    let a = fs.create_inode(file(0o644)).unwrap();
    let inode_a = fs.inode(a).unwrap();
    let handle_a = FileSystem::handle(a, &inode_a);
    fs.free_inode(a, &inode_a).unwrap();
    assert_eq!(fs.resolve(&handle_a).unwrap_err(), Status::Stale, "freed");
    // The page is reused for the next inode, with a new generation: the old handle stays stale.
    let b = fs.create_inode(file(0o644)).unwrap();
    assert_eq!(b, a, "the free list gives the page back");
    assert_eq!(fs.resolve(&handle_a).unwrap_err(), Status::Stale);
    let inode_b = fs.inode(b).unwrap();
    assert_eq!(fs.resolve(&FileSystem::handle(b, &inode_b)).unwrap().0, b);
}

#[test]
fn file_data_round_trips_across_blocks_holes_and_the_indirect_boundary() {
    let mut fs = FileSystem::new();
    let id = fs.create_inode(file(0o644)).unwrap();
    let mut inode = fs.inode(id).unwrap();
    // Straddles blocks 0 and 1.
    let first = pattern(100_000, 1);
    fs.write(&mut inode, 10, &first).unwrap();
    // Just before and after the direct/indirect boundary, leaving a hole in between.
    let boundary = DIRECT_MAX as u64 * BLOCK_BYTES;
    let second = pattern(70_000, 2);
    fs.write(&mut inode, boundary - 5_000, &second).unwrap();
    fs.put_inode(id, &inode);
    let inode = fs.inode(id).unwrap();
    assert_eq!(inode.size, boundary - 5_000 + 70_000);

    let (data, eof) = fs.read(&inode, 0, 100_010).unwrap();
    assert!(!eof);
    assert_eq!(&data[..10], &[0; 10]);
    assert_eq!(&data[10..], &first[..]);
    let (hole, _) = fs.read(&inode, 500_000, 1_000).unwrap();
    assert_eq!(hole, vec![0; 1_000]);
    let (data, eof) = fs.read(&inode, boundary - 5_000, 1 << 20).unwrap();
    assert!(eof);
    assert_eq!(data, second);
    // Only the blocks written hold pages: 2 + 2 data pages, 1 indirect page, 1 inode.
    let (files, pages, free) = fs.usage().unwrap();
    assert_eq!((files, pages, free), (2, 2 + 1 + 2 + 2 + 1, 0));
}

#[test]
fn truncation_frees_the_pages_past_the_end_and_an_extension_reads_zeros() {
    let mut fs = FileSystem::new();
    let id = fs.create_inode(file(0o644)).unwrap();
    let mut inode = fs.inode(id).unwrap();
    let size = (DIRECT_MAX as u64 + 3) * BLOCK_BYTES;
    let data = pattern(size as usize, 3);
    fs.write(&mut inode, 0, &data).unwrap();
    let (_, allocated, _) = fs.usage().unwrap();
    fs.truncate(&mut inode, 1_000).unwrap();
    let (_, _, free) = fs.usage().unwrap();
    assert_eq!(
        free,
        DIRECT_MAX as u64 + 3 - 1 + 1,
        "every data page but the first, and the indirect page"
    );
    fs.truncate(&mut inode, 3_000).unwrap();
    let (read, eof) = fs.read(&inode, 0, 10_000).unwrap();
    assert!(eof);
    assert_eq!(&read[..1_000], &data[..1_000]);
    assert_eq!(&read[1_000..], &[0; 2_000][..], "no old bytes come back");
    // Freed pages are reused before the file system grows.
    fs.write(&mut inode, 0, &pattern(5 * BLOCK_BYTES as usize, 4)).unwrap();
    assert_eq!(fs.usage().unwrap().1, allocated);
    assert_eq!(fs.truncate(&mut inode, FILE_BYTES_MAX + 1), Err(Status::FBig));
}

#[test]
fn a_directory_of_ten_thousand_entries_moves_to_pages_and_lists_every_entry_once_by_cookie() {
    let mut fs = FileSystem::new();
    let mut root = fs.inode(ROOT).unwrap();
    let names: Vec<String> = (0..10_000).map(|i| format!("file-{i:05}.txt")).collect();
    for (i, name) in names.iter().enumerate() {
        fs.add_entry(&mut root, name, 1_000 + i as u64).unwrap();
    }
    fs.put_inode(ROOT, &root);
    let root = fs.inode(ROOT).unwrap();
    let Body::Directory {
        entries: Entries::Paged(pages),
        ..
    } = &root.body
    else {
        panic!("a large directory is paged");
    };
    assert!(pages.len() >= 5, "{} entry pages", pages.len());
    assert_eq!(root.size, 10_000);
    for (i, name) in names.iter().enumerate() {
        assert_eq!(fs.lookup(&root, name), Ok(1_000 + i as u64));
    }
    assert_eq!(fs.lookup(&root, "missing"), Err(Status::NoEnt));
    // READDIR in pieces of 333 from each last cookie: every entry once, cookies increasing.
    let (mut cookie, mut seen) = (0, Vec::new());
    loop {
        let (chunk, eof) = fs.list(&root, cookie, 333).unwrap();
        for e in &chunk {
            assert!(e.hash > cookie);
            cookie = e.hash;
            seen.push(e.name.clone());
        }
        if eof {
            break;
        }
    }
    let mut sorted = seen.clone();
    sorted.sort();
    assert_eq!(sorted, names);
    // A cookie stays valid while the directory changes: removing entries before it and adding
    // others does not repeat or skip the ones after it.
    let (first, _) = fs.list(&root, 0, 100).unwrap();
    let resume = first[99].hash;
    let mut root = root;
    for e in &first[..50] {
        fs.remove_entry(&mut root, &e.name).unwrap();
    }
    let (rest, eof) = fs.list(&root, resume, 20_000).unwrap();
    assert!(eof);
    assert_eq!(rest.len(), 10_000 - 100);
    // Removing every entry frees the entry pages but the last one.
    for e in &first[50..] {
        fs.remove_entry(&mut root, &e.name).unwrap();
    }
    for e in &rest {
        fs.remove_entry(&mut root, &e.name).unwrap();
    }
    assert_eq!(root.size, 0);
    assert_eq!(fs.list(&root, 0, 10).unwrap(), (Vec::new(), true));
    let Body::Directory {
        entries: Entries::Paged(pages),
        ..
    } = &root.body
    else {
        panic!("stays paged");
    };
    assert_eq!(pages.len(), 1);
    assert_eq!(fs.remove_entry(&mut root, "file-00001.txt"), Err(Status::NoEnt));
}

#[test]
fn the_same_calls_give_the_same_pages_and_damaged_pages_are_errors_not_panics() {
    let run = || {
        let mut fs = FileSystem::new();
        let mut root = fs.inode(ROOT).unwrap();
        for i in 0..300u64 {
            let id = fs.create_inode(file(0o600)).unwrap();
            let mut inode = fs.inode(id).unwrap();
            fs.write(&mut inode, i * 1_000, &pattern(2_000, i as u8)).unwrap();
            fs.put_inode(id, &inode);
            fs.add_entry(&mut root, &format!("f{i}"), id).unwrap();
            if i % 7 == 0 {
                fs.free_inode(id, &inode).unwrap();
                fs.remove_entry(&mut root, &format!("f{i}")).unwrap();
            }
        }
        fs.put_inode(ROOT, &root);
        fs
    };
    let (a, b) = (run(), run());
    assert_eq!(a.pages().len(), b.pages().len());
    for i in 0..a.pages().len() {
        assert_eq!(a.pages().get(i), b.pages().get(i), "page {i}");
    }
    // A peer's garbage: refused or reported, never a panic.
    let mut pages = Pages::new();
    pages.set(0, Bytes::from_static(b"not a superblock"));
    assert!(FileSystem::from_pages(pages).is_err());
    let mut fs = run();
    fs.pages_mut().set(ROOT, Bytes::from_static(&[0x55, 0x50, 0, 2, 1]));
    assert_eq!(fs.inode(ROOT).unwrap_err(), Status::Io);
    let copy = (0..a.pages().len()).map(|i| a.pages().get(i).unwrap()).collect();
    let restored = FileSystem::from_pages(Pages::from_pages(copy)).unwrap();
    let root = restored.inode(ROOT).unwrap();
    let f1 = restored.inode(restored.lookup(&root, "f1").unwrap()).unwrap();
    assert_eq!(restored.read(&f1, 1_000, 2_000).unwrap(), (pattern(2_000, 1), true));
    assert_eq!(restored.lookup(&root, "f7"), Err(Status::NoEnt));
}

/// Every page within `PAGE_BYTES_MAX`: the 1 GiB file of the real-client test first made an
/// indirect page of 8,192 indices, 8 bytes over, and every replica panicked on it.
#[test]
fn a_file_past_a_full_indirect_page_keeps_every_page_within_the_limit() {
    let mut fs = FileSystem::new();
    let id = fs.create_inode(file(0o644)).unwrap();
    let mut inode = fs.inode(id).unwrap();
    // One byte in the last block of the first indirect page and one in the next page's first.
    let last_of_first = (DIRECT_MAX + PER_INDIRECT - 1) as u64 * BLOCK_BYTES;
    fs.write(&mut inode, last_of_first, b"x").unwrap();
    fs.write(&mut inode, last_of_first + BLOCK_BYTES, b"y").unwrap();
    // Fill the first indirect page's every slot (sparse blocks: one byte each).
    for block in DIRECT_MAX..DIRECT_MAX + PER_INDIRECT {
        fs.write(&mut inode, block as u64 * BLOCK_BYTES, b"z").unwrap();
    }
    fs.put_inode(id, &inode);
    let Body::File { indirect, .. } = &fs.inode(id).unwrap().body else {
        panic!("a file")
    };
    assert_eq!(indirect.len(), 2);
    for i in 0..fs.pages().len() {
        let len = fs.pages().get(i).unwrap().len();
        assert!(len <= upright_core::limits::PAGE_BYTES_MAX, "page {i}: {len} bytes");
    }
    assert_eq!(
        fs.read(&fs.inode(id).unwrap(), last_of_first + BLOCK_BYTES, 1)
            .unwrap()
            .0,
        b"y"
    );
}

#[test]
fn a_file_past_four_gib_keeps_its_blocks_apart_and_its_holes_read_zeros() {
    const GIB: u64 = 1 << 30;
    const { assert!(FILE_BYTES_MAX >= 4 * GIB) };
    let mut fs = FileSystem::new();
    let id = fs.create_inode(file(0o644)).unwrap();
    let mut inode = fs.inode(id).unwrap();
    // A block in the direct range, one around 2 GiB, and one straddling two blocks past 4 GiB.
    let writes = [(0, 1), (2 * GIB + 5, 2), (4 * GIB + BLOCK_BYTES - 100, 3)];
    for &(offset, seed) in &writes {
        fs.write(&mut inode, offset, &pattern(1_000, seed)).unwrap();
    }
    assert_eq!(inode.size, 4 * GIB + BLOCK_BYTES + 900);
    fs.put_inode(id, &inode);
    let inode = fs.inode(id).unwrap();
    for &(offset, seed) in &writes {
        let (read, _) = fs.read(&inode, offset, 1_000).unwrap();
        assert_eq!(read, pattern(1_000, seed), "at {offset}");
    }
    let (hole, _) = fs.read(&inode, 3 * GIB, 4_096).unwrap();
    assert_eq!(hole, vec![0; 4_096], "a hole reads zeros");
    let (tail, eof) = fs.read(&inode, inode.size - 10, 100).unwrap();
    assert_eq!((tail.len(), eof), (10, true));
    // The superblock, two inodes, four data pages (the last write spans two) and the two
    // indirect pages that reach them: the file system grew by what was written, not by the
    // file's size.
    let (files, pages, _) = fs.usage().unwrap();
    assert_eq!((files, pages), (2, 1 + 2 + 4 + 2));
}

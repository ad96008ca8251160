use super::*;
use morris_proto::MAX_SYMLINK_LEN;
use uuid::Uuid;

pub(super) fn descriptor(servers: usize) -> VolumeDescriptor {
    VolumeDescriptor {
        uuid: Uuid::new_v4(),
        servers: (0..servers)
            .map(|i| format!("127.0.0.1:{}", 7000 + i))
            .collect(),
        stripe_unit: 4096,
        replicas: 1,
        created: Timestamp::now(),
    }
}

pub(super) fn attr(kind: FileKind) -> Attr {
    Attr {
        kind,
        mode: 0o100644,
        uid: 1000,
        gid: 1000,
        nlink: 0,
        size: 0,
        atime: Timestamp::default(),
        mtime: Timestamp::default(),
        ctime: Timestamp::default(),
        rdev: 0,
        flags: 0,
    }
}

pub(super) fn root(s: &Store) -> Handle {
    s.get_inode(ROOT_ID).unwrap().unwrap().handle()
}

pub(super) fn open_formatted(dir: &Path) -> (Store, VolumeDescriptor) {
    let s = Store::open(&dir.join("m.sqlite")).unwrap();
    let d = descriptor(1);
    assert_eq!(s.format(&d, 0, 77).unwrap(), FormatOutcome::Formatted);
    (s, d)
}

#[test]
fn format_rules() {
    let dir = tempfile::tempdir().unwrap();
    let s = Store::open(&dir.path().join("m.sqlite")).unwrap();
    assert!(s.formatted().is_none());
    let d = descriptor(3);
    // Index out of range, invalid descriptor.
    assert_eq!(s.format(&d, 3, 1).unwrap_err().code, ErrorCode::Invalid);
    let mut bad = d.clone();
    bad.stripe_unit = 1000;
    assert_eq!(s.format(&bad, 0, 1).unwrap_err().code, ErrorCode::Invalid);
    // ROOT_ID % 3 == 1: server 0 does not own the root.
    assert_eq!(s.format(&d, 0, 1).unwrap(), FormatOutcome::Formatted);
    assert!(s.get_inode(ROOT_ID).unwrap().is_none());
    assert_eq!(s.format(&d, 0, 1).unwrap(), FormatOutcome::AlreadyFormatted);
    let other = descriptor(3);
    let e = s.format(&other, 0, 1).unwrap_err();
    assert_eq!(e.code, ErrorCode::WrongVolume);
    assert!(e.message.contains(&d.uuid.to_string()));
    assert!(e.message.contains(&other.uuid.to_string()));
    assert_eq!(s.format(&d, 1, 1).unwrap_err().code, ErrorCode::Invalid);
    drop(s);
    // Server 1 of 3 owns the root.
    let s1 = Store::open(&dir.path().join("m1.sqlite")).unwrap();
    s1.format(&d, 1, 5).unwrap();
    let r = s1.get_inode(ROOT_ID).unwrap().unwrap();
    assert_eq!(r.gen, 5);
    assert_eq!(r.parent, ROOT_ID);
    assert_eq!(r.attr.kind, FileKind::Dir);
    assert_eq!(r.attr.mode, 0o755);
    assert_eq!((r.attr.uid, r.attr.gid, r.attr.nlink), (0, 0, 2));
    // The descriptor survives a reopen.
    drop(s1);
    let s1 = Store::open(&dir.path().join("m1.sqlite")).unwrap();
    let f = s1.formatted().unwrap();
    assert_eq!(f.descriptor, d);
    assert_eq!(f.index, 1);
    assert_eq!(s1.inode_count(), 1);
}

#[test]
fn ids_follow_the_layout_and_survive_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.sqlite");
    let d = descriptor(4);
    let s = Store::open(&path).unwrap();
    s.format(&d, 2, 1).unwrap();
    let layout = s.formatted().unwrap().layout;
    let a = s
        .create_inode(0, &attr(FileKind::File), None, 9, None, None)
        .unwrap();
    let b = s
        .create_inode(0, &attr(FileKind::File), None, 9, None, None)
        .unwrap();
    assert_eq!(a.id, layout.allocate_id(2, FIRST_COUNTER));
    assert_eq!(b.id, layout.allocate_id(2, FIRST_COUNTER + 1));
    assert_eq!(layout.inode_server(a.id), 2);
    assert_eq!(a.attr.nlink, 1);
    assert_eq!(a.attr.mode, 0o644, "mode keeps only permission bits");
    drop(s);
    // A reopened store starts past what it had reserved (power loss may
    // have lost the counter's last updates, never the reservation).
    let s = Store::open(&path).unwrap();
    let c = s
        .create_inode(0, &attr(FileKind::File), None, 9, None, None)
        .unwrap();
    assert_eq!(c.id, layout.allocate_id(2, FIRST_COUNTER + super::ID_BATCH));
    assert_eq!(s.inode_count(), 3);
}

#[test]
fn inodes_are_read_many_at_once_and_only_with_their_generation() {
    let dir = tempfile::tempdir().unwrap();
    let s = Store::open(&dir.path().join("m.sqlite")).unwrap();
    s.format(&descriptor(1), 0, 1).unwrap();
    let a = s
        .create_inode(0, &attr(FileKind::File), None, 9, None, None)
        .unwrap();
    let b = s
        .create_inode(0, &attr(FileKind::Dir), None, 9, None, None)
        .unwrap();
    let old = Handle {
        id: a.id,
        gen: a.gen.wrapping_add(1),
    };
    let gone = Handle {
        id: b.id + 1000,
        gen: 1,
    };
    let got = s.get_inodes(&[b.handle(), old, gone, a.handle()]).unwrap();
    assert_eq!(
        got,
        vec![b.clone(), a.clone()],
        "in the order asked, the others left out"
    );
    assert!(s.get_inodes(&[]).unwrap().is_empty());
}

/// Every id handed out is below a reservation that was made durable
/// before it: the counter's own last updates may be lost to power loss,
/// the reservation not.
#[test]
fn ids_are_reserved_durably_in_batches_before_use() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.sqlite");
    let s = Store::open(&path).unwrap();
    s.format(&descriptor(4), 2, 1).unwrap();
    let layout = s.formatted().unwrap().layout;
    let hw = |s: &Store| -> u64 {
        s.with_reader(|c| {
            c.query_row("SELECT hw FROM id_reserve", [], |r| r.get::<_, i64>(0))
                .map_err(super::db_err)
        })
        .unwrap() as u64
    };
    let mut last = 0;
    for _ in 0..(super::ID_BATCH + 3) {
        last = s
            .create_inode(0, &attr(FileKind::File), None, 9, None, None)
            .unwrap()
            .id;
        let counter = (last - 2) / 4;
        assert!(counter < hw(&s), "id {last} past the reservation");
    }
    // Two reservations so far (one fsync each), not one per create.
    assert_eq!(
        hw(&s),
        FIRST_COUNTER + 2 * super::ID_BATCH,
        "reservation after {} creates",
        super::ID_BATCH + 3
    );
    assert_eq!(layout.inode_server(last), 2);
}

/// Ids set aside for a client (`ReserveIds`) are never handed out again,
/// here or after a reopen, and an inode can be made with one only once,
/// only if it was handed out, and only in this store's range.
#[test]
fn reserved_ids_are_used_once_and_only_as_reserved() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.sqlite");
    let s = Store::open(&path).unwrap();
    s.format(&descriptor(4), 2, 1).unwrap();
    let layout = s.formatted().unwrap().layout;
    assert_eq!(s.reserve_ids(0).unwrap_err().code, ErrorCode::Invalid);
    assert_eq!(s.reserve_ids(1025).unwrap_err().code, ErrorCode::Invalid);
    let ids = s.reserve_ids(10).unwrap();
    assert_eq!(ids.len(), 10);
    assert!(
        ids.iter().all(|&id| layout.inode_server(id) == 2),
        "{ids:?}"
    );
    // The store's own next create skips them.
    let own = s
        .create_inode(0, &attr(FileKind::File), None, 9, None, None)
        .unwrap();
    assert!(!ids.contains(&own.id), "{} handed out twice", own.id);
    assert!(own.id > ids[9]);
    // Made with an id reserved: as `create_inode` would make it.
    let dirattr = attr(FileKind::Dir);
    let made = s
        .create_inode_at(ids[3], 1, &dirattr, None, 77, None, &[])
        .unwrap();
    assert_eq!((made.id, made.gen, made.parent), (ids[3], 77, 1));
    assert_eq!(made.attr.nlink, 2);
    assert_eq!(s.get_inode(ids[3]).unwrap(), Some(made));
    // Once only.
    let again = s.create_inode_at(ids[3], 1, &dirattr, None, 78, None, &[]);
    assert_eq!(again.unwrap_err().code, ErrorCode::Exists);
    // Not an id of this range, not yet handed out, generation 0.
    let file = attr(FileKind::File);
    let other = layout.allocate_id(1, FIRST_COUNTER);
    let e = s.create_inode_at(other, 0, &file, None, 5, None, &[]);
    assert_eq!(e.unwrap_err().code, ErrorCode::Invalid);
    let future = layout.allocate_id(2, FIRST_COUNTER + 1000);
    let e = s.create_inode_at(future, 0, &file, None, 5, None, &[]);
    assert_eq!(e.unwrap_err().code, ErrorCode::Invalid);
    let e = s.create_inode_at(ids[4], 0, &file, None, 0, None, &[]);
    assert_eq!(e.unwrap_err().code, ErrorCode::Invalid);
    // A reopened store never hands them out, and still takes them.
    drop(s);
    let s = Store::open(&path).unwrap();
    let more = s.reserve_ids(5).unwrap();
    assert!(more.iter().all(|id| !ids.contains(id) && *id != own.id));
    let next = s
        .create_inode(0, &attr(FileKind::File), None, 9, None, None)
        .unwrap();
    assert!(!ids.contains(&next.id) && !more.contains(&next.id));
    s.create_inode_at(ids[5], 0, &file, None, 6, None, &[])
        .unwrap();
}

#[test]
fn create_checks_kinds() {
    let dir = tempfile::tempdir().unwrap();
    let (s, _) = open_formatted(dir.path());
    let d = s
        .create_inode(ROOT_ID, &attr(FileKind::Dir), None, 3, None, None)
        .unwrap();
    assert_eq!((d.attr.nlink, d.parent, d.attr.size), (2, ROOT_ID, 0));
    let l = s
        .create_inode(
            ROOT_ID,
            &attr(FileKind::Symlink),
            Some(b"../x"),
            3,
            None,
            None,
        )
        .unwrap();
    assert_eq!((l.attr.size, l.parent), (4, 0));
    assert_eq!(l.target.as_deref(), Some(&b"../x"[..]));
    let e = s
        .create_inode(0, &attr(FileKind::Symlink), None, 3, None, None)
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::Invalid);
    let e = s
        .create_inode(0, &attr(FileKind::File), Some(b"x"), 3, None, None)
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::Invalid);
    let long = vec![b'a'; MAX_SYMLINK_LEN + 1];
    let e = s
        .create_inode(0, &attr(FileKind::Symlink), Some(&long), 3, None, None)
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::NameTooLong);
}

#[test]
fn entries_link_lookup_unlink() {
    let dir = tempfile::tempdir().unwrap();
    let (s, _) = open_formatted(dir.path());
    let r = root(&s);
    let before = s.get_inode(ROOT_ID).unwrap().unwrap();
    let f = s
        .create_inode(0, &attr(FileKind::File), None, 3, None, None)
        .unwrap();
    let sub = s
        .create_inode(ROOT_ID, &attr(FileKind::Dir), None, 4, None, None)
        .unwrap();
    assert_eq!(
        s.link(r, b"f", f.handle(), FileKind::File, None, None)
            .unwrap()
            .0,
        None
    );
    assert_eq!(
        s.link(r, b"sub", sub.handle(), FileKind::Dir, None, None)
            .unwrap()
            .0,
        None
    );
    let after = s.get_inode(ROOT_ID).unwrap().unwrap();
    assert_eq!(after.attr.size, 2);
    assert_eq!(after.attr.nlink, 3);
    assert!(after.attr.mtime >= before.attr.mtime);
    assert_eq!(after.attr.mtime, after.attr.ctime);
    let e = s.lookup(r, b"f").unwrap().unwrap();
    assert_eq!(e.child, f.handle());
    assert_eq!(e.kind, FileKind::File);
    assert!(e.cookie > 0);
    assert_eq!(s.lookup(r, b"nope").unwrap(), None);
    // Exists unless the replaced child is named.
    let g = s
        .create_inode(0, &attr(FileKind::File), None, 5, None, None)
        .unwrap();
    let err = s
        .link(r, b"f", g.handle(), FileKind::File, None, None)
        .unwrap_err();
    assert_eq!(err.code, ErrorCode::Exists);
    let err = s
        .link(r, b"f", g.handle(), FileKind::File, Some(g.id), None)
        .unwrap_err();
    assert_eq!(err.code, ErrorCode::Exists);
    let old = s
        .link(r, b"f", g.handle(), FileKind::File, Some(f.id), None)
        .unwrap()
        .0
        .unwrap();
    assert_eq!(old.child, f.handle());
    assert_eq!(s.lookup(r, b"f").unwrap().unwrap().child, g.handle());
    assert_eq!(s.get_inode(ROOT_ID).unwrap().unwrap().attr.size, 2);
    assert_eq!(s.entry_count(), 2);
    // Unlink with the wrong expectation fails and changes nothing.
    let err = s.unlink(r, b"sub", Some(g.id), None).unwrap_err();
    assert_eq!(err.code, ErrorCode::NotFound);
    let gone = s.unlink(r, b"sub", Some(sub.id), None).unwrap().0.unwrap();
    assert_eq!(gone.kind, FileKind::Dir);
    let now = s.get_inode(ROOT_ID).unwrap().unwrap();
    assert_eq!((now.attr.size, now.attr.nlink), (1, 2));
    assert_eq!(
        s.unlink(r, b"sub", None, None).unwrap_err().code,
        ErrorCode::NotFound
    );
    assert_eq!(s.entry_count(), 1);
}

#[test]
fn names_and_handles_are_checked() {
    let dir = tempfile::tempdir().unwrap();
    let (s, _) = open_formatted(dir.path());
    let r = root(&s);
    let f = s
        .create_inode(0, &attr(FileKind::File), None, 3, None, None)
        .unwrap();
    let h = f.handle();
    fn code<T: std::fmt::Debug>(res: Result<T, WireError>) -> ErrorCode {
        res.unwrap_err().code
    }
    assert_eq!(
        code(s.link(r, b"", h, FileKind::File, None, None)),
        ErrorCode::Invalid
    );
    assert_eq!(
        code(s.link(r, b"a/b", h, FileKind::File, None, None)),
        ErrorCode::Invalid
    );
    assert_eq!(
        code(s.link(r, b"a\0", h, FileKind::File, None, None)),
        ErrorCode::Invalid
    );
    assert_eq!(
        code(s.link(r, b"..", h, FileKind::File, None, None)),
        ErrorCode::Invalid
    );
    let long = vec![b'x'; 256];
    assert_eq!(
        code(s.link(r, &long, h, FileKind::File, None, None)),
        ErrorCode::NameTooLong
    );
    assert!(s
        .link(r, &long[..255], h, FileKind::File, None, None)
        .is_ok());
    // A stale directory handle, a file used as a directory.
    let stale = Handle {
        id: ROOT_ID,
        gen: r.gen.wrapping_add(1),
    };
    assert_eq!(code(s.lookup(stale, b"a")), ErrorCode::Stale);
    assert_eq!(
        code(s.link(stale, b"a", h, FileKind::File, None, None)),
        ErrorCode::Stale
    );
    assert_eq!(code(s.lookup(h, b"a")), ErrorCode::NotDir);
    let missing = Handle {
        id: 999_999,
        gen: 1,
    };
    assert_eq!(code(s.lookup(missing, b"a")), ErrorCode::Stale);
    let huge = Handle {
        id: u64::MAX,
        gen: 1,
    };
    assert_eq!(code(s.lookup(huge, b"a")), ErrorCode::Stale);
    assert_eq!(code(s.unlink(huge, b"a", None, None)), ErrorCode::Stale);
    assert!(s.get_inode(u64::MAX).unwrap().is_none());
}

#[test]
fn readdir_pages_by_cookie() {
    let dir = tempfile::tempdir().unwrap();
    let (s, _) = open_formatted(dir.path());
    let r = root(&s);
    let f = s
        .create_inode(0, &attr(FileKind::File), None, 3, None, None)
        .unwrap();
    for i in 0..250 {
        s.link(
            r,
            format!("n{i}").as_bytes(),
            f.handle(),
            FileKind::File,
            None,
            None,
        )
        .unwrap();
    }
    // Remove a few in the middle; cookies of the rest stay.
    for i in (0..250).step_by(7) {
        s.unlink(r, format!("n{i}").as_bytes(), None, None).unwrap();
    }
    let mut cookie = 0;
    let mut names = Vec::new();
    let mut pages = 0;
    loop {
        let (page, eof) = s.read_dir(r, cookie, 40).unwrap();
        pages += 1;
        assert!(page.len() <= 40);
        for e in &page {
            assert!(e.cookie > cookie, "cookies ascend");
            cookie = e.cookie;
            names.push(String::from_utf8(e.name.clone()).unwrap());
        }
        if eof {
            break;
        }
    }
    let mut want: Vec<String> = (0..250)
        .filter(|i| i % 7 != 0)
        .map(|i| format!("n{i}"))
        .collect();
    // Listed in cookie order, which is the order of the names' hashes.
    let mut sorted = names.clone();
    sorted.sort();
    want.sort();
    assert_eq!(sorted, want);
    assert_eq!(pages, want.len().div_ceil(40));
    for n in &names {
        let e = s.lookup(r, n.as_bytes()).unwrap().unwrap();
        assert_eq!(e.cookie, super::cookies::of(n.as_bytes()), "{n}");
    }
    // A name removed and made again keeps its place: a listing that has
    // passed it does not meet it again.
    let first = names[0].clone();
    let c0 = s.lookup(r, first.as_bytes()).unwrap().unwrap().cookie;
    s.unlink(r, first.as_bytes(), None, None).unwrap();
    s.link(r, first.as_bytes(), f.handle(), FileKind::File, None, None)
        .unwrap();
    assert_eq!(s.lookup(r, first.as_bytes()).unwrap().unwrap().cookie, c0);
    let (page, _) = s.read_dir(r, c0, 4096).unwrap();
    assert!(page.iter().all(|e| e.name != first.as_bytes()));
    // Reading past the end, from a huge cookie, with max 0.
    let (page, eof) = s.read_dir(r, u64::MAX, 10).unwrap();
    assert!(page.is_empty() && eof);
    let (page, _) = s.read_dir(r, 0, 0).unwrap();
    assert_eq!(page.len(), 1);
}

#[test]
fn rename_rules() {
    let dir = tempfile::tempdir().unwrap();
    let (s, _) = open_formatted(dir.path());
    let r = root(&s);
    let a = s
        .create_inode(0, &attr(FileKind::File), None, 3, None, None)
        .unwrap();
    let b = s
        .create_inode(ROOT_ID, &attr(FileKind::Dir), None, 3, None, None)
        .unwrap();
    s.link(r, b"a", a.handle(), FileKind::File, None, None)
        .unwrap();
    s.link(r, b"b", b.handle(), FileKind::Dir, None, None)
        .unwrap();
    assert_eq!(s.rename(r, b"a", b"c", None, None).unwrap().0, None);
    let c = s.lookup(r, b"c").unwrap().unwrap();
    // A name's cookie is its own, whatever it was renamed from.
    assert_eq!((c.child, c.cookie), (a.handle(), super::cookies::of(b"c")));
    assert!(s.lookup(r, b"a").unwrap().is_none());
    assert_eq!(
        s.rename(r, b"a", b"d", None, None).unwrap_err().code,
        ErrorCode::NotFound
    );
    assert_eq!(
        s.rename(r, b"c", b"b", None, None).unwrap_err().code,
        ErrorCode::Exists
    );
    assert_eq!(s.rename(r, b"c", b"c", None, None).unwrap().0, None);
    // Replace the directory entry "b" by "c": "b" keeps its cookie.
    let cookie_b = s.lookup(r, b"b").unwrap().unwrap().cookie;
    let old = s
        .rename(r, b"c", b"b", Some(b.id), None)
        .unwrap()
        .0
        .unwrap();
    assert_eq!(old.child, b.handle());
    let now = s.lookup(r, b"b").unwrap().unwrap();
    assert_eq!((now.child, now.cookie), (a.handle(), cookie_b));
    let ri = s.get_inode(ROOT_ID).unwrap().unwrap();
    assert_eq!((ri.attr.size, ri.attr.nlink), (1, 2));
    assert_eq!(s.entry_count(), 1);
    // Two names of one file: nothing happens.
    s.link(r, b"twin", a.handle(), FileKind::File, None, None)
        .unwrap();
    assert_eq!(s.rename(r, b"b", b"twin", None, None).unwrap().0, None);
    assert!(s.lookup(r, b"b").unwrap().is_some());
}

#[test]
fn setattr_and_delete() {
    let dir = tempfile::tempdir().unwrap();
    let (s, _) = open_formatted(dir.path());
    let r = root(&s);
    let f = s
        .create_inode(0, &attr(FileKind::File), None, 3, None, None)
        .unwrap();
    let set = SetAttr {
        mode: Some(0o104755),
        size: Some(1 << 30),
        uid: Some(5),
        ..SetAttr::default()
    };
    let n = s.set_attr(f.handle(), &set).unwrap();
    assert_eq!(n.attr.mode, 0o4755);
    assert_eq!((n.attr.size, n.attr.uid, n.attr.gid), (1 << 30, 5, 1000));
    assert!(n.attr.ctime > Timestamp::default());
    let t = Timestamp { secs: 7, nanos: 8 };
    let n = s
        .set_attr(
            f.handle(),
            &SetAttr {
                ctime: Some(t),
                mtime: Some(t),
                ..SetAttr::default()
            },
        )
        .unwrap();
    assert_eq!((n.attr.ctime, n.attr.mtime), (t, t));
    assert_eq!(s.get_inode(f.id).unwrap().unwrap(), n);
    let big = SetAttr {
        size: Some(MAX_FILE_SIZE + 1),
        ..SetAttr::default()
    };
    assert_eq!(
        s.set_attr(f.handle(), &big).unwrap_err().code,
        ErrorCode::FileTooBig
    );
    let sz = SetAttr {
        size: Some(0),
        ..SetAttr::default()
    };
    assert_eq!(s.set_attr(r, &sz).unwrap_err().code, ErrorCode::IsDir);
    // Delete: directories must be empty, the root stays, stale handles fail.
    let d = s
        .create_inode(ROOT_ID, &attr(FileKind::Dir), None, 3, None, None)
        .unwrap();
    s.link(d.handle(), b"x", f.handle(), FileKind::File, None, None)
        .unwrap();
    assert_eq!(
        s.delete_inode(d.handle(), None).unwrap_err().code,
        ErrorCode::NotEmpty
    );
    s.unlink(d.handle(), b"x", None, None).unwrap();
    s.delete_inode(d.handle(), None).unwrap();
    assert!(s.get_inode(d.id).unwrap().is_none());
    assert_eq!(
        s.delete_inode(d.handle(), None).unwrap_err().code,
        ErrorCode::Stale
    );
    assert_eq!(
        s.delete_inode(r, None).unwrap_err().code,
        ErrorCode::Invalid
    );
    let stale = Handle {
        id: f.id,
        gen: f.gen + 1,
    };
    assert_eq!(s.set_attr(stale, &sz).unwrap_err().code, ErrorCode::Stale);
}

#[test]
fn scans_page_through_everything() {
    let dir = tempfile::tempdir().unwrap();
    let (s, _) = open_formatted(dir.path());
    let r = root(&s);
    let mut dirs = vec![r];
    for _ in 0..3 {
        dirs.push(
            s.create_inode(ROOT_ID, &attr(FileKind::Dir), None, 3, None, None)
                .unwrap()
                .handle(),
        );
    }
    for (i, d) in dirs.iter().enumerate() {
        for j in 0..30 {
            s.link(
                *d,
                format!("{i}-{j}").as_bytes(),
                *d,
                FileKind::File,
                None,
                None,
            )
            .unwrap();
        }
    }
    let mut after = 0;
    let mut ids = Vec::new();
    loop {
        let page = s.scan_inodes(after, 2).unwrap();
        let Some(last) = page.last() else { break };
        after = last.id;
        ids.extend(page.iter().map(|i| i.id));
    }
    assert_eq!(ids.len(), 4);
    assert!(ids.windows(2).all(|w| w[0] < w[1]));
    let (mut ad, mut ac) = (0, 0);
    let mut all = Vec::new();
    loop {
        let page = s.scan_entries(ad, ac, 7).unwrap();
        let Some((d, e)) = page.last() else { break };
        (ad, ac) = (*d, e.cookie);
        all.extend(page);
    }
    assert_eq!(all.len(), 120);
    assert!(all
        .windows(2)
        .all(|w| (w[0].0, w[0].1.cookie) < (w[1].0, w[1].1.cookie)));
    assert!(s.scan_inodes(u64::MAX, 10).unwrap().is_empty());
    assert!(s.scan_entries(u64::MAX, 0, 10).unwrap().is_empty());
}

#[test]
fn data_file_records_and_sync() {
    let dir = tempfile::tempdir().unwrap();
    let (s, _) = open_formatted(dir.path());
    for id in [5, 3, 9, 3] {
        s.add_data_file(id).unwrap();
    }
    assert_eq!(s.data_file_count(), 3);
    assert_eq!(s.scan_data_files(0, 10).unwrap(), vec![3, 5, 9]);
    assert_eq!(s.scan_data_files(3, 1).unwrap(), vec![5]);
    s.remove_data_files(&[5]).unwrap();
    s.remove_data_files(&[5]).unwrap();
    assert_eq!(s.data_file_count(), 2);
    s.sync().unwrap();
    let flushed = s.flushes();
    // Nothing committed since: nothing to flush.
    s.sync().unwrap();
    assert_eq!(s.flushes(), flushed);
    s.add_data_file(11).unwrap();
    s.sync().unwrap();
    assert_eq!(s.flushes(), flushed + 1, "a commit since the last sync");
    s.sync().unwrap();
    assert_eq!(s.flushes(), flushed + 1);
    // Still NORMAL afterwards.
    let mode: i64 = s
        .write
        .lock()
        .query_row("PRAGMA synchronous", [], |r| r.get(0))
        .unwrap();
    assert_eq!(mode, 1);
}

#[test]
fn committed_state_survives_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let (s, _) = open_formatted(dir.path());
    let r = root(&s);
    let f = s
        .create_inode(0, &attr(FileKind::File), None, 3, None, None)
        .unwrap();
    s.link(r, b"keep", f.handle(), FileKind::File, None, None)
        .unwrap();
    // Dropped without any checkpoint or sync: the WAL holds the commits.
    drop(s);
    let s = Store::open(&dir.path().join("m.sqlite")).unwrap();
    assert_eq!(s.lookup(r, b"keep").unwrap().unwrap().child, f.handle());
    assert_eq!(s.entry_count(), 1);
    assert_eq!(s.inode_count(), 2);
    // Cookies continue after the old ones.
    s.link(r, b"next", f.handle(), FileKind::File, None, None)
        .unwrap();
    let (page, _) = s.read_dir(r, 0, 10).unwrap();
    assert_eq!(page.len(), 2);
    assert!(page[1].cookie > page[0].cookie);
}

/// A large directory: every name is found, and listing resumes from any
/// cookie with one index seek (timing is measured by the benchmarks, not here).
#[test]
fn large_directory_lists_and_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let (s, _) = open_formatted(dir.path());
    let r = root(&s);
    let f = s
        .create_inode(0, &attr(FileKind::File), None, 3, None, None)
        .unwrap();
    let n = 20_000u32;
    for i in 0..n {
        s.link(
            r,
            format!("file-{i:08}").as_bytes(),
            f.handle(),
            FileKind::File,
            None,
            None,
        )
        .unwrap();
    }
    for i in (0..n).step_by(97) {
        assert!(s
            .lookup(r, format!("file-{i:08}").as_bytes())
            .unwrap()
            .is_some());
    }
    let mut seen = 0u32;
    let mut cookie = 0;
    let mut resume_points = Vec::new();
    loop {
        let (page, eof) = s.read_dir(r, cookie, 1000).unwrap();
        seen += page.len() as u32;
        if let Some(last) = page.last() {
            cookie = last.cookie;
            resume_points.push(cookie);
        }
        if eof {
            break;
        }
    }
    assert_eq!(seen, n);
    // Resuming from a cookie in the middle continues right after it.
    let mid = resume_points[resume_points.len() / 2];
    let (page, _) = s.read_dir(r, mid, 10).unwrap();
    assert!(page.iter().all(|e| e.cookie > mid));
    assert_eq!(page.len(), 10);
}

#[test]
fn stale_copy_records_widen_advance_by_seq_and_travel_with_the_inode() {
    let dir = tempfile::tempdir().unwrap();
    let s = Store::open(&dir.path().join("m.sqlite")).unwrap();
    let mut d = descriptor(3);
    d.replicas = 2;
    s.format(&d, 0, 1).unwrap();
    let f = s
        .create_inode(ROOT_ID, &attr(FileKind::File), None, 5, None, None)
        .unwrap();
    let h = f.handle();
    assert!(f.stale.is_empty());
    // Block 0 is the inode, not a data block; server 3 does not exist.
    assert_eq!(s.mark_stale(h, 1, 0).unwrap_err().code, ErrorCode::Invalid);
    assert_eq!(s.mark_stale(h, 3, 1).unwrap_err().code, ErrorCode::Invalid);
    let i = s.mark_stale(h, 1, 9).unwrap();
    assert_eq!(i.stale.len(), 1);
    let first = i.stale[0];
    assert_eq!((first.server, first.from), (1, 9));
    // Widening keeps the lowest block and changes seq.
    let i = s.mark_stale(h, 1, 12).unwrap();
    assert_eq!(i.stale[0].from, 9);
    assert!(i.stale[0].seq > first.seq);
    let i = s.mark_stale(h, 1, 4).unwrap();
    let rec = i.stale[0];
    assert_eq!(rec.from, 4);
    assert_eq!(s.get_inode(h.id).unwrap().unwrap().stale, vec![rec]);
    assert_eq!(s.scan_inodes(0, 10).unwrap()[0].stale, vec![rec]);
    assert_eq!(s.stale_counts().unwrap(), vec![(1, 1)]);
    // A resync that copied under an older record cannot move it.
    let e = s.resync_advance(h.id, 1, first.seq, None).unwrap_err();
    assert_eq!(e.code, ErrorCode::Stale);
    s.resync_advance(h.id, 1, rec.seq, Some(20)).unwrap();
    assert_eq!(s.get_inode(h.id).unwrap().unwrap().stale[0].from, 20);
    let listed = s.scan_stale(1, 0, 10).unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].0, h.id);
    assert_eq!(listed[0].2.as_ref().map(|i| i.id), Some(h.id));
    assert!(s.scan_stale(2, 0, 10).unwrap().is_empty());
    s.resync_advance(h.id, 1, rec.seq, None).unwrap();
    assert!(s.get_inode(h.id).unwrap().unwrap().stale.is_empty());
    assert!(s.stale_counts().unwrap().is_empty());
    // A deleted file's leftover blocks are listed without an inode.
    s.note_leftover(9_999, 2).unwrap();
    let listed = s.scan_stale(2, 0, 10).unwrap();
    assert_eq!((listed[0].0, listed[0].1.from), (9_999, 0));
    assert!(listed[0].2.is_none());
}

#[test]
fn inodes_stored_before_stale_records_existed_still_decode() {
    // The stored layout of an inode: the wire Inode of protocol 2, which had
    // no `stale` field. Records stored then must read back unchanged.
    // (The wire `Attr` of then: no flags, which protocol 25 added.)
    #[derive(serde::Serialize)]
    struct AttrV2 {
        kind: FileKind,
        mode: u32,
        uid: u32,
        gid: u32,
        nlink: u32,
        size: u64,
        atime: Timestamp,
        mtime: Timestamp,
        ctime: Timestamp,
        rdev: u32,
    }
    #[derive(serde::Serialize)]
    struct InodeV2 {
        id: FileId,
        gen: u32,
        parent: FileId,
        attr: AttrV2,
        target: Option<Vec<u8>>,
    }
    let a = attr(FileKind::Symlink);
    let old = InodeV2 {
        id: 42,
        gen: 7,
        parent: 0,
        attr: AttrV2 {
            kind: a.kind,
            mode: a.mode,
            uid: a.uid,
            gid: a.gid,
            nlink: a.nlink,
            size: a.size,
            atime: a.atime,
            mtime: a.mtime,
            ctime: a.ctime,
            rdev: a.rdev,
        },
        target: Some(b"/x".to_vec()),
    };
    let blob = postcard::to_stdvec(&old).unwrap();
    let i = decode_inode(42, &blob).unwrap();
    assert_eq!(
        (i.id, i.gen, i.target.as_deref()),
        (42, 7, Some(&b"/x"[..]))
    );
    assert!(i.stale.is_empty());
    assert_eq!(encode_inode(&i).unwrap(), blob);
}

#[test]
fn an_operation_with_an_id_runs_once() {
    let dir = tempfile::tempdir().unwrap();
    let (s, _) = open_formatted(dir.path());
    let r = root(&s);
    let op = |n| OpKey::new(7, n);
    let f = s
        .create_inode(0, &attr(FileKind::File), None, 3, None, op(1))
        .unwrap();
    // The same create again (a client resending after a lost reply): the
    // same inode, no second one.
    let again = s
        .create_inode(0, &attr(FileKind::File), None, 9, None, op(1))
        .unwrap();
    assert_eq!(again, f);
    assert_eq!(s.inode_count(), 2, "root and one file");
    s.link(r, b"a", f.handle(), FileKind::File, None, op(2))
        .unwrap();
    s.unlink(r, b"a", None, op(3)).unwrap();
    // The link resent after the unlink: answered from its outcome, and
    // the name stays gone (run again, it would come back).
    let (replaced, _) = s
        .link(r, b"a", f.handle(), FileKind::File, None, op(2))
        .unwrap();
    assert_eq!(replaced, None);
    assert!(s.lookup(r, b"a").unwrap().is_none());
    // The unlink resent: its outcome, not NotFound.
    let (gone, _) = s.unlink(r, b"a", None, op(3)).unwrap();
    assert_eq!(gone.map(|e| e.child), Some(f.handle()));
    assert_eq!(s.entry_count(), 0);
    // Another client's op 2 is another operation.
    s.link(r, b"b", f.handle(), FileKind::File, None, OpKey::new(8, 2))
        .unwrap();
    assert!(s.lookup(r, b"b").unwrap().is_some());
    // Failures store nothing: the same id may run when it can.
    let e = s.unlink(r, b"nope", None, op(4)).unwrap_err();
    assert_eq!(e.code, ErrorCode::NotFound);
    s.link(r, b"nope", f.handle(), FileKind::File, None, None)
        .unwrap();
    s.unlink(r, b"nope", None, op(4)).unwrap();
    assert_eq!(s.stored_outcomes().unwrap(), 5);
    // Op 0 asks for no protection.
    assert_eq!(OpKey::new(7, 0), None);
}

#[test]
fn an_orphan_stays_while_a_live_client_has_it_open() {
    let dir = tempfile::tempdir().unwrap();
    let (s, _) = open_formatted(dir.path());
    let r = root(&s);
    let f = s
        .create_inode(0, &attr(FileKind::File), None, 3, None, None)
        .unwrap();
    s.link(r, b"a", f.handle(), FileKind::File, None, None)
        .unwrap();
    s.link(r, b"b", f.handle(), FileKind::File, None, None)
        .unwrap();
    let set = SetAttr {
        nlink: Some(2),
        ..SetAttr::default()
    };
    s.set_attr(f.handle(), &set).unwrap();
    let alive = |c: u64| c == 1;
    // Named: never reaped.
    assert_eq!(s.reap(f.handle(), &alive, None).unwrap(), None);
    s.unlink(r, b"a", None, None).unwrap();
    assert_eq!(s.drop_link(f.handle(), None).unwrap().attr.nlink, 1);
    assert!(s.scan_orphans(0, 10, &alive).unwrap().is_empty());
    s.unlink(r, b"b", None, None).unwrap();
    // Clients 1 (alive) and 2 (dead) have it open.
    s.set_open(f.handle(), 1, true, None).unwrap();
    s.set_open(f.handle(), 2, true, None).unwrap();
    assert_eq!(s.drop_link(f.handle(), None).unwrap().attr.nlink, 0);
    let o = s.scan_orphans(0, 10, &alive).unwrap();
    assert_eq!(o.len(), 1);
    assert!(o[0].open && o[0].inode.id == f.id);
    assert_eq!(s.reap(f.handle(), &alive, None).unwrap(), None);
    assert!(s.get_inode(f.id).unwrap().is_some());
    // Client 1 closes it: only the dead client's record is left.
    s.set_open(f.handle(), 1, false, None).unwrap();
    assert!(!s.scan_orphans(0, 10, &alive).unwrap()[0].open);
    let gone = s.reap(f.handle(), &alive, None).unwrap().unwrap();
    assert_eq!(gone.id, f.id);
    assert!(s.get_inode(f.id).unwrap().is_none());
    assert!(s.scan_orphans(0, 10, &alive).unwrap().is_empty());
    assert_eq!(s.inode_count(), 1);
    // Gone: every request about it is Stale, but forgetting an open is harmless.
    assert_eq!(
        s.reap(f.handle(), &alive, None).unwrap_err().code,
        ErrorCode::Stale
    );
    assert_eq!(
        s.set_open(f.handle(), 1, true, None).unwrap_err().code,
        ErrorCode::Stale
    );
    s.set_open(f.handle(), 1, false, None).unwrap();
    // A directory drops to 0 at once, and must be empty.
    let d = s
        .create_inode(ROOT_ID, &attr(FileKind::Dir), None, 3, None, None)
        .unwrap();
    s.link(d.handle(), b"x", f.handle(), FileKind::File, None, None)
        .unwrap();
    assert_eq!(
        s.drop_link(d.handle(), None).unwrap_err().code,
        ErrorCode::NotEmpty
    );
    s.unlink(d.handle(), b"x", None, None).unwrap();
    assert_eq!(s.drop_link(d.handle(), None).unwrap().attr.nlink, 0);
    assert!(s.reap(d.handle(), &alive, None).unwrap().is_some());
}

#[test]
// Holding the lock across awaits is the point: it plays a long snapshot.
#[allow(clippy::await_holding_lock)]
fn a_caller_waiting_for_the_store_does_not_stop_its_async_worker() {
    let dir = tempfile::tempdir().unwrap();
    let s = Arc::new(Store::open(&dir.path().join("m.sqlite")).unwrap());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    // As a snapshot would: the connection is held a while.
    let held = s.conn();
    rt.block_on(async {
        let waiting = {
            let s = s.clone();
            tokio::spawn(async move { s.scan_data_files(0, 1).unwrap() })
        };
        let other = tokio::spawn(async {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            42
        });
        // The one worker still runs other tasks while a store call waits.
        let got = tokio::time::timeout(std::time::Duration::from_secs(10), other).await;
        assert_eq!(got.expect("the worker was stopped").unwrap(), 42);
        drop(held);
        waiting.await.unwrap();
        // Waiting from a blocking thread, and inside `block_in_place`: no
        // panic either.
        let held = s.conn();
        let a = {
            let s = s.clone();
            tokio::task::spawn_blocking(move || s.scan_data_files(0, 1).unwrap())
        };
        let b = {
            let s = s.clone();
            tokio::spawn(
                async move { tokio::task::block_in_place(|| s.scan_data_files(0, 1).unwrap()) },
            )
        };
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        drop(held);
        a.await.unwrap();
        b.await.unwrap();
    });
}

#[test]
fn access_and_change_times_are_touched_forward_only() {
    let dir = tempfile::tempdir().unwrap();
    let s = Store::open(&dir.path().join("m.sqlite")).unwrap();
    s.format(&descriptor(1), 0, 77).unwrap();
    let f = s
        .create_inode(0, &attr(FileKind::File), None, 1, None, None)
        .unwrap();
    let at = |secs: i64| Timestamp { secs, nanos: 0 };
    let now = |s: &Store| s.get_inode(f.id).unwrap().unwrap().attr;
    let before = now(&s);
    s.touch_ctime(f.handle(), at(before.ctime.secs + 100))
        .unwrap();
    s.touch_atime(f.handle(), at(before.atime.secs + 50))
        .unwrap();
    let a = now(&s);
    assert_eq!(a.ctime, at(before.ctime.secs + 100));
    assert_eq!(a.atime, at(before.atime.secs + 50));
    assert_eq!(
        (a.mtime, a.size, a.mode),
        (before.mtime, before.size, before.mode)
    );
    // Never back.
    s.touch_ctime(f.handle(), at(1)).unwrap();
    s.touch_atime(f.handle(), at(1)).unwrap();
    assert_eq!(now(&s), a);
    // A stale handle is refused.
    let stale = Handle {
        id: f.id,
        gen: f.gen.wrapping_add(1),
    };
    assert_eq!(
        s.touch_ctime(stale, at(i64::MAX)).unwrap_err().code,
        ErrorCode::Stale
    );
}

/// A file's measure: kept and read back from disk, forgotten when it is
/// what a file written whole takes or when the file is emptied, and never
/// given to a directory.
#[test]
fn a_measure_is_stored_and_forgotten_when_no_longer_needed() {
    let dir = tempfile::tempdir().unwrap();
    let (s, _) = open_formatted(dir.path());
    let r = root(&s);
    let f = s
        .create_inode(0, &attr(FileKind::File), None, 3, None, None)
        .unwrap();
    let set = |size: Option<u64>, alloc: Option<u64>| SetAttr {
        size,
        alloc,
        ..SetAttr::default()
    };
    let n = s
        .set_attr(f.handle(), &set(Some(1 << 30), Some(0)))
        .unwrap();
    assert_eq!(n.alloc, Some(0));
    assert_eq!(s.get_inode(f.id).unwrap().unwrap().alloc, Some(0));
    // Times alone leave it.
    let n = s.set_attr(f.handle(), &set(None, None)).unwrap();
    assert_eq!(n.alloc, Some(0));
    // Filled in whole: 1 GiB is 1 GiB of blocks.
    let n = s.set_attr(f.handle(), &set(None, Some(1 << 30))).unwrap();
    assert_eq!(n.alloc, None);
    let n = s
        .set_attr(f.handle(), &set(Some(5000), Some(4096)))
        .unwrap();
    assert_eq!(n.alloc, Some(4096));
    let n = s.set_attr(f.handle(), &set(Some(0), None)).unwrap();
    assert_eq!(n.alloc, None);
    assert_eq!(s.get_inode(f.id).unwrap().unwrap().alloc, None);
    let n = s.set_attr(r, &set(None, Some(7))).unwrap();
    assert_eq!(n.alloc, None);
}

//! The cached-object state in the store: bind, placeholders (fill, seed),
//! inodes made from seeds, revalidation (home_changed, refresh_dir), units.

use morris_proto::home::{cache_id, Binding, CacheMode, HomeLink, HomeStamp};

use super::tests::{attr, descriptor, root};
use super::*;

fn stamp(size: u64, secs: i64) -> HomeStamp {
    HomeStamp {
        kind: FileKind::File,
        size,
        mtime: Timestamp { secs, nanos: 0 },
        ctime: Timestamp { secs, nanos: 0 },
    }
}

fn link(binding: FileId, handle: &[u8], fileid: u64) -> HomeLink {
    HomeLink {
        binding,
        handle: handle.to_vec(),
        fileid,
        seen: stamp(5, 100),
        checked_ms: 0,
        version: 1,
        listed: false,
        bound: None,
    }
}

fn seed(binding: FileId, name: &str, fileid: u64, handle: &[u8]) -> Seed {
    let mut a = attr(FileKind::File);
    a.nlink = 1;
    a.size = 5;
    Seed {
        name: name.as_bytes().to_vec(),
        inode: Inode {
            id: cache_id(binding, 0, fileid),
            gen: 1,
            parent: 0,
            attr: a,
            target: None,
            stale: Vec::new(),
            alloc: None,
            home: Some(Box::new(link(binding, handle, fileid))),
        },
    }
}

fn bound_root(s: &Store) -> Handle {
    let r = root(s);
    let mut l = link(r.id, b"root", 2);
    l.bound = Some(Binding {
        url: "file:///x".into(),
        mode: CacheMode::Ro,
        validity_ms: 1000,
        timeout_ms: 1000,
        max_bytes: 0,
        sync_lag_ms: 15_000,
        on_disconnect: morris_proto::home::OnDisconnect::Local,
        on_conflict: morris_proto::home::OnConflict::Home,
    });
    let ino = s.bind(r, &l).unwrap();
    assert_eq!(ino.home.as_deref(), Some(&l));
    r
}

fn store() -> (tempfile::TempDir, Store) {
    let dir = tempfile::tempdir().unwrap();
    let s = Store::open(&dir.path().join("m.sqlite")).unwrap();
    s.format(&descriptor(1), 0, 7).unwrap();
    (dir, s)
}

#[test]
fn only_an_empty_directory_that_is_not_cached_can_be_bound() {
    let (_d, s) = store();
    let r = root(&s);
    s.create_inode(ROOT_ID, &attr(FileKind::File), None, 1, None, None)
        .map(|i| {
            s.link(r, b"f", i.handle(), FileKind::File, None, None)
                .unwrap()
        })
        .unwrap();
    let mut l = link(r.id, b"root", 2);
    l.bound = Some(Binding {
        url: "file:///x".into(),
        mode: CacheMode::Ro,
        validity_ms: 1,
        timeout_ms: 1,
        max_bytes: 0,
        sync_lag_ms: 15_000,
        on_disconnect: morris_proto::home::OnDisconnect::Local,
        on_conflict: morris_proto::home::OnConflict::Home,
    });
    assert_eq!(s.bind(r, &l).unwrap_err().code, ErrorCode::NotEmpty);
    s.unlink(r, b"f", None, None).unwrap();
    s.bind(r, &l).unwrap();
    assert_eq!(s.bind(r, &l).unwrap_err().code, ErrorCode::Exists);
    // The link comes back with the inode, from a fresh open too.
    assert!(s.get_inode(ROOT_ID).unwrap().unwrap().home.is_some());
}

#[test]
fn placeholders_become_inodes_once_and_survive_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.sqlite");
    let r;
    let a = seed(ROOT_ID, "a", 10, b"ha");
    {
        let s = Store::open(&path).unwrap();
        s.format(&descriptor(1), 0, 7).unwrap();
        r = bound_root(&s);
        let b = seed(ROOT_ID, "b", 11, b"hb");
        assert_eq!(s.fill(r, &[a.clone(), b.clone()], false).unwrap(), 2);
        // Again: names present are left as they are.
        assert_eq!(s.fill(r, std::slice::from_ref(&a), true).unwrap(), 0);
        assert!(s.get_inode(ROOT_ID).unwrap().unwrap().home.unwrap().listed);
        // An entry, a seed, no inode yet.
        let e = s.lookup(r, b"a").unwrap().unwrap();
        assert_eq!(e.child, a.inode.handle());
        assert!(s.get_inode(a.inode.id).unwrap().is_none());
        assert_eq!(s.seed(r, b"a").unwrap().unwrap(), a.inode);
        assert!(s.seed(r, b"zz").unwrap().is_none());
    }
    let s = Store::open(&path).unwrap();
    let made = s.create_cached(&a.inode).unwrap();
    assert_eq!(made, a.inode);
    // Idempotent: a second client racing the first gets the same inode.
    assert_eq!(s.create_cached(&a.inode).unwrap(), made);
    // Another home object on that id (home reused the number): replaced,
    // with the next generation, so old handles are stale.
    let mut other = a.inode.clone();
    other.home.as_mut().unwrap().handle = b"new".to_vec();
    other.gen = 77;
    let replaced = s.create_cached(&other).unwrap();
    assert_eq!(replaced.gen, 77);
    assert_eq!(
        s.get_handle(a.inode.handle()).unwrap_err().code,
        ErrorCode::Stale
    );
    // A seed without a link, or an ordinary id, is refused.
    let mut plain = a.inode.clone();
    plain.home = None;
    assert_eq!(
        s.create_cached(&plain).unwrap_err().code,
        ErrorCode::Invalid
    );
    let mut low = a.inode.clone();
    low.id = 5;
    assert_eq!(s.create_cached(&low).unwrap_err().code, ErrorCode::Invalid);
    let _ = r;
}

#[test]
fn a_change_at_home_raises_the_version_and_a_refresh_follows_home() {
    let (_d, s) = store();
    let r = bound_root(&s);
    let a = seed(ROOT_ID, "a", 10, b"ha");
    let b = seed(ROOT_ID, "b", 11, b"hb");
    s.fill(r, &[a.clone(), b.clone()], true).unwrap();
    let ino = s.create_cached(&a.inode).unwrap();
    let mut now = ino.attr.clone();
    now.size = 9;
    now.mode = 0o600;
    let changed = s
        .home_changed(ino.handle(), &now, stamp(9, 200), None)
        .unwrap();
    let l = changed.home.as_deref().unwrap();
    assert_eq!((l.version, l.seen.size), (2, 9));
    assert_eq!((changed.attr.size, changed.attr.mode), (9, 0o600));
    assert_eq!(s.get_inode(ino.id).unwrap().unwrap(), changed);
    // Home now has a (same object), c (new), and b's name names another object.
    let c = seed(ROOT_ID, "c", 12, b"hc");
    let b2 = seed(ROOT_ID, "b", 13, b"hb2");
    let dir_attr = s.get_inode(ROOT_ID).unwrap().unwrap().attr;
    let (d, what) = s
        .refresh_dir(
            r,
            &[a.clone(), b2.clone(), c.clone()],
            stamp(0, 300),
            &dir_attr,
        )
        .unwrap();
    assert_eq!((what.added, what.removed, what.replaced), (1, 0, 1));
    assert_eq!(d.home.unwrap().version, 2);
    assert_eq!(s.lookup(r, b"b").unwrap().unwrap().child, b2.inode.handle());
    assert_eq!(s.seed(r, b"b").unwrap().unwrap(), b2.inode);
    let (_, what) = s
        .refresh_dir(r, std::slice::from_ref(&c), stamp(0, 400), &dir_attr)
        .unwrap();
    assert_eq!((what.added, what.removed, what.replaced), (0, 2, 0));
    assert!(s.lookup(r, b"a").unwrap().is_none());
    assert!(s.seed(r, b"a").unwrap().is_none());
}

#[test]
fn units_are_recorded_per_version_and_coldest_first() {
    let (_d, s) = store();
    assert_eq!(s.put_unit(9, 0, 1, 1, 100, 1).unwrap(), 0);
    assert_eq!(s.put_unit(9, 0, 2, 1, 50, 1).unwrap(), 0);
    std::thread::sleep(std::time::Duration::from_millis(5));
    s.put_unit(9, 1, 1, 1, 10, 1).unwrap();
    assert_eq!(
        s.unit(9, 0, 1).unwrap().unwrap(),
        UnitRec { tag: 1, bytes: 100 }
    );
    s.put_unit(9, 0, 4, u64::MAX, 1, 1).unwrap();
    assert_eq!(
        s.unit(9, 0, 4).unwrap().unwrap().tag,
        u64::MAX,
        "every bit of a tag is kept"
    );
    s.drop_unit(9, 0, 4).unwrap();
    assert!(s.unit(9, 0, 3).unwrap().is_none());
    // A newer version replaces the record and says what it held.
    assert_eq!(s.put_unit(9, 0, 1, 2, 80, 1).unwrap(), 100);
    assert_eq!(s.cached_bytes_of(1).unwrap(), (3, 140));
    std::thread::sleep(std::time::Duration::from_millis(5));
    s.touch_units(&[(9, 0, 2)]).unwrap();
    let cold = s.coldest_units_of(1, 10).unwrap();
    assert_eq!(
        cold.last().map(|u| (u.copy, u.block)),
        Some((0, 2)),
        "{cold:?}"
    );
    // Per binding: another binding's units are neither counted nor listed.
    s.put_unit(12, 0, 1, 1, 1000, 2).unwrap();
    assert_eq!(s.cached_bytes_of(1).unwrap(), (3, 140));
    assert_eq!(s.cached_bytes_of(2).unwrap(), (1, 1000));
    assert_eq!(s.coldest_units_of(1, 10).unwrap().len(), 3);
    assert_eq!(s.coldest_units_of(2, 10).unwrap().len(), 1);
    s.drop_units_of(12).unwrap();
    assert_eq!(s.units_of(9).unwrap().len(), 3);
    s.drop_unit(9, 0, 2).unwrap();
    assert_eq!(s.cached_bytes_of(1).unwrap(), (2, 90));
}

#[test]
fn a_binding_is_purged_whole_and_then_unbound() {
    let (_d, s) = store();
    let r = bound_root(&s);
    let a = seed(ROOT_ID, "a", 10, b"ha");
    let mut sub = seed(ROOT_ID, "sub", 11, b"hs");
    sub.inode.attr.kind = FileKind::Dir;
    sub.inode.parent = ROOT_ID;
    s.fill(r, &[a.clone(), sub.clone()], true).unwrap();
    s.create_cached(&a.inode).unwrap();
    let d = s.create_cached(&sub.inode).unwrap();
    s.fill(d.handle(), &[seed(ROOT_ID, "inner", 12, b"hi")], true)
        .unwrap();
    // Another binding's object stays.
    let other = seed(999, "x", 13, b"hx");
    s.create_cached(&other.inode).unwrap();
    assert_eq!(s.unbind(r).unwrap_err().code, ErrorCode::NotEmpty);
    // A fetched name removed in the cache: a departed name and a mark.
    s.unlink(d.handle(), b"inner", None, None).unwrap();
    assert_eq!(s.wb_gone(ROOT_ID).unwrap().len(), 1);
    assert!(!s.wb_marks(ROOT_ID, u64::MAX).unwrap().is_empty());
    assert_eq!(s.purge_binding(ROOT_ID).unwrap(), (2, 2));
    assert!(s.wb_gone(ROOT_ID).unwrap().is_empty());
    assert!(s.wb_marks(ROOT_ID, u64::MAX).unwrap().is_empty());
    assert!(s.get_inode(a.inode.id).unwrap().is_none());
    assert!(s.get_inode(other.inode.id).unwrap().is_some());
    let plain = s.unbind(r).unwrap();
    assert!(plain.home.is_none());
    assert_eq!((plain.attr.size, plain.attr.nlink), (0, 2));
    assert!(s.get_inode(ROOT_ID).unwrap().unwrap().home.is_none());
}

#[test]
fn a_listing_under_way_sees_every_name_filled_after_it_began() {
    // Hashed cookies would put some later names before the listing's
    // position: it would miss them.
    let (_d, s) = store();
    let r = bound_root(&s);
    let names = |from: u64, n: u64| -> Vec<Seed> {
        (from..from + n)
            .map(|i| {
                seed(
                    r.id,
                    &format!("n{}", (i * 7919) % 1000),
                    i + 10,
                    &i.to_le_bytes(),
                )
            })
            .collect()
    };
    assert_eq!(s.fill(r, &names(0, 300), false).unwrap(), 300);
    let first = s.read_dir_page(r, 0, 200).unwrap();
    assert_eq!(
        (first.entries.len(), first.eof, first.unlisted),
        (200, false, true)
    );
    let at = first.entries.last().unwrap().cookie;
    assert_eq!(s.fill(r, &names(300, 700), true).unwrap(), 700);
    let mut seen: Vec<Vec<u8>> = first.entries.into_iter().map(|e| e.name).collect();
    let mut cookie = at;
    loop {
        let p = s.read_dir_page(r, cookie, 128).unwrap();
        assert!(!p.unlisted, "listed whole by the last fill");
        if let Some(e) = p.entries.last() {
            cookie = e.cookie;
        }
        seen.extend(p.entries.into_iter().map(|e| e.name));
        if p.eof {
            break;
        }
    }
    assert_eq!(seen.len(), 1000);
    seen.sort();
    seen.dedup();
    assert_eq!(seen.len(), 1000, "no name twice");
    // A name filled again (home listed twice) keeps its place.
    assert_eq!(s.fill(r, &names(0, 10), true).unwrap(), 0);
}

#[test]
fn seeds_are_read_a_block_of_cookies_at_a_time_and_made_many_at_once() {
    use morris_proto::messages::SEED_BLOCK;
    let (_d, s) = store();
    let r = bound_root(&s);
    let n = SEED_BLOCK + 100;
    let seeds: Vec<Seed> = (0..n)
        .map(|i| seed(r.id, &format!("f{i}"), i + 10, &i.to_le_bytes()))
        .collect();
    assert_eq!(s.fill(r, &seeds, false).unwrap() as u64, n);
    let page = s.read_dir_page(r, 0, u32::MAX).unwrap();
    let cookie_of = |name: &str| {
        page.entries
            .iter()
            .find(|e| e.name == name.as_bytes())
            .map(|e| e.cookie)
            .unwrap()
    };
    // Every seed of the block holding a name's cookie, in cookie order,
    // that name's among them; the blocks cover each name once.
    let mut seen = Vec::new();
    let mut blocks = std::collections::BTreeSet::new();
    for e in &page.entries {
        let from = e.cookie - e.cookie % SEED_BLOCK;
        if blocks.insert(from) {
            let got = s.seeds_between(r, from, from + SEED_BLOCK).unwrap();
            assert!(got.len() as u64 <= SEED_BLOCK);
            seen.extend(got.into_iter().map(|i| i.id));
        }
    }
    let mut want: Vec<FileId> = seeds.iter().map(|x| x.inode.id).collect();
    seen.sort_unstable();
    want.sort_unstable();
    assert_eq!(seen, want);
    let c = cookie_of("f7");
    let from = c - c % SEED_BLOCK;
    let block = s.seeds_between(r, from, from + SEED_BLOCK).unwrap();
    assert!(block.contains(&seeds[7].inode));
    // Made many at once: those with no inode only, and again nothing.
    let one = s.create_cached(&seeds[0].inode).unwrap();
    let all: Vec<Inode> = seeds.iter().map(|x| x.inode.clone()).collect();
    assert_eq!(s.create_cached_many(&all).unwrap(), n - 1);
    assert_eq!(s.create_cached_many(&all).unwrap(), 0);
    assert_eq!(s.get_inode(one.id).unwrap().unwrap(), one);
    assert_eq!(s.get_inode(all[9].id).unwrap().unwrap().attr, all[9].attr);
    // An ordinary id is refused, and nothing of the request is made.
    let mut low = seed(r.id, "low", 99_999, b"x").inode;
    low.id = 5;
    let fresh = seed(r.id, "fresh", 88_888, b"y").inode;
    assert_eq!(
        s.create_cached_many(&[fresh.clone(), low])
            .unwrap_err()
            .code,
        ErrorCode::Invalid
    );
    assert!(s.get_inode(fresh.id).unwrap().is_none());
    // Not a cached directory: no seeds.
    let plain = s
        .create_inode(ROOT_ID, &attr(FileKind::Dir), None, 1, None, None)
        .unwrap();
    assert!(s
        .seeds_between(plain.handle(), 0, u64::MAX)
        .unwrap()
        .is_empty());
}

/// A link stored by the code before bindings had a sync lag (record
/// format 1) still reads, with the default lag.
#[test]
fn a_format_1_link_reads_with_the_default_sync_lag() {
    #[derive(serde::Serialize)]
    struct BindingV1 {
        url: String,
        mode: CacheMode,
        validity_ms: u64,
        timeout_ms: u64,
        max_bytes: u64,
    }
    #[derive(serde::Serialize)]
    struct LinkV1 {
        binding: FileId,
        handle: Vec<u8>,
        fileid: u64,
        seen: morris_proto::home::HomeStamp,
        checked_ms: u64,
        version: u32,
        listed: bool,
        bound: Option<BindingV1>,
    }
    let l = link(1, b"root", 2);
    let old = LinkV1 {
        binding: l.binding,
        handle: l.handle.clone(),
        fileid: l.fileid,
        seen: l.seen,
        checked_ms: l.checked_ms,
        version: l.version,
        listed: l.listed,
        bound: Some(BindingV1 {
            url: "file:///x".into(),
            mode: CacheMode::Ro,
            validity_ms: 7,
            timeout_ms: 8,
            max_bytes: 9,
        }),
    };
    let mut bytes = vec![1u8];
    bytes.extend(postcard::to_stdvec(&old).unwrap());
    let got = super::cached::decode_link(&bytes).unwrap();
    let b = got.bound.clone().unwrap();
    assert_eq!((b.validity_ms, b.timeout_ms, b.max_bytes), (7, 8, 9));
    assert_eq!(b.sync_lag_ms, morris_proto::home::DEFAULT_SYNC_LAG_MS);
    assert_eq!(got.handle, l.handle);
    // Unknown formats are refused, not misread.
    bytes[0] = 9;
    assert!(super::cached::decode_link(&bytes).is_err());
}

#[test]
fn changes_under_a_binding_leave_marks_cleared_only_when_unchanged() {
    let (_d, s) = store();
    let r = bound_root(&s);
    let f = s
        .create_inode(ROOT_ID, &attr(FileKind::File), None, 1, Some(r.id), None)
        .unwrap();
    assert!(f.home.as_ref().unwrap().is_local());
    s.link(r, b"f", f.handle(), FileKind::File, None, None)
        .unwrap();
    let marks = s.wb_marks(r.id, u64::MAX).unwrap();
    // Marks set after a time are not due before it.
    assert!(s.wb_marks(r.id, 0).unwrap().is_empty());
    assert_eq!(s.wb_queue(r.id).unwrap().objects, 2);
    let root_mark = marks.iter().find(|m| m.id == r.id).unwrap().clone();
    assert!(root_mark.names);
    let file_mark = marks.iter().find(|m| m.id == f.id).unwrap().clone();
    assert!(file_mark.attrs && !file_mark.data);
    // Written: the file's mark gains data, its count goes up.
    let set = morris_proto::SetAttr {
        size: Some(10),
        mtime: Some(morris_proto::Timestamp::now()),
        ..Default::default()
    };
    s.set_attr(f.handle(), &set).unwrap();
    let now = s.wb_marks(r.id, u64::MAX).unwrap();
    let fm = now.iter().find(|m| m.id == f.id).unwrap();
    assert!(fm.data && fm.count > file_mark.count);
    // Its size counts as queued data.
    assert_eq!(s.wb_queue(r.id).unwrap().dirty_bytes, 10);
    // A clear with the count read before the write keeps the mark.
    assert_eq!(
        s.wb_clear(&[(f.id, file_mark.count), (r.id, root_mark.count)])
            .unwrap(),
        1
    );
    let left = s.wb_marks(r.id, u64::MAX).unwrap();
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].id, f.id);
    // Removing the object drops its mark and its place at home.
    s.wb_set_home(
        r.id,
        &morris_proto::WbHome {
            id: f.id,
            dir: r.id,
            name: b"f".to_vec(),
            fileid: 5,
            handle: vec![1],
        },
        None,
    )
    .unwrap();
    assert_eq!(s.wb_homes(r.id).unwrap().len(), 1);
    s.unlink(r, b"f", None, None).unwrap();
    s.delete_inode(f.handle(), None).unwrap();
    assert!(s.wb_homes(r.id).unwrap().is_empty());
    // ... its place at home is kept as a departed name.
    let gone = s.wb_gone(r.id).unwrap();
    assert_eq!(gone.len(), 1);
    assert_eq!((gone[0].id, gone[0].dir, gone[0].fileid), (f.id, r.id, 5));
    assert_eq!(gone[0].name, b"f".to_vec());
    s.wb_gone_clear(&[(r.id, b"f".to_vec(), f.id)]).unwrap();
    assert!(s.wb_gone(r.id).unwrap().is_empty());
    let left = s.wb_marks(r.id, u64::MAX).unwrap();
    assert_eq!(left.len(), 1, "only the root's names mark: {left:?}");
    assert_eq!(left[0].id, r.id);
}

#[test]
fn a_fetched_name_removed_or_replaced_in_the_cache_is_recorded_as_departed() {
    let (_d, s) = store();
    let r = bound_root(&s);
    let a = seed(ROOT_ID, "a", 10, b"ha");
    let b = seed(ROOT_ID, "b", 11, b"hb");
    s.fill(r, &[a.clone(), b.clone()], true).unwrap();
    // `a` removed; `b` replaced by a file made in the cache.
    s.unlink(r, b"a", None, None).unwrap();
    let f = s
        .create_inode(ROOT_ID, &attr(FileKind::File), None, 1, Some(r.id), None)
        .unwrap();
    s.link(r, b"f", f.handle(), FileKind::File, None, None)
        .unwrap();
    s.rename(r, b"f", b"b", Some(b.inode.id), None).unwrap();
    let mut gone = s.wb_gone(r.id).unwrap();
    gone.sort_by(|x, y| x.name.cmp(&y.name));
    let got: Vec<(Vec<u8>, FileId, u64)> = gone
        .iter()
        .map(|g| (g.name.clone(), g.id, g.fileid))
        .collect();
    assert_eq!(
        got,
        vec![
            (b"a".to_vec(), a.inode.id, 10),
            (b"b".to_vec(), b.inode.id, 11)
        ]
    );
    // A listing from home keeps the object made in the cache while the
    // directory's change is not pushed, and after.
    let dir_attr = s.get_inode(ROOT_ID).unwrap().unwrap().attr;
    let (_, what) = s
        .refresh_dir(r, &[a.clone(), b.clone()], stamp(0, 500), &dir_attr)
        .unwrap();
    assert_eq!((what.added, what.removed), (0, 0), "marked: left as it is");
    let marks: Vec<(FileId, u64)> = s
        .wb_marks(r.id, u64::MAX)
        .unwrap()
        .iter()
        .map(|m| (m.id, m.count))
        .collect();
    s.wb_clear(&marks).unwrap();
    let (_, what) = s
        .refresh_dir(r, &[a.clone(), b.clone()], stamp(0, 600), &dir_attr)
        .unwrap();
    assert_eq!(what.added, 1, "home still has a: it comes back");
    assert_eq!(s.lookup(r, b"b").unwrap().unwrap().child, f.handle());
}

#[test]
fn a_conflict_makes_the_object_homes_version_only_if_unchanged_since_read() {
    let (_d, s) = store();
    let r = bound_root(&s);
    let f = s
        .create_inode(ROOT_ID, &attr(FileKind::File), None, 1, Some(r.id), None)
        .unwrap();
    s.link(r, b"f", f.handle(), FileKind::File, None, None)
        .unwrap();
    let count = s
        .wb_marks(r.id, u64::MAX)
        .unwrap()
        .iter()
        .find(|m| m.id == f.id)
        .unwrap()
        .count;
    let place = morris_proto::WbHome {
        id: f.id,
        dir: r.id,
        name: b"f".to_vec(),
        fileid: 42,
        handle: b"hf".to_vec(),
    };
    let mut home_attr = attr(FileKind::File);
    home_attr.size = 77;
    let now = (b"hf".to_vec(), stamp(77, 900), home_attr);
    // Changed in the cache since the push read the mark: refused.
    assert_eq!(
        s.wb_rebase(f.id, Some(count + 1), r.id, Some(&place), Some(&now))
            .unwrap_err()
            .code,
        ErrorCode::Stale
    );
    s.wb_rebase(f.id, Some(count), r.id, Some(&place), Some(&now))
        .unwrap();
    let i = s.get_inode(f.id).unwrap().unwrap();
    let l = i.home.unwrap();
    assert!(!l.is_local());
    assert_eq!((l.fileid, l.seen.size, l.version), (42, 77, 1));
    assert_eq!(i.attr.size, 77);
    assert!(s
        .wb_marks(r.id, u64::MAX)
        .unwrap()
        .iter()
        .all(|m| m.id != f.id));
    assert_eq!(s.wb_homes(r.id).unwrap(), vec![place]);
}

#[test]
fn a_unit_made_local_is_the_caches_until_a_newer_version() {
    let t = local_tag(3, 5);
    assert_eq!(is_own_for(t, 3, 5), Some(true));
    assert_eq!(is_own_for(t, 3, 4), Some(true), "an older read: stale");
    assert_eq!(is_own_for(t, 3, 6), Some(false), "home's again: fetched");
    assert_eq!(is_own_for(t, 4, 5), Some(false), "another object");
    assert_eq!(is_own_for(cached::LOCAL_TAG, 9, 9), Some(true));
    assert_eq!(is_own_for((3u64 << 32) | 5, 3, 5), None);
}

/// A link stored before bindings said what changes do while home is down
/// (record format 2) still reads, with changes made locally.
#[test]
fn a_format_2_link_reads_with_changes_made_locally_while_home_is_down() {
    #[derive(serde::Serialize)]
    struct BindingV2 {
        url: String,
        mode: CacheMode,
        validity_ms: u64,
        timeout_ms: u64,
        max_bytes: u64,
        sync_lag_ms: u64,
    }
    #[derive(serde::Serialize)]
    struct LinkV2 {
        binding: FileId,
        handle: Vec<u8>,
        fileid: u64,
        seen: morris_proto::home::HomeStamp,
        checked_ms: u64,
        version: u32,
        listed: bool,
        bound: Option<BindingV2>,
    }
    let l = link(1, b"root", 2);
    let old = LinkV2 {
        binding: l.binding,
        handle: l.handle.clone(),
        fileid: l.fileid,
        seen: l.seen,
        checked_ms: l.checked_ms,
        version: l.version,
        listed: l.listed,
        bound: Some(BindingV2 {
            url: "file:///x".into(),
            mode: CacheMode::Sw,
            validity_ms: 7,
            timeout_ms: 8,
            max_bytes: 9,
            sync_lag_ms: 10,
        }),
    };
    let mut bytes = vec![2u8];
    bytes.extend(postcard::to_stdvec(&old).unwrap());
    let got = super::cached::decode_link(&bytes).unwrap();
    let b = got.bound.clone().unwrap();
    assert_eq!(b.mode, CacheMode::Sw);
    assert_eq!(
        (b.validity_ms, b.timeout_ms, b.max_bytes, b.sync_lag_ms),
        (7, 8, 9, 10)
    );
    assert_eq!(b.on_disconnect, morris_proto::home::OnDisconnect::Local);
    assert_eq!(got.handle, l.handle);
}

/// A link stored before bindings said whose version wins a conflict
/// (record format 3) still reads, keeping its setting for a disconnected
/// home, with home's version winning.
#[test]
fn a_format_3_link_reads_with_homes_version_winning_conflicts() {
    use morris_proto::home::{OnConflict, OnDisconnect};
    #[derive(serde::Serialize)]
    struct BindingV3 {
        url: String,
        mode: CacheMode,
        validity_ms: u64,
        timeout_ms: u64,
        max_bytes: u64,
        sync_lag_ms: u64,
        on_disconnect: OnDisconnect,
    }
    #[derive(serde::Serialize)]
    struct LinkV3 {
        binding: FileId,
        handle: Vec<u8>,
        fileid: u64,
        seen: morris_proto::home::HomeStamp,
        checked_ms: u64,
        version: u32,
        listed: bool,
        bound: Option<BindingV3>,
    }
    let l = link(1, b"root", 2);
    let old = LinkV3 {
        binding: l.binding,
        handle: l.handle.clone(),
        fileid: l.fileid,
        seen: l.seen,
        checked_ms: l.checked_ms,
        version: l.version,
        listed: l.listed,
        bound: Some(BindingV3 {
            url: "file:///x".into(),
            mode: CacheMode::Iw,
            validity_ms: 7,
            timeout_ms: 8,
            max_bytes: 9,
            sync_lag_ms: 10,
            on_disconnect: OnDisconnect::Block,
        }),
    };
    let mut bytes = vec![3u8];
    bytes.extend(postcard::to_stdvec(&old).unwrap());
    let got = super::cached::decode_link(&bytes).unwrap();
    let b = got.bound.clone().unwrap();
    assert_eq!(b.mode, CacheMode::Iw);
    assert_eq!(b.sync_lag_ms, 10);
    assert_eq!(b.on_disconnect, OnDisconnect::Block);
    assert_eq!(b.on_conflict, OnConflict::Home);
    assert_eq!(got.handle, l.handle);
    assert_eq!(got.version, l.version);
}

#[test]
fn seeds_a_format_5_store_kept_by_name_are_found_after_the_upgrade() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.sqlite");
    let a = seed(ROOT_ID, "a", 10, b"ha");
    let b = seed(ROOT_ID, "b", 11, b"hb");
    let r;
    {
        let s = Store::open(&path).unwrap();
        s.format(&descriptor(1), 0, 7).unwrap();
        r = bound_root(&s);
        assert_eq!(s.fill(r, &[a.clone(), b.clone()], true).unwrap(), 2);
    }
    // Back to format 5's layout, as that code left it: seeds by name (one
    // of them, "gone", for an entry no longer there).
    {
        let c = Connection::open(&path).unwrap();
        c.execute_batch(
            "CREATE TABLE cache_seeds (
                 dir INTEGER NOT NULL, name BLOB NOT NULL, seed BLOB NOT NULL,
                 PRIMARY KEY (dir, name)) WITHOUT ROWID;
             INSERT INTO cache_seeds (dir, name, seed)
                 SELECT s.dir, e.name, s.seed FROM cache_seeds_at s
                 JOIN entries e ON e.dir = s.dir AND e.cookie = s.cookie;
             INSERT INTO cache_seeds (dir, name, seed)
                 SELECT dir, CAST('gone' AS BLOB), seed FROM cache_seeds LIMIT 1;
             DROP TABLE cache_seeds_at;
             PRAGMA user_version = 5;",
        )
        .unwrap();
    }
    let s = Store::open(&path).unwrap();
    assert_eq!(s.seed(r, b"a").unwrap().unwrap(), a.inode);
    assert_eq!(s.seed(r, b"b").unwrap().unwrap(), b.inode);
    assert!(s.seed(r, b"gone").unwrap().is_none());
    let c = s.conn();
    let left: i64 = c
        .query_row(
            "SELECT count(*) FROM sqlite_master WHERE name = 'cache_seeds'",
            [],
            |x| x.get(0),
        )
        .unwrap();
    assert_eq!(left, 0, "the old table is gone");
    let kept: i64 = c
        .query_row("SELECT count(*) FROM cache_seeds_at", [], |x| x.get(0))
        .unwrap();
    assert_eq!(kept, 2, "the seed of no entry is not kept");
    let v: i64 = c
        .query_row("PRAGMA user_version", [], |x| x.get(0))
        .unwrap();
    assert_eq!(v, STORE_FORMAT);
}

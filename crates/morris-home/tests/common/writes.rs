//! The write side of the conformance suite: every change a write-back
//! queue replays, made through the backend below the fixture's `scratch/`
//! and checked against `lstat`, `read_link` and the bytes of the fixture
//! itself; and the errors a replay tells "already applied" by.

use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;

use bytes::Bytes;
use morris_home::{Home, HomeError, HomeHandle, HomeKind, HomeNew, HomeSetAttr, HomeTime};

use super::{check_attr, ok, read_range, walk, Tree, OWNER};

const T1: HomeTime = HomeTime {
    secs: 1_400_000_000,
    nsecs: 111_222_333,
};
const T2: HomeTime = HomeTime {
    secs: 1_450_000_000,
    nsecs: 444_555_666,
};

fn set_all(mode: u32) -> HomeSetAttr {
    HomeSetAttr {
        mode: Some(mode),
        uid: Some(OWNER.0),
        gid: Some(OWNER.1),
        size: None,
        atime: Some(T1),
        mtime: Some(T2),
    }
}

/// Writes `data` at `offset` in pieces of at most `max_write`, as a
/// write-back does; short writes are written on from where they ended.
async fn write_all(home: &dyn Home, h: &HomeHandle, mut offset: u64, data: &[u8]) {
    let max = home.max_write().max(1) as usize;
    let mut rest = data;
    while !rest.is_empty() {
        let n = rest.len().min(max);
        let took = ok(
            home.write(h, offset, Bytes::copy_from_slice(&rest[..n]))
                .await,
            "write",
        ) as usize;
        assert!(took > 0 && took <= n, "write took {took} of {n}");
        offset += took as u64;
        rest = &rest[took..];
    }
}

/// Runs the write checks; leaves `scratch/` as it found it (empty).
pub async fn check_writes(home: &dyn Home, tree: &Tree) {
    let s = |n: &str| [&tree.scratch[..], b"/", n.as_bytes()].concat();
    let (sh, _) = walk(home, &tree.scratch).await;

    // A file, made with every attribute, written past max_write, committed.
    let (f, fa) = ok(
        home.create(&sh, b"f", &HomeNew::File, &set_all(0o640))
            .await,
        "create f",
    );
    assert_eq!(fa.kind, HomeKind::File);
    check_attr(tree, &s("f"), &fa);
    let m = tree.lstat(&s("f"));
    assert_eq!(m.mode() & 0o7777, 0o640, "created mode");
    assert_eq!((m.uid(), m.gid()), OWNER, "created owner");
    assert_eq!((m.mtime(), m.mtime_nsec() as u32), (T2.secs, T2.nsecs));
    let data: Vec<u8> = (0..home.max_write() as usize * 2 + 12_345)
        .map(|i| (i % 251) as u8)
        .collect();
    write_all(home, &f, 0, &data).await;
    // A hole, then bytes: a sparse tail.
    write_all(home, &f, data.len() as u64 + 100_000, b"tail").await;
    ok(home.commit(&f).await, "commit");
    let on_disk = ok(fs::read(tree.path(&s("f"))), "read f");
    assert_eq!(on_disk.len(), data.len() + 100_000 + 4);
    assert_eq!(&on_disk[..data.len()], &data[..], "written bytes");
    assert!(on_disk[data.len()..data.len() + 100_000]
        .iter()
        .all(|&b| b == 0));
    assert_eq!(&on_disk[data.len() + 100_000..], b"tail");
    let (back, _) = read_range(home, &f, 0, data.len() as u64).await;
    assert_eq!(back, data, "read back through the home");

    // Attributes set afterwards: size down, mode, owner, times.
    let set = HomeSetAttr {
        size: Some(1000),
        ..set_all(0o600)
    };
    let a = ok(home.setattr(&f, &set).await, "setattr f");
    check_attr(tree, &s("f"), &a);
    assert_eq!((a.size, a.mode, a.mtime), (1000, 0o600, T2));
    assert_eq!((a.uid, a.gid), OWNER);
    let a = ok(
        home.setattr(
            &f,
            &HomeSetAttr {
                size: Some(5000),
                ..HomeSetAttr::default()
            },
        )
        .await,
        "extend f",
    );
    assert_eq!(a.size, 5000);
    let on_disk = ok(fs::read(tree.path(&s("f"))), "read f");
    assert_eq!(&on_disk[..1000], &data[..1000]);
    assert!(
        on_disk[1000..].iter().all(|&b| b == 0),
        "extended with zeros"
    );

    // A create over an existing name never replaces it.
    assert_eq!(
        home.create(&sh, b"f", &HomeNew::File, &HomeSetAttr::default())
            .await
            .map(|_| ()),
        Err(HomeError::Exists),
        "create over a file"
    );
    assert_eq!(ok(fs::metadata(tree.path(&s("f"))), "stat f").len(), 5000);

    // A directory, and things in it.
    let (d, da) = ok(
        home.create(&sh, b"d", &HomeNew::Dir, &set_all(0o751)).await,
        "mkdir d",
    );
    assert_eq!(da.kind, HomeKind::Dir);
    check_attr(tree, &s("d"), &da);
    assert_eq!(
        home.create(&sh, b"d", &HomeNew::Dir, &HomeSetAttr::default())
            .await
            .map(|_| ()),
        Err(HomeError::Exists),
        "mkdir over a directory"
    );
    let target = b"../f with a space".to_vec();
    let (l, la) = ok(
        home.create(
            &d,
            b"sym",
            &HomeNew::Symlink(target.clone()),
            &HomeSetAttr {
                uid: Some(OWNER.0),
                gid: Some(OWNER.1),
                ..HomeSetAttr::default()
            },
        )
        .await,
        "symlink",
    );
    assert_eq!(la.kind, HomeKind::Symlink);
    assert_eq!(ok(home.read_link(&l).await, "read_link"), target);
    let fixture = ok(fs::read_link(tree.path(&s("d/sym"))), "readlink");
    assert_eq!(fixture.as_os_str().as_bytes(), &target[..]);
    assert_eq!(
        (tree.lstat(&s("d/sym")).uid(), tree.lstat(&s("d/sym")).gid()),
        OWNER,
        "symlink owner"
    );
    let (_, pa) = ok(
        home.create(&d, b"pipe", &HomeNew::Fifo, &set_all(0o620))
            .await,
        "mkfifo",
    );
    assert_eq!(pa.kind, HomeKind::Fifo);
    check_attr(tree, &s("d/pipe"), &pa);
    let (_, ca) = ok(
        home.create(
            &d,
            b"null",
            &HomeNew::Device(HomeKind::CharDev, (1, 3)),
            &set_all(0o666),
        )
        .await,
        "mknod",
    );
    assert_eq!((ca.kind, ca.rdev), (HomeKind::CharDev, (1, 3)));
    check_attr(tree, &s("d/null"), &ca);

    // A hard link: one object, two names; not over an existing name.
    let (_, ha) = ok(home.link(&f, &d, b"hard").await, "link");
    assert_eq!(ha.nlink, 2);
    assert_eq!(
        tree.lstat(&s("d/hard")).ino(),
        tree.lstat(&s("f")).ino(),
        "link names the same object"
    );
    assert_eq!(
        home.link(&f, &d, b"pipe").await.map(|_| ()),
        Err(HomeError::Exists),
        "link over a name"
    );

    // Removals: the right kind, and a missing name is NotFound (a replay).
    assert_eq!(
        home.rmdir(&sh, b"d").await,
        Err(HomeError::NotEmpty),
        "rmdir of a full directory"
    );
    assert_eq!(
        home.rmdir(&sh, b"f").await,
        Err(HomeError::NotDir),
        "rmdir of a file"
    );
    assert_eq!(
        home.remove(&sh, b"d").await,
        Err(HomeError::IsDir),
        "remove of a directory"
    );
    assert_eq!(
        home.remove(&sh, b"no such").await,
        Err(HomeError::NotFound),
        "remove of a missing name"
    );
    ok(home.remove(&d, b"hard").await, "remove hard");
    assert_eq!(tree.lstat(&s("f")).nlink(), 1);
    assert_eq!(
        home.remove(&d, b"hard").await,
        Err(HomeError::NotFound),
        "remove twice"
    );

    // Renames: into another directory, over a file, a directory over an
    // empty one, never over a full one.
    ok(home.rename(&sh, b"f", &d, b"g").await, "rename f -> d/g");
    assert!(!tree.path(&s("f")).exists() && tree.path(&s("d/g")).exists());
    assert_eq!(
        home.rename(&sh, b"f", &d, b"g").await,
        Err(HomeError::NotFound),
        "rename of a missing name"
    );
    let (_, _) = ok(
        home.create(&d, b"other", &HomeNew::File, &HomeSetAttr::default())
            .await,
        "create other",
    );
    ok(
        home.rename(&d, b"g", &d, b"other").await,
        "rename over a file",
    );
    assert_eq!(
        ok(fs::metadata(tree.path(&s("d/other"))), "stat").len(),
        5000
    );
    let (_, _) = ok(
        home.create(&sh, b"empty", &HomeNew::Dir, &HomeSetAttr::default())
            .await,
        "mkdir empty",
    );
    let (_, _) = ok(
        home.create(&sh, b"full", &HomeNew::Dir, &HomeSetAttr::default())
            .await,
        "mkdir full",
    );
    let (full, _) = walk(home, &s("full")).await;
    let (_, _) = ok(
        home.create(&full, b"x", &HomeNew::File, &HomeSetAttr::default())
            .await,
        "create full/x",
    );
    match home.rename(&sh, b"d", &sh, b"full").await {
        Err(HomeError::NotEmpty) | Err(HomeError::Exists) => {}
        r => panic!("rename of a directory over a full one: {r:?}"),
    }
    ok(
        home.rename(&sh, b"d", &sh, b"empty").await,
        "rename over an empty dir",
    );
    assert!(tree.path(&s("empty/other")).exists());

    // A handle made before a rename: the same object or Stale, never
    // another (as for renames made at home, `check_stale`).
    let (e, _) = walk(home, &s("empty")).await;
    match home.getattr(&d).await {
        Ok(a) => assert_eq!(a.fileid, ok(home.getattr(&e).await, "getattr").fileid),
        Err(HomeError::Stale) => {}
        Err(err) => panic!("getattr through a renamed directory's handle: {err}"),
    }

    // Everything removed again through the home.
    for (dir, name) in [
        (s("empty"), "other"),
        (s("empty"), "sym"),
        (s("empty"), "pipe"),
        (s("empty"), "null"),
        (s("full"), "x"),
    ] {
        let (dh, _) = walk(home, &dir).await;
        ok(
            home.remove(&dh, name.as_bytes()).await,
            format!("remove {name}"),
        );
    }
    ok(home.rmdir(&sh, b"empty").await, "rmdir empty");
    ok(home.rmdir(&sh, b"full").await, "rmdir full");
    assert_eq!(
        home.rmdir(&sh, b"full").await,
        Err(HomeError::NotFound),
        "rmdir twice"
    );
}

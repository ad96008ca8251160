//! The conformance suite every home backend passes.
//!
//! [`build_tree`] lays a fixture tree in a local directory; a test serves it
//! through a backend (directly for `LocalHome`, through nfs-ganesha for
//! `NfsHome`) and runs [`conformance`], which checks what the backend says
//! against `lstat` and `read_dir` of the fixture itself. The suite relies on
//! nothing one backend knows and another does not: it never compares a
//! `fileid` with an inode number or an `fsid` with a device number (the
//! backends' own tests do, where it holds), and where the homes may
//! rightly differ (reading a directory: `IsDir` or `Invalid`; a handle
//! after a rename at home: the same object or `Stale`) it says so.
//!
//! The suite changes the fixture only below `scratch/` (by hand, to make
//! home change behind the backend's back, and through the backend's write
//! side, `writes.rs`), and removes what it made there, so it can run again
//! on the same tree.
#![allow(dead_code)]

use std::collections::{BTreeSet, HashMap};
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::sync::Arc;

use morris_home::{Home, HomeAttr, HomeEntry, HomeError, HomeHandle, HomeKind, HomeTime};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

mod tree;
mod writes;

// Each test binary that includes the suite uses its own part of these.
#[allow(unused_imports)]
pub use tree::{build_tree, FileFix, Tree, ATIME, MANY, MTIME, OWNER};

/// A path for messages.
pub fn show(rel: &[u8]) -> String {
    format!("/{}", String::from_utf8_lossy(rel))
}

fn ok<T, E: std::fmt::Display>(r: Result<T, E>, what: impl std::fmt::Display) -> T {
    match r {
        Ok(v) => v,
        Err(e) => panic!("{what}: {e}"),
    }
}

fn kind_of(m: &fs::Metadata) -> HomeKind {
    use std::os::unix::fs::FileTypeExt;
    let ft = m.file_type();
    if ft.is_file() {
        HomeKind::File
    } else if ft.is_dir() {
        HomeKind::Dir
    } else if ft.is_symlink() {
        HomeKind::Symlink
    } else if ft.is_fifo() {
        HomeKind::Fifo
    } else if ft.is_char_device() {
        HomeKind::CharDev
    } else if ft.is_block_device() {
        HomeKind::BlockDev
    } else {
        HomeKind::Socket
    }
}

/// Checks `a`, what home says of `rel`, against `lstat` of the fixture.
pub fn check_attr(tree: &Tree, rel: &[u8], a: &HomeAttr) {
    let m = tree.lstat(rel);
    let at = show(rel);
    assert_eq!(a.kind, kind_of(&m), "{at}: kind");
    assert_eq!(a.mode, m.mode() & 0o7777, "{at}: mode");
    assert_eq!(u64::from(a.nlink), m.nlink(), "{at}: nlink");
    assert_eq!((a.uid, a.gid), (m.uid(), m.gid()), "{at}: owner");
    assert_eq!(a.size, m.size(), "{at}: size");
    let mtime = HomeTime {
        secs: m.mtime(),
        nsecs: m.mtime_nsec() as u32,
    };
    assert_eq!(a.mtime, mtime, "{at}: mtime");
    assert!(a.ctime.secs > 0, "{at}: no ctime");
    assert!(a.atime.secs > 0, "{at}: no atime");
    if matches!(a.kind, HomeKind::CharDev | HomeKind::BlockDev) {
        let rdev = m.rdev();
        let want = (rustix::fs::major(rdev), rustix::fs::minor(rdev));
        assert_eq!(a.rdev, want, "{at}: rdev");
    }
}

/// `a` and `b` equal but for the access time (which reading moves).
pub fn same_attr(a: &HomeAttr, b: &HomeAttr) -> bool {
    let mut b = b.clone();
    b.atime = a.atime;
    *a == b
}

/// Looks `rel` up from the root, one name at a time.
pub async fn walk(home: &dyn Home, rel: &[u8]) -> (HomeHandle, HomeAttr) {
    let mut cur = ok(home.root().await, "root");
    if rel.is_empty() {
        return cur;
    }
    for name in rel.split(|&c| c == b'/') {
        cur = ok(
            home.lookup(&cur.0, name).await,
            format!(
                "lookup {:?} on the way to {}",
                String::from_utf8_lossy(name),
                show(rel)
            ),
        );
    }
    cur
}

/// The whole listing of `dir` from `cookie`, in pages of `max`.
pub async fn list_from(
    home: &dyn Home,
    dir: &HomeHandle,
    mut cookie: u64,
    mut verifier: [u8; 8],
    max: usize,
    plus: bool,
    at: &str,
) -> Vec<(HomeEntry, [u8; 8])> {
    let mut all = Vec::new();
    for _ in 0..1_000_000 {
        let page = ok(
            home.read_dir(dir, cookie, verifier, max, plus).await,
            format!("read_dir {at} from {cookie}"),
        );
        assert!(
            page.eof || !page.entries.is_empty(),
            "{at}: an empty page that is not the last"
        );
        for e in &page.entries {
            assert!(
                e.name != b"." && e.name != b"..",
                "{at}: the listing has . or .."
            );
            assert_eq!(e.plus.is_some(), plus, "{at}: plus entries, asked {plus}");
        }
        verifier = page.verifier;
        if let Some(last) = page.entries.last() {
            cookie = last.cookie;
        }
        all.extend(page.entries.into_iter().map(|e| (e, verifier)));
        if page.eof {
            return all;
        }
    }
    panic!("{at}: the listing does not end");
}

/// Complete listings of every directory, in small pages, with and without
/// attributes; every cookie resumes; plus entries equal lookups.
async fn check_listings(home: &dyn Home, tree: &Tree) {
    for dir in &tree.dirs {
        let at = show(dir);
        let (dh, _) = walk(home, dir).await;
        let want: BTreeSet<Vec<u8>> = ok(fs::read_dir(tree.path(dir)), &at)
            .map(|e| ok(e, &at).file_name().as_bytes().to_vec())
            .collect();
        let mut looked: HashMap<Vec<u8>, (HomeHandle, HomeAttr)> = HashMap::new();
        for (max, plus) in [(7, false), (7, true), (100, false), (100, true)] {
            let list = list_from(home, &dh, 0, [0; 8], max, plus, &at).await;
            let names: Vec<Vec<u8>> = list.iter().map(|(e, _)| e.name.clone()).collect();
            let set: BTreeSet<Vec<u8>> = names.iter().cloned().collect();
            assert_eq!(set.len(), names.len(), "{at}: a name listed twice");
            assert_eq!(set, want, "{at}: names (pages of {max}, plus {plus})");
            for (e, _) in &list {
                let (h, a) = match looked.get(&e.name) {
                    Some(v) => v.clone(),
                    None => {
                        let v = ok(
                            home.lookup(&dh, &e.name).await,
                            format!("lookup {at}/{}", String::from_utf8_lossy(&e.name)),
                        );
                        looked.insert(e.name.clone(), v.clone());
                        v
                    }
                };
                assert_eq!(e.fileid, a.fileid, "{at}: fileid of a listed entry");
                if let Some((ph, pa)) = &e.plus {
                    assert_eq!(ph, &h, "{at}: plus handle differs from lookup's");
                    assert!(same_attr(pa, &a), "{at}: plus attrs {pa:?} != {a:?}");
                }
            }
            // Every cookie resumes: from a middle one and near the end.
            let n = list.len();
            for k in [n / 2, n.saturating_sub(2), 0] {
                if k >= n {
                    continue;
                }
                let (e, v) = &list[k];
                let rest = list_from(home, &dh, e.cookie, *v, max, plus, &at).await;
                let rest: Vec<&[u8]> = rest.iter().map(|(e, _)| &e.name[..]).collect();
                let tail: Vec<&[u8]> = names[k + 1..].iter().map(|n| &n[..]).collect();
                assert_eq!(rest, tail, "{at}: listing again from entry {k}'s cookie");
            }
        }
    }
}

/// Reads `[offset, offset + len)` of `h`, in reads of at most `max_read`,
/// continuing short reads; returns the bytes and whether the end was seen.
pub async fn read_range(home: &dyn Home, h: &HomeHandle, offset: u64, len: u64) -> (Vec<u8>, bool) {
    let max = u64::from(home.max_read());
    let mut out = Vec::new();
    let mut empty = 0;
    loop {
        let pos = offset + out.len() as u64;
        let want = (len - out.len() as u64).min(max);
        if want == 0 && !out.is_empty() {
            return (out, false);
        }
        let r = ok(
            home.read(h, pos, want as u32).await,
            format!("read {want} at {pos}"),
        );
        assert!(
            r.data.len() as u64 <= want,
            "read {want} at {pos}: got {}",
            r.data.len()
        );
        out.extend_from_slice(&r.data);
        if r.eof {
            return (out, true);
        }
        if want == 0 {
            return (out, false);
        }
        if r.data.is_empty() {
            empty += 1;
            assert!(empty < 3, "read {want} at {pos}: empty reads, no eof");
        }
    }
}

async fn check_reads(home: &Arc<dyn Home>, tree: &Tree) {
    let max = u64::from(home.max_read());
    assert!(max >= 4096, "max_read {max}");
    let mut rng = StdRng::seed_from_u64(0x7265_6164);
    for f in &tree.files {
        let at = show(&f.path);
        let (h, _) = walk(home.as_ref(), &f.path).await;
        for i in 0..200 {
            let offset = match i % 4 {
                0 => rng.gen_range(0..=f.size),
                1 => f.size.saturating_sub(rng.gen_range(0..=4096)),
                2 => rng.gen_range(0..=f.size / max) * max,
                _ => rng.gen_range(0..=f.size.min(8192)),
            };
            let len = match i % 3 {
                0 => rng.gen_range(0..=4096),
                1 => rng.gen_range(0..=2 * max + 3),
                _ => rng.gen_range(1..=max),
            };
            let (data, eof) = read_range(home.as_ref(), &h, offset, len).await;
            let want = f.bytes(offset, len);
            assert!(
                data == want,
                "{at}: {len} bytes at {offset} differ (got {})",
                data.len()
            );
            if offset + len < f.size {
                assert!(!eof, "{at}: eof at {offset}+{len} of {}", f.size);
            }
            if eof {
                assert_eq!(
                    offset + data.len() as u64,
                    f.size.max(offset),
                    "{at}: early eof"
                );
            }
        }
        // One read never returns more than max_read.
        let r = ok(home.read(&h, 0, u32::MAX).await, &at);
        assert!(r.data.len() as u64 <= max, "{at}: read beyond max_read");
        assert!(
            r.data[..] == f.bytes(0, r.data.len() as u64)[..],
            "{at}: read of max"
        );
        // Past the end: nothing, and the end.
        for off in [f.size, f.size + 1, f.size + (10 << 20)] {
            let r = ok(home.read(&h, off, 100).await, &at);
            assert!(
                r.data.is_empty() && r.eof,
                "{at}: read at {off} past the end: {r:?}"
            );
        }
    }
    // Holes read as zeros; the sparse file takes less room than its size.
    let (h, a) = walk(home.as_ref(), &tree.sparse).await;
    assert!(a.used < a.size, "sparse file uses {} of {}", a.used, a.size);
    for off in [
        4096u64,
        1 << 20,
        (40 << 20) - 100,
        (40 << 20) + 4096,
        (64 << 20) - 10,
    ] {
        let (data, _) = read_range(home.as_ref(), &h, off, 1000).await;
        let want = tree.file(&tree.sparse).bytes(off, 1000);
        assert!(data == want, "sparse at {off}");
    }

    // 64 reads at once.
    let f = tree.file(b"three-mib").clone();
    let (h, _) = walk(home.as_ref(), &f.path).await;
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..64 {
        let (home, h, f) = (home.clone(), h.clone(), f.clone());
        let offset = rng.gen_range(0..f.size);
        let len = rng.gen_range(1..=max);
        set.spawn(async move {
            let (data, _) = read_range(home.as_ref(), &h, offset, len).await;
            assert!(
                data == f.bytes(offset, len),
                "concurrent read {len} at {offset}"
            );
        });
    }
    while let Some(r) = set.join_next().await {
        ok(r, "concurrent read");
    }
}

/// Removes `rel` in the fixture (a file, or an empty directory).
fn remove(tree: &Tree, rel: &[u8]) {
    let p = tree.path(rel);
    let r = if fs::symlink_metadata(&p).is_ok_and(|m| m.is_dir()) {
        fs::remove_dir(&p)
    } else {
        fs::remove_file(&p)
    };
    ok(r, p.display());
}

/// Handles of objects removed, replaced or renamed at home.
async fn check_stale(home: &dyn Home, tree: &Tree) {
    let s = |n: &[u8]| [&tree.scratch[..], b"/", n].concat();
    let (sh, _) = walk(home, &tree.scratch).await;

    // A file removed and made again under its name.
    let victim = s(b"victim");
    ok(fs::write(tree.path(&victim), b"first"), "write victim");
    let (old, old_attr) = ok(home.lookup(&sh, b"victim").await, "lookup victim");
    remove(tree, &victim);
    ok(fs::write(tree.path(&victim), b"second!"), "write victim");
    assert_eq!(
        home.getattr(&old).await,
        Err(HomeError::Stale),
        "getattr of a replaced file"
    );
    assert_eq!(
        home.read(&old, 0, 10).await,
        Err(HomeError::Stale),
        "read of a replaced file"
    );
    let (new, new_attr) = ok(home.lookup(&sh, b"victim").await, "lookup new victim");
    assert_ne!(new, old, "a new file has the old file's handle");
    check_attr(tree, &victim, &new_attr);
    let _ = old_attr;
    let r = ok(home.read(&new, 0, 100).await, "read new victim");
    assert_eq!(&r.data[..], b"second!");
    remove(tree, &victim);
    assert_eq!(
        home.getattr(&new).await,
        Err(HomeError::Stale),
        "getattr of a removed file"
    );

    // A directory removed and made again.
    let d = s(b"dir");
    ok(fs::create_dir(tree.path(&d)), "mkdir");
    let (old, _) = ok(home.lookup(&sh, b"dir").await, "lookup dir");
    remove(tree, &d);
    ok(fs::create_dir(tree.path(&d)), "mkdir");
    assert_eq!(
        home.getattr(&old).await,
        Err(HomeError::Stale),
        "getattr of a replaced dir"
    );
    assert_eq!(
        home.read_dir(&old, 0, [0; 8], 10, false).await,
        Err(HomeError::Stale),
        "read_dir of a replaced dir"
    );
    assert_eq!(
        home.lookup(&old, b"x").await,
        Err(HomeError::Stale),
        "lookup in a replaced dir"
    );
    remove(tree, &d);

    // A file renamed at home, and another made under its old name: the old
    // handle names the renamed file (NFS) or nothing (a local home, whose
    // handles hold a path): never the new one.
    let (from, to) = (s(b"mover"), s(b"moved"));
    ok(fs::write(tree.path(&from), b"mover's bytes"), "write mover");
    let (h, a) = ok(home.lookup(&sh, b"mover").await, "lookup mover");
    ok(fs::rename(tree.path(&from), tree.path(&to)), "rename");
    ok(fs::write(tree.path(&from), b"newcomer"), "write newcomer");
    match home.getattr(&h).await {
        Ok(now) => {
            assert_eq!(
                now.fileid, a.fileid,
                "a renamed file's handle names another object"
            );
            let r = ok(
                home.read(&h, 0, 100).await,
                "read through a renamed file's handle",
            );
            assert_eq!(&r.data[..], b"mover's bytes");
            eprintln!("conformance: handles survive a rename at home");
        }
        Err(HomeError::Stale) => {
            assert_eq!(home.read(&h, 0, 100).await, Err(HomeError::Stale));
            eprintln!("conformance: handles do not survive a rename at home (Stale)");
        }
        Err(e) => panic!("getattr through a renamed file's handle: {e}"),
    }
    remove(tree, &from);
    remove(tree, &to);
}

/// Errors every home gives alike.
async fn check_errors(home: &dyn Home, tree: &Tree) {
    let (root, _) = ok(home.root().await, "root");
    assert_eq!(
        home.lookup(&root, b"no such name").await.map(|_| ()),
        Err(HomeError::NotFound)
    );
    let (file, _) = walk(home, b"one").await;
    assert_eq!(
        home.lookup(&file, b"x").await.map(|_| ()),
        Err(HomeError::NotDir)
    );
    assert_eq!(
        home.read_dir(&file, 0, [0; 8], 10, false).await.map(|_| ()),
        Err(HomeError::NotDir)
    );
    // Reading a directory: IsDir (a local home, NFS3ERR_ISDIR) or Invalid
    // (NFS3ERR_INVAL), as the home says.
    let (dir, _) = walk(home, b"a").await;
    match home.read(&dir, 0, 10).await {
        Err(HomeError::IsDir) | Err(HomeError::Invalid(_)) => {}
        r => panic!("read of a directory: {r:?}"),
    }
    match home.read_link(&file).await {
        Err(HomeError::Invalid(_)) => {}
        r => panic!("read_link of a file: {r:?}"),
    }
    let _ = tree;
}

/// Runs the suite: `home` serves the fixture `tree`.
pub async fn conformance(home: Arc<dyn Home>, tree: &Tree) {
    let h = home.as_ref();
    let t0 = std::time::Instant::now();

    let (rh, ra) = ok(h.root().await, "root");
    assert_eq!(ra.kind, HomeKind::Dir);
    check_attr(tree, b"", &ra);
    assert_eq!(ok(h.getattr(&rh).await, "getattr root").kind, HomeKind::Dir);

    // Every object: lookup, getattr, against lstat.
    let mut handles: HashMap<Vec<u8>, HomeHandle> = HashMap::new();
    handles.insert(Vec::new(), rh.clone());
    let mut by_fileid: HashMap<u64, Vec<Vec<u8>>> = HashMap::new();
    by_fileid.entry(ra.fileid).or_default().push(Vec::new());
    for rel in &tree.all {
        let (parent, name) = match rel.iter().rposition(|&c| c == b'/') {
            Some(i) => (&rel[..i], &rel[i + 1..]),
            None => (&b""[..], &rel[..]),
        };
        let ph = handles[parent].clone();
        let (oh, oa) = ok(h.lookup(&ph, name).await, format!("lookup {}", show(rel)));
        check_attr(tree, rel, &oa);
        assert_eq!(oa.fsid, ra.fsid, "{}: fsid", show(rel));
        let ga = ok(h.getattr(&oh).await, format!("getattr {}", show(rel)));
        assert!(
            same_attr(&ga, &oa),
            "{}: getattr {ga:?} != lookup {oa:?}",
            show(rel)
        );
        by_fileid.entry(oa.fileid).or_default().push(rel.clone());
        handles.insert(rel.clone(), oh);
    }
    // One fileid per object: hard links share theirs, nothing else does.
    for (id, paths) in &by_fileid {
        let inos: BTreeSet<u64> = paths.iter().map(|p| tree.lstat(p).ino()).collect();
        assert_eq!(
            inos.len(),
            1,
            "fileid {id} names several objects: {paths:?}"
        );
    }
    let (la, lb) = &tree.hard_links;
    let fa = ok(h.getattr(&handles[la]).await, "hard link");
    let fb = ok(h.getattr(&handles[lb]).await, "hard link");
    assert_eq!(fa.fileid, fb.fileid, "hard links differ in fileid");
    assert_eq!(fa.nlink, 2);
    for rel in &tree.owned {
        let a = ok(h.getattr(&handles[rel]).await, "owned");
        assert_eq!((a.uid, a.gid), OWNER, "{}: owner", show(rel));
    }
    for rel in &tree.timed {
        let a = ok(h.getattr(&handles[rel]).await, "timed");
        let mtime = HomeTime {
            secs: MTIME.0,
            nsecs: MTIME.1,
        };
        assert_eq!(a.mtime, mtime, "{}: mtime", show(rel));
    }
    let dev = ok(h.getattr(&handles[&tree.chardev]).await, "chardev");
    assert_eq!((dev.kind, dev.rdev), (HomeKind::CharDev, (1, 3)));
    let fifo = ok(h.getattr(&handles[&tree.fifo]).await, "fifo");
    assert_eq!(fifo.kind, HomeKind::Fifo);
    eprintln!(
        "conformance: {} objects looked up in {:?}",
        tree.all.len(),
        t0.elapsed()
    );

    // Symlink targets, byte for byte.
    for (rel, target) in &tree.symlinks {
        let got = ok(
            h.read_link(&handles[rel]).await,
            format!("read_link {}", show(rel)),
        );
        assert_eq!(&got, target, "{}: target", show(rel));
        let fixture = ok(fs::read_link(tree.path(rel)), "readlink");
        assert_eq!(got, fixture.as_os_str().as_bytes(), "{}: target", show(rel));
    }

    let t = std::time::Instant::now();
    check_listings(h, tree).await;
    eprintln!("conformance: listings in {:?}", t.elapsed());
    let t = std::time::Instant::now();
    check_reads(&home, tree).await;
    eprintln!("conformance: reads in {:?}", t.elapsed());
    check_errors(h, tree).await;
    check_stale(h, tree).await;
    let t = std::time::Instant::now();
    writes::check_writes(h, tree).await;
    eprintln!("conformance: writes in {:?}", t.elapsed());
    let left: Vec<_> = ok(fs::read_dir(tree.path(&tree.scratch)), "scratch").collect();
    assert!(
        left.is_empty(),
        "the suite left {} entries in scratch",
        left.len()
    );
    eprintln!("conformance: passed in {:?}", t0.elapsed());
}

//! Stores written by earlier morris versions open, and read as they were
//! written; stores of a later format are refused. The fixtures are SQL
//! dumps of real stores (`tests/fixtures/`, each saying how it was made).

use super::*;

/// Loads a dumped store into a database file under `dir`.
fn load(dir: &Path, sql: &str) -> std::path::PathBuf {
    let path = dir.join("meta.sqlite");
    let c = Connection::open(&path).unwrap();
    c.execute_batch(sql).unwrap();
    drop(c);
    path
}

fn child(s: &Store, dir: &Inode, name: &str) -> Inode {
    let e = s
        .lookup(dir.handle(), name.as_bytes())
        .unwrap()
        .unwrap_or_else(|| panic!("no entry {name}"));
    s.get_handle(e.child).unwrap()
}

#[test]
fn a_format_2_store_opens_and_reads_as_it_was_written() {
    let dir = tempfile::tempdir().unwrap();
    let path = load(
        dir.path(),
        include_str!("../../tests/fixtures/store-v2.sql"),
    );
    let s = Store::open(&path).unwrap();
    let f = s.formatted().expect("formatted");
    assert_eq!(
        f.descriptor.uuid.to_string(),
        "8787dead-569b-4e92-aad6-395b4fadfcab"
    );
    assert_eq!(f.descriptor.stripe_unit, 64 << 10);
    assert_eq!((f.descriptor.replicas, f.index), (1, 0));

    let root = s.get_inode(morris_proto::ROOT_ID).unwrap().expect("root");
    assert_eq!(root.attr.kind, FileKind::Dir);
    let d = child(&s, &root, "d");
    assert_eq!((d.attr.kind, d.attr.mode & 0o7777), (FileKind::Dir, 0o755));
    let f = child(&s, &d, "f");
    assert_eq!(f.attr.kind, FileKind::File);
    assert_eq!((f.attr.size, f.attr.nlink), (5, 2));
    // setfacl's mask (rw) shows in the group bits.
    assert_eq!(f.attr.mode & 0o7777, 0o660);
    assert_eq!(f.attr.mtime.secs, 1_577_934_245, "2020-01-02 03:04:05 UTC");
    assert_eq!(child(&s, &d, "g").id, f.id, "a hard link");
    let l = child(&s, &root, "l");
    assert_eq!(l.attr.kind, FileKind::Symlink);
    assert_eq!(l.target.as_deref(), Some(&b"d/f"[..]));
    let p = child(&s, &root, "p");
    assert_eq!((p.attr.kind, p.attr.mode & 0o7777), (FileKind::Fifo, 0o600));
    let (_, xattrs) = s.get_xattrs(f.handle()).unwrap();
    let names: Vec<&[u8]> = xattrs.iter().map(|x| x.name.as_slice()).collect();
    assert!(names.contains(&&b"user.k"[..]), "{names:?}");
    assert!(
        names.contains(&&b"system.posix_acl_access"[..]),
        "{names:?}"
    );
    let listing = s.read_dir_page(root.handle(), 0, 100).unwrap();
    let mut listed: Vec<Vec<u8>> = listing.entries.into_iter().map(|e| e.name).collect();
    listed.sort();
    assert_eq!(listed, vec![b"d".to_vec(), b"l".to_vec(), b"p".to_vec()]);
    // Counted when it became format 5: every inode (the root, d, f, l, p)
    // against its owner and group; the 5-byte file as one 4 KiB page.
    let usage = s.usage().unwrap();
    let inodes: i64 = usage.iter().filter(|r| !r.group).map(|r| r.inodes).sum();
    let bytes: i64 = usage.iter().filter(|r| !r.group).map(|r| r.bytes).sum();
    assert_eq!((inodes, bytes), (5, 4096), "{usage:?}");
    assert_eq!(
        usage
            .iter()
            .filter(|r| r.group)
            .map(|r| r.inodes)
            .sum::<i64>(),
        5
    );

    // Opened once, it is of the current format, and opens again.
    drop(s);
    let c = Connection::open(&path).unwrap();
    let v: i64 = c
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(v, STORE_FORMAT);
    drop(c);
    Store::open(&path).unwrap();
}

#[test]
fn a_store_of_a_later_format_is_refused_and_left_as_it_was() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("meta.sqlite");
    drop(Store::open(&path).unwrap());
    let c = Connection::open(&path).unwrap();
    c.execute_batch(&format!("PRAGMA user_version = {};", STORE_FORMAT + 1))
        .unwrap();
    drop(c);
    match Store::open(&path) {
        Err(e @ StoreError::TooNew { .. }) => {
            assert!(e.to_string().contains("later morris"), "{e}")
        }
        Err(e) => panic!("refused for another reason: {e}"),
        Ok(_) => panic!("a store of a later format opened"),
    }
    let c = Connection::open(&path).unwrap();
    let v: i64 = c
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(v, STORE_FORMAT + 1, "the refused store was changed");
}

#[test]
fn a_format_0_store_gets_the_current_format() {
    // A store from before the format was numbered: the schema of format 2
    // is added around what it has.
    let dir = tempfile::tempdir().unwrap();
    let path = load(
        dir.path(),
        include_str!("../../tests/fixtures/store-v2.sql"),
    );
    let c = Connection::open(&path).unwrap();
    c.execute_batch("DROP TABLE fence_reserve; PRAGMA user_version = 0;")
        .unwrap();
    drop(c);
    let s = Store::open(&path).unwrap();
    assert!(s.formatted().is_some());
    drop(s);
    let c = Connection::open(&path).unwrap();
    let v: i64 = c
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(v, STORE_FORMAT);
    let n: i64 = c
        .query_row(
            "SELECT count(*) FROM sqlite_master WHERE name = 'fence_reserve'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(n, 1, "the missing table was made");
}

//! Tests of metadata mirroring (`replica.rs`).

use super::tests::{attr, descriptor, root};
use super::*;
use rusqlite::types::Value;
use tokio::sync::mpsc::{error::TryRecvError, unbounded_channel, UnboundedReceiver};

const TABLES: [(&str, &str); 5] = [
    ("volume", "one"),
    ("inodes", "id"),
    ("entries", "dir, name"),
    ("stale_copies", "id, server"),
    ("fence_reserve", "one"),
];

type Rows = Vec<Vec<Value>>;

/// A two-server descriptor and the index of the server owning the root.
fn volume() -> (VolumeDescriptor, u32) {
    let d = descriptor(2);
    let own = Layout::new(2, d.stripe_unit, 1).inode_server(ROOT_ID);
    (d, own)
}

fn dump(s: &Store, table: &str, order: &str) -> Rows {
    s.with_reader(|c| {
        let mut st = c
            .prepare(&format!("SELECT * FROM {table} ORDER BY {order}"))
            .unwrap();
        let n = st.column_count();
        st.query_map([], |r| (0..n).map(|i| r.get::<_, Value>(i)).collect())
            .unwrap()
            .collect::<Result<Rows, _>>()
            .unwrap()
    })
}

/// The replicated tables, in `TABLES` order.
fn dump_all(s: &Store) -> Vec<Rows> {
    TABLES.iter().map(|(t, o)| dump(s, t, o)).collect()
}

fn data_files(s: &Store) -> Rows {
    dump(s, "data_files", "id")
}

fn drain(rx: &mut UnboundedReceiver<Captured>) -> Vec<Captured> {
    let mut out = Vec::new();
    while let Ok(c) = rx.try_recv() {
        out.push(c);
    }
    out
}

fn assert_same(copy: &Store, primary: &Store) {
    assert_eq!(dump_all(copy), dump_all(primary));
    assert_eq!(copy.formatted(), primary.formatted());
    assert_eq!(copy.inode_count(), primary.inode_count());
    assert_eq!(copy.entry_count(), primary.entry_count());
    // Not mirrored: the copy's own triggers count what it applied.
    assert_eq!(copy.usage().unwrap(), primary.usage().unwrap());
}

#[test]
fn a_copy_follows_every_change_of_the_replicated_tables() {
    let dir = tempfile::tempdir().unwrap();
    let (d, own) = volume();
    let p = Store::open(&dir.path().join("p.sqlite")).unwrap();
    p.format(&d, own, 7).unwrap();
    p.add_data_file(77).unwrap();
    let (tx, mut rx) = unbounded_channel();
    let base = p.start_capture(tx);
    assert_eq!((base, p.committed_seq()), (0, 0));
    let snap = dir.path().join("snap.sqlite");
    assert_eq!(p.snapshot_to(&snap).unwrap(), base);
    assert_eq!(p.snapshot_to(&snap).unwrap_err().code, ErrorCode::Io);
    let at_snapshot = dump_all(&p);

    let c = Store::open(&dir.path().join("c.sqlite")).unwrap();
    assert!(c.formatted().is_none());
    c.add_data_file(4242).unwrap();
    c.install_snapshot(&snap).unwrap();
    assert_same(&c, &p);
    assert_eq!(data_files(&c), vec![vec![Value::Integer(4242)]]);
    assert_eq!(c.data_file_count(), 1);

    let r = root(&p);
    let sub = p
        .create_inode(ROOT_ID, &attr(FileKind::Dir), None, 1, None, None)
        .unwrap();
    p.link(r, b"sub", sub.handle(), FileKind::Dir, None, None)
        .unwrap();
    let f = p
        .create_inode(0, &attr(FileKind::File), None, 2, None, None)
        .unwrap();
    p.link(sub.handle(), b"f", f.handle(), FileKind::File, None, None)
        .unwrap();
    p.link(r, b"hard", f.handle(), FileKind::File, None, None)
        .unwrap();
    let l = p
        .create_inode(0, &attr(FileKind::Symlink), Some(b"f"), 3, None, None)
        .unwrap();
    p.link(
        sub.handle(),
        b"l",
        l.handle(),
        FileKind::Symlink,
        None,
        None,
    )
    .unwrap();
    p.rename(sub.handle(), b"l", b"l2", None, None).unwrap();
    p.unlink(r, b"hard", Some(f.id), None).unwrap();
    let set = SetAttr {
        size: Some(12_345),
        mode: Some(0o600),
        ..SetAttr::default()
    };
    p.set_attr(f.handle(), &set).unwrap();
    let gone = p
        .create_inode(0, &attr(FileKind::File), None, 4, None, None)
        .unwrap();
    p.delete_inode(gone.handle(), None).unwrap();
    let rec = p.mark_stale(f.handle(), 0, 8).unwrap().stale[0];
    p.mark_stale(f.handle(), 1, 5).unwrap();
    p.resync_advance(f.id, 0, rec.seq, Some(10)).unwrap();
    p.note_leftover(gone.id, 1).unwrap();
    assert!(p.reserve_fence(1_000).unwrap().is_some());
    let seq = p.committed_seq();
    assert!(seq > base);
    // Server-local and failed transactions send nothing.
    p.add_data_file(f.id).unwrap();
    let e = p
        .link(r, b"sub", f.handle(), FileKind::File, None, None)
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::Exists);
    assert_eq!(p.committed_seq(), seq);

    let caps = drain(&mut rx);
    let seqs: Vec<u64> = caps.iter().map(|c| c.seq).collect();
    assert_eq!(seqs, (base + 1..=seq).collect::<Vec<_>>());
    c.sync().unwrap();
    let flushed = c.flushes();
    for cap in &caps {
        c.apply_changeset(&cap.changeset).unwrap();
    }
    // What a copy applied is flushed by its next sync, as its own commits.
    c.sync().unwrap();
    assert_eq!(c.flushes(), flushed + 1);
    let now = dump_all(&p);
    for (i, (table, _)) in TABLES.iter().enumerate() {
        assert_ne!(now[i], at_snapshot[i], "{table} changed after the snapshot");
        assert!(!now[i].is_empty(), "{table} has rows");
    }
    assert_same(&c, &p);
    assert_eq!(data_files(&c), vec![vec![Value::Integer(4242)]]);
    assert_eq!(data_files(&p).len(), 2);
    // Reads on the copy see what the primary has.
    assert_eq!(c.get_inode(f.id).unwrap(), p.get_inode(f.id).unwrap());
    assert_eq!(c.get_inode(f.id).unwrap().unwrap().stale.len(), 2);
    assert_eq!(
        c.lookup(root(&c), b"sub").unwrap(),
        p.lookup(r, b"sub").unwrap()
    );
    assert!(c.get_inode(gone.id).unwrap().is_none());
    // The counts kept by applying match a recount.
    let counts = (c.inode_count(), c.entry_count(), c.data_file_count());
    c.recount().unwrap();
    assert_eq!(
        (c.inode_count(), c.entry_count(), c.data_file_count()),
        counts
    );
    // The copy is durable like any store.
    drop(c);
    let c = Store::open(&dir.path().join("c.sqlite")).unwrap();
    assert_same(&c, &p);
    // A copy that takes over numbers above the primary's fence reservation.
    assert_eq!(c.fence_floor().unwrap(), p.fence_floor().unwrap());
    assert!(c.fence_floor().unwrap() > 1_000);
}

#[test]
fn a_snapshot_from_a_build_without_the_fence_reservation_installs() {
    let dir = tempfile::tempdir().unwrap();
    let (d, own) = volume();
    let p = Store::open(&dir.path().join("p.sqlite")).unwrap();
    p.format(&d, own, 7).unwrap();
    let snap = dir.path().join("snap.sqlite");
    p.snapshot_to(&snap).unwrap();
    rusqlite::Connection::open(&snap)
        .unwrap()
        .execute_batch("DROP TABLE fence_reserve")
        .unwrap();
    let c = Store::open(&dir.path().join("c.sqlite")).unwrap();
    c.reserve_fence(5).unwrap();
    c.install_snapshot(&snap).unwrap();
    assert_same(&c, &p);
    assert_eq!(c.fence_floor().unwrap(), 0);
}

#[test]
fn format_is_captured_and_a_later_snapshot_takes_the_tail() {
    let dir = tempfile::tempdir().unwrap();
    let (d, own) = volume();
    let p = Store::open(&dir.path().join("p.sqlite")).unwrap();
    let (tx, mut rx) = unbounded_channel();
    assert_eq!(p.start_capture(tx), 0);
    assert_eq!(p.format(&d, own, 9).unwrap(), FormatOutcome::Formatted);
    let caps = drain(&mut rx);
    assert_eq!(caps.len(), 1);
    assert_eq!(caps[0].seq, 1);
    let c = Store::open(&dir.path().join("c.sqlite")).unwrap();
    c.apply_changeset(&caps[0].changeset).unwrap();
    assert_same(&c, &p);
    assert_eq!(c.formatted().unwrap().descriptor, d);
    assert_eq!(c.get_inode(ROOT_ID).unwrap().unwrap().gen, 9);
    assert_eq!(
        p.format(&d, own, 9).unwrap(),
        FormatOutcome::AlreadyFormatted
    );
    assert!(drain(&mut rx).is_empty());

    for g in 0..3 {
        p.create_inode(0, &attr(FileKind::File), None, g, None, None)
            .unwrap();
    }
    let snap = dir.path().join("snap.sqlite");
    let s = p.snapshot_to(&snap).unwrap();
    assert_eq!((s, p.committed_seq()), (4, 4));
    let h = p
        .create_inode(0, &attr(FileKind::File), None, 5, None, None)
        .unwrap();
    p.link(root(&p), b"h", h.handle(), FileKind::File, None, None)
        .unwrap();
    let caps = drain(&mut rx);
    assert!(caps.iter().all(|c| c.seq > 1));
    assert_eq!(caps.iter().filter(|c| c.seq > s).count(), 2);

    let c2 = Store::open(&dir.path().join("c2.sqlite")).unwrap();
    c2.install_snapshot(&snap).unwrap();
    assert_eq!(c2.inode_count(), 4);
    // A changeset the snapshot already holds does not apply.
    let old = caps.iter().find(|c| c.seq <= s).unwrap();
    assert!(c2.apply_changeset(&old.changeset).is_err());
    for cap in caps.iter().filter(|c| c.seq > s) {
        c2.apply_changeset(&cap.changeset).unwrap();
    }
    assert_same(&c2, &p);
    for cap in &caps {
        c.apply_changeset(&cap.changeset).unwrap();
    }
    assert_same(&c, &p);
}

#[test]
fn conflicting_changesets_are_refused_whole() {
    let dir = tempfile::tempdir().unwrap();
    let (d, own) = volume();
    let p = Store::open(&dir.path().join("p.sqlite")).unwrap();
    p.format(&d, own, 1).unwrap();
    let (tx, mut rx) = unbounded_channel();
    p.start_capture(tx);
    let snap = dir.path().join("snap.sqlite");
    p.snapshot_to(&snap).unwrap();
    let c = Store::open(&dir.path().join("c.sqlite")).unwrap();
    c.install_snapshot(&snap).unwrap();

    let f = p
        .create_inode(0, &attr(FileKind::File), None, 2, None, None)
        .unwrap();
    let set = SetAttr {
        mode: Some(0o640),
        ..SetAttr::default()
    };
    p.set_attr(f.handle(), &set).unwrap();
    p.link(root(&p), b"x", f.handle(), FileKind::File, None, None)
        .unwrap();
    let caps = drain(&mut rx);
    assert_eq!(caps.len(), 3);
    let (create, setattr, link) = (&caps[0], &caps[1], &caps[2]);

    let unchanged = |c: &Store, before: &(Vec<Rows>, u64, u64)| {
        assert_eq!(&dump_all(c), &before.0);
        assert_eq!((c.inode_count(), c.entry_count()), (before.1, before.2));
    };
    let state = |c: &Store| (dump_all(c), c.inode_count(), c.entry_count());

    // Out of order: the row to update is missing.
    let before = state(&c);
    let e = c.apply_changeset(&setattr.changeset).unwrap_err();
    assert_eq!(e.code, ErrorCode::Io);
    unchanged(&c, &before);
    // Twice: the row to insert exists.
    c.apply_changeset(&create.changeset).unwrap();
    let before = state(&c);
    c.apply_changeset(&create.changeset).unwrap_err();
    unchanged(&c, &before);
    c.apply_changeset(&setattr.changeset).unwrap();
    c.apply_changeset(&setattr.changeset).unwrap_err();
    // Not a changeset at all.
    c.apply_changeset(b"not a changeset").unwrap_err();

    // The link inserts an entry and updates the root; when only the root
    // row differs, the entry is not inserted either.
    let root_data = |c: &Store| -> Vec<u8> {
        c.write
            .lock()
            .query_row(
                "SELECT data FROM inodes WHERE id = ?1",
                params![sql_id(ROOT_ID)],
                |r| r.get(0),
            )
            .unwrap()
    };
    let set_root_data = |c: &Store, data: &[u8]| {
        c.write
            .lock()
            .execute(
                "UPDATE inodes SET data = ?1 WHERE id = ?2",
                params![data, sql_id(ROOT_ID)],
            )
            .unwrap()
    };
    let good = root_data(&c);
    let mut other = p.get_inode(ROOT_ID).unwrap().unwrap();
    other.attr.mode ^= 0o001;
    set_root_data(&c, &super::encode_inode(&other).unwrap());
    let before = state(&c);
    let e = c.apply_changeset(&link.changeset).unwrap_err();
    assert!(e.message.contains("inodes"), "{}", e.message);
    unchanged(&c, &before);
    assert!(c.lookup(root(&c), b"x").unwrap().is_none());
    set_root_data(&c, &good);
    c.apply_changeset(&link.changeset).unwrap();
    assert_same(&c, &p);
}

#[test]
fn capture_stops_and_guards_the_copy_operations() {
    let dir = tempfile::tempdir().unwrap();
    let (d, own) = volume();
    let p = Store::open(&dir.path().join("p.sqlite")).unwrap();
    p.format(&d, own, 1).unwrap();
    let snap = dir.path().join("snap.sqlite");
    p.snapshot_to(&snap).unwrap();
    let (tx, mut rx) = unbounded_channel();
    p.start_capture(tx);
    // A capturing store is a primary: it takes no copy.
    assert!(p.install_snapshot(&snap).is_err());
    let missing = dir.path().join("missing.sqlite");
    let c = Store::open(&dir.path().join("c.sqlite")).unwrap();
    assert_eq!(
        c.install_snapshot(&missing).unwrap_err().code,
        ErrorCode::NotFound
    );
    assert!(!missing.exists());
    p.create_inode(0, &attr(FileKind::File), None, 1, None, None)
        .unwrap();
    let cap = rx.try_recv().unwrap();
    assert!(p.apply_changeset(&cap.changeset).is_err());
    p.stop_capture();
    p.create_inode(0, &attr(FileKind::File), None, 1, None, None)
        .unwrap();
    assert_eq!(rx.try_recv().unwrap_err(), TryRecvError::Disconnected);
    assert_eq!(p.committed_seq(), 1);
    // A new sink continues the numbering.
    let (tx, mut rx) = unbounded_channel();
    assert_eq!(p.start_capture(tx), 1);
    p.create_inode(0, &attr(FileKind::File), None, 1, None, None)
        .unwrap();
    assert_eq!(rx.try_recv().unwrap().seq, 2);
    // A dropped receiver ends capture.
    drop(rx);
    p.create_inode(0, &attr(FileKind::File), None, 1, None, None)
        .unwrap();
    assert!(!p.capture.is_on());
    assert_eq!(p.committed_seq(), 2);
    p.install_snapshot(&snap).unwrap();
    assert_eq!(p.inode_count(), 1);
}

#[test]
fn a_snapshot_taken_in_steps_holds_every_change_made_between_them() {
    let dir = tempfile::tempdir().unwrap();
    let (d, own) = volume();
    let p = Store::open(&dir.path().join("p.sqlite")).unwrap();
    p.format(&d, own, 1).unwrap();
    let r = root(&p);
    // Enough rows for many one-page steps.
    for i in 0..300u32 {
        let f = p
            .create_inode(0, &attr(FileKind::File), None, 1, None, None)
            .unwrap();
        let name = format!("before-{i:04}-{}", "x".repeat(100));
        p.link(r, name.as_bytes(), f.handle(), FileKind::File, None, None)
            .unwrap();
    }
    let (tx, mut rx) = unbounded_channel();
    p.start_capture(tx);
    let snap = dir.path().join("snap.sqlite");
    let mut steps = 0u32;
    let mut made = Vec::new();
    let seq = p
        .snapshot_in_steps(&snap, 1, || {
            steps += 1;
            // Between steps: new names, and a change to a row (the root's
            // cookie counter) whose page was copied already.
            if steps.is_multiple_of(4) {
                let f = p
                    .create_inode(0, &attr(FileKind::File), None, 2, None, None)
                    .unwrap();
                let name = format!("during-{steps}");
                p.link(r, name.as_bytes(), f.handle(), FileKind::File, None, None)
                    .unwrap();
                made.push(name);
            }
        })
        .unwrap();
    assert!(steps > 20, "only {steps} steps");
    assert!(made.len() > 5);
    // Every change made between steps is in the copy, and the seq names
    // the last of them.
    assert_eq!(seq, p.committed_seq());
    let caps = drain(&mut rx);
    assert!(!caps.is_empty());
    assert!(caps.iter().all(|c| c.seq <= seq));

    let c = Store::open(&dir.path().join("c.sqlite")).unwrap();
    c.install_snapshot(&snap).unwrap();
    assert_same(&c, &p);
    // The copy is a plain database file a receiver can open, mode 0600.
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&snap).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);

    // And changes after it apply on top of it, in order.
    let f = p
        .create_inode(0, &attr(FileKind::File), None, 3, None, None)
        .unwrap();
    p.link(r, b"after", f.handle(), FileKind::File, None, None)
        .unwrap();
    for cap in drain(&mut rx) {
        assert!(cap.seq > seq);
        c.apply_changeset(&cap.changeset).unwrap();
    }
    assert_same(&c, &p);
}

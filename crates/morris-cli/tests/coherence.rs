//! Coherence between two mounts of one volume (two `morris mount`
//! processes, so two clients): what one writes or changes in the namespace,
//! the other sees right afterwards, even where its kernel had cached the old
//! state (attribute TTL 1 s, page cache) — lease recalls invalidate it.

mod common;

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::path::Path;

use common::{assert_same_bytes, close_checked, expect_errno, pattern, read_log, TwoMounts};

type Two = TwoMounts;

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("readdir {}: {e}", dir.display()))
        .map(|e| {
            e.expect("readdir entry")
                .file_name()
                .into_string()
                .expect("utf-8 name")
        })
        .collect();
    v.sort();
    v
}

fn same(t: &Two, got: &[u8], want: &[u8], what: &str) {
    assert_same_bytes(got, want, what, &t.logs());
}

fn write_closed(p: &Path, data: &[u8]) {
    let mut f = File::create(p).unwrap_or_else(|e| panic!("create {}: {e}", p.display()));
    f.write_all(data)
        .unwrap_or_else(|e| panic!("write {}: {e}", p.display()));
    close_checked(f).unwrap_or_else(|e| panic!("close {}: {e}", p.display()));
}

/// Rewrites `p_a` in place with `new` (same size) and puts back the mtime
/// `p_b` shows, as rsync or `touch -r` do: nothing in the attributes tells
/// the other mount's kernel.
fn rewrite_keeping_mtime(p_a: &Path, p_b: &Path, new: &[u8]) -> std::time::SystemTime {
    let mtime = fs::metadata(p_b)
        .expect("stat on B")
        .modified()
        .expect("mtime");
    let f = OpenOptions::new().write(true).open(p_a).expect("open on A");
    f.write_all_at(new, 0).expect("rewrite on A");
    f.set_modified(mtime).expect("put the mtime back on A");
    close_checked(f).expect("close on A");
    mtime
}

#[test]
fn data_written_on_one_mount_is_read_whole_on_the_other() {
    let t = Two::long_ttl();
    // A fresh file, over several stripe units, odd length.
    let data = pattern(11, 0, 3 * 1024 * 1024 + 4321);
    write_closed(&t.a.path.join("fresh"), &data);
    same(
        &t,
        &fs::read(t.b.path.join("fresh")).expect("read on B"),
        &data,
        "fresh file read on B",
    );

    // B has it cached (kernel page cache and client); A overwrites it in
    // place, then with a shorter, then with a longer version.
    let p_a = t.a.path.join("fresh");
    let p_b = t.b.path.join("fresh");
    for (round, len) in [(1u64, data.len()), (2, 100_000), (3, 5 * 1024 * 1024 + 1)] {
        let _ = fs::read(&p_b).expect("read on B to cache it");
        let _ = fs::metadata(&p_b).expect("stat on B to cache it");
        let new = pattern(100 + round, 0, len);
        write_closed(&p_a, &new);
        assert_eq!(
            fs::metadata(&p_b).expect("stat on B").len(),
            len as u64,
            "round {round}: size on B after A rewrote the file"
        );
        same(
            &t,
            &fs::read(&p_b).expect("read on B"),
            &new,
            &format!("round {round}: B after A rewrote the file"),
        );
    }

    // B keeps a descriptor open (and has read through it); A rewrites part
    // of the file; B's next pread through the same descriptor sees it.
    let held = File::open(&p_b).expect("open on B");
    let mut before = vec![0u8; 8192];
    held.read_exact_at(&mut before, 70_000).expect("pread on B");
    let patch = pattern(999, 0, 8192);
    let f = OpenOptions::new()
        .write(true)
        .open(&p_a)
        .expect("open on A");
    f.write_all_at(&patch, 70_000).expect("pwrite on A");
    close_checked(f).expect("close on A");
    let mut after = vec![0u8; 8192];
    held.read_exact_at(&mut after, 70_000)
        .expect("pread on B again");
    same(&t, &after, &patch, "B's open descriptor after A's pwrite");

    // And the other way round, through the same names.
    let back = pattern(12, 0, 777_777);
    write_closed(&t.b.path.join("from-b"), &back);
    same(
        &t,
        &fs::read(t.a.path.join("from-b")).expect("read on A"),
        &back,
        "file written on B read on A",
    );
}

#[test]
fn a_same_size_rewrite_with_its_mtime_put_back_is_still_seen() {
    // B holds the file open and has read its start (its client prefetched
    // what follows); A rewrites it in place with the same size, then puts
    // the old mtime back (as rsync or `touch -r` do). Size and mtime match
    // what B's prefetched blocks belong to; the new content must still
    // reach B's open descriptor.
    let t = Two::long_ttl();
    let old = pattern(21, 0, 2 * 1024 * 1024 + 99);
    write_closed(&t.a.path.join("same"), &old);
    let p_a = t.a.path.join("same");
    let p_b = t.b.path.join("same");
    let held = File::open(&p_b).expect("open on B");
    let mut start = vec![0u8; 4096];
    for off in [0u64, 4096, 8192] {
        held.read_exact_at(&mut start, off).expect("read on B");
        same(
            &t,
            &start,
            &old[off as usize..off as usize + 4096],
            "first reads on B",
        );
    }
    let mut got = vec![0u8; old.len()];
    let new = pattern(22, 0, old.len());
    let mtime = rewrite_keeping_mtime(&p_a, &p_b, &new);
    assert_eq!(
        fs::metadata(&p_a)
            .expect("stat on A")
            .modified()
            .expect("mtime"),
        mtime,
        "A restored the mtime"
    );

    held.read_exact_at(&mut got, 0).expect("read on B again");
    same(
        &t,
        &got,
        &new,
        "B's open descriptor after a same-size rewrite with the old mtime",
    );
}

#[test]
fn a_file_opened_again_is_read_from_the_kernels_cache_until_another_mount_changes_it() {
    // B reads a file whole, closes it and opens it again: the kernel keeps
    // its pages (B's read lease never left it), so no block is read from
    // the servers. A then rewrites it in place with the same size and puts
    // the old mtime back, so that nothing in its attributes tells B's
    // kernel: B's next open must still drop the old pages (its lease was
    // recalled and taken anew) and read the new bytes.
    let t = Two::long_ttl();
    let old = pattern(31, 0, 3 * 1024 * 1024 + 17);
    let (p_a, p_b) = (t.a.path.join("again"), t.b.path.join("again"));
    write_closed(&p_a, &old);
    same(
        &t,
        &fs::read(&p_b).expect("read on B"),
        &old,
        "first read on B",
    );
    let reads = common::served_during(&t.c, &["Read"], || {
        for round in 0..3 {
            same(
                &t,
                &fs::read(&p_b).expect("read on B again"),
                &old,
                &format!("read {round} on B from its cache"),
            );
        }
    });
    assert_eq!(reads["Read"], 0, "B's kernel kept the pages it had");

    let new = pattern(32, 0, old.len());
    rewrite_keeping_mtime(&p_a, &p_b, &new);
    same(
        &t,
        &fs::read(&p_b).expect("read on B after A's rewrite"),
        &new,
        "B after a same-size rewrite with the old mtime",
    );
}

#[test]
fn namespace_changes_on_one_mount_are_seen_on_the_other_at_once() {
    let t = Two::long_ttl();
    let (a, b) = (&t.a.path, &t.b.path);

    // B looks the name up first (a negative entry its kernel may cache).
    expect_errno(
        fs::metadata(b.join("n")),
        libc::ENOENT,
        "B: stat before create",
    );
    assert_eq!(names(b), Vec::<String>::new(), "B: empty root");
    write_closed(&a.join("n"), b"hello");
    let md = fs::metadata(b.join("n")).expect("B: stat right after A created it");
    assert_eq!(md.len(), 5);
    assert_eq!(names(b), vec!["n"], "B: listing after A created n");

    // Rename in one directory.
    fs::rename(a.join("n"), a.join("m")).expect("A: rename");
    expect_errno(
        fs::metadata(b.join("n")),
        libc::ENOENT,
        "B: old name after A renamed it",
    );
    assert_eq!(fs::read(b.join("m")).expect("B: read new name"), b"hello");
    assert_eq!(names(b), vec!["m"], "B: listing after rename");

    // Directories, and a rename across them.
    fs::create_dir(a.join("d1")).expect("A: mkdir d1");
    fs::create_dir(a.join("d2")).expect("A: mkdir d2");
    assert!(fs::metadata(b.join("d1")).expect("B: stat d1").is_dir());
    assert_eq!(names(&b.join("d2")), Vec::<String>::new(), "B: d2 empty");
    fs::rename(a.join("m"), a.join("d2/m")).expect("A: move into d2");
    assert_eq!(names(b), vec!["d1", "d2"], "B: root after the move");
    assert_eq!(names(&b.join("d2")), vec!["m"], "B: d2 after the move");
    assert_eq!(fs::read(b.join("d2/m")).expect("B: read moved"), b"hello");

    // Attributes.
    fs::set_permissions(a.join("d2/m"), fs::Permissions::from_mode(0o600)).expect("A: chmod");
    assert_eq!(
        fs::metadata(b.join("d2/m")).expect("B: stat").mode() & 0o7777,
        0o600,
        "B: mode after A's chmod"
    );

    // Removal.
    fs::remove_file(a.join("d2/m")).expect("A: unlink");
    expect_errno(
        fs::metadata(b.join("d2/m")),
        libc::ENOENT,
        "B: stat after A's unlink",
    );
    expect_errno(
        File::open(b.join("d2/m")),
        libc::ENOENT,
        "B: open after A's unlink",
    );
    assert_eq!(
        names(&b.join("d2")),
        Vec::<String>::new(),
        "B: d2 after unlink"
    );
    fs::remove_dir(a.join("d1")).expect("A: rmdir");
    expect_errno(
        fs::metadata(b.join("d1")),
        libc::ENOENT,
        "B: stat after A's rmdir",
    );
    assert_eq!(names(b), vec!["d2"], "B: root after rmdir");

    // B changes, A sees: B removes a directory A had listed.
    assert_eq!(names(&a.join("d2")), Vec::<String>::new());
    fs::remove_dir(b.join("d2")).expect("B: rmdir d2");
    expect_errno(
        fs::metadata(a.join("d2")),
        libc::ENOENT,
        "A: stat after B's rmdir",
    );
    expect_errno(
        File::create(a.join("d2/x")),
        libc::ENOENT,
        "A: create inside a directory B removed",
    );
    // A name reused for another kind is seen as the new kind.
    write_closed(&b.join("d2"), b"file now");
    assert!(
        fs::metadata(a.join("d2")).expect("A: stat").is_file(),
        "A: d2 is a file now"
    );
    assert_eq!(names(a), vec!["d2"]);
}

#[test]
fn alternate_appends_from_two_mounts_all_land() {
    let t = Two::long_ttl();
    write_closed(&t.a.path.join("log"), b"");
    let mut want = Vec::new();
    for round in 0..20 {
        for (who, m) in [("A", &t.a), ("B", &t.b)] {
            let line = format!("{who}{round} {}\n", "x".repeat(round * 997 % 5000));
            let mut f = OpenOptions::new()
                .append(true)
                .open(m.path.join("log"))
                .unwrap_or_else(|e| panic!("{who}: open for append, round {round}: {e}"));
            f.write_all(line.as_bytes())
                .unwrap_or_else(|e| panic!("{who}: append, round {round}: {e}"));
            close_checked(f).unwrap_or_else(|e| panic!("{who}: close, round {round}: {e}"));
            want.extend_from_slice(line.as_bytes());
        }
    }
    for (who, m) in [("A", &t.a), ("B", &t.b)] {
        same(
            &t,
            &fs::read(m.path.join("log")).expect("read the log"),
            &want,
            &format!("log read on {who}"),
        );
    }
}

#[test]
fn a_reader_keeping_a_file_open_sees_it_grow() {
    let t = Two::long_ttl();
    let first = pattern(21, 0, 300_000);
    write_closed(&t.a.path.join("grow"), &first);

    let held = File::open(t.b.path.join("grow")).expect("B: open");
    assert_eq!(held.metadata().expect("B: fstat").len(), 300_000);
    let mut buf = vec![0u8; 300_000];
    held.read_exact_at(&mut buf, 0).expect("B: read it all");
    same(&t, &buf, &first, "B: first contents");

    // A appends (across stripe units) and closes, twice.
    let mut want = first.clone();
    for round in 1..=2u64 {
        let more = pattern(21 + round, 0, 200_001);
        let mut f = OpenOptions::new()
            .append(true)
            .open(t.a.path.join("grow"))
            .expect("A: open for append");
        f.write_all(&more).expect("A: append");
        close_checked(f).expect("A: close");
        want.extend_from_slice(&more);
        let seen = held.metadata().expect("B: fstat").len();
        assert_eq!(
            seen,
            want.len() as u64,
            "round {round}: size B's open descriptor sees after A extended the file\n{}",
            t.logs()
        );
        let mut tail = vec![0u8; 200_001];
        held.read_exact_at(&mut tail, want.len() as u64 - 200_001)
            .unwrap_or_else(|e| panic!("round {round}: B: read the new tail: {e}"));
        same(
            &t,
            &tail,
            &want[want.len() - 200_001..],
            &format!("round {round}: new tail read by B"),
        );
    }
    // A truncates it; B's descriptor sees the smaller size and EOF there.
    let f = OpenOptions::new()
        .write(true)
        .open(t.a.path.join("grow"))
        .expect("A: open");
    f.set_len(1000).expect("A: truncate");
    close_checked(f).expect("A: close");
    assert_eq!(
        held.metadata().expect("B: fstat").len(),
        1000,
        "size after A truncated"
    );
    let mut buf = vec![0u8; 5000];
    let n = held.read_at(&mut buf, 0).expect("B: read after truncate");
    same(
        &t,
        &buf[..n],
        &first[..1000],
        "B: contents after A truncated",
    );
}

#[test]
fn a_paused_client_drops_what_its_expired_leases_protected() {
    // B holds a read lease and the kernel caches the file's pages for an open
    // descriptor. B's mount process is then paused past the lease time: the
    // server revokes B's lease and lets A write. When B runs again it must
    // drop what the lost lease protected (from the recall it finds waiting,
    // or from noticing the lease ran out): B's old descriptor then reads what
    // A wrote, though B's kernel cache TTL is ten minutes.
    let t = Two::long_ttl();
    let old = pattern(7, 0, 100_000);
    fs::write(t.a.path.join("paused"), &old).expect("A: write");
    let held = File::open(t.b.path.join("paused")).expect("B: open");
    let mut buf = vec![0u8; old.len()];
    held.read_exact_at(&mut buf, 0).expect("B: first read");
    same(&t, &buf, &old, "B: first read");
    let b_pid = t.b.pid().expect("B's mount process");
    common::signal(b_pid, libc::SIGSTOP);
    let new = pattern(8, 0, 100_000);
    let writer = {
        let p = t.a.path.join("paused");
        let new = new.clone();
        std::thread::spawn(move || {
            let f = OpenOptions::new().write(true).open(&p).expect("A: open");
            f.write_all_at(&new, 0).expect("A: write while B is paused");
            close_checked(f).expect("A: close");
        })
    };
    // A's write lease waits for B's read lease to run out. (A bounded wait,
    // so that B is always resumed; no timing is asserted.)
    let start = std::time::Instant::now();
    while !writer.is_finished() && start.elapsed() < std::time::Duration::from_secs(60) {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let joined = writer.is_finished();
    common::signal(b_pid, libc::SIGCONT);
    assert!(joined, "A's write never completed while B was paused");
    writer.join().expect("A's writer thread");
    common::wait_for(
        std::time::Duration::from_secs(30),
        "B reading A's data through its old descriptor",
        || {
            let mut b = vec![0u8; new.len()];
            held.read_exact_at(&mut b, 0).map_err(|e| e.to_string())?;
            if b == new {
                Ok(())
            } else {
                Err(format!(
                    "B still reads the data its expired lease protected; B's log:\n{}",
                    read_log(&t.b.log)
                ))
            }
        },
    );
}

/// Unmounts both mounts, then checks that fsck finds nothing wrong and no
/// inode without a name; the volume stays up.
fn unmount_then_fsck_clean(t: TwoMounts) -> common::Cluster {
    let TwoMounts { a, b, c } = t;
    drop(a);
    drop(b);
    let o = common::morris(&["fsck", c.addr(0)]);
    let out = common::both(&o);
    assert!(
        o.status.success(),
        "fsck after the unmount: {out}\n{}",
        c.logs()
    );
    assert!(out.contains("0 unreachable inodes"), "{out}");
    c
}

/// A mount answers an unlink before the removal and the inode's lowered
/// link count are stored (`deferred.rs`): nobody may see the count in
/// between, and an unmount right after many removals leaves none of them
/// undone.
#[test]
fn a_removed_names_link_count_is_right_at_once_everywhere() {
    let t = Two::long_ttl();
    let (a, b) = (t.a.path.clone(), t.b.path.clone());
    write_closed(&a.join("f"), b"data");
    fs::hard_link(a.join("f"), a.join("g")).expect("A: link");
    assert_eq!(fs::metadata(b.join("g")).expect("B: stat g").nlink(), 2);
    fs::remove_file(a.join("f")).expect("A: unlink f");
    assert_eq!(
        fs::metadata(a.join("g")).expect("A: stat g").nlink(),
        1,
        "A: g after unlink f"
    );
    assert_eq!(
        fs::metadata(b.join("g")).expect("B: stat g").nlink(),
        1,
        "B: g after A's unlink f"
    );

    // Renamed over: the replaced object's other name counts one link less.
    write_closed(&a.join("h"), b"old");
    fs::hard_link(a.join("h"), a.join("h2")).expect("A: link h2");
    write_closed(&a.join("new"), b"new");
    fs::rename(a.join("new"), a.join("h")).expect("A: rename over h");
    assert_eq!(
        fs::metadata(a.join("h2")).expect("A: stat h2").nlink(),
        1,
        "A: h2"
    );
    assert_eq!(
        fs::metadata(b.join("h2")).expect("B: stat h2").nlink(),
        1,
        "B: h2"
    );
    assert_eq!(fs::read(b.join("h2")).expect("B: read h2"), b"old");

    // An open file unlinked: no name at once, its data until the close.
    let f = File::open(a.join("g")).expect("A: open g");
    fs::remove_file(a.join("g")).expect("A: unlink g");
    assert_eq!(
        f.metadata().expect("A: fstat").nlink(),
        0,
        "A: fstat after unlink"
    );
    let mut got = [0u8; 4];
    f.read_exact_at(&mut got, 0)
        .expect("A: read the unlinked file");
    assert_eq!(&got, b"data");
    drop(f);

    // Many removals, then the mount goes at once: every link count landed
    // first, so fsck finds no inode without a name.
    fs::create_dir(a.join("many")).expect("A: mkdir");
    for i in 0..300 {
        write_closed(&a.join(format!("many/m{i}")), b"x");
    }
    for i in 0..300 {
        fs::remove_file(a.join(format!("many/m{i}"))).expect("A: unlink");
    }
    unmount_then_fsck_clean(t);
}

/// A mount answers a file's create once its inode is stored and stores the
/// name right after (`names_behind`, `deferred.rs`): the same mount lists
/// it, renames and removes it in order; another mount sees every name at
/// once and cannot make one of them again; an unmount right after leaves
/// every name stored.
#[test]
fn names_of_files_just_created_are_seen_everywhere_at_once() {
    let t = Two::long_ttl();
    let (a, b) = (t.a.path.clone(), t.b.path.clone());
    fs::create_dir(a.join("d")).expect("A: mkdir d");
    assert_eq!(names(&b.join("d")), Vec::<String>::new(), "B: d empty");
    let want: Vec<String> = {
        let mut v: Vec<String> = (0..200).map(|i| format!("f{i:03}")).collect();
        v.sort();
        v
    };
    for n in &want {
        write_closed(&a.join("d").join(n), n.as_bytes());
    }
    assert_eq!(names(&a.join("d")), want, "A: its own listing right after");
    assert_eq!(names(&b.join("d")), want, "B: A's names right after");
    assert_eq!(fs::read(b.join("d/f123")).expect("B: read"), b"f123");

    // Made and at once renamed over, or removed, on the same mount.
    for i in 0..50 {
        let tmp = a.join(format!("d/tmp{i}"));
        write_closed(&tmp, format!("v{i}").as_bytes());
        fs::rename(&tmp, a.join("d/f000")).expect("A: rename over f000");
        write_closed(&a.join("d/gone"), b"x");
        fs::remove_file(a.join("d/gone")).expect("A: unlink just made");
    }
    assert_eq!(
        names(&b.join("d")),
        want,
        "B: after the renames and removals"
    );
    assert_eq!(fs::read(b.join("d/f000")).expect("B: read f000"), b"v49");

    // An exclusive create of a name the other mount made a moment ago.
    for i in 0..20 {
        let p = format!("e{i}");
        File::create_new(a.join("d").join(&p)).expect("A: create_new");
        expect_errno(
            File::create_new(b.join("d").join(&p)),
            libc::EEXIST,
            "B: create_new of a name A just made",
        );
    }

    // fsync of the directory, then many creates and the unmount at once.
    let dir = File::open(a.join("d")).expect("A: open d");
    dir.sync_all().expect("A: fsync d");
    drop(dir);
    fs::create_dir(a.join("many")).expect("A: mkdir many");
    for i in 0..300 {
        drop(File::create(a.join(format!("many/m{i}"))).expect("A: create"));
    }
    let c = unmount_then_fsck_clean(t);
    let m = c.mount();
    assert_eq!(
        names(&m.path.join("many")).len(),
        300,
        "a new mount: every name"
    );
}

/// A create answers once the new inode is stored: with the directory's
/// server stopped (`SIGSTOP`: connected, answering nothing), an empty
/// file, a directory (with an empty file in it) and a symlink are made there,
/// and names removed there, and the mount answers for them; once the
/// server runs again the changes land and the other mount sees them.
#[test]
fn a_create_answers_before_its_directorys_server_has_the_name() {
    let t = Two::long_ttl();
    let (a, b) = (t.a.path.clone(), t.b.path.clone());
    fs::create_dir(a.join("d")).expect("A: mkdir d");
    // Warm: A holds d's write lease and knows d whole (it made it).
    write_closed(&a.join("d/warm"), b"");
    write_closed(&a.join("d/old"), b"");
    let ino = fs::metadata(a.join("d")).expect("A: stat d").ino();
    let owner = (ino % 4) as usize;
    let pid = t.c.pids()[owner].expect("the directory's server runs");
    common::signal(pid, libc::SIGSTOP);
    let maker = {
        let d = a.join("d");
        std::thread::spawn(move || {
            let p = d.join("made-while-stopped");
            let f = File::create_new(&p).map_err(|e| format!("create: {e}"))?;
            close_checked(f).map_err(|e| format!("close: {e}"))?;
            fs::create_dir(d.join("sub")).map_err(|e| format!("mkdir: {e}"))?;
            // (Empty: a byte might be due at the stopped server.)
            let f =
                File::create_new(d.join("sub/inner")).map_err(|e| format!("create inner: {e}"))?;
            close_checked(f).map_err(|e| format!("close inner: {e}"))?;
            std::os::unix::fs::symlink("warm", d.join("ln"))
                .map_err(|e| format!("symlink: {e}"))?;
            // Made and removed again, and a name from before removed.
            let f = File::create_new(d.join("gone")).map_err(|e| format!("create gone: {e}"))?;
            close_checked(f).map_err(|e| format!("close gone: {e}"))?;
            fs::remove_file(d.join("gone")).map_err(|e| format!("unlink gone: {e}"))?;
            fs::remove_file(d.join("old")).map_err(|e| format!("unlink old: {e}"))?;
            fs::metadata(&p)
                .map(|m| m.len())
                .map_err(|e| format!("stat: {e}"))
        })
    };
    // Bounded, so that the server is always resumed; no timing is asserted.
    let start = std::time::Instant::now();
    while !maker.is_finished() && start.elapsed() < std::time::Duration::from_secs(30) {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let finished = maker.is_finished();
    common::signal(pid, libc::SIGCONT);
    assert!(
        finished,
        "the create waited for the stopped directory server\n{}",
        t.logs()
    );
    assert_eq!(maker.join().expect("maker thread"), Ok(0));
    assert_eq!(
        names(&b.join("d")),
        vec!["ln", "made-while-stopped", "sub", "warm"],
        "B: after the server runs again"
    );
    assert_eq!(names(&b.join("d/sub")), vec!["inner"], "B: d/sub");
    assert_eq!(
        fs::read_link(b.join("d/ln")).expect("B: readlink"),
        Path::new("warm")
    );
    assert_eq!(
        fs::metadata(b.join("d")).expect("B: stat d").nlink(),
        3,
        "d holds sub"
    );
}

/// Files written as they are made: their blocks go out before their
/// inodes are stored (early fence number), then under the real grant. On
/// a mirrored volume too, the other mount reads every byte, after the
/// close and after a rewrite in place, and a third mount after the first
/// unmounts.
#[test]
fn files_written_as_they_are_made_read_whole_on_another_mount() {
    for replicas in [1u8, 2] {
        let t = Two::start(
            common::ClusterOpts {
                replicas,
                ..common::ClusterOpts::default()
            },
            &[],
        );
        fs::create_dir(t.a.path.join("w")).expect("mkdir");
        // Past the first batch of reserved ids, and a mix of sizes: one
        // unit, several units on several servers, a few bytes.
        let sizes = [5usize, 64 * 1024, 3 * 64 * 1024 + 17, 1000];
        let mut want = Vec::new();
        for i in 0..300u64 {
            let data = pattern(i, 0, sizes[i as usize % sizes.len()]);
            write_closed(&t.a.path.join(format!("w/f{i}")), &data);
            want.push(data);
        }
        for (i, data) in want.iter_mut().enumerate().step_by(7) {
            let p = t.a.path.join(format!("w/f{i}"));
            let f = OpenOptions::new().write(true).open(&p).expect("open");
            let patch = pattern(1000 + i as u64, 0, 3);
            f.write_all_at(&patch, 1).expect("pwrite");
            close_checked(f).expect("close after pwrite");
            data[1..4].copy_from_slice(&patch);
        }
        for (i, data) in want.iter().enumerate() {
            let got = fs::read(t.b.path.join(format!("w/f{i}"))).expect("read on B");
            same(
                &t,
                &got,
                data,
                &format!("replicas {replicas}: w/f{i} read on B"),
            );
        }
        let Two { a, b, c } = t;
        drop(a);
        drop(b);
        let m = common::Mount::start(c.addr(1), &[]);
        for (i, data) in want.iter().enumerate() {
            let got = fs::read(m.path.join(format!("w/f{i}"))).expect("read on a new mount");
            assert!(
                got == *data,
                "replicas {replicas}: w/f{i} differs on a new mount ({} bytes, want {})",
                got.len(),
                data.len()
            );
        }
    }
}

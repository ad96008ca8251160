//! Crashes: `kill -9` of servers under load and of all servers at once, of
//! a mount holding a write lease, and of a mount in the middle of
//! `RENAME_EXCHANGE`s between two directories, and of a mount whose data
//! past a file's end reached the servers before its size was saved. After each, the volume must work again,
//! `morris fsck` must find no errors (garbage is allowed) and whatever an
//! application was told is done must still be there.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use common::{close_checked, fsck, pattern, read_log, wait_for, Cluster, ClusterOpts, Mount};

/// How long a recovery may take before the test calls it a hang. Generous:
/// the servers' lease time is 1.5 s and the client retries for 5 s.
const RECOVERY: Duration = Duration::from_secs(90);

/// Size of every file the churn writes: three 64 KiB stripe units and a bit,
/// so each file touches every server.
const CHURN_LEN: usize = 3 * 64 * 1024 + 100;

/// What the churn thread knows for sure: the files whose every operation
/// succeeded, where they are (or that they are gone).
#[derive(Default)]
struct Churn {
    /// Iterations whose every step succeeded.
    ok: u64,
    /// Steps that failed (tolerated: servers are being killed).
    failed: u64,
    /// Failures by message, for the report.
    errors: BTreeMap<String, u64>,
    /// Relative path → seed of its contents, for files known to exist.
    present: BTreeMap<String, u64>,
    /// Paths known to be removed.
    removed: Vec<String>,
}

fn churn_step(root: &Path, n: u64) -> Result<(Option<String>, Option<String>), String> {
    let created = format!("a/f{n}");
    let mut f = File::create(root.join(&created)).map_err(|e| format!("create: {e}"))?;
    f.write_all(&pattern(n, 0, CHURN_LEN))
        .map_err(|e| format!("write: {e}"))?;
    close_checked(f).map_err(|e| format!("close: {e}"))?;
    // Across directories, then (sometimes) within one, then (sometimes) away.
    let moved = format!("b/g{n}");
    fs::rename(root.join(&created), root.join(&moved))
        .map_err(|e| format!("rename across dirs: {e}"))?;
    let mut last = moved;
    if n % 4 == 1 {
        let again = format!("b/h{n}");
        fs::rename(root.join(&last), root.join(&again))
            .map_err(|e| format!("rename in a dir: {e}"))?;
        last = again;
    }
    // Every third file is removed again.
    match n % 3 {
        0 => {
            fs::remove_file(root.join(&last)).map_err(|e| format!("unlink: {e}"))?;
            Ok((None, Some(last)))
        }
        _ => Ok((Some(last), None)),
    }
}

/// Creates, renames and removes files under `root` until `stop` is set;
/// file numbers start after `first`.
fn start_churn(
    root: PathBuf,
    first: u64,
    stop: Arc<AtomicBool>,
    state: Arc<Mutex<Churn>>,
) -> JoinHandle<()> {
    std::thread::spawn(move || {
        let mut n = first;
        while !stop.load(Ordering::SeqCst) {
            n += 1;
            let res = churn_step(&root, n);
            let mut s = state.lock().expect("churn state");
            match res {
                Ok((present, removed)) => {
                    s.ok += 1;
                    if let Some(p) = present {
                        s.present.insert(p, n);
                    }
                    if let Some(r) = removed {
                        s.removed.push(r);
                    }
                }
                Err(e) => {
                    s.failed += 1;
                    let kind = e.split(" (os error").next().unwrap_or(&e).to_string();
                    *s.errors.entry(kind).or_insert(0) += 1;
                    drop(s);
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
        }
    })
}

/// Waits until the churn has completed `more` iterations beyond `from`.
fn wait_churn(state: &Mutex<Churn>, from: u64, more: u64, what: &str) {
    wait_for(RECOVERY, what, || {
        let s = state.lock().expect("churn state");
        if s.ok >= from + more {
            Ok(())
        } else {
            Err(format!(
                "{} iterations done ({} wanted), {} failed steps: {:?}",
                s.ok,
                from + more,
                s.failed,
                s.errors
            ))
        }
    });
}

/// One full round trip through the mount: create, write, read, rename, unlink.
fn probe(root: &Path, tag: &str) -> Result<(), String> {
    let p = root.join(format!("probe-{tag}"));
    let q = root.join(format!("b/probe-{tag}"));
    let data = pattern(42, 0, 100_000);
    let mut f = File::create(&p).map_err(|e| format!("create: {e}"))?;
    f.write_all(&data).map_err(|e| format!("write: {e}"))?;
    close_checked(f).map_err(|e| format!("close: {e}"))?;
    if fs::read(&p).map_err(|e| format!("read: {e}"))? != data {
        return Err("read back different data".into());
    }
    fs::rename(&p, &q).map_err(|e| format!("rename: {e}"))?;
    fs::remove_file(&q).map_err(|e| format!("unlink: {e}"))?;
    Ok(())
}

/// Asserts `morris fsck` finds no errors (garbage is allowed); `context`
/// goes into the failure message.
fn assert_fsck_clean(c: &Cluster, when: &str, context: &str) {
    let (ok, out, all) = fsck(c.addr(0));
    let all = format!("{all}{context}");
    let summary = out
        .lines()
        .find(|l| l.starts_with("fsck: volume"))
        .unwrap_or_else(|| panic!("{when}: no summary line in fsck's output:\n{all}"));
    assert!(
        summary.contains(" 0 errors (0 dangling entries,"),
        "{when}: fsck found dangling entries or other errors:\n{all}"
    );
    assert!(
        summary.contains(
            " 0 errors (0 dangling entries, 0 entries of missing directories, 0 mismatches)"
        ),
        "{when}: fsck found errors:\n{all}"
    );
    assert!(ok, "{when}: fsck exited with an error status:\n{all}");
}

/// Every file under `dir` can be read whole (as many bytes as its size).
fn assert_all_readable(dir: &Path, when: &str) -> usize {
    let mut n = 0;
    for e in fs::read_dir(dir).unwrap_or_else(|e| panic!("{when}: readdir {}: {e}", dir.display()))
    {
        let e = e.unwrap_or_else(|e| panic!("{when}: readdir entry in {}: {e}", dir.display()));
        let p = e.path();
        let md = fs::symlink_metadata(&p)
            .unwrap_or_else(|e| panic!("{when}: {} is listed but stat fails: {e}", p.display()));
        if md.is_dir() {
            n += assert_all_readable(&p, when);
        } else {
            let data = fs::read(&p).unwrap_or_else(|e| {
                panic!("{when}: {} is listed but unreadable: {e}", p.display())
            });
            assert_eq!(
                data.len() as u64,
                md.len(),
                "{when}: {} reads {} bytes but its size is {}",
                p.display(),
                data.len(),
                md.len()
            );
            n += 1;
        }
    }
    n
}

/// The files the churn knows about are as it left them.
fn assert_churn_state(root: &Path, s: &Churn, when: &str) {
    for (rel, seed) in &s.present {
        let got = fs::read(root.join(rel)).unwrap_or_else(|e| {
            panic!("{when}: {rel} was created, written, closed and renamed successfully, but: {e}")
        });
        if got != pattern(*seed, 0, CHURN_LEN) {
            let md = fs::metadata(root.join(rel)).expect("stat");
            let zeros = got.iter().filter(|&&b| b == 0).count();
            panic!(
                "{when}: {rel} (file id {}, its inode on server {}; written and closed \
                 successfully) has different contents: {} bytes (want {CHURN_LEN}), {zeros} of them zero",
                md.ino(),
                md.ino() % 4,
                got.len()
            );
        }
    }
    for rel in &s.removed {
        assert!(
            fs::symlink_metadata(root.join(rel)).is_err(),
            "{when}: {rel} was removed successfully but is back"
        );
    }
}

#[test]
fn killing_each_server_under_load_leaves_a_consistent_volume() {
    let mut c = Cluster::start(4, ClusterOpts::default());
    let m = c.mount();
    let root = m.path.clone();
    fs::create_dir(root.join("a")).expect("mkdir a");
    fs::create_dir(root.join("b")).expect("mkdir b");
    let state = Arc::new(Mutex::new(Churn::default()));

    for victim in 0..4 {
        let stop = Arc::new(AtomicBool::new(false));
        let start = state.lock().expect("churn state").ok;
        let worker = start_churn(
            root.clone(),
            1_000_000 * (victim as u64 + 1),
            stop.clone(),
            state.clone(),
        );
        wait_churn(
            &state,
            start,
            10,
            &format!("churn before killing server {victim}"),
        );

        c.kill9(victim);
        // Let the churn run into the outage.
        std::thread::sleep(Duration::from_millis(1500));
        c.restart(victim);

        wait_for(
            RECOVERY,
            &format!(
                "the mount working again after server {victim} restarted (mount log: {})",
                m.log.display()
            ),
            || probe(&root, &victim.to_string()),
        );
        let now = state.lock().expect("churn state").ok;
        wait_churn(
            &state,
            now,
            10,
            &format!("churn after server {victim} restarted"),
        );
        stop.store(true, Ordering::SeqCst);
        worker.join().expect("the churn thread panicked");

        let when = format!("after killing server {victim}");
        let context = {
            let s = state.lock().expect("churn state");
            let warnings: String = read_log(&m.log)
                .lines()
                .filter(|l| l.contains("WARN"))
                .map(|l| format!("{l}\n"))
                .collect();
            format!(
                "--- churn: {} iterations ok, failed steps: {:?}\n--- mount warnings\n{warnings}",
                s.ok, s.errors
            )
        };
        assert_fsck_clean(&c, &when, &context);
        let files = assert_all_readable(&root, &when);
        let s = state.lock().expect("churn state");
        assert_churn_state(&root, &s, &when);
        eprintln!(
            "{when}: {} iterations ok, {} failed steps {:?}, {files} files listed",
            s.ok, s.failed, s.errors
        );
    }
    // Every server was killed in the middle of writes: every chunk still
    // matches its checksum (changes cut short were resealed at the start).
    let o = common::morris(&["scrub", c.addr(0)]);
    assert!(
        o.status.success(),
        "scrub after the kills: {}",
        common::both(&o)
    );
}

#[test]
fn closed_and_fsynced_data_survive_killing_every_server() {
    let mut c = Cluster::start(4, ClusterOpts::default());
    let m = c.mount();
    let closed = pattern(77, 0, 2 * 1024 * 1024 + 333);
    fs::create_dir(m.path.join("dir")).expect("mkdir");
    let mut f = File::create(m.path.join("dir/closed")).expect("create");
    f.write_all(&closed).expect("write");
    close_checked(f).expect("close (must succeed for this test to mean anything)");
    fs::rename(m.path.join("dir/closed"), m.path.join("closed")).expect("rename");
    // A second file, fsynced but still open when the servers die.
    let synced = pattern(78, 0, 700_001);
    let mut held = File::create(m.path.join("synced")).expect("create");
    held.write_all(&synced).expect("write");
    held.sync_all().expect("fsync");
    // A rewrite in place of part of a closed file.
    let f = OpenOptions::new()
        .write(true)
        .open(m.path.join("closed"))
        .expect("open");
    let patch = pattern(79, 0, 100_000);
    f.write_all_at(&patch, 1_000_000).expect("pwrite");
    close_checked(f).expect("close after pwrite");
    let mut want = closed.clone();
    want[1_000_000..1_100_000].copy_from_slice(&patch);

    for i in 0..4 {
        c.kill9(i);
    }
    for i in 0..4 {
        c.restart(i);
    }
    drop(held);

    let fresh = Mount::start(c.addr(3), &[]);
    let got = wait_for(
        RECOVERY,
        "reading the closed file through a fresh mount",
        || fs::read(fresh.path.join("closed")).map_err(|e| e.to_string()),
    );
    assert!(
        got == want,
        "the closed file differs after every server was killed ({} bytes, want {})",
        got.len(),
        want.len()
    );
    let got = fs::read(fresh.path.join("synced")).expect("read the fsynced file");
    assert!(
        got == synced,
        "the fsynced file differs after every server was killed ({} bytes, want {})",
        got.len(),
        synced.len()
    );
    assert!(
        fs::read_dir(fresh.path.join("dir"))
            .expect("readdir dir")
            .next()
            .is_none(),
        "the renamed file is still in its old directory"
    );
    // The old mount recovers too.
    let got = wait_for(RECOVERY, "the old mount reading the file again", || {
        fs::read(m.path.join("closed")).map_err(|e| e.to_string())
    });
    assert!(got == want, "the old mount reads different data");
    wait_for(RECOVERY, "the old mount writing again", || {
        probe_write(&m.path)
    });
    assert_fsck_clean(&c, "after killing every server", "");
}

fn probe_write(root: &Path) -> Result<(), String> {
    let p = root.join("after-restart");
    fs::write(&p, b"works").map_err(|e| format!("write: {e}"))?;
    match fs::read(&p) {
        Ok(d) if d == b"works" => Ok(()),
        Ok(d) => Err(format!("read back {d:?}")),
        Err(e) => Err(format!("read: {e}")),
    }
}

#[test]
fn a_killed_clients_write_lease_expires() {
    let c = Cluster::start(4, ClusterOpts::default());
    let mut a = Mount::start(c.addr(0), &[]);
    let b = Mount::start(c.addr(1), &[]);
    fs::write(b.path.join("shared"), b"before").expect("B: create");

    // A takes the file's write lease (and the root's, by creating a file)
    // and dies holding them.
    let mut f = OpenOptions::new()
        .write(true)
        .open(a.path.join("shared"))
        .expect("A: open for writing");
    f.write_all(&pattern(5, 0, 200_000)).expect("A: write");
    f.flush().expect("A: flush");
    let g = File::create(a.path.join("a-only")).expect("A: create");
    a.kill9();
    drop(f);
    drop(g);

    // B's requests wait for the leases to expire, then complete.
    let root = b.path.clone();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let res = (|| -> Result<Vec<u8>, String> {
            let p = root.join("shared");
            let mut f = OpenOptions::new()
                .write(true)
                .truncate(true)
                .open(&p)
                .map_err(|e| format!("open: {e}"))?;
            f.write_all(b"B wrote this")
                .map_err(|e| format!("write: {e}"))?;
            close_checked(f).map_err(|e| format!("close: {e}"))?;
            fs::write(root.join("b-new"), b"new").map_err(|e| format!("create: {e}"))?;
            fs::read(&p).map_err(|e| format!("read: {e}"))
        })();
        let _ = tx.send(res);
    });
    let res = rx.recv_timeout(RECOVERY).unwrap_or_else(|_| {
        panic!(
            "B's write to a file whose write lease a killed mount held did not complete in \
             {RECOVERY:?} (the lease never expired?); B's log:\n{}\n{}",
            read_log(&b.log),
            c.logs()
        )
    });
    let got = res.unwrap_or_else(|e| {
        panic!(
            "B failed after A was killed: {e}; B's log:\n{}",
            read_log(&b.log)
        )
    });
    assert_eq!(got, b"B wrote this", "what B reads back");
    let names: HashMap<String, u64> = fs::read_dir(&b.path)
        .expect("B: readdir")
        .map(|e| {
            let e = e.expect("entry");
            (
                e.file_name().into_string().expect("utf-8"),
                e.metadata().expect("stat").len(),
            )
        })
        .collect();
    assert_eq!(names.get("shared"), Some(&12), "B sees: {names:?}");
    assert_eq!(names.get("b-new"), Some(&3), "B sees: {names:?}");
    assert_fsck_clean(&c, "after a mount holding leases was killed", "");
}

/// A mount killed after its data past the end reached the servers but
/// before it saved the new size: the file keeps its saved size, and what
/// the dead mount wrote past it must never show, not even when another
/// mount extends the file over that place (`truncate` up, a write further
/// on): the gap reads as zeros, as POSIX promises. Before the fix the dead
/// mount's bytes came back there.
fn a_dead_writers_bytes_past_the_saved_size_never_show(c: &Cluster) {
    let mut a = Mount::start(c.addr(0), &[]);
    let b = Mount::start(c.addr(1 % c.addrs().len()), &[]);
    for name in ["grown", "written"] {
        fs::write(b.path.join(name), b"saved").expect("B: create");
    }
    let mut files = Vec::new();
    for name in ["grown", "written"] {
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .open(a.path.join(name))
            .expect("A: open");
        // Large enough to go to the servers at once (write-behind holds
        // only small writes back); the read after it waits for them.
        f.write_all_at(&[b'X'; 300_000], 1 << 20)
            .expect("A: write past the end");
        let mut head = [0u8; 5];
        f.read_exact_at(&mut head, 0).expect("A: read");
        assert_eq!(f.metadata().expect("A: stat").len(), (1 << 20) + 300_000);
        files.push(f);
    }
    a.kill9();
    drop(files);

    let grown = b.path.join("grown");
    let written = b.path.join("written");
    let sizes = wait_for(RECOVERY, "B sees the saved sizes", || {
        let s = (fs::metadata(&grown), fs::metadata(&written));
        match s {
            (Ok(g), Ok(w)) => Ok((g.len(), w.len())),
            (g, w) => Err(format!("{g:?} {w:?}")),
        }
    });
    // A file whose size the dead mount stored before it died (stored only
    // after its data, so rightly) holds what it wrote; the property under
    // test is for a size it never stored. That has happened, rarely, to
    // the first file on mirrored volumes (CI of 284547c and 22ac10d; not
    // explained yet: no close, fsync or recall of A's lease preceded the
    // kill in either log), so each file is checked for what it is.
    let written_size = (1u64 << 20) + 300_000;
    let mut unsaved = Vec::new();
    for (p, size) in [(&grown, sizes.0), (&written, sizes.1)] {
        if size == 5 {
            unsaved.push(p);
            continue;
        }
        assert_eq!(
            size,
            written_size,
            "{}: neither the saved size nor the dead mount's; its log:\n{}\nthe servers' logs:\n{}",
            p.display(),
            read_log(&a.log),
            c.logs()
        );
        eprintln!(
            "{}: the dead mount stored its size before it died",
            p.display()
        );
        let got = fs::read(p).expect("B: read");
        assert_eq!(&got[..5], b"saved");
        assert!(got[5..1 << 20].iter().all(|&x| x == 0), "{}", p.display());
        assert!(got[1 << 20..].iter().all(|&x| x == b'X'), "{}", p.display());
    }
    if unsaved.contains(&&grown) {
        OpenOptions::new()
            .write(true)
            .open(&grown)
            .and_then(|f| f.set_len(2 << 20))
            .expect("B: truncate up");
    }
    if unsaved.contains(&&written) {
        let f = OpenOptions::new()
            .write(true)
            .open(&written)
            .expect("B: open");
        f.write_all_at(b"end", 3 << 20)
            .expect("B: write past the end");
        close_checked(f).expect("B: close");
    }
    for (p, len) in [(&grown, 2 << 20), (&written, (3 << 20) + 3)] {
        if !unsaved.contains(&p) {
            continue;
        }
        let got = fs::read(p).expect("B: read");
        assert_eq!(got.len(), len, "{}", p.display());
        assert_eq!(&got[..5], b"saved", "{}", p.display());
        let shown = got[5..(3 << 20).min(len)]
            .iter()
            .filter(|&&x| x != 0)
            .count();
        assert_eq!(
            shown,
            0,
            "{}: {shown} bytes of the gap are not zeros (the dead mount's data); server logs:\n{}",
            p.display(),
            c.logs()
        );
    }
    // Another mount sees the same.
    let other = Mount::start(c.addr(0), &[]);
    if unsaved.contains(&&grown) {
        let got = fs::read(other.path.join("grown")).expect("read on a third mount");
        assert!(
            got[5..].iter().all(|&x| x == 0),
            "a third mount sees the dead mount's bytes"
        );
    }
    assert_fsck_clean(c, "after a mount died with unsaved data past the end", "");
}

#[test]
fn a_dead_writers_unsaved_tail_never_shows() {
    a_dead_writers_bytes_past_the_saved_size_never_show(&Cluster::start(4, ClusterOpts::default()));
}

#[test]
fn a_dead_writers_unsaved_tail_never_shows_with_two_copies() {
    // No resync: a resync's read lease would recall the writer's and make
    // it store its size before the kill (rightly, but then the property
    // has nothing to check). It is not why CI twice saw a size stored: it
    // happened with resync off too.
    a_dead_writers_bytes_past_the_saved_size_never_show(&Cluster::start(
        4,
        ClusterOpts {
            replicas: 2,
            server_args: vec!["--no-resync".into()],
            ..ClusterOpts::default()
        },
    ));
}

#[test]
fn a_close_after_the_inode_server_restarted_stores_the_data_or_fails() {
    let mut c = Cluster::start(4, ClusterOpts::default());
    let m = c.mount();
    let p = m.path.join("pending");
    let data = pattern(90, 0, 300_000);
    let mut f = File::create(&p).expect("create");
    f.write_all(&data).expect("write");
    // The size is now cached in the client (dirty) under its write lease.
    // The server that owns the inode restarts before the file is closed.
    let owner = (f.metadata().expect("fstat").ino() % 4) as usize;
    c.kill9(owner);
    std::thread::sleep(Duration::from_millis(300));
    // Restarting forks a process, whose exec closes its copy of `f`: the
    // kernel sends a flush for it, which hears of any lost write first.
    // This program's own close must still hear of it (it did not: 5 of 8
    // runs lost the error to the child).
    c.restart(owner);
    let closed = close_checked(f);

    let fresh = Mount::start(c.addr((owner + 1) % 4), &[]);
    let got = wait_for(RECOVERY, "reading the file through a fresh mount", || {
        fs::read(fresh.path.join("pending")).map_err(|e| e.to_string())
    });
    match closed {
        // The application was told: nothing more is promised.
        Err(e) => eprintln!("close reported {e}; the file has {} bytes", got.len()),
        Ok(()) => common::assert_same_bytes(
            &got,
            &data,
            &format!(
                "close() succeeded after the server owning the inode (server {owner}) \
                 restarted, but the file does not read what was written"
            ),
            &format!("mount log:\n{}\n{}", read_log(&m.log), c.logs()),
        ),
    }
    assert_fsck_clean(&c, "after a close across a server restart", "");
}

/// `renameat2(RENAME_EXCHANGE)` of `a` and `b`.
fn exchange(a: &Path, b: &Path) -> std::io::Result<()> {
    common::renameat2(a, b, libc::RENAME_EXCHANGE)
}

#[test]
fn a_mount_killed_during_exchanges_between_directories_loses_no_object() {
    let c = Cluster::start(4, ClusterOpts::default());
    for round in 0..5u64 {
        // Fresh directories each round: a file `a/x` and a directory `b/y`.
        let (a, b) = (format!("a{round}"), format!("b{round}"));
        {
            let m = c.mount();
            fs::create_dir(m.path.join(&a)).expect("mkdir a");
            fs::create_dir(m.path.join(&b)).expect("mkdir b");
            fs::write(m.path.join(&a).join("x"), b"first").expect("write a/x");
            fs::create_dir(m.path.join(&b).join("y")).expect("mkdir b/y");
            fs::write(m.path.join(&b).join("y/inside"), b"second").expect("write");
        }
        let mut m = c.mount();
        let stop = Arc::new(AtomicBool::new(false));
        let (x, y, st) = (
            m.path.join(&a).join("x"),
            m.path.join(&b).join("y"),
            stop.clone(),
        );
        let swapper = std::thread::spawn(move || {
            let mut done = 0u64;
            while !st.load(Ordering::Relaxed) && exchange(&x, &y).is_ok() {
                done += 1;
            }
            done
        });
        std::thread::sleep(Duration::from_millis(200 + 150 * round));
        m.kill9();
        stop.store(true, Ordering::Relaxed);
        let done = swapper.join().expect("the exchanging thread");
        // A new mount finds both objects, each under at least one name:
        // the file's bytes and the directory's content.
        let m = c.mount();
        let mut found: Vec<(PathBuf, &str)> = Vec::new();
        wait_for(RECOVERY, "the killed mount's leases to expire", || {
            found.clear();
            for d in [&a, &b] {
                for e in fs::read_dir(m.path.join(d)).map_err(|e| e.to_string())? {
                    let p = e.map_err(|e| e.to_string())?.path();
                    if p.is_dir() {
                        if fs::read(p.join("inside")).map_err(|e| e.to_string())? == b"second" {
                            found.push((p, "directory"));
                        }
                    } else if fs::read(&p).map_err(|e| e.to_string())? == b"first" {
                        found.push((p, "file"));
                    }
                }
            }
            Ok(())
        });
        eprintln!("round {round}: killed after {done} exchanges; names: {found:?}");
        assert!(
            done > 0,
            "round {round}: no exchange went through before the kill"
        );
        for what in ["file", "directory"] {
            assert!(
                found.iter().any(|(_, w)| *w == what),
                "round {round}, killed after {done} exchanges: no name for the {what}: {found:?}"
            );
        }
    }
    // What a kill may leave is an extra name (a link count or a
    // directory's entry count that fsck reports), never an entry naming
    // nothing or an object nothing names.
    let (_, out, all) = fsck(c.addr(0));
    for want in [
        "0 dangling entries",
        "0 entries of missing directories",
        "0 unreachable inodes",
    ] {
        assert!(out.contains(want), "fsck after the kills ({want}):\n{all}");
    }
}

/// Creates answer before their inode is stored (ids reserved ahead,
/// `CreateInodeAt`, then the name's `Link`). A mount killed in a burst of
/// them may lose the last ones, but leaves no name naming nothing, every
/// listed name readable, and every file it fsynced whole.
#[test]
fn a_mount_killed_while_creating_leaves_no_name_naming_nothing() {
    let c = Cluster::start(4, ClusterOpts::default());
    for round in 0..3u64 {
        let top = format!("r{round}");
        let mut m = c.mount();
        fs::create_dir(m.path.join(&top)).expect("mkdir");
        let stop = Arc::new(AtomicBool::new(false));
        let synced: Arc<Mutex<Vec<(PathBuf, u64)>>> = Arc::default();
        let (root, st, sy) = (m.path.join(&top), stop.clone(), synced.clone());
        let maker = std::thread::spawn(move || {
            let mut made = 0u64;
            'outer: for d in 0u64.. {
                let dir = root.join(format!("d{d}"));
                if fs::create_dir(&dir).is_err() {
                    break;
                }
                for f in 0..20u64 {
                    if st.load(Ordering::Relaxed) {
                        break 'outer;
                    }
                    let seed = d * 100 + f;
                    let p = dir.join(format!("f{f}"));
                    let Ok(mut file) = File::create(&p) else {
                        break 'outer;
                    };
                    if file.write_all(&pattern(seed, 0, 5000)).is_err() {
                        break 'outer;
                    }
                    if f % 19 == 0 {
                        if file.sync_all().is_err() {
                            break 'outer;
                        }
                        if let Ok(mut s) = sy.lock() {
                            s.push((
                                p.strip_prefix(&root).map(Path::to_path_buf).unwrap_or(p),
                                seed,
                            ));
                        }
                    }
                    drop(file);
                    made += 1;
                }
            }
            made
        });
        std::thread::sleep(Duration::from_millis(400 + 300 * round));
        m.kill9();
        stop.store(true, Ordering::Relaxed);
        let made = maker.join().expect("the creating thread");
        assert!(made > 0, "round {round}: nothing was made before the kill");
        let m = c.mount();
        let root = m.path.join(&top);
        let n = wait_for(RECOVERY, "the killed mount's leases to expire", || {
            fs::read_dir(&root).map_err(|e| e.to_string())?;
            Ok(assert_all_readable(&root, &format!("round {round}")))
        });
        let synced = synced.lock().map(|s| s.clone()).unwrap_or_default();
        for (rel, seed) in &synced {
            let got = fs::read(root.join(rel)).unwrap_or_else(|e| {
                panic!("round {round}: {} was fsynced, but: {e}", rel.display())
            });
            assert!(
                got == pattern(*seed, 0, 5000),
                "round {round}: {} was fsynced but reads {} other bytes",
                rel.display(),
                got.len()
            );
        }
        eprintln!(
            "round {round}: {made} files made before the kill, {n} found, {} fsynced",
            synced.len()
        );
    }
    assert_fsck_clean(&c, "after mounts were killed while creating", "");
}

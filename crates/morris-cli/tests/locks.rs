//! Cluster-wide locks through real FUSE mounts: `fcntl` and `flock` locks
//! taken on one mount exclude another mount's, `F_GETLK` names the holder,
//! a blocked waiter wakes when the lock goes, a closed or killed holder's
//! locks go, a waiting `flock -w` gives up on its signal, and SQLite with a
//! writer on each of two mounts loses nothing.

mod common;

use std::fs::{self, File};
use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{both, getlk, open_rw, setlk, wait_for, would_block, Cluster, ClusterOpts};

#[test]
fn fcntl_locks_of_one_mount_exclude_another_mounts() {
    let c = Cluster::start(3, ClusterOpts::default());
    let a = c.mount();
    let b = c.mount();
    fs::write(a.path.join("f"), b"0123456789").unwrap();
    let fa = open_rw(&a.path.join("f"));
    let fb = open_rw(&b.path.join("f"));

    // A write lock on bytes 0..10 on mount A.
    setlk(&fa, libc::F_WRLCK, 0, 10, false).unwrap();
    would_block(
        setlk(&fb, libc::F_WRLCK, 5, 1, false),
        "B's write lock inside A's",
    );
    would_block(
        setlk(&fb, libc::F_RDLCK, 0, 0, false),
        "B's read lock of the whole file",
    );
    // Beyond A's range is free.
    setlk(&fb, libc::F_WRLCK, 10, 5, false).unwrap();
    // F_GETLK on B names A's lock.
    let fl = getlk(&fb, libc::F_WRLCK, 0, 0);
    assert_eq!(i32::from(fl.l_type), libc::F_WRLCK);
    assert_eq!((fl.l_start, fl.l_len), (0, 10));
    // And on A, B's.
    let fl = getlk(&fa, libc::F_RDLCK, 12, 1);
    assert_eq!(i32::from(fl.l_type), libc::F_WRLCK);
    assert_eq!((fl.l_start, fl.l_len), (10, 5));
    let fl = getlk(&fa, libc::F_RDLCK, 100, 1);
    assert_eq!(i32::from(fl.l_type), libc::F_UNLCK, "nothing there");

    // Read locks share.
    setlk(&fa, libc::F_RDLCK, 0, 10, false).unwrap();
    setlk(&fb, libc::F_RDLCK, 0, 5, false).unwrap();
    would_block(
        setlk(&fb, libc::F_WRLCK, 0, 5, false),
        "upgrade while A reads",
    );

    // A blocked waiter on B wakes when A unlocks.
    let p = b.path.join("f");
    let waiter = std::thread::spawn(move || {
        let f = open_rw(&p);
        let t = Instant::now();
        setlk(&f, libc::F_WRLCK, 0, 10, true).map(|()| (t.elapsed(), f))
    });
    std::thread::sleep(Duration::from_millis(500));
    assert!(!waiter.is_finished(), "the waiter went through a held lock");
    setlk(&fa, libc::F_UNLCK, 0, 0, false).unwrap();
    let (waited, _held) = waiter.join().unwrap().expect("F_SETLKW");
    assert!(waited >= Duration::from_millis(400), "waited {waited:?}");
    would_block(
        setlk(&fa, libc::F_WRLCK, 0, 1, false),
        "A while the waiter holds it",
    );

    // Closing a descriptor drops the closing process's locks (POSIX).
    drop(_held);
    drop(fb);
    setlk(&fa, libc::F_WRLCK, 0, 0, false).unwrap();
    // ...any descriptor of the file, not only the one they were taken
    // through (the classic POSIX rule).
    let fa2 = open_rw(&a.path.join("f"));
    let fb = open_rw(&b.path.join("f"));
    would_block(setlk(&fb, libc::F_WRLCK, 0, 1, false), "while A holds it");
    drop(fa2);
    setlk(&fb, libc::F_WRLCK, 0, 1, false).expect("A's close of another descriptor freed it");
}

#[test]
fn flock_locks_exclude_across_mounts_and_a_waiting_flock_gives_up_on_its_signal() {
    let c = Cluster::start(2, ClusterOpts::default());
    let a = c.mount();
    let b = c.mount();
    let pa = a.path.join("lockfile");
    fs::write(&pa, b"").unwrap();
    let fa = File::open(&pa).unwrap();
    assert_eq!(unsafe { libc::flock(fa.as_raw_fd(), libc::LOCK_EX) }, 0);
    let pb = b.path.join("lockfile");
    let o = Command::new("flock")
        .args(["-n", "-E", "75"])
        .arg(&pb)
        .arg("true")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(75), "flock -n on B: {}", both(&o));
    // `flock -w 1` waits, then its alarm ends the wait.
    let t = Instant::now();
    let o = Command::new("flock")
        .args(["-w", "1", "-E", "75"])
        .arg(&pb)
        .arg("true")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(75), "flock -w 1 on B: {}", both(&o));
    assert!(
        t.elapsed() < Duration::from_secs(10),
        "took {:?}",
        t.elapsed()
    );
    // Shared locks share.
    assert_eq!(unsafe { libc::flock(fa.as_raw_fd(), libc::LOCK_SH) }, 0);
    let o = Command::new("flock")
        .args(["-n", "-s"])
        .arg(&pb)
        .arg("true")
        .output()
        .unwrap();
    assert!(o.status.success(), "shared flock on B: {}", both(&o));
    // The last close of A's file drops its flock lock.
    drop(fa);
    let o = Command::new("flock")
        .arg("-n")
        .arg(&pb)
        .arg("true")
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "flock on B after A closed: {}",
        both(&o)
    );
}

#[test]
fn a_killed_holders_locks_go() {
    let c = Cluster::start(2, ClusterOpts::default());
    let a = c.mount();
    let b = c.mount();
    let p = a.path.join("f");
    fs::write(&p, b"x").unwrap();
    // A process on mount A takes a lock and is killed with it.
    let mut holder = Command::new("python3")
        .arg("-c")
        .arg(
            "import fcntl, sys, time\n\
             f = open(sys.argv[1], 'r+')\n\
             fcntl.lockf(f, fcntl.LOCK_EX)\n\
             print('locked', flush=True)\n\
             time.sleep(600)\n",
        )
        .arg(&p)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    use std::io::BufRead;
    std::io::BufReader::new(holder.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "locked");
    let fb = open_rw(&b.path.join("f"));
    would_block(
        setlk(&fb, libc::F_WRLCK, 0, 0, false),
        "while the holder lives",
    );
    holder.kill().unwrap();
    holder.wait().unwrap();
    wait_for(
        Duration::from_secs(10),
        "the killed holder's lock to go",
        || setlk(&fb, libc::F_WRLCK, 0, 0, false).map_err(|e| e.to_string()),
    );
    setlk(&fb, libc::F_UNLCK, 0, 0, false).unwrap();

    // A whole mount killed with a lock held: its locks go within a lease
    // time (its servers stop hearing from it).
    let fa = open_rw(&p);
    setlk(&fa, libc::F_WRLCK, 0, 0, false).unwrap();
    would_block(
        setlk(&fb, libc::F_WRLCK, 0, 0, false),
        "while mount A lives",
    );
    let mut a = a;
    a.kill9();
    std::mem::forget(fa);
    let t = Instant::now();
    wait_for(Duration::from_secs(60), "a dead mount's lock to go", || {
        setlk(&fb, libc::F_WRLCK, 0, 0, false).map_err(|e| e.to_string())
    });
    eprintln!("a dead mount's lock went after {:?}", t.elapsed());
}

#[test]
fn sqlite_with_a_writer_on_each_of_two_mounts_loses_nothing() {
    let c = Cluster::start(3, ClusterOpts::default());
    let a = c.mount();
    let b = c.mount();
    let script = "import sqlite3, sys\n\
        db = sqlite3.connect(sys.argv[1], timeout=60, isolation_level=None)\n\
        db.execute('CREATE TABLE IF NOT EXISTS t (who TEXT, n INTEGER)')\n\
        for i in range(int(sys.argv[3])):\n\
        \x20   db.execute('BEGIN IMMEDIATE')\n\
        \x20   db.execute('INSERT INTO t VALUES (?, ?)', (sys.argv[2], i))\n\
        \x20   db.execute('COMMIT')\n\
        print('done', flush=True)\n";
    let run = move |mount: &Path, who: &str| {
        Command::new("python3")
            .arg("-c")
            .arg(script)
            .arg(mount.join("db.sqlite"))
            .arg(who)
            .arg("200")
            .output()
    };
    // The table first, so the two do not race to create it.
    let o = Command::new("python3")
        .arg("-c")
        .arg("import sqlite3, sys; sqlite3.connect(sys.argv[1]).execute('CREATE TABLE t (who TEXT, n INTEGER)')")
        .arg(a.path.join("db.sqlite"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", both(&o));
    let pa = a.path.clone();
    let run_a = run;
    let ta = std::thread::spawn(move || run_a(&pa, "a"));
    let ob = run(&b.path, "b").unwrap();
    let oa = ta.join().unwrap().unwrap();
    assert!(oa.status.success(), "writer on A: {}", both(&oa));
    assert!(ob.status.success(), "writer on B: {}", both(&ob));
    for m in [&a, &b] {
        let o = Command::new("python3")
            .arg("-c")
            .arg(
                "import sqlite3, sys\n\
                 db = sqlite3.connect(sys.argv[1])\n\
                 print(db.execute('PRAGMA integrity_check').fetchone()[0])\n\
                 print(db.execute('SELECT who, COUNT(*), COUNT(DISTINCT n) FROM t GROUP BY who ORDER BY who').fetchall())\n",
            )
            .arg(m.path.join("db.sqlite"))
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", both(&o));
        let out = String::from_utf8_lossy(&o.stdout);
        assert_eq!(
            out.trim(),
            "ok\n[('a', 200, 200), ('b', 200, 200)]",
            "read through {}",
            m.path.display()
        );
    }
}

#[test]
fn two_mounts_waiting_for_each_other_get_edeadlk() {
    let c = Cluster::start(2, ClusterOpts::default());
    let a = c.mount();
    let b = c.mount();
    fs::write(a.path.join("f"), b"0123456789").unwrap();
    let fa = open_rw(&a.path.join("f"));
    let fb = open_rw(&b.path.join("f"));
    setlk(&fa, libc::F_WRLCK, 0, 1, false).unwrap();
    setlk(&fb, libc::F_WRLCK, 5, 1, false).unwrap();
    // A waits for B's byte 5...
    let waiter = std::thread::spawn(move || {
        let r = setlk(&fa, libc::F_WRLCK, 5, 1, true);
        (r, fa)
    });
    std::thread::sleep(Duration::from_millis(300));
    assert!(!waiter.is_finished());
    // ...so B waiting for A's byte 0 would never end.
    match setlk(&fb, libc::F_WRLCK, 0, 1, true) {
        Err(e) => assert_eq!(e.raw_os_error(), Some(libc::EDEADLK), "{e}"),
        Ok(()) => panic!("both waits went through"),
    }
    // B gives up its byte; A's wait ends.
    setlk(&fb, libc::F_UNLCK, 5, 1, false).unwrap();
    let (r, _fa) = waiter.join().unwrap();
    r.expect("A's wait");
}

#[test]
fn a_lock_outlives_a_restart_of_its_files_owner() {
    use std::os::unix::fs::MetadataExt;
    let mut c = Cluster::start(3, ClusterOpts::default());
    let a = c.mount();
    let b = c.mount();
    let p = a.path.join("f");
    fs::write(&p, b"x").unwrap();
    let owner = (fs::metadata(&p).unwrap().ino() % 3) as usize;
    let fa = open_rw(&p);
    setlk(&fa, libc::F_WRLCK, 0, 0, false).unwrap();
    let fb = open_rw(&b.path.join("f"));
    would_block(setlk(&fb, libc::F_WRLCK, 0, 0, false), "before the restart");
    // The server keeping the lock restarts and forgets it; mount A asks
    // for it again during the grace period, before B may have it.
    c.kill9(owner);
    c.restart(owner);
    let t = Instant::now();
    would_block(setlk(&fb, libc::F_WRLCK, 0, 0, false), "after the restart");
    eprintln!("B refused {:?} after the restart", t.elapsed());
    // A still holds it, and can give it up.
    setlk(&fa, libc::F_UNLCK, 0, 0, false).unwrap();
    setlk(&fb, libc::F_WRLCK, 0, 0, false).unwrap();
}

#[test]
fn a_lock_outlives_the_takeover_of_its_files_range_on_a_mirrored_volume() {
    use std::os::unix::fs::MetadataExt;
    let mut c = Cluster::start_mirrored(3);
    let a = c.mount();
    let b = c.mount();
    let p = a.path.join("f");
    fs::write(&p, b"x").unwrap();
    let owner = (fs::metadata(&p).unwrap().ino() % 3) as usize;
    let fa = open_rw(&p);
    setlk(&fa, libc::F_WRLCK, 0, 0, false).unwrap();
    let fb = open_rw(&b.path.join("f"));
    would_block(
        setlk(&fb, libc::F_WRLCK, 0, 0, false),
        "before the owner died",
    );
    // The owner dies for good; its copy takes the range over and A asks
    // it for the lock during its grace period.
    c.kill9(owner);
    let t = Instant::now();
    // B's attempts fail while the range is unserved (EIO after the
    // client's retries) or the lock is held (EAGAIN); never granted.
    let refused = wait_for(
        Duration::from_secs(60),
        "the range to be served again",
        || match setlk(&fb, libc::F_WRLCK, 0, 0, false) {
            Ok(()) => Ok(Err("B was granted a lock A holds".to_string())),
            Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => Ok(Ok(())),
            Err(e) => Err(e.to_string()),
        },
    );
    refused.unwrap_or_else(|e| panic!("{e} ({:?} after the kill)", t.elapsed()));
    setlk(&fa, libc::F_UNLCK, 0, 0, false).unwrap();
    setlk(&fb, libc::F_WRLCK, 0, 0, false).unwrap();
}

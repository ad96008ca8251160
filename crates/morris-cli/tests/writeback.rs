//! Cache mode II (Panache, write side) end to end: changes made in a `sw`
//! cache through a real FUSE mount reach the home (a local directory) —
//! after `morris cache flush`, and by themselves within the sync lag — and
//! survive `kill -9` of any server and of the mount.

mod common;
#[path = "../../morris-home/tests/ganesha/mod.rs"]
mod ganesha;
mod nfs_harness;
mod trees;

use std::fs::{self, File};
use std::io::Write;
use std::os::unix::fs::{symlink, FileExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;
use trees::*;

/// A volume of four servers with one mount and a directory `c` in it,
/// bound to `home` with `args`.
fn bound(home: &Path, args: &[&str]) -> (Cluster, Mount) {
    bound_to(
        Cluster::start(4, ClusterOpts::default()),
        &format!("file://{}", home.display()),
        args,
    )
}

/// [`bound`] on cluster `c`, to home `url`.
fn bound_to(c: Cluster, url: &str, args: &[&str]) -> (Cluster, Mount) {
    let m = c.mount();
    let dir = m.path.join("c");
    fs::create_dir(&dir).expect("mkdir c");
    let dir = dir.to_str().expect("utf-8");
    let mut a = vec!["cache", "bind", dir, url];
    a.extend_from_slice(args);
    let o = morris(&a);
    assert!(o.status.success(), "cache bind: {}", both(&o));
    (c, m)
}

/// Every server's view of the bindings (`morris cache status --json`).
fn queue_of(c: &Cluster) -> (u64, Vec<bool>) {
    let o = morris(&["cache", "status", "--server", live(c), "--json"]);
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("json");
    let mut queued = 0;
    let mut reachable = Vec::new();
    for s in v.as_array().expect("array") {
        for b in s["bindings"].as_array().cloned().unwrap_or_default() {
            queued += b["queued"].as_u64().unwrap_or(0);
            reachable.push(b["reachable"].as_bool().unwrap_or(false));
        }
    }
    (queued, reachable)
}

/// A number of every server's status summed over its bindings
/// (`morris cache status --json`).
fn status_sum(c: &Cluster, field: &str) -> u64 {
    let o = morris(&["cache", "status", "--server", live(c), "--json"]);
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("json");
    v.as_array()
        .expect("array")
        .iter()
        .flat_map(|s| s["bindings"].as_array().cloned().unwrap_or_default())
        .map(|b| b[field].as_u64().unwrap_or(0))
        .sum()
}

/// [`assert_same_tree`] but for symlinks' times, which nfs-ganesha does not
/// set (it answers the SETATTR and keeps them).
fn assert_same_tree_nfs(home: &Path, cache: &Path) {
    let want = walk(home);
    assert_eq!(walk(cache), want, "names under {}", cache.display());
    for rel in &want {
        let (mut h, mut c) = (meta(&home.join(rel)), meta(&cache.join(rel)));
        if h.kind == "symlink" {
            h.mtime = (0, 0);
            c.mtime = (0, 0);
        }
        assert_eq!(c, h, "{}", rel.display());
        if h.kind == "file" {
            assert!(
                same_bytes(&home.join(rel), &cache.join(rel)),
                "{}: bytes",
                rel.display()
            );
        }
    }
}

fn flush(m: &Mount) {
    flush_via(m, None);
}

/// `morris cache flush` of `m`'s cache, through server `server` (default:
/// the mount's).
fn flush_via(m: &Mount, server: Option<&str>) {
    let dir = m.path.join("c");
    let mut a = vec![
        "cache",
        "flush",
        dir.to_str().expect("utf-8"),
        "--timeout",
        "120s",
    ];
    if let Some(s) = server {
        a.extend(["--server", s]);
    }
    let o = morris(&a);
    assert!(o.status.success(), "cache flush: {}", both(&o));
}

/// What home holds before the cache is bound: a few files and directories
/// the cache then fetches, changes and removes.
fn seed_home(home: &Path) {
    fs::create_dir_all(home.join("d/deep")).expect("mkdir");
    fs::write(home.join("d/f"), b"fetched from home").expect("write");
    fs::write(home.join("d/deep/g"), pattern(1, 0, 300_000)).expect("write");
    fs::write(home.join("x"), b"to be removed").expect("write");
    fs::create_dir_all(home.join("old/inner")).expect("mkdir");
    fs::write(home.join("old/inner/y"), b"y").expect("write");
    fs::write(home.join("replaced"), b"home's version").expect("write");
}

fn write_file(p: &Path, data: &[u8]) {
    let mut f = File::create(p).unwrap_or_else(|e| panic!("create {}: {e}", p.display()));
    f.write_all(data).expect("write");
    f.sync_all().expect("fsync");
}

/// The sequence of dependent changes of the issue, in cache `c`.
fn change_everything(c: &Path) {
    // Fetched objects: read, changed in attributes and data, removed,
    // replaced.
    assert_eq!(fs::read(c.join("d/f")).expect("read"), b"fetched from home");
    fs::set_permissions(c.join("d/f"), fs::Permissions::from_mode(0o640)).expect("chmod");
    let mut f = fs::OpenOptions::new()
        .append(true)
        .open(c.join("d/f"))
        .expect("open fetched for append");
    f.write_all(b", then appended to").expect("append");
    f.sync_all().expect("fsync");
    drop(f);
    // Not read before: written in the middle, without reading it first.
    let g = fs::OpenOptions::new()
        .write(true)
        .open(c.join("d/deep/g"))
        .expect("open fetched unread");
    g.write_all_at(b"CHANGED", 150_000).expect("pwrite");
    g.sync_all().expect("fsync");
    drop(g);
    fs::remove_file(c.join("x")).expect("unlink fetched");
    fs::remove_dir_all(c.join("old")).expect("rm -r fetched");
    write_file(&c.join(".replaced.tmp"), b"the cache's version");
    fs::rename(c.join(".replaced.tmp"), c.join("replaced")).expect("rename over");
    // Made in the cache.
    fs::create_dir(c.join("a")).expect("mkdir a");
    write_file(&c.join("a/f"), &pattern(2, 0, 1 << 20));
    fs::rename(c.join("a"), c.join("b")).expect("rename a -> b");
    fs::hard_link(c.join("b/f"), c.join("b/g")).expect("link");
    symlink("f", c.join("b/s")).expect("symlink");
    fs::set_permissions(c.join("b/f"), fs::Permissions::from_mode(0o600)).expect("chmod");
    let f = fs::OpenOptions::new()
        .write(true)
        .open(c.join("b/g"))
        .expect("open");
    f.set_len(100_000).expect("truncate");
    f.write_all_at(b"patched", 5_000).expect("write");
    f.sync_all().expect("fsync");
    drop(f);
    write_file(&c.join("b/temp"), b"never at home");
    fs::remove_file(c.join("b/temp")).expect("unlink temp");
    fs::create_dir_all(c.join("e/sub")).expect("mkdir -p");
    write_file(&c.join("e/sub/z"), b"z");
    fs::rename(c.join("e/sub/z"), c.join("b/z")).expect("rename across");
    fs::remove_dir(c.join("e/sub")).expect("rmdir");
    write_file(&c.join("d/new-in-fetched"), b"new");
    // A sparse file with data at both ends.
    let sparse = File::create(c.join("sparse")).expect("create");
    sparse.set_len(9 << 20).expect("set_len");
    sparse.write_all_at(b"end", (9 << 20) - 3).expect("write");
    sparse.write_all_at(b"start", 0).expect("write");
    sparse.sync_all().expect("fsync");
}

/// What home must hold after [`change_everything`] was pushed, checked
/// at home alone (a push that lost something on both sides would still
/// leave them equal).
fn assert_home_after_changes(home: &Path) {
    let want: Vec<PathBuf> = [
        "b",
        "b/f",
        "b/g",
        "b/s",
        "b/z",
        "d",
        "d/deep",
        "d/deep/g",
        "d/f",
        "d/new-in-fetched",
        "e",
        "replaced",
        "sparse",
    ]
    .iter()
    .map(PathBuf::from)
    .collect();
    assert_eq!(walk(home), want);
    let mut g = pattern(1, 0, 300_000);
    g[150_000..150_007].copy_from_slice(b"CHANGED");
    assert_eq!(fs::read(home.join("d/deep/g")).expect("read"), g);
    assert_eq!(
        fs::read(home.join("d/f")).expect("read"),
        b"fetched from home, then appended to"
    );
    assert_eq!(meta(&home.join("d/f")).mode, 0o640);
    let mut g = pattern(2, 0, 1 << 20);
    g.truncate(100_000);
    g[5_000..5_007].copy_from_slice(b"patched");
    assert_eq!(fs::read(home.join("b/f")).expect("read"), g);
    assert_eq!(meta(&home.join("b/f")).nlink, 2);
    assert_eq!(meta(&home.join("b/f")).mode, 0o600);
    assert_eq!(
        fs::read_link(home.join("b/s")).expect("readlink"),
        PathBuf::from("f")
    );
    assert_eq!(fs::read(home.join("b/z")).expect("read"), b"z");
    let sparse = fs::read(home.join("sparse")).expect("read");
    assert_eq!(sparse.len(), 9 << 20);
    assert_eq!(&sparse[..5], b"start");
    assert_eq!(&sparse[(9 << 20) - 3..], b"end");
}

#[test]
fn dependent_changes_in_a_sw_cache_reach_home_after_flush() {
    require_fuse();
    let home = tempdir();
    seed_home(home.path());
    // A long lag: nothing is pushed before the flush.
    let (cl, m) = bound(home.path(), &["--mode", "sw", "--sync-lag", "1h"]);
    let c = m.path.join("c");
    change_everything(&c);
    // Objects fetched from home keep their place.
    expect_errno(
        fs::rename(c.join("d"), c.join("d2")),
        libc::EXDEV,
        "rename of a fetched directory",
    );
    // Nothing reached home yet.
    assert!(home.path().join("x").exists(), "x pushed before the lag");
    assert!(!home.path().join("b").exists(), "b pushed before the lag");
    // Unbinding with changes still queued is refused.
    let dir = c.to_str().expect("utf-8").to_string();
    let o = morris(&["cache", "unbind", &dir]);
    assert!(
        !o.status.success(),
        "unbind with changes queued: {}",
        both(&o)
    );
    assert!(stderr(&o).contains("morris cache flush"), "{}", both(&o));
    flush(&m);
    assert_same_tree(home.path(), &c);
    assert_home_after_changes(home.path());
    assert!(!home.path().join("b/temp").exists());
    assert_eq!(
        fs::read(home.path().join("replaced")).expect("read"),
        b"the cache's version"
    );

    // A second round of changes on what was pushed: moves of pushed
    // objects, a swap of two names, a directory moved into another.
    fs::rename(c.join("b/f"), c.join("b/f2")).expect("rename pushed");
    fs::rename(c.join("b/z"), c.join("e/z")).expect("move pushed");
    fs::rename(c.join("b/s"), c.join("tmp-swap")).expect("swap 1");
    fs::rename(c.join("b/f2"), c.join("b/s")).expect("swap 2");
    fs::rename(c.join("tmp-swap"), c.join("b/f2")).expect("swap 3");
    fs::rename(c.join("e"), c.join("b/e")).expect("move dir");
    write_file(&c.join("b/e/z"), b"rewritten");
    fs::remove_file(c.join("b/g")).expect("unlink one of two names");
    flush(&m);
    assert_same_tree(home.path(), &c);

    // Flushing again with nothing queued is quick and changes nothing.
    flush(&m);
    assert_same_tree(home.path(), &c);
    // Nothing the write-back keeps looks like damage to fsck.
    fsck_clean(&cl);
}

#[test]
fn a_sw_cache_pushes_by_itself_within_the_sync_lag() {
    require_fuse();
    let home = tempdir();
    seed_home(home.path());
    let (_cl, m) = bound(home.path(), &["--mode", "sw", "--sync-lag", "1s"]);
    let c = m.path.join("c");
    change_everything(&c);
    wait_for(Duration::from_secs(60), "home equal to the cache", || {
        if home.path().join("x").exists() {
            return Err("x still at home".into());
        }
        let (h, cc) = (walk(home.path()), walk(&c));
        if h != cc {
            return Err(format!("names differ: {} vs {}", h.len(), cc.len()));
        }
        for rel in &h {
            if meta(&home.path().join(rel)) != meta(&c.join(rel)) {
                return Err(format!("{} differs", rel.display()));
            }
        }
        Ok(())
    });
    assert_same_tree(home.path(), &c);
    assert_home_after_changes(home.path());
}

#[test]
fn a_lu_cache_keeps_its_changes_and_never_pushes() {
    require_fuse();
    let home = tempdir();
    seed_home(home.path());
    let before = walk(home.path());
    let (_cl, m) = bound(home.path(), &["--mode", "lu", "--sync-lag", "1s"]);
    let c = m.path.join("c");
    change_everything(&c);
    flush(&m);
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(walk(home.path()), before, "home changed under lu");
    assert_eq!(fs::read(c.join("b/z")).expect("read"), b"z");
    assert!(!c.join("x").exists());
}

#[test]
fn kill_9_of_each_server_with_changes_queued_loses_nothing() {
    require_fuse();
    let home = tempdir();
    seed_home(home.path());
    let (mut cl, m) = bound(home.path(), &["--mode", "sw", "--sync-lag", "1h"]);
    let c = m.path.join("c");
    for i in 0..4 {
        let dir = c.join(format!("round{i}"));
        fs::create_dir(&dir).expect("mkdir");
        for j in 0..20 {
            write_file(&dir.join(format!("f{j}")), &pattern(i * 100 + j, 0, 70_000));
        }
        fs::rename(dir.join("f0"), dir.join("renamed")).expect("rename");
        fs::remove_file(dir.join("f1")).expect("unlink");
        cl.kill9(i as usize);
        cl.restart(i as usize);
        // The change made while a server was away waits in its queue too.
        write_file(&dir.join("after-restart"), b"after");
    }
    flush(&m);
    assert_same_tree(home.path(), &c);
    // Nothing applied twice: pushing again finds nothing to do.
    flush(&m);
    assert_same_tree(home.path(), &c);
}

#[test]
fn kill_9_of_the_mount_loses_no_acknowledged_change() {
    require_fuse();
    let home = tempdir();
    let (cl, mut m) = bound(home.path(), &["--mode", "sw", "--sync-lag", "1h"]);
    let c = m.path.join("c");
    fs::create_dir(c.join("kept")).expect("mkdir");
    for j in 0..30 {
        write_file(
            &c.join(format!("kept/f{j}")),
            &pattern(j, 0, 10_000 + j as usize),
        );
    }
    let cache_tree: Vec<PathBuf> = walk(&c);
    m.kill9();
    let m2 = cl.mount();
    let c2 = m2.path.join("c");
    assert_eq!(walk(&c2), cache_tree);
    flush(&m2);
    assert_same_tree(home.path(), &c2);
}

#[test]
fn kill_9_of_each_server_during_a_push_loses_nothing() {
    require_fuse();
    let home = tempdir();
    let (mut cl, m) = bound(home.path(), &["--mode", "sw", "--sync-lag", "1h"]);
    let c = m.path.join("c");
    for i in 0..4 {
        let dir = c.join(format!("round{i}"));
        fs::create_dir(&dir).expect("mkdir");
        write_file(&dir.join("big"), &pattern(i, 0, 48 << 20));
        for j in 0..50 {
            write_file(&dir.join(format!("f{j}")), &pattern(i * 100 + j, 0, 5_000));
        }
        let dirs = c.to_str().expect("utf-8").to_string();
        let pushing =
            std::thread::spawn(move || morris(&["cache", "flush", &dirs, "--timeout", "5s"]));
        std::thread::sleep(Duration::from_millis(300 + 200 * i));
        cl.kill9(i as usize);
        let _ = pushing.join();
        cl.restart(i as usize);
        fs::remove_file(dir.join("f3")).expect("unlink after restart");
    }
    flush(&m);
    assert_same_tree(home.path(), &c);
    for i in 0..4 {
        assert_eq!(
            fs::read(home.path().join(format!("round{i}/big"))).expect("read"),
            pattern(i, 0, 48 << 20)
        );
    }
}

/// A file removed in the cache while still open (or not reaped yet) with
/// changes queued: its name goes at home, and nothing of it is taken for
/// a conflict (before, its queued data was pushed after the removal and
/// kept at home in `.conflicts/`).
#[test]
fn a_file_removed_while_open_with_changes_queued_is_only_removed_at_home() {
    require_fuse();
    let home = tempdir();
    let (_cl, m) = bound(home.path(), &["--mode", "sw", "--sync-lag", "1h"]);
    let c = m.path.join("c");
    write_file(&c.join("f"), b"pushed once");
    write_file(&c.join("g"), b"stays");
    flush(&m);
    assert_eq!(
        fs::read(home.path().join("f")).expect("read"),
        b"pushed once"
    );
    let mut open = fs::OpenOptions::new()
        .append(true)
        .open(c.join("f"))
        .expect("open");
    open.write_all(b", then written").expect("write");
    open.sync_all().expect("fsync");
    fs::remove_file(c.join("f")).expect("unlink");
    flush(&m);
    assert!(
        !home.path().join(".conflicts").exists(),
        "a removed file was taken for a conflict"
    );
    assert_same_tree(home.path(), &c);
    // Still the writer's while open; nothing of it goes home after either.
    open.write_all(b", and again").expect("write");
    open.sync_all().expect("fsync");
    drop(open);
    flush(&m);
    assert!(!home.path().join(".conflicts").exists());
    assert_same_tree(home.path(), &c);
}

#[test]
fn with_mirrored_metadata_the_push_goes_on_while_any_one_server_is_down() {
    require_fuse();
    let home = tempdir();
    seed_home(home.path());
    let (mut cl, m) = bound_to(
        Cluster::start_mirrored(4),
        &format!("file://{}", home.path().display()),
        &["--mode", "sw", "--sync-lag", "1h"],
    );
    change_everything(&m.path.join("c"));
    drop(m);
    for i in 0..4 {
        // A fresh mount each time: a client holds a server it lost as down
        // for a while after it is back (not what is tested here).
        let m = cl.mount();
        let c = m.path.join("c");
        cl.kill9(i);
        let dir = c.join(format!("while-{i}-down"));
        fs::create_dir(&dir).expect("mkdir");
        if let Err(e) = fs::write(dir.join("f"), pattern(i as u64, 0, 3 << 20)) {
            panic!("write with server {i} down: {e}\n{}", read_log(&m.log));
        }
        flush_via(&m, Some(live(&cl)));
        assert_same_tree(home.path(), &c);
        drop(m);
        cl.restart(i);
        wait_healthy(&cl);
    }
    assert_home_after_changes_plus(home.path());
}

/// [`assert_home_after_changes`] and the directories the mirrored test adds.
fn assert_home_after_changes_plus(home: &Path) {
    for i in 0..4u64 {
        assert_eq!(
            fs::read(home.join(format!("while-{i}-down/f"))).expect("read"),
            pattern(i, 0, 3 << 20)
        );
    }
    for d in 0..4 {
        fs::remove_dir_all(home.join(format!("while-{d}-down"))).expect("rm");
    }
    assert_home_after_changes(home);
}

#[test]
fn an_nfs_home_gets_the_dependent_changes() {
    require_fuse();
    let work = tempdir();
    let export = work.path().join("export");
    fs::create_dir(&export).expect("mkdir");
    seed_home(&export);
    let g = ganesha::Ganesha::start_new(&export, &work.path().join("ganesha"));
    let (_cl, m) = bound_to(
        Cluster::start(4, ClusterOpts::default()),
        &g.url().to_string(),
        &["--mode", "sw", "--sync-lag", "1h"],
    );
    let c = m.path.join("c");
    change_everything(&c);
    write_file(&c.join("big"), &pattern(7, 0, 40 << 20));
    flush(&m);
    assert_same_tree_nfs(&export, &c);
    fs::remove_file(export.join("big")).expect("rm big");
    assert_home_after_changes(&export);
    drop(g);
}

#[test]
fn with_an_nfs_home_down_changes_are_queued_and_pushed_when_it_returns() {
    require_fuse();
    let work = tempdir();
    let export = work.path().join("export");
    fs::create_dir(&export).expect("mkdir");
    seed_home(&export);
    let mut g = ganesha::Ganesha::start_new(&export, &work.path().join("ganesha"));
    let (cl, m) = bound_to(
        Cluster::start(4, ClusterOpts::default()),
        &g.url().to_string(),
        &["--mode", "sw", "--sync-lag", "1s", "--timeout", "2s"],
    );
    let c = m.path.join("c");
    // Read (and listed) before home goes away.
    assert_eq!(fs::read(c.join("d/f")).expect("read"), b"fetched from home");
    assert_eq!(
        fs::read(c.join("d/deep/g")).expect("read"),
        pattern(1, 0, 300_000)
    );
    let _ = walk(&c);
    g.stop();
    // Cached data is read, changes are made, at local speed.
    assert_eq!(fs::read(c.join("d/f")).expect("read"), b"fetched from home");
    change_everything(&c);
    std::thread::sleep(Duration::from_secs(4));
    let (queued, reachable) = queue_of(&cl);
    assert!(queued > 0, "nothing queued with home down");
    assert!(
        reachable.iter().any(|r| !r),
        "home shown reachable while down: {reachable:?}"
    );
    g.start();
    let dir = c.to_str().expect("utf-8").to_string();
    let o = morris(&["cache", "flush", &dir, "--timeout", "60s"]);
    assert!(o.status.success(), "flush: {}\n{}", both(&o), cl.logs());
    assert_same_tree_nfs(&export, &c);
    assert_home_after_changes(&export);
    assert_eq!(queue_of(&cl).0, 0);
}

#[test]
fn a_1_gib_file_written_in_a_sw_cache_reaches_home_whole() {
    require_fuse();
    let home = tempdir();
    let (cl, m) = bound(home.path(), &["--mode", "sw", "--sync-lag", "1h"]);
    let c = m.path.join("c");
    let len: usize = 1 << 30;
    let piece = 4 << 20;
    let mut f = File::create(c.join("big")).expect("create");
    let mut off = 0;
    while off < len {
        f.write_all(&pattern(9, off as u64, piece)).expect("write");
        off += piece;
    }
    f.sync_all().expect("fsync");
    drop(f);
    // Status counts the queued file's bytes, then the push and its time.
    assert_eq!(status_sum(&cl, "dirty_bytes"), len as u64);
    flush(&m);
    assert_eq!(status_sum(&cl, "dirty_bytes"), 0);
    assert!(status_sum(&cl, "pushed_bytes") >= len as u64);
    assert!(status_sum(&cl, "push_ms") > 0);
    let mut h = File::open(home.path().join("big")).expect("open at home");
    assert_eq!(h.metadata().expect("stat").len(), len as u64);
    let mut buf = vec![0u8; piece];
    let mut off = 0;
    while off < len {
        std::io::Read::read_exact(&mut h, &mut buf).expect("read at home");
        assert!(
            buf == pattern(9, off as u64, piece),
            "bytes at {off} differ at home"
        );
        off += piece;
    }
    assert_eq!(meta(&home.path().join("big")), meta(&c.join("big")));
}

#[test]
fn files_written_through_the_nfs_gateway_reach_home() {
    require_fuse();
    let home = tempdir();
    seed_home(home.path());
    let (cl, m) = bound(home.path(), &["--mode", "sw", "--sync-lag", "1h"]);
    let gw = nfs_harness::Gateway::start(cl.addr(0), &[]);
    let src = home.path().join("d/deep/g");
    let o = std::process::Command::new("nfs-cp")
        .arg(&src)
        .arg(gw.file_url("c/d/copied"))
        .output()
        .expect("run nfs-cp");
    assert!(o.status.success(), "nfs-cp into a sw cache: {}", both(&o));
    flush(&m);
    assert_eq!(
        fs::read(home.path().join("d/copied")).expect("read at home"),
        pattern(1, 0, 300_000)
    );
    assert_same_tree(home.path(), &m.path.join("c"));
}

/// A home tree for the moves below: files never read, read, and a
/// directory with contents never listed.
fn seed_moves(home: &Path) {
    fs::create_dir_all(home.join("mv/dir/sub")).expect("mkdir");
    fs::create_dir_all(home.join("other")).expect("mkdir");
    fs::write(home.join("mv/unread"), pattern(3, 0, 700_000)).expect("write");
    fs::write(home.join("mv/read"), b"read before it moves").expect("write");
    fs::write(home.join("mv/written"), b"written, ").expect("write");
    fs::write(home.join("mv/twice"), pattern(4, 0, 200_000)).expect("write");
    fs::write(home.join("mv/dir/sub/x"), pattern(5, 0, 500_000)).expect("write");
    fs::write(home.join("mv/dir/y"), b"y").expect("write");
}

#[test]
fn objects_fetched_from_an_nfs_home_move_in_a_sw_cache_and_at_home() {
    require_fuse();
    let work = tempdir();
    let export = work.path().join("export");
    fs::create_dir(&export).expect("mkdir");
    seed_moves(&export);
    let g = ganesha::Ganesha::start_new(&export, &work.path().join("ganesha"));
    let (_cl, m) = bound_to(
        Cluster::start(4, ClusterOpts::default()),
        &g.url().to_string(),
        &["--mode", "sw", "--sync-lag", "1h"],
    );
    let c = m.path.join("c");
    assert_eq!(
        fs::read(c.join("mv/read")).expect("read"),
        b"read before it moves"
    );
    let mut f = fs::OpenOptions::new()
        .append(true)
        .open(c.join("mv/written"))
        .expect("open for append");
    f.write_all(b"then moved").expect("append");
    f.sync_all().expect("fsync");
    drop(f);
    // Within a directory, across directories, a directory with contents
    // never listed, a written file, and one moved twice before a push.
    fs::rename(c.join("mv/unread"), c.join("mv/unread-renamed")).expect("rename in place");
    fs::rename(c.join("mv/read"), c.join("other/read")).expect("rename across");
    fs::rename(c.join("mv/dir"), c.join("moved-dir")).expect("rename a directory");
    fs::rename(c.join("mv/written"), c.join("other/written")).expect("rename written");
    fs::create_dir(c.join("new")).expect("mkdir");
    fs::rename(c.join("mv/twice"), c.join("mv/once")).expect("rename");
    fs::rename(c.join("mv/once"), c.join("new/twice")).expect("rename again");
    // Read after the move (not fetched before it): home's bytes.
    assert_eq!(
        fs::read(c.join("moved-dir/sub/x")).expect("read moved"),
        pattern(5, 0, 500_000)
    );
    flush(&m);
    assert_same_tree_nfs(&export, &c);
    for gone in [
        "mv/unread",
        "mv/read",
        "mv/dir",
        "mv/written",
        "mv/twice",
        "mv/once",
    ] {
        assert!(!export.join(gone).exists(), "{gone} still at home");
    }
    assert_eq!(
        fs::read(export.join("mv/unread-renamed")).expect("read"),
        pattern(3, 0, 700_000)
    );
    assert_eq!(
        fs::read(export.join("other/written")).expect("read"),
        b"written, then moved"
    );
    assert_eq!(
        fs::read(export.join("moved-dir/sub/x")).expect("read"),
        pattern(5, 0, 500_000)
    );
    assert_eq!(
        fs::read(export.join("new/twice")).expect("read"),
        pattern(4, 0, 200_000)
    );
    // Moved again after its move was pushed, and read whole in the cache.
    fs::rename(c.join("new/twice"), c.join("mv/back")).expect("rename back");
    fs::rename(c.join("moved-dir"), c.join("other/moved-dir")).expect("rename again");
    flush(&m);
    assert_eq!(
        fs::read(export.join("mv/back")).expect("read"),
        pattern(4, 0, 200_000)
    );
    assert_eq!(
        fs::read(c.join("mv/back")).expect("read"),
        pattern(4, 0, 200_000)
    );
    assert!(export.join("other/moved-dir/sub/x").exists());
    assert_same_tree_nfs(&export, &c);
    drop(g);
}

#[test]
fn with_a_local_home_fetched_objects_move_once_written_and_else_answer_exdev() {
    require_fuse();
    let home = tempdir();
    seed_moves(home.path());
    let (_cl, m) = bound(home.path(), &["--mode", "sw", "--sync-lag", "1h"]);
    let c = m.path.join("c");
    // A local directory's handles are paths: home's data does not move.
    let e = fs::rename(c.join("mv/read"), c.join("mv/read2")).expect_err("moved");
    assert_eq!(e.raw_os_error(), Some(libc::EXDEV), "{e}");
    // Written, it is the cache's own, and moves.
    let mut f = fs::OpenOptions::new()
        .append(true)
        .open(c.join("mv/written"))
        .expect("open for append");
    f.write_all(b"then moved").expect("append");
    drop(f);
    fs::rename(c.join("mv/written"), c.join("other/written")).expect("rename written");
    flush(&m);
    assert!(!home.path().join("mv/written").exists());
    assert_eq!(
        fs::read(home.path().join("other/written")).expect("read"),
        b"written, then moved"
    );
    assert_same_tree(home.path(), &c);
}

#[test]
fn links_and_renames_of_pushed_files_reach_home_as_links_and_renames() {
    require_fuse();
    let home = tempdir();
    seed_moves(home.path());
    let (_cl, m) = bound(home.path(), &["--mode", "sw", "--sync-lag", "1h"]);
    let c = m.path.join("c");
    write_file(&c.join("mv/f"), b"two names");
    fs::hard_link(c.join("mv/f"), c.join("mv/g")).expect("link");
    flush(&m);
    let h = home.path();
    assert_eq!(fs::read(h.join("mv/g")).expect("read"), b"two names");
    // One name of two goes; then the other is renamed in its directory.
    fs::remove_file(c.join("mv/f")).expect("unlink one name");
    flush(&m);
    assert!(
        !h.join("mv/f").exists(),
        "the removed link is still at home"
    );
    assert_eq!(meta(&h.join("mv/g")).nlink, 1);
    let before = {
        use std::os::unix::fs::MetadataExt;
        fs::metadata(h.join("mv/g")).expect("stat").ino()
    };
    fs::rename(c.join("mv/g"), c.join("mv/h")).expect("rename in place");
    flush(&m);
    assert!(!h.join("mv/g").exists());
    let after = {
        use std::os::unix::fs::MetadataExt;
        fs::metadata(h.join("mv/h")).expect("stat").ino()
    };
    assert_eq!(after, before, "renamed at home, not made again");
    assert_same_tree(h, &c);
}

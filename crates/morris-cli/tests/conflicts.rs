//! Cache mode II's independent writers and conflicts end to end (a real
//! FUSE mount, a local directory as home, changed behind the cache's back
//! as another writer would): both versions of an object changed on both
//! sides are kept, home's at its path and the cache's under `.conflicts/`;
//! another writer's names and changes come into an `iw` cache; the cache's
//! removals and creations reach home.

mod common;
#[path = "../../morris-home/tests/ganesha/mod.rs"]
mod ganesha;
mod trees;

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use common::*;
use trees::*;

/// A volume of four servers with one mount and a directory `c` in it,
/// bound to `home` with `args`.
fn bound(home: &Path, args: &[&str]) -> (Cluster, Mount) {
    bound_to(&format!("file://{}", home.display()), args)
}

/// [`bound`], to home `url`.
fn bound_to(url: &str, args: &[&str]) -> (Cluster, Mount) {
    let c = Cluster::start(4, ClusterOpts::default());
    let m = c.mount();
    let dir = m.path.join("c");
    fs::create_dir(&dir).expect("mkdir c");
    let mut a = vec!["cache", "bind", dir.to_str().expect("utf-8"), url];
    a.extend_from_slice(args);
    let o = morris(&a);
    assert!(o.status.success(), "cache bind: {}", both(&o));
    (c, m)
}

fn flush(m: &Mount) {
    let dir = m.path.join("c");
    let o = morris(&[
        "cache",
        "flush",
        dir.to_str().expect("utf-8"),
        "--timeout",
        "120s",
    ]);
    assert!(o.status.success(), "cache flush: {}", both(&o));
}

/// Another writer changes `p` at home: new bytes, and an mtime an hour
/// ahead (no clock coarseness can hide the change).
fn change_at_home(p: &Path, data: &[u8]) {
    fs::write(p, data).expect("write at home");
    let f = fs::File::options().write(true).open(p).expect("open");
    f.set_modified(SystemTime::now() + Duration::from_secs(3600))
        .expect("set mtime");
}

/// The files in home's `.conflicts/` whose names start with `name.`, with
/// their bytes.
fn kept(home: &Path, name: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let dir = home.join(".conflicts");
    let Ok(rd) = fs::read_dir(&dir) else {
        return Vec::new();
    };
    let mut out: Vec<(PathBuf, Vec<u8>)> = rd
        .filter_map(|e| e.ok())
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with(&format!("{name}.conflict-"))
        })
        .map(|e| {
            let p = e.path();
            let b = fs::read(&p).expect("read kept");
            (p, b)
        })
        .collect();
    out.sort();
    out
}

/// Conflicts counted by every server (`morris cache status --json`).
fn conflicts_counted(c: &Cluster) -> u64 {
    let o = morris(&["cache", "status", "--server", c.addr(0), "--json"]);
    assert!(o.status.success(), "cache status: {}", both(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("json");
    v.as_array()
        .expect("array")
        .iter()
        .flat_map(|s| s["bindings"].as_array().cloned().unwrap_or_default())
        .map(|b| b["conflicts"].as_u64().unwrap_or(0))
        .sum()
}

fn seed(home: &Path) {
    fs::create_dir_all(home.join("d")).expect("mkdir");
    fs::write(home.join("d/f"), b"home v1").expect("write");
    fs::write(home.join("d/keep"), b"kept as it is").expect("write");
    fs::write(home.join("d/del"), b"removed in the cache").expect("write");
    fs::write(home.join("d/later"), b"changed at home later").expect("write");
    for t in ["tree", "gone"] {
        fs::create_dir_all(home.join(t).join("sub")).expect("mkdir");
        fs::write(home.join(t).join("a"), b"a").expect("write");
        fs::write(home.join(t).join("sub/b"), b"b").expect("write");
    }
}

#[test]
fn an_iw_cache_keeps_both_versions_and_merges_both_writers_names() {
    require_fuse();
    let home = tempdir();
    let h = home.path();
    seed(h);
    independent_writers(h, &format!("file://{}", h.display()));
}

#[test]
fn with_an_nfs_home_an_iw_cache_keeps_both_versions_and_merges_names() {
    require_fuse();
    let work = tempdir();
    let export = work.path().join("export");
    fs::create_dir(&export).expect("mkdir");
    seed(&export);
    let g = ganesha::Ganesha::start_new(&export, &work.path().join("ganesha"));
    // Home's other writer writes the exported directory itself.
    independent_writers(&export, &g.url().to_string());
    drop(g);
}

/// The independent-writer scenario: home `h` (reached as `url`) and an
/// `iw` cache change the same objects and names.
fn independent_writers(h: &Path, url: &str) {
    let (cl, m) = bound_to(
        url,
        &["--mode", "iw", "--sync-lag", "1h", "--validity", "1s"],
    );
    let c = m.path.join("c");
    // The cache reads, then writes d/f; home writes it too meanwhile.
    assert_eq!(fs::read(c.join("d/f")).expect("read"), b"home v1");
    assert_eq!(
        fs::read(c.join("d/later")).expect("read"),
        b"changed at home later"
    );
    fs::write(c.join("d/f"), b"cache v2").expect("write in the cache");
    change_at_home(&h.join("d/f"), b"home v2, longer");
    // Names: each side makes one; both make `same`; the cache removes one.
    fs::write(c.join("d/mine"), b"mine").expect("create in the cache");
    fs::write(c.join("d/same"), b"the cache's same").expect("create in the cache");
    fs::remove_file(c.join("d/del")).expect("remove in the cache");
    fs::write(h.join("d/theirs"), b"theirs").expect("create at home");
    fs::write(h.join("d/same"), b"home's same").expect("create at home");
    // Two trees removed in the cache; another writer adds to one of them
    // after the cache listed it.
    fs::remove_dir_all(c.join("tree")).expect("rm -r tree in the cache");
    fs::remove_dir_all(c.join("gone")).expect("rm -r gone in the cache");
    fs::write(h.join("tree/sub/new"), b"another writer's").expect("create at home");
    flush(&m);

    // Home: its own versions at their paths, the cache's under .conflicts/.
    assert_eq!(fs::read(h.join("d/f")).expect("read"), b"home v2, longer");
    let kf = kept(h, "f");
    assert_eq!(kf.len(), 1, "the cache's d/f kept once: {kf:?}");
    assert_eq!(kf[0].1, b"cache v2");
    assert_eq!(fs::read(h.join("d/same")).expect("read"), b"home's same");
    let ks = kept(h, "same");
    assert_eq!(ks.len(), 1, "the cache's d/same kept once: {ks:?}");
    assert_eq!(ks[0].1, b"the cache's same");
    // Both writers' names, the cache's removal.
    assert_eq!(fs::read(h.join("d/theirs")).expect("read"), b"theirs");
    assert_eq!(fs::read(h.join("d/mine")).expect("read"), b"mine");
    assert_eq!(fs::read(h.join("d/keep")).expect("read"), b"kept as it is");
    assert!(!h.join("d/del").exists(), "d/del still at home");
    // What the cache removed goes, another writer's name stays (with the
    // directories that hold it: two more conflicts).
    assert!(!h.join("gone").exists(), "gone still at home");
    assert!(!h.join("tree/a").exists() && !h.join("tree/sub/b").exists());
    assert_eq!(
        fs::read(h.join("tree/sub/new")).expect("read"),
        b"another writer's"
    );
    assert_eq!(conflicts_counted(&cl), 4);

    // The cache comes to show the same: home's versions, another writer's
    // names, the kept versions under .conflicts/.
    wait_for(
        Duration::from_secs(30),
        "the cache to show home's d/f",
        || match fs::read(c.join("d/f")) {
            Ok(b) if b == b"home v2, longer" => Ok(()),
            other => Err(format!("{other:?}")),
        },
    );
    wait_for(Duration::from_secs(30), "another writer's names", || {
        if c.join("d/theirs").exists() && c.join(".conflicts").exists() {
            Ok(())
        } else {
            Err("not yet".into())
        }
    });
    assert_eq!(fs::read(c.join("d/same")).expect("read"), b"home's same");
    assert_eq!(fs::read(c.join("d/mine")).expect("read"), b"mine");
    assert!(!c.join("d/del").exists());
    wait_for(
        Duration::from_secs(30),
        "tree/sub/new in the cache",
        || match fs::read(c.join("tree/sub/new")) {
            Ok(b) if b == b"another writer's" => Ok(()),
            other => Err(format!("{other:?}")),
        },
    );
    assert_same_tree(h, &c);

    // Home's later change to a file nobody changed in the cache comes in,
    // as does one to a file the cache made and pushed.
    change_at_home(&h.join("d/later"), b"changed at home, later still");
    change_at_home(&h.join("d/mine"), b"mine, changed at home");
    wait_for(Duration::from_secs(30), "home's later changes", || {
        let a = fs::read(c.join("d/later")).map_err(|e| e.to_string())?;
        let b = fs::read(c.join("d/mine")).map_err(|e| e.to_string())?;
        if a == b"changed at home, later still" && b == b"mine, changed at home" {
            Ok(())
        } else {
            Err(format!("{a:?} {b:?}"))
        }
    });
    // A second change in the cache, with home unchanged since: no conflict.
    fs::write(c.join("d/mine"), b"mine, again in the cache").expect("write");
    flush(&m);
    assert_eq!(
        fs::read(h.join("d/mine")).expect("read"),
        b"mine, again in the cache"
    );
    assert_eq!(conflicts_counted(&cl), 4);
    assert!(kept(h, "mine").is_empty());
}

#[test]
fn with_on_conflict_cache_the_caches_version_takes_homes_path() {
    require_fuse();
    let home = tempdir();
    let h = home.path();
    seed(h);
    cache_wins(h, &format!("file://{}", h.display()));
}

#[test]
fn with_an_nfs_home_and_on_conflict_cache_the_caches_version_takes_homes_path() {
    require_fuse();
    let work = tempdir();
    let export = work.path().join("export");
    fs::create_dir(&export).expect("mkdir");
    seed(&export);
    let g = ganesha::Ganesha::start_new(&export, &work.path().join("ganesha"));
    cache_wins(&export, &g.url().to_string());
    drop(g);
}

/// The cache-wins scenario: home `h` (reached as `url`) and an `iw` cache
/// bound with `--on-conflict cache` change the same objects and names;
/// home's versions end under `.conflicts/`.
fn cache_wins(h: &Path, url: &str) {
    use std::os::unix::fs::PermissionsExt;
    let (cl, m) = bound_to(
        url,
        &[
            "--mode",
            "iw",
            "--sync-lag",
            "1h",
            "--validity",
            "1s",
            "--on-conflict",
            "cache",
        ],
    );
    let c = m.path.join("c");
    // Data written on both sides.
    assert_eq!(fs::read(c.join("d/f")).expect("read"), b"home v1");
    fs::write(c.join("d/f"), b"cache v2").expect("write in the cache");
    change_at_home(&h.join("d/f"), b"home v2, longer");
    // Only attributes changed in the cache, the data at home.
    fs::set_permissions(c.join("d/keep"), fs::Permissions::from_mode(0o600)).expect("chmod");
    change_at_home(&h.join("d/keep"), b"kept, changed at home");
    // A name made on both sides.
    fs::write(c.join("d/same"), b"the cache's same").expect("create in the cache");
    fs::write(h.join("d/same"), b"home's same").expect("create at home");
    fs::write(c.join("d/mine"), b"mine").expect("create in the cache");
    flush(&m);

    assert_eq!(fs::read(h.join("d/f")).expect("read"), b"cache v2");
    let kf = kept(h, "f");
    assert_eq!(kf.len(), 1, "home's d/f kept once: {kf:?}");
    assert_eq!(kf[0].1, b"home v2, longer");
    assert_eq!(
        fs::read(h.join("d/same")).expect("read"),
        b"the cache's same"
    );
    let ks = kept(h, "same");
    assert_eq!(ks.len(), 1, "home's d/same kept once: {ks:?}");
    assert_eq!(ks[0].1, b"home's same");
    // The cache's mode on home's data (the cache wrote none), home's
    // version kept too.
    assert_eq!(
        fs::read(h.join("d/keep")).expect("read"),
        b"kept, changed at home"
    );
    assert_eq!(meta(&h.join("d/keep")).mode & 0o7777, 0o600);
    assert_eq!(kept(h, "keep").len(), 1);
    assert_eq!(fs::read(h.join("d/mine")).expect("read"), b"mine");
    assert_eq!(conflicts_counted(&cl), 3);
    // The cache reads home's data of d/keep now, its own elsewhere.
    wait_for(
        Duration::from_secs(30),
        "the cache to read home's d/keep",
        || match fs::read(c.join("d/keep")) {
            Ok(b) if b == b"kept, changed at home" => Ok(()),
            other => Err(format!("{other:?}")),
        },
    );
    assert_eq!(fs::read(c.join("d/f")).expect("read"), b"cache v2");
    assert_eq!(
        fs::read(c.join("d/same")).expect("read"),
        b"the cache's same"
    );

    // Another writer removes a file the cache made; the cache writes it
    // again before it learns: made again at home.
    fs::remove_file(h.join("d/mine")).expect("remove at home");
    fs::write(c.join("d/mine"), b"mine, again").expect("write in the cache");
    flush(&m);
    assert_eq!(fs::read(h.join("d/mine")).expect("read"), b"mine, again");
    assert_eq!(conflicts_counted(&cl), 4);
    wait_for(Duration::from_secs(30), ".conflicts/ in the cache", || {
        if c.join(".conflicts").exists() {
            Ok(())
        } else {
            Err("not yet".into())
        }
    });
    wait_for(Duration::from_secs(30), "the same tree", || {
        if walk(h) == walk(&c) {
            Ok(())
        } else {
            Err(format!("{:?} vs {:?}", walk(h), walk(&c)))
        }
    });
    assert_same_tree(h, &c);
}

#[test]
fn in_an_iw_cache_with_an_nfs_home_fetched_and_pushed_objects_move_at_home() {
    require_fuse();
    let work = tempdir();
    let export = work.path().join("export");
    fs::create_dir(&export).expect("mkdir");
    seed(&export);
    let h = export.as_path();
    let g = ganesha::Ganesha::start_new(&export, &work.path().join("ganesha"));
    let (_cl, m) = bound_to(
        &g.url().to_string(),
        &["--mode", "iw", "--sync-lag", "1h", "--validity", "1s"],
    );
    let c = m.path.join("c");
    fs::write(c.join("d/mine"), b"made in the cache").expect("create");
    flush(&m);
    assert_eq!(
        fs::read(h.join("d/mine")).expect("read"),
        b"made in the cache"
    );
    // A fetched file (read), a fetched directory (not listed), and a file
    // made here and pushed (home's from then on) move; another writer
    // adds a name meanwhile.
    assert_eq!(fs::read(c.join("d/keep")).expect("read"), b"kept as it is");
    fs::rename(c.join("d/keep"), c.join("d/kept-moved")).expect("rename fetched");
    fs::rename(c.join("gone"), c.join("d/gone-moved")).expect("rename fetched dir");
    fs::rename(c.join("d/mine"), c.join("tree/mine")).expect("rename pushed");
    fs::write(h.join("d/theirs"), b"theirs").expect("create at home");
    flush(&m);
    assert!(!h.join("d/keep").exists() && !h.join("gone").exists() && !h.join("d/mine").exists());
    assert_eq!(
        fs::read(h.join("d/kept-moved")).expect("read"),
        b"kept as it is"
    );
    assert_eq!(fs::read(h.join("d/gone-moved/sub/b")).expect("read"), b"b");
    assert_eq!(
        fs::read(h.join("tree/mine")).expect("read"),
        b"made in the cache"
    );
    assert_eq!(fs::read(h.join("d/theirs")).expect("read"), b"theirs");
    wait_for(Duration::from_secs(30), "another writer's name", || {
        if c.join("d/theirs").exists() {
            Ok(())
        } else {
            Err("not yet".into())
        }
    });
    assert_same_tree(h, &c);
    drop(g);
}

#[test]
fn a_sw_cache_winning_conflicts_makes_a_file_home_removed_again_with_its_bytes() {
    use std::os::unix::fs::PermissionsExt;
    require_fuse();
    let home = tempdir();
    let h = home.path();
    seed(h);
    let (cl, m) = bound(
        h,
        &["--mode", "sw", "--sync-lag", "1h", "--on-conflict", "cache"],
    );
    let c = m.path.join("c");
    fs::write(c.join("d/made"), b"made in the cache").expect("create in the cache");
    assert_eq!(fs::read(c.join("d/f")).expect("read"), b"home v1");
    flush(&m);
    // Home removes the made file and changes a fetched one behind the
    // cache's back; the cache changes only the mode of the first, the
    // bytes of the second.
    fs::remove_file(h.join("d/made")).expect("remove at home");
    change_at_home(&h.join("d/f"), b"home v2");
    fs::set_permissions(c.join("d/made"), fs::Permissions::from_mode(0o640)).expect("chmod");
    fs::write(c.join("d/f"), b"cache v2").expect("write in the cache");
    flush(&m);
    assert_eq!(
        fs::read(h.join("d/made")).expect("read"),
        b"made in the cache"
    );
    assert_eq!(meta(&h.join("d/made")).mode & 0o7777, 0o640);
    assert_eq!(fs::read(h.join("d/f")).expect("read"), b"cache v2");
    assert_eq!(kept(h, "f")[0].1, b"home v2");
    assert_eq!(conflicts_counted(&cl), 2);
    assert_eq!(meta(&h.join("d")), meta(&c.join("d")));
}

#[test]
fn a_sw_cache_keeps_its_version_when_home_changed_behind_its_back() {
    require_fuse();
    let home = tempdir();
    let h = home.path();
    seed(h);
    let (cl, m) = bound(h, &["--mode", "sw", "--sync-lag", "1h"]);
    let c = m.path.join("c");
    assert_eq!(fs::read(c.join("d/f")).expect("read"), b"home v1");
    fs::write(c.join("d/f"), b"cache v2").expect("write in the cache");
    fs::write(c.join("d/new"), b"new").expect("create in the cache");
    flush(&m);
    assert_eq!(fs::read(h.join("d/f")).expect("read"), b"cache v2");
    // Home changes the pushed file; the cache changes it again.
    change_at_home(&h.join("d/f"), b"home v3");
    change_at_home(&h.join("d/new"), b"new at home");
    fs::write(c.join("d/f"), b"cache v3").expect("write in the cache");
    fs::write(c.join("d/new"), b"new in the cache").expect("write in the cache");
    flush(&m);
    assert_eq!(fs::read(h.join("d/f")).expect("read"), b"home v3");
    assert_eq!(fs::read(h.join("d/new")).expect("read"), b"new at home");
    assert_eq!(kept(h, "f").len(), 1);
    assert_eq!(kept(h, "f")[0].1, b"cache v3");
    assert_eq!(kept(h, "new")[0].1, b"new in the cache");
    assert_eq!(conflicts_counted(&cl), 2);
    // The cache shows home's versions now.
    assert_eq!(fs::read(c.join("d/f")).expect("read"), b"home v3");
    assert_eq!(fs::read(c.join("d/new")).expect("read"), b"new at home");
}

#[test]
fn with_on_disconnect_block_changes_wait_for_home_and_then_go_through() {
    require_fuse();
    let work = tempdir();
    let export = work.path().join("export");
    fs::create_dir(&export).expect("mkdir");
    seed(&export);
    let mut g = ganesha::Ganesha::start_new(&export, &work.path().join("ganesha"));
    let (cl, m) = bound_to(
        &g.url().to_string(),
        &[
            "--mode",
            "sw",
            "--sync-lag",
            "1s",
            "--timeout",
            "2s",
            "--on-disconnect",
            "block",
        ],
    );
    let c = m.path.join("c");
    assert_eq!(fs::read(c.join("d/f")).expect("read"), b"home v1");
    let _ = walk(&c);
    fs::write(c.join("d/before"), b"made while home answers").expect("write");
    g.stop();
    // A home that answered within the last 2 s is taken to answer still.
    std::thread::sleep(Duration::from_secs(3));
    // Cached data is still read; a change waits (nothing else in its
    // directory is looked at meanwhile: the change holds its lease).
    assert_eq!(fs::read(c.join("d/f")).expect("read"), b"home v1");
    let target = c.join("d/while-down");
    let started = std::time::Instant::now();
    let writer = std::thread::spawn(move || fs::write(target, b"waited for home"));
    std::thread::sleep(Duration::from_secs(6));
    assert!(
        !writer.is_finished(),
        "a change went through with home down"
    );
    g.start();
    writer
        .join()
        .expect("writer")
        .expect("the change once home is back");
    assert!(started.elapsed() >= Duration::from_secs(6));
    flush(&m);
    assert_eq!(
        fs::read(export.join("d/while-down")).expect("read"),
        b"waited for home"
    );
    assert_eq!(
        fs::read(export.join("d/before")).expect("read"),
        b"made while home answers"
    );
    drop(cl);
}

#[test]
fn kill_9_of_each_server_while_conflicts_are_resolved_keeps_each_version_once() {
    require_fuse();
    let home = tempdir();
    let h = home.path();
    fs::create_dir(h.join("d")).expect("mkdir");
    let n = 8;
    for i in 0..4 * n {
        fs::write(h.join(format!("d/f{i}")), format!("home v1 of {i}")).expect("write");
    }
    let (mut cl, m) = bound(h, &["--mode", "iw", "--sync-lag", "1h"]);
    let c = m.path.join("c");
    for round in 0..4 {
        for i in round * n..(round + 1) * n {
            let name = format!("d/f{i}");
            assert_eq!(
                fs::read(c.join(&name)).expect("read"),
                format!("home v1 of {i}").as_bytes()
            );
            fs::write(c.join(&name), format!("the cache's {i}")).expect("write");
            change_at_home(&h.join(&name), format!("home v2 of {i}").as_bytes());
        }
        let dir = c.to_str().expect("utf-8").to_string();
        let pushing =
            std::thread::spawn(move || morris(&["cache", "flush", &dir, "--timeout", "5s"]));
        std::thread::sleep(Duration::from_millis(100 + 150 * round as u64));
        cl.kill9(round);
        let _ = pushing.join();
        cl.restart(round);
    }
    flush(&m);
    for i in 0..4 * n {
        let name = format!("f{i}");
        assert_eq!(
            fs::read(h.join("d").join(&name)).expect("read"),
            format!("home v2 of {i}").as_bytes(),
            "home's version at d/{name}"
        );
        let k = kept(h, &name);
        assert_eq!(k.len(), 1, "the cache's {name} kept once: {k:?}");
        assert_eq!(k[0].1, format!("the cache's {i}").as_bytes());
    }
    let all = fs::read_dir(h.join(".conflicts")).expect("list").count();
    assert_eq!(all, 4 * n, "nothing else in .conflicts/");
    // (Not the conflict counts: they are each server process's, and the
    // pusher may be among the servers killed after its work.)
    drop(cl);
}

//! `--replicas 2` with a copy server lost in the middle of the work: writes
//! and reads go on without an error, the copies it missed are recorded as
//! stale, nobody reads them before the server has caught up, and the
//! returning server's resync brings the volume back to healthy (and fsck
//! clean) by itself. Most tests lose a server that holds neither the
//! file's inode nor the root (a copy server); the `owner` tests lose the
//! server holding both, whose metadata range its copy then takes over.

mod common;

use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use common::{copy_only_server, pattern, read_all, Cluster};

const K: u32 = 4;
const MIB: usize = 1 << 20;

use common::{fsck_clean, live, status, wait_healthy};

/// A mount through a running server.
fn mount(c: &Cluster) -> common::Mount {
    common::Mount::start(live(c), &[])
}

/// Writes `data` to the existing file `f` through mount `m` in 1 MiB
/// pieces, then fsyncs and closes it, killing server `v` after 11 MiB: the
/// write must not fail.
fn write_killing(c: &mut Cluster, m: &common::Mount, f: &Path, data: &[u8], v: usize) {
    let writer = write_in_background(f, data);
    c.kill9(v);
    if let Err(e) = writer.join().expect("writer thread") {
        panic!(
            "the write to {} failed after server {v} was killed: {e}; mount log:\n{}",
            f.display(),
            common::read_log(&m.log)
        );
    }
}

/// Writes `data` to the existing file `f` in 1 MiB pieces, then fsyncs and
/// closes it, on a thread of its own; returns once 11 MiB are written.
fn write_in_background(f: &Path, data: &[u8]) -> std::thread::JoinHandle<std::io::Result<()>> {
    let (tx, rx) = mpsc::channel();
    let (f, data) = (f.to_path_buf(), data.to_vec());
    let writer = std::thread::spawn(move || -> std::io::Result<()> {
        let mut file = std::fs::OpenOptions::new().write(true).open(&f)?;
        for (i, chunk) in data.chunks(MIB).enumerate() {
            file.write_all(chunk)?;
            if i == 10 {
                let _ = tx.send(());
            }
        }
        file.sync_all()?;
        common::close_checked(file)
    });
    rx.recv_timeout(Duration::from_secs(120))
        .expect("the writer stalled before the kill");
    writer
}

/// Reads the file `name` through a fresh mount in 1 MiB preads, killing
/// server `v` after 8 MiB: every read must succeed and the whole must equal
/// `data`.
fn read_killing(c: &mut Cluster, name: &Path, data: &[u8], v: usize) {
    let m = mount(c);
    let file = std::fs::File::open(m.path.join(name)).expect("open");
    let mut got = vec![0u8; data.len()];
    for (i, chunk) in got.chunks_mut(MIB).enumerate() {
        if i == 8 {
            c.kill9(v);
        }
        if let Err(e) = file.read_exact_at(chunk, (i * MIB) as u64) {
            panic!(
                "read at MiB {i} with server {v} killed: {e}; mount log:\n{}",
                common::read_log(&m.log)
            );
        }
    }
    assert!(got == data, "read with server {v} killed midway differs");
}

/// Every extent file of server `data`, by name (`<id>` or `<id>.<copy>`).
fn extents(data: &Path) -> BTreeMap<String, PathBuf> {
    let mut out = BTreeMap::new();
    let Ok(dirs) = std::fs::read_dir(data.join("blocks")) else {
        return out;
    };
    for d in dirs.flatten() {
        for f in std::fs::read_dir(d.path()).into_iter().flatten().flatten() {
            out.insert(f.file_name().to_string_lossy().into_owned(), f.path());
        }
    }
    out
}

/// Content of a file with trailing zeros dropped (a hole and written
/// zeros read alike; extent lengths may differ by trailing holes).
fn content(p: &Path) -> Vec<u8> {
    let mut b = std::fs::read(p).unwrap_or_default();
    while b.last() == Some(&0) {
        b.pop();
    }
    b
}

/// With two copies, copy 1 on server s is exactly server s-1's copy 0:
/// every such pair of extent files on disk must hold the same bytes.
fn copies_agree(c: &Cluster) {
    copies_agree_n(c, 2)
}

/// With `n` copies, copy j on server s is exactly server s-j's copy 0.
fn copies_agree_n(c: &Cluster, n: usize) {
    let k = c.servers.len();
    let mut pairs = 0;
    for s in 0..k {
        let mine = extents(&c.servers[s].data);
        for j in 1..n {
            let prev = (s + k - j) % k;
            let theirs = extents(&c.servers[prev].data);
            let suffix = format!(".{j}");
            for (name, path) in &mine {
                let Some(id) = name.strip_suffix(suffix.as_str()) else {
                    continue;
                };
                let other = theirs.get(id).map(|p| content(p)).unwrap_or_default();
                assert!(
                    content(path) == other,
                    "file {id}: copy {j} on server {s} differs from copy 0 on server {prev}"
                );
                pairs += 1;
            }
            for (name, path) in &theirs {
                if !name.contains('.') && !mine.contains_key(&format!("{name}{suffix}")) {
                    assert!(
                        content(path).is_empty(),
                        "file {name}: server {prev} holds data whose copy {j} on server {s} is missing"
                    );
                }
            }
        }
    }
    assert!(pairs > 0, "no mirrored extent files found");
}

#[test]
fn a_copy_server_killed_during_a_long_write_is_caught_up_when_it_returns() {
    let mut c = Cluster::start_mirrored(K as usize);
    let m = mount(&c);
    let f = m.path.join("big");
    std::fs::write(&f, b"").expect("create");
    let v = copy_only_server(K, &[&f]);
    let total = 40 * MIB;
    let data = pattern(51, 0, total);

    // The writer goes on while server v is killed a quarter of the way in.
    write_killing(&mut c, &m, &f, &data, v);
    drop(m);

    // The volume knows server v missed the end of the file.
    let s = status(&c);
    assert_eq!(s["health"], "degraded", "{s}");
    assert!(
        s["servers"][v]["stale_files"].as_u64().unwrap_or(0) >= 1,
        "no stale copies recorded for server {v}: {s}"
    );
    let m = mount(&c);
    assert!(
        read_all(&m.path.join("big")) == data,
        "the file read back with server {v} down differs"
    );
    drop(m);

    // Back, it catches up by itself; the copies agree byte for byte.
    c.restart(v);
    wait_healthy(&c);
    fsck_clean(&c);
    copies_agree(&c);
    let m = mount(&c);
    assert!(
        read_all(&m.path.join("big")) == data,
        "read after resync differs"
    );
}

#[test]
fn a_copy_server_killed_during_a_long_read_is_read_around() {
    let mut c = Cluster::start_mirrored(K as usize);
    let m = mount(&c);
    let f = m.path.join("big");
    let data = pattern(52, 0, 40 * MIB);
    std::fs::write(&f, &data).expect("write");
    let v = copy_only_server(K, &[&f]);
    drop(m);
    read_killing(&mut c, "big".as_ref(), &data, v);
    // Reads miss nothing: the volume is healthy as soon as v is back.
    c.restart(v);
    wait_healthy(&c);
    fsck_clean(&c);
    copies_agree(&c);
}

#[test]
fn a_returning_server_is_not_read_before_it_has_caught_up() {
    let mut c = Cluster::start_mirrored(K as usize);
    let m = mount(&c);
    let old = pattern(53, 0, 24 * MIB);
    std::fs::write(m.path.join("a"), &old).expect("write a");
    std::fs::write(m.path.join("gone"), &old[..3 * MIB]).expect("write gone");
    let v = copy_only_server(K, &[&m.path.join("a"), &m.path.join("gone")]);
    drop(m);

    // While v is down: rewrite `a` in place, write `b`, delete `gone`.
    c.kill9(v);
    let m = mount(&c);
    let new = pattern(54, 0, 24 * MIB);
    {
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(m.path.join("a"))
            .expect("open a");
        file.write_all_at(&new, 0).expect("rewrite a");
        common::close_checked(file).expect("close a");
    }
    let b = pattern(55, 0, 10 * MIB);
    std::fs::write(m.path.join("b"), &b).expect("write b");
    if let Err(e) = std::fs::remove_file(m.path.join("gone")) {
        panic!(
            "remove gone: {e}\nmount log:\n{}\n{}",
            common::read_log(&m.log),
            c.logs()
        );
    }
    drop(m);

    // v comes back with its old blocks and no resync: readers must not use it.
    c.restart_with(v, &["--no-resync"]);
    let s = status(&c);
    assert_eq!(s["health"], "degraded", "{s}");
    assert_eq!(s["servers"][v]["copies"], "stale", "{s}");
    let reads_before = reads_at(&s, v);
    for round in 0..3 {
        let m = mount(&c);
        assert!(
            read_all(&m.path.join("a")) == new,
            "round {round}: a is stale"
        );
        assert!(
            read_all(&m.path.join("b")) == b,
            "round {round}: b is stale"
        );
    }
    let reads_after = reads_at(&status(&c), v);
    assert_eq!(
        reads_after, reads_before,
        "server {v} served block reads before catching up"
    );

    // With its resync, it catches up and serves again.
    c.restart(v);
    wait_healthy(&c);
    fsck_clean(&c);
    copies_agree(&c);
    let m = mount(&c);
    assert!(read_all(&m.path.join("a")) == new, "a after resync");
    assert!(read_all(&m.path.join("b")) == b, "b after resync");
}

/// Block reads served by server `i` so far.
fn reads_at(status: &serde_json::Value, i: usize) -> u64 {
    status["servers"][i]["stats"]["requests_by_op"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p[0] == "Read")
        .and_then(|p| p[1].as_u64())
        .unwrap_or(0)
}

#[test]
fn a_stopped_copy_server_does_not_stop_writes() {
    let mut c = Cluster::start_mirrored(K as usize);
    let m = mount(&c);
    let (f, v) = common::create_with_quiet_server(K, &m.path, "w");
    let pid = c.pids()[v].expect("victim running");
    // Connected but silent: only the copy-write time limit (half a lease)
    // lets the writes go on.
    common::signal(pid, libc::SIGSTOP);
    let data = pattern(56, 0, 12 * MIB);
    let small = pattern(57, 0, MIB + 17);
    // The first write waits out the time limit; later files' writes skip the
    // silent server at once for a while.
    let wrote = std::fs::write(&f, &data)
        .and_then(|()| std::fs::write(m.path.join("w2"), &small))
        .and_then(|()| std::fs::write(m.path.join("w3"), &small));
    common::signal(pid, libc::SIGCONT);
    if let Err(e) = wrote {
        panic!(
            "write with server {v} stopped: {e}; mount log:\n{}",
            common::read_log(&m.log)
        );
    }
    drop(m);
    // Recorded as stale (or, if its resync was quick, already caught up).
    let s = status(&c);
    let stale = s["servers"][v]["stale_files"].as_u64().unwrap_or(0);
    let caught_up = s["servers"][v]["stats"]["resync"]["files_total"]
        .as_u64()
        .unwrap_or(0);
    assert!(
        stale + caught_up >= 1,
        "no stale copies recorded for the stopped server {v}: {s}"
    );
    wait_healthy(&c);
    fsck_clean(&c);
    copies_agree(&c);
    let name = f.file_name().expect("name").to_owned();
    let m = mount(&c);
    assert!(
        read_all(&m.path.join(&name)) == data,
        "read after resync differs"
    );
    drop(m);
    c.kill9(v);
    let m = mount(&c);
    assert!(
        read_all(&m.path.join(&name)) == data,
        "read from the other copies differs"
    );
    for name in ["w2", "w3"] {
        assert!(read_all(&m.path.join(name)) == small, "{name} differs");
    }
}

/// Creates empty files `dir/name`, `dir/name.1`, ... until one's inode is
/// owned (its metadata range served) by server `owner`.
fn create_owned_by(k: u32, owner: u32, dir: &Path, name: &str) -> PathBuf {
    use std::os::unix::fs::MetadataExt;
    for i in 0..8 * k {
        let p = dir.join(format!("{name}.{i}"));
        std::fs::write(&p, b"").expect("create");
        let ino = std::fs::metadata(&p).expect("stat").ino();
        if ino % u64::from(k) == u64::from(owner) {
            return p;
        }
    }
    panic!("no new inode landed on server {owner}");
}

/// The metadata range `range` as server `i` reports it.
fn range_of(s: &serde_json::Value, i: usize, range: u32) -> serde_json::Value {
    s["servers"][i]["stats"]["ranges"]
        .as_array()
        .and_then(|v| v.iter().find(|r| r["range"] == range).cloned())
        .unwrap_or_default()
}

/// The server that owns the root (and the file being written) is killed in
/// the middle of a long write: its copy takes the range over and the
/// writer never sees an error; with the server gone, names are created and
/// listed in the root; back, it keeps the copy and catches up.
#[test]
fn the_owner_of_a_files_inode_and_of_the_root_killed_during_a_long_write() {
    let mut c = Cluster::start_mirrored(K as usize);
    let m = mount(&c);
    let root_owner = 1 % K;
    let f = create_owned_by(K, root_owner, &m.path, "big");
    let total = 40 * MIB;
    let data = pattern(61, 0, total);
    let v = root_owner as usize;
    write_killing(&mut c, &m, &f, &data, v);
    // The namespace goes on without server v.
    std::fs::write(m.path.join("new"), b"created while v was down").expect("create");
    let names: Vec<String> = std::fs::read_dir(&m.path)
        .expect("list the root")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    assert!(names.iter().any(|n| n == "new"), "{names:?}");
    drop(m);
    let s = status(&c);
    assert_eq!(s["health"], "degraded", "{s}");
    let next = (v + 1) % K as usize;
    let taken = range_of(&s, next, root_owner);
    assert_eq!(
        taken["primary"], true,
        "server {next} did not take range {v} over: {s}"
    );
    assert_eq!(taken["ready"], true, "{s}");
    let m = mount(&c);
    assert!(
        read_all(&m.path.join(f.file_name().expect("name"))) == data,
        "the file read back with server {v} down differs"
    );
    drop(m);

    // Back, it keeps the copy of its range, and the volume becomes whole.
    c.restart(v);
    wait_healthy(&c);
    let s = status(&c);
    let home = range_of(&s, v, root_owner);
    assert_eq!(home["primary"], false, "{s}");
    assert_eq!(home["ready"], true, "{s}");
    fsck_clean(&c);
    copies_agree(&c);
    let m = mount(&c);
    assert!(
        read_all(&m.path.join(f.file_name().expect("name"))) == data,
        "read after resync differs"
    );
    assert_eq!(
        std::fs::read(m.path.join("new")).expect("read new"),
        b"created while v was down"
    );
}

/// The server owning the file being read (and the root) is killed during a
/// long pread loop: every read succeeds (the read lease is taken again from
/// the range's new primary).
#[test]
fn the_owner_of_a_files_inode_killed_during_a_long_read() {
    let mut c = Cluster::start_mirrored(K as usize);
    let m = mount(&c);
    let root_owner = 1 % K;
    let f = create_owned_by(K, root_owner, &m.path, "big");
    let data = pattern(62, 0, 40 * MIB);
    std::fs::write(&f, &data).expect("write");
    let name = f.file_name().expect("name").to_owned();
    drop(m);
    let v = root_owner as usize;
    read_killing(&mut c, name.as_ref(), &data, v);
    c.restart(v);
    wait_healthy(&c);
    fsck_clean(&c);
    copies_agree(&c);
}

/// With `--replicas 3`, the server owning the root (and two files' inodes)
/// is killed during one long write and its successor, which took the range
/// over, during a second: neither writer sees an error, names are created
/// in the root with both gone, everything reads back, and once both are
/// back the volume is whole again with three agreeing copies.
#[test]
fn three_copies_two_servers_killed_in_turn_during_long_writes() {
    let mut c = Cluster::start(
        K as usize,
        common::ClusterOpts {
            replicas: 3,
            ..common::ClusterOpts::default()
        },
    );
    let m = mount(&c);
    let root_owner = 1 % K;
    let f = create_owned_by(K, root_owner, &m.path, "one");
    let g = create_owned_by(K, root_owner, &m.path, "two");
    let total = 24 * MIB;
    let (df, dg) = (pattern(71, 0, total), pattern(72, 0, total));
    let v1 = root_owner as usize;
    let v2 = (v1 + 1) % K as usize;
    let last = (v1 + 2) % K as usize;

    write_killing(&mut c, &m, &f, &df, v1);
    // The successor serves the range and has brought the third copy up to
    // date with its own stream (generation 2 there).
    common::wait_for(
        Duration::from_secs(30),
        "the third copy follows the new primary",
        || {
            let s = status(&c);
            let (p, t) = (range_of(&s, v2, root_owner), range_of(&s, last, root_owner));
            if p["primary"] == true
                && p["ready"] == true
                && t["ready"] == true
                && t["gen"].as_u64().unwrap_or(0) >= 2
            {
                Ok(())
            } else {
                Err(format!("{p} / {t}"))
            }
        },
    );
    write_killing(&mut c, &m, &g, &dg, v2);
    std::fs::write(m.path.join("new"), b"two servers down").expect("create");
    drop(m);
    let s = status(&c);
    let taken = range_of(&s, last, root_owner);
    assert_eq!(
        taken["primary"], true,
        "server {last} did not take range {root_owner} over: {s}"
    );
    let m = mount(&c);
    assert!(
        read_all(&m.path.join(f.file_name().expect("name"))) == df,
        "first file differs"
    );
    assert!(
        read_all(&m.path.join(g.file_name().expect("name"))) == dg,
        "second file differs"
    );
    drop(m);

    c.restart(v1);
    c.restart(v2);
    wait_healthy(&c);
    fsck_clean(&c);
    copies_agree_n(&c, 3);
    let m = mount(&c);
    assert!(
        read_all(&m.path.join(f.file_name().expect("name"))) == df,
        "first file after resync"
    );
    assert!(
        read_all(&m.path.join(g.file_name().expect("name"))) == dg,
        "second file after resync"
    );
    assert_eq!(
        std::fs::read(m.path.join("new")).expect("read new"),
        b"two servers down"
    );
}

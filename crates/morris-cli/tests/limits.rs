//! Resource limits: a full disk reaches the application as ENOSPC without
//! losing what was stored, and reading a huge file keeps the mount's memory
//! bounded.

mod common;

use std::fs::{self, File};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use common::{close_checked, is_mounted, is_root, pattern, Cluster, ClusterOpts, Mount};

/// A tmpfs of a fixed size on a temporary directory, unmounted when dropped.
struct Tmpfs {
    path: PathBuf,
    _dir: tempfile::TempDir,
}

impl Tmpfs {
    fn new(size: &str) -> Tmpfs {
        let dir = tempfile::Builder::new()
            .prefix("morris-tmpfs-")
            .tempdir()
            .expect("cannot create a temporary directory");
        let path = dir.path().canonicalize().expect("canonical path");
        Tmpfs::mount(size, path, dir)
    }

    /// A tmpfs mounted on `at` (made here, inside `dir`, kept alive).
    fn at(size: &str, at: PathBuf, dir: tempfile::TempDir) -> Tmpfs {
        fs::create_dir_all(&at).expect("mkdir the mount point");
        Tmpfs::mount(size, at, dir)
    }

    fn mount(size: &str, path: PathBuf, dir: tempfile::TempDir) -> Tmpfs {
        assert!(
            is_root(),
            "this test mounts a small tmpfs for the servers' data and must run as root"
        );
        let o = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0755"),
                "tmpfs",
            ])
            .arg(&path)
            .stdin(Stdio::null())
            .output()
            .expect("cannot run mount");
        assert!(
            o.status.success(),
            "mount -t tmpfs -o size={size} failed: {}",
            common::both(&o)
        );
        Tmpfs { path, _dir: dir }
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        if is_mounted(&self.path) {
            let _ = Command::new("umount")
                .arg("-l")
                .arg(&self.path)
                .stderr(Stdio::null())
                .status();
        }
    }
}

fn write_closed(p: &Path, data: &[u8]) -> std::io::Result<()> {
    let mut f = File::create(p)?;
    f.write_all(data)?;
    close_checked(f)
}

/// Writes `path` until something fails; returns which step failed and how,
/// or `None` if `limit` bytes went through.
fn fill(path: &Path, limit: u64) -> Option<(String, std::io::Error)> {
    let mut f = match File::create(path) {
        Ok(f) => f,
        Err(e) => return Some(("create".into(), e)),
    };
    let chunk = pattern(1234, 0, 1 << 20);
    let mut off = 0u64;
    while off < limit {
        if let Err(e) = f.write_all(&chunk) {
            let _ = close_checked(f);
            return Some((format!("write at offset {off}"), e));
        }
        off += chunk.len() as u64;
    }
    if let Err(e) = f.sync_all() {
        let _ = close_checked(f);
        return Some((format!("fsync after {off} bytes"), e));
    }
    close_checked(f)
        .err()
        .map(|e| (format!("close after {off} bytes"), e))
}

#[test]
fn a_full_disk_gives_enospc_and_keeps_what_was_stored() {
    let fs_ = Tmpfs::new("64m");
    let c = Cluster::start_with_data_root(4, ClusterOpts::default(), &fs_.path);
    let m = c.mount();

    let first = pattern(1, 0, 4 * 1024 * 1024 + 5);
    write_closed(&m.path.join("first"), &first).expect("write and close the first file");

    // Far more than the 64 MiB tmpfs can take.
    let big = m.path.join("big");
    let (step, err) = fill(&big, 256 << 20).unwrap_or_else(|| {
        panic!(
            "256 MiB were written, fsynced and closed on servers whose data is on a 64 MiB tmpfs"
        )
    });
    assert_eq!(
        err.raw_os_error(),
        Some(libc::ENOSPC),
        "the first failure filling the volume ({step}) should be ENOSPC, got \"{err}\"; \
         mount log:\n{}",
        common::read_log(&m.log)
    );

    // What was stored before is intact, through this mount and a fresh one.
    let got = fs::read(m.path.join("first")).expect("read the first file back");
    assert!(
        got == first,
        "the first file changed after the disk filled up"
    );
    let fresh = Mount::start(c.addr(1), &[]);
    let got = fs::read(fresh.path.join("first")).expect("read the first file on a fresh mount");
    assert!(
        got == first,
        "the first file reads differently on a fresh mount after the disk filled up"
    );
    drop(fresh);

    // Removing the big file makes room again.
    fs::remove_file(&big).unwrap_or_else(|e| {
        panic!(
            "removing the big file from the full volume failed: {e}\n--- mount log\n{}{}",
            common::read_log(&m.log),
            c.logs()
        )
    });
    let after = pattern(2, 0, 8 * 1024 * 1024);
    if let Err(e) = write_closed(&m.path.join("after"), &after) {
        panic!(
            "writing 8 MiB after removing the big file: {e}\n--- mount log\n{}{}",
            common::read_log(&m.log),
            c.logs()
        );
    }
    let got = fs::read(m.path.join("after")).expect("read it back");
    assert!(got == after, "the file written after freeing space differs");
    assert!(
        fs::read(m.path.join("first")).expect("read first") == first,
        "first file changed"
    );
}

/// The mount process's peak resident memory, in bytes.
fn vm_hwm(pid: u32) -> u64 {
    let status = fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_else(|e| panic!("cannot read /proc/{pid}/status: {e}"));
    let line = status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .unwrap_or_else(|| panic!("no VmHWM in /proc/{pid}/status"));
    let kb: u64 = line
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("bad VmHWM line {line:?}"));
    kb * 1024
}

#[test]
fn reading_a_4_gib_file_keeps_the_mount_small() {
    let c = Cluster::start(4, ClusterOpts::default());
    let m = c.mount();
    let pid = m.pid().expect("the mount process is running");
    let p = m.path.join("huge");
    const SIZE: u64 = 4 << 30;
    let f = File::create(&p).expect("create");
    f.set_len(SIZE).expect("set_len 4 GiB");
    close_checked(f).expect("close");
    assert_eq!(fs::metadata(&p).expect("stat").len(), SIZE);

    let mut f = File::open(&p).expect("open");
    let zeros = vec![0u8; 1 << 20];
    let mut buf = vec![0xffu8; 1 << 20];
    let mut total = 0u64;
    loop {
        let n = f
            .read(&mut buf)
            .unwrap_or_else(|e| panic!("read at {total}: {e}"));
        if n == 0 {
            break;
        }
        assert!(
            buf[..n] == zeros[..n],
            "non-zero bytes in the read at {total}"
        );
        total += n as u64;
    }
    assert_eq!(total, SIZE, "bytes read");
    let peak = vm_hwm(pid);
    assert!(
        peak < 400 << 20,
        "the mount process's peak resident memory (VmHWM) reached {} MiB reading a 4 GiB file",
        peak >> 20
    );
    eprintln!("mount VmHWM after reading 4 GiB: {} MiB", peak >> 20);
}

/// A new empty file in `dir` whose inode is not kept by server `not` of
/// `k` (its metadata must stay writable while that server's disk is full).
fn create_not_owned_by(k: u64, not: u64, dir: &Path, name: &str) -> PathBuf {
    use std::os::unix::fs::MetadataExt;
    for i in 0..32 {
        let p = dir.join(format!("{name}.{i}"));
        fs::write(&p, b"").expect("create");
        if fs::metadata(&p).expect("stat").ino() % k != not {
            return p;
        }
    }
    panic!("every new inode landed on server {not}");
}

#[test]
fn a_copy_write_failing_with_enospc_is_recorded_stale_and_resync_repairs_it() {
    // Server 1's data (blocks and metadata) on a small tmpfs of its own,
    // the others on the ordinary disk.
    let root = tempfile::Builder::new()
        .prefix("morris-enospc-")
        .tempdir()
        .expect("tempdir");
    let at = root
        .path()
        .canonicalize()
        .expect("canonical")
        .join("server-1");
    let holder = tempfile::Builder::new()
        .prefix("morris-enospc-keep-")
        .tempdir()
        .expect("tempdir");
    let small = Tmpfs::at("24m", at, holder);
    let opts = ClusterOpts {
        replicas: 2,
        ..ClusterOpts::default()
    };
    let c = Cluster::start_with_data_root(4, opts, root.path());
    let m = c.mount();
    // A directory and files whose metadata server 1 does not keep.
    let mut dir = None;
    for i in 0..32 {
        let d = m.path.join(format!("d{i}"));
        fs::create_dir(&d).expect("mkdir");
        use std::os::unix::fs::MetadataExt;
        if fs::metadata(&d).expect("stat").ino() % 4 != 1 {
            dir = Some(d);
            break;
        }
    }
    let dir = dir.expect("a directory kept by another server");
    let a = create_not_owned_by(4, 1, &dir, "a");
    let b = create_not_owned_by(4, 1, &dir, "b");
    // Room taken on server 1, to be given back later.
    write_closed(&a, &pattern(1, 0, 16 << 20)).expect("write a");
    // Server 1's copies fill its disk; the other copies take the blocks.
    let (step, err) = fill(&b, 256 << 20)
        .unwrap_or_else(|| panic!("256 MiB went to a server whose data is on a 24 MiB tmpfs"));
    assert_eq!(
        err.raw_os_error(),
        Some(libc::ENOSPC),
        "{step}: {err}; mount log:\n{}",
        common::read_log(&m.log)
    );
    // The copies that differ are on record: not healthy.
    let s = common::status(&c);
    assert_ne!(s["health"], "healthy", "no stale copy recorded: {s}");
    // Room again on server 1: its resync brings its copies of b back.
    fs::remove_file(&a).expect("remove a");
    common::wait_healthy(&c);
    common::fsck_clean(&c);
    let want = fs::read(&b).expect("read b");
    let fresh = Mount::start(c.addr(2), &[]);
    let rel = b.strip_prefix(&m.path).expect("under the mount");
    assert!(
        fs::read(fresh.path.join(rel)).expect("read b on a fresh mount") == want,
        "b reads differently on a fresh mount"
    );
    drop(fresh);
    drop(m);
    drop(c);
    drop(small);
}

//! Linux calls beyond POSIX, through real FUSE mounts: `renameat2`'s
//! `RENAME_EXCHANGE` between two directories and `RENAME_WHITEOUT`, file
//! handles (`name_to_handle_at` / `open_by_handle_at`, what NFS re-export
//! and xfstests' generic/426, 467, 477, 756, 777 use) across mounts and
//! after an unlink, and access-time updates following `mount -o remount`.

mod common;

use std::ffi::CString;
use std::fs::{self, File};
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::{expect_errno, fsck_clean, renameat2, Cluster, ClusterOpts, Mount};

fn cpath(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).expect("no NUL in a test path")
}

#[test]
fn rename_exchange_between_directories_swaps_the_objects_and_their_parents() {
    let c = Cluster::start(4, ClusterOpts::default());
    let m = c.mount();
    let (a, b) = (m.path.join("a"), m.path.join("b"));
    fs::create_dir(&a).expect("mkdir a");
    fs::create_dir(&b).expect("mkdir b");
    fs::write(a.join("f"), b"file").expect("write a/f");
    fs::create_dir(b.join("d")).expect("mkdir b/d");
    fs::write(b.join("d/inside"), b"in").expect("write b/d/inside");
    let (f_ino, d_ino) = (
        fs::metadata(a.join("f")).expect("stat").ino(),
        fs::metadata(b.join("d")).expect("stat").ino(),
    );
    renameat2(&a.join("f"), &b.join("d"), libc::RENAME_EXCHANGE).expect("RENAME_EXCHANGE");
    // Each name now names the other object; the directory's ".." follows
    // it, and each directory counts the subdirectory it now holds.
    let other = c.mount();
    for root in [&m.path, &other.path] {
        let md = fs::metadata(root.join("a/f")).expect("stat a/f");
        assert!(md.is_dir() && md.ino() == d_ino, "a/f is the directory");
        assert_eq!(fs::read(root.join("a/f/inside")).expect("read"), b"in");
        assert_eq!(fs::read(root.join("b/d")).expect("read b/d"), b"file");
        assert_eq!(fs::metadata(root.join("b/d")).expect("stat").ino(), f_ino);
        assert_eq!(
            fs::metadata(root.join("a/f/..")).expect("stat ..").ino(),
            fs::metadata(root.join("a")).expect("stat a").ino(),
            "the moved directory's parent"
        );
        assert_eq!(fs::metadata(root.join("a")).expect("stat").nlink(), 3);
        assert_eq!(fs::metadata(root.join("b")).expect("stat").nlink(), 2);
        let names: Vec<_> = fs::read_dir(root.join("b"))
            .expect("list b")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(
            names,
            vec![std::ffi::OsString::from("d")],
            "no third name left"
        );
    }
    // Two directories, and back again.
    fs::create_dir(b.join("e")).expect("mkdir b/e");
    renameat2(&a.join("f"), &b.join("e"), libc::RENAME_EXCHANGE).expect("two directories");
    assert!(fs::metadata(b.join("e/inside")).is_ok());
    assert!(fs::read_dir(a.join("f")).expect("list").next().is_none());
    // A directory may not go below itself; both names must exist; no other
    // flag goes with it.
    fs::create_dir(b.join("e/sub")).expect("mkdir");
    expect_errno(
        renameat2(&b.join("e"), &b.join("e/sub/x"), libc::RENAME_EXCHANGE),
        libc::ENOENT,
        "exchange with a missing name",
    );
    fs::write(b.join("e/sub/x"), b"x").expect("write");
    expect_errno(
        renameat2(&b.join("e"), &b.join("e/sub/x"), libc::RENAME_EXCHANGE),
        libc::EINVAL,
        "a directory exchanged into itself",
    );
    expect_errno(
        renameat2(
            &a.join("f"),
            &b.join("d"),
            libc::RENAME_EXCHANGE | libc::RENAME_NOREPLACE,
        ),
        libc::EINVAL,
        "RENAME_EXCHANGE with RENAME_NOREPLACE",
    );
    drop(other);
    drop(m);
    fsck_clean(&c);
}

/// `(ctime, ctime_nsec)` of `p`.
fn ctime(p: &Path) -> (i64, i64) {
    let md = fs::symlink_metadata(p).expect("stat");
    (md.ctime(), md.ctime_nsec())
}

#[test]
fn a_rename_moves_the_status_change_time_of_what_it_renames() {
    let c = Cluster::start(4, ClusterOpts::default());
    let m = c.mount();
    fs::create_dir(m.path.join("d")).expect("mkdir");
    for n in ["f", "g", "h"] {
        fs::write(m.path.join(n), n).expect("write");
    }
    let before = ctime(&m.path.join("f"));
    std::thread::sleep(Duration::from_millis(20));
    fs::rename(m.path.join("f"), m.path.join("f2")).expect("rename in a directory");
    let after = ctime(&m.path.join("f2"));
    assert!(after > before, "{before:?} then {after:?}");
    std::thread::sleep(Duration::from_millis(20));
    fs::rename(m.path.join("f2"), m.path.join("d/f3")).expect("rename across");
    let across = ctime(&m.path.join("d/f3"));
    assert!(across > after, "{after:?} then {across:?}");
    // Both objects of an exchange.
    let (g0, h0) = (ctime(&m.path.join("g")), ctime(&m.path.join("h")));
    std::thread::sleep(Duration::from_millis(20));
    renameat2(&m.path.join("g"), &m.path.join("h"), libc::RENAME_EXCHANGE).expect("exchange");
    assert!(ctime(&m.path.join("h")) > g0 && ctime(&m.path.join("g")) > h0);
    // Another mount reads the same times from the owners.
    let other = c.mount();
    assert_eq!(ctime(&other.path.join("d/f3")), across);
    assert_eq!(ctime(&other.path.join("g")), ctime(&m.path.join("g")));
}

/// Asserts `p` is a whiteout: a character device 0:0 with no permission bits.
fn assert_whiteout(p: &Path) {
    let md = fs::symlink_metadata(p).expect("stat the whiteout");
    assert!(md.file_type().is_char_device(), "{}: {md:?}", p.display());
    assert_eq!(md.rdev(), 0, "{}", p.display());
    assert_eq!(md.mode() & 0o7777, 0, "{}", p.display());
}

#[test]
fn rename_whiteout_leaves_a_whiteout_at_the_old_name() {
    let c = Cluster::start(4, ClusterOpts::default());
    let m = c.mount();
    let (a, b) = (m.path.join("a"), m.path.join("b"));
    fs::create_dir(&a).expect("mkdir a");
    fs::create_dir(&b).expect("mkdir b");
    // Within a directory, onto a free name.
    fs::write(a.join("f"), b"one").expect("write");
    renameat2(&a.join("f"), &a.join("g"), libc::RENAME_WHITEOUT).expect("whiteout, one dir");
    assert_whiteout(&a.join("f"));
    assert_eq!(fs::read(a.join("g")).expect("read"), b"one");
    // Between directories, replacing a file.
    fs::write(b.join("old"), b"old").expect("write");
    renameat2(&a.join("g"), &b.join("old"), libc::RENAME_WHITEOUT).expect("whiteout, across");
    assert_whiteout(&a.join("g"));
    assert_eq!(fs::read(b.join("old")).expect("read"), b"one");
    // A directory moved between directories.
    fs::create_dir(a.join("dir")).expect("mkdir");
    renameat2(&a.join("dir"), &b.join("dir"), libc::RENAME_WHITEOUT).expect("whiteout, dir");
    assert_whiteout(&a.join("dir"));
    assert_eq!(
        fs::metadata(&a).expect("stat").nlink(),
        2,
        "a lost its subdir"
    );
    assert_eq!(fs::metadata(&b).expect("stat").nlink(), 3, "b gained it");
    // With RENAME_NOREPLACE onto an existing name: nothing changes.
    fs::write(a.join("h"), b"h").expect("write");
    expect_errno(
        renameat2(
            &a.join("h"),
            &b.join("old"),
            libc::RENAME_WHITEOUT | libc::RENAME_NOREPLACE,
        ),
        libc::EEXIST,
        "RENAME_WHITEOUT | RENAME_NOREPLACE onto a name",
    );
    assert_eq!(fs::read(a.join("h")).expect("read"), b"h");
    // Another mount sees them; whiteouts are removed like any file.
    let other = c.mount();
    for n in ["f", "g", "dir"] {
        assert_whiteout(&other.path.join("a").join(n));
    }
    fs::remove_file(other.path.join("a/f")).expect("remove a whiteout");
    drop(other);
    drop(m);
    fsck_clean(&c);
}

/// A file handle of `p` from `name_to_handle_at`.
fn handle_of(p: &Path) -> Vec<u8> {
    const MAX: usize = 128;
    let mut buf = vec![0u8; 8 + MAX];
    buf[..4].copy_from_slice(&(MAX as u32).to_ne_bytes());
    let mut mount_id: libc::c_int = 0;
    let path = cpath(p);
    // SAFETY: `buf` starts with a `file_handle` header whose size field
    // says MAX bytes follow, which `buf` has; the path is NUL-terminated.
    let r = unsafe {
        libc::name_to_handle_at(
            libc::AT_FDCWD,
            path.as_ptr(),
            buf.as_mut_ptr().cast::<libc::file_handle>(),
            &mut mount_id,
            0,
        )
    };
    assert_eq!(
        r,
        0,
        "name_to_handle_at({}): {}",
        p.display(),
        std::io::Error::last_os_error()
    );
    buf
}

/// Opens handle `h` through the mount that `on` lies in.
fn open_by_handle(on: &Path, h: &[u8]) -> std::io::Result<File> {
    let dir = File::open(on).expect("open the mount");
    let mut h = h.to_vec();
    // SAFETY: `h` is a `file_handle` as `handle_of` filled it.
    let fd = unsafe {
        libc::open_by_handle_at(
            dir.as_raw_fd(),
            h.as_mut_ptr().cast::<libc::file_handle>(),
            libc::O_RDONLY,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a descriptor just opened and owned by nobody else.
    Ok(unsafe { File::from_raw_fd(fd) })
}

#[test]
fn file_handles_work_on_another_mount_and_go_stale_with_their_file() {
    let c = Cluster::start(4, ClusterOpts::default());
    let m = c.mount();
    fs::create_dir(m.path.join("d")).expect("mkdir");
    let mut handles = Vec::new();
    for i in 0..8 {
        let p = m.path.join(format!("d/f{i}"));
        fs::write(&p, format!("file {i}")).expect("write");
        handles.push(handle_of(&p));
    }
    let dir_handle = handle_of(&m.path.join("d"));
    // The mount that made them is gone: a new one (as after a remount, or
    // an NFS server restarted) opens them by handle alone.
    drop(m);
    let m = c.mount();
    for (i, h) in handles.iter().enumerate() {
        let mut f = open_by_handle(&m.path, h).expect("open_by_handle after a remount");
        let mut s = String::new();
        std::io::Read::read_to_string(&mut f, &mut s).expect("read");
        assert_eq!(s, format!("file {i}"));
    }
    let d = open_by_handle(&m.path, &dir_handle).expect("a directory by handle");
    assert!(d.metadata().expect("fstat").is_dir());
    // Removed here (the kernel's caches dropped): its handle is stale at
    // once, on this mount and on another.
    fs::remove_file(m.path.join("d/f0")).expect("unlink");
    fs::write("/proc/sys/vm/drop_caches", "2").expect("drop the kernel's caches");
    let other = c.mount();
    for on in [&m.path, &other.path] {
        expect_errno(
            open_by_handle(on, &handles[0]).map(drop),
            libc::ESTALE,
            "a handle of an unlinked file",
        );
    }
    // A file still open somewhere keeps its handle usable there.
    let kept = File::open(m.path.join("d/f1")).expect("open f1");
    fs::remove_file(m.path.join("d/f1")).expect("unlink f1");
    fs::write("/proc/sys/vm/drop_caches", "2").expect("drop the kernel's caches");
    let again = open_by_handle(&m.path, &handles[1]).expect("an open unlinked file");
    assert_eq!(again.metadata().expect("fstat").nlink(), 0);
    drop((kept, again));
}

/// The access time of `p` after reading it, a second after the last read.
fn atime_after_read(p: &Path) -> (i64, i64) {
    std::thread::sleep(Duration::from_millis(1100));
    fs::read(p).expect("read");
    let md = fs::metadata(p).expect("stat");
    (md.atime(), md.atime_nsec())
}

fn remount(m: &Mount, opts: &str) {
    // `-i`: the mount's flags only, as mount(8) does for a type without a
    // helper.
    let o = Command::new("mount")
        .args(["-i", "-o", &format!("remount,{opts}")])
        .arg(&m.path)
        .output()
        .expect("run mount");
    assert!(o.status.success(), "mount -o remount,{opts}: {o:?}");
    // The mount notices within its poll of the mount table.
    std::thread::sleep(Duration::from_millis(500));
}

#[test]
fn access_times_follow_strictatime_and_remounts() {
    let c = Cluster::start(2, ClusterOpts::default());
    let m = Mount::start(c.addr(0), &["--strictatime"]);
    let p = m.path.join("f");
    fs::write(&p, b"data").expect("write");
    // strictatime: every read (a second apart) moves it.
    let first = atime_after_read(&p);
    let second = atime_after_read(&p);
    assert!(second > first, "strictatime: {first:?} then {second:?}");
    // Remounted read-only: never.
    remount(&m, "ro");
    let ro = atime_after_read(&p);
    assert_eq!(ro, second, "a read on a read-only mount");
    // Back to read-write with relatime: a read later than the last change
    // leaves it.
    remount(&m, "rw,relatime");
    assert_eq!(atime_after_read(&p), second, "relatime, after a remount");
    remount(&m, "strictatime");
    assert!(atime_after_read(&p) > second, "strictatime again");
    // A mount made read-only never moves it either.
    let ro = Mount::start(c.addr(0), &["--read-only", "--strictatime"]);
    let before = fs::metadata(ro.path.join("f")).expect("stat").atime_nsec();
    std::thread::sleep(Duration::from_millis(1100));
    fs::read(ro.path.join("f")).expect("read");
    assert_eq!(
        fs::metadata(ro.path.join("f")).expect("stat").atime_nsec(),
        before
    );
}

/// `copy_file_range` of `len` bytes from `src` at `off_in` to `dst` at
/// `off_out`, as many calls as it takes; the total copied.
fn copy_range(src: &File, off_in: i64, dst: &File, off_out: i64, len: usize) -> usize {
    let (mut i, mut o, mut done) = (off_in, off_out, 0usize);
    while done < len {
        // SAFETY: two open descriptors and two valid offsets.
        let n = unsafe {
            libc::copy_file_range(
                src.as_raw_fd(),
                &mut i,
                dst.as_raw_fd(),
                &mut o,
                len - done,
                0,
            )
        };
        assert!(
            n >= 0,
            "copy_file_range: {}",
            std::io::Error::last_os_error()
        );
        if n == 0 {
            break;
        }
        done += n as usize;
    }
    done
}

#[test]
fn copy_file_range_copies_within_the_volume() {
    // 64 KiB units over 4 servers: a few MiB cross every server many times.
    let c = Cluster::start(4, ClusterOpts::default());
    let m = c.mount();
    let data = common::pattern(7, 0, 5_000_000);
    fs::write(m.path.join("src"), &data).expect("write src");
    let src = File::open(m.path.join("src")).expect("open src");
    // The whole file, as cp does.
    let dst = File::create(m.path.join("whole")).expect("create");
    assert_eq!(
        copy_range(&src, 0, &dst, 0, 10_000_000),
        data.len(),
        "short at the end"
    );
    // Odd offsets on both sides, into the middle of an existing file.
    fs::write(m.path.join("mid"), vec![b'x'; 3_000_000]).expect("write");
    let mid = fs::OpenOptions::new()
        .write(true)
        .open(m.path.join("mid"))
        .expect("open mid");
    assert_eq!(
        copy_range(&src, 12_345, &mid, 1_000_001, 2_500_000),
        2_500_000
    );
    // Past the end of the source: nothing.
    assert_eq!(copy_range(&src, 6_000_000, &mid, 0, 100), 0);
    // Overlapping ranges of one file.
    let same = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(m.path.join("src"))
        .expect("open src rw");
    let (mut i, mut o) = (0i64, 100i64);
    // SAFETY: one open descriptor, two valid offsets.
    let r = unsafe {
        libc::copy_file_range(same.as_raw_fd(), &mut i, same.as_raw_fd(), &mut o, 1000, 0)
    };
    assert_eq!(r, -1);
    assert_eq!(
        std::io::Error::last_os_error().raw_os_error(),
        Some(libc::EINVAL)
    );
    // A sparse source: into a new file its holes stay holes; over an
    // existing file's bytes they are zeros.
    let sparse = File::create(m.path.join("sparse")).expect("create sparse");
    std::os::unix::fs::FileExt::write_all_at(&sparse, &data[..100_000], 0).expect("write");
    std::os::unix::fs::FileExt::write_all_at(&sparse, &data[..100_000], 3_000_000).expect("write");
    sparse.set_len(4_000_000).expect("truncate up");
    drop(sparse);
    let sparse = File::open(m.path.join("sparse")).expect("open sparse");
    let fresh = File::create(m.path.join("fresh")).expect("create fresh");
    assert_eq!(copy_range(&sparse, 0, &fresh, 0, 10_000_000), 4_000_000);
    let mut want_sparse = vec![0u8; 4_000_000];
    want_sparse[..100_000].copy_from_slice(&data[..100_000]);
    want_sparse[3_000_000..3_100_000].copy_from_slice(&data[..100_000]);
    assert_eq!(fs::read(m.path.join("fresh")).expect("read"), want_sparse);
    // SAFETY: an open descriptor.
    let hole = unsafe { libc::lseek(fresh.as_raw_fd(), 0, libc::SEEK_HOLE) };
    assert!(
        hole > 0 && hole < 3_000_000,
        "the copy's first hole is at {hole}, not in the source's hole"
    );
    fs::write(m.path.join("over"), vec![b'y'; 4_000_000]).expect("write");
    let over = fs::OpenOptions::new()
        .write(true)
        .open(m.path.join("over"))
        .expect("open over");
    assert_eq!(copy_range(&sparse, 0, &over, 0, 4_000_000), 4_000_000);
    assert_eq!(fs::read(m.path.join("over")).expect("read"), want_sparse);
    drop((src, dst, mid, same, sparse, fresh, over));
    // Read back through another mount.
    let other = c.mount();
    assert_eq!(fs::read(other.path.join("whole")).expect("read"), data);
    let mut want = vec![b'x'; 3_500_001];
    want[1_000_001..].copy_from_slice(&data[12_345..12_345 + 2_500_000]);
    assert_eq!(fs::read(other.path.join("mid")).expect("read"), want);
}

/// `open(dir, O_TMPFILE | flags, 0o640)`.
fn open_tmpfile(dir: &Path, flags: i32) -> std::io::Result<File> {
    let p = cpath(dir);
    // SAFETY: a NUL-terminated path; the descriptor is owned by the File.
    let fd = unsafe { libc::open(p.as_ptr(), libc::O_TMPFILE | flags, 0o640) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor nobody else owns.
    Ok(unsafe { File::from_raw_fd(fd) })
}

/// Names open file `f` as `to`: `linkat` of `/proc/self/fd/N` with
/// `AT_SYMLINK_FOLLOW`, as programs that use `O_TMPFILE` do.
fn link_open(f: &File, to: &Path) -> std::io::Result<()> {
    let from = cpath(Path::new(&format!("/proc/self/fd/{}", f.as_raw_fd())));
    let to = cpath(to);
    // SAFETY: NUL-terminated paths.
    let r = unsafe {
        libc::linkat(
            libc::AT_FDCWD,
            from.as_ptr(),
            libc::AT_FDCWD,
            to.as_ptr(),
            libc::AT_SYMLINK_FOLLOW,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Waits until fsck counts `inodes` inodes and no garbage.
fn wait_for_inodes(c: &Cluster, inodes: usize, what: &str) {
    common::wait_for(Duration::from_secs(90), what, || {
        let (ok, out, all) = common::fsck(c.addr(0));
        let want = format!(": {inodes} inodes,");
        if ok && out.contains(&want) && out.contains("0 unreachable") && out.contains("0 errors") {
            Ok(())
        } else {
            Err(all)
        }
    });
}

#[test]
fn o_tmpfile_makes_a_file_without_a_name_that_linkat_can_name() {
    use std::io::{Read, Write};
    let c = Cluster::start(4, ClusterOpts::default());
    let m = c.mount();
    let other = c.mount();
    let data = common::pattern(5, 0, 3 << 20);
    // Open, writable, counted by no name and listed nowhere.
    let mut f = open_tmpfile(&m.path, libc::O_RDWR).expect("open O_TMPFILE");
    f.write_all(&data).expect("write");
    let md = f.metadata().expect("fstat");
    assert_eq!((md.nlink(), md.len()), (0, data.len() as u64));
    assert!(md.is_file());
    assert_eq!(fs::read_dir(&m.path).expect("list").count(), 0);
    // Named by linkat: seen, whole, on another mount.
    link_open(&f, &m.path.join("named")).expect("linkat the open file");
    assert_eq!(f.metadata().expect("fstat").nlink(), 1);
    f.write_all(b"tail").expect("write after the link");
    drop(f);
    let mut want = data.clone();
    want.extend_from_slice(b"tail");
    assert!(fs::read(other.path.join("named")).expect("read on B") == want);
    // O_EXCL: never named (the kernel and the volume both refuse).
    let g = open_tmpfile(&m.path, libc::O_RDWR | libc::O_EXCL).expect("O_TMPFILE|O_EXCL");
    expect_errno(
        link_open(&g, &m.path.join("excl")),
        libc::ENOENT,
        "linkat of an O_EXCL temporary file",
    );
    // Named once only: unlinked again, it cannot be named a second time.
    let h = open_tmpfile(&m.path, libc::O_RDWR).expect("O_TMPFILE");
    link_open(&h, &m.path.join("once")).expect("linkat");
    fs::remove_file(m.path.join("once")).expect("unlink");
    expect_errno(
        link_open(&h, &m.path.join("twice")),
        libc::ENOENT,
        "a second linkat after the unlink",
    );
    let mut read_back = Vec::new();
    let mut g2 = g.try_clone().expect("dup");
    g2.write_all(b"excl").expect("write");
    drop(g2);
    let mut r = File::open(format!("/proc/self/fd/{}", g.as_raw_fd())).expect("reopen");
    r.read_to_end(&mut read_back).expect("read through /proc");
    assert_eq!(read_back, b"excl");
    drop((g, h, r));
    let names: Vec<_> = fs::read_dir(&other.path)
        .expect("list on B")
        .map(|e| e.expect("entry").file_name())
        .collect();
    assert_eq!(names, ["named"]);
    // Closed without a name: gone (root and `named` remain).
    wait_for_inodes(&c, 2, "unnamed temporary files removed at their close");
    // A mount killed with one open: the servers remove it once its client
    // is gone (after `ORPHAN_AGE`).
    let mut third = c.mount();
    let mut t = open_tmpfile(&third.path, libc::O_WRONLY).expect("O_TMPFILE on C");
    t.write_all(&data).expect("write on C");
    t.sync_all().expect("fsync on C");
    third.kill9();
    drop(t);
    wait_for_inodes(&c, 2, "a killed mount's temporary file removed");
    fsck_clean(&c);
}

/// The inode flags of `p` (`FS_IOC_GETFLAGS`, as `lsattr`).
fn get_flags(p: &Path) -> std::io::Result<u32> {
    let f = File::open(p)?;
    let mut flags: libc::c_int = 0;
    // SAFETY: FS_IOC_GETFLAGS writes one int through the pointer.
    let r = unsafe { libc::ioctl(f.as_raw_fd(), libc::FS_IOC_GETFLAGS, &mut flags) };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(flags as u32)
}

/// Sets the inode flags of `p` (`FS_IOC_SETFLAGS`, as `chattr`).
fn set_flags(p: &Path, flags: u32) -> std::io::Result<()> {
    let f = File::open(p)?;
    let flags = flags as libc::c_int;
    // SAFETY: FS_IOC_SETFLAGS reads one int through the pointer.
    let r = unsafe { libc::ioctl(f.as_raw_fd(), libc::FS_IOC_SETFLAGS, &flags) };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

#[test]
fn chattr_flags_hold_on_every_mount_and_across_a_restart() {
    use std::fs::OpenOptions;
    use std::io::Write;
    use std::os::unix::fs::PermissionsExt;
    const IMMUTABLE: u32 = 0x10;
    const APPEND: u32 = 0x20;
    const NODUMP: u32 = 0x40;
    let mut c = Cluster::start(4, ClusterOpts::default());
    let a = c.mount();
    let b = c.mount();
    fs::write(a.path.join("f"), b"kept").expect("write f");
    fs::create_dir(a.path.join("d")).expect("mkdir d");
    fs::write(a.path.join("d/in"), b"in").expect("write d/in");
    set_flags(&a.path.join("f"), IMMUTABLE | NODUMP).expect("chattr +id f");
    set_flags(&a.path.join("d"), APPEND).expect("chattr +a d");
    // Refused on the other mount, to root as to anyone.
    let (f, d) = (b.path.join("f"), b.path.join("d"));
    assert_eq!(get_flags(&f).expect("lsattr f"), IMMUTABLE | NODUMP);
    let eperm = libc::EPERM;
    expect_errno(
        OpenOptions::new().write(true).open(&f),
        eperm,
        "open to write",
    );
    expect_errno(
        OpenOptions::new().append(true).open(&f),
        eperm,
        "open to append",
    );
    expect_errno(fs::remove_file(&f), eperm, "unlink");
    expect_errno(fs::rename(&f, b.path.join("g")), eperm, "rename");
    expect_errno(fs::hard_link(&f, b.path.join("h")), eperm, "link");
    expect_errno(
        fs::set_permissions(&f, fs::Permissions::from_mode(0o600)),
        eperm,
        "chmod",
    );
    let name = CString::new("user.x").expect("name");
    let fp = cpath(&f);
    // SAFETY: NUL-terminated strings and a 1-byte value.
    let r = unsafe { libc::setxattr(fp.as_ptr(), name.as_ptr(), b"1".as_ptr().cast(), 1, 0) };
    assert_eq!(
        (r, std::io::Error::last_os_error().raw_os_error()),
        (-1, Some(eperm)),
        "setxattr"
    );
    // An append-only directory takes new entries and loses none.
    fs::write(d.join("new"), b"new").expect("create in an append-only directory");
    expect_errno(
        fs::remove_file(d.join("in")),
        eperm,
        "unlink in an append-only directory",
    );
    expect_errno(
        fs::rename(d.join("in"), d.join("in2")),
        eperm,
        "rename in an append-only directory",
    );
    // An append-only file: O_APPEND only, never truncated.
    fs::write(a.path.join("log"), b"1\n").expect("write log");
    set_flags(&a.path.join("log"), APPEND).expect("chattr +a log");
    let log = b.path.join("log");
    OpenOptions::new()
        .append(true)
        .open(&log)
        .and_then(|mut l| l.write_all(b"2\n"))
        .expect("append to an append-only file");
    expect_errno(
        OpenOptions::new().write(true).open(&log),
        eperm,
        "open to overwrite",
    );
    expect_errno(
        OpenOptions::new().write(true).truncate(true).open(&log),
        eperm,
        "O_TRUNC",
    );
    assert_eq!(fs::read(&log).expect("read log"), b"1\n2\n");
    // Its times move to now (`touch`), never elsewhere.
    let lp = cpath(&log);
    // SAFETY: a NUL-terminated path; NULL times mean "now".
    let r = unsafe { libc::utimensat(libc::AT_FDCWD, lp.as_ptr(), std::ptr::null(), 0) };
    assert_eq!(
        r,
        0,
        "touch an append-only file: {}",
        std::io::Error::last_os_error()
    );
    let epoch = [libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    }; 2];
    // SAFETY: as above, with two explicit times.
    let r = unsafe { libc::utimensat(libc::AT_FDCWD, lp.as_ptr(), epoch.as_ptr(), 0) };
    assert_eq!(
        (r, std::io::Error::last_os_error().raw_os_error()),
        (-1, Some(eperm)),
        "utime of an append-only file to the epoch"
    );
    // Kept by the servers: after a restart of every one, as before.
    for i in 0..4 {
        c.kill9(i);
        c.restart(i);
    }
    let m = c.mount();
    assert_eq!(
        get_flags(&m.path.join("f")).expect("lsattr"),
        IMMUTABLE | NODUMP
    );
    assert_eq!(get_flags(&m.path.join("d")).expect("lsattr"), APPEND);
    expect_errno(
        fs::remove_file(m.path.join("f")),
        eperm,
        "unlink after a restart",
    );
    // Cleared, it is an ordinary file again; flags not kept are refused.
    set_flags(&m.path.join("f"), 0).expect("chattr -id");
    fs::write(m.path.join("f"), b"changed").expect("write after chattr -i");
    expect_errno(
        set_flags(&m.path.join("f"), 0x4),
        libc::EOPNOTSUPP,
        "chattr +c (not kept)",
    );
    assert_eq!(fs::read(a.path.join("f")).expect("read on A"), b"changed");
    set_flags(&m.path.join("d"), 0).expect("chattr -a d");
    set_flags(&m.path.join("log"), 0).expect("chattr -a log");
    drop((a, b, m));
    fsck_clean(&c);
}

//! POSIX behaviour through one FUSE mount, checked against what a local disk
//! does: data at odd offsets across stripe units, open flags, truncation,
//! sparse files, directories, renames, links, attributes, statfs, big
//! directories, name limits, open-but-unlinked files and a big file.
//!
//! Every test runs a four-server volume with 64 KiB stripe units, so that a
//! few hundred KiB already spread over every server.

mod common;

use std::collections::hash_map::DefaultHasher;
use std::collections::HashSet;
use std::ffi::CString;
use std::fs::{self, File, OpenOptions};
use std::hash::Hasher;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::time::Duration;

use common::{
    close_checked, expect_errno, morris, pattern, renameat2, stderr, stdout, Cluster, ClusterOpts,
    Mount,
};
use rand::{Rng, SeedableRng};

/// The stripe unit of every test volume here.
const UNIT: u64 = 64 * 1024;

/// A four-server volume and one mount; the mount is dropped (unmounted)
/// before the servers are stopped.
struct Env {
    m: Mount,
    _c: Cluster,
}

impl Env {
    fn new() -> Env {
        let c = Cluster::start(4, ClusterOpts::default());
        assert_eq!(c.opts.stripe_unit, "64K", "these tests assume 64 KiB units");
        let m = c.mount();
        Env { m, _c: c }
    }

    fn p(&self, rel: &str) -> std::path::PathBuf {
        self.m.path.join(rel)
    }
}

fn cpath(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).expect("path without NUL")
}

/// The last OS error as an `io::Result` when `ret` is -1.
fn check(ret: libc::c_int) -> std::io::Result<()> {
    if ret == -1 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Reads the whole file at `p` and compares it with `want`, naming the first
/// differing offset on mismatch.
fn assert_contents(p: &Path, want: &[u8], what: &str) {
    let got = fs::read(p).unwrap_or_else(|e| panic!("{what}: cannot read {}: {e}", p.display()));
    assert_same(&got, want, what);
}

fn assert_same(got: &[u8], want: &[u8], what: &str) {
    if got != want {
        let first = common::first_difference(got, want);
        panic!(
            "{what}: contents differ: got {} bytes, want {} bytes, first difference at offset {first} \
             (stripe unit {}, byte {} of it)",
            got.len(),
            want.len(),
            first as u64 / UNIT,
            first as u64 % UNIT
        );
    }
}

#[test]
fn pread_pwrite_at_odd_offsets_across_stripe_units() {
    let env = Env::new();
    let p = env.p("odd");

    // A first image spanning five units plus a bit.
    let mut model = pattern(1, 0, (5 * UNIT + 123) as usize);
    fs::write(&p, &model).expect("write the first image");
    assert_contents(&p, &model, "after the first write");

    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&p)
        .expect("open read-write");
    // Writes straddling unit boundaries, one byte before and after each.
    for (i, off) in [UNIT - 1, 2 * UNIT - 3, 3 * UNIT + 7, 4 * UNIT - 1]
        .into_iter()
        .enumerate()
    {
        let data = pattern(100 + i as u64, 0, 5);
        f.write_all_at(&data, off)
            .expect("pwrite across a boundary");
        model[off as usize..off as usize + 5].copy_from_slice(&data);
        let mut back = [0u8; 5];
        f.read_exact_at(&mut back, off).expect("pread it back");
        assert_eq!(back, data[..], "pread at {off} right after pwrite");
    }
    // A write covering whole units with odd ends.
    let big = pattern(7, 0, (2 * UNIT + 2) as usize);
    f.write_all_at(&big, UNIT - 1).expect("pwrite two units");
    model[(UNIT - 1) as usize..(3 * UNIT + 1) as usize].copy_from_slice(&big);

    // Random reads and writes, some past the end (leaving holes).
    let seed: u64 = rand::random();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    for step in 0..200 {
        let off = rng.gen_range(0..9 * UNIT);
        let len = rng.gen_range(1..3 * UNIT) as usize;
        if rng.gen_bool(0.5) {
            let data = pattern(seed ^ step, off, len);
            f.write_all_at(&data, off)
                .unwrap_or_else(|e| panic!("seed {seed} step {step}: pwrite {len} at {off}: {e}"));
            let end = off as usize + len;
            if model.len() < end {
                model.resize(end, 0);
            }
            model[off as usize..end].copy_from_slice(&data);
        } else {
            let mut buf = vec![0u8; len];
            let mut got = 0;
            while got < len {
                let n = f
                    .read_at(&mut buf[got..], off + got as u64)
                    .unwrap_or_else(|e| panic!("seed {seed} step {step}: pread: {e}"));
                if n == 0 {
                    break;
                }
                got += n;
            }
            let start = (off as usize).min(model.len());
            let end = (off as usize + len).min(model.len());
            assert_same(
                &buf[..got],
                &model[start..end],
                &format!("seed {seed} step {step}: pread {len} at {off}"),
            );
        }
    }
    assert_eq!(
        f.metadata().expect("fstat").len(),
        model.len() as u64,
        "seed {seed}: size after random writes"
    );
    close_checked(f).expect("close after random writes");
    assert_contents(&p, &model, &format!("seed {seed}: reopened"));
}

#[test]
fn open_flags_trunc_append_and_excl() {
    let env = Env::new();
    let p = env.p("flags");
    fs::write(&p, pattern(2, 0, 200_000)).expect("write");

    // O_TRUNC empties the file at open.
    let mut f = OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(&p)
        .expect("open O_TRUNC");
    assert_eq!(
        f.metadata().expect("fstat").len(),
        0,
        "size right after O_TRUNC"
    );
    f.write_all(b"fresh").expect("write after O_TRUNC");
    close_checked(f).expect("close");
    assert_contents(&p, b"fresh", "after O_TRUNC and a write");

    // O_APPEND writes at the end, even after a seek elsewhere.
    let mut f = OpenOptions::new()
        .append(true)
        .open(&p)
        .expect("open O_APPEND");
    f.write_all(b"-one").expect("append");
    f.seek(SeekFrom::Start(0)).expect("seek");
    f.write_all(b"-two").expect("append after seek");
    close_checked(f).expect("close");
    // A second writer appending across a stripe unit boundary.
    let tail = pattern(3, 0, UNIT as usize);
    let mut f = OpenOptions::new()
        .append(true)
        .open(&p)
        .expect("open O_APPEND again");
    f.write_all(&tail).expect("append a unit");
    close_checked(f).expect("close");
    let mut want = b"fresh-one-two".to_vec();
    want.extend_from_slice(&tail);
    assert_contents(&p, &want, "after appends");

    // O_CREAT|O_EXCL: EEXIST on an existing name, success on a new one.
    expect_errno(
        OpenOptions::new().write(true).create_new(true).open(&p),
        libc::EEXIST,
        "O_EXCL on an existing file",
    );
    let q = env.p("excl-new");
    let f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&q)
        .expect("O_EXCL on a new name");
    close_checked(f).expect("close");
    let md = fs::metadata(&q).expect("stat");
    assert_eq!(md.mode() & 0o7777, 0o600, "mode given to O_CREAT");
    assert_eq!(md.len(), 0);
    // Also for a directory and a symlink that exist.
    fs::create_dir(env.p("d")).expect("mkdir");
    expect_errno(
        OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(env.p("d")),
        libc::EEXIST,
        "O_EXCL on a directory",
    );
    // O_RDONLY on a file gives a descriptor that cannot write.
    let mut ro = File::open(&p).expect("open read-only");
    expect_errno(
        ro.write(b"x"),
        libc::EBADF,
        "write on an O_RDONLY descriptor",
    );
}

#[test]
fn truncate_down_then_up_reads_zeros() {
    let env = Env::new();
    let p = env.p("trunc");
    let orig = pattern(4, 0, (5 * UNIT) as usize);
    fs::write(&p, &orig).expect("write");

    // Down to an odd size inside the second unit, then back up past the old end.
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&p)
        .expect("open");
    f.set_len(UNIT + 1000).expect("truncate down");
    assert_eq!(f.metadata().expect("fstat").len(), UNIT + 1000);
    f.set_len(6 * UNIT).expect("truncate up");
    assert_eq!(f.metadata().expect("fstat").len(), 6 * UNIT);
    let mut want = orig[..(UNIT + 1000) as usize].to_vec();
    want.resize((6 * UNIT) as usize, 0);
    let mut got = Vec::new();
    (&f).read_to_end(&mut got)
        .expect("read through the same descriptor");
    assert_same(&got, &want, "same descriptor after truncate down and up");
    close_checked(f).expect("close");
    assert_contents(&p, &want, "reopened after truncate down and up");

    // Through the path (truncate(2)), to zero and up again.
    check(unsafe { libc::truncate(cpath(&p).as_ptr(), 0) }).expect("truncate(2) to 0");
    assert_eq!(fs::metadata(&p).expect("stat").len(), 0);
    check(unsafe { libc::truncate(cpath(&p).as_ptr(), 3 * UNIT as libc::off_t + 5) })
        .expect("truncate(2) up");
    assert_contents(
        &p,
        &vec![0u8; (3 * UNIT + 5) as usize],
        "zeros after truncate up",
    );

    // Writing past a truncated end leaves zeros in between.
    let f = OpenOptions::new().write(true).open(&p).expect("open");
    f.set_len(10).expect("truncate to 10");
    f.write_all_at(b"end", 2 * UNIT)
        .expect("pwrite past the end");
    close_checked(f).expect("close");
    let mut want = vec![0u8; (2 * UNIT + 3) as usize];
    want[(2 * UNIT) as usize..].copy_from_slice(b"end");
    assert_contents(&p, &want, "write past a truncated end");
    expect_errno(
        unsafe { check(libc::truncate(cpath(&p).as_ptr(), -1)) },
        libc::EINVAL,
        "truncate to a negative size",
    );
}

#[test]
fn sparse_file_holes_read_as_zeros() {
    let env = Env::new();
    let p = env.p("sparse");
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&p)
        .expect("create");
    let far = 100 * 1024 * 1024 + 17;
    f.write_all_at(b"head", 0).expect("write the head");
    f.write_all_at(b"tail", far).expect("write far away");
    close_checked(f).expect("close");
    let md = fs::metadata(&p).expect("stat");
    assert_eq!(md.len(), far + 4, "size of the sparse file");

    let f = File::open(&p).expect("open");
    let mut buf = vec![0xffu8; 3 * UNIT as usize];
    f.read_exact_at(&mut buf, 4)
        .expect("read the start of the hole");
    assert!(
        buf.iter().all(|&b| b == 0),
        "hole after the head is not zeros"
    );
    let mut buf = vec![0xffu8; 2 * UNIT as usize];
    f.read_exact_at(&mut buf, 50 * 1024 * 1024 + 3)
        .expect("read the middle of the hole");
    assert!(
        buf.iter().all(|&b| b == 0),
        "middle of the hole is not zeros"
    );
    let mut buf = vec![0xffu8; 1000];
    f.read_exact_at(&mut buf, far - 996)
        .expect("read up to the tail");
    assert!(buf[..996].iter().all(|&b| b == 0), "hole before the tail");
    assert_eq!(&buf[996..], b"tail");
    let mut head = [0u8; 4];
    f.read_exact_at(&mut head, 0).expect("read the head");
    assert_eq!(&head, b"head");
}

#[test]
fn sparse_file_takes_no_space_on_the_servers() {
    let env = Env::new();
    let used = |env: &Env| -> u64 {
        let out = morris(&["status", env._c.addr(0), "--json"]);
        assert!(out.status.success(), "status failed: {}", stderr(&out));
        let v: serde_json::Value = serde_json::from_str(&stdout(&out)).expect("status json");
        v["servers"]
            .as_array()
            .expect("servers")
            .iter()
            .map(|s| s["stats"]["data_bytes"].as_u64().expect("data_bytes"))
            .sum()
    };
    let before = used(&env);
    let p = env.p("sparse");
    let f = File::create(&p).expect("create");
    f.set_len(1 << 30).expect("set_len 1 GiB");
    f.write_all_at(b"x", 512 * 1024 * 1024)
        .expect("one byte in the middle");
    close_checked(f).expect("close");
    let md = fs::metadata(&p).expect("stat");
    assert_eq!(md.len(), 1 << 30);
    // The holes are not stored: the servers' disks hold about one block.
    // (st_blocks reports the apparent size; see docs/architecture.md.)
    let grown = used(&env).saturating_sub(before);
    assert!(
        grown <= 1 << 20,
        "a 1 GiB sparse file holding one byte takes {grown} bytes on the servers"
    );
    let mut b = [1u8; 4096];
    File::open(&p)
        .expect("open")
        .read_exact_at(&mut b, 4096)
        .expect("read hole");
    assert!(b.iter().all(|&x| x == 0), "a hole must read as zeros");
}

#[test]
fn unlink_mkdir_rmdir_and_their_errors() {
    let env = Env::new();
    let d = env.p("dir");
    fs::create_dir(&d).expect("mkdir");
    expect_errno(fs::create_dir(&d), libc::EEXIST, "mkdir of an existing dir");
    let f = d.join("file");
    fs::write(&f, b"data").expect("create in dir");
    assert!(fs::metadata(&d).expect("stat dir").is_dir());
    assert_eq!(
        fs::metadata(&d).expect("stat dir").nlink(),
        2,
        "nlink of a directory without subdirectories"
    );
    fs::create_dir(d.join("sub")).expect("mkdir sub");
    assert_eq!(
        fs::metadata(&d).expect("stat dir").nlink(),
        3,
        "a subdirectory adds a link to its parent"
    );
    fs::remove_dir(d.join("sub")).expect("rmdir sub");
    assert_eq!(fs::metadata(&d).expect("stat dir").nlink(), 2);

    expect_errno(
        fs::remove_dir(&d),
        libc::ENOTEMPTY,
        "rmdir of a non-empty dir",
    );
    expect_errno(fs::remove_dir(&f), libc::ENOTDIR, "rmdir of a file");
    expect_errno(
        fs::create_dir(f.join("below")),
        libc::ENOTDIR,
        "mkdir below a file",
    );
    expect_errno(
        File::open(f.join("below")),
        libc::ENOTDIR,
        "open below a file",
    );
    expect_errno(fs::remove_file(&d), libc::EISDIR, "unlink of a directory");
    expect_errno(
        OpenOptions::new().write(true).open(&d),
        libc::EISDIR,
        "open a directory for writing",
    );
    expect_errno(
        fs::remove_file(d.join("missing")),
        libc::ENOENT,
        "unlink of a missing name",
    );
    expect_errno(
        fs::remove_dir(env.p("missing")),
        libc::ENOENT,
        "rmdir of a missing name",
    );

    fs::remove_file(&f).expect("unlink");
    expect_errno(fs::metadata(&f), libc::ENOENT, "stat after unlink");
    expect_errno(File::open(&f), libc::ENOENT, "open after unlink");
    assert_eq!(
        fs::read_dir(&d).expect("readdir").count(),
        0,
        "directory empty after unlink"
    );
    fs::remove_dir(&d).expect("rmdir of the now empty dir");
    expect_errno(fs::metadata(&d), libc::ENOENT, "stat after rmdir");
    // The name can be used again, for another kind.
    fs::write(&d, b"now a file").expect("reuse the name");
    assert_contents(&d, b"now a file", "reused name");
}

#[test]
fn rename_semantics() {
    let env = Env::new();
    let (a, b) = (env.p("a"), env.p("b"));
    fs::create_dir(&a).expect("mkdir a");
    fs::create_dir(&b).expect("mkdir b");

    // Same directory.
    fs::write(a.join("one"), b"1").expect("create");
    fs::rename(a.join("one"), a.join("two")).expect("rename in one dir");
    expect_errno(
        fs::metadata(a.join("one")),
        libc::ENOENT,
        "old name after rename",
    );
    assert_contents(&a.join("two"), b"1", "new name after rename");

    // Across directories.
    fs::rename(a.join("two"), b.join("moved")).expect("rename across dirs");
    expect_errno(
        fs::metadata(a.join("two")),
        libc::ENOENT,
        "source after move",
    );
    assert_contents(&b.join("moved"), b"1", "moved file");
    let names: Vec<_> = fs::read_dir(&a).expect("readdir a").collect();
    assert!(names.is_empty(), "a still lists {names:?}");

    // Overwriting an existing file: the target's old data is gone, the
    // source's inode now has the name.
    fs::write(b.join("victim"), b"old victim").expect("create victim");
    let src_ino = fs::metadata(b.join("moved")).expect("stat").ino();
    fs::rename(b.join("moved"), b.join("victim")).expect("rename over a file");
    assert_contents(&b.join("victim"), b"1", "overwritten target");
    assert_eq!(fs::metadata(b.join("victim")).expect("stat").ino(), src_ino);
    let mut listed: Vec<_> = fs::read_dir(&b)
        .expect("readdir b")
        .map(|e| e.expect("entry").file_name())
        .collect();
    listed.sort();
    assert_eq!(listed, vec!["victim"], "b after overwriting rename");

    // Overwriting across directories.
    fs::write(a.join("x"), b"from a").expect("create");
    fs::rename(a.join("x"), b.join("victim")).expect("rename over a file across dirs");
    assert_contents(&b.join("victim"), b"from a", "overwritten across dirs");

    // A directory over an empty directory.
    fs::create_dir(a.join("srcdir")).expect("mkdir");
    fs::write(a.join("srcdir/inside"), b"in").expect("create inside");
    fs::create_dir(b.join("empty")).expect("mkdir empty");
    fs::rename(a.join("srcdir"), b.join("empty")).expect("rename dir over empty dir");
    assert_contents(&b.join("empty/inside"), b"in", "file inside the moved dir");
    expect_errno(
        fs::metadata(a.join("srcdir")),
        libc::ENOENT,
        "moved dir's old name",
    );
    // `..` of the moved directory is its new parent.
    assert_eq!(
        fs::metadata(b.join("empty/..")).expect("stat ..").ino(),
        fs::metadata(&b).expect("stat b").ino(),
        "the moved directory's parent"
    );

    // Not over a non-empty directory.
    fs::create_dir(a.join("d2")).expect("mkdir");
    expect_errno(
        fs::rename(a.join("d2"), b.join("empty")),
        libc::ENOTEMPTY,
        "rename over a non-empty dir",
    );
    assert!(fs::metadata(a.join("d2")).expect("source stays").is_dir());
    // Kind mismatches.
    expect_errno(
        fs::rename(a.join("d2"), b.join("victim")),
        libc::ENOTDIR,
        "rename a dir over a file",
    );
    expect_errno(
        fs::rename(b.join("victim"), a.join("d2")),
        libc::EISDIR,
        "rename a file over a dir",
    );
    // Not into its own subdirectory.
    fs::create_dir(a.join("d2/child")).expect("mkdir child");
    expect_errno(
        fs::rename(a.join("d2"), a.join("d2/child/loop")),
        libc::EINVAL,
        "move a dir into its own subdirectory",
    );
    expect_errno(
        fs::rename(&a, a.join("d2/child/loop")),
        libc::EINVAL,
        "move a dir into its grandchild",
    );
    assert!(fs::metadata(a.join("d2/child"))
        .expect("tree intact")
        .is_dir());
    // A missing source.
    expect_errno(
        fs::rename(a.join("nothing"), a.join("else")),
        libc::ENOENT,
        "rename of a missing name",
    );

    // RENAME_NOREPLACE.
    fs::write(a.join("keep"), b"keep me").expect("create");
    fs::write(a.join("other"), b"other").expect("create");
    expect_errno(
        renameat2(&a.join("other"), &a.join("keep"), libc::RENAME_NOREPLACE),
        libc::EEXIST,
        "RENAME_NOREPLACE over an existing file",
    );
    assert_contents(&a.join("keep"), b"keep me", "target after refused rename");
    assert_contents(&a.join("other"), b"other", "source after refused rename");
    renameat2(&a.join("other"), &a.join("fresh"), libc::RENAME_NOREPLACE)
        .expect("RENAME_NOREPLACE to a free name");
    assert_contents(&a.join("fresh"), b"other", "RENAME_NOREPLACE result");

    // RENAME_EXCHANGE within a directory: a file and a directory swap.
    fs::create_dir(a.join("xd")).expect("mkdir");
    fs::write(a.join("xd/inside"), b"in").expect("create");
    renameat2(&a.join("fresh"), &a.join("xd"), libc::RENAME_EXCHANGE).expect("RENAME_EXCHANGE");
    assert_contents(
        &a.join("xd"),
        b"other",
        "the file under the directory's name",
    );
    assert_contents(
        &a.join("fresh/inside"),
        b"in",
        "the directory under the file's name",
    );
    let names: HashSet<String> = fs::read_dir(&a)
        .expect("list")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    assert!(names.contains("fresh") && names.contains("xd"), "{names:?}");
    expect_errno(
        renameat2(&a.join("xd"), &a.join("nothing"), libc::RENAME_EXCHANGE),
        libc::ENOENT,
        "RENAME_EXCHANGE with a missing name",
    );
    fs::create_dir(a.join("sub")).expect("mkdir");
    fs::write(a.join("sub/s"), b"s").expect("create");
    renameat2(&a.join("xd"), &a.join("sub/s"), libc::RENAME_EXCHANGE)
        .expect("RENAME_EXCHANGE between directories");
    assert_contents(&a.join("xd"), b"s", "exchanged across directories");
    assert_contents(&a.join("sub/s"), b"other", "exchanged across directories");
}

#[test]
fn symlinks_and_hard_links() {
    let env = Env::new();
    let target = env.p("target");
    fs::write(&target, b"through the link").expect("create target");

    // Symlinks.
    let link = env.p("sym");
    std::os::unix::fs::symlink("target", &link).expect("symlink");
    assert_eq!(fs::read_link(&link).expect("readlink"), Path::new("target"));
    let lmd = fs::symlink_metadata(&link).expect("lstat");
    assert!(lmd.file_type().is_symlink(), "lstat kind");
    assert_eq!(
        lmd.len(),
        "target".len() as u64,
        "a symlink's size is its target's length"
    );
    assert_contents(&link, b"through the link", "read through a symlink");
    let long_target = "x/".repeat(1000) + "end";
    std::os::unix::fs::symlink(&long_target, env.p("long")).expect("symlink with a long target");
    assert_eq!(
        fs::read_link(env.p("long")).expect("readlink long"),
        Path::new(&long_target)
    );
    std::os::unix::fs::symlink("nowhere", env.p("dangling")).expect("dangling symlink");
    expect_errno(
        fs::metadata(env.p("dangling")),
        libc::ENOENT,
        "stat through a dangling symlink",
    );
    expect_errno(
        fs::read_link(&target),
        libc::EINVAL,
        "readlink of a regular file",
    );
    expect_errno(
        std::os::unix::fs::symlink("x", &link),
        libc::EEXIST,
        "symlink over an existing name",
    );
    fs::remove_file(&link).expect("unlink the symlink");
    assert_contents(
        &target,
        b"through the link",
        "target after unlinking a symlink",
    );

    // Hard links.
    let h = env.p("hard");
    fs::create_dir(env.p("sub")).expect("mkdir");
    let h2 = env.p("sub/hard2");
    fs::hard_link(&target, &h).expect("link");
    fs::hard_link(&h, &h2).expect("link into a subdirectory");
    for p in [&target, &h, &h2] {
        let md = fs::metadata(p).expect("stat");
        assert_eq!(md.nlink(), 3, "nlink of {}", p.display());
    }
    assert_eq!(
        fs::metadata(&target).expect("stat").ino(),
        fs::metadata(&h2).expect("stat").ino(),
        "links share the inode"
    );
    let f = OpenOptions::new()
        .write(true)
        .open(&h2)
        .expect("open a link");
    f.write_all_at(b"THROUGH", 0)
        .expect("write through one name");
    close_checked(f).expect("close");
    assert_contents(&target, b"THROUGH the link", "data shared between links");
    fs::remove_file(&target).expect("unlink the first name");
    assert_eq!(fs::metadata(&h).expect("stat").nlink(), 2);
    assert_contents(&h, b"THROUGH the link", "data after unlinking one name");
    fs::remove_file(&h).expect("unlink the second name");
    assert_eq!(fs::metadata(&h2).expect("stat").nlink(), 1);
    assert_contents(&h2, b"THROUGH the link", "data after unlinking two names");
    expect_errno(
        fs::hard_link(env.p("sub"), env.p("dirlink")),
        libc::EPERM,
        "hard link to a directory",
    );
    expect_errno(
        fs::hard_link(&h2, env.p("sub/hard2")),
        libc::EEXIST,
        "link over an existing name",
    );
    expect_errno(
        fs::hard_link(env.p("missing"), env.p("l")),
        libc::ENOENT,
        "link of a missing file",
    );
}

fn utimens(p: &Path, atime: (i64, i64), mtime: (i64, i64)) -> std::io::Result<()> {
    let ts = [
        libc::timespec {
            tv_sec: atime.0,
            tv_nsec: atime.1,
        },
        libc::timespec {
            tv_sec: mtime.0,
            tv_nsec: mtime.1,
        },
    ];
    let c = cpath(p);
    // SAFETY: valid path and a two-element timespec array.
    check(unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), ts.as_ptr(), 0) })
}

#[test]
fn chmod_chown_utimens_and_timestamps() {
    let env = Env::new();
    let p = env.p("attrs");
    fs::write(&p, b"x").expect("create");

    fs::set_permissions(&p, fs::Permissions::from_mode(0o4751)).expect("chmod");
    assert_eq!(fs::metadata(&p).expect("stat").mode() & 0o7777, 0o4751);
    fs::set_permissions(&p, fs::Permissions::from_mode(0o640)).expect("chmod");
    assert_eq!(fs::metadata(&p).expect("stat").mode() & 0o7777, 0o640);
    assert!(
        fs::metadata(&p).expect("stat").is_file(),
        "chmod keeps the kind"
    );

    std::os::unix::fs::chown(&p, Some(1234), Some(5678)).expect("chown");
    let md = fs::metadata(&p).expect("stat");
    assert_eq!((md.uid(), md.gid()), (1234, 5678), "owner after chown");
    std::os::unix::fs::chown(&p, None, Some(42)).expect("chgrp only");
    let md = fs::metadata(&p).expect("stat");
    assert_eq!((md.uid(), md.gid()), (1234, 42), "owner after chgrp");
    std::os::unix::fs::symlink("attrs", env.p("sym")).expect("symlink");
    std::os::unix::fs::lchown(env.p("sym"), Some(77), Some(88)).expect("lchown");
    let lmd = fs::symlink_metadata(env.p("sym")).expect("lstat");
    assert_eq!((lmd.uid(), lmd.gid()), (77, 88), "lchown changed the link");
    assert_eq!(
        fs::metadata(&p).expect("stat").uid(),
        1234,
        "not its target"
    );

    // utimensat sets both times exactly, to the nanosecond.
    utimens(
        &p,
        (1_000_000_000, 123_456_789),
        (1_500_000_000, 987_654_321),
    )
    .expect("utimensat");
    let md = fs::metadata(&p).expect("stat");
    assert_eq!(
        (md.atime(), md.atime_nsec()),
        (1_000_000_000, 123_456_789),
        "atime"
    );
    assert_eq!(
        (md.mtime(), md.mtime_nsec()),
        (1_500_000_000, 987_654_321),
        "mtime"
    );
    // UTIME_OMIT leaves one alone; UTIME_NOW sets the current time.
    utimens(&p, (0, libc::UTIME_OMIT), (7, 8)).expect("utimensat omit");
    let md = fs::metadata(&p).expect("stat");
    assert_eq!(
        (md.atime(), md.atime_nsec()),
        (1_000_000_000, 123_456_789),
        "atime omitted"
    );
    assert_eq!((md.mtime(), md.mtime_nsec()), (7, 8), "mtime set");
    let before = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs() as i64;
    utimens(&p, (0, libc::UTIME_NOW), (0, libc::UTIME_NOW)).expect("utimensat now");
    let md = fs::metadata(&p).expect("stat");
    assert!(
        md.mtime() >= before && md.atime() >= before,
        "UTIME_NOW gave mtime {} atime {}, before the call it was {before}",
        md.mtime(),
        md.atime()
    );

    // A write changes mtime (and ctime).
    utimens(&p, (1_000, 0), (2_000, 0)).expect("utimensat");
    let f = OpenOptions::new().write(true).open(&p).expect("open");
    f.write_all_at(b"more", 1).expect("write");
    close_checked(f).expect("close");
    let md = fs::metadata(&p).expect("stat");
    assert!(
        md.mtime() >= before,
        "mtime after a write is {} (was set to 2000 before it)",
        md.mtime()
    );
    assert!(
        md.ctime() >= before,
        "ctime after a write is {}",
        md.ctime()
    );

    // chmod changes ctime but not mtime.
    let ct = |m: &fs::Metadata| (m.ctime(), m.ctime_nsec());
    let mt = |m: &fs::Metadata| (m.mtime(), m.mtime_nsec());
    let md0 = fs::metadata(&p).expect("stat");
    std::thread::sleep(Duration::from_millis(20));
    fs::set_permissions(&p, fs::Permissions::from_mode(0o600)).expect("chmod");
    let md1 = fs::metadata(&p).expect("stat");
    assert!(
        ct(&md1) > ct(&md0),
        "ctime did not advance on chmod: {:?} then {:?}",
        ct(&md0),
        ct(&md1)
    );
    assert_eq!(mt(&md1), mt(&md0), "chmod changed mtime");
    // ... and on chown.
    std::thread::sleep(Duration::from_millis(20));
    std::os::unix::fs::chown(&p, Some(1), None).expect("chown");
    let md2 = fs::metadata(&p).expect("stat");
    assert!(ct(&md2) > ct(&md1), "ctime did not advance on chown");
    // Creating a file in a directory changes the directory's mtime.
    let d = env.p("dir");
    fs::create_dir(&d).expect("mkdir");
    utimens(&d, (10, 0), (20, 0)).expect("utimensat dir");
    fs::write(d.join("new"), b"").expect("create in dir");
    let dm = fs::metadata(&d).expect("stat dir");
    assert!(
        dm.mtime() >= before,
        "directory mtime after a create is {} (set to 20 before)",
        dm.mtime()
    );
}

#[test]
fn statfs_reports_the_volume() {
    let env = Env::new();
    let c = cpath(&env.m.path);
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: valid path and an out-parameter of the right type.
    check(unsafe { libc::statvfs(c.as_ptr(), &mut st) }).expect("statvfs");
    assert!(st.f_bsize > 0, "f_bsize {}", st.f_bsize);
    assert!(st.f_frsize > 0, "f_frsize {}", st.f_frsize);
    assert!(st.f_blocks > 0, "f_blocks {}", st.f_blocks);
    assert!(
        st.f_bfree <= st.f_blocks,
        "f_bfree {} > f_blocks {}",
        st.f_bfree,
        st.f_blocks
    );
    assert!(st.f_bavail <= st.f_blocks, "f_bavail {}", st.f_bavail);
    assert!(
        st.f_bfree > 0,
        "a fresh volume on a disk with room reports no free blocks"
    );
    assert!(st.f_files > 0, "f_files {}", st.f_files);
    assert!(st.f_namemax >= 255, "f_namemax {}", st.f_namemax);
    // The servers share one disk here: it is counted once (in whole
    // stripe units), not once per server.
    let dir = cpath(env._c.dir());
    let mut local: libc::statvfs = unsafe { std::mem::zeroed() };
    check(unsafe { libc::statvfs(dir.as_ptr(), &mut local) }).expect("statvfs local");
    let total = st.f_blocks as u128 * st.f_frsize as u128;
    let disk = local.f_blocks as u128 * local.f_frsize as u128;
    assert!(
        total <= disk && disk - total < u128::from(UNIT),
        "volume total {total} bytes for the one disk its servers share ({disk} bytes)"
    );
    // Free inodes: as many files as both the space (a 4 KiB block each)
    // and the shared disk's own free inodes (two per file: its extent and
    // checksums) allow; before, one per free stripe unit (1 MiB).
    let by_space = (st.f_bavail + 1) * (st.f_frsize / 4096);
    let by_inodes = if local.f_files == 0 {
        u64::MAX
    } else {
        local.f_favail / 2
    };
    // (The servers make files of their own between the two statvfs calls.)
    let slack = 10_000;
    assert!(
        st.f_ffree <= by_space && st.f_ffree <= by_inodes.saturating_add(slack),
        "f_ffree {} for {} bytes available and {} free inodes on the disk",
        st.f_ffree,
        st.f_bavail * st.f_frsize,
        local.f_favail
    );
    assert!(
        st.f_ffree >= (st.f_bavail * (st.f_frsize / 4096)).min(by_inodes.saturating_sub(slack)),
        "f_ffree {} for {} bytes available and {} free inodes on the disk",
        st.f_ffree,
        st.f_bavail * st.f_frsize,
        local.f_favail
    );
    assert!(
        st.f_files > st.f_ffree,
        "f_files {} f_ffree {}",
        st.f_files,
        st.f_ffree
    );
}

#[test]
fn readdir_lists_5000_entries_exactly_once() {
    let env = Env::new();
    let d = env.p("many");
    fs::create_dir(&d).expect("mkdir");
    let names: Vec<String> = (0..5000)
        .map(|i| format!("entry-{i:05}-{}", "n".repeat(i % 40)))
        .collect();
    for (i, n) in names.iter().enumerate() {
        if i % 10 == 0 {
            fs::create_dir(d.join(n)).unwrap_or_else(|e| panic!("mkdir {n}: {e}"));
        } else {
            File::create(d.join(n)).unwrap_or_else(|e| panic!("create {n}: {e}"));
        }
    }
    let mut seen = HashSet::new();
    let mut dirs = 0;
    for e in fs::read_dir(&d).expect("opendir") {
        let e = e.expect("readdir entry");
        let name = e.file_name().into_string().expect("utf-8 name");
        assert!(name != "." && name != "..", "read_dir passes . and .. on");
        if e.file_type().expect("d_type").is_dir() {
            dirs += 1;
        }
        assert!(seen.insert(name.clone()), "{name} listed twice");
    }
    let want: HashSet<String> = names.iter().cloned().collect();
    let missing: Vec<_> = want.difference(&seen).take(10).collect();
    let extra: Vec<_> = seen.difference(&want).take(10).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "listed {} names of 5000; missing (first 10) {missing:?}, unexpected {extra:?}",
        seen.len()
    );
    assert_eq!(dirs, 500, "entries reported as directories by d_type");
    assert_eq!(
        fs::metadata(&d).expect("stat").nlink(),
        2 + 500,
        "nlink of a directory with 500 subdirectories"
    );
    // Removing every other entry while listing again still lists the rest once.
    for n in names.iter().step_by(2) {
        let p = d.join(n);
        if p.is_dir() {
            fs::remove_dir(&p).expect("rmdir");
        } else {
            fs::remove_file(&p).expect("unlink");
        }
    }
    let left: Vec<_> = fs::read_dir(&d)
        .expect("opendir")
        .map(|e| e.expect("entry").file_name().into_string().expect("utf-8"))
        .collect();
    let left_set: HashSet<_> = left.iter().cloned().collect();
    assert_eq!(left.len(), left_set.len(), "duplicates after removals");
    let want: HashSet<String> = names.iter().skip(1).step_by(2).cloned().collect();
    assert!(
        left_set == want,
        "after removing half: {} listed, want 2500",
        left.len()
    );
}

#[test]
fn name_length_limits() {
    let env = Env::new();
    let ok = "a".repeat(255);
    let too_long = "b".repeat(256);
    let p = env.p(&ok);
    fs::write(&p, b"long name").expect("create with a 255-byte name");
    assert_contents(&p, b"long name", "file with a 255-byte name");
    let listed: Vec<_> = fs::read_dir(&env.m.path)
        .expect("readdir")
        .map(|e| e.expect("entry").file_name())
        .collect();
    assert!(
        listed.iter().any(|n| n.as_bytes() == ok.as_bytes()),
        "255-byte name not listed"
    );
    // Multi-byte: 85 three-byte characters = 255 bytes.
    let wide = "\u{20ac}".repeat(85);
    assert_eq!(wide.len(), 255);
    fs::create_dir(env.p(&wide)).expect("mkdir with a 255-byte UTF-8 name");
    fs::rename(&p, env.p(&wide).join(&ok)).expect("rename to a 255-byte name");

    expect_errno(
        File::create(env.p(&too_long)),
        libc::ENAMETOOLONG,
        "create with a 256-byte name",
    );
    expect_errno(
        fs::create_dir(env.p(&too_long)),
        libc::ENAMETOOLONG,
        "mkdir with a 256-byte name",
    );
    expect_errno(
        fs::metadata(env.p(&too_long)),
        libc::ENAMETOOLONG,
        "stat of a 256-byte name",
    );
    expect_errno(
        std::os::unix::fs::symlink("t", env.p(&too_long)),
        libc::ENAMETOOLONG,
        "symlink with a 256-byte name",
    );
    expect_errno(
        fs::rename(env.p(&wide).join(&ok), env.p(&too_long)),
        libc::ENAMETOOLONG,
        "rename to a 256-byte name",
    );
    expect_errno(
        fs::hard_link(env.p(&wide).join(&ok), env.p(&too_long)),
        libc::ENAMETOOLONG,
        "link to a 256-byte name",
    );
}

#[test]
fn fsync_and_an_unlinked_open_file() {
    let env = Env::new();
    let p = env.p("f");
    let mut f = File::create(&p).expect("create");
    f.write_all(&pattern(5, 0, 3 * UNIT as usize))
        .expect("write");
    f.sync_all().expect("fsync");
    f.sync_data().expect("fdatasync");
    close_checked(f).expect("close");
    let d = File::open(&env.m.path).expect("open the root dir");
    d.sync_all().expect("fsync of a directory");

    // Unlinked while open: still readable and writable through the
    // descriptor until the last close; the name is gone at once.
    let data = pattern(6, 0, (2 * UNIT + 77) as usize);
    let q = env.p("doomed");
    fs::write(&q, &data).expect("create doomed");
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&q)
        .expect("open doomed");
    let other = File::open(&q).expect("a second descriptor");
    fs::remove_file(&q).expect("unlink while open");
    expect_errno(fs::metadata(&q), libc::ENOENT, "stat of the unlinked name");
    assert!(
        !fs::read_dir(&env.m.path)
            .expect("readdir")
            .any(|e| e.expect("entry").file_name() == "doomed"),
        "unlinked name still listed"
    );
    let mut got = vec![0u8; data.len()];
    f.read_exact_at(&mut got, 0)
        .expect("read the unlinked file");
    assert_same(&got, &data, "unlinked file through its descriptor");
    assert_eq!(
        f.metadata().expect("fstat").nlink(),
        0,
        "nlink of an unlinked file"
    );
    f.write_all_at(b"still here", UNIT)
        .expect("write to the unlinked file");
    close_checked(f).expect("close the first descriptor");
    // The other descriptor keeps it alive and sees the write.
    let mut got = [0u8; 10];
    other
        .read_exact_at(&mut got, UNIT)
        .expect("read through the other descriptor");
    assert_eq!(&got, b"still here");
    close_checked(other).expect("last close");
    // A new file under the old name is a different, empty file.
    fs::write(&q, b"new").expect("recreate the name");
    assert_contents(&q, b"new", "recreated name");
}

#[test]
fn a_200_mib_file_reads_back_identical() {
    let env = Env::new();
    let p = env.p("big");
    const CHUNK: usize = 1 << 20;
    const TOTAL: u64 = 200 << 20;
    let seed = 0xb16_f11e;
    let mut f = File::create(&p).expect("create");
    let mut wrote = DefaultHasher::new();
    let mut off = 0u64;
    while off < TOTAL {
        // Odd-sized writes so that they straddle stripe units.
        let len = (CHUNK as u64 - 4097).min(TOTAL - off) as usize;
        let data = pattern(seed, off, len);
        wrote.write(&data);
        f.write_all(&data)
            .unwrap_or_else(|e| panic!("write at {off}: {e}"));
        off += len as u64;
    }
    close_checked(f).expect("close after writing 200 MiB");
    assert_eq!(fs::metadata(&p).expect("stat").len(), TOTAL);

    let mut f = File::open(&p).expect("open");
    let mut read = DefaultHasher::new();
    let mut buf = vec![0u8; CHUNK];
    let mut off = 0u64;
    let mut first_bad = None;
    loop {
        let n = f
            .read(&mut buf)
            .unwrap_or_else(|e| panic!("read at {off}: {e}"));
        if n == 0 {
            break;
        }
        read.write(&buf[..n]);
        if first_bad.is_none() && buf[..n] != pattern(seed, off, n)[..] {
            first_bad = Some(off);
        }
        off += n as u64;
    }
    assert_eq!(off, TOTAL, "bytes read back");
    assert_eq!(
        first_bad, None,
        "the data read back differs in the read starting at this offset"
    );
    assert_eq!(
        read.finish(),
        wrote.finish(),
        "checksums of written and read data"
    );
}

#[test]
fn flushes_racing_writes_keep_every_byte() {
    // A descriptor closed elsewhere (a dup, or a forked child that inherited
    // it) sends FLUSH while this thread's writes are in flight; fsync does
    // too. After the last close, each file must hold every byte written.
    use std::sync::atomic::{AtomicBool, Ordering};
    let env = Env::new();
    const FILES: u64 = 150;
    const PIECE: usize = 10_000;
    const PIECES: u64 = 4;
    let mut flushes = 0u64;
    for n in 0..FILES {
        let mut f = File::create(env.p(&format!("raced-{n}"))).expect("create");
        let done = std::sync::Arc::new(AtomicBool::new(false));
        let flushers: Vec<_> = (0..2)
            .map(|t| {
                let f = f.try_clone().expect("dup");
                let done = done.clone();
                std::thread::spawn(move || {
                    let mut k = 0u64;
                    while !done.load(Ordering::SeqCst) {
                        // Closing a duplicate sends FLUSH; fsync flushes as well.
                        drop(f.try_clone().expect("dup"));
                        if t == 1 {
                            f.sync_data()
                                .expect("fdatasync while another thread writes");
                        }
                        k += 1;
                    }
                    k
                })
            })
            .collect();
        for i in 0..PIECES {
            let data = pattern(n, i * PIECE as u64, PIECE);
            f.write_all(&data)
                .unwrap_or_else(|e| panic!("file {n}: write {i}: {e}"));
        }
        done.store(true, Ordering::SeqCst);
        for h in flushers {
            flushes += h.join().expect("a flushing thread panicked");
        }
        close_checked(f).expect("close");
    }

    // Another client sees what the servers store.
    let total = PIECES * PIECE as u64;
    let other = Mount::start(env._c.addr(1), &[]);
    let short: Vec<(u64, u64)> = (0..FILES)
        .filter_map(|n| {
            let len = fs::metadata(other.path.join(format!("raced-{n}")))
                .expect("stat on a second mount")
                .len();
            (len != total).then_some((n, len))
        })
        .collect();
    assert!(
        short.is_empty(),
        "{} of {FILES} files, each written with {PIECES} writes of {PIECE} bytes while other \
         threads flushed it ({flushes} closes of duplicates and fdatasyncs), are stored with \
         the wrong size (want {total}); first (file, size): {:?}",
        short.len(),
        &short[..short.len().min(10)]
    );
    for n in 0..FILES {
        let got = fs::read(other.path.join(format!("raced-{n}"))).expect("read on a second mount");
        assert_same(&got, &pattern(n, 0, total as usize), &format!("raced-{n}"));
    }
}

#[test]
fn reads_move_the_access_time_as_relatime_does_and_noatime_mounts_never() {
    let c = Cluster::start(2, ClusterOpts::default());
    let m = c.mount();
    let p = m.path.join("f");
    fs::write(&p, b"data").expect("write");
    // Read before its last change: the next read moves it to now.
    utimens(&p, (1_000_000_000, 0), (1_500_000_000, 0)).expect("utimensat");
    let before = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs() as i64;
    let ctime = fs::metadata(&p).expect("stat").ctime_nsec();
    fs::read(&p).expect("read");
    let md = fs::metadata(&p).expect("stat");
    assert!(md.atime() >= before, "atime {} after a read", md.atime());
    assert_eq!(md.ctime_nsec(), ctime, "an access time update is no change");
    // Another mount sees it.
    let other = c.mount();
    common::wait_for(Duration::from_secs(10), "the other mount's atime", || {
        let a = fs::metadata(other.path.join("f"))
            .map_err(|e| e.to_string())?
            .atime();
        if a >= before {
            Ok(())
        } else {
            Err(format!("atime {a}"))
        }
    });
    // Later than the last change (and status change) and less than a day
    // old: left alone.
    let was = (md.atime(), md.atime_nsec());
    std::thread::sleep(Duration::from_millis(20));
    fs::read(&p).expect("read");
    let md = fs::metadata(&p).expect("stat");
    assert_eq!((md.atime(), md.atime_nsec()), was, "a second read");
    // A day old: moved.
    utimens(&p, (before - 2 * 86_400, 0), (1_500_000_000, 0)).expect("utimensat");
    fs::read(&p).expect("read");
    assert!(fs::metadata(&p).expect("stat").atime() >= before);
    // `--noatime`: never.
    let quiet = common::Mount::start(c.addr(0), &["--noatime"]);
    let q = quiet.path.join("f");
    utimens(&q, (1_000_000_000, 0), (1_500_000_000, 0)).expect("utimensat");
    fs::read(&q).expect("read");
    assert_eq!(fs::metadata(&q).expect("stat").atime(), 1_000_000_000);
}

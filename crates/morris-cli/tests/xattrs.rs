//! Extended attributes through real FUSE mounts: `setxattr(2)` semantics,
//! two mounts seeing each other's changes, attributes lasting across a
//! remount and a killed owner (mirrored metadata), hard links sharing them,
//! another user's access, and `cp --preserve=xattr`.

mod common;

use std::ffi::CString;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{both, is_root, wait_for, Cluster, ClusterOpts};

fn cpath(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).expect("path without NUL")
}

fn cname(n: &str) -> CString {
    CString::new(n).expect("name without NUL")
}

fn errno_of(ret: isize) -> std::io::Result<usize> {
    if ret < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(ret as usize)
    }
}

fn set(p: &Path, name: &str, value: &[u8], flags: i32) -> std::io::Result<()> {
    let r = unsafe {
        libc::setxattr(
            cpath(p).as_ptr(),
            cname(name).as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            flags,
        )
    };
    errno_of(r as isize).map(|_| ())
}

fn get(p: &Path, name: &str) -> std::io::Result<Vec<u8>> {
    let (path, name) = (cpath(p), cname(name));
    let n =
        errno_of(unsafe { libc::getxattr(path.as_ptr(), name.as_ptr(), std::ptr::null_mut(), 0) })?;
    let mut buf = vec![0u8; n];
    let got = errno_of(unsafe {
        libc::getxattr(
            path.as_ptr(),
            name.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    })?;
    buf.truncate(got);
    Ok(buf)
}

fn list(p: &Path) -> std::io::Result<Vec<String>> {
    let path = cpath(p);
    let n = errno_of(unsafe { libc::listxattr(path.as_ptr(), std::ptr::null_mut(), 0) })?;
    let mut buf = vec![0u8; n];
    let got = errno_of(unsafe { libc::listxattr(path.as_ptr(), buf.as_mut_ptr().cast(), n) })?;
    buf.truncate(got);
    Ok(buf
        .split(|b| *b == 0)
        .filter(|s| !s.is_empty())
        .map(|s| String::from_utf8_lossy(s).into_owned())
        .collect())
}

fn remove(p: &Path, name: &str) -> std::io::Result<()> {
    let r = unsafe { libc::removexattr(cpath(p).as_ptr(), cname(name).as_ptr()) };
    errno_of(r as isize).map(|_| ())
}

fn errno(r: std::io::Result<impl std::fmt::Debug>, want: i32, what: &str) {
    match r {
        Err(e) => assert_eq!(e.raw_os_error(), Some(want), "{what}: {e}"),
        Ok(v) => panic!("{what}: succeeded ({v:?}), expected errno {want}"),
    }
}

#[test]
fn setxattr_getxattr_listxattr_removexattr_behave_as_on_ext4() {
    let c = Cluster::start(3, ClusterOpts::default());
    let m = c.mount();
    let f = m.path.join("f");
    fs::write(&f, b"data").unwrap();
    assert!(list(&f).unwrap().is_empty());
    errno(get(&f, "user.none"), libc::ENODATA, "absent attribute");

    let ctime = |p: &Path| {
        let m = fs::metadata(p).unwrap();
        (m.ctime(), m.ctime_nsec())
    };
    let before = ctime(&f);
    std::thread::sleep(Duration::from_millis(20));
    set(&f, "user.mime", b"text/plain", 0).unwrap();
    assert_eq!(get(&f, "user.mime").unwrap(), b"text/plain");
    assert!(ctime(&f) > before, "ctime moves");
    set(&f, "user.empty", b"", 0).unwrap();
    assert_eq!(get(&f, "user.empty").unwrap(), b"");
    set(&f, "trusted.t", b"root's", 0).unwrap();
    set(&f, "security.s", b"sec", 0).unwrap();
    let mut names = list(&f).unwrap();
    names.sort();
    assert_eq!(
        names,
        ["security.s", "trusted.t", "user.empty", "user.mime"]
    );

    errno(
        set(&f, "user.mime", b"x", libc::XATTR_CREATE),
        libc::EEXIST,
        "XATTR_CREATE of an existing name",
    );
    errno(
        set(&f, "user.new", b"x", libc::XATTR_REPLACE),
        libc::ENODATA,
        "XATTR_REPLACE of an absent name",
    );
    set(&f, "user.mime", b"text/html", libc::XATTR_REPLACE).unwrap();
    assert_eq!(get(&f, "user.mime").unwrap(), b"text/html");
    remove(&f, "user.mime").unwrap();
    errno(get(&f, "user.mime"), libc::ENODATA, "removed attribute");
    errno(remove(&f, "user.mime"), libc::ENODATA, "removing it again");

    // A buffer too small for the value.
    set(&f, "user.long", &[7u8; 300], 0).unwrap();
    let mut small = [0u8; 10];
    let r = unsafe {
        libc::getxattr(
            cpath(&f).as_ptr(),
            cname("user.long").as_ptr(),
            small.as_mut_ptr().cast(),
            small.len(),
        )
    };
    errno(errno_of(r), libc::ERANGE, "getxattr into a small buffer");
    // The largest value Linux allows.
    let big: Vec<u8> = (0..65_536u32).map(|i| (i % 251) as u8).collect();
    set(&f, "user.big", &big, 0).unwrap();
    assert!(get(&f, "user.big").unwrap() == big);
    // Namespaces ext4 does not keep either; an ACL the file does not
    // have (tests/acls.rs has the rest).
    errno(
        set(&f, "os2.x", b"v", 0),
        libc::EOPNOTSUPP,
        "unknown namespace",
    );
    errno(get(&f, "system.posix_acl_access"), libc::ENODATA, "no ACL");

    // Directories have them too; symlinks may not have user. ones.
    let d = m.path.join("d");
    fs::create_dir(&d).unwrap();
    set(&d, "user.dir", b"yes", 0).unwrap();
    assert_eq!(get(&d, "user.dir").unwrap(), b"yes");
    let l = m.path.join("l");
    std::os::unix::fs::symlink("f", &l).unwrap();
    let r = unsafe {
        libc::lsetxattr(
            cpath(&l).as_ptr(),
            cname("user.x").as_ptr(),
            b"v".as_ptr().cast(),
            1,
            0,
        )
    };
    errno(
        errno_of(r as isize),
        libc::EPERM,
        "user. attribute on a symlink",
    );

    // A hard link is the same object.
    let h = m.path.join("hard");
    fs::hard_link(&f, &h).unwrap();
    assert_eq!(get(&h, "user.empty").unwrap(), b"");
    set(&h, "user.via-link", b"1", 0).unwrap();
    assert_eq!(get(&f, "user.via-link").unwrap(), b"1");

    // Writes go on as before (the kernel asks for security.capability
    // before each one; the mount answers from the list it keeps).
    let mut data = Vec::new();
    {
        use std::io::Write;
        let mut w = fs::OpenOptions::new().append(true).open(&f).unwrap();
        for i in 0..200u32 {
            let chunk = format!("line {i}\n");
            w.write_all(chunk.as_bytes()).unwrap();
            data.extend_from_slice(chunk.as_bytes());
        }
    }
    let mut want = b"data".to_vec();
    want.extend_from_slice(&data);
    assert!(fs::read(&f).unwrap() == want);
}

#[test]
fn two_mounts_see_each_others_changes_and_a_remount_keeps_them() {
    let c = Cluster::start(3, ClusterOpts::default());
    let a = c.mount();
    let b = c.mount();
    let fa = a.path.join("shared");
    let fb = b.path.join("shared");
    fs::write(&fa, b"x").unwrap();
    set(&fa, "user.k", b"one", 0).unwrap();
    assert_eq!(get(&fb, "user.k").unwrap(), b"one");
    // B keeps A's list with its lease; A's change recalls it.
    set(&fa, "user.k", b"two", 0).unwrap();
    assert_eq!(get(&fb, "user.k").unwrap(), b"two");
    set(&fb, "user.other", b"from b", 0).unwrap();
    remove(&fb, "user.k").unwrap();
    errno(
        get(&fa, "user.k"),
        libc::ENODATA,
        "removed on the other mount",
    );
    assert_eq!(list(&fa).unwrap(), ["user.other"]);
    drop(a);
    drop(b);
    let m = c.mount();
    assert_eq!(
        get(&m.path.join("shared"), "user.other").unwrap(),
        b"from b"
    );
    // `cp --preserve=xattr` carries them to a new file.
    let out = Command::new("cp")
        .arg("--preserve=xattr")
        .arg(m.path.join("shared"))
        .arg(m.path.join("copy"))
        .output()
        .unwrap();
    assert!(out.status.success(), "cp: {}", both(&out));
    assert_eq!(get(&m.path.join("copy"), "user.other").unwrap(), b"from b");
}

#[test]
fn another_user_is_held_to_the_mode_bits_and_does_not_see_trusted_names() {
    if !is_root() {
        panic!("this test needs root (it runs commands as uid 65534)");
    }
    let c = Cluster::start(2, ClusterOpts::default());
    let m = c.mount();
    m.open_to_all_users();
    let f = m.path.join("f");
    fs::write(&f, b"x").unwrap();
    fs::set_permissions(&f, fs::Permissions::from_mode(0o644)).unwrap();
    set(&f, "user.public", b"p", 0).unwrap();
    set(&f, "trusted.secret", b"s", 0).unwrap();
    let nobody = |script: &str| {
        Command::new("sh")
            .arg("-c")
            .arg(script)
            .arg("sh")
            .arg(&f)
            .uid(65534)
            .gid(65534)
            .env("LC_ALL", "C")
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    // Reading a user. attribute needs read permission: allowed.
    let o = nobody("getfattr --only-values -n user.public \"$1\"");
    assert!(o.status.success(), "{}", both(&o));
    assert_eq!(o.stdout, b"p");
    // Changing one needs write permission: refused.
    let o = nobody("setfattr -n user.public -v q \"$1\"");
    assert!(!o.status.success(), "setfattr as nobody: {}", both(&o));
    assert!(both(&o).contains("Permission denied"), "{}", both(&o));
    // trusted. names are root's: not listed to others.
    let o = nobody("getfattr -d -m - \"$1\"");
    assert!(o.status.success(), "{}", both(&o));
    let shown = String::from_utf8_lossy(&o.stdout);
    assert!(shown.contains("user.public"), "{shown}");
    assert!(!shown.contains("trusted.secret"), "{shown}");
    assert_eq!(get(&f, "user.public").unwrap(), b"p");
}

#[test]
fn attributes_outlive_their_owners_kill_on_a_mirrored_volume() {
    let mut c = Cluster::start_mirrored(3);
    let m = c.mount();
    let f = m.path.join("kept");
    fs::write(&f, b"x").unwrap();
    set(&f, "user.a", b"before the kill", 0).unwrap();
    let owner = (fs::metadata(&f).unwrap().ino() % 3) as usize;
    drop(m);
    c.kill9(owner);
    let other = common::Mount::start(c.addr((owner + 1) % 3), &[]);
    let g = other.path.join("kept");
    let v = wait_for(Duration::from_secs(40), "reading the attribute", || {
        get(&g, "user.a").map_err(|e| e.to_string())
    });
    assert_eq!(v, b"before the kill");
    // And a change made through the copy stays.
    set(&g, "user.b", b"after", 0).unwrap();
    assert_eq!(get(&g, "user.b").unwrap(), b"after");
}

#[test]
fn morris_layout_says_where_a_file_lives_and_is_read_only() {
    let c = Cluster::start(3, ClusterOpts::default());
    let m = c.mount();
    let f = m.path.join("f");
    fs::write(&f, b"data").unwrap();
    let v = String::from_utf8(get(&f, "morris.layout").unwrap()).unwrap();
    let field = |k: &str| {
        v.split(' ')
            .find_map(|kv| kv.strip_prefix(&format!("{k}=")))
            .unwrap_or_else(|| panic!("no {k} in {v:?}"))
            .to_string()
    };
    assert_eq!(field("servers"), "3", "{v}");
    let first: u32 = field("first_block_server").parse().unwrap();
    assert!(first < 3, "{v}");
    let order = field("stripe_order");
    assert_eq!(order.split(',').count(), 3, "{v}");
    assert!(order.starts_with(&first.to_string()), "{v}");
    // The metadata holder is one of the servers, with its address.
    let meta = field("metadata");
    assert!((0..3).any(|i| meta == format!("{i}@{}", c.addr(i))), "{v}");
    // Directories have one too (no block order); nobody may set it, and
    // it is not listed.
    let d = String::from_utf8(get(&m.path, "morris.layout").unwrap()).unwrap();
    assert!(
        d.starts_with("stripe_unit=") && !d.contains("stripe_order"),
        "{d}"
    );
    errno(
        set(&f, "morris.layout", b"x", 0),
        libc::EPERM,
        "setting the layout",
    );
    assert!(list(&f).unwrap().is_empty());
}

/// Whether the running kernel is at least `major.minor`.
fn kernel_at_least(major: u32, minor: u32) -> bool {
    let release = fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mut parts = release
        .trim()
        .split(|c: char| !c.is_ascii_digit())
        .map(|p| p.parse::<u32>().unwrap_or(0));
    (parts.next().unwrap_or(0), parts.next().unwrap_or(0)) >= (major, minor)
}

/// `(operation, inode)` of each line of an access log.
fn logged(text: &str) -> Vec<(String, u64)> {
    text.lines()
        .filter_map(|l| {
            let (_, rest) = l.split_once("] ")?;
            let (op, rest) = rest.split_once(" (")?;
            let (ino, _) = rest.split_once(')')?;
            Some((op.to_string(), ino.parse().ok()?))
        })
        .collect()
}

/// A directory another mount made, listed and stat'ed as `ls -l` does on
/// mounts that have seen none of it: with `READDIRPLUS` (the default) the
/// listing brings every entry's attributes, and its extended attributes
/// come with the leases, so that no name is looked up one at a time on
/// kernels that keep names, and the listing's leases are taken with one
/// request per server; `--no-readdirplus` lists names only, and each
/// is looked up. Both see the same sizes and attributes.
#[test]
fn a_listing_brings_attributes_unless_turned_off() {
    common::require_fuse();
    let c = Cluster::start(2, ClusterOpts::default());
    let a = c.mount();
    let d = a.path.join("d");
    fs::create_dir(&d).unwrap();
    for i in 0..50u64 {
        fs::write(d.join(format!("f{i}")), vec![7u8; i as usize]).unwrap();
    }
    set(&d.join("f7"), "user.tag", b"seven", 0).unwrap();
    let dir_ino = fs::metadata(&d).unwrap().ino();
    let logs = tempfile::tempdir().unwrap();
    for plus in [true, false] {
        let log = logs.path().join(format!("access-{plus}.log"));
        let mut args = vec!["--access-log".to_string(), log.display().to_string()];
        if !plus {
            args.push("--no-readdirplus".into());
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let m = common::Mount::start(c.addr(1), &args);
        let seen = m.path.join("d");
        let mut sizes = Vec::new();
        let leases = common::served_during(&c, &["AcquireRead", "AcquireReadMany"], || {
            for e in fs::read_dir(&seen).unwrap() {
                let e = e.unwrap();
                let md = fs::symlink_metadata(e.path()).unwrap();
                sizes.push((e.file_name().into_string().unwrap(), md.len()));
                let _ = get(&e.path(), "security.selinux");
            }
        });
        sizes.sort();
        let mut want: Vec<(String, u64)> = (0..50u64).map(|i| (format!("f{i}"), i)).collect();
        want.sort();
        assert_eq!(sizes, want, "readdirplus {plus}");
        assert_eq!(get(&seen.join("f7"), "user.tag").unwrap(), b"seven");
        let text = wait_for(Duration::from_secs(10), "the access log", || {
            let t = fs::read_to_string(&log).unwrap_or_default();
            if t.contains("releasedir (") {
                Ok(t)
            } else {
                Err(t)
            }
        });
        let ops = logged(&text);
        let count = |op: &str, ino: u64| ops.iter().filter(|(o, i)| o == op && *i == ino).count();
        let lookups = count("lookup", dir_ino);
        if plus {
            assert!(count("readdirplus", dir_ino) >= 1, "{text}");
            // The listing's leases: a request per server for the batch, not
            // one per file (the directory's own lease, taken again under
            // load, may add one or two).
            assert!(leases["AcquireRead"] < 10, "{leases:?}");
            assert!(leases["AcquireReadMany"] <= 8, "{leases:?}");
            if kernel_at_least(6, 16) {
                assert!(
                    lookups < 5,
                    "{lookups} lookups in a listed directory:\n{text}"
                );
            }
        } else {
            assert_eq!(count("readdirplus", dir_ino), 0, "{text}");
            assert!(count("readdir", dir_ino) >= 1, "{text}");
            assert!(lookups >= 50, "{lookups} lookups:\n{text}");
        }
    }
}

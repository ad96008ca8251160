//! Permission checks through a FUSE mount for a user other than the one who
//! mounted it: the test (root) prepares files, then runs shell commands as
//! uid/gid 65534 (nobody) in child processes and checks what they may do.

mod common;

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use common::{both, is_root, Cluster, ClusterOpts};

const NOBODY: u32 = 65534;

/// Runs `sh -c script sh args...` as uid/gid 65534 with no supplementary groups.
fn as_nobody(script: &str, args: &[&Path]) -> Output {
    Command::new("sh")
        .arg("-c")
        .arg(script)
        .arg("sh")
        .args(args)
        .uid(NOBODY)
        .gid(NOBODY)
        .env("LC_ALL", "C")
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run sh as uid {NOBODY}: {e}"))
}

/// Asserts the command succeeded.
fn allowed(o: &Output, what: &str) {
    assert!(o.status.success(), "{what} should be allowed: {}", both(o));
}

/// Asserts the command failed with `message` (the strerror text) on stderr.
fn refused(o: &Output, message: &str, what: &str) {
    assert!(
        !o.status.success(),
        "{what} should be refused with \"{message}\", but it succeeded: {}",
        both(o)
    );
    assert!(
        String::from_utf8_lossy(&o.stderr).contains(message),
        "{what} should be refused with \"{message}\": {}",
        both(o)
    );
}

fn chmod(p: &Path, mode: u32) {
    fs::set_permissions(p, fs::Permissions::from_mode(mode))
        .unwrap_or_else(|e| panic!("chmod {:o} {}: {e}", mode, p.display()));
}

const EACCES: &str = "Permission denied";
const EPERM: &str = "Operation not permitted";

#[test]
fn permissions_are_enforced_for_another_user() {
    assert!(
        is_root(),
        "this test creates files as root and checks access as uid {NOBODY}: run it as root"
    );
    let c = Cluster::start(4, ClusterOpts::default());
    let m = c.mount();
    m.open_to_all_users();
    let root = &m.path;
    let mode = fs::metadata(root).expect("stat the mount root").mode();
    assert_eq!(mode & 0o777, 0o755, "the volume root's mode");

    // As root: a 0644 file, a 0755 dir, a 0777 dir, a sticky 0o1777 dir, a
    // 0700 dir and a 0600 file.
    let file = root.join("file");
    fs::write(&file, b"readable by all\n").expect("create file");
    chmod(&file, 0o644);
    let rootdir = root.join("rootdir");
    fs::create_dir(&rootdir).expect("mkdir rootdir");
    chmod(&rootdir, 0o755);
    fs::write(rootdir.join("inside"), b"x").expect("create in rootdir");
    let open = root.join("open");
    fs::create_dir(&open).expect("mkdir open");
    chmod(&open, 0o777);
    fs::write(open.join("roots"), b"root's").expect("create root's file in open");
    let sticky = root.join("sticky");
    fs::create_dir(&sticky).expect("mkdir sticky");
    chmod(&sticky, 0o1777);
    assert_eq!(
        fs::metadata(&sticky).expect("stat").mode() & 0o7777,
        0o1777,
        "sticky bit kept"
    );
    let roots_in_sticky = sticky.join("roots");
    fs::write(&roots_in_sticky, b"root's, writable by all").expect("create in sticky");
    chmod(&roots_in_sticky, 0o666);
    let private = root.join("private");
    fs::create_dir(&private).expect("mkdir private");
    chmod(&private, 0o700);
    fs::write(private.join("secret"), b"s").expect("create in private");
    let secret = root.join("secret");
    fs::write(&secret, b"secret").expect("create secret");
    chmod(&secret, 0o600);

    // The other user can read what is readable...
    let o = as_nobody("cat \"$1\"", &[&file]);
    allowed(&o, "reading a 0644 file");
    assert_eq!(o.stdout, b"readable by all\n", "what uid {NOBODY} read");
    allowed(&as_nobody("ls \"$1\"", &[&rootdir]), "listing a 0755 dir");
    // ... but not what is not.
    refused(
        &as_nobody("cat \"$1\"", &[&secret]),
        EACCES,
        "reading a 0600 file",
    );
    refused(
        &as_nobody("ls \"$1\"", &[&private]),
        EACCES,
        "listing a 0700 dir",
    );
    refused(
        &as_nobody("cat \"$1\"/secret", &[&private]),
        EACCES,
        "reading through a 0700 dir",
    );

    // Writing a 0644 file owned by root fails, in every way.
    refused(
        &as_nobody("printf more >> \"$1\"", &[&file]),
        EACCES,
        "appending to a 0644 root file",
    );
    refused(
        &as_nobody(": > \"$1\"", &[&file]),
        EACCES,
        "truncating a 0644 root file at open",
    );
    refused(
        &as_nobody("truncate -s 0 \"$1\"", &[&file]),
        EACCES,
        "truncate(2) of a 0644 root file",
    );
    assert_eq!(
        fs::read(&file).expect("read"),
        b"readable by all\n",
        "the file was changed by refused writes"
    );

    // Creating or removing in a 0755 root dir fails.
    refused(
        &as_nobody("touch \"$1\"/new", &[&rootdir]),
        EACCES,
        "creating a file in a 0755 root dir",
    );
    refused(
        &as_nobody("mkdir \"$1\"/sub", &[&rootdir]),
        EACCES,
        "mkdir in a 0755 root dir",
    );
    refused(
        &as_nobody("rm -f \"$1\"/inside", &[&rootdir]),
        EACCES,
        "unlink in a 0755 root dir",
    );
    refused(
        &as_nobody("mv \"$1\"/inside \"$2\"/", &[&rootdir, &open]),
        EACCES,
        "renaming out of a 0755 root dir",
    );
    assert!(rootdir.join("inside").exists(), "refused unlink removed it");
    assert!(!rootdir.join("new").exists(), "refused create created it");

    // Changing another user's file's attributes fails with EPERM.
    refused(
        &as_nobody("chmod 777 \"$1\"", &[&file]),
        EPERM,
        "chmod of root's file",
    );
    refused(
        &as_nobody("chown 65534 \"$1\"", &[&file]),
        EPERM,
        "chown of root's file",
    );
    refused(
        &as_nobody("touch -c -d 2001-01-01 \"$1\"", &[&file]),
        EPERM,
        "setting explicit times of root's file",
    );
    refused(
        &as_nobody("touch -c \"$1\"", &[&file]),
        EACCES,
        "setting the times of root's 0644 file to now",
    );
    let md = fs::metadata(&file).expect("stat");
    assert_eq!(
        (md.mode() & 0o7777, md.uid()),
        (0o644, 0),
        "refused chmod/chown changed the file"
    );

    // A 0777 dir allows creating; the new file belongs to the creator.
    let o = as_nobody(
        "printf mine > \"$1\"/mine && mkdir \"$1\"/mydir && chmod 600 \"$1\"/mine \
         && touch -c -d '2001-01-01 00:00:00 UTC' \"$1\"/mine",
        &[&open],
    );
    allowed(&o, "creating in a 0777 dir and chmod of one's own file");
    let md = fs::metadata(open.join("mine")).expect("stat the new file");
    assert_eq!(
        (md.uid(), md.gid()),
        (NOBODY, NOBODY),
        "owner of a file created by uid {NOBODY}"
    );
    assert_eq!(md.mode() & 0o7777, 0o600, "mode set by its owner");
    assert_eq!(md.mtime(), 978_307_200, "mtime set by its owner");
    let md = fs::metadata(open.join("mydir")).expect("stat the new dir");
    assert_eq!((md.uid(), md.gid()), (NOBODY, NOBODY), "owner of a new dir");
    assert_eq!(fs::read(open.join("mine")).expect("read"), b"mine");
    // Without the sticky bit, anyone with write access to the dir may remove
    // another user's file.
    allowed(
        &as_nobody("rm -f \"$1\"/roots", &[&open]),
        "removing root's file from a 0777 dir",
    );
    assert!(
        !open.join("roots").exists(),
        "root's file still in the 0777 dir"
    );

    // The sticky bit: another user's file may be written but not removed or
    // renamed; one's own file may be removed.
    allowed(
        &as_nobody("printf ' and mine' >> \"$1\"", &[&roots_in_sticky]),
        "writing a 0666 file in a sticky dir",
    );
    refused(
        &as_nobody("rm -f \"$1\"", &[&roots_in_sticky]),
        EPERM,
        "removing another user's file from a sticky dir",
    );
    refused(
        &as_nobody("mv \"$1\" \"$2\"/taken", &[&roots_in_sticky, &sticky]),
        EPERM,
        "renaming another user's file in a sticky dir",
    );
    assert_eq!(
        fs::read(&roots_in_sticky).expect("root's file survives"),
        b"root's, writable by all and mine"
    );
    allowed(
        &as_nobody(
            "printf x > \"$1\"/own && mv \"$1\"/own \"$1\"/own2 && rm \"$1\"/own2",
            &[&sticky],
        ),
        "creating, renaming and removing one's own file in a sticky dir",
    );
    assert!(!sticky.join("own2").exists());
    // Root may remove anything.
    fs::remove_file(&roots_in_sticky).expect("root removes from the sticky dir");
}

/// The mount clears set-ID bits itself (FUSE's `HANDLE_KILLPRIV_V2`): on a
/// write or truncate by a user without CAP_FSETID, and on chown.
#[test]
fn set_id_bits_are_cleared_on_write_truncate_and_chown() {
    assert!(
        is_root(),
        "this test runs commands as uid {NOBODY}: run it as root"
    );
    let c = Cluster::start(2, ClusterOpts::default());
    let m = c.mount();
    m.open_to_all_users();
    let mode = |p: &Path| fs::metadata(p).expect("stat").mode() & 0o7777;
    // Group-executable: both bits go. Without g+x, set-group-ID stays (it
    // means mandatory locking then, not privilege).
    for (start, after) in [(0o6777, 0o777), (0o6766, 0o2766)] {
        let f = m.path.join(format!("w{start:o}"));
        fs::write(&f, b"x").expect("create");
        chmod(&f, start);
        // Root writes keep them (CAP_FSETID).
        fs::write(&f, b"root was here").expect("root write");
        assert_eq!(mode(&f), start, "after a write by root");
        let o = as_nobody("echo more >> \"$1\"", &[&f]);
        allowed(&o, "appending as nobody");
        assert_eq!(mode(&f), after, "after a write by uid {NOBODY}");

        let t = m.path.join(format!("t{start:o}"));
        fs::write(&t, b"some bytes").expect("create");
        chmod(&t, start);
        let o = as_nobody("truncate -s 2 \"$1\"", &[&t]);
        allowed(&o, "truncating as nobody");
        assert_eq!(mode(&t), after, "after a truncate by uid {NOBODY}");
        assert_eq!(fs::metadata(&t).expect("stat").len(), 2);
    }
    // chown, even by root, clears set-user-ID (and set-group-ID with g+x).
    let f = m.path.join("owned");
    fs::write(&f, b"x").expect("create");
    chmod(&f, 0o6755);
    std::os::unix::fs::chown(&f, Some(NOBODY), None).expect("chown");
    assert_eq!(mode(&f), 0o755, "after chown");
    assert_eq!(fs::metadata(&f).expect("stat").uid(), NOBODY);
    // A directory keeps its set-group-ID bit (inheritance of the group).
    let d = m.path.join("dir");
    fs::create_dir(&d).expect("mkdir");
    chmod(&d, 0o2775);
    std::os::unix::fs::chown(&d, Some(NOBODY), None).expect("chown dir");
    assert_eq!(mode(&d), 0o2775, "a directory after chown");
}

//! POSIX ACLs through real mounts: `setfacl`/`getfacl` round trips, the
//! kernel enforcing them for another user (uid 65534) on this mount and on
//! a second one, the mode and the ACL following each other, default ACLs
//! inherited by new files and directories (and the umask applied when
//! there is none), and `cp -a` and `rsync -aHAXS` keeping ACLs, user
//! attributes, owners, modes, hard links, holes and times both ways.

mod common;

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use common::{both, is_root, Cluster, ClusterOpts};

const NOBODY: u32 = 65534;

fn need_root() {
    assert!(
        is_root(),
        "this test runs commands as uid {NOBODY}: run it as root"
    );
}

/// Runs `sh -c script sh args...` as `uid` (gid the same, no other groups).
fn sh_as(uid: u32, script: &str, args: &[&Path]) -> Output {
    let mut c = Command::new("sh");
    c.arg("-c")
        .arg(script)
        .arg("sh")
        .args(args)
        .env("LC_ALL", "C")
        .stdin(Stdio::null());
    if uid != 0 {
        c.uid(uid).gid(uid);
    }
    c.output()
        .unwrap_or_else(|e| panic!("cannot run sh as uid {uid}: {e}"))
}

fn ok(o: Output, what: &str) -> String {
    assert!(o.status.success(), "{what} failed: {}", both(&o));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn run(script: &str, args: &[&Path]) -> String {
    ok(sh_as(0, script, args), script)
}

/// `getfacl -n` of `p` (`-d`: its default ACL) without its comment
/// lines, white space collapsed.
fn getfacl(p: &Path, default: bool) -> Vec<String> {
    let flag = if default { "-nd" } else { "-n" };
    run(&format!("getfacl {flag} \"$1\""), &[p])
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect()
}

fn mode(p: &Path) -> u32 {
    fs::metadata(p)
        .unwrap_or_else(|e| panic!("stat {}: {e}", p.display()))
        .mode()
        & 0o7777
}

fn can_read(p: &Path) -> bool {
    sh_as(NOBODY, "cat \"$1\" >/dev/null", &[p])
        .status
        .success()
}

#[test]
fn acls_round_trip_and_are_enforced_for_another_user_on_every_mount() {
    need_root();
    let c = Cluster::start(3, ClusterOpts::default());
    let a = c.mount();
    let b = c.mount();
    a.open_to_all_users();
    b.open_to_all_users();
    let f = a.path.join("f");
    let fb = b.path.join("f");
    fs::write(&f, b"secret\n").unwrap();
    run("chmod 600 \"$1\"", &[&f]);
    assert!(!can_read(&f), "0600 and no ACL");
    assert!(!can_read(&fb));

    run("setfacl -m u:65534:r \"$1\"", &[&f]);
    assert_eq!(
        getfacl(&f, false),
        [
            "user::rw-",
            "user:65534:r--",
            "group::---",
            "mask::r--",
            "other::---"
        ]
    );
    // The mode's group bits are the mask.
    assert_eq!(mode(&f), 0o640);
    assert!(can_read(&f), "the ACL grants read on this mount");
    common::wait_for(
        Duration::from_secs(10),
        "the other mount to see the ACL",
        || {
            if can_read(&fb) {
                Ok(())
            } else {
                Err("denied".to_string())
            }
        },
    );
    assert_eq!(getfacl(&fb, false), getfacl(&f, false));
    let o = sh_as(NOBODY, "echo x >> \"$1\"", &[&f]);
    assert!(
        !o.status.success(),
        "read-only ACL entry let a write through"
    );

    // chmod takes the mask away: the named entry is masked to nothing.
    run("chmod 600 \"$1\"", &[&f]);
    assert!(getfacl(&f, false).contains(&"mask::---".to_string()));
    assert!(!can_read(&f), "masked by chmod");
    run("chmod 640 \"$1\"", &[&f]);
    assert!(can_read(&f));

    // Removed: the mode alone again, on both mounts.
    run("setfacl -b \"$1\"", &[&f]);
    assert_eq!(
        getfacl(&f, false),
        ["user::rw-", "group::---", "other::---"]
    );
    assert_eq!(mode(&f), 0o600);
    assert!(!can_read(&f));
    common::wait_for(
        Duration::from_secs(10),
        "the other mount to drop the ACL",
        || {
            if can_read(&fb) {
                Err("still readable".to_string())
            } else {
                Ok(())
            }
        },
    );

    // Only the owner (or root) may set an ACL; default ACLs are for
    // directories; anyone may read one.
    let o = sh_as(NOBODY, "setfacl -m u:65534:rw \"$1\"", &[&f]);
    assert!(!o.status.success(), "nobody set root's ACL: {}", both(&o));
    let o = sh_as(0, "setfacl -d -m u:65534:r \"$1\"", &[&f]);
    assert!(!o.status.success(), "a default ACL on a file: {}", both(&o));
}

/// A `chmod` of a file being written is kept in the client a moment
/// (write-behind); an ACL set right after must not be undone when it is
/// stored (xfstests generic/099 found the mode-only case).
#[test]
fn an_acl_set_right_after_a_chmod_keeps_its_mode() {
    need_root();
    let c = Cluster::start(3, ClusterOpts::default());
    let a = c.mount();
    let b = c.mount();
    let (f, g) = (a.path.join("f"), a.path.join("g"));
    // Mode-only: the ACL is the mode.
    run(
        "touch \"$1\" && chmod 764 \"$1\" && setfacl --set u::r--,g::rwx,o::rw- \"$1\"",
        &[&f],
    );
    // A named entry: the mode's group bits become the mask.
    run(
        "touch \"$1\" && chmod 600 \"$1\" && setfacl -m u:65534:rwx \"$1\"",
        &[&g],
    );
    let want_g = [
        "user::rw-",
        "user:65534:rwx",
        "group::---",
        "mask::rwx",
        "other::---",
    ];
    // Past the time a kept change is stored by itself.
    std::thread::sleep(Duration::from_secs(3));
    for (root, who) in [(&a.path, "this mount"), (&b.path, "another mount")] {
        let (f, g) = (root.join("f"), root.join("g"));
        assert_eq!(mode(&f), 0o476, "mode of f on {who}");
        assert_eq!(
            getfacl(&f, false),
            ["user::r--", "group::rwx", "other::rw-"],
            "f on {who}"
        );
        assert_eq!(mode(&g), 0o670, "mode of g on {who}");
        assert_eq!(getfacl(&g, false), want_g, "g on {who}");
    }
}

#[test]
fn default_acls_are_inherited_and_the_umask_applies_without_one() {
    need_root();
    let c = Cluster::start(3, ClusterOpts::default());
    let m = c.mount();
    m.open_to_all_users();
    let d = m.path.join("shared");
    fs::create_dir(&d).unwrap();
    run("chmod 755 \"$1\"", &[&d]);
    run(
        "setfacl -m u:65534:rwx \"$1\" && setfacl -d -m u:65534:rwx \"$1\"",
        &[&d],
    );
    // Made by root with umask 022: the default ACL, not the umask, decides.
    run(
        "cd \"$1\" && umask 022 && touch f && mkdir sub && touch sub/g",
        &[&d],
    );
    let f = d.join("f");
    assert_eq!(mode(&f), 0o664, "0666 masked by the default ACL, no umask");
    assert_eq!(
        getfacl(&f, false),
        [
            "user::rw-",
            "user:65534:rwx #effective:rw-",
            "group::r-x #effective:r--",
            "mask::rw-",
            "other::r--"
        ]
    );
    // A directory inherits the default as its own default too, and passes
    // it on.
    let sub = d.join("sub");
    assert_eq!(getfacl(&sub, true), getfacl(&d, true));
    assert!(
        getfacl(&sub.join("g"), false)
            .iter()
            .any(|l| l.starts_with("user:65534:rwx")),
        "{:?}",
        getfacl(&sub.join("g"), false)
    );
    // The named user may write what root made here.
    let o = sh_as(NOBODY, "echo hi >> \"$1\"", &[&f]);
    assert!(o.status.success(), "{}", both(&o));

    // No default ACL: the umask applies (the kernel leaves it to us).
    run(
        "cd \"$1\" && umask 027 && touch plain && mkdir plaind",
        &[&m.path],
    );
    assert_eq!(mode(&m.path.join("plain")), 0o640);
    assert_eq!(mode(&m.path.join("plaind")), 0o750);
    assert_eq!(
        getfacl(&m.path.join("plain"), false),
        ["user::rw-", "group::r--", "other::---"]
    );
}

#[test]
fn cp_a_keeps_acls_and_user_attributes_both_ways() {
    need_root();
    let c = Cluster::start(2, ClusterOpts::default());
    let m = c.mount();
    let local = tempfile::Builder::new()
        .prefix("morris-acl-local-")
        .tempdir_in("/var/tmp")
        .unwrap();
    let src = local.path().join("src");
    fs::create_dir(&src).unwrap();
    fs::write(src.join("f"), b"data").unwrap();
    run(
        "cd \"$1\" && setfacl -m u:65534:rw,g:123:r f && setfattr -n user.color -v blue f \
         && setfacl -d -m u:65534:rx . && mkdir d",
        &[&src],
    );
    let want_f = getfacl(&src.join("f"), false);
    let want_d = getfacl(&src.join("d"), true);
    run("cp -a \"$1\" \"$2\"", &[&src, &m.path.join("copy")]);
    let there = m.path.join("copy");
    assert_eq!(getfacl(&there.join("f"), false), want_f);
    assert_eq!(getfacl(&there.join("d"), true), want_d);
    assert_eq!(
        run(
            "getfattr --only-values -n user.color \"$1\"",
            &[&there.join("f")]
        ),
        "blue"
    );
    // And back out.
    let back = local.path().join("back");
    run("cp -a \"$1\" \"$2\"", &[&there, &back]);
    assert_eq!(getfacl(&back.join("f"), false), want_f);
    assert_eq!(getfacl(&back.join("d"), true), want_d);
    assert_eq!(
        run(
            "getfattr --only-values -n user.color \"$1\"",
            &[&back.join("f")]
        ),
        "blue"
    );
}

#[test]
fn rsync_keeps_everything_both_ways() {
    need_root();
    assert!(
        Command::new("rsync").arg("--version").output().is_ok(),
        "this test needs rsync (package rsync)"
    );
    let c = Cluster::start(2, ClusterOpts::default());
    let m = c.mount();
    let local = tempfile::Builder::new()
        .prefix("morris-rsync-")
        .tempdir_in("/var/tmp")
        .unwrap();
    let src = local.path().join("src");
    fs::create_dir(&src).unwrap();
    // Owners, modes with set-group-ID, ACLs (access and default), user
    // attributes, hard links, a symlink, a fifo, a sparse file, old times.
    run(
        "cd \"$1\" && printf data > f && setfacl -m u:65534:rw,g:123:r f \
         && setfattr -n user.color -v blue f && ln f hard && ln -s f link && mkfifo -m 640 fifo \
         && mkdir -m 2750 d && chown 65534:123 d && setfacl -d -m u:65534:rx d \
         && printf inner > d/g && chown 65534:65534 d/g \
         && truncate -s 10M sparse && printf x | dd of=sparse bs=1 seek=5000000 conv=notrunc 2>/dev/null \
         && touch -h -d '2021-03-04 05:06:07' f link d/g",
        &[&src],
    );
    let copy = m.path.join("copy");
    let back = local.path().join("back");
    let flags = "-aHAXS --numeric-ids";
    run(&format!("rsync {flags} \"$1\"/ \"$2\"/"), &[&src, &copy]);
    run(&format!("rsync {flags} \"$1\"/ \"$2\"/"), &[&copy, &back]);
    // rsync itself compares, by content (-c) too: nothing to change.
    for (a, b) in [(&src, &copy), (&src, &back)] {
        let diff = run(&format!("rsync {flags} -c -n -i \"$1\"/ \"$2\"/"), &[a, b]);
        assert_eq!(
            diff.trim(),
            "",
            "{} and {} differ",
            a.display(),
            b.display()
        );
    }
    assert_eq!(
        fs::metadata(copy.join("f")).unwrap().ino(),
        fs::metadata(copy.join("hard")).unwrap().ino(),
        "hard link"
    );
    assert_eq!(
        getfacl(&copy.join("d"), true),
        getfacl(&src.join("d"), true)
    );
    assert_eq!(mode(&copy.join("d")) & 0o7777, 0o2750);
}

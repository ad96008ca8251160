//! `morris nfs`: the NFSv3 gateway, driven by a real NFS client (libnfs: its
//! command-line tools `nfs-cp`, `nfs-ls`, `nfs-cat`, and `nfsop.c`, a small
//! program compiled here against libnfs for the procedures the tools do not
//! cover). The tests fail, never skip, when libnfs or a C compiler is missing.

mod common;
mod nfs_harness;

use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{pattern, read_log, Cluster, ClusterOpts};
use nfs_harness::{nfsop_bin, tool, write_local, Gateway, Raw};

#[test]
fn files_copy_in_and_out_with_libnfs_tools() {
    let c = Cluster::start(3, ClusterOpts::default());
    let gw = Gateway::start(c.addr(0), &[]);
    let tmp = tempfile::tempdir().expect("tempdir");
    let src = tmp.path().join("in.bin");
    // 4 MiB + a tail: several stripe units on every server, a short last READ.
    let data = pattern(7, 0, (4 << 20) + 12_345);
    write_local(&src, &data);
    let src_s = src.display().to_string();
    tool(&gw, "nfs-cp", &[&src_s, &gw.file_url("big.bin")]);

    let ls = tool(&gw, "nfs-ls", &[&gw.url()]);
    let listing = String::from_utf8_lossy(&ls.stdout).into_owned();
    let line = listing
        .lines()
        .find(|l| l.ends_with(" big.bin"))
        .unwrap_or_else(|| panic!("big.bin not listed:\n{listing}"));
    assert!(
        line.contains(&data.len().to_string()),
        "wrong size listed: {line}"
    );

    let dst = tmp.path().join("out.bin");
    let dst_s = dst.display().to_string();
    tool(&gw, "nfs-cp", &[&gw.file_url("big.bin"), &dst_s]);
    assert!(
        std::fs::read(&dst).expect("read copy") == data,
        "copy out differs"
    );
    let cat = tool(&gw, "nfs-cat", &[&gw.file_url("big.bin")]);
    assert!(cat.stdout == data, "nfs-cat output differs");

    // Overwrite with a shorter file (open with O_TRUNC; nfs-cp itself
    // refuses existing targets): the file is truncated, not merged.
    let short = pattern(8, 0, 100_000);
    write_local(&src, &short);
    gw.ok(&["copyin", &src_s, "/big.bin"]);
    let cat = tool(&gw, "nfs-cat", &[&gw.file_url("big.bin")]);
    assert!(cat.stdout == short, "overwritten file differs");
    assert!(
        common::fsck(c.addr(0)).0,
        "fsck after nfs copies: {}",
        common::fsck(c.addr(0)).2
    );
}

#[test]
fn namespace_procedures_through_libnfs() {
    let c = Cluster::start(2, ClusterOpts::default());
    let gw = Gateway::start(c.addr(0), &[]);
    gw.ok(&["mkdir", "/d"]);
    gw.err_as(0, 0, &["mkdir", "/d"], libc::EEXIST);
    gw.ok(&["put", "/d/x", "644", "hello nfs"]);
    assert_eq!(gw.ok(&["get", "/d/x"]), "hello nfs\n");
    assert!(gw
        .ok(&["stat", "/d/x"])
        .starts_with("mode=100644 size=9 nlink=1 "));

    // LINK, RENAME
    gw.ok(&["link", "/d/x", "/d/y"]);
    assert!(gw.ok(&["stat", "/d/y"]).contains(" nlink=2 "));
    gw.ok(&["rename", "/d/y", "/d/z"]);
    gw.err_as(0, 0, &["stat", "/d/y"], libc::ENOENT);
    assert_eq!(gw.ok(&["get", "/d/z"]), "hello nfs\n");

    // SYMLINK, READLINK
    gw.ok(&["symlink", "x", "/d/s"]);
    assert_eq!(gw.ok(&["readlink", "/d/s"]), "x\n");

    // SETATTR: size and mode
    gw.ok(&["truncate", "/d/x", "5"]);
    assert_eq!(gw.ok(&["get", "/d/x"]), "hello\n");
    gw.ok(&["chmod", "/d/x", "600"]);
    assert!(gw.ok(&["stat", "/d/x"]).starts_with("mode=100600 size=5 "));
    gw.ok(&["chown", "/d/x", "1234", "5678"]);
    assert!(gw.ok(&["stat", "/d/x"]).contains(" uid=1234 gid=5678 "));
    // `used`: what is on disk, not the size (a file grown by SETATTR has none).
    gw.ok(&["put", "/d/sparse", "644", ""]);
    gw.ok(&["truncate", "/d/sparse", "1073741824"]);
    let st = gw.ok(&["stat", "/d/sparse"]);
    assert!(
        st.contains(" size=1073741824 ") && st.ends_with(" blocks=0\n"),
        "{st}"
    );
    gw.ok(&["unlink", "/d/sparse"]);

    // MKNOD: a fifo
    gw.ok(&["mknod", "/d/p", "010640", "0"]);
    assert!(gw.ok(&["stat", "/d/p"]).starts_with("mode=10640 "));

    // READDIR(PLUS) over more entries than one batch.
    gw.ok(&["mkdir", "/many"]);
    for i in 0..300 {
        gw.ok(&["put", &format!("/many/f{i:03}"), "644", "x"]);
    }
    let names = gw.ok(&["ls", "/many"]);
    let mut names: Vec<&str> = names.lines().filter(|n| n.starts_with('f')).collect();
    names.sort_unstable();
    let want: Vec<String> = (0..300).map(|i| format!("f{i:03}")).collect();
    assert_eq!(names, want);

    // FSSTAT reports the servers' real capacity.
    let st = gw.ok(&["statvfs", "/"]);
    let field = |k: &str| -> u64 {
        st.split_whitespace()
            .find_map(|w| w.strip_prefix(&format!("{k}=")))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {k} in {st}"))
    };
    assert!(
        field("blocks") > 0 && field("bfree") <= field("blocks"),
        "{st}"
    );

    // MKDIR keeps the mode asked for.
    gw.ok(&["mkdirm", "/m", "700"]);
    assert!(
        gw.ok(&["stat", "/m"]).starts_with("mode=40700 "),
        "{}",
        gw.ok(&["stat", "/m"])
    );
    gw.ok(&["rmdir", "/m"]);

    // REMOVE / RMDIR and their errors.
    gw.err_as(0, 0, &["rmdir", "/d"], libc::ENOTEMPTY);
    gw.err_as(0, 0, &["unlink", "/d/nothing"], libc::ENOENT);
    for f in ["/d/x", "/d/z", "/d/s", "/d/p"] {
        gw.ok(&["unlink", f]);
    }
    gw.ok(&["rmdir", "/d"]);
    let root = gw.ok(&["ls", "/"]);
    assert!(!root.lines().any(|l| l == "d"), "rmdir left /d: {root}");
    assert!(common::fsck(c.addr(0)).0, "{}", common::fsck(c.addr(0)).2);
}

#[test]
fn permissions_follow_the_callers_credentials() {
    let c = Cluster::start(1, ClusterOpts::default());
    let gw = Gateway::start(c.addr(0), &[]);
    gw.ok(&["mkdir", "/d"]);
    gw.ok(&["chmod", "/d", "755"]);
    gw.ok(&["put", "/d/secret", "600", "root only"]);
    gw.ok(&["put", "/d/public", "644", "everyone"]);

    // uid 1000 may read the public file, not the secret one, and may not
    // write in a directory it does not own. ACCESS answers the same.
    assert_eq!(gw.ok_as(1000, 1000, &["get", "/d/public"]), "everyone\n");
    gw.ok_as(1000, 1000, &["access", "/d/public", "4"]);
    gw.err_as(1000, 1000, &["access", "/d/public", "2"], libc::EACCES);
    gw.err_as(1000, 1000, &["access", "/d/secret", "4"], libc::EACCES);
    gw.err_as(1000, 1000, &["get", "/d/secret"], libc::EACCES);
    gw.err_as(1000, 1000, &["put", "/d/new", "644", "no"], libc::EACCES);
    gw.err_as(1000, 1000, &["mkdir", "/d/sub"], libc::EACCES);
    gw.err_as(1000, 1000, &["unlink", "/d/public"], libc::EACCES);
    gw.err_as(1000, 1000, &["chmod", "/d/public", "666"], libc::EPERM);

    // Once root gives uid 1000 the directory, it may create there, and the
    // new file is owned by the caller.
    gw.ok(&["chown", "/d", "1000", "1000"]);
    gw.ok_as(1000, 1000, &["put", "/d/mine", "640", "mine"]);
    assert!(gw.ok(&["stat", "/d/mine"]).contains(" uid=1000 gid=1000 "));
    gw.ok_as(1000, 1000, &["access", "/d", "2"]);
    gw.ok_as(1000, 1000, &["unlink", "/d/public"]);
    // Another user cannot read the 0640 file of uid 1000.
    gw.err_as(2000, 2000, &["get", "/d/mine"], libc::EACCES);
}

#[test]
fn acls_set_on_a_mount_decide_access_through_the_gateway() {
    let c = Cluster::start(2, ClusterOpts::default());
    let gw = Gateway::start(c.addr(0), &[]);
    let m = c.mount();
    gw.ok(&["mkdir", "/d"]);
    gw.ok(&["chmod", "/d", "700"]);
    gw.ok(&["put", "/d/f", "600", "for 1000"]);
    gw.err_as(1000, 1000, &["get", "/d/f"], libc::EACCES);
    let setfacl = |args: &str| {
        let o = Command::new("sh")
            .arg("-c")
            .arg(format!("setfacl {args}"))
            .current_dir(&m.path)
            .output()
            .unwrap();
        assert!(o.status.success(), "setfacl {args}: {o:?}");
    };
    // Search on the directory and read on the file for uid 1000 only.
    setfacl("-m u:1000:x d");
    setfacl("-m u:1000:r d/f");
    assert_eq!(gw.ok_as(1000, 1000, &["get", "/d/f"]), "for 1000\n");
    gw.ok_as(1000, 1000, &["access", "/d/f", "4"]);
    gw.err_as(1000, 1000, &["access", "/d/f", "2"], libc::EACCES);
    gw.err_as(2000, 2000, &["get", "/d/f"], libc::EACCES);
    // A group entry; the mask limits it.
    setfacl("-m g:3000:rw,m::r d/f");
    setfacl("-m g:3000:x d");
    gw.ok_as(2000, 3000, &["access", "/d/f", "4"]);
    gw.err_as(2000, 3000, &["access", "/d/f", "2"], libc::EACCES);
    // Creating in the directory needs write there: granted by an entry.
    gw.err_as(1000, 1000, &["put", "/d/new", "644", "no"], libc::EACCES);
    setfacl("-m u:1000:rwx d");
    gw.ok_as(1000, 1000, &["put", "/d/new", "644", "yes"]);
    // Truncating (SETATTR of the size) needs write: granted by an entry.
    gw.err_as(1000, 1000, &["truncate", "/d/f", "3"], libc::EACCES);
    setfacl("-m u:1000:rw,m::rw d/f");
    gw.ok_as(1000, 1000, &["truncate", "/d/f", "3"]);
    assert_eq!(gw.ok_as(1000, 1000, &["get", "/d/f"]), "for\n");
    // Gone again: the mode decides.
    setfacl("-b d/f");
    gw.err_as(1000, 1000, &["get", "/d/f"], libc::EACCES);
}

#[test]
fn fuse_mount_and_gateway_see_each_others_writes() {
    let c = Cluster::start(2, ClusterOpts::default());
    let gw = Gateway::start(c.addr(0), &[]);
    let m = c.mount();
    let tmp = tempfile::tempdir().expect("tempdir");

    // Written through FUSE, read through NFS.
    let a = pattern(11, 0, (3 << 20) + 7);
    write_local(&m.path.join("from-fuse.bin"), &a);
    let out = tmp.path().join("a.out");
    let out_s = out.display().to_string();
    tool(&gw, "nfs-cp", &[&gw.file_url("from-fuse.bin"), &out_s]);
    assert!(
        std::fs::read(&out).expect("read") == a,
        "FUSE -> NFS differs"
    );

    // Written through NFS, read through FUSE.
    let b = pattern(12, 0, (2 << 20) + 99);
    let src = tmp.path().join("b.in");
    write_local(&src, &b);
    tool(
        &gw,
        "nfs-cp",
        &[&src.display().to_string(), &gw.file_url("from-nfs.bin")],
    );
    let got = wait_for_content(&m.path.join("from-nfs.bin"), &b);
    assert!(got, "NFS -> FUSE differs");

    // The file FUSE wrote, rewritten through NFS, read through FUSE again.
    let a2 = pattern(13, 0, 1 << 20);
    write_local(&src, &a2);
    gw.ok(&["copyin", &src.display().to_string(), "/from-fuse.bin"]);
    assert!(
        wait_for_content(&m.path.join("from-fuse.bin"), &a2),
        "NFS rewrite not seen through FUSE"
    );

    // A directory made through FUSE is listed by the gateway.
    std::fs::create_dir(m.path.join("dir-from-fuse")).expect("mkdir through FUSE");
    let ls = tool(&gw, "nfs-ls", &[&gw.url()]);
    let listing = String::from_utf8_lossy(&ls.stdout).into_owned();
    assert!(listing.contains("dir-from-fuse"), "{listing}");
}

/// Whether `path` (through FUSE) reads as `want` within a few seconds: the
/// kernel may serve cached attributes for its attribute timeout.
fn wait_for_content(path: &Path, want: &[u8]) -> bool {
    let start = Instant::now();
    loop {
        let mut got = Vec::new();
        if File::open(path)
            .and_then(|mut f| f.read_to_end(&mut got))
            .is_ok()
            && got == want
        {
            return true;
        }
        if start.elapsed() > Duration::from_secs(5) {
            return false;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn hosts_outside_export_allow_are_refused() {
    let c = Cluster::start(1, ClusterOpts::default());
    let refused = Gateway::start(c.addr(0), &["--export-allow", "10.0.0.0/8,192.168.7.7"]);
    let o = Command::new("nfs-ls")
        .arg(refused.url())
        .stdin(Stdio::null())
        .output()
        .expect("cannot run nfs-ls");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(!o.status.success(), "refused host could list: {text}");
    assert!(text.contains("MNT3ERR_ACCES"), "{text}");

    let admitted = Gateway::start(c.addr(0), &["--export-allow", "10.0.0.0/8,127.0.0.0/8"]);
    tool(&admitted, "nfs-ls", &[&admitted.url()]);

    let bad = common::morris(&["nfs", c.addr(0), "--export-allow", "10.0.0.0/33"]);
    assert!(!bad.status.success());
    assert!(
        common::stderr(&bad).contains("10.0.0.0/33"),
        "{}",
        common::both(&bad)
    );
}

#[test]
fn a_deleted_files_handle_is_stale() {
    let c = Cluster::start(1, ClusterOpts::default());
    let gw = Gateway::start(c.addr(0), &[]);
    gw.ok(&["put", "/held", "644", "held data"]);
    let mut holder = Command::new(nfsop_bin())
        .arg(gw.url())
        .args(["0", "0", "hold", "/held"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("cannot run nfsop hold");
    let mut out = BufReader::new(holder.stdout.take().expect("stdout"));
    let mut first = String::new();
    out.read_line(&mut first).expect("read nfsop output");
    assert_eq!(first, "held data\n");
    gw.ok(&["unlink", "/held"]);
    // A file with no name left stays a moment (an open racing the removal
    // must still find it, docs/architecture.md "Files with no name left"),
    // then goes: its handle is stale from then on.
    std::thread::sleep(std::time::Duration::from_secs(4));
    holder
        .stdin
        .as_mut()
        .expect("stdin")
        .write_all(b"go\n")
        .expect("wake nfsop");
    let mut rest = String::new();
    out.read_to_string(&mut rest).expect("read nfsop output");
    let status = holder.wait().expect("wait nfsop");
    assert!(
        !status.success(),
        "read through a deleted file's handle worked: {rest}"
    );
    assert!(
        read_log(&gw.log).contains("NFS3ERR_STALE"),
        "no STALE answer logged:\n{}",
        read_log(&gw.log)
    );
}

#[test]
fn bad_rpc_input_gets_rpc_errors_and_never_stops_the_gateway() {
    let c = Cluster::start(1, ClusterOpts::default());
    // Plain sockets here come from unprivileged ports.
    let mut gw = Gateway::start(c.addr(0), &["--insecure"]);
    let addr = format!("127.0.0.1:{}", gw.port);

    // A call to an unknown program: an accepted reply with PROG_UNAVAIL (1).
    let mut s = TcpStream::connect(&addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let mut call = Vec::new();
    for w in [0x8000_0028u32, 42, 0, 2, 123_456, 1, 0, 0, 0, 0, 0] {
        call.extend_from_slice(&w.to_be_bytes());
    }
    s.write_all(&call).expect("send");
    let mut reply = [0u8; 28];
    s.read_exact(&mut reply).expect("reply");
    let word = |i: usize| u32::from_be_bytes([reply[i], reply[i + 1], reply[i + 2], reply[i + 3]]);
    assert_eq!((word(4), word(8), word(12)), (42, 1, 0), "{reply:?}");
    assert_eq!(word(24), 1, "accept_stat should be PROG_UNAVAIL: {reply:?}");

    // An NFS call with an unknown procedure number: PROC_UNAVAIL (3).
    let mut call = Vec::new();
    for w in [0x8000_0028u32, 43, 0, 2, 100_003, 3, 99, 0, 0, 0, 0] {
        call.extend_from_slice(&w.to_be_bytes());
    }
    s.write_all(&call).expect("send");
    s.read_exact(&mut reply).expect("reply");
    let word = |i: usize| u32::from_be_bytes([reply[i], reply[i + 1], reply[i + 2], reply[i + 3]]);
    assert_eq!((word(4), word(24)), (43, 3), "{reply:?}");

    // Garbage, and a record claiming 1 GiB: the connection is closed.
    for junk in [
        &[0x80, 0, 0, 8, 1, 2, 3, 4, 5, 6, 7, 8][..],
        &[0xc0, 0, 0, 0][..],
    ] {
        let mut s = TcpStream::connect(&addr).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        s.write_all(junk).expect("send junk");
        let mut buf = [0u8; 64];
        let n = s.read(&mut buf).unwrap_or(0);
        assert_eq!(n, 0, "expected the connection to close after junk");
    }

    assert!(
        gw.alive(),
        "gateway died on bad input:\n{}",
        read_log(&gw.log)
    );
    tool(&gw, "nfs-ls", &[&gw.url()]);
    gw.stop();
}

#[test]
fn handles_are_stable_and_the_write_verifier_changes_across_restarts() {
    let c = Cluster::start(1, ClusterOpts::default());
    let mut gw = Gateway::start(c.addr(0), &[]);
    gw.ok(&["put", "/v.txt", "644", "0123456789"]);
    let mut raw = Raw::connect(gw.port);
    let root = raw.mount_root();
    let fh = raw.lookup(&root, "v.txt");
    let (status, committed, verf1) = raw.write(&fh, b"abc");
    assert_eq!((status, committed), (0, 0), "UNSTABLE write");
    let (_, _, again) = raw.write(&fh, b"abd");
    assert_eq!(verf1, again, "verifier changed within one run");
    drop(raw);

    let port = gw.port;
    gw.stop();
    let gw = Gateway::start_on(c.addr(0), port, &[]);
    let mut raw = Raw::connect(gw.port);
    // The old file handle works at once, before anything is looked up again.
    let (status, _, verf2) = raw.write(&fh, b"xyz");
    assert_eq!(status, 0, "old file handle refused after a restart");
    assert_eq!(
        raw.mount_root(),
        root,
        "root handle changed across a restart"
    );
    assert_eq!(
        raw.lookup(&root, "v.txt"),
        fh,
        "file handle changed across a restart"
    );
    assert_ne!(verf1, verf2, "write verifier survived a gateway restart");
    // The writes of both runs landed (the stop closed the open file cleanly).
    assert_eq!(gw.ok(&["get", "/v.txt"]), "xyz3456789\n");
}

#[test]
fn rmdir_of_a_file_and_remove_of_a_directory_are_refused() {
    let c = Cluster::start(1, ClusterOpts::default());
    let gw = Gateway::start(c.addr(0), &[]);
    gw.ok(&["put", "/f", "644", "keep me"]);
    gw.ok(&["symlink", "f", "/s"]);
    gw.ok(&["mkdir", "/e"]);

    // RMDIR names a directory: a file or symlink is ENOTDIR and stays.
    gw.err_as(0, 0, &["rmdir", "/f"], libc::ENOTDIR);
    gw.err_as(0, 0, &["rmdir", "/s"], libc::ENOTDIR);
    assert_eq!(gw.ok(&["get", "/f"]), "keep me\n");
    assert_eq!(gw.ok(&["readlink", "/s"]), "f\n");

    // REMOVE names a non-directory: an (empty) directory is EISDIR and stays.
    gw.err_as(0, 0, &["unlink", "/e"], libc::EISDIR);
    assert!(
        gw.ok(&["stat", "/e"]).starts_with("mode=40"),
        "{}",
        gw.ok(&["stat", "/e"])
    );

    // Each on its own kind still removes it.
    gw.ok(&["rmdir", "/e"]);
    gw.ok(&["unlink", "/f"]);
    gw.ok(&["unlink", "/s"]);
    for gone in ["/e", "/f", "/s"] {
        gw.err_as(0, 0, &["stat", gone], libc::ENOENT);
    }
    assert!(common::fsck(c.addr(0)).0, "{}", common::fsck(c.addr(0)).2);
}

/// `nfsop stat PATH`'s inode number.
fn ino(gw: &Gateway, path: &str) -> u64 {
    let st = gw.ok(&["stat", path]);
    st.split_whitespace()
        .find_map(|w| w.strip_prefix("ino="))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no ino in {st}"))
}

/// `nfsop lsi PATH`: (name, inode, NFS type) of every entry, sorted.
fn entries(gw: &Gateway, path: &str) -> Vec<(String, u64, u32)> {
    let out = gw.ok(&["lsi", path]);
    let mut v: Vec<(String, u64, u32)> = out
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            assert_eq!(f.len(), 3, "bad lsi line {l:?}");
            (
                f[0].to_string(),
                f[1].parse().expect("inode"),
                f[2].parse().expect("type"),
            )
        })
        .collect();
    v.sort();
    v
}

#[test]
fn listings_start_with_dot_and_dotdot() {
    const DIR: u32 = 2; // NF3DIR
    const REG: u32 = 1; // NF3REG
    let c = Cluster::start(2, ClusterOpts::default());
    let gw = Gateway::start(c.addr(0), &[]);
    gw.ok(&["mkdir", "/d"]);
    gw.ok(&["mkdir", "/d/sub"]);
    gw.ok(&["put", "/d/a", "644", "x"]);
    let (root, d, sub, a) = (
        ino(&gw, "/"),
        ino(&gw, "/d"),
        ino(&gw, "/d/sub"),
        ino(&gw, "/d/a"),
    );

    // The root is its own parent.
    let got = entries(&gw, "/");
    let want = vec![
        (".".to_string(), root, DIR),
        ("..".to_string(), root, DIR),
        ("d".to_string(), d, DIR),
    ];
    assert_eq!(got, want, "listing of /");

    let got = entries(&gw, "/d");
    let want = vec![
        (".".to_string(), d, DIR),
        ("..".to_string(), root, DIR),
        ("a".to_string(), a, REG),
        ("sub".to_string(), sub, DIR),
    ];
    assert_eq!(got, want, "listing of /d");

    let got = entries(&gw, "/d/sub");
    let want = vec![(".".to_string(), sub, DIR), ("..".to_string(), d, DIR)];
    assert_eq!(got, want, "listing of the empty /d/sub");

    // A directory of several READDIRPLUS replies: each name exactly once.
    for i in 0..300 {
        gw.ok(&["put", &format!("/d/sub/f{i:03}"), "644", "x"]);
    }
    let got = entries(&gw, "/d/sub");
    let names: Vec<&str> = got.iter().map(|e| e.0.as_str()).collect();
    let mut want: Vec<String> = vec![".".into(), "..".into()];
    want.extend((0..300).map(|i| format!("f{i:03}")));
    assert_eq!(names, want);
}

#[test]
fn the_named_export_serves_host_export_file_urls() {
    let c = Cluster::start(2, ClusterOpts::default());
    let gw = Gateway::start(c.addr(0), &[]);
    let tmp = tempfile::tempdir().expect("tempdir");
    let src = tmp.path().join("in.bin");
    let data = pattern(31, 0, (1 << 20) + 777);
    write_local(&src, &data);
    let src_s = src.display().to_string();

    // nfs://127.0.0.1/morris/FILE: libnfs mounts "/morris", the volume's root.
    tool(
        &gw,
        "nfs-cp",
        &[&src_s, &gw.export_url("/morris", "/copied.bin")],
    );
    let cat = tool(&gw, "nfs-cat", &[&gw.export_url("/morris", "/copied.bin")]);
    assert!(cat.stdout == data, "read back through /morris differs");
    // The same file through the "/" export.
    let cat = tool(&gw, "nfs-cat", &[&gw.file_url("copied.bin")]);
    assert!(cat.stdout == data, "read back through / differs");

    // nfs://127.0.0.1/morris/sub/FILE mounts "/morris/sub": the volume's /sub.
    gw.ok(&["mkdir", "/sub"]);
    tool(
        &gw,
        "nfs-cp",
        &[&src_s, &gw.export_url("/morris", "/sub/in-sub.bin")],
    );
    let cat = tool(&gw, "nfs-cat", &[&gw.file_url("sub/in-sub.bin")]);
    assert!(cat.stdout == data, "file in /sub differs");
    let ls = tool(&gw, "nfs-ls", &[&gw.export_url("/morris", "/")]);
    let listing = String::from_utf8_lossy(&ls.stdout).into_owned();
    assert!(
        listing.contains("copied.bin") && listing.contains("sub"),
        "{listing}"
    );
    let o = gw.op_at(
        &gw.export_url("/morris", "/sub"),
        0,
        0,
        &["get", "/in-sub.bin"],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stdout));

    // nfs://127.0.0.1/FILE: libnfs sends the export path "" (the root); it
    // refuses an empty export itself unless told not to look for nested ones.
    let url = format!(
        "nfs://127.0.0.1/copied.bin?version=3&nfsport={p}&mountport={p}&auto-traverse-mounts=0",
        p = gw.port
    );
    let cat = tool(&gw, "nfs-cat", &[&url]);
    assert!(cat.stdout == data, "read back through export \"\" differs");

    // --export names another export; /morris is then just a path.
    let vol = Gateway::start(c.addr(0), &["--export", "vol"]);
    let cat = tool(&vol, "nfs-cat", &[&vol.export_url("/vol", "/copied.bin")]);
    assert!(cat.stdout == data, "read back through /vol differs");
    let o = Command::new("nfs-cat")
        .arg(vol.export_url("/morris", "/copied.bin"))
        .stdin(Stdio::null())
        .output()
        .expect("cannot run nfs-cat");
    assert!(!o.status.success(), "/morris served with --export vol");
    for bad in ["/", "", "a/../b", "/x/./y", "a//b"] {
        let o = common::morris(&["nfs", c.addr(0), "--export", bad]);
        assert!(!o.status.success(), "--export {bad:?} accepted");
        assert!(
            common::stderr(&o).contains("--export"),
            "{}",
            common::both(&o)
        );
    }
}

#[test]
fn by_default_the_gateway_squashes_root_refuses_unprivileged_ports_and_device_nodes() {
    let c = Cluster::start(1, ClusterOpts::default());
    let gw = Gateway::start_plain(c.addr(0), common::free_port(), &[]);
    // Root's calls act as nobody: root may not write into a directory only
    // root may write, and what it makes belongs to nobody.
    let trusted = Gateway::start(c.addr(0), &[]);
    trusted.ok(&["mkdirm", "/rootonly", "755"]);
    trusted.ok(&["mkdirm", "/open", "777"]);
    gw.err_as(0, 0, &["put", "/rootonly/f", "644", "x"], libc::EACCES);
    gw.ok_as(0, 0, &["put", "/open/f", "644", "by root"]);
    let st = trusted.ok(&["stat", "/open/f"]);
    assert!(st.contains("uid=65534 gid=65534"), "{st}");
    // Another user is who it says (from a privileged port).
    gw.ok_as(1000, 100, &["put", "/open/g", "644", "by 1000"]);
    let st = trusted.ok(&["stat", "/open/g"]);
    assert!(st.contains("uid=1000 gid=100"), "{st}");
    // Device nodes are refused (a FIFO is not a device).
    gw.ok_as(1000, 100, &["mknod", "/open/fifo", "10644", "0"]);
    gw.err_as(0, 0, &["mknod", "/open/dev", "20644", "259"], libc::EPERM);
    trusted.err_as(0, 0, &["mknod", "/open/dev", "20644", "259"], libc::EPERM);

    // An unprivileged source port gets AUTH_TOOWEAK for every call.
    let mut raw = Raw::connect_unprivileged(gw.port);
    let reply = raw.call_raw(100_005, 0, &[]);
    let word = |i: usize| u32::from_be_bytes([reply[i], reply[i + 1], reply[i + 2], reply[i + 3]]);
    // REPLY, MSG_DENIED, AUTH_ERROR, AUTH_TOOWEAK.
    assert_eq!((word(4), word(8), word(12), word(16)), (1, 1, 1, 5));
    assert!(read_log(&gw.log).contains("unprivileged port"));
    // With --insecure it is served.
    let open = Gateway::start_plain(c.addr(0), common::free_port(), &["--insecure"]);
    let mut raw = Raw::connect_unprivileged(open.port);
    raw.mount_root();

    // A gateway that other hosts can reach needs an allow-list.
    let o = common::morris(&[
        "nfs",
        c.addr(0),
        "--key",
        &common::client_key(),
        "--listen",
        "0.0.0.0:0",
    ]);
    assert!(!o.status.success(), "{}", common::both(&o));
    assert!(
        common::stderr(&o).contains("--export-allow"),
        "{}",
        common::both(&o)
    );
}

/// One NLM call through `nfsop` (`nlmlock`, `nlmtest`, ...) on `path`:
/// its answer's first line.
fn nlm(gw: &Gateway, op: &str, path: &str, args: &[&str]) -> String {
    let port = gw.port.to_string();
    let mut all = vec![op, path, port.as_str()];
    all.extend_from_slice(args);
    gw.ok(&all).trim().to_string()
}

#[test]
fn nlm_locks_of_nfs_clients_and_fcntl_locks_of_mounts_exclude_each_other() {
    use common::{getlk, open_rw, setlk, wait_for, would_block};
    let c = Cluster::start(2, ClusterOpts::default());
    let mut gw = Gateway::start(c.addr(0), &[]);
    let m = c.mount();
    let f = open_rw(&m.path.join("locked"));
    std::fs::write(m.path.join("locked"), b"0123456789").expect("write");
    let me = std::process::id().to_string();

    // A mount's lock, seen and respected by NFS clients.
    setlk(&f, libc::F_WRLCK, 0, 100, false).expect("fcntl lock on the mount");
    assert_eq!(
        nlm(&gw, "nlmtest", "/locked", &["hostA", "11", "0", "10", "1"]),
        format!("DENIED excl=1 svid={me} off=0 len=100")
    );
    assert_eq!(
        nlm(
            &gw,
            "nlmlock",
            "/locked",
            &["hostA", "11", "50", "10", "1", "0"]
        ),
        "DENIED"
    );
    // Bytes nobody holds: granted, shared.
    assert_eq!(
        nlm(
            &gw,
            "nlmlock",
            "/locked",
            &["hostA", "11", "200", "10", "0", "0"]
        ),
        "GRANTED"
    );
    // A blocking lock waits for the mount's.
    let blocked = ["hostA", "11", "0", "10", "1", "1"];
    assert_eq!(nlm(&gw, "nlmlock", "/locked", &blocked), "BLOCKED");
    setlk(&f, libc::F_UNLCK, 0, 100, false).expect("unlock on the mount");
    // No lock manager answers GRANTED callbacks here: the client asks
    // again, as Linux's does, and finds the lock its own.
    wait_for(
        Duration::from_secs(15),
        "the blocked nlm lock to be granted",
        || match nlm(&gw, "nlmlock", "/locked", &blocked) {
            g if g == "GRANTED" => Ok(()),
            other => Err(other),
        },
    );

    // NFS clients' locks, seen and respected by the mount.
    would_block(
        setlk(&f, libc::F_WRLCK, 0, 10, false),
        "a mount's lock over an nlm lock",
    );
    assert_eq!(
        getlk(&f, libc::F_WRLCK, 0, 10).l_type,
        libc::F_WRLCK as libc::c_short
    );
    would_block(
        setlk(&f, libc::F_WRLCK, 205, 1, false),
        "a mount's lock over a shared nlm lock",
    );
    setlk(&f, libc::F_RDLCK, 205, 1, false).expect("shared over shared");
    setlk(&f, libc::F_UNLCK, 205, 1, false).expect("unlock");
    // Another NFS client's lock conflicts as well.
    assert_eq!(
        nlm(
            &gw,
            "nlmlock",
            "/locked",
            &["hostB", "11", "5", "1", "1", "0"]
        ),
        "DENIED"
    );
    assert_eq!(
        nlm(&gw, "nlmunlock", "/locked", &["hostA", "11", "0", "10"]),
        "GRANTED"
    );
    setlk(&f, libc::F_WRLCK, 0, 10, false).expect("the mount's lock once the nlm lock went");
    setlk(&f, libc::F_UNLCK, 0, 10, false).expect("unlock");

    // A client that restarted (NSM SM_NOTIFY) loses its locks.
    would_block(
        setlk(&f, libc::F_WRLCK, 200, 10, false),
        "hostA's shared lock",
    );
    assert_eq!(
        gw.ok(&["nsmnotify", "-", &gw.port.to_string(), "hostA", "3"])
            .trim(),
        "ok"
    );
    setlk(&f, libc::F_WRLCK, 200, 10, false).expect("hostA's locks went with its restart");

    // A cancelled wait never takes the lock.
    let wait_b = ["hostB", "5", "200", "10", "1", "1"];
    assert_eq!(nlm(&gw, "nlmlock", "/locked", &wait_b), "BLOCKED");
    assert_eq!(
        nlm(
            &gw,
            "nlmcancel",
            "/locked",
            &["hostB", "5", "200", "10", "1"]
        ),
        "GRANTED"
    );
    setlk(&f, libc::F_UNLCK, 200, 10, false).expect("unlock");
    std::thread::sleep(Duration::from_secs(2));
    setlk(&f, libc::F_WRLCK, 200, 10, false).expect("the cancelled wait took nothing");
    setlk(&f, libc::F_UNLCK, 200, 10, false).expect("unlock");

    // A gateway killed with NFS clients' locks: they go a lease time later.
    assert_eq!(
        nlm(
            &gw,
            "nlmlock",
            "/locked",
            &["hostC", "9", "300", "0", "1", "0"]
        ),
        "GRANTED"
    );
    would_block(setlk(&f, libc::F_WRLCK, 300, 1, false), "hostC's lock");
    assert!(gw.alive());
    drop(gw);
    wait_for(
        Duration::from_secs(30),
        "a killed gateway's nlm locks to go",
        || setlk(&f, libc::F_WRLCK, 300, 1, false).map_err(|e| e.to_string()),
    );
}

/// A user (neither root nor the directory's owner) creating files through
/// the gateway while a mount keeps changing the same directory: each of
/// the mount's changes recalls the gateway's lease on it, and the
/// gateway's permission check (the directory's ACL) must not ask for a
/// second use of the lease it holds — that waited behind the recall,
/// which waited for the first use, until the lease lapsed (a stall of
/// about a minute per create, found by `bench/consistency.py`).
#[test]
fn a_users_creates_through_the_gateway_never_stall_while_a_mount_changes_the_directory() {
    use std::os::unix::fs::PermissionsExt;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let c = Cluster::start(2, ClusterOpts::default());
    let gw = Gateway::start(c.addr(0), &["--insecure"]);
    let m = c.mount();
    let shared = m.path.join("shared");
    std::fs::create_dir(&shared).expect("mkdir");
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o1777)).expect("chmod");
    let stop = Arc::new(AtomicBool::new(false));
    let churn = {
        let (stop, shared) = (stop.clone(), shared.clone());
        std::thread::spawn(move || {
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let p = shared.join(format!("m{i}"));
                std::fs::write(&p, b"x").expect("write through the mount");
                std::fs::remove_file(&p).expect("unlink through the mount");
                i += 1;
            }
            i
        })
    };
    for n in 0..60 {
        let name = format!("/shared/u{n}");
        let mut child = Command::new(nfsop_bin())
            .arg(gw.url())
            .args(["1000", "1000", "put", &name, "644", "data"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("nfsop");
        let status = common::wait_timeout(&mut child, Duration::from_secs(20));
        if status.is_none() {
            let _ = child.kill();
            let _ = child.wait();
            stop.store(true, Ordering::Relaxed);
            panic!(
                "create {n} through the gateway stalled for 20 s; gateway log:\n{}",
                read_log(&gw.log)
            );
        }
        assert!(
            status.is_some_and(|s| s.success()),
            "create {n} failed: {status:?}; gateway log:\n{}",
            read_log(&gw.log)
        );
    }
    stop.store(true, Ordering::Relaxed);
    let changes = churn.join().expect("the mount's thread");
    assert!(changes > 0, "the mount changed nothing meanwhile");
}

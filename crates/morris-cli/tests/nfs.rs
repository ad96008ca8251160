//! `morris nfs`: the NFSv3 gateway, driven by a real NFS client (libnfs: its
//! command-line tools `nfs-cp`, `nfs-ls`, `nfs-cat`, and `nfsop.c`, a small
//! program compiled here against libnfs for the procedures the tools do not
//! cover). The tests fail, never skip, when libnfs or a C compiler is missing.

mod common;

use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use common::{free_port, pattern, read_log, signal, wait_timeout, Cluster, ClusterOpts, MORRIS};

/// Panics unless `tool` is on PATH.
fn require_tool(tool: &str, package: &str) {
    let found = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()))
        .unwrap_or(false);
    assert!(
        found,
        "this test needs `{tool}` (package {package}), which is not on PATH"
    );
}

/// The `nfsop` helper, compiled once per test binary against libnfs.
fn nfsop_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        require_tool("cc", "gcc");
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/nfsop.c");
        let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("morris-nfsop");
        let o = Command::new("cc")
            .arg("-Wall")
            .arg("-O1")
            .arg("-o")
            .arg(&out)
            .arg(&src)
            .arg("-lnfs")
            .output()
            .expect("cannot run cc");
        assert!(
            o.status.success(),
            "cannot compile {} against libnfs (install libnfs-dev): {}",
            src.display(),
            String::from_utf8_lossy(&o.stderr)
        );
        out
    })
}

/// A running `morris nfs` child process.
struct Gateway {
    port: u16,
    log: PathBuf,
    child: Option<Child>,
    _dir: tempfile::TempDir,
}

impl Gateway {
    /// Starts `morris nfs ADDR --listen 127.0.0.1:<free port> EXTRA...`.
    fn start(addr: &str, extra: &[&str]) -> Gateway {
        Gateway::start_on(addr, free_port(), extra)
    }

    fn start_on(addr: &str, port: u16, extra: &[&str]) -> Gateway {
        require_tool("nfs-cp", "libnfs-utils");
        require_tool("nfs-ls", "libnfs-utils");
        require_tool("nfs-cat", "libnfs-utils");
        let dir = tempfile::tempdir().expect("tempdir");
        let log = dir.path().join("nfs.log");
        let out = File::create(&log).expect("cannot create the gateway log");
        let err = out.try_clone().expect("cannot clone a file handle");
        let mut child = Command::new(MORRIS)
            .arg("nfs")
            .arg(addr)
            .arg("--listen")
            .arg(format!("127.0.0.1:{port}"))
            .args(extra)
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()),
            )
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .expect("cannot start morris nfs");
        let start = Instant::now();
        // Ready once the log says so (the port may be taken by our own probe otherwise).
        while !read_log(&log).contains("nfs gateway serving") {
            if let Ok(Some(status)) = child.try_wait() {
                panic!("morris nfs exited with {status}; log:\n{}", read_log(&log));
            }
            if start.elapsed() > Duration::from_secs(30) {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "morris nfs not serving after 30 s; log:\n{}",
                    read_log(&log)
                );
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        Gateway {
            port,
            log,
            child: Some(child),
            _dir: dir,
        }
    }

    /// The export's directory URL (libnfs syntax, no portmapper).
    fn url(&self) -> String {
        format!(
            "nfs://127.0.0.1/?version=3&nfsport={p}&mountport={p}",
            p = self.port
        )
    }

    /// The URL of a file in the export's root directory. libnfs sends the
    /// export path "" for `nfs://host/file`; `//file` makes it "/".
    fn file_url(&self, name: &str) -> String {
        format!(
            "nfs://127.0.0.1//{name}?version=3&nfsport={p}&mountport={p}",
            p = self.port
        )
    }

    /// Runs `nfsop URL UID GID ARGS...`.
    fn op(&self, uid: u32, gid: u32, args: &[&str]) -> Output {
        Command::new(nfsop_bin())
            .arg(self.url())
            .arg(uid.to_string())
            .arg(gid.to_string())
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("cannot run nfsop")
    }

    /// Runs an nfsop as root that must succeed; returns its stdout.
    fn ok(&self, args: &[&str]) -> String {
        self.ok_as(0, 0, args)
    }

    fn ok_as(&self, uid: u32, gid: u32, args: &[&str]) -> String {
        let o = self.op(uid, gid, args);
        let out = String::from_utf8_lossy(&o.stdout).into_owned();
        assert!(
            o.status.success(),
            "nfsop {args:?} as {uid}:{gid} failed: {out}{}\n--- gateway log\n{}",
            String::from_utf8_lossy(&o.stderr),
            read_log(&self.log)
        );
        out
    }

    /// Runs an nfsop that must fail with `errno`.
    fn err_as(&self, uid: u32, gid: u32, args: &[&str], errno: i32) {
        let o = self.op(uid, gid, args);
        let out = String::from_utf8_lossy(&o.stdout).into_owned();
        assert_eq!(
            o.status.code(),
            Some(2),
            "nfsop {args:?} as {uid}:{gid} should have failed with errno {errno}: {out}"
        );
        assert!(
            out.starts_with(&format!("ERR {errno} ")),
            "nfsop {args:?} as {uid}:{gid}: expected errno {errno}, got: {out}"
        );
    }

    fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            signal(child.id(), libc::SIGTERM);
            let status = wait_timeout(&mut child, Duration::from_secs(20));
            if status.is_none() {
                let _ = child.kill();
                let _ = child.wait();
            }
            assert!(
                status.is_some_and(|s| s.success()),
                "morris nfs did not stop cleanly on SIGTERM ({status:?}); log:\n{}",
                read_log(&self.log)
            );
        }
    }

    fn alive(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Runs a libnfs tool and returns its output, asserting success.
fn tool(gw: &Gateway, name: &str, args: &[&str]) -> Output {
    let o = Command::new(name)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {name}: {e}"));
    assert!(
        o.status.success(),
        "{name} {args:?} failed: {}{}\n--- gateway log\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr),
        read_log(&gw.log)
    );
    o
}

fn write_local(path: &Path, data: &[u8]) {
    std::fs::write(path, data).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
}

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
    let mut gw = Gateway::start(c.addr(0), &[]);
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

/// A minimal ONC RPC client speaking raw XDR, for what libnfs does not show:
/// file handle bytes and write verifiers.
struct Raw {
    s: TcpStream,
    xid: u32,
}

fn xdr_opaque(out: &mut Vec<u8>, b: &[u8]) {
    out.extend_from_slice(&(b.len() as u32).to_be_bytes());
    out.extend_from_slice(b);
    out.resize(out.len() + (4 - b.len() % 4) % 4, 0);
}

impl Raw {
    fn connect(port: u16) -> Raw {
        let s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(20)))
            .expect("timeout");
        Raw { s, xid: 1000 }
    }

    /// Calls `prog`/3 procedure `proc_` as root and returns the reply body
    /// (after the accepted-reply header), asserting SUCCESS.
    fn call(&mut self, prog: u32, proc_: u32, args: &[u8]) -> Vec<u8> {
        self.xid += 1;
        let mut rec = Vec::new();
        // xid, CALL, rpcvers 2, prog, vers 3, proc, AUTH_UNIX root, AUTH_NULL verf.
        for w in [self.xid, 0, 2, prog, 3, proc_, 1, 20, 0, 0, 0, 0, 0, 0, 0] {
            rec.extend_from_slice(&w.to_be_bytes());
        }
        rec.extend_from_slice(args);
        let mut framed = (0x8000_0000u32 | rec.len() as u32).to_be_bytes().to_vec();
        framed.extend_from_slice(&rec);
        self.s.write_all(&framed).expect("send call");
        let mut mark = [0u8; 4];
        self.s.read_exact(&mut mark).expect("reply mark");
        let len = (u32::from_be_bytes(mark) & 0x7fff_ffff) as usize;
        let mut reply = vec![0u8; len];
        self.s.read_exact(&mut reply).expect("reply");
        let word =
            |i: usize| u32::from_be_bytes([reply[i], reply[i + 1], reply[i + 2], reply[i + 3]]);
        assert_eq!(word(0), self.xid, "reply to another call");
        assert_eq!(
            (word(4), word(8), word(20)),
            (1, 0, 0),
            "not an accepted SUCCESS reply"
        );
        reply[24..].to_vec()
    }

    /// An opaque at `at` in `body` (length-prefixed).
    fn opaque_at(body: &[u8], at: usize) -> Vec<u8> {
        let len = u32::from_be_bytes([body[at], body[at + 1], body[at + 2], body[at + 3]]) as usize;
        body[at + 4..at + 4 + len].to_vec()
    }

    fn mount_root(&mut self) -> Vec<u8> {
        let mut a = Vec::new();
        xdr_opaque(&mut a, b"/");
        let r = self.call(100_005, 1, &a);
        assert_eq!(&r[..4], &[0, 0, 0, 0], "MNT failed");
        Raw::opaque_at(&r, 4)
    }

    fn lookup(&mut self, dir: &[u8], name: &str) -> Vec<u8> {
        let mut a = Vec::new();
        xdr_opaque(&mut a, dir);
        xdr_opaque(&mut a, name.as_bytes());
        let r = self.call(100_003, 3, &a);
        assert_eq!(&r[..4], &[0, 0, 0, 0], "LOOKUP failed");
        Raw::opaque_at(&r, 4)
    }

    /// An UNSTABLE WRITE; returns (status, committed, verifier).
    fn write(&mut self, fh: &[u8], data: &[u8]) -> (u32, u32, [u8; 8]) {
        let mut a = Vec::new();
        xdr_opaque(&mut a, fh);
        a.extend_from_slice(&0u64.to_be_bytes());
        a.extend_from_slice(&(data.len() as u32).to_be_bytes());
        a.extend_from_slice(&0u32.to_be_bytes());
        xdr_opaque(&mut a, data);
        let r = self.call(100_003, 7, &a);
        let status = u32::from_be_bytes([r[0], r[1], r[2], r[3]]);
        let n = r.len();
        let committed = u32::from_be_bytes([r[n - 12], r[n - 11], r[n - 10], r[n - 9]]);
        let mut verf = [0u8; 8];
        verf.copy_from_slice(&r[n - 8..]);
        (status, committed, verf)
    }
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

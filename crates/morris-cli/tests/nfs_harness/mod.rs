//! Shared by the NFS gateway tests: a `morris nfs` child process, the
//! libnfs tools, `nfsop` (a small program compiled here against libnfs for
//! what the tools do not cover), and `Raw`, a minimal ONC RPC client for
//! what libnfs does not show (handle bytes, verifiers, single procedures).

#![allow(dead_code)]

use std::fs::File;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::common::{free_port, keys, morris_cmd, read_log, signal, wait_timeout};

/// Panics unless `tool` is on PATH.
pub fn require_tool(tool: &str, package: &str) {
    let found = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()))
        .unwrap_or(false);
    assert!(
        found,
        "this test needs `{tool}` (package {package}), which is not on PATH"
    );
}

/// The `nfsop` helper, compiled once per test binary against libnfs.
pub fn nfsop_bin() -> &'static Path {
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
pub struct Gateway {
    pub port: u16,
    pub log: PathBuf,
    child: Option<Child>,
    _dir: tempfile::TempDir,
}

impl Gateway {
    /// Starts `morris nfs ADDR --listen 127.0.0.1:<free port>
    /// --no-root-squash EXTRA...`: the tests act as root through the
    /// gateway, as a trusted admin host would.
    pub fn start(addr: &str, extra: &[&str]) -> Gateway {
        Gateway::start_on(addr, free_port(), extra)
    }

    /// [`Gateway::start`] on `port`.
    pub fn start_on(addr: &str, port: u16, extra: &[&str]) -> Gateway {
        let mut args = vec!["--no-root-squash"];
        args.extend_from_slice(extra);
        Gateway::start_plain(addr, port, &args)
    }

    /// Starts `morris nfs ADDR --listen 127.0.0.1:PORT EXTRA...`, with the
    /// gateway's own defaults otherwise.
    pub fn start_plain(addr: &str, port: u16, extra: &[&str]) -> Gateway {
        require_tool("nfs-cp", "libnfs-utils");
        require_tool("nfs-ls", "libnfs-utils");
        require_tool("nfs-cat", "libnfs-utils");
        let dir = tempfile::tempdir().expect("tempdir");
        let log = dir.path().join("nfs.log");
        let out = File::create(&log).expect("cannot create the gateway log");
        let err = out.try_clone().expect("cannot clone a file handle");
        let mut child = morris_cmd()
            .arg("nfs")
            .arg(addr)
            .arg("--key")
            .arg(&keys().client)
            .arg("--listen")
            .arg(format!("127.0.0.1:{port}"))
            .args(extra)
            .args(
                (!extra.contains(&"--nlm-state"))
                    .then(|| ["--nlm-state".into(), dir.path().join("nlm.json")])
                    .into_iter()
                    .flatten(),
            )
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
    pub fn url(&self) -> String {
        format!(
            "nfs://127.0.0.1/?version=3&nfsport={p}&mountport={p}",
            p = self.port
        )
    }

    /// The URL of a file in the volume's root directory through the export
    /// `/`. (libnfs sends the export path "" for `nfs://host/file` and then
    /// refuses it itself; `//file` makes it "/".)
    pub fn file_url(&self, name: &str) -> String {
        format!(
            "nfs://127.0.0.1//{name}?version=3&nfsport={p}&mountport={p}",
            p = self.port
        )
    }

    /// A URL below the named export (`nfs://127.0.0.1/<export><path>`):
    /// libnfs mounts the export path up to the last `/` and opens the rest.
    pub fn export_url(&self, export: &str, path: &str) -> String {
        format!(
            "nfs://127.0.0.1{export}{path}?version=3&nfsport={p}&mountport={p}",
            p = self.port
        )
    }

    /// Runs `nfsop URL UID GID ARGS...`.
    pub fn op(&self, uid: u32, gid: u32, args: &[&str]) -> Output {
        self.op_at(&self.url(), uid, gid, args)
    }

    /// Runs `nfsop` on the export directory `url` (its path is mounted).
    pub fn op_at(&self, url: &str, uid: u32, gid: u32, args: &[&str]) -> Output {
        Command::new(nfsop_bin())
            .arg(url)
            .arg(uid.to_string())
            .arg(gid.to_string())
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("cannot run nfsop")
    }

    /// Runs an nfsop as root that must succeed; returns its stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        self.ok_as(0, 0, args)
    }

    pub fn ok_as(&self, uid: u32, gid: u32, args: &[&str]) -> String {
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
    pub fn err_as(&self, uid: u32, gid: u32, args: &[&str], errno: i32) {
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

    pub fn stop(&mut self) {
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

    pub fn alive(&mut self) -> bool {
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
pub fn tool(gw: &Gateway, name: &str, args: &[&str]) -> Output {
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

pub fn write_local(path: &Path, data: &[u8]) {
    std::fs::write(path, data).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
}

/// A minimal ONC RPC client speaking raw XDR, for what libnfs does not show:
/// file handle bytes and write verifiers.
pub struct Raw {
    pub s: TcpStream,
    pub xid: u32,
}

pub fn xdr_opaque(out: &mut Vec<u8>, b: &[u8]) {
    out.extend_from_slice(&(b.len() as u32).to_be_bytes());
    out.extend_from_slice(b);
    out.resize(out.len() + (4 - b.len() % 4) % 4, 0);
}

impl Raw {
    /// Connects from a privileged port (the tests run as root), as the
    /// gateway asks by default.
    pub fn connect(port: u16) -> Raw {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let to = std::net::SocketAddr::from(([127, 0, 0, 1], port));
        let start = (std::process::id() as u16).wrapping_mul(31);
        let s = (0..700u16)
            .find_map(|i| {
                let local = 300 + start.wrapping_add(i) % 700;
                let sock = tokio::net::TcpSocket::new_v4().ok()?;
                sock.bind(std::net::SocketAddr::from(([0, 0, 0, 0], local)))
                    .ok()?;
                let s = rt.block_on(sock.connect(to)).ok()?;
                s.into_std().ok()
            })
            .expect("connect from a privileged port (are the tests root?)");
        s.set_nonblocking(false).expect("blocking");
        s.set_read_timeout(Some(Duration::from_secs(20)))
            .expect("timeout");
        Raw { s, xid: 1000 }
    }

    /// Connects from an unprivileged port.
    pub fn connect_unprivileged(port: u16) -> Raw {
        let s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(20)))
            .expect("timeout");
        Raw { s, xid: 1000 }
    }

    /// Calls `prog`/3 procedure `proc_` as root and returns the reply body
    /// (after the accepted-reply header), asserting SUCCESS.
    pub fn call(&mut self, prog: u32, proc_: u32, args: &[u8]) -> Vec<u8> {
        let reply = self.call_raw(prog, proc_, args);
        let word =
            |i: usize| u32::from_be_bytes([reply[i], reply[i + 1], reply[i + 2], reply[i + 3]]);
        assert_eq!(
            (word(4), word(8), word(20)),
            (1, 0, 0),
            "not an accepted SUCCESS reply"
        );
        reply[24..].to_vec()
    }

    /// Calls `prog`/3 procedure `proc_` as root and returns the whole reply
    /// record (from the xid on).
    pub fn call_raw(&mut self, prog: u32, proc_: u32, args: &[u8]) -> Vec<u8> {
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
        reply
    }

    /// An opaque at `at` in `body` (length-prefixed).
    pub fn opaque_at(body: &[u8], at: usize) -> Vec<u8> {
        let len = u32::from_be_bytes([body[at], body[at + 1], body[at + 2], body[at + 3]]) as usize;
        body[at + 4..at + 4 + len].to_vec()
    }

    pub fn mount_root(&mut self) -> Vec<u8> {
        self.mnt(b"/").expect("MNT / failed")
    }

    /// MOUNT MNT of `path`: the root handle, or the mountstat3 error.
    pub fn mnt(&mut self, path: &[u8]) -> Result<Vec<u8>, u32> {
        let mut a = Vec::new();
        xdr_opaque(&mut a, path);
        let r = self.call(100_005, 1, &a);
        match u32::from_be_bytes([r[0], r[1], r[2], r[3]]) {
            0 => Ok(Raw::opaque_at(&r, 4)),
            stat => Err(stat),
        }
    }

    pub fn lookup(&mut self, dir: &[u8], name: &str) -> Vec<u8> {
        let mut a = Vec::new();
        xdr_opaque(&mut a, dir);
        xdr_opaque(&mut a, name.as_bytes());
        let r = self.call(100_003, 3, &a);
        assert_eq!(&r[..4], &[0, 0, 0, 0], "LOOKUP failed");
        Raw::opaque_at(&r, 4)
    }

    /// An UNSTABLE WRITE at offset 0; returns (status, committed, verifier).
    pub fn write(&mut self, fh: &[u8], data: &[u8]) -> (u32, u32, [u8; 8]) {
        self.write_how(fh, data, 0)
    }

    /// A WRITE at offset 0 with `stable` (0 UNSTABLE, 1 DATA_SYNC, 2
    /// FILE_SYNC); returns (status, committed, verifier).
    pub fn write_how(&mut self, fh: &[u8], data: &[u8], stable: u32) -> (u32, u32, [u8; 8]) {
        let mut a = Vec::new();
        xdr_opaque(&mut a, fh);
        a.extend_from_slice(&0u64.to_be_bytes());
        a.extend_from_slice(&(data.len() as u32).to_be_bytes());
        a.extend_from_slice(&stable.to_be_bytes());
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

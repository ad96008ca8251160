//! `morris nfs` at the protocol level: procedures libnfs' API does not show
//! one by one (FSINFO, PATHCONF, CREATE modes, guarded SETATTR, COMMIT,
//! plain READDIR with cookies, bogus handles) over raw ONC RPC; portmapper
//! registration against a real `rpcbind` in a private network namespace; a
//! 1 GiB file copied in and out with libnfs; a huge directory (200,000
//! entries; 1,000,000 with `MORRIS_BIGDIR_ENTRIES=1000000`) listed
//! completely through READDIR and READDIRPLUS.

mod common;
mod nfs_harness;

use std::collections::HashSet;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{free_port, pattern, read_log, Cluster, ClusterOpts, MORRIS};
use nfs_harness::{require_tool, tool, xdr_opaque, Gateway, Raw};

const NFS: u32 = 100_003;
const NFS3ERR_EXIST: u32 = 17;
const NFS3ERR_STALE: u32 = 70;
const NFS3ERR_BADHANDLE: u32 = 10_001;
const NFS3ERR_NOT_SYNC: u32 = 10_002;
/// Bytes of an XDR fattr3.
const FATTR3: usize = 84;

fn word(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn dword(b: &[u8], at: usize) -> u64 {
    (u64::from(word(b, at)) << 32) | u64::from(word(b, at + 4))
}

fn fh_arg(fh: &[u8]) -> Vec<u8> {
    let mut a = Vec::new();
    xdr_opaque(&mut a, fh);
    a
}

/// Skips a post_op_attr at `at`; returns the position after it.
fn skip_post_op_attr(b: &[u8], at: usize) -> usize {
    if word(b, at) == 1 {
        at + 4 + FATTR3
    } else {
        at + 4
    }
}

/// sattr3 setting only the mode (or nothing, with `None`).
fn sattr_mode(mode: Option<u32>) -> Vec<u8> {
    let mut a = Vec::new();
    match mode {
        Some(m) => {
            a.extend_from_slice(&1u32.to_be_bytes());
            a.extend_from_slice(&m.to_be_bytes());
        }
        None => a.extend_from_slice(&0u32.to_be_bytes()),
    }
    // uid, gid, size, atime, mtime: not set.
    for _ in 0..5 {
        a.extend_from_slice(&0u32.to_be_bytes());
    }
    a
}

/// CREATE `name` in `dir` with `how` (0 UNCHECKED, 1 GUARDED, 2 EXCLUSIVE
/// with `verf`); returns (status, file handle if any).
fn create(raw: &mut Raw, dir: &[u8], name: &str, how: u32, verf: [u8; 8]) -> (u32, Vec<u8>) {
    let mut a = fh_arg(dir);
    xdr_opaque(&mut a, name.as_bytes());
    a.extend_from_slice(&how.to_be_bytes());
    if how == 2 {
        a.extend_from_slice(&verf);
    } else {
        a.extend_from_slice(&sattr_mode(Some(0o644)));
    }
    let r = raw.call(NFS, 8, &a);
    let status = word(&r, 0);
    if status != 0 || word(&r, 4) != 1 {
        return (status, Vec::new());
    }
    (status, Raw::opaque_at(&r, 8))
}

/// GETATTR: (status, fattr3 bytes).
fn getattr(raw: &mut Raw, fh: &[u8]) -> (u32, Vec<u8>) {
    let r = raw.call(NFS, 1, &fh_arg(fh));
    let status = word(&r, 0);
    if status != 0 {
        return (status, Vec::new());
    }
    (status, r[4..4 + FATTR3].to_vec())
}

/// Lists `dir` with plain READDIR, `count` bytes per call, following
/// cookies; returns every name and the number of calls.
fn readdir_all(raw: &mut Raw, dir: &[u8], count: u32) -> (Vec<String>, usize) {
    let mut names = Vec::new();
    let mut cookie = 0u64;
    let mut verf = [0u8; 8];
    let mut calls = 0;
    loop {
        let mut a = fh_arg(dir);
        a.extend_from_slice(&cookie.to_be_bytes());
        a.extend_from_slice(&verf);
        a.extend_from_slice(&count.to_be_bytes());
        let r = raw.call(NFS, 16, &a);
        calls += 1;
        assert_eq!(word(&r, 0), 0, "READDIR at cookie {cookie} failed");
        let mut at = skip_post_op_attr(&r, 4);
        verf.copy_from_slice(&r[at..at + 8]);
        at += 8;
        let mut got = 0;
        while word(&r, at) == 1 {
            let name = Raw::opaque_at(&r, at + 12);
            let padded = name.len().div_ceil(4) * 4;
            at += 12 + 4 + padded;
            cookie = dword(&r, at);
            at += 8;
            names.push(String::from_utf8(name).expect("utf-8 name"));
            got += 1;
        }
        let eof = word(&r, at + 4) == 1;
        if eof {
            return (names, calls);
        }
        assert!(got > 0, "READDIR returned no entries and no eof");
    }
}

#[test]
fn fsinfo_pathconf_create_modes_setattr_guard_commit_readdir_and_bad_handles() {
    let c = Cluster::start(2, ClusterOpts::default());
    let gw = Gateway::start(c.addr(0), &[]);
    let mut raw = Raw::connect(gw.port);
    let root = raw.mount_root();

    // NULL answers with an empty body.
    assert!(raw.call(NFS, 0, &[]).is_empty(), "NULL reply has a body");

    // FSINFO: 1 MiB transfers advertised, files to the volume's limit.
    let r = raw.call(NFS, 19, &fh_arg(&root));
    assert_eq!(word(&r, 0), 0, "FSINFO failed");
    let at = skip_post_op_attr(&r, 4);
    let (rtmax, rtpref, wtmax, wtpref) = (
        word(&r, at),
        word(&r, at + 4),
        word(&r, at + 12),
        word(&r, at + 16),
    );
    assert!(
        rtmax >= 1 << 20 && wtmax >= 1 << 20 && rtpref >= 1 << 20 && wtpref >= 1 << 20,
        "FSINFO advertises rtmax {rtmax} rtpref {rtpref} wtmax {wtmax} wtpref {wtpref}"
    );
    let maxfilesize = dword(&r, at + 28);
    assert!(maxfilesize >= 1 << 40, "maxfilesize {maxfilesize}");

    // PATHCONF: 255-byte names, long names refused rather than truncated.
    let r = raw.call(NFS, 20, &fh_arg(&root));
    assert_eq!(word(&r, 0), 0, "PATHCONF failed");
    let at = skip_post_op_attr(&r, 4);
    let (linkmax, name_max, no_trunc, case_insensitive, case_preserving) = (
        word(&r, at),
        word(&r, at + 4),
        word(&r, at + 8),
        word(&r, at + 16),
        word(&r, at + 20),
    );
    assert!(linkmax >= 1, "linkmax {linkmax}");
    assert_eq!(name_max, 255, "name_max");
    assert_eq!(
        (no_trunc, case_insensitive, case_preserving),
        (1, 0, 1),
        "PATHCONF flags"
    );

    // CREATE GUARDED refuses an existing name; UNCHECKED reuses it.
    let (s, g) = create(&mut raw, &root, "g", 1, [0; 8]);
    assert_eq!(s, 0, "GUARDED create of a new name");
    assert_eq!(create(&mut raw, &root, "g", 1, [0; 8]).0, NFS3ERR_EXIST);
    let (s, g2) = create(&mut raw, &root, "g", 0, [0; 8]);
    assert_eq!((s, &g2), (0, &g), "UNCHECKED create of an existing name");

    // CREATE EXCLUSIVE: a retransmission (same verifier) succeeds with the
    // same file; another verifier is refused.
    let (s, e1) = create(&mut raw, &root, "e", 2, *b"verifier");
    assert_eq!(s, 0, "EXCLUSIVE create");
    let (s, e2) = create(&mut raw, &root, "e", 2, *b"verifier");
    assert_eq!((s, &e2), (0, &e1), "EXCLUSIVE retransmission");
    assert_eq!(
        create(&mut raw, &root, "e", 2, *b"another!").0,
        NFS3ERR_EXIST,
        "EXCLUSIVE create with another verifier"
    );

    // SETATTR with a ctime guard: a wrong ctime is NOT_SYNC and changes
    // nothing; the right one applies.
    let (s, attr) = getattr(&mut raw, &g);
    assert_eq!(s, 0);
    let ctime = &attr[76..84];
    let setattr = |raw: &mut Raw, guard: &[u8]| -> u32 {
        let mut a = fh_arg(&g);
        a.extend_from_slice(&sattr_mode(Some(0o600)));
        a.extend_from_slice(&1u32.to_be_bytes());
        a.extend_from_slice(guard);
        word(&raw.call(NFS, 2, &a), 0)
    };
    let mut wrong = ctime.to_vec();
    wrong[3] ^= 1;
    assert_eq!(setattr(&mut raw, &wrong), NFS3ERR_NOT_SYNC);
    assert_eq!(word(&getattr(&mut raw, &g).1, 4) & 0o7777, 0o644);
    assert_eq!(setattr(&mut raw, ctime), 0, "SETATTR with the right guard");
    assert_eq!(word(&getattr(&mut raw, &g).1, 4) & 0o7777, 0o600);

    // SETATTR of times: mtime and atime set to a client time stick.
    let mut a = fh_arg(&g);
    for w in [0u32, 0, 0, 0] {
        a.extend_from_slice(&w.to_be_bytes()); // mode, uid, gid, size: not set
    }
    for (secs, nsecs) in [(1_000_000_000u32, 5u32), (1_234_567_890, 789)] {
        a.extend_from_slice(&2u32.to_be_bytes()); // SET_TO_CLIENT_TIME
        a.extend_from_slice(&secs.to_be_bytes());
        a.extend_from_slice(&nsecs.to_be_bytes());
    }
    a.extend_from_slice(&0u32.to_be_bytes()); // no guard
    assert_eq!(word(&raw.call(NFS, 2, &a), 0), 0, "SETATTR of times");
    let attr = getattr(&mut raw, &g).1;
    assert_eq!(
        (
            word(&attr, 60),
            word(&attr, 64),
            word(&attr, 68),
            word(&attr, 72)
        ),
        (1_000_000_000, 5, 1_234_567_890, 789),
        "atime/mtime after SETATTR"
    );

    // FILE_SYNC and DATA_SYNC writes answer as stable as asked.
    for stable in [2u32, 1] {
        let (s, committed, _) = raw.write_how(&g, b"stable", stable);
        assert_eq!(s, 0);
        assert!(committed >= stable, "asked {stable}, answered {committed}");
    }

    // WRITE UNSTABLE, then COMMIT: the same verifier; READ sees the data,
    // and a READ past the end is an empty eof.
    let (s, _, wverf) = raw.write(&g, b"commit me");
    assert_eq!(s, 0);
    let mut a = fh_arg(&g);
    a.extend_from_slice(&0u64.to_be_bytes());
    a.extend_from_slice(&0u32.to_be_bytes());
    let r = raw.call(NFS, 21, &a);
    assert_eq!(word(&r, 0), 0, "COMMIT failed");
    assert_eq!(
        &r[r.len() - 8..],
        &wverf,
        "COMMIT verifier differs from WRITE's"
    );
    let read = |raw: &mut Raw, off: u64, count: u32| -> (u32, bool, Vec<u8>) {
        let mut a = fh_arg(&g);
        a.extend_from_slice(&off.to_be_bytes());
        a.extend_from_slice(&count.to_be_bytes());
        let r = raw.call(NFS, 6, &a);
        assert_eq!(word(&r, 0), 0, "READ failed");
        let at = skip_post_op_attr(&r, 4);
        (
            word(&r, at),
            word(&r, at + 4) == 1,
            Raw::opaque_at(&r, at + 8),
        )
    };
    assert_eq!(read(&mut raw, 0, 100), (9, true, b"commit me".to_vec()));
    assert_eq!(read(&mut raw, 4096, 100), (0, true, Vec::new()));
    // An oversized count is served up to the file's end, not refused.
    assert_eq!(read(&mut raw, 0, u32::MAX).2, b"commit me".to_vec());

    // Plain READDIR over 500 names in small batches: every name exactly once.
    let mut a = fh_arg(&root);
    xdr_opaque(&mut a, b"rd");
    a.extend_from_slice(&sattr_mode(Some(0o755)));
    let r = raw.call(NFS, 9, &a);
    assert_eq!(word(&r, 0), 0, "MKDIR failed");
    let rd = Raw::opaque_at(&r, 8);
    for i in 0..500 {
        assert_eq!(create(&mut raw, &rd, &format!("n{i:04}"), 1, [0; 8]).0, 0);
    }
    let (names, calls) = readdir_all(&mut raw, &rd, 1024);
    assert!(calls > 5, "expected several READDIR calls, got {calls}");
    let unique: HashSet<&String> = names.iter().collect();
    assert_eq!(unique.len(), names.len(), "a name listed twice");
    let want: HashSet<String> = (0..500).map(|i| format!("n{i:04}")).collect();
    let got: HashSet<String> = names
        .into_iter()
        .filter(|n| n != "." && n != "..")
        .collect();
    assert_eq!(got, want, "READDIR listing differs");

    // Bogus handles: a clear error, never another file.
    for bogus in [&b"12345678"[..], &[0u8; 64][..], &[0xffu8; 16][..], &[][..]] {
        let s = getattr(&mut raw, bogus).0;
        assert!(
            s == NFS3ERR_BADHANDLE || s == NFS3ERR_STALE,
            "GETATTR of a bogus handle {bogus:?}: status {s}"
        );
    }
    let mut raw2 = Raw::connect(gw.port);
    assert!(
        raw2.call(NFS, 0, &[]).is_empty(),
        "gateway stopped answering"
    );
    drop(gw);
}

/// A network namespace of this test, deleted (with its processes killed)
/// on drop.
struct NetNs {
    name: String,
    children: Vec<Child>,
}

impl NetNs {
    fn new() -> NetNs {
        assert!(
            common::is_root(),
            "this test needs root (network namespaces)"
        );
        // One per test: tests of this binary run at once.
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let name = format!("morris-t{}-{n}", std::process::id());
        let ok = |args: &[&str]| {
            let o = Command::new("ip")
                .args(args)
                .output()
                .expect("cannot run ip (package iproute2)");
            assert!(
                o.status.success(),
                "ip {args:?}: {}",
                String::from_utf8_lossy(&o.stderr)
            );
        };
        ok(&["netns", "add", &name]);
        let ns = NetNs {
            name,
            children: Vec::new(),
        };
        ok(&["-n", &ns.name, "link", "set", "lo", "up"]);
        ns
    }

    /// A command run inside the namespace.
    fn cmd(&self, program: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.name, program])
            .env("MORRIS_KEY", &common::keys().volume);
        c
    }

    fn spawn(&mut self, mut c: Command, log: &Path) {
        let out = std::fs::File::create(log).expect("log file");
        let err = out.try_clone().expect("clone");
        let child = c
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .expect("cannot start a process in the namespace");
        self.children.push(child);
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        for c in self.children.iter_mut().rev() {
            common::signal(c.id(), libc::SIGTERM);
            if common::wait_timeout(c, Duration::from_secs(10)).is_none() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
        let _ = Command::new("ip")
            .args(["netns", "delete", &self.name])
            .status();
    }
}

fn wait_until(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(start.elapsed() < limit, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn registers_with_a_running_rpcbind_and_unregisters_on_stop() {
    require_tool("rpcbind", "rpcbind");
    require_tool("rpcinfo", "rpcbind");
    require_tool("nfs-ls", "libnfs-utils");
    let mut h = HostNs::new();
    let rpcinfo = |ns: &NetNs| -> String {
        let o = ns
            .cmd("rpcinfo")
            .args(["-p", "127.0.0.1"])
            .output()
            .expect("rpcinfo");
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let log = h.gateway("nfs.log", &[]);
    let nfs_port = h.nfs_port;
    wait_until("the registration", Duration::from_secs(20), || {
        read_log(&log).contains("registered nfs v3, mount v3 and the lock programs")
    });
    let map = rpcinfo(&h.ns);
    for (prog, vers, name) in [
        ("100003", "3", "nfs"),
        ("100005", "3", "mountd"),
        ("100021", "4", "nlockmgr"),
        ("100024", "1", "status"),
    ] {
        assert!(
            map.lines().any(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                f.len() == 5
                    && f[0] == prog
                    && f[1] == vers
                    && f[2] == "tcp"
                    && f[3] == nfs_port.to_string()
                    && f[4] == name
            }),
            "{name} not registered on port {nfs_port}:\n{map}"
        );
    }
    // A client that names no port finds the gateway through rpcbind.
    let o =
        h.ns.cmd("nfs-ls")
            .arg("nfs://127.0.0.1/?version=3")
            .output()
            .expect("nfs-ls");
    assert!(
        o.status.success(),
        "nfs-ls through the portmapper: {}{}\n--- gateway log\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr),
        read_log(&log)
    );

    // Stopping the gateway removes its mappings.
    let gw = h.ns.children.pop().expect("gateway");
    let mut gw = gw;
    common::signal(gw.id(), libc::SIGTERM);
    let status = common::wait_timeout(&mut gw, Duration::from_secs(20));
    assert!(
        status.is_some_and(|s| s.success()),
        "gateway did not stop: {status:?}\n{}",
        read_log(&log)
    );
    let map = rpcinfo(&h.ns);
    assert!(
        !["100003", "100005", "100021", "100024"]
            .iter()
            .any(|p| map.contains(p)),
        "mappings left after stop:\n{map}"
    );

    // Without a portmapper the gateway serves all the same (by port).
    drop(h);
    let c = Cluster::start(1, ClusterOpts::default());
    let gw = Gateway::start(c.addr(0), &[]);
    tool(&gw, "nfs-ls", &[&gw.url()]);
}

/// Writes `len` bytes of a deterministic pattern to `path`, streaming.
fn write_pattern_file(path: &Path, seed: u64, len: u64) {
    use std::io::Write;
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).expect("create"));
    let mut off = 0u64;
    while off < len {
        let n = (len - off).min(8 << 20) as usize;
        f.write_all(&pattern(seed, off, n)).expect("write");
        off += n as u64;
    }
    f.flush().expect("flush");
}

fn sha256(path: &Path) -> String {
    let o = Command::new("sha256sum")
        .arg(path)
        .output()
        .expect("sha256sum");
    assert!(o.status.success(), "sha256sum {}", path.display());
    String::from_utf8_lossy(&o.stdout)
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_string()
}

#[test]
fn a_gibibyte_file_copies_in_and_out_with_matching_checksums() {
    let c = Cluster::start(4, ClusterOpts::default());
    let gw = Gateway::start(c.addr(0), &[]);
    let tmp = tempfile::tempdir().expect("tempdir");
    let src = tmp.path().join("in.bin");
    // 1 GiB and a tail, so the last READ/WRITE is short.
    write_pattern_file(&src, 21, (1 << 30) + 4_321);
    let want = sha256(&src);
    tool(
        &gw,
        "nfs-cp",
        &[&src.display().to_string(), &gw.file_url("gib.bin")],
    );
    let dst = tmp.path().join("out.bin");
    tool(
        &gw,
        "nfs-cp",
        &[&gw.file_url("gib.bin"), &dst.display().to_string()],
    );
    assert_eq!(
        std::fs::metadata(&dst).expect("copy out").len(),
        (1 << 30) + 4_321
    );
    assert_eq!(sha256(&dst), want, "checksum of the copy out differs");
    // The blocks really are striped over all four servers.
    let st = common::morris(&["status", c.addr(0), "--json"]);
    assert!(st.status.success(), "{}", common::both(&st));
    assert!(common::fsck(c.addr(0)).0, "{}", common::fsck(c.addr(0)).2);
}

/// Entries in the big-directory test: `MORRIS_BIGDIR_ENTRIES`, default
/// 200,000 (creating 1,000,000 through debug builds takes ~10 minutes on
/// two cores; docs/benchmarks.md records the 1,000,000 run).
fn bigdir_entries() -> u64 {
    std::env::var("MORRIS_BIGDIR_ENTRIES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200_000)
}

#[test]
fn a_huge_directory_lists_completely_through_readdir_and_readdirplus() {
    let n = bigdir_entries();
    let c = Cluster::start(4, ClusterOpts::default());
    let addr = c.addr(0).to_string();
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let started = Instant::now();
    rt.block_on(async {
        use morris_client::{Caller, Client, ClientConfig, FileKind, ROOT_ID};
        let keys = morris_client::Keys::load(&common::keys().client).expect("client key");
        let cl = Client::connect(&addr, ClientConfig::new(keys))
            .await
            .expect("connect");
        let me = Caller::root();
        let dir = cl.mkdir(ROOT_ID, b"big", 0o755, &me).await.expect("mkdir");
        let next = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let mut tasks = Vec::new();
        for _ in 0..64 {
            let (cl, next, me) = (cl.clone(), next.clone(), me.clone());
            tasks.push(tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if i >= n {
                        return;
                    }
                    cl.create(
                        dir.id,
                        format!("f{i:07}").as_bytes(),
                        FileKind::File,
                        0o644,
                        0,
                        true,
                        &me,
                    )
                    .await
                    .expect("create");
                }
            }));
        }
        for t in tasks {
            t.await.expect("create task");
        }
        cl.shutdown().await;
    });
    eprintln!("created {n} entries in {:?}", started.elapsed());
    let gw = Gateway::start(c.addr(0), &[]);

    // Plain READDIR, 64 KiB per call, by raw RPC.
    let mut raw = Raw::connect(gw.port);
    let root = raw.mount_root();
    let big = raw.lookup(&root, "big");
    let t = Instant::now();
    let (names, calls) = readdir_all(&mut raw, &big, 64 << 10);
    eprintln!(
        "READDIR: {} names in {calls} calls, {:?}",
        names.len(),
        t.elapsed()
    );
    let mut seen = vec![false; n as usize];
    for n in names
        .iter()
        .filter(|n| n.as_str() != "." && n.as_str() != "..")
    {
        let i: usize = n
            .strip_prefix('f')
            .and_then(|d| d.parse().ok())
            .unwrap_or_else(|| panic!("unexpected name {n}"));
        assert!(!seen[i], "{n} listed twice");
        seen[i] = true;
    }
    let missing = seen.iter().filter(|s| !**s).count();
    assert_eq!(missing, 0, "READDIR missed {missing} of {n} names");

    // READDIRPLUS through libnfs (nfs_opendir reads the whole directory).
    let t = Instant::now();
    let out = gw.ok(&["ls", "/big"]);
    let count = out.lines().filter(|l| l.starts_with('f')).count();
    eprintln!("READDIRPLUS (libnfs): {count} names in {:?}", t.elapsed());
    assert_eq!(count as u64, n, "libnfs listed {count} of {n} names");
}

const MOUNT: u32 = 100_005;
const NFS3ERR_NOENT: u32 = 2;
const NFS3ERR_NOTDIR: u32 = 20;
const NFS3ERR_ISDIR: u32 = 21;
const NFS3ERR_BAD_COOKIE: u32 = 10_003;
/// Bytes of an XDR wcc_attr (size, mtime, ctime).
const WCC_ATTR: usize = 24;

/// A `diropargs3`: directory handle and name.
fn dirop(dir: &[u8], name: &str) -> Vec<u8> {
    let mut a = fh_arg(dir);
    xdr_opaque(&mut a, name.as_bytes());
    a
}

/// MKDIR `name` in `dir` (mode 0755); returns the new handle.
fn mkdir(raw: &mut Raw, dir: &[u8], name: &str) -> Vec<u8> {
    let mut a = dirop(dir, name);
    a.extend_from_slice(&sattr_mode(Some(0o755)));
    let r = raw.call(NFS, 9, &a);
    assert_eq!(word(&r, 0), 0, "MKDIR {name} failed");
    Raw::opaque_at(&r, 8)
}

/// The fileid in a fattr3.
fn fileid_of(attr: &[u8]) -> u64 {
    dword(attr, 52)
}

/// The status of a LOOKUP.
fn lookup_status(raw: &mut Raw, dir: &[u8], name: &str) -> u32 {
    word(&raw.call(NFS, 3, &dirop(dir, name)), 0)
}

/// A REMOVE (12) or RMDIR (13) reply: status, and the directory's wcc_data
/// as (before: (size, mtime, ctime words)?, after: fattr3?).
fn remove_call(
    raw: &mut Raw,
    proc_: u32,
    dir: &[u8],
    name: &str,
) -> (u32, Option<Vec<u8>>, Option<Vec<u8>>) {
    let r = raw.call(NFS, proc_, &dirop(dir, name));
    let status = word(&r, 0);
    let mut at = 4;
    let before = (word(&r, at) == 1).then(|| r[at + 4..at + 4 + WCC_ATTR].to_vec());
    at += 4 + before.as_ref().map_or(0, |_| WCC_ATTR);
    let after = (word(&r, at) == 1).then(|| r[at + 4..at + 4 + FATTR3].to_vec());
    at += 4 + after.as_ref().map_or(0, |_| FATTR3);
    assert_eq!(at, r.len(), "REMOVE/RMDIR reply of unexpected length");
    (status, before, after)
}

#[test]
fn remove_and_rmdir_refuse_the_other_kind_and_answer_wcc_data() {
    let c = Cluster::start(1, ClusterOpts::default());
    let gw = Gateway::start(c.addr(0), &[]);
    let mut raw = Raw::connect(gw.port);
    let root = raw.mount_root();
    let d = mkdir(&mut raw, &root, "d");
    assert_eq!(create(&mut raw, &d, "f", 1, [0; 8]).0, 0);
    mkdir(&mut raw, &d, "e");
    let (_, dattr) = getattr(&mut raw, &d);

    // RMDIR of a file: NOTDIR, with the directory's attributes before and
    // after (unchanged), and the file is still there.
    let (s, before, after) = remove_call(&mut raw, 13, &d, "f");
    assert_eq!(s, NFS3ERR_NOTDIR, "RMDIR of a file");
    let before = before.expect("RMDIR failure without pre-op attributes");
    let after = after.expect("RMDIR failure without post-op attributes");
    assert_eq!(dword(&before, 0), dword(&dattr, 20), "pre-op size");
    assert_eq!(&before[8..], &dattr[68..84], "pre-op mtime/ctime");
    assert_eq!(fileid_of(&after), fileid_of(&dattr), "post-op attributes");
    assert_eq!(lookup_status(&mut raw, &d, "f"), 0, "RMDIR removed a file");

    // REMOVE of an empty directory: ISDIR, and it is still there.
    let (s, before, after) = remove_call(&mut raw, 12, &d, "e");
    assert_eq!(s, NFS3ERR_ISDIR, "REMOVE of a directory");
    assert!(before.is_some() && after.is_some(), "wcc_data missing");
    assert_eq!(lookup_status(&mut raw, &d, "e"), 0, "REMOVE removed a dir");

    // Each on its own kind: removed, with wcc_data.
    for (proc_, name) in [(12, "f"), (13, "e")] {
        let (s, before, after) = remove_call(&mut raw, proc_, &d, name);
        assert_eq!(s, 0, "procedure {proc_} of {name}");
        assert!(before.is_some() && after.is_some(), "wcc_data missing");
        assert_eq!(lookup_status(&mut raw, &d, name), NFS3ERR_NOENT);
    }
    // A name that does not exist: NOENT from either.
    for proc_ in [12, 13] {
        assert_eq!(remove_call(&mut raw, proc_, &d, "none").0, NFS3ERR_NOENT);
    }
}

/// One READDIR(PLUS) entry: name, fileid, cookie and, for READDIRPLUS,
/// attributes and handle.
#[derive(Debug, Clone, PartialEq)]
struct Entry {
    name: String,
    fileid: u64,
    cookie: u64,
    attrs: Option<Vec<u8>>,
    handle: Option<Vec<u8>>,
}

/// One READDIR (`plus`: READDIRPLUS) call of `count` bytes from `cookie`:
/// (status, entries, verifier, eof).
fn readdir_page(
    raw: &mut Raw,
    dir: &[u8],
    cookie: u64,
    verf: [u8; 8],
    count: u32,
    plus: bool,
) -> (u32, Vec<Entry>, [u8; 8], bool) {
    let mut a = fh_arg(dir);
    a.extend_from_slice(&cookie.to_be_bytes());
    a.extend_from_slice(&verf);
    if plus {
        a.extend_from_slice(&(count / 4).to_be_bytes()); // dircount
    }
    a.extend_from_slice(&count.to_be_bytes());
    let r = raw.call(NFS, if plus { 17 } else { 16 }, &a);
    let status = word(&r, 0);
    if status != 0 {
        return (status, Vec::new(), [0; 8], false);
    }
    let mut at = skip_post_op_attr(&r, 4);
    let mut verf = [0u8; 8];
    verf.copy_from_slice(&r[at..at + 8]);
    at += 8;
    let mut entries = Vec::new();
    while word(&r, at) == 1 {
        let fileid = dword(&r, at + 4);
        let name = Raw::opaque_at(&r, at + 12);
        at += 12 + 4 + name.len().div_ceil(4) * 4;
        let cookie = dword(&r, at);
        at += 8;
        let (mut attrs, mut handle) = (None, None);
        if plus {
            if word(&r, at) == 1 {
                attrs = Some(r[at + 4..at + 4 + FATTR3].to_vec());
            }
            at = skip_post_op_attr(&r, at);
            if word(&r, at) == 1 {
                let h = Raw::opaque_at(&r, at + 4);
                at += 8 + h.len().div_ceil(4) * 4;
                handle = Some(h);
            } else {
                at += 4;
            }
        }
        entries.push(Entry {
            name: String::from_utf8(name).expect("utf-8 name"),
            fileid,
            cookie,
            attrs,
            handle,
        });
    }
    (status, entries, verf, word(&r, at + 4) == 1)
}

/// Lists `dir` from `cookie` (with verifier `verf`) to its end, following
/// the cookies; returns the entries and the verifier of the first reply.
fn list_from(
    raw: &mut Raw,
    dir: &[u8],
    mut cookie: u64,
    verf: [u8; 8],
    count: u32,
    plus: bool,
) -> (Vec<Entry>, [u8; 8]) {
    let mut all = Vec::new();
    let mut verf = verf;
    let mut first = None;
    for _ in 0..1000 {
        let (s, entries, v, eof) = readdir_page(raw, dir, cookie, verf, count, plus);
        assert_eq!(s, 0, "READDIR(PLUS {plus}) from cookie {cookie} failed");
        first.get_or_insert(v);
        verf = v;
        if let Some(last) = entries.last() {
            cookie = last.cookie;
        }
        let got = entries.len();
        all.extend(entries);
        if eof {
            return (all, first.unwrap_or(v));
        }
        assert!(got > 0, "READDIR(PLUS) returned no entries and no eof");
    }
    panic!("listing did not end");
}

#[test]
fn readdir_and_readdirplus_list_dot_and_dotdot_and_continue_from_every_cookie() {
    let c = Cluster::start(2, ClusterOpts::default());
    let gw = Gateway::start(c.addr(0), &[]);
    let mut raw = Raw::connect(gw.port);
    let root = raw.mount_root();
    let root_id = fileid_of(&getattr(&mut raw, &root).1);
    let cd = mkdir(&mut raw, &root, "cd");
    let cd_id = fileid_of(&getattr(&mut raw, &cd).1);
    for i in 0..30 {
        assert_eq!(create(&mut raw, &cd, &format!("e{i:02}"), 1, [0; 8]).0, 0);
    }
    let sub = mkdir(&mut raw, &cd, "sub");
    let sub_id = fileid_of(&getattr(&mut raw, &sub).1);

    for plus in [false, true] {
        // 512-byte replies: a handful of entries each.
        let (full, verf) = list_from(&mut raw, &cd, 0, [0; 8], 512, plus);
        let names: Vec<&str> = full.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(&names[..2], &[".", ".."], "plus {plus}: {names:?}");
        let mut rest: Vec<&str> = names[2..].to_vec();
        rest.sort_unstable();
        let mut want: Vec<String> = (0..30).map(|i| format!("e{i:02}")).collect();
        want.push("sub".into());
        assert_eq!(rest, want, "plus {plus}");
        assert_eq!((full[0].fileid, full[1].fileid), (cd_id, root_id));
        let cookies: HashSet<u64> = full.iter().map(|e| e.cookie).collect();
        assert_eq!(cookies.len(), full.len(), "plus {plus}: a cookie twice");
        assert!(!cookies.contains(&0), "plus {plus}: cookie 0 given");
        if plus {
            // "." and ".." come with their attributes and handles.
            for (e, h, id) in [(&full[0], &cd, cd_id), (&full[1], &root, root_id)] {
                assert_eq!(e.handle.as_ref(), Some(h), "handle of {}", e.name);
                let attrs = e.attrs.as_ref().expect("attributes of . / ..");
                assert_eq!((word(attrs, 0), fileid_of(attrs)), (2, id), "{}", e.name);
            }
            let s = full.iter().find(|e| e.name == "sub").expect("sub listed");
            assert_eq!(s.handle.as_ref(), Some(&sub));
        }
        // Continuing from any entry's cookie lists exactly what follows it.
        for (i, e) in full.iter().enumerate() {
            let (tail, _) = list_from(&mut raw, &cd, e.cookie, verf, 512, plus);
            assert_eq!(
                tail,
                full[i + 1..].to_vec(),
                "plus {plus}: continuing after {} (cookie {})",
                e.name,
                e.cookie
            );
        }
    }

    // The verifier still guards cookies: a wrong one is BAD_COOKIE, and so
    // is a cookie without one.
    let (full, verf) = list_from(&mut raw, &cd, 0, [0; 8], 512, false);
    let mut wrong = verf;
    wrong[7] ^= 1;
    let (s, ..) = readdir_page(&mut raw, &cd, full[1].cookie, wrong, 512, false);
    assert_eq!(s, NFS3ERR_BAD_COOKIE, "wrong verifier");
    let (s, ..) = readdir_page(&mut raw, &cd, full[1].cookie, [0; 8], 512, false);
    assert_eq!(s, NFS3ERR_BAD_COOKIE, "cookie without a verifier");

    // The root is its own parent; an empty directory lists just . and ..
    for plus in [false, true] {
        let (r, _) = list_from(&mut raw, &root, 0, [0; 8], 4096, plus);
        assert_eq!((r[0].name.as_str(), r[0].fileid), (".", root_id));
        assert_eq!((r[1].name.as_str(), r[1].fileid), ("..", root_id));
        assert_eq!(r.len(), 3, "{r:?}");
        let (s, _) = list_from(&mut raw, &sub, 0, [0; 8], 4096, plus);
        let got: Vec<(&str, u64)> = s.iter().map(|e| (e.name.as_str(), e.fileid)).collect();
        assert_eq!(got, [(".", sub_id), ("..", cd_id)], "plus {plus}");
        if plus {
            assert_eq!(r[1].handle.as_ref(), Some(&root));
            assert_eq!(s[1].handle.as_ref(), Some(&cd));
        }
    }
}

/// MOUNT EXPORT: the export paths listed.
fn exports(raw: &mut Raw) -> Vec<String> {
    let r = raw.call(MOUNT, 5, &[]);
    let mut at = 0;
    let mut out = Vec::new();
    while word(&r, at) == 1 {
        let dir = Raw::opaque_at(&r, at + 4);
        at += 8 + dir.len().div_ceil(4) * 4;
        while word(&r, at) == 1 {
            let g = Raw::opaque_at(&r, at + 4);
            at += 8 + g.len().div_ceil(4) * 4;
        }
        at += 4;
        out.push(String::from_utf8(dir).expect("utf-8 export"));
    }
    assert_eq!(at + 4, r.len(), "EXPORT reply of unexpected length");
    out
}

#[test]
fn mount_lists_and_mounts_the_named_export_and_the_root() {
    const MNT3ERR_NOENT: u32 = 2;
    let c = Cluster::start(1, ClusterOpts::default());
    let gw = Gateway::start(c.addr(0), &[]);
    let mut raw = Raw::connect(gw.port);
    let mut listed = exports(&mut raw);
    listed.sort();
    assert_eq!(listed, ["/", "/morris"]);

    // "/morris", "/" and "" (libnfs' nfs://host/file) are the volume's root.
    let root = raw.mount_root();
    for path in [&b"/morris"[..], b"/morris/", b"", b"//"] {
        assert_eq!(raw.mnt(path), Ok(root.clone()), "MNT {path:?}");
    }
    // Below either: the volume's directories.
    let sub = mkdir(&mut raw, &root, "sub");
    for path in [&b"/morris/sub"[..], b"/sub", b"/morris//sub/"] {
        assert_eq!(raw.mnt(path), Ok(sub.clone()), "MNT {path:?}");
    }
    for path in [&b"/morris/none"[..], b"/none", b"/morrisx"] {
        assert_eq!(raw.mnt(path), Err(MNT3ERR_NOENT), "MNT {path:?}");
    }

    // A volume directory at the export's path: MNT paths starting with the
    // export's name still name the export (never one or the other by what
    // exists), the directory is below it, and the gateway warns.
    let shadowed = mkdir(&mut raw, &root, "morris");
    assert_eq!(raw.mnt(b"/morris"), Ok(root.clone()));
    assert_eq!(raw.mnt(b"/morris/morris"), Ok(shadowed));
    assert!(
        read_log(&gw.log).contains("entry at the export's path"),
        "no warning about the shadowed directory:\n{}",
        read_log(&gw.log)
    );
    drop(gw);

    // --export names it.
    let gw = Gateway::start(c.addr(0), &["--export", "/srv/vol"]);
    let mut raw = Raw::connect(gw.port);
    let mut listed = exports(&mut raw);
    listed.sort();
    assert_eq!(listed, ["/", "/srv/vol"]);
    assert_eq!(raw.mnt(b"/srv/vol/sub"), Ok(sub.clone()));
    assert_eq!(raw.mnt(b"/morris/sub"), Err(MNT3ERR_NOENT));
}

/// A client host's status monitor or lock manager, as far as a lock
/// server sees them: registers program `argv[1]` version `argv[2]` with the
/// namespace's rpcbind and prints every call it is sent: NSM `SM_NOTIFY`
/// as `notify MON_NAME STATE`, NLM `GRANTED` as `granted CALLER SVID
/// OFFSET LEN` (answered `NLM4_GRANTED` for svid 8, else `NLM4_DENIED`:
/// "nobody waits for that").
const FAKE_CLIENT_DAEMON: &str = r#"
import socket, struct, sys
prog, vers = int(sys.argv[1]), int(sys.argv[2])
def rec(s):
    data = b''
    while True:
        n = struct.unpack('>I', s.recv(4, socket.MSG_WAITALL))[0]
        data += s.recv(n & 0x7fffffff, socket.MSG_WAITALL)
        if n & 0x80000000:
            return data
def send(s, body):
    s.sendall(struct.pack('>I', 0x80000000 | len(body)) + body)
def opaque(d, off):
    ln = struct.unpack('>I', d[off:off + 4])[0]
    return d[off + 4:off + 4 + ln], off + 4 + (ln + 3) // 4 * 4
l = socket.socket()
l.bind(('127.0.0.1', 0))
l.listen(4)
port = l.getsockname()[1]
pm = socket.create_connection(('127.0.0.1', 111))
send(pm, struct.pack('>10I', 1, 0, 2, 100000, 2, 1, 0, 0, 0, 0) + struct.pack('>4I', prog, vers, 6, port))
print('registered', port, struct.unpack('>I', rec(pm)[-4:])[0], flush=True)
while True:
    c, _ = l.accept()
    d = rec(c)
    xid, proc = struct.unpack('>I', d[:4])[0], struct.unpack('>I', d[20:24])[0]
    off = 24
    for _ in range(2):
        ln = struct.unpack('>I', d[off + 4:off + 8])[0]
        off += 8 + (ln + 3) // 4 * 4
    body = b''
    if prog == 100024 and proc == 6:
        name, off = opaque(d, off)
        print('notify', name.decode(), struct.unpack('>I', d[off:off + 4])[0], flush=True)
    if prog == 100021 and proc == 5:
        cookie, off = opaque(d, off)
        off += 4
        caller, off = opaque(d, off)
        _, off = opaque(d, off)
        _, off = opaque(d, off)
        svid, start, length = struct.unpack('>IQQ', d[off:off + 20])
        print('granted', caller.decode(), svid, start, length, flush=True)
        body = struct.pack('>I', len(cookie)) + cookie + b'\0' * (-len(cookie) % 4)
        body += struct.pack('>I', 0 if svid == 8 else 1)
    send(c, struct.pack('>6I', xid, 1, 0, 0, 0, 0) + body)
    c.close()
"#;

/// A host of its own (a network namespace) with its own rpcbind, one
/// server (1.5 s leases) and a gateway port: where the gateway's portmapper
/// registration and NLM's callbacks to a client host's daemons can be
/// watched (the gateway and its client share 127.0.0.1 there).
struct HostNs {
    ns: NetNs,
    dir: tempfile::TempDir,
    server: String,
    nfs_port: u16,
}

impl HostNs {
    fn new() -> HostNs {
        require_tool("rpcbind", "rpcbind");
        require_tool("python3", "python3");
        let dir = tempfile::tempdir().expect("tempdir");
        let mut ns = NetNs::new();
        let mut rpcbind = ns.cmd("unshare");
        rpcbind.args([
            "-m",
            "sh",
            "-c",
            "mount -t tmpfs tmpfs /run && exec rpcbind -f -w",
        ]);
        ns.spawn(rpcbind, &dir.path().join("rpcbind.log"));
        wait_until("rpcbind", Duration::from_secs(10), || {
            ns.cmd("rpcinfo")
                .args(["-p", "127.0.0.1"])
                .output()
                .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("portmapper"))
        });
        let server = format!("127.0.0.1:{}", free_port());
        let mut s = ns.cmd(MORRIS);
        s.args([
            "server",
            "--listen",
            &server,
            "--lease-ms",
            "1500",
            "--data",
        ])
        .arg(dir.path().join("s0"));
        ns.spawn(s, &dir.path().join("server.log"));
        wait_until("the server", Duration::from_secs(20), || {
            ns.cmd(MORRIS)
                .args(["format", "--servers", &server])
                .output()
                .is_ok_and(|o| o.status.success())
        });
        HostNs {
            ns,
            dir,
            server,
            nfs_port: free_port(),
        }
    }

    /// Starts a gateway with `extra` options, logging to `log`; the log's
    /// path.
    fn gateway(&mut self, log: &str, extra: &[&str]) -> std::path::PathBuf {
        let mut g = self.ns.cmd(MORRIS);
        g.args([
            "nfs",
            &self.server,
            "--listen",
            &format!("127.0.0.1:{}", self.nfs_port),
        ])
        .args(extra)
        .arg("--nlm-state")
        .arg(self.dir.path().join("nlm.json"));
        let log = self.dir.path().join(log);
        self.ns.spawn(g, &log);
        wait_until("the gateway", Duration::from_secs(20), || {
            read_log(&log).contains("nfs gateway serving")
        });
        log
    }

    /// Kills the process started last.
    fn kill_last(&mut self) {
        let mut c = self.ns.children.pop().expect("a process");
        let _ = c.kill();
        let _ = c.wait();
    }

    /// Starts a fake client daemon for RPC program `prog` version `vers`;
    /// the path of what it prints.
    fn daemon(&mut self, prog: &str, vers: &str, log: &str) -> std::path::PathBuf {
        let mut d = self.ns.cmd("python3");
        d.args(["-c", FAKE_CLIENT_DAEMON, prog, vers]);
        let log = self.dir.path().join(log);
        self.ns.spawn(d, &log);
        wait_until("a fake client daemon", Duration::from_secs(10), || {
            read_log(&log).contains("registered")
        });
        log
    }

    /// `nfsop ARGS` through the gateway: its output's first line.
    fn nfsop(&self, args: &[&str]) -> String {
        let p = self.nfs_port;
        let url = format!("nfs://127.0.0.1/?version=3&nfsport={p}&mountport={p}");
        let o = self
            .ns
            .cmd(nfs_harness::nfsop_bin().to_str().expect("utf-8 path"))
            .args([url.as_str(), "0", "0"])
            .args(args)
            .output()
            .expect("nfsop");
        String::from_utf8_lossy(&o.stdout).trim().to_string()
    }

    /// An NLM LOCK of bytes `start..start+10` of `/f`: the status.
    fn lock(&self, host: &str, svid: &str, start: &str, block: bool, reclaim: bool) -> String {
        let port = self.nfs_port.to_string();
        let b = if block { "1" } else { "0" };
        let r = if reclaim { "1" } else { "0" };
        self.nfsop(&["nlmlock", "/f", &port, host, svid, start, "10", "1", b, r])
    }

    fn unlock(&self, host: &str, svid: &str, start: &str) -> String {
        let port = self.nfs_port.to_string();
        self.nfsop(&["nlmunlock", "/f", &port, host, svid, start, "10"])
    }
}

/// The gateway of the lock tests: the tests act as root from unprivileged
/// ports, and it does not register with rpcbind (the fake daemons there
/// are the client host's).
const LOCK_GATEWAY: &[&str] = &[
    "--no-root-squash",
    "--insecure",
    "--no-rpcbind",
    "--nlm-grace-secs",
    "6",
];

#[test]
fn a_restarted_gateway_tells_lock_holders_and_grants_only_their_reclaims_in_its_grace_period() {
    let mut h = HostNs::new();
    let state = h.dir.path().join("nlm.json");
    h.gateway("nfs1.log", LOCK_GATEWAY);
    assert_eq!(h.nfsop(&["put", "/f", "644", "data"]), "ok");
    assert_eq!(h.lock("hostA", "7", "0", false, false), "GRANTED");
    // Reclaims only after a restart.
    assert_eq!(
        h.lock("hostA", "7", "50", false, true),
        "DENIED_GRACE_PERIOD"
    );
    let kept = std::fs::read_to_string(&state).expect("the nlm state file");
    assert!(kept.contains("hostA"), "{kept}");

    // The gateway dies with hostA's lock; hostA's statd runs.
    h.kill_last();
    let statd = h.daemon("100024", "1", "statd.log");
    let log2 = h.gateway("nfs2.log", LOCK_GATEWAY);
    wait_until("SM_NOTIFY at the client", Duration::from_secs(10), || {
        read_log(&statd).contains("notify")
    });
    assert!(
        read_log(&statd).contains("notify 127.0.0.1 3"),
        "{}",
        read_log(&statd)
    );
    // In the grace period: no new locks, no tests, reclaims granted (once
    // the dead gateway's session lapses at the server).
    assert_eq!(
        h.lock("hostB", "7", "100", false, false),
        "DENIED_GRACE_PERIOD"
    );
    let port = h.nfs_port.to_string();
    assert_eq!(
        h.nfsop(&["nlmtest", "/f", &port, "hostB", "7", "100", "10", "1"]),
        "DENIED_GRACE_PERIOD"
    );
    assert_eq!(
        h.lock("hostA", "7", "0", false, true),
        "GRANTED",
        "{}",
        read_log(&log2)
    );
    // After it: new locks again; hostA's reclaimed lock holds.
    wait_until("the grace period's end", Duration::from_secs(20), || {
        h.lock("hostB", "7", "100", false, false) == "GRANTED"
    });
    assert_eq!(h.lock("hostB", "7", "0", false, false), "DENIED");
    assert_eq!(
        h.lock("hostA", "7", "200", false, true),
        "DENIED_GRACE_PERIOD"
    );
}

#[test]
fn a_blocked_nlm_lock_is_handed_over_by_a_granted_callback_or_given_back_if_nobody_waits() {
    let mut h = HostNs::new();
    let lockd = h.daemon("100021", "4", "lockd.log");
    h.gateway("nfs.log", LOCK_GATEWAY);
    assert_eq!(h.nfsop(&["put", "/f", "644", "data"]), "ok");
    assert_eq!(h.lock("hostA", "1", "0", false, false), "GRANTED");
    // hostB (svid 8: its lock manager waits for it) blocks behind hostA.
    assert_eq!(h.lock("hostB", "8", "0", true, false), "BLOCKED");
    assert_eq!(h.unlock("hostA", "1", "0"), "GRANTED");
    wait_until(
        "GRANTED at hostB's lock manager",
        Duration::from_secs(15),
        || read_log(&lockd).contains("granted hostB 8 0 10"),
    );
    assert_eq!(h.lock("hostA", "1", "0", false, false), "DENIED");

    // hostC (svid 9) blocks behind hostB; when it is called back its lock
    // manager says nobody waits, and the gateway gives the lock back.
    assert_eq!(h.lock("hostC", "9", "0", true, false), "BLOCKED");
    assert_eq!(h.unlock("hostB", "8", "0"), "GRANTED");
    wait_until(
        "GRANTED at hostC's lock manager",
        Duration::from_secs(15),
        || read_log(&lockd).contains("granted hostC 9 0 10"),
    );
    wait_until(
        "hostC's unwanted lock to be given back",
        Duration::from_secs(10),
        || h.lock("hostA", "1", "0", false, false) == "GRANTED",
    );
}

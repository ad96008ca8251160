//! `NfsHome` against a real nfs-ganesha (FSAL VFS) exporting a fixture
//! tree: attributes equal `lstat`, listings equal the directories, reads
//! equal the bytes, errors map as the trait promises, and a home that goes
//! down and comes back is answered `Unreachable` in time, then served again.
//! On exports of their own: what the write side makes, writes and sets is
//! what `lstat` sees, its errors say why, and a commit after a restart of
//! ganesha asks for the writes again.
//!
//! Needs root and nfs-ganesha (scripts/setup.sh installs it); fails, never
//! skips, if ganesha cannot start.

mod ganesha;

use std::collections::BTreeSet;
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use bytes::Bytes;
use ganesha::Ganesha;
use morris_home::nfs::NfsHome;
use morris_home::{
    Home, HomeAttr, HomeEntry, HomeError, HomeHandle, HomeKind, HomeNew, HomeOptions, HomeSetAttr,
    HomeTime,
};
use rand::rngs::StdRng;
use rand::{Rng, RngCore, SeedableRng};

const BIG_LEN: usize = (3 << 20) + 7;
const SPARSE_LEN: u64 = 8 << 20;
const SPARSE_DATA_AT: u64 = 3 << 20;
const MANY: usize = 3000;
/// The mtime every fixture object gets: nanoseconds included.
const MTIME: (i64, i64) = (1_600_000_000, 123_456_789);

/// The fixture tree, served by one ganesha shared by the tests that only
/// read it (stopped when the last of them drops it).
struct Fixture {
    export: PathBuf,
    ganesha: Ganesha,
    _tmp: tempfile::TempDir,
}

fn shared() -> Arc<Fixture> {
    static SHARED: Mutex<Weak<Fixture>> = Mutex::new(Weak::new());
    let mut g = SHARED.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(f) = g.upgrade() {
        return f;
    }
    let f = Arc::new(Fixture::new());
    *g = Arc::downgrade(&f);
    f
}

fn cpath(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).expect("no NUL in fixture paths")
}

/// chown (not following symlinks), then chmod (chown clears set-uid).
fn own(p: &Path, mode: Option<u32>) {
    let c = cpath(p);
    // SAFETY: a valid C string; lchown touches no memory of ours.
    assert_eq!(
        unsafe { libc::lchown(c.as_ptr(), 1234, 5678) },
        0,
        "lchown {p:?}"
    );
    if let Some(m) = mode {
        std::fs::set_permissions(p, std::os::unix::fs::PermissionsExt::from_mode(m))
            .expect("chmod");
    }
}

/// Sets atime and mtime to [`MTIME`], not following symlinks.
fn set_mtime(p: &Path) {
    let c = cpath(p);
    let t = libc::timespec {
        tv_sec: MTIME.0,
        tv_nsec: MTIME.1,
    };
    let times = [t, t];
    // SAFETY: a valid C string and two timespecs.
    let r = unsafe {
        libc::utimensat(
            libc::AT_FDCWD,
            c.as_ptr(),
            times.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    assert_eq!(r, 0, "utimensat {p:?}");
}

fn random_bytes(rng: &mut StdRng, n: usize) -> Vec<u8> {
    let mut v = vec![0; n];
    rng.fill_bytes(&mut v);
    v
}

/// The name of entry `i` of `many/`: some long, some short.
fn many_name(i: usize) -> String {
    if i.is_multiple_of(7) {
        format!("entry-{i:04}-{}", "x".repeat(i % 150))
    } else {
        format!("e{i}")
    }
}

fn make_tree(export: &Path) {
    let mut rng = StdRng::seed_from_u64(0x6d6f_7272);
    std::fs::create_dir_all(export).expect("mkdir export");
    let w = |name: &str, data: &[u8]| std::fs::write(export.join(name), data).expect("write");
    w("empty", b"");
    w("small", b"hello, world\n");
    w("page", &random_bytes(&mut rng, 4096));
    w("medium", &random_bytes(&mut rng, 100_000));
    w("big", &random_bytes(&mut rng, BIG_LEN));
    w("hard_a", &random_bytes(&mut rng, 1000));
    std::fs::hard_link(export.join("hard_a"), export.join("hard_b")).expect("link");
    std::os::unix::fs::symlink("big", export.join("sym")).expect("symlink");
    let fifo = cpath(&export.join("fifo"));
    // SAFETY: a valid C string.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o640) }, 0, "mkfifo");
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::File::create(export.join("sparse")).expect("create sparse");
        f.set_len(SPARSE_LEN).expect("set_len");
        f.write_all_at(&random_bytes(&mut rng, 4096), SPARSE_DATA_AT)
            .expect("write sparse");
    }
    std::fs::create_dir(export.join("many")).expect("mkdir many");
    for i in 0..MANY {
        std::fs::write(export.join("many").join(many_name(i)), b"").expect("write many");
    }
    std::fs::create_dir_all(export.join("sub/inner")).expect("mkdir sub");
    std::fs::write(export.join("sub/inner/file"), b"inner\n").expect("write inner");
    std::fs::create_dir(export.join("stale")).expect("mkdir stale");
    let modes = [
        ("small", Some(0o640)),
        ("page", Some(0o600)),
        ("medium", None),
        ("big", Some(0o604)),
        ("hard_a", Some(0o4755)),
        ("sym", None),
        ("fifo", None),
        ("sparse", None),
        ("many", Some(0o750)),
        ("sub", Some(0o1777)),
    ];
    for (name, mode) in modes {
        own(&export.join(name), mode);
        set_mtime(&export.join(name));
    }
    set_mtime(&export.join("empty"));
    set_mtime(export);
}

impl Fixture {
    fn new() -> Fixture {
        let tmp = tempfile::Builder::new()
            .prefix("morris-home-nfs-")
            .tempdir_in("/var/tmp")
            .expect("tempdir in /var/tmp");
        let export = tmp.path().join("export");
        make_tree(&export);
        let ganesha = Ganesha::start_new(&export, &tmp.path().join("ganesha"));
        Fixture {
            export,
            ganesha,
            _tmp: tmp,
        }
    }

    async fn home(&self) -> NfsHome {
        open(&self.ganesha, "", HomeOptions::default()).await
    }
}

async fn open(g: &Ganesha, subdir: &str, options: HomeOptions) -> NfsHome {
    let url = g.url_of(subdir);
    match NfsHome::open(url.clone(), options).await {
        Ok(h) => h,
        Err(e) => panic!("open {url}: {e}"),
    }
}

/// Asserts that home's attributes are `lstat`'s.
fn assert_like_lstat(what: &str, a: &HomeAttr, path: &Path) {
    let m = std::fs::symlink_metadata(path).expect("lstat");
    let ft = m.file_type();
    let kind = if ft.is_file() {
        HomeKind::File
    } else if ft.is_dir() {
        HomeKind::Dir
    } else if ft.is_symlink() {
        HomeKind::Symlink
    } else if ft.is_fifo() {
        HomeKind::Fifo
    } else if ft.is_socket() {
        HomeKind::Socket
    } else if ft.is_block_device() {
        HomeKind::BlockDev
    } else {
        HomeKind::CharDev
    };
    assert_eq!(a.kind, kind, "{what}: kind");
    assert_eq!(a.mode, m.mode() & 0o7777, "{what}: mode");
    assert_eq!(u64::from(a.nlink), m.nlink(), "{what}: nlink");
    assert_eq!((a.uid, a.gid), (m.uid(), m.gid()), "{what}: owner");
    assert_eq!(a.size, m.size(), "{what}: size");
    assert_eq!(
        (a.mtime.secs, i64::from(a.mtime.nsecs)),
        (m.mtime(), m.mtime_nsec()),
        "{what}: mtime"
    );
}

const TOP: [&str; 13] = [
    "empty", "small", "page", "medium", "big", "hard_a", "hard_b", "sym", "fifo", "sparse", "many",
    "sub", "stale",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attributes_equal_lstat() {
    let f = shared();
    let home = f.home().await;
    let (root, ra) = home.root().await.expect("root");
    assert_like_lstat("root", &ra, &f.export);
    assert_eq!((ra.uid, ra.gid), (0, 0));
    let mut same_ino = 0;
    for name in TOP.iter().filter(|n| **n != "stale") {
        let path = f.export.join(name);
        let (h, a) = home.lookup(&root, name.as_bytes()).await.expect(name);
        assert_like_lstat(name, &a, &path);
        let again = home.getattr(&h).await.expect("getattr");
        assert_like_lstat(name, &again, &path);
        assert_eq!(again.fileid, a.fileid);
        let ino = std::fs::symlink_metadata(&path).expect("lstat").ino();
        same_ino += usize::from(a.fileid == ino);
    }
    let (_, a) = home.lookup(&root, b"hard_a").await.expect("hard_a");
    let (_, b) = home.lookup(&root, b"hard_b").await.expect("hard_b");
    assert_eq!(a.fileid, b.fileid, "hard links share a fileid");
    assert_eq!((a.nlink, a.mode, a.uid, a.gid), (2, 0o4755, 1234, 5678));
    let (_, s) = home.lookup(&root, b"sparse").await.expect("sparse");
    assert!(s.used < s.size, "sparse: used {} < size {}", s.used, s.size);
    let (_, sym) = home.lookup(&root, b"sym").await.expect("sym");
    assert_eq!(sym.size, 3, "a symlink's size is its target's length");
    eprintln!(
        "fileid == st_ino for {same_ino} of {} objects",
        TOP.len() - 1
    );
}

/// The whole listing of `dir`, in pages of at most `max` entries, with
/// the verifier of the page each came in.
async fn list_all(
    home: &NfsHome,
    dir: &HomeHandle,
    max: usize,
    plus: bool,
) -> Vec<(HomeEntry, [u8; 8])> {
    let mut out: Vec<(HomeEntry, [u8; 8])> = Vec::new();
    let (mut cookie, mut verf) = (0, [0; 8]);
    for _ in 0..100_000 {
        let page = home
            .read_dir(dir, cookie, verf, max, plus)
            .await
            .expect("read_dir");
        assert!(page.entries.len() <= max, "page of {}", page.entries.len());
        assert!(
            page.eof || !page.entries.is_empty(),
            "empty page before eof"
        );
        verf = page.verifier;
        for e in page.entries {
            cookie = e.cookie;
            out.push((e, verf));
        }
        if page.eof {
            return out;
        }
    }
    panic!("listing does not end");
}

fn dir_names(path: &Path) -> BTreeSet<Vec<u8>> {
    std::fs::read_dir(path)
        .expect("read_dir")
        .map(|e| e.expect("entry").file_name().as_bytes().to_vec())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listings_in_small_pages_equal_the_directories() {
    let f = shared();
    let home = f.home().await;
    let (root, _) = home.root().await.expect("root");
    let (many, _) = home.lookup(&root, b"many").await.expect("many");
    for (dir, path, max) in [
        (&many, f.export.join("many"), 7),
        (&many, f.export.join("many"), 500),
        (&root, f.export.clone(), 1),
        (&root, f.export.clone(), 5),
    ] {
        for plus in [false, true] {
            let t0 = Instant::now();
            let list = list_all(&home, dir, max, plus).await;
            let names: Vec<Vec<u8>> = list.iter().map(|(e, _)| e.name.clone()).collect();
            let set: BTreeSet<Vec<u8>> = names.iter().cloned().collect();
            assert_eq!(set.len(), names.len(), "no name twice");
            let want = dir_names(&path);
            assert_eq!(set, want, "{path:?} max {max} plus {plus}");
            for (e, _) in &list {
                match (&e.plus, plus) {
                    (None, false) => {}
                    (Some((h, a)), true) => {
                        assert_eq!(a.fileid, e.fileid);
                        let again = home.getattr(h).await.expect("getattr of a plus handle");
                        assert_eq!(again.fileid, e.fileid);
                    }
                    (p, _) => panic!("{:?}: plus {} but asked {plus}", e.name, p.is_some()),
                }
            }
            eprintln!(
                "{} entries of {path:?} in pages of {max} (plus {plus}): {:?}",
                list.len(),
                t0.elapsed()
            );
            // Any cookie it gave goes on from there.
            if list.len() > 3 {
                let (e, verf) = &list[list.len() / 2];
                let page = home
                    .read_dir(dir, e.cookie, *verf, 2, plus)
                    .await
                    .expect("read_dir from a cookie");
                assert_eq!(page.entries[0].name, list[list.len() / 2 + 1].0.name);
            }
        }
    }
    let (small, _) = home.lookup(&root, b"small").await.expect("small");
    assert_eq!(
        home.read_dir(&small, 0, [0; 8], 10, false).await,
        Err(HomeError::NotDir)
    );
}

async fn read_all(home: &NfsHome, h: &HomeHandle, size: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(size);
    loop {
        let r = home
            .read(h, out.len() as u64, home.max_read())
            .await
            .expect("read");
        out.extend_from_slice(&r.data);
        if r.eof {
            return out;
        }
        assert!(
            !r.data.is_empty(),
            "an empty read before eof at {}",
            out.len()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_equal_the_bytes() {
    let f = shared();
    let home = Arc::new(f.home().await);
    assert!(home.max_read() >= 4096 && home.max_read() <= 1 << 20);
    eprintln!("max_read (ganesha's rtmax, capped): {}", home.max_read());
    let (root, _) = home.root().await.expect("root");
    for name in [
        "empty", "small", "page", "medium", "big", "hard_b", "sparse",
    ] {
        let want = std::fs::read(f.export.join(name)).expect("read fixture");
        let (h, _) = home.lookup(&root, name.as_bytes()).await.expect(name);
        let t0 = Instant::now();
        let got = read_all(&home, &h, want.len()).await;
        assert!(
            got == want,
            "{name}: {} bytes read, {} expected",
            got.len(),
            want.len()
        );
        eprintln!("{name}: {} bytes in {:?}", got.len(), t0.elapsed());
    }
    let big = Arc::new(std::fs::read(f.export.join("big")).expect("read big"));
    let (bh, _) = home.lookup(&root, b"big").await.expect("big");
    let check = |off: u64, len: u32, data: &[u8], eof: bool| {
        let start = (off as usize).min(big.len());
        let end = (start + len.min(home.max_read()) as usize).min(big.len());
        assert!(
            data == &big[start..end],
            "read {len} at {off}: {} bytes",
            data.len()
        );
        assert_eq!(eof, end == big.len(), "eof of a read of {len} at {off}");
    };
    let mut rng = StdRng::seed_from_u64(7);
    for _ in 0..200 {
        let off = rng.gen_range(0..big.len() as u64 + 100);
        let len = rng.gen_range(1..300_000u32);
        let r = home.read(&bh, off, len).await.expect("read");
        check(off, len, &r.data, r.eof);
    }
    // 64 reads at once, over the pool's connections.
    let t0 = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..64 {
        let (home, bh) = (home.clone(), bh.clone());
        let off = rng.gen_range(0..big.len() as u64);
        let len = rng.gen_range(1..1u32 << 20);
        tasks.push(tokio::spawn(async move {
            let r = home.read(&bh, off, len).await;
            (off, len, r)
        }));
    }
    for t in tasks {
        let (off, len, r) = t.await.expect("task");
        let r = r.expect("concurrent read");
        check(off, len, &r.data, r.eof);
    }
    eprintln!(
        "64 concurrent reads: {:?}; connections to ganesha now (all homes): {:?}",
        t0.elapsed(),
        client_ports(f.ganesha.port())
    );
    // Holes read as zeros.
    let (sh, _) = home.lookup(&root, b"sparse").await.expect("sparse");
    for off in [
        0,
        1 << 20,
        SPARSE_DATA_AT - 100,
        SPARSE_DATA_AT + 4096,
        SPARSE_LEN - 10,
    ] {
        let r = home.read(&sh, off, 100).await.expect("read sparse");
        assert_eq!(r.data.len() as u64, 100.min(SPARSE_LEN - off));
        assert!(r.data.iter().all(|&b| b == 0), "hole at {off}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn links_names_and_errors() {
    let f = shared();
    let home = f.home().await;
    let (root, _) = home.root().await.expect("root");
    let (sym, a) = home.lookup(&root, b"sym").await.expect("sym");
    assert_eq!(a.kind, HomeKind::Symlink);
    assert_eq!(home.read_link(&sym).await, Ok(b"big".to_vec()));
    let (small, _) = home.lookup(&root, b"small").await.expect("small");
    assert!(matches!(
        home.read_link(&small).await,
        Err(HomeError::Invalid(_))
    ));
    assert_eq!(home.lookup(&root, b"nope").await, Err(HomeError::NotFound));
    assert_eq!(home.lookup(&small, b"x").await, Err(HomeError::NotDir));
    for bad in [&b"."[..], b"..", b"a/b", b"a\0b", b""] {
        assert!(
            matches!(home.lookup(&root, bad).await, Err(HomeError::Invalid(_))),
            "{bad:?}"
        );
    }
    let (many, _) = home.lookup(&root, b"many").await.expect("many");
    assert_eq!(home.read(&many, 0, 10).await, Err(HomeError::IsDir));
    let (fifo, fa) = home.lookup(&root, b"fifo").await.expect("fifo");
    assert_eq!(fa.kind, HomeKind::Fifo);
    let _ = fifo;
    assert!(matches!(
        home.getattr(&HomeHandle(vec![0; 65])).await,
        Err(HomeError::Invalid(_))
    ));
    // A handle ganesha never made.
    let r = home.getattr(&HomeHandle(vec![0; root.0.len()])).await;
    assert!(matches!(r, Err(HomeError::Stale)), "forged handle: {r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handles_follow_renames_and_go_stale() {
    let f = shared();
    let home = f.home().await;
    let (root, _) = home.root().await.expect("root");
    let (dir, _) = home.lookup(&root, b"stale").await.expect("stale dir");
    let d = f.export.join("stale");
    std::fs::write(d.join("victim"), b"first").expect("write");
    let (h, a) = home.lookup(&dir, b"victim").await.expect("victim");
    std::fs::rename(d.join("victim"), d.join("renamed")).expect("rename");
    let after = home.getattr(&h).await.expect("getattr after rename");
    assert_eq!(
        after.fileid, a.fileid,
        "a handle names its object across renames"
    );
    assert_eq!(
        home.read(&h, 0, 100).await.expect("read").data.as_ref(),
        b"first"
    );
    std::fs::remove_file(d.join("renamed")).expect("remove");
    std::fs::write(d.join("renamed"), b"second").expect("recreate");
    let ino = std::fs::metadata(d.join("renamed")).expect("stat").ino();
    eprintln!("removed fileid {}, recreated ino {ino}", a.fileid);
    assert_eq!(
        home.getattr(&h).await,
        Err(HomeError::Stale),
        "getattr of the old handle"
    );
    assert_eq!(
        home.read(&h, 0, 100).await,
        Err(HomeError::Stale),
        "read of the old handle"
    );
    let (h2, _) = home.lookup(&dir, b"renamed").await.expect("the new file");
    assert_ne!(h2, h);
    assert_eq!(
        home.read(&h2, 0, 100).await.expect("read").data.as_ref(),
        b"second"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_errors_and_subdirs() {
    let f = shared();
    let g = &f.ganesha;
    let opts = HomeOptions {
        timeout: Duration::from_secs(2),
        ..HomeOptions::default()
    };
    let inner = open(g, "sub/inner", opts.clone()).await;
    let (root, ra) = inner.root().await.expect("root");
    assert_like_lstat("sub/inner", &ra, &f.export.join("sub/inner"));
    let (_, fa) = inner.lookup(&root, b"file").await.expect("file");
    assert_eq!(fa.size, 6);
    let err = |url: morris_home::HomeUrl| {
        let opts = opts.clone();
        async move {
            match NfsHome::open(url.clone(), opts).await {
                Ok(_) => panic!("open {url} succeeded"),
                Err(e) => e,
            }
        }
    };
    assert_eq!(err(g.url_of("no/such")).await, HomeError::NotFound);
    assert_eq!(err(g.url_of("small")).await, HomeError::NotDir);
    let morris_home::HomeUrl::Nfs {
        host,
        port,
        mount_port,
        ..
    } = g.url()
    else {
        panic!("not NFS")
    };
    let no_export = morris_home::HomeUrl::Nfs {
        host: host.clone(),
        port,
        mount_port,
        export: "/nope".into(),
        subdir: String::new(),
    };
    // ganesha answers MNT3ERR_ACCES for an export it does not have; the
    // export list tells that apart from a refusal.
    assert_eq!(err(no_export).await, HomeError::NotFound);
    // Nothing listens on a port just freed.
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port();
    let t0 = Instant::now();
    let e = err(morris_home::HomeUrl::Nfs {
        host,
        port: Some(dead),
        mount_port: Some(dead),
        export: "/export".into(),
        subdir: String::new(),
    })
    .await;
    assert_eq!(
        e,
        HomeError::Unreachable(format!("cannot reach 127.0.0.1:{dead}: connection refused"))
    );
    assert!(t0.elapsed() < Duration::from_secs(1), "refused at once");
}

/// Local ports of this host's established TCP connections to `port`.
fn client_ports(port: u16) -> Vec<u16> {
    let mut out = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let text = std::fs::read_to_string(table).unwrap_or_default();
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            let port_of = |a: &str| {
                a.rsplit(':')
                    .next()
                    .and_then(|p| u16::from_str_radix(p, 16).ok())
            };
            // Field 3 is the state: 01, established.
            if f.len() > 3 && f[3] == "01" && port_of(f[2]) == Some(port) {
                out.extend(port_of(f[1]));
            }
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn home_down_then_back() {
    let tmp = tempfile::Builder::new()
        .prefix("morris-home-nfs-down-")
        .tempdir_in("/var/tmp")
        .expect("tempdir");
    let export = tmp.path().join("export");
    std::fs::create_dir(&export).expect("mkdir");
    let data: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    std::fs::write(export.join("file"), &data).expect("write");
    let mut g = Ganesha::start_new(&export, &tmp.path().join("ganesha"));
    let timeout = Duration::from_secs(2);
    let home = Arc::new(
        open(
            &g,
            "",
            HomeOptions {
                timeout,
                parallel: 4,
                ..HomeOptions::default()
            },
        )
        .await,
    );
    let (root, _) = home.root().await.expect("root");
    let (fh, _) = home.lookup(&root, b"file").await.expect("file");
    // Fill the pool with connections, which the server's end will break.
    let mut tasks = Vec::new();
    for i in 0..4u64 {
        let (home, fh) = (home.clone(), fh.clone());
        tasks.push(tokio::spawn(
            async move { home.read(&fh, i * 1000, 1000).await },
        ));
    }
    for t in tasks {
        t.await.expect("task").expect("read while up");
    }
    // As root, from reserved ports; never more connections than `parallel`.
    let ports = client_ports(g.port());
    eprintln!("source ports of the connections to ganesha: {ports:?}");
    assert!(!ports.is_empty() && ports.len() <= 4, "{ports:?}");
    assert!(ports.iter().all(|&p| p < 1024), "reserved ports: {ports:?}");

    g.stop();
    for op in ["getattr", "read"] {
        let t0 = Instant::now();
        let r = match op {
            "getattr" => home.getattr(&fh).await.map(|_| ()),
            _ => home.read(&fh, 0, 10).await.map(|_| ()),
        };
        let took = t0.elapsed();
        assert!(
            matches!(&r, Err(HomeError::Unreachable(_))),
            "{op} with ganesha down: {r:?}"
        );
        assert!(
            took <= timeout + Duration::from_secs(1),
            "{op} took {took:?}"
        );
        eprintln!("{op} with ganesha down: {r:?} after {took:?}");
    }

    g.start();
    let t0 = Instant::now();
    let a = home
        .getattr(&fh)
        .await
        .expect("getattr once ganesha is back");
    assert_eq!(a.size, data.len() as u64);
    let r = home.read(&fh, 1000, 5000).await.expect("read once back");
    assert!(r.data.as_ref() == &data[1000..6000]);
    let (_, again) = home.root().await.expect("root once back");
    assert_eq!(again.kind, HomeKind::Dir);
    eprintln!("answered again {:?} after ganesha was back", t0.elapsed());
    g.stop();
}

/// A fresh export with its own ganesha, for tests that change it.
fn writable(prefix: &str) -> (tempfile::TempDir, PathBuf, Ganesha) {
    let tmp = tempfile::Builder::new()
        .prefix(prefix)
        .tempdir_in("/var/tmp")
        .expect("tempdir in /var/tmp");
    let export = tmp.path().join("export");
    std::fs::create_dir(&export).expect("mkdir export");
    let g = Ganesha::start_new(&export, &tmp.path().join("ganesha"));
    (tmp, export, g)
}

fn time(secs: i64, nsecs: u32) -> HomeTime {
    HomeTime { secs, nsecs }
}

/// Asserts that `path`'s `lstat` shows what `set` asked (mode, owner,
/// size, times where set) and what home answered (`a`).
fn assert_set(what: &str, set: &HomeSetAttr, a: &HomeAttr, path: &Path) {
    assert_like_lstat(what, a, path);
    let m = std::fs::symlink_metadata(path).expect("lstat");
    if let Some(mode) = set.mode {
        if !m.file_type().is_symlink() {
            assert_eq!(m.mode() & 0o7777, mode, "{what}: mode on disk");
        }
    }
    if let Some(uid) = set.uid {
        assert_eq!(m.uid(), uid, "{what}: uid on disk");
    }
    if let Some(gid) = set.gid {
        assert_eq!(m.gid(), gid, "{what}: gid on disk");
    }
    if let Some(size) = set.size {
        assert_eq!(m.size(), size, "{what}: size on disk");
    }
    if m.file_type().is_symlink() {
        // ganesha 4.3 (FSAL VFS) neither takes a symlink's times from
        // SYMLINK's attributes nor sets them by SETATTR (which it answers
        // NFS3_OK, the times unchanged): all a caller can rely on is that
        // the attributes home returns say so, as assert_like_lstat checks.
        if set.mtime.is_some_and(|t| t != a.mtime) {
            eprintln!("{what}: ganesha left a symlink's times as they were");
        }
        return;
    }
    if let Some(t) = set.atime {
        assert_eq!(
            (m.atime(), m.atime_nsec()),
            (t.secs, i64::from(t.nsecs)),
            "{what}: atime on disk"
        );
        assert_eq!(a.atime, t, "{what}: atime at home");
    }
    if let Some(t) = set.mtime {
        assert_eq!(
            (m.mtime(), m.mtime_nsec()),
            (t.secs, i64::from(t.nsecs)),
            "{what}: mtime on disk"
        );
    }
}

/// Writes all of `data` at `offset`, in pieces of at most `max_write`,
/// writing again what home did not take.
async fn write_all(home: &NfsHome, h: &HomeHandle, offset: u64, data: &[u8]) {
    let mut done = 0;
    while done < data.len() {
        let end = (done + home.max_write() as usize).min(data.len());
        let piece = Bytes::copy_from_slice(&data[done..end]);
        let n = home
            .write(h, offset + done as u64, piece)
            .await
            .expect("write");
        assert!(n > 0 && n as usize <= end - done, "took {n}");
        done += n as usize;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn creates_writes_and_setattrs_land_on_disk() {
    let (_tmp, export, g) = writable("morris-home-nfs-write-");
    let home = open(&g, "", HomeOptions::default()).await;
    let mw = home.max_write();
    eprintln!("max_write (ganesha's wtmax, capped): {mw}");
    assert!((4096..=1 << 20).contains(&mw), "max_write {mw}");
    let (root, _) = home.root().await.expect("root");

    // A file, with everything set at once, set-uid included (which a chown
    // after the chmod would clear).
    let set = HomeSetAttr {
        mode: Some(0o4750),
        uid: Some(1234),
        gid: Some(5678),
        size: Some(10),
        atime: Some(time(1_500_000_000, 111_222_333)),
        mtime: Some(time(1_600_000_000, 444_555_666)),
    };
    let (fh, fa) = home
        .create(&root, b"file", &HomeNew::File, &set)
        .await
        .expect("create file");
    assert_eq!(fa.kind, HomeKind::File);
    assert_set("new file", &set, &fa, &export.join("file"));
    assert_eq!(
        std::fs::read(export.join("file")).expect("read"),
        vec![0; 10]
    );
    let (again, _) = home.lookup(&root, b"file").await.expect("lookup");
    assert_eq!(again, fh, "the handle create returns is LOOKUP's");

    // Write, commit, read back (through home and on disk).
    let mut rng = StdRng::seed_from_u64(11);
    let data = random_bytes(&mut rng, 3 * mw as usize + 1234);
    write_all(&home, &fh, 0, &data).await;
    write_all(&home, &fh, data.len() as u64 + 100, b"tail").await;
    home.commit(&fh).await.expect("commit");
    let mut want = data.clone();
    want.extend_from_slice(&[0; 100]);
    want.extend_from_slice(b"tail");
    assert!(read_all(&home, &fh, want.len()).await == want, "read back");
    assert!(
        std::fs::read(export.join("file")).expect("read") == want,
        "on disk"
    );
    assert_eq!(
        home.write(&fh, 0, Bytes::from(vec![0; mw as usize + 1]))
            .await,
        Err(HomeError::Invalid(format!(
            "a write of {} bytes (home takes at most {mw} at once)",
            mw + 1
        )))
    );

    // setattr: owner, mode, times and size, alone and together.
    let steps = [
        HomeSetAttr {
            size: Some(5000),
            ..HomeSetAttr::default()
        },
        HomeSetAttr {
            uid: Some(4321),
            gid: Some(8765),
            ..HomeSetAttr::default()
        },
        HomeSetAttr {
            mode: Some(0o2640),
            ..HomeSetAttr::default()
        },
        HomeSetAttr {
            mode: Some(0o6755),
            uid: Some(1),
            gid: Some(2),
            size: Some(7),
            atime: Some(time(1_000_000_000, 1)),
            mtime: Some(time(1_100_000_000, 999_999_999)),
        },
        HomeSetAttr {
            atime: Some(time(0, 0)),
            mtime: Some(time(u32::MAX.into(), 5)),
            ..HomeSetAttr::default()
        },
    ];
    for (i, set) in steps.iter().enumerate() {
        let a = home.setattr(&fh, set).await.expect("setattr");
        assert_set(&format!("setattr {i}"), set, &a, &export.join("file"));
    }
    assert_eq!(std::fs::read(export.join("file")).expect("read"), data[..7]);
    assert!(matches!(
        home.setattr(
            &fh,
            &HomeSetAttr {
                mtime: Some(time(-1, 0)),
                ..HomeSetAttr::default()
            }
        )
        .await,
        Err(HomeError::Invalid(_))
    ));

    // Every other kind, with owner, mode and times.
    let set = |mode| HomeSetAttr {
        mode: Some(mode),
        uid: Some(1234),
        gid: Some(5678),
        size: None,
        atime: Some(time(1_400_000_000, 5)),
        mtime: Some(time(1_450_000_000, 123_456_789)),
    };
    let kinds = [
        ("dir", HomeNew::Dir, HomeKind::Dir, 0o3750),
        (
            "sym",
            HomeNew::Symlink(b"some/where".to_vec()),
            HomeKind::Symlink,
            0o600,
        ),
        (
            "chr",
            HomeNew::Device(HomeKind::CharDev, (1, 3)),
            HomeKind::CharDev,
            0o620,
        ),
        (
            "blk",
            HomeNew::Device(HomeKind::BlockDev, (7, 42)),
            HomeKind::BlockDev,
            0o660,
        ),
        ("fifo", HomeNew::Fifo, HomeKind::Fifo, 0o640),
        ("sock", HomeNew::Socket, HomeKind::Socket, 0o755),
    ];
    for (name, what, kind, mode) in &kinds {
        let set = set(*mode);
        let (h, a) = home
            .create(&root, name.as_bytes(), what, &set)
            .await
            .unwrap_or_else(|e| panic!("create {name}: {e}"));
        assert_eq!(a.kind, *kind, "{name}");
        assert_set(name, &set, &a, &export.join(name));
        let (again, _) = home.lookup(&root, name.as_bytes()).await.expect(name);
        assert_eq!(again, h, "{name}: handle");
        let m = std::fs::symlink_metadata(export.join(name)).expect("lstat");
        if let HomeNew::Device(_, (major, minor)) = what {
            assert_eq!(a.rdev, (*major, *minor), "{name}: rdev at home");
            let rdev = m.rdev();
            assert_eq!(
                (libc::major(rdev), libc::minor(rdev)),
                (*major, *minor),
                "{name}: rdev on disk"
            );
        }
    }
    assert_eq!(
        std::fs::read_link(export.join("sym")).expect("readlink"),
        Path::new("some/where")
    );
    // A symlink's mode is left as it is; the rest is set.
    let (sym, _) = home.lookup(&root, b"sym").await.expect("sym");
    let set = HomeSetAttr {
        mode: Some(0o600),
        uid: Some(99),
        mtime: Some(time(1_234_567_890, 0)),
        ..HomeSetAttr::default()
    };
    let a = home
        .setattr(&sym, &set)
        .await
        .expect("setattr of a symlink");
    assert_eq!(a.mode, 0o777);
    assert_set("setattr of sym", &set, &a, &export.join("sym"));

    // Link, rename, remove, rmdir.
    let (dir, _) = home.lookup(&root, b"dir").await.expect("dir");
    let (lh, la) = home.link(&fh, &dir, b"hard").await.expect("link");
    assert_eq!(lh, fh, "a link's handle is its target's");
    assert_eq!(la.nlink, 2);
    assert_eq!(
        std::fs::metadata(export.join("dir/hard"))
            .expect("stat")
            .ino(),
        std::fs::metadata(export.join("file")).expect("stat").ino()
    );
    home.rename(&root, b"file", &dir, b"moved")
        .await
        .expect("rename");
    assert!(!export.join("file").exists());
    assert_eq!(home.getattr(&fh).await.expect("getattr").nlink, 2);
    // Over a file: replaced.
    home.create(&root, b"other", &HomeNew::File, &HomeSetAttr::default())
        .await
        .expect("create other");
    home.rename(&root, b"other", &dir, b"hard")
        .await
        .expect("rename over a file");
    assert_eq!(home.getattr(&fh).await.expect("getattr").nlink, 1);
    assert_eq!(
        dir_names(&export.join("dir")),
        BTreeSet::from([b"hard".to_vec(), b"moved".to_vec()])
    );
    home.remove(&dir, b"moved").await.expect("remove");
    assert_eq!(home.getattr(&fh).await, Err(HomeError::Stale));
    home.remove(&dir, b"hard").await.expect("remove");
    for name in ["sym", "chr", "blk", "fifo", "sock"] {
        home.remove(&root, name.as_bytes()).await.expect(name);
    }
    home.rmdir(&root, b"dir").await.expect("rmdir");
    assert!(dir_names(&export).is_empty(), "{:?}", dir_names(&export));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_errors_say_why() {
    let (_tmp, export, g) = writable("morris-home-nfs-errors-");
    let home = open(&g, "", HomeOptions::default()).await;
    let (root, _) = home.root().await.expect("root");
    let none = HomeSetAttr::default();
    let (fh, _) = home
        .create(&root, b"file", &HomeNew::File, &none)
        .await
        .expect("create");
    std::fs::write(export.join("file"), b"kept").expect("write");
    let (dir, _) = home
        .create(&root, b"dir", &HomeNew::Dir, &none)
        .await
        .expect("mkdir");
    home.create(&dir, b"inside", &HomeNew::Fifo, &none)
        .await
        .expect("mkfifo");
    home.create(&root, b"empty", &HomeNew::Dir, &none)
        .await
        .expect("mkdir");
    // A create over an existing name never replaces it.
    for what in [
        HomeNew::File,
        HomeNew::Dir,
        HomeNew::Symlink(b"x".to_vec()),
        HomeNew::Fifo,
        HomeNew::Socket,
        HomeNew::Device(HomeKind::CharDev, (1, 3)),
    ] {
        for name in [&b"file"[..], b"dir"] {
            assert_eq!(
                home.create(&root, name, &what, &none).await,
                Err(HomeError::Exists),
                "{what:?} over {}",
                String::from_utf8_lossy(name)
            );
        }
    }
    assert_eq!(
        std::fs::read(export.join("file")).expect("read"),
        b"kept",
        "untouched"
    );
    assert_eq!(
        home.link(&fh, &dir, b"inside").await,
        Err(HomeError::Exists)
    );
    assert_eq!(home.rmdir(&root, b"dir").await, Err(HomeError::NotEmpty));
    assert_eq!(
        home.rename(&root, b"empty", &root, b"dir").await,
        Err(HomeError::NotEmpty)
    );
    assert_eq!(home.remove(&root, b"nope").await, Err(HomeError::NotFound));
    assert_eq!(home.rmdir(&root, b"nope").await, Err(HomeError::NotFound));
    assert_eq!(
        home.rename(&root, b"nope", &root, b"x").await,
        Err(HomeError::NotFound)
    );
    assert_eq!(home.rmdir(&root, b"file").await, Err(HomeError::NotDir));
    assert_eq!(
        home.create(&fh, b"x", &HomeNew::File, &none).await,
        Err(HomeError::NotDir)
    );
    assert_eq!(home.remove(&root, b"empty").await, Err(HomeError::IsDir));
    assert!(export.join("empty").is_dir());
    // ganesha answers NFS3ERR_BADTYPE.
    assert_eq!(
        home.link(&dir, &root, b"dirlink").await,
        Err(HomeError::Invalid("LINK: NFS3ERR_BADTYPE".into()))
    );
    for bad in [&b""[..], b".", b"..", b"a/b", b"a\0"] {
        assert!(
            matches!(
                home.create(&root, bad, &HomeNew::File, &none).await,
                Err(HomeError::Invalid(_))
            ),
            "{bad:?}"
        );
        assert!(matches!(
            home.remove(&root, bad).await,
            Err(HomeError::Invalid(_))
        ));
    }
    assert!(matches!(
        home.create(&root, b"s", &HomeNew::Symlink(vec![]), &none)
            .await,
        Err(HomeError::Invalid(_))
    ));
    assert!(matches!(
        home.create(
            &root,
            b"d",
            &HomeNew::Dir,
            &HomeSetAttr {
                size: Some(1),
                ..none.clone()
            }
        )
        .await,
        Err(HomeError::Invalid(_))
    ));
    assert!(matches!(
        home.create(&root, b"d", &HomeNew::Device(HomeKind::Fifo, (0, 0)), &none)
            .await,
        Err(HomeError::Invalid(_))
    ));
    assert!(!export.join("s").exists() && !export.join("d").exists());
    // A removed file's handle is stale.
    home.remove(&root, b"file").await.expect("remove");
    assert_eq!(
        home.setattr(
            &fh,
            &HomeSetAttr {
                mode: Some(0o600),
                ..none.clone()
            }
        )
        .await,
        Err(HomeError::Stale)
    );
    assert_eq!(
        home.write(&fh, 0, Bytes::from_static(b"x")).await,
        Err(HomeError::Stale)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commit_after_a_restart_asks_to_write_again() {
    let (_tmp, export, mut g) = writable("morris-home-nfs-restart-");
    let home = open(&g, "", HomeOptions::default()).await;
    let (root, _) = home.root().await.expect("root");
    let (fh, _) = home
        .create(&root, b"file", &HomeNew::File, &HomeSetAttr::default())
        .await
        .expect("create");
    // Nothing written: a commit has nothing to lose.
    home.commit(&fh).await.expect("commit of nothing");
    write_all(&home, &fh, 0, b"before the restart").await;
    home.commit(&fh).await.expect("commit");

    write_all(&home, &fh, 0, b"lost?! ").await;
    // ganesha's write verifier is the second it started at (its first 4
    // bytes, little-endian; the rest zeros): a restart within the same
    // second keeps it, and a commit then succeeds though the server may
    // have lost the writes (seen: a restart takes ganesha under 0.5 s).
    // Restart it in a later second, as any real restart is.
    g.stop();
    tokio::time::sleep(Duration::from_millis(1100)).await;
    g.start();
    let r = home.commit(&fh).await;
    eprintln!("COMMIT after a restart: {r:?}");
    assert_eq!(
        r,
        Err(HomeError::Io(
            "home restarted before the writes since the last commit were durable \
             (COMMIT's write verifier changed): write again"
                .into()
        ))
    );
    // Written again, committed: fine (and the error is not sticky).
    write_all(&home, &fh, 0, b"again! ").await;
    home.commit(&fh).await.expect("commit after writing again");
    home.commit(&fh).await.expect("commit once more");
    assert_eq!(
        std::fs::read(export.join("file")).expect("read"),
        b"again! the restart"
    );
    // A restart with nothing written since the last commit loses nothing.
    g.stop();
    tokio::time::sleep(Duration::from_millis(1100)).await;
    g.start();
    home.commit(&fh)
        .await
        .expect("commit after a restart, nothing written");
}

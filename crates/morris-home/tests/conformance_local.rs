//! `LocalHome` against the conformance suite, and what only a local home
//! can be asked: inode and device numbers, fifos and devices that are never
//! opened, symlinks swapped in at home, a hung mount, a directory of 100,000
//! entries.

mod common;

use std::fs;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use morris_home::{Home, HomeError, HomeHandle, HomeKind, HomeOptions, HomeUrl};

use common::{build_tree, conformance, walk};

fn tempdir() -> tempfile::TempDir {
    match tempfile::Builder::new()
        .prefix("morris-home-")
        .tempdir_in("/var/tmp")
    {
        Ok(d) => d,
        Err(e) => panic!("tempdir in /var/tmp: {e}"),
    }
}

async fn local_with(root: &Path, options: HomeOptions) -> Arc<dyn Home> {
    let url = HomeUrl::Local {
        path: root.to_path_buf(),
    };
    match morris_home::open(&url, options).await {
        Ok(h) => h,
        Err(e) => panic!("open {url}: {e}"),
    }
}

async fn local(root: &Path) -> Arc<dyn Home> {
    local_with(root, HomeOptions::default()).await
}

fn must<T, E: std::fmt::Display>(r: Result<T, E>, what: &str) -> T {
    match r {
        Ok(v) => v,
        Err(e) => panic!("{what}: {e}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_home_passes_the_conformance_suite() {
    let dir = tempdir();
    let t = Instant::now();
    let tree = build_tree(dir.path());
    eprintln!("fixture built in {:?}", t.elapsed());
    let home = local(dir.path()).await;
    conformance(home.clone(), &tree).await;
    // And once more on the same tree: the suite leaves it as it found it.
    conformance(home, &tree).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_fileids_and_fsids_are_inode_and_device_numbers() {
    let dir = tempdir();
    let tree = build_tree(dir.path());
    let home = local(dir.path()).await;
    for rel in tree.all.iter().filter(|r| !r.starts_with(b"many/")) {
        let (h, a) = walk(home.as_ref(), rel).await;
        let m = tree.lstat(rel);
        assert_eq!(a.fileid, m.ino(), "{}", common::show(rel));
        assert_eq!(a.fsid, m.dev(), "{}", common::show(rel));
        assert_eq!(a.used, m.blocks() * 512, "{}", common::show(rel));
        assert_eq!(
            h.0[..8],
            m.ino().to_le_bytes(),
            "handle starts with the inode"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_regular_files_are_read_and_a_fifo_never_blocks() {
    let dir = tempdir();
    let tree = build_tree(dir.path());
    let home = local_with(
        dir.path(),
        HomeOptions {
            timeout: Duration::from_secs(2),
            ..HomeOptions::default()
        },
    )
    .await;
    for rel in [&tree.fifo, &tree.chardev] {
        let (h, a) = walk(home.as_ref(), rel).await;
        assert!(matches!(a.kind, HomeKind::Fifo | HomeKind::CharDev));
        let t = Instant::now();
        match home.read(&h, 0, 10).await {
            Err(HomeError::Invalid(msg)) => assert!(msg.contains("only regular files"), "{msg}"),
            r => panic!("read of {}: {r:?}", common::show(rel)),
        }
        assert!(t.elapsed() < Duration::from_secs(1), "refused up front");
        assert!(matches!(
            home.read_link(&h).await,
            Err(HomeError::Invalid(_))
        ));
    }
    let (h, _) = walk(home.as_ref(), b"a").await;
    assert_eq!(home.read(&h, 0, 1).await, Err(HomeError::IsDir));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_symlink_swapped_in_at_home_is_never_followed() {
    let dir = tempdir();
    let outside = tempdir();
    let root = dir.path();
    must(fs::create_dir_all(root.join("d/sub")), "mkdir");
    must(fs::write(root.join("d/sub/file"), b"inside"), "write");
    must(
        std::os::unix::fs::symlink("/", root.join("escape")),
        "symlink",
    );
    let home = local(root).await;
    let (file, _) = walk(home.as_ref(), b"d/sub/file").await;
    let (sub, _) = walk(home.as_ref(), b"d/sub").await;

    // A symlink is looked up as itself, and is no directory.
    let (esc, a) = walk(home.as_ref(), b"escape").await;
    assert_eq!(a.kind, HomeKind::Symlink);
    assert_eq!(
        home.lookup(&esc, b"etc").await.map(|_| ()),
        Err(HomeError::NotDir)
    );
    assert!(matches!(
        home.read_dir(&esc, 0, [0; 8], 10, false).await,
        Err(HomeError::NotDir)
    ));

    // The same directory, now reached through a symlink inside the home.
    must(
        fs::rename(root.join("d/sub"), root.join("d/sub2")),
        "rename",
    );
    must(
        std::os::unix::fs::symlink("sub2", root.join("d/sub")),
        "symlink",
    );
    assert_eq!(home.getattr(&file).await, Err(HomeError::Stale));
    assert_eq!(home.read(&file, 0, 10).await, Err(HomeError::Stale));
    assert_eq!(home.getattr(&sub).await, Err(HomeError::Stale));

    // The same directory moved out of the home, reached through a symlink.
    must(fs::remove_file(root.join("d/sub")), "rm");
    let out = outside.path().join("sub");
    must(fs::rename(root.join("d/sub2"), &out), "rename out");
    must(
        std::os::unix::fs::symlink(&out, root.join("d/sub")),
        "symlink",
    );
    assert_eq!(home.getattr(&file).await, Err(HomeError::Stale));
    assert_eq!(home.read(&file, 0, 10).await, Err(HomeError::Stale));
    assert_eq!(
        home.read_dir(&sub, 0, [0; 8], 10, true).await,
        Err(HomeError::Stale)
    );

    // Moved back: the handles work again (the same objects at their paths).
    must(fs::remove_file(root.join("d/sub")), "rm");
    must(fs::rename(&out, root.join("d/sub")), "rename back");
    let r = must(home.read(&file, 0, 10).await, "read");
    assert_eq!(&r.data[..], b"inside");
    assert!(r.eof);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn junk_handles_are_stale_and_bad_names_invalid() {
    let dir = tempdir();
    must(fs::write(dir.path().join("f"), b"x"), "write");
    let home = local(dir.path()).await;
    let (root, _) = must(home.root().await, "root");
    let (f, _) = must(home.lookup(&root, b"f").await, "lookup");
    let head = &f.0[..f.0.len() - 1];
    for junk in [
        Vec::new(),
        vec![1, 2, 3],
        [head, b"/f"].concat(),
        [head, b"../f"].concat(),
        [head, b"f/"].concat(),
        [head, b"g"].concat(),
        [&root.0[..], b".."].concat(),
    ] {
        let h = HomeHandle(junk);
        assert_eq!(home.getattr(&h).await, Err(HomeError::Stale), "{h:?}");
        assert_eq!(home.read(&h, 0, 1).await, Err(HomeError::Stale), "{h:?}");
    }
    for name in [&b""[..], b".", b"..", b"a/b", b"/", b"a\0b"] {
        match home.lookup(&root, name).await {
            Err(HomeError::Invalid(_)) => {}
            r => panic!("lookup {name:?}: {r:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_refuses_a_missing_home_or_a_file_and_replaced_homes_go_stale() {
    let dir = tempdir();
    let file = dir.path().join("file");
    must(fs::write(&file, b"x"), "write");
    for (path, why) in [
        (dir.path().join("missing"), "does not exist"),
        (file, "not a directory"),
    ] {
        let url = HomeUrl::Local { path };
        match morris_home::open(&url, HomeOptions::default()).await {
            Err(HomeError::Invalid(msg)) => assert!(msg.contains(why), "{msg}"),
            Err(e) => panic!("open {url}: {e}"),
            Ok(_) => panic!("open {url} worked"),
        }
    }
    let root = dir.path().join("home");
    must(fs::create_dir(&root), "mkdir");
    let home = local(&root).await;
    let (old, _) = must(home.root().await, "root");
    must(fs::rename(&root, dir.path().join("old-home")), "rename");
    assert!(matches!(home.root().await, Err(HomeError::Unreachable(_))));
    must(fs::create_dir(&root), "mkdir");
    assert_eq!(home.getattr(&old).await, Err(HomeError::Stale));
    let (new, _) = must(home.root().await, "root");
    assert_ne!(new, old);
}

/// A FUSE mount whose server never answers (not even the kernel's INIT):
/// every call that reaches it blocks until the connection is aborted, which
/// dropping this does (closing /dev/fuse), before unmounting.
struct HungMount {
    at: PathBuf,
    dev: Option<OwnedFd>,
}

impl HungMount {
    fn new(at: &Path) -> Self {
        let dev = must(
            rustix::fs::open(
                "/dev/fuse",
                rustix::fs::OFlags::RDWR | rustix::fs::OFlags::CLOEXEC,
                rustix::fs::Mode::empty(),
            ),
            "open /dev/fuse (the test must run as root, with FUSE)",
        );
        let opts = format!(
            "fd={},rootmode=40000,user_id=0,group_id=0\0",
            dev.as_raw_fd()
        );
        let target = must(
            std::ffi::CString::new(at.as_os_str().as_bytes()),
            "mount point",
        );
        // SAFETY: every pointer is to a NUL-terminated string that lives
        // across the call.
        let rc = unsafe {
            libc::mount(
                c"morris-hung".as_ptr(),
                target.as_ptr(),
                c"fuse.morris-hung".as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV,
                opts.as_ptr().cast(),
            )
        };
        if rc != 0 {
            panic!(
                "mount fuse at {}: {} (the test must run as root, with FUSE)",
                at.display(),
                std::io::Error::last_os_error()
            );
        }
        HungMount {
            at: at.to_path_buf(),
            dev: Some(dev),
        }
    }

    /// Aborts the connection: every blocked call returns (ENOTCONN).
    fn abort(&mut self) {
        self.dev = None;
    }
}

impl Drop for HungMount {
    fn drop(&mut self) {
        self.abort();
        if let Ok(target) = std::ffi::CString::new(self.at.as_os_str().as_bytes()) {
            // SAFETY: a NUL-terminated path that lives across the call.
            unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_mount_below_the_home_answers_unreachable_in_time() {
    let dir = tempdir();
    let mnt = dir.path().join("mnt");
    must(fs::create_dir(&mnt), "mkdir");
    must(fs::write(dir.path().join("f"), b"fine"), "write");
    let timeout = Duration::from_millis(300);
    let options = HomeOptions {
        timeout,
        parallel: 2,
        ..HomeOptions::default()
    };
    let mut hung = HungMount::new(&mnt);

    // The hung mount as the home itself.
    let t = Instant::now();
    let url = HomeUrl::Local { path: mnt.clone() };
    match morris_home::open(&url, options.clone()).await {
        Err(HomeError::Unreachable(msg)) => {
            assert!(msg.contains("in 0.3s"), "{msg}");
            eprintln!("open of a hung mount: {msg}, after {:?}", t.elapsed());
        }
        r => panic!("open of a hung mount: {:?}", r.map(|_| ())),
    }
    assert!(t.elapsed() < Duration::from_secs(3));

    // The hung mount below the home.
    let home = local_with(dir.path(), options).await;
    let (root, _) = must(home.root().await, "root");
    let t = Instant::now();
    match home.lookup(&root, b"mnt").await {
        Err(HomeError::Unreachable(msg)) => {
            assert!(msg.contains("/mnt in 0.3s"), "{msg}");
            eprintln!("lookup in a hung mount: {msg}, after {:?}", t.elapsed());
        }
        r => panic!("lookup of a hung mount: {r:?}"),
    }
    assert!(t.elapsed() < Duration::from_secs(3));
    // A second stuck call takes the last thread: now every call waits for
    // a thread, and is bounded too.
    assert!(matches!(
        home.lookup(&root, b"mnt").await,
        Err(HomeError::Unreachable(_))
    ));
    let t = Instant::now();
    assert!(matches!(home.root().await, Err(HomeError::Unreachable(_))));
    assert!(t.elapsed() < Duration::from_secs(3));

    // Once the mount answers (here: fails), the home works again.
    hung.abort();
    let mut back = false;
    for _ in 0..100 {
        if let Ok((_, a)) = home.lookup(&root, b"f").await {
            assert_eq!(a.size, 4);
            back = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        back,
        "the home did not come back after the mount was aborted"
    );
    drop(hung);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_directory_of_100_000_entries_pages_in_linear_time() {
    const N: usize = 100_000;
    let dir = tempdir();
    let big = dir.path().join("big");
    must(fs::create_dir(&big), "mkdir");
    let t = Instant::now();
    for i in 0..N {
        must(fs::File::create(big.join(format!("{i:06}"))), "create");
    }
    eprintln!("100,000 files made in {:?}", t.elapsed());
    let home = local(dir.path()).await;
    let (h, _) = walk(home.as_ref(), b"big").await;
    for (max, plus) in [(1000, false), (100, false), (1000, true)] {
        let t = Instant::now();
        let mut seen = std::collections::HashSet::new();
        let (mut cookie, mut verifier) = (0, [0; 8]);
        let (mut pages, mut first) = (0, Duration::ZERO);
        let mut last;
        loop {
            let tp = Instant::now();
            let page = must(
                home.read_dir(&h, cookie, verifier, max, plus).await,
                "read_dir",
            );
            let took = tp.elapsed();
            if pages == 0 {
                first = took;
            }
            last = took;
            pages += 1;
            for e in &page.entries {
                assert!(seen.insert(e.name.clone()), "listed twice");
            }
            if let Some(e) = page.entries.last() {
                cookie = e.cookie;
            }
            verifier = page.verifier;
            if page.eof {
                break;
            }
        }
        assert_eq!(seen.len(), N);
        eprintln!(
            "100,000 entries in {pages} pages of {max} (plus {plus}): {:?}; first page {first:?}, last page {last:?}",
            t.elapsed()
        );
    }
}

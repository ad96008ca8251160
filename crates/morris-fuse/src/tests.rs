//! Mount mechanics against the real kernel, with a stand-in file system (the
//! morris client is exercised end to end by the CLI's tests). Needs root and
//! /dev/fuse; skipped otherwise.

use std::ffi::OsStr;
use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Instant, UNIX_EPOCH};

use fuser::{
    Errno, FileAttr, FileHandle, FileType, INodeNo, KernelConfig, ReplyAttr, ReplyEntry, Request,
};
use morris_client::Invalidator;

use super::*;

/// A file system with a root directory and one 8 MiB file `f` (inode 2);
/// counts root getattrs and records the largest read and write requests.
struct RootOnly {
    getattrs: Arc<AtomicUsize>,
    lookups: Arc<AtomicUsize>,
    largest_read: Arc<AtomicUsize>,
    largest_write: Arc<AtomicUsize>,
}

const FILE_SIZE: u64 = 8 << 20;

fn attr(ino: INodeNo) -> FileAttr {
    let dir = ino == INodeNo(1);
    FileAttr {
        ino,
        size: if dir { 0 } else { FILE_SIZE },
        blocks: 0,
        atime: UNIX_EPOCH,
        mtime: UNIX_EPOCH,
        ctime: UNIX_EPOCH,
        crtime: UNIX_EPOCH,
        kind: if dir {
            FileType::Directory
        } else {
            FileType::RegularFile
        },
        perm: if dir { 0o751 } else { 0o666 },
        nlink: if dir { 2 } else { 1 },
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: 4096,
        flags: 0,
    }
}

impl Filesystem for RootOnly {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> io::Result<()> {
        fs::configure(config, true);
        Ok(())
    }

    fn lookup(&self, _req: &Request, _parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        if name != "f" {
            return reply.error(Errno::ENOENT);
        }
        self.lookups.fetch_add(1, Ordering::SeqCst);
        reply.entry(
            &Duration::from_secs(3600),
            &attr(INodeNo(2)),
            fuser::Generation(0),
        );
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match ino.0 {
            1 => {
                self.getattrs.fetch_add(1, Ordering::SeqCst);
            }
            2 => {}
            _ => return reply.error(Errno::ENOENT),
        }
        // A long TTL: only an invalidation makes the kernel ask again.
        reply.attr(&Duration::from_secs(3600), &attr(ino));
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: fuser::OpenFlags,
        _lock_owner: Option<fuser::LockOwner>,
        reply: fuser::ReplyData,
    ) {
        self.largest_read.fetch_max(size as usize, Ordering::SeqCst);
        let n = FILE_SIZE.saturating_sub(offset).min(u64::from(size));
        reply.data(&vec![7u8; n as usize]);
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _offset: u64,
        data: &[u8],
        _write_flags: fuser::WriteFlags,
        _flags: fuser::OpenFlags,
        _lock_owner: Option<fuser::LockOwner>,
        reply: fuser::ReplyWrite,
    ) {
        self.largest_write.fetch_max(data.len(), Ordering::SeqCst);
        reply.written(data.len() as u32);
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lo: fuser::LockOwner,
        reply: fuser::ReplyEmpty,
    ) {
        reply.ok();
    }
}

fn can_mount() -> bool {
    if is_root()
        && std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/fuse")
            .is_ok()
    {
        return true;
    }
    eprintln!("skipped: mounting needs root and /dev/fuse");
    false
}

fn mount_root_only(dir: &Path) -> (MountGuard, Arc<RootOnlyCounters>, Arc<KernelInvalidator>) {
    mount_root_only_with(dir, Method::Direct)
}

fn mount_root_only_with(
    dir: &Path,
    method: Method,
) -> (MountGuard, Arc<RootOnlyCounters>, Arc<KernelInvalidator>) {
    let counters = Arc::new(RootOnlyCounters::default());
    let slot = Mutex::new(None);
    let opts = MountOptions {
        fsname: "morris-test".into(),
        threads: 2,
        ..MountOptions::default()
    };
    let fs = RootOnly {
        getattrs: counters.getattrs.clone(),
        lookups: counters.lookups.clone(),
        largest_read: counters.largest_read.clone(),
        largest_write: counters.largest_write.clone(),
    };
    let names = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let guard = start(
        fs,
        dir,
        &opts,
        method,
        Arc::default(),
        names.clone(),
        |inv| {
            if let Ok(mut s) = slot.lock() {
                *s = Some(inv);
            }
        },
    )
    .expect("mount");
    let inv = slot
        .lock()
        .expect("lock")
        .take()
        .expect("invalidator registered");
    // Names are handed to the kernel exactly when it can drop them all at
    // once (`FUSE_NOTIFY_INC_EPOCH`, Linux 6.16).
    assert_eq!(
        names.load(std::sync::atomic::Ordering::SeqCst),
        kernel_at_least(6, 16),
        "kernel {:?}",
        kernel_release()
    );
    (guard, counters, inv)
}

/// The running kernel's release (`uname -r`).
fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .expect("kernel release")
        .trim()
        .to_string()
}

/// Whether the running kernel is at least `major.minor`.
fn kernel_at_least(major: u32, minor: u32) -> bool {
    let release = kernel_release();
    let mut parts = release
        .split(|c: char| !c.is_ascii_digit())
        .map(|p| p.parse::<u32>().unwrap_or(0));
    let (a, b) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    (a, b) >= (major, minor)
}

/// The counters of a mounted [`RootOnly`].
#[derive(Default)]
struct RootOnlyCounters {
    getattrs: Arc<AtomicUsize>,
    lookups: Arc<AtomicUsize>,
    largest_read: Arc<AtomicUsize>,
    largest_write: Arc<AtomicUsize>,
}

impl RootOnly {
    fn unmounted() -> Self {
        RootOnly {
            getattrs: Arc::default(),
            lookups: Arc::default(),
            largest_read: Arc::default(),
            largest_write: Arc::default(),
        }
    }
}

fn mounted(dir: &Path) -> bool {
    let text = mountinfo::read().expect("mountinfo");
    let dir = dir.canonicalize().expect("path");
    !mountinfo::devices_in(&text, &dir).is_empty()
}

/// Unmounts whatever is on `path`, as an administrator would.
fn umount_flags(path: &Path, flags: libc::c_int) -> io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).map_err(io::Error::other)?;
    // SAFETY: c is NUL-terminated and outlives the call.
    if unsafe { libc::umount2(c.as_ptr(), flags) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

fn umount(path: &Path) -> io::Result<()> {
    umount_flags(path, 0)
}

#[test]
fn mount_options_invalidation_busy_unmount() {
    if !can_mount() {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let (guard, counters, inv) = mount_root_only(dir.path());
    let getattrs = &counters.getattrs;
    let mp = guard.mountpoint().to_path_buf();

    // Options as the kernel sees them.
    let text = mountinfo::read().expect("mountinfo");
    let line = text
        .lines()
        .rfind(|l| l.split(' ').nth(4).map(OsStr::new) == Some(mp.as_os_str()))
        .expect("mountinfo line")
        .to_string();
    assert!(line.contains(" - fuse.morris morris-test "), "{line}");
    assert!(line.contains("default_permissions"), "{line}");
    assert!(line.contains("allow_other"), "{line}");
    assert!(line.contains("nosuid") && line.contains("nodev"), "{line}");
    let dev = guard.device();
    assert_eq!(
        mountinfo::readahead(dev).expect("read_ahead_kb"),
        u64::from(fs::MAX_IO)
    );

    // Attributes are cached for the TTL ...
    let meta = std::fs::metadata(&mp).expect("stat");
    assert!(meta.is_dir());
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o7777,
        0o751
    );
    let after_first = getattrs.load(Ordering::SeqCst);
    assert!(after_first >= 1);
    std::fs::metadata(&mp).expect("stat");
    assert_eq!(getattrs.load(Ordering::SeqCst), after_first);
    // ... until invalidated; entries can be invalidated too (nothing cached: no error).
    inv.entry(1, b"nothing\xff");
    inv.inode(1);
    let deadline = Instant::now() + Duration::from_secs(10);
    while getattrs.load(Ordering::SeqCst) == after_first {
        assert!(
            Instant::now() < deadline,
            "invalidation did not reach the kernel"
        );
        std::thread::sleep(Duration::from_millis(20));
        std::fs::metadata(&mp).expect("stat");
    }

    // A name is kept for its TTL ...
    let file = mp.join("f");
    std::fs::metadata(&file).expect("stat f");
    let looked = counters.lookups.load(Ordering::SeqCst);
    assert!(looked >= 1);
    std::fs::metadata(&file).expect("stat f");
    assert_eq!(counters.lookups.load(Ordering::SeqCst), looked);
    // ... until every name is dropped at once (kernels that can).
    if kernel_at_least(6, 16) {
        inv.all_names();
        std::fs::metadata(&file).expect("stat f");
        assert_eq!(counters.lookups.load(Ordering::SeqCst), looked + 1);
    }

    // Reads and writes travel in 1 MiB requests.
    std::fs::OpenOptions::new()
        .write(true)
        .open(&file)
        .and_then(|mut f| io::Write::write_all(&mut f, &vec![1u8; 4 << 20]))
        .expect("write");
    assert_eq!(
        counters.largest_write.load(Ordering::SeqCst),
        fs::MAX_IO as usize
    );
    let read = std::fs::read(&file).expect("read");
    assert_eq!(read.len() as u64, FILE_SIZE);
    assert_eq!(
        counters.largest_read.load(Ordering::SeqCst),
        fs::MAX_IO as usize
    );

    // A busy mount is not unmounted, and keeps working.
    let open_dir = std::fs::File::open(&mp).expect("open root");
    let err = guard.unmount(false).expect_err("busy mount unmounted");
    assert!(
        matches!(err, UnmountError::Busy { in_flight: 0, .. }),
        "{err:?}"
    );
    assert!(format!("{err}").contains("busy"), "{err}");
    assert!(mounted(&mp));
    assert_eq!(guard.state(), MountState::Mounted);
    let found = guard.holders();
    assert!(
        found
            .holders
            .iter()
            .any(|h| h.pid == std::process::id() && h.uses.contains(&Use::OpenFile)),
        "{found}"
    );
    std::fs::metadata(&mp).expect("stat while busy");
    drop(open_dir);

    guard.unmount(false).expect("unmount");
    assert!(!mounted(&mp));
    assert!(
        guard.wait_ended(Duration::from_secs(10)),
        "session still running"
    );
    assert_eq!(guard.state(), MountState::Ended);
    guard.join().expect("session result");
    // Invalidations after unmount are dropped quietly.
    inv.inode(1);
}

#[test]
fn join_returns_after_external_unmount_and_drop_unmounts() {
    if !can_mount() {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let (guard, _, _) = mount_root_only(dir.path());
    let mp = guard.mountpoint().to_path_buf();
    let unmounter = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(200));
        umount(&mp)
    });
    guard.join().expect("join");
    unmounter.join().expect("thread").expect("umount");
    assert!(!mounted(dir.path()));

    let (guard, _, _) = mount_root_only(dir.path());
    assert!(mounted(dir.path()));
    drop(guard);
    assert!(!mounted(dir.path()));
}

#[test]
fn bad_options_are_refused_before_mounting() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fs = RootOnly::unmounted();
    let opts = MountOptions {
        fsname: "a,b".into(),
        ..MountOptions::default()
    };
    let err = start(
        fs,
        dir.path(),
        &opts,
        Method::Direct,
        Arc::default(),
        Arc::default(),
        |_| {},
    )
    .expect_err("bad name accepted");
    assert!(matches!(err, MountError::BadName(_)), "{err:?}");
    let fs = RootOnly::unmounted();
    let missing = dir.path().join("missing");
    let err = start(
        fs,
        &missing,
        &MountOptions::default(),
        Method::Direct,
        Arc::default(),
        Arc::default(),
        |_| {},
    )
    .expect_err("no mount point");
    assert!(format!("{err:#}").contains("missing"), "{err:#}");
}

#[test]
fn session_settings() {
    let opts = MountOptions {
        threads: 0,
        allow_other: false,
        ..MountOptions::default()
    };
    let c = session_config(&opts);
    assert_eq!(c.n_threads, Some(1));
    assert!(c.clone_fd);
    assert_eq!(c.acl, SessionACL::Owner);
    assert!(c.mount_options.is_empty(), "fuser mounts nothing itself");
    let c = session_config(&MountOptions::default());
    assert_eq!(c.n_threads, Some(4));
    assert_eq!(c.acl, SessionACL::All);
}

#[test]
fn unmounting_after_an_outside_lazy_detach_is_success() {
    if !can_mount() {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let (guard, _, _) = mount_root_only(dir.path());
    let mp = guard.mountpoint().to_path_buf();
    umount_flags(&mp, libc::MNT_DETACH).expect("umount -l");
    // Nothing was open: the kernel ends the session at once.
    assert!(
        guard.wait_ended(Duration::from_secs(10)),
        "session still running"
    );
    assert_eq!(guard.state(), MountState::Ended);
    guard.unmount(false).expect("already gone is success");
    guard
        .unmount(true)
        .expect("already gone is success, lazily too");
    guard.join().expect("session result");
}

#[test]
fn a_lazily_detached_mount_serves_its_open_files_until_they_close() {
    if !can_mount() {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let (guard, _, _) = mount_root_only(dir.path());
    let mp = guard.mountpoint().to_path_buf();
    let open_dir = std::fs::File::open(&mp).expect("open root");
    umount_flags(&mp, libc::MNT_DETACH).expect("umount -l");
    assert!(!mounted(&mp));
    assert_eq!(guard.state(), MountState::Detached);
    let found = guard.holders();
    assert!(
        found.holders.iter().any(|h| h.pid == std::process::id()),
        "{found}"
    );
    // Unmounting something already detached is success.
    guard.unmount(false).expect("detached is unmounted");
    assert!(!guard.has_ended());
    drop(open_dir);
    assert!(
        guard.wait_ended(Duration::from_secs(10)),
        "session outlived the last file"
    );
    guard.join().expect("session result");
}

#[test]
fn a_newer_mount_on_the_same_directory_is_not_ours() {
    if !can_mount() {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let (old, _, _) = mount_root_only(dir.path());
    let mp = old.mountpoint().to_path_buf();
    let old_dev = old.device();
    umount(&mp).expect("umount from outside");
    let (new, _, _) = mount_root_only(dir.path());
    // The kernel hands the freed device number out again (usually at once):
    // it does not identify a mount once its connection has ended.
    eprintln!("old device {old_dev:?}, new device {:?}", new.device());
    assert!(old.wait_ended(Duration::from_secs(10)));
    assert_eq!(old.state(), MountState::Ended);
    old.unmount(false).expect("nothing of ours to unmount");
    old.unmount(true).expect("nothing of ours to unmount");
    drop(old);
    assert!(mounted(&mp), "the old guard unmounted the new mount");
    assert_eq!(new.state(), MountState::Mounted);
    assert!(std::fs::metadata(&mp).expect("stat the new mount").is_dir());
    drop(new);
    assert!(!mounted(&mp));
}

#[test]
fn the_helper_mounts_and_unmounts() {
    if !can_mount() {
        return;
    }
    if std::process::Command::new("fusermount3")
        .arg("-V")
        .output()
        .is_err()
    {
        panic!("fusermount3 is missing (install the fuse3 package)");
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let (guard, counters, _) = mount_root_only_with(dir.path(), Method::Helper);
    let mp = guard.mountpoint().to_path_buf();
    let text = mountinfo::read().expect("mountinfo");
    let line = text
        .lines()
        .rfind(|l| l.split(' ').nth(4).map(OsStr::new) == Some(mp.as_os_str()))
        .expect("mountinfo line")
        .to_string();
    assert!(line.contains(" - fuse.morris morris-test "), "{line}");
    assert!(line.contains("nosuid") && line.contains("nodev"), "{line}");
    std::fs::metadata(&mp).expect("stat");
    assert!(counters.getattrs.load(Ordering::SeqCst) >= 1);
    assert_eq!(guard.requests_in_flight(), 0);
    guard.unmount(false).expect("unmount");
    assert!(guard.wait_ended(Duration::from_secs(10)));
    assert!(!mounted(&mp));
}

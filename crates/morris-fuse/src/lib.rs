//! The morris FUSE front end: mounts a volume through the Linux kernel's FUSE.
//!
//! A thin adapter: every FUSE request becomes [`morris_client::Client`] calls,
//! and client error classes become errno in one place. All file-system logic
//! (leases, caching, readahead, write ordering, permission checks when asked)
//! lives in the client library; the kernel checks permissions itself
//! (`default_permissions`).
//!
//! * FUSE inode numbers are morris file ids (the root is 1 in both).
//! * The kernel caches attributes and entries for [`MountOptions::attr_ttl`];
//!   changes by other clients reach it sooner, as invalidations the client
//!   library reports through [`morris_client::Invalidator`].
//! * Requests are decoded by [`MountOptions::threads`] FUSE threads and
//!   answered from tasks on the given tokio runtime, so many are in flight.
//!   The runtime must make progress while the caller blocks in
//!   [`MountGuard::join`] or [`MountGuard::unmount`]: use a multi-thread
//!   runtime, or one driven by another thread.
//! * Kernel settings: 1 MiB read and write requests, 1 MiB kernel readahead,
//!   asynchronous reads, parallel directory operations, atomic `O_TRUNC`, no
//!   writeback cache; mounted `default_permissions`, `nosuid`, `nodev`, type
//!   `fuse.morris`.

#![warn(missing_docs)]

mod attr;
mod dirents;
mod errno;
mod fs;
mod invalidate;
pub mod mountinfo;

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use fuser::{BackgroundSession, Config, Filesystem, MountOption, Session, SessionACL};
use morris_client::Client;

use crate::invalidate::{KernelInvalidator, Worker};
use crate::mountinfo::Dev;

/// How a volume is mounted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountOptions {
    /// Let every user use the mount, not only the user who mounted it
    /// (default `true`). Access is still checked against mode bits.
    pub allow_other: bool,
    /// Threads reading FUSE requests (default 4; 0 counts as 1). Requests are
    /// answered asynchronously, so a few threads keep many requests in flight.
    pub threads: usize,
    /// The mount's source name, shown by `mount` and `df`.
    pub fsname: String,
    /// How long the kernel caches attributes and directory entries without
    /// asking again; `None` (the default): the volume's lease time, as long as
    /// the client itself may trust them. Coherence with other clients comes
    /// from invalidations when leases are recalled, not from a short TTL.
    pub attr_ttl: Option<Duration>,
}

impl Default for MountOptions {
    fn default() -> Self {
        MountOptions {
            allow_other: true,
            threads: 4,
            fsname: "morris".into(),
            attr_ttl: None,
        }
    }
}

/// A mounted volume, served by background threads until unmounted.
///
/// Dropping the guard tries to unmount (see [`MountGuard::unmount`]); if the
/// mount is busy it stays, served by the detached threads while the process lives.
#[derive(Debug)]
pub struct MountGuard {
    session: Option<BackgroundSession>,
    invalidation: Option<Worker>,
    mountpoint: PathBuf,
    /// The mount's device, to tell our mount from whatever is on the mount
    /// point later. `None` if /proc/self/mountinfo was unreadable.
    dev: Option<Dev>,
}

impl MountGuard {
    /// The mount point (absolute, symlinks resolved).
    pub fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }

    /// Unmounts and waits for the FUSE threads to end. Fails, leaving the
    /// volume mounted and served, if the mount is busy (open files, working
    /// directories) — the error says so. Blocks: call it outside async code.
    pub fn unmount(mut self) -> anyhow::Result<()> {
        self.try_unmount()
    }

    /// Like [`MountGuard::unmount`], but keeps the guard when the mount is
    /// busy so that the caller can try again later.
    pub fn try_unmount(&mut self) -> anyhow::Result<()> {
        let Some(session) = self.session.take() else {
            return Ok(());
        };
        if let Err(e) = unmount_kernel(&self.mountpoint, self.dev) {
            self.session = Some(session);
            return Err(e);
        }
        self.finish(session)
    }

    /// Waits until the volume is unmounted by someone else (`umount`,
    /// `fusermount -u`), then ends the FUSE threads. Blocks.
    pub fn join(mut self) -> anyhow::Result<()> {
        match self.session.take() {
            Some(session) => self.finish(session),
            None => Ok(()),
        }
    }

    /// Waits for the session threads, which end once the kernel mount is gone.
    fn finish(&mut self, session: BackgroundSession) -> anyhow::Result<()> {
        let res = session.join();
        if let Some(worker) = self.invalidation.take() {
            worker.stop();
        }
        tracing::info!(mountpoint = %self.mountpoint.display(), "unmounted");
        res.with_context(|| {
            format!(
                "FUSE session on {} ended with an error",
                self.mountpoint.display()
            )
        })
    }
}

impl Drop for MountGuard {
    fn drop(&mut self) {
        if self.session.is_some() {
            if let Err(e) = self.try_unmount() {
                tracing::warn!(mountpoint = %self.mountpoint.display(), error = %format!("{e:#}"), "mount guard dropped while mounted");
            }
        }
    }
}

/// Mounts the volume of `client` on `mountpoint` and serves it in background
/// threads; FUSE requests are answered by tasks spawned on `rt`.
///
/// Registers the mount's kernel-cache invalidator with the client. Blocks
/// until the kernel has completed the FUSE handshake. The caller keeps the
/// client and calls [`Client::shutdown`] after unmounting.
pub fn mount(
    client: Arc<Client>,
    rt: tokio::runtime::Handle,
    mountpoint: &Path,
    opts: &MountOptions,
) -> anyhow::Result<MountGuard> {
    let blksize = client.descriptor().stripe_unit;
    let ttl = opts.attr_ttl.unwrap_or_else(|| client.lease_duration());
    let fs = fs::MorrisFs::new(client.clone(), rt, ttl, blksize);
    start(fs, mountpoint, opts, |inv| client.set_invalidator(inv))
}

/// Mounts `fs`; `register` receives the invalidator before requests are served.
fn start<FS: Filesystem>(
    fs: FS,
    mountpoint: &Path,
    opts: &MountOptions,
    register: impl FnOnce(Arc<KernelInvalidator>),
) -> anyhow::Result<MountGuard> {
    if opts.fsname.is_empty() || opts.fsname.contains([',', '\0']) {
        bail!(
            "file system name {:?} must be non-empty, without commas or NUL",
            opts.fsname
        );
    }
    // Resolved before mounting: afterwards, resolving it would ask the mount.
    let mountpoint = mountpoint
        .canonicalize()
        .with_context(|| format!("mount point {}", mountpoint.display()))?;
    if !mountpoint.is_dir() {
        bail!("mount point {} is not a directory", mountpoint.display());
    }
    let config = session_config(opts, is_root());
    let session = Session::new(fs, &mountpoint, &config)
        .with_context(|| format!("cannot mount on {}", mountpoint.display()))?;
    let (invalidator, worker) =
        Worker::start(session.notifier()).context("cannot start the invalidation thread")?;
    register(invalidator);
    let dev = mountinfo::device(&mountpoint);
    let session = session.spawn().context("cannot start the FUSE threads")?;
    if let Some(dev) = dev {
        // Kernel readahead requests of up to MAX_IO bytes.
        match mountinfo::set_readahead(dev, fs::MAX_IO) {
            Ok(()) => tracing::debug!(?dev, bytes = fs::MAX_IO, "kernel readahead set"),
            Err(e) => {
                tracing::info!(?dev, error = %e, "cannot raise kernel readahead; it stays at 128 KiB")
            }
        }
    }
    tracing::info!(mountpoint = %mountpoint.display(), fsname = %opts.fsname, threads = opts.threads.max(1), "mounted");
    Ok(MountGuard {
        session: Some(session),
        invalidation: Some(worker),
        mountpoint,
        dev,
    })
}

/// Mount options and FUSE session settings.
fn session_config(opts: &MountOptions, root: bool) -> Config {
    let subtype = if root {
        // The kernel takes the subtype as a mount option when mounting
        // directly; fuser hands its Subtype option only to fusermount.
        MountOption::CUSTOM("subtype=morris".into())
    } else {
        MountOption::Subtype("morris".into())
    };
    let mut config = Config::default();
    config.mount_options = vec![
        MountOption::FSName(opts.fsname.clone()),
        subtype,
        MountOption::DefaultPermissions,
    ];
    config.acl = if opts.allow_other {
        SessionACL::All
    } else {
        SessionACL::Owner
    };
    config.n_threads = Some(opts.threads.max(1));
    config.clone_fd = true;
    config
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// Unmounts our FUSE mount (device `dev`) from `path`, refusing if it is busy.
fn unmount_kernel(path: &Path, dev: Option<Dev>) -> anyhow::Result<()> {
    if let Some(dev) = dev {
        if let Some(text) = mountinfo::read() {
            let stack = mountinfo::devices_in(&text, path);
            if !stack.contains(&dev) {
                // Unmounted already (e.g. `umount -l`); the session ends when
                // the kernel lets go of it.
                return Ok(());
            }
            if stack.last() != Some(&dev) {
                bail!(
                    "another file system is mounted over {}; unmount it first",
                    path.display()
                );
            }
        }
    }
    let cpath = CString::new(path.as_os_str().as_bytes()).context("mount point contains NUL")?;
    // SAFETY: cpath is a NUL-terminated string that lives across the call.
    if unsafe { libc::umount2(cpath.as_ptr(), 0) } == 0 {
        return Ok(());
    }
    let err = io::Error::last_os_error();
    match err.raw_os_error() {
        Some(libc::EBUSY) => bail!(
            "{} is busy (files open or working directories under it); it stays mounted",
            path.display()
        ),
        // Not privileged: the setuid helper may unmount mounts of its user.
        Some(libc::EPERM) => fusermount_unmount(path),
        Some(libc::EINVAL) if dev.is_none() => Ok(()),
        _ => Err(err).with_context(|| format!("cannot unmount {}", path.display())),
    }
}

/// Unmounts through `fusermount3 -u` (or `fusermount -u`).
fn fusermount_unmount(path: &Path) -> anyhow::Result<()> {
    let mut last = None;
    for helper in ["fusermount3", "fusermount"] {
        match std::process::Command::new(helper)
            .arg("-u")
            .arg(path)
            .output()
        {
            Ok(out) if out.status.success() => return Ok(()),
            Ok(out) => bail!(
                "cannot unmount {}: {helper}: {}",
                path.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            ),
            Err(e) => last = Some(e),
        }
    }
    Err(anyhow::anyhow!("no fusermount helper found: {last:?}"))
        .with_context(|| format!("cannot unmount {} without privileges", path.display()))
}

#[cfg(test)]
mod tests;

//! The morris FUSE front end: mounts a volume through the Linux kernel's FUSE.
//!
//! A thin adapter: every FUSE request becomes [`morris_client::Client`] calls,
//! and client error classes become errno in one place. All file-system logic
//! (leases, caching, readahead, write ordering, permission checks when asked)
//! lives in the client library; the kernel checks permissions itself
//! (`default_permissions`).
//!
//! * FUSE inode numbers are morris file ids (the root is 1 in both).
//! * The kernel caches attributes for [`MountOptions::attr_ttl`]; changes
//!   by other clients reach it sooner, as invalidations the client library
//!   reports through [`morris_client::Invalidator`]. It keeps no names: it
//!   asks for each one it resolves, and the client answers from the entries
//!   it caches under its directory leases.
//! * Requests are decoded by [`MountOptions::threads`] FUSE threads; each
//!   is polled once on its FUSE thread (answered there if it needs no
//!   waiting: a write the client gathers, names and attributes under held
//!   leases) and otherwise answered from a task on the given tokio
//!   runtime, so many are in flight.
//!   The runtime must make progress while the caller blocks in
//!   [`MountGuard::join`] or [`MountGuard::wait_ended`]: use a multi-thread
//!   runtime, or one driven by another thread.
//! * A [`MountGuard`] owns exactly its own mount: the kernel mount is made
//!   with our own `/dev/fuse` descriptor (fuser only serves it and never
//!   unmounts by path), the mount is recognised by its device number only
//!   while that descriptor's connection is alive (device numbers and mount
//!   ids are reused by later mounts), and the session's end is the kernel's
//!   word that the mount is gone.
//! * Kernel settings: 1 MiB read and write requests, 1 MiB kernel readahead,
//!   asynchronous reads, parallel directory operations, atomic `O_TRUNC`, no
//!   writeback cache; mounted `default_permissions`, `nosuid`, `nodev`, type
//!   `fuse.morris`.

#![warn(missing_docs)]

mod access;
mod attr;
mod chattr;
mod dirents;
mod errno;
mod fs;
mod holders;
mod invalidate;
mod kernel;
pub mod mountinfo;

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use fuser::{Config, Filesystem, Session, SessionACL};
use morris_client::Client;
use tokio::sync::watch;

pub use crate::holders::{Holder, Holders, Use};
use crate::invalidate::{KernelInvalidator, Worker};
use crate::kernel::Method;
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
    /// How long the kernel caches attributes without asking again; `None`
    /// (the default): the volume's lease time, as long as the client itself
    /// may trust them. Coherence with other clients comes from
    /// invalidations when leases are recalled, not from a short TTL. Names
    /// are kept by the kernel while the client keeps them under its
    /// directory leases (see `fs.rs` `Shared::name_ttl`).
    pub attr_ttl: Option<Duration>,
    /// Mount read-only (`ro`; default `false`).
    pub read_only: bool,
    /// Honour set-ID bits (default `false`: `nosuid`). Direct mounts only.
    pub suid: bool,
    /// Let device nodes be opened (default `false`: `nodev`). Direct
    /// mounts only.
    pub dev: bool,
    /// Show the mount as `noatime` (default `false`: `relatime`); the
    /// client's `ClientConfig::atime` is what updates access times.
    pub noatime: bool,
    /// Show the mount as `strictatime` (likewise only shown).
    pub strictatime: bool,
    /// Answer `READDIRPLUS` (default `true`): listings carry attributes,
    /// their names looked up a batch at a time (`fs.rs` `readdirplus`).
    pub readdirplus: bool,
    /// Append a line per answered request to this file (`access.rs`).
    pub access_log: Option<std::path::PathBuf>,
}

impl Default for MountOptions {
    fn default() -> Self {
        MountOptions {
            allow_other: true,
            threads: 4,
            fsname: "morris".into(),
            attr_ttl: None,
            read_only: false,
            suid: false,
            dev: false,
            noatime: false,
            strictatime: false,
            readdirplus: true,
            access_log: None,
        }
    }
}

/// Why a mount failed.
#[derive(Debug, thiserror::Error)]
pub enum MountError {
    /// The access log cannot be opened.
    #[error("cannot open the access log {path}: {source}")]
    AccessLog {
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file system name cannot be passed as a mount option.
    #[error("file system name {0:?} must be non-empty, without commas or NUL")]
    BadName(String),
    /// The mount point cannot be used.
    #[error("mount point {}: {source}", path.display())]
    MountPoint {
        /// The mount point as given.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// The mount point is not a directory.
    #[error("mount point {} is not a directory", .0.display())]
    NotADirectory(PathBuf),
    /// A path or option contains a NUL byte.
    #[error("a path or option contains a NUL byte")]
    Nul,
    /// `/dev/fuse` cannot be opened.
    #[error("cannot open /dev/fuse: {0}")]
    Device(io::Error),
    /// `mount(2)` failed.
    #[error("mount(2) on {}: {source}", path.display())]
    Mount {
        /// The mount point.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// The socket for the mount helper cannot be made.
    #[error("cannot make a socket for fusermount3: {0}")]
    Socket(io::Error),
    /// No mount helper is installed.
    #[error("mounting without privileges needs fusermount3 (the fuse3 package): {0}")]
    NoHelper(io::Error),
    /// The mount helper failed.
    #[error("{helper}: {message}")]
    Helper {
        /// Which helper.
        helper: &'static str,
        /// What it said.
        message: String,
    },
    /// The new mount is not in `/proc/self/mountinfo`.
    #[error("the new mount on {} does not appear in /proc/self/mountinfo", .0.display())]
    NotListed(PathBuf),
    /// The FUSE handshake, the descriptor or the threads failed.
    #[error("cannot start the FUSE session: {0}")]
    Session(io::Error),
}

/// Why [`MountGuard::unmount`] did not unmount.
#[derive(Debug, thiserror::Error)]
pub enum UnmountError {
    /// The kernel refuses: processes use the mount, or requests to this
    /// process are in flight (a process in a file system call keeps the
    /// mount busy until it is answered, even once it has been killed).
    #[error("{} is busy ({in_flight} requests in flight)", path.display())]
    Busy {
        /// Where it is mounted.
        path: PathBuf,
        /// FUSE requests this mount has not answered yet.
        in_flight: usize,
    },
    /// Another file system is mounted over ours.
    #[error("another file system is mounted over {}; unmount it first", .0.display())]
    Covered(PathBuf),
    /// `/proc/self/mountinfo` is unreadable, so the mount cannot be told apart.
    #[error("cannot read /proc/self/mountinfo: {0}")]
    MountTable(io::Error),
    /// A path contains a NUL byte.
    #[error("{} contains a NUL byte", .0.display())]
    Nul(PathBuf),
    /// `umount2` failed otherwise.
    #[error("cannot unmount {}: {source}", path.display())]
    Io {
        /// The mount point.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// The unmount helper failed.
    #[error("cannot unmount {}: {helper}: {message}", path.display())]
    Helper {
        /// The mount point.
        path: PathBuf,
        /// Which helper.
        helper: &'static str,
        /// What it said.
        message: String,
    },
}

/// Where a [`MountGuard`]'s mount stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MountState {
    /// Mounted in this process's mount namespace (at its mount point, or
    /// wherever it was moved or bind-mounted).
    Mounted,
    /// Gone from this mount namespace, but the kernel still uses the
    /// session: files are open on it after a lazy unmount, or copies of the
    /// mount live on in other mount namespaces.
    Detached,
    /// The FUSE connection has ended: nothing of this mount is left.
    Ended,
}

/// How the session's end is announced to waiters.
#[derive(Debug)]
struct Ending {
    result: Mutex<Option<io::Result<()>>>,
    done: Condvar,
    tx: watch::Sender<bool>,
}

/// A mounted volume, served by background threads until its FUSE session
/// ends.
///
/// Dropping the guard unmounts (not lazily) and waits for the session to
/// end; a busy mount stays, served by the detached threads while the
/// process lives.
#[derive(Debug)]
pub struct MountGuard {
    mountpoint: PathBuf,
    dev: Dev,
    /// A duplicate of the session's `/dev/fuse` descriptor: `POLLERR` on it
    /// says the connection has ended.
    control: OwnedFd,
    in_flight: Arc<AtomicUsize>,
    ending: Arc<Ending>,
    ended_rx: watch::Receiver<bool>,
    watcher: Option<JoinHandle<()>>,
    /// Set by [`MountGuard::abandon`]: drop without unmounting or waiting.
    abandoned: bool,
}

impl MountGuard {
    /// The mount point (absolute, symlinks resolved).
    pub fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }

    /// The mount's device number (ours only while the session lives).
    pub fn device(&self) -> Dev {
        self.dev
    }

    /// FUSE requests received and not answered yet.
    pub fn requests_in_flight(&self) -> usize {
        self.in_flight.load(Ordering::SeqCst)
    }

    /// True once the FUSE session has ended (the kernel let go of it).
    pub fn has_ended(&self) -> bool {
        *self.ended_rx.borrow() || !kernel::connected(self.control.as_fd())
    }

    /// Resolves once the FUSE session threads have ended.
    pub async fn ended(&self) {
        let mut rx = self.ended_rx.clone();
        // An error means the sender is gone, which happens only after it sent.
        let _ = rx.wait_for(|ended| *ended).await;
    }

    /// Blocks until the session threads have ended, at most `limit`;
    /// returns whether they did.
    pub fn wait_ended(&self, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        let mut result = self
            .ending
            .result
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        while result.is_none() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            result = match self.ending.done.wait_timeout(result, left) {
                Ok((r, _)) => r,
                Err(poisoned) => poisoned.into_inner().0,
            };
        }
        true
    }

    /// Where the mount stands now.
    pub fn state(&self) -> MountState {
        let Some(text) = mountinfo::read() else {
            return if self.has_ended() {
                MountState::Ended
            } else {
                MountState::Mounted
            };
        };
        // Read the table first: if the connection is alive after that, the
        // device number in it was still ours.
        if self.has_ended() {
            return MountState::Ended;
        }
        if mountinfo::mounts_of(&text, self.dev).is_empty() {
            MountState::Detached
        } else {
            MountState::Mounted
        }
    }

    /// The processes that keep the mount in use (see [`Holders`]).
    pub fn holders(&self) -> Holders {
        holders::scan(self.dev)
    }

    /// Unmounts this mount (lazily with `lazy`: detached now, gone once the
    /// last file on it is closed) and nothing else: it is found by its
    /// device number while the FUSE connection is alive, at the mount point
    /// (or wherever it was moved). Success if it is not mounted in this
    /// namespace any more (e.g. detached from outside, or the session has
    /// ended). Does not wait for the session to end: see
    /// [`MountGuard::ended`].
    ///
    /// Between reading the mount table and `umount2` the mount point is
    /// not locked: a mount made in that instant over ours would be the one
    /// unmounted (Linux has no unmount by descriptor).
    pub fn unmount(&self, lazy: bool) -> Result<(), UnmountError> {
        let text =
            std::fs::read_to_string("/proc/self/mountinfo").map_err(UnmountError::MountTable)?;
        if self.has_ended() {
            return Ok(());
        }
        let mounts = mountinfo::mounts_of(&text, self.dev);
        let Some((entry, covered)) = mounts
            .iter()
            .find(|(m, _)| m.mount_point == self.mountpoint)
            .or_else(|| mounts.first())
        else {
            return Ok(());
        };
        if *covered {
            return Err(UnmountError::Covered(entry.mount_point.clone()));
        }
        match kernel::unmount(&entry.mount_point, lazy) {
            Ok(()) => Ok(()),
            Err(kernel::Failure::Busy) => Err(UnmountError::Busy {
                path: entry.mount_point.clone(),
                in_flight: self.requests_in_flight(),
            }),
            Err(kernel::Failure::NotMounted) => match self.state() {
                // Detached meanwhile by someone else.
                MountState::Detached | MountState::Ended => Ok(()),
                MountState::Mounted => Err(UnmountError::Io {
                    path: entry.mount_point.clone(),
                    source: io::Error::from_raw_os_error(libc::EINVAL),
                }),
            },
            Err(kernel::Failure::Other(e)) => Err(e),
        }
    }

    /// Asks the kernel to end the FUSE connection now (through the FUSE
    /// control file system, when it is mounted at /sys/fs/fuse/connections):
    /// whatever still uses the mount gets `ENOTCONN` from then on. Without
    /// it, the connection ends when this process exits.
    pub fn abort(&self) -> io::Result<()> {
        if self.has_ended() {
            return Ok(());
        }
        kernel::abort(self.dev)
    }

    /// Waits for the session to end and returns how it ended. Blocks
    /// without limit: unmount first (or see [`MountGuard::wait_ended`]).
    pub fn join(mut self) -> io::Result<()> {
        while !self.wait_ended(Duration::from_secs(3600)) {}
        self.finish()
    }

    /// Lets the session threads run on, serving whatever still uses the
    /// mount, until the process exits; neither unmounts nor waits.
    pub fn abandon(mut self) {
        self.abandoned = true;
        tracing::debug!(mountpoint = %self.mountpoint.display(), "FUSE session left to end with the process");
    }

    /// Joins the watcher thread (the session has ended) and takes the
    /// session's result.
    fn finish(&mut self) -> io::Result<()> {
        if let Some(w) = self.watcher.take() {
            if w.join().is_err() {
                return Err(io::Error::other("the FUSE session watcher panicked"));
            }
        }
        let taken = self
            .ending
            .result
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .take();
        taken.unwrap_or(Ok(()))
    }
}

impl Drop for MountGuard {
    fn drop(&mut self) {
        if self.abandoned || self.watcher.is_none() {
            return;
        }
        if self.state() == MountState::Mounted {
            if let Err(e) = self.unmount(false) {
                tracing::warn!(mountpoint = %self.mountpoint.display(), error = %e, "mount guard dropped while mounted; the mount stays until the process exits");
                return;
            }
        }
        if self.wait_ended(Duration::from_secs(5)) {
            if let Err(e) = self.finish() {
                tracing::warn!(mountpoint = %self.mountpoint.display(), error = %e, "FUSE session ended with an error");
            }
        } else {
            tracing::debug!(mountpoint = %self.mountpoint.display(), "FUSE session still in use; it ends with the process");
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
) -> Result<MountGuard, MountError> {
    let blksize = client.descriptor().stripe_unit;
    let ttl = opts.attr_ttl.unwrap_or_else(|| client.lease_duration());
    let in_flight = Arc::new(AtomicUsize::new(0));
    let access = match &opts.access_log {
        Some(path) => {
            Some(
                access::AccessLog::open(path).map_err(|source| MountError::AccessLog {
                    path: path.clone(),
                    source,
                })?,
            )
        }
        None => None,
    };
    let names = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let fs = fs::MorrisFs::new(
        client.clone(),
        rt,
        ttl,
        blksize,
        in_flight.clone(),
        access,
        names.clone(),
    )
    .with_readdirplus(opts.readdirplus);
    let method = if is_root() {
        Method::Direct
    } else {
        Method::Helper
    };
    let guard = start(fs, mountpoint, opts, method, in_flight, names, |inv| {
        client.set_invalidator(inv)
    })?;
    let (weak, dev, ended) = (Arc::downgrade(&client), guard.dev, guard.ended_rx.clone());
    let at = guard.mountpoint.clone();
    let spawned = std::thread::Builder::new()
        .name("morris-flags".into())
        .spawn(move || follow_flags(weak, dev, &at, ended));
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "mount flags not followed: remounts keep access-time updates as mounted");
    }
    Ok(guard)
}

/// Keeps `client`'s access-time updates in step with the options of its
/// mount (device `dev`, at `at`) as `mount -o remount,...` changes them:
/// reads `/proc/self/mountinfo` whenever the kernel says the table changed
/// (`POLLPRI`), until the mount ends or the client is gone.
fn follow_flags(
    client: std::sync::Weak<Client>,
    dev: Dev,
    at: &Path,
    ended: watch::Receiver<bool>,
) {
    let table = std::fs::File::open("/proc/self/mountinfo");
    let mut changed = true;
    loop {
        if *ended.borrow() {
            return;
        }
        let Some(c) = client.upgrade() else { return };
        if let Some(text) = changed.then(mountinfo::read).flatten() {
            let mounts = mountinfo::mounts_of(&text, dev);
            let ours = mounts
                .iter()
                .find(|(m, _)| m.mount_point == at)
                .or_else(|| mounts.first());
            if let Some((m, _)) = ours {
                c.set_atime(m.atime());
            }
        }
        drop(c);
        match &table {
            Ok(f) => {
                let mut pfd = libc::pollfd {
                    fd: std::os::fd::AsRawFd::as_raw_fd(f),
                    events: libc::POLLPRI,
                    revents: 0,
                };
                // SAFETY: one valid pollfd, for the duration of the call.
                changed = unsafe { libc::poll(&mut pfd, 1, 1000) } > 0;
                if changed {
                    // A burst of changes is read once.
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
            Err(_) => std::thread::sleep(Duration::from_secs(5)),
        }
    }
}

/// Mounts `fs`; `register` receives the invalidator before requests are
/// served; `in_flight` is the count `fs` keeps of unanswered requests.
fn start<FS: Filesystem + Send + 'static>(
    fs: FS,
    mountpoint: &Path,
    opts: &MountOptions,
    method: Method,
    in_flight: Arc<AtomicUsize>,
    names: Arc<std::sync::atomic::AtomicBool>,
    register: impl FnOnce(Arc<KernelInvalidator>),
) -> Result<MountGuard, MountError> {
    if opts.fsname.is_empty() || opts.fsname.contains([',', '\0']) {
        return Err(MountError::BadName(opts.fsname.clone()));
    }
    // Resolved before mounting: afterwards, resolving it would ask the mount.
    let mountpoint = mountpoint
        .canonicalize()
        .map_err(|source| MountError::MountPoint {
            path: mountpoint.to_path_buf(),
            source,
        })?;
    if !mountpoint.is_dir() {
        return Err(MountError::NotADirectory(mountpoint));
    }
    let req = kernel::Request {
        fsname: opts.fsname.clone(),
        allow_other: opts.allow_other,
        read_only: opts.read_only,
        suid: opts.suid,
        dev: opts.dev,
        noatime: opts.noatime,
        strictatime: opts.strictatime,
    };
    let fd = kernel::mount(&mountpoint, &req, method)?;
    // Ours is the mount on top of the mount point now (our connection is
    // alive, so its device number is not reused).
    let dev = mountinfo::read()
        .and_then(|text| {
            mountinfo::parse(&text)
                .into_iter()
                .rfind(|m| m.mount_point == mountpoint && m.is_fuse())
                .and_then(|m| m.dev)
        })
        // Without it the mount cannot be told apart from others: closing the
        // descriptor ends the connection and leaves it dead, untouched.
        .ok_or_else(|| MountError::NotListed(mountpoint.clone()))?;
    let undo = |e: MountError| {
        undo_mount(&mountpoint, dev);
        e
    };
    let control = fd.try_clone().map_err(MountError::Session).map_err(undo)?;
    let session = Session::from_fd(fs, fd, session_acl(opts), session_config(opts))
        .map_err(MountError::Session)
        .map_err(undo)?;
    let (invalidator, worker) = Worker::start(session.notifier(), names)
        .map_err(MountError::Session)
        .map_err(undo)?;
    register(invalidator);
    let background = session.spawn().map_err(MountError::Session).map_err(undo)?;
    // Kernel readahead requests of up to MAX_IO bytes.
    match mountinfo::set_readahead(dev, fs::MAX_IO) {
        Ok(()) => tracing::debug!(?dev, bytes = fs::MAX_IO, "kernel readahead set"),
        Err(e) => {
            tracing::info!(?dev, error = %e, "cannot raise kernel readahead; it stays at 128 KiB")
        }
    }
    let (tx, ended_rx) = watch::channel(false);
    let ending = Arc::new(Ending {
        result: Mutex::new(None),
        done: Condvar::new(),
        tx,
    });
    let watched = ending.clone();
    let shown = mountpoint.clone();
    let watcher = std::thread::Builder::new()
        .name("morris-session".into())
        .spawn(move || {
            let res = background.join();
            worker.stop();
            match &res {
                Ok(()) => tracing::debug!(mountpoint = %shown.display(), "FUSE session ended"),
                Err(e) => {
                    tracing::warn!(mountpoint = %shown.display(), error = %e, "FUSE session ended with an error")
                }
            }
            *watched
                .result
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(res);
            watched.done.notify_all();
            watched.tx.send_replace(true);
        })
        .map_err(MountError::Session)
        .map_err(undo)?;
    tracing::info!(mountpoint = %mountpoint.display(), fsname = %opts.fsname, threads = opts.threads.max(1), ?dev, "mounted");
    Ok(MountGuard {
        mountpoint,
        dev,
        control,
        in_flight,
        ending,
        ended_rx,
        watcher: Some(watcher),
        abandoned: false,
    })
}

/// Lazily unmounts the mount just made on `mountpoint` (device `dev`, its
/// connection still open) after a later step failed.
fn undo_mount(mountpoint: &Path, dev: Dev) {
    let ours = mountinfo::read().is_some_and(|text| {
        mountinfo::mounts_of(&text, dev)
            .iter()
            .any(|(m, covered)| m.mount_point == mountpoint && !covered)
    });
    if !ours {
        return;
    }
    if let Err(e) = kernel::unmount(mountpoint, true) {
        tracing::warn!(mountpoint = %mountpoint.display(), error = ?e, "cannot undo a failed mount");
    }
}

/// Who may use the mount, as fuser enforces it.
fn session_acl(opts: &MountOptions) -> SessionACL {
    if opts.allow_other {
        SessionACL::All
    } else {
        SessionACL::Owner
    }
}

/// FUSE session settings (the mount options are ours: see `kernel`).
fn session_config(opts: &MountOptions) -> Config {
    let mut config = Config::default();
    config.acl = session_acl(opts);
    config.n_threads = Some(opts.threads.max(1));
    config.clone_fd = true;
    config
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

#[cfg(test)]
mod tests;

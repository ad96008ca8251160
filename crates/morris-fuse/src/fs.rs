//! The FUSE request handlers: each one translates its request into
//! [`morris_client::Client`] calls and replies.
//!
//! Every handler that talks to the volume spawns one task on the client's
//! tokio runtime and returns at once; the task replies when the client
//! answers (fuser replies are `Send`). The few FUSE worker threads therefore
//! only decode requests, and as many requests are in flight as the kernel
//! sends (it bounds them itself: `max_background` for readahead and other
//! asynchronous requests, one per blocked application thread otherwise).

use std::cell::Cell;
use std::ffi::OsStr;
use std::future::Future;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use fuser::{
    AccessFlags, BsdFileFlags, CopyFileRangeFlags, Errno, FileHandle, FileType, Filesystem,
    FopenFlags, Generation, INodeNo, InitFlags, IoctlFlags, KernelConfig, LockOwner, OpenAccMode,
    OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus,
    ReplyEmpty, ReplyEntry, ReplyIoctl, ReplyLock, ReplyLseek, ReplyOpen, ReplyStatfs, ReplyWrite,
    ReplyXattr, Request, TimeOrNow, WriteFlags,
};
use morris_client::{
    Caller, Client, DirEntry, Error, ErrorCode, Fallocate, FileId, FileKind, Inode, Timestamp,
};
use morris_proto::observe::OpTimers;
use morris_proto::{LockKind, XattrHow, MAX_NAME_LEN};
use tokio::runtime::Handle;

use crate::attr::{file_attr, is_empty, mknod_kind, set_attr};
use crate::chattr;
use crate::dirents;
use crate::errno::fail;

/// Largest FUSE read and write request, and the kernel readahead window: 1 MiB.
pub(crate) const MAX_IO: u32 = 1 << 20;

/// Most asynchronous requests (readahead, background writes) the kernel keeps
/// outstanding, and the level at which it considers the mount congested.
const MAX_BACKGROUND: u16 = 64;
const CONGESTION_THRESHOLD: u16 = 48;

/// Kernel capabilities asked for when the kernel offers them.
/// `FUSE_WRITEBACK_CACHE` is deliberately absent: writes must reach the client
/// library (and its leases) in order, not be batched by the kernel.
fn wanted_capabilities(readdirplus: bool) -> InitFlags {
    let plus = if readdirplus {
        // Listings with attributes when lookups follow them (`ls -l`).
        InitFlags::FUSE_DO_READDIRPLUS | InitFlags::FUSE_READDIRPLUS_AUTO
    } else {
        InitFlags::empty()
    };
    plus | always_wanted()
}

/// [`wanted_capabilities`] but `READDIRPLUS`.
fn always_wanted() -> InitFlags {
    InitFlags::FUSE_ASYNC_READ
        | InitFlags::FUSE_BIG_WRITES
        | InitFlags::FUSE_MAX_PAGES
        | InitFlags::FUSE_PARALLEL_DIROPS
        | InitFlags::FUSE_ATOMIC_O_TRUNC
        | InitFlags::FUSE_EXPORT_SUPPORT
        | InitFlags::FUSE_AUTO_INVAL_DATA
        | InitFlags::FUSE_ASYNC_DIO
        | InitFlags::FUSE_CACHE_SYMLINKS
        // The mount clears set-user-ID bits on write, truncate and chown
        // itself; in return the kernel stops asking for
        // `security.capability` before every write of a file it has
        // checked once (`SB_NOSEC`).
        | InitFlags::FUSE_HANDLE_KILLPRIV_V2
        // Locks are the volume's, not this kernel's: every mount sees them.
        | InitFlags::FUSE_POSIX_LOCKS
        | InitFlags::FUSE_FLOCK_LOCKS
        // POSIX ACLs: the kernel enforces them (asking for
        // `system.posix_acl_access` once per inode) and leaves the umask
        // and inheritance to the library (`Caller::umask`).
        | InitFlags::FUSE_POSIX_ACL
        | InitFlags::FUSE_DONT_MASK
}

/// State shared by the handlers and their tasks.
struct Shared {
    client: Arc<Client>,
    /// How long the kernel may cache attributes without asking.
    ttl: Duration,
    /// Whether the kernel may keep names (it can drop them all at once:
    /// `invalidate.rs`); set once the mount is made.
    names: Arc<AtomicBool>,
    /// `st_blksize`: the volume's stripe unit.
    blksize: u32,
    /// Each FUSE operation's time (`morris_fuse_request_duration_seconds`).
    timers: OpTimers,
    /// `--access-log`: a line per request answered.
    access: Option<crate::access::AccessLog>,
}

/// The FUSE operations timed for the metrics.
const TIMED: [&str; 34] = [
    "lookup",
    "getattr",
    "setattr",
    "readlink",
    "mknod",
    "mkdir",
    "unlink",
    "rmdir",
    "symlink",
    "rename",
    "link",
    "open",
    "read",
    "write",
    "flush",
    "getlk",
    "setlk",
    "release",
    "fsync",
    "fsyncdir",
    "opendir",
    "readdir",
    "readdirplus",
    "releasedir",
    "statfs",
    "access",
    "create",
    "setxattr",
    "getxattr",
    "listxattr",
    "removexattr",
    "lseek",
    "fallocate",
    "copy_file_range",
];

impl Shared {
    /// Answers a lookup (or a create) of `name` in `dir`. The kernel keeps
    /// the attributes for the TTL, and the name for as long as the client
    /// keeps it under its lease on `dir` ([`Shared::name_ttl`]).
    fn reply_entry(&self, reply: ReplyEntry, dir: FileId, name: &[u8], inode: &Inode) {
        let attr = file_attr(inode, self.blksize);
        reply.entry_with_ttls(
            &self.attr_ttl(inode),
            &self.name_ttl(dir, name, inode),
            &attr,
            Generation(u64::from(inode.gen)),
        );
    }

    /// How long the kernel may keep `dir`'s entry `name` (naming `inode`)
    /// without looking it up again: while the client's lease on `dir` may
    /// be trusted with the name cached under it, so that its recall
    /// invalidates the kernel's copy first (`invalidate.rs`; a recall
    /// that cannot wait for that drops every name the kernel keeps at
    /// once); under a cache binding, no longer than the binding's validity
    /// lets the name go unchecked. Zero — the kernel asks for the name
    /// each time it resolves a path, and the client answers from its own
    /// cache — when the kernel cannot drop all names at once, and for `.`
    /// and `..`.
    fn name_ttl(&self, dir: FileId, name: &[u8], inode: &Inode) -> Duration {
        if !self.names.load(Ordering::Relaxed) || name == b"." || name == b".." {
            return Duration::ZERO;
        }
        self.client
            .name_ttl(dir, name, inode.handle())
            .min(self.ttl)
    }

    fn reply_attr(&self, reply: ReplyAttr, inode: &Inode) {
        reply.attr(&self.attr_ttl(inode), &file_attr(inode, self.blksize));
    }

    /// How long the kernel may keep `inode`'s attributes: the TTL, and no
    /// longer than the client's lease on it may be trusted (a server that
    /// stops answering cannot leave them kept past the moment another
    /// mount could be granted the object).
    fn attr_ttl(&self, inode: &Inode) -> Duration {
        self.client
            .attr_trust(inode.id)
            .map_or(self.ttl, |t| t.min(self.ttl))
    }

    /// The id a listing of `dir` from `offset` shows for `..`: its parent's
    /// if `..` is still to be listed (else it is not needed: `dir`).
    async fn listed_parent(&self, dir: FileId, offset: u64) -> Result<FileId, Error> {
        if dirents::resume(offset).dotdot {
            self.parent_of(dir).await
        } else {
            Ok(dir)
        }
    }

    /// The inode of `dir`'s parent directory (the root is its own parent).
    async fn parent_of(&self, dir: FileId) -> Result<FileId, Error> {
        let inode = self.client.getattr_by_id(dir).await?;
        if inode.attr.kind != FileKind::Dir {
            return Err(Error::new(
                ErrorCode::NotDir,
                format!("{dir} is not a directory"),
            ));
        }
        Ok(if inode.parent == 0 { dir } else { inode.parent })
    }
}

/// The FUSE file system of one mount.
pub(crate) struct MorrisFs {
    shared: Arc<Shared>,
    rt: Handle,
    /// Ask the kernel for `READDIRPLUS` (`MountOptions::readdirplus`).
    readdirplus: bool,
    /// Requests handed to tasks and not answered yet.
    in_flight: Arc<AtomicUsize>,
}

/// Counts one request in flight until dropped (answered, or dropped with
/// its task).
pub(crate) struct InFlight(Arc<AtomicUsize>);

impl InFlight {
    pub(crate) fn enter(count: &Arc<AtomicUsize>) -> Self {
        count.fetch_add(1, Ordering::SeqCst);
        InFlight(count.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

tokio::task_local! {
    /// The errno a request's task replied with (0: it succeeded), for the
    /// access log.
    static OUTCOME: Cell<i32>;
}

/// Replies `errno` to a request, noting it for the access log.
macro_rules! refuse {
    ($reply:expr, $errno:expr) => {{
        let errno: Errno = $errno;
        let _ = OUTCOME.try_with(|o| o.set(errno.code()));
        $reply.error(errno)
    }};
}

/// A request being answered: what is recorded when it is (its time, and
/// the access log's line).
struct Done {
    shared: Arc<Shared>,
    op: &'static str,
    ino: u64,
    who: (u32, u32, u32),
    started: Instant,
}

impl Done {
    /// Records the request as answered with `errno` (0: it succeeded).
    fn finish(self, errno: i32) {
        let took = self.started.elapsed();
        self.shared.timers.record(self.op, took, errno != 0);
        if let Some(log) = &self.shared.access {
            log.record(self.who, self.op, self.ino, errno, took);
        }
    }
}

impl MorrisFs {
    /// A file system answering from `client`, running its tasks on `rt`
    /// and counting the requests they have not answered in `in_flight`.
    pub(crate) fn new(
        client: Arc<Client>,
        rt: Handle,
        ttl: Duration,
        blksize: u32,
        in_flight: Arc<AtomicUsize>,
        access: Option<crate::access::AccessLog>,
        names: Arc<AtomicBool>,
    ) -> Self {
        MorrisFs {
            shared: Arc::new(Shared {
                client,
                ttl,
                names,
                blksize,
                timers: OpTimers::new(
                    "morris_fuse_request_duration_seconds",
                    Some("morris_fuse_request_errors_total"),
                    &TIMED,
                ),
                access,
            }),
            rt,
            readdirplus: true,
            in_flight,
        }
    }

    /// Whether to ask the kernel for `READDIRPLUS` (default `true`).
    pub(crate) fn with_readdirplus(mut self, on: bool) -> Self {
        self.readdirplus = on;
        self
    }

    /// Runs `work` on the runtime with the shared state. If the runtime has
    /// shut down the task (and with it the reply) is dropped, and fuser
    /// answers the request with `EIO`.
    fn spawn<F, Fut>(&self, op: &'static str, req: &Request, ino: u64, work: F)
    where
        F: FnOnce(Arc<Shared>) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let started = Instant::now();
        let counted = InFlight::enter(&self.in_flight);
        let done = Done {
            shared: self.shared.clone(),
            op,
            ino,
            who: (req.uid(), req.gid(), req.pid()),
            started,
        };
        let mut fut = Box::pin(OUTCOME.scope(Cell::new(0), work(self.shared.clone())));
        // Polled once on this FUSE thread first: a request answered without
        // waiting (a write gathered in the client, attributes or names under
        // a held lease) then costs no hand-over to a runtime thread and
        // back, which is most of its time. A future that must wait goes on
        // to the runtime and is polled there again, with a real waker.
        let first = {
            let _in = self.rt.enter();
            let mut cx = std::task::Context::from_waker(futures::task::noop_waker_ref());
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| fut.as_mut().poll(&mut cx)))
        };
        match first {
            Ok(std::task::Poll::Ready(())) => {
                drop(counted);
                done.finish(fut.as_mut().take_value().map_or(0, |c| c.get()));
            }
            Ok(std::task::Poll::Pending) => {
                self.rt.spawn(async move {
                    (&mut fut).await;
                    drop(counted);
                    done.finish(fut.as_mut().take_value().map_or(0, |c| c.get()));
                });
            }
            // (The runtime shutting down under it: the reply is dropped,
            // and fuser answers `EIO`.)
            Err(_) => tracing::warn!("a request's handler panicked"),
        }
    }
}

/// Who is asking. The kernel checks permissions (`default_permissions`), so
/// the library does not.
fn caller(req: &Request) -> Caller {
    Caller {
        uid: req.uid(),
        gid: req.gid(),
        groups: vec![],
        check: false,
        umask: 0,
    }
}

/// The supplementary groups of process `pid` (`Groups:` in its
/// `/proc/PID/status`); none if it cannot be read (the process is gone).
fn groups_of(pid: u32) -> Vec<u32> {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return Vec::new();
    };
    status
        .lines()
        .find_map(|l| l.strip_prefix("Groups:"))
        .map(|g| {
            g.split_whitespace()
                .filter_map(|x| x.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// The kernel's "to the end of the file" (`OFFSET_MAX`).
const OFFSET_MAX: u64 = i64::MAX as u64;

/// A lock's last byte as the volume keeps it (`u64::MAX`: to the end).
fn lock_end(end: u64) -> u64 {
    if end >= OFFSET_MAX {
        u64::MAX
    } else {
        end
    }
}

/// A lock's last byte as the kernel takes it (at most `OFFSET_MAX`).
fn kernel_end(end: u64) -> u64 {
    end.min(OFFSET_MAX)
}

/// Whether thread `tid` has a signal pending that it does not block: a
/// lock it waits for is then given up (`EINTR`), as the kernel would for a
/// local lock. fuser does not pass `FUSE_INTERRUPT` on, so the mount looks.
fn signal_pending(tid: u32) -> bool {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{tid}/status")) else {
        // Gone: nobody waits any more.
        return true;
    };
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
            .unwrap_or(0)
    };
    (field("SigPnd:") | field("ShdPnd:")) & !field("SigBlk:") != 0
}

/// Answers a `getxattr`/`listxattr`: the size alone when asked with no
/// buffer, `ERANGE` when the buffer is too small.
fn xattr_reply(reply: ReplyXattr, size: u32, data: &[u8]) {
    match u32::try_from(data.len()) {
        Ok(n) if size == 0 => reply.size(n),
        Ok(n) if n <= size => reply.data(data),
        _ => refuse!(reply, Errno::ERANGE),
    }
}

fn bytes(name: &OsStr) -> Vec<u8> {
    name.as_bytes().to_vec()
}

/// Entries looked up at once in a readdirplus (Linux 6.18 asks for
/// thousands of entries per call; a small batch would wait for one round
/// of lookups after another). Leases taken for entries the reply has no
/// room for are used by the next call.
const PLUS_BATCH: u32 = 128;

/// The kernel's readdirplus buffer: an entry the client looked up goes
/// with its attributes (kept for the TTL, its name for `name_ttl`), any
/// other as a plain listing has it.
struct PlusSink<'a> {
    reply: &'a mut ReplyDirectoryPlus,
    shared: &'a Shared,
    dir: FileId,
    /// Entries this reply may still take.
    left: usize,
}

impl dirents::DirSink<(DirEntry, Option<Inode>)> for PlusSink<'_> {
    fn add(
        &mut self,
        ino: u64,
        offset: u64,
        kind: FileType,
        name: &[u8],
        item: Option<&(DirEntry, Option<Inode>)>,
    ) -> bool {
        let shown = OsStr::from_bytes(name);
        if item.is_some() {
            if self.left == 0 {
                return true;
            }
            self.left -= 1;
        }
        match item.and_then(|(_, i)| i.as_ref()) {
            Some(inode) => self.reply.add_with_ttls(
                offset,
                shown,
                &self.shared.name_ttl(self.dir, name, inode),
                &self.shared.attr_ttl(inode),
                &file_attr(inode, self.shared.blksize),
                Generation(u64::from(inode.gen)),
            ),
            None => self.reply.add_bare(INodeNo(ino), offset, kind, shown),
        }
    }

    /// A reply that has its batch ends before the next batch is looked up.
    fn takes_more(&self) -> bool {
        self.left > 0
    }
}

/// Whether an open with `flags` may write.
fn writes(flags: i32) -> bool {
    OpenFlags(flags).acc_mode() != OpenAccMode::O_RDONLY
}

/// Answers a create (or `O_TMPFILE`) of `inode`, opened as `fh` with
/// open flags `flags`. The reply's one TTL covers the attributes and the
/// name (`ttl`: see `Shared::name_ttl`; zero for `O_TMPFILE`).
fn created(reply: ReplyCreate, inode: &Inode, ttl: Duration, blksize: u32, fh: u64, flags: i32) {
    let attr = file_attr(inode, blksize);
    let gen = Generation(u64::from(inode.gen));
    reply.created(&ttl, &attr, gen, FileHandle(fh), open_flags(flags));
}

/// How the kernel should treat an open file. Writes through an `O_APPEND`
/// descriptor bypass the page cache (`FOPEN_DIRECT_IO`): the client puts
/// them at the end of the file as the volume has it, which another mount
/// may have moved since the kernel last looked, so the kernel's copy of
/// the pages it thinks it wrote would be wrong.
fn open_flags(flags: i32) -> FopenFlags {
    if writes(flags) && flags & libc::O_APPEND != 0 {
        FopenFlags::FOPEN_DIRECT_IO
    } else {
        FopenFlags::empty()
    }
}

/// `statfs` numbers: `(blocks, free blocks, available blocks, files, free
/// files, block size)`. The volume has no inode table; new inodes are
/// bounded only by free space, so one free inode per available block is
/// reported.
fn statfs_numbers(st: &morris_client::FsStat) -> (u64, u64, u64, u64, u64, u32) {
    let bsize = if st.block_size == 0 {
        4096
    } else {
        st.block_size
    };
    let blocks = st.total / u64::from(bsize);
    let bfree = st.free / u64::from(bsize);
    let bavail = st.avail / u64::from(bsize);
    (
        blocks,
        bfree,
        bavail,
        st.files.saturating_add(st.files_free),
        st.files_free,
        bsize,
    )
}

/// Negotiates the FUSE connection: capabilities, 1 MiB requests, and how
/// many asynchronous requests the kernel keeps outstanding.
pub(crate) fn configure(config: &mut KernelConfig, readdirplus: bool) {
    let wanted = wanted_capabilities(readdirplus);
    let offered = wanted & config.capabilities();
    if let Err(missing) = config.add_capabilities(offered) {
        tracing::warn!(?missing, "kernel refused FUSE capabilities it offered");
    }
    let absent = wanted - offered;
    if !absent.is_empty() {
        tracing::info!(?absent, "kernel lacks some FUSE capabilities");
    }
    if let Err(max) = config.set_max_write(MAX_IO) {
        let _ = config.set_max_write(max);
    }
    // The kernel only lets the handshake lower its readahead window; the
    // window is raised after mounting, through sysfs (see `mountinfo`).
    if let Err(max) = config.set_max_readahead(MAX_IO) {
        let _ = config.set_max_readahead(max);
    }
    let _ = config.set_max_background(MAX_BACKGROUND);
    let _ = config.set_congestion_threshold(CONGESTION_THRESHOLD);
    tracing::debug!(abi = ?config.kernel_abi(), "FUSE session initialised");
}

impl Filesystem for MorrisFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> io::Result<()> {
        configure(config, self.readdirplus);
        Ok(())
    }

    fn lookup(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let name = bytes(name);
        self.spawn("lookup", req, parent.0, move |s| async move {
            // "." and ".." arrive only with FUSE_EXPORT_SUPPORT (NFS export,
            // open_by_handle_at), for ids this mount may never have seen
            // (a handle made before a remount); the kernel checks the
            // generation in its handle against the one answered.
            let res = match name.as_slice() {
                b"." => s.client.getattr_by_id(parent.0).await,
                b".." => match s.parent_of(parent.0).await {
                    Ok(p) => s.client.getattr_by_id(p).await,
                    Err(e) => Err(e),
                },
                _ => s.client.lookup(parent.0, &name).await,
            };
            match res {
                Ok(inode) => s.reply_entry(reply, parent.0, &name, &inode),
                Err(e) => refuse!(reply, fail("lookup", parent.0, &e)),
            }
        });
    }

    fn forget(&self, _req: &Request, _ino: INodeNo, _nlookup: u64) {
        // File ids are never reused and the client keeps no per-lookup state.
    }

    fn getattr(&self, req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        self.spawn("getattr", req, ino.0, move |s| async move {
            match s.client.getattr(ino.0).await {
                Ok(inode) => s.reply_attr(reply, &inode),
                Err(e) => refuse!(reply, fail("getattr", ino.0, &e)),
            }
        });
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let set = set_attr(mode, uid, gid, size, atime, mtime, ctime, Timestamp::now());
        let who = caller(req);
        // Set-ID bits go on a change of owner or group, and on a truncate
        // by a caller without CAP_FSETID (taken as: not root), unless the
        // same call sets the mode (`FUSE_HANDLE_KILLPRIV_V2`).
        let kill =
            mode.is_none() && (uid.is_some() || gid.is_some() || (size.is_some() && who.uid != 0));
        self.spawn("setattr", req, ino.0, move |s| async move {
            let res = if is_empty(&set) {
                s.client.getattr(ino.0).await
            } else {
                match s.client.setattr(ino.0, set, &who).await {
                    Ok(i) if kill && i.attr.mode & 0o6000 != 0 => {
                        match s.client.clear_setid(ino.0).await {
                            Ok(()) => s.client.getattr(ino.0).await,
                            Err(e) => Err(e),
                        }
                    }
                    r => r,
                }
            };
            match res {
                Ok(inode) => s.reply_attr(reply, &inode),
                Err(e) => refuse!(reply, fail("setattr", ino.0, &e)),
            }
        });
    }

    fn readlink(&self, req: &Request, ino: INodeNo, reply: ReplyData) {
        self.spawn("readlink", req, ino.0, move |s| async move {
            match s.client.readlink(ino.0).await {
                Ok(target) => reply.data(&target),
                Err(e) => refuse!(reply, fail("readlink", ino.0, &e)),
            }
        });
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let Some(kind) = mknod_kind(mode) else {
            refuse!(reply, Errno::EINVAL);
            return;
        };
        let name = bytes(name);
        let who = Caller {
            umask,
            ..caller(req)
        };
        self.spawn("mknod", req, parent.0, move |s| async move {
            // mknod(2) fails on an existing name: exclusive.
            match s
                .client
                .create(parent.0, &name, kind, mode & 0o7777, rdev, true, &who)
                .await
            {
                Ok(inode) => s.reply_entry(reply, parent.0, &name, &inode),
                Err(e) => refuse!(reply, fail("mknod", parent.0, &e)),
            }
        });
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let name = bytes(name);
        let who = Caller {
            umask,
            ..caller(req)
        };
        self.spawn("mkdir", req, parent.0, move |s| async move {
            match s.client.mkdir(parent.0, &name, mode & 0o7777, &who).await {
                Ok(inode) => s.reply_entry(reply, parent.0, &name, &inode),
                Err(e) => refuse!(reply, fail("mkdir", parent.0, &e)),
            }
        });
    }

    fn unlink(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let name = bytes(name);
        let who = caller(req);
        self.spawn("unlink", req, parent.0, move |s| async move {
            match s.client.unlink(parent.0, &name, &who).await {
                Ok(()) => reply.ok(),
                Err(e) => refuse!(reply, fail("unlink", parent.0, &e)),
            }
        });
    }

    fn rmdir(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let name = bytes(name);
        let who = caller(req);
        self.spawn("rmdir", req, parent.0, move |s| async move {
            match s.client.rmdir(parent.0, &name, &who).await {
                Ok(()) => reply.ok(),
                Err(e) => refuse!(reply, fail("rmdir", parent.0, &e)),
            }
        });
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let name = bytes(link_name);
        let target = bytes(target.as_os_str());
        let who = caller(req);
        self.spawn("symlink", req, parent.0, move |s| async move {
            match s.client.symlink(parent.0, &name, &target, &who).await {
                Ok(inode) => s.reply_entry(reply, parent.0, &name, &inode),
                Err(e) => refuse!(reply, fail("symlink", parent.0, &e)),
            }
        });
    }

    fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let known = RenameFlags::RENAME_NOREPLACE
            | RenameFlags::RENAME_EXCHANGE
            | RenameFlags::RENAME_WHITEOUT;
        if !(flags - known).is_empty() {
            refuse!(reply, Errno::EINVAL);
            return;
        }
        let flags = morris_client::RenameFlags {
            noreplace: flags.contains(RenameFlags::RENAME_NOREPLACE),
            exchange: flags.contains(RenameFlags::RENAME_EXCHANGE),
            whiteout: flags.contains(RenameFlags::RENAME_WHITEOUT),
        };
        let (name, newname) = (bytes(name), bytes(newname));
        let who = caller(req);
        self.spawn("rename", req, parent.0, move |s| async move {
            match s
                .client
                .rename(parent.0, &name, newparent.0, &newname, flags, &who)
                .await
            {
                Ok(()) => reply.ok(),
                // renameat2(2) reports a flag the file system cannot honour as
                // EINVAL (an ENOSYS would make the kernel refuse every flagged
                // rename, RENAME_NOREPLACE included, for the rest of the mount).
                Err(e)
                    if e.code == ErrorCode::NotSupported
                        && (flags.exchange || flags.noreplace || flags.whiteout) =>
                {
                    fail("rename", parent.0, &e);
                    refuse!(reply, Errno::EINVAL);
                }
                Err(e) => refuse!(reply, fail("rename", parent.0, &e)),
            }
        });
    }

    fn link(
        &self,
        req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let newname = bytes(newname);
        let who = caller(req);
        self.spawn("link", req, ino.0, move |s| async move {
            match s.client.link(ino.0, newparent.0, &newname, &who).await {
                Ok(inode) => s.reply_entry(reply, newparent.0, &newname, &inode),
                Err(e) => refuse!(reply, fail("link", ino.0, &e)),
            }
        });
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let write = writes(flags.0);
        // Present because FUSE_ATOMIC_O_TRUNC was negotiated; without it the
        // kernel truncates with a setattr before the open.
        let truncate = flags.0 & libc::O_TRUNC != 0;
        let append = flags.0 & libc::O_APPEND != 0;
        let how = open_flags(flags.0);
        // A truncating open by a caller without CAP_FSETID (taken as: not
        // root) clears set-ID bits (`FUSE_HANDLE_KILLPRIV_V2`).
        let kill = truncate && write && req.uid() != 0;
        self.spawn("open", req, ino.0, move |s| async move {
            match s.client.open_with(ino.0, write, truncate, append).await {
                Ok(fh) => {
                    if kill {
                        if let Err(e) = s.client.clear_setid(ino.0).await {
                            let _ = s.client.release(fh).await;
                            return refuse!(reply, fail("open", ino.0, &e));
                        }
                    }
                    let keep = if s.client.open_keeps_cache(fh) {
                        FopenFlags::FOPEN_KEEP_CACHE
                    } else {
                        FopenFlags::empty()
                    };
                    reply.opened(FileHandle(fh), how | keep)
                }
                Err(e) => refuse!(reply, fail("open", ino.0, &e)),
            }
        });
    }

    fn read(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        self.spawn("read", req, ino.0, move |s| async move {
            match s.client.read(fh.0, offset, size).await {
                Ok(data) => reply.data(&data),
                Err(e) => refuse!(reply, fail("read", ino.0, &e)),
            }
        });
    }

    fn write(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        // The request buffer is reused by the FUSE thread as soon as we return.
        let data = Bytes::copy_from_slice(data);
        let len = data.len() as u32;
        // The kernel computed `offset` for O_APPEND from its cached size,
        // which another mount's appends may have made stale: the client
        // appends at the end the volume has now.
        let append = flags.0 & libc::O_APPEND != 0;
        // A writer without CAP_FSETID (`FUSE_HANDLE_KILLPRIV_V2`).
        let kill = write_flags.contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID);
        self.spawn("write", req, ino.0, move |s| async move {
            if kill {
                if let Err(e) = s.client.clear_setid(ino.0).await {
                    return refuse!(reply, fail("write", ino.0, &e));
                }
            }
            let res = if append {
                s.client.append(fh.0, data, offset).await.map(|_| len)
            } else {
                s.client.write(fh.0, offset, data).await
            };
            match res {
                Ok(n) => reply.written(n),
                Err(e) => refuse!(reply, fail("write", ino.0, &e)),
            }
        });
    }

    fn flush(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        self.spawn("flush", req, ino.0, move |s| async move {
            // A close: the closing process's POSIX locks on the file go.
            let unlocked = s.client.flush_locks(fh.0, lock_owner.0).await;
            match s.client.flush(fh.0).await.and(unlocked) {
                Ok(()) => reply.ok(),
                Err(e) => refuse!(reply, fail("flush", ino.0, &e)),
            }
        });
    }

    fn getlk(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        lock_owner: LockOwner,
        start: u64,
        end: u64,
        typ: i32,
        _pid: u32,
        reply: ReplyLock,
    ) {
        let write = typ == libc::F_WRLCK;
        let range = (start, lock_end(end));
        self.spawn("getlk", req, ino.0, move |s| async move {
            match s.client.test_lock(fh.0, lock_owner.0, range, write).await {
                Ok(Some(l)) => {
                    let typ = if l.write {
                        libc::F_WRLCK
                    } else {
                        libc::F_RDLCK
                    };
                    reply.locked(l.start, kernel_end(l.end), typ, l.pid)
                }
                Ok(None) => reply.locked(start, end, libc::F_UNLCK, 0),
                Err(e) => refuse!(reply, fail("getlk", ino.0, &e)),
            }
        });
    }

    fn setlk(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        lock_owner: LockOwner,
        start: u64,
        end: u64,
        typ: i32,
        pid: u32,
        sleep: bool,
        reply: ReplyEmpty,
    ) {
        let kind = match typ {
            libc::F_RDLCK => LockKind::Read,
            libc::F_WRLCK => LockKind::Write,
            libc::F_UNLCK => LockKind::Unlock,
            _ => return refuse!(reply, Errno::EINVAL),
        };
        let (range, caller) = ((start, lock_end(end)), req.pid());
        self.spawn("setlk", req, ino.0, move |s| async move {
            let interrupted = || signal_pending(caller);
            match s
                .client
                .lock(fh.0, lock_owner.0, pid, range, kind, sleep, interrupted)
                .await
            {
                Ok(()) => reply.ok(),
                Err(e) => refuse!(reply, fail("setlk", ino.0, &e)),
            }
        });
    }

    fn release(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        flush: bool,
        reply: ReplyEmpty,
    ) {
        self.spawn("release", req, ino.0, move |s| async move {
            let flushed = if flush {
                s.client.flush(fh.0).await
            } else {
                Ok(())
            };
            // Release even if the flush failed, or the open file would leak.
            let released = s.client.release(fh.0).await;
            match flushed.and(released) {
                Ok(()) => reply.ok(),
                Err(e) => refuse!(reply, fail("release", ino.0, &e)),
            }
        });
    }

    fn fsync(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.spawn("fsync", req, ino.0, move |s| async move {
            match s.client.fsync(fh.0, datasync).await {
                Ok(()) => reply.ok(),
                Err(e) => refuse!(reply, fail("fsync", ino.0, &e)),
            }
        });
    }

    fn opendir(&self, req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        // Listings are stateless (see `dirents`); the handle only keeps the
        // directory open, so it outlives an rmdir or a rename over it.
        self.spawn("opendir", req, ino.0, move |s| async move {
            match s.client.open(ino.0, false, false).await {
                Ok(fh) => reply.opened(FileHandle(fh), FopenFlags::empty()),
                Err(e) => refuse!(reply, fail("opendir", ino.0, &e)),
            }
        });
    }

    fn readdir(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        self.spawn("readdir", req, ino.0, move |s| async move {
            let dir = ino.0;
            let parent = match s.listed_parent(dir, offset).await {
                Ok(p) => p,
                Err(e) => return refuse!(reply, fail("readdir", dir, &e)),
            };
            let client = &s.client;
            let res = dirents::fill(&mut reply, dir, parent, offset, |cookie, max| {
                client.readdir(dir, cookie, max)
            })
            .await;
            match res {
                Ok(()) => reply.ok(),
                Err(errno) => refuse!(reply, errno),
            }
        });
    }

    /// A listing with each entry's attributes, so that the kernel need not
    /// look the names up one by one (`ls -l`). The kernel asks for it for a
    /// directory's first batch and while lookups follow its listings
    /// (`FUSE_READDIRPLUS_AUTO`); the client looks a batch's names up at
    /// once (`Client::readdir_plus`), taking their read leases as lookups do.
    /// Entries the mount looked up before go without attributes: the
    /// kernel has them, and would drop their cached ACLs on being given
    /// them again (so `ls -l` would ask for each one's ACL anew).
    fn readdirplus(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        self.spawn("readdirplus", req, ino.0, move |s| async move {
            let dir = ino.0;
            let parent = match s.listed_parent(dir, offset).await {
                Ok(p) => p,
                Err(e) => return refuse!(reply, fail("readdirplus", dir, &e)),
            };
            let client = &s.client;
            let mut sink = PlusSink {
                reply: &mut reply,
                shared: &s,
                dir,
                // The kernel asks for a listing's first buffer with
                // attributes whether or not the program looks at them
                // (`ls -f`, `find -name`): one batch, then. It asks for
                // the next ones so only if the program stat'ed these.
                left: if offset == 0 {
                    PLUS_BATCH as usize
                } else {
                    usize::MAX
                },
            };
            let res = dirents::fill(&mut sink, dir, parent, offset, |cookie, max| {
                client.readdir_plus(dir, cookie, max.min(PLUS_BATCH))
            })
            .await;
            match res {
                Ok(()) => reply.ok(),
                Err(errno) => refuse!(reply, errno),
            }
        });
    }

    fn releasedir(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.spawn("releasedir", req, ino.0, move |s| async move {
            match s.client.release(fh.0).await {
                Ok(()) => reply.ok(),
                Err(e) => refuse!(reply, fail("releasedir", ino.0, &e)),
            }
        });
    }

    fn fsyncdir(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        // Names of new files still on their way to the directory's owner
        // (`names_behind`); every other namespace change is stored by
        // its server before it is answered.
        self.spawn("fsyncdir", req, ino.0, move |s| async move {
            match s.client.fsync_dir(ino.0).await {
                Ok(()) => reply.ok(),
                Err(e) => refuse!(reply, fail("fsyncdir", ino.0, &e)),
            }
        });
    }

    fn statfs(&self, req: &Request, ino: INodeNo, reply: ReplyStatfs) {
        self.spawn("statfs", req, ino.0, move |s| async move {
            match s.client.statfs().await {
                Ok(st) => {
                    let (blocks, bfree, bavail, files, ffree, bsize) = statfs_numbers(&st);
                    reply.statfs(
                        blocks,
                        bfree,
                        bavail,
                        files,
                        ffree,
                        bsize,
                        MAX_NAME_LEN as u32,
                        bsize,
                    );
                }
                Err(e) => refuse!(reply, fail("statfs", ino.0, &e)),
            }
        });
    }

    fn access(&self, req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        // Only called without `default_permissions`; then the library checks.
        let who = Caller {
            check: true,
            ..caller(req)
        };
        let mask = (mask.bits() & (libc::R_OK | libc::W_OK | libc::X_OK)) as u32;
        self.spawn("access", req, ino.0, move |s| async move {
            match s.client.access(ino.0, mask, &who).await {
                Ok(()) => reply.ok(),
                Err(e) => refuse!(reply, fail("access", ino.0, &e)),
            }
        });
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let name = bytes(name);
        let who = Caller {
            umask,
            ..caller(req)
        };
        let exclusive = flags & libc::O_EXCL != 0;
        let truncate = flags & libc::O_TRUNC != 0;
        let write = writes(flags);
        self.spawn("create", req, parent.0, move |s| async move {
            let inode = match s
                .client
                .create(
                    parent.0,
                    &name,
                    FileKind::File,
                    mode & 0o7777,
                    0,
                    exclusive,
                    &who,
                )
                .await
            {
                Ok(inode) => inode,
                Err(e) => return refuse!(reply, fail("create", parent.0, &e)),
            };
            // Without O_EXCL the file may be one another client just created:
            // O_TRUNC then applies to it as to any existing file.
            let append = flags & libc::O_APPEND != 0;
            match s.client.open_with(inode.id, write, truncate, append).await {
                Ok(fh) => {
                    let ttl = s.name_ttl(parent.0, &name, &inode);
                    created(reply, &inode, ttl, s.blksize, fh, flags)
                }
                Err(e) => refuse!(reply, fail("create", parent.0, &e)),
            }
        });
    }

    /// `open(2)` with `O_TMPFILE`: a file without a name, open; without
    /// `O_EXCL`, `linkat(2)` may name it later.
    fn tmpfile(
        &self,
        req: &Request,
        parent: INodeNo,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let who = Caller {
            umask,
            ..caller(req)
        };
        let write = writes(flags);
        let linkable = flags & libc::O_EXCL == 0;
        self.spawn("tmpfile", req, parent.0, move |s| async move {
            match s
                .client
                .tmpfile(parent.0, mode & 0o7777, write, linkable, &who)
                .await
            {
                Ok((inode, fh)) => created(reply, &inode, Duration::ZERO, s.blksize, fh, flags),
                Err(e) => refuse!(reply, fail("tmpfile", parent.0, &e)),
            }
        });
    }

    // Extended attributes: `user.`, `trusted.`, `security.` (the kernel
    // checks permissions; `system.` ACLs it answers itself, EOPNOTSUPP).
    // The kernel asks for `security.capability` before every write: the
    // client answers from the list it keeps with the lease.

    fn setxattr(
        &self,
        req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        let how = match flags & (libc::XATTR_CREATE | libc::XATTR_REPLACE) {
            0 => XattrHow::Either,
            libc::XATTR_CREATE => XattrHow::Create,
            libc::XATTR_REPLACE => XattrHow::Replace,
            _ => return refuse!(reply, Errno::EINVAL),
        };
        let (mut caller, name, value) = (caller(req), bytes(name), value.to_vec());
        if name == morris_proto::acl::ACCESS {
            // Whether setting it keeps a set-group-ID bit depends on the
            // caller's groups, which FUSE does not pass.
            caller.groups = groups_of(req.pid());
        }
        self.spawn("setxattr", req, ino.0, move |s| async move {
            match s.client.set_xattr(ino.0, &name, &value, how, &caller).await {
                Ok(()) => reply.ok(),
                Err(e) => refuse!(reply, fail("setxattr", ino.0, &e)),
            }
        });
    }

    fn getxattr(&self, req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let (caller, name) = (caller(req), bytes(name));
        self.spawn("getxattr", req, ino.0, move |s| async move {
            match s.client.get_xattr(ino.0, &name, &caller).await {
                Ok(v) => xattr_reply(reply, size, &v),
                Err(e) => refuse!(reply, fail("getxattr", ino.0, &e)),
            }
        });
    }

    fn listxattr(&self, req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let caller = caller(req);
        self.spawn("listxattr", req, ino.0, move |s| async move {
            match s.client.list_xattrs(ino.0, &caller).await {
                Ok(list) => {
                    let mut names = Vec::new();
                    for x in list.iter() {
                        names.extend_from_slice(&x.name);
                        names.push(0);
                    }
                    xattr_reply(reply, size, &names)
                }
                Err(e) => refuse!(reply, fail("listxattr", ino.0, &e)),
            }
        });
    }

    fn removexattr(&self, req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let (caller, name) = (caller(req), bytes(name));
        self.spawn("removexattr", req, ino.0, move |s| async move {
            match s.client.remove_xattr(ino.0, &name, &caller).await {
                Ok(()) => reply.ok(),
                Err(e) => refuse!(reply, fail("removexattr", ino.0, &e)),
            }
        });
    }

    fn lseek(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: i64,
        whence: i32,
        reply: ReplyLseek,
    ) {
        // The kernel sends only these two; the others it answers itself.
        let hole = match whence {
            libc::SEEK_DATA => false,
            libc::SEEK_HOLE => true,
            _ => return refuse!(reply, Errno::EINVAL),
        };
        let Ok(from) = u64::try_from(offset) else {
            return refuse!(reply, Errno::ENXIO);
        };
        self.spawn("lseek", req, ino.0, move |s| async move {
            match s.client.seek(fh.0, from, hole).await {
                Ok(Some(at)) => reply.offset(at as i64),
                Ok(None) => refuse!(reply, Errno::ENXIO),
                Err(e) => refuse!(reply, fail("lseek", ino.0, &e)),
            }
        });
    }

    fn fallocate(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let keep_size = mode & libc::FALLOC_FL_KEEP_SIZE != 0;
        let what = match mode & !libc::FALLOC_FL_KEEP_SIZE {
            0 => Fallocate::Allocate { keep_size },
            libc::FALLOC_FL_PUNCH_HOLE if keep_size => Fallocate::PunchHole,
            libc::FALLOC_FL_ZERO_RANGE => Fallocate::ZeroRange { keep_size },
            // Collapse, insert, unshare: the kernel does not pass them to
            // FUSE file systems (`fuse_file_fallocate`); refused if it ever does.
            _ => return refuse!(reply, Errno::EOPNOTSUPP),
        };
        self.spawn("fallocate", req, ino.0, move |s| async move {
            match s.client.fallocate(fh.0, offset, length, what).await {
                Ok(()) => reply.ok(),
                Err(e) => refuse!(reply, fail("fallocate", ino.0, &e)),
            }
        });
    }

    fn ioctl(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: IoctlFlags,
        cmd: u32,
        in_data: &[u8],
        _out_size: u32,
        reply: ReplyIoctl,
    ) {
        let who = caller(req);
        let set = match cmd {
            chattr::GETFLAGS | chattr::FSGETXATTR => None,
            chattr::SETFLAGS => match chattr::flags_arg(in_data) {
                Some(f) => Some(Ok(f)),
                None => return refuse!(reply, Errno::EINVAL),
            },
            chattr::FSSETXATTR => Some(Err(in_data.to_vec())),
            // What a local file system answers for ioctls it does not
            // know (e.g. the TCGETS of every isatty() on a regular file),
            // quietly: fuser's default logs a warning for each one.
            _ => return refuse!(reply, Errno::ENOTTY),
        };
        self.spawn("ioctl", req, ino.0, move |s| async move {
            let cur = match s.client.getattr(ino.0).await {
                Ok(i) => i.attr.flags,
                Err(e) => return refuse!(reply, fail("ioctl", ino.0, &e)),
            };
            let want = match set {
                None if cmd == chattr::GETFLAGS => {
                    return reply.ioctl(0, &cur.to_ne_bytes());
                }
                None => return reply.ioctl(0, &chattr::fsxattr(cur)),
                Some(Ok(f)) => f,
                Some(Err(x)) => match chattr::from_fsxattr(&x, cur) {
                    Ok(f) => f,
                    Err(()) => return refuse!(reply, Errno::EOPNOTSUPP),
                },
            };
            match s.client.set_flags(ino.0, want, &who).await {
                Ok(_) => reply.ioctl(0, &[]),
                Err(e) => refuse!(reply, fail("ioctl", ino.0, &e)),
            }
        });
    }

    fn copy_file_range(
        &self,
        req: &Request,
        ino_in: INodeNo,
        fh_in: FileHandle,
        offset_in: u64,
        _ino_out: INodeNo,
        fh_out: FileHandle,
        offset_out: u64,
        len: u64,
        _flags: CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        // The kernel wrote the source's dirty pages back first, and drops
        // the destination's cached pages of the range after.
        self.spawn("copy_file_range", req, 0, move |s| async move {
            let copied = s
                .client
                .copy_range(fh_in.0, offset_in, fh_out.0, offset_out, len)
                .await;
            match copied {
                // At most MAX_COPY (1 GiB): fits.
                Ok(n) => reply.written(u32::try_from(n).unwrap_or(u32::MAX)),
                Err(e) => refuse!(reply, fail("copy_file_range", ino_in.0, &e)),
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn appending_descriptors_bypass_the_page_cache() {
        assert_eq!(
            open_flags(libc::O_WRONLY | libc::O_APPEND),
            FopenFlags::FOPEN_DIRECT_IO
        );
        assert_eq!(
            open_flags(libc::O_RDWR | libc::O_APPEND | libc::O_CREAT),
            FopenFlags::FOPEN_DIRECT_IO
        );
        assert_eq!(open_flags(libc::O_WRONLY), FopenFlags::empty());
        assert_eq!(
            open_flags(libc::O_RDONLY | libc::O_APPEND),
            FopenFlags::empty()
        );
    }

    #[test]
    fn write_access_modes() {
        assert!(!writes(libc::O_RDONLY));
        assert!(!writes(libc::O_RDONLY | libc::O_TRUNC | libc::O_NOFOLLOW));
        assert!(writes(libc::O_WRONLY));
        assert!(writes(libc::O_RDWR | libc::O_APPEND));
    }

    #[test]
    fn writeback_cache_is_never_requested() {
        let caps = wanted_capabilities(true);
        assert!(!caps.contains(InitFlags::FUSE_WRITEBACK_CACHE));
        // READDIRPLUS as the mount asks.
        let plus = InitFlags::FUSE_DO_READDIRPLUS | InitFlags::FUSE_READDIRPLUS_AUTO;
        assert!(caps.contains(plus));
        assert!(!wanted_capabilities(false).intersects(plus));
        assert_eq!(wanted_capabilities(false) | plus, caps);
        assert!(caps.contains(
            InitFlags::FUSE_ASYNC_READ | InitFlags::FUSE_BIG_WRITES | InitFlags::FUSE_MAX_PAGES
        ));
        // We answer "." and ".." lookups, which export support implies.
        assert!(caps.contains(InitFlags::FUSE_EXPORT_SUPPORT));
    }

    #[test]
    fn statfs_in_blocks() {
        let st = morris_client::FsStat {
            total: 10 << 30,
            free: (4 << 30) + 100,
            avail: 3 << 30,
            files: 1234,
            files_free: 5678,
            block_size: 1 << 20,
        };
        assert_eq!(
            statfs_numbers(&st),
            (10 << 10, 4 << 10, 3 << 10, 1234 + 5678, 5678, 1 << 20)
        );
        let zero = morris_client::FsStat {
            total: 8192,
            free: 4096,
            avail: 4096,
            files: 0,
            files_free: 1,
            block_size: 0,
        };
        assert_eq!(statfs_numbers(&zero), (2, 1, 1, 1, 1, 4096));
    }
}

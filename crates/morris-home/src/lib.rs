//! The home file system of a cached directory (cache mode, Panache).
//!
//! A directory of a morris volume can be bound to a *home*: another file
//! system, usually far away, whose tree the directory caches. Everything
//! morris asks of a home goes through the [`Home`] trait, so the client
//! library and the stripe servers never see a protocol. Two homes exist:
//!
//! * [`nfs::NfsHome`]: an NFSv3 server, reached from user space with
//!   `nfs3_client` (`nfs://host[:port]/export/path`);
//! * [`local::LocalHome`]: a local directory, which may be any mounted file
//!   system (`file:///path`).
//!
//! Both pass one conformance suite (`tests/common/mod.rs`, run for each
//! backend by its own test). What a home promises, whatever the protocol:
//!
//! * a [`HomeHandle`] names one object and never another: once the object
//!   is gone, or the handle no longer leads to it, a request on the handle
//!   answers [`HomeError::Stale`] (then look the name up again). Whether a
//!   handle outlives a rename at home depends on the home: an NFS server's
//!   handles do; a local directory's, which find their object by its path,
//!   answer `Stale`;
//! * a [`HomeAttr::fileid`] is the same for every hard link of one object;
//! * a listing is paged by home's own cookies, and a page can be asked for
//!   again from any cookie it returned (with the verifier that came with it);
//! * every request is bounded in time: a home that does not answer within
//!   the timeout it was opened with gives [`HomeError::Unreachable`], never
//!   a hang.

pub mod url;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use serde::{Deserialize, Serialize};

pub use url::HomeUrl;

/// How a home names one of its objects: opaque bytes (an NFSv3 file handle,
/// at most 64 bytes; for a local directory, the object's inode number,
/// birth time and path below the root).
#[derive(Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct HomeHandle(pub Vec<u8>);

impl std::fmt::Debug for HomeHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HomeHandle(")?;
        for b in self.0.iter().take(16) {
            write!(f, "{b:02x}")?;
        }
        if self.0.len() > 16 {
            write!(f, "..{}B", self.0.len())?;
        }
        write!(f, ")")
    }
}

/// What kind of object a home holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum HomeKind {
    /// A regular file.
    File,
    /// A directory.
    Dir,
    /// A symbolic link.
    Symlink,
    /// A block device node.
    BlockDev,
    /// A character device node.
    CharDev,
    /// A named pipe.
    Fifo,
    /// A socket.
    Socket,
}

/// A point in time at home: seconds and nanoseconds since the epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct HomeTime {
    /// Whole seconds since 1970-01-01 UTC (negative before).
    pub secs: i64,
    /// Nanoseconds within the second (below 10^9).
    pub nsecs: u32,
}

/// The attributes of a home object, as home reports them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HomeAttr {
    /// File, directory, symlink, ...
    pub kind: HomeKind,
    /// Permission bits, with set-uid, set-gid and sticky (`0o7777` at most).
    pub mode: u32,
    /// Number of names the object has.
    pub nlink: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Size in bytes (for a symlink, the length of its target).
    pub size: u64,
    /// Bytes of storage the object takes at home (less than `size` when sparse).
    pub used: u64,
    /// Device numbers of a device node (major, minor); zero otherwise.
    pub rdev: (u32, u32),
    /// Home's file system id.
    pub fsid: u64,
    /// Home's number for the object: equal for every hard link of it.
    pub fileid: u64,
    /// Last access.
    pub atime: HomeTime,
    /// Last change of the data.
    pub mtime: HomeTime,
    /// Last change of the inode (data or attributes).
    pub ctime: HomeTime,
}

impl HomeAttr {
    /// Whether the object's data or attributes changed between `self` (what
    /// was cached) and `now` (what home says now): Panache's revalidation
    /// compares home's mtime and ctime (and the size, for homes whose
    /// clocks are coarse).
    pub fn changed(&self, now: &HomeAttr) -> bool {
        self.mtime != now.mtime
            || self.ctime != now.ctime
            || self.size != now.size
            || self.kind != now.kind
    }
}

/// One entry of a home directory listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HomeEntry {
    /// The name, as bytes (never `.` or `..`: homes leave those out).
    pub name: Vec<u8>,
    /// Home's number for the object.
    pub fileid: u64,
    /// Home's cookie: listing again from it continues after this entry.
    pub cookie: u64,
    /// The object's handle and attributes, when the listing carried them
    /// (NFSv3 READDIRPLUS, a local directory); `None` when the caller must
    /// look the name up.
    pub plus: Option<(HomeHandle, HomeAttr)>,
}

/// One page of a directory listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirPage {
    /// The entries, in home's order.
    pub entries: Vec<HomeEntry>,
    /// Home's cookie verifier, to send back with the next page's cookie.
    pub verifier: [u8; 8],
    /// Whether this page ends the listing.
    pub eof: bool,
}

/// Bytes read from a home file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadReply {
    /// The bytes: fewer than asked at the end of the file, or when home
    /// answers short (ask again from where they end).
    pub data: Bytes,
    /// Whether the read reached the end of the file.
    pub eof: bool,
}

/// What went wrong at home.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HomeError {
    /// No such name.
    #[error("no such file or directory at home")]
    NotFound,
    /// The handle names an object home no longer has.
    #[error("stale handle: the object is gone at home")]
    Stale,
    /// A directory was expected.
    #[error("not a directory at home")]
    NotDir,
    /// Not a directory was expected (reading a directory's bytes, ...).
    #[error("is a directory at home")]
    IsDir,
    /// Home refused the request for lack of permission.
    #[error("permission denied by home")]
    Access,
    /// The request does not apply to this object (readlink of a file, ...).
    #[error("invalid request at home: {0}")]
    Invalid(String),
    /// A listing's cookie is no longer valid (the directory changed); list
    /// again from the start.
    #[error("home's listing cookie is no longer valid")]
    BadCookie,
    /// Home did not answer in time, or could not be reached.
    #[error("home unreachable: {0}")]
    Unreachable(String),
    /// The name exists already (a create, or a rename over a directory
    /// that is not empty is [`HomeError::NotEmpty`]).
    #[error("the name exists at home")]
    Exists,
    /// A directory to remove (or to rename over) is not empty.
    #[error("directory not empty at home")]
    NotEmpty,
    /// Home is out of space or over a quota.
    #[error("no space left at home")]
    NoSpace,
    /// Home refuses every change (a read-only export or mount).
    #[error("home is read-only")]
    ReadOnly,
    /// Home answered with an I/O error, or with something this client
    /// cannot use.
    #[error("home I/O error: {0}")]
    Io(String),
}

/// Attributes to set at home; `None` leaves one as it is.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HomeSetAttr {
    /// Permission bits, with set-uid, set-gid and sticky (`0o7777` at most).
    pub mode: Option<u32>,
    /// Owner.
    pub uid: Option<u32>,
    /// Group.
    pub gid: Option<u32>,
    /// Size in bytes (a regular file only: truncated or extended with zeros).
    pub size: Option<u64>,
    /// Last access.
    pub atime: Option<HomeTime>,
    /// Last change of the data.
    pub mtime: Option<HomeTime>,
}

/// What [`Home::create`] makes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum HomeNew {
    /// An empty regular file.
    File,
    /// An empty directory.
    Dir,
    /// A symbolic link to the target (bytes, not empty).
    Symlink(Vec<u8>),
    /// A device node of this kind ([`HomeKind::BlockDev`] or
    /// [`HomeKind::CharDev`]) and device numbers (major, minor).
    Device(HomeKind, (u32, u32)),
    /// A named pipe.
    Fifo,
    /// A socket.
    Socket,
}

/// Result of a home request.
pub type Result<T, E = HomeError> = std::result::Result<T, E>;

/// Settings every home is opened with.
#[derive(Debug, Clone)]
pub struct HomeOptions {
    /// Longest any one request may take before it fails with
    /// [`HomeError::Unreachable`].
    pub timeout: Duration,
    /// Most requests in flight at once (connections, for NFS; threads, for
    /// a local directory).
    pub parallel: usize,
    /// The identity requests are made as (AUTH_UNIX for NFS).
    pub uid: u32,
    /// The group requests are made as.
    pub gid: u32,
}

impl Default for HomeOptions {
    fn default() -> Self {
        HomeOptions {
            timeout: Duration::from_secs(10),
            parallel: 8,
            uid: 0,
            gid: 0,
        }
    }
}

/// The home file system of a cached directory: what is read from it (cache
/// mode I) and written back to it (cache mode II). Requests on different
/// handles may run at once; each is bounded by [`HomeOptions::timeout`].
///
/// The write side is what a write-back queue replays, so each request
/// either applies whole or fails, and says precisely why: a create over an
/// existing name fails with [`HomeError::Exists`] (never replaces it), a
/// remove of a missing name with [`HomeError::NotFound`], so that a change
/// replayed after a crash can be told from one never applied by looking at
/// home.
#[async_trait]
pub trait Home: Send + Sync + std::fmt::Debug {
    /// The URL this home was opened from.
    fn url(&self) -> &HomeUrl;

    /// The handle and attributes of the home's root directory.
    async fn root(&self) -> Result<(HomeHandle, HomeAttr)>;

    /// Looks `name` up in directory `dir`.
    async fn lookup(&self, dir: &HomeHandle, name: &[u8]) -> Result<(HomeHandle, HomeAttr)>;

    /// The attributes of an object.
    async fn getattr(&self, handle: &HomeHandle) -> Result<HomeAttr>;

    /// One page of directory `dir`'s listing, after `cookie` (0: from the
    /// start) with the verifier that came with it; at most about
    /// `max_entries` entries, with handles and attributes if `plus`.
    async fn read_dir(
        &self,
        dir: &HomeHandle,
        cookie: u64,
        verifier: [u8; 8],
        max_entries: usize,
        plus: bool,
    ) -> Result<DirPage>;

    /// Up to `len` bytes of a file from `offset`.
    async fn read(&self, handle: &HomeHandle, offset: u64, len: u32) -> Result<ReadReply>;

    /// The target of a symbolic link.
    async fn read_link(&self, handle: &HomeHandle) -> Result<Vec<u8>>;

    /// The most bytes one [`Home::read`] returns (NFS: the server's rtmax).
    fn max_read(&self) -> u32;

    /// Makes `name` in directory `dir` with the attributes `attr` gives
    /// (mode, owner and times where set; the size of a new file only if
    /// set); [`HomeError::Exists`] if the name exists. Returns the new
    /// object's handle and attributes.
    async fn create(
        &self,
        dir: &HomeHandle,
        name: &[u8],
        what: &HomeNew,
        attr: &HomeSetAttr,
    ) -> Result<(HomeHandle, HomeAttr)>;

    /// Writes `data` to a regular file at `offset`; returns how many bytes
    /// home took (fewer than given: write the rest again). Not durable at
    /// home before [`Home::commit`].
    async fn write(&self, handle: &HomeHandle, offset: u64, data: Bytes) -> Result<u32>;

    /// Makes every write to a regular file so far durable at home. Fails
    /// with [`HomeError::Io`] if home may have lost writes made through
    /// this `Home` since the last commit (an NFS server that restarted in
    /// between, seen by its write verifier): write them again, then commit.
    /// Only as good as home's verifier: nfs-ganesha 4.3's is its start time
    /// in whole seconds, so a restart within the second goes unseen.
    async fn commit(&self, handle: &HomeHandle) -> Result<()>;

    /// Sets the attributes `set` gives; returns the attributes after.
    /// The mode of a symlink is left as it is (no home can change it), and
    /// some homes leave a symlink's times too (nfs-ganesha 4.3 answers OK
    /// and keeps them): the attributes returned say what home has.
    async fn setattr(&self, handle: &HomeHandle, set: &HomeSetAttr) -> Result<HomeAttr>;

    /// Removes the name `name` of something that is not a directory.
    async fn remove(&self, dir: &HomeHandle, name: &[u8]) -> Result<()>;

    /// Removes the empty directory `name`.
    async fn rmdir(&self, dir: &HomeHandle, name: &[u8]) -> Result<()>;

    /// Renames `from_dir/from` to `to_dir/to`, replacing what `to` named
    /// (as rename(2) does: a file over a file, an empty directory's name
    /// over a directory).
    async fn rename(
        &self,
        from_dir: &HomeHandle,
        from: &[u8],
        to_dir: &HomeHandle,
        to: &[u8],
    ) -> Result<()>;

    /// Gives `target` (not a directory) one more name, `dir/name`;
    /// [`HomeError::Exists`] if the name exists. Returns the handle the
    /// object has under the new name (a local home's handle carries the
    /// path) and its attributes.
    async fn link(
        &self,
        target: &HomeHandle,
        dir: &HomeHandle,
        name: &[u8],
    ) -> Result<(HomeHandle, HomeAttr)>;

    /// The most bytes one [`Home::write`] takes (NFS: the server's wtmax).
    fn max_write(&self) -> u32;

    /// The part of `handle` that names the object itself: equal for every
    /// name (hard link) of one object, different for a later object that
    /// home gives the same file number (a file removed and another made).
    /// NFS: the whole handle (servers put the inode's generation in it); a
    /// local directory: the inode number and birth time, without the path.
    fn identity<'a>(&self, handle: &'a HomeHandle) -> &'a [u8] {
        &handle.0
    }
}

/// Opens the home `url` names.
pub async fn open(url: &HomeUrl, options: HomeOptions) -> Result<Arc<dyn Home>> {
    match url {
        HomeUrl::Local { .. } => Ok(Arc::new(
            local::LocalHome::open(url.clone(), options).await?,
        )),
        HomeUrl::Nfs { .. } => Ok(Arc::new(nfs::NfsHome::open(url.clone(), options).await?)),
    }
}

pub mod local;
pub mod nfs;

//! Cache mode on the wire: bindings of directories to a home file system and
//! the link every cached object keeps to its home object.
//!
//! A *binding* makes a directory of the volume a cache of a *home* (an NFS
//! export, a local directory). Every object under it carries a
//! [`HomeLink`] in its inode: which binding, home's handle, what home's
//! attributes were when they were last checked, and the *version* of home's
//! content the cached data belongs to. See docs/architecture.md, "Cache
//! mode".

use serde::{Deserialize, Serialize};

use crate::types::{FileId, FileKind, Timestamp};

/// Smallest file id given to cached objects (see [`cache_id`]); ids below
/// it are allocated by the servers' counters (`layout::allocate_id`).
pub const CACHE_ID_BASE: FileId = 1 << 62;

/// How a cache treats changes (AFM's modes; docs/architecture.md, "Cache
/// mode II").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum CacheMode {
    /// Read-only: every change under the binding answers `ReadOnly`.
    Ro,
    /// Single writer: only this cache writes home (cache mode II).
    Sw,
    /// Independent writers: home and other caches write too (cache mode II).
    Iw,
    /// Local updates: changes stay in the cache (cache mode II).
    Lu,
}

impl CacheMode {
    /// The mode's short name (`ro`, `sw`, `iw`, `lu`).
    pub fn name(self) -> &'static str {
        match self {
            CacheMode::Ro => "ro",
            CacheMode::Sw => "sw",
            CacheMode::Iw => "iw",
            CacheMode::Lu => "lu",
        }
    }

    /// Parses a short name.
    pub fn parse(s: &str) -> Option<CacheMode> {
        match s {
            "ro" => Some(CacheMode::Ro),
            "sw" => Some(CacheMode::Sw),
            "iw" => Some(CacheMode::Iw),
            "lu" => Some(CacheMode::Lu),
            _ => None,
        }
    }
}

/// The settings of a binding, kept in the bound directory's [`HomeLink`].
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Binding {
    /// The home, as a URL (`nfs://host/export/dir?...`, `file:///path`).
    pub url: String,
    /// What the cache does with changes.
    pub mode: CacheMode,
    /// How long what was checked against home is trusted before the next
    /// access checks again, in milliseconds (0: at every open and lookup).
    pub validity_ms: u64,
    /// Longest a request to home may take before it fails, in milliseconds.
    pub timeout_ms: u64,
    /// Most bytes of home's data the cache keeps (0: no limit); past it
    /// the least recently read units are evicted.
    pub max_bytes: u64,
    /// `Sw`/`Iw`: how long a change waits before it is pushed home, in
    /// milliseconds (later changes to the same object within it are
    /// pushed with it).
    pub sync_lag_ms: u64,
    /// What a change does while home does not answer.
    pub on_disconnect: OnDisconnect,
    /// Whose version keeps the path at home when an object changed both
    /// in the cache and at home.
    pub on_conflict: OnConflict,
}

/// Whose version of an object changed both in the cache and at home keeps
/// its path at home; the other is kept under `.conflicts/` in home's
/// bound directory (docs/architecture.md, "Conflicts").
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum OnConflict {
    /// Home's (Panache's choice): the cached object becomes home's version.
    #[default]
    Home,
    /// The cache's: home's version is copied to `.conflicts/`, then the
    /// cache's is pushed over it.
    Cache,
}

impl OnConflict {
    /// The short name (`home`, `cache`).
    pub fn name(self) -> &'static str {
        match self {
            OnConflict::Home => "home",
            OnConflict::Cache => "cache",
        }
    }

    /// Parses a short name.
    pub fn parse(s: &str) -> Option<OnConflict> {
        match s {
            "home" => Some(OnConflict::Home),
            "cache" => Some(OnConflict::Cache),
            _ => None,
        }
    }
}

/// What a change under a writable binding does while home does not answer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum OnDisconnect {
    /// It is made and queued, pushed once home answers again.
    #[default]
    Local,
    /// It waits until home answers (as a hard NFS mount does).
    Block,
}

impl OnDisconnect {
    /// The short name (`local`, `block`).
    pub fn name(self) -> &'static str {
        match self {
            OnDisconnect::Local => "local",
            OnDisconnect::Block => "block",
        }
    }

    /// Parses a short name.
    pub fn parse(s: &str) -> Option<OnDisconnect> {
        match s {
            "local" => Some(OnDisconnect::Local),
            "block" => Some(OnDisconnect::Block),
            _ => None,
        }
    }
}

impl Binding {
    /// Whether changes under this binding are allowed at all.
    pub fn writable(&self) -> bool {
        self.mode != CacheMode::Ro
    }

    /// Whether changes under this binding are pushed home.
    pub fn pushes(&self) -> bool {
        matches!(self.mode, CacheMode::Sw | CacheMode::Iw)
    }
}

/// A binding's settings as stores kept them before `sync_lag_ms` (record
/// format 1): read, never written.
#[derive(Debug, Clone, Deserialize)]
pub struct BindingV1 {
    url: String,
    mode: CacheMode,
    validity_ms: u64,
    timeout_ms: u64,
    max_bytes: u64,
}

impl From<BindingV1> for Binding {
    fn from(b: BindingV1) -> Binding {
        Binding {
            url: b.url,
            mode: b.mode,
            validity_ms: b.validity_ms,
            timeout_ms: b.timeout_ms,
            max_bytes: b.max_bytes,
            sync_lag_ms: DEFAULT_SYNC_LAG_MS,
            on_disconnect: OnDisconnect::Local,
            on_conflict: OnConflict::Home,
        }
    }
}

/// A binding's settings as stores kept them before `on_disconnect`
/// (record format 2): read, never written.
#[derive(Debug, Clone, Deserialize)]
pub struct BindingV2 {
    url: String,
    mode: CacheMode,
    validity_ms: u64,
    timeout_ms: u64,
    max_bytes: u64,
    sync_lag_ms: u64,
}

impl From<BindingV2> for Binding {
    fn from(b: BindingV2) -> Binding {
        Binding {
            url: b.url,
            mode: b.mode,
            validity_ms: b.validity_ms,
            timeout_ms: b.timeout_ms,
            max_bytes: b.max_bytes,
            sync_lag_ms: b.sync_lag_ms,
            on_disconnect: OnDisconnect::Local,
            on_conflict: OnConflict::Home,
        }
    }
}

/// A binding's settings as stores kept them before `on_conflict` (record
/// format 3): read, never written.
#[derive(Debug, Clone, Deserialize)]
pub struct BindingV3 {
    url: String,
    mode: CacheMode,
    validity_ms: u64,
    timeout_ms: u64,
    max_bytes: u64,
    sync_lag_ms: u64,
    on_disconnect: OnDisconnect,
}

impl From<BindingV3> for Binding {
    fn from(b: BindingV3) -> Binding {
        Binding {
            url: b.url,
            mode: b.mode,
            validity_ms: b.validity_ms,
            timeout_ms: b.timeout_ms,
            max_bytes: b.max_bytes,
            sync_lag_ms: b.sync_lag_ms,
            on_disconnect: b.on_disconnect,
            on_conflict: OnConflict::Home,
        }
    }
}

/// The sync lag of a binding that does not name one.
pub const DEFAULT_SYNC_LAG_MS: u64 = 15_000;

/// A [`HomeLink`] as stores kept it in record format 1: read, never written.
#[derive(Debug, Clone, Deserialize)]
pub struct HomeLinkV1 {
    binding: FileId,
    handle: Vec<u8>,
    fileid: u64,
    seen: HomeStamp,
    checked_ms: u64,
    version: u32,
    listed: bool,
    bound: Option<BindingV1>,
}

impl From<HomeLinkV1> for HomeLink {
    fn from(l: HomeLinkV1) -> HomeLink {
        HomeLink {
            binding: l.binding,
            handle: l.handle,
            fileid: l.fileid,
            seen: l.seen,
            checked_ms: l.checked_ms,
            version: l.version,
            listed: l.listed,
            bound: l.bound.map(Binding::from),
        }
    }
}

/// A [`HomeLink`] as stores kept it in record format 2: read, never written.
#[derive(Debug, Clone, Deserialize)]
pub struct HomeLinkV2 {
    binding: FileId,
    handle: Vec<u8>,
    fileid: u64,
    seen: HomeStamp,
    checked_ms: u64,
    version: u32,
    listed: bool,
    bound: Option<BindingV2>,
}

impl From<HomeLinkV2> for HomeLink {
    fn from(l: HomeLinkV2) -> HomeLink {
        HomeLink {
            binding: l.binding,
            handle: l.handle,
            fileid: l.fileid,
            seen: l.seen,
            checked_ms: l.checked_ms,
            version: l.version,
            listed: l.listed,
            bound: l.bound.map(Binding::from),
        }
    }
}

/// A [`HomeLink`] as stores kept it in record format 3: read, never written.
#[derive(Debug, Clone, Deserialize)]
pub struct HomeLinkV3 {
    binding: FileId,
    handle: Vec<u8>,
    fileid: u64,
    seen: HomeStamp,
    checked_ms: u64,
    version: u32,
    listed: bool,
    bound: Option<BindingV3>,
}

impl From<HomeLinkV3> for HomeLink {
    fn from(l: HomeLinkV3) -> HomeLink {
        HomeLink {
            binding: l.binding,
            handle: l.handle,
            fileid: l.fileid,
            seen: l.seen,
            checked_ms: l.checked_ms,
            version: l.version,
            listed: l.listed,
            bound: l.bound.map(Binding::from),
        }
    }
}

/// What revalidation compares: home's kind, size, mtime and ctime of an
/// object when it was last checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct HomeStamp {
    /// The object's kind at home.
    pub kind: FileKind,
    /// Its size at home.
    pub size: u64,
    /// Its data modification time at home.
    pub mtime: Timestamp,
    /// Its inode change time at home.
    pub ctime: Timestamp,
}

/// The link of a cached object to its home object, kept with its inode.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct HomeLink {
    /// The bound directory this object is cached under (its own id for the
    /// bound directory itself).
    pub binding: FileId,
    /// Home's handle of the object; empty for an object made in the cache
    /// (under a `sw`/`iw`/`lu` binding), whose data is the cache's own:
    /// read as any file's, never fetched (see [`HomeLink::is_local`]).
    pub handle: Vec<u8>,
    /// Home's number for the object (equal for its hard links).
    pub fileid: u64,
    /// Home's attributes when they were last found changed (or first seen).
    pub seen: HomeStamp,
    /// When `seen` was read from home (wall clock, ms since the epoch):
    /// until the validity lag has passed since then, nothing asks home
    /// again (a name listed a moment ago needs no second look).
    pub checked_ms: u64,
    /// The version of home's content the cached data belongs to; raised
    /// every time revalidation finds the object changed at home, so data
    /// fetched for an older version is never served for a newer one.
    pub version: u32,
    /// Directories: every entry home had is here (a lookup of a name not
    /// here is answered "no such entry" without asking home).
    pub listed: bool,
    /// The binding's settings: only in the bound directory's own link.
    pub bound: Option<Binding>,
}

/// What a cached read names, so that the server holding the block can fetch
/// it from home if it does not have it at this version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HomeRef {
    /// The bound directory.
    pub binding: FileId,
    /// Home's handle of the file.
    pub handle: Vec<u8>,
    /// The file's generation: an object that got the id of a removed one
    /// (home reused its number) has another, and none of its units.
    pub gen: u32,
    /// The version of home's content being read.
    pub version: u32,
    /// The file's size at that version (a unit is fetched up to it).
    pub size: u64,
}

impl HomeRef {
    /// The tag of the content a unit holds: generation and version.
    pub fn tag(&self) -> u64 {
        (u64::from(self.gen) << 32) | u64::from(self.version)
    }
}

/// The id a home object gets in the cache: derived from the binding and
/// home's (fsid, fileid), so that every name of one home object (hard
/// links) is one local inode and a listing made again gives every object
/// the id it had. It lies at or above [`CACHE_ID_BASE`], where the servers'
/// counters never reach, and spreads over all servers like allocated ids
/// (the owner is `id mod k`). Two home objects of one binding meet on one
/// id with odds of about n²/2⁶³ for n objects; the owner keeps home's
/// fileid in the inode and refuses to take one object for the other.
pub fn cache_id(binding: FileId, fsid: u64, fileid: u64) -> FileId {
    // SplitMix64 finaliser over the three words: a fixed, well-mixed
    // function (the ids are stored, so it must never change).
    fn mix(mut z: u64) -> u64 {
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    let h = mix(mix(mix(binding) ^ fsid) ^ fileid);
    CACHE_ID_BASE | (h & (CACHE_ID_BASE - 1))
}

/// The wall clock in ms since the epoch, as [`HomeLink::checked_ms`] keeps it.
pub fn wall_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

impl HomeLink {
    /// The link of an object made in the cache under binding `binding`:
    /// no home object yet (the write-back creates one and keeps its place
    /// apart), data kept locally.
    pub fn local(binding: FileId, kind: FileKind) -> HomeLink {
        let now = Timestamp::now();
        HomeLink {
            binding,
            handle: Vec::new(),
            fileid: 0,
            seen: HomeStamp {
                kind,
                size: 0,
                mtime: now,
                ctime: now,
            },
            checked_ms: wall_ms(),
            version: 0,
            listed: true,
            bound: None,
        }
    }

    /// Whether the object was made in the cache (its data and names are
    /// the cache's own; nothing is fetched or compared with home).
    pub fn is_local(&self) -> bool {
        self.handle.is_empty()
    }

    /// Whether what `seen` says was read from home less than `validity_ms`
    /// ago (by this machine's clock).
    pub fn fresh(&self, validity_ms: u64) -> bool {
        validity_ms > 0 && wall_ms().saturating_sub(self.checked_ms) < validity_ms
    }
}

/// The generation a cached object's inode gets: derived from home's
/// identity of the object (`Home::identity`: equal for its hard links,
/// different for a later object on the same file number), so that when
/// home gives a removed file's number to a new file — same [`cache_id`] —
/// the new file's entry names another handle, and handles of the old one
/// answer `Stale`. Never 0.
pub fn cache_gen(identity: &[u8]) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for &b in identity {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h.max(1)
}

/// Whether `id` was given to a cached object (see [`cache_id`]).
pub fn is_cache_id(id: FileId) -> bool {
    id >= CACHE_ID_BASE
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_ids_are_stable_and_spread() {
        // Stored ids: the function must never change.
        assert_eq!(cache_id(1, 2, 3), cache_id(1, 2, 3));
        let a = cache_id(1, 0, 1);
        assert!(is_cache_id(a));
        assert_ne!(cache_id(1, 0, 1), cache_id(2, 0, 1));
        assert_ne!(cache_id(1, 0, 1), cache_id(1, 1, 1));
        let mut per_server = [0u32; 4];
        for f in 0..4000u64 {
            per_server[(cache_id(7, 0, f) % 4) as usize] += 1;
        }
        for n in per_server {
            assert!((800..1200).contains(&n), "{per_server:?}");
        }
    }
}

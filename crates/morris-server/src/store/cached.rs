//! Cache mode in the metadata store: home links, placeholders and the
//! record of which stripe units hold home's data.
//!
//! Tables:
//! * `cache_links` (mirrored): inode id → its [`HomeLink`] (home's handle,
//!   the attributes last seen at home, the content version, the binding);
//!   loaded with the inode ([`super::load_inode`]), so every reply that
//!   carries an inode carries its link;
//! * `cache_seeds_at` (mirrored): (directory, the entry's cookie) → the
//!   inode its entry's object *will* have, built from what home said when
//!   the name was fetched (keyed by cookie, not name: a listing from home
//!   stores its names at cookies in order, so the seeds, the biggest rows,
//!   are appended instead of inserted all over a B-tree; store format 6). A directory listed from home gets one entry per home name at
//!   once (with the child's [`cache_id`]) but no inodes: those are made
//!   from the seed, at the child's owner, when the object is first used
//!   ([`Store::create_cached`]) — Panache's "orphan" inodes;
//! * `cache_units` (this server's own, never mirrored): which units of
//!   which cached files this server holds, at which content version, how
//!   many bytes, and when last read (for eviction);
//! * `cache_bindings` (this server's own): the settings of every binding
//!   this server has been told of (`OpenHome`), so that a restarted server
//!   knows its bindings (status, eviction) before any client names them.
//!
//! Links and seeds are stored as a format byte and the postcard encoding
//! of the wire types ([`HomeLink`], [`Inode`]); a change to those types
//! must keep a frozen copy of the old layout here and convert.

use morris_proto::home::{
    is_cache_id, Binding, BindingV1, BindingV2, BindingV3, HomeLink, HomeLinkV1, HomeLinkV2,
    HomeLinkV3, HomeStamp,
};
use morris_proto::{Attr, ErrorCode, FileId, FileKind, Handle, Inode, WireError};
use rusqlite::{params, Connection, OptionalExtension, Transaction};

use super::{
    check_dir, check_handle, cookies, db_err, encode_inode, find_entry, load_dir_row, load_inode,
    sql_id, store_dir_row, Cached, Store,
};

/// The tables of this module (run at every open).
pub(super) const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS cache_links (id INTEGER PRIMARY KEY, link BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS cache_seeds_at (
    dir INTEGER NOT NULL,
    cookie INTEGER NOT NULL,
    seed BLOB NOT NULL,
    PRIMARY KEY (dir, cookie)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS cache_units (
    id INTEGER NOT NULL,
    copy INTEGER NOT NULL,
    block INTEGER NOT NULL,
    version INTEGER NOT NULL,
    bytes INTEGER NOT NULL,
    used INTEGER NOT NULL,
    binding INTEGER NOT NULL,
    PRIMARY KEY (id, copy, block)
) WITHOUT ROWID;
DROP INDEX IF EXISTS cache_units_by_use;
CREATE INDEX IF NOT EXISTS cache_units_by_binding ON cache_units (binding, id);
CREATE INDEX IF NOT EXISTS cache_units_by_binding_use ON cache_units (binding, used);
CREATE TABLE IF NOT EXISTS cache_bindings (binding INTEGER PRIMARY KEY, spec BLOB NOT NULL);
";

/// The tag of every unit of a file detached from home by an older server
/// (stored as -1): detached whatever the version.
pub const LOCAL_TAG: u64 = u64::MAX;

/// The bit of a tag that marks a unit of a file detached from home (see
/// [`Store::make_unit_local`]); no content version reaches it.
const LOCAL_BIT: u64 = 1 << 31;

/// The tag of a unit made the cache's own while its file was at content
/// version `version` of generation `gen`.
pub fn local_tag(gen: u32, version: u32) -> u64 {
    (u64::from(gen) << 32) | LOCAL_BIT | (u64::from(version) & (LOCAL_BIT - 1))
}

/// Whether a unit tagged `tag` is still the cache's own for a read of
/// generation `gen` at content version `version`: yes unless the file
/// became home's version again since (a conflict resolved for home gives
/// it a newer version; the unit is then fetched again).
pub fn is_own_for(tag: u64, gen: u32, version: u32) -> Option<bool> {
    if tag & LOCAL_BIT == 0 {
        return None;
    }
    if tag == LOCAL_TAG {
        return Some(true);
    }
    let same_gen = tag >> 32 == u64::from(gen);
    Some(same_gen && u64::from(version) & (LOCAL_BIT - 1) <= tag & (LOCAL_BIT - 1))
}

/// Format byte of stored links, seeds and binding settings: 4 since
/// bindings say whose version wins a conflict; 3 (read, converted) since
/// they say what changes do while home is down; 2 (read, converted) since
/// they carry a sync lag; 1 (read, converted) before.
const FORMAT: u8 = 4;
/// The formats before [`FORMAT`].
const FORMAT_3: u8 = 3;
const FORMAT_2: u8 = 2;
const FORMAT_1: u8 = 1;

fn encode<T: serde::Serialize>(v: &T) -> Result<Vec<u8>, WireError> {
    let mut out = vec![FORMAT];
    out.extend(
        postcard::to_stdvec(v)
            .map_err(|e| WireError::new(ErrorCode::Io, format!("encoding a cache record: {e}")))?,
    );
    Ok(out)
}

/// Decodes a record of the current format, or of format 1 as `Old1`, of
/// format 2 as `Old2` and of format 3 as `Old3` (frozen copies of the
/// layouts then) converted.
fn decode_as<T, Old1, Old2, Old3>(what: &str, b: &[u8]) -> Result<T, WireError>
where
    T: serde::de::DeserializeOwned,
    Old1: serde::de::DeserializeOwned + Into<T>,
    Old2: serde::de::DeserializeOwned + Into<T>,
    Old3: serde::de::DeserializeOwned + Into<T>,
{
    let corrupt =
        |e: postcard::Error| WireError::new(ErrorCode::Io, format!("corrupt {what}: {e}"));
    match b.split_first() {
        Some((&FORMAT, rest)) => postcard::from_bytes(rest).map_err(corrupt),
        Some((&FORMAT_3, rest)) => postcard::from_bytes::<Old3>(rest)
            .map(Into::into)
            .map_err(corrupt),
        Some((&FORMAT_2, rest)) => postcard::from_bytes::<Old2>(rest)
            .map(Into::into)
            .map_err(corrupt),
        Some((&FORMAT_1, rest)) => postcard::from_bytes::<Old1>(rest)
            .map(Into::into)
            .map_err(corrupt),
        _ => Err(WireError::new(
            ErrorCode::Io,
            format!("{what} in an unknown format"),
        )),
    }
}

/// [`decode_as`] of a record whose layout did not change in formats 2 to
/// 4 (a seed: its link never carries a binding's settings).
fn decode<T: serde::de::DeserializeOwned>(what: &str, b: &[u8]) -> Result<T, WireError> {
    decode_as::<T, T, T, T>(what, b)
}

pub(super) fn decode_link(b: &[u8]) -> Result<HomeLink, WireError> {
    decode_as::<HomeLink, HomeLinkV1, HomeLinkV2, HomeLinkV3>("home link", b)
}

/// The home link stored for `id`, if any.
pub(super) fn link_of(c: &Connection, id: FileId) -> Result<Option<Box<HomeLink>>, WireError> {
    let b: Option<Vec<u8>> = c
        .prepare_cached("SELECT link FROM cache_links WHERE id = ?1")
        .and_then(|mut s| s.query_row(params![sql_id(id)], |r| r.get(0)).optional())
        .map_err(db_err)?;
    match b {
        Some(b) => Ok(Some(Box::new(decode_link(&b)?))),
        None => Ok(None),
    }
}

pub(super) fn put_link(tx: &Transaction<'_>, id: FileId, link: &HomeLink) -> Result<(), WireError> {
    let b = encode(link)?;
    tx.prepare_cached("INSERT OR REPLACE INTO cache_links (id, link) VALUES (?1, ?2)")
        .and_then(|mut s| s.execute(params![sql_id(id), b]))
        .map_err(db_err)?;
    Ok(())
}

/// Removes what this module keeps about inode `id` (it is being deleted).
pub(super) fn forget_inode(tx: &Transaction<'_>, id: FileId) -> Result<(), WireError> {
    for sql in [
        "DELETE FROM cache_links WHERE id = ?1",
        "DELETE FROM cache_seeds_at WHERE dir = ?1",
    ] {
        tx.exec(sql, params![sql_id(id)]).map_err(db_err)?;
    }
    Ok(())
}

/// The seed of the entry `dir/name`, found through the entry's cookie.
const SEED_OF_NAME: &str = "SELECT s.seed FROM entries e JOIN cache_seeds_at s
     ON s.dir = e.dir AND s.cookie = e.cookie WHERE e.dir = ?1 AND e.name = ?2";

/// Removes the seed at `cookie` of `dir` (its entry is being removed).
pub(super) fn forget_seed_at(
    tx: &Transaction<'_>,
    dir: FileId,
    cookie: i64,
) -> Result<(), WireError> {
    tx.prepare_cached("DELETE FROM cache_seeds_at WHERE dir = ?1 AND cookie = ?2")
        .and_then(|mut s| s.execute(params![sql_id(dir), cookie]))
        .map_err(db_err)?;
    Ok(())
}

/// The home link of the seed of entry `dir/name`, if the entry's object
/// `child` was fetched from home under that name.
pub(super) fn seed_link(
    c: &Connection,
    dir: FileId,
    name: &[u8],
    child: FileId,
) -> Result<Option<HomeLink>, WireError> {
    let b: Option<Vec<u8>> = c
        .prepare_cached(SEED_OF_NAME)
        .and_then(|mut s| {
            s.query_row(params![sql_id(dir), name], |r| r.get(0))
                .optional()
        })
        .map_err(db_err)?;
    let Some(b) = b else { return Ok(None) };
    let seed: Inode = decode("seed", &b)?;
    if seed.id != child {
        return Ok(None);
    }
    Ok(seed.home.map(|l| *l))
}

/// A name fetched from home, with the inode its object will have.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seed {
    /// The entry name.
    pub name: Vec<u8>,
    /// The inode to create on first use: a [`cache_id`], generation 1,
    /// home's attributes and the object's [`HomeLink`].
    pub inode: Inode,
}

/// What [`Store::refresh_dir`] changed.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Refreshed {
    /// Names added.
    pub added: usize,
    /// Names removed (gone at home).
    pub removed: usize,
    /// Names that now name another home object.
    pub replaced: usize,
}

/// One unit of a cached file this server holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnitRec {
    /// The content it was fetched for: the file's generation and version
    /// (`HomeRef::tag`).
    pub tag: u64,
    /// Bytes of home's data in it.
    pub bytes: u64,
}

/// A unit chosen for eviction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Evictable {
    /// The file.
    pub id: FileId,
    /// Which copy (extent file).
    pub copy: u8,
    /// The block index.
    pub block: u64,
    /// Its bytes.
    pub bytes: u64,
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

fn cached_link(ino: &Inode, what: &str) -> Result<HomeLink, WireError> {
    match &ino.home {
        Some(l) => Ok((**l).clone()),
        None => Err(WireError::new(
            ErrorCode::Invalid,
            format!("{what} {} is not cached from a home", ino.id),
        )),
    }
}

impl Store {
    /// Makes the empty directory `dir` the root of a binding: its link
    /// (with `link.bound` set) is stored. Refused if the directory has
    /// entries or already lies under a binding.
    pub fn bind(&self, dir: Handle, link: &HomeLink) -> Result<Inode, WireError> {
        if link.bound.is_none() || link.binding != dir.id {
            return Err(WireError::new(
                ErrorCode::Invalid,
                "a binding's root link names itself and its settings",
            ));
        }
        self.write_txn(|tx| {
            let d = load_dir_row(tx, dir)?;
            if let Some(old) = &d.inode.home {
                let msg = if old.bound.is_some() {
                    "the directory is already bound to a home (unbind it first)"
                } else {
                    "the directory lies under a bound directory"
                };
                return Err(WireError::new(ErrorCode::Exists, msg));
            }
            if super::orphans::has_entries(tx, dir.id)? {
                return Err(WireError::new(
                    ErrorCode::NotEmpty,
                    "only an empty directory can be bound to a home",
                ));
            }
            put_link(tx, dir.id, link)?;
            let mut ino = d.inode;
            ino.home = Some(Box::new(link.clone()));
            Ok(ino)
        })
    }

    /// Removes the binding of `dir`, which must be empty again (its cached
    /// entries removed first).
    pub fn unbind(&self, dir: Handle) -> Result<Inode, WireError> {
        self.write_txn(|tx| {
            let d = load_dir_row(tx, dir)?;
            match &d.inode.home {
                Some(l) if l.bound.is_some() => {}
                _ => {
                    return Err(WireError::new(
                        ErrorCode::Invalid,
                        "the directory is not bound to a home",
                    ))
                }
            }
            if super::orphans::has_entries(tx, dir.id)? {
                return Err(WireError::new(
                    ErrorCode::NotEmpty,
                    "remove the cached entries before the binding",
                ));
            }
            forget_inode(tx, dir.id)?;
            let mut d = d;
            // An ordinary empty directory again (its counts were home's).
            d.inode.attr.size = 0;
            d.inode.attr.nlink = 2;
            d.inode.home = None;
            store_dir_row(tx, &d)?;
            Ok(d.inode)
        })
    }

    /// Adds the names of `seeds` that `dir` does not have yet, each with
    /// its seed; with `listed`, marks the directory as holding every name
    /// home has. Names already present are left as they are (a later
    /// revalidation replaces what changed). Returns how many were added.
    pub fn fill(&self, dir: Handle, seeds: &[Seed], listed: bool) -> Result<usize, WireError> {
        let added = self.write_txn(|tx| {
            let mut d = load_dir_row(tx, dir)?;
            let mut link = cached_link(&d.inode, "directory")?;
            let mut added = 0;
            // In name order within the batch (the entries and seeds
            // B-trees are keyed by name), each at the next cookie, so that
            // a listing in progress sees every name stored after it began.
            let mut sorted: Vec<&Seed> = seeds.iter().collect();
            sorted.sort_unstable_by(|a, b| a.name.cmp(&b.name));
            let mut next = cookies::next_in_order(tx, dir.id)?;
            for s in sorted {
                let (h, kind) = (s.inode.handle(), s.inode.attr.kind);
                let stored = cookies::insert_in_order(tx, dir.id, &s.name, h, kind, &mut next)?;
                if let Some(cookie) = stored {
                    put_seed(tx, dir.id, cookie, s)?;
                    added += 1;
                }
            }
            if listed && !link.listed {
                link.listed = true;
                put_link(tx, dir.id, &link)?;
                d.inode.home = Some(Box::new(link));
                store_dir_row(tx, &d)?;
            }
            Ok(added)
        })?;
        self.entries
            .fetch_add(added as u64, std::sync::atomic::Ordering::Relaxed);
        Ok(added)
    }

    /// Brings directory `dir` to what home has now (`seeds`: every home
    /// name): names gone at home are removed, new ones added, and names
    /// that now name another home object point at it; the directory's
    /// stamp becomes `stamp`, its version goes up, and it is listed.
    pub fn refresh_dir(
        &self,
        dir: Handle,
        seeds: &[Seed],
        stamp: HomeStamp,
        attr: &Attr,
    ) -> Result<(Inode, Refreshed), WireError> {
        let mut out = Refreshed::default();
        let ino = self.write_txn(|tx| {
            let mut d = load_dir_row(tx, dir)?;
            let mut link = cached_link(&d.inode, "directory")?;
            let marked = tx
                .prepare_cached("SELECT 1 FROM wb_marks WHERE id = ?1")
                .and_then(|mut s| s.exists(params![sql_id(dir.id)]))
                .map_err(db_err)?;
            if marked {
                // Changed in the cache meanwhile (`iw`): the write-back
                // pushes it first; home's names come in after that.
                return Ok(d.inode);
            }
            let wanted: std::collections::HashMap<&[u8], &Seed> =
                seeds.iter().map(|s| (s.name.as_slice(), s)).collect();
            // Local names not at home any more.
            let mut gone = Vec::new();
            {
                let mut st = tx
                    .prepare_cached("SELECT name, child, gen FROM entries WHERE dir = ?1")
                    .map_err(db_err)?;
                let rows = st
                    .query_map(params![sql_id(dir.id)], |r| {
                        Ok((
                            r.get::<_, Vec<u8>>(0)?,
                            r.get::<_, i64>(1)?,
                            r.get::<_, i64>(2)?,
                        ))
                    })
                    .map_err(db_err)?;
                for row in rows {
                    let (name, child, gen) = row.map_err(db_err)?;
                    if !is_cache_id(super::from_sql_id(child)) {
                        // Made in the cache (`iw`): the write-back's to
                        // push, never taken back by a listing.
                        continue;
                    }
                    match wanted.get(name.as_slice()) {
                        None => gone.push(name),
                        // Another object (or the same number given to a
                        // new one: another generation).
                        Some(s) if sql_id(s.inode.id) != child || i64::from(s.inode.gen) != gen => {
                            gone.push(name)
                        }
                        Some(_) => {}
                    }
                }
            }
            for name in &gone {
                let replaced = wanted.contains_key(name.as_slice());
                super::delete_entry(tx, dir.id, name)?;
                if replaced {
                    out.replaced += 1;
                } else {
                    out.removed += 1;
                }
            }
            for s in seeds {
                if find_entry(tx, dir.id, &s.name)?.is_some() {
                    continue;
                }
                add_seeded(tx, dir.id, s)?;
                if !gone.contains(&s.name) {
                    out.added += 1;
                }
            }
            link.seen = stamp;
            link.checked_ms = morris_proto::home::wall_ms();
            link.version = link.version.wrapping_add(1);
            link.listed = true;
            apply_home_attr(&mut d.inode.attr, attr);
            put_link(tx, dir.id, &link)?;
            d.inode.home = Some(Box::new(link));
            store_dir_row(tx, &d)?;
            Ok(d.inode)
        })?;
        Ok((ino, out))
    }

    /// The seed of entry `dir/name`, if it was fetched from home.
    pub fn seed(&self, dir: Handle, name: &[u8]) -> Result<Option<Inode>, WireError> {
        self.with_reader(|c| {
            let d = check_dir(check_handle(dir, load_inode(c, dir.id)?)?)?;
            if d.home.is_none() {
                return Ok(None);
            }
            let b: Option<Vec<u8>> = c
                .prepare_cached(SEED_OF_NAME)
                .and_then(|mut s| {
                    s.query_row(params![sql_id(dir.id), name], |r| r.get(0))
                        .optional()
                })
                .map_err(db_err)?;
            match b {
                Some(b) => Ok(Some(decode("seed", &b)?)),
                None => Ok(None),
            }
        })
    }

    /// The seeds of `dir`'s entries at cookies `from..to`, in cookie order.
    pub fn seeds_between(&self, dir: Handle, from: u64, to: u64) -> Result<Vec<Inode>, WireError> {
        self.with_reader(|c| {
            let d = check_dir(check_handle(dir, load_inode(c, dir.id)?)?)?;
            if d.home.is_none() {
                return Ok(Vec::new());
            }
            let mut st = c
                .prepare_cached(
                    "SELECT seed FROM cache_seeds_at WHERE dir = ?1 AND cookie >= ?2 AND cookie < ?3
                     ORDER BY cookie",
                )
                .map_err(db_err)?;
            let rows = st
                .query_map(
                    params![
                        sql_id(dir.id),
                        from.min(i64::MAX as u64) as i64,
                        to.min(i64::MAX as u64) as i64
                    ],
                    |r| r.get::<_, Vec<u8>>(0),
                )
                .map_err(db_err)?;
            let mut out = Vec::new();
            for b in rows {
                out.push(decode("seed", &b.map_err(db_err)?)?);
            }
            Ok(out)
        })
    }

    /// Creates the cached inode `seed` describes, here (its owner), unless
    /// it exists; returns the inode as stored. An inode at that id with
    /// another generation caches another home object (home reused the file
    /// number, or two objects met on one id): it is replaced by the seed's,
    /// so that handles of the old one answer `Stale`.
    pub fn create_cached(&self, seed: &Inode) -> Result<Inode, WireError> {
        let link = cached_link(seed, "seed")?;
        if !is_cache_id(seed.id) {
            return Err(WireError::new(
                ErrorCode::Invalid,
                format!("{} is not an id of a cached object", seed.id),
            ));
        }
        let (ino, created) = self.write_txn(|tx| {
            if let Some(old) = load_inode(tx, seed.id)? {
                let same = old.gen == seed.gen
                    && old.home.as_ref().is_some_and(|l| l.binding == link.binding);
                if same && old.attr.nlink > 0 {
                    return Ok((old, false));
                }
                if same {
                    // Removed in the cache (an orphan, kept while open)
                    // and listed from home again (`iw`: home kept it, as
                    // another writer's names were in it): alive again, as
                    // home has it; the orphan's reaping must not take it.
                    tx.exec(
                        "DELETE FROM orphans WHERE ino = ?1",
                        params![sql_id(seed.id)],
                    )
                    .map_err(db_err)?;
                    let mut new = seed.clone();
                    new.stale.clear();
                    tx.exec(
                        "UPDATE inodes SET data = ?2 WHERE id = ?1",
                        params![sql_id(new.id), encode_inode(&new)?],
                    )
                    .map_err(db_err)?;
                    put_link(tx, new.id, &link)?;
                    return Ok((new, false));
                }
                tracing::info!(
                    id = seed.id,
                    old_gen = old.gen,
                    new_gen = seed.gen,
                    "cached inode replaced: its id now names another home object"
                );
                let mut new = seed.clone();
                if new.gen == old.gen {
                    new.gen = old.gen.wrapping_add(1).max(1);
                }
                new.stale.clear();
                tx.exec(
                    "UPDATE inodes SET gen = ?2, data = ?3 WHERE id = ?1",
                    params![sql_id(new.id), i64::from(new.gen), encode_inode(&new)?],
                )
                .map_err(db_err)?;
                put_link(tx, new.id, &link)?;
                return Ok((new, false));
            }
            Ok((insert_cached(tx, seed, &link)?, true))
        })?;
        if created {
            self.inodes
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        Ok(ino)
    }

    /// Creates, here (their owner), in one transaction, the inodes of
    /// those of `seeds` that have none; an inode at a seed's id is left as
    /// it is (another generation is [`Store::create_cached`]'s case, one
    /// at a time). Returns how many were made.
    pub fn create_cached_many(&self, seeds: &[Inode]) -> Result<u64, WireError> {
        let mut checked = Vec::with_capacity(seeds.len());
        for seed in seeds {
            if !is_cache_id(seed.id) {
                return Err(WireError::new(
                    ErrorCode::Invalid,
                    format!("{} is not an id of a cached object", seed.id),
                ));
            }
            checked.push((seed, cached_link(seed, "seed")?));
        }
        let made = self.write_txn(|tx| {
            let mut made = 0u64;
            for (seed, link) in &checked {
                let exists: Option<i64> = tx
                    .prepare_cached("SELECT 1 FROM inodes WHERE id = ?1")
                    .and_then(|mut st| {
                        st.query_row(params![sql_id(seed.id)], |r| r.get(0))
                            .optional()
                    })
                    .map_err(db_err)?;
                if exists.is_none() {
                    insert_cached(tx, seed, link)?;
                    made += 1;
                }
            }
            Ok(made)
        })?;
        self.inodes
            .fetch_add(made, std::sync::atomic::Ordering::Relaxed);
        Ok(made)
    }

    /// Records that home's object behind `h` changed: home's attributes
    /// `attr` (size, times, mode, owner), stamp `stamp`, and the next
    /// content version, so that data fetched before is never served again.
    pub fn home_changed(
        &self,
        h: Handle,
        attr: &Attr,
        stamp: HomeStamp,
        target: Option<Vec<u8>>,
    ) -> Result<Inode, WireError> {
        self.write_txn(|tx| {
            let mut ino = check_handle(h, load_inode(tx, h.id)?)?;
            let mut link = cached_link(&ino, "file")?;
            link.seen = stamp;
            link.checked_ms = morris_proto::home::wall_ms();
            link.version = link.version.wrapping_add(1);
            apply_home_attr(&mut ino.attr, attr);
            if target.is_some() {
                ino.target = target.clone();
            }
            tx.exec(
                "UPDATE inodes SET data = ?2 WHERE id = ?1",
                params![sql_id(ino.id), encode_inode(&ino)?],
            )
            .map_err(db_err)?;
            put_link(tx, ino.id, &link)?;
            ino.home = Some(Box::new(link));
            Ok(ino)
        })
    }

    /// Removes every object of binding `binding` this store keeps: the
    /// entries (and seeds) of its cached directories and of the bound
    /// directory, and its cached inodes with their links, orphan and open
    /// records, and the write-back's marks, places and departed names.
    /// Returns (entries, inodes) removed. The bound directory's
    /// own inode and link stay (`unbind` removes the link).
    pub fn purge_binding(&self, binding: FileId) -> Result<(u64, u64), WireError> {
        let (entries, inodes) = self.write_txn(|tx| {
            let mut ids = vec![binding];
            {
                let mut st = tx
                    .prepare_cached("SELECT id, link FROM cache_links")
                    .map_err(db_err)?;
                let rows = st
                    .query_map([], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, Vec<u8>>(1)?)))
                    .map_err(db_err)?;
                for row in rows {
                    let (id, b) = row.map_err(db_err)?;
                    let link: HomeLink = decode_link(&b)?;
                    let id = super::from_sql_id(id);
                    if link.binding == binding && id != binding {
                        ids.push(id);
                    }
                }
            }
            let mut entries = 0u64;
            let mut inodes = 0u64;
            for &id in &ids {
                entries += tx
                    .exec("DELETE FROM entries WHERE dir = ?1", params![sql_id(id)])
                    .map_err(db_err)? as u64;
                tx.exec(
                    "DELETE FROM cache_seeds_at WHERE dir = ?1",
                    params![sql_id(id)],
                )
                .map_err(db_err)?;
                if id == binding {
                    continue;
                }
                inodes += tx
                    .exec("DELETE FROM inodes WHERE id = ?1", params![sql_id(id)])
                    .map_err(db_err)? as u64;
                for sql in [
                    "DELETE FROM orphans WHERE ino = ?1",
                    "DELETE FROM opens WHERE ino = ?1",
                    "DELETE FROM stale_copies WHERE id = ?1",
                    "DELETE FROM cache_links WHERE id = ?1",
                    "DELETE FROM xattrs WHERE id = ?1",
                ] {
                    tx.exec(sql, params![sql_id(id)]).map_err(db_err)?;
                }
            }
            // The write-back's records of the binding go with it (`unbind`
            // refuses queued changes unless told to drop them).
            for sql in [
                "DELETE FROM wb_marks WHERE binding = ?1",
                "DELETE FROM wb_homes WHERE binding = ?1",
                "DELETE FROM wb_gone WHERE binding = ?1",
            ] {
                tx.exec(sql, params![sql_id(binding)]).map_err(db_err)?;
            }
            Ok((entries, inodes))
        })?;
        self.entries.fetch_sub(
            entries.min(self.entry_count()),
            std::sync::atomic::Ordering::Relaxed,
        );
        self.inodes.fetch_sub(
            inodes.min(self.inode_count()),
            std::sync::atomic::Ordering::Relaxed,
        );
        Ok((entries, inodes))
    }

    /// The files of binding `binding` whose units this server holds.
    pub fn unit_files_of(&self, binding: FileId) -> Result<Vec<FileId>, WireError> {
        self.with_reader(|c| {
            let mut st = c
                .prepare_cached("SELECT DISTINCT id FROM cache_units WHERE binding = ?1")
                .map_err(db_err)?;
            let rows = st
                .query_map(params![sql_id(binding)], |r| r.get::<_, i64>(0))
                .map_err(db_err)?;
            rows.map(|r| r.map(super::from_sql_id))
                .collect::<Result<Vec<_>, _>>()
                .map_err(db_err)
        })
    }

    /// The bound directories kept here and their settings (from their
    /// links: a server that takes a range over learns its bindings).
    pub fn bound_dirs(&self) -> Result<Vec<(FileId, Binding)>, WireError> {
        self.with_reader(|c| {
            let mut st = c
                .prepare_cached("SELECT id, link FROM cache_links")
                .map_err(db_err)?;
            let rows = st
                .query_map([], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, Vec<u8>>(1)?)))
                .map_err(db_err)?;
            let mut out = Vec::new();
            for row in rows {
                let (id, b) = row.map_err(db_err)?;
                let id = super::from_sql_id(id);
                if let Ok(HomeLink {
                    binding,
                    bound: Some(spec),
                    ..
                }) = decode_link(&b)
                {
                    if binding == id {
                        out.push((id, spec));
                    }
                }
            }
            Ok(out)
        })
    }

    /// Keeps the settings of binding `binding` (replacing older ones).
    pub fn remember_binding(&self, binding: FileId, spec: &Binding) -> Result<(), WireError> {
        let b = encode(spec)?;
        self.write_txn(|tx| {
            tx.exec(
                "INSERT OR REPLACE INTO cache_bindings (binding, spec) VALUES (?1, ?2)",
                params![sql_id(binding), b],
            )
            .map_err(db_err)?;
            Ok(())
        })
    }

    /// Forgets the settings of binding `binding`.
    pub fn forget_binding_spec(&self, binding: FileId) -> Result<(), WireError> {
        self.write_txn(|tx| {
            tx.exec(
                "DELETE FROM cache_bindings WHERE binding = ?1",
                params![sql_id(binding)],
            )
            .map_err(db_err)?;
            Ok(())
        })
    }

    /// Every binding this server keeps the settings of; a record that does
    /// not decode is reported as an error beside the others.
    #[allow(clippy::type_complexity)]
    pub fn known_bindings(&self) -> Result<Vec<(FileId, Result<Binding, WireError>)>, WireError> {
        self.with_reader(|c| {
            let mut st = c
                .prepare_cached("SELECT binding, spec FROM cache_bindings ORDER BY binding")
                .map_err(db_err)?;
            let rows = st
                .query_map([], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, Vec<u8>>(1)?)))
                .map_err(db_err)?;
            let mut out = Vec::new();
            for row in rows {
                let (id, b) = row.map_err(db_err)?;
                out.push((
                    super::from_sql_id(id),
                    decode_as::<Binding, BindingV1, BindingV2, BindingV3>("binding settings", &b),
                ));
            }
            Ok(out)
        })
    }

    /// Forgets every unit of file `id` (its extent files were removed).
    pub fn drop_units_of(&self, id: FileId) -> Result<(), WireError> {
        self.write_txn(|tx| {
            tx.exec("DELETE FROM cache_units WHERE id = ?1", params![sql_id(id)])
                .map_err(db_err)?;
            Ok(())
        })
    }

    // ------------------------------------------------------------ units

    /// The unit (`id`, `copy`, `block`) held here, if any.
    pub fn unit(&self, id: FileId, copy: u8, block: u64) -> Result<Option<UnitRec>, WireError> {
        self.with_reader(|c| {
            c.prepare_cached(
                "SELECT version, bytes FROM cache_units WHERE id = ?1 AND copy = ?2 AND block = ?3",
            )
            .and_then(|mut s| {
                s.query_row(params![sql_id(id), i64::from(copy), sql_id(block)], |r| {
                    Ok(UnitRec {
                        // Stored as the i64 with the same bits.
                        tag: r.get::<_, i64>(0)? as u64,
                        bytes: u64::try_from(r.get::<_, i64>(1)?).unwrap_or(0),
                    })
                })
                .optional()
            })
            .map_err(db_err)
        })
    }

    /// Records that the unit now holds home's data tagged `tag` (`bytes`
    /// of it), of a file under binding `binding`; returns the bytes it held
    /// before under any tag.
    #[allow(clippy::too_many_arguments)]
    pub fn put_unit(
        &self,
        id: FileId,
        copy: u8,
        block: u64,
        tag: u64,
        bytes: u64,
        binding: FileId,
    ) -> Result<u64, WireError> {
        self.write_txn(|tx| {
            let before: Option<i64> = tx
                .prepare_cached(
                    "SELECT bytes FROM cache_units WHERE id = ?1 AND copy = ?2 AND block = ?3",
                )
                .and_then(|mut s| {
                    s.query_row(params![sql_id(id), i64::from(copy), sql_id(block)], |r| {
                        r.get(0)
                    })
                    .optional()
                })
                .map_err(db_err)?;
            tx.prepare_cached(
                "INSERT OR REPLACE INTO cache_units (id, copy, block, version, bytes, used, binding)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            )
            .and_then(|mut s| {
                s.execute(params![
                    sql_id(id),
                    i64::from(copy),
                    sql_id(block),
                    tag as i64,
                    i64::try_from(bytes).unwrap_or(i64::MAX),
                    now_ms(),
                    sql_id(binding)
                ])
            })
            .map_err(db_err)?;
            Ok(before.map_or(0, |b| u64::try_from(b).unwrap_or(0)))
        })
    }

    /// Marks units as just read (eviction keeps the most recently read).
    pub fn touch_units(&self, units: &[(FileId, u8, u64)]) -> Result<(), WireError> {
        if units.is_empty() {
            return Ok(());
        }
        let now = now_ms();
        self.write_txn(|tx| {
            let mut st = tx
                .prepare_cached(
                    "UPDATE cache_units SET used = ?4 WHERE id = ?1 AND copy = ?2 AND block = ?3",
                )
                .map_err(db_err)?;
            for &(id, copy, block) in units {
                st.execute(params![sql_id(id), i64::from(copy), sql_id(block), now])
                    .map_err(db_err)?;
            }
            Ok(())
        })
    }

    /// Units and bytes held here for binding `binding`.
    pub fn cached_bytes_of(&self, binding: FileId) -> Result<(u64, u64), WireError> {
        self.with_reader(|c| {
            c.prepare_cached(
                "SELECT count(*), coalesce(sum(bytes), 0) FROM cache_units
                 WHERE binding = ?1 AND (version & 2147483648) = 0",
            )
            .and_then(|mut st| {
                st.query_row(params![sql_id(binding)], |r| {
                    Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?))
                })
            })
            .map(|(n, b)| (n.max(0) as u64, b.max(0) as u64))
            .map_err(db_err)
        })
    }

    /// The least recently read units of binding `binding`, oldest first,
    /// at most `max`.
    pub fn coldest_units_of(&self, binding: FileId, max: u32) -> Result<Vec<Evictable>, WireError> {
        self.with_reader(|c| {
            let mut st = c
                .prepare_cached(
                    "SELECT id, copy, block, bytes FROM cache_units
                     WHERE binding = ?1 AND (version & 2147483648) = 0 ORDER BY used LIMIT ?2",
                )
                .map_err(db_err)?;
            let rows = st
                .query_map(params![sql_id(binding), i64::from(max)], unit_row)
                .map_err(db_err)?;
            rows.collect::<Result<Vec<_>, _>>().map_err(db_err)
        })
    }

    /// Whether any unit of file `id` (fetched from home, or the cache's
    /// own) is held here: its copies may differ by design.
    pub fn has_cache_units(&self, id: FileId) -> Result<bool, WireError> {
        self.with_reader(|c| {
            c.prepare_cached("SELECT EXISTS (SELECT 1 FROM cache_units WHERE id = ?1)")
                .and_then(|mut s| s.query_row(params![sql_id(id)], |r| r.get(0)))
                .map_err(db_err)
        })
    }

    /// The units of file `id` held here.
    pub fn units_of(&self, id: FileId) -> Result<Vec<Evictable>, WireError> {
        self.with_reader(|c| {
            let mut st = c
                .prepare_cached(
                    "SELECT id, copy, block, bytes FROM cache_units WHERE id = ?1 AND (version & 2147483648) = 0",
                )
                .map_err(db_err)?;
            let rows = st
                .query_map(params![sql_id(id)], unit_row)
                .map_err(db_err)?;
            rows.collect::<Result<Vec<_>, _>>().map_err(db_err)
        })
    }

    /// Makes the unit the cache's own (its file was detached from home to
    /// be written): tagged `tag` (a [`local_tag`]), never evicted, never
    /// fetched while the file is detached.
    pub fn make_unit_local(
        &self,
        id: FileId,
        copy: u8,
        block: u64,
        tag: u64,
    ) -> Result<(), WireError> {
        self.write_txn(|tx| {
            tx.prepare_cached(
                "UPDATE cache_units SET version = ?4 WHERE id = ?1 AND copy = ?2 AND block = ?3",
            )
            .and_then(|mut s| {
                s.execute(params![
                    sql_id(id),
                    i64::from(copy),
                    sql_id(block),
                    tag as i64
                ])
            })
            .map_err(db_err)?;
            Ok(())
        })
    }

    /// Detaches cached file `h` from home's data (it is about to be
    /// written in a writable cache): its link becomes a local one and
    /// where home has it is kept apart (`wb_homes`, by handle), so the
    /// write-back pushes its data there. With `truncate` it is emptied
    /// too, its data marked for the write-back, in the same transaction.
    pub fn detach(&self, h: Handle, truncate: bool) -> Result<Inode, WireError> {
        self.write_txn(|tx| {
            let mut ino = check_handle(h, load_inode(tx, h.id)?)?;
            let mut link = cached_link(&ino, "file")?;
            if link.is_local() {
                return Ok(ino);
            }
            if ino.attr.kind != FileKind::File {
                return Err(WireError::new(
                    ErrorCode::Invalid,
                    "only a file is detached",
                ));
            }
            super::wb::put_home_new(
                tx,
                link.binding,
                &morris_proto::WbHome {
                    id: h.id,
                    dir: 0,
                    name: Vec::new(),
                    fileid: link.fileid,
                    handle: std::mem::take(&mut link.handle),
                },
            )?;
            put_link(tx, h.id, &link)?;
            if truncate {
                // Emptied: home's bytes were never made the cache's (no
                // `Localize` fetched them); its data goes home at the next
                // push.
                let now = morris_proto::Timestamp::now();
                ino.attr.size = 0;
                ino.attr.mtime = now;
                ino.attr.ctime = now;
                tx.exec(
                    "UPDATE inodes SET data = ?2 WHERE id = ?1",
                    params![sql_id(h.id), super::encode_inode(&ino)?],
                )
                .map_err(db_err)?;
                super::wb::mark(
                    tx,
                    h.id,
                    link.binding,
                    super::wb::Changed {
                        attrs: true,
                        data: true,
                        ..Default::default()
                    },
                )?;
            }
            ino.home = Some(Box::new(link));
            Ok(ino)
        })
    }

    /// Forgets the unit (its bytes were freed).
    pub fn drop_unit(&self, id: FileId, copy: u8, block: u64) -> Result<(), WireError> {
        self.write_txn(|tx| {
            tx.prepare_cached("DELETE FROM cache_units WHERE id = ?1 AND copy = ?2 AND block = ?3")
                .and_then(|mut s| s.execute(params![sql_id(id), i64::from(copy), sql_id(block)]))
                .map_err(db_err)?;
            Ok(())
        })
    }
}

/// A `cache_units` row read as (id, copy, block, bytes).
fn unit_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<Evictable> {
    Ok(Evictable {
        id: super::from_sql_id(r.get(0)?),
        copy: u8::try_from(r.get::<_, i64>(1)?).unwrap_or(0),
        block: super::from_sql_id(r.get(2)?),
        bytes: u64::try_from(r.get::<_, i64>(3)?).unwrap_or(0),
    })
}

/// Inserts the inode `seed` describes, linked by `link` (its id is free).
fn insert_cached(tx: &Transaction<'_>, seed: &Inode, link: &HomeLink) -> Result<Inode, WireError> {
    let mut new = seed.clone();
    new.stale.clear();
    tx.exec(
        "INSERT INTO inodes (id, gen, data, next_cookie) VALUES (?1, ?2, ?3, 1)",
        params![sql_id(new.id), i64::from(new.gen), encode_inode(&new)?],
    )
    .map_err(db_err)?;
    put_link(tx, new.id, link)?;
    Ok(new)
}

/// Adds entry `s.name` → `s.inode` to `dir` with its seed.
fn add_seeded(tx: &Transaction<'_>, dir: FileId, s: &Seed) -> Result<(), WireError> {
    let cookie = cookies::insert(tx, dir, &s.name, s.inode.handle(), s.inode.attr.kind)?;
    put_seed(tx, dir, cookie, s)
}

/// Stores the seed of entry `s.name` of `dir`, which is at `cookie`.
fn put_seed(tx: &Transaction<'_>, dir: FileId, cookie: u64, s: &Seed) -> Result<(), WireError> {
    let b = encode(&s.inode)?;
    tx.prepare_cached(
        "INSERT OR REPLACE INTO cache_seeds_at (dir, cookie, seed) VALUES (?1, ?2, ?3)",
    )
    .and_then(|mut st| st.execute(params![sql_id(dir), cookie as i64, b]))
    .map_err(db_err)?;
    Ok(())
}

/// Format 5 kept seeds by name (`cache_seeds`): each moves to its entry's
/// cookie (a seed whose entry is gone was never to be used again).
pub(super) const SEEDS_BY_COOKIE: &str = "
INSERT OR REPLACE INTO cache_seeds_at (dir, cookie, seed)
    SELECT s.dir, e.cookie, s.seed FROM cache_seeds s
    JOIN entries e ON e.dir = s.dir AND e.name = s.name;
DROP TABLE cache_seeds;";

/// Takes home's attributes into a cached inode (kind stays; the link count
/// of a directory stays the local one).
pub(super) fn apply_home_attr(a: &mut Attr, home: &Attr) {
    a.mode = home.mode;
    a.uid = home.uid;
    a.gid = home.gid;
    a.size = home.size;
    a.atime = home.atime;
    a.mtime = home.mtime;
    a.ctime = home.ctime;
    a.rdev = home.rdev;
    if a.kind != FileKind::Dir {
        a.nlink = home.nlink;
    }
}

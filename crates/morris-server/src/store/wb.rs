//! Cache mode II in the metadata store: the write-back's marks and the
//! places at home of the objects it made (docs/architecture.md, "Cache
//! mode II").
//!
//! Tables (both mirrored with the rest of the metadata):
//! * `wb_marks`: object id → which of its parts changed since it was last
//!   pushed home (names, attributes, data), how many changes, since when.
//!   Written in the transaction of the change itself ([`mark`]), so a
//!   change acknowledged to a client always has its mark, on every copy;
//!   cleared only if the count is unchanged since the push read it.
//! * `wb_homes`: object id → where home has it (the cache directory whose
//!   home directory holds it, the name there, home's file number and
//!   handle), for objects the write-back made or moved at home, and for
//!   objects fetched from home once moved in the cache (`WbPlace`: where
//!   home has them until the write-back moves them there) or written (a
//!   detached file: by handle, `dir` 0). Other fetched objects need none:
//!   their id is derived from home's file number, and they have not moved.
//! * `wb_gone`: (directory, name, object) → home's file number of an
//!   object that left that name in the cache and has no other record: one
//!   fetched from home (removed or replaced: written by the directory's
//!   owner in the change's transaction) or one the write-back had placed
//!   there and that was deleted since (written by its owner, from its
//!   place record). The write-back removes the name at home; an
//!   independent-writer cache tells it from a name another writer made
//!   meanwhile (which it keeps). Forgotten once home no longer has it.

use morris_proto::home::{is_cache_id, HomeStamp};
use morris_proto::{Attr, ErrorCode, FileId, WbHome, WbMark, WireError};
use rusqlite::{params, OptionalExtension, Transaction};

use super::{db_err, encode_inode, from_sql_id, load_inode, sql_id, Cached, Store};

/// What one binding's write-back queue holds in one store.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WbQueue {
    /// Objects with changes not pushed yet.
    pub objects: u64,
    /// When the oldest of them was first changed (wall clock, ms).
    pub oldest_ms: Option<u64>,
    /// The sizes of the files among them whose data changed.
    pub dirty_bytes: u64,
}

/// The tables of this module (run at every open).
pub(super) const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS wb_marks (
    id INTEGER PRIMARY KEY,
    binding INTEGER NOT NULL,
    names INTEGER NOT NULL,
    attrs INTEGER NOT NULL,
    data INTEGER NOT NULL,
    count INTEGER NOT NULL,
    since INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS wb_marks_by_binding ON wb_marks (binding, since);
CREATE TABLE IF NOT EXISTS wb_homes (
    id INTEGER PRIMARY KEY,
    binding INTEGER NOT NULL,
    dir INTEGER NOT NULL,
    name BLOB NOT NULL,
    fileid INTEGER NOT NULL,
    handle BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS wb_homes_by_binding ON wb_homes (binding);
CREATE TABLE IF NOT EXISTS wb_gone (
    dir INTEGER NOT NULL,
    name BLOB NOT NULL,
    id INTEGER NOT NULL,
    binding INTEGER NOT NULL,
    fileid INTEGER NOT NULL,
    PRIMARY KEY (dir, name, id)
);
CREATE INDEX IF NOT EXISTS wb_gone_by_binding ON wb_gone (binding);
";

/// Records that entry `dir/name`, naming `child`, leaves the cache's
/// directory (in the change's transaction): if `child` was fetched from
/// home under that name, the write-back is to remove it there.
pub(super) fn depart(
    tx: &Transaction<'_>,
    dir: FileId,
    name: &[u8],
    child: FileId,
) -> Result<(), WireError> {
    if !is_cache_id(child) {
        return Ok(());
    }
    let Some(link) = super::cached::seed_link(tx, dir, name, child)? else {
        return Ok(());
    };
    tx.prepare_cached(
        "INSERT OR REPLACE INTO wb_gone (dir, name, id, binding, fileid) VALUES (?1, ?2, ?3, ?4, ?5)",
    )
    .and_then(|mut s| {
        s.execute(params![
            sql_id(dir),
            name,
            sql_id(child),
            sql_id(link.binding),
            sql_id(link.fileid)
        ])
    })
    .map_err(db_err)?;
    Ok(())
}

/// What changed.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Changed {
    pub names: bool,
    pub attrs: bool,
    pub data: bool,
}

/// Marks object `id` of `binding` changed, in the change's transaction.
pub(super) fn mark(
    tx: &Transaction<'_>,
    id: FileId,
    binding: FileId,
    c: Changed,
) -> Result<(), WireError> {
    let now = i64::try_from(morris_proto::home::wall_ms()).unwrap_or(i64::MAX);
    tx.prepare_cached(
        "INSERT INTO wb_marks (id, binding, names, attrs, data, count, since)
         VALUES (?1, ?2, ?3, ?4, ?5, 1, ?6)
         ON CONFLICT (id) DO UPDATE SET
            names = names | ?3, attrs = attrs | ?4, data = data | ?5, count = count + 1",
    )
    .and_then(|mut s| {
        s.execute(params![
            sql_id(id),
            sql_id(binding),
            c.names,
            c.attrs,
            c.data,
            now
        ])
    })
    .map_err(db_err)?;
    Ok(())
}

/// Forgets the marks and home place of object `id` (it is being deleted:
/// its directory's mark covers its removal at home, where its place is
/// kept as a departed name, so that an independent-writer cache knows the
/// name at home for its own). The names that left a directory being
/// deleted stay too: its removal at home removes just those.
pub(super) fn forget(tx: &Transaction<'_>, id: FileId) -> Result<(), WireError> {
    tx.exec(
        "INSERT OR REPLACE INTO wb_gone (dir, name, id, binding, fileid)
         SELECT dir, name, id, binding, fileid FROM wb_homes WHERE id = ?1 AND dir != 0",
        params![sql_id(id)],
    )
    .map_err(db_err)?;
    for sql in [
        "DELETE FROM wb_marks WHERE id = ?1",
        "DELETE FROM wb_homes WHERE id = ?1",
    ] {
        tx.exec(sql, params![sql_id(id)]).map_err(db_err)?;
    }
    Ok(())
}

/// Stores where home has object `h.id` of `binding` (a record with `dir`
/// 0 names it by its handle alone: a file fetched from home, detached).
pub(super) fn put_home(tx: &Transaction<'_>, binding: FileId, h: &WbHome) -> Result<(), WireError> {
    put_home_as(tx, binding, h, "REPLACE")
}

/// [`put_home`], unless object `h.id` has a record already (a file made in
/// the cache, pushed and detached again keeps its place).
pub(super) fn put_home_new(
    tx: &Transaction<'_>,
    binding: FileId,
    h: &WbHome,
) -> Result<(), WireError> {
    put_home_as(tx, binding, h, "IGNORE")
}

fn put_home_as(
    tx: &Transaction<'_>,
    binding: FileId,
    h: &WbHome,
    or: &str,
) -> Result<(), WireError> {
    tx.prepare_cached(&format!(
        "INSERT OR {or} INTO wb_homes (id, binding, dir, name, fileid, handle)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)"
    ))
    .and_then(|mut s| {
        s.execute(params![
            sql_id(h.id),
            sql_id(binding),
            sql_id(h.dir),
            h.name,
            sql_id(h.fileid),
            h.handle
        ])
    })
    .map_err(db_err)?;
    Ok(())
}

impl Store {
    /// The marks of `binding`'s objects kept here, set at or before
    /// `due_before` (ms since the epoch).
    pub fn wb_marks(&self, binding: FileId, due_before: u64) -> Result<Vec<WbMark>, WireError> {
        let due = i64::try_from(due_before).unwrap_or(i64::MAX);
        self.with_reader(|c| {
            let mut st = c
                .prepare_cached(
                    "SELECT id, names, attrs, data, count, since FROM wb_marks
                     WHERE binding = ?1 AND since <= ?2 ORDER BY id",
                )
                .map_err(db_err)?;
            let rows = st
                .query_map(params![sql_id(binding), due], |r| {
                    Ok(WbMark {
                        id: from_sql_id(r.get(0)?),
                        names: r.get(1)?,
                        attrs: r.get(2)?,
                        data: r.get(3)?,
                        count: u64::try_from(r.get::<_, i64>(4)?).unwrap_or(0),
                        since_ms: u64::try_from(r.get::<_, i64>(5)?).unwrap_or(0),
                    })
                })
                .map_err(db_err)?;
            rows.collect::<Result<Vec<_>, _>>().map_err(db_err)
        })
    }

    /// What `binding`'s queue holds here: how many marks, the oldest's
    /// time, and the bytes of the files whose data is queued (their sizes:
    /// what their pushes write home).
    pub fn wb_queue(&self, binding: FileId) -> Result<WbQueue, WireError> {
        self.with_reader(|c| {
            let (n, oldest) = c
                .prepare_cached("SELECT count(*), min(since) FROM wb_marks WHERE binding = ?1")
                .and_then(|mut s| {
                    s.query_row(params![sql_id(binding)], |r| {
                        Ok((r.get::<_, i64>(0)?, r.get::<_, Option<i64>>(1)?))
                    })
                })
                .map_err(db_err)?;
            let mut st = c
                .prepare_cached(
                    "SELECT i.id, i.data FROM wb_marks m JOIN inodes i ON i.id = m.id
                     WHERE m.binding = ?1 AND m.data != 0",
                )
                .map_err(db_err)?;
            let rows = st
                .query_map(params![sql_id(binding)], |r| {
                    Ok((from_sql_id(r.get(0)?), r.get::<_, Vec<u8>>(1)?))
                })
                .map_err(db_err)?;
            let mut dirty_bytes = 0u64;
            for row in rows {
                let (id, data) = row.map_err(db_err)?;
                let i = super::decode_inode(id, &data)?;
                if i.attr.kind == morris_proto::FileKind::File {
                    dirty_bytes = dirty_bytes.saturating_add(i.attr.size);
                }
            }
            Ok(WbQueue {
                objects: u64::try_from(n).unwrap_or(0),
                oldest_ms: oldest.and_then(|t| u64::try_from(t).ok()),
                dirty_bytes,
            })
        })
    }

    /// Clears the marks of `marks` whose change count is still as given.
    /// Returns how many were cleared.
    pub fn wb_clear(&self, marks: &[(FileId, u64)]) -> Result<usize, WireError> {
        self.write_txn(|tx| {
            let mut n = 0;
            for &(id, count) in marks {
                n += tx
                    .prepare_cached("DELETE FROM wb_marks WHERE id = ?1 AND count = ?2")
                    .and_then(|mut s| {
                        s.execute(params![sql_id(id), i64::try_from(count).unwrap_or(-1)])
                    })
                    .map_err(db_err)?;
            }
            Ok(n)
        })
    }

    /// Where home has `binding`'s objects kept here, as the write-back
    /// recorded.
    pub fn wb_homes(&self, binding: FileId) -> Result<Vec<WbHome>, WireError> {
        self.with_reader(|c| {
            let mut st = c
                .prepare_cached(
                    "SELECT id, dir, name, fileid, handle FROM wb_homes
                     WHERE binding = ?1 ORDER BY id",
                )
                .map_err(db_err)?;
            let rows = st
                .query_map(params![sql_id(binding)], |r| {
                    Ok(WbHome {
                        id: from_sql_id(r.get(0)?),
                        dir: from_sql_id(r.get(1)?),
                        name: r.get(2)?,
                        fileid: from_sql_id(r.get(3)?),
                        handle: r.get(4)?,
                    })
                })
                .map_err(db_err)?;
            rows.collect::<Result<Vec<_>, _>>().map_err(db_err)
        })
    }

    /// Records where home has object `h.id` of `binding`, and home's stamp
    /// of it (`seen`), if the object still exists here (else nothing: it
    /// was removed meanwhile, and its directory's next push removes it at
    /// home).
    pub fn wb_set_home(
        &self,
        binding: FileId,
        h: &WbHome,
        seen: Option<HomeStamp>,
    ) -> Result<(), WireError> {
        self.write_txn(|tx| {
            let exists = tx
                .prepare_cached("SELECT 1 FROM inodes WHERE id = ?1")
                .and_then(|mut s| s.exists(params![sql_id(h.id)]))
                .map_err(db_err)?;
            if exists {
                put_home(tx, binding, h)?;
                if let Some(seen) = seen {
                    set_seen(tx, h.id, seen)?;
                }
            }
            Ok(())
        })
    }

    /// Records that home has object `h.id` at `h.dir`/`h.name`, before it
    /// moves in the cache, unless a record of where home has it exists (a
    /// detached file's record by handle, `dir` 0, is replaced). Nothing if
    /// the object is gone.
    pub fn wb_place(&self, binding: FileId, h: &WbHome) -> Result<(), WireError> {
        self.write_txn(|tx| {
            let exists = tx
                .prepare_cached("SELECT 1 FROM inodes WHERE id = ?1")
                .and_then(|mut s| s.exists(params![sql_id(h.id)]))
                .map_err(db_err)?;
            if !exists {
                return Ok(());
            }
            let at: Option<(i64, i64, Vec<u8>)> = tx
                .prepare_cached("SELECT dir, fileid, handle FROM wb_homes WHERE id = ?1")
                .and_then(|mut s| {
                    s.query_row(params![sql_id(h.id)], |r| {
                        Ok((r.get(0)?, r.get(1)?, r.get(2)?))
                    })
                    .optional()
                })
                .map_err(db_err)?;
            match at {
                Some((dir, _, _)) if dir != 0 => Ok(()),
                // Detached: home's number and handle are the record's.
                Some((_, fileid, handle)) => put_home(
                    tx,
                    binding,
                    &WbHome {
                        fileid: from_sql_id(fileid),
                        handle,
                        ..h.clone()
                    },
                ),
                None => put_home(tx, binding, h),
            }
        })
    }

    /// Records home's stamp of object `id` as a push left it (nothing if
    /// the object is gone).
    pub fn wb_seen(&self, id: FileId, seen: HomeStamp) -> Result<(), WireError> {
        self.write_txn(|tx| set_seen(tx, id, seen))
    }

    /// Whether object `id` has changes not yet pushed home.
    pub fn wb_marked(&self, id: FileId) -> Result<bool, WireError> {
        self.with_reader(|c| {
            c.prepare_cached("SELECT 1 FROM wb_marks WHERE id = ?1")
                .and_then(|mut s| s.exists(params![sql_id(id)]))
                .map_err(db_err)
        })
    }

    /// The names objects of `binding` left with no other record, kept here
    /// (as [`WbHome`] records: `id` the object, `handle` empty).
    pub fn wb_gone(&self, binding: FileId) -> Result<Vec<WbHome>, WireError> {
        self.with_reader(|c| {
            let mut st = c
                .prepare_cached(
                    "SELECT id, dir, name, fileid FROM wb_gone WHERE binding = ?1 ORDER BY dir",
                )
                .map_err(db_err)?;
            let rows = st
                .query_map(params![sql_id(binding)], |r| {
                    Ok(WbHome {
                        id: from_sql_id(r.get(0)?),
                        dir: from_sql_id(r.get(1)?),
                        name: r.get(2)?,
                        fileid: from_sql_id(r.get(3)?),
                        handle: Vec::new(),
                    })
                })
                .map_err(db_err)?;
            rows.collect::<Result<Vec<_>, _>>().map_err(db_err)
        })
    }

    /// A name of object `id` in a directory kept here (as a [`WbHome`]
    /// record: `dir`, `name`), if any. Scans the entries: for conflicts,
    /// which are rare.
    pub fn wb_name_of(&self, id: FileId) -> Result<Vec<WbHome>, WireError> {
        self.with_reader(|c| {
            c.prepare_cached("SELECT dir, name FROM entries WHERE child = ?1 LIMIT 1")
                .and_then(|mut s| {
                    s.query_row(params![sql_id(id)], |r| {
                        Ok(WbHome {
                            id,
                            dir: from_sql_id(r.get(0)?),
                            name: r.get(1)?,
                            fileid: 0,
                            handle: Vec::new(),
                        })
                    })
                    .optional()
                })
                .map(|o| o.into_iter().collect())
                .map_err(db_err)
        })
    }

    /// Forgets departed names `(dir, name, id)` (only records of that very
    /// object: a name left again by another object since stays).
    pub fn wb_gone_clear(&self, gone: &[(FileId, Vec<u8>, FileId)]) -> Result<(), WireError> {
        self.write_txn(|tx| {
            for (dir, name, id) in gone {
                tx.prepare_cached("DELETE FROM wb_gone WHERE dir = ?1 AND name = ?2 AND id = ?3")
                    .and_then(|mut s| s.execute(params![sql_id(*dir), name, sql_id(*id)]))
                    .map_err(db_err)?;
            }
            Ok(())
        })
    }

    /// A conflict resolved for home: object `id` becomes home's version
    /// (`now`: handle, stamp, attributes — a directory keeps its own; a new
    /// content version), its place record becomes `place` (when given),
    /// and its mark goes — only if the mark's change count is still
    /// `count` (0: no mark); `Stale` if not. `count` `None`: the mark
    /// stays. `now` `None`: home removed the object; only the mark goes.
    pub fn wb_rebase(
        &self,
        id: FileId,
        count: Option<u64>,
        binding: FileId,
        place: Option<&WbHome>,
        now: Option<&(Vec<u8>, HomeStamp, Attr)>,
    ) -> Result<(), WireError> {
        self.write_txn(|tx| {
            if let Some(count) = count {
                let marked: Option<i64> = tx
                    .prepare_cached("SELECT count FROM wb_marks WHERE id = ?1")
                    .and_then(|mut s| s.query_row(params![sql_id(id)], |r| r.get(0)).optional())
                    .map_err(db_err)?;
                let as_read = marked.map_or(0, |c| u64::try_from(c).unwrap_or(0));
                if as_read != count {
                    return Err(WireError::new(
                        ErrorCode::Stale,
                        format!("object {id} changed in the cache meanwhile"),
                    ));
                }
                tx.exec("DELETE FROM wb_marks WHERE id = ?1", params![sql_id(id)])
                    .map_err(db_err)?;
            }
            let Some((handle, stamp, attr)) = now else {
                return Ok(());
            };
            let Some(mut ino) = load_inode(tx, id)? else {
                return Ok(());
            };
            let Some(mut link) = ino.home.take().map(|l| *l) else {
                return Err(WireError::new(
                    ErrorCode::Invalid,
                    format!("object {id} is not under a binding"),
                ));
            };
            link.handle = handle.clone();
            link.seen = *stamp;
            link.checked_ms = morris_proto::home::wall_ms();
            link.version = link.version.wrapping_add(1);
            if let Some(p) = place {
                link.fileid = p.fileid;
                put_home(tx, binding, p)?;
            } else {
                // Made in the cache, or detached: home's number is the
                // place record's; a detached file's handle is in its link
                // again.
                let fileid: Option<i64> = tx
                    .prepare_cached("SELECT fileid FROM wb_homes WHERE id = ?1")
                    .and_then(|mut s| s.query_row(params![sql_id(id)], |r| r.get(0)).optional())
                    .map_err(db_err)?;
                if let Some(f) = fileid {
                    link.fileid = from_sql_id(f);
                }
                tx.exec(
                    "DELETE FROM wb_homes WHERE id = ?1 AND dir = 0",
                    params![sql_id(id)],
                )
                .map_err(db_err)?;
            }
            if ino.attr.kind != morris_proto::FileKind::Dir {
                super::cached::apply_home_attr(&mut ino.attr, attr);
            }
            tx.exec(
                "UPDATE inodes SET data = ?2 WHERE id = ?1",
                params![sql_id(id), encode_inode(&ino)?],
            )
            .map_err(db_err)?;
            super::cached::put_link(tx, id, &link)?;
            Ok(())
        })
    }
}

/// Sets home's stamp in object `id`'s link (nothing if it has none).
fn set_seen(tx: &Transaction<'_>, id: FileId, seen: HomeStamp) -> Result<(), WireError> {
    let Some(mut link) = super::cached::link_of(tx, id)? else {
        return Ok(());
    };
    link.seen = seen;
    super::cached::put_link(tx, id, &link)
}

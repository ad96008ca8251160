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
//!   handle), for objects the write-back made or moved at home. Objects
//!   fetched from home need none: their id is derived from home's file
//!   number, and they do not move.

use morris_proto::{FileId, WbHome, WbMark, WireError};
use rusqlite::{params, Transaction};

use super::{db_err, from_sql_id, sql_id, Store};

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
";

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
/// its directory's mark covers its removal at home).
pub(super) fn forget(tx: &Transaction<'_>, id: FileId) -> Result<(), WireError> {
    for sql in [
        "DELETE FROM wb_marks WHERE id = ?1",
        "DELETE FROM wb_homes WHERE id = ?1",
    ] {
        tx.execute(sql, params![sql_id(id)]).map_err(db_err)?;
    }
    Ok(())
}

/// Stores where home has object `h.id` of `binding` (a record with `dir`
/// 0 names it by its handle alone: a file fetched from home, detached).
pub(super) fn put_home(tx: &Transaction<'_>, binding: FileId, h: &WbHome) -> Result<(), WireError> {
    tx.prepare_cached(
        "INSERT OR REPLACE INTO wb_homes (id, binding, dir, name, fileid, handle)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
    )
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

    /// How many marks of `binding` are kept here, and the oldest's time.
    pub fn wb_queue(&self, binding: FileId) -> Result<(u64, Option<u64>), WireError> {
        self.with_reader(|c| {
            c.prepare_cached("SELECT count(*), min(since) FROM wb_marks WHERE binding = ?1")
                .and_then(|mut s| {
                    s.query_row(params![sql_id(binding)], |r| {
                        Ok((r.get::<_, i64>(0)?, r.get::<_, Option<i64>>(1)?))
                    })
                })
                .map(|(n, t)| {
                    (
                        u64::try_from(n).unwrap_or(0),
                        t.and_then(|t| u64::try_from(t).ok()),
                    )
                })
                .map_err(db_err)
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

    /// Records where home has object `h.id` of `binding`, if the object
    /// still exists here (else nothing: it was removed meanwhile, and its
    /// directory's next push removes it at home).
    pub fn wb_set_home(&self, binding: FileId, h: &WbHome) -> Result<(), WireError> {
        self.write_txn(|tx| {
            let exists = tx
                .prepare_cached("SELECT 1 FROM inodes WHERE id = ?1")
                .and_then(|mut s| s.exists(params![sql_id(h.id)]))
                .map_err(db_err)?;
            if exists {
                put_home(tx, binding, h)?;
            }
            Ok(())
        })
    }
}

//! Orphans and open records: an inode whose last name is gone stays while
//! any client has it open (POSIX: an open file outlives its names).
//!
//! Tables (both replicated with the range):
//! * `orphans`: inode id → when (ms since the Unix epoch) it lost its last
//!   name. Written by [`Store::drop_link`] when `nlink` reaches 0, removed
//!   with the inode by [`Store::reap`].
//! * `opens`: (inode id, client id) for every client that told the owner
//!   it has the inode open ([`Store::set_open`]). Clients record an open
//!   only when it matters: when they give up (or lose) the lease of a file
//!   they have open, or open a file that is already an orphan. Whether a
//!   record's client is still alive is the service's call (it has talked
//!   to this server within a lease time); a dead client's records are
//!   dropped when the orphan is reaped.
//!
//! | inode state | DropLink | SetOpen open | SetOpen closed | Reap |
//! |---|---|---|---|---|
//! | named (nlink ≥ 1) | nlink − 1; at 0 → orphan | record | forget | kept (`None`) |
//! | orphan, a live record | — (nlink stays 0) | record | forget | kept |
//! | orphan, no live record | — | record | — | **removed**: inode, records, orphan row |
//! | gone | `Stale` | `Stale` | ok | `Stale` |

use morris_proto::{ErrorCode, FileId, FileKind, Handle, Inode, Orphan, Timestamp, WireError};
use rusqlite::{params, OptionalExtension, Transaction};

use super::once::OpKey;
use super::{check_handle, db_err, from_sql_id, load_inode, sql_id, Store};

/// Milliseconds since the Unix epoch.
fn unix_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

fn store_inode(tx: &Transaction<'_>, ino: &Inode) -> Result<(), WireError> {
    let data = super::encode_inode(ino)?;
    tx.prepare_cached("UPDATE inodes SET data = ?2 WHERE id = ?1")
        .and_then(|mut s| s.execute(params![sql_id(ino.id), data]))
        .map_err(db_err)?;
    Ok(())
}

/// Whether directory `dir` has any entry.
pub(super) fn has_entries(tx: &Transaction<'_>, dir: FileId) -> Result<bool, WireError> {
    let any: Option<i64> = tx
        .prepare_cached("SELECT 1 FROM entries WHERE dir = ?1 LIMIT 1")
        .and_then(|mut s| s.query_row(params![sql_id(dir)], |r| r.get(0)).optional())
        .map_err(db_err)?;
    Ok(any.is_some())
}

/// The clients with an open record of `id`.
fn open_clients(c: &rusqlite::Connection, id: FileId) -> Result<Vec<u64>, WireError> {
    let mut stmt = c
        .prepare_cached("SELECT client FROM opens WHERE ino = ?1")
        .map_err(db_err)?;
    let rows = stmt
        .query_map(params![sql_id(id)], |r| r.get::<_, i64>(0))
        .map_err(db_err)?;
    rows.map(|r| r.map(|c| c as u64).map_err(db_err)).collect()
}

impl Store {
    /// One name of `h` is gone: counts its link down (a directory's to 0,
    /// and it must be empty); at 0 the inode becomes an orphan.
    pub fn drop_link(&self, h: Handle, op: Option<OpKey>) -> Result<Inode, WireError> {
        if h.id == morris_proto::ROOT_ID {
            return Err(WireError::new(
                ErrorCode::Invalid,
                "the root directory has no link to drop",
            ));
        }
        self.write_txn_once(op, |tx| {
            let mut ino = check_handle(h, load_inode(tx, h.id)?)?;
            if ino.attr.kind == FileKind::Dir {
                if has_entries(tx, h.id)? {
                    return Err(WireError::new(
                        ErrorCode::NotEmpty,
                        format!("directory {} is not empty", h.id),
                    ));
                }
                ino.attr.nlink = 0;
            } else {
                ino.attr.nlink = ino.attr.nlink.saturating_sub(1);
            }
            ino.attr.ctime = Timestamp::now();
            store_inode(tx, &ino)?;
            if ino.attr.nlink == 0 {
                tx.prepare_cached("INSERT OR IGNORE INTO orphans (ino, since) VALUES (?1, ?2)")
                    .and_then(|mut s| s.execute(params![sql_id(h.id), unix_ms()]))
                    .map_err(db_err)?;
            }
            Ok(ino)
        })
        .map(|(ino, _)| ino)
    }

    /// Records or forgets that `client` has `h` open.
    pub fn set_open(
        &self,
        h: Handle,
        client: u64,
        open: bool,
        op: Option<OpKey>,
    ) -> Result<(), WireError> {
        self.write_txn_once(op, |tx| {
            let exists = check_handle(h, load_inode(tx, h.id)?);
            if open {
                exists?;
                tx.prepare_cached("INSERT OR IGNORE INTO opens (ino, client) VALUES (?1, ?2)")
                    .and_then(|mut s| s.execute(params![sql_id(h.id), client as i64]))
                    .map_err(db_err)?;
            } else {
                tx.prepare_cached("DELETE FROM opens WHERE ino = ?1 AND client = ?2")
                    .and_then(|mut s| s.execute(params![sql_id(h.id), client as i64]))
                    .map_err(db_err)?;
            }
            Ok(())
        })
        .map(|_| ())
    }

    /// Removes `h` if it is an orphan without a live open record (`live`
    /// says which clients are alive; the records of the others go).
    /// Returns the removed inode, or `None` if it stays.
    pub fn reap(
        &self,
        h: Handle,
        live: &dyn Fn(u64) -> bool,
        op: Option<OpKey>,
    ) -> Result<Option<Inode>, WireError> {
        let (out, replayed) = self.write_txn_once(op, |tx| {
            let ino = check_handle(h, load_inode(tx, h.id)?)?;
            if ino.attr.nlink > 0 {
                tx.prepare_cached("DELETE FROM orphans WHERE ino = ?1")
                    .and_then(|mut s| s.execute(params![sql_id(h.id)]))
                    .map_err(db_err)?;
                return Ok(None);
            }
            let clients = open_clients(tx, h.id)?;
            let mut alive = false;
            for c in clients {
                if live(c) {
                    alive = true;
                } else {
                    tx.prepare_cached("DELETE FROM opens WHERE ino = ?1 AND client = ?2")
                        .and_then(|mut s| s.execute(params![sql_id(h.id), c as i64]))
                        .map_err(db_err)?;
                }
            }
            if alive {
                return Ok(None);
            }
            if ino.attr.kind == FileKind::Dir && has_entries(tx, h.id)? {
                return Err(WireError::new(
                    ErrorCode::NotEmpty,
                    format!("orphan directory {} is not empty", h.id),
                ));
            }
            for sql in [
                "DELETE FROM inodes WHERE id = ?1",
                "DELETE FROM orphans WHERE ino = ?1",
                "DELETE FROM opens WHERE ino = ?1",
            ] {
                tx.prepare_cached(sql)
                    .and_then(|mut s| s.execute(params![sql_id(h.id)]))
                    .map_err(db_err)?;
            }
            super::cached::forget_inode(tx, h.id)?;
            super::xattrs::forget(tx, h.id)?;
            Ok(Some(ino))
        })?;
        if out.is_some() && !replayed {
            self.inodes
                .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
        }
        Ok(out)
    }

    /// Orphans with id > `after`, ascending, at most `max`; `live` says
    /// which clients are alive (for [`Orphan::open`]).
    pub fn scan_orphans(
        &self,
        after: FileId,
        max: u32,
        live: &dyn Fn(u64) -> bool,
    ) -> Result<Vec<Orphan>, WireError> {
        let Ok(after) = i64::try_from(after) else {
            return Ok(Vec::new());
        };
        let max = max.clamp(1, 4096);
        let now = unix_ms();
        self.with_reader(|c| {
            let mut stmt = c
                .prepare_cached(
                    "SELECT ino, since FROM orphans WHERE ino > ?1 ORDER BY ino LIMIT ?2",
                )
                .map_err(db_err)?;
            let rows: Vec<(i64, i64)> = stmt
                .query_map(params![after, i64::from(max)], |r| {
                    Ok((r.get(0)?, r.get(1)?))
                })
                .map_err(db_err)?
                .collect::<Result<_, _>>()
                .map_err(db_err)?;
            let mut out = Vec::with_capacity(rows.len());
            for (id, since) in rows {
                let id = from_sql_id(id);
                let Some(inode) = load_inode(c, id)? else {
                    continue;
                };
                let open = open_clients(c, id)?.into_iter().any(live);
                out.push(Orphan {
                    inode,
                    age_secs: (now.saturating_sub(since).max(0) / 1000) as u64,
                    open,
                });
            }
            Ok(out)
        })
    }
}

//! Stale-copy records: which server's copies of which file's blocks missed
//! writes while that server was down or cut off (mirrored volumes).
//!
//! A record `(id, server) → (from, seq)` lives at the owner of `id`, next
//! to the inode, and travels with it ([`Inode::stale`]): a reader never reads
//! block `i >= from` of `id` from `server`. The record is widened (lower
//! `from`, new `seq`) by every further missed write, and narrowed or removed
//! only by that server's resync through [`Store::resync_advance`], which must
//! name the `seq` it copied under. `from = 0` marks a deleted file whose
//! blocks the server may still hold.

use std::sync::atomic::{AtomicU64, Ordering};

use morris_proto::{ErrorCode, FileId, Handle, Inode, StaleCopy, WireError};
use rusqlite::{params, Connection, OptionalExtension};

use super::{check_handle, db_err, load_inode, sql_id, Cached, Store, MAX_PAGE};

/// Last `seq` handed out by this process; seqs grow across restarts because
/// they start from the wall clock.
static LAST_SEQ: AtomicU64 = AtomicU64::new(0);

/// A `seq` larger than every earlier one (wall-clock nanoseconds, bumped if
/// the clock stood still or went back).
fn next_seq(c: &Connection) -> Result<u64, WireError> {
    let stored: i64 = c
        .row("SELECT COALESCE(MAX(seq), 0) FROM stale_copies", [], |r| {
            r.get(0)
        })
        .map_err(db_err)?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let floor = (stored.max(0) as u64).max(now);
    let mut last = LAST_SEQ.load(Ordering::Relaxed);
    loop {
        let next = floor.max(last + 1);
        match LAST_SEQ.compare_exchange(last, next, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => return Ok(next),
            Err(cur) => last = cur,
        }
    }
}

fn to_sql(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// The records of file `id`, by server.
pub(super) fn records_of(c: &Connection, id: FileId) -> Result<Vec<StaleCopy>, WireError> {
    let mut stmt = c
        .prepare_cached(
            "SELECT server, from_block, seq FROM stale_copies WHERE id = ?1 ORDER BY server",
        )
        .map_err(db_err)?;
    let rows = stmt
        .query_map(params![sql_id(id)], |r| {
            Ok(StaleCopy {
                server: r.get::<_, i64>(0)? as u32,
                from: r.get::<_, i64>(1)? as u64,
                seq: r.get::<_, i64>(2)? as u64,
            })
        })
        .map_err(db_err)?;
    rows.collect::<Result<Vec<_>, _>>().map_err(db_err)
}

/// Inserts or widens the record of (`id`, `server`) to `from`.
fn widen(c: &Connection, id: FileId, server: u32, from: u64) -> Result<(), WireError> {
    let seq = next_seq(c)?;
    c.exec(
        "INSERT INTO stale_copies (id, server, from_block, seq) VALUES (?1, ?2, ?3, ?4)
         ON CONFLICT (id, server) DO UPDATE SET
             from_block = MIN(from_block, excluded.from_block), seq = excluded.seq",
        params![sql_id(id), i64::from(server), to_sql(from), to_sql(seq)],
    )
    .map_err(db_err)?;
    Ok(())
}

impl Store {
    /// Records that `server` missed a write to blocks `from` and above of
    /// the file `h` names; returns the inode with all its records.
    pub fn mark_stale(&self, h: Handle, server: u32, from: u64) -> Result<Inode, WireError> {
        if from == 0 {
            return Err(WireError::new(
                ErrorCode::Invalid,
                "a stale block range starts at block 1 or above",
            ));
        }
        self.check_server(server)?;
        self.write_txn(|tx| {
            let ino = check_handle(h, load_inode(tx, h.id)?)?;
            if ino.attr.kind != morris_proto::FileKind::File {
                return Err(WireError::new(
                    ErrorCode::Invalid,
                    "only regular files have data blocks",
                ));
            }
            widen(tx, h.id, server, from)?;
            check_handle(h, load_inode(tx, h.id)?)
        })
    }

    /// Records that `server` may still hold blocks of the deleted file `id`.
    pub fn note_leftover(&self, id: FileId, server: u32) -> Result<(), WireError> {
        self.check_server(server)?;
        self.write_txn(|tx| widen(tx, id, server, 0))
    }

    /// Records naming `server`, for ids above `after`, with the inode if the
    /// file still exists.
    pub fn scan_stale(
        &self,
        server: u32,
        after: FileId,
        max: u32,
    ) -> Result<Vec<(FileId, StaleCopy, Option<Inode>)>, WireError> {
        let Ok(after) = i64::try_from(after) else {
            return Ok(Vec::new());
        };
        let max = max.clamp(1, MAX_PAGE / 4);
        self.with_reader(|c| {
            let mut stmt = c
                .prepare_cached(
                    "SELECT id, from_block, seq FROM stale_copies
                     WHERE server = ?1 AND id > ?2 ORDER BY id LIMIT ?3",
                )
                .map_err(db_err)?;
            let rows = stmt
                .query_map(params![i64::from(server), after, i64::from(max)], |r| {
                    Ok((
                        r.get::<_, i64>(0)? as u64,
                        r.get::<_, i64>(1)? as u64,
                        r.get::<_, i64>(2)? as u64,
                    ))
                })
                .map_err(db_err)?
                .collect::<Result<Vec<_>, _>>()
                .map_err(db_err)?;
            let mut out = Vec::with_capacity(rows.len());
            for (id, from, seq) in rows {
                let rec = StaleCopy { server, from, seq };
                out.push((id, rec, load_inode(c, id)?));
            }
            Ok(out)
        })
    }

    /// Narrows (to `upto`) or removes (`None`) the record of (`id`,
    /// `server`), if it still has `seq`; `Stale` otherwise.
    pub fn resync_advance(
        &self,
        id: FileId,
        server: u32,
        seq: u64,
        upto: Option<u64>,
    ) -> Result<(), WireError> {
        self.write_txn(|tx| {
            let cur: Option<i64> = tx
                .row(
                    "SELECT seq FROM stale_copies WHERE id = ?1 AND server = ?2",
                    params![sql_id(id), i64::from(server)],
                    |r| r.get(0),
                )
                .optional()
                .map_err(db_err)?;
            if cur != Some(to_sql(seq)) {
                return Err(WireError::new(
                    ErrorCode::Stale,
                    format!("the stale record of file {id} on server {server} changed"),
                ));
            }
            match upto {
                None => tx.exec(
                    "DELETE FROM stale_copies WHERE id = ?1 AND server = ?2",
                    params![sql_id(id), i64::from(server)],
                ),
                Some(upto) => tx.exec(
                    "UPDATE stale_copies SET from_block = MAX(from_block, ?3)
                     WHERE id = ?1 AND server = ?2",
                    params![sql_id(id), i64::from(server), to_sql(upto)],
                ),
            }
            .map_err(db_err)?;
            Ok(())
        })
    }

    /// Records kept here, counted by the server they name.
    pub fn stale_counts(&self) -> Result<Vec<(u32, u64)>, WireError> {
        self.with_reader(|c| {
            let mut stmt = c
                .prepare_cached(
                    "SELECT server, COUNT(*) FROM stale_copies GROUP BY server ORDER BY server",
                )
                .map_err(db_err)?;
            let rows = stmt
                .query_map([], |r| {
                    Ok((r.get::<_, i64>(0)? as u32, r.get::<_, i64>(1)? as u64))
                })
                .map_err(db_err)?;
            rows.collect::<Result<Vec<_>, _>>().map_err(db_err)
        })
    }

    fn check_server(&self, server: u32) -> Result<(), WireError> {
        let k = self
            .formatted()
            .map(|f| f.descriptor.servers.len() as u32)
            .unwrap_or(0);
        if server >= k {
            return Err(WireError::new(
                ErrorCode::Invalid,
                format!("no server {server} in this volume"),
            ));
        }
        Ok(())
    }
}

//! What each user and group has stored (`morris quota`): inodes and bytes
//! per uid and per gid, kept by SQLite triggers on the `inodes` table, so
//! every path that writes an inode (creates, size and owner changes,
//! removals, a copy applying the primary's changes, a snapshot installed)
//! counts in the same transaction, and a `kill -9` can never leave the
//! counts and the inodes apart.
//!
//! The triggers read a record through SQL functions registered on the
//! store's connection ([`register`]), which decode it as `stored.rs` does
//! ([`super::stored::account`]); a record that does not decode counts
//! against id -1, so that its removal balances its insertion. The table is
//! this copy's own (not mirrored): a copy applying the primary's changes
//! runs the same triggers and arrives at the same counts.
//!
//! | inode change | usage |
//! |---|---|
//! | inserted | its owner's and its group's rows: +1 inode, + its bytes |
//! | removed | −1 inode, − its bytes |
//! | record rewritten, owner, group or bytes changed | the old values out, the new in |
//! | record rewritten, nothing counted changed | nothing (the trigger's `WHEN`) |

use morris_proto::{QuotaLimit, UsageRow, WireError};
use rusqlite::functions::FunctionFlags;
use rusqlite::{params, Connection};

use super::{db_err, stored, Store};

/// The table and its triggers (created with the store's schema, after
/// [`register`]).
pub(super) const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS usage (
    kind INTEGER NOT NULL,
    id INTEGER NOT NULL,
    inodes INTEGER NOT NULL,
    bytes INTEGER NOT NULL,
    PRIMARY KEY (kind, id)
) WITHOUT ROWID;
CREATE TRIGGER IF NOT EXISTS usage_inserted AFTER INSERT ON inodes BEGIN
    INSERT INTO usage (kind, id, inodes, bytes)
        VALUES (0, morris_uid(NEW.data), 1, morris_bytes(NEW.data))
        ON CONFLICT (kind, id) DO UPDATE
        SET inodes = inodes + 1, bytes = bytes + excluded.bytes;
    INSERT INTO usage (kind, id, inodes, bytes)
        VALUES (1, morris_gid(NEW.data), 1, morris_bytes(NEW.data))
        ON CONFLICT (kind, id) DO UPDATE
        SET inodes = inodes + 1, bytes = bytes + excluded.bytes;
END;
CREATE TRIGGER IF NOT EXISTS usage_removed AFTER DELETE ON inodes BEGIN
    UPDATE usage SET inodes = inodes - 1, bytes = bytes - morris_bytes(OLD.data)
        WHERE kind = 0 AND id = morris_uid(OLD.data);
    UPDATE usage SET inodes = inodes - 1, bytes = bytes - morris_bytes(OLD.data)
        WHERE kind = 1 AND id = morris_gid(OLD.data);
END;
CREATE TRIGGER IF NOT EXISTS usage_changed AFTER UPDATE OF data ON inodes
WHEN morris_account(OLD.data) IS NOT morris_account(NEW.data) BEGIN
    UPDATE usage SET inodes = inodes - 1, bytes = bytes - morris_bytes(OLD.data)
        WHERE kind = 0 AND id = morris_uid(OLD.data);
    UPDATE usage SET inodes = inodes - 1, bytes = bytes - morris_bytes(OLD.data)
        WHERE kind = 1 AND id = morris_gid(OLD.data);
    INSERT INTO usage (kind, id, inodes, bytes)
        VALUES (0, morris_uid(NEW.data), 1, morris_bytes(NEW.data))
        ON CONFLICT (kind, id) DO UPDATE
        SET inodes = inodes + 1, bytes = bytes + excluded.bytes;
    INSERT INTO usage (kind, id, inodes, bytes)
        VALUES (1, morris_gid(NEW.data), 1, morris_bytes(NEW.data))
        ON CONFLICT (kind, id) DO UPDATE
        SET inodes = inodes + 1, bytes = bytes + excluded.bytes;
END;
";

/// Limits set with `morris quota set` (kept by the root directory's range,
/// and mirrored with it).
pub(super) const LIMITS_SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS quota_limits (
    kind INTEGER NOT NULL,
    id INTEGER NOT NULL,
    inodes INTEGER NOT NULL,
    bytes INTEGER NOT NULL,
    PRIMARY KEY (kind, id)
) WITHOUT ROWID;
";

/// Counts every inode again (a store from before the table, format < 5).
pub(super) const RECOUNT: &str = "
DELETE FROM usage;
INSERT INTO usage (kind, id, inodes, bytes)
    SELECT 0, morris_uid(data), count(*), sum(morris_bytes(data)) FROM inodes GROUP BY 2;
INSERT INTO usage (kind, id, inodes, bytes)
    SELECT 1, morris_gid(data), count(*), sum(morris_bytes(data)) FROM inodes GROUP BY 2;
";

/// What a record counts: `(uid, gid, bytes)`, `None` if it does not decode.
type Counted = Option<(u32, u32, u64)>;

thread_local! {
    /// The last record the functions decoded, and what it counts.
    static LAST: std::cell::RefCell<(Vec<u8>, Counted)> =
        const { std::cell::RefCell::new((Vec::new(), None)) };
}

/// Registers the functions the triggers call on `conn` (every connection
/// that may write `inodes` needs them).
pub(crate) fn register(conn: &Connection) -> rusqlite::Result<()> {
    let flags = FunctionFlags::SQLITE_UTF8 | FunctionFlags::SQLITE_DETERMINISTIC;
    let blob = |ctx: &rusqlite::functions::Context<'_>| -> Counted {
        let data = ctx.get_raw(0).as_blob().ok()?;
        // A trigger asks for the same record's fields several times in a
        // row: decode it once.
        LAST.with(|last| {
            let mut last = last.borrow_mut();
            if last.0 != data {
                *last = (data.to_vec(), stored::account(data));
            }
            last.1
        })
    };
    conn.create_scalar_function("morris_uid", 1, flags, move |ctx| {
        Ok(blob(ctx).map_or(-1, |(u, _, _)| i64::from(u)))
    })?;
    conn.create_scalar_function("morris_gid", 1, flags, move |ctx| {
        Ok(blob(ctx).map_or(-1, |(_, g, _)| i64::from(g)))
    })?;
    conn.create_scalar_function("morris_bytes", 1, flags, move |ctx| {
        Ok(blob(ctx).map_or(0, |(_, _, b)| i64::try_from(b).unwrap_or(i64::MAX)))
    })?;
    conn.create_scalar_function("morris_account", 1, flags, move |ctx| {
        Ok(blob(ctx).map(|(u, g, b)| format!("{u}:{g}:{b}")))
    })?;
    Ok(())
}

impl Store {
    /// Sets `limit` (both limits 0: removes it).
    pub fn set_quota(&self, limit: &QuotaLimit) -> Result<(), WireError> {
        let kind = i64::from(limit.group);
        let as_sql = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        self.write_txn(|tx| {
            if limit.inodes == 0 && limit.bytes == 0 {
                tx.execute(
                    "DELETE FROM quota_limits WHERE kind = ?1 AND id = ?2",
                    params![kind, limit.id],
                )
            } else {
                tx.execute(
                    "INSERT INTO quota_limits (kind, id, inodes, bytes) VALUES (?1, ?2, ?3, ?4)
                     ON CONFLICT (kind, id) DO UPDATE SET inodes = ?3, bytes = ?4",
                    params![kind, limit.id, as_sql(limit.inodes), as_sql(limit.bytes)],
                )
            }
            .map_err(db_err)?;
            Ok(())
        })
    }

    /// Every limit set.
    pub fn quotas(&self) -> Result<Vec<QuotaLimit>, WireError> {
        self.with_reader(|c| {
            let mut stmt = c
                .prepare_cached(
                    "SELECT kind, id, inodes, bytes FROM quota_limits ORDER BY kind, id",
                )
                .map_err(db_err)?;
            let rows = stmt
                .query_map([], |r| {
                    Ok(QuotaLimit {
                        group: r.get::<_, i64>(0)? == 1,
                        id: r.get(1)?,
                        inodes: r.get::<_, i64>(2)?.max(0) as u64,
                        bytes: r.get::<_, i64>(3)?.max(0) as u64,
                    })
                })
                .map_err(db_err)?;
            rows.map(|r| r.map_err(db_err)).collect()
        })
    }

    /// What every user and group has stored in this copy, rows that count
    /// nothing left out.
    pub fn usage(&self) -> Result<Vec<UsageRow>, WireError> {
        self.with_reader(|c| {
            let mut stmt = c
                .prepare_cached(
                    "SELECT kind, id, inodes, bytes FROM usage
                     WHERE inodes != 0 OR bytes != 0 ORDER BY kind, id",
                )
                .map_err(db_err)?;
            let rows = stmt
                .query_map([], |r| {
                    Ok(UsageRow {
                        group: r.get::<_, i64>(0)? == 1,
                        id: r.get::<_, i64>(1)?,
                        inodes: r.get::<_, i64>(2)?,
                        bytes: r.get::<_, i64>(3)?,
                    })
                })
                .map_err(db_err)?;
            rows.map(|r| r.map_err(db_err)).collect()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use morris_proto::{FileKind, SetAttr};

    /// Every inode counted from scratch, as [`Store::usage`] lists them.
    fn recount(s: &Store) -> Vec<UsageRow> {
        s.with_reader(|c| {
            let sql = "SELECT kind, id, inodes, bytes FROM (
                 SELECT 0 AS kind, morris_uid(data) AS id, count(*) AS inodes,
                        sum(morris_bytes(data)) AS bytes FROM inodes GROUP BY 2
                 UNION ALL
                 SELECT 1, morris_gid(data), count(*), sum(morris_bytes(data))
                 FROM inodes GROUP BY 2) ORDER BY kind, id";
            let mut stmt = c.prepare(sql).unwrap();
            let rows = stmt
                .query_map([], |r| {
                    Ok(UsageRow {
                        group: r.get::<_, i64>(0)? == 1,
                        id: r.get(1)?,
                        inodes: r.get(2)?,
                        bytes: r.get(3)?,
                    })
                })
                .unwrap();
            rows.map(|r| r.unwrap()).collect()
        })
    }

    #[test]
    fn counts_follow_every_change_of_an_inode() {
        let dir = tempfile::tempdir().unwrap();
        let (s, _) = super::super::tests::open_formatted(dir.path());
        let root = super::super::tests::root(&s);
        let mut a = super::super::tests::attr(FileKind::File);
        a.uid = 1000;
        a.gid = 100;
        let f = s.create_inode(root.id, &a, None, 1, None, None).unwrap();
        let g = s.create_inode(root.id, &a, None, 2, None, None).unwrap();
        let row = |group, id| {
            s.usage()
                .unwrap()
                .into_iter()
                .find(|r| r.group == group && r.id == id)
                .map(|r| (r.inodes, r.bytes))
        };
        assert_eq!(row(false, 1000), Some((2, 0)));
        assert_eq!(row(true, 100), Some((2, 0)));
        let grow = SetAttr {
            size: Some(10_000),
            ..SetAttr::default()
        };
        s.set_attr(f.handle(), &grow).unwrap();
        assert_eq!(row(false, 1000), Some((2, 12_288)), "pages of 4 KiB");
        let chown = SetAttr {
            uid: Some(1001),
            ..SetAttr::default()
        };
        s.set_attr(f.handle(), &chown).unwrap();
        assert_eq!(row(false, 1000), Some((1, 0)));
        assert_eq!(row(false, 1001), Some((1, 12_288)));
        assert_eq!(row(true, 100), Some((2, 12_288)));
        s.delete_inode(g.handle(), None).unwrap();
        assert_eq!(row(false, 1000), None, "nothing left");
        assert_eq!(s.usage().unwrap(), recount(&s));
    }
}

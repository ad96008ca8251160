//! The rebuild mark of a server that took the place of a lost one
//! (`Replace`, docs/operations.md "Replacing a lost server").
//!
//! Set in the transaction that formats the replacement; while it is set
//! the server answers no read of its data blocks (its disk is empty: it
//! would answer zeros), and its resync loop records every file with blocks
//! on it stale (`Client::record_rebuild`). Cleared once that pass went
//! through every metadata range; from then on clients skip its copies of
//! those files by their stale records until resync has rewritten them.
//! The table is this server's own: a metadata snapshot installed from a
//! range's primary keeps it.

use rusqlite::{params, OptionalExtension, Transaction};

use super::{db_err, Cached, Store};
use morris_proto::WireError;

/// The table of this module (run at every open).
pub(super) const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS rebuild (
    one INTEGER PRIMARY KEY CHECK (one = 1),
    since INTEGER NOT NULL
);
";

/// Sets the mark (in the formatting transaction).
pub(super) fn mark(tx: &Transaction<'_>) -> Result<(), WireError> {
    let now = i64::try_from(morris_proto::home::wall_ms()).unwrap_or(i64::MAX);
    tx.exec(
        "INSERT OR REPLACE INTO rebuild (one, since) VALUES (1, ?1)",
        params![now],
    )
    .map_err(db_err)?;
    Ok(())
}

impl Store {
    /// Whether this server is a replacement whose blocks are not yet all
    /// recorded stale.
    pub fn rebuild_pending(&self) -> Result<bool, WireError> {
        self.with_reader(|c| {
            c.prepare_cached("SELECT 1 FROM rebuild WHERE one = 1")
                .and_then(|mut s| s.query_row([], |r| r.get::<_, i64>(0)).optional())
                .map(|v| v.is_some())
                .map_err(db_err)
        })
    }

    /// Clears the mark (every file with blocks here is recorded stale).
    pub fn rebuild_recorded(&self) -> Result<(), WireError> {
        self.write_txn(|tx| {
            tx.exec("DELETE FROM rebuild", params![]).map_err(db_err)?;
            Ok(())
        })
    }
}

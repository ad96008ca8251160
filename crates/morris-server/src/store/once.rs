//! Exactly-once changes: the stored outcomes of requests that carry an
//! operation id (`morris_proto::messages`, "Exactly once").
//!
//! Table `replies`: (client id, op) → when, and the postcard-encoded result
//! of the store method that ran it. The row is written in the same
//! transaction as the change itself, so either both are committed or
//! neither is; a repeat of the same (client, op) finds the row and returns
//! the stored result without running the change again. The table is
//! replicated with the range's other tables, so a copy that takes the range
//! over answers repeats the same way. Rows older than [`KEEP_SECS`] are
//! removed every [`PRUNE_EVERY`] new rows (clients resend for well under a
//! minute).

use std::sync::atomic::Ordering;

use morris_proto::{ErrorCode, WireError};
use rusqlite::{params, OptionalExtension, Transaction};
use serde::{de::DeserializeOwned, Serialize};

use super::{db_err, Store};

/// How long an outcome is kept, in seconds.
pub(crate) const KEEP_SECS: i64 = 600;
/// New outcomes between two prunes of old ones (a power of two).
const PRUNE_EVERY: u64 = 1024;

/// Names one operation: the client that sent it and the id it gave it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct OpKey {
    /// The client id of the session that sent it.
    pub client: u64,
    /// The operation id (never 0).
    pub op: u64,
}

impl OpKey {
    /// The key of a request with operation id `op` from `client`; `None`
    /// for `op == 0` (no exactly-once protection asked for).
    pub fn new(client: u64, op: u64) -> Option<OpKey> {
        (op != 0).then_some(OpKey { client, op })
    }
}

/// Seconds since the Unix epoch (0 if the clock is before it).
pub(crate) fn unix_secs() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

impl Store {
    /// Runs `f` in a write transaction unless `op` ran before, in which
    /// case its stored result is returned and nothing changes. Returns the
    /// result and whether it was a repeat (callers keep their counters right).
    pub(crate) fn write_txn_once<T: Serialize + DeserializeOwned>(
        &self,
        op: Option<OpKey>,
        f: impl FnOnce(&Transaction<'_>) -> Result<T, WireError>,
    ) -> Result<(T, bool), WireError> {
        let Some(key) = op else {
            return self.write_txn(f).map(|t| (t, false));
        };
        // One connection, one lock: a repeat that arrives while the first
        // copy still runs waits here and then finds its outcome.
        let mut conn = self.conn();
        let stored: Option<Vec<u8>> = conn
            .prepare_cached("SELECT outcome FROM replies WHERE client = ?1 AND op = ?2")
            .and_then(|mut s| {
                s.query_row(params![key.client as i64, key.op as i64], |r| r.get(0))
                    .optional()
            })
            .map_err(db_err)?;
        if let Some(blob) = stored {
            let out = postcard::from_bytes(&blob).map_err(|e| {
                WireError::new(
                    ErrorCode::Io,
                    format!("stored outcome of operation {} is corrupt: {e}", key.op),
                )
            })?;
            tracing::debug!(
                client = key.client,
                op = key.op,
                "repeated operation answered from its stored outcome"
            );
            return Ok((out, true));
        }
        let prune = self.ops_stored.fetch_add(1, Ordering::Relaxed) & (PRUNE_EVERY - 1) == 0;
        let out = self.txn_locked(&mut conn, |tx| {
            let out = f(tx)?;
            let blob = postcard::to_stdvec(&out).map_err(|e| {
                WireError::new(ErrorCode::Io, format!("cannot encode an outcome: {e}"))
            })?;
            let now = unix_secs();
            tx.prepare_cached(
                "INSERT OR REPLACE INTO replies (client, op, at, outcome) VALUES (?1, ?2, ?3, ?4)",
            )
            .and_then(|mut s| s.execute(params![key.client as i64, key.op as i64, now, blob]))
            .map_err(db_err)?;
            if prune {
                tx.prepare_cached("DELETE FROM replies WHERE at < ?1")
                    .and_then(|mut s| s.execute(params![now - KEEP_SECS]))
                    .map_err(db_err)?;
            }
            Ok(out)
        })?;
        Ok((out, false))
    }

    /// Whether operation `op` ran here before (its outcome is kept): a
    /// repeat is answered from that outcome, so checks that decide whether
    /// a new operation may run (quotas) must not refuse it.
    pub fn ran_before(&self, op: Option<OpKey>) -> Result<bool, WireError> {
        let Some(key) = op else {
            return Ok(false);
        };
        self.with_reader(|c| {
            c.prepare_cached("SELECT 1 FROM replies WHERE client = ?1 AND op = ?2")
                .and_then(|mut s| s.exists(params![key.client as i64, key.op as i64]))
                .map_err(db_err)
        })
    }

    /// Stored outcomes kept now.
    #[cfg(test)]
    pub fn stored_outcomes(&self) -> Result<u64, WireError> {
        self.with_reader(|c| {
            c.query_row("SELECT count(*) FROM replies", [], |r| r.get::<_, i64>(0))
                .map(|n| n.max(0) as u64)
                .map_err(db_err)
        })
    }
}

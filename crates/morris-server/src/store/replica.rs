//! Metadata mirroring: shipping a store's changes to another server's copy.
//!
//! A primary turns capture on ([`Store::start_capture`]); from then on every
//! write transaction that changes a replicated table (`volume`, `inodes`,
//! `entries`, `stale_copies`, `replies`, `orphans`, `opens`) is recorded with SQLite's session extension
//! and its changeset is sent, numbered, in commit order. A mirror starts from
//! a whole copy ([`Store::snapshot_to`], [`Store::install_snapshot`]) and then
//! applies the changesets numbered after that copy, in order
//! ([`Store::apply_changeset`]). `data_files` and `sync_marker` describe this
//! server's own disk and are never shipped.

use std::io::Read;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use morris_proto::{ErrorCode, VolumeDescriptor, WireError};
use parking_lot::Mutex;
use rusqlite::fallible_streaming_iterator::FallibleStreamingIterator;
use rusqlite::hooks::Action;
use rusqlite::session::{ChangesetIter, ConflictAction, ConflictType, Session};
use rusqlite::{params, Connection, OptionalExtension, Transaction, TransactionBehavior};
use tokio::sync::mpsc::UnboundedSender;

use super::{db_err, Formatted, Store};

/// The tables whose changes are mirrored, with their columns.
const REPLICATED: [(&str, &str); 15] = [
    ("volume", "one, descriptor, own_index, counter"),
    ("inodes", "id, gen, data, next_cookie"),
    ("entries", "dir, name, cookie, child, gen, kind"),
    ("stale_copies", "id, server, from_block, seq"),
    ("replies", "client, op, at, outcome"),
    ("orphans", "ino, since"),
    ("opens", "ino, client"),
    ("cache_links", "id, link"),
    ("cache_seeds_at", "dir, cookie, seed"),
    ("wb_marks", "id, binding, names, attrs, data, count, since"),
    ("wb_homes", "id, binding, dir, name, fileid, handle"),
    ("wb_gone", "dir, name, id, binding, fileid"),
    ("xattrs", "id, name, value"),
    ("fence_reserve", "one, hw"),
    ("quota_limits", "kind, id, inodes, bytes"),
];

/// Whether `table` is mirrored.
fn replicated(table: &str) -> bool {
    REPLICATED.iter().any(|(t, _)| *t == table)
}

/// One committed transaction's changes to the replicated tables.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Captured {
    /// Its place in commit order: one more than the previous captured transaction's.
    pub seq: u64,
    /// The SQLite changeset, for [`Store::apply_changeset`] on a copy.
    pub changeset: Vec<u8>,
}

/// Capture state of a store.
#[derive(Default)]
pub(super) struct Capture {
    /// Where changesets go while capture is on.
    sink: Mutex<Option<UnboundedSender<Captured>>>,
    /// The seq of the last captured committed transaction.
    seq: AtomicU64,
}

impl Capture {
    /// Whether capture is on.
    pub(super) fn is_on(&self) -> bool {
        self.sink.lock().is_some()
    }

    /// Numbers and sends one changeset, if capture is still on. Called with
    /// the write lock held, so seqs follow commit order.
    fn send(&self, changeset: Vec<u8>) {
        let mut sink = self.sink.lock();
        let Some(tx) = sink.as_ref() else { return };
        let seq = self.seq.load(Ordering::Acquire) + 1;
        if tx.send(Captured { seq, changeset }).is_ok() {
            self.seq.store(seq, Ordering::Release);
        } else {
            tracing::warn!("metadata capture: receiver gone; capture stopped");
            *sink = None;
        }
    }

    /// Ends capture after a committed transaction could not be shipped: the
    /// receiver sees its channel close and must start again from a snapshot.
    fn fail(&self, e: &rusqlite::Error) {
        tracing::error!("metadata capture: cannot produce a changeset ({e}); capture stopped");
        *self.sink.lock() = None;
    }
}

fn io_err(message: impl Into<String>) -> WireError {
    WireError::new(ErrorCode::Io, message.into())
}

/// Reads the volume record stored on `c`.
fn read_formatted(c: &Connection) -> Result<Option<Arc<Formatted>>, WireError> {
    let volume: Option<(Vec<u8>, i64)> = c
        .query_row(
            "SELECT descriptor, own_index FROM main.volume WHERE one = 1",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .optional()
        .map_err(db_err)?;
    let Some((blob, index)) = volume else {
        return Ok(None);
    };
    let descriptor: VolumeDescriptor =
        postcard::from_bytes(&blob).map_err(|e| io_err(format!("corrupt volume record: {e}")))?;
    let index = u32::try_from(index)
        .map_err(|_| io_err(format!("corrupt volume record: index {index}")))?;
    Ok(Some(Arc::new(Formatted::new(descriptor, index))))
}

fn count(c: &Connection, table: &str) -> Result<u64, WireError> {
    let n: i64 = c
        .query_row(&format!("SELECT count(*) FROM main.{table}"), [], |r| {
            r.get(0)
        })
        .map_err(db_err)?;
    Ok(n.max(0) as u64)
}

fn adjust(counter: &AtomicU64, delta: i64) {
    if delta >= 0 {
        counter.fetch_add(delta as u64, Ordering::Relaxed);
    } else {
        let down = delta.unsigned_abs();
        let _ = counter.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
            Some(v.saturating_sub(down))
        });
    }
}

/// What applying a changeset does to the cached state.
#[derive(Default)]
struct Effect {
    inodes: i64,
    entries: i64,
    volume_changed: bool,
}

/// Reads a changeset's operations.
fn effect_of(changeset: &[u8]) -> rusqlite::Result<Effect> {
    let mut bytes = changeset;
    let input: &mut dyn Read = &mut bytes;
    let mut it = ChangesetIter::start_strm(&input)?;
    let mut out = Effect::default();
    while let Some(item) = it.next()? {
        let op = item.op()?;
        let delta = match op.code() {
            Action::SQLITE_INSERT => 1,
            Action::SQLITE_DELETE => -1,
            _ => 0,
        };
        match op.table_name() {
            "inodes" => out.inodes += delta,
            "entries" => out.entries += delta,
            // An update of the counter alone leaves the volume record as it is.
            "volume" => {
                out.volume_changed |=
                    delta != 0 || item.new_value(1).is_ok() || item.new_value(2).is_ok();
            }
            _ => {}
        }
    }
    Ok(out)
}

impl Store {
    /// Runs `f` in an IMMEDIATE transaction whose changes to the replicated
    /// tables are sent to the capture channel once committed.
    pub(super) fn captured_txn<T>(
        &self,
        conn: &Connection,
        f: impl FnOnce(&Transaction<'_>) -> Result<T, WireError>,
    ) -> Result<T, WireError> {
        let mut session = Session::new(conn).map_err(db_err)?;
        for (table, _) in REPLICATED {
            session.attach(Some(table)).map_err(db_err)?;
        }
        let tx =
            Transaction::new_unchecked(conn, TransactionBehavior::Immediate).map_err(db_err)?;
        let out = f(&tx)?;
        super::commit(tx)?;
        if !session.is_empty() {
            let mut changeset = Vec::new();
            match session.changeset_strm(&mut changeset) {
                Ok(()) if changeset.is_empty() => {}
                Ok(()) => self.capture.send(changeset),
                Err(e) => self.capture.fail(&e),
            }
        }
        Ok(out)
    }

    /// Starts capturing: from now on the changes of every committed write
    /// transaction that touches a replicated table are sent on `tx`, in
    /// commit order, numbered one after another. Replaces an earlier sink.
    /// Returns the seq of the last transaction already in the store: every
    /// changeset sent later has a larger seq.
    pub fn start_capture(&self, tx: UnboundedSender<Captured>) -> u64 {
        let _write = self.conn();
        *self.capture.sink.lock() = Some(tx);
        self.capture.seq.load(Ordering::Acquire)
    }

    /// Stops capturing: no changeset is sent after this returns.
    pub fn stop_capture(&self) {
        *self.capture.sink.lock() = None;
    }

    /// The seq of the last captured committed transaction (0 before any).
    pub fn committed_seq(&self) -> u64 {
        self.capture.seq.load(Ordering::Acquire)
    }

    /// Replaces this store's replicated tables with those of the snapshot at
    /// `path` (made by [`Store::snapshot_to`]), keeping this server's own
    /// tables, and reloads the volume record and the counts. Refused while
    /// capture is on.
    pub fn install_snapshot(&self, path: &Path) -> Result<(), WireError> {
        let shown = path.display();
        let p = path
            .to_str()
            .ok_or_else(|| io_err(format!("snapshot path {shown} is not UTF-8")))?;
        if !path.is_file() {
            return Err(WireError::new(
                ErrorCode::NotFound,
                format!("no snapshot file {shown}"),
            ));
        }
        let mut conn = self.conn();
        if self.capture.is_on() {
            return Err(io_err(
                "cannot install a snapshot while this store's changes are captured",
            ));
        }
        let mut slot = self.formatted.write();
        conn.execute("ATTACH DATABASE ?1 AS snap", params![p])
            .map_err(|e| io_err(format!("snapshot {shown}: {e}")))?;
        let copied = copy_snapshot(&mut conn);
        let detached = conn.execute_batch("DETACH DATABASE snap");
        let (formatted, inodes, entries) =
            copied.map_err(|e| io_err(format!("installing snapshot {shown}: {e}")))?;
        detached.map_err(db_err)?;
        self.inodes.store(inodes, Ordering::Relaxed);
        self.entries.store(entries, Ordering::Relaxed);
        *slot = formatted;
        Ok(())
    }

    /// Applies a changeset captured on another store, all or nothing: a row
    /// that is missing, differs from what the changeset expects, or breaks a
    /// constraint fails the whole changeset and leaves this store unchanged.
    /// Keeps the volume record and the inode/entry counts current. Refused
    /// while this store's own changes are captured.
    pub fn apply_changeset(&self, changeset: &[u8]) -> Result<(), WireError> {
        let mut conn = self.conn();
        if self.capture.is_on() {
            return Err(io_err(
                "cannot apply a changeset while this store's changes are captured",
            ));
        }
        let effect = effect_of(changeset).map_err(|e| io_err(format!("bad changeset: {e}")))?;
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(db_err)?;
        let conflict: Arc<Mutex<Option<String>>> = Arc::default();
        let seen = conflict.clone();
        let mut input = changeset;
        let applied = tx.apply_strm(
            &mut input,
            Some(replicated as fn(&str) -> bool),
            move |kind: ConflictType, item| {
                let table = item
                    .op()
                    .map(|op| op.table_name().to_owned())
                    .unwrap_or_default();
                seen.lock()
                    .get_or_insert_with(|| format!("{kind:?} in table {table}"));
                ConflictAction::SQLITE_CHANGESET_ABORT
            },
        );
        if let Err(e) = applied {
            return Err(match conflict.lock().take() {
                Some(c) => io_err(format!("changeset conflicts with this copy: {c}")),
                None => io_err(format!("cannot apply changeset: {e}")),
            });
        }
        let formatted = if effect.volume_changed {
            Some(read_formatted(&tx)?)
        } else {
            None
        };
        tx.commit().map_err(db_err)?;
        adjust(&self.inodes, effect.inodes);
        adjust(&self.entries, effect.entries);
        if let Some(f) = formatted {
            *self.formatted.write() = f;
        }
        Ok(())
    }

    /// Recounts the inodes, entries and data files from the tables.
    pub fn recount(&self) -> Result<(), WireError> {
        let conn = self.conn();
        let inodes = count(&conn, "inodes")?;
        let entries = count(&conn, "entries")?;
        let data_files = count(&conn, "data_files")?;
        self.inodes.store(inodes, Ordering::Relaxed);
        self.entries.store(entries, Ordering::Relaxed);
        self.data_files.store(data_files, Ordering::Relaxed);
        Ok(())
    }
}

type Installed = (Option<Arc<Formatted>>, u64, u64);

/// Copies the replicated tables from the attached `snap` database in one
/// transaction; returns the new volume record and inode/entry counts.
fn copy_snapshot(conn: &mut Connection) -> Result<Installed, WireError> {
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(db_err)?;
    for (table, cols) in REPLICATED {
        tx.execute_batch(&format!("DELETE FROM main.{table};"))
            .map_err(db_err)?;
        // A snapshot from a build before the table (same protocol: e.g.
        // `fence_reserve`) has none of its rows.
        let present: bool = tx
            .query_row(
                "SELECT count(*) > 0 FROM snap.sqlite_master WHERE type = 'table' AND name = ?1",
                [table],
                |r| r.get(0),
            )
            .map_err(db_err)?;
        if present {
            tx.execute_batch(&format!(
                "INSERT INTO main.{table} ({cols}) SELECT {cols} FROM snap.{table};"
            ))
            .map_err(db_err)?;
        }
    }
    let formatted = read_formatted(&tx)?;
    let inodes = count(&tx, "inodes")?;
    let entries = count(&tx, "entries")?;
    tx.commit().map_err(db_err)?;
    Ok((formatted, inodes, entries))
}

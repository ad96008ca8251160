//! Whole-store snapshots taken online, in steps, without holding the store.
//!
//! A mirror starts from a whole copy of its primary's store. `VACUUM INTO`
//! made that copy in one call, holding the store's only connection (and so
//! every metadata request of the range) for as long as it took: seconds for
//! a big store, long enough for `Renew` and `PeerSync` to miss their lease.
//! SQLite's online backup copies a few pages per step instead, and the store
//! lock is taken for one step at a time. A change committed between steps
//! through the same connection is written into the copy too (SQLite updates
//! a running backup from its own connection's writes), so the copy is the
//! store as of the last step, and the seq read under the lock of that step
//! is exactly the last transaction it holds.
//!
//! rusqlite's `Backup` borrows the connection for its whole life, which
//! would mean holding the lock for the whole copy; hence the raw
//! `sqlite3_backup_*` calls here, each made with the store lock held.

use std::fs::OpenOptions;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::ptr::NonNull;

use morris_proto::{ErrorCode, WireError};
use parking_lot::MutexGuard;
use rusqlite::{ffi, Connection};

use super::Store;

/// Pages copied per step: 4 MiB of 4 KiB pages, a few milliseconds.
pub(super) const PAGES_PER_STEP: i32 = 1024;

fn io_err(message: String) -> WireError {
    WireError::new(ErrorCode::Io, message)
}

/// A running `sqlite3_backup`; finished when dropped. Every call must be
/// made with the source store's lock held (the source connection is not
/// thread-safe by itself).
struct Running(NonNull<ffi::sqlite3_backup>);

impl Running {
    /// Finishes the backup; `src` proves the store lock is held.
    fn finish(self, _src: &MutexGuard<'_, Connection>) -> i32 {
        let b = self.0;
        std::mem::forget(self);
        // SAFETY: `b` came from sqlite3_backup_init and is finished once
        // (ownership moved out of `self`, whose Drop is skipped), with the
        // source connection's lock held.
        unsafe { ffi::sqlite3_backup_finish(b.as_ptr()) }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        // Reached only on a panic between steps; the lock may not be held,
        // so the backup is leaked rather than finished unlocked.
        tracing::error!("online snapshot abandoned without finishing");
    }
}

impl Store {
    /// Writes a consistent copy of the whole database to `path`, which must
    /// not exist (created mode 0600), and returns the seq of the last
    /// captured transaction it includes. Holds the store for one step of
    /// [`PAGES_PER_STEP`] pages at a time, so requests go on meanwhile.
    pub fn snapshot_to(&self, path: &Path) -> Result<u64, WireError> {
        self.snapshot_in_steps(path, PAGES_PER_STEP, || {})
    }

    /// [`Store::snapshot_to`] with `pages` per step, calling `between` with
    /// the store unlocked after every step but the last (tests write there).
    pub(super) fn snapshot_in_steps(
        &self,
        path: &Path,
        pages: i32,
        mut between: impl FnMut(),
    ) -> Result<u64, WireError> {
        let shown = path.display();
        OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .map_err(|e| io_err(format!("snapshot to {shown}: {e}")))?;
        let dest = Connection::open(path).map_err(|e| io_err(format!("snapshot {shown}: {e}")))?;
        dest.execute_batch("PRAGMA synchronous = OFF;")
            .map_err(|e| io_err(format!("snapshot {shown}: {e}")))?;
        let main = c"main";
        let running = {
            let src = self.conn();
            // SAFETY: both handles are live connections (`dest` is owned
            // here and outlives the backup; `src` is the store's, which
            // outlives `self`'s borrow) and the store lock is held.
            let b = unsafe {
                ffi::sqlite3_backup_init(dest.handle(), main.as_ptr(), src.handle(), main.as_ptr())
            };
            match NonNull::new(b) {
                Some(b) => Running(b),
                None => {
                    // SAFETY: `dest` is a live connection owned here.
                    let msg = unsafe { errmsg(dest.handle()) };
                    return Err(io_err(format!("snapshot {shown}: {msg}")));
                }
            }
        };
        let seq = loop {
            let src = self.conn();
            // SAFETY: `running` is unfinished and the store lock is held.
            let rc = unsafe { ffi::sqlite3_backup_step(running.0.as_ptr(), pages) };
            match rc {
                ffi::SQLITE_DONE => {
                    let seq = self.committed_seq();
                    let rc = running.finish(&src);
                    if rc != ffi::SQLITE_OK {
                        // SAFETY: `dest` is a live connection owned here.
                        let msg = unsafe { errmsg(dest.handle()) };
                        return Err(io_err(format!("snapshot {shown}: {msg}")));
                    }
                    break seq;
                }
                ffi::SQLITE_OK | ffi::SQLITE_BUSY | ffi::SQLITE_LOCKED => {
                    MutexGuard::unlock_fair(src);
                    between();
                }
                _ => {
                    running.finish(&src);
                    // SAFETY: `dest` is a live connection owned here.
                    let msg = unsafe { errmsg(dest.handle()) };
                    return Err(io_err(format!("snapshot {shown}: {msg} (code {rc})")));
                }
            }
        };
        // The copy carries the store's WAL flag; a plain rollback-journal
        // file is what a receiver attaches.
        dest.query_row("PRAGMA journal_mode = DELETE", [], |_| Ok(()))
            .map_err(|e| io_err(format!("snapshot {shown}: {e}")))?;
        dest.close()
            .map_err(|(_, e)| io_err(format!("snapshot {shown}: {e}")))?;
        Ok(seq)
    }
}

/// The last error message of connection `db`.
///
/// # Safety
/// `db` must be a live connection not used by another thread meanwhile.
unsafe fn errmsg(db: *mut ffi::sqlite3) -> String {
    // SAFETY: per this function's contract; sqlite3_errmsg returns a
    // NUL-terminated string owned by the connection, copied out here.
    unsafe {
        let p = ffi::sqlite3_errmsg(db);
        if p.is_null() {
            return "unknown error".into();
        }
        std::ffi::CStr::from_ptr(p).to_string_lossy().into_owned()
    }
}

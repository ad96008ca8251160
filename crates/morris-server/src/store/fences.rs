//! The fence reservation of a metadata range: the number below which its
//! write grants may have been numbered (`fence_reserve`, one row, mirrored
//! with the range).
//!
//! Fence numbers come from the wall clock (`LeaseTable::fenced_from`), so
//! a server restarted with its clock set back, or a takeover by a server
//! whose clock is behind, would number new grants below ones that data
//! servers have already seen, and the new holder's writes would be refused
//! until the clock caught up. A number past the reservation is answered
//! only once a new reservation ([`FENCE_RESERVE_US`] ahead) is committed,
//! fsynced and (mirrored ranges) acknowledged by the copies; whoever serves
//! the range next numbers its grants above the reservation. One commit per
//! [`FENCE_RESERVE_US`] of numbers (a minute of the clock), not one per grant.

use std::sync::atomic::Ordering;

use rusqlite::params;

use super::{db_err, Cached, Store};
use morris_proto::WireError;

/// How far ahead of the number being answered a reservation reaches (µs
/// of the wall clock: about one commit a minute while writes are granted).
pub const FENCE_RESERVE_US: u64 = 60_000_000;

impl Store {
    /// The range's fence reservation as stored (0 if none was made): every
    /// write grant numbered while the range was served before is at most
    /// this.
    pub fn fence_floor(&self) -> Result<u64, WireError> {
        let conn = self.conn();
        let hw: i64 = conn
            .row("SELECT coalesce(max(hw), 0) FROM fence_reserve", [], |r| {
                r.get(0)
            })
            .map_err(db_err)?;
        let hw = hw.max(0) as u64;
        Ok(hw)
    }

    /// Makes `fence` durable within the reservation: if it is past what
    /// is known reserved, commits a reservation up to `fence` +
    /// [`FENCE_RESERVE_US`] (never lowering what is stored) and makes it
    /// durable; returns it. A mirrored range's copies must have it before
    /// `fence` is answered; [`Store::fences_reserved`] then lets later
    /// numbers within it pass without a commit.
    pub fn reserve_fence(&self, fence: u64) -> Result<Option<u64>, WireError> {
        if fence <= self.fence_reserved_upto.load(Ordering::Acquire) {
            return Ok(None);
        }
        let upto = fence.saturating_add(FENCE_RESERVE_US).min(i64::MAX as u64);
        {
            let conn = self.conn();
            self.captured_txn(&conn, |tx| {
                tx.exec(
                    "INSERT INTO fence_reserve (one, hw) VALUES (1, ?1)
                     ON CONFLICT (one) DO UPDATE SET hw = ?1 WHERE hw < ?1",
                    params![upto as i64],
                )
                .map_err(db_err)?;
                Ok(())
            })?;
        }
        self.sync()?;
        Ok(Some(upto))
    }

    /// Records that the reservation `upto` is durable everywhere it must
    /// be (numbers up to it need no further commit).
    pub fn fences_reserved(&self, upto: u64) {
        self.fence_reserved_upto.fetch_max(upto, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reservation_reaches_ahead_lasts_and_never_goes_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("meta.sqlite");
        {
            let s = Store::open(&path).unwrap();
            assert_eq!(s.fence_floor().unwrap(), 0);
            let upto = s.reserve_fence(1_000).unwrap();
            assert_eq!(upto, Some(1_000 + FENCE_RESERVE_US));
            // Until it is published, a number within it commits again.
            assert!(s.reserve_fence(2_000).unwrap().is_some());
            assert_eq!(s.fence_floor().unwrap(), 2_000 + FENCE_RESERVE_US);
            s.fences_reserved(2_000 + FENCE_RESERVE_US);
            // Within the reservation: nothing to write.
            assert_eq!(s.reserve_fence(3_000).unwrap(), None);
            assert_eq!(s.reserve_fence(2_000 + FENCE_RESERVE_US).unwrap(), None);
            assert!(s.reserve_fence(2_001 + FENCE_RESERVE_US).unwrap().is_some());
        }
        let s = Store::open(&path).unwrap();
        assert_eq!(s.fence_floor().unwrap(), 2_001 + 2 * FENCE_RESERVE_US);
        // A lower number on a store that has not read its reservation yet
        // commits, but never lowers what is stored.
        s.fence_reserved_upto.store(0, Ordering::Release);
        assert!(s.reserve_fence(5).unwrap().is_some());
        assert_eq!(s.fence_floor().unwrap(), 2_001 + 2 * FENCE_RESERVE_US);
    }
}

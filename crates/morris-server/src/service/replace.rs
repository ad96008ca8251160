//! `Replace`: an empty server takes the place of one whose disk was lost
//! (`morris volume replace`, docs/operations.md "Replacing a lost
//! server"). **Where a replacement is kept from serving what it lacks.**
//!
//! | step | what holds |
//! |---|---|
//! | role files written (every range copy here: secondary, generation 0), then the store formatted with the rebuild mark in one transaction | a crash in between leaves an unformatted server (run the command again); a formatted replacement never starts as the primary of a range it holds no copy of |
//! | ranges opened as secondaries | each range's primary (or the copy that took it over) sends this server a snapshot, as to a copy back from an outage |
//! | rebuild mark set | `Read`, `ReadCached`, `Seek`, `ChunkSums`, `PushData` (cache mode's write-back) and `Scrub` answered `Unavailable`: clients read another copy, the write-back pushes from another copy, a scrub (whose comparison would take the empty copy for the first one) waits. Writes are taken (a file written now has its blocks here) |
//! | the server's resync loop (`Client::record_rebuild`) records every file with blocks here stale, under each file's write lease | readers skip this server's copies of those files from then on |
//! | mark cleared | reads served again: every copy here is either recorded stale or was written since the replacement |
//! | resync (as after an outage) | the stale copies rewritten from the others, the records dropped |

use std::sync::atomic::Ordering;
use std::sync::Weak;

use morris_proto::{ErrorCode, Reply, Request, VolumeDescriptor, WireError};
use tracing::info;

use super::{blocking, err, Server};
use crate::ranges::{save_role, Role};
use crate::store::{FormatOutcome, Formatted};

/// The role file of the range copy kept `back` servers behind its home
/// (0: this server's own range).
pub(super) fn range_state_file(back: u32) -> String {
    match back {
        0 => "range-home.state".to_string(),
        1 => "range-mirror.state".to_string(),
        n => format!("range-mirror{n}.state"),
    }
}

/// Whether `req` reads this server's block data.
fn reads_blocks(req: &Request) -> bool {
    matches!(
        req,
        Request::Read { .. }
            | Request::ReadCached { .. }
            | Request::Seek { .. }
            | Request::Allocated { .. }
            | Request::ChunkSums { .. }
            | Request::PushData { .. }
            | Request::Scrub { .. }
    )
}

impl Server {
    /// `Replace`.
    pub(super) async fn replace(
        &self,
        descriptor: VolumeDescriptor,
        index: u32,
    ) -> Result<Reply, WireError> {
        if let Some(f) = self.store.formatted() {
            if f.descriptor.uuid != descriptor.uuid {
                return Err(err(
                    ErrorCode::WrongVolume,
                    format!(
                        "server already belongs to volume {}; refusing to make it a server of volume {}",
                        f.descriptor.uuid, descriptor.uuid
                    ),
                ));
            }
            if f.descriptor == descriptor
                && f.index == index
                && self.rebuilding.load(Ordering::Acquire)
            {
                return Ok(Reply::Ok);
            }
            return Err(err(
                ErrorCode::Invalid,
                format!(
                    "server is already server {} of volume {}: only an empty, unformatted server replaces a lost one",
                    f.index, f.descriptor.uuid
                ),
            ));
        }
        descriptor
            .validate()
            .map_err(|m| err(ErrorCode::Invalid, m))?;
        if index as usize >= descriptor.servers.len() {
            return Err(err(
                ErrorCode::Invalid,
                format!(
                    "index {index} out of range for {} servers",
                    descriptor.servers.len()
                ),
            ));
        }
        if descriptor.replicas < 2 {
            return Err(err(
                ErrorCode::Invalid,
                "the volume keeps one copy of everything (--replicas 1): a lost server's data and metadata cannot be rebuilt",
            ));
        }
        let copies = Formatted::new(descriptor.clone(), index)
            .layout
            .meta_copies();
        let (store, dir) = (self.store.clone(), self.data_dir.clone());
        let d = descriptor.clone();
        let outcome = blocking(move || {
            // Role files first: a crash before the store is formatted
            // leaves an unformatted server; after, its ranges open as
            // copies that are behind.
            let files: Vec<_> = (0..copies)
                .map(|back| dir.join(range_state_file(back)))
                .collect();
            for f in &files {
                save_role(f, 0, Role::Secondary)?;
            }
            store.format_replacement(&d, index).inspect_err(|_| {
                // Still unformatted: a later `Format` of a new volume must
                // find no roles of this attempt.
                for f in &files {
                    let _ = std::fs::remove_file(f);
                }
            })
        })
        .await?;
        if outcome == FormatOutcome::AlreadyFormatted {
            // A second `Replace` that ran alongside the first: that one
            // opens the ranges.
            return Ok(Reply::Ok);
        }
        self.rebuilding.store(true, Ordering::Release);
        info!(
            index,
            "formatted as a replacement: metadata comes from the ranges' primaries; blocks are read from no client until every file with blocks here is recorded stale, then rebuilt from the other copies"
        );
        if let Some(me) = self.this.get().and_then(Weak::upgrade) {
            me.init_ranges(self.now_ms() + u64::from(self.lease_ms))?;
        }
        Ok(Reply::Ok)
    }

    /// `Unavailable` for a read of block data while this server is a
    /// replacement not yet rebuilt (its empty disk would answer zeros).
    pub(super) fn refuse_while_rebuilding(&self, req: &Request) -> Option<WireError> {
        (self.rebuilding.load(Ordering::Acquire) && reads_blocks(req)).then(|| {
            err(
                ErrorCode::Unavailable,
                "this server replaces a lost one and its blocks are not rebuilt yet: read another copy",
            )
        })
    }

    /// Whether this server still waits for its blocks to be recorded stale.
    pub(crate) fn rebuild_pending(&self) -> bool {
        self.rebuilding.load(Ordering::Acquire)
    }

    /// Every file with blocks here is recorded stale: reads are served
    /// again (resync rewrites the stale copies).
    pub(crate) fn rebuild_recorded(&self) -> Result<(), WireError> {
        self.store.rebuild_recorded()?;
        self.rebuilding.store(false, Ordering::Release);
        info!("every file with blocks here is recorded stale: reads served again, resync rebuilds the copies");
        Ok(())
    }
}

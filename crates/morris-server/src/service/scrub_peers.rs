//! What a scrub pass compares this server's copies with
//! ([`crate::scrub::OtherCopies`]): the other servers' checksums, asked
//! for by `ChunkSums`, and the resync loop's list of blocks to make equal
//! ([`Server::note_diverged`]).

use std::sync::Weak;
use std::time::Duration;

use morris_proto::{ErrorCode, FileId, Reply, Request, WireError};

use super::Server;
use crate::scrub::Sums;

/// Longest a scrub waits for another server's page of checksums.
const SUMS_WAIT: Duration = Duration::from_secs(30);

/// The volume as a scrub pass comparing copies sees it
/// ([`crate::scrub::OtherCopies`]): other servers' checksums by
/// `ChunkSums`, differing blocks handed to resync.
pub(crate) struct ScrubPeers {
    pub(crate) server: Weak<Server>,
    pub(crate) rt: tokio::runtime::Handle,
}

impl crate::scrub::OtherCopies for ScrubPeers {
    fn layout(&self) -> Option<morris_proto::layout::Layout> {
        let s = self.server.upgrade()?;
        let vol = s.store.formatted()?;
        Some(vol.layout)
    }

    fn me(&self) -> u32 {
        self.server
            .upgrade()
            .and_then(|s| s.store.formatted())
            .map_or(0, |v| v.index)
    }

    fn sums(&self, server: u32, id: FileId, replica: u8, first: u64) -> Result<Sums, WireError> {
        let s = self
            .server
            .upgrade()
            .ok_or_else(|| super::err(ErrorCode::Unavailable, "server stopping"))?;
        let vol = s
            .store
            .formatted()
            .ok_or_else(|| super::err(ErrorCode::WrongVolume, "not formatted"))?;
        let req = Request::ChunkSums {
            id,
            replica,
            first,
            max: crate::scrub::SUMS_PAGE,
        };
        // The timer is made inside the runtime: this runs on the scrub's
        // own thread.
        let ask = async { tokio::time::timeout(SUMS_WAIT, s.peer_ask(&vol, server, &req)).await };
        let answer = self.rt.block_on(ask).map_err(|_| {
            super::err(
                ErrorCode::Unavailable,
                format!("server {server}: no checksums in {SUMS_WAIT:?}"),
            )
        })?;
        match answer? {
            Reply::ChunkSums {
                len,
                entries,
                cached,
            } => Ok(Sums {
                len,
                entries,
                cached,
            }),
            other => Err(super::err(
                ErrorCode::Protocol,
                format!("ChunkSums answered with {other:?}"),
            )),
        }
    }

    fn local(&self, id: FileId, first: u64) -> Result<Sums, WireError> {
        let s = self
            .server
            .upgrade()
            .ok_or_else(|| super::err(ErrorCode::Unavailable, "server stopping"))?;
        let (len, entries) = s.blocks.chunk_sums(id, 0, first, crate::scrub::SUMS_PAGE)?;
        let cached = s.store.has_cache_units(id)?;
        Ok(Sums {
            len,
            entries,
            cached,
        })
    }

    fn diverged(&self, id: FileId, first: u64, last: u64) {
        if let Some(s) = self.server.upgrade() {
            s.note_diverged(id, first, last);
        }
    }
}

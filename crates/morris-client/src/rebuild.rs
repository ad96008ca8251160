//! A replacement server's first pass (`Request::Replace`): every file with
//! blocks on it is recorded stale there, so that readers skip its empty
//! copies and resync rewrites them from the others.

use bytes::Bytes;
use morris_proto::{FileKind, Inode, Reply, Request};

use crate::copies::Repair;
use crate::pool::unexpected;
use crate::{Client, Result};

/// Inodes asked for at once.
const PAGE: u32 = 1000;

impl Client {
    /// Records stale, at each file's owner and under its write lease, the
    /// copies server `server` keeps of every file with blocks on it; walks
    /// every metadata range through the copy that serves it (`ScanRange`:
    /// a copy that is behind would answer a short list). Returns the
    /// files recorded. An error leaves the pass to be run again (recording
    /// a copy stale twice is harmless).
    pub async fn record_rebuild(&self, server: u32) -> Result<u64> {
        let l = self.layout;
        let mut recorded = 0;
        for range in 0..l.servers {
            let mut after = 0;
            loop {
                let req = Request::ScanRange {
                    range,
                    after,
                    max: PAGE,
                };
                let page = match self.pool.call_range(range, req, Bytes::new()).await?.1 {
                    Reply::Inodes(v) => v,
                    other => return Err(unexpected(&other)),
                };
                let Some(last) = page.last().map(|i| i.id) else {
                    break;
                };
                for i in page
                    .iter()
                    .filter(|i| l.inode_server(i.id) == range && has_blocks_on(self, i, server))
                {
                    if self.repair_damaged(i.id, server, 0).await? == Repair::Recorded {
                        recorded += 1;
                    }
                }
                if last <= after {
                    break;
                }
                after = last;
            }
        }
        Ok(recorded)
    }
}

/// Whether file `i` may have blocks on `server` that its other copies
/// hold: a regular file with data, not a cached object whose units are
/// home's (each server fetches those from home itself).
fn has_blocks_on(c: &Client, i: &Inode, server: u32) -> bool {
    let l = c.layout;
    if i.attr.kind != FileKind::File || i.attr.size == 0 {
        return false;
    }
    if i.home.as_ref().is_some_and(|h| !h.is_local()) {
        return false;
    }
    let blocks = i.attr.size.div_ceil(u64::from(l.unit.max(1)));
    (1..=blocks.min(u64::from(l.servers))).any(|b| l.placement(i.id, b).contains(&server))
}

//! `Fallocate` at a data server: reserves or frees the bytes of a range
//! that fall in the blocks this server keeps, every copy of them here;
//! `Seek`: where data or a hole starts in the blocks of one copy here;
//! `Truncate`: cuts every copy here at a file size.

use std::sync::Arc;

use morris_proto::{ErrorCode, FileId, Reply, WireError, MAX_FILE_SIZE};

use super::{blocking, err, Server};
use crate::blocks::MAX_REPLICAS;
use crate::store::{Formatted, Store};

impl Server {
    /// `Truncate`: every copy of `id`'s blocks kept here ends where a file
    /// of `size` bytes ends (the data past it is gone; growing never
    /// writes here).
    pub(super) async fn truncate_here(
        &self,
        vol: &Formatted,
        id: FileId,
        size: u64,
    ) -> Result<(), WireError> {
        if size > MAX_FILE_SIZE {
            return Err(err(
                ErrorCode::FileTooBig,
                format!("size {size} exceeds {MAX_FILE_SIZE}"),
            ));
        }
        // Each copy this server keeps has its own extent file.
        let lens: Vec<(u8, u64)> = (0..vol.layout.replicas.min(u32::from(MAX_REPLICAS)))
            .map(|r| {
                (
                    r as u8,
                    vol.layout.replica_local_len(id, vol.index, r, size),
                )
            })
            .collect();
        let blocks = self.blocks.clone();
        blocking(move || {
            for (r, len) in lens {
                blocks.truncate(id, r, len)?;
            }
            Ok(())
        })
        .await
    }

    /// `Fallocate`: `punch` frees `offset..offset + len`, else reserves it.
    pub(super) async fn fallocate_here(
        &self,
        vol: &Formatted,
        store: &Arc<Store>,
        id: FileId,
        (offset, len): (u64, u64),
        punch: bool,
    ) -> Result<Reply, WireError> {
        let end = offset.checked_add(len).filter(|&e| e <= MAX_FILE_SIZE);
        let Some(end) = end else {
            return Err(err(
                ErrorCode::FileTooBig,
                format!("range ends past the largest file size {MAX_FILE_SIZE}"),
            ));
        };
        if len == 0 {
            return Ok(Reply::Ok);
        }
        let l = vol.layout;
        let unit = u64::from(l.unit);
        let (first, _) = l.block_of(offset);
        let (last, _) = l.block_of(end - 1);
        // The part of the range in block `index`, as bytes of it.
        let within = |index: u64| {
            let start = l.block_start(index);
            (offset.max(start) - start, end.min(start + unit) - start)
        };
        // For each copy kept here, the blocks of the range it holds lie one
        // after the other in its extent file: one piece, from the first
        // such block's part to the last one's.
        let k = u64::from(l.servers);
        let mut pieces = Vec::new();
        for replica in 0..l.replicas {
            let here = |index: &u64| l.replica_server(id, *index, replica) == vol.index;
            let lo = (first..=last.min(first + k - 1)).find(here);
            let hi = (last.saturating_sub(k - 1).max(first)..=last)
                .rev()
                .find(here);
            if let (Some(lo), Some(hi)) = (lo, hi) {
                let from = l.local_offset(lo) + within(lo).0;
                let to = l.local_offset(hi) + within(hi).1;
                pieces.push((replica as u8, from, to - from));
            }
        }
        if !punch {
            let wanted: u64 = pieces.iter().map(|p| p.2).sum();
            self.check_reserve(wanted)?;
        }
        let blocks = self.blocks.clone();
        let store = store.clone();
        blocking(move || {
            for (r, pos, n) in pieces {
                if punch {
                    blocks.punch(id, r, pos, n)?;
                } else {
                    blocks.allocate(id, r, pos, n, &store)?;
                }
            }
            Ok(())
        })
        .await?;
        Ok(Reply::Ok)
    }

    /// `Seek`: the first byte at or after `from` of file `id` that copy
    /// `replica` kept here holds as data (or as a hole).
    pub(super) async fn seek_here(
        &self,
        vol: &Formatted,
        id: FileId,
        replica: u8,
        from: u64,
        hole: bool,
    ) -> Result<Reply, WireError> {
        let l = vol.layout;
        if u32::from(replica) >= l.replicas.max(1) || from > MAX_FILE_SIZE {
            return Err(err(ErrorCode::Invalid, "no such copy or offset"));
        }
        let k = l.servers.max(1);
        // This copy holds the blocks copy 0 holds on server `primary`.
        let primary = (vol.index % k + k - u32::from(replica) % k) % k;
        let start = l.local_start(id, primary, from);
        let blocks = self.blocks.clone();
        let found = blocking(move || blocks.seek(id, replica, start, hole)).await?;
        Ok(Reply::Sought(
            found.map(|local| l.global_of_local(id, primary, local)),
        ))
    }
}

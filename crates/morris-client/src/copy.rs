//! `copy_file_range(2)`: bytes of one open file copied into another by the
//! client, without passing through the calling program or the kernel's
//! page cache.
//!
//! The data still travels from the servers holding the source to this
//! client and on to the servers holding the destination (no server-side
//! copy yet); what is saved is the caller's read/write loop: one request
//! from the kernel instead of one per 128 KiB buffer each way, and reads of
//! the next chunk overlapping the writes of the last. Into a destination
//! range past its end, only the source's data is copied (found with
//! `SEEK_DATA`/`SEEK_HOLE`): holes stay holes.

use bytes::Bytes;
use morris_proto::{ErrorCode, SetAttr};

use crate::leases::Mode;
use crate::{Caller, Client, Error, Result};

/// Bytes read or written at once: whole stripes of a 4-server, 1 MiB unit
/// volume, so every server works on each chunk.
const CHUNK: u64 = 8 << 20;

/// Most bytes one call copies (the caller asks again for the rest, as
/// `copy_file_range` allows; FUSE answers a count below 4 GiB).
pub const MAX_COPY: u64 = 1 << 30;

impl Client {
    /// Copies up to `len` bytes (at most 1 GiB: `MAX_COPY`) from open file
    /// `fh_in` at `off_in` to open file `fh_out` at `off_out`; returns the
    /// count copied, short only where the source ends. Overlapping ranges
    /// of one file are `Invalid`, as Linux has it.
    pub async fn copy_range(
        &self,
        fh_in: u64,
        off_in: u64,
        fh_out: u64,
        off_out: u64,
        len: u64,
    ) -> Result<u64> {
        let len = len.min(MAX_COPY);
        // The kernel checked that `fh_out` is open for writing.
        let (src, dst) = (self.open_file(fh_in)?, self.open_file(fh_out)?);
        if src.id == dst.id
            && off_in < off_out.saturating_add(len)
            && off_out < off_in.saturating_add(len)
        {
            return Err(Error::new(
                ErrorCode::Invalid,
                "overlapping ranges of one file",
            ));
        }
        if off_in.checked_add(len).is_none() || off_out.checked_add(len).is_none() {
            return Err(Error::new(
                ErrorCode::Invalid,
                "range past the largest offset",
            ));
        }
        // Where the destination has nothing yet (past its end), the
        // source's holes are not written: they stay holes, and the size
        // is set at the end. Elsewhere they must overwrite what is there.
        let dst_size = self.open_size(fh_out).await?;
        if off_out < dst_size {
            return self.copy_dense(fh_in, off_in, fh_out, off_out, len).await;
        }
        let end = off_in.saturating_add(len).min(self.open_size(fh_in).await?);
        let mut pos = off_in;
        let mut total = end.saturating_sub(off_in);
        while pos < end {
            let Some(data) = self.seek(fh_in, pos, false).await? else {
                break; // a hole to the end
            };
            if data >= end {
                break;
            }
            let hole = self.seek(fh_in, data, true).await?.unwrap_or(end).min(end);
            let n = self
                .copy_dense(fh_in, data, fh_out, off_out + (data - off_in), hole - data)
                .await?;
            if n < hole - data {
                // The source ended early (truncated meanwhile).
                total = data - off_in + n;
                break;
            }
            pos = hole;
        }
        // The destination's size covers what is reported copied, also
        // when that ends in a hole.
        let want = off_out + total;
        if total > 0 && self.open_size(fh_out).await? < want {
            let dst = self.open_file(fh_out)?;
            let set = SetAttr {
                size: Some(want),
                ..SetAttr::default()
            };
            // The kernel checked the caller may write the file.
            self.setattr(dst.id, set, &Caller::root()).await?;
        }
        Ok(total)
    }

    /// The size of open file `fh` as this client sees it.
    async fn open_size(&self, fh: u64) -> Result<u64> {
        let f = self.open_file(fh)?;
        let g = self.leases.get(f.h, Mode::Read).await?;
        let size = g.inode().attr.size;
        Ok(size)
    }

    /// Copies `len` bytes as they are, holes as zeros; short only where
    /// the source ends.
    async fn copy_dense(
        &self,
        fh_in: u64,
        off_in: u64,
        fh_out: u64,
        off_out: u64,
        len: u64,
    ) -> Result<u64> {
        let read = |done: u64| {
            let n = (len - done).min(CHUNK) as u32;
            self.read(fh_in, off_in + done, n)
        };
        let mut done = 0u64;
        let mut next: Option<Bytes> = if len == 0 { None } else { Some(read(0).await?) };
        while let Some(data) = next.take() {
            let n = data.len() as u64;
            if n == 0 {
                break; // the source ends here
            }
            let more = done + n < len && n == CHUNK.min(len - done);
            let write = self.write(fh_out, off_out + done, data);
            if more {
                let (w, r) = tokio::join!(write, read(done + n));
                w?;
                next = Some(r?);
            } else {
                write.await?;
            }
            done += n;
        }
        Ok(done)
    }
}

//! `fallocate`: reserving space on the data servers, freeing ranges
//! (punching holes) and zeroing them, under the file's write lease.

use bytes::Bytes;
use morris_proto::{ErrorCode, FileKind, Request, SetAttr, Timestamp, MAX_FILE_SIZE};

use crate::leases::Mode;
use crate::{Caller, Client, Error, Result};

/// What a `fallocate` does to its range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fallocate {
    /// Reserve the space (mode 0); with `keep_size`, the size stays
    /// (`FALLOC_FL_KEEP_SIZE`), else it grows to cover the range.
    Allocate {
        /// Leave the file's size as it is.
        keep_size: bool,
    },
    /// Free the range; it reads as zeros (`FALLOC_FL_PUNCH_HOLE`, which
    /// always keeps the size).
    PunchHole,
    /// Make the range read as zeros, space reserved
    /// (`FALLOC_FL_ZERO_RANGE`); with `keep_size`, the size stays.
    ZeroRange {
        /// Leave the file's size as it is.
        keep_size: bool,
    },
}

impl Client {
    /// Applies `what` to bytes `offset..offset + len` of open file `fh`.
    pub async fn fallocate(&self, fh: u64, offset: u64, len: u64, what: Fallocate) -> Result<()> {
        if len == 0 {
            return Err(Error::new(ErrorCode::Invalid, "fallocate of 0 bytes"));
        }
        let end = offset
            .checked_add(len)
            .filter(|&e| e <= MAX_FILE_SIZE)
            .ok_or_else(|| Error::new(ErrorCode::FileTooBig, "range past the largest file size"))?;
        let f = self.open_file(fh)?;
        if !f.write {
            return Err(Error::new(ErrorCode::Invalid, "file not open for writing"));
        }
        let id = f.id;
        let (punch, reserve, keep_size) = match what {
            Fallocate::Allocate { keep_size } => (false, true, keep_size),
            Fallocate::PunchHole => (true, false, true),
            Fallocate::ZeroRange { keep_size } => (true, true, keep_size),
        };
        let size = {
            let g = self.leases.get(f.h, Mode::Write).await?;
            let cur = self.fresh(&g).await?;
            self.check_change(&cur).await?;
            if cur.attr.kind != FileKind::File {
                return Err(Error::new(ErrorCode::Invalid, "not a regular file"));
            }
            let fence = g.entry.fence;
            let req = |punch| Request::Fallocate {
                id,
                offset,
                len,
                punch,
                fence,
            };
            if punch {
                if self.layout.replicas > 1 {
                    let from = self.layout.block_of(offset).0;
                    self.to_every_copy_server(&g, from, |_| req(true)).await?;
                } else {
                    self.to_every_server(&g, req(true)).await?;
                }
                g.entry.state.lock().local_writes += 1;
            }
            if reserve {
                self.to_every_server(&g, req(false)).await?;
            }
            g.inode().attr.size
        };
        // Times, and the size if it grows.
        let set = SetAttr {
            size: (!keep_size && end > size).then_some(end),
            mtime: Some(Timestamp::now()),
            ..SetAttr::default()
        };
        self.do_setattr(id, set, &Caller::root()).await.map(|_| ())
    }

    /// Sends `req` to every server under write lease `g`; any failure
    /// fails the whole.
    async fn to_every_server(&self, g: &crate::leases::LeaseGuard, req: Request) -> Result<()> {
        let fence = Some(g.fence());
        let calls = (0..self.layout.servers)
            .map(|s| self.pool.call_fenced(s, req.clone(), Bytes::new(), fence));
        for r in futures::future::join_all(calls).await {
            r?;
        }
        Ok(())
    }
}

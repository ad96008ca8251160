//! `fallocate`: reserving space on the data servers, freeing ranges
//! (punching holes) and zeroing them, under the file's write lease; and
//! `SEEK_DATA` / `SEEK_HOLE`, asked of every server at once.

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
        let (size, alloc) = {
            let g = self.leases.get(f.h, Mode::Write).await?;
            // Gathered writes first (`behind.rs`): a hole punched after
            // them must not be filled by them.
            self.drained(&g.entry, async { Ok(()) }).await?;
            let cur = self.fresh(&g).await?;
            self.check_change(&cur).await?;
            crate::flags::may_fallocate(&cur, !punch)?;
            if reserve && offset.saturating_add(len) > cur.attr.size {
                self.check_quota(cur.attr.uid, cur.attr.gid, crate::quota::Charge::Bytes)
                    .await?;
            }
            if cur.attr.kind != FileKind::File {
                return Err(Error::new(ErrorCode::Invalid, "not a regular file"));
            }
            let fence = g.entry.fence_no();
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
            let cur = g.inode();
            let alloc = match cur.home {
                None => self.leases.measure(id, &cur.stale).await,
                Some(_) => None,
            };
            (cur.attr.size, alloc)
        };
        // Times, the size if it grows, and what is on disk now.
        let set = SetAttr {
            size: (!keep_size && end > size).then_some(end),
            mtime: Some(Timestamp::now()),
            alloc,
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

    /// `lseek(SEEK_DATA)` (`hole: false`) or `lseek(SEEK_HOLE)` from byte
    /// `offset` of open file `fh`: the first byte at or after it that is
    /// data, or in a hole (the end of the file counts as one). `None`:
    /// `ENXIO` (at or past the end; or no data after `offset`).
    ///
    /// Every server is asked about the blocks it keeps (a copy not known
    /// stale: a stale copy may lack data written since); a server no
    /// current copy of whose blocks answers counts as all data, so a
    /// hole is never reported where data may be.
    pub async fn seek(&self, fh: u64, offset: u64, hole: bool) -> Result<Option<u64>> {
        let f = self.open_file(fh)?;
        self.drain_file(&f).await?;
        let g = self.leases.get(f.h, Mode::Read).await?;
        let cur = g.inode();
        drop(g);
        let size = cur.attr.size;
        if offset >= size {
            return Ok(None);
        }
        if cur.home.is_some() || cur.attr.kind != FileKind::File {
            // Cached from a home (blocks may not be here yet): all data.
            return Ok(Some(if hole { size } else { offset }));
        }
        let l = self.layout;
        let id = cur.id;
        let asks = (0..l.servers).map(|primary| {
            let stale = &cur.stale;
            async move {
                for r in 0..l.replicas.max(1) {
                    let s = (primary + r) % l.servers;
                    if stale.iter().any(|rec| rec.server == s) {
                        continue;
                    }
                    let req = Request::Seek {
                        id,
                        replica: r as u8,
                        from: offset,
                        hole,
                    };
                    match self.call_bounded(s, req, Bytes::new(), None).await {
                        Ok((morris_proto::Reply::Sought(found), _)) => return Some(found),
                        Ok((other, _)) => {
                            tracing::debug!(server = s, reply = ?other, "unexpected answer to Seek")
                        }
                        Err(e) => {
                            tracing::debug!(server = s, error = %e, "Seek: trying another copy")
                        }
                    }
                }
                // Nobody could say: all data, no hole.
                Some(if hole {
                    None
                } else {
                    Some(l.global_of_local(id, primary, l.local_start(id, primary, offset)))
                })
            }
        });
        let found: Vec<u64> = futures::future::join_all(asks)
            .await
            .into_iter()
            .flatten()
            .flatten()
            .collect();
        let first = found.into_iter().filter(|&at| at >= offset).min();
        Ok(if hole {
            Some(first.unwrap_or(size).min(size))
        } else {
            first.filter(|&at| at < size)
        })
    }
}

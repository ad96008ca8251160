//! Files made without a name (`open(2)` with `O_TMPFILE`).
//!
//! Such a file is an orphan from its first moment: open here, named by
//! nothing, gone at its last close unless `linkat(2)` names it first. It
//! is made from the parts an unlinked open file already uses
//! (`opens.rs`, `store/orphans.rs`), in the order that keeps it safe:
//!
//! | step | request | a `kill -9` of the mount after it leaves |
//! |---|---|---|
//! | 1. make the inode (`nlink` 1, no entry) | `CreateInode` | an unnamed inode: fsck reclaims it, as after any create whose `Link` never came |
//! | 2. record the open at its owner | `SetOpen` | the same, with a record of a dead client |
//! | 3. drop its link | `DropLink` | an orphan kept for a dead client: the servers reap it ([`crate::reaper::ORPHAN_AGE`]) |
//!
//! Step 2 comes before step 3 so that the file is never an orphan without
//! an open record, which a server's background reaper would remove. A
//! `linkat(2)` that names it (`Client::do_link`) is allowed only for a file
//! this client made so, without `O_EXCL` (the kernel checks the same with
//! its own `I_LINKABLE`); naming it counts its link up from 0 before the
//! entry is stored, as every link does, and the orphan record goes at its
//! next reap, which finds it named.

use morris_proto::{ErrorCode, FileId, FileKind, Inode, Request};

use crate::leases::Mode;
use crate::perm::{W_OK, X_OK};
use crate::{Caller, Client, Error, Result};

impl Client {
    /// Makes a regular file without a name in `dir`, open here; see the
    /// module's table. Returns it (`nlink` 0) and its open-file handle.
    pub(crate) async fn do_tmpfile(
        &self,
        dir: FileId,
        mode: u32,
        write: bool,
        linkable: bool,
        caller: &Caller,
    ) -> Result<(Inode, u64)> {
        let g = self.dir_guard(dir, Mode::Read).await?;
        let dir_inode = g.inode();
        if dir_inode.home.is_some() {
            // Home has no such thing to push it to.
            return Err(Error::new(
                ErrorCode::NotSupported,
                "files without a name are not made in a directory cached from a home",
            ));
        }
        self.permit_under(&g, &dir_inode, caller, W_OK | X_OK)
            .await?;
        let mut attr = Self::new_attr(FileKind::File, mode, 0, &dir_inode, caller);
        self.check_quota(attr.uid, attr.gid, crate::quota::Charge::Inode)
            .await?;
        let xattrs = self.inherit(&g, &dir_inode, &mut attr, caller).await?;
        drop(g);
        let (inode, fence) = self
            .create_inode(Request::CreateInode {
                parent: dir,
                attr,
                target: None,
                home: None,
                op: self.pool.next_op(),
                xattrs: xattrs.clone(),
            })
            .await?;
        let id = inode.id;
        self.leases
            .install_granted(Mode::Write, inode.clone(), fence, xattrs);
        let fh = match self.do_open(id, write, false, false).await {
            Ok(fh) => fh,
            Err(e) => {
                self.remove_unnamed(&inode).await;
                return Err(e);
            }
        };
        // Open here, so `drop_link` records the open before the link goes.
        let dropped = async {
            let cg = self.leases.get(inode.handle(), Mode::Write).await?;
            self.drop_link(&cg).await?;
            Ok::<_, Error>(cg.inode())
        }
        .await;
        match dropped {
            Ok(orphan) => {
                if linkable {
                    self.linkable.lock().insert(id);
                }
                Ok((orphan, fh))
            }
            Err(e) => {
                // Its last close reaps it if the link went after all.
                let _ = self.do_release(fh).await;
                self.remove_unnamed(&inode).await;
                Err(e)
            }
        }
    }

    /// Removes a new inode that nothing names (a create whose `Link`
    /// failed, a file made by [`Client::do_tmpfile`] that could not be
    /// opened or unnamed); fsck reclaims it if this fails too.
    pub(super) async fn remove_unnamed(&self, inode: &Inode) {
        let gone = self
            .call_owner(
                inode.id,
                Request::DeleteInode {
                    ino: inode.handle(),
                    op: self.pool.next_op(),
                },
            )
            .await;
        if let Err(e) = gone {
            tracing::debug!(id = inode.id, error = %e, "an unnamed new file stays for fsck");
        }
        self.leases.forget(inode.id);
    }

    /// Whether `linkat(2)` may name `id` although its last name is gone:
    /// made here by `O_TMPFILE` without `O_EXCL`, and not named since.
    pub(crate) fn may_relink(&self, id: FileId) -> bool {
        self.linkable.lock().contains(&id)
    }
}

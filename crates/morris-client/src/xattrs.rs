//! Extended attributes: read whole from the object's owner under a read
//! lease and kept with the lease (so the kernel's `security.capability`
//! question before every write is answered here), changed one at a time
//! under the write lease.

use std::sync::Arc;

use morris_proto::{ErrorCode, FileId, FileKind, Inode, Reply, Request, Xattr, XattrHow};

use crate::fs::inode_reply;
use crate::leases::Mode;
use crate::perm::{check_access, R_OK, W_OK};
use crate::pool::unexpected;
use crate::{Caller, Client, Error, Result};

/// The namespaces kept; any other name is `NotSupported`, as on ext4.
/// `system.` (POSIX ACLs) is not among them yet.
const KEPT: [&[u8]; 3] = [b"user.", b"trusted.", b"security."];

fn namespace_kept(name: &[u8]) -> Result<()> {
    if KEPT
        .iter()
        .any(|p| name.starts_with(p) && name.len() > p.len())
    {
        return Ok(());
    }
    Err(Error::new(
        ErrorCode::NotSupported,
        format!(
            "extended attribute {:?}: only user., trusted. and security. names are kept",
            String::from_utf8_lossy(name)
        ),
    ))
}

/// Whether `c` may read (`write == false`) or change attribute `name` of
/// `i`, by Linux's rules (`xattr_permission`): `trusted.` is root's,
/// `security.` may be changed by root only, `user.` exists on files and
/// directories only and follows the mode bits (and a sticky directory's
/// owner rule). Checked only for callers the library checks.
fn check_xattr(i: &Inode, c: &Caller, name: &[u8], write: bool) -> Result<()> {
    if !c.check || c.uid == 0 {
        return Ok(());
    }
    let denied = |what: &str| {
        if write {
            Error::new(ErrorCode::Perm, format!("{what} attributes are root's"))
        } else {
            Error::new(ErrorCode::NoData, "no such extended attribute")
        }
    };
    if name.starts_with(b"trusted.") {
        return Err(denied("trusted."));
    }
    if name.starts_with(b"security.") {
        return if write {
            Err(denied("security."))
        } else {
            Ok(())
        };
    }
    if !matches!(i.attr.kind, FileKind::File | FileKind::Dir) {
        return Err(denied(
            "user. attributes of special files are not kept; these",
        ));
    }
    if write && i.attr.kind == FileKind::Dir && i.attr.mode & 0o1000 != 0 && i.attr.uid != c.uid {
        return Err(Error::new(ErrorCode::Perm, "sticky directory"));
    }
    check_access(i, c, if write { W_OK } else { R_OK })
}

impl Client {
    /// Every extended attribute of `id` that `caller` may see, in name
    /// order (kept while this client holds a lease on `id`).
    pub async fn list_xattrs(&self, id: FileId, caller: &Caller) -> Result<Arc<Vec<Xattr>>> {
        let all = self.xattrs_of(id).await?;
        if caller.uid == 0 || !all.iter().any(|x| x.name.starts_with(b"trusted.")) {
            return Ok(all);
        }
        // As on ext4: trusted. names are listed to root only.
        Ok(Arc::new(
            all.iter()
                .filter(|x| !x.name.starts_with(b"trusted."))
                .cloned()
                .collect(),
        ))
    }

    /// The value of extended attribute `name` of `id`; `NoData` if absent.
    pub async fn get_xattr(&self, id: FileId, name: &[u8], caller: &Caller) -> Result<Vec<u8>> {
        namespace_kept(name)?;
        if caller.check {
            let i = self.do_getattr(id).await?;
            check_xattr(&i, caller, name, false)?;
        }
        let all = self.xattrs_of(id).await?;
        match all.binary_search_by(|x| x.name.as_slice().cmp(name)) {
            Ok(at) => Ok(all[at].value.clone()),
            Err(_) => Err(Error::new(ErrorCode::NoData, "no such extended attribute")),
        }
    }

    /// Sets extended attribute `name` of `id` to `value`, as `how` allows.
    pub async fn set_xattr(
        &self,
        id: FileId,
        name: &[u8],
        value: &[u8],
        how: XattrHow,
        caller: &Caller,
    ) -> Result<()> {
        self.change_xattr(id, name, Some(value), how, caller).await
    }

    /// Removes extended attribute `name` of `id`; `NoData` if absent.
    pub async fn remove_xattr(&self, id: FileId, name: &[u8], caller: &Caller) -> Result<()> {
        self.change_xattr(id, name, None, XattrHow::Either, caller)
            .await
    }

    /// The whole attribute list of `id`, from the lease's copy or its owner.
    async fn xattrs_of(&self, id: FileId) -> Result<Arc<Vec<Xattr>>> {
        let h = self.leases.handle(id)?;
        let g = self.leases.get(h, Mode::Read).await?;
        let version = {
            let st = g.entry.state.lock();
            if let Some(x) = &st.xattrs {
                return Ok(x.clone());
            }
            st.version
        };
        let list = match self.call_owner(id, Request::GetXattrs { ino: h }).await? {
            Reply::Xattrs(list) => Arc::new(list),
            other => return Err(unexpected(&other)),
        };
        let mut st = g.entry.state.lock();
        // A change of ours answered meanwhile may not be in this list.
        if st.version == version {
            st.xattrs = Some(list.clone());
        }
        Ok(list)
    }

    async fn change_xattr(
        &self,
        id: FileId,
        name: &[u8],
        value: Option<&[u8]>,
        how: XattrHow,
        caller: &Caller,
    ) -> Result<()> {
        namespace_kept(name)?;
        let h = self.leases.handle(id)?;
        let g = self.leases.get(h, Mode::Write).await?;
        let cur = self.fresh(&g).await?;
        self.check_change(&cur).await?;
        check_xattr(&cur, caller, name, true)?;
        let _one_at_a_time = self.leases.store_lock(id).await;
        let req = Request::SetXattr {
            ino: h,
            name: name.to_vec(),
            value: value.map(<[u8]>::to_vec),
            how,
            op: self.pool.next_op(),
        };
        let inode = inode_reply(self.call_owner(id, req).await?)?;
        let ctime = inode.attr.ctime;
        self.leases.refreshed(&g.entry, inode);
        let mut st = g.entry.state.lock();
        if st.inode.attr.ctime < ctime {
            st.inode.attr.ctime = ctime;
        }
        // Under the write lease nobody else changes the list: apply the
        // change to the kept copy.
        if let Some(list) = st.xattrs.take() {
            let mut list = Arc::unwrap_or_clone(list);
            let at = list.binary_search_by(|x| x.name.as_slice().cmp(name));
            match (at, value) {
                (Ok(i), Some(v)) => list[i].value = v.to_vec(),
                (Err(i), Some(v)) => list.insert(
                    i,
                    Xattr {
                        name: name.to_vec(),
                        value: v.to_vec(),
                    },
                ),
                (Ok(i), None) => {
                    list.remove(i);
                }
                (Err(_), None) => {}
            }
            st.xattrs = Some(Arc::new(list));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inode(kind: FileKind, mode: u32, uid: u32) -> Inode {
        crate::perm::test_inode(kind, mode, uid, uid)
    }

    fn user(uid: u32) -> Caller {
        Caller {
            uid,
            gid: uid,
            groups: vec![],
            check: true,
        }
    }

    #[test]
    fn names_outside_the_kept_namespaces_are_not_supported() {
        for ok in [&b"user.a"[..], b"trusted.x", b"security.selinux"] {
            assert!(namespace_kept(ok).is_ok());
        }
        for bad in [&b"user."[..], b"system.posix_acl_access", b"os2.x", b"x"] {
            assert_eq!(
                namespace_kept(bad).unwrap_err().code,
                ErrorCode::NotSupported
            );
        }
    }

    #[test]
    fn permissions_follow_linux() {
        let f = inode(FileKind::File, 0o644, 1000);
        let owner = user(1000);
        let other = user(2000);
        assert!(check_xattr(&f, &owner, b"user.a", true).is_ok());
        assert!(check_xattr(&f, &other, b"user.a", false).is_ok());
        assert_eq!(
            check_xattr(&f, &other, b"user.a", true).unwrap_err().code,
            ErrorCode::Access
        );
        assert_eq!(
            check_xattr(&f, &owner, b"trusted.a", true)
                .unwrap_err()
                .code,
            ErrorCode::Perm
        );
        assert_eq!(
            check_xattr(&f, &owner, b"trusted.a", false)
                .unwrap_err()
                .code,
            ErrorCode::NoData
        );
        assert!(check_xattr(&f, &other, b"security.a", false).is_ok());
        assert_eq!(
            check_xattr(&f, &owner, b"security.a", true)
                .unwrap_err()
                .code,
            ErrorCode::Perm
        );
        assert!(check_xattr(&f, &Caller::root(), b"trusted.a", true).is_ok());
        let fifo = inode(FileKind::Fifo, 0o666, 1000);
        assert_eq!(
            check_xattr(&fifo, &owner, b"user.a", true)
                .unwrap_err()
                .code,
            ErrorCode::Perm
        );
        let sticky = inode(FileKind::Dir, 0o1777, 1000);
        assert_eq!(
            check_xattr(&sticky, &other, b"user.a", true)
                .unwrap_err()
                .code,
            ErrorCode::Perm
        );
        // The kernel checks for FUSE mounts: nothing checked here then.
        let unchecked = Caller {
            check: false,
            ..other
        };
        assert!(check_xattr(&f, &unchecked, b"trusted.a", true).is_ok());
    }
}

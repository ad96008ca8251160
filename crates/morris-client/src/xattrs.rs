//! Extended attributes: read whole from the object's owner under a read
//! lease and kept with the lease (so the kernel's `security.capability`
//! question before every write is answered here), changed one at a time
//! under the write lease.

use std::sync::Arc;

use morris_proto::acl::{self, Acl};
use morris_proto::{
    Attr, ErrorCode, FileId, FileKind, Inode, Reply, Request, SetAttr, Xattr, XattrHow,
};

use crate::fs::inode_reply;
use crate::leases::{LeaseGuard, Mode};
use crate::perm::{check_access_acl, R_OK, W_OK};
use crate::pool::unexpected;
use crate::{Caller, Client, Error, Result};

/// The namespaces kept; any other name is `NotSupported`, as on ext4.
const KEPT: [&[u8]; 3] = [b"user.", b"trusted.", b"security."];

/// The read-only attribute that shows where an object's blocks and
/// metadata live (as CephFS's `ceph.file.layout`); not listed.
pub const LAYOUT: &[u8] = b"morris.layout";

fn is_acl(name: &[u8]) -> bool {
    name == acl::ACCESS || name == acl::DEFAULT
}

fn namespace_kept(name: &[u8]) -> Result<()> {
    if is_acl(name)
        || KEPT
            .iter()
            .any(|p| name.starts_with(p) && name.len() > p.len())
    {
        return Ok(());
    }
    Err(Error::new(
        ErrorCode::NotSupported,
        format!(
            "extended attribute {:?}: only user., trusted., security. names and POSIX ACLs are kept",
            String::from_utf8_lossy(name)
        ),
    ))
}

/// Whether `c` may read (`write == false`) or change attribute `name` of
/// `i`, by Linux's rules (`xattr_permission`): `trusted.` is root's,
/// `security.` may be changed by root only, `user.` exists on files and
/// directories only and follows the mode bits (and a sticky directory's
/// owner rule). Checked only for callers the library checks.
fn check_xattr(i: &Inode, acl: Option<&Acl>, c: &Caller, name: &[u8], write: bool) -> Result<()> {
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
    if is_acl(name) {
        // Anyone may read an ACL; only the owner may set one.
        return if write && c.uid != i.attr.uid {
            Err(Error::new(ErrorCode::Perm, "only the owner may set an ACL"))
        } else {
            Ok(())
        };
    }
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
    check_access_acl(i, acl, c, if write { W_OK } else { R_OK })
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
        if name == LAYOUT {
            let i = self.do_getattr(id).await?;
            return Ok(self.layout_of(&i).into_bytes());
        }
        namespace_kept(name)?;
        if caller.check {
            let i = self.do_getattr(id).await?;
            let acl = self.acl_for(&i, caller).await?;
            check_xattr(&i, acl.as_ref(), caller, name, false)?;
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
        self.xattrs_under(&g).await
    }

    /// The attribute list of the object `g` holds a lease on.
    pub(crate) async fn xattrs_under(&self, g: &LeaseGuard) -> Result<Arc<Vec<Xattr>>> {
        let h = g.entry.state.lock().inode.handle();
        let id = h.id;
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
        if name == LAYOUT {
            return Err(Error::new(
                ErrorCode::Perm,
                "morris.layout is read-only: the layout is the volume's",
            ));
        }
        namespace_kept(name)?;
        let h = self.leases.handle(id)?;
        let g = self.leases.get(h, Mode::Write).await?;
        if is_acl(name) && self.leases.has_unstored(id) {
            // A mode kept here (`set_behind`) must be stored before the
            // ACL: the owner sets the mode from it, and a kept chmod
            // stored after would undo that (`chmod` then `setfacl`).
            self.drained(&g.entry, self.leases.write_back(&g.entry))
                .await?;
        }
        let cur = self.fresh(&g).await?;
        self.check_change(&cur).await?;
        crate::flags::may_set_xattr(&cur)?;
        let acl = self.acl_under(&g, &cur, caller).await?;
        check_xattr(&cur, acl.as_ref(), caller, name, true)?;
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
        let a = &inode.attr;
        // Setting an access ACL clears set-group-ID as chmod does
        // (`posix_acl_update_mode`): unless the caller is in the file's
        // group or privileged (root). A second request; Linux does both at
        // once.
        let kill_sgid = name == acl::ACCESS
            && value.is_some()
            && a.mode & 0o2000 != 0
            && caller.uid != 0
            && caller.gid != a.gid
            && !caller.groups.contains(&a.gid);
        let mode = a.mode & !0o2000;
        self.leases.refreshed(&g.entry, inode);
        if kill_sgid {
            drop(_one_at_a_time);
            let set = SetAttr {
                mode: Some(mode),
                ..SetAttr::default()
            };
            self.set_inode(&g, set).await?;
        }
        let mut st = g.entry.state.lock();
        if st.inode.attr.ctime < ctime {
            st.inode.attr.ctime = ctime;
        }
        // An ACL may be kept in another form or not at all (the mode says
        // it): asked again when next wanted.
        if is_acl(name) {
            st.xattrs = None;
            return Ok(());
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

impl Client {
    /// `morris.layout` of `i`: the volume's striping, where the object's
    /// metadata lives (and its copies), and for a file the server of its
    /// first block and the order its blocks go round the servers.
    fn layout_of(&self, i: &Inode) -> String {
        let l = &self.layout;
        let d = self.descriptor();
        let addr = |s: u32| d.servers.get(s as usize).map_or("?", String::as_str);
        let owner = l.inode_server(i.id);
        let meta: Vec<String> = l
            .meta_holders(owner)
            .iter()
            .map(|s| format!("{s}@{}", addr(*s)))
            .collect();
        let mut out = format!(
            "stripe_unit={} servers={} copies={} metadata={}",
            l.unit,
            l.servers,
            l.replicas,
            meta.join(",")
        );
        if i.attr.kind == FileKind::File {
            let order: Vec<String> = (1..=u64::from(l.servers))
                .map(|b| l.block_server(i.id, b).to_string())
                .collect();
            out.push_str(&format!(
                " first_block_server={} stripe_order={}",
                l.block_server(i.id, 1),
                order.join(",")
            ));
        }
        out
    }

    /// The access ACL that decides `caller`'s access to `i`, when the
    /// library checks it (the NFS gateway) and the caller is neither root
    /// nor the owner (their access is the mode's); read from the object's
    /// attributes, kept under a lease.
    pub async fn acl_for(&self, i: &Inode, caller: &Caller) -> Result<Option<Acl>> {
        if !acl_matters(i, caller) {
            return Ok(None);
        }
        let list = self.xattrs_of(i.id).await?;
        access_acl(i, &list)
    }

    /// [`Client::acl_for`] of `i` while `g`, a lease on `i`, is held: the
    /// list is read under `g`. (Taking another use of a lease already held
    /// waits behind a recall of it, which waits for `g`: a deadlock until
    /// the lease lapses.)
    pub(crate) async fn acl_under(
        &self,
        g: &LeaseGuard,
        i: &Inode,
        caller: &Caller,
    ) -> Result<Option<Acl>> {
        if !acl_matters(i, caller) {
            return Ok(None);
        }
        let list = self.xattrs_under(g).await?;
        access_acl(i, &list)
    }

    /// [`Client::permit`] of `i` while `g`, a lease on `i`, is held.
    pub(crate) async fn permit_under(
        &self,
        g: &LeaseGuard,
        i: &Inode,
        caller: &Caller,
        mask: u32,
    ) -> Result<()> {
        if !caller.check || mask == 0 {
            return Ok(());
        }
        let acl = self.acl_under(g, i, caller).await?;
        check_access_acl(i, acl.as_ref(), caller, mask)
    }
}

/// Whether `i`'s access ACL can change what `caller` may do.
fn acl_matters(i: &Inode, caller: &Caller) -> bool {
    caller.check
        && caller.uid != 0
        && caller.uid != i.attr.uid
        && i.home.is_none()
        && i.attr.kind != FileKind::Symlink
}

/// The access ACL in `i`'s attribute list, if it has one.
fn access_acl(i: &Inode, list: &[Xattr]) -> Result<Option<Acl>> {
    let Ok(at) = list.binary_search_by(|x| x.name.as_slice().cmp(acl::ACCESS)) else {
        return Ok(None);
    };
    match Acl::decode(&list[at].value) {
        Ok(a) => Ok(a),
        // The servers keep only ACLs that decode.
        Err(e) => Err(Error::new(
            ErrorCode::Io,
            format!("the access ACL of {} does not decode: {e}", i.id),
        )),
    }
}

impl Client {
    /// Checks `mask` for `caller` on `i` (its ACL, else its mode) when
    /// the library checks.
    pub async fn permit(&self, i: &Inode, caller: &Caller, mask: u32) -> Result<()> {
        if !caller.check || mask == 0 {
            return Ok(());
        }
        let acl = self.acl_for(i, caller).await?;
        check_access_acl(i, acl.as_ref(), caller, mask)
    }

    /// A new object's mode and first attributes in directory `g`: its
    /// default ACL, if it has one, masked by the asked mode (Linux's
    /// `posix_acl_create`); else the caller's umask taken away. Returns the
    /// attributes to create the object with (an access ACL when it says
    /// more than the mode; a directory's copy of the default).
    pub(crate) async fn inherit(
        &self,
        g: &LeaseGuard,
        dir: &Inode,
        attr: &mut Attr,
        caller: &Caller,
    ) -> Result<Vec<Xattr>> {
        let umasked = |attr: &mut Attr| attr.mode &= !(caller.umask & 0o777);
        if attr.kind == FileKind::Symlink {
            return Ok(Vec::new());
        }
        if dir.home.is_some() {
            // Cached from a home: no attributes kept here.
            umasked(attr);
            return Ok(Vec::new());
        }
        let list = self.xattrs_under(g).await?;
        let found = list
            .binary_search_by(|x| x.name.as_slice().cmp(acl::DEFAULT))
            .ok()
            .map(|at| &list[at].value);
        let default = match found.map(|v| Acl::decode(v)) {
            Some(Ok(Some(a))) => a,
            Some(Err(e)) => {
                tracing::warn!(dir = dir.id, error = %e, "a directory's default ACL does not decode; not inherited");
                umasked(attr);
                return Ok(Vec::new());
            }
            _ => {
                umasked(attr);
                return Ok(Vec::new());
            }
        };
        let (access, mode) = default.inherit(attr.mode);
        attr.mode = mode;
        let mut first = Vec::new();
        if !access.is_mode_only() {
            first.push(Xattr {
                name: acl::ACCESS.to_vec(),
                value: access.encode(),
            });
        }
        if attr.kind == FileKind::Dir {
            first.push(Xattr {
                name: acl::DEFAULT.to_vec(),
                value: default.encode(),
            });
        }
        Ok(first)
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
            umask: 0,
        }
    }

    #[test]
    fn names_outside_the_kept_namespaces_are_not_supported() {
        for ok in [&b"user.a"[..], b"trusted.x", b"security.selinux"] {
            assert!(namespace_kept(ok).is_ok());
        }
        for bad in [&b"user."[..], b"system.posix_acl_mask", b"os2.x", b"x"] {
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
        assert!(check_xattr(&f, None, &owner, b"user.a", true).is_ok());
        assert!(check_xattr(&f, None, &other, b"user.a", false).is_ok());
        assert_eq!(
            check_xattr(&f, None, &other, b"user.a", true)
                .unwrap_err()
                .code,
            ErrorCode::Access
        );
        assert_eq!(
            check_xattr(&f, None, &owner, b"trusted.a", true)
                .unwrap_err()
                .code,
            ErrorCode::Perm
        );
        assert_eq!(
            check_xattr(&f, None, &owner, b"trusted.a", false)
                .unwrap_err()
                .code,
            ErrorCode::NoData
        );
        assert!(check_xattr(&f, None, &other, b"security.a", false).is_ok());
        assert_eq!(
            check_xattr(&f, None, &owner, b"security.a", true)
                .unwrap_err()
                .code,
            ErrorCode::Perm
        );
        assert!(check_xattr(&f, None, &Caller::root(), b"trusted.a", true).is_ok());
        let fifo = inode(FileKind::Fifo, 0o666, 1000);
        assert_eq!(
            check_xattr(&fifo, None, &owner, b"user.a", true)
                .unwrap_err()
                .code,
            ErrorCode::Perm
        );
        let sticky = inode(FileKind::Dir, 0o1777, 1000);
        assert_eq!(
            check_xattr(&sticky, None, &other, b"user.a", true)
                .unwrap_err()
                .code,
            ErrorCode::Perm
        );
        // The kernel checks for FUSE mounts: nothing checked here then.
        let unchecked = Caller {
            check: false,
            ..other
        };
        assert!(check_xattr(&f, None, &unchecked, b"trusted.a", true).is_ok());
    }
}

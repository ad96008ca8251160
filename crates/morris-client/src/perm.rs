//! Permission checks for callers the library must check itself (the NFS
//! gateway). FUSE mounts leave them to the kernel (`default_permissions`,
//! POSIX ACLs included). An object's access ACL, when it has one, decides
//! for everyone but its owner and root (`Client::acl_for` fetches it).

use morris_proto::acl::Acl;
use morris_proto::{ErrorCode, Inode, SetAttr};

use crate::{Caller, Error, Result};

/// Read permission bit.
pub const R_OK: u32 = 4;
/// Write permission bit.
pub const W_OK: u32 = 2;
/// Execute / search permission bit.
pub const X_OK: u32 = 1;

fn in_group(c: &Caller, gid: u32) -> bool {
    c.gid == gid || c.groups.contains(&gid)
}

/// Checks `mask` (`R_OK|W_OK|X_OK`) for `c` on `inode` by its mode bits.
pub fn check_access(inode: &Inode, c: &Caller, mask: u32) -> Result<()> {
    check_access_acl(inode, None, c, mask)
}

/// Checks `mask` for `c` on `inode` by its access ACL `acl` if it has one
/// (Linux's `posix_acl_permission`), else by its mode bits.
pub fn check_access_acl(inode: &Inode, acl: Option<&Acl>, c: &Caller, mask: u32) -> Result<()> {
    if !c.check || mask == 0 {
        return Ok(());
    }
    let mode = inode.attr.mode;
    if c.uid == 0 {
        // Root may do anything except execute a file nobody may execute.
        let any_x = mode & 0o111 != 0 || inode.attr.kind == morris_proto::FileKind::Dir;
        if mask & X_OK != 0 && !any_x {
            return Err(Error::new(ErrorCode::Access, "no execute bit set"));
        }
        return Ok(());
    }
    if let Some(acl) = acl.filter(|_| c.uid != inode.attr.uid) {
        let want = (mask & 7) as u16;
        if acl.permits(
            inode.attr.uid,
            inode.attr.gid,
            c.uid,
            |g| in_group(c, g),
            want,
        ) {
            return Ok(());
        }
        return Err(Error::new(
            ErrorCode::Access,
            format!("the ACL denies {mask:o} to uid {}", c.uid),
        ));
    }
    let bits = if c.uid == inode.attr.uid {
        (mode >> 6) & 7
    } else if in_group(c, inode.attr.gid) {
        (mode >> 3) & 7
    } else {
        mode & 7
    };
    if bits & mask == mask {
        Ok(())
    } else {
        Err(Error::new(
            ErrorCode::Access,
            format!("mode {:o} denies {mask:o} to uid {}", mode & 0o7777, c.uid),
        ))
    }
}

/// Checks that `c` may remove or rename `child` out of `dir` (write+search on
/// the directory, by `dir_acl` if it has one; with the sticky bit, only the
/// owner of the file or directory).
pub fn check_delete(dir: &Inode, dir_acl: Option<&Acl>, child: &Inode, c: &Caller) -> Result<()> {
    crate::flags::may_remove(dir, child)?;
    check_access_acl(dir, dir_acl, c, W_OK | X_OK)?;
    if c.check
        && c.uid != 0
        && dir.attr.mode & 0o1000 != 0
        && c.uid != child.attr.uid
        && c.uid != dir.attr.uid
    {
        return Err(Error::new(ErrorCode::Perm, "sticky directory"));
    }
    Ok(())
}

/// Checks an attribute change by `c` (POSIX chmod/chown/utimes/truncate rules;
/// write access by `acl` if the inode has one) and returns the change with
/// setgid cleared where POSIX requires.
pub fn check_setattr(
    inode: &Inode,
    acl: Option<&Acl>,
    set: &SetAttr,
    c: &Caller,
) -> Result<SetAttr> {
    crate::flags::may_set(inode, set, c)?;
    let mut out = set.clone();
    if !c.check || c.uid == 0 {
        return Ok(out);
    }
    let owner = c.uid == inode.attr.uid;
    if let Some(mode) = set.mode {
        if !owner {
            return Err(Error::new(ErrorCode::Perm, "only the owner may chmod"));
        }
        if mode & 0o2000 != 0 && !in_group(c, set.gid.unwrap_or(inode.attr.gid)) {
            out.mode = Some(mode & !0o2000);
        }
    }
    if let Some(uid) = set.uid {
        if uid != inode.attr.uid {
            return Err(Error::new(ErrorCode::Perm, "only root may chown"));
        }
    }
    if let Some(gid) = set.gid {
        if (!owner || !in_group(c, gid)) && gid != inode.attr.gid {
            return Err(Error::new(
                ErrorCode::Perm,
                "chgrp to a group you are not in",
            ));
        }
    }
    if set.size.is_some() {
        check_access_acl(inode, acl, c, W_OK)?;
    }
    if set.atime.is_some() || set.mtime.is_some() {
        // Setting explicit times needs ownership; "now" needs write access, but
        // the wire cannot tell them apart, so accept either.
        if !owner {
            check_access_acl(inode, acl, c, W_OK)
                .map_err(|_| Error::new(ErrorCode::Perm, "not the owner"))?;
        }
    }
    Ok(out)
}

/// An inode of `kind` with these mode bits and owners, for tests.
#[cfg(test)]
pub(crate) fn test_inode(kind: morris_proto::FileKind, mode: u32, uid: u32, gid: u32) -> Inode {
    use morris_proto::{Attr, Timestamp};
    Inode {
        id: 9,
        gen: 1,
        parent: 0,
        attr: Attr {
            kind,
            mode,
            uid,
            gid,
            nlink: 1,
            size: 0,
            atime: Timestamp::default(),
            mtime: Timestamp::default(),
            ctime: Timestamp::default(),
            rdev: 0,
            flags: 0,
        },
        target: None,
        stale: Vec::new(),
        alloc: None,
        home: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use morris_proto::FileKind;

    fn inode(mode: u32, uid: u32, gid: u32) -> Inode {
        test_inode(FileKind::File, mode, uid, gid)
    }

    fn user(uid: u32, gid: u32) -> Caller {
        Caller {
            uid,
            gid,
            groups: vec![50],
            check: true,
            umask: 0,
        }
    }

    #[test]
    fn owner_group_other() {
        let i = inode(0o640, 10, 50);
        assert!(check_access(&i, &user(10, 1), R_OK | W_OK).is_ok());
        assert!(check_access(&i, &user(11, 1), R_OK).is_ok()); // via supplementary group 50
        assert!(check_access(&i, &user(11, 1), W_OK).is_err());
        let mut other = user(12, 2);
        other.groups.clear();
        assert!(check_access(&i, &other, R_OK).is_err());
        assert!(check_access(&i, &Caller::root(), R_OK | W_OK).is_ok());
    }

    #[test]
    fn chmod_chown_rules() {
        let i = inode(0o644, 10, 50);
        let chmod = SetAttr {
            mode: Some(0o600),
            ..SetAttr::default()
        };
        assert!(check_setattr(&i, None, &chmod, &user(10, 1)).is_ok());
        assert_eq!(
            check_setattr(&i, None, &chmod, &user(11, 1))
                .unwrap_err()
                .code,
            ErrorCode::Perm
        );
        let chown = SetAttr {
            uid: Some(11),
            ..SetAttr::default()
        };
        assert!(check_setattr(&i, None, &chown, &user(10, 1)).is_err());
        let mut root = Caller::root();
        root.check = true;
        assert!(check_setattr(&i, None, &chown, &root).is_ok());
    }
}

//! Inode flags (`chattr`): what an immutable or append-only object lets
//! anyone, root included, do. The kernel leaves these checks to a FUSE
//! file system (it never sees the flags), so every front end gets them
//! here, as ext4 gives them (`IS_IMMUTABLE`/`IS_APPEND` in the VFS):
//!
//! | change | immutable (`i`) | append-only (`a`) |
//! |---|---|---|
//! | open for writing, write | `EPERM` | only with `O_APPEND` |
//! | truncate, chmod, chown, utimes | `EPERM` | `EPERM` (times set to now: allowed) |
//! | unlink, rename, link it | `EPERM` | `EPERM` |
//! | set or remove an extended attribute | `EPERM` | `EPERM` |
//! | fallocate | `EPERM` | only plain allocation |
//! | a directory: add an entry | `EPERM` | allowed |
//! | a directory: remove or rename an entry | `EPERM` | `EPERM` |
//! | change the flags | owner or root; `i` and `a` root only | same |
//!
//! Flags other than these are kept (`d`, `A`) or refused by the servers.

use morris_proto::inode_flags::{APPEND, IMMUTABLE};
use morris_proto::{ErrorCode, Inode, SetAttr};

use crate::{Caller, Error, Result};

fn refuse(i: &Inode, why: &str) -> Error {
    Error::new(ErrorCode::Perm, format!("{} is {why}", i.id))
}

/// Whether `i` is immutable or append-only.
fn sealed(i: &Inode) -> Option<&'static str> {
    if i.attr.flags & IMMUTABLE != 0 {
        Some("immutable")
    } else if i.attr.flags & APPEND != 0 {
        Some("append-only")
    } else {
        None
    }
}

/// Opening `i` for writing (`append`: with `O_APPEND`), or writing to it.
pub(crate) fn may_write(i: &Inode, append: bool) -> Result<()> {
    if i.attr.flags & IMMUTABLE != 0 {
        return Err(refuse(i, "immutable"));
    }
    if i.attr.flags & APPEND != 0 && !append {
        return Err(refuse(i, "append-only: open it with O_APPEND"));
    }
    Ok(())
}

/// Removing or renaming entry `child` of `dir`, or naming `child` anew
/// (a link): neither may be immutable or append-only.
pub(crate) fn may_remove(dir: &Inode, child: &Inode) -> Result<()> {
    if let Some(why) = sealed(dir) {
        return Err(refuse(dir, why));
    }
    may_name(child)
}

/// Giving `i` another name (a link).
pub(crate) fn may_name(i: &Inode) -> Result<()> {
    match sealed(i) {
        Some(why) => Err(refuse(i, why)),
        None => Ok(()),
    }
}

/// Adding an entry to directory `dir`.
pub(crate) fn may_add(dir: &Inode) -> Result<()> {
    if dir.attr.flags & IMMUTABLE != 0 {
        return Err(refuse(dir, "immutable"));
    }
    Ok(())
}

/// Setting or removing an extended attribute of `i`.
pub(crate) fn may_set_xattr(i: &Inode) -> Result<()> {
    may_name(i)
}

/// `fallocate` of `i`; `plain`: allocation only (no hole punched, no range
/// zeroed).
pub(crate) fn may_fallocate(i: &Inode, plain: bool) -> Result<()> {
    may_write(i, plain)
}

/// Whether the times `set` sets (if any) are "now" (`utime(NULL)`, NFS's
/// `SET_TO_SERVER_TIME`), which an append-only object takes; explicit
/// times it refuses. The front ends resolve "now" before the change gets
/// here, so a time within [`NOW_SLACK_SECS`] of this client's clock
/// counts as "now" (an explicit time that close moves it no further than
/// `touch` would).
fn times_now(set: &SetAttr) -> bool {
    let now = morris_proto::Timestamp::now().secs;
    [set.atime, set.mtime]
        .into_iter()
        .flatten()
        .all(|t| (t.secs - now).abs() <= NOW_SLACK_SECS)
}

/// See [`times_now`].
const NOW_SLACK_SECS: i64 = 2;

/// An attribute change of `i` by `c`.
pub(crate) fn may_set(i: &Inode, set: &SetAttr, c: &Caller) -> Result<()> {
    let others = set.mode.is_some() || set.uid.is_some() || set.gid.is_some() || set.size.is_some();
    let times = set.atime.is_some() || set.mtime.is_some();
    if i.attr.flags & IMMUTABLE != 0 && (others || times) {
        return Err(refuse(i, "immutable"));
    }
    if i.attr.flags & APPEND != 0 && (others || !times_now(set)) {
        return Err(refuse(i, "append-only"));
    }
    if let Some(f) = set.flags {
        if c.check && c.uid != 0 {
            if c.uid != i.attr.uid {
                return Err(Error::new(ErrorCode::Perm, "only the owner may chattr"));
            }
            if (f ^ i.attr.flags) & (IMMUTABLE | APPEND) != 0 {
                return Err(Error::new(
                    ErrorCode::Perm,
                    "only root may change the immutable and append-only flags",
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use morris_proto::inode_flags::NODUMP;
    use morris_proto::FileKind;

    fn with(flags: u32) -> Inode {
        let mut i = crate::perm::test_inode(FileKind::File, 0o644, 1000, 1000);
        i.attr.flags = flags;
        i
    }

    fn user(uid: u32) -> Caller {
        Caller {
            uid,
            gid: uid,
            groups: vec![],
            umask: 0,
            check: true,
        }
    }

    #[test]
    fn an_immutable_object_changes_in_no_way() {
        let i = with(IMMUTABLE);
        let dir = with(0);
        assert!(may_write(&i, false).is_err() && may_write(&i, true).is_err());
        assert!(may_remove(&dir, &i).is_err() && may_name(&i).is_err());
        assert!(may_set_xattr(&i).is_err() && may_fallocate(&i, true).is_err());
        assert!(may_add(&i).is_err() && may_remove(&i, &dir).is_err());
        let times = SetAttr {
            mtime: Some(morris_proto::Timestamp::now()),
            ..SetAttr::default()
        };
        assert!(may_set(&i, &times, &user(0)).is_err(), "root too");
        let clear = SetAttr {
            flags: Some(0),
            ..SetAttr::default()
        };
        assert!(may_set(&i, &clear, &user(0)).is_ok());
        assert!(may_set(&i, &clear, &user(1000)).is_err(), "not root");
    }

    #[test]
    fn an_append_only_object_grows_and_nothing_else() {
        let i = with(APPEND);
        let dir = with(0);
        assert!(may_write(&i, true).is_ok() && may_write(&i, false).is_err());
        assert!(may_fallocate(&i, true).is_ok() && may_fallocate(&i, false).is_err());
        assert!(may_remove(&dir, &i).is_err() && may_set_xattr(&i).is_err());
        assert!(may_add(&i).is_ok(), "a directory's entries are added");
        assert!(may_remove(&i, &dir).is_err(), "and never removed");
        let truncate = SetAttr {
            size: Some(0),
            ..SetAttr::default()
        };
        assert!(may_set(&i, &truncate, &user(0)).is_err());
        let times = SetAttr {
            atime: Some(morris_proto::Timestamp::now()),
            ..SetAttr::default()
        };
        assert!(may_set(&i, &times, &user(0)).is_ok(), "touch");
        let epoch = SetAttr {
            mtime: Some(morris_proto::Timestamp { secs: 0, nanos: 0 }),
            ..SetAttr::default()
        };
        assert!(may_set(&i, &epoch, &user(0)).is_err(), "utime to the epoch");
    }

    #[test]
    fn the_owner_sets_the_other_flags() {
        let i = with(0);
        let nodump = SetAttr {
            flags: Some(NODUMP),
            ..SetAttr::default()
        };
        assert!(may_set(&i, &nodump, &user(1000)).is_ok());
        assert!(may_set(&i, &nodump, &user(1001)).is_err());
        assert!(may_write(&with(NODUMP), false).is_ok());
    }
}

//! NFSv3 wire types to home types: attributes, statuses, handles, names.

use nfs3_client::nfs3_types::mount::mountstat3;
use nfs3_client::nfs3_types::nfs3::{
    fattr3, ftype3, nfs_fh3, nfsstat3, nfstime3, post_op_attr, sattr3, set_atime, set_mtime,
    Nfs3Option, NFS3_FHSIZE,
};
use nfs3_client::nfs3_types::xdr_codec::Opaque;

use crate::{HomeAttr, HomeError, HomeHandle, HomeKind, HomeSetAttr, HomeTime};

/// The home error an NFSv3 status stands for; `op` names the procedure,
/// for the messages of [`HomeError::Invalid`] and [`HomeError::Io`].
pub(crate) fn status_error(op: &str, s: nfsstat3) -> HomeError {
    match s {
        nfsstat3::NFS3ERR_NOENT => HomeError::NotFound,
        nfsstat3::NFS3ERR_STALE | nfsstat3::NFS3ERR_BADHANDLE => HomeError::Stale,
        nfsstat3::NFS3ERR_NOTDIR => HomeError::NotDir,
        nfsstat3::NFS3ERR_ISDIR => HomeError::IsDir,
        nfsstat3::NFS3ERR_ACCES | nfsstat3::NFS3ERR_PERM => HomeError::Access,
        // BADTYPE: a LINK to a directory, a MKNOD of a kind the server
        // cannot make.
        nfsstat3::NFS3ERR_INVAL | nfsstat3::NFS3ERR_BADTYPE | nfsstat3::NFS3ERR_NAMETOOLONG => {
            HomeError::Invalid(format!("{op}: {s}"))
        }
        nfsstat3::NFS3ERR_BAD_COOKIE => HomeError::BadCookie,
        nfsstat3::NFS3ERR_EXIST => HomeError::Exists,
        nfsstat3::NFS3ERR_NOTEMPTY => HomeError::NotEmpty,
        nfsstat3::NFS3ERR_NOSPC | nfsstat3::NFS3ERR_DQUOT => HomeError::NoSpace,
        nfsstat3::NFS3ERR_ROFS => HomeError::ReadOnly,
        _ => HomeError::Io(format!("{op}: {s}")),
    }
}

/// The home error a MOUNT status stands for.
pub(crate) fn mount_error(export: &str, s: mountstat3) -> HomeError {
    match s {
        mountstat3::MNT3ERR_NOENT => HomeError::NotFound,
        mountstat3::MNT3ERR_ACCES | mountstat3::MNT3ERR_PERM => HomeError::Access,
        mountstat3::MNT3ERR_NOTDIR => HomeError::NotDir,
        mountstat3::MNT3ERR_INVAL => HomeError::Invalid(format!("MOUNT {export}: {s}")),
        _ => HomeError::Io(format!("MOUNT {export}: {s}")),
    }
}

fn kind(t: ftype3) -> HomeKind {
    match t {
        ftype3::NF3REG => HomeKind::File,
        ftype3::NF3DIR => HomeKind::Dir,
        ftype3::NF3BLK => HomeKind::BlockDev,
        ftype3::NF3CHR => HomeKind::CharDev,
        ftype3::NF3LNK => HomeKind::Symlink,
        ftype3::NF3SOCK => HomeKind::Socket,
        ftype3::NF3FIFO => HomeKind::Fifo,
    }
}

/// An NFS time as a home time (nanoseconds past 10^9, which no correct
/// server sends, are capped).
fn time(t: &nfstime3) -> HomeTime {
    HomeTime {
        secs: i64::from(t.seconds),
        nsecs: t.nseconds.min(999_999_999),
    }
}

/// NFSv3 attributes as home attributes.
pub(crate) fn attr(a: &fattr3) -> HomeAttr {
    HomeAttr {
        kind: kind(a.type_),
        mode: a.mode & 0o7777,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        size: a.size,
        used: a.used,
        rdev: (a.rdev.specdata1, a.rdev.specdata2),
        fsid: a.fsid,
        fileid: a.fileid,
        atime: time(&a.atime),
        mtime: time(&a.mtime),
        ctime: time(&a.ctime),
    }
}

/// Attributes of an object a request named by handle, as home attributes:
/// [`HomeError::Stale`] if the object has no name left (`nlink` 0). A
/// server that still has the file open (ganesha keeps descriptors of files
/// it read) answers for a removed file with its last attributes, unchanged
/// but for `nlink`; the object is gone all the same.
pub(crate) fn live_attr(a: &fattr3) -> Result<HomeAttr, HomeError> {
    if a.nlink == 0 {
        return Err(HomeError::Stale);
    }
    Ok(attr(a))
}

/// Fails with [`HomeError::Stale`] if a reply's attributes say the object
/// has no name left (see [`live_attr`]).
pub(crate) fn check_live(a: &post_op_attr) -> Result<(), HomeError> {
    match a {
        Nfs3Option::Some(a) => live_attr(a).map(|_| ()),
        Nfs3Option::None => Ok(()),
    }
}

/// A file handle the server sent, as a home handle: an [`HomeError::Io`]
/// unless it is 1 to 64 bytes long (RFC 1813).
pub(crate) fn handle_from_wire(op: &str, fh: nfs_fh3) -> Result<HomeHandle, HomeError> {
    let data = fh.data.into_owned();
    if data.is_empty() || data.len() > NFS3_FHSIZE {
        return Err(HomeError::Io(format!(
            "{op}: the server sent a file handle of {} bytes (NFSv3 allows 1 to {NFS3_FHSIZE})",
            data.len()
        )));
    }
    Ok(HomeHandle(data))
}

/// A home handle as an NFS file handle: [`HomeError::Invalid`] if it
/// cannot be one (it was not made by an NFS home).
pub(crate) fn handle_to_wire(h: &HomeHandle) -> Result<nfs_fh3, HomeError> {
    if h.0.is_empty() || h.0.len() > NFS3_FHSIZE {
        return Err(HomeError::Invalid(format!(
            "a handle of {} bytes is no NFSv3 file handle",
            h.0.len()
        )));
    }
    Ok(nfs_fh3 {
        data: Opaque::owned(h.0.clone()),
    })
}

/// A home time as an NFS time: [`HomeError::Invalid`] unless NFSv3 can
/// carry it (1970 to 2106, nanoseconds below 10^9).
pub(crate) fn nfs_time(t: HomeTime) -> Result<nfstime3, HomeError> {
    match u32::try_from(t.secs) {
        Ok(seconds) if t.nsecs < 1_000_000_000 => Ok(nfstime3 {
            seconds,
            nseconds: t.nsecs,
        }),
        _ => Err(HomeError::Invalid(format!(
            "NFSv3 cannot carry the time {}.{:09} (seconds 0 to {}, nanoseconds below 10^9)",
            t.secs,
            t.nsecs,
            u32::MAX
        ))),
    }
}

/// Attributes to set as an NFS `sattr3` (times as the client's): the
/// fields `set` gives, but the mode only if `with_mode`.
/// [`HomeError::Invalid`] for a mode above `0o7777` or a time NFSv3 cannot
/// carry.
pub(crate) fn sattr(set: &HomeSetAttr, with_mode: bool) -> Result<sattr3, HomeError> {
    let mode = match set.mode {
        Some(m) if m > 0o7777 => {
            return Err(HomeError::Invalid(format!(
                "mode {m:#o} has bits beyond 0o7777"
            )))
        }
        Some(m) if with_mode => Nfs3Option::Some(m),
        _ => Nfs3Option::None,
    };
    Ok(sattr3 {
        mode,
        uid: set.uid.map_or(Nfs3Option::None, Nfs3Option::Some),
        gid: set.gid.map_or(Nfs3Option::None, Nfs3Option::Some),
        size: set.size.map_or(Nfs3Option::None, Nfs3Option::Some),
        atime: match set.atime {
            Some(t) => set_atime::SET_TO_CLIENT_TIME(nfs_time(t)?),
            None => set_atime::DONT_CHANGE,
        },
        mtime: match set.mtime {
            Some(t) => set_mtime::SET_TO_CLIENT_TIME(nfs_time(t)?),
            None => set_mtime::DONT_CHANGE,
        },
    })
}

/// Checks that `name` is one name of a directory: not empty, not `.` or
/// `..`, without `/` or NUL.
pub(crate) fn check_name(name: &[u8]) -> Result<(), HomeError> {
    if name.is_empty() || name == b"." || name == b".." || name.iter().any(|&b| b == b'/' || b == 0)
    {
        return Err(HomeError::Invalid(format!(
            "{:?} is not a name within a directory",
            String::from_utf8_lossy(name)
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use nfs3_client::nfs3_types::nfs3::specdata3;

    #[test]
    fn attributes_map_field_by_field() {
        let a = fattr3 {
            type_: ftype3::NF3CHR,
            mode: 0o104755 | 0o170000,
            nlink: 3,
            uid: 1234,
            gid: 5678,
            size: 42,
            used: 4096,
            rdev: specdata3 {
                specdata1: 1,
                specdata2: 3,
            },
            fsid: 77,
            fileid: 99,
            atime: nfstime3 {
                seconds: 1,
                nseconds: 2,
            },
            mtime: nfstime3 {
                seconds: 1_700_000_000,
                nseconds: 123_456_789,
            },
            ctime: nfstime3 {
                seconds: 5,
                nseconds: 2_000_000_000,
            },
        };
        let h = attr(&a);
        assert_eq!(h.kind, HomeKind::CharDev);
        assert_eq!(h.mode, 0o4755);
        assert_eq!(
            (h.nlink, h.uid, h.gid, h.size, h.used),
            (3, 1234, 5678, 42, 4096)
        );
        assert_eq!((h.rdev, h.fsid, h.fileid), ((1, 3), 77, 99));
        assert_eq!(
            h.mtime,
            HomeTime {
                secs: 1_700_000_000,
                nsecs: 123_456_789
            }
        );
        assert_eq!(h.ctime.nsecs, 999_999_999);
        assert_eq!(live_attr(&a), Ok(h));
        let gone = fattr3 { nlink: 0, ..a };
        assert_eq!(live_attr(&gone), Err(HomeError::Stale));
        assert_eq!(check_live(&Nfs3Option::Some(gone)), Err(HomeError::Stale));
        assert_eq!(check_live(&Nfs3Option::None), Ok(()));
    }

    #[test]
    fn statuses_map_to_home_errors() {
        use nfsstat3::*;
        assert_eq!(status_error("X", NFS3ERR_NOENT), HomeError::NotFound);
        assert_eq!(status_error("X", NFS3ERR_STALE), HomeError::Stale);
        assert_eq!(status_error("X", NFS3ERR_BADHANDLE), HomeError::Stale);
        assert_eq!(status_error("X", NFS3ERR_NOTDIR), HomeError::NotDir);
        assert_eq!(status_error("X", NFS3ERR_ISDIR), HomeError::IsDir);
        assert_eq!(status_error("X", NFS3ERR_ACCES), HomeError::Access);
        assert_eq!(status_error("X", NFS3ERR_PERM), HomeError::Access);
        assert_eq!(status_error("X", NFS3ERR_BAD_COOKIE), HomeError::BadCookie);
        assert_eq!(status_error("X", NFS3ERR_EXIST), HomeError::Exists);
        assert_eq!(status_error("X", NFS3ERR_NOTEMPTY), HomeError::NotEmpty);
        assert_eq!(status_error("X", NFS3ERR_NOSPC), HomeError::NoSpace);
        assert_eq!(status_error("X", NFS3ERR_DQUOT), HomeError::NoSpace);
        assert_eq!(status_error("X", NFS3ERR_ROFS), HomeError::ReadOnly);
        assert_eq!(
            status_error("LINK", NFS3ERR_BADTYPE),
            HomeError::Invalid("LINK: NFS3ERR_BADTYPE".into())
        );
        assert_eq!(
            status_error("READLINK", NFS3ERR_INVAL),
            HomeError::Invalid("READLINK: NFS3ERR_INVAL".into())
        );
        assert_eq!(
            status_error("READ", NFS3ERR_SERVERFAULT),
            HomeError::Io("READ: NFS3ERR_SERVERFAULT".into())
        );
    }

    #[test]
    fn attributes_to_set_map_field_by_field() {
        let t = |secs, nsecs| HomeTime { secs, nsecs };
        let set = HomeSetAttr {
            mode: Some(0o4750),
            uid: Some(12),
            gid: Some(34),
            size: Some(56),
            atime: Some(t(1, 2)),
            mtime: Some(t(1_700_000_000, 999_999_999)),
        };
        let s = sattr(&set, true).unwrap();
        assert_eq!(
            (s.mode, s.uid, s.gid, s.size),
            (
                Nfs3Option::Some(0o4750),
                Nfs3Option::Some(12),
                Nfs3Option::Some(34),
                Nfs3Option::Some(56)
            )
        );
        assert!(matches!(
            s.atime,
            set_atime::SET_TO_CLIENT_TIME(nfstime3 {
                seconds: 1,
                nseconds: 2
            })
        ));
        assert!(matches!(
            s.mtime,
            set_mtime::SET_TO_CLIENT_TIME(nfstime3 {
                seconds: 1_700_000_000,
                nseconds: 999_999_999
            })
        ));
        let s = sattr(&set, false).unwrap();
        assert_eq!(s.mode, Nfs3Option::None);
        let s = sattr(&HomeSetAttr::default(), true).unwrap();
        assert_eq!(
            (s.mode, s.uid, s.gid, s.size),
            (
                Nfs3Option::None,
                Nfs3Option::None,
                Nfs3Option::None,
                Nfs3Option::None
            )
        );
        assert!(matches!(s.atime, set_atime::DONT_CHANGE));
        assert!(matches!(s.mtime, set_mtime::DONT_CHANGE));
        for bad in [
            HomeSetAttr {
                mode: Some(0o10000),
                ..HomeSetAttr::default()
            },
            HomeSetAttr {
                atime: Some(t(-1, 0)),
                ..HomeSetAttr::default()
            },
            HomeSetAttr {
                mtime: Some(t(1 << 32, 0)),
                ..HomeSetAttr::default()
            },
            HomeSetAttr {
                mtime: Some(t(1, 1_000_000_000)),
                ..HomeSetAttr::default()
            },
        ] {
            assert!(
                matches!(sattr(&bad, true), Err(HomeError::Invalid(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn handles_are_1_to_64_bytes() {
        let fh = |n: usize| nfs_fh3 {
            data: Opaque::owned(vec![7; n]),
        };
        assert!(matches!(
            handle_from_wire("L", fh(0)),
            Err(HomeError::Io(_))
        ));
        assert!(matches!(
            handle_from_wire("L", fh(65)),
            Err(HomeError::Io(_))
        ));
        assert_eq!(handle_from_wire("L", fh(64)), Ok(HomeHandle(vec![7; 64])));
        assert!(matches!(
            handle_to_wire(&HomeHandle(vec![1; 65])),
            Err(HomeError::Invalid(_))
        ));
        assert!(handle_to_wire(&HomeHandle(vec![1; 28])).is_ok());
    }

    #[test]
    fn names_are_single_components() {
        for bad in [&b""[..], b".", b"..", b"a/b", b"/", b"a\0"] {
            assert!(
                matches!(check_name(bad), Err(HomeError::Invalid(_))),
                "{bad:?}"
            );
        }
        for good in [&b"a"[..], b"...", b".hidden", b"\xff\xfe"] {
            assert_eq!(check_name(good), Ok(()));
        }
    }
}

//! The inode-flag ioctls (`chattr`, `lsattr`, `xfs_io -c chattr`) in
//! terms of the volume's flags ([`morris_proto::inode_flags`], which use
//! Linux's `FS_*_FL` numbers). The kernel sends them as `FUSE_IOCTL` from
//! its `fileattr_get`/`fileattr_set`, after checking ownership and
//! `CAP_LINUX_IMMUTABLE` itself.

use morris_proto::inode_flags::{APPEND, IMMUTABLE, KEPT, NOATIME, NODUMP};

/// `FS_IOC_GETFLAGS`: `_IOR('f', 1, long)`.
pub(crate) const GETFLAGS: u32 = 0x8008_6601;
/// `FS_IOC_SETFLAGS`: `_IOW('f', 2, long)`.
pub(crate) const SETFLAGS: u32 = 0x4008_6602;
/// `FS_IOC_FSGETXATTR`: `_IOR('X', 31, struct fsxattr)`.
pub(crate) const FSGETXATTR: u32 = 0x801c_581f;
/// `FS_IOC_FSSETXATTR`: `_IOW('X', 32, struct fsxattr)`.
pub(crate) const FSSETXATTR: u32 = 0x401c_5820;
/// `sizeof(struct fsxattr)`.
pub(crate) const FSXATTR_LEN: usize = 28;

/// `FS_XFLAG_*` for each kept flag.
const XFLAGS: [(u32, u32); 4] = [
    (IMMUTABLE, 0x8),
    (APPEND, 0x10),
    (NOATIME, 0x40),
    (NODUMP, 0x80),
];

/// The `FS_IOC_SETFLAGS` argument (an `int` on the wire), or `None` if it
/// is too short.
pub(crate) fn flags_arg(data: &[u8]) -> Option<u32> {
    let b: [u8; 4] = data.get(..4)?.try_into().ok()?;
    Some(u32::from_ne_bytes(b))
}

/// `struct fsxattr` for `flags`.
pub(crate) fn fsxattr(flags: u32) -> [u8; FSXATTR_LEN] {
    let x = XFLAGS
        .iter()
        .filter(|(f, _)| flags & f != 0)
        .fold(0u32, |a, (_, x)| a | x);
    let mut out = [0u8; FSXATTR_LEN];
    out[..4].copy_from_slice(&x.to_ne_bytes());
    out
}

/// The flags a `struct fsxattr` asks for, with the inode's other
/// `FS_*_FL` flags (those with no `FS_XFLAG_*`) kept from `current`;
/// `Err` for what the volume does not keep (other `xflags`, an extent
/// size hint, a project id).
pub(crate) fn from_fsxattr(data: &[u8], current: u32) -> Result<u32, ()> {
    if data.len() < 20 {
        return Err(());
    }
    let word = |i: usize| {
        let b: [u8; 4] = data[i * 4..i * 4 + 4].try_into().unwrap_or_default();
        u32::from_ne_bytes(b)
    };
    let (xflags, extsize, projid, cowextsize) = (word(0), word(1), word(3), word(4));
    if extsize != 0 || projid != 0 || cowextsize != 0 {
        return Err(());
    }
    let mut flags = current & !KEPT;
    let mut left = xflags;
    for (f, x) in XFLAGS {
        if xflags & x != 0 {
            flags |= f;
            left &= !x;
        }
    }
    if left != 0 {
        return Err(());
    }
    Ok(flags)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ioctl_numbers_are_linuxs() {
        assert_eq!(GETFLAGS, libc::FS_IOC_GETFLAGS as u32);
        assert_eq!(SETFLAGS, libc::FS_IOC_SETFLAGS as u32);
        assert_eq!(FSXATTR_LEN, 28);
    }

    #[test]
    fn fsxattr_round_trips_the_kept_flags_and_refuses_others() {
        for flags in [0, IMMUTABLE, APPEND | NODUMP, KEPT] {
            assert_eq!(from_fsxattr(&fsxattr(flags), 0), Ok(flags));
        }
        let mut x = fsxattr(0);
        x[..4].copy_from_slice(&0x800u32.to_ne_bytes()); // FS_XFLAG_EXTSIZE
        assert!(from_fsxattr(&x, 0).is_err());
        let mut x = fsxattr(0);
        x[12..16].copy_from_slice(&7u32.to_ne_bytes()); // a project id
        assert!(from_fsxattr(&x, 0).is_err());
        assert!(from_fsxattr(&[0; 8], 0).is_err());
        assert_eq!(flags_arg(&0x30u32.to_ne_bytes()), Some(0x30));
        assert_eq!(flags_arg(&[1, 2]), None);
    }
}

//! Conversions between morris inodes and the kernel's attribute types.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{FileAttr, FileType, INodeNo, TimeOrNow};
use morris_client::{FileKind, Inode, SetAttr, Timestamp};

/// The kernel's file type for a morris kind.
pub(crate) fn file_type(kind: FileKind) -> FileType {
    match kind {
        FileKind::File => FileType::RegularFile,
        FileKind::Dir => FileType::Directory,
        FileKind::Symlink => FileType::Symlink,
        FileKind::Fifo => FileType::NamedPipe,
        FileKind::Socket => FileType::Socket,
        FileKind::CharDev => FileType::CharDevice,
        FileKind::BlockDev => FileType::BlockDevice,
    }
}

/// The kind `mknod` asks for in the `S_IFMT` bits of `mode` (no type bits
/// means a regular file, as for mknod(2)); `None` for directories, symlinks
/// and unknown types, which mknod cannot create.
pub(crate) fn mknod_kind(mode: u32) -> Option<FileKind> {
    match mode & libc::S_IFMT {
        0 | libc::S_IFREG => Some(FileKind::File),
        libc::S_IFIFO => Some(FileKind::Fifo),
        libc::S_IFSOCK => Some(FileKind::Socket),
        libc::S_IFCHR => Some(FileKind::CharDev),
        libc::S_IFBLK => Some(FileKind::BlockDev),
        _ => None,
    }
}

/// A morris timestamp as a `SystemTime`, saturating at the ends of the range
/// `SystemTime` can hold instead of panicking.
pub(crate) fn system_time(t: Timestamp) -> SystemTime {
    let nanos = Duration::from_nanos(u64::from(t.nanos.min(999_999_999)));
    let secs = Duration::from_secs(t.secs.unsigned_abs());
    let whole = if t.secs >= 0 {
        UNIX_EPOCH.checked_add(secs)
    } else {
        UNIX_EPOCH.checked_sub(secs)
    };
    whole
        .and_then(|w| w.checked_add(nanos))
        .unwrap_or(if t.secs >= 0 {
            far_future()
        } else {
            UNIX_EPOCH
        })
}

/// A late time every `SystemTime` can represent (year 2262), for saturation.
fn far_future() -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(i64::MAX as u64 / 1_000_000_000)
}

/// A `SystemTime` as a morris timestamp (seconds may be negative; nanoseconds
/// always count forward), saturating instead of overflowing.
pub(crate) fn timestamp(t: SystemTime) -> Timestamp {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => Timestamp {
            secs: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
            nanos: d.subsec_nanos(),
        },
        Err(before) => {
            let d = before.duration();
            let secs = i64::try_from(d.as_secs()).unwrap_or(i64::MAX);
            if d.subsec_nanos() == 0 {
                Timestamp {
                    secs: -secs,
                    nanos: 0,
                }
            } else {
                Timestamp {
                    secs: (-secs).saturating_sub(1),
                    nanos: 1_000_000_000 - d.subsec_nanos(),
                }
            }
        }
    }
}

/// The kernel's attributes for an inode. `blksize` is the volume's stripe unit
/// (the preferred I/O size reported by stat).
pub(crate) fn file_attr(inode: &Inode, blksize: u32) -> FileAttr {
    let a = &inode.attr;
    FileAttr {
        ino: INodeNo(inode.id),
        size: a.size,
        blocks: inode.disk_bytes().div_ceil(512),
        atime: system_time(a.atime),
        mtime: system_time(a.mtime),
        ctime: system_time(a.ctime),
        crtime: system_time(a.ctime),
        kind: file_type(a.kind),
        // Masked to 12 bits, so it always fits.
        perm: (a.mode & 0o7777) as u16,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: a.rdev,
        blksize: if blksize == 0 { 4096 } else { blksize },
        flags: 0,
    }
}

/// The morris attribute change for a FUSE `setattr`. `now` resolves
/// `UTIME_NOW`; `mode` loses its file-type bits.
#[allow(clippy::too_many_arguments)]
pub(crate) fn set_attr(
    mode: Option<u32>,
    uid: Option<u32>,
    gid: Option<u32>,
    size: Option<u64>,
    atime: Option<TimeOrNow>,
    mtime: Option<TimeOrNow>,
    ctime: Option<SystemTime>,
    now: Timestamp,
) -> SetAttr {
    let resolve = |t: TimeOrNow| match t {
        TimeOrNow::Now => now,
        TimeOrNow::SpecificTime(t) => timestamp(t),
    };
    SetAttr {
        mode: mode.map(|m| m & 0o7777),
        uid,
        gid,
        size,
        atime: atime.map(resolve),
        mtime: mtime.map(resolve),
        ctime: ctime.map(timestamp),
        ..SetAttr::default()
    }
}

/// Whether a change touches nothing (the kernel sends such setattrs, e.g. with
/// only a file handle); answering it with getattr avoids a needless ctime bump.
pub(crate) fn is_empty(set: &SetAttr) -> bool {
    *set == SetAttr::default()
}

#[cfg(test)]
mod tests {
    use morris_client::FileId;
    use morris_proto::Attr;

    use super::*;

    fn inode(id: FileId, kind: FileKind, mode: u32, size: u64) -> Inode {
        Inode {
            id,
            gen: 9,
            parent: 0,
            attr: Attr {
                kind,
                mode,
                uid: 1000,
                gid: 100,
                nlink: 3,
                size,
                atime: Timestamp { secs: 10, nanos: 5 },
                mtime: Timestamp { secs: 20, nanos: 6 },
                ctime: Timestamp {
                    secs: -30,
                    nanos: 7,
                },
                rdev: 0x0801,
                flags: 0,
            },
            target: None,
            stale: Vec::new(),
            alloc: None,
            home: None,
        }
    }

    #[test]
    fn attr_fields() {
        let a = file_attr(&inode(42, FileKind::File, 0o104755, 1025), 1 << 20);
        assert_eq!(a.ino, INodeNo(42));
        assert_eq!(a.size, 1025);
        assert_eq!(a.blocks, 8);
        assert_eq!(a.perm, 0o4755);
        assert_eq!(a.kind, FileType::RegularFile);
        assert_eq!(a.nlink, 3);
        assert_eq!((a.uid, a.gid), (1000, 100));
        assert_eq!(a.rdev, 0x0801);
        assert_eq!(a.blksize, 1 << 20);
        assert_eq!(a.atime, UNIX_EPOCH + Duration::new(10, 5));
        assert_eq!(a.mtime, UNIX_EPOCH + Duration::new(20, 6));
        assert_eq!(
            a.ctime,
            UNIX_EPOCH - Duration::from_secs(30) + Duration::from_nanos(7)
        );
    }

    #[test]
    fn blocks_are_the_size_in_4k_blocks_unless_measured() {
        for (size, blocks) in [(0, 0), (1, 8), (4096, 8), (4097, 16), (1 << 40, 1 << 31)] {
            assert_eq!(
                file_attr(&inode(2, FileKind::File, 0o644, size), 4096).blocks,
                blocks
            );
        }
        assert_eq!(
            file_attr(&inode(2, FileKind::File, 0o644, u64::MAX), 4096).blocks,
            u64::MAX / 512 + 1
        );
        // A sparse file: what was measured on disk.
        let mut sparse = inode(2, FileKind::File, 0o644, 1 << 30);
        sparse.alloc = Some(0);
        assert_eq!(file_attr(&sparse, 4096).blocks, 0);
        sparse.alloc = Some(1 << 20);
        assert_eq!(file_attr(&sparse, 4096).blocks, 2048);
    }

    #[test]
    fn kinds_map_both_ways() {
        let pairs = [
            (FileKind::File, FileType::RegularFile, libc::S_IFREG),
            (FileKind::Dir, FileType::Directory, libc::S_IFDIR),
            (FileKind::Symlink, FileType::Symlink, libc::S_IFLNK),
            (FileKind::Fifo, FileType::NamedPipe, libc::S_IFIFO),
            (FileKind::Socket, FileType::Socket, libc::S_IFSOCK),
            (FileKind::CharDev, FileType::CharDevice, libc::S_IFCHR),
            (FileKind::BlockDev, FileType::BlockDevice, libc::S_IFBLK),
        ];
        for (kind, ty, ifmt) in pairs {
            assert_eq!(file_type(kind), ty);
            let back = mknod_kind(ifmt | 0o640);
            match kind {
                FileKind::Dir | FileKind::Symlink => assert_eq!(back, None),
                _ => assert_eq!(back, Some(kind)),
            }
        }
        assert_eq!(mknod_kind(0o644), Some(FileKind::File));
        assert_eq!(mknod_kind(0o170000), None);
    }

    #[test]
    fn timestamps_round_trip() {
        for (secs, nanos) in [
            (0, 0),
            (1, 1),
            (1_700_000_000, 999_999_999),
            (-1, 0),
            (-1, 500),
            (-86_400, 1),
        ] {
            let t = Timestamp { secs, nanos };
            assert_eq!(timestamp(system_time(t)), t, "{t:?}");
        }
    }

    #[test]
    fn extreme_timestamps_do_not_panic() {
        for secs in [i64::MAX, i64::MIN, i64::MAX - 1, i64::MIN + 1] {
            let t = system_time(Timestamp {
                secs,
                nanos: 999_999_999,
            });
            let back = timestamp(t);
            assert_eq!(back.secs.signum(), secs.signum());
        }
        let t = system_time(Timestamp {
            secs: 0,
            nanos: u32::MAX,
        });
        assert_eq!(t, UNIX_EPOCH + Duration::from_nanos(999_999_999));
    }

    #[test]
    fn setattr_translation() {
        let now = Timestamp {
            secs: 100,
            nanos: 1,
        };
        let set = set_attr(
            Some(0o100644 | 0o4000),
            Some(5),
            None,
            Some(0),
            Some(TimeOrNow::Now),
            Some(TimeOrNow::SpecificTime(UNIX_EPOCH + Duration::new(7, 8))),
            Some(UNIX_EPOCH + Duration::from_secs(9)),
            now,
        );
        assert_eq!(set.mode, Some(0o4644));
        assert_eq!(set.uid, Some(5));
        assert_eq!(set.gid, None);
        assert_eq!(set.size, Some(0));
        assert_eq!(set.atime, Some(now));
        assert_eq!(set.mtime, Some(Timestamp { secs: 7, nanos: 8 }));
        assert_eq!(set.ctime, Some(Timestamp { secs: 9, nanos: 0 }));
        assert_eq!((set.nlink, set.parent), (None, None));
        assert!(!is_empty(&set));
        assert!(is_empty(&set_attr(
            None, None, None, None, None, None, None, now
        )));
    }
}

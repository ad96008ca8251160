//! What a server keeps of an inode on its disk, in types of its own.
//!
//! The wire types (`morris_proto`) change with the protocol; these do not:
//! they are the layout of the `data` column of the `inodes` table since
//! store format 1 (postcard, fields in this order), so a protocol change
//! is no longer a disk-format change by accident. A field added here is a
//! new store format: a new type, the old one kept for reading (as
//! `cached.rs` does with its links' format byte), and `STORE_FORMAT`
//! raised. `tests/fixtures/store-v2.sql` and the golden bytes below check
//! that stores already written read as they were written.

use morris_proto::{Attr, ErrorCode, FileId, FileKind, Inode, Timestamp, WireError};
use serde::{Deserialize, Serialize};

/// An object's kind as stored (variant order is the encoding).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
enum StoredKind {
    File,
    Dir,
    Symlink,
    Fifo,
    Socket,
    CharDev,
    BlockDev,
}

impl From<FileKind> for StoredKind {
    fn from(k: FileKind) -> Self {
        match k {
            FileKind::File => StoredKind::File,
            FileKind::Dir => StoredKind::Dir,
            FileKind::Symlink => StoredKind::Symlink,
            FileKind::Fifo => StoredKind::Fifo,
            FileKind::Socket => StoredKind::Socket,
            FileKind::CharDev => StoredKind::CharDev,
            FileKind::BlockDev => StoredKind::BlockDev,
        }
    }
}

impl From<StoredKind> for FileKind {
    fn from(k: StoredKind) -> Self {
        match k {
            StoredKind::File => FileKind::File,
            StoredKind::Dir => FileKind::Dir,
            StoredKind::Symlink => FileKind::Symlink,
            StoredKind::Fifo => FileKind::Fifo,
            StoredKind::Socket => FileKind::Socket,
            StoredKind::CharDev => FileKind::CharDev,
            StoredKind::BlockDev => FileKind::BlockDev,
        }
    }
}

/// A time as stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
struct StoredTime {
    secs: i64,
    nanos: u32,
}

impl From<Timestamp> for StoredTime {
    fn from(t: Timestamp) -> Self {
        StoredTime {
            secs: t.secs,
            nanos: t.nanos,
        }
    }
}

impl From<StoredTime> for Timestamp {
    fn from(t: StoredTime) -> Self {
        Timestamp {
            secs: t.secs,
            nanos: t.nanos,
        }
    }
}

/// An inode's attributes as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct StoredAttr {
    kind: StoredKind,
    mode: u32,
    uid: u32,
    gid: u32,
    nlink: u32,
    size: u64,
    atime: StoredTime,
    mtime: StoredTime,
    ctime: StoredTime,
    rdev: u32,
}

impl From<&Attr> for StoredAttr {
    fn from(a: &Attr) -> Self {
        StoredAttr {
            kind: a.kind.into(),
            mode: a.mode,
            uid: a.uid,
            gid: a.gid,
            nlink: a.nlink,
            size: a.size,
            atime: a.atime.into(),
            mtime: a.mtime.into(),
            ctime: a.ctime.into(),
            rdev: a.rdev,
        }
    }
}

impl From<StoredAttr> for Attr {
    fn from(a: StoredAttr) -> Self {
        Attr {
            kind: a.kind.into(),
            mode: a.mode,
            uid: a.uid,
            gid: a.gid,
            nlink: a.nlink,
            size: a.size,
            atime: a.atime.into(),
            mtime: a.mtime.into(),
            ctime: a.ctime.into(),
            rdev: a.rdev,
            flags: 0,
        }
    }
}

/// An inode as stored: the wire [`Inode`] without what lives in tables of
/// its own (stale-copy records, a cached object's home link).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct StoredInode {
    id: FileId,
    gen: u32,
    parent: FileId,
    attr: StoredAttr,
    target: Option<Vec<u8>>,
}

/// An inode whose data was measured (store format 4): [`StoredInode`]'s
/// fields, then the bytes its data takes on disk. A record without a
/// measure keeps the older layout, so the two never read as each other:
/// each decodes only if it uses every byte of the record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct MeasuredInode {
    id: FileId,
    gen: u32,
    parent: FileId,
    attr: StoredAttr,
    target: Option<Vec<u8>>,
    alloc: u64,
}

/// An inode with `chattr` flags (store format 5): [`StoredInode`]'s
/// fields, its measure if it has one, then the flags (never 0: an inode
/// without flags keeps an older layout). Neither older layout decodes
/// whole as this one, nor this one as them: after the common fields,
/// [`StoredInode`] has nothing, [`MeasuredInode`] one varint (whose first
/// byte, read as this one's option tag, is either invalid or leaves the
/// flags missing), and this one an option and a varint that is not 0.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct FlaggedInode {
    id: FileId,
    gen: u32,
    parent: FileId,
    attr: StoredAttr,
    target: Option<Vec<u8>>,
    alloc: Option<u64>,
    flags: u32,
}

fn corrupt(id: FileId, e: impl std::fmt::Display) -> WireError {
    WireError::new(
        ErrorCode::Io,
        format!("inode {id} is corrupt in the store: {e}"),
    )
}

/// The `data` column for inode `ino`.
pub(super) fn encode_inode(ino: &Inode) -> Result<Vec<u8>, WireError> {
    let attr = StoredAttr::from(&ino.attr);
    let target = ino.target.clone();
    let (id, gen, parent) = (ino.id, ino.gen, ino.parent);
    if ino.attr.flags != 0 {
        return postcard::to_stdvec(&FlaggedInode {
            id,
            gen,
            parent,
            attr,
            target,
            alloc: ino.alloc,
            flags: ino.attr.flags,
        })
        .map_err(|e| corrupt(ino.id, e));
    }
    match ino.alloc {
        None => postcard::to_stdvec(&StoredInode {
            id,
            gen,
            parent,
            attr,
            target,
        }),
        Some(alloc) => postcard::to_stdvec(&MeasuredInode {
            id,
            gen,
            parent,
            attr,
            target,
            alloc,
        }),
    }
    .map_err(|e| corrupt(ino.id, e))
}

/// `T` from all of `data`, or why not.
fn whole<'a, T: Deserialize<'a>>(data: &'a [u8]) -> Result<T, String> {
    match postcard::take_from_bytes::<T>(data) {
        Ok((v, [])) => Ok(v),
        Ok((_, rest)) => Err(format!("{} bytes left over", rest.len())),
        Err(e) => Err(e.to_string()),
    }
}

/// What an inode record counts against its owner and group: `(uid, gid,
/// bytes)`, the bytes being what a regular file takes on the servers'
/// disks (its measure, or its size in 4 KiB pages); other kinds count 0.
/// `None` for a record that does not decode.
pub(super) fn account(data: &[u8]) -> Option<(u32, u32, u64)> {
    let id = postcard::take_from_bytes::<FileId>(data).ok()?.0;
    let i = decode_inode(id, data).ok()?;
    let bytes = match i.attr.kind {
        FileKind::File => i.alloc.unwrap_or_else(|| {
            i.attr
                .size
                .checked_next_multiple_of(4096)
                .unwrap_or(u64::MAX)
        }),
        _ => 0,
    };
    Some((i.attr.uid, i.attr.gid, bytes))
}

/// Decodes the `data` column of inode `id` (its `stale` list empty and no
/// home link: the callers fill them from their tables).
pub(super) fn decode_inode(id: FileId, data: &[u8]) -> Result<Inode, WireError> {
    let (s, alloc, flags) = if let Ok(m) = whole::<MeasuredInode>(data) {
        let s = StoredInode {
            id: m.id,
            gen: m.gen,
            parent: m.parent,
            attr: m.attr,
            target: m.target,
        };
        (s, Some(m.alloc), 0)
    } else if let Ok(f) = whole::<FlaggedInode>(data).and_then(|f| {
        if f.flags == 0 {
            Err("a flagged record without flags".to_string())
        } else {
            Ok(f)
        }
    }) {
        let s = StoredInode {
            id: f.id,
            gen: f.gen,
            parent: f.parent,
            attr: f.attr,
            target: f.target,
        };
        (s, f.alloc, f.flags)
    } else {
        (
            whole::<StoredInode>(data).map_err(|e| corrupt(id, e))?,
            None,
            0,
        )
    };
    if s.id != id {
        return Err(corrupt(id, format!("record names id {}", s.id)));
    }
    let mut attr = Attr::from(s.attr);
    attr.flags = flags;
    Ok(Inode {
        id: s.id,
        gen: s.gen,
        parent: s.parent,
        attr,
        target: s.target,
        stale: Vec::new(),
        home: None,
        alloc,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(secs: i64, nanos: u32) -> Timestamp {
        Timestamp { secs, nanos }
    }

    fn symlink() -> Inode {
        Inode {
            id: 300,
            gen: 7,
            parent: 1,
            attr: Attr {
                kind: FileKind::Symlink,
                mode: 0o777,
                uid: 1000,
                gid: 100,
                nlink: 1,
                size: 3,
                atime: t(1_577_934_245, 5),
                mtime: t(-2, 999_999_999),
                ctime: t(0, 0),
                rdev: 0,
                flags: 0,
            },
            target: Some(b"d/f".to_vec()),
            stale: Vec::new(),
            home: None,
            alloc: None,
        }
    }

    /// The bytes format 1 and 2 stores hold for [`symlink`]: postcard,
    /// varints, fields in order. Written down once; must never change.
    const GOLDEN: &[u8] = &[
        0xac, 0x02, // id 300
        0x07, // gen
        0x01, // parent
        0x02, // kind: Symlink
        0xff, 0x03, // mode 0o777
        0xe8, 0x07, // uid 1000
        0x64, // gid 100
        0x01, // nlink
        0x03, // size
        0xca, 0xf6, 0xea, 0xe0, 0x0b, 0x05, // atime (zigzag secs, nanos)
        0x03, 0xff, 0x93, 0xeb, 0xdc, 0x03, // mtime -2 s + 999,999,999 ns
        0x00, 0x00, // ctime
        0x00, // rdev
        0x01, 0x03, b'd', b'/', b'f', // target: Some, 3 bytes
    ];

    #[test]
    fn an_inode_is_stored_in_the_layout_stores_already_hold() {
        assert_eq!(encode_inode(&symlink()).unwrap(), GOLDEN);
        assert_eq!(decode_inode(300, GOLDEN).unwrap(), symlink());
    }

    #[test]
    fn every_kind_keeps_its_stored_number() {
        let kinds = [
            FileKind::File,
            FileKind::Dir,
            FileKind::Symlink,
            FileKind::Fifo,
            FileKind::Socket,
            FileKind::CharDev,
            FileKind::BlockDev,
        ];
        for (n, k) in kinds.into_iter().enumerate() {
            let mut i = symlink();
            i.attr.kind = k;
            assert_eq!(encode_inode(&i).unwrap()[4], n as u8, "{k:?}");
            assert_eq!(FileKind::from(StoredKind::from(k)), k);
        }
    }

    #[test]
    fn a_record_of_another_id_or_cut_short_is_an_error_not_a_panic() {
        let e = decode_inode(301, GOLDEN).unwrap_err();
        assert_eq!(e.code, ErrorCode::Io);
        for n in 0..GOLDEN.len() {
            assert!(decode_inode(300, &GOLDEN[..n]).is_err(), "{n} bytes");
        }
        let mut measured = symlink();
        measured.alloc = Some(1 << 40);
        let bytes = encode_inode(&measured).unwrap();
        // (Cut at the end of the older layout, it is that record: SQLite
        // keeps a value whole or not at all.)
        for n in (GOLDEN.len() + 1)..bytes.len() {
            assert!(decode_inode(300, &bytes[..n]).is_err(), "{n} bytes");
        }
    }

    /// Format 4: a measured file's record is the older layout and then the
    /// measure; an unmeasured one is still the older layout, byte for byte.
    #[test]
    fn a_measured_inode_is_the_older_record_and_its_measure() {
        let mut i = symlink();
        i.alloc = Some(300);
        let bytes = encode_inode(&i).unwrap();
        assert_eq!(&bytes[..GOLDEN.len()], GOLDEN);
        assert_eq!(&bytes[GOLDEN.len()..], &[0xac, 0x02]);
        assert_eq!(decode_inode(300, &bytes).unwrap(), i);
        i.alloc = Some(0);
        assert_eq!(decode_inode(300, &encode_inode(&i).unwrap()).unwrap(), i);
    }

    /// Format 5: an inode with flags is the older layout, its measure as an
    /// option, then the flags; without flags, nothing changes.
    #[test]
    fn a_flagged_inode_is_the_older_record_its_measure_and_its_flags() {
        let mut i = symlink();
        i.attr.flags = 0x30;
        let bytes = encode_inode(&i).unwrap();
        assert_eq!(&bytes[..GOLDEN.len()], GOLDEN);
        assert_eq!(&bytes[GOLDEN.len()..], &[0x00, 0x30]);
        assert_eq!(decode_inode(300, &bytes).unwrap(), i);
        for alloc in [
            None,
            Some(0),
            Some(1),
            Some(2),
            Some(127),
            Some(128),
            Some(1 << 40),
        ] {
            for flags in [0, 0x10, 0x20, 0x40, 0x80, 0xf0, 0x1_0000] {
                let mut i = symlink();
                i.alloc = alloc;
                i.attr.flags = flags;
                let bytes = encode_inode(&i).unwrap();
                assert_eq!(
                    decode_inode(300, &bytes).unwrap(),
                    i,
                    "{alloc:?} {flags:#x}"
                );
                if flags == 0 {
                    assert!(whole::<FlaggedInode>(&bytes).is_err(), "{alloc:?}");
                } else {
                    assert!(
                        whole::<MeasuredInode>(&bytes).is_err(),
                        "{alloc:?} {flags:#x}"
                    );
                    assert!(
                        whole::<StoredInode>(&bytes).is_err(),
                        "{alloc:?} {flags:#x}"
                    );
                }
            }
        }
    }
}

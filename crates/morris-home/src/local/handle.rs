//! The handles of a local home.
//!
//! A handle is the object's inode number (8 bytes, little endian), its birth
//! time (seconds, 8 bytes, and nanoseconds, 4 bytes, little endian; zeros
//! where the file system keeps none) and its path below the root (bytes, no
//! leading '/', empty for the root).
//!
//! The path finds the object again; the inode number and the birth time
//! tell whether what the path finds is still the same object. The birth
//! time is there because ext4 and others hand a freed inode number to the
//! next file created: a file removed and created again under its name
//! usually gets the very inode number it had (NFS servers put the inode's
//! generation in their handles for the same reason, but a generation can
//! only be read from an open file, and opening is what a handle check must
//! not do to a fifo or a device).

use rustix::fs::Statx;

use crate::HomeHandle;

/// Bytes before the path: inode number, birth seconds, birth nanoseconds.
const HEAD: usize = 8 + 8 + 4;

/// Longest path a handle may carry (Linux's PATH_MAX).
const MAX_PATH: usize = 4096;

/// The bytes of a handle that name the object wherever it is found: its
/// inode number and birth time (the path differs between hard links).
pub(crate) fn identity(h: &HomeHandle) -> &[u8] {
    &h.0[..h.0.len().min(HEAD)]
}

/// A decoded handle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Decoded {
    pub ino: u64,
    /// Birth time (seconds, nanoseconds); `None` when the file system keeps
    /// none.
    pub birth: Option<(i64, u32)>,
    /// Path below the root: components joined by '/', none empty, `.` or
    /// `..`; empty for the root.
    pub path: Vec<u8>,
}

/// The birth time statx reported, if it did.
pub(crate) fn birth(stx: &Statx) -> Option<(i64, u32)> {
    if stx.stx_mask & rustix::fs::StatxFlags::BTIME.bits() != 0 {
        Some((stx.stx_btime.tv_sec, stx.stx_btime.tv_nsec))
    } else {
        None
    }
}

impl Decoded {
    /// The handle of the object `stx` describes, found at `path`.
    pub(crate) fn of(stx: &Statx, path: Vec<u8>) -> Self {
        Decoded {
            ino: stx.stx_ino,
            birth: birth(stx),
            path,
        }
    }

    /// Whether `stx` describes the object this handle names.
    pub(crate) fn is(&self, stx: &Statx) -> bool {
        if stx.stx_ino != self.ino {
            return false;
        }
        match (self.birth, birth(stx)) {
            (Some(a), Some(b)) => a == b,
            // The handle was made where no birth time was reported (or the
            // file system stopped reporting it): the inode number decides.
            _ => true,
        }
    }

    /// The path of `name` in the directory this handle names.
    pub(crate) fn child_path(&self, name: &[u8]) -> Vec<u8> {
        let mut p = Vec::with_capacity(self.path.len() + 1 + name.len());
        p.extend_from_slice(&self.path);
        if !p.is_empty() {
            p.push(b'/');
        }
        p.extend_from_slice(name);
        p
    }

    /// The opaque handle.
    pub(crate) fn encode(&self) -> HomeHandle {
        let mut b = Vec::with_capacity(HEAD + self.path.len());
        b.extend_from_slice(&self.ino.to_le_bytes());
        let (s, ns) = self.birth.unwrap_or((0, 0));
        b.extend_from_slice(&s.to_le_bytes());
        b.extend_from_slice(&ns.to_le_bytes());
        b.extend_from_slice(&self.path);
        HomeHandle(b)
    }

    /// Decodes `h`; `None` when it is not a handle of a local home.
    pub(crate) fn decode(h: &HomeHandle) -> Option<Self> {
        let b = &h.0;
        if b.len() < HEAD || b.len() > HEAD + MAX_PATH {
            return None;
        }
        let ino = u64::from_le_bytes(b.get(0..8)?.try_into().ok()?);
        let s = i64::from_le_bytes(b.get(8..16)?.try_into().ok()?);
        let ns = u32::from_le_bytes(b.get(16..20)?.try_into().ok()?);
        let path = b.get(HEAD..)?.to_vec();
        if !path.is_empty() && !path.split(|&c| c == b'/').all(valid_name) {
            return None;
        }
        if ns >= 1_000_000_000 {
            return None;
        }
        let birth = (s != 0 || ns != 0).then_some((s, ns));
        Some(Decoded { ino, birth, path })
    }
}

/// Whether `name` can be one entry of a directory: not empty, not `.` or
/// `..`, no '/' and no NUL.
pub(crate) fn valid_name(name: &[u8]) -> bool {
    !name.is_empty() && name != b"." && name != b".." && !name.iter().any(|&c| c == b'/' || c == 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_round_trip_and_junk_is_refused() {
        for d in [
            Decoded {
                ino: 2,
                birth: None,
                path: vec![],
            },
            Decoded {
                ino: u64::MAX,
                birth: Some((-5, 999_999_999)),
                path: b"a b/\xff\xfe/c".to_vec(),
            },
        ] {
            assert_eq!(Decoded::decode(&d.encode()), Some(d.clone()));
        }
        let ok = Decoded {
            ino: 7,
            birth: Some((1, 2)),
            path: b"x".to_vec(),
        }
        .encode()
        .0;
        let with_path = |p: &[u8]| {
            let mut b = ok[..HEAD].to_vec();
            b.extend_from_slice(p);
            HomeHandle(b)
        };
        assert!(Decoded::decode(&HomeHandle(ok[..HEAD - 1].to_vec())).is_none());
        for bad in [
            &b"/x"[..],
            b"x/",
            b"a//b",
            b"..",
            b"a/../b",
            b"./a",
            b"a\0b",
        ] {
            assert!(Decoded::decode(&with_path(bad)).is_none(), "{bad:?}");
        }
        assert!(Decoded::decode(&with_path(&vec![b'a'; MAX_PATH + 1])).is_none());
    }

    #[test]
    fn names() {
        assert!(valid_name(b"a b"));
        assert!(valid_name(b"\xff"));
        assert!(valid_name(b"..."));
        for bad in [&b""[..], b".", b"..", b"a/b", b"a\0"] {
            assert!(!valid_name(bad), "{bad:?}");
        }
    }
}

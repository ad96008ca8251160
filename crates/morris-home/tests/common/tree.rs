//! The fixture home tree the conformance suite runs on.

use std::ffi::OsStr;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use rand::rngs::StdRng;
use rand::{RngCore, SeedableRng};

use super::{ok, show};

/// Entries of the big directory.
pub const MANY: usize = 5_000;

/// Owner and group of the chowned objects.
pub const OWNER: (u32, u32) = (1234, 5678);

/// The fixed access time of the timed objects.
pub const ATIME: (i64, u32) = (1_600_000_000, 123_456_789);
/// The fixed modification time of the timed objects.
pub const MTIME: (i64, u32) = (1_500_000_000, 987_654_321);

/// A regular file of the fixture: its size and where its data is (zeros
/// elsewhere).
#[derive(Debug, Clone)]
pub struct FileFix {
    /// Path below the root.
    pub path: Vec<u8>,
    /// Size in bytes.
    pub size: u64,
    /// Data extents: (offset, bytes); the rest reads as zeros.
    pub extents: Vec<(u64, Vec<u8>)>,
}

impl FileFix {
    /// The bytes of `[offset, offset + len)`, cut at the end of the file.
    pub fn bytes(&self, offset: u64, len: u64) -> Vec<u8> {
        let end = offset.saturating_add(len).min(self.size);
        if offset >= end {
            return Vec::new();
        }
        let mut out = vec![0u8; (end - offset) as usize];
        for (at, data) in &self.extents {
            let (s, e) = (*at, at + data.len() as u64);
            let (from, to) = (s.max(offset), e.min(end));
            if from < to {
                out[(from - offset) as usize..(to - offset) as usize]
                    .copy_from_slice(&data[(from - s) as usize..(to - s) as usize]);
            }
        }
        out
    }
}

/// What [`build_tree`] laid where (paths are below the root, as bytes).
#[derive(Debug, Clone)]
pub struct Tree {
    /// The fixture's root directory.
    pub root: PathBuf,
    /// Every object below the root, parents before children.
    pub all: Vec<Vec<u8>>,
    /// Every directory, the root (empty path) first.
    pub dirs: Vec<Vec<u8>>,
    /// The regular files and their contents.
    pub files: Vec<FileFix>,
    /// Symbolic links and their targets.
    pub symlinks: Vec<(Vec<u8>, Vec<u8>)>,
    /// Two names of one file.
    pub hard_links: (Vec<u8>, Vec<u8>),
    /// The sparse file.
    pub sparse: Vec<u8>,
    /// A named pipe.
    pub fifo: Vec<u8>,
    /// A character device (1, 3: /dev/null's numbers).
    pub chardev: Vec<u8>,
    /// The directory with [`MANY`] entries.
    pub many: Vec<u8>,
    /// A directory the suite may change (and empties again).
    pub scratch: Vec<u8>,
    /// Objects chowned to [`OWNER`].
    pub owned: Vec<Vec<u8>>,
    /// Objects with [`ATIME`] and [`MTIME`].
    pub timed: Vec<Vec<u8>>,
}

impl Tree {
    /// The fixture path of `rel`.
    pub fn path(&self, rel: &[u8]) -> PathBuf {
        if rel.is_empty() {
            self.root.clone()
        } else {
            self.root.join(OsStr::from_bytes(rel))
        }
    }

    /// `lstat` of `rel` in the fixture.
    pub fn lstat(&self, rel: &[u8]) -> fs::Metadata {
        let p = self.path(rel);
        fs::symlink_metadata(&p).unwrap_or_else(|e| panic!("lstat {}: {e}", p.display()))
    }

    pub(super) fn file(&self, rel: &[u8]) -> &FileFix {
        match self.files.iter().find(|f| f.path == rel) {
            Some(f) => f,
            None => panic!("no fixture file {}", show(rel)),
        }
    }
}

fn random(rng: &mut StdRng, n: usize) -> Vec<u8> {
    let mut v = vec![0u8; n];
    rng.fill_bytes(&mut v);
    v
}

/// Lays the fixture tree in `root` (an empty directory). Needs root:
/// it makes a device node and chowns; it fails rather than skip either.
pub fn build_tree(root: &Path) -> Tree {
    let mut rng = StdRng::seed_from_u64(0x4d6f_7272_6973);
    let mut t = Tree {
        root: root.to_path_buf(),
        all: Vec::new(),
        dirs: vec![Vec::new()],
        files: Vec::new(),
        symlinks: Vec::new(),
        hard_links: (b"link-a".to_vec(), b"link-b".to_vec()),
        sparse: b"sparse".to_vec(),
        fifo: b"fifo".to_vec(),
        chardev: b"chardev".to_vec(),
        many: b"many".to_vec(),
        scratch: b"scratch".to_vec(),
        owned: Vec::new(),
        timed: Vec::new(),
    };
    let file = |t: &mut Tree, rel: &[u8], extents: Vec<(u64, Vec<u8>)>, size: u64, mode| {
        let p = t.path(rel);
        let mut f = ok(fs::File::create(&p), p.display());
        for (at, data) in &extents {
            ok(
                std::os::unix::fs::FileExt::write_all_at(&f, data, *at),
                p.display(),
            );
        }
        ok(f.set_len(size), p.display());
        ok(std::io::Write::flush(&mut f), p.display());
        ok(
            fs::set_permissions(&p, fs::Permissions::from_mode(mode)),
            p.display(),
        );
        t.all.push(rel.to_vec());
        t.files.push(FileFix {
            path: rel.to_vec(),
            size,
            extents,
        });
    };
    let dir = |t: &mut Tree, rel: &[u8], mode| {
        let p = t.path(rel);
        ok(fs::create_dir(&p), p.display());
        ok(
            fs::set_permissions(&p, fs::Permissions::from_mode(mode)),
            p.display(),
        );
        t.all.push(rel.to_vec());
        t.dirs.push(rel.to_vec());
    };

    file(&mut t, b"empty", vec![], 0, 0o600);
    let d = random(&mut rng, 1);
    file(&mut t, b"one", vec![(0, d)], 1, 0o644);
    let d = random(&mut rng, 4095);
    file(&mut t, b"page-1", vec![(0, d)], 4095, 0o644);
    let d = random(&mut rng, (1 << 20) + 7);
    file(&mut t, b"mib+7", vec![(0, d)], (1 << 20) + 7, 0o755);
    let d = random(&mut rng, 3 << 20);
    file(&mut t, b"three-mib", vec![(0, d)], 3 << 20, 0o644);
    let (a, b) = (random(&mut rng, 4096), random(&mut rng, 4096));
    file(
        &mut t,
        b"sparse",
        vec![(0, a), (40 << 20, b)],
        64 << 20,
        0o644,
    );
    let d = random(&mut rng, 100);
    file(&mut t, b"setuid", vec![(0, d)], 100, 0o4755);
    let d = random(&mut rng, 77);
    file(&mut t, b"owned", vec![(0, d)], 77, 0o640);
    let d = random(&mut rng, 33);
    file(&mut t, b"timed", vec![(0, d)], 33, 0o644);
    let d = random(&mut rng, 10);
    file(&mut t, b"link-a", vec![(0, d.clone())], 10, 0o644);
    ok(
        fs::hard_link(t.path(b"link-a"), t.path(b"link-b")),
        "hard link",
    );
    t.all.push(b"link-b".to_vec());
    t.files.push(FileFix {
        path: b"link-b".to_vec(),
        size: 10,
        extents: vec![(0, d)],
    });

    let abs = t.path(b"one").as_os_str().as_bytes().to_vec();
    for (name, target) in [
        (&b"sym-rel"[..], b"a/b/../b/c".to_vec()),
        (b"sym-abs", abs),
        (b"sym-dangling", b"no/such/target".to_vec()),
    ] {
        ok(
            std::os::unix::fs::symlink(OsStr::from_bytes(&target), t.path(name)),
            "symlink",
        );
        t.all.push(name.to_vec());
        t.symlinks.push((name.to_vec(), target));
    }

    let fifo = t.path(b"fifo");
    ok(
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &fifo,
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o644),
            0,
        ),
        "mkfifo (the suite must run as root)",
    );
    t.all.push(b"fifo".to_vec());
    let dev = t.path(b"chardev");
    ok(
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &dev,
            rustix::fs::FileType::CharacterDevice,
            rustix::fs::Mode::from_raw_mode(0o600),
            rustix::fs::makedev(1, 3),
        ),
        "mknod of a character device (the suite must run as root)",
    );
    t.all.push(b"chardev".to_vec());

    dir(&mut t, b"sticky", 0o1777);
    dir(&mut t, b"a", 0o755);
    dir(&mut t, b"a/b", 0o700);
    dir(&mut t, b"a/b/c", 0o755);
    dir(&mut t, b"a/b/c/d", 0o755);
    let d = random(&mut rng, 5000);
    file(&mut t, b"a/b/c/d/deep", vec![(0, d)], 5000, 0o644);

    dir(&mut t, b"many", 0o755);
    for i in 0..MANY {
        let rel = format!("many/entry-{i:05}").into_bytes();
        let p = t.path(&rel);
        if i % 10 == 0 {
            ok(fs::create_dir(&p), p.display());
            // A few of them are listed (empty) too.
            if i < 30 {
                t.dirs.push(rel.clone());
            }
        } else {
            ok(fs::File::create(&p), p.display());
        }
        t.all.push(rel);
    }

    dir(&mut t, b"names", 0o755);
    for name in [
        &b"names/with space"[..],
        "names/ütf-8 ✓ 名前".as_bytes(),
        b"names/not utf-8 \xff\xfe",
        b"names/ leading and trailing ",
    ] {
        let d = random(&mut rng, 12);
        file(&mut t, name, vec![(0, d)], 12, 0o644);
    }
    dir(&mut t, b"names/dir with space", 0o755);
    dir(&mut t, b"scratch", 0o755);

    for rel in [&b"owned"[..], b"a/b", b"sym-rel"] {
        ok(
            std::os::unix::fs::lchown(t.path(rel), Some(OWNER.0), Some(OWNER.1)),
            "chown (the suite must run as root)",
        );
        t.owned.push(rel.to_vec());
    }
    // chown clears set-uid: set it again.
    ok(
        fs::set_permissions(t.path(b"setuid"), fs::Permissions::from_mode(0o4755)),
        "chmod 04755",
    );
    // Times last: making children changes a directory's mtime.
    for rel in [&b"timed"[..], b"a", b"sym-abs", b"three-mib"] {
        let ts = rustix::fs::Timestamps {
            last_access: rustix::fs::Timespec {
                tv_sec: ATIME.0,
                tv_nsec: ATIME.1.into(),
            },
            last_modification: rustix::fs::Timespec {
                tv_sec: MTIME.0,
                tv_nsec: MTIME.1.into(),
            },
        };
        ok(
            rustix::fs::utimensat(
                rustix::fs::CWD,
                t.path(rel),
                &ts,
                rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
            ),
            "utimensat",
        );
        t.timed.push(rel.to_vec());
    }
    t
}

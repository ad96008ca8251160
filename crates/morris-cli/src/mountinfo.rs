//! What is mounted where, from `/proc/self/mountinfo`, and absolute paths that
//! never touch the mount point itself (a dead FUSE mount fails every stat).

use std::io;
use std::path::{Component, Path, PathBuf};

/// One line of `/proc/self/mountinfo`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountEntry {
    /// Where it is mounted.
    pub mount_point: PathBuf,
    /// File system type (`fuse`, `fuse.morris`, `ext4`, ...).
    pub fs_type: String,
    /// The mount source (for FUSE: the `fsname`).
    pub source: String,
}

impl MountEntry {
    /// True for FUSE mounts.
    pub fn is_fuse(&self) -> bool {
        self.fs_type == "fuse" || self.fs_type.starts_with("fuse.")
    }
}

/// Undoes the kernel's octal escapes (`\040` for a space, ...).
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Parses the text of a mountinfo file; malformed lines are skipped.
pub fn parse(text: &str) -> Vec<MountEntry> {
    let mut out = Vec::new();
    for line in text.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        let Some(sep) = fields.iter().position(|f| *f == "-") else {
            continue;
        };
        if sep < 6 || fields.len() < sep + 3 {
            continue;
        }
        out.push(MountEntry {
            mount_point: PathBuf::from(unescape(fields[4])),
            fs_type: fields[sep + 1].to_string(),
            source: unescape(fields[sep + 2]),
        });
    }
    out
}

/// The mount at exactly `path` (the last one, if stacked), if any.
pub fn find(path: &Path) -> io::Result<Option<MountEntry>> {
    let text = std::fs::read_to_string("/proc/self/mountinfo")?;
    Ok(parse(&text)
        .into_iter()
        .rev()
        .find(|m| m.mount_point == path))
}

/// Makes `p` absolute and free of `.`/`..`, resolving symlinks in its parent
/// directories but never stat-ing `p` itself.
pub fn absolute(p: &Path) -> io::Result<PathBuf> {
    let joined = if p.is_absolute() {
        p.to_path_buf()
    } else {
        std::env::current_dir()?.join(p)
    };
    let mut lexical = PathBuf::new();
    for c in joined.components() {
        match c {
            Component::ParentDir => {
                lexical.pop();
            }
            Component::CurDir => {}
            other => lexical.push(other),
        }
    }
    match (lexical.parent(), lexical.file_name()) {
        (Some(parent), Some(name)) => match parent.canonicalize() {
            Ok(parent) => Ok(parent.join(name)),
            Err(_) => Ok(lexical),
        },
        _ => Ok(lexical),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
40 22 0:35 / /tmp/my\\040mnt rw,nosuid,nodev,relatime shared:20 - fuse.morris morris rw,user_id=0,group_id=0
41 22 0:36 / /mnt/x rw - fuse morris@127.0.0.1:7700 rw
garbage line
";

    #[test]
    fn parses_mountinfo() {
        let m = parse(SAMPLE);
        assert_eq!(m.len(), 3);
        assert_eq!(m[0].mount_point, PathBuf::from("/"));
        assert!(!m[0].is_fuse());
        assert_eq!(m[1].mount_point, PathBuf::from("/tmp/my mnt"));
        assert_eq!(m[1].fs_type, "fuse.morris");
        assert!(m[1].is_fuse());
        assert_eq!(m[2].source, "morris@127.0.0.1:7700");
        assert!(m[2].is_fuse());
    }

    #[test]
    fn unescapes() {
        assert_eq!(unescape("a\\040b\\011c"), "a b\tc");
        assert_eq!(unescape("trailing\\04"), "trailing\\04");
        assert_eq!(unescape("\\\\x"), "\\\\x");
    }

    #[test]
    fn absolute_paths() {
        let cwd = std::env::current_dir().unwrap().canonicalize().unwrap();
        assert_eq!(absolute(Path::new("x")).unwrap(), cwd.join("x"));
        assert_eq!(
            absolute(Path::new("/no/such/dir/../y")).unwrap(),
            PathBuf::from("/no/such/y")
        );
        assert_eq!(absolute(Path::new("/")).unwrap(), PathBuf::from("/"));
    }

    #[test]
    fn root_is_mounted() {
        assert!(find(Path::new("/")).unwrap().is_some());
    }
}

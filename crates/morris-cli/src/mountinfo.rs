//! What is mounted where, from `/proc/self/mountinfo`, and absolute paths that
//! never touch the mount point itself (a dead FUSE mount fails every stat).

use std::io;
use std::path::{Component, Path, PathBuf};

pub use morris_fuse::mountinfo::{parse, MountEntry};

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

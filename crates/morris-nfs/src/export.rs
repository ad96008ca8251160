//! The gateway's exports: `/` and a named one (`--export`, default
//! `/morris`), both the volume's root.
//!
//! libnfs mounts the part of an `nfs://host/PATH/FILE` URL before its last
//! `/` (the export path `""` for `nfs://host/FILE`, which libnfs itself then
//! refuses), so a named export gives files in the volume's root the URL
//! `nfs://host/morris/FILE`. A MOUNT path names a directory of the volume:
//! below the named export if its first components are the export's, else
//! below `/` (`""` is `/`). A volume directory at the export's path is
//! therefore reachable by MOUNT only below the export
//! (`/morris/morris/...`); LOOKUP still finds it.

use std::str::FromStr;

use morris_client::{Client, ROOT_ID};

/// Longest MOUNT path (RFC 1813 `MNTPATHLEN`).
const MNTPATHLEN: usize = 1024;

/// The name of the named export: one or more path components, written with
/// or without the leading `/` (`morris`, `/srv/morris`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportName {
    components: Vec<String>,
}

/// A malformed `--export` name.
#[derive(Debug, thiserror::Error)]
#[error(
    "invalid export name {0:?}: expected NAME or /NAME[/NAME...] (no empty, `.` or `..` components; `/` is always exported)"
)]
pub struct ExportNameError(String);

impl FromStr for ExportName {
    type Err = ExportNameError;

    fn from_str(s: &str) -> Result<Self, ExportNameError> {
        let bad = || ExportNameError(s.to_string());
        let rest = s.strip_prefix('/').unwrap_or(s);
        if rest.is_empty() || s.len() > MNTPATHLEN || s.contains('\0') {
            return Err(bad());
        }
        let components: Vec<String> = rest.split('/').map(str::to_string).collect();
        if components
            .iter()
            .any(|c| c.is_empty() || c == "." || c == "..")
        {
            return Err(bad());
        }
        Ok(ExportName { components })
    }
}

impl std::fmt::Display for ExportName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for c in &self.components {
            write!(f, "/{c}")?;
        }
        Ok(())
    }
}

impl Default for ExportName {
    /// `/morris`.
    fn default() -> Self {
        ExportName {
            components: vec!["morris".to_string()],
        }
    }
}

impl ExportName {
    /// The path's components, from the top.
    pub(crate) fn components(&self) -> impl Iterator<Item = &[u8]> {
        self.components.iter().map(String::as_bytes)
    }

    /// The components of the volume path that the MOUNT path `path` names,
    /// and whether it named the export (else it is below `/`).
    pub(crate) fn volume_path<'a>(&self, path: &'a [u8]) -> (Vec<&'a [u8]>, bool) {
        let comps: Vec<&[u8]> = path
            .split(|b| *b == b'/')
            .filter(|c| !c.is_empty())
            .collect();
        let named = comps.len() >= self.components.len()
            && self
                .components
                .iter()
                .zip(&comps)
                .all(|(e, c)| e.as_bytes() == *c);
        if named {
            (comps[self.components.len()..].to_vec(), true)
        } else {
            (comps, false)
        }
    }
}

/// Warns when the volume has an entry at the export's path: MOUNT paths
/// starting with the export's name name the export, so that entry is
/// reachable by MOUNT only below it, and libnfs clients that mount `/` (and
/// follow the exports nested in it) see the export there instead.
pub(crate) async fn warn_if_shadowed(client: &Client, export: &ExportName) {
    let mut dir = ROOT_ID;
    for c in export.components() {
        match client.lookup(dir, c).await {
            Ok(i) => dir = i.id,
            Err(_) => return,
        }
    }
    tracing::warn!(
        %export,
        "the volume has an entry at the export's path, which MOUNT and libnfs take for the export (the volume's root): mount it as {export}{export}, or choose another --export"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse() {
        for (s, shown) in [
            ("morris", "/morris"),
            ("/morris", "/morris"),
            ("/srv/vol", "/srv/vol"),
            ("a.b", "/a.b"),
        ] {
            let e: ExportName = s.parse().unwrap();
            assert_eq!(e.to_string(), shown);
        }
        for bad in ["", "/", "//", "a//b", "a/", "/a/./b", "../a", "a\0b"] {
            assert!(bad.parse::<ExportName>().is_err(), "{bad:?}");
        }
        assert!("x".repeat(MNTPATHLEN + 1).parse::<ExportName>().is_err());
        assert_eq!(ExportName::default().to_string(), "/morris");
    }

    #[test]
    fn mount_paths_resolve() {
        let e = ExportName::default();
        fn v(p: &'static [u8]) -> (Vec<&'static [u8]>, bool) {
            ExportName::default().volume_path(p)
        }
        let none: Vec<&[u8]> = vec![];
        assert_eq!(v(b""), (none.clone(), false));
        assert_eq!(v(b"/"), (none.clone(), false));
        assert_eq!(v(b"/morris"), (none.clone(), true));
        assert_eq!(v(b"//morris/"), (none, true));
        assert_eq!(v(b"/morris/a/b"), (vec![&b"a"[..], b"b"], true));
        assert_eq!(v(b"/a/morris"), (vec![&b"a"[..], b"morris"], false));
        assert_eq!(v(b"/morrisx/a"), (vec![&b"morrisx"[..], b"a"], false));
        assert!(e.volume_path(b"/morris/x").1);
        let deep: ExportName = "/srv/vol".parse().unwrap();
        assert_eq!(deep.volume_path(b"/srv/vol/a"), (vec![&b"a"[..]], true));
        assert_eq!(
            deep.volume_path(b"/srv/a"),
            (vec![&b"srv"[..], b"a"], false)
        );
        assert_eq!(deep.volume_path(b"/srv"), (vec![&b"srv"[..]], false));
    }
}

//! Home URLs: `file:///path` and `nfs://host[:port]/export/path[?mountport=N]`.
//!
//! The NFS form follows libnfs's URL syntax (so the same URL works with
//! `nfs-ls`): `port` (or the query's `nfsport`) is the NFS port (default:
//! ask the portmapper on port 111, as libnfs does), `mountport` the MOUNT
//! port (default: ask the portmapper). The export is the path's first component unless the URL
//! says otherwise: `nfs://host/export/sub/dir` mounts `/export` and caches
//! `sub/dir` below it; `?export=/a/b` names an export with several
//! components.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Where a home is and how to reach it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum HomeUrl {
    /// A local directory (any mounted file system).
    Local {
        /// Absolute path of the directory.
        path: PathBuf,
    },
    /// An NFSv3 export.
    Nfs {
        /// Host name or address.
        host: String,
        /// NFS port; `None`: ask the portmapper.
        port: Option<u16>,
        /// MOUNT port; `None`: ask the portmapper.
        mount_port: Option<u16>,
        /// The exported path to mount (starts with `/`).
        export: String,
        /// The directory below the export that is the home (no leading `/`;
        /// empty: the export itself).
        subdir: String,
    },
}

/// A URL that is not a home URL.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bad home URL {url:?}: {why} (expected file:///PATH or nfs://HOST[:PORT]/EXPORT[/DIR][?mountport=N])")]
pub struct BadUrl {
    url: String,
    why: String,
}

fn bad(url: &str, why: impl Into<String>) -> BadUrl {
    BadUrl {
        url: url.to_string(),
        why: why.into(),
    }
}

impl FromStr for HomeUrl {
    type Err = BadUrl;

    fn from_str(s: &str) -> Result<Self, BadUrl> {
        if let Some(rest) = s.strip_prefix("file://") {
            if !rest.starts_with('/') {
                return Err(bad(s, "a file URL needs an absolute path (file:///...)"));
            }
            if rest.contains('?') || rest.contains('#') {
                return Err(bad(s, "a file URL takes no query"));
            }
            let path = PathBuf::from(rest);
            if path
                .components()
                .any(|c| matches!(c, std::path::Component::ParentDir))
            {
                return Err(bad(s, "the path may not contain .."));
            }
            return Ok(HomeUrl::Local { path });
        }
        let Some(rest) = s.strip_prefix("nfs://") else {
            return Err(bad(s, "unknown scheme"));
        };
        let (main, query) = match rest.split_once('?') {
            Some((m, q)) => (m, Some(q)),
            None => (rest, None),
        };
        let (authority, path) = match main.find('/') {
            Some(i) => (&main[..i], &main[i..]),
            None => (main, ""),
        };
        if authority.is_empty() {
            return Err(bad(s, "no host"));
        }
        let (host, mut port) = split_host_port(authority).map_err(|why| bad(s, why))?;
        let mut mount_port = None;
        let mut export_q = None;
        for kv in query.unwrap_or("").split('&').filter(|kv| !kv.is_empty()) {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            match k {
                "mountport" => {
                    mount_port = Some(
                        v.parse::<u16>()
                            .map_err(|_| bad(s, format!("mountport {v:?} is not a port")))?,
                    )
                }
                "nfsport" => {
                    let p = v
                        .parse::<u16>()
                        .map_err(|_| bad(s, format!("nfsport {v:?} is not a port")))?;
                    if port.is_some_and(|q| q != p) {
                        return Err(bad(s, "nfsport differs from the port after the host"));
                    }
                    port = Some(p);
                }
                "export" => export_q = Some(v.to_string()),
                // libnfs options that do not change what is read.
                "version" if v == "3" => {}
                "uid" | "gid" | "readahead" | "auto-traverse-mounts" => {}
                _ => return Err(bad(s, format!("unknown option {k:?}"))),
            }
        }
        let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
        if parts.contains(&"..") {
            return Err(bad(s, "the path may not contain .."));
        }
        let (export, subdir) = match export_q {
            Some(e) => {
                if !e.starts_with('/') {
                    return Err(bad(s, "export must start with /"));
                }
                let e_parts: Vec<&str> = e.split('/').filter(|p| !p.is_empty()).collect();
                if !parts.starts_with(&e_parts) {
                    return Err(bad(s, "the path does not start with the export"));
                }
                (
                    format!("/{}", e_parts.join("/")),
                    parts[e_parts.len()..].join("/"),
                )
            }
            None => match parts.split_first() {
                Some((first, rest)) => (format!("/{first}"), rest.join("/")),
                None => return Err(bad(s, "no export path")),
            },
        };
        Ok(HomeUrl::Nfs {
            host,
            port,
            mount_port,
            export,
            subdir,
        })
    }
}

fn split_host_port(a: &str) -> Result<(String, Option<u16>), String> {
    if let Some(rest) = a.strip_prefix('[') {
        let Some((h, after)) = rest.split_once(']') else {
            return Err("unclosed [ in host".into());
        };
        let port = match after.strip_prefix(':') {
            Some(p) => Some(p.parse::<u16>().map_err(|_| format!("port {p:?}"))?),
            None if after.is_empty() => None,
            None => return Err("junk after ]".into()),
        };
        return Ok((h.to_string(), port));
    }
    match a.rsplit_once(':') {
        Some((h, p)) if !h.contains(':') => Ok((
            h.to_string(),
            Some(
                p.parse::<u16>()
                    .map_err(|_| format!("port {p:?} is not a port"))?,
            ),
        )),
        _ => Ok((a.to_string(), None)),
    }
}

impl fmt::Display for HomeUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HomeUrl::Local { path } => write!(f, "file://{}", path.display()),
            HomeUrl::Nfs {
                host,
                port,
                mount_port,
                export,
                subdir,
            } => {
                if host.contains(':') {
                    write!(f, "nfs://[{host}]")?;
                } else {
                    write!(f, "nfs://{host}")?;
                }
                if let Some(p) = port {
                    write!(f, ":{p}")?;
                }
                write!(f, "{export}")?;
                if !subdir.is_empty() {
                    write!(f, "/{subdir}")?;
                }
                let mut sep = '?';
                if let Some(m) = mount_port {
                    write!(f, "{sep}mountport={m}")?;
                    sep = '&';
                }
                if export.matches('/').count() > 1 {
                    write!(f, "{sep}export={export}")?;
                }
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> HomeUrl {
        match s.parse() {
            Ok(u) => u,
            Err(e) => panic!("{s}: {e}"),
        }
    }

    #[test]
    fn file_urls() {
        assert_eq!(
            p("file:///srv/data"),
            HomeUrl::Local {
                path: "/srv/data".into()
            }
        );
        assert!("file://srv".parse::<HomeUrl>().is_err());
        assert!("file:///a/../b".parse::<HomeUrl>().is_err());
        assert!("http://x/y".parse::<HomeUrl>().is_err());
    }

    #[test]
    fn nfs_urls() {
        assert_eq!(
            p("nfs://10.0.0.1:2049/export/sub/dir?mountport=20048"),
            HomeUrl::Nfs {
                host: "10.0.0.1".into(),
                port: Some(2049),
                mount_port: Some(20048),
                export: "/export".into(),
                subdir: "sub/dir".into(),
            }
        );
        assert_eq!(
            p("nfs://filer/vol/a/b?export=/vol/a"),
            HomeUrl::Nfs {
                host: "filer".into(),
                port: None,
                mount_port: None,
                export: "/vol/a".into(),
                subdir: "b".into(),
            }
        );
        // As bench/lib/ganesha.py prints it.
        assert_eq!(
            p("nfs://127.0.0.1/export?version=3&nfsport=22049&mountport=22050"),
            HomeUrl::Nfs {
                host: "127.0.0.1".into(),
                port: Some(22049),
                mount_port: Some(22050),
                export: "/export".into(),
                subdir: "".into(),
            }
        );
        assert_eq!(
            p("nfs://[::1]:2050/e"),
            HomeUrl::Nfs {
                host: "::1".into(),
                port: Some(2050),
                mount_port: None,
                export: "/e".into(),
                subdir: "".into(),
            }
        );
        for bad in [
            "nfs://",
            "nfs://h",
            "nfs://h:x/e",
            "nfs://h/e?mountport=99999",
            "nfs://h/e?nfsport=x",
            "nfs://h:1/e?nfsport=2",
            "nfs://h/e?frob=1",
            "nfs://h/e/../x",
            "nfs://h/a/b?export=/c",
        ] {
            assert!(bad.parse::<HomeUrl>().is_err(), "{bad}");
        }
    }

    #[test]
    fn urls_print_as_they_parse() {
        for s in [
            "file:///srv/data",
            "nfs://10.0.0.1:2049/export/sub/dir?mountport=20048",
            "nfs://filer/vol/a/b?export=/vol/a",
            "nfs://[::1]:2050/e",
        ] {
            let u = p(s);
            assert_eq!(p(&u.to_string()), u, "{s}");
        }
    }
}

//! An NFSv3 export as home, reached from user space with `nfs3_client`.
//!
//! [`NfsHome::open`] finds the server's ports (from the URL, else from its
//! portmapper), mounts the export with MOUNT v3 as the caller's uid/gid
//! (AUTH_UNIX), looks the URL's directory up below it and asks FSINFO how
//! much one READ and one WRITE may carry. Requests then go over a pool of
//! up to [`HomeOptions::parallel`] TCP connections, each bounded in all by
//! [`HomeOptions::timeout`] (see [`conn::Pool::call`]). The write side is
//! in [`write`].

mod conn;
mod convert;
mod write;

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use nfs3_client::nfs3_types::mount::dirpath;
use nfs3_client::nfs3_types::nfs3::{
    cookieverf3, diropargs3, filename3, nfs_fh3, post_op_attr, post_op_fh3, FSINFO3args,
    GETATTR3args, LOOKUP3args, Nfs3Option, READ3args, READDIR3args, READDIRPLUS3args,
    READLINK3args,
};
use nfs3_client::nfs3_types::portmap::{IPPROTO_TCP, PMAP_PORT};
use nfs3_client::nfs3_types::xdr_codec::Opaque;
use nfs3_client::nfs3_types::{mount, nfs3};
use nfs3_client::{MountClient, MountError, PortmapError, PortmapperClient, RpcError};
use tokio::time::Instant;

use self::conn::{connect_conn, credential, io_text, rpc_error, Pool};
use self::convert::{
    attr, check_live, check_name, handle_from_wire, handle_to_wire, live_attr, mount_error,
};
use crate::{
    DirPage, Home, HomeAttr, HomeEntry, HomeError, HomeHandle, HomeKind, HomeNew, HomeOptions,
    HomeSetAttr, HomeUrl, ReadReply, Result,
};

/// Most bytes one READ asks for, whatever the server allows.
const MAX_READ: u32 = 1 << 20;

/// READ size when the server's FSINFO gives none.
const DEFAULT_READ: u32 = 32 << 10;

/// Most bytes one WRITE carries, whatever the server allows.
const MAX_WRITE: u32 = 1 << 20;

/// WRITE size when the server's FSINFO gives none.
const DEFAULT_WRITE: u32 = 32 << 10;

/// Bytes of a READDIR reply per entry asked for before any reply was
/// seen and for small pages (an entry is 24 bytes and its name, padded;
/// later requests use the size of the entries the server sent,
/// [`EntrySizes`]), and for the reply's header and the `.`/`..` entries.
const DIR_ENTRY_BYTES: usize = 64;
/// What READDIRPLUS adds per entry: attributes (4 + 84) and a handle
/// (4 + 4 + 64).
const PLUS_ENTRY_BYTES: usize = 160;
const DIR_HEADER_BYTES: usize = 512;
/// Pages of fewer entries than this ask for the room of the guesses
/// below whatever the entries seen took, and a sized page that fails is
/// asked again so: nfs-ganesha 6 answered `NFS3ERR_SERVERFAULT` to a
/// READDIR(PLUS) of 2 entries from a cookie in the middle of a listing
/// read in pages of 7 sized to their entries (`tests/nfs_home.rs`), and
/// not with pages of the old room (why is not known). A cached directory
/// is listed in pages of 256 or more, from the start.
const SIZED_PAGES: usize = 64;
/// Largest READDIR(PLUS) reply asked for.
const MAX_DIR_REPLY: usize = 1 << 20;

/// An NFSv3 export as home; see the module documentation.
#[derive(Debug)]
pub struct NfsHome {
    url: HomeUrl,
    pool: Pool,
    root: HomeHandle,
    max_read: u32,
    max_write: u32,
    /// Write verifiers of the writes not yet committed.
    verifiers: write::Verifiers,
    /// How big the listing entries this server sends are.
    entry_sizes: EntrySizes,
}

/// The mean size of the entries of the last READDIR and READDIRPLUS
/// replies, in bytes (0: none seen yet). A server fills a reply up to the
/// byte count asked for (nfs-ganesha does), and entries past the ones
/// asked for are thrown away and sent again in the next page; so the byte
/// count asked for follows what the entries really take (with 24-byte
/// handles and short names, a READDIRPLUS entry takes ~150 bytes; with
/// 224 bytes asked per entry, a third of every page was sent twice).
#[derive(Debug, Default)]
struct EntrySizes {
    plain: std::sync::atomic::AtomicUsize,
    plus: std::sync::atomic::AtomicUsize,
}

impl EntrySizes {
    /// Bytes to ask for `max` entries: `(count or dircount, maxcount)`,
    /// with room for the entries seen if `sized` (else as guessed).
    fn counts(&self, max: usize, plus: bool, sized: bool) -> (u32, u32) {
        use std::sync::atomic::Ordering::Relaxed;
        let or = |seen: usize, guess: usize| {
            if seen == 0 || !sized {
                guess
            } else {
                seen
            }
        };
        let plain = or(self.plain.load(Relaxed), DIR_ENTRY_BYTES);
        let whole = if plus {
            or(self.plus.load(Relaxed), DIR_ENTRY_BYTES + PLUS_ENTRY_BYTES)
        } else {
            plain
        };
        let bytes = |per: usize| (max * per + DIR_HEADER_BYTES).min(MAX_DIR_REPLY) as u32;
        (bytes(plain), bytes(whole))
    }

    /// Records the sizes of one reply's entries: `(directory part, whole
    /// entry)` each.
    fn saw(&self, sizes: impl Iterator<Item = (usize, usize)>, plus: bool) {
        use std::sync::atomic::Ordering::Relaxed;
        let (mut n, mut plain, mut whole) = (0, 0, 0);
        for (p, w) in sizes {
            n += 1;
            plain += p;
            whole += w;
        }
        if n == 0 {
            return;
        }
        self.plain.store(plain.div_ceil(n), Relaxed);
        if plus {
            self.plus.store(whole.div_ceil(n), Relaxed);
        }
    }
}

/// XDR bytes of a listing entry's fixed part (value-follows, fileid,
/// name length, cookie) and name.
fn dir_entry_bytes(name: &[u8]) -> usize {
    24 + name.len().div_ceil(4) * 4
}

/// AUTH_UNIX's flavor number, and AUTH_NULL's (both of which we can send).
const AUTH_UNIX: u32 = 1;
const AUTH_NULL: u32 = 0;

/// Waits for `fut` until `deadline`; `what` says what for, in the error.
async fn within<T>(
    deadline: Instant,
    timeout: Duration,
    what: &str,
    fut: impl std::future::Future<Output = Result<T>>,
) -> Result<T> {
    match tokio::time::timeout_at(deadline, fut).await {
        Ok(r) => r,
        Err(_) => Err(HomeError::Unreachable(format!(
            "{what}: no answer within {timeout:?}"
        ))),
    }
}

/// The home error for a failed RPC at open: unreachable if the connection
/// broke, else what the refusal means.
fn open_rpc_error(what: &str, e: &RpcError) -> HomeError {
    match e {
        RpcError::Io(io) => HomeError::Unreachable(format!("{what}: {}", io_text(io))),
        e => rpc_error(what, e),
    }
}

impl NfsHome {
    /// Mounts the export `url` names and finds the directory below it that
    /// is the home root. Errors: [`HomeError::Unreachable`] if the server
    /// cannot be reached (or does not answer within `options.timeout`),
    /// [`HomeError::NotFound`] for a missing export or directory,
    /// [`HomeError::Access`] if the server refuses us.
    pub async fn open(url: HomeUrl, options: HomeOptions) -> Result<Self> {
        let HomeUrl::Nfs {
            host,
            port,
            mount_port,
            export,
            subdir,
        } = &url
        else {
            return Err(HomeError::Invalid(format!("{url} is not an nfs:// URL")));
        };
        let timeout = options.timeout;
        let deadline = Instant::now() + timeout;
        let ip = within(deadline, timeout, "resolving the host", resolve(host)).await?;
        let (nfs_port, mnt_port) = match (*port, *mount_port) {
            (Some(p), Some(m)) => (p, m),
            (p, m) => {
                let what = format!(
                    "asking the portmapper at {}",
                    SocketAddr::new(ip, PMAP_PORT)
                );
                within(deadline, timeout, &what, portmap(ip, p, m)).await?
            }
        };
        let cred = credential(options.uid, options.gid);
        let mnt_addr = SocketAddr::new(ip, mnt_port);
        let what = format!("MOUNT {export} at {mnt_addr}");
        let root_fh = within(
            deadline,
            timeout,
            &what,
            mount(mnt_addr, export, cred.clone()),
        )
        .await?;
        let pool = Pool::new(
            SocketAddr::new(ip, nfs_port),
            cred,
            timeout,
            options.parallel,
        );
        // The first NFS connection, made here so that a server without NFS
        // on that port fails the open at once, and clearly.
        let addr = pool.addr();
        let first = within(deadline, timeout, &format!("connecting to {addr}"), async {
            connect_conn(addr).await.map_err(|e| {
                HomeError::Unreachable(format!("cannot reach {addr}: {}", io_text(&e)))
            })
        })
        .await?;
        pool.put(pool.client(first));
        let mut home = NfsHome {
            url: url.clone(),
            pool,
            root: root_fh,
            max_read: DEFAULT_READ,
            max_write: DEFAULT_WRITE,
            verifiers: write::Verifiers::default(),
            entry_sizes: EntrySizes::default(),
        };
        let mut root = home.root.clone();
        for comp in subdir.split('/').filter(|c| !c.is_empty()) {
            let (h, a) = home.lookup(&root, comp.as_bytes()).await?;
            if a.kind != HomeKind::Dir {
                return Err(HomeError::NotDir);
            }
            root = h;
        }
        home.root = root;
        let fsroot = handle_to_wire(&home.root)?;
        let info = home
            .pool
            .call("FSINFO", move |c| {
                let args = FSINFO3args {
                    fsroot: fsroot.clone(),
                };
                Box::pin(async move { c.fsinfo(&args).await })
            })
            .await?;
        home.max_read = match info.rtmax {
            0 => DEFAULT_READ,
            n => n.min(MAX_READ),
        };
        home.max_write = match info.wtmax {
            0 => DEFAULT_WRITE,
            n => n.min(MAX_WRITE),
        };
        tracing::debug!(url = %home.url, nfs = %addr, mount = %mnt_addr, rtmax = info.rtmax, max_read = home.max_read, wtmax = info.wtmax, max_write = home.max_write, "NFS home open");
        Ok(home)
    }

    /// GETATTR.
    async fn getattr_fh(&self, fh: nfs_fh3) -> Result<HomeAttr> {
        let ok = self
            .pool
            .call("GETATTR", move |c| {
                let args = GETATTR3args { object: fh.clone() };
                Box::pin(async move { c.getattr(&args).await })
            })
            .await?;
        live_attr(&ok.obj_attributes)
    }

    /// Attributes a reply carried, else GETATTR's.
    async fn attr_or_getattr(&self, a: post_op_attr, h: &HomeHandle) -> Result<HomeAttr> {
        match a {
            Nfs3Option::Some(a) => live_attr(&a),
            Nfs3Option::None => self.getattr_fh(handle_to_wire(h)?).await,
        }
    }

    /// One READDIR page from `cookie`: the entries but `.` and `..`, the
    /// verifier, eof, and the last cookie of the page as sent. `sized`:
    /// the room asked for follows the entries seen ([`EntrySizes`]).
    async fn readdir_page(
        &self,
        dir: &nfs_fh3,
        cookie: u64,
        verf: [u8; 8],
        (max, sized): (usize, bool),
    ) -> Result<(DirPage, Option<u64>)> {
        let (count, _) = self.entry_sizes.counts(max, false, sized);
        let dir = dir.clone();
        let ok = self
            .pool
            .call("READDIR", move |c| {
                let args = READDIR3args {
                    dir: dir.clone(),
                    cookie,
                    cookieverf: cookieverf3(verf),
                    count,
                };
                Box::pin(async move { c.readdir(&args).await })
            })
            .await?;
        let raw = ok.reply.entries.into_inner();
        let last = raw.last().map(|e| e.cookie);
        self.entry_sizes.saw(
            raw.iter().map(|e| {
                let b = dir_entry_bytes(e.name.as_ref());
                (b, b)
            }),
            false,
        );
        let entries = raw
            .into_iter()
            .filter(|e| !is_dot(e.name.as_ref()))
            .map(|e| HomeEntry {
                name: e.name.0.into_owned(),
                fileid: e.fileid,
                cookie: e.cookie,
                plus: None,
            })
            .collect();
        Ok((
            DirPage {
                entries,
                verifier: ok.cookieverf.0,
                eof: ok.reply.eof,
            },
            last,
        ))
    }

    /// One READDIRPLUS page, as [`NfsHome::readdir_page`].
    async fn readdirplus_page(
        &self,
        dir: &nfs_fh3,
        cookie: u64,
        verf: [u8; 8],
        (max, sized): (usize, bool),
    ) -> Result<(DirPage, Option<u64>)> {
        let (dircount, maxcount) = self.entry_sizes.counts(max, true, sized);
        let dir = dir.clone();
        let ok = self
            .pool
            .call("READDIRPLUS", move |c| {
                let args = READDIRPLUS3args {
                    dir: dir.clone(),
                    cookie,
                    cookieverf: cookieverf3(verf),
                    dircount,
                    maxcount,
                };
                Box::pin(async move { c.readdirplus(&args).await })
            })
            .await?;
        let raw = ok.reply.entries.into_inner();
        let last = raw.last().map(|e| e.cookie);
        self.entry_sizes.saw(
            raw.iter().map(|e| {
                let plain = dir_entry_bytes(e.name.as_ref());
                let attrs = match &e.name_attributes {
                    Nfs3Option::Some(_) => 4 + 84,
                    _ => 4,
                };
                let handle = match &e.name_handle {
                    post_op_fh3::Some(fh) => 8 + fh.data.len().div_ceil(4) * 4,
                    _ => 4,
                };
                (plain, plain + attrs + handle)
            }),
            true,
        );
        let mut entries = Vec::with_capacity(raw.len());
        for e in raw {
            if is_dot(e.name.as_ref()) {
                continue;
            }
            let plus = match (e.name_handle, e.name_attributes) {
                (post_op_fh3::Some(fh), Nfs3Option::Some(a)) => {
                    Some((handle_from_wire("READDIRPLUS", fh)?, attr(&a)))
                }
                _ => None,
            };
            entries.push(HomeEntry {
                name: e.name.0.into_owned(),
                fileid: e.fileid,
                cookie: e.cookie,
                plus,
            });
        }
        Ok((
            DirPage {
                entries,
                verifier: ok.cookieverf.0,
                eof: ok.reply.eof,
            },
            last,
        ))
    }
}

/// Whether two export paths are the same, trailing slashes aside.
fn same_path(a: &[u8], b: &str) -> bool {
    let trim = |p: &[u8]| -> Vec<u8> {
        let mut v = p.to_vec();
        while v.len() > 1 && v.last() == Some(&b'/') {
            v.pop();
        }
        v
    };
    trim(a) == trim(b.as_bytes())
}

fn is_dot(name: &[u8]) -> bool {
    name == b"." || name == b".."
}

/// The host's address (the first one it resolves to).
async fn resolve(host: &str) -> Result<IpAddr> {
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(ip);
    }
    let mut addrs = tokio::net::lookup_host((host, 0))
        .await
        .map_err(|e| HomeError::Unreachable(format!("cannot resolve {host}: {}", io_text(&e))))?;
    addrs
        .next()
        .map(|a| a.ip())
        .ok_or_else(|| HomeError::Unreachable(format!("{host} resolves to no address")))
}

/// The NFS and MOUNT ports (v3, TCP): those given, the others from the
/// portmapper on port 111.
async fn portmap(ip: IpAddr, nfs: Option<u16>, mnt: Option<u16>) -> Result<(u16, u16)> {
    let at = SocketAddr::new(ip, PMAP_PORT);
    let conn = connect_conn(at).await.map_err(|e| {
        HomeError::Unreachable(format!(
            "cannot reach the portmapper at {at}: {}",
            io_text(&e)
        ))
    })?;
    let mut pm = PortmapperClient::new(conn);
    let nfs = match nfs {
        Some(p) => p,
        None => getport(&mut pm, at, nfs3::PROGRAM, nfs3::VERSION, "NFS").await?,
    };
    let mnt = match mnt {
        Some(p) => p,
        None => getport(&mut pm, at, mount::PROGRAM, mount::VERSION, "MOUNT").await?,
    };
    Ok((nfs, mnt))
}

/// The TCP port the portmapper at `at` has for program `prog` version `vers`.
async fn getport(
    pm: &mut PortmapperClient<conn::Conn>,
    at: SocketAddr,
    prog: u32,
    vers: u32,
    name: &str,
) -> Result<u16> {
    pm.getport(prog, vers, IPPROTO_TCP)
        .await
        .map_err(|e| match e {
            PortmapError::ProgramUnavailable => HomeError::Unreachable(format!(
                "the portmapper at {at} knows no {name} v{vers} over TCP"
            )),
            PortmapError::Rpc(e) => open_rpc_error(&format!("portmapper at {at}"), &e),
            e => HomeError::Io(format!("portmapper at {at}: {e}")),
        })
}

/// MOUNT v3 of `export`: the export's root handle.
async fn mount(
    addr: SocketAddr,
    export: &str,
    cred: nfs3_client::nfs3_types::rpc::opaque_auth<'static>,
) -> Result<HomeHandle> {
    let conn = connect_conn(addr)
        .await
        .map_err(|e| HomeError::Unreachable(format!("cannot reach {addr}: {}", io_text(&e))))?;
    let mut mc = MountClient::new_with_auth(conn, cred, Default::default());
    let ok = mc
        .mnt(dirpath(Opaque::borrowed(export.as_bytes())))
        .await
        .map_err(|e| match e {
            MountError::Denied(s) => mount_error(export, s),
            MountError::Rpc(e) => open_rpc_error(&format!("MOUNT {export} at {addr}"), &e),
        });
    let ok = match ok {
        Ok(ok) => ok,
        // Some servers (ganesha) refuse an export they do not have: if the
        // export list lacks it, it is missing, not forbidden.
        Err(HomeError::Access) => {
            return Err(match mc.export().await {
                Ok(list)
                    if !list
                        .0
                        .iter()
                        .any(|e| same_path(e.ex_dir.0.as_ref(), export)) =>
                {
                    HomeError::NotFound
                }
                _ => HomeError::Access,
            })
        }
        Err(e) => return Err(e),
    };
    if !ok.auth_flavors.is_empty()
        && !ok
            .auth_flavors
            .iter()
            .any(|&f| f == AUTH_UNIX || f == AUTH_NULL)
    {
        tracing::warn!(export, flavors = ?ok.auth_flavors, "the export wants a security flavor other than AUTH_UNIX");
        return Err(HomeError::Access);
    }
    handle_from_wire(
        "MOUNT",
        nfs_fh3 {
            data: ok.fhandle.0.to_vec().into(),
        },
    )
}

#[async_trait]
impl Home for NfsHome {
    fn url(&self) -> &HomeUrl {
        &self.url
    }

    async fn root(&self) -> Result<(HomeHandle, HomeAttr)> {
        let a = self.getattr(&self.root).await?;
        Ok((self.root.clone(), a))
    }

    async fn lookup(&self, dir: &HomeHandle, name: &[u8]) -> Result<(HomeHandle, HomeAttr)> {
        check_name(name)?;
        let dir = handle_to_wire(dir)?;
        let name = name.to_vec();
        let ok = self
            .pool
            .call("LOOKUP", move |c| {
                let args = LOOKUP3args {
                    what: diropargs3 {
                        dir: dir.clone(),
                        name: filename3::from(name.clone()),
                    },
                };
                Box::pin(async move { c.lookup(&args).await })
            })
            .await?;
        let h = handle_from_wire("LOOKUP", ok.object)?;
        let a = self.attr_or_getattr(ok.obj_attributes, &h).await?;
        Ok((h, a))
    }

    async fn getattr(&self, handle: &HomeHandle) -> Result<HomeAttr> {
        self.getattr_fh(handle_to_wire(handle)?).await
    }

    async fn read_dir(
        &self,
        dir: &HomeHandle,
        cookie: u64,
        verifier: [u8; 8],
        max_entries: usize,
        plus: bool,
    ) -> Result<DirPage> {
        let fh = handle_to_wire(dir)?;
        let max = max_entries.max(1);
        let (mut cookie, mut verifier) = (cookie, verifier);
        loop {
            let fh = &fh;
            let page = |sized| async move {
                if plus {
                    self.readdirplus_page(fh, cookie, verifier, (max, sized))
                        .await
                } else {
                    self.readdir_page(fh, cookie, verifier, (max, sized)).await
                }
            };
            let sized = max >= SIZED_PAGES;
            let (mut page, last) = match page(sized).await {
                // A failure of a page sized to the entries seen is asked
                // again with the room guessed (see [`SIZED_PAGES`]).
                Err(HomeError::Io(e)) if sized => {
                    tracing::debug!(error = %e, max, plus, "a sized listing page failed; asked again with the room guessed");
                    page(false).await?
                }
                r => r?,
            };
            if page.entries.len() > max {
                page.entries.truncate(max);
                page.eof = false;
            }
            if !page.entries.is_empty() || page.eof {
                return Ok(page);
            }
            // A page of only `.` and `..`: the caller has no cookie to go
            // on from, so go on here.
            let Some(last) = last else {
                return Err(HomeError::Io(
                    "READDIR: the server sent an empty page that does not end the listing".into(),
                ));
            };
            cookie = last;
            verifier = page.verifier;
        }
    }

    async fn read(&self, handle: &HomeHandle, offset: u64, len: u32) -> Result<ReadReply> {
        let file = handle_to_wire(handle)?;
        let count = len.min(self.max_read);
        let ok = self
            .pool
            .call("READ", move |c| {
                let args = READ3args {
                    file: file.clone(),
                    offset,
                    count,
                };
                Box::pin(async move { c.read(&args).await })
            })
            .await?;
        check_live(&ok.file_attributes)?;
        let data = ok.data.into_owned();
        if data.len() > count as usize {
            return Err(HomeError::Io(format!(
                "READ: asked for {count} bytes, the server sent {}",
                data.len()
            )));
        }
        Ok(ReadReply {
            data: Bytes::from(data),
            eof: ok.eof,
        })
    }

    async fn read_link(&self, handle: &HomeHandle) -> Result<Vec<u8>> {
        let symlink = handle_to_wire(handle)?;
        let ok = self
            .pool
            .call("READLINK", move |c| {
                let args = READLINK3args {
                    symlink: symlink.clone(),
                };
                Box::pin(async move { c.readlink(&args).await })
            })
            .await?;
        check_live(&ok.symlink_attributes)?;
        Ok(ok.data.0.into_owned())
    }

    fn max_read(&self) -> u32 {
        self.max_read
    }

    async fn create(
        &self,
        dir: &HomeHandle,
        name: &[u8],
        what: &HomeNew,
        attr: &HomeSetAttr,
    ) -> Result<(HomeHandle, HomeAttr)> {
        self.create_at(dir, name, what, attr).await
    }

    async fn write(&self, handle: &HomeHandle, offset: u64, data: Bytes) -> Result<u32> {
        self.write_at(handle, offset, data).await
    }

    async fn commit(&self, handle: &HomeHandle) -> Result<()> {
        self.commit_file(handle).await
    }

    async fn setattr(&self, handle: &HomeHandle, set: &HomeSetAttr) -> Result<HomeAttr> {
        self.setattr_of(handle, set).await
    }

    async fn remove(&self, dir: &HomeHandle, name: &[u8]) -> Result<()> {
        self.remove_at(dir, name, false).await
    }

    async fn rmdir(&self, dir: &HomeHandle, name: &[u8]) -> Result<()> {
        self.remove_at(dir, name, true).await
    }

    async fn rename(
        &self,
        from_dir: &HomeHandle,
        from: &[u8],
        to_dir: &HomeHandle,
        to: &[u8],
    ) -> Result<()> {
        self.rename_at(from_dir, from, to_dir, to).await
    }

    async fn link(
        &self,
        target: &HomeHandle,
        dir: &HomeHandle,
        name: &[u8],
    ) -> Result<(HomeHandle, HomeAttr)> {
        self.link_at(target, dir, name).await
    }

    fn max_write(&self) -> u32 {
        self.max_write
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listing_pages_ask_for_the_bytes_entries_were_seen_to_take() {
        let s = EntrySizes::default();
        // Before any reply: the guesses.
        assert_eq!(
            s.counts(256, true, true),
            (
                (256 * DIR_ENTRY_BYTES + DIR_HEADER_BYTES) as u32,
                (256 * (DIR_ENTRY_BYTES + PLUS_ENTRY_BYTES) + DIR_HEADER_BYTES) as u32
            )
        );
        // A READDIRPLUS reply of 7-byte names with 24-byte handles: 32
        // bytes of directory part, 152 in all, per entry.
        let name = b"f000001";
        let plain = dir_entry_bytes(name);
        assert_eq!(plain, 32);
        s.saw((0..300).map(|_| (plain, plain + 88 + 32)), true);
        assert_eq!(
            s.counts(256, true, true),
            ((256 * 32 + 512) as u32, (256 * 152 + 512) as u32)
        );
        // A plain READDIR reply moves only the directory part; an empty one
        // nothing; the most asked for is bounded.
        s.saw((0..10).map(|_| (40, 40)), false);
        s.saw(std::iter::empty(), true);
        assert_eq!(s.counts(256, false, true).0, (256 * 40 + 512) as u32);
        assert_eq!(s.counts(256, true, true).1, (256 * 152 + 512) as u32);
        assert_eq!(s.counts(1 << 20, true, true).1, MAX_DIR_REPLY as u32);
        // Unsized pages ask for the room guessed.
        assert_eq!(s.counts(7, false, false).0, (7 * 64 + 512) as u32);
    }
}

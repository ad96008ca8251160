//! [`Access`] through NFSv3 with the `nfs3_client` crate: one TCP
//! connection per worker (MOUNT then NFS on the same port, as `morris nfs`
//! serves them), AUTH_UNIX with the caller's uid/gid, every call bounded by
//! a timeout. `NFS3ERR_JUKEBOX` is retried (RFC 1813: "try again later");
//! every other status becomes an [`FsError`] with the matching errno.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::time::Duration;

use nfs3_client::net::Connector;
use nfs3_client::nfs3_types::nfs3::{
    createhow3, diropargs3, filename3, nfs_fh3, nfsstat3, sattr3, stable_how, COMMIT3args,
    CREATE3args, FSINFO3args, GETATTR3args, LOOKUP3args, MKDIR3args, Nfs3Option, Nfs3Result,
    READ3args, READDIRPLUS3args, REMOVE3args, RENAME3args, RMDIR3args, WRITE3args,
};
use nfs3_client::nfs3_types::rpc::{auth_unix, opaque_auth};
use nfs3_client::nfs3_types::xdr_codec::Opaque;
use nfs3_client::tokio::{TokioConnector, TokioIo};
use nfs3_client::{Nfs3Client, Nfs3ConnectionBuilder, RpcError};

use super::{Access, Attr, ErrCode, FsError, Handle};

type Client = Nfs3Client<TokioIo<tokio::net::TcpStream>>;

/// A call on the client: a boxed future borrowing it.
type CallFuture<'a, O, E> = Pin<Box<dyn Future<Output = Result<Nfs3Result<O, E>, RpcError>> + 'a>>;

/// Longest any single NFS call may take before it counts as failed.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(60);

/// Most times a call answered `NFS3ERR_JUKEBOX` is sent again.
const JUKEBOX_RETRIES: u32 = 50;

/// An NFSv3 file handle and the name it was found under.
#[derive(Debug, Clone)]
pub struct FileHandle {
    /// The handle.
    pub fh: nfs_fh3,
    /// The name it was looked up or created as, for messages.
    pub name: String,
    /// The attributes that came with the LOOKUP or CREATE reply.
    pub attr: Option<Attr>,
}

/// A directory of an NFSv3 export.
pub struct NfsAccess {
    label: String,
    addr: SocketAddr,
    rt: tokio::runtime::Runtime,
    client: Option<Client>,
    cred: opaque_auth<'static>,
    dir: nfs_fh3,
    rtmax: u32,
    wtmax: u32,
}

impl std::fmt::Debug for NfsAccess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NfsAccess")
            .field("label", &self.label)
            .finish()
    }
}

/// The errno an NFSv3 status stands for (0 if none does).
pub fn nfs_errno(s: nfsstat3) -> i32 {
    match s {
        nfsstat3::NFS3_OK => 0,
        nfsstat3::NFS3ERR_PERM => libc::EPERM,
        nfsstat3::NFS3ERR_NOENT => libc::ENOENT,
        nfsstat3::NFS3ERR_IO => libc::EIO,
        nfsstat3::NFS3ERR_NXIO => libc::ENXIO,
        nfsstat3::NFS3ERR_ACCES => libc::EACCES,
        nfsstat3::NFS3ERR_EXIST => libc::EEXIST,
        nfsstat3::NFS3ERR_XDEV => libc::EXDEV,
        nfsstat3::NFS3ERR_NODEV => libc::ENODEV,
        nfsstat3::NFS3ERR_NOTDIR => libc::ENOTDIR,
        nfsstat3::NFS3ERR_ISDIR => libc::EISDIR,
        nfsstat3::NFS3ERR_INVAL => libc::EINVAL,
        nfsstat3::NFS3ERR_FBIG => libc::EFBIG,
        nfsstat3::NFS3ERR_NOSPC => libc::ENOSPC,
        nfsstat3::NFS3ERR_ROFS => libc::EROFS,
        nfsstat3::NFS3ERR_NAMETOOLONG => libc::ENAMETOOLONG,
        nfsstat3::NFS3ERR_NOTEMPTY => libc::ENOTEMPTY,
        nfsstat3::NFS3ERR_DQUOT => libc::EDQUOT,
        nfsstat3::NFS3ERR_STALE => libc::ESTALE,
        _ => 0,
    }
}

fn nfs_code(s: nfsstat3) -> ErrCode {
    let errno = nfs_errno(s);
    ErrCode {
        errno,
        name: if errno == 0 {
            s.to_string()
        } else {
            super::errno_name(errno)
        },
        text: s.to_string(),
    }
}

fn rpc_code(e: &RpcError) -> ErrCode {
    ErrCode {
        errno: 0,
        name: "RPC".into(),
        text: format!("RPC error: {e}"),
    }
}

fn fname(name: &str) -> filename3<'static> {
    filename3::from(name.as_bytes().to_vec())
}

fn dirop(dir: &nfs_fh3, name: &str) -> diropargs3<'static> {
    diropargs3 {
        dir: dir.clone(),
        name: fname(name),
    }
}

fn handle<'h>(h: &'h Handle, op: &'static str) -> Result<&'h FileHandle, FsError> {
    match h {
        Handle::Nfs(f) => Ok(f),
        Handle::Posix(_) => Err(FsError {
            op,
            name: String::new(),
            code: ErrCode::other(libc::EBADF, "a file descriptor given to NFS access"),
        }),
    }
}

/// AUTH_UNIX with this process's effective uid and gid.
fn credential() -> opaque_auth<'static> {
    // SAFETY: geteuid/getegid cannot fail and touch no memory of ours.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    opaque_auth::auth_unix(&auth_unix {
        stamp: 0,
        machinename: Opaque::owned(b"morris-consistency".to_vec()),
        uid,
        gid,
        gids: vec![],
    })
}

impl NfsAccess {
    /// Mounts the export `/` of `addr` (from a privileged port when run as
    /// root, as `morris nfs` asks by default, NFS `secure`), (MOUNT and NFS on that one port),
    /// looks `path` up component by component, and asks FSINFO for the
    /// transfer sizes.
    pub fn connect(addr: SocketAddr, path: &str, label: String) -> Result<NfsAccess, FsError> {
        let fail = |op: &'static str, text: String| FsError {
            op,
            name: format!("{addr}/{path}"),
            code: ErrCode::other(0, text),
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| fail("runtime", e.to_string()))?;
        let cred = credential();
        let mounted = rt.block_on(async {
            tokio::time::timeout(
                CALL_TIMEOUT,
                Nfs3ConnectionBuilder::new(TokioConnector, addr.ip().to_string(), "/")
                    .mount_port(addr.port())
                    .nfs3_port(addr.port())
                    .connect_from_privileged_port(privileged())
                    .credential(cred.clone())
                    .mount(),
            )
            .await
        });
        let conn = match mounted {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => return Err(fail("MOUNT", e.to_string())),
            Err(_) => return Err(fail("MOUNT", format!("no answer in {CALL_TIMEOUT:?}"))),
        };
        let root = conn.root_nfs_fh3();
        let mut a = NfsAccess {
            label,
            addr,
            rt,
            client: Some(conn.into_nfs3_client()),
            cred,
            dir: root,
            rtmax: 64 << 10,
            wtmax: 64 << 10,
        };
        for comp in path.split('/').filter(|c| !c.is_empty()) {
            let (fh, _) = a.lookup(comp)?;
            a.dir = fh;
        }
        let root = a.dir.clone();
        let info = a.call("FSINFO", "", move |c| {
            let args = FSINFO3args {
                fsroot: root.clone(),
            };
            Box::pin(async move { c.fsinfo(&args).await })
        })?;
        a.rtmax = info.rtmax.clamp(4096, 1 << 20);
        a.wtmax = info.wtmax.clamp(4096, 1 << 20);
        Ok(a)
    }

    /// The directory's handle.
    pub fn dir_handle(&self) -> &nfs_fh3 {
        &self.dir
    }

    /// Sends one call (again while the server answers JUKEBOX); a transport
    /// error or timeout drops the connection, which the next call opens again.
    fn call<O, E, F>(&mut self, op: &'static str, name: &str, f: F) -> Result<O, FsError>
    where
        F: for<'a> Fn(&'a mut Client) -> CallFuture<'a, O, E>,
    {
        let err = |code| FsError {
            op,
            name: name.to_string(),
            code,
        };
        let mut attempt = 0;
        loop {
            if self.client.is_none() {
                let addr = self.addr;
                let cred = self.cred.clone();
                let io = self
                    .rt
                    .block_on(async { tokio::time::timeout(CALL_TIMEOUT, reconnect(addr)).await })
                    .map_err(|_| err(ErrCode::other(libc::ETIMEDOUT, "reconnect timed out")))?
                    .map_err(|e| err(ErrCode::from_io(&e)))?;
                self.client = Some(Client::new_with_auth(io, cred, opaque_auth::default()));
            }
            let Some(client) = self.client.as_mut() else {
                continue;
            };
            let r = self
                .rt
                .block_on(async { tokio::time::timeout(CALL_TIMEOUT, f(client)).await });
            match r {
                Err(_) => {
                    self.client = None;
                    return Err(err(ErrCode::other(
                        libc::ETIMEDOUT,
                        format!("no answer in {CALL_TIMEOUT:?}"),
                    )));
                }
                Ok(Err(e)) => {
                    self.client = None;
                    return Err(err(rpc_code(&e)));
                }
                Ok(Ok(Nfs3Result::Ok(o))) => return Ok(o),
                Ok(Ok(Nfs3Result::Err((nfsstat3::NFS3ERR_JUKEBOX, _))))
                    if attempt < JUKEBOX_RETRIES =>
                {
                    attempt += 1;
                    std::thread::sleep(Duration::from_millis(100 * u64::from(attempt.min(10))));
                }
                Ok(Ok(Nfs3Result::Err((s, _)))) => return Err(err(nfs_code(s))),
            }
        }
    }

    /// LOOKUP of `name` in the directory: its handle and attributes.
    fn lookup(&mut self, name: &str) -> Result<(nfs_fh3, Option<Attr>), FsError> {
        let dir = self.dir.clone();
        let n = name.to_string();
        let ok = self.call("LOOKUP", name, move |c| {
            let args = LOOKUP3args {
                what: dirop(&dir, &n),
            };
            Box::pin(async move { c.lookup(&args).await })
        })?;
        let attr = match ok.obj_attributes {
            Nfs3Option::Some(a) => Some(Attr {
                size: a.size,
                ino: a.fileid,
            }),
            Nfs3Option::None => None,
        };
        Ok((ok.object, attr))
    }

    fn getattr(&mut self, fh: &nfs_fh3, name: &str) -> Result<Attr, FsError> {
        let fh = fh.clone();
        let ok = self.call("GETATTR", name, move |c| {
            let args = GETATTR3args { object: fh.clone() };
            Box::pin(async move { c.getattr(&args).await })
        })?;
        Ok(Attr {
            size: ok.obj_attributes.size,
            ino: ok.obj_attributes.fileid,
        })
    }
}

impl Access for NfsAccess {
    fn label(&self) -> &str {
        &self.label
    }

    fn is_nfs(&self) -> bool {
        true
    }

    fn create_excl(&mut self, name: &str) -> Result<Handle, FsError> {
        let dir = self.dir.clone();
        let n = name.to_string();
        let ok = self.call("CREATE(GUARDED)", name, move |c| {
            let args = CREATE3args {
                where_: dirop(&dir, &n),
                how: createhow3::GUARDED(sattr3 {
                    mode: Nfs3Option::Some(0o644),
                    ..sattr3::default()
                }),
            };
            Box::pin(async move { c.create(&args).await })
        })?;
        let attr = match &ok.obj_attributes {
            Nfs3Option::Some(a) => Some(Attr {
                size: a.size,
                ino: a.fileid,
            }),
            Nfs3Option::None => None,
        };
        let fh = match ok.obj {
            Nfs3Option::Some(fh) => fh,
            Nfs3Option::None => self.lookup(name)?.0,
        };
        Ok(Handle::Nfs(FileHandle {
            fh,
            name: name.to_string(),
            attr,
        }))
    }

    fn open_read(&mut self, name: &str) -> Result<Handle, FsError> {
        let (fh, attr) = self.lookup(name)?;
        Ok(Handle::Nfs(FileHandle {
            fh,
            name: name.to_string(),
            attr,
        }))
    }

    fn write_at(&mut self, h: &mut Handle, offset: u64, data: &[u8]) -> Result<(), FsError> {
        let fh = handle(h, "WRITE")?.clone();
        let mut done = 0usize;
        while done < data.len() {
            let n = (data.len() - done).min(self.wtmax as usize);
            let chunk = data[done..done + n].to_vec();
            let file = fh.fh.clone();
            let off = offset + done as u64;
            let ok = self.call("WRITE(FILE_SYNC)", &fh.name, move |c| {
                let args = WRITE3args {
                    file: file.clone(),
                    offset: off,
                    count: chunk.len() as u32,
                    stable: stable_how::FILE_SYNC,
                    data: Opaque::owned(chunk.clone()),
                };
                Box::pin(async move { c.write(&args).await })
            })?;
            if ok.count == 0 {
                return Err(FsError {
                    op: "WRITE(FILE_SYNC)",
                    name: fh.name.clone(),
                    code: ErrCode::other(libc::EIO, "the server wrote 0 bytes"),
                });
            }
            if ok.committed != stable_how::FILE_SYNC {
                return Err(FsError {
                    op: "WRITE(FILE_SYNC)",
                    name: fh.name.clone(),
                    code: ErrCode::other(
                        libc::EIO,
                        format!("asked FILE_SYNC, the server answered {}", ok.committed),
                    ),
                });
            }
            done += (ok.count as usize).min(n);
        }
        Ok(())
    }

    fn read_at(&mut self, h: &mut Handle, offset: u64, len: usize) -> Result<Vec<u8>, FsError> {
        let fh = handle(h, "READ")?.clone();
        let mut out = Vec::with_capacity(len.min(1 << 20));
        while out.len() < len {
            let count = (len - out.len()).min(self.rtmax as usize) as u32;
            let file = fh.fh.clone();
            let off = offset + out.len() as u64;
            let ok = self.call("READ", &fh.name, move |c| {
                let args = READ3args {
                    file: file.clone(),
                    offset: off,
                    count,
                };
                Box::pin(async move { c.read(&args).await })
            })?;
            let data = ok.data.into_owned();
            let empty = data.is_empty();
            out.extend_from_slice(&data);
            if ok.eof || empty {
                break;
            }
        }
        Ok(out)
    }

    fn sync(&mut self, h: &mut Handle) -> Result<(), FsError> {
        let fh = handle(h, "COMMIT")?.clone();
        let file = fh.fh.clone();
        self.call("COMMIT", &fh.name, move |c| {
            let args = COMMIT3args {
                file: file.clone(),
                offset: 0,
                count: 0,
            };
            Box::pin(async move { c.commit(&args).await })
        })?;
        Ok(())
    }

    fn close(&mut self, _h: Handle) -> Result<(), FsError> {
        Ok(())
    }

    fn attr(&mut self, h: &mut Handle) -> Result<Attr, FsError> {
        let fh = handle(h, "GETATTR")?.clone();
        self.getattr(&fh.fh, &fh.name)
    }

    fn stat(&mut self, name: &str) -> Result<Attr, FsError> {
        match self.lookup(name)? {
            (_, Some(a)) => Ok(a),
            (fh, None) => self.getattr(&fh, name),
        }
    }

    fn rename(&mut self, from: &str, to: &str) -> Result<(), FsError> {
        let dir = self.dir.clone();
        let (f, t) = (from.to_string(), to.to_string());
        self.call("RENAME", &format!("{from} -> {to}"), move |c| {
            let args = RENAME3args {
                from: dirop(&dir, &f),
                to: dirop(&dir, &t),
            };
            Box::pin(async move { c.rename(&args).await })
        })?;
        Ok(())
    }

    fn remove(&mut self, name: &str) -> Result<(), FsError> {
        let dir = self.dir.clone();
        let n = name.to_string();
        self.call("REMOVE", name, move |c| {
            let args = REMOVE3args {
                object: dirop(&dir, &n),
            };
            Box::pin(async move { c.remove(&args).await })
        })?;
        Ok(())
    }

    fn list(&mut self) -> Result<Vec<String>, FsError> {
        let mut out = Vec::new();
        let mut cookie = 0u64;
        let mut verf = Default::default();
        loop {
            let dir = self.dir.clone();
            let ok = self.call("READDIRPLUS", "", move |c| {
                // Small replies, so that a listing takes several calls
                // (continuing from a cookie) even in a modest directory.
                let args = READDIRPLUS3args {
                    dir: dir.clone(),
                    cookie,
                    cookieverf: verf,
                    dircount: 1024,
                    maxcount: 4096,
                };
                Box::pin(async move { c.readdirplus(&args).await })
            })?;
            verf = ok.cookieverf;
            let entries = ok.reply.entries.into_inner();
            let n = entries.len();
            for e in entries {
                cookie = e.cookie;
                let name = String::from_utf8_lossy(e.name.as_ref()).into_owned();
                if name != "." && name != ".." {
                    out.push(name);
                }
            }
            if ok.reply.eof {
                return Ok(out);
            }
            if n == 0 {
                return Err(FsError {
                    op: "READDIRPLUS",
                    name: String::new(),
                    code: ErrCode::other(libc::EIO, "no entries and no eof"),
                });
            }
        }
    }

    fn mkdir(&mut self, name: &str) -> Result<(), FsError> {
        let dir = self.dir.clone();
        let n = name.to_string();
        self.call("MKDIR", name, move |c| {
            let args = MKDIR3args {
                where_: dirop(&dir, &n),
                attributes: sattr3 {
                    mode: Nfs3Option::Some(0o755),
                    ..sattr3::default()
                },
            };
            Box::pin(async move { c.mkdir(&args).await })
        })?;
        Ok(())
    }

    fn rmdir(&mut self, name: &str) -> Result<(), FsError> {
        let dir = self.dir.clone();
        let n = name.to_string();
        self.call("RMDIR", name, move |c| {
            let args = RMDIR3args {
                object: dirop(&dir, &n),
            };
            Box::pin(async move { c.rmdir(&args).await })
        })?;
        Ok(())
    }
}

/// Whether this process connects from privileged ports (it may: root).
fn privileged() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// A new connection to `addr`, from a privileged port when [`privileged`]
/// (a port in use, or whose last connection to `addr` is still closing,
/// is skipped).
async fn reconnect(addr: SocketAddr) -> std::io::Result<TokioIo<tokio::net::TcpStream>> {
    if !privileged() {
        return TokioConnector.connect(addr).await;
    }
    const FIRST: u16 = 300;
    const PORTS: u16 = 1024 - FIRST;
    let start = (std::process::id() as u16).wrapping_mul(7919);
    for i in 0..PORTS {
        let port = FIRST + start.wrapping_add(i) % PORTS;
        match TokioConnector.connect_with_port(addr, port).await {
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::AddrInUse | std::io::ErrorKind::AddrNotAvailable
                ) => {}
            r => return r,
        }
    }
    Err(std::io::Error::other(format!(
        "no free privileged port ({FIRST}-1023) to reach {addr} from"
    )))
}

//! RPC procedures the gateway answers itself instead of `nfs3_server`,
//! because the crate's traits cannot express them: MOUNT MNT (`/`, the
//! named export, any directory below them, and the empty path some clients
//! send), MOUNT EXPORT (both exports), NFS ACCESS (computed
//! from the caller's real permissions), FSSTAT (real capacity), MKDIR (the
//! crate drops the mode), PATHCONF (real limits), REMOVE and RMDIR (the
//! crate sends both to one trait method, which cannot tell which was
//! asked), LINK and MKNOD; and the refusals sent to hosts outside
//! `--export-allow`.

use std::io::Cursor;

use morris_client::perm::{self, R_OK, W_OK, X_OK};
use morris_client::{FileKind, Inode};
use nfs3_server::nfs3_types::mount::{
    dirpath, export_node, exports, fhandle3, mountres3, mountres3_ok, mountstat3,
    name as group_name, PROGRAM as MOUNT_PROGRAM,
};
use nfs3_server::nfs3_types::nfs3::mknoddata3;
use nfs3_server::nfs3_types::nfs3::{
    diropargs3, nfs_fh3, nfsstat3, post_op_fh3, pre_op_attr, wcc_attr, wcc_data, ACCESS3args,
    ACCESS3res, ACCESS3resfail, ACCESS3resok, FSSTAT3args, FSSTAT3res, FSSTAT3resfail,
    FSSTAT3resok, LINK3args, LINK3res, LINK3resfail, LINK3resok, MKDIR3args, MKDIR3res,
    MKDIR3resfail, MKDIR3resok, MKNOD3args, MKNOD3res, MKNOD3resfail, MKNOD3resok, Nfs3Option,
    PATHCONF3args, PATHCONF3res, PATHCONF3resfail, PATHCONF3resok, REMOVE3args, REMOVE3res,
    REMOVE3resfail, REMOVE3resok, RMDIR3args, RMDIR3res, RMDIR3resfail, RMDIR3resok,
    ACCESS3_DELETE, ACCESS3_EXECUTE, ACCESS3_EXTEND, ACCESS3_LOOKUP, ACCESS3_MODIFY, ACCESS3_READ,
    PROGRAM as NFS_PROGRAM,
};
use nfs3_server::nfs3_types::rpc::{
    accept_stat_data, accepted_reply, auth_flavor, auth_stat, msg_body, opaque_auth,
    rejected_reply, reply_body, rpc_msg,
};
use nfs3_server::nfs3_types::xdr_codec::{Error as XdrError, List, Opaque, Pack, Unpack};
use nfs3_server::vfs::FileHandle;

use crate::export::ExportName;
use crate::front::Shared;
use crate::fs::{MorrisNfs, NfsHandle};
use crate::status::fail;

const MOUNTPROC3_NULL: u32 = 0;
const MOUNTPROC3_MNT: u32 = 1;
const MOUNTPROC3_DUMP: u32 = 2;
const MOUNTPROC3_UMNT: u32 = 3;
const MOUNTPROC3_UMNTALL: u32 = 4;
const MOUNTPROC3_EXPORT: u32 = 5;
const NFSPROC3_NULL: u32 = 0;
const NFSPROC3_ACCESS: u32 = 4;
const NFSPROC3_MKDIR: u32 = 9;
const NFSPROC3_MKNOD: u32 = 11;
const NFSPROC3_REMOVE: u32 = 12;
const NFSPROC3_RMDIR: u32 = 13;
const NFSPROC3_LINK: u32 = 15;
const NFSPROC3_FSSTAT: u32 = 18;
const NFSPROC3_PATHCONF: u32 = 20;

/// Most hard links to one inode (the client library's limit).
const LINK_MAX: u32 = 65_000;

/// Which program, version and procedure a call is for.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Proc {
    pub xid: u32,
    pub prog: u32,
    pub vers: u32,
    pub proc_: u32,
}

/// Whether the gateway answers `p` itself (for admitted hosts).
pub(crate) fn is_local(p: &Proc) -> bool {
    (p.prog == MOUNT_PROGRAM
        && p.vers == 3
        && matches!(p.proc_, MOUNTPROC3_MNT | MOUNTPROC3_EXPORT))
        || (p.prog == NFS_PROGRAM
            && p.vers == 3
            && matches!(
                p.proc_,
                NFSPROC3_ACCESS
                    | NFSPROC3_MKDIR
                    | NFSPROC3_MKNOD
                    | NFSPROC3_REMOVE
                    | NFSPROC3_RMDIR
                    | NFSPROC3_LINK
                    | NFSPROC3_FSSTAT
                    | NFSPROC3_PATHCONF
            ))
}

/// Turns the handle generation of `nfs3_server` handles into theirs and back.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Handles {
    generation: u64,
}

impl Handles {
    /// Handles carrying `generation` (see `Gateway::bind`).
    pub(crate) fn new(generation: u64) -> Self {
        Handles { generation }
    }

    /// The wire handle, laid out as `nfs3_server` lays out its own.
    pub(crate) fn encode(self, h: &NfsHandle) -> nfs_fh3 {
        let mut v = Vec::with_capacity(8 + h.len());
        v.extend_from_slice(&self.generation.to_le_bytes());
        v.extend_from_slice(h.as_bytes());
        nfs_fh3 {
            data: Opaque::owned(v),
        }
    }

    /// The handle a wire handle names.
    pub(crate) fn decode(self, fh: &nfs_fh3) -> Result<NfsHandle, nfsstat3> {
        let d: &[u8] = fh.data.as_ref();
        if d.len() < 8 {
            return Err(nfsstat3::NFS3ERR_BADHANDLE);
        }
        let mut g = [0u8; 8];
        g.copy_from_slice(&d[..8]);
        let g = u64::from_le_bytes(g);
        if g != self.generation {
            return Err(if g < self.generation {
                nfsstat3::NFS3ERR_STALE
            } else {
                nfsstat3::NFS3ERR_BADHANDLE
            });
        }
        NfsHandle::from_bytes(&d[8..]).ok_or(nfsstat3::NFS3ERR_BADHANDLE)
    }
}

/// A framed (record-marked) RPC reply: the accepted-reply header and `body`.
fn reply(xid: u32, stat: accept_stat_data, body: Option<&dyn PackDyn>) -> Vec<u8> {
    let msg = rpc_msg {
        xid,
        body: msg_body::REPLY(reply_body::MSG_ACCEPTED(accepted_reply {
            verf: opaque_auth::default(),
            reply_data: stat,
        })),
    };
    let mut out = Cursor::new(vec![0u8; 4]);
    out.set_position(4);
    // Packing into a Vec cannot fail.
    let _ = msg.pack(&mut out);
    if let Some(b) = body {
        b.pack_dyn(&mut out);
    }
    frame(out.into_inner())
}

/// Object-safe packing, for `reply`.
pub(crate) trait PackDyn {
    fn pack_dyn(&self, out: &mut Cursor<Vec<u8>>);
}

impl<T: Pack> PackDyn for T {
    fn pack_dyn(&self, out: &mut Cursor<Vec<u8>>) {
        let _ = self.pack(out);
    }
}

/// Sets the record mark of a buffer whose first 4 bytes are reserved for it.
fn frame(mut buf: Vec<u8>) -> Vec<u8> {
    let len = u32::try_from(buf.len() - 4).unwrap_or(u32::MAX) & 0x7fff_ffff;
    buf[..4].copy_from_slice(&(0x8000_0000 | len).to_be_bytes());
    buf
}

/// A framed successful reply carrying `body`.
pub(crate) fn success(xid: u32, body: &dyn PackDyn) -> Vec<u8> {
    reply(xid, accept_stat_data::SUCCESS, Some(body))
}

/// A framed RPC-level error reply (`GARBAGE_ARGS`, `SYSTEM_ERR`, ...).
pub(crate) fn rpc_error(xid: u32, stat: accept_stat_data) -> Vec<u8> {
    reply(xid, stat, None)
}

/// A framed `MSG_DENIED / AUTH_ERROR` reply.
pub(crate) fn auth_error(xid: u32, stat: auth_stat) -> Vec<u8> {
    let msg = rpc_msg {
        xid,
        body: msg_body::REPLY(reply_body::MSG_DENIED(rejected_reply::AUTH_ERROR(stat))),
    };
    let mut out = Cursor::new(vec![0u8; 4]);
    out.set_position(4);
    let _ = msg.pack(&mut out);
    frame(out.into_inner())
}

/// Bytes of the (all absent) optional attributes in the failure body of
/// each NFSv3 procedure (RFC 1813): post_op_attr is 4, wcc_data 8.
fn fail_body_len(proc_: u32) -> Option<usize> {
    Some(match proc_ {
        1 => 0,                                      // GETATTR: void
        2 | 7 | 8 | 9 | 10 | 11 | 12 | 13 | 21 => 8, // wcc_data
        3 | 4 | 5 | 6 | 16 | 17 | 18 | 19 | 20 => 4, // post_op_attr
        14 => 16,                                    // RENAME: two wcc_data
        15 => 12,                                    // LINK: post_op_attr + wcc_data
        _ => return None,
    })
}

/// The answer to a call from a host outside `--export-allow`: MOUNT MNT gets
/// `MNT3ERR_ACCES`, NFS procedures `NFS3ERR_ACCES`, NULL pings succeed, the
/// rest an RPC authentication error.
pub(crate) fn refusal(p: &Proc) -> Vec<u8> {
    if p.prog == MOUNT_PROGRAM && p.vers == 3 {
        return match p.proc_ {
            MOUNTPROC3_NULL | MOUNTPROC3_UMNT | MOUNTPROC3_UMNTALL => success(p.xid, &Void4),
            MOUNTPROC3_MNT => success(p.xid, &(mountstat3::MNT3ERR_ACCES as u32)),
            MOUNTPROC3_DUMP | MOUNTPROC3_EXPORT => success(p.xid, &0u32),
            _ => rpc_error(p.xid, accept_stat_data::PROC_UNAVAIL),
        };
    }
    if p.prog == NFS_PROGRAM && p.vers == 3 {
        if p.proc_ == NFSPROC3_NULL {
            return success(p.xid, &Void4);
        }
        if let Some(n) = fail_body_len(p.proc_) {
            return success(p.xid, &AccesFailure(n));
        }
        return rpc_error(p.xid, accept_stat_data::PROC_UNAVAIL);
    }
    auth_error(p.xid, auth_stat::AUTH_TOOWEAK)
}

/// An empty XDR body.
struct Void4;

impl Pack for Void4 {
    fn packed_size(&self) -> usize {
        0
    }
    fn pack(&self, _out: &mut impl std::io::Write) -> Result<usize, XdrError> {
        Ok(0)
    }
}

/// `NFS3ERR_ACCES` followed by `n` bytes of absent optional attributes.
struct AccesFailure(usize);

impl Pack for AccesFailure {
    fn packed_size(&self) -> usize {
        4 + self.0
    }
    fn pack(&self, out: &mut impl std::io::Write) -> Result<usize, XdrError> {
        out.write_all(&(nfsstat3::NFS3ERR_ACCES as u32).to_be_bytes())?;
        out.write_all(&vec![0u8; self.0])?;
        Ok(4 + self.0)
    }
}

/// Unpacks a procedure's arguments, or `None` if they are garbage.
fn args<T: Unpack>(body: &[u8]) -> Option<T> {
    let mut c = Cursor::new(body);
    let (v, _) = T::unpack(&mut c).ok()?;
    (c.position() == body.len() as u64).then_some(v)
}

/// Answers a local procedure (`is_local(p)`) whose arguments are `body`.
pub(crate) async fn handle(nfs: &MorrisNfs, shared: &Shared, p: Proc, body: &[u8]) -> Vec<u8> {
    let garbage = || rpc_error(p.xid, accept_stat_data::GARBAGE_ARGS);
    let handles = shared.handles;
    if p.prog == MOUNT_PROGRAM {
        if p.proc_ == MOUNTPROC3_EXPORT {
            return success(p.xid, &export_list(shared));
        }
        let Some(path) = args::<dirpath<'static>>(body) else {
            return garbage();
        };
        return success(
            p.xid,
            &mnt(nfs, handles, &shared.export, path.0.as_ref()).await,
        );
    }
    match p.proc_ {
        NFSPROC3_ACCESS => match args::<ACCESS3args>(body) {
            Some(a) => success(p.xid, &access(nfs, handles, a).await),
            None => garbage(),
        },
        NFSPROC3_FSSTAT => match args::<FSSTAT3args>(body) {
            Some(a) => success(p.xid, &fsstat(nfs, handles, a).await),
            None => garbage(),
        },
        NFSPROC3_LINK => match args::<LINK3args<'static>>(body) {
            Some(a) => success(p.xid, &link(nfs, handles, a).await),
            None => garbage(),
        },
        NFSPROC3_MKDIR => match args::<MKDIR3args<'static>>(body) {
            Some(a) => success(p.xid, &mkdir(nfs, handles, a).await),
            None => garbage(),
        },
        NFSPROC3_PATHCONF => match args::<PATHCONF3args>(body) {
            Some(a) => success(p.xid, &pathconf(nfs, handles, a).await),
            None => garbage(),
        },
        NFSPROC3_MKNOD => match args::<MKNOD3args<'static>>(body) {
            Some(a) => success(
                p.xid,
                &mknod(nfs, handles, a, shared.policy.allow_devices).await,
            ),
            None => garbage(),
        },
        NFSPROC3_REMOVE => match args::<REMOVE3args<'static>>(body) {
            Some(a) => success(p.xid, &remove(nfs, handles, a).await),
            None => garbage(),
        },
        NFSPROC3_RMDIR => match args::<RMDIR3args<'static>>(body) {
            Some(a) => success(p.xid, &rmdir(nfs, handles, a).await),
            None => garbage(),
        },
        _ => rpc_error(p.xid, accept_stat_data::PROC_UNAVAIL),
    }
}

/// MOUNT EXPORT: the named export and `/`, each with the networks
/// allowed to mount it (none listed: everyone).
fn export_list(shared: &Shared) -> exports<'static, 'static> {
    let groups = || {
        List(
            shared
                .allow
                .iter()
                .map(|c| group_name(Opaque::owned(c.to_string().into_bytes())))
                .collect(),
        )
    };
    List(
        [shared.export.to_string(), "/".to_string()]
            .into_iter()
            .map(|dir| export_node {
                ex_dir: dirpath(Opaque::owned(dir.into_bytes())),
                ex_groups: groups(),
            })
            .collect(),
    )
}

/// MOUNT MNT: any directory of the volume by path, below `/` ("", "/",
/// "/a/b") or below the named export ("/morris", "/morris/a/b").
async fn mnt(
    nfs: &MorrisNfs,
    handles: Handles,
    export: &ExportName,
    path: &[u8],
) -> mountres3<'static> {
    let (comps, named) = export.volume_path(path);
    let mut cur = match nfs.inode("mnt", &nfs.root).await {
        Ok(i) => i,
        Err(_) => return mountres3::Err(mountstat3::MNT3ERR_IO),
    };
    for comp in comps {
        if cur.attr.kind != FileKind::Dir {
            return mountres3::Err(mountstat3::MNT3ERR_NOTDIR);
        }
        if nfs.client.permit(&cur, &nfs.caller, X_OK).await.is_err() {
            return mountres3::Err(mountstat3::MNT3ERR_ACCES);
        }
        cur = match nfs.client.lookup(cur.id, comp).await {
            Ok(i) => i,
            Err(e) if e.code == morris_client::ErrorCode::NotFound => {
                return mountres3::Err(mountstat3::MNT3ERR_NOENT)
            }
            Err(e) => {
                fail("mnt", cur.id, &e);
                return mountres3::Err(mountstat3::MNT3ERR_IO);
            }
        };
    }
    if cur.attr.kind != FileKind::Dir {
        return mountres3::Err(mountstat3::MNT3ERR_NOTDIR);
    }
    let fh = handles.encode(&NfsHandle::new(cur.handle()));
    let export = if named {
        crate::export::warn_if_shadowed(&nfs.client, export).await;
        export.to_string()
    } else {
        "/".to_string()
    };
    tracing::info!(path = %String::from_utf8_lossy(path), %export, uid = nfs.caller.uid, "nfs export mounted");
    mountres3::Ok(mountres3_ok {
        fhandle: fhandle3(fh.data),
        auth_flavors: vec![auth_flavor::AUTH_UNIX as u32, auth_flavor::AUTH_NULL as u32],
    })
}

/// The ACCESS3 bits `caller` holds on `i` among `want` (RFC 1813 §3.3.4).
pub(crate) async fn access_bits(nfs: &MorrisNfs, i: &Inode, want: u32) -> u32 {
    // The ACL (when it decides) is read once; if it cannot be read,
    // nothing is granted (the mode's group bits are the ACL's mask, which
    // may grant more than the ACL does).
    let acl = match nfs.client.acl_for(i, &nfs.caller).await {
        Ok(a) => a,
        Err(e) => {
            tracing::warn!(ino = i.id, error = %e, "ACCESS: cannot read the ACL; granting nothing");
            return 0;
        }
    };
    let ok = |mask| perm::check_access_acl(i, acl.as_ref(), &nfs.caller, mask).is_ok();
    let dir = i.attr.kind == FileKind::Dir;
    let mut got = 0;
    if want & ACCESS3_READ != 0 && ok(R_OK) {
        got |= ACCESS3_READ;
    }
    if want & ACCESS3_LOOKUP != 0 && dir && ok(X_OK) {
        got |= ACCESS3_LOOKUP;
    }
    if want & ACCESS3_MODIFY != 0 && ok(W_OK) {
        got |= ACCESS3_MODIFY;
    }
    if want & ACCESS3_EXTEND != 0 && ok(W_OK) {
        got |= ACCESS3_EXTEND;
    }
    if want & ACCESS3_DELETE != 0 && dir && ok(W_OK | X_OK) {
        got |= ACCESS3_DELETE;
    }
    if want & ACCESS3_EXECUTE != 0 && !dir && ok(X_OK) {
        got |= ACCESS3_EXECUTE;
    }
    got
}

async fn access(nfs: &MorrisNfs, handles: Handles, a: ACCESS3args) -> ACCESS3res {
    let h = match handles.decode(&a.object) {
        Ok(h) => h,
        Err(s) => return ACCESS3res::Err((s, ACCESS3resfail::default())),
    };
    match nfs.inode("access", &h).await {
        Ok(i) => ACCESS3res::Ok(ACCESS3resok {
            obj_attributes: Nfs3Option::Some(nfs.fattr(&i)),
            access: access_bits(nfs, &i, a.access).await,
        }),
        Err(s) => ACCESS3res::Err((s, ACCESS3resfail::default())),
    }
}

async fn fsstat(nfs: &MorrisNfs, handles: Handles, a: FSSTAT3args) -> FSSTAT3res {
    let h = match handles.decode(&a.fsroot) {
        Ok(h) => h,
        Err(s) => return FSSTAT3res::Err((s, FSSTAT3resfail::default())),
    };
    let attrs = match nfs.inode("fsstat", &h).await {
        Ok(i) => Nfs3Option::Some(nfs.fattr(&i)),
        Err(s) => return FSSTAT3res::Err((s, FSSTAT3resfail::default())),
    };
    match nfs.client.statfs().await {
        // Inodes are limited only by space: one per 4 KiB free is reported.
        Ok(st) => FSSTAT3res::Ok(FSSTAT3resok {
            obj_attributes: attrs,
            tbytes: st.total,
            fbytes: st.free,
            abytes: st.avail,
            tfiles: st.files.saturating_add(st.files_free),
            ffiles: st.files_free,
            afiles: st.files_free,
            invarsec: 0,
        }),
        Err(e) => FSSTAT3res::Err((
            fail("fsstat", h.id(), &e),
            FSSTAT3resfail {
                obj_attributes: attrs,
            },
        )),
    }
}

/// Attributes of a directory after a change, as `wcc_data`.
async fn dir_wcc(nfs: &MorrisNfs, dir: &NfsHandle) -> wcc_data {
    wcc_data {
        before: Nfs3Option::None,
        after: match nfs.inode("wcc", dir).await {
            Ok(i) => Nfs3Option::Some(nfs.fattr(&i)),
            Err(_) => Nfs3Option::None,
        },
    }
}

/// Removes `what` as REMOVE (`dir: false`, a non-directory) or RMDIR
/// (`dir: true`, an empty directory) asks; the other kind is refused
/// (`NFS3ERR_ISDIR` / `NFS3ERR_NOTDIR`) and left alone. Returns the outcome
/// and the directory's attributes before and after, as `nfs3_server`
/// answers its own procedures.
async fn remove_entry(
    nfs: &MorrisNfs,
    handles: Handles,
    what: &diropargs3<'_>,
    dir: bool,
) -> (Result<(), nfsstat3>, wcc_data) {
    let op = if dir { "rmdir" } else { "remove" };
    let h = match handles.decode(&what.dir) {
        Ok(h) => h,
        Err(s) => return (Err(s), wcc_data::default()),
    };
    let before = match nfs.inode(op, &h).await {
        Ok(i) => nfs.fattr(&i),
        Err(s) => return (Err(s), wcc_data::default()),
    };
    let name = what.name.0.as_ref();
    let r = if dir {
        nfs.rmdir(h.id(), name).await
    } else {
        nfs.unlink(h.id(), name).await
    };
    let mut wcc = dir_wcc(nfs, &h).await;
    wcc.before = pre_op_attr::Some(wcc_attr {
        size: before.size,
        mtime: before.mtime,
        ctime: before.ctime,
    });
    (r, wcc)
}

async fn remove(nfs: &MorrisNfs, handles: Handles, a: REMOVE3args<'static>) -> REMOVE3res {
    match remove_entry(nfs, handles, &a.object, false).await {
        (Ok(()), dir_wcc) => REMOVE3res::Ok(REMOVE3resok { dir_wcc }),
        (Err(s), dir_wcc) => REMOVE3res::Err((s, REMOVE3resfail { dir_wcc })),
    }
}

async fn rmdir(nfs: &MorrisNfs, handles: Handles, a: RMDIR3args<'static>) -> RMDIR3res {
    match remove_entry(nfs, handles, &a.object, true).await {
        (Ok(()), dir_wcc) => RMDIR3res::Ok(RMDIR3resok { dir_wcc }),
        (Err(s), dir_wcc) => RMDIR3res::Err((s, RMDIR3resfail { dir_wcc })),
    }
}

async fn link(nfs: &MorrisNfs, handles: Handles, a: LINK3args<'static>) -> LINK3res {
    let failed = |s| {
        LINK3res::Err((
            s,
            LINK3resfail {
                file_attributes: Nfs3Option::None,
                linkdir_wcc: wcc_data::default(),
            },
        ))
    };
    let (file, dir) = match (handles.decode(&a.file), handles.decode(&a.link.dir)) {
        (Ok(f), Ok(d)) => (f, d),
        (Err(s), _) | (_, Err(s)) => return failed(s),
    };
    if let Err(s) = nfs.inode("link", &file).await {
        return failed(s);
    }
    if let Err(s) = nfs.inode("link", &dir).await {
        return failed(s);
    }
    let r = nfs
        .client
        .link(file.id(), dir.id(), a.link.name.0.as_ref(), &nfs.caller)
        .await;
    let linkdir_wcc = dir_wcc(nfs, &dir).await;
    match r {
        Ok(i) => LINK3res::Ok(LINK3resok {
            file_attributes: Nfs3Option::Some(nfs.fattr(&i)),
            linkdir_wcc,
        }),
        Err(e) => {
            let attrs = match nfs.inode("link", &file).await {
                Ok(i) => Nfs3Option::Some(nfs.fattr(&i)),
                Err(_) => Nfs3Option::None,
            };
            LINK3res::Err((
                fail("link", file.id(), &e),
                LINK3resfail {
                    file_attributes: attrs,
                    linkdir_wcc,
                },
            ))
        }
    }
}

/// Linux `makedev`.
fn makedev(major: u32, minor: u32) -> u32 {
    (minor & 0xff) | ((major & 0xfff) << 8) | ((minor & !0xff) << 12)
}

async fn mknod(
    nfs: &MorrisNfs,
    handles: Handles,
    a: MKNOD3args<'static>,
    allow_devices: bool,
) -> MKNOD3res {
    let failed = |s| {
        MKNOD3res::Err((
            s,
            MKNOD3resfail {
                dir_wcc: wcc_data::default(),
            },
        ))
    };
    let dir = match handles.decode(&a.where_.dir) {
        Ok(d) => d,
        Err(s) => return failed(s),
    };
    if let Err(s) = nfs.inode("mknod", &dir).await {
        return failed(s);
    }
    let (kind, attr, rdev) = match a.what {
        mknoddata3::NF3FIFO(s) => (FileKind::Fifo, s, 0),
        mknoddata3::NF3SOCK(s) => (FileKind::Socket, s, 0),
        mknoddata3::NF3CHR(d) => (
            FileKind::CharDev,
            d.dev_attributes,
            makedev(d.spec.specdata1, d.spec.specdata2),
        ),
        mknoddata3::NF3BLK(d) => (
            FileKind::BlockDev,
            d.dev_attributes,
            makedev(d.spec.specdata1, d.spec.specdata2),
        ),
        // RFC 1813: regular files, directories and symlinks have their own calls.
        mknoddata3::default => return failed(nfsstat3::NFS3ERR_BADTYPE),
    };
    if matches!(kind, FileKind::CharDev | FileKind::BlockDev) && !allow_devices {
        // A device node made through the gateway would open the device on
        // any mount that allows devices (`morris nfs --allow-devices`).
        return failed(nfsstat3::NFS3ERR_PERM);
    }
    let mode = match attr.mode {
        Nfs3Option::Some(m) => m & 0o7777,
        Nfs3Option::None => 0o644,
    };
    let r = nfs
        .client
        .create(
            dir.id(),
            a.where_.name.0.as_ref(),
            kind,
            mode,
            rdev,
            true,
            &nfs.caller,
        )
        .await;
    let r = match r {
        Ok(i) => nfs.apply_sattr("mknod", i, &attr, true).await,
        Err(e) => Err(fail("mknod", dir.id(), &e)),
    };
    let dir_wcc = dir_wcc(nfs, &dir).await;
    match r {
        Ok(i) => MKNOD3res::Ok(MKNOD3resok {
            obj: post_op_fh3::Some(handles.encode(&NfsHandle::new(i.handle()))),
            obj_attributes: Nfs3Option::Some(nfs.fattr(&i)),
            dir_wcc,
        }),
        Err(s) => MKNOD3res::Err((s, MKNOD3resfail { dir_wcc })),
    }
}

async fn mkdir(nfs: &MorrisNfs, handles: Handles, a: MKDIR3args<'static>) -> MKDIR3res {
    let dir = match handles.decode(&a.where_.dir) {
        Ok(d) => d,
        Err(s) => return MKDIR3res::Err((s, MKDIR3resfail::default())),
    };
    if let Err(s) = nfs.inode("mkdir", &dir).await {
        return MKDIR3res::Err((s, MKDIR3resfail::default()));
    }
    let mode = match a.attributes.mode {
        Nfs3Option::Some(m) => m & 0o7777,
        Nfs3Option::None => 0o755,
    };
    let r = match nfs
        .client
        .mkdir(dir.id(), a.where_.name.0.as_ref(), mode, &nfs.caller)
        .await
    {
        Ok(i) => nfs.apply_sattr("mkdir", i, &a.attributes, true).await,
        Err(e) => Err(fail("mkdir", dir.id(), &e)),
    };
    let dir_wcc = dir_wcc(nfs, &dir).await;
    match r {
        Ok(i) => MKDIR3res::Ok(MKDIR3resok {
            obj: post_op_fh3::Some(handles.encode(&NfsHandle::new(i.handle()))),
            obj_attributes: Nfs3Option::Some(nfs.fattr(&i)),
            dir_wcc,
        }),
        Err(s) => MKDIR3res::Err((s, MKDIR3resfail { dir_wcc })),
    }
}

async fn pathconf(nfs: &MorrisNfs, handles: Handles, a: PATHCONF3args) -> PATHCONF3res {
    let h = match handles.decode(&a.object) {
        Ok(h) => h,
        Err(s) => return PATHCONF3res::Err((s, PATHCONF3resfail::default())),
    };
    match nfs.inode("pathconf", &h).await {
        Ok(i) => PATHCONF3res::Ok(PATHCONF3resok {
            obj_attributes: Nfs3Option::Some(nfs.fattr(&i)),
            linkmax: LINK_MAX,
            name_max: morris_proto::MAX_NAME_LEN as u32,
            no_trunc: true,
            chown_restricted: true,
            case_insensitive: false,
            case_preserving: true,
        }),
        Err(s) => PATHCONF3res::Err((s, PATHCONF3resfail::default())),
    }
}

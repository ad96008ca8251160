//! The NFS file system: `nfs3_server`'s traits implemented over
//! `morris_client::Client`. No file-system logic lives here, only
//! translation of arguments, attributes and errors.

use std::collections::VecDeque;
use std::sync::Arc;

use bytes::Bytes;
use morris_client::perm;
use morris_client::{
    Caller, Client, DirEntry as MDirEntry, FileId, FileKind, Handle, Inode, RenameFlags, SetAttr,
    Timestamp, ROOT_ID,
};
use nfs3_server::nfs3_types::nfs3::{
    createverf3, fattr3, filename3, ftype3, nfspath3, nfsstat3, nfstime3, sattr3, set_atime,
    set_mtime, specdata3, stable_how, FSINFO3resok, Nfs3Option,
};
use nfs3_server::nfs3_types::xdr_codec::Opaque;
use nfs3_server::vfs::{
    DirEntry, DirEntryPlus, FileHandle, NextResult, NfsFileSystem, NfsReadFileSystem,
    ReadDirIterator, ReadDirPlusIterator,
};

use crate::cookies;
use crate::files::OpenFiles;
use crate::status::fail;

/// An NFS file handle's payload: a morris `(file id, generation)`, so that it
/// stays valid across gateway restarts and goes stale when the file is deleted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NfsHandle {
    bytes: [u8; 12],
}

impl NfsHandle {
    /// The handle naming `h`.
    pub fn new(h: Handle) -> Self {
        let mut bytes = [0u8; 12];
        bytes[..8].copy_from_slice(&h.id.to_be_bytes());
        bytes[8..].copy_from_slice(&h.gen.to_be_bytes());
        NfsHandle { bytes }
    }

    /// The file id.
    pub fn id(&self) -> FileId {
        let mut b = [0u8; 8];
        b.copy_from_slice(&self.bytes[..8]);
        u64::from_be_bytes(b)
    }

    /// The generation.
    pub fn gen(&self) -> u32 {
        let mut b = [0u8; 4];
        b.copy_from_slice(&self.bytes[8..]);
        u32::from_be_bytes(b)
    }
}

impl FileHandle for NfsHandle {
    fn len(&self) -> usize {
        self.bytes.len()
    }
    fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }
    fn from_bytes(bytes: &[u8]) -> Option<Self> {
        let bytes: [u8; 12] = bytes.try_into().ok()?;
        let h = NfsHandle { bytes };
        (h.id() != 0).then_some(h)
    }
}

/// Entries fetched per directory listing request.
const DIR_BATCH: u32 = 256;

/// Entries of a READDIRPLUS listing whose attributes are read at once.
const PLUS_CHUNK: usize = 64;

/// The volume as an NFS file system.
pub struct MorrisNfs {
    pub(crate) client: Arc<Client>,
    pub(crate) root: NfsHandle,
    fsid: u64,
    pub(crate) files: Arc<OpenFiles>,
    /// Who every call of this instance acts as (one instance per credential).
    pub(crate) caller: Caller,
}

impl MorrisNfs {
    /// Wraps a connected client; `files` caches open files between calls.
    pub(crate) async fn new(
        client: Arc<Client>,
        files: Arc<OpenFiles>,
    ) -> morris_client::Result<Self> {
        let root = client.getattr(ROOT_ID).await?;
        let u = client.descriptor().uuid.as_bytes();
        let mut b = [0u8; 8];
        b.copy_from_slice(&u[..8]);
        Ok(MorrisNfs {
            client,
            root: NfsHandle::new(root.handle()),
            fsid: u64::from_be_bytes(b),
            files,
            caller: Caller::root(),
        })
    }

    /// The same file system acting for `caller` (permissions checked).
    pub(crate) fn for_caller(&self, caller: Caller) -> MorrisNfs {
        MorrisNfs {
            client: self.client.clone(),
            root: self.root,
            fsid: self.fsid,
            files: self.files.clone(),
            caller,
        }
    }

    /// Checks `mask` for the caller on `i`; the owner may always read and
    /// write a file's data (as NFS servers allow, since permissions were
    /// checked when the client opened it).
    async fn may(&self, i: &Inode, mask: u32) -> Result<(), nfsstat3> {
        if self.caller.uid == i.attr.uid && mask & perm::X_OK == 0 {
            return Ok(());
        }
        self.client
            .permit(i, &self.caller, mask)
            .await
            .map_err(|e| fail("access", i.id, &e))
    }

    /// The inode a handle names; `NFS3ERR_STALE` if it was deleted.
    pub(crate) async fn inode(&self, op: &'static str, h: &NfsHandle) -> Result<Inode, nfsstat3> {
        // A handle from before a gateway restart names a file this client
        // has not looked up yet; the server checks its generation.
        self.client.learn(morris_client::Handle {
            id: h.id(),
            gen: h.gen(),
        });
        match self.client.getattr(h.id()).await {
            Ok(i) if i.gen == h.gen() => Ok(i),
            Ok(_) => Err(nfsstat3::NFS3ERR_STALE),
            Err(e) if e.code == morris_client::ErrorCode::NotFound => Err(nfsstat3::NFS3ERR_STALE),
            Err(e) => Err(fail(op, h.id(), &e)),
        }
    }

    pub(crate) fn fattr(&self, i: &Inode) -> fattr3 {
        fattr_with(self.fsid, i)
    }

    /// Applies the parts of `attr` other than `skip_mode`'s mode to a new object.
    pub(crate) async fn apply_sattr(
        &self,
        op: &'static str,
        inode: Inode,
        attr: &sattr3,
        skip_mode: bool,
    ) -> Result<Inode, nfsstat3> {
        let mut set = setattr_of(attr);
        if skip_mode {
            set.mode = None;
        }
        if set == SetAttr::default() {
            return Ok(inode);
        }
        self.client
            .setattr(inode.id, set, &self.caller)
            .await
            .map_err(|e| fail(op, inode.id, &e))
    }
}

/// NFS attributes of an inode.
fn fattr_with(fsid: u64, i: &Inode) -> fattr3 {
    let a = &i.attr;
    let type_ = match a.kind {
        FileKind::File => ftype3::NF3REG,
        FileKind::Dir => ftype3::NF3DIR,
        FileKind::Symlink => ftype3::NF3LNK,
        FileKind::Fifo => ftype3::NF3FIFO,
        FileKind::Socket => ftype3::NF3SOCK,
        FileKind::CharDev => ftype3::NF3CHR,
        FileKind::BlockDev => ftype3::NF3BLK,
    };
    fattr3 {
        type_,
        mode: a.mode & 0o7777,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        size: a.size,
        used: i.disk_bytes(),
        rdev: specdata3 {
            specdata1: (a.rdev >> 8) & 0xfff,
            specdata2: (a.rdev & 0xff) | ((a.rdev >> 12) & 0xfff00),
        },
        fsid,
        fileid: i.id,
        atime: nfstime(a.atime),
        mtime: nfstime(a.mtime),
        ctime: nfstime(a.ctime),
    }
}

fn nfstime(t: Timestamp) -> nfstime3 {
    nfstime3 {
        seconds: u32::try_from(t.secs.max(0)).unwrap_or(u32::MAX),
        nseconds: t.nanos,
    }
}

fn timestamp(t: nfstime3) -> Timestamp {
    Timestamp {
        secs: i64::from(t.seconds),
        nanos: t.nseconds.min(999_999_999),
    }
}

/// The morris attribute change an NFS `sattr3` asks for.
fn setattr_of(a: &sattr3) -> SetAttr {
    let mut s = SetAttr::default();
    if let Nfs3Option::Some(m) = a.mode {
        s.mode = Some(m & 0o7777);
    }
    if let Nfs3Option::Some(u) = a.uid {
        s.uid = Some(u);
    }
    if let Nfs3Option::Some(g) = a.gid {
        s.gid = Some(g);
    }
    if let Nfs3Option::Some(sz) = a.size {
        s.size = Some(sz);
    }
    s.atime = match a.atime {
        set_atime::DONT_CHANGE => None,
        set_atime::SET_TO_SERVER_TIME => Some(Timestamp::now()),
        set_atime::SET_TO_CLIENT_TIME(t) => Some(timestamp(t)),
    };
    s.mtime = match a.mtime {
        set_mtime::DONT_CHANGE => None,
        set_mtime::SET_TO_SERVER_TIME => Some(Timestamp::now()),
        set_mtime::SET_TO_CLIENT_TIME(t) => Some(timestamp(t)),
    };
    s
}

/// The mode an NFS `sattr3` asks for, or `default`.
fn mode_of(a: &sattr3, default: u32) -> u32 {
    match a.mode {
        Nfs3Option::Some(m) => m & 0o7777,
        Nfs3Option::None => default,
    }
}

/// An exclusive-create verifier as the times it is stored in (RFC 1813
/// §3.3.8: the server keeps it with the file until the client's SETATTR).
fn verifier_times(v: &createverf3) -> (Timestamp, Timestamp) {
    let a = u32::from_be_bytes([v.0[0], v.0[1], v.0[2], v.0[3]]);
    let m = u32::from_be_bytes([v.0[4], v.0[5], v.0[6], v.0[7]]);
    (
        Timestamp {
            secs: i64::from(a),
            nanos: 0,
        },
        Timestamp {
            secs: i64::from(m),
            nanos: 0,
        },
    )
}

/// One entry of a listing as NFS sees it: a morris entry, `.` or `..`.
struct Item {
    fileid: FileId,
    name: Vec<u8>,
    /// The NFS cookie (`cookies`).
    cookie: u64,
    /// READDIRPLUS: attributes, if known.
    attrs: Option<fattr3>,
    /// READDIRPLUS: handle, if known.
    handle: Option<NfsHandle>,
}

/// A directory listing continued from NFS cookies (`cookies`): `.` and
/// `..`, then the morris entries.
pub struct Listing {
    client: Arc<Client>,
    dir: FileId,
    /// `.` and `..`, as far as they are still to be listed.
    dots: VecDeque<Item>,
    /// The morris cookie the next morris batch is listed after.
    cookie: u64,
    buf: VecDeque<MDirEntry>,
    /// READDIRPLUS: the attributes of the first entries in `buf`, fetched
    /// a chunk ([`PLUS_CHUNK`]) at a time.
    attrs: VecDeque<Option<fattr3>>,
    plus: bool,
    done: bool,
    /// A batch was listed already.
    listed_any: bool,
    fsid: u64,
}

impl Listing {
    async fn next_item(&mut self) -> NextResult<Item> {
        if let Some(dot) = self.dots.pop_front() {
            return NextResult::Ok(dot);
        }
        if self.buf.is_empty() && !self.done {
            // A READDIRPLUS reply of libnfs holds ~50 entries: its first
            // batch no bigger than a chunk of attributes.
            let max = if self.plus && !self.listed_any {
                PLUS_CHUNK as u32
            } else {
                DIR_BATCH
            };
            self.listed_any = true;
            match self.client.readdir(self.dir, self.cookie, max).await {
                Ok((entries, complete)) => {
                    self.done = complete || entries.is_empty();
                    self.buf.extend(entries);
                }
                Err(e) => return NextResult::Err(fail("readdir", self.dir, &e)),
            }
        }
        if self.plus && self.attrs.is_empty() && !self.buf.is_empty() {
            // A reply holds what the client's byte count allows (libnfs:
            // ~50 entries): attributes a chunk at a time, not the batch.
            let n = self.buf.len().min(PLUS_CHUNK);
            self.buf.make_contiguous();
            let chunk = &self.buf.as_slices().0[..n];
            self.attrs = self.batch_attrs(chunk).await;
        }
        let Some(e) = self.buf.pop_front() else {
            return NextResult::Eof;
        };
        // Cookies that do not increase would make clients list forever.
        let cookie = match cookies::entry_cookie(e.cookie) {
            Some(c) if e.cookie > self.cookie => c,
            _ => {
                tracing::warn!(
                    dir = self.dir,
                    cookie = e.cookie,
                    after = self.cookie,
                    "readdir: cookie out of order or too large"
                );
                return NextResult::Err(nfsstat3::NFS3ERR_IO);
            }
        };
        self.cookie = e.cookie;
        // Attributes are optional in READDIRPLUS: an entry removed
        // meanwhile is listed without them.
        let attrs = if self.plus {
            self.attrs.pop_front().flatten()
        } else {
            None
        };
        NextResult::Ok(Item {
            fileid: e.child.id,
            name: e.name,
            cookie,
            attrs,
            handle: Some(NfsHandle::new(e.child)),
        })
    }

    /// Attributes of a batch of entries, fetched without leases (a listing
    /// of a million files must not take a million locks), one request per
    /// server; `None` for an entry removed or replaced meanwhile.
    async fn batch_attrs(&self, entries: &[MDirEntry]) -> VecDeque<Option<fattr3>> {
        self.client
            .entries_snapshot(self.dir, entries)
            .await
            .into_iter()
            .map(|i| i.map(|i| fattr_with(self.fsid, &i)))
            .collect()
    }
}

impl ReadDirIterator for Listing {
    async fn next(&mut self) -> NextResult<DirEntry> {
        match self.next_item().await {
            NextResult::Ok(e) => NextResult::Ok(DirEntry {
                fileid: e.fileid,
                name: filename3(Opaque::owned(e.name)),
                cookie: e.cookie,
            }),
            NextResult::Eof => NextResult::Eof,
            NextResult::Err(s) => NextResult::Err(s),
        }
    }
}

impl ReadDirPlusIterator<NfsHandle> for Listing {
    async fn next(&mut self) -> NextResult<DirEntryPlus<NfsHandle>> {
        match self.next_item().await {
            NextResult::Ok(e) => NextResult::Ok(DirEntryPlus {
                fileid: e.fileid,
                name: filename3(Opaque::owned(e.name)),
                cookie: e.cookie,
                name_attributes: e.attrs,
                name_handle: e.handle,
            }),
            NextResult::Eof => NextResult::Eof,
            NextResult::Err(s) => NextResult::Err(s),
        }
    }
}

impl NfsReadFileSystem for MorrisNfs {
    type Handle = NfsHandle;

    fn root_dir(&self) -> NfsHandle {
        self.root
    }

    async fn lookup(&self, dir: &NfsHandle, name: &filename3<'_>) -> Result<NfsHandle, nfsstat3> {
        let d = self.inode("lookup", dir).await?;
        if d.attr.kind == FileKind::Dir {
            self.may(&d, perm::X_OK).await?;
        }
        match self.client.lookup(dir.id(), name.0.as_ref()).await {
            Ok(i) => Ok(NfsHandle::new(i.handle())),
            Err(e) => Err(fail("lookup", dir.id(), &e)),
        }
    }

    async fn getattr(&self, id: &NfsHandle) -> Result<fattr3, nfsstat3> {
        let i = self.inode("getattr", id).await?;
        Ok(self.fattr(&i))
    }

    async fn read(
        &self,
        id: &NfsHandle,
        offset: u64,
        count: u32,
    ) -> Result<(Vec<u8>, bool), nfsstat3> {
        let i = self.inode("read", id).await?;
        match i.attr.kind {
            FileKind::File => {}
            FileKind::Dir => return Err(nfsstat3::NFS3ERR_ISDIR),
            _ => return Err(nfsstat3::NFS3ERR_INVAL),
        }
        self.may(&i, perm::R_OK).await?;
        let fh = self
            .files
            .get(id.id(), false)
            .await
            .map_err(|e| fail("read", id.id(), &e))?;
        let data = match self.client.read(fh.fh(), offset, count).await {
            Ok(d) => d,
            Err(e) => {
                self.files.drop_file(id.id()).await;
                return Err(fail("read", id.id(), &e));
            }
        };
        let size = match self.client.getattr(id.id()).await {
            Ok(i) => i.attr.size,
            Err(e) => return Err(fail("read", id.id(), &e)),
        };
        let eof = offset.saturating_add(data.len() as u64) >= size;
        Ok((data.to_vec(), eof))
    }

    async fn readdir(
        &self,
        dir: &NfsHandle,
        cookie: u64,
    ) -> Result<impl ReadDirIterator, nfsstat3> {
        self.listing(dir, cookie, false).await
    }

    async fn readdirplus(
        &self,
        dir: &NfsHandle,
        cookie: u64,
    ) -> Result<impl ReadDirPlusIterator<NfsHandle>, nfsstat3> {
        self.listing(dir, cookie, true).await
    }

    async fn readlink(&self, id: &NfsHandle) -> Result<nfspath3<'_>, nfsstat3> {
        self.inode("readlink", id).await?;
        match self.client.readlink(id.id()).await {
            Ok(t) => Ok(nfspath3(Opaque::owned(t))),
            Err(e) => Err(fail("readlink", id.id(), &e)),
        }
    }

    async fn fsinfo(&self, root: &NfsHandle) -> Result<FSINFO3resok, nfsstat3> {
        const MIB: u32 = 1 << 20;
        let attrs = match self.getattr(root).await {
            Ok(a) => Nfs3Option::Some(a),
            Err(_) => Nfs3Option::None,
        };
        Ok(FSINFO3resok {
            obj_attributes: attrs,
            rtmax: MIB,
            rtpref: MIB,
            rtmult: 4096,
            wtmax: MIB,
            wtpref: MIB,
            wtmult: 4096,
            dtpref: 64 << 10,
            maxfilesize: morris_proto::MAX_FILE_SIZE,
            time_delta: nfstime3 {
                seconds: 0,
                nseconds: 1,
            },
            properties: nfs3_server::nfs3_types::nfs3::FSF3_SYMLINK
                | nfs3_server::nfs3_types::nfs3::FSF3_HOMOGENEOUS
                | nfs3_server::nfs3_types::nfs3::FSF3_CANSETTIME,
        })
    }
}

impl MorrisNfs {
    async fn listing(&self, dir: &NfsHandle, cookie: u64, plus: bool) -> Result<Listing, nfsstat3> {
        let i = self.inode("readdir", dir).await?;
        if i.attr.kind != FileKind::Dir {
            return Err(nfsstat3::NFS3ERR_NOTDIR);
        }
        self.may(&i, perm::R_OK).await?;
        let start = cookies::resume(cookie);
        let mut dots = VecDeque::new();
        if start.dot {
            dots.push_back(Item {
                fileid: i.id,
                name: b".".to_vec(),
                cookie: cookies::AFTER_DOT,
                attrs: plus.then(|| self.fattr(&i)),
                handle: Some(*dir),
            });
        }
        if start.dotdot {
            dots.push_back(self.dotdot(&i, plus).await);
        }
        Ok(Listing {
            client: self.client.clone(),
            dir: dir.id(),
            dots,
            cookie: start.cookie,
            buf: VecDeque::new(),
            attrs: VecDeque::new(),
            plus,
            done: false,
            listed_any: false,
            fsid: self.fsid,
        })
    }

    /// The `..` entry of directory `d` (the root is its own parent); for
    /// READDIRPLUS (`plus`) with the parent's attributes and handle, which
    /// are left out if the parent cannot be read.
    async fn dotdot(&self, d: &Inode, plus: bool) -> Item {
        let parent = if d.id == ROOT_ID || d.parent == 0 {
            d.id
        } else {
            d.parent
        };
        let mut item = Item {
            fileid: parent,
            name: b"..".to_vec(),
            cookie: cookies::AFTER_DOTDOT,
            attrs: None,
            handle: None,
        };
        if plus {
            match self.client.lookup(d.id, b"..").await {
                Ok(p) => {
                    item.fileid = p.id;
                    item.attrs = Some(self.fattr(&p));
                    item.handle = Some(NfsHandle::new(p.handle()));
                }
                Err(e) => {
                    fail("readdirplus", d.id, &e);
                }
            }
        }
        item
    }

    /// REMOVE: removes the non-directory `name` from `dir` (a directory is
    /// `NFS3ERR_ISDIR` and stays).
    pub(crate) async fn unlink(&self, dir: FileId, name: &[u8]) -> Result<(), nfsstat3> {
        // Close the file's cached open file first: its flush must not come
        // after the removal.
        if let Ok(child) = self.client.lookup(dir, name).await {
            if child.attr.kind != FileKind::Dir {
                self.files.drop_file(child.id).await;
            }
        }
        self.client
            .unlink(dir, name, &self.caller)
            .await
            .map_err(|e| fail("remove", dir, &e))
    }

    /// RMDIR: removes the empty directory `name` from `dir` (anything else
    /// is `NFS3ERR_NOTDIR` and stays).
    pub(crate) async fn rmdir(&self, dir: FileId, name: &[u8]) -> Result<(), nfsstat3> {
        self.client
            .rmdir(dir, name, &self.caller)
            .await
            .map_err(|e| fail("rmdir", dir, &e))
    }

    /// Makes written data as stable as `stable` asks. UNSTABLE data is left
    /// to COMMIT: the write verifier changes when the gateway restarts, so
    /// clients resend what a crash lost (`front::patch_verifier`).
    async fn stabilize(
        &self,
        id: FileId,
        fh: u64,
        stable: stable_how,
    ) -> morris_client::Result<()> {
        match stable {
            stable_how::UNSTABLE => Ok(()),
            stable_how::DATA_SYNC => self.client.fsync(fh, true).await,
            stable_how::FILE_SYNC => self.client.fsync(fh, false).await,
        }
        .inspect_err(|_| tracing::debug!(id, ?stable, "stabilizing a write failed"))
    }
}

impl NfsFileSystem for MorrisNfs {
    async fn setattr(&self, id: &NfsHandle, attr: sattr3) -> Result<fattr3, nfsstat3> {
        let i = self.inode("setattr", id).await?;
        let set = setattr_of(&attr);
        if set == SetAttr::default() {
            return Ok(self.fattr(&i));
        }
        match self.client.setattr(id.id(), set, &self.caller).await {
            Ok(i) => Ok(self.fattr(&i)),
            Err(e) => Err(fail("setattr", id.id(), &e)),
        }
    }

    async fn write(
        &self,
        id: &NfsHandle,
        offset: u64,
        data: &[u8],
        stable: stable_how,
    ) -> Result<(fattr3, stable_how), nfsstat3> {
        let i = self.inode("write", id).await?;
        match i.attr.kind {
            FileKind::File => {}
            FileKind::Dir => return Err(nfsstat3::NFS3ERR_ISDIR),
            _ => return Err(nfsstat3::NFS3ERR_INVAL),
        }
        self.may(&i, perm::W_OK).await?;
        let fh = self
            .files
            .get(id.id(), true)
            .await
            .map_err(|e| fail("write", id.id(), &e))?;
        let mut done = 0usize;
        while done < data.len() {
            let chunk = Bytes::copy_from_slice(&data[done..]);
            match self
                .client
                .write(fh.fh(), offset + done as u64, chunk)
                .await
            {
                Ok(0) => return Err(nfsstat3::NFS3ERR_IO),
                Ok(n) => done += n as usize,
                Err(e) => {
                    self.files.drop_file(id.id()).await;
                    return Err(fail("write", id.id(), &e));
                }
            }
        }
        if let Err(e) = self.stabilize(id.id(), fh.fh(), stable).await {
            self.files.drop_file(id.id()).await;
            return Err(fail("write", id.id(), &e));
        }
        let i = self
            .client
            .getattr(id.id())
            .await
            .map_err(|e| fail("write", id.id(), &e))?;
        Ok((self.fattr(&i), stable))
    }

    async fn create(
        &self,
        dir: &NfsHandle,
        name: &filename3<'_>,
        attr: sattr3,
    ) -> Result<(NfsHandle, fattr3), nfsstat3> {
        self.inode("create", dir).await?;
        let mode = mode_of(&attr, 0o644);
        let i = self
            .client
            .create(
                dir.id(),
                name.0.as_ref(),
                FileKind::File,
                mode,
                0,
                false,
                &self.caller,
            )
            .await
            .map_err(|e| fail("create", dir.id(), &e))?;
        let i = self.apply_sattr("create", i, &attr, true).await?;
        Ok((NfsHandle::new(i.handle()), self.fattr(&i)))
    }

    async fn create_exclusive(
        &self,
        dir: &NfsHandle,
        name: &filename3<'_>,
        verf: createverf3,
    ) -> Result<NfsHandle, nfsstat3> {
        self.inode("create", dir).await?;
        let (atime, mtime) = verifier_times(&verf);
        let caller = self.caller.clone();
        match self
            .client
            .create(
                dir.id(),
                name.0.as_ref(),
                FileKind::File,
                0o600,
                0,
                true,
                &caller,
            )
            .await
        {
            Ok(i) => {
                let set = SetAttr {
                    atime: Some(atime),
                    mtime: Some(mtime),
                    ..SetAttr::default()
                };
                let i = self
                    .client
                    .setattr(i.id, set, &caller)
                    .await
                    .map_err(|e| fail("create", i.id, &e))?;
                Ok(NfsHandle::new(i.handle()))
            }
            Err(e) if e.code == morris_client::ErrorCode::Exists => {
                // A retransmission of our own create carries the same verifier.
                let i = self
                    .client
                    .lookup(dir.id(), name.0.as_ref())
                    .await
                    .map_err(|e| fail("create", dir.id(), &e))?;
                if i.attr.kind == FileKind::File && i.attr.atime == atime && i.attr.mtime == mtime {
                    Ok(NfsHandle::new(i.handle()))
                } else {
                    Err(nfsstat3::NFS3ERR_EXIST)
                }
            }
            Err(e) => Err(fail("create", dir.id(), &e)),
        }
    }

    async fn mkdir(
        &self,
        dir: &NfsHandle,
        name: &filename3<'_>,
    ) -> Result<(NfsHandle, fattr3), nfsstat3> {
        self.inode("mkdir", dir).await?;
        match self
            .client
            .mkdir(dir.id(), name.0.as_ref(), 0o755, &self.caller)
            .await
        {
            Ok(i) => Ok((NfsHandle::new(i.handle()), self.fattr(&i))),
            Err(e) => Err(fail("mkdir", dir.id(), &e)),
        }
    }

    /// nfs3_server sends REMOVE and RMDIR here alike, so the gateway answers
    /// both itself (`local.rs`); should a call get here all the same, it is
    /// taken as REMOVE, which never removes a directory.
    async fn remove(&self, dir: &NfsHandle, name: &filename3<'_>) -> Result<(), nfsstat3> {
        self.inode("remove", dir).await?;
        self.unlink(dir.id(), name.0.as_ref()).await
    }

    async fn rename<'a>(
        &self,
        from_dir: &NfsHandle,
        from_name: &filename3<'a>,
        to_dir: &NfsHandle,
        to_name: &filename3<'a>,
    ) -> Result<(), nfsstat3> {
        self.inode("rename", from_dir).await?;
        self.inode("rename", to_dir).await?;
        self.client
            .rename(
                from_dir.id(),
                from_name.0.as_ref(),
                to_dir.id(),
                to_name.0.as_ref(),
                RenameFlags::default(),
                &self.caller,
            )
            .await
            .map_err(|e| fail("rename", from_dir.id(), &e))
    }

    async fn symlink<'a>(
        &self,
        dir: &NfsHandle,
        name: &filename3<'a>,
        target: &nfspath3<'a>,
        attr: &sattr3,
    ) -> Result<(NfsHandle, fattr3), nfsstat3> {
        self.inode("symlink", dir).await?;
        let i = self
            .client
            .symlink(dir.id(), name.0.as_ref(), target.0.as_ref(), &self.caller)
            .await
            .map_err(|e| fail("symlink", dir.id(), &e))?;
        // Symlink modes are meaningless; owner and times are kept.
        let i = self.apply_sattr("symlink", i, attr, true).await?;
        Ok((NfsHandle::new(i.handle()), self.fattr(&i)))
    }

    async fn commit(&self, id: &NfsHandle, _offset: u64, _count: u32) -> Result<(), nfsstat3> {
        let i = self.inode("commit", id).await?;
        match i.attr.kind {
            FileKind::File => {}
            // As Linux's NFS server and nfs-ganesha answer.
            FileKind::Dir => return Err(nfsstat3::NFS3ERR_ISDIR),
            _ => return Err(nfsstat3::NFS3ERR_INVAL),
        }
        let fh = match self.files.writer(id.id()) {
            Some(fh) => fh,
            None => self
                .files
                .get(id.id(), false)
                .await
                .map_err(|e| fail("commit", id.id(), &e))?,
        };
        if let Err(e) = self.client.fsync(fh.fh(), false).await {
            // A lost write sticks to the open file that saw it: the next
            // call gets a fresh one.
            drop(fh);
            self.files.drop_file(id.id()).await;
            return Err(fail("commit", id.id(), &e));
        }
        Ok(())
    }
}

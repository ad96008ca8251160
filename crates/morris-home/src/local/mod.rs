//! A local directory as home (`file:///path`): any mounted file system,
//! including an NFS or FUSE mount.
//!
//! Objects are named by their inode number, birth time and path below the
//! home directory (see `handle`); every use of a handle finds the path again
//! beneath the home directory without following any symlink, and answers
//! [`HomeError::Stale`] if what it finds is not the same object. So, unlike
//! an NFS server's, a local home's handle does not survive a rename at home.
//!
//! Every file-system call runs on a blocking thread, at most
//! [`HomeOptions::parallel`] at once, each bounded by
//! [`HomeOptions::timeout`] (a hung mount gives [`HomeError::Unreachable`]).
//! Only regular files are read or written: a fifo or a device is never
//! opened. The write side (`write`) makes changes to names durable before
//! it returns, as an NFS server does.

mod handle;
mod ops;
mod pool;
mod write;

use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;

use bytes::Bytes;

use crate::{
    DirPage, Home, HomeAttr, HomeError, HomeHandle, HomeNew, HomeOptions, HomeSetAttr, HomeUrl,
    ReadReply, Result,
};
use handle::Decoded;
use ops::Shown;
use pool::Pool;

/// Most bytes one read returns.
const MAX_READ: u32 = 1 << 20;

/// Most bytes one write takes.
const MAX_WRITE: u32 = 1 << 20;

/// A local directory as home.
#[derive(Debug)]
pub struct LocalHome {
    url: HomeUrl,
    root: Arc<PathBuf>,
    pool: Pool,
}

impl LocalHome {
    /// Opens the directory `url` names (which must exist and be a
    /// directory).
    pub async fn open(url: HomeUrl, options: HomeOptions) -> Result<Self> {
        let HomeUrl::Local { path } = &url else {
            return Err(HomeError::Invalid(format!("{url} is not a file:// URL")));
        };
        if !path.is_absolute() {
            return Err(HomeError::Invalid(format!(
                "home directory {} is not an absolute path",
                path.display()
            )));
        }
        let root = Arc::new(path.clone());
        let pool = Pool::new(options.parallel, options.timeout);
        let r = root.clone();
        pool.run(|| root.display().to_string(), move || ops::check_root(&r))
            .await?;
        tracing::debug!(root = %root.display(), "local home opened");
        Ok(LocalHome { url, root, pool })
    }

    /// Runs `f` on the object `h` names (or on its entry `name`), on a
    /// blocking thread.
    async fn on<T, F>(&self, h: &HomeHandle, name: Option<&[u8]>, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&std::path::Path, &Decoded) -> Result<T> + Send + 'static,
    {
        let Some(d) = Decoded::decode(h) else {
            tracing::debug!(?h, "not a local home handle");
            return Err(HomeError::Stale);
        };
        let root = self.root.clone();
        let shown = match name {
            Some(n) => Shown(&self.root, &d.child_path(n)).to_string(),
            None => Shown(&self.root, &d.path).to_string(),
        };
        self.pool.run(move || shown, move || f(&root, &d)).await
    }
}

#[async_trait]
impl Home for LocalHome {
    fn url(&self) -> &HomeUrl {
        &self.url
    }

    async fn root(&self) -> Result<(HomeHandle, HomeAttr)> {
        let root = self.root.clone();
        self.pool
            .run(|| self.root.display().to_string(), move || ops::root(&root))
            .await
    }

    async fn lookup(&self, dir: &HomeHandle, name: &[u8]) -> Result<(HomeHandle, HomeAttr)> {
        if !handle::valid_name(name) {
            return Err(HomeError::Invalid(format!(
                "{:?} is not a name",
                String::from_utf8_lossy(name)
            )));
        }
        tracing::trace!(?dir, name = %String::from_utf8_lossy(name), "lookup");
        let owned = name.to_vec();
        self.on(dir, Some(name), move |root, d| ops::lookup(root, d, &owned))
            .await
    }

    async fn getattr(&self, handle: &HomeHandle) -> Result<HomeAttr> {
        tracing::trace!(?handle, "getattr");
        self.on(handle, None, ops::getattr).await
    }

    async fn read_dir(
        &self,
        dir: &HomeHandle,
        cookie: u64,
        _verifier: [u8; 8],
        max_entries: usize,
        plus: bool,
    ) -> Result<DirPage> {
        tracing::trace!(?dir, cookie, max_entries, plus, "read_dir");
        self.on(dir, None, move |root, d| {
            ops::read_dir(root, d, cookie, max_entries, plus)
        })
        .await
    }

    async fn read(&self, handle: &HomeHandle, offset: u64, len: u32) -> Result<ReadReply> {
        tracing::trace!(?handle, offset, len, "read");
        let len = len.min(MAX_READ);
        self.on(handle, None, move |root, d| ops::read(root, d, offset, len))
            .await
    }

    async fn read_link(&self, handle: &HomeHandle) -> Result<Vec<u8>> {
        tracing::trace!(?handle, "read_link");
        self.on(handle, None, ops::read_link).await
    }

    fn max_read(&self) -> u32 {
        MAX_READ
    }

    async fn create(
        &self,
        dir: &HomeHandle,
        name: &[u8],
        what: &HomeNew,
        attr: &HomeSetAttr,
    ) -> Result<(HomeHandle, HomeAttr)> {
        tracing::trace!(?dir, name = %String::from_utf8_lossy(name), ?what, "create");
        let (name, what, attr) = (name.to_vec(), what.clone(), attr.clone());
        self.on(dir, Some(&name.clone()), move |root, d| {
            write::create(root, d, &name, &what, &attr)
        })
        .await
    }

    async fn write(&self, handle: &HomeHandle, offset: u64, data: Bytes) -> Result<u32> {
        tracing::trace!(?handle, offset, len = data.len(), "write");
        if data.len() > MAX_WRITE as usize {
            return Err(HomeError::Invalid(format!(
                "a write of {} bytes is more than {MAX_WRITE}",
                data.len()
            )));
        }
        self.on(handle, None, move |root, d| {
            write::write(root, d, offset, &data)
        })
        .await
    }

    async fn commit(&self, handle: &HomeHandle) -> Result<()> {
        tracing::trace!(?handle, "commit");
        self.on(handle, None, write::commit).await
    }

    async fn setattr(&self, handle: &HomeHandle, set: &HomeSetAttr) -> Result<HomeAttr> {
        tracing::trace!(?handle, ?set, "setattr");
        let set = set.clone();
        self.on(handle, None, move |root, d| write::setattr(root, d, &set))
            .await
    }

    async fn remove(&self, dir: &HomeHandle, name: &[u8]) -> Result<()> {
        tracing::trace!(?dir, name = %String::from_utf8_lossy(name), "remove");
        let owned = name.to_vec();
        self.on(dir, Some(name), move |root, d| {
            write::remove(root, d, &owned, false)
        })
        .await
    }

    async fn rmdir(&self, dir: &HomeHandle, name: &[u8]) -> Result<()> {
        tracing::trace!(?dir, name = %String::from_utf8_lossy(name), "rmdir");
        let owned = name.to_vec();
        self.on(dir, Some(name), move |root, d| {
            write::remove(root, d, &owned, true)
        })
        .await
    }

    async fn rename(
        &self,
        from_dir: &HomeHandle,
        from: &[u8],
        to_dir: &HomeHandle,
        to: &[u8],
    ) -> Result<()> {
        tracing::trace!(
            ?from_dir,
            from = %String::from_utf8_lossy(from),
            ?to_dir,
            to = %String::from_utf8_lossy(to),
            "rename"
        );
        let Some(td) = Decoded::decode(to_dir) else {
            return Err(HomeError::Stale);
        };
        let (from, to) = (from.to_vec(), to.to_vec());
        self.on(from_dir, Some(&from.clone()), move |root, fd| {
            write::rename(root, fd, &from, &td, &to)
        })
        .await
    }

    async fn link(
        &self,
        target: &HomeHandle,
        dir: &HomeHandle,
        name: &[u8],
    ) -> Result<(HomeHandle, HomeAttr)> {
        tracing::trace!(?target, ?dir, name = %String::from_utf8_lossy(name), "link");
        let Some(t) = Decoded::decode(target) else {
            return Err(HomeError::Stale);
        };
        let owned = name.to_vec();
        self.on(dir, Some(name), move |root, d| {
            write::link(root, &t, d, &owned)
        })
        .await
    }

    fn max_write(&self) -> u32 {
        MAX_WRITE
    }

    fn identity<'a>(&self, handle: &'a HomeHandle) -> &'a [u8] {
        handle::identity(handle)
    }
}

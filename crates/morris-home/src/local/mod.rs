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
//! Only regular files are read: a fifo or a device is never opened.

mod handle;
mod ops;
mod pool;

use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;

use crate::{
    DirPage, Home, HomeAttr, HomeError, HomeHandle, HomeOptions, HomeUrl, ReadReply, Result,
};
use handle::Decoded;
use ops::Shown;
use pool::Pool;

/// Most bytes one read returns.
const MAX_READ: u32 = 1 << 20;

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

    fn identity<'a>(&self, handle: &'a HomeHandle) -> &'a [u8] {
        handle::identity(handle)
    }
}

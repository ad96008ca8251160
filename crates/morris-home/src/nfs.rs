//! An NFSv3 export as home. PLACEHOLDER: replaced by the real backend before this lands on main.

use crate::{HomeError, HomeOptions, HomeUrl, Result};

/// An NFSv3 export as home.
#[derive(Debug)]
pub struct NfsHome;

impl NfsHome {
    /// Mounts the export `url` names.
    pub async fn open(_url: HomeUrl, _options: HomeOptions) -> Result<Self> {
        Err(HomeError::Invalid("not built yet".into()))
    }
}

#[async_trait::async_trait]
impl crate::Home for NfsHome {
    fn url(&self) -> &HomeUrl {
        unreachable!("placeholder")
    }
    async fn root(&self) -> Result<(crate::HomeHandle, crate::HomeAttr)> {
        Err(HomeError::Invalid("not built yet".into()))
    }
    async fn lookup(
        &self,
        _dir: &crate::HomeHandle,
        _name: &[u8],
    ) -> Result<(crate::HomeHandle, crate::HomeAttr)> {
        Err(HomeError::Invalid("not built yet".into()))
    }
    async fn getattr(&self, _h: &crate::HomeHandle) -> Result<crate::HomeAttr> {
        Err(HomeError::Invalid("not built yet".into()))
    }
    async fn read_dir(
        &self,
        _d: &crate::HomeHandle,
        _c: u64,
        _v: [u8; 8],
        _m: usize,
        _p: bool,
    ) -> Result<crate::DirPage> {
        Err(HomeError::Invalid("not built yet".into()))
    }
    async fn read(&self, _h: &crate::HomeHandle, _o: u64, _l: u32) -> Result<crate::ReadReply> {
        Err(HomeError::Invalid("not built yet".into()))
    }
    async fn read_link(&self, _h: &crate::HomeHandle) -> Result<Vec<u8>> {
        Err(HomeError::Invalid("not built yet".into()))
    }
    fn max_read(&self) -> u32 {
        0
    }
}

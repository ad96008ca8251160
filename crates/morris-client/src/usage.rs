//! What each user and group stores in the volume (`morris quota`): every
//! server answers for the metadata ranges it serves (`Request::Usage`;
//! the servers keep the counts with the inodes, `store/usage.rs`), and
//! the client adds the ranges up, each once.

use std::time::Duration;

use morris_proto::quota::volume_usage;
use morris_proto::{ErrorCode, Reply, Request, UsageRow};

use crate::pool::unexpected;
use crate::{Client, Error, Result};

/// How long a server may take to answer.
const USAGE_WAIT: Duration = Duration::from_secs(10);

impl Client {
    /// Inodes and bytes (of regular files, one copy) each user and each
    /// group stores in the whole volume, users first, by id. Fails if no
    /// server answers for some metadata range (its server and every copy
    /// down), rather than count it as empty.
    pub async fn usage(&self) -> Result<Vec<UsageRow>> {
        let mut answers = Vec::new();
        let mut last_err = None;
        for r in self.ask_every_server(&Request::Usage, USAGE_WAIT).await {
            match r {
                Ok(Reply::Usage(list)) => answers.extend(list),
                Ok(other) => return Err(unexpected(&other)),
                Err(e) => last_err = Some(e),
            }
        }
        volume_usage(self.layout.servers, answers).map_err(|missing| {
            let why = last_err.map_or_else(String::new, |e| format!(": {e}"));
            Error::new(
                ErrorCode::Unavailable,
                format!("no server answered for metadata range {missing}{why}"),
            )
        })
    }
}

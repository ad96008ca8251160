//! Quotas at the servers: a server refuses a new inode (`CreateInode`,
//! `CreateInodeAt`) whose owner or group has reached its inode limit, so
//! that a client which does not check (`morris-client/src/quota.rs` does)
//! is held to the limits too.
//!
//! Each server keeps a verdict made as a client's is (`morris_proto::quota`):
//! the limits from the root directory's range (`Quotas`) and every range's
//! counts (`Usage`, asked only while a limit is set), refreshed in the
//! background every [`FRESH`], so a new limit holds within that. A create checks
//! it without waiting: before the first verdict, or while the counts
//! cannot all be had, the last verdict (or none) stands.
//!
//! Bytes are checked by the clients only: the servers storing a file's
//! bytes do not know its owner, and refusing the size a writer saves after
//! its bytes are stored would leave them past the end.

use std::sync::Weak;
use std::time::Duration;

use morris_proto::quota::{volume_usage, Charge, Over};
use morris_proto::{Attr, ErrorCode, Reply, Request, WireError, ROOT_ID};
use tracing::debug;

use super::Server;
use crate::store::{OpKey, Store};

/// How old a verdict may be.
const FRESH: Duration = Duration::from_secs(2);
/// How long one server may take to answer for its counts.
const USAGE_WAIT: Duration = Duration::from_secs(5);

/// This server's verdict: `None` while no limit is set (or none known).
#[derive(Debug, Default)]
pub(super) struct QuotaVerdict(parking_lot::Mutex<Option<Over>>);

impl Server {
    /// Refreshes the verdict for as long as the server runs.
    pub(crate) async fn quota_loop(this: Weak<Server>) {
        loop {
            let Some(me) = this.upgrade() else { return };
            if let Err(e) = me.refresh_quota_verdict().await {
                debug!(error = %e, "quota verdict not refreshed; the last one stands");
            }
            drop(me);
            tokio::time::sleep(FRESH).await;
        }
    }

    /// Makes a new verdict.
    async fn refresh_quota_verdict(&self) -> Result<(), WireError> {
        let Some(vol) = self.store.formatted() else {
            return Ok(());
        };
        let limits = match self.range_ask(&vol, ROOT_ID, &Request::Quotas).await? {
            Reply::Quotas(l) => l,
            other => {
                return Err(WireError::new(
                    ErrorCode::Protocol,
                    format!("unexpected answer to Quotas: {other:?}"),
                ))
            }
        };
        if limits.is_empty() {
            *self.quota.0.lock() = None;
            return Ok(());
        }
        let calls =
            (0..vol.layout.servers).map(|i| {
                let vol = &vol;
                async move {
                    tokio::time::timeout(USAGE_WAIT, self.peer_ask(vol, i, &Request::Usage)).await
                }
            });
        let mut answers = Vec::new();
        for r in futures::future::join_all(calls).await {
            if let Ok(Ok(Reply::Usage(list))) = r {
                answers.extend(list);
            }
        }
        let usage = volume_usage(vol.layout.servers, answers).map_err(|missing| {
            WireError::new(
                ErrorCode::Unavailable,
                format!("no server answered for metadata range {missing}"),
            )
        })?;
        *self.quota.0.lock() = Some(Over::of(&limits, &usage));
        Ok(())
    }

    /// Refuses a new inode with `attr` if its owner or group is at its
    /// inode limit.
    pub(super) fn check_inode_quota(&self, attr: &Attr) -> Result<(), WireError> {
        let v = self.quota.0.lock();
        match v
            .as_ref()
            .and_then(|o| o.refusal(attr.uid, attr.gid, Charge::Inode))
        {
            Some(why) => Err(WireError::new(ErrorCode::QuotaExceeded, why)),
            None => Ok(()),
        }
    }

    /// [`Server::check_inode_quota`] for a create with operation key `op`,
    /// except that a repeat of a create that ran here (the client resent
    /// it: its answer was lost) is let through, to be answered with the
    /// inode the first try made, even if the verdict turned in between.
    pub(super) fn check_inode_quota_unless_repeat(
        &self,
        store: &Store,
        op: Option<OpKey>,
        attr: &Attr,
    ) -> Result<(), WireError> {
        match self.check_inode_quota(attr) {
            Err(e) if !store.ran_before(op)? => Err(e),
            _ => Ok(()),
        }
    }
}

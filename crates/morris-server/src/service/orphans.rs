//! `DropLink`, `SetOpen` and `Reap`: keeping an unnamed inode while a
//! client has it open (the store's side is `store/orphans.rs`).
//!
//! A client's open records count while the client is alive, which for this
//! server means: it has sent something here within two lease times. A
//! client with records keeps every server it has records at renewed, as it
//! does with leases. After a start (or a takeover) nobody has been heard
//! from yet, so `Reap` waits out the range's grace period like the
//! lease-taking requests (`takes_lease`), by which time every live client
//! has renewed.

use std::collections::HashMap;
use std::sync::Arc;

use morris_proto::messages::LeaseMode;
use morris_proto::{ErrorCode, Reply, Request, WireError};

use super::{metadata, Server};
use crate::leases::{ClientId, Millis};
use crate::store::{Formatted, OpKey, Store};

/// Whether a client id is alive, as of one moment.
pub(crate) struct Liveness {
    seen: HashMap<ClientId, Millis>,
    now: Millis,
    window: Millis,
}

impl Liveness {
    /// True if `client` was heard from within the window.
    pub(crate) fn live(&self, client: u64) -> bool {
        self.seen
            .get(&client)
            .is_some_and(|&t| self.now.saturating_sub(t) <= self.window)
    }
}

impl Server {
    /// Which clients count as alive now.
    pub(super) fn liveness(&self) -> impl Fn(u64) -> bool + Send + 'static {
        let l = Liveness {
            seen: self.seen.lock().clone(),
            now: self.now_ms(),
            window: Millis::from(self.lease_ms) * 2,
        };
        move |c| l.live(c)
    }

    /// Runs `DropLink`, `SetOpen` or `Reap` on `store`, the range's copy.
    pub(super) async fn orphan_op(
        &self,
        vol: &Formatted,
        store: Arc<Store>,
        client: ClientId,
        conn_id: u64,
        req: Request,
    ) -> Result<Reply, WireError> {
        match req {
            Request::DropLink { ino, op } => {
                Self::check_owner(vol, ino.id)?;
                let op = OpKey::new(client, op);
                self.leased(client, conn_id, ino, LeaseMode::Write, move || {
                    store.drop_link(ino, op)
                })
                .await
                .map(Reply::Inode)
            }
            Request::SetOpen { ino, open, op } => {
                Self::check_owner(vol, ino.id)?;
                let op = OpKey::new(client, op);
                metadata(move || store.set_open(ino, client, open, op))?;
                Ok(Reply::Ok)
            }
            Request::Reap { ino, op } => {
                Self::check_owner(vol, ino.id)?;
                let op = OpKey::new(client, op);
                let live = self.liveness();
                let gone = metadata(move || store.reap(ino, &live, op))?;
                if gone.is_some() {
                    tracing::debug!(ino = ino.id, "orphan removed");
                }
                Ok(Reply::Reaped(gone))
            }
            other => Err(WireError::new(
                ErrorCode::Protocol,
                format!("{} is not an orphan request", other.name()),
            )),
        }
    }
}

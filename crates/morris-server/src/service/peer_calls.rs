//! The servers' requests to each other outside metadata mirroring: one
//! connection per server (an admin session), and the requests about a
//! metadata range sent to whichever copy serves it now. Used by the
//! write-back's pusher (`pusher.rs`).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use morris_proto::net::RpcClient;
use morris_proto::{ErrorCode, FileId, Reply, Request, WireError, PROTOCOL_VERSION};
use parking_lot::Mutex;

use super::{err, Server};
use crate::store::Formatted;

/// Longest a server-to-server request may take (a data push of a large
/// file's share takes long; everything else is quick).
const CALL_TIMEOUT: Duration = Duration::from_secs(600);

/// Connections of this server to the others, for the pusher's requests,
/// and the metadata range copies whose bindings it has learnt.
#[derive(Default)]
pub(crate) struct PeerConns {
    pub(super) conns: Mutex<HashMap<u32, Arc<RpcClient>>>,
    pub(super) learnt: Mutex<HashSet<(u32, usize)>>,
    /// Wakes the pusher before its next tick (a flush is waiting).
    pub(super) wake: tokio::sync::Notify,
}

impl Server {
    /// A connection to server `i` (made on first use; again after a loss).
    pub(super) async fn peer_rpc(
        &self,
        vol: &Formatted,
        i: u32,
    ) -> Result<Arc<RpcClient>, WireError> {
        if let Some(c) = self.pusher_conns.conns.lock().get(&i) {
            if !c.is_closed() {
                return Ok(c.clone());
            }
        }
        let addr = vol
            .descriptor
            .servers
            .get(i as usize)
            .ok_or_else(|| err(ErrorCode::Invalid, format!("no server {i}")))?;
        let unavailable =
            |e: String| err(ErrorCode::Unavailable, format!("server {i} ({addr}): {e}"));
        let c = tokio::time::timeout(
            Duration::from_secs(5),
            RpcClient::connect(addr, &self.keys.credential(), None),
        )
        .await
        .map_err(|_| unavailable("connect timed out".into()))?
        .map_err(|e| unavailable(e.to_string()))?;
        let hello = Request::Hello {
            volume: None,
            client_id: rand::random(),
            client_name: "pusher".into(),
            version: PROTOCOL_VERSION,
        };
        c.call(&hello, Bytes::new())
            .await
            .map_err(|e| unavailable(e.to_string()))?;
        let c = Arc::new(c);
        self.pusher_conns.conns.lock().insert(i, c.clone());
        Ok(c)
    }

    /// One request to server `i`.
    pub(super) async fn peer_ask(
        &self,
        vol: &Formatted,
        i: u32,
        req: &Request,
    ) -> Result<Reply, WireError> {
        let c = self.peer_rpc(vol, i).await?;
        match tokio::time::timeout(CALL_TIMEOUT, c.call(req, Bytes::new())).await {
            Ok(Ok((r, _))) => Ok(r),
            Ok(Err(morris_proto::net::RpcError::Remote(e))) => Err(e),
            Ok(Err(e)) => {
                self.pusher_conns.conns.lock().remove(&i);
                Err(err(ErrorCode::Unavailable, format!("server {i}: {e}")))
            }
            Err(_) => {
                self.pusher_conns.conns.lock().remove(&i);
                Err(err(
                    ErrorCode::Unavailable,
                    format!("server {i}: no answer"),
                ))
            }
        }
    }

    /// A request about object `id`, to whichever copy of its metadata
    /// range serves it now.
    pub(super) async fn range_ask(
        &self,
        vol: &Formatted,
        id: FileId,
        req: &Request,
    ) -> Result<Reply, WireError> {
        self.range_ask_r(vol, vol.layout.inode_server(id), req)
            .await
    }

    /// A request to whichever copy of metadata range `range` serves it now.
    pub(super) async fn range_ask_r(
        &self,
        vol: &Formatted,
        range: u32,
        req: &Request,
    ) -> Result<Reply, WireError> {
        let k = vol.layout.servers;
        let mut last = err(ErrorCode::Unavailable, "no copy of the range answers");
        for c in 0..vol.layout.replicas.max(1) {
            let s = (range + c) % k;
            match self.peer_ask(vol, s, req).await {
                Ok(r) => return Ok(r),
                Err(e)
                    if matches!(
                        e.code,
                        ErrorCode::Unavailable | ErrorCode::NotOwner | ErrorCode::Grace
                    ) =>
                {
                    last = e;
                }
                Err(e) => return Err(e),
            }
        }
        Err(last)
    }
}

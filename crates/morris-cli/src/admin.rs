//! Admin connections to stripe servers: hello, calls with deadlines, and the
//! retry on `Grace` that lease-taking requests need after a server restart.

use std::future::Future;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use bytes::Bytes;
use morris_proto::auth::Key;
use morris_proto::net::{RpcClient, RpcError};
use morris_proto::{ErrorCode, Reply, Request, VolumeDescriptor, PROTOCOL_VERSION};
use tracing::debug;
use uuid::Uuid;

/// How long admin commands wait for a server to connect and say hello.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// An open session with one stripe server.
pub struct Session {
    rpc: RpcClient,
    /// The address connected to.
    pub addr: String,
    /// The server's index in its volume, if formatted.
    pub index: Option<u32>,
    /// The server's volume descriptor, if formatted.
    pub descriptor: Option<VolumeDescriptor>,
    /// The server's lease duration.
    pub lease_ms: u32,
}

/// A random client id for a session.
pub fn random_client_id() -> u64 {
    let (a, b) = Uuid::new_v4().as_u64_pair();
    a ^ b
}

/// Runs `fut` with a deadline, naming `what` when it runs out.
pub async fn deadline<T>(
    limit: Duration,
    what: impl FnOnce() -> String,
    fut: impl Future<Output = Result<T>>,
) -> Result<T> {
    match tokio::time::timeout(limit, fut).await {
        Ok(r) => r,
        Err(_) => Err(anyhow!(
            "{}: no answer within {:.1} s",
            what(),
            limit.as_secs_f64()
        )),
    }
}

impl Session {
    /// Connects to `addr` and says hello. `volume: None` opens an admin session
    /// (no leases); `Some(uuid)` joins that volume as client `client_id`.
    pub async fn open(
        addr: &str,
        key: &Key,
        volume: Option<Uuid>,
        client_id: u64,
        name: &str,
        limit: Duration,
    ) -> Result<Session> {
        deadline(
            limit,
            || format!("server {addr}"),
            Self::open_inner(addr, key, volume, client_id, name),
        )
        .await
    }

    async fn open_inner(
        addr: &str,
        key: &Key,
        volume: Option<Uuid>,
        client_id: u64,
        name: &str,
    ) -> Result<Session> {
        let rpc = RpcClient::connect(addr, key, None)
            .await
            .map_err(|e| anyhow!("{e}"))?;
        let hello = Request::Hello {
            volume,
            client_id,
            client_name: name.to_string(),
            version: PROTOCOL_VERSION,
        };
        let (reply, _) = rpc
            .call(&hello, Bytes::new())
            .await
            .map_err(|e| anyhow!("server {addr} refused hello: {e}"))?;
        match reply {
            Reply::Hello {
                index,
                epoch,
                descriptor,
                lease_ms,
            } => {
                debug!(%addr, ?index, epoch, lease_ms, "hello");
                Ok(Session {
                    rpc,
                    addr: addr.to_string(),
                    index,
                    descriptor,
                    lease_ms,
                })
            }
            other => bail!("server {addr} answered hello with {other:?}"),
        }
    }

    /// Sends one request (without payload) and returns the reply.
    pub async fn call(&self, req: &Request) -> Result<Reply, RpcError> {
        self.rpc.call(req, Bytes::new()).await.map(|(r, _)| r)
    }

    /// Like [`Session::call`] with an error that names the server and request.
    pub async fn ask(&self, req: &Request) -> Result<Reply> {
        self.call(req)
            .await
            .with_context(|| format!("{} to server {}", req.name(), self.addr))
    }

    /// Sends a lease-taking request, retrying with backoff while the server
    /// answers `Grace` (it restarted less than a lease ago), for at most `limit`.
    pub async fn call_through_grace(
        &self,
        req: &Request,
        limit: Duration,
    ) -> Result<Reply, RpcError> {
        let start = tokio::time::Instant::now();
        let mut wait = Duration::from_millis(100);
        loop {
            match self.call(req).await {
                Err(RpcError::Remote(e))
                    if e.code == ErrorCode::Grace && start.elapsed() + wait < limit =>
                {
                    debug!(addr = %self.addr, req = req.name(), "server in grace; retrying");
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(Duration::from_secs(2));
                }
                other => return other,
            }
        }
    }
}

/// An error for a reply of the wrong kind.
pub fn unexpected(req: &Request, addr: &str, reply: &Reply) -> anyhow::Error {
    anyhow!(
        "server {addr} answered {} with an unexpected {reply:?}",
        req.name()
    )
}

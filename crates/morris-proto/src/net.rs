//! A multiplexed RPC connection over TCP.
//!
//! One socket carries many requests at once, each tagged with an id; replies
//! come back in any order. The server may push [`Push`] frames on the same
//! socket. Payloads travel as `Bytes`: the receiver's payload is a slice of the
//! frame buffer, the sender's is written straight from the caller's buffer.

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use futures::stream::FuturesUnordered;
use futures::StreamExt;
use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, BufWriter};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot, Semaphore};
use tokio_util::codec::{FramedRead, LengthDelimitedCodec};
use tracing::{debug, warn};

use crate::auth::{handshake, HandshakeError, Key, Keys, Role};
use crate::error::{ErrorCode, WireError};
use crate::frame::{
    decode_frame, decode_push, decode_request, decode_response, encode_frame_head, FrameKind,
    MAX_FRAME,
};
use crate::messages::{Push, Reply, Request};
use crate::tls;

/// The receiving half of a connection (a TCP socket's, or a TLS session's).
type ReadHalf = Box<dyn AsyncRead + Send + Unpin>;
/// The sending half of a connection.
type WriteHalf = Box<dyn AsyncWrite + Send + Unpin>;

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
pub enum RpcError {
    /// The server answered with an error.
    #[error("{0}")]
    Remote(#[from] WireError),
    /// The connection is closed or was lost before the answer came.
    #[error("connection to {0} lost")]
    Disconnected(String),
    /// The connection could not be made.
    #[error("cannot connect to {addr}: {source}")]
    Connect {
        /// The address.
        addr: String,
        /// The cause.
        source: std::io::Error,
    },
    /// The request could not be encoded (too large).
    #[error("cannot encode request: {0}")]
    Encode(String),
    /// The handshake failed: the server refused our key, or it does not
    /// hold the volume's key itself.
    #[error("{addr}: handshake failed: {source}")]
    Auth {
        /// The address.
        addr: String,
        /// Why.
        source: HandshakeError,
    },
}

impl RpcError {
    /// The protocol error class this failure maps to.
    pub fn code(&self) -> ErrorCode {
        match self {
            RpcError::Remote(e) => e.code,
            RpcError::Disconnected(_) | RpcError::Connect { .. } => ErrorCode::Unavailable,
            RpcError::Encode(_) => ErrorCode::Invalid,
            RpcError::Auth {
                source: HandshakeError::Io(_),
                ..
            } => ErrorCode::Unavailable,
            RpcError::Auth { .. } => ErrorCode::Denied,
        }
    }
}

/// The sending half of a socket, shared by every task that sends on it: each
/// frame is written whole under the lock, straight from the caller's task (no
/// hop through a writer task on the request path).
struct Writer {
    w: tokio::sync::Mutex<BufWriter<WriteHalf>>,
    closed: Arc<AtomicBool>,
    /// Cancelled when a write fails or stalls: the connection's reader stops.
    gone: tokio_util::sync::CancellationToken,
    /// Longest one piece of a frame may take to be written.
    stall: std::time::Duration,
}

/// Bytes written at a time, each within the stall limit.
const WRITE_PIECE: usize = 1 << 20;

/// `fut` within `stall`, as an I/O error otherwise.
async fn within<T>(
    stall: std::time::Duration,
    fut: impl Future<Output = std::io::Result<T>>,
) -> std::io::Result<T> {
    match tokio::time::timeout(stall, fut).await {
        Ok(r) => r,
        Err(_) => Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("no write progress in {} s", stall.as_secs()),
        )),
    }
}

impl Writer {
    fn new(wr: WriteHalf, closed: Arc<AtomicBool>, stall: std::time::Duration) -> Arc<Self> {
        Arc::new(Writer {
            w: tokio::sync::Mutex::new(BufWriter::with_capacity(64 << 10, wr)),
            closed,
            gone: tokio_util::sync::CancellationToken::new(),
            stall,
        })
    }

    async fn send(&self, head: &[u8], payload: &[u8]) -> std::io::Result<()> {
        if self.closed.load(Ordering::SeqCst) {
            return Err(std::io::ErrorKind::BrokenPipe.into());
        }
        let mut w = self.w.lock().await;
        if self.closed.load(Ordering::SeqCst) {
            return Err(std::io::ErrorKind::BrokenPipe.into());
        }
        let r = async {
            within(self.stall, w.write_all(head)).await?;
            for piece in payload.chunks(WRITE_PIECE) {
                within(self.stall, w.write_all(piece)).await?;
            }
            within(self.stall, w.flush()).await
        }
        .await;
        if let Err(e) = &r {
            if e.kind() == std::io::ErrorKind::TimedOut {
                warn!(error = %e, "the peer stopped reading; closing the connection");
            }
            self.closed.store(true, Ordering::SeqCst);
            self.gone.cancel();
            // Not `w.shutdown()`: it would flush what the peer does not read.
            let _ = w.get_mut().shutdown().await;
        }
        r
    }

    async fn close(&self) {
        let stalled = self.gone.is_cancelled();
        self.closed.store(true, Ordering::SeqCst);
        self.gone.cancel();
        let mut w = self.w.lock().await;
        if !stalled {
            let _ = within(self.stall, w.flush()).await;
        }
        let _ = w.get_mut().shutdown().await;
    }
}

type Pending = Arc<Mutex<HashMap<u64, oneshot::Sender<Result<(Reply, Bytes), RpcError>>>>>;

/// The client end of a connection.
pub struct RpcClient {
    addr: String,
    writer: Arc<Writer>,
    pending: Pending,
    next_id: AtomicU64,
    closed: Arc<AtomicBool>,
}

impl RpcClient {
    /// Connects to `addr` and proves it holds `key` (the handshake, in
    /// [`crate::auth::handshake`]); pushes from the server go to `pushes`.
    pub async fn connect(
        addr: &str,
        key: &Key,
        pushes: Option<mpsc::UnboundedSender<Push>>,
    ) -> Result<Self, RpcError> {
        let stream = TcpStream::connect(addr)
            .await
            .map_err(|source| RpcError::Connect {
                addr: addr.to_string(),
                source,
            })?;
        let _ = stream.set_nodelay(true);
        keepalive(&stream);
        let auth = |source| RpcError::Auth {
            addr: addr.to_string(),
            source,
        };
        let (rd, wr) = match tokio::time::timeout(HANDSHAKE_TIMEOUT, open_client(stream, key)).await
        {
            Ok(r) => r.map_err(auth)?,
            Err(_) => {
                return Err(auth(HandshakeError::Io(format!(
                    "no answer in {} s",
                    HANDSHAKE_TIMEOUT.as_secs()
                ))))
            }
        };
        let pending: Pending = Arc::new(Mutex::new(HashMap::new()));
        let closed = Arc::new(AtomicBool::new(false));
        let writer = Writer::new(wr, closed.clone(), WRITE_STALL);
        let reader_pending = pending.clone();
        let reader_closed = closed.clone();
        let reader_addr = addr.to_string();
        tokio::spawn(async move {
            let mut frames = FramedRead::new(rd, codec());
            while let Some(item) = frames.next().await {
                let body = match item {
                    Ok(b) => b.freeze(),
                    Err(e) => {
                        warn!(addr = %reader_addr, error = %e, "bad frame from server; closing");
                        break;
                    }
                };
                let frame = match decode_frame(body) {
                    Ok(f) => f,
                    Err(e) => {
                        warn!(addr = %reader_addr, error = %e, "undecodable frame from server; closing");
                        break;
                    }
                };
                match frame.kind {
                    FrameKind::Response => {
                        let waiter = reader_pending.lock().remove(&frame.id);
                        let Some(waiter) = waiter else { continue };
                        let result = match decode_response(&frame.header) {
                            Ok(Ok(reply)) => Ok((reply, frame.payload)),
                            Ok(Err(e)) => Err(RpcError::Remote(e)),
                            Err(e) => Err(RpcError::Remote(WireError::new(
                                ErrorCode::Protocol,
                                e.to_string(),
                            ))),
                        };
                        let _ = waiter.send(result);
                    }
                    FrameKind::Push => match decode_push(&frame.header) {
                        Ok(p) => {
                            if let Some(tx) = &pushes {
                                let _ = tx.send(p);
                            }
                        }
                        Err(e) => warn!(addr = %reader_addr, error = %e, "undecodable push"),
                    },
                    FrameKind::Request => {
                        warn!(addr = %reader_addr, "server sent a request frame; ignored")
                    }
                }
            }
            reader_closed.store(true, Ordering::SeqCst);
            let waiters: Vec<_> = reader_pending.lock().drain().collect();
            for (_, w) in waiters {
                let _ = w.send(Err(RpcError::Disconnected(reader_addr.clone())));
            }
        });
        Ok(RpcClient {
            addr: addr.to_string(),
            writer,
            pending,
            next_id: AtomicU64::new(1),
            closed,
        })
    }

    /// The address this client connected to.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// True once the connection is gone; every later call fails.
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    /// Sends `req` with `payload` and waits for the answer.
    pub async fn call(&self, req: &Request, payload: Bytes) -> Result<(Reply, Bytes), RpcError> {
        if self.is_closed() {
            return Err(RpcError::Disconnected(self.addr.clone()));
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let head = encode_frame_head(FrameKind::Request, id, req, payload.len())
            .map_err(|e| RpcError::Encode(e.to_string()))?;
        let (wtx, wrx) = oneshot::channel();
        self.pending.lock().insert(id, wtx);
        // Registered before sending, so a reply cannot race past us; and checked
        // again so a reader that closed in between does not leave us waiting.
        if self.is_closed() {
            self.pending.lock().remove(&id);
            return Err(RpcError::Disconnected(self.addr.clone()));
        }
        if self.writer.send(&head, &payload).await.is_err() {
            self.pending.lock().remove(&id);
            return Err(RpcError::Disconnected(self.addr.clone()));
        }
        match wrx.await {
            Ok(r) => r,
            Err(_) => Err(RpcError::Disconnected(self.addr.clone())),
        }
    }
}

impl Drop for RpcClient {
    fn drop(&mut self) {
        self.closed.store(true, Ordering::SeqCst);
        let w = self.writer.clone();
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move { w.close().await });
        }
    }
}

fn codec() -> LengthDelimitedCodec {
    LengthDelimitedCodec::builder()
        .length_field_length(4)
        .max_frame_length(MAX_FRAME)
        .new_codec()
}

/// A frame piece (1 MiB) that cannot be written for this long means the
/// peer stopped reading: the connection is closed.
pub const WRITE_STALL: std::time::Duration = std::time::Duration::from_secs(60);

/// Most connections a server keeps at once (`ConnLimits::new`).
pub const DEFAULT_MAX_CONNECTIONS: usize = 4096;

/// Most bytes of data-request replies one connection may have in progress
/// (read, queued or being written): what a peer that stops reading can pin.
pub const REPLY_BUDGET: usize = 128 << 20;

/// A server's limits on its connections, and counters of what they hold.
#[derive(Debug)]
pub struct ConnLimits {
    max_connections: usize,
    reply_budget: usize,
    stall: std::time::Duration,
    open: AtomicU64,
    queued: AtomicU64,
    refused: AtomicU64,
    stalled: AtomicU64,
}

/// A snapshot of [`ConnLimits`]' counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ConnCounters {
    /// Connections open now (past their handshake or in it).
    pub open: u64,
    /// Bytes of data-request replies in progress, over every connection.
    pub reply_bytes: u64,
    /// Connections refused because `max_connections` were open.
    pub refused: u64,
    /// Connections closed because the peer stopped reading.
    pub stalled: u64,
}

impl ConnLimits {
    /// At most `max_connections` connections, each with at most
    /// [`REPLY_BUDGET`] bytes of replies in progress.
    pub fn new(max_connections: usize) -> Arc<ConnLimits> {
        Arc::new(ConnLimits {
            max_connections: max_connections.max(1),
            reply_budget: REPLY_BUDGET,
            stall: WRITE_STALL,
            open: AtomicU64::new(0),
            queued: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            stalled: AtomicU64::new(0),
        })
    }

    /// The counters now.
    pub fn counters(&self) -> ConnCounters {
        ConnCounters {
            open: self.open.load(Ordering::Relaxed),
            reply_bytes: self.queued.load(Ordering::Relaxed),
            refused: self.refused.load(Ordering::Relaxed),
            stalled: self.stalled.load(Ordering::Relaxed),
        }
    }

    /// Counts a new connection in, or refuses it (false) at the cap.
    pub fn admit(&self) -> bool {
        let mut n = self.open.load(Ordering::SeqCst);
        loop {
            if n >= self.max_connections as u64 {
                self.refused.fetch_add(1, Ordering::Relaxed);
                return false;
            }
            match self
                .open
                .compare_exchange(n, n + 1, Ordering::SeqCst, Ordering::SeqCst)
            {
                Ok(_) => return true,
                Err(now) => n = now,
            }
        }
    }

    fn leave(&self) {
        self.open.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The most reply bytes `req` may bring (its block data; small otherwise).
fn reply_bytes(req: &Request) -> usize {
    const SMALL: usize = 64 << 10;
    match req {
        Request::Read { len, .. } | Request::ReadCached { len, .. } => *len as usize + SMALL,
        _ => SMALL,
    }
}

/// How long a new connection may take to prove its key.
pub const HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// The server end of one connection, handed to the [`Service`] with every request.
pub struct Conn {
    /// Unique per connection within the process.
    pub id: u64,
    /// The peer's address.
    pub peer: SocketAddr,
    /// What the key the peer proved lets it do.
    pub role: Role,
    writer: Arc<Writer>,
    /// Pushes queued and not yet written (at most [`MAX_QUEUED_PUSHES`]).
    pushes: Arc<AtomicUsize>,
}

/// Most pushes one connection may have waiting to be written: a client that
/// stops reading loses the rest (a lost recall costs it its lease, which
/// the recall's deadline takes by force), not the server's memory.
pub const MAX_QUEUED_PUSHES: usize = 1024;

impl Conn {
    /// Pushes a message to this client. Returns false if the connection is gone
    /// or its queue is full (the push is dropped; lease expiry covers the loss).
    pub fn push(&self, msg: &Push) -> bool {
        if !self.is_open() {
            return false;
        }
        let Ok(head) = encode_frame_head(FrameKind::Push, 0, msg, 0) else {
            return false;
        };
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return false;
        };
        if self.pushes.fetch_add(1, Ordering::SeqCst) >= MAX_QUEUED_PUSHES {
            self.pushes.fetch_sub(1, Ordering::SeqCst);
            return false;
        }
        let (w, pushes) = (self.writer.clone(), self.pushes.clone());
        rt.spawn(async move {
            let _ = w.send(&head, &[]).await;
            pushes.fetch_sub(1, Ordering::SeqCst);
        });
        true
    }

    /// Pushes waiting to be written now.
    pub fn queued_pushes(&self) -> usize {
        self.pushes.load(Ordering::SeqCst)
    }

    /// Closes the connection from the server's side: the client sees it end
    /// (and reconnects); answers not yet written are lost.
    pub fn close(&self) {
        self.writer.closed.store(true, Ordering::SeqCst);
        let w = self.writer.clone();
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move { w.close().await });
        }
    }

    /// True while the connection's writer is alive.
    pub fn is_open(&self) -> bool {
        !self.writer.closed.load(Ordering::SeqCst)
    }
}

/// A future returned by a [`Service`].
pub type ServiceFuture = Pin<Box<dyn Future<Output = (Result<Reply, WireError>, Bytes)> + Send>>;

/// What a server does with requests.
pub trait Service: Send + Sync + 'static {
    /// Handles one request; many run at once, even on one connection.
    fn call(self: Arc<Self>, conn: Arc<Conn>, req: Request, payload: Bytes) -> ServiceFuture;
    /// Told when a connection closes.
    fn disconnected(&self, _conn: &Conn) {}
    /// The largest frame a connection that proved `role` may send (for a
    /// client: the volume's block and a header); [`MAX_FRAME`] by default.
    fn max_frame(&self, _role: Role) -> usize {
        MAX_FRAME
    }
}

/// Turns on TCP keepalive, so a peer that vanished (a host lost without a
/// FIN) is noticed and its connection closed.
fn keepalive(stream: &TcpStream) {
    let ka = socket2::TcpKeepalive::new()
        .with_time(std::time::Duration::from_secs(60))
        .with_interval(std::time::Duration::from_secs(10))
        .with_retries(6);
    if let Err(e) = socket2::SockRef::from(stream).set_tcp_keepalive(&ka) {
        debug!(error = %e, "cannot turn on TCP keepalive");
    }
}

/// Most requests one connection may have in progress on the server.
pub const MAX_IN_FLIGHT_PER_CONN: usize = 256;

/// A request or a connection waiting this long is logged (once), with what
/// it waits for: a stall must say where it is.
const SLOW: std::time::Duration = std::time::Duration::from_secs(30);

/// Requests that move block data (and may wait for the disk).
fn is_data_request(req: &Request) -> bool {
    matches!(
        req,
        Request::Read { .. }
            | Request::Write { .. }
            | Request::Truncate { .. }
            | Request::RaiseFence { .. }
            | Request::DeleteData { .. }
            | Request::Sync { .. }
            | Request::Status
            | Request::ScanInodes { .. }
            | Request::ScanEntries { .. }
            | Request::ScanData { .. }
            | Request::SnapshotChunk { .. }
    )
}

/// Runs one request and writes its answer.
async fn respond<S: Service>(
    conn: Arc<Conn>,
    svc: Arc<S>,
    id: u64,
    req: Result<Request, WireError>,
    payload: Bytes,
) {
    let (result, payload) = match req {
        Ok(req) => {
            let op = req.name();
            let call = svc.call(conn.clone(), req, payload);
            tokio::pin!(call);
            tokio::select! {
                r = &mut call => r,
                () = tokio::time::sleep(SLOW) => {
                    warn!(peer = %conn.peer, op, id, "slow request: no answer after 30 s (still waiting)");
                    call.await
                }
            }
        }
        Err(e) => (Err(e), Bytes::new()),
    };
    let head = match encode_frame_head(FrameKind::Response, id, &result, payload.len()) {
        Ok(h) => h,
        Err(e) => {
            let err: Result<Reply, WireError> = Err(WireError::new(
                ErrorCode::Io,
                format!("cannot encode reply: {e}"),
            ));
            match encode_frame_head(FrameKind::Response, id, &err, 0) {
                Ok(h) => {
                    let _ = conn.writer.send(&h, &[]).await;
                }
                Err(_) => warn!("cannot encode an error reply"),
            }
            return;
        }
    };
    let _ = conn.writer.send(&head, &payload).await;
}

/// The client's side of a new connection: TLS first if `key` says so
/// ([`crate::tls`]), then the key handshake; the connection's halves.
async fn open_client(
    mut stream: TcpStream,
    key: &Key,
) -> Result<(ReadHalf, WriteHalf), HandshakeError> {
    if !key.tls() {
        handshake::connect(&mut stream, key, &[]).await?;
        let (rd, wr) = stream.into_split();
        return Ok((Box::new(rd), Box::new(wr)));
    }
    let cfg = tls::client_config().map_err(HandshakeError::Bad)?;
    let name = rustls::pki_types::ServerName::try_from(tls::SERVER_NAME)
        .map_err(|e| HandshakeError::Bad(e.to_string()))?;
    let mut s = tokio_rustls::TlsConnector::from(cfg)
        .connect(name, stream)
        .await
        .map_err(|e| HandshakeError::Io(format!("TLS: {e}")))?;
    let binding = tls::binding(s.get_ref().1).map_err(HandshakeError::Bad)?;
    handshake::connect(&mut s, key, &binding).await?;
    let (rd, wr) = tokio::io::split(s);
    Ok((Box::new(rd), Box::new(wr)))
}

/// The server's side of a new connection: TLS if the client starts it
/// (required when `keys` say so), then the key handshake; the role the
/// peer proved and the connection's halves.
async fn open_server(
    mut stream: TcpStream,
    keys: &Keys,
) -> Result<(Role, ReadHalf, WriteHalf), HandshakeError> {
    let mut first = [0u8; 1];
    let n = stream
        .peek(&mut first)
        .await
        .map_err(|e| HandshakeError::Io(e.to_string()))?;
    if n == 0 {
        return Err(HandshakeError::Io("closed before the handshake".into()));
    }
    if first[0] != tls::TLS_FIRST_BYTE {
        if keys.tls() {
            let reason =
                "this server takes connections inside TLS only (start the client with --tls)";
            let _ = handshake::refuse(&mut stream, reason).await;
            return Err(HandshakeError::Refused(reason.into()));
        }
        let role = handshake::accept(&mut stream, keys, &[]).await?;
        let (rd, wr) = stream.into_split();
        return Ok((role, Box::new(rd), Box::new(wr)));
    }
    let cfg = tls::server_config().map_err(HandshakeError::Bad)?;
    let mut s = tokio_rustls::TlsAcceptor::from(cfg)
        .accept(stream)
        .await
        .map_err(|e| HandshakeError::Io(format!("TLS: {e}")))?;
    let binding = tls::binding(s.get_ref().1).map_err(HandshakeError::Bad)?;
    let role = handshake::accept(&mut s, keys, &binding).await?;
    let (rd, wr) = tokio::io::split(s);
    Ok((role, Box::new(rd), Box::new(wr)))
}

/// Accepts connections forever, serving each with `svc` once it proved it
/// holds one of `keys`.
pub async fn serve<S: Service>(
    listener: TcpListener,
    svc: Arc<S>,
    keys: Keys,
) -> std::io::Result<()> {
    let limits = ConnLimits::new(DEFAULT_MAX_CONNECTIONS);
    let next = AtomicU64::new(1);
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(x) => x,
            Err(e) => {
                // EMFILE and friends: back off instead of spinning.
                warn!(error = %e, "accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let id = next.fetch_add(1, Ordering::Relaxed);
        if !limits.admit() {
            warn!(%peer, "connection refused: too many connections");
            continue;
        }
        tokio::spawn(serve_connection(
            stream,
            peer,
            id,
            svc.clone(),
            keys.clone(),
            limits.clone(),
        ));
    }
}

/// Serves one connection until it closes, once it proved it holds one of
/// `keys` (otherwise it is closed, and the refusal logged). The connection
/// was counted in by `limits.admit()`; it is counted out here.
pub async fn serve_connection<S: Service>(
    stream: TcpStream,
    peer: SocketAddr,
    id: u64,
    svc: Arc<S>,
    keys: Keys,
    limits: Arc<ConnLimits>,
) {
    serve_admitted(stream, peer, id, svc, keys, &limits).await;
    limits.leave();
}

async fn serve_admitted<S: Service>(
    stream: TcpStream,
    peer: SocketAddr,
    id: u64,
    svc: Arc<S>,
    keys: Keys,
    limits: &Arc<ConnLimits>,
) {
    let _ = stream.set_nodelay(true);
    keepalive(&stream);
    let (role, rd, wr) =
        match tokio::time::timeout(HANDSHAKE_TIMEOUT, open_server(stream, &keys)).await {
            Ok(Ok(x)) => x,
            Ok(Err(HandshakeError::Io(e))) => {
                debug!(%peer, error = %e, "connection ended during the handshake");
                return;
            }
            Ok(Err(e)) => {
                warn!(%peer, error = %e, "connection refused: handshake failed");
                return;
            }
            Err(_) => {
                warn!(%peer, "connection refused: no handshake in 10 s");
                return;
            }
        };
    let closed = Arc::new(AtomicBool::new(false));
    let writer = Writer::new(wr, closed, limits.stall);
    let conn = Arc::new(Conn {
        id,
        peer,
        role,
        writer: writer.clone(),
        pushes: Arc::new(AtomicUsize::new(0)),
    });
    let limit = Arc::new(Semaphore::new(MAX_IN_FLIGHT_PER_CONN));
    // In KiB: what this connection's data replies in progress may hold.
    let budget_kib = (limits.reply_budget >> 10).max(1);
    let budget = Arc::new(Semaphore::new(budget_kib));
    let mut frames = FramedRead::new(rd, codec());
    // No frame larger than this server's largest block (plus headers).
    frames
        .decoder_mut()
        .set_max_frame_length(svc.max_frame(role).clamp(1 << 20, MAX_FRAME));
    // Metadata requests run inside this task (no hop to another worker on the
    // request path), many at once; data requests, which may wait for the
    // disk, get tasks of their own.
    let mut inline: FuturesUnordered<Pin<Box<dyn Future<Output = ()> + Send>>> =
        FuturesUnordered::new();
    debug!(%peer, conn = id, %role, "connection opened");
    loop {
        let item = tokio::select! {
            biased;
            () = writer.gone.cancelled() => {
                limits.stalled.fetch_add(1, Ordering::Relaxed);
                break;
            }
            Some(()) = inline.next(), if !inline.is_empty() => continue,
            item = frames.next() => item,
        };
        let Some(item) = item else { break };
        let body = match item {
            Ok(b) => b.freeze(),
            Err(e) => {
                warn!(%peer, error = %e, "bad frame; closing connection");
                break;
            }
        };
        let frame = match decode_frame(body) {
            Ok(f) => f,
            Err(e) => {
                warn!(%peer, error = %e, "undecodable frame; closing connection");
                break;
            }
        };
        if frame.kind != FrameKind::Request {
            warn!(%peer, "client sent a non-request frame; closing connection");
            break;
        }
        let req = decode_request(&frame.header)
            .map_err(|e| WireError::new(ErrorCode::Protocol, e.to_string()));
        let data = req.as_ref().is_ok_and(is_data_request);
        let kib = req
            .as_ref()
            .map_or(1, |r| (reply_bytes(r) >> 10).clamp(1, budget_kib));
        let fut = respond(conn.clone(), svc.clone(), frame.id, req, frame.payload);
        if data {
            // Wait for a slot while driving this connection's metadata
            // requests: one of them may hold what a data request waits for
            // (not polled, it would never let go, and the connection would
            // stop for good, even its end unseen).
            let waiting = tokio::time::Instant::now();
            let mut told = false;
            let permit = loop {
                tokio::select! {
                    biased;
                    p = limit.clone().acquire_owned() => break p,
                    Some(()) = inline.next(), if !inline.is_empty() => {}
                    () = tokio::time::sleep_until(waiting + SLOW), if !told => {
                        told = true;
                        warn!(%peer, conn = id, inline = inline.len(),
                            "slow wait: every data slot of this connection busy for 30 s");
                    }
                }
            };
            let Ok(permit) = permit else {
                break;
            };
            // Then room for its reply (a peer that stops reading stops here).
            let bytes = loop {
                tokio::select! {
                    biased;
                    () = writer.gone.cancelled() => break None,
                    p = budget.clone().acquire_many_owned(kib as u32) => break p.ok(),
                    Some(()) = inline.next(), if !inline.is_empty() => {}
                }
            };
            let Some(bytes) = bytes else {
                limits.stalled.fetch_add(1, Ordering::Relaxed);
                break;
            };
            let held = (kib as u64) << 10;
            limits.queued.fetch_add(held, Ordering::Relaxed);
            let limits = limits.clone();
            tokio::spawn(async move {
                fut.await;
                limits.queued.fetch_sub(held, Ordering::Relaxed);
                drop(bytes);
                drop(permit);
            });
        } else {
            while inline.len() >= MAX_IN_FLIGHT_PER_CONN {
                inline.next().await;
            }
            inline.push(Box::pin(fut));
        }
    }
    svc.disconnected(&conn);
    drop(conn);
    writer.close().await;
    debug!(%peer, conn = id, "connection closed");
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use tokio::sync::{watch, Notify};

    /// Data requests (`Status`) wait until a metadata request (`Renew`)
    /// lets them go, which it does once every data slot is taken.
    struct Gate {
        busy: AtomicUsize,
        all_busy: Notify,
        renew_started: Notify,
        go: watch::Sender<bool>,
    }

    impl Service for Gate {
        fn call(self: Arc<Self>, _conn: Arc<Conn>, req: Request, _p: Bytes) -> ServiceFuture {
            Box::pin(async move {
                if let Request::Status = req {
                    if self.busy.fetch_add(1, Ordering::SeqCst) + 1 == MAX_IN_FLIGHT_PER_CONN {
                        self.all_busy.notify_one();
                    }
                    let mut rx = self.go.subscribe();
                    let _ = rx.wait_for(|g| *g).await;
                } else {
                    self.renew_started.notify_one();
                    self.all_busy.notified().await;
                    self.go.send_replace(true);
                }
                (Ok(Reply::Ok), Bytes::new())
            })
        }
    }

    #[tokio::test]
    async fn a_connection_whose_data_slots_are_full_still_drives_its_metadata_requests() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let gate = Arc::new(Gate {
            busy: AtomicUsize::new(0),
            all_busy: Notify::new(),
            renew_started: Notify::new(),
            go: watch::channel(false).0,
        });
        let key = Key::generate();
        tokio::spawn(serve(listener, gate.clone(), Keys::from_key(key.clone())));
        let c = Arc::new(
            RpcClient::connect(&addr, &key.client_key(), None)
                .await
                .unwrap(),
        );
        let renew = {
            let c = c.clone();
            tokio::spawn(async move { c.call(&Request::Renew, Bytes::new()).await })
        };
        gate.renew_started.notified().await;
        // One more data request than there are slots: the connection waits
        // for a slot, which only the Renew in progress can free.
        let data: Vec<_> = (0..=MAX_IN_FLIGHT_PER_CONN)
            .map(|_| {
                let c = c.clone();
                tokio::spawn(async move { c.call(&Request::Status, Bytes::new()).await })
            })
            .collect();
        let all = async {
            assert!(matches!(renew.await.unwrap(), Ok((Reply::Ok, _))));
            for d in data {
                assert!(matches!(d.await.unwrap(), Ok((Reply::Ok, _))));
            }
        };
        // Before: the Renew was never polled again, and the connection
        // stopped for good.
        tokio::time::timeout(std::time::Duration::from_secs(60), all)
            .await
            .expect("every request answered");
    }

    /// Echoes a request's payload back.
    struct Echo;

    impl Service for Echo {
        fn call(self: Arc<Self>, _conn: Arc<Conn>, _req: Request, p: Bytes) -> ServiceFuture {
            Box::pin(async move { (Ok(Reply::Ok), p) })
        }
    }

    async fn echo_server(keys: Keys) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(serve(listener, Arc::new(Echo), keys));
        addr
    }

    #[tokio::test]
    async fn tls_carries_calls_and_a_tls_only_server_refuses_plain_clients() {
        let key = Key::generate();
        let tls_client = Keys::from_key(key.client_key()).with_tls(true).credential();
        let plain_client = key.client_key();
        let big = Bytes::from(vec![7u8; 3 << 20]);
        // A server that takes both.
        let addr = echo_server(Keys::from_key(key.clone())).await;
        for k in [&tls_client, &plain_client] {
            let c = RpcClient::connect(&addr, k, None).await.unwrap();
            let (r, p) = c.call(&Request::Renew, big.clone()).await.unwrap();
            assert!(matches!(r, Reply::Ok));
            assert_eq!(p, big);
        }
        // A server that takes TLS only.
        let addr = echo_server(Keys::from_key(key.clone()).with_tls(true)).await;
        let c = RpcClient::connect(&addr, &tls_client, None).await.unwrap();
        assert_eq!(c.call(&Request::Renew, big.clone()).await.unwrap().1, big);
        match RpcClient::connect(&addr, &plain_client, None).await {
            Err(e @ RpcError::Auth { .. }) => {
                assert!(e.to_string().contains("inside TLS only"), "{e}");
                assert_eq!(e.code(), ErrorCode::Denied);
            }
            Err(e) => panic!("unexpected error {e}"),
            Ok(_) => panic!("a plain client got in"),
        }
        // A key of another volume inside TLS: refused all the same.
        let other = Keys::from_key(Key::generate().client_key())
            .with_tls(true)
            .credential();
        assert!(RpcClient::connect(&addr, &other, None).await.is_err());
    }

    /// Pushes a recall per `Renew`, many times, counting those taken.
    struct Pushy {
        taken: AtomicUsize,
        queued: AtomicUsize,
    }

    impl Service for Pushy {
        fn call(self: Arc<Self>, conn: Arc<Conn>, req: Request, p: Bytes) -> ServiceFuture {
            Box::pin(async move {
                if let Request::Renew = req {
                    for _ in 0..5 * MAX_QUEUED_PUSHES {
                        let recall = Push::Recall {
                            ino: 1,
                            want: crate::messages::LeaseMode::Read,
                        };
                        if conn.push(&recall) {
                            self.taken.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                    self.queued.store(conn.queued_pushes(), Ordering::SeqCst);
                }
                (Ok(Reply::Ok), p)
            })
        }
    }

    #[tokio::test]
    async fn a_client_that_stops_reading_gets_a_bounded_number_of_pushes_queued() {
        use crate::frame::{encode_frame_head, FrameKind};
        use tokio::io::AsyncWriteExt;
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let svc = Arc::new(Pushy {
            taken: AtomicUsize::new(0),
            queued: AtomicUsize::new(0),
        });
        let key = Key::generate();
        tokio::spawn(serve(listener, svc.clone(), Keys::from_key(key.clone())));
        let mut s = tokio::net::TcpStream::connect(&addr).await.unwrap();
        crate::auth::handshake::connect(&mut s, &key.client_key(), &[])
            .await
            .unwrap();
        // A 32 MiB echo that this client never reads: the server's writer
        // is stuck behind it, so every push from now on waits in the queue.
        let big = vec![1u8; 32 << 20];
        let head = encode_frame_head(FrameKind::Request, 1, &Request::Status, big.len()).unwrap();
        s.write_all(&head).await.unwrap();
        s.write_all(&big).await.unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        let head = encode_frame_head(FrameKind::Request, 2, &Request::Renew, 0).unwrap();
        s.write_all(&head).await.unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while svc.queued.load(Ordering::SeqCst) == 0 && std::time::Instant::now() < deadline {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        assert_eq!(svc.taken.load(Ordering::SeqCst), MAX_QUEUED_PUSHES);
        assert_eq!(svc.queued.load(Ordering::SeqCst), MAX_QUEUED_PUSHES);
    }
}

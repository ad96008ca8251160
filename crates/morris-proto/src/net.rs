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
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use futures::stream::FuturesUnordered;
use futures::StreamExt;
use parking_lot::Mutex;
use tokio::io::{AsyncWriteExt, BufWriter};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot, Semaphore};
use tokio_util::codec::{FramedRead, LengthDelimitedCodec};
use tracing::{debug, warn};

use crate::error::{ErrorCode, WireError};
use crate::frame::{
    decode_frame, decode_push, decode_request, decode_response, encode_frame_head, FrameKind,
    MAX_FRAME,
};
use crate::messages::{Push, Reply, Request};

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
}

impl RpcError {
    /// The protocol error class this failure maps to.
    pub fn code(&self) -> ErrorCode {
        match self {
            RpcError::Remote(e) => e.code,
            RpcError::Disconnected(_) | RpcError::Connect { .. } => ErrorCode::Unavailable,
            RpcError::Encode(_) => ErrorCode::Invalid,
        }
    }
}

/// The sending half of a socket, shared by every task that sends on it: each
/// frame is written whole under the lock, straight from the caller's task (no
/// hop through a writer task on the request path).
struct Writer {
    w: tokio::sync::Mutex<BufWriter<OwnedWriteHalf>>,
    closed: Arc<AtomicBool>,
}

impl Writer {
    fn new(wr: OwnedWriteHalf, closed: Arc<AtomicBool>) -> Arc<Self> {
        Arc::new(Writer {
            w: tokio::sync::Mutex::new(BufWriter::with_capacity(64 << 10, wr)),
            closed,
        })
    }

    async fn send(&self, head: &[u8], payload: &[u8]) -> std::io::Result<()> {
        if self.closed.load(Ordering::SeqCst) {
            return Err(std::io::ErrorKind::BrokenPipe.into());
        }
        let mut w = self.w.lock().await;
        let r = async {
            w.write_all(head).await?;
            if !payload.is_empty() {
                w.write_all(payload).await?;
            }
            w.flush().await
        }
        .await;
        if r.is_err() {
            self.closed.store(true, Ordering::SeqCst);
            let _ = w.shutdown().await;
        }
        r
    }

    async fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        let _ = self.w.lock().await.shutdown().await;
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
    /// Connects to `addr`; pushes from the server go to `pushes`.
    pub async fn connect(
        addr: &str,
        pushes: Option<mpsc::UnboundedSender<Push>>,
    ) -> Result<Self, RpcError> {
        let stream = TcpStream::connect(addr)
            .await
            .map_err(|source| RpcError::Connect {
                addr: addr.to_string(),
                source,
            })?;
        let _ = stream.set_nodelay(true);
        let (rd, wr) = stream.into_split();
        let pending: Pending = Arc::new(Mutex::new(HashMap::new()));
        let closed = Arc::new(AtomicBool::new(false));
        let writer = Writer::new(wr, closed.clone());
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

/// The server end of one connection, handed to the [`Service`] with every request.
pub struct Conn {
    /// Unique per connection within the process.
    pub id: u64,
    /// The peer's address.
    pub peer: SocketAddr,
    writer: Arc<Writer>,
}

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
        let w = self.writer.clone();
        rt.spawn(async move {
            let _ = w.send(&head, &[]).await;
        });
        true
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

/// Accepts connections forever, serving each with `svc`.
pub async fn serve<S: Service>(listener: TcpListener, svc: Arc<S>) -> std::io::Result<()> {
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
        tokio::spawn(serve_connection(stream, peer, id, svc.clone()));
    }
}

/// Serves one connection until it closes.
pub async fn serve_connection<S: Service>(
    stream: TcpStream,
    peer: SocketAddr,
    id: u64,
    svc: Arc<S>,
) {
    let _ = stream.set_nodelay(true);
    let (rd, wr) = stream.into_split();
    let closed = Arc::new(AtomicBool::new(false));
    let writer = Writer::new(wr, closed);
    let conn = Arc::new(Conn {
        id,
        peer,
        writer: writer.clone(),
    });
    let limit = Arc::new(Semaphore::new(MAX_IN_FLIGHT_PER_CONN));
    let mut frames = FramedRead::new(rd, codec());
    // Metadata requests run inside this task (no hop to another worker on the
    // request path), many at once; data requests, which may wait for the
    // disk, get tasks of their own.
    let mut inline: FuturesUnordered<Pin<Box<dyn Future<Output = ()> + Send>>> =
        FuturesUnordered::new();
    debug!(%peer, conn = id, "connection opened");
    loop {
        let item = tokio::select! {
            biased;
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
            tokio::spawn(async move {
                fut.await;
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
        tokio::spawn(serve(listener, gate.clone()));
        let c = Arc::new(RpcClient::connect(&addr, None).await.unwrap());
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
}

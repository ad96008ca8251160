//! TCP connections to the NFS server: a reserved source port when we may
//! bind one, a transport that turns a closed connection into an error, and
//! a pool of [`Nfs3Client`]s with deadline-bounded, retried calls.

use std::future::Future;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use nfs3_client::nfs3_types::nfs3::{nfsstat3, Nfs3Result};
use nfs3_client::nfs3_types::rpc::{auth_unix, opaque_auth};
use nfs3_client::nfs3_types::xdr_codec::Opaque;
use nfs3_client::{Nfs3Client, RpcError};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::sync::Semaphore;
use tokio::time::Instant;

use super::convert::status_error;
use crate::HomeError;

/// An NFSv3 client on one of our connections.
pub(crate) type Client = Nfs3Client<Conn>;

/// One call on a client: a boxed future borrowing it.
pub(crate) type CallFuture<'a, T, E> =
    Pin<Box<dyn Future<Output = Result<Nfs3Result<T, E>, RpcError>> + Send + 'a>>;

/// The largest RPC reply accepted (a READ or READDIR reply of 1 MiB, and
/// room for its header); a record mark claiming more is a broken server.
const MAX_REPLY: u32 = 4 << 20;

/// Reserved source ports tried, as the Linux kernel's NFS client does
/// (`min_resvport`..=`max_resvport`).
const RESERVED_PORTS: std::ops::RangeInclusive<u16> = 665..=1023;

/// First pause after a failed attempt (a refused connection, JUKEBOX);
/// doubled after each, up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(20);
const MAX_BACKOFF: Duration = Duration::from_millis(500);

/// A TCP connection to the server, as `nfs3_client` reads and writes it.
///
/// `nfs3_client` 0.9 loops on a read of 0 bytes (`async_read_exact` does
/// not treat end of file), so a connection the server closed would spin
/// until the deadline: here a read or write of 0 bytes is an error. Replies
/// claiming more than [`MAX_REPLY`] bytes are refused before the client
/// allocates them.
pub(crate) struct Conn {
    stream: TcpStream,
    /// Bytes of the current reply's record mark seen (4: in the body).
    mark_seen: usize,
    mark: [u8; 4],
    /// Bytes of the current reply's body still to come.
    body_left: u32,
}

impl Conn {
    fn new(stream: TcpStream) -> Conn {
        Conn {
            stream,
            mark_seen: 0,
            mark: [0; 4],
            body_left: 0,
        }
    }

    /// Follows the record marking of replies through the bytes just read.
    fn track(&mut self, bytes: &[u8]) -> io::Result<()> {
        let mut rest = bytes;
        while !rest.is_empty() {
            if self.mark_seen < 4 {
                let n = (4 - self.mark_seen).min(rest.len());
                self.mark[self.mark_seen..self.mark_seen + n].copy_from_slice(&rest[..n]);
                self.mark_seen += n;
                rest = &rest[n..];
                if self.mark_seen == 4 {
                    let len = u32::from_be_bytes(self.mark) & 0x7fff_ffff;
                    if len > MAX_REPLY {
                        return Err(io::Error::new(
                            io::ErrorKind::InvalidData,
                            format!("the server sent a reply of {len} bytes (at most {MAX_REPLY} expected)"),
                        ));
                    }
                    self.body_left = len;
                    if len == 0 {
                        self.mark_seen = 0;
                    }
                }
            } else {
                let n = (self.body_left as usize).min(rest.len());
                // n <= body_left, a u32.
                self.body_left -= n as u32;
                rest = &rest[n..];
                if self.body_left == 0 {
                    self.mark_seen = 0;
                }
            }
        }
        Ok(())
    }
}

impl nfs3_client::io::AsyncRead for Conn {
    async fn async_read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.stream.read(buf).await?;
        if n == 0 && !buf.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the server closed the connection",
            ));
        }
        self.track(&buf[..n])?;
        Ok(n)
    }
}

impl nfs3_client::io::AsyncWrite for Conn {
    async fn async_write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.stream.write(buf).await?;
        if n == 0 && !buf.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                "the connection takes no more bytes",
            ));
        }
        Ok(n)
    }
}

/// AUTH_UNIX as `uid`:`gid`, without supplementary groups.
pub(crate) fn credential(uid: u32, gid: u32) -> opaque_auth<'static> {
    opaque_auth::auth_unix(&auth_unix {
        stamp: 0,
        machinename: Opaque::owned(b"morris".to_vec()),
        uid,
        gid,
        gids: vec![],
    })
}

/// An I/O error as text without the "(os error N)" suffix.
pub(crate) fn io_text(e: &io::Error) -> String {
    let s = e.to_string();
    let s = match s.find(" (os error ") {
        Some(i) => &s[..i],
        None => &s,
    };
    let mut c = s.chars();
    match c.next() {
        Some(first) => first.to_lowercase().chain(c).collect(),
        None => s.to_string(),
    }
}

/// Whether to try reserved source ports: only root may bind them.
fn may_bind_reserved() -> bool {
    // SAFETY: geteuid cannot fail and touches no memory of ours.
    unsafe { libc::geteuid() == 0 }
}

fn unspecified(addr: &SocketAddr) -> IpAddr {
    match addr {
        SocketAddr::V4(_) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        SocketAddr::V6(_) => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
    }
}

/// Connects to `addr`, from a reserved port (< 1024) when running as root,
/// as the kernel's and libnfs's clients do (servers often refuse others);
/// from an ordinary port if no reserved one can be had.
pub(crate) async fn connect(addr: SocketAddr) -> io::Result<TcpStream> {
    if may_bind_reserved() {
        // Start where the last connection left off, so that connections
        // made at once do not all try the same ports.
        static NEXT: AtomicU16 = AtomicU16::new(0);
        let (lo, hi) = (*RESERVED_PORTS.start(), *RESERVED_PORTS.end());
        let span = hi - lo + 1;
        for _ in 0..span {
            let port = lo + NEXT.fetch_add(1, Ordering::Relaxed) % span;
            let socket = match addr {
                SocketAddr::V4(_) => TcpSocket::new_v4()?,
                SocketAddr::V6(_) => TcpSocket::new_v6()?,
            };
            socket.set_reuseaddr(true)?;
            match socket.bind(SocketAddr::new(unspecified(&addr), port)) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AddrInUse => continue,
                Err(e) => {
                    tracing::debug!(%addr, error = %e, "cannot bind a reserved port; using an ordinary one");
                    break;
                }
            }
            match socket.connect(addr).await {
                Ok(s) => {
                    let _ = s.set_nodelay(true);
                    return Ok(s);
                }
                // The same (source, destination) pair is still in use or in TIME_WAIT.
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::AddrInUse | io::ErrorKind::AddrNotAvailable
                    ) =>
                {
                    continue
                }
                Err(e) => return Err(e),
            }
        }
        tracing::debug!(%addr, "no reserved port free; using an ordinary one");
    }
    let s = TcpStream::connect(addr).await?;
    let _ = s.set_nodelay(true);
    Ok(s)
}

/// Connects to `addr` for an `nfs3_client` client.
pub(crate) async fn connect_conn(addr: SocketAddr) -> io::Result<Conn> {
    Ok(Conn::new(connect(addr).await?))
}

/// Up to `parallel` connections to the NFS server, made on demand: a call
/// takes an idle one (or makes one), and gives it back unless it broke.
pub(crate) struct Pool {
    addr: SocketAddr,
    cred: opaque_auth<'static>,
    timeout: Duration,
    idle: Mutex<Vec<Client>>,
    /// One permit per connection that may exist.
    slots: Semaphore,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("addr", &self.addr)
            .field("timeout", &self.timeout)
            .field("idle", &self.idle.lock().map(|v| v.len()).unwrap_or(0))
            .finish()
    }
}

impl Pool {
    /// A pool for the NFS server at `addr`, calls made as `cred`, each
    /// bounded by `timeout`.
    pub(crate) fn new(
        addr: SocketAddr,
        cred: opaque_auth<'static>,
        timeout: Duration,
        parallel: usize,
    ) -> Pool {
        Pool {
            addr,
            cred,
            timeout,
            idle: Mutex::new(Vec::new()),
            slots: Semaphore::new(parallel.max(1)),
        }
    }

    /// The server's address.
    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Makes a client on a connection `stream` made by [`connect_conn`].
    pub(crate) fn client(&self, conn: Conn) -> Client {
        Client::new_with_auth(conn, self.cred.clone(), opaque_auth::default())
    }

    /// Hands a connected client to the pool, for the next call.
    pub(crate) fn put(&self, c: Client) {
        self.idle.lock().unwrap_or_else(|p| p.into_inner()).push(c);
    }

    fn take(&self) -> Option<Client> {
        self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop()
    }

    /// Sends one call and waits for its answer, within the pool's timeout
    /// in all: a broken connection is dropped and the call sent again on a
    /// new one; `NFS3ERR_JUKEBOX` is asked again after a pause; once the
    /// deadline passes, [`HomeError::Unreachable`] says what happened last.
    /// Other statuses map by [`status_error`].
    ///
    /// A call that is not idempotent (CREATE, REMOVE, RENAME, ...) sent
    /// again after its connection broke may find it applied already, and
    /// fail as a replay would (`Exists`, `NotFound`).
    pub(crate) async fn call<T, E, F>(&self, op: &'static str, f: F) -> Result<T, HomeError>
    where
        F: for<'a> Fn(&'a mut Client) -> CallFuture<'a, T, E>,
    {
        let start = Instant::now();
        let deadline = start + self.timeout;
        let mut backoff = FIRST_BACKOFF;
        let mut attempts = 0u32;
        let mut last = String::from("no answer");
        loop {
            if attempts > 0 {
                // Pause before trying again, unless the deadline comes first.
                let pause = backoff.min(deadline.saturating_duration_since(Instant::now()));
                tokio::time::sleep(pause).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
            if Instant::now() >= deadline {
                tracing::warn!(op, addr = %self.addr, attempts, elapsed = ?start.elapsed(), last = %last, "home unreachable: giving up");
                return Err(HomeError::Unreachable(format!(
                    "{op} to {}: no answer within {:?} ({attempts} attempts; last: {last})",
                    self.addr, self.timeout
                )));
            }
            attempts += 1;
            let Ok(Ok(_permit)) = tokio::time::timeout_at(deadline, self.slots.acquire()).await
            else {
                last = "every connection busy with other calls".into();
                continue;
            };
            let mut client = match self.take() {
                Some(c) => c,
                None => match tokio::time::timeout_at(deadline, connect_conn(self.addr)).await {
                    Ok(Ok(conn)) => {
                        tracing::debug!(op, addr = %self.addr, attempt = attempts, "connected to home");
                        self.client(conn)
                    }
                    Ok(Err(e)) => {
                        last = format!("cannot reach {}: {}", self.addr, io_text(&e));
                        tracing::debug!(op, addr = %self.addr, attempt = attempts, error = %last, "reconnect failed");
                        continue;
                    }
                    Err(_) => {
                        last = format!("connecting to {} timed out", self.addr);
                        continue;
                    }
                },
            };
            match tokio::time::timeout_at(deadline, f(&mut client)).await {
                // Dropping the client mid-call closes its connection, whose
                // reply would otherwise come to the next call.
                Err(_) => last = "no answer to the call".into(),
                Ok(Err(e)) if e.is_connection_reusable() => {
                    self.put(client);
                    return Err(rpc_error(op, &e));
                }
                Ok(Err(e)) => {
                    last = match &e {
                        RpcError::Io(io) => io_text(io),
                        e => e.to_string(),
                    };
                    tracing::debug!(op, addr = %self.addr, attempt = attempts, error = %last, "connection broke; reconnecting");
                }
                Ok(Ok(Nfs3Result::Ok(v))) => {
                    self.put(client);
                    tracing::trace!(op, attempts, elapsed = ?start.elapsed(), "home answered");
                    return Ok(v);
                }
                Ok(Ok(Nfs3Result::Err((nfsstat3::NFS3ERR_JUKEBOX, _)))) => {
                    self.put(client);
                    last = "the server answered NFS3ERR_JUKEBOX (try again later)".into();
                    tracing::debug!(op, addr = %self.addr, attempt = attempts, "NFS3ERR_JUKEBOX; asking again");
                }
                Ok(Ok(Nfs3Result::Err((s, _)))) => {
                    self.put(client);
                    tracing::trace!(op, attempts, elapsed = ?start.elapsed(), status = %s, "home refused");
                    return Err(status_error(op, s));
                }
            }
        }
    }
}

/// An RPC-level refusal (the connection itself is fine) as a home error.
pub(crate) fn rpc_error(op: &str, e: &RpcError) -> HomeError {
    match e {
        RpcError::Auth(stat) => {
            tracing::warn!(op, %stat, "home refused our credential (a server that wants a reserved source port answers AUTH_TOOWEAK)");
            HomeError::Access
        }
        e => HomeError::Io(format!("{op}: RPC error: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn io_errors_read_plainly() {
        let e = io::Error::from_raw_os_error(libc::ECONNREFUSED);
        assert_eq!(io_text(&e), "connection refused");
    }

    #[tokio::test]
    async fn record_marks_are_bounded() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let s = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let mut c = Conn::new(s);
        // Two replies of 8 and 0 bytes, split anyhow.
        c.track(&[0x80, 0, 0]).unwrap();
        c.track(&[8, 1, 2, 3]).unwrap();
        c.track(&[4, 5, 6, 7, 8, 0x80]).unwrap();
        c.track(&[0, 0, 0]).unwrap();
        assert_eq!((c.mark_seen, c.body_left), (0, 0));
        let big = (0x8000_0000u32 | (MAX_REPLY + 1)).to_be_bytes();
        assert!(c.track(&big).is_err());
    }
}

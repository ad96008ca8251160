//! Registration with the local portmapper (rpcbind), when one is running.
//!
//! NFS and MOUNT answer on the gateway's one port, so clients that name the
//! port need no portmapper; clients that ask the portmapper (the usual
//! `mount -t nfs` and `nfs://host/` without ports) find the gateway once it
//! is registered here. The RPC client is `nfs3_client`'s; only the SET and
//! UNSET calls (which its `PortmapperClient` lacks) are made through its
//! generic `RpcClient::call`.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use nfs3_client::nfs3_types::portmap::{mapping, IPPROTO_TCP, PMAP_PORT, PMAP_PROG, PROGRAM};
use nfs3_client::rpc::RpcClient;
use nfs3_client::tokio::TokioIo;
use nfs3_server::nfs3_types::{mount, nfs3};
use tokio::net::TcpStream;

/// How long registration waits for the portmapper before giving up.
const PORTMAP_TIMEOUT: Duration = Duration::from_secs(3);

/// The programs the gateway serves: NFS v3 and MOUNT v3.
const PROGRAMS: [(u32, u32); 2] = [
    (nfs3::PROGRAM, nfs3::VERSION),
    (mount::PROGRAM, mount::VERSION),
];

/// The lock programs the gateway also serves (NLM v4, NSM v1): a host may
/// run its own (a kernel NFS client's lockd, rpc.statd), which must keep
/// its registration.
const LOCK_PROGRAMS: [(u32, u32); 2] = [(100_021, 4), (100_024, 1)];

/// What registering with the portmapper came to.
#[derive(Debug, PartialEq, Eq)]
pub enum Registration {
    /// Both programs are registered on the gateway's port.
    Registered,
    /// No portmapper answers on this host; nothing registered.
    NoPortmapper,
}

/// Errors talking to a portmapper that does answer.
#[derive(Debug, thiserror::Error)]
pub enum PortmapError {
    /// The call failed (connection lost, RPC error reply, timeout).
    #[error("portmapper call failed: {0}")]
    Call(String),
    /// The portmapper refused the mapping (another server holds it, or the
    /// caller is not allowed to set it).
    #[error("portmapper refused to register program {prog} version {vers} on port {port}")]
    Refused {
        /// RPC program number.
        prog: u32,
        /// Program version.
        vers: u32,
        /// Port asked for.
        port: u16,
    },
}

async fn connect() -> Option<RpcClient<TokioIo<TcpStream>>> {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, PMAP_PORT));
    match tokio::time::timeout(PORTMAP_TIMEOUT, TcpStream::connect(addr)).await {
        Ok(Ok(sock)) => Some(RpcClient::new(TokioIo::new(sock))),
        _ => None,
    }
}

async fn call(
    rpc: &mut RpcClient<TokioIo<TcpStream>>,
    proc_: PMAP_PROG,
    m: mapping,
) -> Result<bool, PortmapError> {
    let fut = rpc.call::<mapping, bool>(PROGRAM, 2, proc_ as u32, &m);
    match tokio::time::timeout(PORTMAP_TIMEOUT, fut).await {
        Ok(Ok(ok)) => Ok(ok),
        Ok(Err(e)) => Err(PortmapError::Call(e.to_string())),
        Err(_) => Err(PortmapError::Call("no answer".into())),
    }
}

fn tcp(prog: u32, vers: u32, port: u16) -> mapping {
    mapping {
        prog,
        vers,
        prot: IPPROTO_TCP,
        port: u32::from(port),
    }
}

/// Registers NFS v3 and MOUNT v3 over TCP on `port` (and NLM v4 and NSM
/// v1 unless another live service holds them) with the portmapper on
/// 127.0.0.1:111, replacing older mappings of the same programs.
pub async fn register(port: u16) -> Result<Registration, PortmapError> {
    let Some(mut rpc) = connect().await else {
        return Ok(Registration::NoPortmapper);
    };
    for (prog, vers) in PROGRAMS {
        // A stale mapping (a gateway that died) would make SET fail.
        call(&mut rpc, PMAP_PROG::PMAPPROC_UNSET, tcp(prog, vers, 0)).await?;
        if !call(&mut rpc, PMAP_PROG::PMAPPROC_SET, tcp(prog, vers, port)).await? {
            return Err(PortmapError::Refused { prog, vers, port });
        }
    }
    for (prog, vers) in LOCK_PROGRAMS {
        let now = getport(&mut rpc, prog, vers).await?;
        if now == u32::from(port) {
            continue;
        }
        if now != 0 {
            let live = match u16::try_from(now) {
                Ok(p) => matches!(
                    tokio::time::timeout(
                        Duration::from_millis(500),
                        TcpStream::connect(SocketAddr::from((Ipv4Addr::LOCALHOST, p))),
                    )
                    .await,
                    Ok(Ok(_))
                ),
                Err(_) => false,
            };
            if live {
                tracing::warn!(
                    prog,
                    vers,
                    port = now,
                    "another lock service is registered with the portmapper; NFS clients \
                     that find NLM through it will not reach this gateway's locks"
                );
                continue;
            }
            // A gateway that died.
            call(&mut rpc, PMAP_PROG::PMAPPROC_UNSET, tcp(prog, vers, 0)).await?;
        }
        if !call(&mut rpc, PMAP_PROG::PMAPPROC_SET, tcp(prog, vers, port)).await? {
            tracing::warn!(
                prog,
                vers,
                port,
                "the portmapper refused to register a lock program"
            );
        }
    }
    Ok(Registration::Registered)
}

/// The port `prog`/`vers` over TCP is registered on (0: none).
async fn getport(
    rpc: &mut RpcClient<TokioIo<TcpStream>>,
    prog: u32,
    vers: u32,
) -> Result<u32, PortmapError> {
    let query = tcp(prog, vers, 0);
    let fut = rpc.call::<mapping, u32>(PROGRAM, 2, PMAP_PROG::PMAPPROC_GETPORT as u32, &query);
    match tokio::time::timeout(PORTMAP_TIMEOUT, fut).await {
        Ok(Ok(p)) => Ok(p),
        Ok(Err(e)) => Err(PortmapError::Call(e.to_string())),
        Err(_) => Err(PortmapError::Call("no answer".into())),
    }
}

/// Removes the mappings `register` made, if they still name `port`.
pub async fn unregister(port: u16) -> Result<(), PortmapError> {
    let Some(mut rpc) = connect().await else {
        return Ok(());
    };
    for (prog, vers) in PROGRAMS.into_iter().chain(LOCK_PROGRAMS) {
        // Another gateway may have taken the programs over since.
        let now = getport(&mut rpc, prog, vers).await?;
        if now == u32::from(port) {
            call(&mut rpc, PMAP_PROG::PMAPPROC_UNSET, tcp(prog, vers, 0)).await?;
        }
    }
    Ok(())
}

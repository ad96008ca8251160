//! `morris server`: runs one stripe server until SIGINT or SIGTERM, and
//! catches up the copies it missed while it was away (resync).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use morris_client::{Client, ClientConfig, Repair, ResyncStatus};
use parking_lot::Mutex;
use tracing::{debug, error, info, warn};

use crate::runtime::{self, Terminate};

/// How often a server looks for copies it has to catch up. Copies missed
/// while it was cut off (not restarted) are found by the next look.
const RESYNC_EVERY: Duration = Duration::from_secs(5);
/// How soon after start a server first looks.
const RESYNC_FIRST: Duration = Duration::from_millis(500);

/// Arguments of `morris server`.
#[derive(Debug, Args)]
pub struct ServerArgs {
    /// Directory holding this server's metadata store and block files (created if missing).
    #[arg(long, value_name = "DIR")]
    pub data: PathBuf,
    /// Address to listen on, HOST:PORT (e.g. 0.0.0.0:7700).
    #[arg(long, value_name = "HOST:PORT")]
    pub listen: String,
    /// Lease duration in milliseconds: how long a silent client keeps its locks,
    /// and how long the server refuses new leases after a restart.
    #[arg(long, default_value_t = 10_000, value_name = "MS",
          value_parser = clap::value_parser!(u32).range(100..=3_600_000))]
    pub lease_ms: u32,
    /// Do not catch up stale copies (mirrored volumes) or delete leftover
    /// blocks automatically. Readers still skip stale copies; `morris status`
    /// shows the volume degraded until a server runs its resync.
    #[arg(long)]
    pub no_resync: bool,
    /// etcd endpoints (comma-separated, e.g. http://10.0.0.5:2379) that
    /// decide which copy of a metadata range serves it (mirrored volumes).
    /// Without it the two copies decide between themselves, and a copy
    /// that is silent (hung, cut off) stops the range it copies until it
    /// answers again; with it that range goes on. Start every server of a
    /// volume the same way.
    #[arg(long, value_name = "URL,URL", value_delimiter = ',')]
    pub etcd: Vec<String>,
    /// PEM CA certificate that etcd's certificate must chain to (for
    /// `https://` endpoints).
    #[arg(long, value_name = "FILE", requires = "etcd")]
    pub etcd_ca: Option<PathBuf>,
    /// PEM client certificate to show etcd (`--client-cert-auth`); with
    /// `--etcd-key`.
    #[arg(long, value_name = "FILE", requires_all = ["etcd", "etcd_key"])]
    pub etcd_cert: Option<PathBuf>,
    /// The client certificate's PEM private key (mode 0600).
    #[arg(long, value_name = "FILE", requires = "etcd_cert")]
    pub etcd_key: Option<PathBuf>,
    /// etcd user, when etcd has authentication on; with
    /// `--etcd-password-file`.
    #[arg(long, value_name = "NAME", requires_all = ["etcd", "etcd_password_file"])]
    pub etcd_user: Option<String>,
    /// File holding that user's password (its first line; mode 0600).
    #[arg(long, value_name = "FILE", requires = "etcd_user")]
    pub etcd_password_file: Option<PathBuf>,
    /// Most connections served at once (mounts and gateways keep two per
    /// server, servers one per peer); more are closed at once and logged.
    #[arg(long, value_name = "N", default_value_t = morris_proto::net::DEFAULT_MAX_CONNECTIONS,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1_000_000))]
    pub max_connections: usize,
    /// Start a scrub pass (every chunk read and checked against its
    /// checksum; damage repaired from another copy) when the last complete
    /// pass is this old, e.g. 7d; 0 for only when `morris scrub` asks.
    #[arg(long, value_name = "DURATION", default_value = "7d", value_parser = humantime::parse_duration)]
    pub scrub_every: Duration,
    /// Bytes a second a scheduled scrub pass reads at most (e.g. 64M).
    #[arg(long, value_name = "BYTES", default_value = "64M", value_parser = crate::size::parse_size)]
    pub scrub_rate: u64,
    /// Bytes a second this server's resync copies at most when it catches
    /// its copies up or is rebuilt after `morris volume replace` (e.g.
    /// 128M; 0 for no limit), so that clients keep most of the bandwidth.
    #[arg(long, value_name = "BYTES", default_value = "128M", value_parser = crate::size::parse_size)]
    pub resync_rate: u64,
    /// Serve Prometheus metrics at http://HOST:PORT/metrics (off by default).
    #[arg(long, value_name = "HOST:PORT")]
    pub metrics: Option<String>,
    #[command(flatten)]
    pub key: crate::key::KeyArg,
}

/// Runs the server.
pub fn run(args: ServerArgs) -> Result<ExitCode> {
    std::fs::create_dir_all(&args.data)
        .with_context(|| format!("cannot create data directory {}", args.data.display()))?;
    let keys = args.key.load_volume_key("morris server")?;
    let etcd_auth = etcd_auth(&args)?;
    // Everything the server makes (metadata, snapshots, block files) is
    // its owner's alone.
    // SAFETY: umask has no preconditions and cannot fail.
    unsafe { libc::umask(0o077) };
    let rt = runtime::build()?;
    let listen = args.listen.clone();
    let result = rt.block_on(async {
        let mut term = Terminate::install()?;
        let cfg = morris_server::ServerConfig {
            data_dir: args.data.clone(),
            listen: args.listen.clone(),
            lease_ms: args.lease_ms,
            etcd: args.etcd.clone(),
            etcd_auth,
            keys: keys.clone(),
            max_connections: args.max_connections,
            scrub_every: (!args.scrub_every.is_zero()).then_some(args.scrub_every),
            scrub_rate: args.scrub_rate,
        };
        let exporter = crate::exporter::maybe_start(args.metrics.as_deref(), "server").await?;
        let mut handle = morris_server::start(cfg)
            .await
            .with_context(|| format!("server on {listen} failed to start"))?;
        if let Some(x) = &exporter {
            let source = handle.metrics();
            let totals = source.clone();
            x.on_scrape(std::sync::Arc::new(move || {
                let s = source.clone();
                Box::pin(async move { s.export().await })
            }));
            let me = connect_addr(handle.local_addr());
            let key = keys.credential();
            x.serve_page(
                std::sync::Arc::new(move || {
                    let (me, key) = (me.clone(), key.clone());
                    Box::pin(async move {
                        match crate::status::collect(&me, &key, Duration::from_secs(2)).await {
                            Ok(r) => Ok((r.health.to_string(), crate::status::render(&r, false))),
                            Err(e) => Err(format!("{e:#}")),
                        }
                    })
                }),
                std::sync::Arc::new(move || totals.totals()),
            );
        }
        let resync = (!args.no_resync).then(|| {
            tokio::spawn(resync_loop(
                connect_addr(handle.local_addr()),
                handle.resync_status(),
                handle.damage(),
                keys.clone(),
                args.resync_rate,
            ))
        });
        let out = tokio::select! {
            () = handle.serve() => Err(anyhow::anyhow!("server on {listen} stopped")),
            sig = term.recv() => {
                info!(signal = sig, listen = %listen, "stopping server");
                Ok(())
            }
        };
        if let Some(t) = resync {
            t.abort();
        }
        handle.shutdown().await;
        out
    });
    // Blocking store work finishes or is abandoned within this bound; every
    // answered request is already committed.
    rt.shutdown_timeout(Duration::from_secs(10));
    result.map(|()| ExitCode::SUCCESS)
}

/// Reads the etcd TLS and credential files named on the command line.
fn etcd_auth(args: &ServerArgs) -> Result<morris_server::EtcdAuth> {
    let read = |p: &PathBuf, what: &str, secret: bool| -> Result<Vec<u8>> {
        if secret {
            return Ok(morris_proto::auth::keys::read_secret(p)
                .with_context(|| format!("the {what}"))?
                .1);
        }
        std::fs::read(p).with_context(|| format!("cannot read the {what} {}", p.display()))
    };
    let ca_pem = match &args.etcd_ca {
        Some(p) => Some(read(p, "etcd CA certificate", false)?),
        None => None,
    };
    let identity = match (&args.etcd_cert, &args.etcd_key) {
        (Some(c), Some(k)) => Some((
            read(c, "etcd client certificate", false)?,
            read(k, "etcd client key", true)?,
        )),
        _ => None,
    };
    let user = match (&args.etcd_user, &args.etcd_password_file) {
        (Some(u), Some(p)) => {
            let text = read(p, "etcd password file", true)?;
            let text =
                String::from_utf8(text).with_context(|| format!("{} is not UTF-8", p.display()))?;
            let password = text.lines().next().unwrap_or("").to_string();
            if password.is_empty() {
                anyhow::bail!("the etcd password file {} is empty", p.display());
            }
            Some((u.clone(), password))
        }
        _ => None,
    };
    if args.etcd.iter().any(|e| e.starts_with("https://")) && ca_pem.is_none() {
        anyhow::bail!(
            "https:// etcd endpoints need --etcd-ca (the CA etcd's certificate chains to)"
        );
    }
    Ok(morris_server::EtcdAuth {
        ca_pem,
        identity,
        user,
    })
}

/// Where this process reaches its own server (a wildcard listen address is
/// reached on loopback).
fn connect_addr(addr: SocketAddr) -> String {
    let ip = match addr.ip() {
        std::net::IpAddr::V4(v) if v.is_unspecified() => std::net::Ipv4Addr::LOCALHOST.into(),
        std::net::IpAddr::V6(v) if v.is_unspecified() => std::net::Ipv6Addr::LOCALHOST.into(),
        ip => ip,
    };
    SocketAddr::new(ip, addr.port()).to_string()
}

/// Every `RESYNC_EVERY`, and whenever this server finds a copy that fails
/// its checksums: hand damaged copies to resync, catch up the copies this
/// server missed (or that were damaged), and remove old orphans of the
/// metadata ranges it serves. The client it uses is made once the volume
/// is formatted and reachable.
async fn resync_loop(
    addr: String,
    status: Arc<Mutex<ResyncStatus>>,
    damage: morris_server::Damage,
    keys: morris_proto::auth::Keys,
    copy_rate: u64,
) {
    let mut client: Option<Arc<Client>> = None;
    let mut me: Option<u32> = None;
    let found = damage.found();
    let mut pending: Vec<(u64, u8, u64)> = Vec::new();
    let mut diverged: Vec<(u64, u64, u64)> = Vec::new();
    // The first look comes soon after start: a server back from an outage
    // has the most to catch up.
    let mut wait = RESYNC_FIRST;
    loop {
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            () = found.notified() => {}
        }
        wait = RESYNC_EVERY;
        if me.is_none() {
            // Known once the server is formatted.
            let id = crate::admin::random_client_id();
            let key = keys.credential();
            match crate::admin::Session::open(&addr, &key, None, id, "resync", RESYNC_EVERY).await {
                Ok(s) => me = s.index,
                Err(e) => debug!(error = %e, "resync: own server not answering"),
            }
            if me.is_none() {
                continue;
            }
        }
        if client.is_none() {
            let cfg = ClientConfig {
                name: format!("resync@{addr}"),
                copy_rate,
                ..ClientConfig::new(keys.clone())
            };
            match Client::connect(&addr, cfg).await {
                Ok(c) => client = Some(c),
                Err(e) => {
                    debug!(error = %e, "resync: volume not reachable yet");
                    continue;
                }
            }
        }
        let (Some(c), Some(index)) = (&client, me) else {
            continue;
        };
        pending.extend(damage.take());
        pending.sort_unstable();
        pending.dedup();
        let mut retry = Vec::new();
        for (id, copy, at) in pending.drain(..) {
            match c.repair_damaged(id, index, at).await {
                Ok(Repair::Recorded) => {
                    info!(
                        id,
                        copy,
                        offset = at,
                        "damaged copy recorded stale: resync rewrites it from another copy"
                    );
                    damage.note_repair(true);
                }
                Ok(Repair::NoOtherCopy) => {
                    error!(id, copy, offset = at, "damaged data and no other copy to repair it from: reads of it fail (EIO) until it is rewritten");
                    damage.note_repair(false);
                }
                Ok(Repair::Gone) => {}
                Err(e) => {
                    warn!(id, copy, error = %e, "cannot record a damaged copy yet; retrying");
                    retry.push((id, copy, at));
                }
            }
        }
        pending = retry;
        // Blocks a revoked writer may have left different between copies.
        diverged.extend(damage.take_diverged());
        let mut again = Vec::new();
        for (id, from, to) in diverged.drain(..) {
            if let Err(e) = c.reconcile_copies(id, from, to).await {
                warn!(id, error = %e, "cannot make a revoked writer's copies equal yet; retrying");
                again.push((id, from, to));
            }
        }
        diverged = again;
        // A replacement (`morris volume replace`): every file with blocks
        // here recorded stale before it serves reads of them again.
        if damage.rebuild_pending() {
            match c.record_rebuild(index).await {
                Ok(n) => {
                    info!(
                        files = n,
                        "replacement: the copies here of every file are recorded stale; resync rebuilds them"
                    );
                    if let Err(e) = damage.rebuild_recorded() {
                        warn!(error = %e, "replacement: cannot clear the rebuild mark; retrying");
                    }
                }
                Err(e) => {
                    warn!(error = %e, "replacement: recording this server's copies stale is incomplete; retrying")
                }
            }
        }
        if let Err(e) = c.resync(index, &status).await {
            warn!(error = %e, "resync pass incomplete; retrying");
        }
        // Files whose last name went while a client had them open, or
        // whose remover died before removing them (`reaper.rs`).
        match c.reap_orphans(index).await {
            Ok(0) => {}
            Ok(n) => info!(removed = n, "reaped orphaned files"),
            Err(e) => debug!(error = %e, "orphan reaping incomplete; retrying"),
        }
    }
}

//! `morris nfs`: serves a volume over NFSv3 + MOUNT v3 until SIGINT or SIGTERM.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use morris_client::{Client, ClientConfig};
use morris_nfs::{Cidr, ExportName, Gateway, GatewayConfig};
use tracing::info;

use crate::runtime::{self, Terminate};

/// Arguments of `morris nfs`.
#[derive(Debug, Args)]
pub struct NfsArgs {
    /// Address HOST:PORT of any server of the volume.
    pub addr: String,
    /// Address to serve NFS and MOUNT on (both on this one port).
    #[arg(long, value_name = "HOST:PORT", default_value_t = format!("127.0.0.1:{}", morris_nfs::DEFAULT_PORT))]
    pub listen: String,
    /// Networks allowed to use the exports, comma-separated (e.g. 10.0.0.0/8,127.0.0.1);
    /// needed when --listen is not a loopback address (0.0.0.0/0,::/0: everyone).
    #[arg(long, value_name = "CIDR,...", value_delimiter = ',')]
    pub export_allow: Vec<Cidr>,
    /// Name of the export served next to "/" (both are the volume's root), so
    /// that files in the root have URLs like nfs://HOST/morris/FILE.
    #[arg(long, value_name = "NAME", default_value_t = ExportName::default())]
    pub export: ExportName,
    /// Seconds an open file kept between NFS READ/WRITE calls stays open unused.
    #[arg(long, value_name = "SECS", default_value_t = morris_nfs::DEFAULT_OPEN_IDLE.as_secs(),
          value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub open_idle_secs: u64,
    /// Do not register with the local portmapper (rpcbind), even if one runs.
    #[arg(long)]
    pub no_rpcbind: bool,
    /// Let uid 0 act as root (by default its calls act as nobody, 65534,
    /// and group 0 as nobody's group: NFS `root_squash`).
    #[arg(long)]
    pub no_root_squash: bool,
    /// Serve calls from unprivileged source ports (1024 and up); by default
    /// only privileged ports are served (NFS `secure`), so that a user of an
    /// allowed host cannot send calls in another user's name.
    #[arg(long)]
    pub insecure: bool,
    /// Let MKNOD make character and block device nodes (refused by default).
    #[arg(long)]
    pub allow_devices: bool,
    /// File that keeps which NFS client hosts hold locks, so that a
    /// restarted gateway tells them to reclaim (default:
    /// /var/lib/morris/nlm-HOST-PORT.json for the --listen address).
    #[arg(long, value_name = "FILE")]
    pub nlm_state: Option<std::path::PathBuf>,
    /// Seconds after a restart in which only lock reclaims are granted.
    #[arg(long, value_name = "SECS", default_value_t = morris_nfs::DEFAULT_NLM_GRACE.as_secs(),
          value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub nlm_grace_secs: u64,
    /// Serve Prometheus metrics at http://HOST:PORT/metrics (off by default).
    #[arg(long, value_name = "HOST:PORT")]
    pub metrics: Option<String>,
    #[command(flatten)]
    pub key: crate::key::KeyArg,
}

/// The lock recovery state file: `--nlm-state`, or the default one if its
/// directory can be made (else none, with a warning: a restart then tells
/// no client to reclaim).
fn nlm_state(args: &NfsArgs) -> Option<std::path::PathBuf> {
    if let Some(p) = &args.nlm_state {
        return Some(p.clone());
    }
    let dir = std::path::Path::new("/var/lib/morris");
    let name: String = args
        .listen
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' {
                c
            } else {
                '-'
            }
        })
        .collect();
    match std::fs::create_dir_all(dir) {
        Ok(()) => Some(dir.join(format!("nlm-{name}.json"))),
        Err(e) => {
            tracing::warn!(dir = %dir.display(), error = %e,
                "no place for the lock recovery state (--nlm-state FILE): after a restart, NFS clients will not be told to reclaim their locks");
            None
        }
    }
}

/// Runs the gateway.
pub fn run(args: NfsArgs) -> Result<ExitCode> {
    let keys = args.key.load()?;
    let rt = runtime::build()?;
    let result = rt.block_on(async {
        let mut term = Terminate::install()?;
        let config = ClientConfig {
            name: format!("nfs-gateway@{}", args.listen),
            ..ClientConfig::new(keys)
        };
        let exporter = crate::exporter::maybe_start(args.metrics.as_deref(), "nfs").await?;
        let client = Client::connect(&args.addr, config)
            .await
            .with_context(|| format!("cannot connect to the volume at {}", args.addr))?;
        if let Some(x) = &exporter {
            crate::exporter::scrape_client(x, &client);
        }
        let gw = Gateway::bind(
            client.clone(),
            GatewayConfig {
                allow: args.export_allow.clone(),
                export: args.export.clone(),
                open_idle: Duration::from_secs(args.open_idle_secs),
                register: !args.no_rpcbind,
                squash_root: !args.no_root_squash,
                secure: !args.insecure,
                allow_devices: args.allow_devices,
                nlm_state: nlm_state(&args),
                nlm_grace: Duration::from_secs(args.nlm_grace_secs),
                ..GatewayConfig::new(args.listen.clone())
            },
        )
        .await?;
        let local = gw.local_addr()?;
        let allow: Vec<String> = args.export_allow.iter().map(ToString::to_string).collect();
        info!(listen = %local, volume = %args.addr, export = %args.export, allow = %allow.join(","), "nfs gateway serving");
        let r = gw
            .run(async {
                let sig = term.recv().await;
                info!(signal = sig, "stopping nfs gateway");
            })
            .await;
        if tokio::time::timeout(morris_nfs::SHUTDOWN_LIMIT, client.shutdown())
            .await
            .is_err()
        {
            tracing::warn!("releasing the gateway's leases timed out");
        }
        r.context("nfs gateway failed")
    });
    rt.shutdown_timeout(Duration::from_secs(5));
    result.map(|()| ExitCode::SUCCESS)
}

//! `morris up`: a whole local cluster in one command — N servers on
//! consecutive ports, formatted the first time, mounted, a server that dies
//! restarted — torn down on Ctrl-C.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;
use morris_proto::auth::Keys;
use morris_proto::{VolumeDescriptor, DEFAULT_STRIPE_UNIT};
use tracing::warn;

use crate::exporter::Exporter;
use crate::format::{describe, format_volume, new_descriptor};
use crate::hold;
use crate::mount::{self, MountTuning};
use crate::mountinfo;
use crate::runtime::{self, Terminate};
use crate::servers::ServerSet;
use crate::size::{human, parse_stripe_unit};

/// Arguments of `morris up`.
#[derive(Debug, Args)]
pub struct UpArgs {
    /// Number of stripe servers to start.
    #[arg(long, default_value_t = 4, value_name = "N",
          value_parser = clap::value_parser!(u16).range(1..=256))]
    pub servers: u16,
    /// Directory for the servers' data (DIR/server-<i>) and logs (DIR/server-<i>.log);
    /// rerunning with the same directory reuses the volume.
    #[arg(long, default_value = "./morris-data", value_name = "DIR")]
    pub dir: PathBuf,
    /// Where to mount the volume (created if missing).
    #[arg(long, default_value = "./mnt", value_name = "DIR")]
    pub mount: PathBuf,
    /// First port; the servers listen on 127.0.0.1 ports PORT .. PORT+N-1.
    #[arg(long, default_value_t = 7700, value_name = "PORT",
          value_parser = clap::value_parser!(u16).range(1..))]
    pub port: u16,
    /// Stripe unit for a new volume (power of two from 4K to 64M; default 1M).
    #[arg(long, value_name = "SIZE", value_parser = parse_stripe_unit)]
    pub stripe_unit: Option<u32>,
    /// Copies of every block for a new volume (default 1).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u8).range(1..))]
    pub replicas: Option<u8>,
    /// The servers' lease duration in milliseconds.
    #[arg(long, default_value_t = 10_000, value_name = "MS",
          value_parser = clap::value_parser!(u32).range(100..=3_600_000))]
    pub lease_ms: u32,
    /// Make the whole mount a read-only cache of this home file system
    /// (nfs://HOST[:PORT]/EXPORT[/DIR] or file:///PATH): its root is bound
    /// to it (the volume must be new or empty, or already bound to it).
    #[arg(long, value_name = "URL")]
    pub home: Option<String>,
    /// With --home: how long what was checked against home is trusted.
    #[arg(long, default_value = "15s", value_name = "DURATION",
          value_parser = humantime::parse_duration)]
    pub validity: std::time::Duration,
    /// With --home: most bytes of home's data to keep (0: no limit).
    #[arg(long, default_value = "0", value_name = "SIZE",
          value_parser = crate::size::parse_size)]
    pub cache_max_bytes: u64,
    /// Run every connection inside TLS (the servers then refuse any
    /// other: give `--tls` to `status`, other mounts, ... too).
    #[arg(long, env = "MORRIS_TLS")]
    pub tls: bool,
    /// First port of the Prometheus metrics endpoints: the servers' on
    /// PORT .. PORT+N-1, the mount's on PORT+N (default: free ports, printed).
    #[arg(long, value_name = "PORT", conflicts_with = "no_metrics",
          value_parser = clap::value_parser!(u16).range(1..))]
    pub metrics_port: Option<u16>,
    /// Serve no metrics.
    #[arg(long)]
    pub no_metrics: bool,
    #[command(flatten)]
    pub tuning: MountTuning,
}

/// What the servers say about the volume they hold.
#[derive(Debug, PartialEq)]
pub enum Found {
    /// No server is formatted: format a new volume.
    Fresh,
    /// Every server belongs to this volume, in this order.
    Existing(VolumeDescriptor),
}

/// Decides from each server's hello (descriptor, index) whether to format,
/// reuse, or refuse a mixed set.
pub fn classify(
    addrs: &[String],
    hellos: &[(Option<VolumeDescriptor>, Option<u32>)],
    dir: &Path,
) -> Result<Found> {
    let formatted: Vec<usize> = (0..hellos.len())
        .filter(|&i| hellos[i].0.is_some())
        .collect();
    if formatted.is_empty() {
        return Ok(Found::Fresh);
    }
    let list = |v: &[usize]| {
        v.iter()
            .map(|i| i.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    };
    if formatted.len() < hellos.len() {
        let blank: Vec<usize> = (0..hellos.len())
            .filter(|&i| hellos[i].0.is_none())
            .collect();
        bail!(
            "servers {} hold a formatted volume but servers {} are unformatted (an earlier \
             format was interrupted, or --servers changed); remove {} to start over",
            list(&formatted),
            list(&blank),
            dir.display()
        );
    }
    let mut uuids: Vec<String> = hellos
        .iter()
        .filter_map(|h| h.0.as_ref().map(|d| d.uuid.to_string()))
        .collect();
    uuids.sort();
    uuids.dedup();
    if uuids.len() > 1 {
        bail!(
            "the servers hold different volumes ({}); remove {} to start over",
            uuids.join(", "),
            dir.display()
        );
    }
    let Some(d) = hellos.first().and_then(|h| h.0.clone()) else {
        return Ok(Found::Fresh);
    };
    let in_order = d.servers.as_slice() == addrs
        && hellos
            .iter()
            .enumerate()
            .all(|(i, h)| h.1 == Some(i as u32));
    if !in_order {
        bail!(
            "{} holds volume {} whose servers are {} but this run started {}; \
             rerun with the same --servers and --port",
            dir.display(),
            d.uuid,
            d.servers.join(","),
            addrs.join(",")
        );
    }
    Ok(Found::Existing(d))
}

/// The metrics ports of `n` servers and the mount (see [`UpArgs`]).
fn metrics_ports(args: &UpArgs) -> Result<Option<Vec<u16>>> {
    if args.no_metrics {
        return Ok(None);
    }
    let n = args.servers + 1;
    if let Some(p) = args.metrics_port {
        check_ports(p, n)?;
        return Ok(Some((0..n).map(|i| p + i).collect()));
    }
    // Held until all are picked, so that they differ.
    let held = (0..n)
        .map(|_| std::net::TcpListener::bind(("127.0.0.1", 0)))
        .collect::<std::io::Result<Vec<_>>>()
        .context("cannot find free ports for the metrics")?;
    let ports = held
        .iter()
        .map(|l| l.local_addr().map(|a| a.port()))
        .collect::<std::io::Result<Vec<_>>>()
        .context("cannot find free ports for the metrics")?;
    Ok(Some(ports))
}

/// Fails with a clear message if a port is taken.
fn check_ports(port: u16, n: u16) -> Result<()> {
    let last = u32::from(port) + u32::from(n) - 1;
    if last > u32::from(u16::MAX) {
        bail!("ports {port}..{last} do not fit below 65536; choose a lower --port");
    }
    for p in port..=last as u16 {
        if let Err(e) = std::net::TcpListener::bind(("127.0.0.1", p)) {
            if e.kind() == std::io::ErrorKind::AddrInUse {
                bail!(
                    "port {p} on 127.0.0.1 is already in use (is another `morris up` \
                     running?); choose other ports with --port"
                );
            }
            bail!("cannot listen on 127.0.0.1:{p}: {e}");
        }
    }
    Ok(())
}

/// Runs `morris up`.
pub fn run(args: UpArgs) -> Result<ExitCode> {
    args.tuning.check_permissions()?;
    std::fs::create_dir_all(&args.dir)
        .with_context(|| format!("cannot create {}", args.dir.display()))?;
    let dir = args
        .dir
        .canonicalize()
        .with_context(|| format!("bad path {}", args.dir.display()))?;
    if let Ok(Some(_)) = mountinfo::find(&mountinfo::absolute(&args.mount)?) {
        bail!(
            "{} is already mounted (is another `morris up` running? `morris umount {}` \
             unmounts it)",
            args.mount.display(),
            args.mount.display()
        );
    }
    std::fs::create_dir_all(&args.mount)
        .with_context(|| format!("cannot create {}", args.mount.display()))?;
    let mp = mount::prepare_mountpoint(&args.mount)?;
    check_ports(args.port, args.servers)?;
    let metrics = metrics_ports(&args)?;
    let exe = std::env::current_exe().context("cannot find the morris executable")?;

    // This process is the mount (its servers are processes of their own).
    let rt = runtime::build_mount(args.tuning.runtime_threads.map(|n| n as usize))?;
    let mut term = {
        let _enter = rt.enter();
        Terminate::install()?
    };
    let (volume_key, client_key) = up_keys(&dir)?;
    let admin_key = Keys::load(&volume_key)?.with_tls(args.tls).credential();
    let mut servers = ServerSet::spawn(
        &exe,
        &dir,
        args.port,
        args.servers,
        args.lease_ms,
        &volume_key,
        args.tls,
        metrics.clone(),
    )?;
    let addrs = servers.addrs();
    let hellos = rt.block_on(servers.wait_ready(&mut term))?;
    let (d, fresh) = match classify(&addrs, &hellos, &dir)? {
        Found::Fresh => {
            let d = new_descriptor(
                addrs.clone(),
                args.stripe_unit.unwrap_or(DEFAULT_STRIPE_UNIT),
                args.replicas.unwrap_or(1),
            )?;
            rt.block_on(format_volume(&d, &admin_key))?;
            (d, true)
        }
        Found::Existing(d) => {
            if args.stripe_unit.is_some_and(|u| u != d.stripe_unit) {
                warn!(
                    "--stripe-unit ignored: volume {} exists with stripe unit {}",
                    d.uuid,
                    human(u64::from(d.stripe_unit))
                );
            }
            if args.replicas.is_some_and(|r| r != d.replicas) {
                warn!(
                    "--replicas ignored: volume {} exists with {} replicas",
                    d.uuid, d.replicas
                );
            }
            (d, false)
        }
    };

    let exporter = match metrics.as_ref().and_then(|m| m.last()) {
        Some(p) => Some(rt.block_on(Exporter::start(&format!("127.0.0.1:{p}"), "mount"))?),
        None => None,
    };
    let name = format!("up@{}:{}", mount::hostname(), mp.display());
    let client = rt.block_on(hold::connect(
        &mut term,
        &addrs[0],
        args.tuning
            .client_config(name, Keys::load(&client_key)?.with_tls(args.tls)),
    ))?;
    if let Some(x) = &exporter {
        crate::exporter::scrape_client(x, &client);
    }
    if let Some(url) = &args.home {
        if let Err(e) = rt.block_on(bind_root(&client, url, &args)) {
            hold::shutdown_client(&rt, &client, &mut term);
            return Err(e);
        }
    }
    let guard = match hold::start(
        &rt,
        client.clone(),
        &mp,
        &args.tuning.mount_options(&addrs[0]),
    ) {
        Ok(g) => g,
        Err(e) => {
            hold::shutdown_client(&rt, &client, &mut term);
            return Err(e);
        }
    };

    let _note = exporter
        .as_ref()
        .and_then(|x| crate::exporter::note_mount(guard.device(), &mp, x));
    println!(
        "morris up: {} volume",
        if fresh {
            "formatted a new"
        } else {
            "reusing the"
        }
    );
    print!("{}", describe(&d));
    for (i, (pid, data, log)) in servers.describe().into_iter().enumerate() {
        println!(
            "  server {i}  pid {pid}  data {}  log {}",
            data.display(),
            log.display()
        );
    }
    println!(
        "keys: {} (servers, admin commands), {} (mounts, NFS gateways)",
        volume_key.display(),
        client_key.display()
    );
    if let Some(ports) = &metrics {
        let urls: Vec<String> = ports
            .iter()
            .map(|p| format!("http://127.0.0.1:{p}/metrics"))
            .collect();
        if let Some((mount_url, servers_urls)) = urls.split_last() {
            println!(
                "metrics: {mount_url} (mount); servers {}",
                servers_urls.join(" ")
            );
        }
    }
    println!("mounted at {}", mp.display());
    println!("A server that dies is restarted (after 1 s, doubling up to 30 s).");
    println!("Ctrl-C (or SIGTERM) unmounts and stops the servers.");

    let replicas = d.replicas;
    let held = hold::hold(&rt, &mut term, guard, || servers.supervise(replicas));
    hold::shutdown_client(&rt, &client, &mut term);
    drop(client);
    rt.shutdown_timeout(Duration::from_secs(5));
    servers.stop();
    held?;
    println!(
        "morris up: unmounted {} and stopped {} servers",
        mp.display(),
        addrs.len()
    );
    Ok(ExitCode::SUCCESS)
}

/// The volume's key files in DIR/keys, made the first time.
fn up_keys(dir: &Path) -> Result<(PathBuf, PathBuf)> {
    let keys = dir.join("keys");
    let volume = keys.join("volume.key");
    let client = keys.join("client.key");
    match (volume.exists(), client.exists()) {
        (true, true) => Ok((volume, client)),
        (false, false) => crate::key::new_pair(&keys),
        _ => bail!(
            "{} holds only one of volume.key and client.key; restore the other              (`morris key client` makes a client key from the volume key)",
            keys.display()
        ),
    }
}

/// Binds the volume's root to `url` (`--home`), unless it is already.
async fn bind_root(client: &morris_client::Client, url: &str, args: &UpArgs) -> Result<()> {
    let root = client
        .getattr(morris_client::ROOT_ID)
        .await
        .map_err(|e| anyhow::anyhow!("reading the root: {e}"))?;
    if let Some(b) = root.home.as_ref().and_then(|l| l.bound.as_ref()) {
        if b.url != url {
            bail!(
                "the volume's root already caches {} (not {url}); use another --dir for another home",
                b.url
            );
        }
        println!("morris up: the root caches {url}");
        return Ok(());
    }
    let binding = morris_proto::home::Binding {
        url: url.to_string(),
        mode: morris_proto::home::CacheMode::Ro,
        validity_ms: u64::try_from(args.validity.as_millis()).unwrap_or(u64::MAX),
        timeout_ms: 10_000,
        max_bytes: args.cache_max_bytes,
        sync_lag_ms: morris_proto::home::DEFAULT_SYNC_LAG_MS,
        on_disconnect: morris_proto::home::OnDisconnect::Local,
        on_conflict: morris_proto::home::OnConflict::Home,
    };
    client
        .bind(morris_client::ROOT_ID, binding)
        .await
        .map_err(|e| anyhow::anyhow!("binding the root to {url}: {e}"))?;
    println!("morris up: the root now caches {url} (read-only)");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use morris_proto::Timestamp;

    fn desc(addrs: &[String]) -> VolumeDescriptor {
        VolumeDescriptor {
            uuid: uuid::Uuid::new_v4(),
            servers: addrs.to_vec(),
            stripe_unit: 1 << 20,
            replicas: 1,
            created: Timestamp::now(),
        }
    }

    #[test]
    fn classifies_server_sets() {
        let dir = Path::new("/d");
        let addrs = vec!["127.0.0.1:1".to_string(), "127.0.0.1:2".to_string()];
        assert_eq!(
            classify(&addrs, &[(None, None), (None, None)], dir).unwrap(),
            Found::Fresh
        );
        let d = desc(&addrs);
        assert_eq!(
            classify(
                &addrs,
                &[(Some(d.clone()), Some(0)), (Some(d.clone()), Some(1))],
                dir
            )
            .unwrap(),
            Found::Existing(d.clone())
        );
        let mixed = classify(&addrs, &[(Some(d.clone()), Some(0)), (None, None)], dir)
            .unwrap_err()
            .to_string();
        assert!(
            mixed.contains("servers 0 hold") && mixed.contains("servers 1 are unformatted"),
            "{mixed}"
        );
        let other = desc(&addrs);
        let two = classify(
            &addrs,
            &[(Some(d.clone()), Some(0)), (Some(other), Some(1))],
            dir,
        )
        .unwrap_err()
        .to_string();
        assert!(two.contains("different volumes"), "{two}");
        let swapped = classify(
            &addrs,
            &[(Some(d.clone()), Some(1)), (Some(d.clone()), Some(0))],
            dir,
        );
        assert!(swapped.is_err());
        let moved = vec!["127.0.0.1:3".to_string(), "127.0.0.1:4".to_string()];
        let e = classify(
            &moved,
            &[(Some(d.clone()), Some(0)), (Some(d), Some(1))],
            dir,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("same --servers and --port"), "{e}");
    }

    #[test]
    fn taken_ports_are_named() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let p = l.local_addr().unwrap().port();
        let e = check_ports(p, 1).unwrap_err().to_string();
        assert!(
            e.contains(&format!("port {p}")) && e.contains("in use"),
            "{e}"
        );
        assert!(check_ports(65535, 2).is_err());
    }
}

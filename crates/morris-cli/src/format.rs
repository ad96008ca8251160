//! `morris format`: writes a new volume descriptor to a set of servers.
//!
//! Every server is asked first; if any of them is unreachable or already
//! belongs to a volume, nothing is written anywhere.

use std::collections::HashSet;
use std::process::ExitCode;

use anyhow::{anyhow, bail, Result};
use clap::Args;
use futures::future::join_all;
use morris_proto::{
    layout::Layout, Reply, Request, Timestamp, VolumeDescriptor, DEFAULT_STRIPE_UNIT, ROOT_ID,
};
use tracing::info;
use uuid::Uuid;

use crate::admin::{self, Session, CONNECT_TIMEOUT};
use crate::key::KeyArg;
use crate::runtime;
use crate::size::{human, parse_stripe_unit};
use morris_proto::auth::Key;

/// Arguments of `morris format`.
#[derive(Debug, Args)]
pub struct FormatArgs {
    /// Comma-separated server addresses HOST:PORT, in layout order (server 0 first).
    /// Clients reach the servers at exactly these addresses.
    #[arg(long, value_name = "H:P,H:P,...", value_parser = parse_server_list)]
    pub servers: ServerList,
    /// Stripe unit: the size of one block (power of two from 4K to 64M; e.g. 4K, 1M, 64MiB, 65536).
    #[arg(long, value_name = "SIZE", default_value_t = DEFAULT_STRIPE_UNIT,
          value_parser = parse_stripe_unit)]
    pub stripe_unit: u32,
    /// Copies of every data block (1 to 3, on distinct servers). Reads spread
    /// over the copies and go around slow or lost servers; with 2 or 3,
    /// inodes, directories and leases get as many copies, on the next
    /// servers, which take them over when their server is lost.
    #[arg(long, default_value_t = 1, value_name = "N",
          value_parser = clap::value_parser!(u8).range(1..))]
    pub replicas: u8,
    #[command(flatten)]
    pub key: KeyArg,
}

/// An ordered list of distinct server addresses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerList(pub Vec<String>);

/// Parses `H:P,H:P,...`: no empty items, no duplicates, each with a port.
pub fn parse_server_list(s: &str) -> Result<ServerList, String> {
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    for item in s.split(',') {
        let a = item.trim();
        if a.is_empty() {
            return Err(format!("empty server address in {s:?}"));
        }
        let Some((host, port)) = a.rsplit_once(':') else {
            return Err(format!("server address {a:?} needs a port (HOST:PORT)"));
        };
        if host.is_empty() || port.parse::<u16>().map_or(true, |p| p == 0) {
            return Err(format!("server address {a:?} is not HOST:PORT"));
        }
        if !seen.insert(a.to_string()) {
            return Err(format!("server {a} is listed twice"));
        }
        out.push(a.to_string());
    }
    Ok(ServerList(out))
}

/// Builds and checks a new descriptor.
pub fn new_descriptor(
    servers: Vec<String>,
    stripe_unit: u32,
    replicas: u8,
) -> Result<VolumeDescriptor> {
    let d = VolumeDescriptor {
        uuid: Uuid::new_v4(),
        servers,
        stripe_unit,
        replicas,
        created: Timestamp::now(),
    };
    d.validate().map_err(|e| anyhow!("invalid volume: {e}"))?;
    Ok(d)
}

/// Formats `d.servers` with descriptor `d`, refusing before writing anything
/// if a server is unreachable or already belongs to a volume.
pub async fn format_volume(d: &VolumeDescriptor, key: &Key) -> Result<()> {
    let client_id = admin::random_client_id();
    let sessions =
        join_all(d.servers.iter().map(|addr| {
            Session::open(addr, key, None, client_id, "morris-format", CONNECT_TIMEOUT)
        }))
        .await;
    let mut problems = Vec::new();
    let mut ok = Vec::new();
    for (addr, s) in d.servers.iter().zip(sessions) {
        match s {
            Err(e) => problems.push(format!("cannot reach server {addr}: {e:#}")),
            Ok(s) => {
                if let Some(other) = &s.descriptor {
                    problems.push(format!(
                        "server {addr} already belongs to volume {} (as server {} of {}); \
                         it was not changed",
                        other.uuid,
                        s.index.map_or_else(|| "?".to_string(), |i| i.to_string()),
                        other.servers.len()
                    ));
                }
                ok.push(s);
            }
        }
    }
    if !problems.is_empty() {
        bail!(
            "refusing to format; nothing was written:\n  {}",
            problems.join("\n  ")
        );
    }
    let results = join_all(ok.iter().enumerate().map(|(i, s)| async move {
        let req = Request::Format {
            descriptor: d.clone(),
            index: i as u32,
        };
        match s.ask(&req).await {
            Ok(Reply::Ok) => Ok(()),
            Ok(other) => Err(admin::unexpected(&req, &s.addr, &other)),
            Err(e) => Err(e),
        }
    }))
    .await;
    let failed: Vec<String> = results
        .iter()
        .zip(&d.servers)
        .filter_map(|(r, addr)| r.as_ref().err().map(|e| format!("{addr}: {e:#}")))
        .collect();
    if !failed.is_empty() {
        bail!(
            "format of volume {} failed on {} of {} servers (the others are formatted; \
             clear every server's data directory and format again):\n  {}",
            d.uuid,
            failed.len(),
            d.servers.len(),
            failed.join("\n  ")
        );
    }
    info!(volume = %d.uuid, servers = d.servers.len(), "volume formatted");
    Ok(())
}

/// Prints a descriptor for people.
pub fn describe(d: &VolumeDescriptor) -> String {
    let layout = Layout::new(d.servers.len() as u32, d.stripe_unit, u32::from(d.replicas));
    let root = layout.inode_server(ROOT_ID) as usize;
    let mut s = format!(
        "volume {}\n  stripe unit {} ({} bytes), replicas {}, {} server{}\n",
        d.uuid,
        human(u64::from(d.stripe_unit)),
        d.stripe_unit,
        d.replicas,
        d.servers.len(),
        if d.servers.len() == 1 { "" } else { "s" }
    );
    for (i, a) in d.servers.iter().enumerate() {
        let note = if i == root { "  (root directory)" } else { "" };
        s.push_str(&format!("  server {i}  {a}{note}\n"));
    }
    if d.replicas > 1 {
        s.push_str(&format!(
            "  {} copies of every data block (copy r of a block on the r-th next server);\n  \
             reads use the least loaded copy; writes go on with one copy server lost,\n  \
             which catches up when it returns. Inodes, directories and leases have\n  \
             as many copies, on the next servers, which take them over if their\n  \
             server is lost.\n",
            d.replicas
        ));
    }
    s
}

/// Runs `morris format`.
pub fn run(args: FormatArgs) -> Result<ExitCode> {
    let key = args.key.load_volume_key("morris format")?.credential();
    let d = new_descriptor(args.servers.0, args.stripe_unit, args.replicas)?;
    let rt = runtime::build()?;
    rt.block_on(format_volume(&d, &key))?;
    print!("formatted {}", describe(&d));
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_lists() {
        assert_eq!(
            parse_server_list("a:1, b:2").unwrap().0,
            vec!["a:1".to_string(), "b:2".to_string()]
        );
        assert_eq!(
            parse_server_list("[::1]:7700").unwrap().0,
            vec!["[::1]:7700"]
        );
        assert!(parse_server_list("a:1,a:1").is_err());
        assert!(parse_server_list("a:1,,b:2").is_err());
        assert!(parse_server_list("a").is_err());
        assert!(parse_server_list("a:0").is_err());
        assert!(parse_server_list(":7").is_err());
        assert!(parse_server_list("a:99999").is_err());
    }

    #[test]
    fn descriptors_are_validated() {
        let servers = vec!["a:1".to_string(), "b:2".to_string()];
        let d = new_descriptor(servers.clone(), 1 << 20, 1).unwrap();
        assert_eq!(d.servers, servers);
        assert!(new_descriptor(servers.clone(), 1 << 20, 3).is_err());
        // Two copies on two servers; the description says what is mirrored.
        let two = new_descriptor(servers.clone(), 1 << 20, 2).unwrap();
        let text = describe(&two);
        assert!(text.contains("2 copies of every data block"), "{text}");
        assert!(
            text.contains("Inodes, directories and leases have"),
            "{text}"
        );
        let four: Vec<String> = (1..=4).map(|i| format!("h{i}:1")).collect();
        assert!(
            new_descriptor(four, 1 << 20, 4).is_err(),
            "at most 3 copies"
        );
        assert!(new_descriptor(vec![], 1 << 20, 1).is_err());
        let text = describe(&d);
        assert!(text.contains(&d.uuid.to_string()));
        assert!(text.contains("server 1  b:2  (root directory)"), "{text}");
    }
}

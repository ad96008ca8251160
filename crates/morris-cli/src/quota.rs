//! `morris quota`: what each user and group stores in a volume.

use std::collections::HashMap;
use std::process::ExitCode;

use anyhow::{anyhow, Result};
use clap::{Args, Subcommand};
use morris_client::{Client, ClientConfig, QuotaLimit, UsageRow};
use serde::Serialize;

use crate::runtime;

/// `morris quota`.
#[derive(Debug, Args)]
pub struct QuotaArgs {
    #[command(subcommand)]
    command: QuotaCommand,
    #[command(flatten)]
    key: crate::key::KeyArg,
}

#[derive(Debug, Subcommand)]
enum QuotaCommand {
    /// Inodes and bytes each user and each group stores (bytes: regular
    /// files' data, one copy, as the servers hold it), counted by the
    /// servers with every change, and their limits.
    Report(ReportArgs),
    /// Set a user's or a group's limits (needs the volume key). Every
    /// mount and gateway refuses new inodes (at the inode limit) and
    /// growing files (over the byte limit) with EDQUOT within seconds.
    Set(SetArgs),
}

#[derive(Debug, Args)]
struct SetArgs {
    /// Address HOST:PORT of any server of the volume.
    addr: String,
    /// The user (name or uid).
    #[arg(long, conflicts_with = "group", required_unless_present = "group")]
    user: Option<String>,
    /// The group (name or gid).
    #[arg(long)]
    group: Option<String>,
    /// Most inodes it may own (0: no limit).
    #[arg(long, default_value_t = 0)]
    inodes: u64,
    /// Most bytes its files may take, e.g. 10G (0: no limit).
    #[arg(long, value_parser = crate::size::parse_size, default_value = "0")]
    bytes: u64,
}

#[derive(Debug, Args)]
struct ReportArgs {
    /// Address HOST:PORT of any server of the volume.
    addr: String,
    /// Only this user (name or uid).
    #[arg(long, conflicts_with = "group")]
    user: Option<String>,
    /// Only this group (name or gid).
    #[arg(long)]
    group: Option<String>,
    /// Print JSON, one object per user or group.
    #[arg(long)]
    json: bool,
}

/// One line of the report.
#[derive(Debug, Serialize)]
struct Line {
    kind: &'static str,
    id: i64,
    name: Option<String>,
    inodes: i64,
    bytes: i64,
    /// Limits (0: none).
    inode_limit: u64,
    byte_limit: u64,
}

/// Names by id from an `/etc/passwd`-shaped file (`name:x:id:...`).
fn names(path: &str) -> HashMap<i64, String> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .filter_map(|l| {
            let mut f = l.split(':');
            let name = f.next()?;
            let id = f.nth(1)?.parse().ok()?;
            Some((id, name.to_string()))
        })
        .collect()
}

/// `who` as an id: a number, or a name in `by_id`.
fn id_of(who: &str, by_id: &HashMap<i64, String>) -> Result<i64> {
    if let Ok(n) = who.parse() {
        return Ok(n);
    }
    by_id
        .iter()
        .find(|(_, n)| n.as_str() == who)
        .map(|(id, _)| *id)
        .ok_or_else(|| anyhow!("no such user or group here: {who}"))
}

/// Whom `--user`/`--group` name: `(group, id)`.
fn who(
    user: &Option<String>,
    group: &Option<String>,
    users: &HashMap<i64, String>,
    groups: &HashMap<i64, String>,
) -> Result<Option<(bool, i64)>> {
    Ok(match (user, group) {
        (Some(u), _) => Some((false, id_of(u, users)?)),
        (_, Some(g)) => Some((true, id_of(g, groups)?)),
        _ => None,
    })
}

async fn connect(addr: &str, keys: morris_client::Keys) -> Result<std::sync::Arc<Client>> {
    let cfg = ClientConfig {
        name: format!("quota@{}", crate::mount::hostname()),
        ..ClientConfig::new(keys)
    };
    Client::connect(addr, cfg)
        .await
        .map_err(|e| anyhow!("cannot connect to the volume through {addr}: {e}"))
}

/// Runs `morris quota`.
pub fn run(args: QuotaArgs) -> Result<ExitCode> {
    let users = names("/etc/passwd");
    let groups = names("/etc/group");
    let r = match args.command {
        QuotaCommand::Report(r) => r,
        QuotaCommand::Set(a) => {
            let keys = args.key.load_volume_key("morris quota set")?;
            let Some((group, id)) = who(&a.user, &a.group, &users, &groups)? else {
                return Err(anyhow!("name a user (--user) or a group (--group)"));
            };
            let limit = QuotaLimit {
                group,
                id,
                inodes: a.inodes,
                bytes: a.bytes,
            };
            runtime::build()?.block_on(async {
                let client = connect(&a.addr, keys).await?;
                client
                    .set_quota(limit)
                    .await
                    .map_err(|e| anyhow!("cannot set the quota: {e}"))
            })?;
            return Ok(ExitCode::SUCCESS);
        }
    };
    let keys = args.key.load()?;
    let only = who(&r.user, &r.group, &users, &groups)?;
    let (rows, limits): (Vec<UsageRow>, Vec<QuotaLimit>) = runtime::build()?.block_on(async {
        let client = connect(&r.addr, keys).await?;
        let rows = client
            .usage()
            .await
            .map_err(|e| anyhow!("cannot count what the volume holds: {e}"))?;
        let limits = client
            .quotas()
            .await
            .map_err(|e| anyhow!("cannot read the limits: {e}"))?;
        Ok::<_, anyhow::Error>((rows, limits))
    })?;
    // Everyone with a use or a limit.
    let mut all: std::collections::BTreeMap<(bool, i64), (i64, i64, u64, u64)> = rows
        .iter()
        .map(|r| ((r.group, r.id), (r.inodes, r.bytes, 0, 0)))
        .collect();
    for l in &limits {
        let e = all.entry((l.group, l.id)).or_default();
        e.2 = l.inodes;
        e.3 = l.bytes;
    }
    let lines: Vec<Line> = all
        .into_iter()
        .filter(|(k, _)| only.is_none_or(|o| *k == o))
        .map(|((group, id), (inodes, bytes, inode_limit, byte_limit))| {
            let by_id = if group { &groups } else { &users };
            Line {
                kind: if group { "group" } else { "user" },
                id,
                name: by_id.get(&id).cloned(),
                inodes,
                bytes,
                inode_limit,
                byte_limit,
            }
        })
        .collect();
    if r.json {
        for l in &lines {
            println!("{}", serde_json::to_string(l)?);
        }
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "{:<6} {:>10} {:<16} {:>12} {:>12} {:>12} {:>12}",
        "", "id", "name", "inodes", "limit", "bytes", "limit"
    );
    let limit = |n: u64, show: &dyn Fn(u64) -> String| {
        if n == 0 {
            "-".to_string()
        } else {
            show(n)
        }
    };
    for l in &lines {
        let bytes = crate::size::human(u64::try_from(l.bytes).unwrap_or(0));
        let over = (l.inode_limit != 0 && l.inodes.max(0) as u64 >= l.inode_limit)
            || (l.byte_limit != 0 && l.bytes.max(0) as u64 > l.byte_limit);
        println!(
            "{:<6} {:>10} {:<16} {:>12} {:>12} {:>12} {:>12}{}",
            l.kind,
            l.id,
            l.name.as_deref().unwrap_or("-"),
            l.inodes,
            limit(l.inode_limit, &|n| n.to_string()),
            bytes,
            limit(l.byte_limit, &crate::size::human),
            if over { "  over" } else { "" }
        );
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_come_from_passwd_lines() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("passwd");
        std::fs::write(
            &p,
            "root:x:0:0:root:/root:/bin/sh\nbad line\nann:x:1000:1000::/:/bin/sh\n",
        )
        .unwrap();
        let n = names(p.to_str().unwrap());
        assert_eq!(n.get(&0).map(String::as_str), Some("root"));
        assert_eq!(id_of("ann", &n).unwrap(), 1000);
        assert_eq!(id_of("42", &n).unwrap(), 42);
        assert!(id_of("nobody-here", &n).is_err());
    }
}

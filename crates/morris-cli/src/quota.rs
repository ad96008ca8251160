//! `morris quota`: what each user and group stores in a volume.

use std::collections::HashMap;
use std::process::ExitCode;

use anyhow::{anyhow, Result};
use clap::{Args, Subcommand};
use morris_client::{Client, ClientConfig, UsageRow};
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
    /// servers with every change.
    Report(ReportArgs),
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

/// Runs `morris quota`.
pub fn run(args: QuotaArgs) -> Result<ExitCode> {
    let QuotaCommand::Report(r) = args.command;
    let keys = args.key.load()?;
    let users = names("/etc/passwd");
    let groups = names("/etc/group");
    let only = match (&r.user, &r.group) {
        (Some(u), _) => Some((false, id_of(u, &users)?)),
        (_, Some(g)) => Some((true, id_of(g, &groups)?)),
        _ => None,
    };
    let rows: Vec<UsageRow> = runtime::build()?.block_on(async {
        let cfg = ClientConfig {
            name: format!("quota@{}", crate::mount::hostname()),
            ..ClientConfig::new(keys)
        };
        let client = Client::connect(&r.addr, cfg)
            .await
            .map_err(|e| anyhow!("cannot connect to the volume through {}: {e}", r.addr))?;
        client
            .usage()
            .await
            .map_err(|e| anyhow!("cannot count what the volume holds: {e}"))
    })?;
    let lines: Vec<Line> = rows
        .into_iter()
        .filter(|row| only.is_none_or(|(g, id)| row.group == g && row.id == id))
        .map(|row| {
            let by_id = if row.group { &groups } else { &users };
            Line {
                kind: if row.group { "group" } else { "user" },
                id: row.id,
                name: by_id.get(&row.id).cloned(),
                inodes: row.inodes,
                bytes: row.bytes,
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
        "{:<6} {:>10} {:<16} {:>12} {:>12}",
        "", "id", "name", "inodes", "bytes"
    );
    for l in &lines {
        let bytes = crate::size::human(u64::try_from(l.bytes).unwrap_or(0));
        println!(
            "{:<6} {:>10} {:<16} {:>12} {:>12}",
            l.kind,
            l.id,
            l.name.as_deref().unwrap_or("-"),
            l.inodes,
            bytes
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

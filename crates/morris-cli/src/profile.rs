//! `morris profile FILE`: sums up a mount's access log (`--access-log`,
//! issue 20): per operation, how many requests, how many failed, their
//! total, mean and 99th-percentile time, the operations that took the most
//! time first; and the inodes and processes that cost the most.

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::Args;
use serde::Serialize;

use crate::status::table;

/// Arguments of `morris profile`.
#[derive(Debug, Args)]
pub struct ProfileArgs {
    /// An access log written by `morris mount --access-log FILE`.
    pub log: PathBuf,
    /// Rows of the inode and process tables.
    #[arg(long, default_value_t = 10, value_name = "N")]
    pub top: usize,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// One line of an access log.
#[derive(Debug, PartialEq)]
pub struct Entry<'a> {
    /// The process that asked.
    pub pid: u32,
    /// The FUSE operation.
    pub op: &'a str,
    /// The inode it named.
    pub ino: u64,
    /// Whether it succeeded.
    pub ok: bool,
    /// Seconds it took.
    pub secs: f64,
}

/// Reads one access-log line (`None`: a comment or not such a line).
pub fn parse(line: &str) -> Option<Entry<'_>> {
    if line.starts_with('#') {
        return None;
    }
    let (_, rest) = line.split_once(" [")?;
    let (who, rest) = rest.split_once("] ")?;
    let pid = who
        .split(',')
        .find_map(|kv| kv.strip_prefix("pid:"))?
        .parse()
        .ok()?;
    let (op, rest) = rest.split_once(" (")?;
    let (ino, rest) = rest.split_once("): ")?;
    let (outcome, rest) = rest.rsplit_once(" <")?;
    let secs = rest.strip_suffix('>')?.parse().ok()?;
    Some(Entry {
        pid,
        op,
        ino: ino.parse().ok()?,
        ok: outcome == "OK",
        secs,
    })
}

/// What one operation (or inode, or process) cost.
#[derive(Debug, Default, Serialize, Clone)]
pub struct Cost {
    /// What is counted: an operation name, an inode, a pid.
    pub key: String,
    /// Requests.
    pub count: u64,
    /// Of which failed.
    pub errors: u64,
    /// Seconds, all together.
    pub total_s: f64,
    /// Mean, milliseconds.
    pub mean_ms: f64,
    /// 99th percentile, milliseconds (operations only).
    pub p99_ms: f64,
    #[serde(skip)]
    times: Vec<f64>,
}

impl Cost {
    fn add(&mut self, e: &Entry<'_>, keep_times: bool) {
        self.count += 1;
        self.errors += u64::from(!e.ok);
        self.total_s += e.secs;
        if keep_times {
            self.times.push(e.secs);
        }
    }

    fn finish(mut self) -> Self {
        self.mean_ms = if self.count > 0 {
            self.total_s / self.count as f64 * 1000.0
        } else {
            0.0
        };
        if !self.times.is_empty() {
            self.times.sort_by(f64::total_cmp);
            let at = ((self.times.len() as f64 * 0.99).ceil() as usize).clamp(1, self.times.len());
            self.p99_ms = self.times[at - 1] * 1000.0;
        }
        self.times = Vec::new();
        self
    }
}

/// A whole log summed up.
#[derive(Debug, Serialize)]
pub struct Profile {
    /// Lines read as requests.
    pub requests: u64,
    /// Lines that were not requests (comments, dropped-line notes, damage).
    pub other_lines: u64,
    /// Per operation, most total time first.
    pub ops: Vec<Cost>,
    /// The inodes that took the most time.
    pub inodes: Vec<Cost>,
    /// The processes that took the most time.
    pub processes: Vec<Cost>,
}

fn ranked(m: HashMap<String, Cost>, top: usize) -> Vec<Cost> {
    let mut v: Vec<Cost> = m.into_values().map(Cost::finish).collect();
    v.sort_by(|a, b| b.total_s.total_cmp(&a.total_s).then(a.key.cmp(&b.key)));
    v.truncate(top);
    v
}

fn add(m: &mut HashMap<String, Cost>, key: String, e: &Entry<'_>, keep_times: bool) {
    m.entry(key.clone())
        .or_insert_with(|| Cost {
            key,
            ..Cost::default()
        })
        .add(e, keep_times);
}

/// Sums up `lines`.
pub fn profile<'a>(lines: impl Iterator<Item = &'a str>, top: usize) -> Profile {
    let (mut ops, mut inodes, mut procs) = (HashMap::new(), HashMap::new(), HashMap::new());
    let (mut requests, mut other) = (0, 0);
    for line in lines {
        let Some(e) = parse(line) else {
            other += 1;
            continue;
        };
        requests += 1;
        add(&mut ops, e.op.to_string(), &e, true);
        add(&mut inodes, e.ino.to_string(), &e, false);
        add(&mut procs, e.pid.to_string(), &e, false);
    }
    Profile {
        requests,
        other_lines: other,
        ops: ranked(ops, usize::MAX),
        inodes: ranked(inodes, top),
        processes: ranked(procs, top),
    }
}

fn rows(v: &[Cost], p99: bool) -> Vec<Vec<String>> {
    v.iter()
        .map(|c| {
            let mut r = vec![
                c.key.clone(),
                c.count.to_string(),
                c.errors.to_string(),
                format!("{:.3}", c.total_s),
                format!("{:.3}", c.mean_ms),
            ];
            if p99 {
                r.push(format!("{:.3}", c.p99_ms));
            }
            r
        })
        .collect()
}

/// Runs `morris profile`.
pub fn run(args: ProfileArgs) -> Result<ExitCode> {
    let f = std::fs::File::open(&args.log)
        .with_context(|| format!("cannot open {}", args.log.display()))?;
    let lines: Vec<String> = BufReader::new(f)
        .lines()
        .collect::<std::io::Result<_>>()
        .with_context(|| format!("cannot read {}", args.log.display()))?;
    let p = profile(lines.iter().map(String::as_str), args.top);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&p)?);
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "{} requests in {} ({} other lines)\n",
        p.requests,
        args.log.display(),
        p.other_lines
    );
    let h = [
        "OPERATION",
        "COUNT",
        "ERRORS",
        "TOTAL-S",
        "MEAN-MS",
        "P99-MS",
    ];
    print!("{}", table(&h, &rows(&p.ops, true), &[0]));
    println!();
    let h = ["INODE", "COUNT", "ERRORS", "TOTAL-S", "MEAN-MS"];
    print!("{}", table(&h, &rows(&p.inodes, false), &[0]));
    println!();
    let h = ["PID", "COUNT", "ERRORS", "TOTAL-S", "MEAN-MS"];
    print!("{}", table(&h, &rows(&p.processes, false), &[0]));
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOG: &str = "\
2026-11-28T01:40:00.123456Z [uid:0,gid:0,pid:7] write (4101): OK <0.000020>
2026-11-28T01:40:00.123500Z [uid:0,gid:0,pid:7] write (4101): OK <0.000040>
# 3 lines dropped (the log could not keep up)
2026-11-28T01:40:00.123600Z [uid:5,gid:5,pid:8] lookup (1): ENOENT <0.001000>
garbage
";

    #[test]
    fn a_log_is_summed_per_operation_inode_and_process() {
        let p = profile(LOG.lines(), 10);
        assert_eq!((p.requests, p.other_lines), (3, 2));
        assert_eq!(p.ops[0].key, "lookup");
        assert_eq!((p.ops[0].count, p.ops[0].errors), (1, 1));
        assert_eq!(p.ops[1].key, "write");
        assert!((p.ops[1].mean_ms - 0.03).abs() < 1e-9);
        assert!((p.ops[1].p99_ms - 0.04).abs() < 1e-9);
        assert_eq!(p.inodes[0].key, "1");
        assert_eq!(p.processes[1].key, "7");
        assert_eq!(p.processes[1].count, 2);
        assert_eq!(
            parse("t [uid:0,gid:0,pid:1] read (9): errno 1234 <0.5>"),
            Some(Entry {
                pid: 1,
                op: "read",
                ino: 9,
                ok: false,
                secs: 0.5
            })
        );
    }
}

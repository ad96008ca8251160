//! `morris-consistency`: runs multi-process, multi-mount workloads against
//! a directory (through FUSE mounts of a morris volume, a local directory,
//! or an NFSv3 export) and checks every result against what POSIX (or
//! NFSv3) promises. One JSON summary line per workload on stdout; each
//! violation (the first 20) and the command to replay on stderr; exit 1 on
//! any violation, 2 when the checker itself could not run.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use morris_consistency::access::TargetSpec;
use morris_consistency::runner::{run, worker_main, RunConfig};
use morris_consistency::workloads::{Params, Workload};

/// Consistency checker for morris (and any POSIX or NFSv3 file system).
#[derive(Debug, Parser)]
#[command(
    name = "morris-consistency",
    version,
    about,
    subcommand_negates_reqs = true,
    after_help = "Example: two FUSE mounts of one volume and the NFS gateway:\n  \
        morris-consistency --workload all --dir /mnt/a/t --dir /mnt/b/t --nfs 127.0.0.1:2050/t --seconds 30 --seed 1\n\
        Each --dir (and --nfs) must be the same directory seen through a different mount;\n\
        a local directory (given once or twice) is the reference every workload passes on."
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Cmd>,

    /// Workloads to run, comma-separated or repeated: append,
    /// rename-replace, create-unlink, open-unlinked, listing, sqlite, or all.
    #[arg(long, required = true, value_delimiter = ',')]
    workload: Vec<String>,

    /// The directory under test through a mount (repeat for each mount).
    #[arg(long = "dir")]
    dirs: Vec<PathBuf>,

    /// The same directory through an NFSv3 server: HOST:PORT[/path/in/export]
    /// (MOUNT and NFS on that one port, export "/"; repeatable).
    #[arg(long = "nfs")]
    nfs: Vec<String>,

    /// Seconds each workload runs.
    #[arg(long, default_value_t = 30.0)]
    seconds: f64,

    /// Seed of every random choice (sizes, names, operations).
    #[arg(long, default_value_t = 1)]
    seed: u64,

    /// Worker processes of each workload's main role.
    #[arg(long, default_value_t = 4)]
    procs: usize,

    /// sqlite: spread the processes over every mount (needs POSIX locks
    /// that work across mounts).
    #[arg(long)]
    sqlite_all_mounts: bool,

    /// listing: names that always exist in the directory, untouched.
    #[arg(long, default_value_t = 200)]
    stable_names: usize,

    /// listing: names that always exist but are constantly renamed over.
    #[arg(long, default_value_t = 100)]
    replaced_names: usize,

    /// Seconds after the deadline before a worker counts as hung and is killed.
    #[arg(long, default_value_t = 90.0)]
    grace: f64,

    /// Keep the run directories and the workers' specs and reports.
    #[arg(long)]
    keep: bool,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// One worker process (started by the checker itself).
    #[command(hide = true)]
    Worker {
        /// The worker's JSON spec.
        #[arg(long)]
        spec: PathBuf,
    },
}

fn parse_workloads(names: &[String]) -> Result<Vec<Workload>, String> {
    let mut out = Vec::new();
    for n in names {
        if n == "all" {
            out.extend(Workload::ALL);
            continue;
        }
        match Workload::ALL.iter().find(|w| w.name() == n) {
            Some(w) => out.push(*w),
            None => {
                return Err(format!(
                    "unknown workload {n:?}; known: all, {}",
                    Workload::ALL.map(Workload::name).join(", ")
                ))
            }
        }
    }
    out.dedup();
    Ok(out)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Some(Cmd::Worker { spec }) = &cli.command {
        return match worker_main(spec) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("morris-consistency worker: {e:#}");
                ExitCode::from(2)
            }
        };
    }
    let usage = |msg: String| {
        eprintln!("morris-consistency: {msg}");
        ExitCode::from(2)
    };
    let workloads = match parse_workloads(&cli.workload) {
        Ok(w) => w,
        Err(e) => return usage(e),
    };
    let mut targets = Vec::new();
    for d in &cli.dirs {
        match std::path::absolute(d) {
            Ok(dir) => targets.push(TargetSpec::Posix { dir }),
            Err(e) => return usage(format!("--dir {}: {e}", d.display())),
        }
    }
    for n in &cli.nfs {
        match TargetSpec::parse_nfs(n) {
            Ok(t) => targets.push(t),
            Err(e) => return usage(e),
        }
    }
    if targets.is_empty() {
        return usage("give at least one --dir or --nfs".into());
    }
    if !cli.seconds.is_finite() || cli.seconds <= 0.0 {
        return usage("--seconds must be positive".into());
    }
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => return usage(format!("cannot find my own executable: {e}")),
    };
    let cfg = RunConfig {
        workloads,
        targets,
        seconds: cli.seconds,
        seed: cli.seed,
        params: Params {
            procs: cli.procs.max(1),
            sqlite_all_mounts: cli.sqlite_all_mounts,
            stable_names: cli.stable_names,
            replaced_names: cli.replaced_names.max(1),
        },
        grace: cli.grace,
        keep: cli.keep,
        exe,
    };
    let summaries = match run(&cfg) {
        Ok(s) => s,
        Err(e) => return usage(format!("{e:#}")),
    };
    let mut violations = 0;
    for s in &summaries {
        match serde_json::to_string(s) {
            Ok(line) => println!("{line}"),
            Err(e) => return usage(format!("cannot encode a summary: {e}")),
        }
        violations += s.violations;
        if s.violations > 0 {
            eprintln!(
                "\n{}: {} violation(s) {:?}; the first {}:",
                s.workload,
                s.violations,
                s.violations_by_kind,
                s.first_violations.len()
            );
            for v in &s.first_violations {
                eprintln!("  {v}");
            }
            eprintln!("  seed {}; replay: {}", s.seed, s.replay);
        }
    }
    if violations > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

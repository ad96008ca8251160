//! `morris`: the one command of the morris distributed file system.
//!
//! Subcommands run a stripe server, format a volume, mount it through FUSE,
//! unmount it, report status, check it (`fsck`) and start a whole local
//! cluster in one go (`up`). Logs go to stderr, filtered by `RUST_LOG`.

mod admin;
mod bench;
mod cache;
mod daemon;
mod exporter;
mod format;
mod fsck;
mod hold;
mod info;
mod key;
mod mount;
mod mountinfo;
mod nfs;
mod profile;
mod progress;
mod quota;
mod runtime;
mod scrub;
mod server;
mod servers;
mod size;
mod stats;
mod status;
mod umount;
mod up;
mod volume;

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use tracing_subscriber::EnvFilter;

/// The morris distributed file system.
#[derive(Debug, Parser)]
#[command(name = "morris", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run a stripe server (one per machine or disk).
    Server(server::ServerArgs),
    /// Write a new volume descriptor to a set of unformatted servers.
    Format(format::FormatArgs),
    /// Mount a volume through FUSE.
    Mount(mount::MountArgs),
    /// Unmount a mounted volume.
    Umount(umount::UmountArgs),
    /// Start a local cluster: servers, format (first time) and a mount.
    Up(up::UpArgs),
    /// Show the state and counters of every server of a volume.
    Status(status::StatusArgs),
    /// A live view of servers, mounts and gateways, from their metrics
    /// endpoints (--metrics).
    Stats(stats::StatsArgs),
    /// Where a file or directory of a mount lives: its inode's server,
    /// each stripe unit's servers and copies, stale copies, lease holders.
    Info(info::InfoArgs),
    /// Sum up a mount's access log (`morris mount --access-log FILE`).
    Profile(profile::ProfileArgs),
    /// Check a volume's namespace and data for inconsistencies and garbage.
    Fsck(fsck::FsckArgs),
    /// Read every server's data and check it against its checksums (damage
    /// is repaired from another copy).
    Scrub(scrub::ScrubArgs),
    /// Measure throughput of a directory (a mount, or a local disk to compare).
    Bench(bench::BenchArgs),
    /// Serve a volume over NFSv3 (with MOUNT v3 on the same port).
    Nfs(nfs::NfsArgs),
    /// Cache mode: bind a directory to a home file system, and look after
    /// the cache (status, prefetch, evict).
    Cache(cache::CacheArgs),
    /// Make and inspect the volume's key files.
    Key(key::KeyArgs),
    /// Change the servers of a running volume: replace a lost one.
    Volume(volume::VolumeArgs),
    /// What each user and group stores in a volume.
    Quota(quota::QuotaArgs),
}

/// How verbose logging is when `RUST_LOG` is not set.
fn default_filter(cmd: &Command) -> &'static str {
    match cmd {
        Command::Server(_) | Command::Mount(_) | Command::Up(_) | Command::Nfs(_) => "info",
        _ => "warn",
    }
}

/// Sets up `tracing` to stderr, filtered by `RUST_LOG` (or `default`).
pub(crate) fn init_logging(default: &str) {
    let filter = match std::env::var("RUST_LOG") {
        Ok(v) if !v.trim().is_empty() => match EnvFilter::try_new(&v) {
            Ok(f) => f,
            Err(e) => {
                eprintln!("morris: ignoring invalid RUST_LOG={v:?}: {e}");
                EnvFilter::new(default)
            }
        },
        _ => EnvFilter::new(default),
    };
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .try_init();
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let default = default_filter(&cli.command);
    // A background mount detaches (and redirects stderr) before logging starts,
    // so that the log file gets no terminal colour codes.
    let detaching = matches!(&cli.command, Command::Mount(m) if m.background);
    if !detaching {
        init_logging(default);
    }
    let result = match cli.command {
        Command::Server(a) => server::run(a),
        Command::Format(a) => format::run(a),
        Command::Mount(a) => mount::run(a, default),
        Command::Umount(a) => umount::run(a),
        Command::Up(a) => up::run(a),
        Command::Status(a) => status::run(a),
        Command::Stats(a) => stats::run(a),
        Command::Info(a) => info::run(a),
        Command::Quota(a) => quota::run(a),
        Command::Profile(a) => profile::run(a),
        Command::Fsck(a) => fsck::run(a),
        Command::Scrub(a) => scrub::run(a),
        Command::Bench(a) => bench::run(a),
        Command::Nfs(a) => nfs::run(a),
        Command::Cache(a) => cache::run(a),
        Command::Key(a) => key::run(a),
        Command::Volume(a) => volume::run(a),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("morris: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn every_argument_has_help() {
        fn walk(cmd: &clap::Command, path: &str) {
            for arg in cmd.get_arguments() {
                let id = arg.get_id().as_str();
                if id == "help" || id == "version" {
                    continue;
                }
                assert!(
                    arg.get_help().is_some(),
                    "argument {id} of `{path}` has no help text"
                );
            }
            for sub in cmd.get_subcommands() {
                assert!(
                    sub.get_about().is_some(),
                    "subcommand `{path} {}` has no help text",
                    sub.get_name()
                );
                walk(sub, &format!("{path} {}", sub.get_name()));
            }
        }
        walk(&Cli::command(), "morris");
    }
}

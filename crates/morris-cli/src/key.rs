//! `morris key`: make and inspect the volume's key files, and the `--key`
//! argument every command that connects takes.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use morris_proto::auth::keys::write_key_file;
use morris_proto::auth::{Key, Keys, Role};

/// The key file a command proves itself with.
#[derive(Debug, Clone, Args)]
pub struct KeyArg {
    /// Key file: the volume key (servers, admin commands) or the client key
    /// (mounts, NFS gateways); made by `morris key new`. Default: $MORRIS_KEY.
    #[arg(long = "key", env = "MORRIS_KEY", value_name = "FILE", global = true)]
    pub key: Option<PathBuf>,
    /// Run every connection to the servers inside TLS (encrypted, and
    /// tamper-evident); on `morris server`, also refuse connections that
    /// are not. Default: $MORRIS_TLS.
    #[arg(long, env = "MORRIS_TLS", global = true)]
    pub tls: bool,
}

impl KeyArg {
    /// Reads the key file; an error that says how to get one if none is given.
    pub fn load(&self) -> Result<Keys> {
        let Some(path) = &self.key else {
            bail!(
                "no key: pass --key FILE or set MORRIS_KEY (servers and admin commands \
                 take the volume key, mounts the client key; `morris key new DIR` makes both)"
            );
        };
        Ok(Keys::load(path)?.with_tls(self.tls))
    }

    /// Reads the key file and insists it is the volume key.
    pub fn load_volume_key(&self, what: &str) -> Result<Keys> {
        let keys = self.load()?;
        if keys.credential().role() != Role::Server {
            bail!(
                "{what} needs the volume key; {} holds a client key",
                self.key.as_deref().unwrap_or(Path::new("?")).display()
            );
        }
        Ok(keys)
    }
}

/// `morris key`.
#[derive(Debug, Args)]
pub struct KeyArgs {
    #[command(subcommand)]
    command: KeyCommand,
}

#[derive(Debug, Subcommand)]
enum KeyCommand {
    /// Make a new volume key (DIR/volume.key) and its client key
    /// (DIR/client.key), readable by their owner only.
    New {
        /// Directory to write the two key files to (created if missing;
        /// existing key files are never overwritten).
        dir: PathBuf,
    },
    /// Write the client key of a volume key file to a new file (after a
    /// rotation: the client key of the first volume key).
    Client {
        /// The volume key file.
        volume_key: PathBuf,
        /// The client key file to write.
        out: PathBuf,
    },
    /// Show the role and the public id of each key in a key file (never
    /// the secret).
    Show {
        /// The key file.
        file: PathBuf,
    },
}

/// Writes DIR/volume.key and DIR/client.key (for `key new` and `up`).
pub fn new_pair(dir: &Path) -> Result<(PathBuf, PathBuf)> {
    std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    let volume = dir.join("volume.key");
    let client = dir.join("client.key");
    let key = Key::generate();
    write_key_file(
        &volume,
        std::slice::from_ref(&key),
        "morris volume key: for stripe servers and admin commands only. Keep it secret.",
    )?;
    write_key_file(
        &client,
        &[key.client_key()],
        "morris client key: for mounts and NFS gateways of this volume. Keep it secret.",
    )?;
    Ok((volume, client))
}

/// Runs `morris key`.
pub fn run(args: KeyArgs) -> Result<ExitCode> {
    match args.command {
        KeyCommand::New { dir } => {
            let (v, c) = new_pair(&dir)?;
            println!("volume key: {} (servers, admin commands)", v.display());
            println!("client key: {} (mounts, NFS gateways)", c.display());
        }
        KeyCommand::Client { volume_key, out } => {
            let key = Keys::load(&volume_key)?.credential();
            if key.role() != Role::Server {
                bail!(
                    "{} holds a client key, not the volume key",
                    volume_key.display()
                );
            }
            write_key_file(
                &out,
                &[key.client_key()],
                "morris client key: for mounts and NFS gateways of this volume. Keep it secret.",
            )?;
            println!(
                "client key {} written to {}",
                key.client_key().id_hex(),
                out.display()
            );
        }
        KeyCommand::Show { file } => {
            let text = std::fs::read_to_string(&file)
                .with_context(|| format!("read {}", file.display()))?;
            for (i, k) in morris_proto::auth::keys::parse_keys(&file, &text)?
                .iter()
                .enumerate()
            {
                let used = if i == 0 {
                    "connects, accepted"
                } else {
                    "accepted"
                };
                println!("{} key {} ({used})", k.role(), k.id_hex());
                if k.role() == Role::Server {
                    println!("  its client key {}", k.client_key().id_hex());
                }
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

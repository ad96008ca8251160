//! A real nfs-ganesha (FSAL VFS) serving a local directory over NFSv3, for
//! tests: `bench/lib/ganesha.py` run as a child process, which starts
//! ganesha and its own rpcbind in private namespaces and prints the libnfs
//! URL once the export answers MOUNT.
//!
//! [`Ganesha::start_new`] picks two free ports (NFS, MOUNT) and starts it;
//! [`Ganesha::stop`] ends it (SIGTERM to the script, which stops ganesha
//! and rpcbind by PID); [`Ganesha::start`] starts it again on the same
//! ports. Dropping it stops it. Any failure to start panics, with the tail
//! of ganesha's log: these tests never skip.

#![allow(dead_code)] // each test binary uses part of it

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use morris_home::HomeUrl;

/// How long ganesha may take to answer MOUNT after it is started.
const START_TIMEOUT: Duration = Duration::from_secs(90);
/// How long the script may take to stop ganesha and rpcbind.
const STOP_TIMEOUT: Duration = Duration::from_secs(45);

/// One nfs-ganesha exporting a directory as `/export`; see the module
/// documentation.
pub struct Ganesha {
    export: PathBuf,
    workdir: PathBuf,
    port: u16,
    mount_port: u16,
    child: Option<Child>,
    url: Option<HomeUrl>,
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../bench/lib/ganesha.py")
}

/// A TCP port nothing listens on at the moment.
fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    l.local_addr().expect("local_addr").port()
}

fn tail(path: &Path, lines: usize) -> String {
    match std::fs::read(path) {
        Ok(b) => {
            let text = String::from_utf8_lossy(&b);
            let all: Vec<&str> = text.lines().collect();
            all[all.len().saturating_sub(lines)..].join("\n")
        }
        Err(e) => format!("(cannot read {}: {e})", path.display()),
    }
}

impl Ganesha {
    /// Starts ganesha exporting `export`, its config, log and state in
    /// `workdir` (created if missing), on two free ports.
    pub fn start_new(export: &Path, workdir: &Path) -> Ganesha {
        std::fs::create_dir_all(workdir).expect("create the ganesha workdir");
        let port = free_port();
        let mut mount_port = free_port();
        while mount_port == port {
            mount_port = free_port();
        }
        let mut g = Ganesha {
            export: export.to_path_buf(),
            workdir: workdir.to_path_buf(),
            port,
            mount_port,
            child: None,
            url: None,
        };
        g.start();
        g
    }

    /// The home URL ganesha printed (`nfs://127.0.0.1/export?...`).
    pub fn url(&self) -> HomeUrl {
        match &self.url {
            Some(u) => u.clone(),
            None => panic!("Ganesha::url() before start()"),
        }
    }

    /// The URL of `subdir` below the export.
    pub fn url_of(&self, subdir: &str) -> HomeUrl {
        match self.url() {
            HomeUrl::Nfs {
                host,
                port,
                mount_port,
                export,
                ..
            } => HomeUrl::Nfs {
                host,
                port,
                mount_port,
                export,
                subdir: subdir.to_string(),
            },
            u => panic!("ganesha printed a non-NFS URL {u}"),
        }
    }

    /// The NFS port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The MOUNT port.
    pub fn mount_port(&self) -> u16 {
        self.mount_port
    }

    /// Whether it runs.
    pub fn running(&self) -> bool {
        self.child.is_some()
    }

    /// Starts ganesha (again, on the same ports) and waits until it serves
    /// the export; panics, with the tail of its log, if it does not within
    /// 90 s.
    pub fn start(&mut self) {
        assert!(self.child.is_none(), "ganesha already started");
        let errfile = self.workdir.join("harness.stderr");
        let stderr = std::fs::File::create(&errfile).expect("create harness.stderr");
        let mut child = match Command::new("python3")
            .arg(script())
            .arg(&self.export)
            .args(["--port", &self.port.to_string()])
            .args(["--mount-port", &self.mount_port.to_string()])
            // Changes made in the exported directory are seen at once, as
            // with a kernel server (ganesha trusts its cache 60 s otherwise).
            .args(["--attr-expiration", "0"])
            .arg("--workdir")
            .arg(&self.workdir)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
        {
            Ok(c) => c,
            Err(e) => panic!("cannot run python3 {}: {e}", script().display()),
        };
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut r = BufReader::new(stdout);
            let mut line = String::new();
            let _ = tx.send(r.read_line(&mut line).map(|_| line.clone()));
            // Drain whatever else it prints, so that it never blocks.
            let mut rest = Vec::new();
            let _ = r.read_to_end(&mut rest);
        });
        let t0 = Instant::now();
        let line = rx.recv_timeout(START_TIMEOUT);
        let url = match &line {
            Ok(Ok(l)) => l
                .split_whitespace()
                .next()
                .and_then(|u| u.parse::<HomeUrl>().ok()),
            _ => None,
        };
        self.child = Some(child);
        let Some(url) = url else {
            self.stop();
            panic!(
                "nfs-ganesha did not start within {START_TIMEOUT:?} (took {:?}; script printed {line:?})\n\
                 --- script stderr ({}):\n{}\n--- tail of {}:\n{}",
                t0.elapsed(),
                errfile.display(),
                tail(&errfile, 30),
                self.workdir.join("ganesha.log").display(),
                tail(&self.workdir.join("ganesha.log"), 40),
            );
        };
        eprintln!(
            "ganesha serving {} as {url} (started in {:.1?})",
            self.export.display(),
            t0.elapsed()
        );
        self.url = Some(url);
    }

    /// Stops ganesha: SIGTERM to the script (which stops ganesha and its
    /// rpcbind by PID), then waits for it; SIGKILL after 45 s.
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        if let Ok(pid) = i32::try_from(child.id()) {
            // SAFETY: kill(2) on the PID of our own child, not yet reaped.
            unsafe { libc::kill(pid, libc::SIGTERM) };
        }
        let t0 = Instant::now();
        loop {
            match child.try_wait() {
                Ok(Some(_)) => return,
                Ok(None) if t0.elapsed() < STOP_TIMEOUT => {
                    std::thread::sleep(Duration::from_millis(50))
                }
                _ => {
                    eprintln!("ganesha.py did not stop within {STOP_TIMEOUT:?}; SIGKILL");
                    let _ = child.kill();
                    let _ = child.wait();
                    return;
                }
            }
        }
    }
}

impl Drop for Ganesha {
    fn drop(&mut self) {
        self.stop();
    }
}

//! The coordinator and the worker processes.
//!
//! For each workload the coordinator makes a fresh run directory through
//! the first target (`mc-<workload>-<seed>-<pid>`), waits until every target
//! sees it, lets the workload set up its files, then starts the workers:
//! the same binary again (`morris-consistency worker --spec FILE`), each
//! with a JSON [`WorkerSpec`] in a local scratch directory. Workers run
//! until the shared deadline (`CLOCK_MONOTONIC`), write a
//! [`WorkerReport`] next to their spec and exit. A worker still running
//! `grace` seconds after the deadline is reported (with where the kernel
//! says it is blocked) and killed. The workload then checks what needs
//! every worker's view, the run directory is removed, and a [`Summary`]
//! is returned.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::Context;
use serde::{Deserialize, Serialize};

use crate::access::{Access, FsError, TargetSpec};
use crate::clock::{now_ns, secs_since};
use crate::report::{Summary, Violation, WorkerReport};
use crate::rng::{derive, hash_str, Rng};
use crate::workloads::{Params, Workload};

/// Everything one invocation runs.
#[derive(Debug, Clone)]
pub struct RunConfig {
    /// Workloads, run one after the other.
    pub workloads: Vec<Workload>,
    /// The directory under test, as each target sees it.
    pub targets: Vec<TargetSpec>,
    /// Seconds each workload runs.
    pub seconds: f64,
    /// The seed of every random choice.
    pub seed: u64,
    /// Workload knobs.
    pub params: Params,
    /// Seconds after the deadline before a worker counts as hung.
    pub grace: f64,
    /// Keep run directories (and the scratch directory) afterwards.
    pub keep: bool,
    /// The program to run as workers (normally this binary).
    pub exe: PathBuf,
}

impl RunConfig {
    /// The command line that replays `workload` with the same seed.
    pub fn replay(&self, workload: Workload) -> String {
        let mut parts = vec![
            self.exe.display().to_string(),
            "--workload".into(),
            workload.name().into(),
        ];
        for t in &self.targets {
            parts.extend(t.cli_args());
        }
        parts.extend([
            "--seconds".into(),
            format!("{}", self.seconds),
            "--seed".into(),
            self.seed.to_string(),
            "--procs".into(),
            self.params.procs.to_string(),
        ]);
        if self.params.sqlite_all_mounts {
            parts.push("--sqlite-all-mounts".into());
        }
        let d = Params::default();
        if self.params.stable_names != d.stable_names
            || self.params.replaced_names != d.replaced_names
        {
            parts.extend([
                "--stable-names".into(),
                self.params.stable_names.to_string(),
                "--replaced-names".into(),
                self.params.replaced_names.to_string(),
            ]);
        }
        parts
            .iter()
            .map(|p| {
                if p.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "/._-:=,".contains(c))
                {
                    p.clone()
                } else {
                    format!("'{}'", p.replace('\'', "'\\''"))
                }
            })
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// What one worker process is told.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WorkerSpec {
    /// The workload.
    pub workload: Workload,
    /// Its role in the workload (`writer`, `reader`, ...).
    pub role: String,
    /// Its index among the workers of that role.
    pub index: usize,
    /// Its index among all workers of the run.
    pub id: usize,
    /// Index of its target in `targets`.
    pub target: usize,
    /// The run directory as each applicable target sees it.
    pub targets: Vec<TargetSpec>,
    /// Labels of the targets, for messages.
    pub labels: Vec<String>,
    /// The run seed (content and records depend on it).
    pub run_seed: u64,
    /// The worker's own seed.
    pub seed: u64,
    /// When the workload started (`CLOCK_MONOTONIC` ns).
    pub start_ns: u64,
    /// When to stop.
    pub deadline_ns: u64,
    /// Workload knobs.
    pub params: Params,
    /// What the workload's set-up left for the workers.
    pub setup: serde_json::Value,
    /// Where to write the report.
    pub result: PathBuf,
}

/// A worker process's view of its run.
pub struct WorkerCtx {
    /// What it was told.
    pub spec: WorkerSpec,
    /// Its random choices.
    pub rng: Rng,
    /// What it reports.
    pub report: WorkerReport,
}

impl WorkerCtx {
    /// A context for `spec`.
    pub fn new(spec: WorkerSpec) -> WorkerCtx {
        let report = WorkerReport {
            worker: format!("{}#{} (pid {})", spec.role, spec.index, std::process::id()),
            target: spec.labels.get(spec.target).cloned().unwrap_or_default(),
            ..WorkerReport::default()
        };
        WorkerCtx {
            rng: Rng::new(spec.seed),
            spec,
            report,
        }
    }

    /// True until the deadline.
    pub fn running(&self) -> bool {
        now_ns() < self.spec.deadline_ns
    }

    /// Seconds since the workload started.
    pub fn t(&self) -> f64 {
        secs_since(self.spec.start_ns, now_ns())
    }

    /// The label of target `i`.
    pub fn label(&self, i: usize) -> String {
        self.spec.labels.get(i).cloned().unwrap_or_default()
    }

    /// Records a violation seen through target `target`.
    pub fn violation(&mut self, kind: &str, target: &str, op: &str, detail: String) {
        let v = Violation {
            kind: kind.to_string(),
            worker: self.report.worker.clone(),
            target: target.to_string(),
            op: op.to_string(),
            detail,
            t: self.t(),
        };
        self.report.violation(v);
    }

    /// Records a failed operation that the promise does not allow: counts
    /// its errno and reports it as a violation of kind `kind`.
    pub fn fs_violation(&mut self, kind: &str, target: &str, what: &str, e: &FsError) {
        self.report.error(e);
        self.violation(kind, target, what, e.to_string());
    }

    /// Connects to target `i`; a failure is a violation (`connect-failed`).
    pub fn connect(&mut self, i: usize) -> Option<Box<dyn Access>> {
        let Some(spec) = self.spec.targets.get(i).cloned() else {
            let label = self.label(i);
            self.violation("worker-failed", &label, "connect", format!("no target {i}"));
            return None;
        };
        match spec.open(i) {
            Ok(a) => Some(a),
            Err(e) => {
                let label = self.label(i);
                self.fs_violation("connect-failed", &label, "connect to the run directory", &e);
                None
            }
        }
    }

    /// Connects to every target (`None` where that failed).
    pub fn connect_all(&mut self) -> Vec<Option<Box<dyn Access>>> {
        (0..self.spec.targets.len())
            .map(|i| self.connect(i))
            .collect()
    }
}

/// The coordinator's view of a run, for set-up and the final checks.
pub struct CoordCtx {
    /// The workload.
    pub workload: Workload,
    /// The run seed.
    pub run_seed: u64,
    /// When the workers started.
    pub start_ns: u64,
    /// When they were told to stop.
    pub deadline_ns: u64,
    /// The run directory through each applicable target.
    pub targets: Vec<TargetSpec>,
    /// Their labels.
    pub labels: Vec<String>,
    /// Workload knobs.
    pub params: Params,
    /// What set-up returned.
    pub setup: serde_json::Value,
    /// The coordinator's own counters and findings.
    pub report: WorkerReport,
}

impl CoordCtx {
    /// Records a violation found by the coordinator.
    pub fn violation(&mut self, kind: &str, target: &str, op: &str, detail: String) {
        self.report.violation(Violation {
            kind: kind.to_string(),
            worker: "coordinator".into(),
            target: target.to_string(),
            op: op.to_string(),
            detail,
            t: secs_since(self.start_ns, now_ns()),
        });
    }

    /// Connects to target `i`; failure is a violation.
    pub fn connect(&mut self, i: usize) -> Option<Box<dyn Access>> {
        let spec = self.targets.get(i)?.clone();
        match spec.open(i) {
            Ok(a) => Some(a),
            Err(e) => {
                let label = self.labels.get(i).cloned().unwrap_or_default();
                self.violation(
                    "connect-failed",
                    &label,
                    "connect to the run directory",
                    e.to_string(),
                );
                None
            }
        }
    }
}

/// The hidden `worker` subcommand: runs the spec in `spec_path` and writes
/// its report. Errors here are the checker's own (unreadable spec).
pub fn worker_main(spec_path: &Path) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(spec_path)
        .with_context(|| format!("cannot read worker spec {}", spec_path.display()))?;
    let spec: WorkerSpec = serde_json::from_str(&text)
        .with_context(|| format!("bad worker spec {}", spec_path.display()))?;
    let result = spec.result.clone();
    let mut ctx = WorkerCtx::new(spec);
    let workload = ctx.spec.workload;
    if let Err(e) = workload.work(&mut ctx) {
        let label = ctx.label(ctx.spec.target);
        ctx.violation("worker-failed", &label, "worker", format!("{e:#}"));
    }
    let json = serde_json::to_vec(&ctx.report).context("cannot encode the report")?;
    let tmp = result.with_extension("tmp");
    std::fs::write(&tmp, json).with_context(|| format!("cannot write {}", tmp.display()))?;
    std::fs::rename(&tmp, &result).with_context(|| format!("cannot write {}", result.display()))?;
    Ok(())
}

/// One planned worker: its role, index in the role and target.
#[derive(Debug, Clone)]
pub struct RolePlan {
    /// Role name.
    pub role: String,
    /// Index among the workers of the role.
    pub index: usize,
    /// Target index.
    pub target: usize,
}

/// Where the kernel says a hung process is blocked.
fn blocked_where(pid: u32) -> String {
    let wchan = std::fs::read_to_string(format!("/proc/{pid}/wchan")).unwrap_or_default();
    let syscall = std::fs::read_to_string(format!("/proc/{pid}/syscall")).unwrap_or_default();
    let nr = syscall.split_whitespace().next().unwrap_or("?").to_string();
    let name = match nr.parse::<i64>() {
        Ok(libc::SYS_read) => "read",
        Ok(libc::SYS_write) => "write",
        Ok(libc::SYS_openat) => "openat",
        Ok(libc::SYS_close) => "close",
        Ok(libc::SYS_pread64) => "pread64",
        Ok(libc::SYS_pwrite64) => "pwrite64",
        Ok(libc::SYS_fsync) => "fsync",
        Ok(libc::SYS_renameat2) | Ok(libc::SYS_rename) => "rename",
        Ok(libc::SYS_unlinkat) | Ok(libc::SYS_unlink) => "unlink",
        Ok(libc::SYS_getdents64) => "getdents64",
        Ok(libc::SYS_statx) | Ok(libc::SYS_newfstatat) => "stat",
        Ok(libc::SYS_fcntl) => "fcntl",
        _ => "",
    };
    // The kernel stack (readable by root) says which request it waits for.
    let stack: Vec<String> = std::fs::read_to_string(format!("/proc/{pid}/stack"))
        .unwrap_or_default()
        .lines()
        .take(4)
        .filter_map(|l| l.split_whitespace().nth(1))
        .map(|f| f.split('+').next().unwrap_or(f).to_string())
        .collect();
    let name = if name.is_empty() {
        String::new()
    } else {
        format!(" ({name})")
    };
    let stack = if stack.is_empty() {
        String::new()
    } else {
        format!(", kernel stack {}", stack.join(" < "))
    };
    format!("kernel wchan {:?}, syscall {nr}{name}{stack}", wchan.trim())
}

/// Starts a worker. Its stderr goes to `stderr` (a file in the scratch
/// directory): a worker stuck in the kernel must not hold the checker's
/// own output open.
fn spawn_worker(exe: &Path, spec_path: &Path, stderr: &Path) -> std::io::Result<Child> {
    use std::os::unix::process::CommandExt;
    let mut cmd = Command::new(exe);
    cmd.arg("worker")
        .arg("--spec")
        .arg(spec_path)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(stderr)?);
    // SAFETY: prctl is async-signal-safe; the closure touches nothing else.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd.spawn()
}

/// Waits for `child` to be reaped, at most `limit`.
fn reap(child: &mut Child, limit: Duration) -> Option<std::process::ExitStatus> {
    let end = now_ns() + limit.as_nanos() as u64;
    loop {
        match child.try_wait() {
            Ok(Some(s)) => return Some(s),
            Ok(None) if now_ns() < end => std::thread::sleep(Duration::from_millis(50)),
            _ => return None,
        }
    }
}

/// Waits until `spec` is visible through target `i` (it was just created
/// through another one), at most 30 s.
fn wait_visible(spec: &TargetSpec, i: usize) -> Result<(), String> {
    let end = now_ns() + 30_000_000_000;
    loop {
        let r: Result<(), FsError> = spec.open(i).map(|_| ());
        match r {
            Ok(()) => return Ok(()),
            Err(e) if now_ns() > end => return Err(e.to_string()),
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

/// Calls `f` until it succeeds, for at most 30 s; the last error otherwise.
fn retry_30s<T>(mut f: impl FnMut() -> Result<T, FsError>) -> Result<T, FsError> {
    let end = now_ns() + 30_000_000_000;
    loop {
        match f() {
            Ok(v) => return Ok(v),
            Err(e) if now_ns() > end => return Err(e),
            Err(_) => std::thread::sleep(Duration::from_millis(200)),
        }
    }
}

/// The summary of a workload whose set-up failed in the file system.
fn setup_failed(
    mut summary: Summary,
    cfg: &RunConfig,
    what: &str,
    e: &FsError,
    t0: std::time::Instant,
) -> Summary {
    let mut rep = WorkerReport {
        worker: "coordinator".into(),
        ..WorkerReport::default()
    };
    rep.error(e);
    rep.violation(Violation {
        kind: "setup-failed".into(),
        worker: "coordinator".into(),
        target: cfg.targets.first().map(|t| t.label(0)).unwrap_or_default(),
        op: what.into(),
        detail: format!("{e} (still failing after 30 s)"),
        t: 0.0,
    });
    summary.absorb(&[rep]);
    summary.elapsed_s = t0.elapsed().as_secs_f64();
    summary
}

/// Removes everything in the run directory and the directory itself.
fn cleanup(home: &mut dyn Access, parent: &mut dyn Access, run_name: &str) -> Result<(), String> {
    let mut first_err = None;
    for _ in 0..3 {
        match home.list() {
            Ok(names) => {
                for n in names {
                    if let Err(e) = home.remove(&n) {
                        first_err.get_or_insert(e.to_string());
                    }
                }
            }
            Err(e) => {
                first_err.get_or_insert(e.to_string());
            }
        }
        if parent.rmdir(run_name).is_ok() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    match parent.rmdir(run_name) {
        Ok(()) => Ok(()),
        Err(e) => Err(first_err.unwrap_or_else(|| e.to_string())),
    }
}

/// What the coordinator is doing now, and what it knows so far: for the
/// report if its own file-system calls hang.
#[derive(Default)]
struct Progress {
    phase: String,
    /// The summary and reports once the workers are done.
    partial: Option<(Summary, Vec<WorkerReport>)>,
}

type Phase = std::sync::Arc<std::sync::Mutex<Progress>>;

fn set_phase(p: &Phase, what: &str) {
    if let Ok(mut g) = p.lock() {
        g.phase = what.to_string();
    }
}

/// Longest a workload may take in all: its run time, the workers' grace
/// time, and twice the grace time plus a minute for the coordinator's own
/// set-up, final checks and clean-up.
fn workload_limit(cfg: &RunConfig) -> Duration {
    Duration::from_secs_f64(cfg.seconds + 3.0 * cfg.grace + 60.0)
}

/// Runs every workload of `cfg`; returns one summary each. `Err` only for
/// failures of the checker's own set-up (no target reachable, no scratch
/// directory), never for what the file system does. The coordinator's own
/// file-system calls are bounded too: if set-up, the final checks or the
/// clean-up of a workload do not return in time ([`workload_limit`]), that
/// is reported as a violation (`checker-hung`, with the phase) and no
/// further workload is run.
pub fn run(cfg: &RunConfig) -> anyhow::Result<Vec<Summary>> {
    let scratch = tempfile::Builder::new()
        .prefix("morris-consistency-")
        .tempdir()
        .context("cannot create a local scratch directory")?;
    let mut out = Vec::new();
    for w in &cfg.workloads {
        let (tx, rx) = std::sync::mpsc::channel();
        let phase: Phase = Default::default();
        let (c, dir, ph, w) = (cfg.clone(), scratch.path().to_path_buf(), phase.clone(), *w);
        std::thread::spawn(move || {
            let _ = tx.send(run_one(&c, w, &dir, &ph));
        });
        let limit = workload_limit(cfg);
        match rx.recv_timeout(limit) {
            Ok(r) => out.push(r?),
            Err(_) => {
                let (what, partial) = match phase.lock() {
                    Ok(mut g) => (g.phase.clone(), g.partial.take()),
                    Err(_) => (String::new(), None),
                };
                let mut rep = WorkerReport {
                    worker: "coordinator".into(),
                    ..WorkerReport::default()
                };
                rep.violation(Violation {
                    kind: "checker-hung".into(),
                    worker: "coordinator".into(),
                    target: cfg.targets.first().map(|t| t.label(0)).unwrap_or_default(),
                    op: what.clone(),
                    detail: format!(
                        "the coordinator's own file-system calls did not return within {limit:?} ({what}); \
                         no further workload is run"
                    ),
                    t: limit.as_secs_f64(),
                });
                let (mut s, mut reports) = partial.unwrap_or_else(|| {
                    (
                        Summary {
                            workload: w.name().into(),
                            seed: cfg.seed,
                            seconds: cfg.seconds,
                            procs: cfg.params.procs,
                            replay: cfg.replay(w),
                            targets: cfg
                                .targets
                                .iter()
                                .enumerate()
                                .map(|(i, t)| t.label(i))
                                .collect(),
                            ..Summary::default()
                        },
                        Vec::new(),
                    )
                });
                reports.push(rep);
                s.elapsed_s = limit.as_secs_f64();
                s.absorb(&reports);
                out.push(s);
                break;
            }
        }
    }
    if cfg.keep {
        let kept = scratch.keep();
        eprintln!(
            "morris-consistency: worker specs and reports kept in {}",
            kept.display()
        );
    }
    Ok(out)
}

fn run_one(cfg: &RunConfig, w: Workload, scratch: &Path, phase: &Phase) -> anyhow::Result<Summary> {
    let t0 = std::time::Instant::now();
    let mut summary = Summary {
        workload: w.name().into(),
        seed: cfg.seed,
        seconds: cfg.seconds,
        procs: cfg.params.procs,
        replay: cfg.replay(w),
        ..Summary::default()
    };
    // Which targets the workload can use.
    let mut applicable = Vec::new();
    for (i, t) in cfg.targets.iter().enumerate() {
        match w.not_on(t) {
            Some(why) => summary
                .not_applicable
                .push(format!("{}: {why}", t.label(i))),
            None => applicable.push(i),
        }
    }
    if let Some(why) = w.needs(
        &applicable
            .iter()
            .map(|i| &cfg.targets[*i])
            .collect::<Vec<_>>(),
    ) {
        summary.skipped = Some(why);
        summary.elapsed_s = t0.elapsed().as_secs_f64();
        return Ok(summary);
    }
    let home_i = applicable[0];
    set_phase(phase, "make the run directory");
    let run_name = format!("mc-{}-{}-{}", w.name(), cfg.seed, std::process::id());
    let mut parent = cfg.targets[home_i]
        .open(home_i)
        .map_err(|e| anyhow::anyhow!("cannot reach {}: {e}", cfg.targets[home_i].label(home_i)))?;
    // A leftover of an earlier run with the same name (same pid) is removed.
    if parent.stat(&run_name).is_ok() {
        if let Ok(mut old) = cfg.targets[home_i].child(&run_name).open(home_i) {
            let _ = cleanup(old.as_mut(), parent.as_mut(), &run_name);
        }
    }
    // The checker's own mkdir goes through the file system under test: a
    // failure (retried for 30 s) is a violation, not a checker error.
    let made = retry_30s(|| match parent.mkdir(&run_name) {
        Err(e) if e.is(libc::EEXIST) => Ok(()),
        r => r,
    });
    if let Err(e) = made {
        return Ok(setup_failed(summary, cfg, "make the run directory", &e, t0));
    }
    let targets: Vec<TargetSpec> = applicable
        .iter()
        .map(|i| cfg.targets[*i].child(&run_name))
        .collect();
    let labels: Vec<String> = applicable
        .iter()
        .enumerate()
        .map(|(k, i)| cfg.targets[*i].child(&run_name).label(k))
        .collect();
    summary.targets = labels.clone();
    let run_seed = derive(cfg.seed, &[hash_str(w.name())]);
    let mut ctx = CoordCtx {
        workload: w,
        run_seed,
        start_ns: now_ns(),
        deadline_ns: now_ns(),
        targets: targets.clone(),
        labels: labels.clone(),
        params: cfg.params.clone(),
        setup: serde_json::Value::Null,
        report: WorkerReport {
            worker: "coordinator".into(),
            target: labels[0].clone(),
            ..WorkerReport::default()
        },
    };
    set_phase(phase, "wait until every target sees the run directory");
    for (k, t) in targets.iter().enumerate().skip(1) {
        if let Err(e) = wait_visible(t, k) {
            ctx.violation(
                "run-dir-invisible",
                &labels[k],
                "look up the run directory made through another target",
                format!("still failing after 30 s: {e}"),
            );
        }
    }
    let mut home = match retry_30s(|| targets[0].open(0)) {
        Ok(h) => h,
        Err(e) => return Ok(setup_failed(summary, cfg, "open the run directory", &e, t0)),
    };
    set_phase(phase, "set-up (the files the workers start from)");
    // A failed set-up is one violation: the workers and the final checks
    // would only report what it left out, once per operation (a listing
    // run whose set-up timed out counted 80,000 "missing names").
    let set_up = match w.setup(&mut ctx, home.as_mut()) {
        Ok(v) => {
            ctx.setup = v;
            true
        }
        Err(e) => {
            ctx.violation("setup-failed", &labels[0], "set-up", e.to_string());
            false
        }
    };
    summary.note = w.note(&ctx);

    // Start the workers.
    let plan = if set_up { w.plan(&ctx) } else { Vec::new() };
    summary.workers = plan.len();
    let start_ns = now_ns();
    let deadline_ns = start_ns + (cfg.seconds * 1e9) as u64;
    ctx.start_ns = start_ns;
    ctx.deadline_ns = deadline_ns;
    let mut children = Vec::new();
    for (id, p) in plan.iter().enumerate() {
        let spec = WorkerSpec {
            workload: w,
            role: p.role.clone(),
            index: p.index,
            id,
            target: p.target,
            targets: targets.clone(),
            labels: labels.clone(),
            run_seed,
            seed: derive(
                cfg.seed,
                &[hash_str(w.name()), hash_str(&p.role), p.index as u64],
            ),
            start_ns,
            deadline_ns,
            params: cfg.params.clone(),
            setup: ctx.setup.clone(),
            result: scratch.join(format!("{}-{id}.report.json", w.name())),
        };
        let spec_path = scratch.join(format!("{}-{id}.spec.json", w.name()));
        std::fs::write(&spec_path, serde_json::to_vec(&spec)?)
            .with_context(|| format!("cannot write {}", spec_path.display()))?;
        let err_path = scratch.join(format!("{}-{id}.stderr", w.name()));
        let child = spawn_worker(&cfg.exe, &spec_path, &err_path)
            .with_context(|| format!("cannot start worker {}", cfg.exe.display()))?;
        children.push((spec, Some(child)));
    }

    // Wait for them: until the deadline plus the grace time.
    set_phase(phase, "workers running");
    let hard_end = deadline_ns + (cfg.grace * 1e9) as u64;
    loop {
        let mut running = 0;
        for (_, c) in children.iter_mut() {
            if let Some(child) = c {
                match child.try_wait() {
                    Ok(Some(_)) | Err(_) => {}
                    Ok(None) => running += 1,
                }
            }
        }
        if running == 0 || now_ns() > hard_end {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut reports = Vec::new();
    for (spec, c) in children.iter_mut() {
        let Some(mut child) = c.take() else { continue };
        let who = format!("{}#{} (pid {})", spec.role, spec.index, child.id());
        let label = labels.get(spec.target).cloned().unwrap_or_default();
        let status = match child.try_wait() {
            Ok(Some(s)) => Some(s),
            _ => {
                let at = blocked_where(child.id());
                let _ = child.kill();
                let reaped = reap(&mut child, Duration::from_secs(10));
                let end = if reaped.is_some() {
                    "killed".to_string()
                } else {
                    format!(
                        "SIGKILL did not end it within 10 s: it is in an uninterruptible wait \
                         (a file-system request that is never answered); {}",
                        blocked_where(child.id())
                    )
                };
                ctx.report.violation(Violation {
                    kind: "worker-hung".into(),
                    worker: who.clone(),
                    target: label.clone(),
                    op: "finish".into(),
                    detail: format!(
                        "still running {:.0} s after the deadline ({at}); {end}",
                        cfg.grace
                    ),
                    t: secs_since(start_ns, now_ns()),
                });
                reaped
            }
        };
        let stderr_tail = || {
            let text =
                std::fs::read_to_string(scratch.join(format!("{}-{}.stderr", w.name(), spec.id)))
                    .unwrap_or_default();
            let tail: String = text
                .chars()
                .rev()
                .take(1500)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect();
            if tail.trim().is_empty() {
                String::new()
            } else {
                format!("; its stderr ends with: {}", tail.trim())
            }
        };
        match std::fs::read(&spec.result) {
            Ok(bytes) => match serde_json::from_slice::<WorkerReport>(&bytes) {
                Ok(r) => reports.push(r),
                Err(e) => ctx.violation(
                    "worker-failed",
                    &label,
                    "read report",
                    format!("{who}: bad report: {e}"),
                ),
            },
            Err(_) if status.is_some_and(|s| s.success()) => ctx.violation(
                "worker-failed",
                &label,
                "read report",
                format!("{who} exited without a report{}", stderr_tail()),
            ),
            Err(_) => {
                if !ctx.report.violations.iter().any(|v| v.worker == who) {
                    ctx.violation(
                        "worker-failed",
                        &label,
                        "finish",
                        format!(
                            "{who} exited with {status:?} and no report{}",
                            stderr_tail()
                        ),
                    );
                }
            }
        }
    }

    // What is known so far, in case the final checks hang.
    if let Ok(mut g) = phase.lock() {
        let mut so_far = reports.clone();
        so_far.push(ctx.report.clone());
        g.partial = Some((summary.clone(), so_far));
    }
    // The workload's own final checks.
    set_phase(phase, "final checks (reading the results back)");
    if set_up {
        w.verify(&mut ctx, &reports, home.as_mut());
    }
    reports.push(ctx.report);
    summary.absorb(&reports);
    if !cfg.keep {
        set_phase(phase, "clean-up (removing the run directory)");
        if let Err(e) = cleanup(home.as_mut(), parent.as_mut(), &run_name) {
            summary.cleanup_error = Some(e);
        }
    }
    summary.elapsed_s = t0.elapsed().as_secs_f64();
    Ok(summary)
}

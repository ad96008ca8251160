//! `--metrics HOST:PORT`: the Prometheus endpoint of a server, a mount or
//! an NFS gateway (issue 20). One recorder per process (the `metrics`
//! facade's global), rendered by `metrics-exporter-prometheus` and served
//! over HTTP by axum at `/metrics`. What each part records is in its own
//! crate (`morris-server` `service/metrics.rs`, `morris-client`
//! `metrics.rs`, the FUSE and NFS front ends); the state gauges are set
//! just before each scrape by the functions given to [`Exporter::on_scrape`].

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use futures::future::BoxFuture;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use parking_lot::Mutex;
use tracing::{info, warn};

mod help;
mod page;

pub use page::{Counters, StatusText};

/// Latency buckets (seconds) of every `_seconds` histogram: 25 µs to 30 s.
const BUCKETS: [f64; 19] = [
    0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1,
    0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];
/// How often histograms' recent samples are folded in between scrapes.
const UPKEEP: Duration = Duration::from_secs(5);

/// Sets state gauges just before a scrape.
pub type Refresh = Arc<dyn Fn() -> BoxFuture<'static, ()> + Send + Sync>;

/// A process's metrics endpoint.
#[derive(Clone)]
pub struct Exporter {
    inner: Arc<Inner>,
}

struct Inner {
    handle: PrometheusHandle,
    addr: std::net::SocketAddr,
    refresh: Mutex<Vec<Refresh>>,
    role: &'static str,
    /// The status page, once [`Exporter::serve_page`] gave what it shows.
    page: Mutex<Option<Arc<page::Page>>>,
}

impl Exporter {
    /// Installs this process's recorder and serves `/metrics` on `addr`
    /// (`HOST:PORT`; port 0 picks one). `role` (`server`, `mount`, `nfs`)
    /// labels `morris_build_info`. Call inside the runtime, before the
    /// server, client or front end is made: handles they take before the
    /// recorder exists record nowhere.
    pub async fn start(addr: &str, role: &'static str) -> Result<Exporter> {
        let recorder = PrometheusBuilder::new()
            .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), &BUCKETS)
            .context("bad histogram buckets")?
            .build_recorder();
        let handle = recorder.handle();
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("cannot listen for metrics on {addr}"))?;
        let local = listener.local_addr().context("metrics listener address")?;
        metrics::set_global_recorder(recorder)
            .map_err(|e| anyhow::anyhow!("a metrics recorder is already installed: {e}"))?;
        help::describe_all();
        metrics::gauge!("morris_build_info", "version" => env!("CARGO_PKG_VERSION"), "role" => role)
            .set(1.0);
        let inner = Arc::new(Inner {
            handle: handle.clone(),
            refresh: Mutex::new(Vec::new()),
            addr: local,
            role,
            page: Mutex::new(None),
        });
        let app = Router::new()
            .route("/metrics", get(scrape))
            .route("/", get(index))
            .with_state(inner.clone());
        tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, app).await {
                warn!(error = %e, "metrics endpoint stopped");
            }
        });
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(UPKEEP);
            loop {
                tick.tick().await;
                handle.run_upkeep();
            }
        });
        info!(addr = %local, "metrics at http://{local}/metrics");
        Ok(Exporter { inner })
    }

    /// Where the endpoint listens.
    pub fn local_addr(&self) -> std::net::SocketAddr {
        self.inner.addr
    }

    /// Runs `f` before every scrape (to set state gauges).
    pub fn on_scrape(&self, f: Refresh) {
        self.inner.refresh.lock().push(f);
    }

    /// Serves the status page at `/`: `status` at each view, and graphs of
    /// `counters` sampled every ten seconds for the last hour.
    pub fn serve_page(&self, status: StatusText, counters: Counters) {
        let history = Arc::new(Mutex::new(page::History::default()));
        tokio::spawn(page::sample(counters, history.clone()));
        *self.inner.page.lock() = Some(Arc::new(page::Page {
            status,
            history,
            role: self.inner.role,
        }));
    }
}

/// Where mounts note their metrics address for `morris stats MOUNTPOINT`:
/// `/run/morris/mounts` for root, else `$XDG_RUNTIME_DIR/morris/mounts`;
/// nowhere for a user without a runtime directory (a shared `/tmp` could
/// be made to point elsewhere by another user).
fn notes_dir() -> Option<PathBuf> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        return Some(PathBuf::from("/run/morris/mounts"));
    }
    std::env::var_os("XDG_RUNTIME_DIR")
        .filter(|d| !d.is_empty())
        .map(|d| PathBuf::from(d).join("morris/mounts"))
}

fn note_path(dev: (u32, u32)) -> Option<PathBuf> {
    notes_dir().map(|d| d.join(format!("{}-{}.json", dev.0, dev.1)))
}

/// A mount's note of its metrics address; removed when dropped.
pub struct MountNote(PathBuf);

impl Drop for MountNote {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Notes that the mount of device `dev` at `mp` serves metrics at `x`
/// (for `morris stats MOUNTPOINT`); `None`, logged, if it cannot.
pub fn note_mount(dev: (u32, u32), mp: &Path, x: &Exporter) -> Option<MountNote> {
    let Some(path) = note_path(dev) else {
        info!("no runtime directory ($XDG_RUNTIME_DIR): `morris stats` needs the metrics address, not the mount point");
        return None;
    };
    let note = serde_json::json!({
        "mountpoint": mp,
        "pid": std::process::id(),
        "metrics": x.local_addr().to_string(),
    });
    let written = path
        .parent()
        .map_or(Ok(()), std::fs::create_dir_all)
        .and_then(|()| std::fs::write(&path, note.to_string()));
    match written {
        Ok(()) => Some(MountNote(path)),
        Err(e) => {
            warn!(path = %path.display(), error = %e, "cannot note the metrics address for morris stats");
            None
        }
    }
}

/// The metrics address the mount at `mp` noted.
pub fn noted_metrics(mp: &Path) -> Result<String> {
    use std::os::unix::fs::MetadataExt;
    let st = std::fs::metadata(mp).with_context(|| format!("{}", mp.display()))?;
    let dev = st.dev();
    let path = note_path((libc::major(dev), libc::minor(dev))).ok_or_else(|| {
        anyhow::anyhow!(
            "no runtime directory ($XDG_RUNTIME_DIR) to find {}'s metrics address in: give HOST:PORT",
            mp.display()
        )
    })?;
    let text = std::fs::read_to_string(&path).map_err(|_| {
        anyhow::anyhow!(
            "{} is not a morris mount started with --metrics (no {})",
            mp.display(),
            path.display()
        )
    })?;
    let v: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("{}", path.display()))?;
    v["metrics"]
        .as_str()
        .map(str::to_string)
        .with_context(|| format!("no metrics address in {}", path.display()))
}

/// Starts an exporter if `addr` is given.
pub async fn maybe_start(addr: Option<&str>, role: &'static str) -> Result<Option<Exporter>> {
    match addr {
        Some(a) => Ok(Some(Exporter::start(a, role).await?)),
        None => Ok(None),
    }
}

/// Sets `client`'s gauges before every scrape (a mount, a gateway).
pub fn scrape_client(x: &Exporter, client: &Arc<morris_client::Client>) {
    let c = Arc::downgrade(client);
    x.on_scrape(Arc::new(move || {
        if let Some(c) = c.upgrade() {
            c.export_metrics();
        }
        Box::pin(async {})
    }));
}

async fn scrape(State(inner): State<Arc<Inner>>) -> impl IntoResponse {
    let refresh: Vec<Refresh> = inner.refresh.lock().clone();
    for f in refresh {
        f().await;
    }
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        inner.handle.render(),
    )
}

async fn index(State(inner): State<Arc<Inner>>) -> axum::response::Response {
    let page = inner.page.lock().clone();
    match page {
        Some(p) => axum::response::Html(page::render(&p).await).into_response(),
        None => "morris: Prometheus metrics at /metrics\n".into_response(),
    }
}

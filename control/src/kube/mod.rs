//! The Kubernetes source: Services, EndpointSlices and Nodes in, complete service lists
//! out (`strait run --kube`).
//!
//! ```text
//!  API server ◄── kube-rs watchers, status writes, Events ──┐
//!                                                           │ tokio, current-thread
//!   thread "kube" ─ watch::run_source ─ Controller ─────────┘ runtime of its own
//!        │  pool::plan (addresses) ─ translate (pure) ─ validate (config rules)
//!        ▼
//!   publish(Publication) ──► control loop (std mpsc) ──► core: Event::Kube ──► Builder::update
//!   (list + changed names)     (run::Driver)             (core::Control)  ──► ArcSwap ◄── workers
//! ```
//!
//! tokio lives on this module's thread only: the control loop receives plain
//! [`Publication`]s (shared `strait_config::model::Service`s and the names that changed),
//! and the dataplane never sees tokio or kube.
//! A list is published only once Services, EndpointSlices and Nodes have all been listed
//! completely, so a starting gateway never forwards on half a cluster and never drops a
//! backend whose slice it has not seen yet; afterwards each change re-translates only the
//! Services it touches and publishes the list with what changed, and the control core
//! updates its table for those services only (and the loop swaps it in atomically).
//!
//! This module is the I/O; what the objects mean (translation, address planning, the
//! reconcile round, Event texts, [`Publication`]) is `crate::kubemodel`, pure, which the
//! control core reads without reaching any of this.
//!
//! | file | part |
//! |---|---|
//! | [`watch`] | watchers, the loop driving `kubemodel::Controller`, status writes |
//! | [`events`] | posting notices as Kubernetes Events |
//! | [`lease`] | the Lease that elects the one gateway writing status and Events |
//! | [`stats`] | connection state and counters for `/metrics` |

pub mod events;
pub mod lease;
pub mod stats;
pub mod watch;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;

use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::Client;
use tracing::{error, info};

pub use crate::kubemodel::settings::{Args, Settings};
use crate::kubemodel::Publication;
pub use stats::{KubeMetrics, Stats};
pub use watch::run_source;

/// What can go wrong starting or running the Kubernetes source.
#[derive(Debug, thiserror::Error)]
pub enum KubeError {
    /// The kubeconfig file named on the command line could not be read or parsed.
    #[error("kubeconfig {}: {source}", path.display())]
    Kubeconfig {
        /// The file.
        path: PathBuf,
        /// What was wrong.
        #[source]
        source: kube::config::KubeconfigError,
    },
    /// Neither `$KUBECONFIG`, `~/.kube/config` nor the in-cluster service account gave a
    /// configuration.
    #[error("no Kubernetes configuration (tried $KUBECONFIG, ~/.kube/config and the in-cluster service account): {0}")]
    Infer(#[source] kube::config::InferConfigError),
    /// The client could not be built from the configuration (TLS material, proxy).
    #[error("building the Kubernetes client: {0}")]
    Client(#[source] kube::Error),
    /// The tokio runtime or the source's thread could not be started.
    #[error("starting the Kubernetes source's {what}: {source}")]
    Runtime {
        /// Runtime or thread.
        what: &'static str,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
    /// The watch streams ended (kube-rs' watchers never end; a bug if seen).
    #[error("the Kubernetes watch streams ended")]
    StreamsEnded,
}

/// A client from `kubeconfig` when given, else inferred: `$KUBECONFIG`, `~/.kube/config`,
/// then the in-cluster service account.
///
/// # Errors
/// [`KubeError::Kubeconfig`], [`KubeError::Infer`], [`KubeError::Client`].
pub async fn connect(kubeconfig: Option<&Path>) -> Result<Client, KubeError> {
    let config = match kubeconfig {
        Some(path) => {
            let err = |source| KubeError::Kubeconfig {
                path: path.to_owned(),
                source,
            };
            let kc = Kubeconfig::read_from(path).map_err(err)?;
            kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
                .await
                .map_err(err)?
        }
        None => kube::Config::infer().await.map_err(KubeError::Infer)?,
    };
    info!(server = %config.cluster_url, "kubernetes: API server");
    Client::try_from(config).map_err(KubeError::Client)
}

/// The running source: its numbers, and a way to stop it (also on drop).
#[derive(Debug)]
pub struct Source {
    stats: Arc<Stats>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Source {
    /// The source's numbers (for `/metrics`: [`KubeMetrics`]).
    pub fn stats(&self) -> Arc<Stats> {
        Arc::clone(&self.stats)
    }

    /// Stops the source and waits for its thread.
    pub fn stop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Source {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Starts the source on a thread of its own with a current-thread tokio runtime, and
/// returns once the client is built (configuration errors show here, not later).
/// `publish` is called on that thread with each [`Publication`]: the complete service list
/// (shared, not copied) and what changed, for a control loop that rebuilds only the changed
/// services.
///
/// # Errors
/// A kubeconfig that cannot be read, no configuration at all, a client that cannot be
/// built, or a runtime or thread that cannot be started.
pub fn spawn_feed<F>(
    kubeconfig: Option<&Path>,
    settings: Settings,
    publish: F,
) -> Result<Source, KubeError>
where
    F: FnMut(Publication) + Send + 'static,
{
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|source| KubeError::Runtime {
            what: "runtime",
            source,
        })?;
    let client = rt.block_on(connect(kubeconfig))?;
    let stats = Arc::new(Stats::default());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let thread_stats = Arc::clone(&stats);
    let thread = std::thread::Builder::new()
        .name("kube".into())
        .spawn(move || {
            rt.block_on(async move {
                // Without a Lease this gateway leads; with one, the election says.
                let (leading_tx, leading) = tokio::sync::watch::channel(settings.lease.is_none());
                let (release, released) = tokio::sync::oneshot::channel::<()>();
                let election = settings
                    .lease
                    .clone()
                    .map(|l| tokio::spawn(lease::elect(client.clone(), l, leading_tx, released)));
                tokio::select! {
                    r = run_source(client, settings, thread_stats, publish, leading) => {
                        if let Err(e) = r {
                            error!("kubernetes source stopped: {e}");
                        }
                    }
                    _ = stopped => {}
                }
                // Hand the Lease on before going.
                if let Some(e) = election {
                    let _ = release.send(());
                    let _ = tokio::time::timeout(std::time::Duration::from_secs(3), e).await;
                }
            });
        })
        .map_err(|source| KubeError::Runtime {
            what: "thread",
            source,
        })?;
    Ok(Source {
        stats,
        stop: Some(stop),
        thread: Some(thread),
    })
}

//! What a serving daemon tells: the status line (systemd's STATUS= and a log line a minute),
//! `/metrics` and the systemd watchdog. These tasks only read counters; they end at the stop
//! without a word.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;

use crate::cache::Cache;
use crate::cli::Config;
use crate::metrics;
use crate::stats::{Counters, Totals};
use crate::systemd::{self, Heartbeats, Notifier};
use crate::upstream::{UpstreamSet, UpstreamSets};

/// How often a summary line is logged (and systemd's STATUS= refreshed) while serving.
const SUMMARY_EVERY: Duration = Duration::from_secs(60);

/// A task to spawn.
pub(super) type Task = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

/// The status line, `/metrics` (if asked for) and the systemd watchdog (if armed), to run until
/// the stop.
pub(super) fn reporting(
    notifier: &Arc<Notifier>,
    config: &Arc<Config>,
    sets_rx: &watch::Receiver<Arc<UpstreamSets>>,
    counters: &Arc<Counters>,
    cache: &Option<Arc<Mutex<Cache>>>,
    heartbeats: &Arc<Heartbeats>,
    metrics_listener: Option<tokio::net::TcpListener>,
) -> Vec<Task> {
    let mut reporting: Vec<Task> = vec![Box::pin(report_status(
        notifier.clone(),
        config.clone(),
        sets_rx.clone(),
        counters.clone(),
    ))];
    if let Some(listener) = metrics_listener {
        tracing::info!(addr = ?listener.local_addr().ok(), "serving /metrics");
        reporting.push(Box::pin(metrics::serve(
            listener,
            counters.clone(),
            sets_rx.clone(),
            cache.clone(),
        )));
    }
    if let Some(timeout) = Notifier::watchdog_timeout() {
        tracing::info!(?timeout, "feeding the systemd watchdog");
        reporting.push(Box::pin(systemd::watchdog(
            notifier.clone(),
            heartbeats.clone(),
            timeout,
        )));
    }
    reporting
}

async fn report_status(
    notifier: Arc<Notifier>,
    config: Arc<Config>,
    mut sets: watch::Receiver<Arc<UpstreamSets>>,
    counters: Arc<Counters>,
) {
    let mut ticker =
        tokio::time::interval_at(tokio::time::Instant::now() + SUMMARY_EVERY, SUMMARY_EVERY);
    let mut last = counters.totals();
    let mut minute = Totals::default();
    loop {
        let (vnet_dns, kube_dns) = {
            let s = sets.borrow_and_update();
            (list(&s.vnet_dns), list(&s.kube_dns))
        };
        notifier.notify(&format!(
            "STATUS=serving {} and {}; last minute: {} answers, {} SERVFAIL, {} stale, {} shed; VNet DNS: {vnet_dns}; kube-dns: {kube_dns}",
            config.node_listen,
            config.cluster_listen,
            minute.answers,
            minute.servfail,
            minute.stale,
            minute.shed
        ));
        tokio::select! {
            _ = ticker.tick() => {
                let now = counters.totals();
                minute = now.since(last);
                last = now;
                // A standby aside answers nothing: its minutes are not worth a line.
                if counters.takeovers.holding().is_none() && minute.answers == 0 {
                    continue;
                }
                tracing::info!(
                    answers = minute.answers,
                    servfail = minute.servfail,
                    stale = minute.stale,
                    shed = minute.shed,
                    vnet_dns,
                    kube_dns,
                    "serving; the last minute"
                );
            }
            changed = sets.changed() => if changed.is_err() { return },
        }
    }
}

fn list(u: &UpstreamSet) -> String {
    if u.is_empty() {
        return "none".to_string();
    }
    u.addrs()
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(" ")
}

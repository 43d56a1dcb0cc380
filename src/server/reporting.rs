//! What a serving daemon tells: the status line (systemd's STATUS= and a log line a minute),
//! `/metrics` and the systemd watchdog. These tasks only read counters; they end at the stop
//! without a word.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::listener::Shared;
use crate::metrics;
use crate::stats::{Counters, Totals};
use crate::stop::until;
use crate::systemd::{self, Notifier};
use crate::upstream::{UpstreamSet, UpstreamSets};

/// How often a summary line is logged (and systemd's STATUS= refreshed) while serving.
const SUMMARY_EVERY: Duration = Duration::from_secs(60);

/// Spawns the status line, `/metrics` (if asked for) and the systemd watchdog (if armed), each
/// to run until the stop.
pub(super) fn reporting(
    shared: &Shared<'_>,
    notifier: &Arc<Notifier>,
    metrics_listener: Option<tokio::net::TcpListener>,
) -> Vec<JoinHandle<()>> {
    let stop = shared.stop;
    let status = report_status(
        notifier.clone(),
        shared.config.listeners(),
        shared.sets_rx.clone(),
        shared.counters.clone(),
    );
    let mut reporting = vec![tokio::spawn(until(stop.clone(), status))];
    if let Some(listener) = metrics_listener {
        tracing::info!(addr = ?listener.local_addr().ok(), "serving /metrics");
        let metrics = metrics::serve(
            listener,
            shared.counters.clone(),
            shared.sets_rx.clone(),
            shared.cache.clone(),
        );
        reporting.push(tokio::spawn(until(stop.clone(), metrics)));
    }
    if let Some(timeout) = Notifier::watchdog_timeout() {
        tracing::info!(?timeout, "feeding the systemd watchdog");
        let watchdog = systemd::watchdog(notifier.clone(), shared.heartbeats.clone(), timeout);
        reporting.push(tokio::spawn(until(stop.clone(), watchdog)));
    }
    reporting
}

async fn report_status(
    notifier: Arc<Notifier>,
    [node, cluster]: [SocketAddr; 2],
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
            "STATUS=serving {node} and {cluster}; last minute: {} answers, {} SERVFAIL, {} stale, {} shed; VNet DNS: {vnet_dns}; kube-dns: {kube_dns}",
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

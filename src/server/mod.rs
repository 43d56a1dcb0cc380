//! Start-up and shutdown. First ask whether LocalDNS serves (`standby`, which later moves the
//! flows as it answers or not); `prepare` does what needs privilege (the listener addresses,
//! binding, then dropping capabilities); `serve` is the lifecycle of a running daemon, built of
//! `listener` (one listener's relay threads and TCP task) and `reporting` (status line,
//! metrics, watchdog).

mod listener;
mod prepare;
mod reporting;
mod serve;

use std::future::Future;

use crate::cli::Config;

/// Does what needs privilege on the calling thread alone, before any other thread exists (see
/// [`prepare::prepare`]), then starts the serving runtime and serves until `shutdown` (made
/// within that runtime) completes, then stops cleanly.
pub fn run<F: Future<Output = ()>>(
    config: Config,
    shutdown: impl FnOnce() -> Result<F, String>,
) -> Result<(), String> {
    let startup = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the start-up runtime: {e}"))?;
    // Before a single socket of ours joins LocalDNS's ports.
    let localdns_serves = crate::standby::localdns_serves(&config);
    if localdns_serves && !config.standby {
        tracing::info!("LocalDNS answers on both listeners; not taking over");
        // A clean end of the start: the unit is not `failed` and nothing restarts it.
        let notifier = crate::systemd::Notifier::from_env();
        notifier.notify("READY=1");
        notifier.notify("STOPPING=1");
        return Ok(());
    }
    // The standby beside a LocalDNS that answers joins its ports' groups with the flows steered
    // to LocalDNS's sockets from the instant of the bind, never to its own.
    let taken = crate::standby::start_cause(&config, localdns_serves);
    let prepared = startup.block_on(prepare::prepare(&config, taken.is_some()))?;
    drop(startup);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))?;
    runtime.block_on(async {
        let shutdown = shutdown()?;
        let running = serve::Running::start(config, prepared, taken).await?;
        shutdown.await;
        running.stop().await;
        Ok(())
    })
}

/// Removes the listener addresses the fallback puts on `lo` (the units' ExecStopPost, which runs
/// also after a kill, and needs no file of LocalDNS's). An address on which a socket still
/// listens stays: that is the standby serving (it takes them off itself when it hands back), or
/// LocalDNS, which has its own link and for which they do no harm.
pub fn release_addresses(config: &Config) -> Result<(), String> {
    let idle: Vec<std::net::IpAddr> = crate::standby::lo_addresses(config)
        .into_iter()
        .filter(|ip| {
            config
                .listeners()
                .iter()
                .filter(|l| l.ip() == *ip)
                .all(|&l| {
                    crate::netlink::group_members(l, crate::netlink::Proto::Udp)
                        .is_ok_and(|m| m.is_empty())
                })
        })
        .collect();
    crate::netlink::release_from_loopback(&idle)
}

//! Start-up and shutdown: [`prepare`] does what needs privilege (the `localdns` link, binding the
//! listeners, then dropping capabilities); [`serve`] starts the relay threads, the TCP tasks and
//! discovery, serves until the stop signal, closes the listeners first and drains briefly.

mod prepare;
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
    let prepared = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the start-up runtime: {e}"))?
        .block_on(prepare::prepare(&config))?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))?;
    runtime.block_on(async {
        let shutdown = shutdown()?;
        serve::serve(config, prepared, shutdown).await
    })
}

//! Start-up and shutdown: [`prepare`] does what needs privilege (the `localdns` link, binding the
//! listeners, then dropping capabilities); [`serve`] starts the relay threads, the TCP tasks and
//! discovery, serves until the stop signal, closes the listeners first and drains briefly.

mod prepare;
mod serve;

use std::future::Future;

use crate::cli::Config;

/// Serves until `shutdown` completes, then stops cleanly.
pub async fn run(config: Config, shutdown: impl Future<Output = ()>) -> Result<(), String> {
    let prepared = prepare::prepare(&config).await?;
    serve::serve(config, prepared, shutdown).await
}

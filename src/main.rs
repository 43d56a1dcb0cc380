//! The `localdns-fallback` binary: parse flags, set up logging, serve until SIGTERM or SIGINT.
//! See `localdns-fallback --help` and README.md.

use std::io::IsTerminal;
use std::process::ExitCode;

use localdns_fallback::cli::{self, Command};
use localdns_fallback::{confine, report, server, status};
use tokio::signal::unix::{SignalKind, signal};

/// Prints to stdout; a reader that went away (`| head`) is no error of ours.
fn out(text: &str) {
    use std::io::Write;
    let _ = std::io::stdout().write_all(text.as_bytes());
}

fn main() -> ExitCode {
    let config = match cli::parse(std::env::args().skip(1)) {
        Ok(Command::Run(config)) => *config,
        Ok(Command::Help) => {
            out(&format!("{}\n", cli::usage()));
            return ExitCode::SUCCESS;
        }
        Ok(Command::Discover { config, json }) => {
            let report = report::gather(&config);
            if json {
                out(&format!("{}\n", report::json(&config, &report)));
            } else {
                out(&report::text(&config, &report));
            }
            return if report.complete() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            };
        }
        Ok(Command::ReleaseAddresses(config)) => {
            return match server::release_addresses(&config) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("localdns-fallback: {e}");
                    ExitCode::FAILURE
                }
            };
        }
        Ok(Command::Status(config, ready)) => return status::report(&config, ready),
        Ok(Command::Version) => {
            println!(
                "localdns-fallback {} (commit {})",
                env!("CARGO_PKG_VERSION"),
                env!("BUILD_COMMIT")
            );
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("localdns-fallback: {e} (see --help)");
            return ExitCode::from(2);
        }
    };
    init_logging(config.log_level);
    // Before the runtime starts its threads: a Landlock ruleset holds for the thread that makes
    // it and every thread and process started from it later, never for threads already running.
    confine::whole_process();
    match run(config) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e}");
            ExitCode::FAILURE
        }
    }
}

fn run(config: cli::Config) -> Result<(), String> {
    server::run(config, || {
        let mut term =
            signal(SignalKind::terminate()).map_err(|e| format!("cannot watch SIGTERM: {e}"))?;
        let mut int =
            signal(SignalKind::interrupt()).map_err(|e| format!("cannot watch SIGINT: {e}"))?;
        Ok(async move {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        })
    })
}

/// Logs go to stderr. Under systemd (JOURNAL_STREAM set) the journal adds its own timestamps, and
/// colours are only for terminals.
fn init_logging(level: tracing::Level) {
    let builder = tracing_subscriber::fmt()
        .with_max_level(level)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_target(false);
    if std::env::var_os("JOURNAL_STREAM").is_some() {
        builder.without_time().init();
    } else {
        builder.init();
    }
}

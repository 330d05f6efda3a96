//! The example MCP server: a real rmcp streamable-HTTP server on axum, protected by stormgate.
//!
//! ```text
//! cargo run --release --example mcp_server -- --addr 127.0.0.1:3000
//! ```
//! The address also comes from `STORMGATE_ADDR`; the default is 127.0.0.1:3000. The
//! configuration file is `--config PATH` or `STORMGATE_CONFIG`, by default
//! `examples/stormgate.toml`. `--redis URL` (or `STORMGATE_REDIS`; build with
//! `--features redis`) shares the budget with every other server given the same Redis: it
//! sets `[distributed] url` (the other `[distributed]` settings come from the file or their
//! defaults).
//!
//! Logs go to stderr, filtered by `RUST_LOG` (targets and levels, e.g.
//! `RUST_LOG=stormgate=debug,info`; default `info`). SIGTERM or SIGINT stops accepting
//! connections and lets calls in flight finish for up to `--shutdown-grace-ms`
//! (`STORMGATE_SHUTDOWN_GRACE_MS`, default 30 000), then the server exits 0. A connection
//! without a whole request head `--header-timeout-ms` after it opens or after its last answer
//! is closed (`STORMGATE_HEADER_TIMEOUT_MS`, default 30 000), and at most `--max-connections`
//! are open at once (`STORMGATE_MAX_CONNECTIONS`, default 10 000; see
//! `stormgate::serve::Connections`).

mod app;

use std::path::{Path, PathBuf};
use std::time::Duration;

use stormgate::control::Config;
use tracing_subscriber::filter::{LevelFilter, Targets};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

const DEFAULT_ADDR: &str = "127.0.0.1:3000";

/// The value of `--name VALUE` or `--name=VALUE`, else of the environment variable `env`.
fn flag(name: &str, env: &str) -> Option<String> {
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        if arg == name {
            return args.next();
        }
        if let Some(value) = arg.strip_prefix(name).and_then(|v| v.strip_prefix('=')) {
            return Some(value.to_owned());
        }
    }
    std::env::var(env).ok()
}

/// The whole number given as `--name` or in `env`, if either is.
fn number(name: &str, env: &str) -> std::io::Result<Option<u64>> {
    flag(name, env)
        .map(|v| {
            v.parse::<u64>()
                .map_err(|e| std::io::Error::other(format!("{name}: {e}")))
        })
        .transpose()
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let filter = std::env::var("RUST_LOG")
        .ok()
        .and_then(|v| v.parse::<Targets>().ok())
        .unwrap_or_else(|| Targets::new().with_default(LevelFilter::INFO));
    tracing_subscriber::registry()
        .with(tracing_subscriber::fmt::layer().with_writer(std::io::stderr))
        .with(filter)
        .init();
    let metrics = stormgate::metrics::prometheus_builder()
        .install_recorder()
        .map_err(std::io::Error::other)?;
    let config_path =
        flag("--config", "STORMGATE_CONFIG").unwrap_or_else(|| app::CONFIG.to_owned());
    let mut config = Config::load(Path::new(&config_path)).map_err(std::io::Error::other)?;
    if let Some(url) = flag("--redis", "STORMGATE_REDIS") {
        config.distributed.get_or_insert_with(Default::default).url = url;
        config.validate().map_err(std::io::Error::other)?;
    }
    let (app, control) =
        app::app(app::Backend::new(), config, metrics).map_err(std::io::Error::other)?;
    let _tasks = control.spawn();
    // Live reloads: edit the file, or send SIGHUP; an invalid file is refused and reported.
    let _watch = control
        .watch_file(PathBuf::from(&config_path))
        .map_err(std::io::Error::other)?;
    let _hup = control.reload_on_sighup(PathBuf::from(&config_path))?;
    let addr = flag("--addr", "STORMGATE_ADDR").unwrap_or_else(|| DEFAULT_ADDR.to_owned());
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    println!(
        "stormgate example MCP server on http://{local}/mcp (metrics: http://{local}/metrics)"
    );
    println!("configuration: {config_path} (watched; SIGHUP reloads it)");
    if let Some(d) = &control.config().distributed {
        println!(
            "budget shared through {} (prefix {:?}, lease window {} ms, on failure: {})",
            d.url,
            d.prefix,
            d.lease_window.as_millis(),
            d.on_failure.as_str()
        );
    }
    if control.admin_router().is_some() {
        println!("admin routes: http://{local}/admin (bearer token from the configuration)");
    }
    let grace = number("--shutdown-grace-ms", "STORMGATE_SHUTDOWN_GRACE_MS")?
        .map_or(stormgate::serve::DEFAULT_GRACE, Duration::from_millis);
    let mut connections = stormgate::serve::Connections::default();
    if let Some(ms) = number("--header-timeout-ms", "STORMGATE_HEADER_TIMEOUT_MS")? {
        let timeout = stormgate::valid::NonZeroDuration::from_millis(ms)
            .map_err(|e| std::io::Error::other(format!("--header-timeout-ms: {e}")))?;
        connections = connections.header_timeout(timeout);
    }
    if let Some(n) = number("--max-connections", "STORMGATE_MAX_CONNECTIONS")? {
        let max = usize::try_from(n)
            .ok()
            .and_then(std::num::NonZeroUsize::new)
            .ok_or_else(|| std::io::Error::other("--max-connections: must be at least 1"))?;
        connections = connections.max_connections(max);
    }
    stormgate::serve::serve_with(listener, app, grace, connections).await?;
    Ok(())
}

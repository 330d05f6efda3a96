//! `stormgate`: the whole stormgate stack in front of any streamable-HTTP MCP server.
//!
//! ```text
//! stormgate --listen 127.0.0.1:4000 --upstream http://127.0.0.1:8000/mcp [--config stormgate.toml]
//! ```
//!
//! Serves `/mcp` (the upstream behind every stage of the stack, from one configuration),
//! `/metrics` (Prometheus) and `/admin` when the configuration has an admin token; watches the
//! configuration file and reloads it on SIGHUP; on SIGTERM or SIGINT stops accepting, lets the
//! calls in flight finish for the grace period and exits 0. A command line or a configuration
//! that cannot run exits 2 with the reason on stderr; a failure while serving exits 1.

mod cli;
mod http;

use std::path::Path;
use std::process::ExitCode;

use axum::Router;
use axum::routing::get;
use stormgate::ControlError;
use stormgate::control::{Config, Control};
use stormgate::gateway::{Hosts, HostsLayer, Proxy};
use tracing_subscriber::filter::{LevelFilter, Targets};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// Exit code of a command line or configuration that cannot run.
const USAGE: u8 = 2;

fn usage(message: impl std::fmt::Display) -> ExitCode {
    eprintln!("stormgate: {message}\n(stormgate --help for the flags)");
    ExitCode::from(USAGE)
}

fn main() -> ExitCode {
    let options = match cli::parse(std::env::args().skip(1), |k| std::env::var(k).ok()) {
        Ok(cli::Command::Help) => {
            print!("{}", cli::HELP);
            return ExitCode::SUCCESS;
        }
        Ok(cli::Command::Version) => {
            println!("stormgate {}", env!("CARGO_PKG_VERSION"));
            return ExitCode::SUCCESS;
        }
        Ok(cli::Command::Run(options)) => options,
        Ok(cli::Command::Check(path)) => {
            return match Config::load(&path).and_then(|c| Control::new(c).map(drop)) {
                Ok(()) => {
                    println!("{}: ok", path.display());
                    ExitCode::SUCCESS
                }
                Err(e) => usage(config_error(&path, &e)),
            };
        }
        Ok(cli::Command::Print(options)) => {
            let config = match effective(&options) {
                Ok(config) => config,
                Err(e) => return usage(e),
            };
            return match toml::to_string(&config) {
                Ok(text) => {
                    print!("{text}");
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("stormgate: cannot write the configuration: {e}");
                    ExitCode::FAILURE
                }
            };
        }
        Err(e) => return usage(e),
    };
    let filter = std::env::var("RUST_LOG")
        .ok()
        .and_then(|v| v.parse::<Targets>().ok())
        .unwrap_or_else(|| Targets::new().with_default(LevelFilter::INFO));
    tracing_subscriber::registry()
        .with(tracing_subscriber::fmt::layer().with_writer(std::io::stderr))
        .with(filter)
        .init();
    let config = match effective(&options) {
        Ok(config) => config,
        Err(e) => return usage(e),
    };
    let Some(gateway) = config.gateway.as_ref().filter(|g| g.upstream.is_some()) else {
        return usage(
            "no upstream: give --upstream URL, STORMGATE_UPSTREAM, or [gateway] upstream",
        );
    };
    let proxy = match Proxy::new(gateway) {
        Ok(proxy) => proxy,
        Err(e) => return usage(e),
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("stormgate: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(run(options, config, proxy))
}

/// A configuration error as one line that names the file once.
fn config_error(path: &Path, e: &ControlError) -> String {
    match e {
        // It names the file itself.
        ControlError::Read { .. } => e.to_string(),
        _ => format!("{}: {e}", path.display()),
    }
}

/// The configuration the options call for: the file's (or the defaults), with the flags'
/// upstream.
fn effective(options: &cli::Options) -> Result<Config, String> {
    let mut config = match &options.config {
        Some(path) => Config::load(path).map_err(|e| config_error(path, &e))?,
        None => Config::default(),
    };
    let gateway = config.gateway.get_or_insert_with(Default::default);
    if let Some(upstream) = &options.upstream {
        // Both given and different: every reload of the file would be refused (the upstream
        // cannot change while running), so refuse it now, saying why.
        if let Some(file) = gateway.upstream.as_ref().filter(|f| *f != upstream) {
            return Err(format!(
                "--upstream (or STORMGATE_UPSTREAM) {upstream:?} and the file's [gateway] upstream {file:?} differ: give one"
            ));
        }
        gateway.upstream = Some(upstream.clone());
    }
    if let Err(e) = gateway.validate() {
        return Err(e.to_string());
    }
    Ok(config)
}

async fn run(options: cli::Options, config: Config, proxy: Proxy) -> ExitCode {
    // Installed first: building the stack already sets gauges (the mode).
    let metrics = match stormgate::metrics::prometheus_builder().install_recorder() {
        Ok(handle) => handle,
        Err(e) => {
            eprintln!("stormgate: cannot install the metrics recorder: {e}");
            return ExitCode::FAILURE;
        }
    };
    let control = match Control::new(config) {
        Ok(control) => control,
        Err(e) => return usage(e),
    };
    let _tasks = control.spawn();
    let mut _reloads = Vec::new();
    if let Some(path) = &options.config {
        match control.watch_file(path.clone()) {
            Ok(task) => _reloads.push(task),
            Err(e) => tracing::warn!(error = %e, "the configuration file is not watched"),
        }
        match control.reload_on_sighup(path.clone()) {
            Ok(task) => _reloads.push(task),
            Err(e) => tracing::warn!(error = %e, "SIGHUP does not reload the configuration"),
        }
    }
    let upstream = proxy.upstream();
    let mut app = control
        .wrap(Router::new().route_service("/mcp", proxy))
        .route(
            "/metrics",
            get(move || std::future::ready(metrics.render())),
        );
    let admin = control.admin_router();
    if let Some(admin) = admin.clone() {
        app = app.nest("/admin", admin);
    }
    // Outermost: a request from a page whose name was rebound to this address goes no further.
    let allowed = control
        .config()
        .gateway
        .as_ref()
        .map(|g| g.allowed_hosts.clone())
        .unwrap_or_default();
    let app = app.layer(HostsLayer::new(Hosts::new(
        &allowed,
        options.listen.ip().is_loopback(),
    )));
    let app = http::around(app);
    let listener = match tokio::net::TcpListener::bind(options.listen).await {
        Ok(listener) => listener,
        Err(e) => {
            eprintln!("stormgate: cannot listen on {}: {e}", options.listen);
            return ExitCode::FAILURE;
        }
    };
    let local = match listener.local_addr() {
        Ok(local) => local,
        Err(e) => {
            eprintln!("stormgate: {e}");
            return ExitCode::FAILURE;
        }
    };
    tracing::info!(
        %upstream,
        mode = control.policy().mode.as_str(),
        config = %options.config.as_deref().map_or("(defaults)".into(), Path::to_string_lossy),
        admin = admin.is_some(),
        "stormgate gateway listening on http://{local}/mcp (metrics: http://{local}/metrics)"
    );
    match stormgate::serve::serve_with(listener, app, options.grace, options.connections).await {
        Ok(stopped) => {
            tracing::info!(?stopped, "stopped");
            ExitCode::SUCCESS
        }
        Err(e) => {
            tracing::error!(error = %e, "serving failed");
            ExitCode::FAILURE
        }
    }
}

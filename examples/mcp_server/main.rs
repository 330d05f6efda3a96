//! The example MCP server: a real rmcp streamable-HTTP server on axum, protected by stormgate.
//!
//! ```text
//! cargo run --release --example mcp_server -- --addr 127.0.0.1:3000
//! ```
//! The address also comes from `STORMGATE_ADDR`; the default is 127.0.0.1:3000.

mod app;

use metrics_exporter_prometheus::PrometheusBuilder;

const DEFAULT_ADDR: &str = "127.0.0.1:3000";

fn addr() -> String {
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        if arg == "--addr" {
            if let Some(addr) = args.next() {
                return addr;
            }
        } else if let Some(addr) = arg.strip_prefix("--addr=") {
            return addr.to_owned();
        }
    }
    std::env::var("STORMGATE_ADDR").unwrap_or_else(|_| DEFAULT_ADDR.to_owned())
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let metrics = PrometheusBuilder::new()
        .install_recorder()
        .map_err(std::io::Error::other)?;
    let app = app::app(app::Backend::new(), metrics);
    let listener = tokio::net::TcpListener::bind(addr()).await?;
    let local = listener.local_addr()?;
    println!(
        "stormgate example MCP server on http://{local}/mcp (metrics: http://{local}/metrics)"
    );
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await
}

//! End to end: the example server on a loopback port, driven by rmcp's own client.

#[path = "../examples/mcp_server/app.rs"]
mod app;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use stormgate::valid::Positive;

use axum::Router;
use rmcp::model::{CallToolRequestParams, ClientConfig, ProtocolVersion};
use rmcp::service::{RoleClient, RunningService, ServiceError};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::{ClientHandler, ClientLifecycleMode, ClientServiceExt, ServiceExt};
use serde_json::{Value, json};
use stormgate::admit::AdmitLayer;
use stormgate::classify::ClassifyLayer;
use stormgate::control::Config;
use stormgate::{Call, Reason, Rejection, Scope};

async fn serve(router: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    addr
}

async fn client(addr: SocketAddr) -> RunningService<RoleClient, ClientConfig> {
    let transport = StreamableHttpClientTransport::from_uri(format!("http://{addr}/mcp"));
    ClientConfig::default().serve(transport).await.unwrap()
}

fn args(v: Value) -> CallToolRequestParams {
    let Value::Object(map) = v["arguments"].clone() else {
        panic!("arguments must be an object")
    };
    CallToolRequestParams::new(v["name"].as_str().unwrap().to_owned()).with_arguments(map)
}

fn text(result: &rmcp::model::CallToolResult) -> String {
    serde_json::to_value(&result.content).unwrap()[0]["text"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// Refuses the next `tools/call` once, when armed.
#[derive(Default)]
struct RejectNext(AtomicBool);

impl RejectNext {
    fn layer(self: &Arc<Self>) -> AdmitLayer<impl stormgate::admit::Admission> {
        let this = self.clone();
        AdmitLayer::new(move |call: &Call| {
            if call.tool.is_some() && this.0.swap(false, Ordering::SeqCst) {
                Err(Rejection::new(
                    Reason::SessionBudgetExceeded,
                    Scope::AgentSession,
                    Duration::from_millis(1200),
                ))
            } else {
                Ok(())
            }
        })
    }
}

#[tokio::test]
async fn lists_and_calls_every_tool_through_the_whole_stack() {
    // The example's whole stack, configured by examples/stormgate.toml.
    let backend = app::Backend::new();
    let config = Config::load(std::path::Path::new(app::CONFIG)).unwrap();
    let (router, control) = app::protected(backend.clone(), config).unwrap();
    let _tasks = control.spawn();
    let addr = serve(router).await;
    let client = client(addr).await;

    let mut names: Vec<String> = client
        .list_all_tools()
        .await
        .unwrap()
        .into_iter()
        .map(|t| t.name.to_string())
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "cache_get",
            "create_order",
            "order_count",
            "read_doc",
            "sql_scan",
            "vector_search"
        ]
    );

    let r = client
        .call_tool(args(
            json!({"name": "cache_get", "arguments": {"key": "k1"}}),
        ))
        .await
        .unwrap();
    assert_eq!(text(&r), "cached:k1");

    let r = client
        .call_tool(args(
            json!({"name": "vector_search", "arguments": {"query": "storms", "top_k": 2}}),
        ))
        .await
        .unwrap();
    assert_eq!(text(&r).lines().count(), 2);

    let r = client
        .call_tool(args(
            json!({"name": "sql_scan", "arguments": {"table": "events"}}),
        ))
        .await
        .unwrap();
    assert_ne!(r.is_error, Some(true));
    assert!(text(&r).starts_with("scanned events"));
    assert_eq!(backend.scans(), 1);

    let r = client
        .call_tool(args(
            json!({"name": "create_order", "arguments": {"item": "gpu", "quantity": 2}}),
        ))
        .await
        .unwrap();
    assert_eq!(text(&r), "order 1: 2 x gpu");
    assert_eq!(backend.orders(), 1);
    // The stack saw the calls: the session guard tracks this client's session.
    assert_eq!(control.sessions().len(), 1);
    client.cancel().await.unwrap();
}

#[tokio::test]
async fn rejection_reaches_the_client_as_rate_limited_and_the_session_goes_on() {
    let backend = app::Backend::new();
    let gate = Arc::new(RejectNext::default());
    let router = app::mcp_router(backend.clone())
        .layer(gate.layer())
        .layer(ClassifyLayer::new());
    let addr = serve(router).await;
    let client = client(addr).await;
    let order = || args(json!({"name": "create_order", "arguments": {"item": "x", "quantity": 1}}));

    gate.0.store(true, Ordering::SeqCst);
    let err = client.call_tool(order()).await.unwrap_err();
    let ServiceError::McpError(err) = err else {
        panic!("expected an MCP error, got {err:?}")
    };
    assert_eq!(err.code.0, -32029);
    assert_eq!(
        err.message, "rate limited: retry after 1200 ms (session budget exceeded)",
        "hosts that show only the message still see when to come back"
    );
    let data = err.data.expect("rejection data");
    assert_eq!(data["retry_after_ms"], 1200);
    assert_eq!(data["retryAfterMs"], 1200);
    assert_eq!(data["notProcessed"], true);
    assert_eq!(data["reason"], "session_budget_exceeded");
    assert_eq!(data["scope"], "agent_session");
    assert_eq!(data["retryable"], true);
    assert_eq!(data["queue_wait_ms"], 0);
    assert_eq!(
        backend.orders(),
        0,
        "a rejected call never reaches the tool"
    );

    // Same session, next call: admitted.
    let r = client.call_tool(order()).await.unwrap();
    assert_eq!(text(&r), "order 1: 1 x x");
    assert_eq!(backend.orders(), 1);
    client.cancel().await.unwrap();
}

#[derive(Clone, Default)]
struct Discoverer;
impl ClientHandler for Discoverer {}

#[tokio::test]
async fn a_2026_07_28_client_gets_the_modern_code() {
    let gate = Arc::new(RejectNext::default());
    let router = app::mcp_router(app::Backend::new())
        .layer(gate.layer())
        .layer(ClassifyLayer::new());
    let addr = serve(router).await;
    let transport = StreamableHttpClientTransport::from_uri(format!("http://{addr}/mcp"));
    let client = Discoverer
        .serve_with_lifecycle(
            transport,
            ClientLifecycleMode::Discover {
                preferred_versions: vec![ProtocolVersion::V_2026_07_28],
            },
        )
        .await
        .unwrap();
    gate.0.store(true, Ordering::SeqCst);
    let err = client
        .call_tool(args(
            json!({"name": "cache_get", "arguments": {"key": "a"}}),
        ))
        .await
        .unwrap_err();
    let ServiceError::McpError(err) = err else {
        panic!("expected an MCP error, got {err:?}")
    };
    assert_eq!(err.code.0, 429);
    assert_eq!(err.data.unwrap()["reason"], "session_budget_exceeded");
    let r = client
        .call_tool(args(
            json!({"name": "cache_get", "arguments": {"key": "a"}}),
        ))
        .await
        .unwrap();
    assert_eq!(text(&r), "cached:a");
    client.cancel().await.unwrap();
}

/// The whole stack is one tower layer over any service: here rmcp's own streamable HTTP
/// service, not a router. Fixed mode at one call a second: the first call runs, the second is
/// refused with the contract, and the tool never sees it.
#[tokio::test]
async fn the_stack_layers_any_mcp_service() {
    use stormgate::control::{Control, Mode};
    use tower::Layer;
    let mut config = Config::default();
    config.mode = Mode::Fixed;
    config.fixed.global_rate = Some(Positive::new(1.0).unwrap());
    let control = Control::new(config).unwrap();
    let backend = app::Backend::new();
    let service = control.layer().layer(app::mcp_service(backend.clone()));
    let addr = serve(Router::new().nest_service("/mcp", service)).await;
    let client = client(addr).await;
    let order = || args(json!({"name": "create_order", "arguments": {"item": "x", "quantity": 1}}));
    assert_eq!(
        text(&client.call_tool(order()).await.unwrap()),
        "order 1: 1 x x"
    );
    let err = client.call_tool(order()).await.unwrap_err();
    let ServiceError::McpError(err) = err else {
        panic!("expected an MCP error, got {err:?}")
    };
    assert_eq!(err.code.0, -32029);
    assert_eq!(err.data.unwrap()["reason"], "fixed_limit_exceeded");
    assert_eq!(
        backend.orders(),
        1,
        "the refused call never reached the tool"
    );
    client.cancel().await.unwrap();
}

//! A loopback server and a client of it: serving a router on a free port, the JSON-RPC POST a
//! client sends and its answer read whole, and an upstream that echoes the headers it got.
//! Shared by the library's tests (through `common`) and the binary's (cli/tests).

#![allow(dead_code, unreachable_pub)]

use axum::Router;
use axum::body::Body;
use axum::routing::any;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::{Value, json};

/// Serves `router` on a free loopback port (with the peer's address, as a server sees it)
/// until the test's runtime ends; its address.
pub async fn serve(router: axum::Router) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(
            listener,
            router.into_make_service_with_connect_info::<std::net::SocketAddr>(),
        )
        .await
        .unwrap()
    });
    addr
}

/// An HTTP/1 client of the loopback servers.
pub fn client() -> Client<HttpConnector, Body> {
    Client::builder(TokioExecutor::new()).build_http()
}

/// A JSON-RPC POST to `url` with `body` and extra `headers`.
pub fn rpc_post(url: &str, body: &Value, headers: &[(&str, &str)]) -> Request<Body> {
    let mut req = Request::post(url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    req.body(Body::from(body.to_string())).unwrap()
}

pub async fn json_of<B>(response: Response<B>) -> (StatusCode, HeaderMap, Value)
where
    B: http_body::Body,
    B::Error: std::fmt::Debug,
{
    let (parts, body) = response.into_parts();
    let bytes = body.collect().await.unwrap().to_bytes();
    let value = serde_json::from_slice(&bytes)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&bytes)));
    (parts.status, parts.headers, value)
}

/// An upstream that answers each request with the headers it received, and with answer headers
/// of its own (MCP ones and hop-by-hop ones).
pub fn echo_headers_upstream() -> Router {
    Router::new().route(
        "/mcp",
        any(|req: Request<Body>| async move {
            let seen: serde_json::Map<String, Value> = req
                .headers()
                .iter()
                .map(|(k, v)| (k.as_str().to_owned(), json!(v.to_str().unwrap_or("?"))))
                .collect();
            let body = json!({
                "jsonrpc": "2.0", "id": 1,
                "result": {"headers": seen, "method": req.method().as_str(),
                           "query": req.uri().query()},
            });
            Response::builder()
                .header("content-type", "application/json")
                .header("mcp-session-id", "upstream-session-1")
                .header("x-upstream", "yes")
                .header("connection", "x-secret-hop")
                .header("x-secret-hop", "must not pass")
                .header("keep-alive", "timeout=5")
                .body(Body::from(body.to_string()))
                .unwrap()
        }),
    )
}

//! The classify layer: reads an MCP POST body once and attaches its [`Calls`](crate::Calls).
//!
//! ```text
//! POST /mcp ──► body limit ──► parse (borrowed) ──► Calls in extensions ──► inner
//!                  │                 │
//!                  └─► 413 + JSON-RPC error, nothing forwarded
//!                                    └─► not JSON-RPC: forwarded byte for byte, tagged
//!                                        `Unclassified`, never answered by stormgate
//! ```
//!
//! * Only `POST` bodies are read; `GET` (the SSE stream) and `DELETE` (session end) pass as is.
//! * The body is buffered once, bounded by [`ClassifyLayer::body_limit`] (4 MiB by default,
//!   as rmcp's own limit). A `Content-Length` over the limit is refused before anything is
//!   read; a chunked body is refused as soon as it passes the limit. Either way the answer is
//!   HTTP 413 with a JSON-RPC error (-32600, id null) and nothing reaches the inner service.
//! * The inner service always receives exactly the bytes the client sent.
//! * The MCP 2026-07-28 `Mcp-Method` / `Mcp-Name` headers are compared with the body; on a
//!   mismatch the body wins and the call is flagged ([`Call::header_mismatch`](crate::Call)).
//! * This layer never rejects on its own: it only reads. Put your authentication layer
//!   (which inserts the [`Tenant`](crate::Tenant) extension) outside it.
//!
//! ```
//! use axum::{Router, routing::post};
//! use stormgate::classify::ClassifyLayer;
//!
//! let app: Router = Router::new()
//!     .route("/mcp", post(|| async { "ok" }))
//!     .layer(ClassifyLayer::new().body_limit(1 << 20));
//! ```

mod buffering;
mod copies;
mod deadlines;
mod future;
mod gather;
mod layer;
mod names;
mod service;

pub use deadlines::DeadlineConfig;
pub use future::ResponseFuture;
pub(crate) use layer::Settings;
pub use layer::{
    Batches, ClassifyConfig, ClassifyLayer, DEFAULT_BODY_LIMIT, DEFAULT_BODY_TIMEOUT,
    DEFAULT_MAX_BUFFERED_BYTES,
};
pub use service::Classify;

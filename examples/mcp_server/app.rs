//! The example MCP server's application: a backend with tools of very different cost, served
//! by rmcp's streamable HTTP service nested in an axum Router and wrapped by stormgate.
//! Shared by `main.rs` and the integration tests.

#![allow(dead_code)] // some items are used only by the integration tests

use std::collections::{HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use metrics_exporter_prometheus::PrometheusHandle;
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::{Json, Parameters};
use rmcp::model::{CallToolResult, ContentBlock, ServerCapabilities, ServerConfig};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData, ServerHandler, schemars, tool, tool_handler, tool_router};
use serde::Deserialize;
use stormgate::control::{Config, Control, ControlError};
use tokio::sync::Semaphore;
use tokio::time::Instant;

/// Connections in the shared database pool.
pub(crate) const POOL_SIZE: usize = 4;
/// How long `sql_scan` holds a connection.
pub(crate) const SQL_HOLD: Duration = Duration::from_millis(200);
/// How long `sql_scan` waits for a connection before it fails.
pub(crate) const POOL_WAIT_LIMIT: Duration = Duration::from_secs(2);
/// How long `vector_search` takes.
pub(crate) const VECTOR_LATENCY: Duration = Duration::from_millis(50);
/// How long `read_doc` takes.
pub(crate) const DOC_LATENCY: Duration = Duration::from_millis(10);

/// A scan slower than this, pool wait included, is a slow query.
pub(crate) const SLOW_QUERY: Duration = Duration::from_secs(1);

/// The window over which a load-sensitive backend counts its recent scans.
pub(crate) const LOAD_WINDOW: Duration = Duration::from_secs(5);

/// How a load-sensitive backend's scans slow down with its recent load (see
/// [`Backend::load_sensitive`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Load {
    /// How much a full `capacity` of recent scans adds to the hold time, as a multiple of the
    /// base hold time.
    pub(crate) k: f64,
    /// Scans started in the last [`LOAD_WINDOW`] that add `k` base hold times.
    pub(crate) capacity: f64,
}

/// The simulated backend every session shares: a small SQL pool with a query cache, a
/// document store and an order book.
#[derive(Debug)]
pub(crate) struct Backend {
    pool: Semaphore,
    orders: AtomicU64,
    scans: AtomicU64,
    started: AtomicU64,
    /// How long a scan holds its connection: (query seen before, new query).
    hold: (Duration, Duration),
    /// Load sensitivity: `None` for a fixed hold time.
    load: Option<Load>,
    /// Arrival times of the scans of the last [`LOAD_WINDOW`] (only with `load`).
    recent: Mutex<VecDeque<Instant>>,
    seen: Mutex<HashSet<String>>,
    log: Mutex<Vec<Scan>>,
}

/// One `sql_scan` as the database saw it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Scan {
    /// When it arrived.
    pub(crate) at: Instant,
    /// How long it waited for a connection.
    pub(crate) pool_wait: Duration,
    /// Arrival to answer, pool wait included.
    pub(crate) total: Duration,
    /// False when the pool wait passed [`POOL_WAIT_LIMIT`] and it failed.
    pub(crate) ok: bool,
}

impl Backend {
    /// A backend with a pool of [`POOL_SIZE`] connections, every scan holding one for
    /// [`SQL_HOLD`].
    pub(crate) fn new() -> Arc<Self> {
        Self::with_cache(SQL_HOLD, SQL_HOLD)
    }

    /// A backend whose scans hold a connection for `warm` when the same table and filter were
    /// scanned before (the cache has it) and `cold` for a query never seen.
    pub(crate) fn with_cache(warm: Duration, cold: Duration) -> Arc<Self> {
        Self::build((warm, cold), None)
    }

    /// A backend whose database slows down with its own recent load, with no cache: a scan
    /// that gets a connection holds it for
    /// `base x (1 + load.k x scans started in the last LOAD_WINDOW / load.capacity)`
    /// (the scans counted include itself and the ones still waiting or failed), so latency
    /// drifts up smoothly as the load rises, before the pool is ever exhausted.
    pub(crate) fn load_sensitive(base: Duration, load: Load) -> Arc<Self> {
        Self::build((base, base), Some(load))
    }

    fn build(hold: (Duration, Duration), load: Option<Load>) -> Arc<Self> {
        Arc::new(Backend {
            pool: Semaphore::new(POOL_SIZE),
            orders: AtomicU64::new(0),
            scans: AtomicU64::new(0),
            started: AtomicU64::new(0),
            hold,
            load,
            recent: Mutex::new(VecDeque::new()),
            seen: Mutex::new(HashSet::new()),
            log: Mutex::new(Vec::new()),
        })
    }

    /// Scans started in the last [`LOAD_WINDOW`] (counted only by a load-sensitive backend).
    pub(crate) fn recent_load(&self) -> usize {
        let mut recent = self.recent.lock().unwrap();
        let now = Instant::now();
        while recent.front().is_some_and(|&t| now - t > LOAD_WINDOW) {
            recent.pop_front();
        }
        recent.len()
    }

    /// How long a scan of `query` holds its connection, now.
    fn hold_time(&self, query: String) -> Duration {
        match self.load {
            None => {
                let cached = !self.seen.lock().unwrap().insert(query);
                if cached { self.hold.0 } else { self.hold.1 }
            }
            // No cache: every scan costs the same at the same load.
            Some(load) => self
                .hold
                .1
                .mul_f64(1.0 + load.k * self.recent_load() as f64 / load.capacity),
        }
    }

    /// Orders created so far.
    pub(crate) fn orders(&self) -> u64 {
        self.orders.load(Ordering::SeqCst)
    }

    /// `sql_scan` calls that got a connection and ran.
    pub(crate) fn scans(&self) -> u64 {
        self.scans.load(Ordering::SeqCst)
    }

    /// `sql_scan` calls that reached the database (running, waiting or done).
    pub(crate) fn scans_started(&self) -> u64 {
        self.started.load(Ordering::SeqCst)
    }

    /// Every scan so far, in the order they finished.
    pub(crate) fn scan_log(&self) -> Vec<Scan> {
        self.log.lock().unwrap().clone()
    }

    /// Runs one scan: waits for a connection (failing after [`POOL_WAIT_LIMIT`]), holds it, and
    /// logs it. Returns the pool wait, or the wait that failed.
    async fn scan(&self, query: String) -> Result<Duration, Duration> {
        self.started.fetch_add(1, Ordering::SeqCst);
        let at = Instant::now();
        if self.load.is_some() {
            self.recent.lock().unwrap().push_back(at);
        }
        let permit = tokio::time::timeout(POOL_WAIT_LIMIT, self.pool.acquire()).await;
        let pool_wait = at.elapsed();
        let ok = permit.is_ok();
        if let Ok(permit) = permit {
            tokio::time::sleep(self.hold_time(query)).await;
            drop(permit);
            self.scans.fetch_add(1, Ordering::SeqCst);
        }
        let total = at.elapsed();
        self.log.lock().unwrap().push(Scan {
            at,
            pool_wait,
            total,
            ok,
        });
        if ok { Ok(pool_wait) } else { Err(pool_wait) }
    }
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub(crate) struct CacheGet {
    /// The cache key.
    pub(crate) key: String,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub(crate) struct VectorSearch {
    /// The search text.
    pub(crate) query: String,
    /// How many hits to return (default 3).
    pub(crate) top_k: Option<u32>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub(crate) struct SqlScan {
    /// The table to scan.
    pub(crate) table: String,
    /// A filter expression.
    pub(crate) filter: Option<String>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub(crate) struct ReadDoc {
    /// The document id.
    pub(crate) id: String,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub(crate) struct CreateOrder {
    /// What to order.
    pub(crate) item: String,
    /// How many.
    pub(crate) quantity: u32,
}

/// What `order_count` answers: a tool with an `outputSchema`.
#[derive(Debug, serde::Serialize, schemars::JsonSchema)]
pub(crate) struct OrderCount {
    /// Orders created so far.
    pub(crate) orders: u64,
}

/// The MCP tools.
#[derive(Debug, Clone)]
pub(crate) struct Tools {
    backend: Arc<Backend>,
    tool_router: ToolRouter<Self>,
}

#[tool_router]
impl Tools {
    /// Tools over `backend`.
    pub(crate) fn new(backend: Arc<Backend>) -> Self {
        Tools {
            backend,
            tool_router: Self::tool_router(),
        }
    }

    #[tool(description = "Read a key from the cache (cheap, instant)")]
    async fn cache_get(&self, Parameters(CacheGet { key }): Parameters<CacheGet>) -> String {
        format!("cached:{key}")
    }

    #[tool(description = "Semantic search over the document index (about 50 ms)")]
    async fn vector_search(
        &self,
        Parameters(VectorSearch { query, top_k }): Parameters<VectorSearch>,
    ) -> String {
        tokio::time::sleep(VECTOR_LATENCY).await;
        let hits: Vec<String> = (1..=top_k.unwrap_or(3))
            .map(|i| format!("doc-{i} for {query:?}"))
            .collect();
        hits.join("\n")
    }

    #[tool(
        description = "Scan a database table (heavy: holds one of 4 shared pool connections for about 200 ms; fails when the pool wait passes 2 s)"
    )]
    async fn sql_scan(
        &self,
        Parameters(SqlScan { table, filter }): Parameters<SqlScan>,
    ) -> Result<CallToolResult, ErrorData> {
        // The database runs a query to its end even when the caller has gone (a timed-out
        // client leaves its query holding a connection), so the scan runs in its own task.
        let backend = self.backend.clone();
        let query = format!("{table}|{}", filter.as_deref().unwrap_or("true"));
        let scan = tokio::spawn(async move { backend.scan(query).await });
        match scan.await {
            Ok(Ok(waited)) => Ok(CallToolResult::success(vec![ContentBlock::text(format!(
                "scanned {table} where {} (pool wait {} ms)",
                filter.as_deref().unwrap_or("true"),
                waited.as_millis()
            ))])),
            Ok(Err(waited)) => Ok(CallToolResult::error(vec![ContentBlock::text(format!(
                "connection pool exhausted: waited {} ms for a connection",
                waited.as_millis()
            ))])),
            Err(e) => Err(ErrorData::internal_error(e.to_string(), None)),
        }
    }

    #[tool(description = "Read one document by id from the document store (about 10 ms)")]
    async fn read_doc(&self, Parameters(ReadDoc { id }): Parameters<ReadDoc>) -> String {
        tokio::time::sleep(DOC_LATENCY).await;
        format!("document {id}")
    }

    #[tool(description = "How many orders exist (structured output, with an outputSchema)")]
    async fn order_count(&self) -> Json<OrderCount> {
        Json(OrderCount {
            orders: self.backend.orders.load(Ordering::SeqCst),
        })
    }

    #[tool(description = "Create an order (a non-idempotent write)")]
    async fn create_order(
        &self,
        Parameters(CreateOrder { item, quantity }): Parameters<CreateOrder>,
    ) -> String {
        let id = self.backend.orders.fetch_add(1, Ordering::SeqCst) + 1;
        format!("order {id}: {quantity} x {item}")
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for Tools {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }
}

/// rmcp's streamable HTTP service over `backend`, with no protection.
pub(crate) fn mcp_service(
    backend: Arc<Backend>,
) -> StreamableHttpService<Tools, LocalSessionManager> {
    StreamableHttpService::new(
        move || Ok(Tools::new(backend.clone())),
        Default::default(),
        StreamableHttpServerConfig::default().with_sse_keep_alive(None),
    )
}

/// The MCP endpoint at `/mcp`, with no protection: add stormgate layers around it.
pub(crate) fn mcp_router(backend: Arc<Backend>) -> Router {
    Router::new().nest_service("/mcp", mcp_service(backend))
}

/// The example configuration file.
pub(crate) const CONFIG: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/stormgate.toml");

/// `/mcp` wrapped by the whole stormgate stack built from `config` (outermost first: classify
/// with tool weights, budget with tenant shares, session guard, FIFO limiter, outcome
/// observation), and the control handle that flips and reloads it.
pub(crate) fn protected(
    backend: Arc<Backend>,
    config: Config,
) -> Result<(Router, Control), ControlError> {
    let control = Control::new(config)?;
    Ok((control.wrap(mcp_router(backend)), control))
}

/// The whole example application: the protected `/mcp`, `/metrics`, and the admin routes
/// under `/admin` when a token is configured.
pub(crate) fn app(
    backend: Arc<Backend>,
    config: Config,
    metrics: PrometheusHandle,
) -> Result<(Router, Control), ControlError> {
    let (router, control) = protected(backend, config)?;
    let mut router = router.route(
        "/metrics",
        get(move || std::future::ready(metrics.render())),
    );
    if let Some(admin) = control.admin_router() {
        router = router.nest("/admin", admin);
    }
    Ok((router, control))
}

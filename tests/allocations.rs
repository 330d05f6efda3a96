//! Heap allocations and bytes per `tools/call` through the whole stack (the example server
//! with examples/stormgate.toml), against the bare MCP router, counted by an instrumented
//! global allocator. The ceilings are the figures measured when this test was written plus a
//! margin; the README's overhead section quotes them.

mod common;

#[path = "../examples/mcp_server/app.rs"]
mod app;

use std::alloc::System;

use common::{body_bytes, session, tool_call};
use serde_json::json;
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};
use stormgate::control::Config;
use tower::ServiceExt;

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// Allocations and bytes allocated by `n` calls of `cache_get` on `router`, per call.
async fn per_call(router: &axum::Router, n: usize) -> (f64, f64) {
    let sid = session(router).await;
    for i in 0..100 {
        let req = tool_call(&sid, i, "cache_get", json!({"key": "k"}));
        body_bytes(router.clone().oneshot(req).await.unwrap()).await;
    }
    let region = Region::new(GLOBAL);
    for i in 0..n {
        let req = tool_call(&sid, 1000 + i, "cache_get", json!({"key": "k"}));
        body_bytes(router.clone().oneshot(req).await.unwrap()).await;
    }
    let stats = region.change();
    (
        stats.allocations as f64 / n as f64,
        stats.bytes_allocated as f64 / n as f64,
    )
}

#[test]
fn allocations_per_call_stay_under_their_ceiling() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let bare = app::mcp_router(app::Backend::new());
        let config = Config::from_toml(include_str!("../examples/stormgate.toml")).unwrap();
        let (stack, _control) = app::protected(app::Backend::new(), config).unwrap();
        let (bare_allocs, bare_bytes) = per_call(&bare, 1000).await;
        let (allocs, bytes) = per_call(&stack, 1000).await;
        let figures = format!(
            "stack {allocs:.0} allocations / {bytes:.0} bytes per call; bare router \
             {bare_allocs:.0} / {bare_bytes:.0}"
        );
        assert!(allocs < ALLOCS_CEILING, "{figures}");
        assert!(bytes < BYTES_CEILING, "{figures}");
        assert!(allocs > bare_allocs, "is anything counted? {figures}");
    });
}

/// Measured: 230 to 241 allocations per call in twelve runs here (the stack's timers run on
/// the real clock), 245 once in a clean-clone CI run; 222 to 235 before the census and the
/// fair shares (another machine); 246 on 6faae52; the bare rmcp router: 179.
const ALLOCS_CEILING: f64 = 260.0;
/// Measured: 23 401 to 24 928 bytes per call here, 25 550 once in CI; 22 637 to 23 829
/// before the census and the fair shares; 26 348 on 6faae52.
const BYTES_CEILING: f64 = 27_000.0;

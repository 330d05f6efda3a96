//! The Node and Python drivers of real MCP clients and servers: where .ci/run installs Node
//! and the TypeScript packages, and running a driver for its JSON report. Shared by the
//! library's tests (through `common`) and the binary's (cli/tests).

#![allow(dead_code, unreachable_pub)]

/// Where .ci/run installs Node 22 and the MCP TypeScript packages (`STORMGATE_NODE_DIR`,
/// default `target/ci-node` at the workspace's root).
pub fn node_dir() -> String {
    std::env::var("STORMGATE_NODE_DIR").unwrap_or_else(|_| {
        let package = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        // The library is the workspace's root; the binary's package is one level below.
        let root = if package.join("Cargo.lock").exists() {
            package
        } else {
            package.parent().unwrap()
        };
        root.join("target/ci-node").display().to_string()
    })
}

/// Runs a client or server driver (`what` names it and its installer in failures), at most
/// 120 s; the JSON report it prints.
pub async fn report(mut command: tokio::process::Command, what: &str) -> serde_json::Value {
    let run = command.kill_on_drop(true).output();
    let out = tokio::time::timeout(std::time::Duration::from_secs(120), run)
        .await
        .unwrap_or_else(|_| panic!("{what} did not finish within 120 s"))
        .unwrap_or_else(|e| panic!("{what}: {e} (.ci/run installs it)"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{what} failed ({}; .ci/run installs it):\n{stderr}",
        out.status
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "not a report ({e}): {}\n{stderr}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

//! Metric names, in one place. Emitted through the [`metrics`] facade, so any recorder works
//! (the example server installs `metrics-exporter-prometheus`).
//!
//! | name | type | labels | meaning |
//! |---|---|---|---|
//! | `stormgate_calls_total` | counter | `kind` (request, notification, response, invalid) | JSON-RPC messages classified |
//! | `stormgate_unclassified_total` | counter | `reason` (not_json, not_json_rpc) | POST bodies forwarded untouched because they are not JSON-RPC |
//! | `stormgate_header_mismatch_total` | counter | | `Mcp-Method`/`Mcp-Name` headers that disagreed with the body |
//! | `stormgate_body_rejected_total` | counter | `status` (413, 400) | bodies refused before parsing |
//! | `stormgate_rejected_total` | counter | `reason`, `scope` | calls refused, by the rejection contract's vocabulary |

/// JSON-RPC messages classified, by `kind`.
pub const CALLS: &str = "stormgate_calls_total";
/// POST bodies that were not JSON-RPC, by `reason`.
pub const UNCLASSIFIED: &str = "stormgate_unclassified_total";
/// `Mcp-Method` / `Mcp-Name` headers that disagreed with the body.
pub const HEADER_MISMATCH: &str = "stormgate_header_mismatch_total";
/// Bodies refused before parsing, by HTTP `status`.
pub const BODY_REJECTED: &str = "stormgate_body_rejected_total";
/// Calls refused, by `reason` and `scope`.
pub const REJECTED: &str = "stormgate_rejected_total";

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
//! | `stormgate_fifo_admitted_total` | counter | `key` | calls admitted by a FIFO key (at once or after waiting) |
//! | `stormgate_fifo_queued_total` | counter | `key` | calls that had to wait in a FIFO queue |
//! | `stormgate_fifo_rejected_total` | counter | `key`, `reason` | calls a FIFO key refused (queue_full, queue_timeout, upstream_rate_limited) |
//! | `stormgate_fifo_queue_depth` | gauge | `key` | waiters queued on a key |
//! | `stormgate_fifo_queue_wait_seconds` | histogram | `key` | time admitted calls waited (0 for those admitted at once) |
//! | `stormgate_upstream_rate_limited_total` | counter | `key` | upstream 429 answers seen by the outbound limiter |
//! | `stormgate_budget` | gauge | | the adaptive global budget, cost units per second |
//! | `stormgate_budget_rate` | gauge | | smoothed admitted cost per second |
//! | `stormgate_budget_error_rate` | gauge | | smoothed error rate of finished calls |
//! | `stormgate_budget_p99_seconds` | gauge | | smoothed p99 service time |
//! | `stormgate_budget_in_flight` | gauge | | smoothed calls in flight |
//! | `stormgate_budget_rejected_total` | counter | `reason` | calls the budget refused (global or tenant) |
//! | `stormgate_sessions` | gauge | | sessions tracked by the session guard |
//! | `stormgate_session_top_score` | gauge | | the highest storm score at the last sweep |
//! | `stormgate_session_rejected_total` | counter | | calls the session guard refused |
//! | `stormgate_mode` | gauge | `mode` (adaptive, fixed, off) | 1 for the kill switch's current mode, 0 for the others |
//! | `stormgate_reloads_total` | counter | `result` (ok, invalid) | configuration reloads, by result |
//! | `stormgate_outcomes_total` | counter | `outcome` | finished calls by outcome (ok, error, timeout, cancelled, client_error) |

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
/// Calls admitted by a FIFO key, by `key`.
pub const FIFO_ADMITTED: &str = "stormgate_fifo_admitted_total";
/// Calls that had to wait in a FIFO queue, by `key`.
pub const FIFO_QUEUED: &str = "stormgate_fifo_queued_total";
/// Calls a FIFO key refused, by `key` and `reason`.
pub const FIFO_REJECTED: &str = "stormgate_fifo_rejected_total";
/// Waiters queued on a key, by `key`.
pub const FIFO_QUEUE_DEPTH: &str = "stormgate_fifo_queue_depth";
/// Time admitted calls waited, by `key`.
pub const FIFO_QUEUE_WAIT: &str = "stormgate_fifo_queue_wait_seconds";
/// Upstream 429 answers seen by the outbound limiter, by `key`.
pub const UPSTREAM_RATE_LIMITED: &str = "stormgate_upstream_rate_limited_total";
/// The adaptive global budget, cost units per second.
pub const BUDGET: &str = "stormgate_budget";
/// Smoothed admitted cost per second.
pub const BUDGET_RATE: &str = "stormgate_budget_rate";
/// Smoothed error rate.
pub const BUDGET_ERROR_RATE: &str = "stormgate_budget_error_rate";
/// Smoothed p99 service time, seconds.
pub const BUDGET_P99: &str = "stormgate_budget_p99_seconds";
/// Smoothed calls in flight.
pub const BUDGET_IN_FLIGHT: &str = "stormgate_budget_in_flight";
/// Calls the budget refused, by `reason`.
pub const BUDGET_REJECTED: &str = "stormgate_budget_rejected_total";
/// Finished calls by `outcome`.
pub const OUTCOMES: &str = "stormgate_outcomes_total";
/// Sessions tracked by the session guard.
pub const SESSIONS: &str = "stormgate_sessions";
/// The highest storm score at the last sweep.
pub const SESSION_TOP_SCORE: &str = "stormgate_session_top_score";
/// Calls the session guard refused.
pub const SESSION_REJECTED: &str = "stormgate_session_rejected_total";
/// 1 for the kill switch's current `mode`, 0 for the others.
pub const MODE: &str = "stormgate_mode";
/// Configuration reloads by `result`.
pub const RELOADS: &str = "stormgate_reloads_total";

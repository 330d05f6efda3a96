//! Metric names, in one place. Emitted through the [`metrics`] facade, so any recorder works;
//! [`prometheus_builder`] sets up `metrics-exporter-prometheus` the way the dashboards expect.
//!
//! Label cardinality is bounded by construction: tenant and tool labels are capped per stack
//! (past a [`Labels`]' caps, new values are reported as `other`), and session ids appear only
//! in the top-N session gauges, which stop being updated when a session leaves the top N and
//! are then dropped by the exporter's idle timeout.
//!
//! | name | type | labels | meaning |
//! |---|---|---|---|
//! | `stormgate_messages_total` | counter | `kind` (request, notification, response, invalid) | JSON-RPC messages classified |
//! | `stormgate_calls_total` | counter | `tenant`, `tool`, `result` (ok, error, timeout, cancelled, client_error, rejected) | calls that ran, by how they ended, and calls refused |
//! | `stormgate_service_time_seconds` | histogram | `tool` | service time of calls that ran (queue wait excluded) |
//! | `stormgate_tenant_consumption` | gauge | `tenant` | admitted cost units per second, per budget tick |
//! | `stormgate_tenant_allocation` | gauge | `tenant` | the tenant's share of the budget, cost units per second |
//! | `stormgate_session_entropy_bits` | gauge | `session` (top N only) | entropy of the session's window |
//! | `stormgate_session_storm_score` | gauge | `session` (top N only) | the session's storm score |
//! | `stormgate_session_consumption` | gauge | `session` (top N only) | the session's admitted cost units per second |
//! | `stormgate_session_rejections` | gauge | `session` (top N only) | calls refused to the session so far |
//! | `stormgate_unclassified_total` | counter | `reason` (not_json, not_json_rpc) | POST bodies forwarded untouched because they are not JSON-RPC |
//! | `stormgate_header_mismatch_total` | counter | | `Mcp-Method`/`Mcp-Name` headers that disagreed with the body |
//! | `stormgate_body_rejected_total` | counter | `status` (413, 400) | bodies refused before parsing |
//! | `stormgate_rejected_total` | counter | `reason`, `scope`, `tenant`, `tool` | calls refused, by the rejection contract's vocabulary |
//! | `stormgate_fifo_admitted_total` | counter | `key` | calls admitted by a FIFO key (at once or after waiting) |
//! | `stormgate_fifo_queued_total` | counter | `key` | calls that had to wait in a FIFO queue |
//! | `stormgate_fifo_rejected_total` | counter | `key`, `reason` | calls a FIFO key refused (queue_full, queue_timeout, upstream_rate_limited) |
//! | `stormgate_fifo_queue_depth` | gauge | `key` | waiters queued on a key |
//! | `stormgate_fifo_queue_wait_seconds` | histogram | `key` | time admitted calls waited (0 for those admitted at once) |
//! | `stormgate_upstream_rate_limited_total` | counter | `key` | upstream 429 answers seen by the outbound limiter |
//! | `stormgate_upstream_retries_total` | counter | `key` | failed safe upstream calls retried once (`retry_once`) |
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
//! | `stormgate_shared_mode` | gauge | `mode` (shared, fallback) | feature `redis`: 1 for the node's current shared-budget mode, 0 for the other |
//! | `stormgate_shared_rate` | gauge | | feature `redis`: the cluster's global rate (minimum of fresh proposals) at Redis's last answer, cost units per second |
//! | `stormgate_shared_lease_requests_total` | counter | `scope` (global, tenant) | feature `redis`: lease requests sent to Redis |
//! | `stormgate_shared_granted_total` | counter | `scope` (global, tenant) | feature `redis`: cost units Redis granted to this node |
//! | `stormgate_shared_redis_errors_total` | counter | | feature `redis`: Redis calls and connection attempts that failed or timed out |

/// JSON-RPC messages classified, by `kind`.
pub const MESSAGES: &str = "stormgate_messages_total";
/// Calls by `tenant`, `tool` and `result`.
pub const CALLS: &str = "stormgate_calls_total";
/// Service time of calls that ran, by `tool`.
pub const SERVICE_TIME: &str = "stormgate_service_time_seconds";
/// Admitted cost per second, by `tenant`.
pub const TENANT_CONSUMPTION: &str = "stormgate_tenant_consumption";
/// The tenant's share of the budget, by `tenant`.
pub const TENANT_ALLOCATION: &str = "stormgate_tenant_allocation";
/// Entropy of a top-N session's window, by `session`.
pub const SESSION_ENTROPY: &str = "stormgate_session_entropy_bits";
/// Storm score of a top-N session, by `session`.
pub const SESSION_SCORE: &str = "stormgate_session_storm_score";
/// Admitted cost per second of a top-N session, by `session`.
pub const SESSION_CONSUMPTION: &str = "stormgate_session_consumption";
/// Calls refused to a top-N session so far, by `session`.
pub const SESSION_REJECTIONS: &str = "stormgate_session_rejections";
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
/// Failed safe upstream calls retried once, by `key`.
pub const UPSTREAM_RETRIES: &str = "stormgate_upstream_retries_total";
/// Requests the gateway's upstream gave no answer to, by `reason` (`upstream_unreachable`,
/// `upstream_broken`, `upstream_timeout`).
pub const GATEWAY_UPSTREAM_FAILURES: &str = "stormgate_gateway_upstream_failures_total";
/// Connections a listener served by [`serve`](crate::serve) has open now.
pub const CONNECTIONS_OPEN: &str = "stormgate_connections_open";
/// Connections [`serve`](crate::serve) closed because no whole request head came within the
/// header timeout (idle, or sending too slowly).
pub const CONNECTIONS_TIMED_OUT: &str = "stormgate_connections_timed_out_total";
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
/// 1 for the node's shared-budget `mode` (shared, fallback), 0 for the other.
pub const SHARED_MODE: &str = "stormgate_shared_mode";
/// The cluster's global rate at Redis's last answer, cost units per second.
pub const SHARED_RATE: &str = "stormgate_shared_rate";
/// Lease requests sent to Redis, by `scope`.
pub const SHARED_LEASE_REQUESTS: &str = "stormgate_shared_lease_requests_total";
/// Cost units Redis granted to this node, by `scope`.
pub const SHARED_GRANTED: &str = "stormgate_shared_granted_total";
/// Redis calls and connection attempts that failed or timed out.
pub const SHARED_REDIS_ERRORS: &str = "stormgate_shared_redis_errors_total";

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, OnceLock};
use std::time::Duration;

use ::metrics::{Counter, Histogram, SharedString};
#[cfg(feature = "prometheus")]
use metrics_exporter_prometheus::PrometheusBuilder;

use crate::bounded::{Bounded, key_of};
use crate::call::{Call, CallKind};
use crate::outcome::{Observation, Observer, Outcome};
use crate::rejection::{Reason, Rejection, Scope};

/// Default number of distinct tenant (and tool) label values before `other`.
pub const DEFAULT_LABEL_CAP: usize = 100;
/// The label value every value past the cap is reported as.
pub const OTHER: &str = "other";
/// The longest `tenant` or `tool` label value, bytes; a longer one (a client can name a tool
/// with a megabyte) is reported as `other` and never stored.
pub const MAX_LABEL_LEN: usize = 128;

struct Cap {
    max: AtomicUsize,
    /// The values labelled so far, by a keyed hash: at most `max` of at most
    /// [`MAX_LABEL_LEN`] bytes.
    seen: Bounded<Arc<str>>,
}

impl Cap {
    fn new() -> Self {
        Cap {
            max: AtomicUsize::new(DEFAULT_LABEL_CAP),
            seen: Bounded::new(),
        }
    }

    /// The value's label: the value, shared (no copy once labelled), or [`OTHER`].
    fn label(&self, value: &str) -> SharedString {
        self.label_at(self.seen.key(value), value).0
    }

    /// [`label`](Cap::label) of a value whose key is known, with the label's key.
    fn label_at(&self, key: u64, value: &str) -> (SharedString, u64) {
        let other = || {
            static KEY: LazyLock<u64> = LazyLock::new(|| key_of(OTHER));
            (SharedString::const_str(OTHER), *KEY)
        };
        if value.len() > MAX_LABEL_LEN {
            return other();
        }
        let cap = self.max.load(Ordering::Relaxed);
        match self.seen.get_or_insert(key, cap, || Arc::from(value)) {
            Some(label) => (SharedString::from(label), key),
            None => other(),
        }
    }
}

/// The bounded `tenant` and `tool` label values of one stack: past a cap (default 100 each),
/// new values are reported as `other`. Each [`Control`](crate::control::Control) owns one and
/// gives it to the stages that label by tenant or tool, so two stacks in one process keep
/// their own caps.
pub struct Labels {
    tenants: Cap,
    tools: Cap,
}

impl Default for Labels {
    fn default() -> Self {
        Labels {
            tenants: Cap::new(),
            tools: Cap::new(),
        }
    }
}

impl std::fmt::Debug for Labels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Labels")
            .field("tenants", &self.tenants.seen.len())
            .field("tools", &self.tools.seen.len())
            .finish()
    }
}

impl Labels {
    /// Label values with these caps.
    pub fn with_caps(tenants: usize, tools: usize) -> Self {
        let labels = Labels::default();
        labels.set_caps(tenants, tools);
        labels
    }

    /// Changes the caps (values already labelled keep their label).
    pub fn set_caps(&self, tenants: usize, tools: usize) {
        self.tenants.max.store(tenants, Ordering::Relaxed);
        self.tools.max.store(tools, Ordering::Relaxed);
    }

    /// The `tenant` label for a tenant name (capped).
    pub fn tenant(&self, tenant: &str) -> SharedString {
        self.tenants.label(tenant)
    }

    /// [`tenant`](Labels::tenant), by the tenant's key taken when it was made, with the
    /// label's key.
    pub(crate) fn tenant_of(&self, tenant: &crate::Tenant) -> (SharedString, u64) {
        self.tenants.label_at(tenant.key(), tenant.as_str())
    }

    /// [`tool`](Labels::tool), by the target's key taken when the call was classified, with
    /// the label's key.
    pub(crate) fn tool_of(&self, tool: Option<&crate::Name>) -> (SharedString, u64) {
        match tool {
            Some(t) => self.tools.label_at(t.key(), t.as_str()),
            None => self.tools.label_at(*NONE_KEY, "none"),
        }
    }

    /// The `tool` label for a call's target (capped; `none` for calls without one).
    pub fn tool(&self, tool: Option<&str>) -> SharedString {
        self.tools.label(tool.unwrap_or("none"))
    }
}

/// The key of the `tool` label of calls without a target, `none`.
static NONE_KEY: LazyLock<u64> = LazyLock::new(|| key_of("none"));

/// Histogram buckets for durations in seconds: 1 ms to 30 s.
pub const SECONDS_BUCKETS: [f64; 14] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// How long a gauge may go without an update before the exporter drops it: top-N session
/// gauges of a session that left the top N disappear after this.
pub const GAUGE_IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// A `metrics-exporter-prometheus` builder set up for stormgate's dashboards: real histograms
/// (with [`SECONDS_BUCKETS`]) for every `*_seconds` metric, and gauges dropped after
/// [`GAUGE_IDLE_TIMEOUT`] without an update. Feature `prometheus`.
///
/// ```
/// let handle = stormgate::metrics::prometheus_builder().build_recorder().handle();
/// assert!(handle.render().is_empty());
/// ```
#[cfg(feature = "prometheus")]
pub fn prometheus_builder() -> PrometheusBuilder {
    PrometheusBuilder::new()
        .set_buckets_for_metric(
            metrics_exporter_prometheus::Matcher::Suffix("_seconds".into()),
            &SECONDS_BUCKETS,
        )
        .expect("buckets are not empty")
        .idle_timeout(
            metrics_util::MetricKindMask::GAUGE,
            Some(GAUGE_IDLE_TIMEOUT),
        )
}

/// `stormgate_messages_total` by message kind, each handle resolved when first used (so it
/// belongs to the recorder installed then, as [`CallMetrics`]' handles do): counting a
/// classified message is one increment, not a lookup in the recorder's registry.
#[derive(Debug, Default)]
pub(crate) struct MessageCounts([OnceLock<Counter>; 4]);

impl MessageCounts {
    /// Counts one message of `kind`.
    pub(crate) fn count(&self, kind: CallKind) {
        self.0[kind as usize]
            .get_or_init(|| ::metrics::counter!(MESSAGES, "kind" => kind.as_str()))
            .increment(1);
    }
}

/// A stage's counter of the calls it refused, by reason (`reason` label, as
/// `stormgate_budget_rejected_total` has) or in one series, each handle resolved when first
/// used (so it belongs to the recorder installed then): counting a refusal is one increment,
/// not a look-up in the recorder's registry, on a storm's path.
#[derive(Debug)]
pub(crate) struct RefusalCounts {
    name: &'static str,
    by_reason: bool,
    counters: [OnceLock<Counter>; Reason::ALL.len()],
}

impl RefusalCounts {
    /// `name` by the refusal's reason.
    pub(crate) fn by_reason(name: &'static str) -> Self {
        RefusalCounts {
            name,
            by_reason: true,
            counters: Default::default(),
        }
    }

    /// `name`, one series for every reason.
    pub(crate) fn total(name: &'static str) -> Self {
        RefusalCounts {
            by_reason: false,
            ..Self::by_reason(name)
        }
    }

    /// Counts one refusal for `reason`.
    pub(crate) fn count(&self, reason: Reason) {
        let at = if self.by_reason { index(reason) } else { 0 };
        self.counters[at]
            .get_or_init(|| {
                if self.by_reason {
                    ::metrics::counter!(self.name, "reason" => reason.as_str())
                } else {
                    ::metrics::counter!(self.name)
                }
            })
            .increment(1);
    }
}

/// `reason`'s place in [`Reason::ALL`].
fn index(reason: Reason) -> usize {
    Reason::ALL.iter().position(|&r| r == reason).unwrap_or(0)
}

/// The observer that counts calls by tenant, tool and result, times them per tool, and counts
/// refusals by reason, scope, tenant and tool. Give it to both the
/// [`OutcomeLayer`](crate::outcome::OutcomeLayer) and the
/// [`ClassifyLayer`](crate::classify::ClassifyLayer::observers) (the
/// [`Control`](crate::control::Control) does), with the stack's [`Labels`].
///
/// The metric handles of each (tenant label, tool label) pair are resolved once, when a call
/// of the pair first finishes or is refused, and kept (at most [`MAX_LABEL_PAIRS`] pairs; past
/// them a call's handles are resolved for it alone): so they belong to the recorder installed
/// then. The pairs are of capped labels, so their number is bounded by the label caps,
/// whatever names clients send. A pair is kept under its labels' keys, which are the keys of
/// the names they label, so a call whose tenant and tool are both labelled finds its handles
/// in one lookup, by the keys it carries; only a call with a name past a cap (`other`) looks
/// its labels up first.
#[derive(Clone)]
pub struct CallMetrics {
    labels: Arc<Labels>,
    pairs: Arc<Bounded<Arc<PairHandles>>>,
    /// `stormgate_outcomes_total` by outcome, each resolved when first used.
    outcomes: Arc<[OnceLock<Counter>; Outcome::COUNT]>,
}

/// The most (tenant label, tool label) pairs whose call metric handles one [`CallMetrics`]
/// keeps.
pub const MAX_LABEL_PAIRS: usize = 65_536;

/// One (tenant label, tool label) pair's handles, each resolved when first used (so a scrape
/// shows the series that happened, as without the cache).
struct PairHandles {
    tenant: SharedString,
    tool: SharedString,
    /// `stormgate_calls_total` by result: each [`Outcome`] at its [`index`](Outcome::index),
    /// then `rejected`.
    calls: [OnceLock<Counter>; Outcome::COUNT + 1],
    /// `stormgate_service_time_seconds` of the tool.
    service_time: OnceLock<Histogram>,
    /// `stormgate_rejected_total` by reason and scope (at [`refusal`]'s place), made at the
    /// pair's first refusal: most pairs are never refused.
    refusals: OnceLock<Box<[OnceLock<Counter>]>>,
}

/// Scopes a refusal can name: [`Scope`]'s variants, `Resource` the last.
const SCOPES: usize = Scope::Resource as usize + 1;

/// The place of a refusal's (reason, scope) in [`PairHandles::refusals`].
fn refusal(r: &Rejection) -> usize {
    index(r.reason()) * SCOPES + r.scope() as usize
}

/// The place of `result="rejected"` in [`PairHandles::calls`].
const REJECTED_RESULT: usize = Outcome::COUNT;

impl PairHandles {
    fn new(tenant: SharedString, tool: SharedString) -> Self {
        PairHandles {
            tenant,
            tool,
            calls: Default::default(),
            service_time: OnceLock::new(),
            refusals: OnceLock::new(),
        }
    }

    /// Counts one call of the pair with result `index`.
    fn count(&self, index: usize) {
        self.calls[index]
            .get_or_init(|| {
                let result = Outcome::ALL.get(index).map_or("rejected", |o| o.as_str());
                ::metrics::counter!(
                    CALLS,
                    "tenant" => self.tenant.clone(),
                    "tool" => self.tool.clone(),
                    "result" => result,
                )
            })
            .increment(1);
    }

    fn service_time(&self) -> &Histogram {
        self.service_time
            .get_or_init(|| ::metrics::histogram!(SERVICE_TIME, "tool" => self.tool.clone()))
    }

    /// Counts one refusal of a call of the pair.
    fn refused(&self, r: &Rejection) {
        self.refusals.get_or_init(|| {
            (0..Reason::ALL.len() * SCOPES)
                .map(|_| OnceLock::new())
                .collect()
        })[refusal(r)]
        .get_or_init(|| {
            ::metrics::counter!(
                REJECTED,
                "reason" => r.reason().as_str(),
                "scope" => r.scope().as_str(),
                "tenant" => self.tenant.clone(),
                "tool" => self.tool.clone(),
            )
        })
        .increment(1);
    }
}

impl std::fmt::Debug for CallMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CallMetrics")
            .field("labels", &self.labels)
            .field("pairs", &self.pairs.len())
            .finish()
    }
}

impl Default for CallMetrics {
    fn default() -> Self {
        CallMetrics::new(Arc::default())
    }
}

impl CallMetrics {
    /// Counting with these label caps.
    pub fn new(labels: Arc<Labels>) -> Self {
        CallMetrics {
            labels,
            pairs: Arc::new(Bounded::new()),
            outcomes: Arc::default(),
        }
    }

    /// The handles of `call`'s (tenant, tool) labels.
    fn pair(&self, call: &Call) -> Arc<PairHandles> {
        // A labelled name's label key is its own key: a pair of labelled names is found by
        // the call's keys, without a look at the labels.
        let tool_key = call.target_name().map_or_else(|| *NONE_KEY, |t| t.key());
        if let Some(kept) = self
            .pairs
            .get(self.pairs.key(&(call.tenant.key(), tool_key)))
        {
            return kept;
        }
        let (tenant, tenant_key) = self.labels.tenant_of(&call.tenant);
        let (tool, tool_key) = self.labels.tool_of(call.target_name());
        // The pair of labels, by their keys (a label's key is its text's).
        let key = self.pairs.key(&(tenant_key, tool_key));
        let make = || Arc::new(PairHandles::new(tenant.clone(), tool.clone()));
        self.pairs
            .get_or_insert(key, MAX_LABEL_PAIRS, make)
            .unwrap_or_else(make)
    }
}

impl Observer for CallMetrics {
    fn observe(&self, o: &Observation<'_>) {
        self.outcomes[o.outcome.index()]
            .get_or_init(|| ::metrics::counter!(OUTCOMES, "outcome" => o.outcome.as_str()))
            .increment(1);
        let pair = self.pair(o.call);
        pair.count(o.outcome.index());
        pair.service_time().record(o.service_time.as_secs_f64());
    }

    fn refused(&self, call: &Call, r: &Rejection) {
        let pair = self.pair(call);
        pair.count(REJECTED_RESULT);
        pair.refused(r);
    }
}

#[cfg(all(test, feature = "prometheus"))]
mod tests {
    use super::*;

    /// What a fresh Prometheus recorder renders after `f` ran with it installed.
    fn scrape_of(f: impl FnOnce()) -> String {
        let recorder = prometheus_builder().build_recorder();
        let handle = recorder.handle();
        ::metrics::with_local_recorder(&recorder, f);
        handle.render()
    }

    fn assert_series(scrape: &str, lines: &[&str]) {
        for line in lines {
            assert!(scrape.contains(line), "{line} in\n{scrape}");
        }
    }

    /// A `tools/call` of `tool` by `tenant`.
    fn call(tenant: &str, tool: &str) -> Call {
        Call::request("tools/call")
            .with_tool(tool)
            .with_tenant(crate::Tenant::new(tenant))
    }

    /// `call` finished with `outcome`, as the outcome layer tells its observers.
    fn finished(call: &Call, outcome: Outcome) -> Observation<'_> {
        Observation {
            call,
            outcome,
            service_time: Duration::from_millis(1),
            response_bytes: 0,
            queue_wait: Duration::ZERO,
            at: tokio::time::Instant::now(),
        }
    }

    #[test]
    fn call_metrics_resolve_each_label_pair_once_and_count_every_call() {
        let mut pairs = 0;
        let scrape = scrape_of(|| {
            let metrics = CallMetrics::new(Arc::new(Labels::with_caps(2, 2)));
            for tenant in 0..50 {
                for tool in 0..50 {
                    let call = call(&format!("n{tenant}"), &format!("t{tool}"));
                    let outcome = if tool == 0 {
                        Outcome::Error
                    } else {
                        Outcome::Ok
                    };
                    metrics.observe(&finished(&call, outcome));
                }
            }
            pairs = metrics.pairs.len();
        });
        // Two labelled tenants and `other`, two labelled tools and `other`: nine pairs,
        // however many names came.
        assert_eq!(pairs, 9);
        assert_series(
            &scrape,
            &[
                r#"stormgate_calls_total{tenant="other",tool="other",result="ok"} 2304"#,
                r#"stormgate_calls_total{tenant="n0",tool="t0",result="error"} 1"#,
                r#"stormgate_calls_total{tenant="n0",tool="other",result="ok"} 48"#,
                r#"stormgate_outcomes_total{outcome="ok"} 2450"#,
                r#"stormgate_outcomes_total{outcome="error"} 50"#,
                r#"stormgate_service_time_seconds_count{tool="other"} 2400"#,
            ],
        );
        // Only the results that happened are series.
        assert!(!scrape.contains(r#"tool="t1",result="error""#), "{scrape}");
        assert!(!scrape.contains(r#"outcome="timeout""#), "{scrape}");
    }

    #[test]
    fn refusals_are_counted_by_reason_scope_tenant_and_tool() {
        let scrape = scrape_of(|| {
            let metrics = CallMetrics::new(Arc::new(Labels::with_caps(1, 10)));
            let storm = Rejection::new(
                Reason::SessionStorm,
                Scope::AgentSession,
                Duration::from_secs(1),
            );
            let full = Rejection::new(Reason::QueueFull, Scope::Resource, Duration::ZERO);
            for _ in 0..3 {
                metrics.refused(&call("a", "search"), &storm);
            }
            metrics.refused(&call("a", "search"), &full);
            metrics.refused(&call("a", "scan"), &full);
            // Past the tenant cap: `other`, as many tenants as come.
            metrics.refused(&call("b", "search"), &storm);
            metrics.refused(&call("c", "search"), &storm);
        });
        assert_series(
            &scrape,
            &[
                r#"stormgate_rejected_total{reason="session_storm",scope="agent_session",tenant="a",tool="search"} 3"#,
                r#"stormgate_rejected_total{reason="queue_full",scope="resource",tenant="a",tool="search"} 1"#,
                r#"stormgate_rejected_total{reason="queue_full",scope="resource",tenant="a",tool="scan"} 1"#,
                r#"stormgate_rejected_total{reason="session_storm",scope="agent_session",tenant="other",tool="search"} 2"#,
                r#"stormgate_calls_total{tenant="a",tool="search",result="rejected"} 4"#,
                r#"stormgate_calls_total{tenant="other",tool="search",result="rejected"} 2"#,
            ],
        );
    }

    #[test]
    fn a_stages_refusals_are_counted_by_reason_or_in_one_series() {
        let scrape = scrape_of(|| {
            let by_reason = RefusalCounts::by_reason(BUDGET_REJECTED);
            let total = RefusalCounts::total(SESSION_REJECTED);
            for reason in [
                Reason::GlobalBudgetExceeded,
                Reason::GlobalBudgetExceeded,
                Reason::TenantBudgetExceeded,
            ] {
                by_reason.count(reason);
                total.count(reason);
            }
            total.count(Reason::SessionStorm);
        });
        assert_series(
            &scrape,
            &[
                r#"stormgate_budget_rejected_total{reason="global_budget_exceeded"} 2"#,
                r#"stormgate_budget_rejected_total{reason="tenant_budget_exceeded"} 1"#,
                "stormgate_session_rejected_total 4",
            ],
        );
    }

    #[test]
    fn every_reason_and_scope_has_a_refusal_counter_of_its_own() {
        let scopes = [
            Scope::Global,
            Scope::Tenant,
            Scope::AgentSession,
            Scope::Tool,
            Scope::Resource,
        ];
        let mut places = std::collections::HashSet::new();
        for reason in Reason::ALL {
            for scope in scopes {
                let at = refusal(&Rejection::new(reason, scope, Duration::ZERO));
                assert!(at < Reason::ALL.len() * SCOPES, "{reason:?} {scope:?}");
                assert!(places.insert(at), "{reason:?} {scope:?} shares a place");
            }
        }
    }

    #[test]
    fn a_name_past_a_cap_gets_its_label_once_the_cap_is_raised() {
        let scrape = scrape_of(|| {
            let labels = Arc::new(Labels::with_caps(1, 1));
            let metrics = CallMetrics::new(labels.clone());
            let observe = |tenant| metrics.observe(&finished(&call(tenant, "search"), Outcome::Ok));
            observe("a");
            observe("b");
            labels.set_caps(2, 1);
            observe("b");
            observe("b");
        });
        assert_series(
            &scrape,
            &[
                r#"stormgate_calls_total{tenant="a",tool="search",result="ok"} 1"#,
                r#"stormgate_calls_total{tenant="other",tool="search",result="ok"} 1"#,
                r#"stormgate_calls_total{tenant="b",tool="search",result="ok"} 2"#,
            ],
        );
    }

    #[test]
    fn labels_past_the_cap_are_other() {
        let cap = Cap::new();
        cap.max.store(2, Ordering::Relaxed);
        assert_eq!(&*cap.label("a"), "a");
        assert_eq!(&*cap.label("b"), "b");
        assert_eq!(&*cap.label("c"), OTHER);
        assert_eq!(&*cap.label("a"), "a", "values seen before keep their label");
    }

    #[test]
    fn long_values_are_other_and_not_stored() {
        let cap = Cap::new();
        let long = "x".repeat(MAX_LABEL_LEN + 1);
        assert_eq!(&*cap.label(&long), OTHER);
        assert_eq!(&*cap.label(&"y".repeat(1 << 20)), OTHER);
        assert!(cap.seen.is_empty(), "nothing kept");
        let fits = "z".repeat(MAX_LABEL_LEN);
        assert_eq!(&*cap.label(&fits), fits);
    }
}

#[cfg(test)]
mod labels_tests {
    use super::*;

    #[test]
    fn two_stacks_keep_their_own_caps() {
        let narrow = Labels::with_caps(1, 1);
        let wide = Labels::default();
        for t in ["a", "b", "c"] {
            wide.tool(Some(t));
        }
        assert_eq!(&*narrow.tool(Some("a")), "a");
        assert_eq!(&*narrow.tool(Some("b")), OTHER);
        assert_eq!(
            &*wide.tool(Some("c")),
            "c",
            "the other stack's cap is its own"
        );
        assert_eq!(&*wide.tenant("t1"), "t1");
        assert_eq!(&*narrow.tenant("t1"), "t1");
        assert_eq!(&*narrow.tenant("t2"), OTHER);
    }
}

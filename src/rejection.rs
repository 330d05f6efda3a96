//! The one rejection every stormgate layer returns, and how it is rendered.
//!
//! A [`Rejection`] says *why* a call was refused ([`Reason`]), *whose* limit refused it
//! ([`Scope`]), *when* to come back (`retry_after`, computed from the state that refused,
//! never a constant) and how long the call had already waited in a queue. The
//! [`RejectionFormat`] says how it is written on the wire; it is set once, on the
//! [`ClassifyLayer`](crate::classify::ClassifyLayer), and every layer below renders with it.
//!
//! # The wire form
//!
//! ```json
//! {"jsonrpc":"2.0","id":7,"error":{"code":-32029,
//!  "message":"rate limited: retry after 1200 ms (session budget exceeded)",
//!  "data":{"retry_after_ms":1200,"retryAfterMs":1200,"notProcessed":true,
//!          "reason":"session_budget_exceeded","scope":"agent_session","retryable":true,
//!          "queue_wait_ms":0}}}
//! ```
//!
//! HTTP 200, `Content-Type: application/json`, `Retry-After` in whole seconds rounded up.
//! Requests that declare `MCP-Protocol-Version` 2026-07-28 or later (a revision that reserves
//! -32020..-32099 for its own codes) get [`RejectionFormat::modern_code`] instead (429 by
//! default).
//!
//! # Map from other limiters' error codes
//!
//! The codes other outbound rate limiters (`RATE_LIMIT_*`) and model gateways (`MODEL_*`) give
//! these conditions, and the [`Reason`] and scope stormgate gives each:
//!
//! | code or condition | [`Reason`] | scope |
//! |---|---|---|
//! | `RATE_LIMIT_QUEUE_FULL` | `queue_full` | resource |
//! | `RATE_LIMIT_QUEUE_TIMEOUT` | `queue_timeout` | resource |
//! | `RATE_LIMITED` (upstream 429) / `MODEL_RATE_LIMITED` | `upstream_rate_limited` | resource |
//! | `TIMEOUT` / `MODEL_TIMEOUT` | `deadline_exceeded` | tool |
//! | `CANCELLED` | none: the caller went away, nobody is answered | |
//! | `MODEL_BUSY` (bulkhead full) | `concurrency_limited` | tool |
//! | `MODEL_CIRCUIT_OPEN` | `circuit_open` | tool |
//! | `rate_limited` with `global_budget_exceeded` | `global_budget_exceeded` | global |
//! | per-tenant budget | `tenant_budget_exceeded` | tenant |
//! | per-session budget | `session_budget_exceeded` | agent_session |
//! | kill switch in fixed mode | `fixed_limit_exceeded` | the fixed limit's scope |
//! | shared budget's Redis unreachable, `on_failure = "closed"` | `shared_budget_unavailable` | global |

use std::fmt;
use std::time::Duration;

use http::StatusCode;

use crate::error::ConfigError;
use serde::{Deserialize, Serialize};

/// The JSON-RPC error code for a rejection under MCP revisions before 2026-07-28.
pub const RATE_LIMITED_CODE: i64 = -32029;
/// The default code under MCP 2026-07-28 and later, outside its reserved -32020..-32099.
pub const MODERN_RATE_LIMITED_CODE: i64 = 429;
/// The default [`RejectionFormat::message`]: hosts often show only `error.message` (or the
/// first text block of a tool result), so the retry hint is in the words.
pub const DEFAULT_MESSAGE: &str = "rate limited: retry after {retry_after_ms} ms ({reason})";

/// The placeholders a [`RejectionFormat::message`] may use.
pub const MESSAGE_PLACEHOLDERS: [&str; 5] = [
    "retry_after_ms",
    "retry_after_s",
    "reason",
    "reason_code",
    "scope",
];

/// Why a call was refused: a stable snake_case vocabulary, serialized as such.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Reason {
    /// The resource's wait queue was full (other limiters' `RATE_LIMIT_QUEUE_FULL`).
    QueueFull,
    /// The call waited in the resource's queue longer than its queue timeout
    /// (other limiters' `RATE_LIMIT_QUEUE_TIMEOUT`).
    QueueTimeout,
    /// The upstream answered 429 and the resource is cooling down (other limiters'
    /// `RATE_LIMITED`).
    UpstreamRateLimited,
    /// The adaptive global budget is spent.
    GlobalBudgetExceeded,
    /// The tenant's share of the budget is spent.
    TenantBudgetExceeded,
    /// The agent session's budget is spent.
    SessionBudgetExceeded,
    /// The session's storm score (its errors, slowness and diversity) cut its budget, and the
    /// cut budget is spent.
    SessionStorm,
    /// A new session's calls came faster than what probation lends a new identity (its
    /// bucket refills at a share of the budget until it has healthy calls behind it).
    SessionProbation,
    /// A fixed limit of the kill switch's `fixed` mode is reached.
    FixedLimitExceeded,
    /// Too many calls are running at once (a model gateway's `MODEL_BUSY`).
    ConcurrencyLimited,
    /// The tool's circuit breaker is open (a model gateway's `MODEL_CIRCUIT_OPEN`).
    CircuitOpen,
    /// The call's whole-round deadline passed (other limiters' `TIMEOUT`, a model gateway's
    /// `MODEL_TIMEOUT`).
    DeadlineExceeded,
    /// The cluster's shared budget cannot be reached (Redis does not answer) and the
    /// configured failure mode is `closed` (feature `redis`).
    SharedBudgetUnavailable,
}

impl Reason {
    /// Every reason, in declaration order.
    pub const ALL: [Reason; 13] = [
        Reason::QueueFull,
        Reason::QueueTimeout,
        Reason::UpstreamRateLimited,
        Reason::GlobalBudgetExceeded,
        Reason::TenantBudgetExceeded,
        Reason::SessionBudgetExceeded,
        Reason::SessionStorm,
        Reason::SessionProbation,
        Reason::FixedLimitExceeded,
        Reason::ConcurrencyLimited,
        Reason::CircuitOpen,
        Reason::DeadlineExceeded,
        Reason::SharedBudgetUnavailable,
    ];

    /// The snake_case name written in `data.reason`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Reason::QueueFull => "queue_full",
            Reason::QueueTimeout => "queue_timeout",
            Reason::UpstreamRateLimited => "upstream_rate_limited",
            Reason::GlobalBudgetExceeded => "global_budget_exceeded",
            Reason::TenantBudgetExceeded => "tenant_budget_exceeded",
            Reason::SessionBudgetExceeded => "session_budget_exceeded",
            Reason::SessionStorm => "session_storm",
            Reason::SessionProbation => "session_probation",
            Reason::FixedLimitExceeded => "fixed_limit_exceeded",
            Reason::ConcurrencyLimited => "concurrency_limited",
            Reason::CircuitOpen => "circuit_open",
            Reason::DeadlineExceeded => "deadline_exceeded",
            Reason::SharedBudgetUnavailable => "shared_budget_unavailable",
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Whose limit refused the call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Scope {
    /// The budget shared by everyone.
    Global,
    /// One tenant's share.
    Tenant,
    /// One agent session.
    AgentSession,
    /// One tool.
    Tool,
    /// One resource key (a FIFO limiter's queue, an upstream host).
    Resource,
}

impl Scope {
    /// The snake_case name written in `data.scope`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Scope::Global => "global",
            Scope::Tenant => "tenant",
            Scope::AgentSession => "agent_session",
            Scope::Tool => "tool",
            Scope::Resource => "resource",
        }
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A refused call: the value every stormgate layer returns instead of calling its inner service.
///
/// ```
/// use std::time::Duration;
/// use stormgate::{Reason, Rejection, Scope};
///
/// let r = Rejection::new(Reason::QueueFull, Scope::Resource, Duration::from_millis(1200));
/// assert_eq!(r.retry_after_secs(), 2); // rounded up: waiting 2 s is always enough
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    reason: Reason,
    scope: Scope,
    retry_after: Duration,
    queue_wait: Duration,
    retryable: bool,
}

impl Rejection {
    /// A retryable rejection that did not wait in any queue.
    pub fn new(reason: Reason, scope: Scope, retry_after: Duration) -> Self {
        Rejection {
            reason,
            scope,
            retry_after,
            queue_wait: Duration::ZERO,
            retryable: true,
        }
    }

    /// Records how long the call waited in a queue before it was refused.
    pub fn with_queue_wait(mut self, queue_wait: Duration) -> Self {
        self.queue_wait = queue_wait;
        self
    }

    /// Marks whether retrying can succeed (`data.retryable`, true by default).
    pub fn with_retryable(mut self, retryable: bool) -> Self {
        self.retryable = retryable;
        self
    }

    /// Why the call was refused.
    pub fn reason(&self) -> Reason {
        self.reason
    }

    /// Whose limit refused it.
    pub fn scope(&self) -> Scope {
        self.scope
    }

    /// How long to wait before retrying.
    pub fn retry_after(&self) -> Duration {
        self.retry_after
    }

    /// How long the call waited in a queue before it was refused.
    pub fn queue_wait(&self) -> Duration {
        self.queue_wait
    }

    /// Whether retrying can succeed.
    pub fn retryable(&self) -> bool {
        self.retryable
    }

    /// `retry_after` in whole milliseconds, rounded up, as written in `data.retry_after_ms`.
    pub fn retry_after_ms(&self) -> u64 {
        ceil_div(self.retry_after.as_nanos(), 1_000_000)
    }

    /// `retry_after` in whole seconds, rounded up, as written in the `Retry-After` header: a
    /// client that waits exactly this long is not refused again for the same reason.
    pub fn retry_after_secs(&self) -> u64 {
        ceil_div(self.retry_after.as_nanos(), 1_000_000_000)
    }

    /// `queue_wait` in whole milliseconds, rounded down.
    pub fn queue_wait_ms(&self) -> u64 {
        u64::try_from(self.queue_wait.as_millis()).unwrap_or(u64::MAX)
    }

    /// The message in the default template ([`DEFAULT_MESSAGE`]):
    /// `rate limited: retry after 1200 ms (session budget exceeded)`.
    pub fn message(&self) -> String {
        self.message_in(DEFAULT_MESSAGE)
    }

    /// The message in `template` (validated by [`RejectionFormat::validate`]): `{retry_after_ms}`,
    /// `{retry_after_s}` (whole seconds, rounded up), `{reason}` (in words: `session budget
    /// exceeded`), `{reason_code}` (`session_budget_exceeded`), `{scope}`; `{{` and `}}` are
    /// literal braces.
    pub fn message_in(&self, template: &str) -> String {
        let mut out = String::with_capacity(template.len() + 32);
        // A template that breaks a rule was refused by `validate`; here it renders as far as
        // it can.
        let _ = render(template, &mut out, |name, out| {
            use std::fmt::Write;
            let _ = match name {
                "retry_after_ms" => write!(out, "{}", self.retry_after_ms()),
                "retry_after_s" => write!(out, "{}", self.retry_after_secs()),
                "reason" => {
                    out.extend(
                        self.reason
                            .as_str()
                            .chars()
                            .map(|c| if c == '_' { ' ' } else { c }),
                    );
                    Ok(())
                }
                "reason_code" => out.write_str(self.reason.as_str()),
                "scope" => out.write_str(self.scope.as_str()),
                _ => Ok(()),
            };
            true
        });
        out
    }

    /// The `error.data` / `structuredContent` object.
    pub(crate) fn data(&self) -> RejectionData {
        RejectionData {
            retry_after_ms: self.retry_after_ms(),
            retry_after_ms_camel: self.retry_after_ms(),
            not_processed: true,
            reason: self.reason,
            scope: self.scope,
            retryable: self.retryable,
            queue_wait_ms: self.queue_wait_ms(),
        }
    }
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "rate limited ({}, scope {}): retry after {} ms",
            self.reason,
            self.scope,
            self.retry_after_ms()
        )
    }
}

impl std::error::Error for Rejection {}

fn ceil_div(n: u128, d: u128) -> u64 {
    u64::try_from(n.div_ceil(d)).unwrap_or(u64::MAX)
}

/// Walks `template`, copying text to `out` and calling `field` for each `{name}`; `{{` and
/// `}}` are literal braces. Stops with the `rejection.message` error at the first malformed
/// brace or a name `field` rejects (returns false).
fn render(
    template: &str,
    out: &mut String,
    mut field: impl FnMut(&str, &mut String) -> bool,
) -> Result<(), ConfigError> {
    let broken = |rule: String| {
        let names = MESSAGE_PLACEHOLDERS.map(|p| format!("{{{p}}}")).join(", ");
        ConfigError::new(
            "rejection.message",
            format!("{rule} (placeholders: {names})"),
        )
    };
    let mut rest = template;
    while let Some(i) = rest.find(['{', '}']) {
        out.push_str(&rest[..i]);
        let tail = &rest[i..];
        if let Some(t) = tail.strip_prefix("{{").or_else(|| tail.strip_prefix("}}")) {
            out.push_str(&tail[..1]);
            rest = t;
            continue;
        }
        let close = match tail.strip_prefix('{').and_then(|t| t.find('}')) {
            Some(close) => close,
            None => {
                return Err(broken(format!(
                    "unmatched {:?} at byte {}",
                    &tail[..1],
                    template.len() - tail.len()
                )));
            }
        };
        let name = &tail[1..=close];
        if !field(name, out) {
            return Err(broken(format!("unknown placeholder {{{name}}}")));
        }
        rest = &tail[close + 2..];
    }
    out.push_str(rest);
    Ok(())
}

/// The serialized `data` of a rejection.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct RejectionData {
    pub(crate) retry_after_ms: u64,
    /// The same value under the MCP rate-limit proposal's name.
    #[serde(rename = "retryAfterMs")]
    pub(crate) retry_after_ms_camel: u64,
    /// The call never ran (nothing half-executed).
    #[serde(rename = "notProcessed")]
    pub(crate) not_processed: bool,
    pub(crate) reason: Reason,
    pub(crate) scope: Scope,
    pub(crate) retryable: bool,
    pub(crate) queue_wait_ms: u64,
}

/// How rejections are written on the wire. Set once on the classify layer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct RejectionFormat {
    /// JSON-RPC error code for requests under MCP revisions before 2026-07-28.
    /// Default -32029.
    pub code: i64,
    /// JSON-RPC error code for requests declaring `MCP-Protocol-Version` 2026-07-28 or later,
    /// which reserves -32020..-32099. Default 429.
    pub modern_code: i64,
    /// Answer a rejected `tools/call` as a tool result with `isError: true`, a text and the
    /// rejection data in `structuredContent`, for clients that treat JSON-RPC errors as fatal.
    /// Default false.
    pub tool_result: bool,
    /// HTTP status of a rejection of a request that is not MCP (no JSON-RPC body to answer in).
    /// Default 429.
    #[serde(with = "status_code")]
    pub non_mcp_status: StatusCode,
    /// The `error.message` (and the tool-result form's text) template; see
    /// [`Rejection::message_in`]. Default [`DEFAULT_MESSAGE`].
    pub message: String,
}

impl RejectionFormat {
    /// Checks the message template; the error names the field and the rule.
    pub fn validate(&self) -> Result<(), ConfigError> {
        render(&self.message, &mut String::new(), |name, _| {
            MESSAGE_PLACEHOLDERS.contains(&name)
        })
    }
}

impl Default for RejectionFormat {
    fn default() -> Self {
        RejectionFormat {
            code: RATE_LIMITED_CODE,
            modern_code: MODERN_RATE_LIMITED_CODE,
            tool_result: false,
            non_mcp_status: StatusCode::TOO_MANY_REQUESTS,
            message: DEFAULT_MESSAGE.to_owned(),
        }
    }
}

mod status_code {
    use http::StatusCode;
    use serde::{Deserialize, Deserializer, Serializer, de::Error};

    pub(super) fn serialize<S: Serializer>(s: &StatusCode, ser: S) -> Result<S::Ok, S::Error> {
        ser.serialize_u16(s.as_u16())
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(de: D) -> Result<StatusCode, D::Error> {
        let n = u16::deserialize(de)?;
        StatusCode::from_u16(n).map_err(|_| D::Error::custom("not an HTTP status code"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounding_is_up() {
        let r = |ms| {
            Rejection::new(
                Reason::QueueFull,
                Scope::Resource,
                Duration::from_millis(ms),
            )
        };
        assert_eq!(r(0).retry_after_secs(), 0);
        assert_eq!(r(1).retry_after_secs(), 1);
        assert_eq!(r(1000).retry_after_secs(), 1);
        assert_eq!(r(1001).retry_after_secs(), 2);
        let micro = Rejection::new(
            Reason::QueueFull,
            Scope::Resource,
            Duration::from_micros(1500),
        );
        assert_eq!(micro.retry_after_ms(), 2);
    }

    #[test]
    fn reason_names_match_serde() {
        for reason in Reason::ALL {
            let json = serde_json::to_string(&reason).unwrap();
            assert_eq!(json, format!("\"{}\"", reason.as_str()));
        }
        assert_eq!(
            serde_json::to_string(&Scope::AgentSession).unwrap(),
            "\"agent_session\""
        );
    }

    #[test]
    fn tool_result_text() {
        let r = Rejection::new(
            Reason::SessionBudgetExceeded,
            Scope::AgentSession,
            Duration::from_millis(1200),
        );
        assert_eq!(
            r.message(),
            "rate limited: retry after 1200 ms (session budget exceeded)"
        );
        assert_eq!(
            r.message_in("{{{reason_code}}} {scope}: back in {retry_after_s} s"),
            "{session_budget_exceeded} agent_session: back in 2 s"
        );
    }

    #[test]
    fn a_bad_template_names_the_field() {
        for bad in ["{retry}", "retry after {retry_after_ms", "oops }", "{}"] {
            let format = RejectionFormat {
                message: bad.into(),
                ..RejectionFormat::default()
            };
            let err = format.validate().unwrap_err();
            assert_eq!(err.field, "rejection.message", "{bad}: {err}");
        }
        assert!(RejectionFormat::default().validate().is_ok());
    }
}

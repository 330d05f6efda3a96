//! One configuration for the whole stack, validated as a whole.

use crate::error::ConfigError;
#[cfg(any(feature = "toml", test))]
use crate::error::ControlError;
use serde::{Deserialize, Serialize};
use std::num::NonZeroUsize;

use super::{Features, FixedLimits, Mode, Off, Policy};
use crate::breaker::BreakerConfig;
use crate::budget::{BudgetConfig, TenantConfig};
use crate::classify::DeadlineConfig;
use crate::classify::{ClassifyConfig, DEFAULT_BODY_LIMIT};
use crate::cost::CostConfig;
use crate::distributed::DistributedConfig;
use crate::entropy::SessionConfig;
use crate::fifo::FifoConfig;
use crate::gateway::GatewayConfig;
use crate::idempotency::IdempotencyConfig;
use crate::rejection::RejectionFormat;

/// The error of a document's deserializer, as the rule a field breaks.
#[cfg(any(feature = "toml", test))]
pub(crate) trait DocumentError: Into<ControlError> {
    /// What the value breaks, without where in the text it is.
    fn rule(&self) -> String;
}

#[cfg(feature = "toml")]
impl DocumentError for toml::de::Error {
    fn rule(&self) -> String {
        self.message().to_owned()
    }
}

#[cfg(any(feature = "toml", test))]
impl DocumentError for serde_json::Error {
    fn rule(&self) -> String {
        let text = self.to_string();
        match self.line() {
            0 => text,
            line => {
                let at = format!(" at line {line} column {}", self.column());
                text.strip_suffix(&at).unwrap_or(&text).to_owned()
            }
        }
    }
}

/// The longest field path and rule a document's error keeps, in bytes.
#[cfg(any(feature = "toml", test))]
const MAX_FIELD: usize = 256;
#[cfg(any(feature = "toml", test))]
const MAX_RULE: usize = 512;

/// `text` cut to at most `max` bytes (at a character boundary), marked `...` where cut.
#[cfg(any(feature = "toml", test))]
fn cut(mut text: String, max: usize) -> String {
    if text.len() > max {
        let end = (0..=max)
            .rev()
            .find(|&i| text.is_char_boundary(i))
            .unwrap_or(0);
        text.truncate(end);
        text.push_str("...");
    }
    text
}

/// Every parameter of every stage (TOML file, or built in code). Each section has its
/// documented defaults; absent optional limits mean that dimension is off.
///
/// ```
/// use stormgate::control::{Config, Mode};
///
/// let config = Config::from_toml(r#"
///     mode = "fixed"
///     [fixed]
///     global_rate = 500.0
///     [budget]
///     stable_budget = 2000.0
/// "#).unwrap();
/// assert_eq!(config.mode, Mode::Fixed);
/// let err = Config::from_toml("[budget]\nalpha = 2.0\n").unwrap_err();
/// assert_eq!(err.to_string(), "budget.alpha: must be in (0, 1]");
/// assert_eq!(err.config_error().unwrap().field, "budget.alpha");
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct Config {
    /// The kill switch: `adaptive` (default), `fixed` or `off`.
    pub mode: Mode,
    /// What `off` does: `measure` (default: every stage runs and refuses nothing) or
    /// `pass_through` (the stack steps aside whole).
    pub off: Off,
    /// One switch per feature.
    pub features: Features,
    /// The limits of fixed mode.
    pub fixed: FixedLimits,
    /// The largest request body read, bytes (default 4 MiB).
    pub body_limit: NonZeroUsize,
    /// The classifier: which JSON-RPC batches are classified.
    pub classify: ClassifyConfig,
    /// How rejections are written.
    pub rejection: RejectionFormat,
    /// The per-resource FIFO limiter.
    pub fifo: FifoConfig,
    /// The adaptive global budget.
    pub budget: BudgetConfig,
    /// Per-tenant shares.
    pub tenants: TenantConfig,
    /// Tool weights.
    pub costs: CostConfig,
    /// The session guard.
    pub sessions: SessionConfig,
    /// Per-tool circuit breakers.
    pub breaker: BreakerConfig,
    /// Idempotency keys for non-idempotent tools.
    pub idempotency: IdempotencyConfig,
    /// Whole-round deadlines per tool.
    pub deadlines: DeadlineConfig,
    /// How tenants and sessions are found.
    pub identity: IdentityConfig,
    /// Metric label bounds.
    pub metrics: MetricsConfig,
    /// The admin routes.
    pub admin: AdminConfig,
    /// The budget shared with the other nodes through Redis (feature `redis`); absent: this
    /// node's budget is its own. Read when the stack is built: a reload keeps the running
    /// connection and ignores changes to this section.
    pub distributed: Option<DistributedConfig>,
    /// The upstream of the `stormgate` gateway binary (see [`GatewayConfig`]); absent: not a
    /// gateway. Read when the proxy is built: a reload that changes it is refused (restart to
    /// change it), and one without it keeps the running one.
    pub gateway: Option<GatewayConfig>,
}

/// A configuration validated whole, with what the stages derive from it, ready to commit.
pub(crate) struct Prepared {
    pub(crate) config: Config,
    pub(crate) identity: crate::call::DefaultIdentity,
}

/// Reads a configuration file.
#[cfg(feature = "toml")]
pub(crate) fn read(path: &std::path::Path) -> Result<String, ControlError> {
    std::fs::read_to_string(path).map_err(|source| ControlError::Read {
        path: path.to_owned(),
        source,
    })
}

/// How tenants and sessions are found (see [`DefaultIdentity`](crate::call::DefaultIdentity)).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct IdentityConfig {
    /// Read the tenant from this header when no `Tenant` extension is set. Absent: not read
    /// (a client-chosen header is not trusted by default).
    pub tenant_header: Option<String>,
    /// Read the session from this `params._meta` key when there is no `Mcp-Session-Id` nor
    /// credential.
    pub session_meta_key: Option<String>,
    /// When there is no `Mcp-Session-Id`, the session is a keyed hash of this header's value
    /// (each agent's bearer token its own session, never kept in clear). Default
    /// `authorization`; `""`: credentials are not an identity.
    pub credential_header: String,
}

impl Default for IdentityConfig {
    fn default() -> Self {
        IdentityConfig {
            tenant_header: None,
            session_meta_key: None,
            credential_header: "authorization".into(),
        }
    }
}

impl IdentityConfig {
    /// The identity these settings describe.
    pub fn identity(&self) -> Result<crate::call::DefaultIdentity, ConfigError> {
        let mut id = crate::call::DefaultIdentity::new();
        if let Some(h) = &self.tenant_header {
            let name = http::HeaderName::from_bytes(h.as_bytes()).map_err(|_| {
                ConfigError::new(
                    "identity.tenant_header",
                    format!("{h:?} is not a header name"),
                )
            })?;
            id = id.tenant_header(name);
        }
        if let Some(k) = &self.session_meta_key {
            id = id.session_meta_key(k.clone());
        }
        let credential = match self.credential_header.as_str() {
            "" => None,
            h => Some(http::HeaderName::from_bytes(h.as_bytes()).map_err(|_| {
                ConfigError::new(
                    "identity.credential_header",
                    format!("{h:?} is not a header name"),
                )
            })?),
        };
        Ok(id.credential_header(credential))
    }
}

/// Bounds on metric labels.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct MetricsConfig {
    /// Distinct `tenant` label values before `other`. Default 100.
    pub max_tenant_labels: usize,
    /// Distinct `tool` label values before `other`. Default 100.
    pub max_tool_labels: usize,
}

impl Default for MetricsConfig {
    fn default() -> Self {
        MetricsConfig {
            max_tenant_labels: crate::metrics::DEFAULT_LABEL_CAP,
            max_tool_labels: crate::metrics::DEFAULT_LABEL_CAP,
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            mode: Mode::default(),
            off: Off::default(),
            features: Features::default(),
            fixed: FixedLimits::default(),
            body_limit: NonZeroUsize::new(DEFAULT_BODY_LIMIT).unwrap(),
            classify: ClassifyConfig::default(),
            rejection: RejectionFormat::default(),
            fifo: FifoConfig::default(),
            budget: BudgetConfig::default(),
            tenants: TenantConfig::default(),
            costs: CostConfig::default(),
            sessions: SessionConfig::default(),
            breaker: BreakerConfig::default(),
            idempotency: IdempotencyConfig::default(),
            deadlines: DeadlineConfig::default(),
            identity: IdentityConfig::default(),
            metrics: MetricsConfig::default(),
            admin: AdminConfig::default(),
            distributed: None,
            gateway: None,
        }
    }
}

/// The admin routes' settings. Without a token the routes are not served at all.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct AdminConfig {
    /// The bearer token, literally (never written back by `GET /config`).
    #[serde(skip_serializing)]
    pub token: Option<String>,
    /// The name of an environment variable holding the bearer token (used when `token` is
    /// absent).
    pub token_env: Option<String>,
}

impl AdminConfig {
    /// The token in effect, if any.
    pub fn token(&self) -> Option<String> {
        self.token
            .clone()
            .or_else(|| self.token_env.as_ref().and_then(|v| std::env::var(v).ok()))
            .filter(|t| !t.is_empty())
    }
}

impl Config {
    /// Parses and validates a TOML text. The error names the field and the rule (feature
    /// `toml`).
    #[cfg(feature = "toml")]
    pub fn from_toml(text: &str) -> Result<Config, ControlError> {
        let config = Config::read(toml::Deserializer::parse(text)?)?;
        config.validate()?;
        Ok(config)
    }

    /// Reads a configuration from a document (TOML or JSON, not validated yet). A value its
    /// field's type cannot hold (out of range, of the wrong type, an unknown key inside a
    /// section) is refused naming the field: `budget.alpha: must be in (0, 1]`.
    #[cfg(any(feature = "toml", test))]
    pub(crate) fn read<'de, D>(document: D) -> Result<Config, ControlError>
    where
        D: serde::Deserializer<'de>,
        D::Error: DocumentError,
    {
        serde_path_to_error::deserialize(document).map_err(|e| {
            if e.path().iter().next().is_none() {
                return e.into_inner().into();
            }
            // Both quote the document's keys, which its writer chooses: kept short.
            let field = cut(e.path().to_string(), MAX_FIELD);
            ConfigError::new(field, cut(e.inner().rule(), MAX_RULE)).into()
        })
    }

    /// Reads, parses and validates a TOML file (feature `toml`).
    #[cfg(feature = "toml")]
    pub fn load(path: &std::path::Path) -> Result<Config, ControlError> {
        Self::from_toml(&read(path)?)
    }

    /// Validates the whole configuration and derives what the stages need from it:
    /// everything that can fail. [`Control`](super::Control) commits the result, which
    /// cannot fail, so a change is applied whole or not at all.
    pub(crate) fn prepare(self) -> Result<Prepared, ConfigError> {
        self.validate()?;
        let identity = self.identity.identity()?;
        Ok(Prepared {
            config: self,
            identity,
        })
    }

    /// The top-level keys (sections, and `mode`, `body_limit`) whose values differ between
    /// `self` and `other`, in the order of the fields.
    pub(crate) fn differences(&self, other: &Config) -> Vec<&'static str> {
        let (a, b) = (self, other);
        [
            ("mode", a.mode != b.mode),
            ("features", a.features != b.features),
            ("fixed", a.fixed != b.fixed),
            ("body_limit", a.body_limit != b.body_limit),
            ("classify", a.classify != b.classify),
            ("rejection", a.rejection != b.rejection),
            ("fifo", a.fifo != b.fifo),
            ("budget", a.budget != b.budget),
            ("tenants", a.tenants != b.tenants),
            ("costs", a.costs != b.costs),
            ("sessions", a.sessions != b.sessions),
            ("breaker", a.breaker != b.breaker),
            ("idempotency", a.idempotency != b.idempotency),
            ("deadlines", a.deadlines != b.deadlines),
            ("identity", a.identity != b.identity),
            ("metrics", a.metrics != b.metrics),
            ("admin", a.admin != b.admin),
            ("distributed", a.distributed != b.distributed),
            ("gateway", a.gateway != b.gateway),
        ]
        .into_iter()
        .filter_map(|(name, differs)| differs.then_some(name))
        .collect()
    }

    /// The top-level keys this configuration sets to something other than their defaults.
    #[cfg(feature = "toml")]
    pub(crate) fn sections(&self) -> Vec<&'static str> {
        self.differences(&Config::default())
    }

    /// Checks every rule of every section; the error names the field and the rule.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.rejection.validate()?;
        self.budget.validate()?;
        self.costs.validate()?;
        self.sessions.validate()?;
        self.breaker.validate()?;
        self.idempotency.validate()?;
        self.identity.identity()?;
        if let Some(d) = &self.distributed {
            if !cfg!(feature = "redis") {
                return Err(ConfigError::new(
                    "distributed",
                    "this build of stormgate has no `redis` feature",
                ));
            }
            d.validate()?;
        }
        if let Some(g) = &self.gateway {
            g.validate()?;
        }
        Ok(())
    }

    /// The policy snapshot this configuration sets.
    pub fn policy(&self) -> Policy {
        Policy {
            mode: self.mode,
            features: self.features,
            fixed: self.fixed,
            off: self.off,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::valid::NonZeroDuration;

    /// A value a field's type refuses is refused naming the field, in TOML as in JSON, whatever
    /// the type: a range of `valid`, a standard `NonZero`, a weight, a map's entry.
    #[test]
    #[cfg(feature = "toml")]
    fn a_document_value_its_type_refuses_names_the_field() {
        let cases = [
            ("[budget]\nalpha = 1.5", "budget.alpha", "must be in (0, 1]"),
            (
                "[budget]\nsample_interval_ms = 0",
                "budget.sample_interval_ms",
                "must be greater than 0",
            ),
            (
                "[sessions]\nbuckets = 0",
                "sessions.buckets",
                "invalid value: integer `0`, expected a nonzero usize",
            ),
            (
                "[tenants.weights]\nacme = -1.0",
                "tenants.weights.acme",
                "must be greater than 0",
            ),
            (
                "[costs.tools]\nx = 0",
                "costs.tools.x",
                "must be at least 1, or \"auto\"",
            ),
            (
                "[deadlines.tools_ms]\nx = 0",
                "deadlines.tools_ms.x",
                "must be greater than 0",
            ),
            (
                "[budget]\nalpha = \"x\"",
                "budget.alpha",
                "invalid type: string \"x\", expected f64",
            ),
        ];
        // A key its writer made long is named short.
        let long = "k".repeat(10_000);
        let err = Config::from_toml(&format!("[budget]\n{long} = 1\n")).unwrap_err();
        let err = err.config_error().expect("a field named");
        assert!(err.field.starts_with("budget.kkk") && err.field.len() <= MAX_FIELD + 3);
        assert!(err.rule.starts_with("unknown field `kkk") && err.rule.len() <= MAX_RULE + 3);
        for (text, field, rule) in cases {
            let err = Config::from_toml(text).unwrap_err();
            let err = err
                .config_error()
                .unwrap_or_else(|| panic!("{text}: {err}"));
            assert_eq!((&*err.field, &*err.rule), (field, rule), "{text}");
            let json =
                serde_json::to_string(&toml::from_str::<toml::Table>(text).unwrap()).unwrap();
            let err = Config::read(&mut serde_json::Deserializer::from_str(&json)).unwrap_err();
            assert_eq!(
                err.config_error().map(|e| &*e.field),
                Some(field),
                "{json}: {err}"
            );
        }
    }

    #[test]
    fn the_gateway_section_is_validated() {
        let ok = Config::from_toml(
            "[gateway]\nupstream = \"http://127.0.0.1:8000/mcp\"\nforward_headers = [\"Authorization\"]\n",
        )
        .unwrap();
        let g = ok.gateway.unwrap();
        assert_eq!(g.upstream.as_deref(), Some("http://127.0.0.1:8000/mcp"));
        assert_eq!(
            g.request_timeout,
            NonZeroDuration::new(std::time::Duration::from_secs(60)).unwrap()
        );
        for (text, field) in [
            ("upstream = \"ws://x/mcp\"", "gateway.upstream"),
            ("upstream = \"not a url\"", "gateway.upstream"),
            ("upstream = \"http:///mcp\"", "gateway.upstream"),
            ("connect_timeout_ms = 0", "gateway.connect_timeout_ms"),
            ("request_timeout_ms = 0", "gateway.request_timeout_ms"),
            (
                "forward_headers = [\"connection\"]",
                "gateway.forward_headers",
            ),
            (
                "forward_headers = [\"bad header\"]",
                "gateway.forward_headers",
            ),
        ] {
            let err = Config::from_toml(&format!("[gateway]\n{text}\n")).unwrap_err();
            assert_eq!(err.config_error().unwrap().field, field, "{text}: {err}");
        }
        // https: with the `tls` feature; without it, refused by name.
        let https = Config::from_toml("[gateway]\nupstream = \"https://x/mcp\"\n");
        if cfg!(feature = "tls") {
            assert!(https.is_ok());
        } else {
            let err = https.unwrap_err();
            assert_eq!(err.config_error().unwrap().field, "gateway.upstream");
            assert!(err.to_string().contains("`tls` feature"), "{err}");
        }
        assert!(Config::from_toml("").unwrap().gateway.is_none());
    }

    #[test]
    fn the_distributed_section_is_validated() {
        let err = Config::from_toml("[distributed]\nurl = \"http://redis\"\n").unwrap_err();
        let err = err.config_error().unwrap().clone();
        if cfg!(feature = "redis") {
            assert_eq!(err.field, "distributed.url", "{err}");
            let ok = Config::from_toml("[distributed]\nlease_window_ms = 250\n").unwrap();
            let d = ok.distributed.unwrap();
            assert_eq!(d.lease_window.as_millis(), 250);
            assert_eq!(d.url, "redis://127.0.0.1:6379");
        } else {
            assert_eq!(err.field, "distributed");
        }
        assert!(Config::from_toml("").unwrap().distributed.is_none());
    }
}

//! The errors of configuration: a field that breaks a rule, and a refused change.

use std::borrow::Cow;
use std::fmt;

/// A configuration field that breaks a rule. `Display` gives `field: rule`, e.g.
/// `budget.floor: must not exceed stable_budget`; tests and callers match the fields, not the
/// text. A field's own range is its type's ([`valid`](crate::valid)): code cannot set a value
/// out of it, and a document that does is refused naming the field the same way.
///
/// ```
/// use stormgate::control::Config;
/// use stormgate::valid::Positive;
///
/// let mut config = Config::default();
/// config.budget.floor = Some(Positive::new(5000.0).unwrap());
/// let err = config.validate().unwrap_err();
/// assert_eq!(err.field, "budget.floor");
/// assert_eq!(err.rule, "must not exceed stable_budget");
/// assert_eq!(err.to_string(), "budget.floor: must not exceed stable_budget");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ConfigError {
    /// The field's path in the configuration, dotted (`fifo.keys.db.queue_timeout_ms`).
    pub field: Cow<'static, str>,
    /// The rule it breaks, in words (`must be greater than 0`).
    pub rule: Cow<'static, str>,
}

impl ConfigError {
    /// `field` breaks `rule`.
    pub fn new(field: impl Into<Cow<'static, str>>, rule: impl Into<Cow<'static, str>>) -> Self {
        ConfigError {
            field: field.into(),
            rule: rule.into(),
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.rule)
    }
}

impl std::error::Error for ConfigError {}

/// Why the control handle refused a configuration change, or could not start a reload path.
/// The running configuration stays whenever a change is refused.
#[derive(Debug)]
#[non_exhaustive]
pub enum ControlError {
    /// A field breaks a rule (validation, a setting that cannot change while running, a
    /// section a document leaves out, a change that would lock the admin API out).
    Invalid(ConfigError),
    /// The document is empty: nothing to apply (an empty file is refused unless it says
    /// `replace = true`).
    Empty,
    /// The TOML text does not parse, or does not fit the configuration's shape.
    #[cfg(feature = "toml")]
    Toml(toml::de::Error),
    /// The JSON text does not parse, or does not fit the configuration's shape.
    Json(serde_json::Error),
    /// A configuration file could not be read.
    Read {
        /// The file.
        path: std::path::PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// A configuration file could not be watched (feature `watch`).
    #[cfg(feature = "watch")]
    Watch {
        /// The directory watched.
        path: std::path::PathBuf,
        /// The error.
        source: notify::Error,
    },
    /// The stage needs a tokio runtime and was built outside one.
    NoRuntime(&'static str),
}

impl ControlError {
    /// The rule broken, when the refusal is about a field.
    pub fn config_error(&self) -> Option<&ConfigError> {
        match self {
            ControlError::Invalid(e) => Some(e),
            _ => None,
        }
    }
}

impl fmt::Display for ControlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ControlError::Invalid(e) => e.fmt(f),
            ControlError::Empty => f.write_str(
                "the document is empty: nothing applied (write `replace = true` to reset every section to its default)",
            ),
            #[cfg(feature = "toml")]
            ControlError::Toml(e) => f.write_str(e.to_string().trim()),
            ControlError::Json(e) => e.fmt(f),
            ControlError::Read { path, source } => write!(f, "{}: {source}", path.display()),
            #[cfg(feature = "watch")]
            ControlError::Watch { path, source } => {
                write!(f, "cannot watch {}: {source}", path.display())
            }
            ControlError::NoRuntime(what) => write!(f, "{what}: must be started inside a tokio runtime"),
        }
    }
}

impl std::error::Error for ControlError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ControlError::Invalid(e) => Some(e),
            ControlError::Empty | ControlError::NoRuntime(_) => None,
            #[cfg(feature = "toml")]
            ControlError::Toml(e) => Some(e),
            ControlError::Json(e) => Some(e),
            ControlError::Read { source, .. } => Some(source),
            #[cfg(feature = "watch")]
            ControlError::Watch { source, .. } => Some(source),
        }
    }
}

impl From<ConfigError> for ControlError {
    fn from(e: ConfigError) -> Self {
        ControlError::Invalid(e)
    }
}

#[cfg(feature = "toml")]
impl From<toml::de::Error> for ControlError {
    fn from(e: toml::de::Error) -> Self {
        ControlError::Toml(e)
    }
}

impl From<serde_json::Error> for ControlError {
    fn from(e: serde_json::Error) -> Self {
        ControlError::Json(e)
    }
}

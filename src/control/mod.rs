//! Control: the kill switch, one validated configuration, and its reload paths (an operator
//! must be able to drop to fixed limits or turn protection off within a second, and change any
//! parameter online).
//!
//! * [`Policy`] is an immutable snapshot (mode, feature switches, fixed limits) swapped
//!   atomically ([`Switch`]); every stage reads it once per request, so a flip is seen by the
//!   next request and a call in flight keeps the policy it started with.
//! * [`Config`] holds every parameter of every stage; validation names the field and the rule.
//! * [`Control`] builds the whole stack from a `Config` and flips or reloads it: in code
//!   (`set_mode`, `reload`), from a watched file (`watch_file`), on SIGHUP
//!   (`reload_on_sighup`), or over HTTP (`admin_router`). An invalid reload is refused whole,
//!   counted, and the running configuration stays; a valid one keeps what was learned.
//! * [`Audit`] keeps each session's recent calls with their queue wait, outcome or refusal.

#[cfg(feature = "admin")]
mod admin;
mod audit;
mod config;
#[cfg(feature = "toml")]
mod document;
mod handle;
mod settings;
mod view;
#[cfg(feature = "watch")]
mod watch;

pub use crate::error::{ConfigError, ControlError};
pub use crate::policy::{Features, FixedLimits, Mode, Off, Policy, Switch};
pub use audit::{AUDIT_MAX_SESSIONS, AUDIT_PER_SESSION, Audit, Invocation};
pub use config::{AdminConfig, Config, IdentityConfig, MetricsConfig};
#[cfg(feature = "test-util")]
pub use handle::Stages;
pub use handle::{Control, Source};
pub use view::View;
#[cfg(feature = "watch")]
pub use watch::DEBOUNCE;

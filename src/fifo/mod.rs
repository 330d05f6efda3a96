//! The per-resource FIFO limiter: pacing, concurrency, a bounded queue with a timeout,
//! cancellation that frees the place at once, sliding windows, per-account concurrency and
//! upstream 429 cooldowns. The only stage of stormgate that waits.
//!
//! It unites the usual outbound rate-limit settings (per `rateLimitGroup`: `minIntervalMs`,
//! `maxConcurrentRequests`, `maxQueueDepth`, `queueTimeoutMs`, a 429 cooldown) and per-provider
//! limits (QPS over a sliding one-second window, per-account concurrency) in one limiter:
//!
//! * [`ResourceLimiter`]: the core, keyed by any string; `acquire(key, account)` waits in FIFO
//!   order and gives a [`Lease`]; dropping the lease frees the place.
//! * [`FifoLimitLayer`]: inbound MCP `tools/call`s, keyed per tool; refusals follow the
//!   rejection contract (`queue_full`, `queue_timeout`, `upstream_rate_limited`, scope
//!   `resource`); admitted answers carry a [`QueueWait`] extension.
//! * [`OutboundLimitLayer`]: around an outbound HTTP client, keyed by host; feeds 429 answers
//!   with `Retry-After` into the cooldown by itself.
//!
//! **Absent means off.** Every dimension of [`ResourceLimits`] is optional and an absent one
//! limits nothing; well-known upstreams' limits are presets ([`ResourceLimits::arxiv`],
//! [`ResourceLimits::ncbi_eutils`], [`ResourceLimits::public_api`]), never hidden defaults.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! use std::time::Duration;
//! use stormgate::fifo::{ResourceLimiter, ResourceLimits};
//!
//! let limiter = ResourceLimiter::builder()
//!     .key("export.arxiv.org", ResourceLimits::arxiv())
//!     .build();
//! let lease = limiter.acquire("export.arxiv.org", None).await.unwrap();
//! assert_eq!(lease.queue_wait(), Duration::ZERO);
//! drop(lease); // the next caller may go 3 s after this one was admitted
//! # }
//! ```

mod acquire;
mod body;
mod config;
mod error;
mod key;
mod layer;
mod limiter;
mod limits;
mod outbound;
mod retry_after;
mod service;

pub use acquire::{Acquire, Lease};
pub use body::{LeaseBody, Leases};
pub use config::FifoConfig;
pub use error::AcquireError;
pub use layer::FifoLimitLayer;
pub(crate) use limiter::Settings as LimiterSettings;
pub use limiter::{
    DEFAULT_COOLDOWN, DEFAULT_KEY, DEFAULT_MAX_KEYS, MAX_KEY_LEN, ResourceLimiter,
    ResourceLimiterBuilder,
};
pub use limits::{ResourceLimits, WindowLimit};
pub use outbound::{OutboundFuture, OutboundLimit, OutboundLimitLayer};
pub use retry_after::{parse_retry_after, retry_after_from_error_text};
pub use service::FifoLimit;

pub use crate::extensions::QueueWait;

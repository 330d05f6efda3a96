//! Why an acquisition failed.

use std::fmt;
use std::time::Duration;

use crate::rejection::{Reason, Rejection, Scope};

/// Why [`ResourceLimiter::acquire`](super::ResourceLimiter::acquire) refused a caller.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum AcquireError {
    /// The key's queue was at its depth (other limiters' `RATE_LIMIT_QUEUE_FULL`).
    QueueFull {
        /// The queue's depth when refused.
        depth: usize,
        /// Expected time until a place frees up, from the queue and the key's service rate.
        retry_after: Duration,
    },
    /// The caller waited `queue_timeout` (other limiters' `RATE_LIMIT_QUEUE_TIMEOUT`).
    QueueTimeout {
        /// How long it really waited.
        waited: Duration,
        /// Expected remaining wait at its position when it gave up.
        retry_after: Duration,
    },
    /// The key is cooling down after an upstream 429 for longer than the caller could wait
    /// (other limiters' `RATE_LIMITED`).
    UpstreamRateLimited {
        /// Until the cooldown ends.
        retry_after: Duration,
    },
    /// The call's whole-round deadline passed, or would pass before it could be admitted
    /// (other limiters' `TIMEOUT`).
    DeadlineExceeded {
        /// How long it waited (zero when refused at once).
        waited: Duration,
        /// Expected wait for a place now.
        retry_after: Duration,
    },
}

impl AcquireError {
    /// The rejection contract's form of this error (scope `resource`).
    pub fn to_rejection(&self) -> Rejection {
        match *self {
            AcquireError::QueueFull { retry_after, .. } => {
                Rejection::new(Reason::QueueFull, Scope::Resource, retry_after)
            }
            AcquireError::QueueTimeout {
                waited,
                retry_after,
            } => Rejection::new(Reason::QueueTimeout, Scope::Resource, retry_after)
                .with_queue_wait(waited),
            AcquireError::UpstreamRateLimited { retry_after } => {
                Rejection::new(Reason::UpstreamRateLimited, Scope::Resource, retry_after)
            }
            AcquireError::DeadlineExceeded {
                waited,
                retry_after,
            } => Rejection::new(Reason::DeadlineExceeded, Scope::Tool, retry_after)
                .with_queue_wait(waited),
        }
    }
}

impl fmt::Display for AcquireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AcquireError::QueueFull { depth, .. } => write!(f, "queue full at depth {depth}"),
            AcquireError::QueueTimeout { waited, .. } => {
                write!(f, "queue timeout after {} ms", waited.as_millis())
            }
            AcquireError::UpstreamRateLimited { retry_after } => write!(
                f,
                "upstream rate limited for another {} ms",
                retry_after.as_millis()
            ),
            AcquireError::DeadlineExceeded { waited, .. } => {
                write!(
                    f,
                    "deadline exceeded after {} ms in the queue",
                    waited.as_millis()
                )
            }
        }
    }
}

impl std::error::Error for AcquireError {}

use std::fmt;
use std::sync::Arc;

use tower::Layer;

use super::body::Observers;
use super::{Observed, Observer};
use crate::call::Unread;

/// Builds [`Observed`] services. See the [module docs](crate::outcome).
#[derive(Clone)]
pub struct OutcomeLayer {
    observers: Observers,
    unread: Arc<Unread>,
}

impl OutcomeLayer {
    /// Reports to these observers.
    pub fn new(observers: impl IntoIterator<Item = Arc<dyn Observer>>) -> Self {
        OutcomeLayer {
            observers: observers.into_iter().collect(),
            unread: Arc::default(),
        }
    }
}

impl fmt::Debug for OutcomeLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OutcomeLayer")
            .field("observers", &self.observers.len())
            .finish()
    }
}

impl<S> Layer<S> for OutcomeLayer {
    type Service = Observed<S>;

    fn layer(&self, inner: S) -> Observed<S> {
        Observed::new(inner, self.observers.clone(), self.unread.clone())
    }
}

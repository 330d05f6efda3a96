use std::fmt;
use std::sync::Arc;

use tokio::time::Instant;
use tower::Layer;

use super::Admit;
use crate::call::Call;
use crate::call::Unread;
use crate::rejection::Rejection;

/// A non-waiting admission decision for one request call.
pub trait Admission: Send + Sync + 'static {
    /// What `admit` took, kept in the call's [`Charges`](crate::charges::Charges) until the
    /// call is settled: given back through [`refund`](Self::refund) if it never runs.
    type Permit: Send + 'static;

    /// Admits `call` or says why not. Must not block.
    fn admit(&self, call: &Call) -> Result<Self::Permit, Rejection>;

    /// [`admit`](Self::admit) at `now`: the instant the stage admits the request's calls at,
    /// read once for every admission of it (a tuple of admissions, and the [`Admit`]
    /// service, pass one reading to all). By default `admit`, which reads the clock itself if
    /// it needs it; an admission that reads the clock overrides this and calls it from
    /// `admit` with `Instant::now()`.
    fn admit_at(&self, call: &Call, now: Instant) -> Result<Self::Permit, Rejection> {
        let _ = now;
        self.admit(call)
    }

    /// The admitted call never ran (a stage after this one refused it, or the MCP server
    /// rejected it unrun): give back what `admit` charged. By default the permit is just
    /// dropped.
    fn refund(&self, permit: Self::Permit) {
        drop(permit);
    }
}

impl<F> Admission for F
where
    F: Fn(&Call) -> Result<(), Rejection> + Send + Sync + 'static,
{
    type Permit = ();

    fn admit(&self, call: &Call) -> Result<(), Rejection> {
        self(call)
    }
}

/// Applies an [`Admission`] to every request call. See the [module docs](crate::admit).
pub struct AdmitLayer<A> {
    admission: Arc<A>,
    unread: Arc<Unread>,
}

impl<A> AdmitLayer<A> {
    /// A layer whose services all share `admission`.
    pub fn new(admission: A) -> Self {
        Self::from_arc(Arc::new(admission))
    }

    /// A layer sharing an admission you keep a handle to.
    pub fn from_arc(admission: Arc<A>) -> Self {
        AdmitLayer {
            admission,
            unread: Arc::default(),
        }
    }
}

impl<A> Clone for AdmitLayer<A> {
    fn clone(&self) -> Self {
        AdmitLayer {
            admission: self.admission.clone(),
            unread: self.unread.clone(),
        }
    }
}

impl<A> fmt::Debug for AdmitLayer<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdmitLayer").finish_non_exhaustive()
    }
}

impl<S, A> Layer<S> for AdmitLayer<A> {
    type Service = Admit<S, A>;

    fn layer(&self, inner: S) -> Admit<S, A> {
        Admit::new(inner, self.admission.clone(), self.unread.clone())
    }
}

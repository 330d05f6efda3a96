//! What the binary puts around the whole app with tower-http: every request gets an id of the
//! gateway's own (`x-request-id`, answered back, and in the span of everything logged while it
//! runs), credentials are marked sensitive so no debug output shows them, and a panic while
//! serving is answered 500 instead of dropping the connection.
//!
//! The body limit, the body timeout and the request's classification stay stormgate's own
//! (`[classify]`, `body_limit`): the body is read once, to classify it, and the same read
//! enforces them.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::Router;
use http::header::{AUTHORIZATION, COOKIE, HeaderName, PROXY_AUTHORIZATION, SET_COOKIE};
use http::{HeaderValue, Request};
use tower::ServiceBuilder;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::request_id::{
    MakeRequestId, PropagateRequestIdLayer, RequestId, SetRequestIdLayer,
};
use tower_http::sensitive_headers::{
    SetSensitiveRequestHeadersLayer, SetSensitiveResponseHeadersLayer,
};
use tower_http::trace::TraceLayer;

const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// Request ids: this process's start (so ids differ across restarts) and a counter.
#[derive(Clone)]
struct Ids {
    prefix: u32,
    next: Arc<AtomicU64>,
}

impl MakeRequestId for Ids {
    fn make_request_id<B>(&mut self, _: &Request<B>) -> Option<RequestId> {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let id = format!("{:08x}-{n}", self.prefix);
        HeaderValue::from_str(&id).ok().map(RequestId::new)
    }
}

/// The path of a request, at most 128 bytes of it, for its span.
fn path_of<B>(req: &Request<B>) -> &str {
    let path = req.uri().path();
    let mut end = path.len().min(128);
    while !path.is_char_boundary(end) {
        end -= 1;
    }
    &path[..end]
}

/// `app` with the request ids, spans, sensitive headers and panic answers around it.
pub(crate) fn around(app: Router) -> Router {
    let ids = Ids {
        prefix: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as u32),
        next: Arc::new(AtomicU64::new(1)),
    };
    let trace = TraceLayer::new_for_http().make_span_with(|req: &Request<axum::body::Body>| {
        let id = req
            .headers()
            .get(&REQUEST_ID)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("-");
        tracing::info_span!("request", id, method = %req.method(), path = path_of(req))
    });
    app.layer(
        ServiceBuilder::new()
            .layer(SetSensitiveRequestHeadersLayer::new([
                AUTHORIZATION,
                PROXY_AUTHORIZATION,
                COOKIE,
            ]))
            .layer(SetSensitiveResponseHeadersLayer::new([SET_COOKIE]))
            // The id is the gateway's: a client's own `x-request-id` (any length, any text)
            // is replaced, never logged.
            .map_request(|mut req: Request<axum::body::Body>| {
                req.headers_mut().remove(&REQUEST_ID);
                req
            })
            .layer(SetRequestIdLayer::new(REQUEST_ID, ids))
            .layer(trace)
            .layer(PropagateRequestIdLayer::new(REQUEST_ID))
            .layer(CatchPanicLayer::new()),
    )
}

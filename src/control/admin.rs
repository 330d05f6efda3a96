//! The admin HTTP routes: read and flip the mode, read and replace the configuration, see the
//! state and a session's recent calls. Bearer token required; without a configured token the
//! routes are not served at all.

use axum::extract::{Path, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::{Deserialize, Serialize};

use std::net::SocketAddr;

use axum::extract::ConnectInfo;

use super::{Config, Control, Mode, Source};
use crate::budget::Health;
use crate::call::SessionId;
use crate::entropy::SessionSummary;
use crate::error::ControlError;

/// Equal in time whatever the first differing byte: the token is not guessable byte by byte.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn auth(State(control): State<Control>, req: Request, next: Next) -> Response {
    let Some(token) = control.config().admin.token() else {
        return StatusCode::NOT_FOUND.into_response();
    };
    let given = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(bearer);
    match given {
        Some(given) if constant_time_eq(given.as_bytes(), token.as_bytes()) => next.run(req).await,
        _ => {
            tracing::warn!(caller = ?caller(&req), path = %req.uri().path(), "admin request refused: no valid bearer token");
            (
                StatusCode::UNAUTHORIZED,
                [(header::WWW_AUTHENTICATE, "Bearer realm=\"stormgate\"")],
            )
                .into_response()
        }
    }
}

/// The credentials of `Authorization: Bearer <token>`; the scheme is case-insensitive
/// (RFC 9110 section 11.1).
fn bearer(value: &str) -> Option<&str> {
    let (scheme, token) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim_start_matches(' '))
}

/// The caller's address, when the server records it.
fn caller<B>(req: &http::Request<B>) -> Option<SocketAddr> {
    req.extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0)
}

/// Extracts the admin caller as a reload [`Source`].
struct Admin(Source);

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for Admin {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut http::request::Parts,
        _: &S,
    ) -> Result<Self, Self::Rejection> {
        let addr = parts
            .extensions
            .get::<ConnectInfo<SocketAddr>>()
            .map(|c| c.0);
        Ok(Admin(Source::Admin(addr)))
    }
}

#[derive(Debug, Serialize, Deserialize)]
struct ModeBody {
    mode: Mode,
}

#[derive(Debug, Serialize)]
struct ErrorBody {
    error: String,
}

#[derive(Debug, Serialize)]
struct StateBody {
    mode: Mode,
    budget: Health,
    tenants_active: usize,
    sessions: usize,
    top_sessions: Vec<SessionSummary>,
    last_reload_error: Option<String>,
    /// The shared budget, when `[distributed]` is configured.
    #[cfg(feature = "redis")]
    #[serde(skip_serializing_if = "Option::is_none")]
    shared: Option<SharedState>,
}

/// `GET /state`'s view of the shared budget.
#[cfg(feature = "redis")]
#[derive(Debug, Serialize)]
struct SharedState {
    node_id: String,
    mode: &'static str,
    rate: Option<f64>,
    nodes: u32,
    round_trips: u64,
    lease_requests: u64,
    granted: u64,
    errors: u64,
}

#[cfg(feature = "redis")]
impl SharedState {
    fn of(s: &crate::distributed::SharedBudget) -> Self {
        let stats = s.stats();
        SharedState {
            node_id: s.node_id().to_owned(),
            mode: s.mode().as_str(),
            rate: s.shared_rate(),
            nodes: s.nodes(),
            round_trips: stats.round_trips,
            lease_requests: stats.lease_requests,
            granted: stats.granted,
            errors: stats.errors,
        }
    }
}

async fn get_config(State(c): State<Control>) -> Json<Config> {
    Json(Config::clone(&c.config()))
}

async fn post_config(State(c): State<Control>, Admin(source): Admin, body: String) -> Response {
    answer(&c, c.reload_document(&body, source))
}

async fn patch_config(State(c): State<Control>, Admin(source): Admin, body: String) -> Response {
    answer(&c, c.patch(&body, source))
}

fn answer(c: &Control, result: Result<(), ControlError>) -> Response {
    match result {
        Ok(()) => Json(ModeBody {
            mode: c.policy().mode,
        })
        .into_response(),
        Err(e) => (
            StatusCode::BAD_REQUEST,
            Json(ErrorBody {
                error: e.to_string(),
            }),
        )
            .into_response(),
    }
}

async fn get_mode(State(c): State<Control>) -> Json<ModeBody> {
    Json(ModeBody {
        mode: c.policy().mode,
    })
}

async fn put_mode(
    State(c): State<Control>,
    Admin(source): Admin,
    Json(body): Json<ModeBody>,
) -> Json<ModeBody> {
    c.flip(body.mode, source);
    Json(body)
}

async fn state(State(c): State<Control>) -> Json<StateBody> {
    Json(StateBody {
        mode: c.policy().mode,
        budget: c.budget().health(),
        tenants_active: c.budget().tenant_count(),
        sessions: c.sessions().len(),
        top_sessions: c.sessions().top(),
        last_reload_error: c.last_error(),
        #[cfg(feature = "redis")]
        shared: c.budget().shared().map(SharedState::of),
    })
}

async fn invocations(State(c): State<Control>, Path(id): Path<String>) -> Response {
    Json(c.audit().invocations(&SessionId::new(id))).into_response()
}

impl Control {
    /// The admin routes, to mount where you like (e.g. `.nest("/admin", ...)`), or `None` when
    /// no token is configured (`[admin] token` or `token_env`):
    ///
    /// | route | does |
    /// |---|---|
    /// | `GET /config` | the running configuration (the token left out) |
    /// | `POST /config` | replaces it (TOML, or JSON) through [`Control::reload_document`]: refused (400 with the error) when invalid, empty, when it leaves out a section the running configuration sets (unless `replace = true`), or when it would remove the admin token |
    /// | `PATCH /config` | merges a partial document into the running configuration ([`Control::patch`]); 400 when the result is refused |
    /// | `GET /mode`, `PUT /mode` | reads / flips the kill switch: `{"mode":"fixed"}` |
    /// | `GET /state` | mode, budget health, tenants, sessions, top sessions, last reload error, and the shared budget's mode, rate, nodes and counters (feature `redis`, with `[distributed]`) |
    /// | `GET /sessions/{id}/invocations` | the session's recent calls with queue wait and outcome |
    ///
    /// Every request needs `Authorization: Bearer <token>` (the scheme in any case; the token
    /// compared in constant time); a wrong or missing one gets 401 with
    /// `WWW-Authenticate: Bearer` and no detail. Every change is counted, logged with the
    /// caller's address (when served with `into_make_service_with_connect_info`), and kept as
    /// the last error when refused.
    pub fn admin_router(&self) -> Option<Router> {
        self.config().admin.token()?;
        Some(
            Router::new()
                .route(
                    "/config",
                    get(get_config).post(post_config).patch(patch_config),
                )
                .route("/mode", get(get_mode).put(put_mode))
                .route("/state", get(state))
                .route("/sessions/{id}/invocations", get(invocations))
                .layer(middleware::from_fn_with_state(self.clone(), auth))
                .with_state(self.clone()),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::{bearer, constant_time_eq};

    #[test]
    fn the_bearer_scheme_is_case_insensitive() {
        assert_eq!(bearer("Bearer abc"), Some("abc"));
        assert_eq!(bearer("bearer abc"), Some("abc"));
        assert_eq!(bearer("BEARER  abc"), Some("abc"));
        assert_eq!(bearer("Basic abc"), None);
        assert_eq!(bearer("Bearerabc"), None);
    }

    #[test]
    fn compares_whole_tokens() {
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secret", b"secreT"));
        assert!(!constant_time_eq(b"secret", b"secret2"));
        assert!(!constant_time_eq(b"", b"x"));
    }
}

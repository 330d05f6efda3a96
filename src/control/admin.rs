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

use super::{Config, Control, Mode};
use crate::budget::Health;
use crate::call::SessionId;
use crate::entropy::SessionSummary;

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
        .and_then(|v| v.strip_prefix("Bearer "));
    match given {
        Some(given) if constant_time_eq(given.as_bytes(), token.as_bytes()) => next.run(req).await,
        _ => StatusCode::UNAUTHORIZED.into_response(),
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

async fn post_config(State(c): State<Control>, body: String) -> Response {
    let parsed = if body.trim_start().starts_with('{') {
        serde_json::from_str::<Config>(&body).map_err(|e| e.to_string())
    } else {
        Config::from_toml(&body)
    };
    match parsed.and_then(|config| c.reload(config)) {
        Ok(()) => Json(ModeBody {
            mode: c.policy().mode,
        })
        .into_response(),
        Err(error) => (StatusCode::BAD_REQUEST, Json(ErrorBody { error })).into_response(),
    }
}

async fn get_mode(State(c): State<Control>) -> Json<ModeBody> {
    Json(ModeBody {
        mode: c.policy().mode,
    })
}

async fn put_mode(State(c): State<Control>, Json(body): Json<ModeBody>) -> Json<ModeBody> {
    c.set_mode(body.mode);
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
    /// | `POST /config` | replaces it (TOML, or JSON); 400 with the validation error when invalid |
    /// | `GET /mode`, `PUT /mode` | reads / flips the kill switch: `{"mode":"fixed"}` |
    /// | `GET /state` | mode, budget health, tenants, sessions, top sessions, last reload error, and the shared budget's mode, rate, nodes and counters (feature `redis`, with `[distributed]`) |
    /// | `GET /sessions/{id}/invocations` | the session's recent calls with queue wait and outcome |
    ///
    /// Every request needs `Authorization: Bearer <token>` (compared in constant time); a
    /// wrong or missing one gets 401 with no detail.
    pub fn admin_router(&self) -> Option<Router> {
        self.config().admin.token()?;
        Some(
            Router::new()
                .route("/config", get(get_config).post(post_config))
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
    use super::constant_time_eq;

    #[test]
    fn compares_whole_tokens() {
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secret", b"secreT"));
        assert!(!constant_time_eq(b"secret", b"secret2"));
        assert!(!constant_time_eq(b"", b"x"));
    }
}

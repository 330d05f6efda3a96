//! Idempotency keys for non-idempotent tools: an agent retries a refused or timed-out write on
//! its own, so a write must not run twice for one key.
//!
//! For the tools listed in [`IdempotencyConfig::tools`], a `tools/call` carries a key in
//! `params._meta` (`meta_key`, default `idempotency_key`) or in the `Idempotency-Key` header,
//! scoped by tenant, session (`scope = "session"`, the default; `"tenant"` shares keys across a
//! tenant's sessions) and tool, and bound to the call's arguments:
//!
//! * the first call with a key runs; its answer (the JSON-RPC `result` or `error`) is kept for
//!   `ttl` (bounded by `max_entries`), if it is at most [`MAX_KEPT_ANSWER`] bytes and the
//!   layer keeps at most [`MAX_KEPT_BYTES`] in all; a larger answer passes to its client but is
//!   not kept, and its duplicates are answered -32603 "already ran" (nothing runs twice);
//! * a duplicate that arrives while the first is running waits for it and receives its answer;
//! * a call that reuses a key with other arguments is answered -32602 "idempotency key reused
//!   with different arguments" and nothing runs: no call gets another call's answer;
//! * a duplicate after completion receives the kept answer without running the tool;
//! * a call stormgate refused never ran, so nothing is kept and its retry runs normally (one of
//!   the waiting duplicates, if any, runs in its place);
//! * a listed tool called without a key is let through (`missing = "allow"`, the default) or
//!   answered with a JSON-RPC error (-32602) naming the key (`missing = "reject"`).
//!
//! Answers are replayed with the duplicate's own id, as `application/json`. Batches and calls
//! of tools not listed pass through untouched. If the first call's client goes away before its
//! answer, nothing is kept and a retry runs (the tool may have started: prefer clients that
//! wait). Place the layer right after the classifier, so duplicates never reach the budgets.

use crate::error::ConfigError;
use crate::valid::NonZeroDuration;
use std::collections::BTreeSet;
use std::num::NonZeroUsize;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use crate::snapshot::{Live, Read};
use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use http::{Request, StatusCode};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use tokio::sync::watch;
use tokio::time::Instant;
use tower::{BoxError, Layer, Service, ServiceExt};

use crate::response::ResponseFuture;

use crate::answer::{AnswerBody, Framing, Listener, Message, Scan, Scanned};
use crate::bounded::Bounded;
use crate::call::{Call, Calls, Meta};
use crate::mcp::reply;
use crate::mcp::verdict::RefusedCalls;
use crate::policy::{Mode, Switch};

/// What to do with a listed tool called without a key.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Missing {
    /// Let it through (no protection for that call).
    #[default]
    Allow,
    /// Answer with a JSON-RPC error naming the key.
    Reject,
}

/// Whose calls share an idempotency key.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KeyScope {
    /// The calls of one session (default): another client's key, however chosen, never
    /// reaches this session's answers.
    #[default]
    Session,
    /// Every session of a tenant (for clients that retry on a new session).
    Tenant,
}

/// Idempotency settings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct IdempotencyConfig {
    /// The non-idempotent tools (default: none).
    pub tools: BTreeSet<String>,
    /// The `params._meta` key of the idempotency key. Default `idempotency_key`.
    pub meta_key: String,
    /// The header of the idempotency key. Default `idempotency-key`.
    pub header: String,
    /// A listed tool called without a key. Default `allow`.
    pub missing: Missing,
    /// Whose calls share a key: `session` (default) or `tenant`.
    pub scope: KeyScope,
    /// How long an answer is kept (`ttl_ms`). Default 10 min.
    #[serde(rename = "ttl_ms")]
    pub ttl: NonZeroDuration,
    /// Keys kept at most; past it, expired ones are dropped and, if still full, new keys are
    /// not protected. Default 10 000.
    pub max_entries: NonZeroUsize,
}

impl Default for IdempotencyConfig {
    fn default() -> Self {
        IdempotencyConfig {
            tools: BTreeSet::new(),
            meta_key: "idempotency_key".into(),
            header: "idempotency-key".into(),
            missing: Missing::Allow,
            scope: KeyScope::Session,
            ttl: NonZeroDuration::of(Duration::from_secs(600)),
            max_entries: NonZeroUsize::new(10_000).unwrap(),
        }
    }
}

impl IdempotencyConfig {
    /// Checks every rule; the error names the field and the rule.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if http::HeaderName::from_bytes(self.header.as_bytes()).is_err() {
            return Err(ConfigError::new(
                "idempotency.header",
                format!("{:?} is not a header name", self.header),
            ));
        }
        if self.meta_key.is_empty() {
            return Err(ConfigError::new(
                "idempotency.meta_key",
                "must not be empty",
            ));
        }
        Ok(())
    }
}

/// Bytes of one answer kept at most: a longer answer is not kept, and its duplicates are told
/// so instead of running again.
pub const MAX_KEPT_ANSWER: usize = 1024 * 1024;
/// Bytes of the answers one layer keeps at once, all keys together: past it, answers are not
/// kept (as with [`MAX_KEPT_ANSWER`]) until older ones expire.
pub const MAX_KEPT_BYTES: usize = 64 * 1024 * 1024;

/// How the first call with a key was answered.
#[derive(Debug, Clone)]
enum Answer {
    /// The raw `result` or `error` member of the JSON-RPC response, replayed as it is.
    Kept(Arc<Kept>),
    /// An answer past [`MAX_KEPT_ANSWER`] or [`MAX_KEPT_BYTES`]: the call ran, its answer is
    /// not replayed.
    TooLarge,
}

/// A kept answer, counted in its layer's kept bytes while it lives.
#[derive(Debug)]
struct Kept {
    member: &'static str,
    value: Box<RawValue>,
    _counted: Counted,
}

/// Bytes counted in a layer's total of kept answers, given back on drop.
#[derive(Debug)]
struct Counted {
    bytes: usize,
    total: Arc<AtomicUsize>,
}

impl Counted {
    /// Counts `bytes` in `total`, if that stays within [`MAX_KEPT_BYTES`].
    fn new(bytes: usize, total: &Arc<AtomicUsize>) -> Option<Counted> {
        let after = total.fetch_add(bytes, Ordering::Relaxed) + bytes;
        let counted = Counted {
            bytes,
            total: total.clone(),
        };
        (after <= MAX_KEPT_BYTES).then_some(counted)
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.total.fetch_sub(self.bytes, Ordering::Relaxed);
    }
}

/// How the first call with a key ended.
#[derive(Debug, Clone)]
enum Settled {
    Answered(Answer),
    /// Refused by stormgate, never answered, or abandoned: nothing kept, a retry runs.
    Retry,
}

#[derive(Debug)]
enum Entry {
    Running(watch::Receiver<Option<Settled>>, u64),
    Done(Answer, Instant, u64),
}

impl Entry {
    /// The hash of what the entry was made for: its whole key and its arguments.
    fn arguments(&self) -> u64 {
        match self {
            Entry::Running(_, a) | Entry::Done(_, _, a) => *a,
        }
    }
}

/// An entry's place: the keyed hash of (tenant, session or "" for tenant scope, tool, key).
type Key = u64;

struct State {
    config: Live<IdempotencyConfig>,
    entries: Bounded<Entry>,
    /// A second key, random per layer, for what an entry was made for: the whole key and the
    /// arguments. Two keys sharing a place (a 64-bit collision) then read as a reuse with
    /// other arguments, refused, and never as the other's answer.
    made_for: std::hash::RandomState,
    switch: Switch,
    /// Bytes of the answers kept now.
    kept: Arc<AtomicUsize>,
    /// A POST no classify layer read is logged once per layer.
    unread: crate::call::Unread,
}

impl State {
    /// The settings a request of `call` runs under: its snapshot's, else the layer's own.
    fn config_for<'a>(&self, call: &'a Call) -> Read<'a, IdempotencyConfig> {
        self.config.read(call.snapshot())
    }
}

/// Builds [`Idempotent`] services. See the [module docs](crate::idempotency).
#[derive(Clone)]
pub struct IdempotencyLayer {
    shared: Arc<State>,
}

impl std::fmt::Debug for IdempotencyLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdempotencyLayer")
            .field("config", &self.shared.config.load())
            .field("entries", &self.shared.entries.len())
            .finish()
    }
}

impl IdempotencyLayer {
    /// A layer with these settings (validated), always adaptive.
    pub fn new(config: IdempotencyConfig) -> Result<Self, ConfigError> {
        Self::with_switch(config, Switch::default())
    }

    /// A layer with these settings that follows the kill switch `switch`: in `off` mode a
    /// listed tool called without a key is let through even with `missing = "reject"` (keys
    /// still deduplicate: a replay is an answer, not a refusal).
    pub fn with_switch(config: IdempotencyConfig, switch: Switch) -> Result<Self, ConfigError> {
        config.validate()?;
        Ok(IdempotencyLayer {
            shared: Arc::new(State {
                config: Live::new(config),
                entries: Bounded::new(),
                made_for: std::hash::RandomState::new(),
                switch,
                kept: Arc::default(),
                unread: Default::default(),
            }),
        })
    }

    /// The settings in force.
    pub fn config(&self) -> Arc<IdempotencyConfig> {
        self.shared.config.load()
    }

    /// The settings `call` runs under (its request's snapshot's).
    #[cfg(test)]
    pub(crate) fn config_of<'a>(&self, call: &'a Call) -> Read<'a, IdempotencyConfig> {
        self.shared.config_for(call)
    }

    /// The layer's settings cell, for a control's snapshots.
    pub(crate) fn cell(&self) -> &Live<IdempotencyConfig> {
        &self.shared.config
    }

    /// Takes new settings; kept answers stay.
    pub fn reconfigure(&self, config: IdempotencyConfig) -> Result<(), ConfigError> {
        config.validate()?;
        self.set_config(config);
        Ok(())
    }

    /// [`reconfigure`](Self::reconfigure) with settings already validated.
    pub(crate) fn set_config(&self, config: IdempotencyConfig) {
        self.shared.config.store(Arc::new(config));
    }
}

impl<S> Layer<S> for IdempotencyLayer {
    type Service = Idempotent<S>;

    fn layer(&self, inner: S) -> Idempotent<S> {
        Idempotent {
            inner,
            shared: self.shared.clone(),
        }
    }
}

/// Runs each write once per idempotency key. Built by [`IdempotencyLayer`].
#[derive(Clone)]
pub struct Idempotent<S> {
    inner: S,
    shared: Arc<State>,
}

impl<S> std::fmt::Debug for Idempotent<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Idempotent").finish_non_exhaustive()
    }
}

fn key_of(
    calls: &Calls,
    parts: &http::request::Parts,
    config: &IdempotencyConfig,
) -> Option<String> {
    let call = calls.single()?;
    let header = parts
        .headers
        .get(config.header.as_str())
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty())
        .map(str::to_owned);
    header.or_else(|| {
        #[derive(Deserialize)]
        struct Params<'a> {
            #[serde(borrow, default)]
            params: Option<Inner<'a>>,
        }
        #[derive(Deserialize)]
        struct Inner<'a> {
            #[serde(borrow, rename = "_meta", default)]
            meta: Option<&'a RawValue>,
        }
        let raw = calls.raw(0);
        let parsed: Params<'_> = serde_json::from_slice(&raw).ok()?;
        let meta = parsed.params?.meta;
        Meta::new(meta.map(RawValue::get))
            .get_str(&config.meta_key)
            .map(|k| k.into_owned())
            .filter(|_| call.tool.is_some())
    })
}

fn replay(call: &Call, answer: &Answer) -> Response {
    let Answer::Kept(kept) = answer else {
        let id = call.id.as_ref().map(|i| i.raw());
        let message = "the call with this idempotency key already ran; its answer was too large \
                       to keep, so it is not replayed";
        return reply::json_response(
            StatusCode::OK,
            reply::error_element(id, INTERNAL_ERROR, message),
        );
    };
    let id = call.id.as_ref().map_or("null", |i| i.as_json());
    reply::json_response(
        StatusCode::OK,
        format!(
            r#"{{"jsonrpc":"2.0","id":{id},"{}":{}}}"#,
            kept.member,
            kept.value.get()
        ),
    )
}

/// JSON-RPC's internal error: a duplicate whose first answer was not kept.
const INTERNAL_ERROR: i64 = -32603;

/// The answer to a call that reuses a key with other arguments: -32602, nothing ran, and no
/// other call's answer is given.
fn reused_key(call: &Call) -> Response {
    invalid_params(call, "idempotency key reused with different arguments")
}

fn missing_key(call: &Call, config: &IdempotencyConfig) -> Response {
    let message = format!(
        "tool {:?} is not idempotent: send an idempotency key in params._meta.{} or the {} header",
        call.tool.as_deref().unwrap_or(""),
        config.meta_key,
        config.header
    );
    invalid_params(call, &message)
}

/// A JSON-RPC -32602 error answer to `call` (its id echoed verbatim).
fn invalid_params(call: &Call, message: &str) -> Response {
    let id = call.id.as_ref().map(|i| i.raw());
    reply::json_response(StatusCode::OK, reply::error_element(id, -32602, message))
}

impl<S, ResBody> Service<Request<Body>> for Idempotent<S>
where
    S: Service<Request<Body>, Response = http::Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ResBody: http_body::Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    type Response = Response;
    type Error = S::Error;
    // Calls with nothing to deduplicate pass unboxed; the rest are one boxed state machine.
    type Future = ResponseFuture<S::Future, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        let calls = req.extensions().get::<Calls>();
        if calls.is_none() {
            self.shared.unread.check(&req, "IdempotencyLayer");
        }
        let single = calls.and_then(Calls::single);
        let listed = single
            .filter(|c| {
                let tools = &self.shared.config_for(c).tools;
                c.tool.as_deref().is_some_and(|t| tools.contains(t))
            })
            .cloned();
        let Some(call) = listed else {
            // Not a listed tool: the readied inner service, called in place.
            return ResponseFuture::inner(self.inner.call(req));
        };
        // A listed call may wait for its key's first call: it takes the readied service.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        // Kept by the future that waits for the first call.
        let config = self.shared.config.read_shared(call.snapshot());
        let (parts, body) = req.into_parts();
        let key = parts
            .extensions
            .get::<Calls>()
            .and_then(|calls| key_of(calls, &parts, &config));
        let req = Request::from_parts(parts, body);
        let Some(key) = key else {
            let off = self.shared.switch.of(&call).mode == Mode::Off;
            return match config.missing {
                Missing::Reject if !off => ResponseFuture::own(missing_key(&call, &config)),
                Missing::Allow | Missing::Reject => ResponseFuture::inner(inner.call(req)),
            };
        };
        let shared = self.shared.clone();
        let session = match config.scope {
            KeyScope::Session => call.session.as_str(),
            KeyScope::Tenant => "",
        };
        let whole = (
            call.tenant.as_str(),
            session,
            call.tool.as_deref().unwrap_or(""),
            key.as_str(),
        );
        let key: Key = shared.entries.key(&whole);
        let arguments = std::hash::BuildHasher::hash_one(
            &shared.made_for,
            (whole, call.arguments().unwrap_or("").trim()),
        );
        ResponseFuture::waiting(Box::pin(async move {
            loop {
                match lead_or_follow(&shared, key, arguments, &config) {
                    Role::Replay(answer) => return Ok(replay(&call, &answer)),
                    Role::Mismatch => return Ok(reused_key(&call)),
                    Role::Follow(mut rx) => {
                        // Wait for the first call; a refusal lets one of us run.
                        let settled = loop {
                            if let Some(s) = rx.borrow_and_update().clone() {
                                break Some(s);
                            }
                            if rx.changed().await.is_err() {
                                break None;
                            }
                        };
                        if let Some(Settled::Answered(answer)) = settled {
                            return Ok(replay(&call, &answer));
                        }
                    }
                    Role::Unprotected => {
                        return Ok(inner.ready().await?.call(req).await?.map(Body::new));
                    }
                    Role::Lead(tx) => {
                        let res = inner.ready().await?.call(req).await?.map(Body::new);
                        let refused = RefusedCalls::of(&res).contains(&call.seq);
                        let settle = Settle {
                            shared,
                            key,
                            arguments,
                            tx: Some(tx),
                            ttl: config.ttl.get(),
                        };
                        if refused {
                            settle.finish(Settled::Retry);
                            return Ok(res);
                        }
                        let scan = Scan::new(Framing::or_json(res.headers()));
                        let capture = Capture {
                            id: call.id.as_ref().map(|i| i.as_json().to_owned()),
                            settle: Some(settle),
                        };
                        return Ok(
                            res.map(|b| Body::new(AnswerBody::new(b, Scanned::new(scan, capture))))
                        );
                    }
                }
            }
        }))
    }
}

enum Role {
    Lead(watch::Sender<Option<Settled>>),
    Follow(watch::Receiver<Option<Settled>>),
    Replay(Answer),
    /// The key was used with other arguments: refused, nothing runs.
    Mismatch,
    Unprotected,
}

fn lead_or_follow(shared: &State, key: Key, arguments: u64, config: &IdempotencyConfig) -> Role {
    let now = Instant::now();
    let entries = &shared.entries;
    if entries.len() >= config.max_entries.get() && !entries.contains(key) {
        entries.retain(|e| !matches!(e, Entry::Done(_, until, _) if *until <= now));
    }
    let fresh = || Entry::Running(watch::channel(None).1, arguments);
    entries
        .with_entry(key, config.max_entries.get(), fresh, |entry| {
            let live = match &*entry {
                Entry::Done(_, until, _) => *until > now,
                Entry::Running(rx, _) => rx.has_changed().is_ok() && rx.borrow().is_none(),
            };
            match &*entry {
                _ if live && entry.arguments() != arguments => Role::Mismatch,
                Entry::Done(answer, _, _) if live => Role::Replay(answer.clone()),
                // A first call is running (its sender alive, nothing settled yet): wait for it.
                Entry::Running(rx, _) if live => Role::Follow(rx.clone()),
                _ => {
                    // Fresh, expired, or left by a first call that will not answer: this call
                    // leads.
                    let (tx, rx) = watch::channel(None);
                    *entry = Entry::Running(rx, arguments);
                    Role::Lead(tx)
                }
            }
        })
        .unwrap_or(Role::Unprotected)
}

/// Settles a key once: keeps the answer (or frees the key for a retry) and wakes duplicates.
/// Dropped without finishing (the client went away): a retry runs.
struct Settle {
    shared: Arc<State>,
    key: Key,
    arguments: u64,
    tx: Option<watch::Sender<Option<Settled>>>,
    ttl: Duration,
}

impl Settle {
    fn finish(mut self, settled: Settled) {
        self.settle(settled);
    }

    fn settle(&mut self, settled: Settled) {
        let Some(tx) = self.tx.take() else { return };
        match &settled {
            Settled::Answered(answer) => {
                self.shared.entries.replace(
                    self.key,
                    Entry::Done(answer.clone(), Instant::now() + self.ttl, self.arguments),
                );
            }
            Settled::Retry => {
                self.shared.entries.remove(self.key);
            }
        }
        let _ = tx.send(Some(settled));
    }
}

impl Drop for Settle {
    fn drop(&mut self) {
        self.settle(Settled::Retry);
    }
}

/// The answer `message` gives to the call with `id`, kept if it fits.
fn answer_in(message: &Message<'_>, id: Option<&str>, kept: &Arc<AtomicUsize>) -> Option<Answer> {
    let same = match (id, message.id) {
        (Some(id), Some(_)) => message.answers(id),
        (None, None) => true,
        _ => false,
    };
    if !same || !(message.result || message.error) {
        return None;
    }
    #[derive(Deserialize)]
    struct Members<'a> {
        #[serde(borrow, default)]
        result: Option<&'a RawValue>,
        #[serde(borrow, default)]
        error: Option<&'a RawValue>,
    }
    let members = message
        .raw
        .and_then(|raw| serde_json::from_slice::<Members<'_>>(raw).ok());
    let (member, value) = match members {
        Some(Members {
            result: Some(r), ..
        }) => ("result", r),
        Some(Members { error: Some(e), .. }) => ("error", e),
        // Too long to keep: the call ran all the same.
        _ => return Some(Answer::TooLarge),
    };
    Some(match Counted::new(value.get().len(), kept) {
        Some(counted) => Answer::Kept(Arc::new(Kept {
            member,
            value: value.to_owned(),
            _counted: counted,
        })),
        None => Answer::TooLarge,
    })
}

/// The first call's listener: keeps the answer with its id once it has passed, or frees the
/// key for a retry if the answer ends (or fails) without it.
struct Capture {
    id: Option<String>,
    settle: Option<Settle>,
}

impl Listener for Capture {
    fn wants(&self) -> bool {
        self.settle.is_some()
    }

    fn keep(&self) -> usize {
        MAX_KEPT_ANSWER
    }

    fn message(&mut self, message: &Message<'_>) {
        let Some(kept) = self.settle.as_ref().map(|s| s.shared.kept.clone()) else {
            return;
        };
        if let Some(answer) = answer_in(message, self.id.as_deref(), &kept)
            && let Some(settle) = self.settle.take()
        {
            settle.finish(Settled::Answered(answer));
        }
    }

    fn end(&mut self) {
        if let Some(settle) = self.settle.take() {
            settle.finish(Settled::Retry);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A key whose place holds an entry made for another whole key or other arguments (a
    /// 64-bit collision, or a reuse) is refused, never answered with that entry's answer.
    #[tokio::test]
    async fn an_entry_made_for_another_key_is_never_replayed() {
        let layer = IdempotencyLayer::new(IdempotencyConfig::default()).unwrap();
        let state = &*layer.shared;
        let config = IdempotencyConfig::default();
        let place = 7;
        let answer = Answer::TooLarge;
        let until = Instant::now() + Duration::from_secs(60);
        state.entries.replace(place, Entry::Done(answer, until, 1));
        assert!(matches!(
            lead_or_follow(state, place, 1, &config),
            Role::Replay(_)
        ));
        assert!(matches!(
            lead_or_follow(state, place, 2, &config),
            Role::Mismatch
        ));
    }

    #[test]
    fn the_key_comes_from_meta_or_the_header() {
        let body = r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"create_order","arguments":{},"_meta":{"idempotency_key":"k1"}}}"#;
        let req = http::Request::post("/mcp").body(()).unwrap();
        let (parts, ()) = req.into_parts();
        let shared = crate::classify::ClassifyLayer::new();
        let calls = shared.classify_for_test(&parts, body);
        assert_eq!(
            key_of(&calls, &parts, &IdempotencyConfig::default()).as_deref(),
            Some("k1")
        );
    }
}

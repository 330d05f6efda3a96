//! Reloads are ordered and transactional, careless documents are refused, the admin routes go
//! through the same path (counted, kept as the last error, logged), and nothing locks the
//! admin API out.

mod common;

use common::{Logs, until};
use stormgate::valid::{Fraction, NonZeroDuration, Positive};

use std::num::NonZeroUsize;
use std::time::Duration;

use axum::body::Body;
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::Value;
use stormgate::control::{Config, Control, ControlError, Mode, Source};
use stormgate::fifo::ResourceLimits;
use tower::ServiceExt;

const EXAMPLE: &str = include_str!("../examples/stormgate.toml");

/// The example configuration with a literal admin token.
fn example() -> String {
    EXAMPLE.replace(
        "token_env = \"STORMGATE_ADMIN_TOKEN\"",
        "token = \"s3cret\"",
    )
}

/// The text up to the last whole line within its first 2 861 bytes.
fn cut_short(text: &str) -> &str {
    &text[..=text[..2861].rfind('\n').unwrap()]
}

fn two_configs() -> (Config, Config) {
    let mut a = Config::default();
    a.budget.stable_budget = Positive::new(1000.0).unwrap();
    a.sessions.base_budget = Positive::new(5.0).unwrap();
    a.breaker.window_calls = 20;
    a.idempotency.max_entries = std::num::NonZeroUsize::new(10).unwrap();
    a.fifo.keys.insert(
        "db".into(),
        ResourceLimits::default().max_concurrent(NonZeroUsize::MIN),
    );
    let mut b = Config::default();
    b.budget.stable_budget = Positive::new(3000.0).unwrap();
    b.sessions.base_budget = Positive::new(9.0).unwrap();
    b.breaker.window_calls = 30;
    b.idempotency.max_entries = std::num::NonZeroUsize::new(20).unwrap();
    b.fifo.keys.insert(
        "db".into(),
        ResourceLimits::default().max_concurrent(NonZeroUsize::new(4).unwrap()),
    );
    (a, b)
}

/// What every stage runs with now equals `config()`, which is one of the two whole configs.
fn assert_whole(control: &Control, a: &Config, b: &Config) {
    let running = control.config();
    let whole = if running.budget == a.budget { a } else { b };
    assert_eq!(
        {
            let mut built = Config::clone(&running);
            built.mode = whole.mode;
            built
        },
        {
            let mut built = whole.clone();
            built.mode = whole.mode;
            built
        },
        "config() is one whole config"
    );
    assert_eq!(
        control.policy().mode,
        running.mode,
        "the mode config() says"
    );
    assert_eq!(control.budget().config().0, running.budget);
    assert_eq!(*control.sessions().config(), running.sessions);
    assert_eq!(*control.breakers().config(), running.breaker);
    assert_eq!(*control.idempotency().config(), running.idempotency);
    assert_eq!(control.limiter().limits("db"), running.fifo.keys["db"]);
}

#[test]
fn concurrent_reloads_and_flips_never_mix_two_configs() {
    let (a, b) = two_configs();
    let control = Control::new(a.clone()).unwrap();
    let modes = [Mode::Off, Mode::Fixed, Mode::Adaptive];
    for round in 0..2000 {
        std::thread::scope(|s| {
            s.spawn(|| control.reload(a.clone()).unwrap());
            s.spawn(|| control.reload(b.clone()).unwrap());
            s.spawn(|| control.set_mode(modes[round % 3]));
        });
        assert_whole(&control, &a, &b);
    }
}

#[test]
fn a_refused_change_changes_nothing_and_says_which_field() {
    let (a, b) = two_configs();
    let control = Control::new(a.clone()).unwrap();
    type Change = fn(&mut Config);
    let cases: [(&str, Change); 4] = [
        ("budget.floor", |c| {
            c.budget.floor = Some(Positive::new(1.0e6).unwrap())
        }),
        ("budget.sample_interval_ms", |c| {
            c.budget.sample_interval = NonZeroDuration::new(Duration::from_millis(250)).unwrap()
        }),
        ("sessions.window_size_ms", |c| {
            c.sessions.window_size = NonZeroDuration::new(Duration::from_secs(30)).unwrap()
        }),
        ("sessions.buckets", |c| {
            c.sessions.buckets = c.sessions.buckets.saturating_add(1)
        }),
    ];
    for (field, change) in cases {
        let mut next = b.clone();
        change(&mut next);
        let err = control.reload(next).unwrap_err();
        assert_eq!(err.config_error().map(|e| &*e.field), Some(field), "{err}");
        assert_eq!(control.last_error(), Some(err.to_string()));
        assert_eq!(*control.config(), a, "nothing changed");
        assert_whole(&control, &a, &b);
    }
    control.reload(b.clone()).unwrap();
    assert_eq!(control.last_error(), None);
    assert_whole(&control, &a, &b);
    assert_eq!(
        control.budget().config().0.stable_budget,
        Positive::new(3000.0).unwrap()
    );
}

#[test]
fn empty_and_cut_short_documents_are_refused_unless_they_say_replace() {
    let control = Control::new(Config::from_toml(&example()).unwrap()).unwrap();
    let running = control.config();
    for empty in ["", "\n\n# nothing yet\n"] {
        let err = control.reload_document(empty, Source::File).unwrap_err();
        assert!(matches!(err, ControlError::Empty), "{err}");
        assert_eq!(control.config(), running);
    }
    // The example cut short after its first ~2 800 bytes (as an operator's half-written
    // file was).
    let text = example();
    let err = control
        .reload_document(cut_short(&text), Source::File)
        .unwrap_err();
    let field = &err.config_error().expect("a section named").field;
    assert!(["fifo", "budget", "sessions"].contains(&&**field), "{err}");
    assert_eq!(control.config(), running, "nothing changed");
    assert!(control.admin_router().is_some(), "the admin token stays");

    // The whole file with one change applies; `replace = true` resets on purpose.
    let fixed = text.replace("mode = \"adaptive\"", "mode = \"fixed\"");
    control.reload_document(&fixed, Source::File).unwrap();
    assert_eq!(control.policy().mode, Mode::Fixed);
    assert_eq!(control.config().fifo, running.fifo);
    control
        .reload_document("replace = true\n", Source::File)
        .unwrap();
    assert_eq!(*control.config(), Config::default());
}

async fn send(
    router: &axum::Router,
    method: &str,
    uri: &str,
    auth: Option<&str>,
    body: &str,
) -> (StatusCode, http::HeaderMap, String) {
    let mut req = Request::builder().method(method).uri(uri);
    if let Some(a) = auth {
        req = req.header("authorization", a);
    }
    let res = router
        .clone()
        .oneshot(req.body(Body::from(body.to_owned())).unwrap())
        .await
        .unwrap();
    let (parts, body) = res.into_parts();
    let bytes = body.collect().await.unwrap().to_bytes();
    (
        parts.status,
        parts.headers,
        String::from_utf8(bytes.to_vec()).unwrap(),
    )
}

#[tokio::test(flavor = "current_thread")]
async fn admin_changes_go_through_the_one_reload_counted_kept_and_logged() {
    let logs = Logs::default();
    let _log = tracing::subscriber::set_default(
        tracing_subscriber::fmt().with_writer(logs.clone()).finish(),
    );
    // Another test thread may have cached a callsite's interest before this subscriber
    // existed (seen once in CI: the refusal's log line missing).
    tracing::callsite::rebuild_interest_cache();
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let metrics = recorder.handle();
    let _metrics = metrics::set_default_local_recorder(&recorder);

    let control = Control::new(Config::from_toml(&example()).unwrap()).unwrap();
    let admin = control.admin_router().unwrap();
    let ok = Some("Bearer s3cret");
    let running = control.config();

    // 401 says how to authenticate; the scheme is case-insensitive.
    let (status, headers, body) = send(&admin, "GET", "/mode", None, "").await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(headers["www-authenticate"], "Bearer realm=\"stormgate\"");
    assert_eq!(body, "");
    let (status, _, _) = send(&admin, "GET", "/mode", Some("bearer s3cret"), "").await;
    assert_eq!(status, StatusCode::OK);

    // A POST that leaves out sections is refused, counted, kept, logged.
    let (status, _, body) = send(&admin, "POST", "/config", ok, "[budget]\nalpha = 0.35\n").await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let error: Value = serde_json::from_str(&body).unwrap();
    let error = error["error"].as_str().unwrap().to_owned();
    assert!(error.contains("this document leaves it out"), "{error}");
    assert_eq!(control.config(), running);
    let (_, _, state) = send(&admin, "GET", "/state", ok, "").await;
    let state: Value = serde_json::from_str(&state).unwrap();
    assert_eq!(state["last_reload_error"], error.as_str());
    assert!(
        metrics
            .render()
            .contains("stormgate_reloads_total{result=\"invalid\"} 1"),
        "{}",
        metrics.render()
    );
    assert!(logs.text().contains("configuration change refused"));
    assert!(logs.text().contains("source=admin"), "{}", logs.text());

    // Replacing on purpose may not remove the token: that would lock the API out.
    let (status, _, body) = send(&admin, "POST", "/config", ok, "replace = true\n").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(body.contains("lock the admin API out"), "{body}");
    assert_eq!(control.config(), running);

    // PATCH changes exactly what it names; the token stays.
    let (status, _, body) = send(&admin, "PATCH", "/config", ok, "[budget]\nalpha = 0.35\n").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(control.config().budget.alpha, Fraction::new(0.35).unwrap());
    assert_eq!(
        {
            let mut built = Config::clone(&control.config());
            built.budget = running.budget.clone();
            built
        },
        *running,
        "nothing else changed"
    );
    let (status, _, _) = send(
        &admin,
        "PATCH",
        "/config",
        ok,
        r#"{"admin":{"token":null}}"#,
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let (status, _, _) = send(&admin, "GET", "/mode", ok, "").await;
    assert_eq!(status, StatusCode::OK, "still reachable with the token");
    assert!(
        metrics
            .render()
            .contains("stormgate_reloads_total{result=\"ok\"} 2")
    );
    assert!(logs.text().contains("configuration reloaded"));
    assert!(
        logs.text().contains("changed=[\"budget\"]"),
        "{}",
        logs.text()
    );

    // A flip is logged with its source too.
    let req = Request::put("/mode")
        .header("authorization", "Bearer s3cret")
        .header("content-type", "application/json")
        .body(Body::from(r#"{"mode":"off"}"#))
        .unwrap();
    assert_eq!(admin.clone().oneshot(req).await.unwrap().status(), 200);
    assert_eq!(control.config().mode, Mode::Off);
    assert!(logs.text().contains("mode set"), "{}", logs.text());
}

#[tokio::test]
async fn a_watched_file_that_is_emptied_or_cut_short_is_refused() {
    let dir = std::env::temp_dir().join(format!("stormgate-cut-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("stormgate.toml");
    std::fs::write(&path, example()).unwrap();
    let control = Control::new(Config::load(&path).unwrap()).unwrap();
    let running = control.config();
    let watch = control.watch_file(path.clone()).unwrap();

    std::fs::write(&path, "").unwrap();
    until("the refusal of the empty file", || {
        control.last_error().is_some_and(|e| e.contains("empty"))
    })
    .await;
    assert_eq!(control.config(), running);
    assert!(control.admin_router().is_some(), "the admin token stays");

    std::fs::write(&path, cut_short(&example())).unwrap();
    until("the refusal of the cut file", || {
        control
            .last_error()
            .is_some_and(|e| e.contains("leaves it out"))
    })
    .await;
    assert_eq!(control.config(), running);

    let text = example().replace("mode = \"adaptive\"", "mode = \"off\"");
    std::fs::write(&path, text).unwrap();
    until("the reload", || control.policy().mode == Mode::Off).await;
    assert_eq!(control.last_error(), None);
    watch.abort();
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Sends `call` with its head now and its body once `between` has run.
async fn split_by(app: &axum::Router, call: &'static str, between: impl FnOnce()) -> Value {
    let (tx, rx) = tokio::sync::oneshot::channel::<Result<bytes::Bytes, std::io::Error>>();
    let body = Body::from_stream(futures::stream::once(async move { rx.await.unwrap() }));
    let started = tokio::spawn(app.clone().oneshot(common::post().body(body).unwrap()));
    tokio::task::yield_now().await;
    between();
    tx.send(Ok(bytes::Bytes::from_static(call.as_bytes())))
        .unwrap();
    common::body_json(started.await.unwrap().unwrap()).await
}

fn answering(control: &Control) -> axum::Router {
    let answer =
        || async { axum::Json(serde_json::json!({"jsonrpc": "2.0", "id": 1, "result": {}})) };
    control.wrap(axum::Router::new().route("/mcp", axum::routing::post(answer)))
}

const PLACE_ORDER: &str = r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"place_order","arguments":{}}}"#;

/// A request whose head arrived before a reload and whose body arrived after it runs under the
/// settings of its head, in every stage: the classifier takes one snapshot of them all.
#[tokio::test]
async fn a_request_runs_under_the_settings_it_started_with() {
    use stormgate::idempotency::Missing;
    let mut a = Config::default();
    a.idempotency.tools.insert("place_order".into());
    a.idempotency.missing = Missing::Reject;
    let b = Config::default(); // nothing listed: every call passes
    let control = Control::new(a).unwrap();
    let app = answering(&control);
    let old = split_by(&app, PLACE_ORDER, || control.reload(b).unwrap()).await;
    assert_eq!(
        old["error"]["code"], -32602,
        "under the first settings: {old}"
    );

    // A request started after the reload runs under the new ones.
    let new = app.oneshot(common::post_body(PLACE_ORDER)).await.unwrap();
    assert_eq!(new.status(), StatusCode::OK);
    let new = common::body_json(new).await;
    assert!(new.get("error").is_none(), "under the new settings: {new}");
}

/// The same for the budget and the kill switch: a call whose head came under fixed mode, its
/// one-call bucket spent, is refused by it even though `off` was set before its body came.
#[tokio::test]
async fn a_request_runs_under_the_mode_it_started_with() {
    let mut fixed = Config::default();
    fixed.mode = Mode::Fixed;
    fixed.fixed.global_rate = Some(Positive::new(0.001).unwrap());
    let control = Control::new(fixed).unwrap();
    let app = answering(&control);
    let first = common::body_json(
        app.clone()
            .oneshot(common::post_body(PLACE_ORDER))
            .await
            .unwrap(),
    )
    .await;
    assert!(
        first.get("error").is_none(),
        "the bucket's one call: {first}"
    );
    let old = split_by(&app, PLACE_ORDER, || control.set_mode(Mode::Off)).await;
    assert_eq!(
        old["error"]["data"]["reason"], "fixed_limit_exceeded",
        "under the mode of its head: {old}"
    );
    let new = common::body_json(app.oneshot(common::post_body(PLACE_ORDER)).await.unwrap()).await;
    assert!(new.get("error").is_none(), "off: {new}");
}

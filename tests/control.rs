//! The kill switch, reloads (code, file, admin routes) and the audit.

mod common;

#[path = "../examples/mcp_server/app.rs"]
mod app;

use std::num::NonZeroUsize;
use std::time::Duration;
use stormgate::valid::Positive;

use axum::body::Body;
use common::{message, session, tool_call, until};
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use stormgate::admit::Admission;
use stormgate::budget::{BudgetConfig, TenantConfig};
use stormgate::control::{AUDIT_PER_SESSION, AdminConfig, Config, Control, Mode};
use stormgate::entropy::SessionConfig;
use stormgate::fifo::ResourceLimits;
use stormgate::outcome::{Observation, Observer, Outcome};
use stormgate::{Call, Reason, Scope, Tenant};
use tower::ServiceExt;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn one_at_a_time() -> Config {
    let mut config = Config::default();
    config.fifo.keys.insert(
        "db".into(),
        ResourceLimits::default().max_concurrent(NonZeroUsize::MIN),
    );
    config
}

#[tokio::test(start_paused = true)]
async fn off_releases_queued_waiters_at_once_and_adaptive_limits_again() {
    let control = Control::new(one_at_a_time()).unwrap();
    let limiter = control.stages().limiter.clone();
    let held = limiter.acquire("db", None).await.unwrap();
    let waiters: Vec<_> = (0..3)
        .map(|_| {
            let l = limiter.clone();
            tokio::spawn(async move { l.acquire("db", None).await.map(|lease| lease.queue_wait()) })
        })
        .collect();
    while limiter.queue_depth("db") < 3 {
        tokio::task::yield_now().await;
    }
    let start = tokio::time::Instant::now();
    control.set_mode(Mode::Off);
    for w in waiters {
        w.await.unwrap().unwrap();
    }
    assert_eq!(start.elapsed(), Duration::ZERO, "released at once");
    assert_eq!(limiter.in_flight("db"), 1, "the held lease only");
    control.set_mode(Mode::Adaptive);
    let queued = tokio::spawn({
        let l = limiter.clone();
        async move { l.acquire("db", None).await.map(drop) }
    });
    while limiter.queue_depth("db") < 1 {
        tokio::task::yield_now().await;
    }
    drop(held);
    queued.await.unwrap().unwrap();
}

#[tokio::test(start_paused = true)]
async fn fixed_enforces_exactly_its_limits() {
    let config = {
        let mut built = Config::default();
        built.mode = Mode::Fixed;
        built.fixed.global_rate = Some(Positive::new(10.0).unwrap());
        built
    };
    let control = Control::new(config).unwrap();
    let call = Call::request("tools/call").with_tool("x");
    let mut admitted = 0;
    for _ in 0..=1000 {
        match control.stages().budget.admit(&call) {
            Ok(_) => admitted += 1,
            Err(r) => {
                assert_eq!(r.reason(), Reason::FixedLimitExceeded);
                assert_eq!(r.scope(), Scope::Global);
            }
        }
        tokio::time::advance(ms(1)).await;
    }
    // A bucket of one: at 0, 100, ..., 1000 ms.
    assert_eq!(admitted, 11);

    // Per tenant: 5 per second each, two tenants, no global limit.
    let control = Control::new({
        let mut built = Config::default();
        built.mode = Mode::Fixed;
        built.fixed.tenant_rate = Some(Positive::new(5.0).unwrap());
        built
    })
    .unwrap();
    let calls = ["a", "b"].map(|t| {
        Call::request("tools/call")
            .with_tool("x")
            .with_tenant(Tenant::new(t))
    });
    let mut per_tenant = [0; 2];
    for _ in 0..=1000 {
        for (i, c) in calls.iter().enumerate() {
            if control.stages().budget.admit(c).is_ok() {
                per_tenant[i] += 1;
            }
        }
        tokio::time::advance(ms(1)).await;
    }
    assert_eq!(per_tenant, [6, 6], "at 0, 200, ..., 1000 ms each");
}

fn observe(control: &Control, failed: bool) {
    let call = Call::request("tools/call").with_tool("x");
    control.stages().budget.observe(&Observation {
        call: &call,
        outcome: if failed { Outcome::Error } else { Outcome::Ok },
        service_time: ms(100),
        response_bytes: 10,
        queue_wait: Duration::ZERO,
        at: tokio::time::Instant::now(),
    });
}

#[tokio::test(start_paused = true)]
async fn back_to_adaptive_resumes_the_learned_budget() {
    let control = Control::new({
        let mut built = Config::default();
        built.fixed.global_rate = Some(Positive::new(50.0).unwrap());
        built
    })
    .unwrap();
    // Two unhealthy ticks: 1000 -> 700 -> 490.
    for _ in 0..2 {
        for _ in 0..10 {
            observe(&control, true);
        }
        control.stages().budget.tick();
    }
    assert!((control.budget().current() - 490.0).abs() < 1e-9);
    control.set_mode(Mode::Fixed);
    assert_eq!(control.policy().mode, Mode::Fixed);
    control.set_mode(Mode::Adaptive);
    assert!(
        (control.budget().current() - 490.0).abs() < 1e-9,
        "not reset to the stable budget"
    );
    assert_eq!(control.config().mode, Mode::Adaptive);
}

#[tokio::test(start_paused = true)]
async fn an_invalid_reload_changes_nothing_and_a_valid_one_keeps_learned_state() {
    let control = Control::new(Config::default()).unwrap();
    for _ in 0..10 {
        observe(&control, true);
    }
    control.stages().budget.tick();
    let learned = control.budget().current();
    assert!(learned < 1000.0);
    let before = control.config();

    let mut bad = Config::default();
    bad.budget.floor = Some(Positive::new(5000.0).unwrap());
    let err = control.reload(bad).unwrap_err();
    let err = err.config_error().expect("a field breaks a rule");
    assert_eq!(
        (&*err.field, &*err.rule),
        ("budget.floor", "must not exceed stable_budget")
    );
    assert_eq!(control.config(), before, "nothing changed");
    assert_eq!(
        control.last_error().as_deref(),
        Some("budget.floor: must not exceed stable_budget")
    );

    let good = {
        let mut built = Config::default();
        built.budget = {
            let mut built = BudgetConfig::default();
            built.stable_budget = Positive::new(2000.0).unwrap();
            built
        };
        built.mode = Mode::Fixed;
        built
    };
    control.reload(good).unwrap();
    assert_eq!(
        control.config().budget.stable_budget,
        Positive::new(2000.0).unwrap()
    );
    assert_eq!(control.policy().mode, Mode::Fixed);
    assert_eq!(
        control.budget().current(),
        learned,
        "the learned budget stays"
    );
    assert_eq!(control.last_error(), None);
}

#[tokio::test]
async fn a_watched_file_reloads_and_a_broken_one_is_reported() {
    let dir = std::env::temp_dir().join(format!("stormgate-watch-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("stormgate.toml");
    std::fs::write(&path, "mode = \"adaptive\"\n").unwrap();
    let control = Control::new(Config::load(&path).unwrap()).unwrap();
    let watch = control.watch_file(path.clone()).unwrap();

    std::fs::write(
        &path,
        "mode = \"fixed\"\n[budget]\nstable_budget = 3000.0\n",
    )
    .unwrap();
    until("the reload", || control.policy().mode == Mode::Fixed).await;
    assert_eq!(
        control.config().budget.stable_budget,
        Positive::new(3000.0).unwrap()
    );

    std::fs::write(&path, "mode = \"off\"\n[budget]\nalpha = 7\n").unwrap();
    until("the error report", || control.last_error().is_some()).await;
    assert!(
        control.last_error().unwrap().contains("alpha"),
        "{:?}",
        control.last_error()
    );
    assert_eq!(
        control.policy().mode,
        Mode::Fixed,
        "the broken file changed nothing"
    );
    watch.abort();
    std::fs::remove_dir_all(&dir).unwrap();
}

async fn send(router: &axum::Router, req: Request<Body>) -> (StatusCode, String) {
    let res = router.clone().oneshot(req).await.unwrap();
    let status = res.status();
    let body = res.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8(body.to_vec()).unwrap())
}

#[tokio::test]
async fn admin_routes_require_the_token() {
    let absent = Control::new(Config::default()).unwrap();
    assert!(
        absent.admin_router().is_none(),
        "no token configured: no routes"
    );

    let control = Control::new({
        let mut built = Config::default();
        built.admin = {
            let mut built = AdminConfig::default();
            built.token = Some("s3cret".into());
            built.token_env = None;
            built
        };
        built
    })
    .unwrap();
    let admin = control.admin_router().unwrap();
    let req = |method: &str, uri: &str, token: Option<&str>, body: &str| {
        let mut b = Request::builder().method(method).uri(uri);
        if let Some(t) = token {
            b = b.header("authorization", format!("Bearer {t}"));
        }
        b.header("content-type", "application/json")
            .body(Body::from(body.to_owned()))
            .unwrap()
    };
    for token in [None, Some("wrong"), Some("s3cre")] {
        let (status, body) = send(&admin, req("GET", "/mode", token, "")).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        assert_eq!(body, "", "no detail");
    }
    let ok = Some("s3cret");
    assert_eq!(
        send(&admin, req("GET", "/mode", ok, "")).await,
        (StatusCode::OK, r#"{"mode":"adaptive"}"#.into())
    );
    let (status, _) = send(&admin, req("PUT", "/mode", ok, r#"{"mode":"off"}"#)).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(control.policy().mode, Mode::Off);

    let whole = "mode = \"off\"\n[admin]\ntoken = \"s3cret\"\n[budget]\nalpha = 0\n";
    let (status, body) = send(&admin, req("POST", "/config", ok, whole)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(body, r#"{"error":"budget.alpha: must be in (0, 1]"}"#);
    assert_eq!(control.policy().mode, Mode::Off, "unchanged");

    let (status, _) = send(
        &admin,
        req(
            "POST",
            "/config",
            ok,
            "mode = \"fixed\"\n[admin]\ntoken = \"s3cret\"\n",
        ),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(control.policy().mode, Mode::Fixed);

    let (status, body) = send(&admin, req("GET", "/config", ok, "")).await;
    assert_eq!(status, StatusCode::OK);
    assert!(!body.contains("s3cret"), "the token is never written back");
    let (status, body) = send(&admin, req("GET", "/state", ok, "")).await;
    assert_eq!(status, StatusCode::OK);
    let state: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(state["mode"], "fixed");
    assert_eq!(state["budget"]["budget"], 1000.0);
}

#[tokio::test(start_paused = true)]
async fn the_audit_keeps_each_sessions_calls_with_queue_wait_and_outcome() {
    let backend = app::Backend::new();
    let mut config = one_at_a_time();
    config.fixed.session_rate = Some(Positive::new(1.0).unwrap());
    config.fifo.tools.insert("sql_scan".into(), "db".into());
    config.costs.tools.insert(
        "sql_scan".into(),
        stormgate::cost::Weight::fixed(1).unwrap(),
    );
    let (router, control) = app::protected(backend, config).unwrap();
    let sid = session(&router).await;
    let calls: Vec<_> = (1..=2)
        .map(|i| {
            let r = router.clone();
            let req = tool_call(&sid, i, "sql_scan", json!({"table": "t"}));
            tokio::spawn(async move { message(r.oneshot(req).await.unwrap()).await })
        })
        .collect();
    for c in calls {
        c.await.unwrap();
    }
    let log = control
        .audit()
        .invocations(&stormgate::SessionId::new(sid.clone()));
    let scans: Vec<_> = log
        .iter()
        .filter(|i| i.target.as_deref() == Some("sql_scan"))
        .collect();
    assert_eq!(scans.len(), 2);
    let mut waits: Vec<u64> = scans.iter().map(|i| i.queue_wait_ms).collect();
    waits.sort();
    assert_eq!(waits, [0, 200], "the second scan waited for the first");
    assert!(
        scans
            .iter()
            .all(|i| i.outcome == Some("ok") && i.service_ms == Some(200))
    );

    // A refusal is audited too (a burst past the fixed session rate), and the log is bounded.
    control.set_mode(Mode::Fixed);
    for i in 0..(AUDIT_PER_SESSION + 10) {
        let req = tool_call(&sid, 100 + i, "cache_get", json!({"key": "k"}));
        message(router.clone().oneshot(req).await.unwrap()).await;
    }
    let log = control.audit().invocations(&stormgate::SessionId::new(sid));
    assert_eq!(log.len(), AUDIT_PER_SESSION);
    let refusal = log
        .iter()
        .find(|i| i.rejection.is_some())
        .expect("a refusal in the log");
    assert_eq!(refusal.rejection, Some("fixed_limit_exceeded"));
    assert_eq!(refusal.outcome, None, "it never ran");
}

#[tokio::test(start_paused = true)]
async fn flips_and_reloads_under_load_fail_no_call() {
    // Adaptive and fixed both refuse much of this load; off refuses nothing.
    let base = {
        let mut built = Config::default();
        built.fixed.session_rate = Some(Positive::new(1.0).unwrap());
        built.sessions = {
            let mut built = SessionConfig::default();
            built.base_budget = Positive::new(2.0).unwrap();
            built.burst = Positive::new(2.0).unwrap();
            built
        };
        built.tenants = TenantConfig::default();
        built
    };
    let (router, control) = app::protected(app::Backend::new(), base.clone()).unwrap();
    let _tasks = control.spawn();
    let sid = session(&router).await;

    // Hundreds of calls in flight through every flip and reload: admitted in off mode, each
    // then runs 50 ms; the flips below take no time, so all of them happen mid-call.
    control.set_mode(Mode::Off);
    let background: Vec<_> = (0..300)
        .map(|i| {
            let r = router.clone();
            let req = tool_call(
                &sid,
                10_000 + i,
                "vector_search",
                json!({"query": format!("q{i}")}),
            );
            tokio::spawn(async move { message(r.oneshot(req).await.unwrap()).await.0 })
        })
        .collect();
    for _ in 0..50 {
        tokio::task::yield_now().await; // let them all be admitted
    }

    let mut next_id = 0;
    let mut refused = std::collections::HashMap::<&str, usize>::new();
    for i in 0..100 {
        // A reload, valid or not, then a flip.
        let before = control.config();
        if i % 2 == 0 {
            let mut bad = base.clone();
            bad.budget.floor = Some(Positive::new(1.0e6).unwrap());
            assert!(control.reload(bad).is_err());
            assert_eq!(
                control.config(),
                before,
                "an invalid reload changes nothing"
            );
        } else {
            let mut good = base.clone();
            good.body_limit = std::num::NonZeroUsize::new(1_000_000 + i).unwrap();
            control.reload(good).unwrap();
        }
        let mode = [Mode::Off, Mode::Fixed, Mode::Adaptive][i % 3];
        control.set_mode(mode);
        // Calls started after the flip see it.
        for _ in 0..3 {
            next_id += 1;
            let req = tool_call(&sid, next_id, "cache_get", json!({"key": "k"}));
            let (msg, _) = message(router.clone().oneshot(req).await.unwrap()).await;
            if let Some(reason) = msg["error"]["data"]["reason"].as_str() {
                *refused
                    .entry(if reason == "fixed_limit_exceeded" {
                        "fixed"
                    } else {
                        "adaptive"
                    })
                    .or_default() += 1;
            }
            match (mode, msg.get("error")) {
                (Mode::Off, None) => {}
                (Mode::Off, Some(e)) => panic!("refused in off mode: {e}"),
                (Mode::Fixed, Some(e)) => assert_eq!(e["data"]["reason"], "fixed_limit_exceeded"),
                (Mode::Adaptive, Some(e)) => {
                    assert_ne!(e["data"]["reason"], "fixed_limit_exceeded")
                }
                (_, None) => assert_eq!(msg["result"]["isError"], false),
            }
        }
    }
    assert!(
        background.iter().all(|h| !h.is_finished()),
        "the flips happened while the background calls were in flight"
    );
    // The load was heavy enough that both limiting modes did refuse: the checks above bit.
    assert!(
        refused.get("fixed").copied().unwrap_or(0) > 10,
        "{refused:?}"
    );
    assert!(
        refused.get("adaptive").copied().unwrap_or(0) > 10,
        "{refused:?}"
    );
    for h in background {
        let msg = h.await.unwrap();
        assert_eq!(
            msg["result"]["isError"], false,
            "no call in flight failed: {msg}"
        );
    }
}

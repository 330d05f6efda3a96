//! The rejection contract: single requests, batches, notifications, protocol versions, the
//! tool-result form.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::body::Body;
use axum::response::Response;
use common::{Recorder, Seen, body_bytes, body_json, ok_json, post, post_body};
use http::{Request, StatusCode};
use serde_json::{Value, json};
use stormgate::admit::{Admission, AdmitLayer};
use stormgate::classify::{Batches, ClassifyLayer};
use stormgate::{Call, Reason, Rejection, RejectionFormat, Scope};
use tower::{Layer, ServiceExt};

/// Refuses every call of the tool `blocked` (1200 ms, session budget); counts every check.
#[derive(Default)]
struct BlockTool {
    checks: AtomicUsize,
}

impl Admission for BlockTool {
    type Permit = ();
    fn admit(&self, call: &Call) -> Result<(), Rejection> {
        self.checks.fetch_add(1, Ordering::SeqCst);
        if call.tool.as_deref() == Some("blocked") {
            Err(Rejection::new(
                Reason::SessionBudgetExceeded,
                Scope::AgentSession,
                Duration::from_millis(1200),
            ))
        } else {
            Ok(())
        }
    }
}

/// A JSON-RPC batch server: answers every request element with `{"echo": id}` in a JSON
/// array, and 202 when there is nothing to answer.
fn batch_server(seen: &Seen) -> Response {
    let items: Vec<Value> = match serde_json::from_slice::<Value>(&seen.body).unwrap() {
        Value::Array(items) => items,
        one => vec![one],
    };
    let answers: Vec<Value> = items
        .iter()
        .filter(|m| m.get("method").is_some() && m.get("id").is_some())
        .map(|m| json!({"jsonrpc": "2.0", "id": m["id"], "result": {"echo": m["id"]}}))
        .collect();
    if answers.is_empty() {
        let mut res = Response::new(Body::empty());
        *res.status_mut() = StatusCode::ACCEPTED;
        return res;
    }
    let mut res = Response::new(Body::from(serde_json::to_vec(&answers).unwrap()));
    res.headers_mut()
        .insert("content-type", "application/json".parse().unwrap());
    res
}

/// An SSE server: one `data:` event per request element.
fn sse_server(seen: &Seen) -> Response {
    let items: Vec<Value> = serde_json::from_slice(&seen.body).unwrap();
    let mut out = String::new();
    for m in items.iter().filter(|m| m.get("id").is_some()) {
        out.push_str(&format!(
            "data: {}\n\n",
            json!({"jsonrpc": "2.0", "id": m["id"], "result": {}})
        ));
    }
    let mut res = Response::new(Body::from(out));
    res.headers_mut()
        .insert("content-type", "text/event-stream".parse().unwrap());
    res
}

struct Stack {
    rec: Recorder,
    admission: Arc<BlockTool>,
    format: RejectionFormat,
    batches: Batches,
}

impl Stack {
    fn new() -> Self {
        Stack {
            rec: Recorder::default(),
            admission: Arc::new(BlockTool::default()),
            format: RejectionFormat::default(),
            batches: Batches::default(),
        }
    }

    async fn call(&self, req: Request<Body>, inner: fn(&Seen) -> Response) -> Response {
        let svc = ClassifyLayer::new()
            .format(self.format.clone())
            .batches(self.batches)
            .layer(AdmitLayer::from_arc(self.admission.clone()).layer(self.rec.service(inner)));
        svc.oneshot(req).await.unwrap()
    }
}

fn tool_call(id: &str, tool: &str) -> String {
    format!(
        r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"{tool}","arguments":{{}}}}}}"#
    )
}

#[tokio::test]
async fn a_rejected_request_gets_the_exact_contract_and_never_reaches_the_inner_service() {
    for id in ["7", r#""abc""#, "-3", "1.5e3", "null"] {
        let stack = Stack::new();
        let res = stack
            .call(post_body(tool_call(id, "blocked")), ok_json)
            .await;
        assert_eq!(res.status(), StatusCode::OK);
        assert_eq!(res.headers()["content-type"], "application/json");
        assert_eq!(
            res.headers()["retry-after"],
            "2",
            "1200 ms rounds up to 2 s"
        );
        let body = body_bytes(res).await;
        let expected = format!(
            r#"{{"jsonrpc":"2.0","id":{id},"error":{{"code":-32029,"message":"rate limited: retry after 1200 ms (session budget exceeded)","data":{{"retry_after_ms":1200,"retryAfterMs":1200,"notProcessed":true,"reason":"session_budget_exceeded","scope":"agent_session","retryable":true,"queue_wait_ms":0}}}}}}"#
        );
        assert_eq!(
            String::from_utf8(body.to_vec()).unwrap(),
            expected,
            "id {id} echoed verbatim"
        );
        assert!(stack.rec.seen().is_empty());
    }
}

#[tokio::test]
async fn an_admitted_request_reaches_the_inner_service_unchanged() {
    let stack = Stack::new();
    let body = tool_call("1", "cache_get");
    let res = stack.call(post_body(body.clone()), ok_json).await;
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(stack.rec.last().body, body.as_bytes());
    assert_eq!(stack.admission.checks.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn the_code_follows_the_declared_protocol_version() {
    for (version, code) in [
        (None, -32029),
        (Some("2025-03-26"), -32029),
        (Some("2025-11-25"), -32029),
        (Some("2026-07-28"), 429),
        (Some("2027-01-01"), 429),
    ] {
        let stack = Stack::new();
        let mut req = post();
        if let Some(v) = version {
            req = req.header("mcp-protocol-version", v);
        }
        let req = req.body(Body::from(tool_call("1", "blocked"))).unwrap();
        let body = body_json(stack.call(req, ok_json).await).await;
        assert_eq!(body["error"]["code"], code, "{version:?}");
    }
    // Both codes are configurable.
    let mut stack = Stack::new();
    stack.format.code = -32001;
    stack.format.modern_code = -31000;
    let legacy = body_json(
        stack
            .call(post_body(tool_call("1", "blocked")), ok_json)
            .await,
    )
    .await;
    assert_eq!(legacy["error"]["code"], -32001);
    let req = post()
        .header("mcp-protocol-version", "2026-07-28")
        .body(Body::from(tool_call("1", "blocked")))
        .unwrap();
    let modern = body_json(stack.call(req, ok_json).await).await;
    assert_eq!(modern["error"]["code"], -31000);
}

#[tokio::test]
async fn tool_result_mode_answers_a_tool_call_with_is_error() {
    let mut stack = Stack::new();
    stack.format.tool_result = true;
    let res = stack
        .call(post_body(tool_call("4", "blocked")), ok_json)
        .await;
    assert_eq!(res.headers()["retry-after"], "2");
    let body = body_json(res).await;
    assert_eq!(
        body,
        json!({"jsonrpc": "2.0", "id": 4, "result": {
            "content": [{"type": "text", "text": "rate limited: retry after 1200 ms (session budget exceeded)"}],
            "isError": true,
            "structuredContent": {"retry_after_ms": 1200, "retryAfterMs": 1200,
                                  "notProcessed": true, "reason": "session_budget_exceeded",
                                  "scope": "agent_session", "retryable": true, "queue_wait_ms": 0}
        }})
    );
    assert!(stack.rec.seen().is_empty());

    // 2026-07-28 requires `resultType` of every result; earlier revisions do not have it.
    let req = post()
        .header("mcp-protocol-version", "2026-07-28")
        .body(Body::from(tool_call("5", "blocked")))
        .unwrap();
    let modern = body_json(stack.call(req, ok_json).await).await;
    assert_eq!(modern["result"]["resultType"], "complete");
    assert_eq!(modern["result"]["isError"], true);
    assert!(body["result"].get("resultType").is_none());
}

#[tokio::test]
async fn the_message_template_is_configurable_in_both_forms() {
    let mut stack = Stack::new();
    stack.format.message = "slow down: {reason_code}, back in {retry_after_s} s".into();
    let error = body_json(
        stack
            .call(post_body(tool_call("1", "blocked")), ok_json)
            .await,
    )
    .await;
    assert_eq!(
        error["error"]["message"],
        "slow down: session_budget_exceeded, back in 2 s"
    );
    stack.format.tool_result = true;
    let result = body_json(
        stack
            .call(post_body(tool_call("2", "blocked")), ok_json)
            .await,
    )
    .await;
    assert_eq!(
        result["result"]["content"][0]["text"],
        "slow down: session_budget_exceeded, back in 2 s"
    );
    let bad = stormgate::control::Config::from_toml("[rejection]\nmessage = \"wait {secs}\"\n");
    assert_eq!(
        bad.unwrap_err().config_error().map(|e| &*e.field),
        Some("rejection.message")
    );
}

/// Refuses everything: for paths where nothing may be refused.
fn refuse_all(_: &Call) -> Result<(), Rejection> {
    Err(Rejection::new(
        Reason::GlobalBudgetExceeded,
        Scope::Global,
        Duration::from_secs(1),
    ))
}

#[tokio::test]
async fn notifications_and_responses_are_never_checked_or_refused() {
    for body in [
        r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":1}}"#,
        r#"{"jsonrpc":"2.0","id":3,"result":{}}"#,
        r#"[{"jsonrpc":"2.0","method":"notifications/progress"},{"jsonrpc":"2.0","id":3,"result":{}}]"#,
    ] {
        let rec = Recorder::default();
        let svc = ClassifyLayer::new()
            .layer(AdmitLayer::new(refuse_all).layer(rec.service(batch_server)));
        let res = svc.oneshot(post_body(body)).await.unwrap();
        assert_eq!(res.status(), StatusCode::ACCEPTED, "{body}");
        assert_eq!(rec.last().body, body.as_bytes());
    }
}

#[tokio::test]
async fn unclassified_requests_pass_unchecked() {
    let rec = Recorder::default();
    let svc = ClassifyLayer::new().layer(AdmitLayer::new(refuse_all).layer(rec.service(ok_json)));
    let res = svc.oneshot(post_body("not json")).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(rec.last().body, "not json");
}

#[tokio::test]
async fn a_mixed_batch_forwards_the_admitted_elements_and_merges_the_answers() {
    let stack = Stack::new();
    let ok1 = tool_call("1", "cache_get");
    let bad = tool_call(r#""two""#, "blocked");
    let note = r#"{"jsonrpc":"2.0","method":"notifications/progress"}"#;
    let ok3 = tool_call("null", "sql_scan");
    let body = format!("[{ok1}, {bad},\n{note} ,{ok3}]");
    let res = stack.call(post_body(body), batch_server).await;
    assert_eq!(res.status(), StatusCode::OK);
    // The inner service saw only the admitted elements (and the notification), exact bytes.
    let seen = stack.rec.last();
    assert_eq!(seen.body, format!("[{ok1},{note},{ok3}]").as_bytes());
    let forwarded = seen.calls.unwrap();
    assert_eq!(forwarded.len(), 3);
    assert!(
        forwarded
            .iter()
            .all(|c| c.tool.as_deref() != Some("blocked"))
    );
    // One answer per request element, matched by id.
    let answers = body_json(res).await;
    let answers = answers.as_array().unwrap();
    assert_eq!(answers.len(), 3);
    let by_id = |id: Value| answers.iter().find(|a| a["id"] == id).unwrap().clone();
    assert_eq!(by_id(json!(1))["result"]["echo"], 1);
    assert_eq!(by_id(Value::Null)["result"]["echo"], Value::Null);
    let refused = by_id(json!("two"));
    assert_eq!(refused["error"]["code"], -32029);
    assert_eq!(
        refused["error"]["data"]["reason"],
        "session_budget_exceeded"
    );
    assert_eq!(
        stack.admission.checks.load(Ordering::SeqCst),
        3,
        "the notification is not checked"
    );
}

#[tokio::test]
async fn batches_are_answered_per_element_only_where_the_protocol_has_them() {
    let body = format!(
        "[{},{}]",
        tool_call("1", "blocked"),
        tool_call("2", "blocked")
    );
    let batch = |version: Option<&str>| {
        let mut req = post();
        if let Some(v) = version {
            req = req.header("mcp-protocol-version", v);
        }
        req.body(Body::from(body.clone())).unwrap()
    };
    // (setting, declared version, classified and answered by stormgate?)
    let cases = [
        (Batches::Auto, None, true),
        (Batches::Auto, Some("2025-03-26"), true),
        (Batches::Auto, Some("2025-06-18"), false),
        (Batches::Auto, Some("2025-11-25"), false),
        (Batches::Auto, Some("2026-07-28"), false),
        (Batches::On, Some("2025-06-18"), true),
        (Batches::Off, None, false),
        (Batches::Off, Some("2025-03-26"), false),
    ];
    for (batches, version, classified) in cases {
        let mut stack = Stack::new();
        stack.batches = batches;
        let res = stack.call(batch(version), batch_server).await;
        let answers = body_json(res).await;
        let seen = stack.rec.seen();
        if classified {
            assert!(
                seen.is_empty(),
                "{batches:?} {version:?}: refused per element"
            );
            assert_eq!(answers[0]["error"]["code"], -32029);
        } else {
            // Forwarded byte for byte, charged nothing: the server's own answer.
            assert_eq!(seen.len(), 1, "{batches:?} {version:?}");
            assert_eq!(seen[0].body, body.as_bytes());
            assert!(seen[0].calls.is_none(), "not classified");
            assert_eq!(
                seen[0].unclassified,
                Some(stormgate::call::Unclassified::BatchUnsupported)
            );
            assert_eq!(answers[0]["result"]["echo"], 1, "{batches:?} {version:?}");
        }
    }
}

#[tokio::test]
async fn a_batch_refused_whole_is_answered_without_the_inner_service() {
    let stack = Stack::new();
    let body = format!(
        "[{},{}]",
        tool_call("1", "blocked"),
        tool_call("2", "blocked")
    );
    let res = stack.call(post_body(body), batch_server).await;
    assert_eq!(res.headers()["retry-after"], "2");
    let answers = body_json(res).await;
    let ids: Vec<Value> = answers
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["id"].clone())
        .collect();
    assert_eq!(ids, [json!(1), json!(2)]);
    assert!(
        answers
            .as_array()
            .unwrap()
            .iter()
            .all(|a| a["error"]["code"] == -32029)
    );
    assert!(stack.rec.seen().is_empty());
}

#[tokio::test]
async fn a_batch_of_refused_requests_and_a_notification_forwards_the_notification() {
    let stack = Stack::new();
    let note = r#"{"jsonrpc":"2.0","method":"notifications/progress"}"#;
    let body = format!("[{},{note}]", tool_call("1", "blocked"));
    let res = stack.call(post_body(body), batch_server).await;
    assert_eq!(
        res.status(),
        StatusCode::OK,
        "202 from the inner service becomes 200 with answers"
    );
    assert_eq!(stack.rec.last().body, format!("[{note}]").as_bytes());
    let answers = body_json(res).await;
    assert_eq!(answers.as_array().unwrap().len(), 1);
    assert_eq!(answers[0]["id"], 1);
    assert_eq!(
        answers[0]["error"]["message"],
        "rate limited: retry after 1200 ms (session budget exceeded)"
    );
}

#[tokio::test]
async fn a_mixed_batch_answered_with_sse_gets_the_refusals_as_first_events() {
    let stack = Stack::new();
    let body = format!(
        "[{},{}]",
        tool_call("1", "cache_get"),
        tool_call("2", "blocked")
    );
    let res = stack.call(post_body(body), sse_server).await;
    assert_eq!(res.headers()["content-type"], "text/event-stream");
    let text = String::from_utf8(body_bytes(res).await.to_vec()).unwrap();
    let events: Vec<Value> = text
        .split("\n\n")
        .filter_map(|e| e.lines().find_map(|l| l.strip_prefix("data: ")))
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    assert_eq!(events.len(), 2);
    assert_eq!(events[0]["id"], 2);
    assert_eq!(events[0]["error"]["code"], -32029);
    assert_eq!(events[1], json!({"jsonrpc": "2.0", "id": 1, "result": {}}));
}

mod batches {
    use super::*;
    use proptest::prelude::*;

    #[derive(Debug, Clone)]
    enum Element {
        Request { id: &'static str, blocked: bool },
        Notification,
        Junk,
    }

    impl Element {
        fn json(&self) -> String {
            match self {
                Element::Request { id, blocked } => {
                    tool_call(id, if *blocked { "blocked" } else { "cache_get" })
                }
                Element::Notification => r#"{"jsonrpc":"2.0","method":"notifications/x"}"#.into(),
                Element::Junk => "17".into(),
            }
        }
    }

    fn element() -> impl Strategy<Value = Element> {
        prop_oneof![
            4 => (prop_oneof![Just("1"), Just("\"s\""), Just("null"), Just("-2.5")], any::<bool>())
                .prop_map(|(id, blocked)| Element::Request { id, blocked }),
            1 => Just(Element::Notification),
            1 => Just(Element::Junk),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Any batch: the inner service receives exactly the elements that were not refused,
        /// byte for byte and in order; every request gets exactly one answer; refused requests
        /// never reach the inner service.
        #[test]
        fn batches_split_and_merge_exactly(elements in proptest::collection::vec(element(), 1..12)) {
            let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
            let stack = Stack::new();
            let body = format!("[{}]", elements.iter().map(Element::json).collect::<Vec<_>>().join(" , "));
            let res = rt.block_on(stack.call(post_body(body.clone()), batch_server));
            let kept: Vec<String> = elements
                .iter()
                .filter(|e| !matches!(e, Element::Request { blocked: true, .. }))
                .map(Element::json)
                .collect();
            let requests = elements.iter().filter(|e| matches!(e, Element::Request { .. })).count();
            let refused = elements.iter().filter(|e| matches!(e, Element::Request { blocked: true, .. })).count();
            let seen = stack.rec.seen();
            if kept.is_empty() {
                prop_assert!(seen.is_empty());
            } else if refused == 0 {
                prop_assert_eq!(&seen[0].body[..], body.as_bytes());
            } else {
                let expected = format!("[{}]", kept.join(","));
                prop_assert_eq!(&seen[0].body[..], expected.as_bytes());
            }
            if requests == 0 {
                prop_assert_eq!(res.status(), StatusCode::ACCEPTED);
            } else {
                let answers = rt.block_on(body_json(res));
                let answers = answers.as_array().unwrap();
                prop_assert_eq!(answers.len(), requests);
                let errors = answers.iter().filter(|a| a.get("error").is_some()).count();
                prop_assert_eq!(errors, refused);
            }
        }
    }
}

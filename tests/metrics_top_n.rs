//! Session ids appear only in the top-N gauges, and a session that leaves the top N is dropped
//! from the scrape by the exporter's idle timeout.

use std::time::Duration;
use stormgate::valid::{Fraction, Positive};

use metrics_exporter_prometheus::PrometheusBuilder;
use metrics_util::MetricKindMask;
use stormgate::admit::Admission;
use stormgate::entropy::{SessionConfig, SessionGuard};
use stormgate::outcome::{Observation, Observer, Outcome};
use stormgate::{Call, SessionId};

fn call(session: &str, query: &str) -> Call {
    Call::request("tools/call")
        .with_tool("search")
        .with_session(SessionId::new(session))
        .with_arguments(&format!(r#"{{"q":"{query}"}}"#))
}

#[test]
fn a_session_that_leaves_the_top_n_leaves_the_scrape() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let _enter = rt.enter();
    // The real exporter, with a short idle timeout for the test (stormgate's is 60 s).
    let recorder = PrometheusBuilder::new()
        .idle_timeout(MetricKindMask::GAUGE, Some(Duration::from_millis(200)))
        .build_recorder();
    let handle = recorder.handle();
    metrics::with_local_recorder(&recorder, || {
        let g = SessionGuard::new({
            let mut built = SessionConfig::default();
            built.top_n = 1;
            built.base_budget = Positive::new(1000.0).unwrap();
            built.burst = Positive::new(1000.0).unwrap();
            built.probation = Fraction::new(1.0).unwrap();
            built
        })
        .unwrap();
        let accept =
            |s: &str| assert!(g.accept(&SessionId::new(s), &stormgate::Tenant::anonymous()));
        accept("busy");
        // Only "busy" so far: it is the top 1.
        for i in 0..5 {
            g.admit(&call("busy", &format!("q{i}"))).unwrap();
        }
        g.sweep();
        let scrape = handle.render();
        assert!(
            scrape.contains(r#"stormgate_session_entropy_bits{session="busy"}"#),
            "{scrape}"
        );
        assert!(
            !scrape.contains(r#"session="calm""#),
            "only the top N carry session ids"
        );

        accept("calm");
        // Now "calm" starts failing and outscores it: "busy" is no longer updated, and expires.
        for i in 0..20 {
            let c = call("calm", &format!("n{i}"));
            g.admit(&c).unwrap();
            g.observe(&Observation {
                call: &c,
                outcome: Outcome::Error,
                service_time: Duration::from_millis(10),
                response_bytes: 10,
                queue_wait: Duration::ZERO,
                at: tokio::time::Instant::now(),
            });
        }
        g.sweep();
        std::thread::sleep(Duration::from_millis(600));
        g.sweep();
        let scrape = handle.render();
        assert!(
            scrape.contains(r#"stormgate_session_entropy_bits{session="calm"}"#),
            "{scrape}"
        );
        assert!(
            !scrape.contains(r#"session="busy""#),
            "dropped after leaving the top N: {scrape}"
        );
    });
}

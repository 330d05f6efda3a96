//! The storm demo (seed 003 section 1): four steady agents, one complex but healthy agent and
//! one runaway agent share the example server's database pool, first with no protection, then
//! behind a fixed per-session rate limit, then behind stormgate. Prints one table and writes
//! `storm.svg`.
//!
//! ```text
//! cargo run --release --example storm [-- --seed N --out storm.svg]
//! ```
//!
//! Every agent is rmcp's own MCP client; the example server is the real rmcp service behind
//! the whole stack, in this process. The run is on tokio's paused clock: three minutes of
//! storm per policy take seconds, and a seed gives the same table every time.

#[path = "../mcp_server/app.rs"]
mod app;
mod inprocess;
mod scenario;

use plotters::prelude::*;
use scenario::{Agent, Policy, Report, Settings};

fn row(r: &Report) -> Vec<String> {
    let steady = r.stats(Agent::Steady);
    let complex = r.stats(Agent::Complex);
    vec![
        r.policy.name(),
        r.slow_queries().to_string(),
        format!("{:.2}/s", steady.goodput),
        format!("{} ms", steady.p99.as_millis()),
        steady.throttled.to_string(),
        format!("{:.2}/s", complex.goodput),
        format!("{} ms", complex.p99.as_millis()),
        format!("{:.2}%", 100.0 * r.complex_throttled()),
        format!("{}/{}", r.runaway_admitted(), r.stats(Agent::Runaway).calls),
        match (
            r.time_to_first_throttle(),
            r.runaway_calls_to_first_throttle(),
        ) {
            (Some(d), Some(n)) => format!("{:.1} s, call {n}", d.as_secs_f64()),
            _ => "never".into(),
        },
        r.calls_after_trouble_until_throttle()
            .map_or("-".into(), |n| n.to_string()),
    ]
}

fn main() {
    let mut settings = Settings::default();
    let mut out = String::from("storm.svg");
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--seed" => settings.seed = args.next().and_then(|v| v.parse().ok()).expect("--seed N"),
            "--out" => out = args.next().expect("--out FILE"),
            other => panic!("unknown argument {other}; use --seed N or --out FILE"),
        }
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .expect("runtime");
    let reports: Vec<Report> = Policy::ALL
        .iter()
        .map(|&p| runtime.block_on(scenario::run(p, settings)))
        .collect();
    let header = [
        "policy",
        "slow queries",
        "steady goodput",
        "steady p99",
        "steady refused",
        "complex goodput",
        "complex p99",
        "complex throttled",
        "runaway admitted",
        "first throttle",
        "calls after trouble",
    ];
    println!("| {} |", header.join(" | "));
    println!("|{}", "---|".repeat(header.len()));
    for r in &reports {
        println!("| {} |", row(r).join(" | "));
    }
    println!();
    for r in &reports {
        let reasons = |agent| {
            let list: Vec<String> = r
                .refusals(agent)
                .iter()
                .map(|(reason, n)| format!("{reason} {n}"))
                .collect();
            if list.is_empty() {
                "none".into()
            } else {
                list.join(", ")
            }
        };
        println!(
            "{}: runaway refused by {}; complex refused by {}",
            r.policy.name(),
            reasons(Agent::Runaway),
            reasons(Agent::Complex),
        );
    }
    chart(&reports, &out).expect("the chart is written");
    println!("\nchart: {out}");
}

/// Three panels over time: the backend's worst pool wait under every policy, and stormgate's
/// global budget and the runaway's storm score in the stormgate run.
fn chart(reports: &[Report], out: &str) -> Result<(), Box<dyn std::error::Error>> {
    let root = SVGBackend::new(out, (1000, 900)).into_drawing_area();
    root.fill(&WHITE)?;
    let panels = root.split_evenly((3, 1));
    let secs = reports[0].settings.duration.as_secs_f64();
    let runaway = reports[0].settings.runaway_start.as_secs_f64();
    let colors = [RED, MAGENTA, CYAN, BLUE];
    let adaptive = reports
        .iter()
        .find(|r| r.policy == Policy::Stormgate)
        .expect("the stormgate run");

    let max_wait = reports
        .iter()
        .flat_map(|r| r.samples.iter().map(|s| s.pool_wait.as_secs_f64() * 1e3))
        .fold(100.0, f64::max);
    let mut c = ChartBuilder::on(&panels[0])
        .caption(
            format!(
                "backend pool wait, worst per {} ms (runaway starts at {runaway} s)",
                scenario::SAMPLE_EVERY.as_millis()
            ),
            ("sans-serif", 18),
        )
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..secs, 0.0..max_wait * 1.05)?;
    c.configure_mesh().x_desc("s").y_desc("ms").draw()?;
    for (r, color) in reports.iter().zip(colors) {
        c.draw_series(LineSeries::new(
            r.samples
                .iter()
                .map(|s| (s.at.as_secs_f64(), s.pool_wait.as_secs_f64() * 1e3)),
            color.stroke_width(2),
        ))?
        .label(r.policy.name())
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
    }
    c.configure_series_labels()
        .border_style(BLACK)
        .background_style(WHITE.mix(0.8))
        .draw()?;

    // The controller and the scorer measure in every mode: the off run shows what they saw
    // while nothing was enforced.
    let off = reports
        .iter()
        .find(|r| r.policy == Policy::Off)
        .expect("the off run");
    let shown = [(off, RED), (adaptive, BLUE)];
    type Metric = fn(&scenario::Sample) -> f64;
    let panels_of: [(&str, &str, Metric); 2] = [
        ("global budget (cost units/s)", "units/s", |s| s.budget),
        ("the runaway session's storm score", "score", |s| {
            s.runaway_score
        }),
    ];
    for (area, (title, unit, metric)) in panels[1..].iter().zip(panels_of) {
        let top = shown
            .iter()
            .flat_map(|(r, _)| r.samples.iter().map(metric))
            .fold(1.0, f64::max);
        let mut c = ChartBuilder::on(area)
            .caption(title, ("sans-serif", 18))
            .margin(10)
            .x_label_area_size(30)
            .y_label_area_size(60)
            .build_cartesian_2d(0.0..secs, 0.0..top * 1.1)?;
        c.configure_mesh().x_desc("s").y_desc(unit).draw()?;
        for (r, color) in shown {
            let label = match r.policy {
                Policy::Off => "off (measured, not enforced)".to_owned(),
                p => p.name(),
            };
            c.draw_series(LineSeries::new(
                r.samples.iter().map(|s| (s.at.as_secs_f64(), metric(s))),
                color.stroke_width(2),
            ))?
            .label(label)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
        }
        c.configure_series_labels()
            .border_style(BLACK)
            .background_style(WHITE.mix(0.8))
            .draw()?;
    }
    root.present()?;
    Ok(())
}

//! The storm demo (the storm, and six more scenarios): steady agents, a complex but healthy
//! agent, a runaway, a clumsy client or a novel worker share the example server's database
//! pool, first with no protection, then behind a fixed per-session rate limit, then behind
//! stormgate, then behind the peers (governor keyed by session, tower-resilience's adaptive
//! concurrency limits). Prints one table per scenario, the refusal reasons and the goals each
//! policy met, and writes `storm.svg` for the storm scenario.
//!
//! ```text
//! cargo run --release --example storm [-- --scenario NAME --policy KEY --seed N --out storm.svg]
//! ```
//!
//! Every agent is rmcp's own MCP client; the example server is the real rmcp service behind
//! the whole stack, in this process. The run is on tokio's paused clock: minutes of storm
//! per policy take seconds, and a seed gives the same tables every time.

#[path = "../mcp_server/app.rs"]
mod app;
mod inprocess;
mod peers;
mod scenario;

use plotters::prelude::*;
use scenario::{Agent, Policy, Report, Scenario, Settings, Verdict};

fn ms(d: std::time::Duration) -> String {
    format!("{} ms", d.as_millis())
}

fn secs(d: Option<std::time::Duration>) -> String {
    d.map_or("never".into(), |d| format!("{:.1} s", d.as_secs_f64()))
}

/// A column of a table: its header and how to fill it from a run.
type Column = (&'static str, fn(&Report) -> String);

/// The table's columns for `scenario`.
fn columns(scenario: Scenario) -> Vec<Column> {
    let mut cols: Vec<Column> = vec![
        ("policy", |r| r.policy.name()),
        ("slow queries", |r| r.slow_queries().to_string()),
        ("steady goodput", |r| {
            format!("{:.2}/s", r.stats(Agent::Steady).goodput)
        }),
        ("steady p99", |r| ms(r.stats(Agent::Steady).p99)),
        ("steady refused", |r| {
            r.stats(Agent::Steady).throttled.to_string()
        }),
    ];
    if scenario.has_complex() {
        cols.extend([
            ("complex goodput", |r: &Report| {
                format!("{:.2}/s", r.stats(Agent::Complex).goodput)
            }),
            ("complex p99", |r: &Report| ms(r.stats(Agent::Complex).p99)),
            ("complex throttled", |r: &Report| {
                format!("{:.2}%", 100.0 * r.complex_throttled())
            }),
        ] as [Column; 3]);
    }
    if scenario.runaway().is_some() {
        cols.extend([
            ("runaway admitted", |r: &Report| {
                format!("{}/{}", r.runaway_admitted(), r.stats(Agent::Runaway).calls)
            }),
            ("first throttle", |r: &Report| {
                match (
                    r.time_to_first_throttle(),
                    r.runaway_calls_to_first_throttle(),
                ) {
                    (Some(d), Some(n)) => format!("{:.1} s, call {n}", d.as_secs_f64()),
                    _ => "never".into(),
                }
            }),
            ("calls after trouble", |r: &Report| {
                r.calls_after_trouble_until_throttle()
                    .map_or("-".into(), |n| n.to_string())
            }),
        ] as [Column; 3]);
    }
    if scenario == Scenario::SlowDrift {
        cols.extend([
            ("steady p99 2x at", |r: &Report| {
                secs(r.steady_p99_doubled_at())
            }),
            ("runaway refused at", |r: &Report| {
                secs(r.runaway_first_refused_at())
            }),
            ("cut first", |r: &Report| match r.runaway_cut_first() {
                Some(true) => "yes".into(),
                Some(false) => "no".into(),
                None => "-".into(),
            }),
        ] as [Column; 3]);
    }
    if scenario.has_clumsy() {
        cols.extend([
            ("clumsy refused", |r: &Report| {
                let s = r.stats(Agent::Clumsy);
                format!("{}/{}", s.throttled, s.calls)
            }),
            ("others refused", |r: &Report| {
                r.others_refused().to_string()
            }),
        ] as [Column; 2]);
    }
    if scenario.has_novel() {
        cols.extend([
            ("novel goodput", |r: &Report| {
                format!("{:.2}/s", r.stats(Agent::Novel).goodput)
            }),
            ("novel p99", |r: &Report| ms(r.stats(Agent::Novel).p99)),
            ("novel refused", |r: &Report| {
                let s = r.stats(Agent::Novel);
                format!(
                    "{:.2}% ({}/{})",
                    100.0 * r.refused_share(Agent::Novel),
                    s.throttled,
                    s.calls
                )
            }),
        ] as [Column; 3]);
    }
    cols.push(("budget min", |r| {
        r.budget_min().map_or("-".into(), |b| format!("{b:.0}"))
    }));
    cols
}

/// One scenario under every policy: its table, the refusals and the goals of each policy.
fn print(scenario: Scenario, reports: &[Report]) {
    println!("## {}\n\n{}\n", scenario.name(), scenario.description());
    let cols = columns(scenario);
    let header: Vec<&str> = cols.iter().map(|(h, _)| *h).collect();
    println!("| {} |", header.join(" | "));
    println!("|{}", "---|".repeat(header.len()));
    for r in reports {
        let row: Vec<String> = cols.iter().map(|(_, f)| f(r)).collect();
        println!("| {} |", row.join(" | "));
    }
    println!();
    let off = reports
        .iter()
        .find(|r| r.policy == Policy::Off)
        .expect("the off run");
    let agents: Vec<Agent> = Agent::ALL
        .into_iter()
        .filter(|&a| reports[0].stats(a).calls > 0)
        .collect();
    for r in reports {
        let refusals: Vec<String> = agents
            .iter()
            .map(|&agent| {
                let list: Vec<String> = r
                    .refusals(agent)
                    .iter()
                    .map(|(reason, n)| format!("{reason} {n}"))
                    .collect();
                let list = if list.is_empty() {
                    "none".into()
                } else {
                    list.join(", ")
                };
                format!("{} refused by {list}", agent.name())
            })
            .collect();
        println!("- {}: {}", r.policy.name(), refusals.join("; "));
        let goals = scenario::goals(r, off);
        let judged = goals
            .iter()
            .filter(|g| g.verdict != Verdict::NotApplicable)
            .count();
        let met = goals.iter().filter(|g| g.verdict == Verdict::Met).count();
        let each: Vec<String> = goals
            .iter()
            .map(|g| {
                let verdict = match g.verdict {
                    Verdict::Met => "met",
                    Verdict::Missed => "MISSED",
                    Verdict::NotApplicable => "n/a",
                };
                format!("{}: {verdict} ({})", g.name, g.detail)
            })
            .collect();
        println!("  goals met {met}/{judged}: {}", each.join("; "));
    }
    println!();
}

fn main() {
    let mut seed = None;
    let mut only = None;
    let mut out = String::from("storm.svg");
    let mut policies: Vec<Policy> = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--seed" => seed = Some(args.next().and_then(|v| v.parse().ok()).expect("--seed N")),
            "--out" => out = args.next().expect("--out FILE"),
            "--policy" => {
                let key = args.next().expect("--policy KEY");
                policies.push(Policy::from_key(&key).unwrap_or_else(|| {
                    let keys: Vec<String> = Policy::ALL.iter().map(|p| p.key()).collect();
                    panic!("unknown policy {key}; one of {}", keys.join(", "))
                }));
            }
            "--scenario" => {
                let name = args.next().expect("--scenario NAME");
                only = Some(Scenario::from_name(&name).unwrap_or_else(|| {
                    let names: Vec<&str> = Scenario::ALL.iter().map(|s| s.name()).collect();
                    panic!("unknown scenario {name}; one of {}", names.join(", "))
                }));
            }
            other => {
                panic!(
                    "unknown argument {other}; use --scenario NAME, --policy KEY, --seed N or --out FILE"
                )
            }
        }
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .expect("runtime");
    for scenario in Scenario::ALL {
        if only.is_some_and(|o| o != scenario) {
            continue;
        }
        let mut settings = Settings::new(scenario);
        if let Some(seed) = seed {
            settings.seed = seed;
        }
        // `off` always runs: every goal is judged against it.
        let reports: Vec<Report> = Policy::ALL
            .iter()
            .filter(|&&p| p == Policy::Off || policies.is_empty() || policies.contains(&p))
            .map(|&p| runtime.block_on(scenario::run(p, settings)))
            .collect();
        print(scenario, &reports);
        if scenario == Scenario::Storm && policies.is_empty() {
            chart(&reports, &out).expect("the chart is written");
            println!("chart: {out}\n");
        }
    }
}

/// Three panels over time: the backend's worst pool wait under every policy, and stormgate's
/// global budget and the runaway's storm score in the stormgate run.
fn chart(reports: &[Report], out: &str) -> Result<(), Box<dyn std::error::Error>> {
    let root = SVGBackend::new(out, (1000, 900)).into_drawing_area();
    root.fill(&WHITE)?;
    let panels = root.split_evenly((3, 1));
    let secs = reports[0].settings.duration.as_secs_f64();
    let runaway = reports[0].settings.runaway_start.as_secs_f64();
    let colors = [
        RED,
        MAGENTA,
        CYAN,
        BLUE,
        GREEN,
        RGBColor(0, 128, 0),
        RGBColor(255, 140, 0),
        BLACK,
    ];
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

//! Statistics every stage shares, as a leaf no stage module is imported by: the
//! exponentially weighted moving average and the healthy-latency baselines that do not creep
//! (one client's, and a tool's over its clients).
//! Pure logic, no runtime.

use std::time::Duration;

/// `d` in nanoseconds, the unit the stages count time in (since an epoch of their own),
/// saturating at `u64::MAX` (585 years).
pub(crate) fn ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// An EWMA of `alpha` in (0, 1]: each sample moves the average `alpha` of the way to it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Ewma {
    alpha: f64,
    value: Option<f64>,
}

impl Ewma {
    /// An empty average. `alpha` must be in (0, 1] (validated by the config).
    pub(crate) fn new(alpha: f64) -> Self {
        debug_assert!(alpha > 0.0 && alpha <= 1.0, "alpha in (0, 1]");
        Ewma { alpha, value: None }
    }

    /// An average that starts at `prior`, as if it had seen it already: the first sample then
    /// moves it only `alpha` of the way (one bad call is not a bad session).
    pub(crate) fn with_prior(alpha: f64, prior: f64) -> Self {
        debug_assert!(alpha > 0.0 && alpha <= 1.0, "alpha in (0, 1]");
        Ewma {
            alpha,
            value: Some(prior),
        }
    }

    /// Folds in one sample and returns the new average.
    pub(crate) fn update(&mut self, sample: f64) -> f64 {
        let next = match self.value {
            None => sample,
            Some(v) => v + self.alpha * (sample - v),
        };
        self.value = Some(next);
        next
    }

    /// The average, `None` before the first sample.
    pub(crate) fn value(&self) -> Option<f64> {
        self.value
    }
}

/// A count of recent events: each adds to it, and it decays exponentially with a time
/// constant, so it reads "about how many within the last time constant". Times are ns from
/// any fixed epoch; a time before the last one counts as the last.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Recent {
    count: f64,
    at: u64,
}

impl Recent {
    /// The count decayed to `now`, time constant `tau` seconds. Nothing to decay (a count of
    /// zero, as a healthy session's failures and refusals are, or no time since the last
    /// event) reads the count as it is, without an `exp`: the same value the decay would give.
    pub(crate) fn at(&self, now: u64, tau: f64) -> f64 {
        if self.count == 0.0 || now <= self.at {
            return self.count;
        }
        let dt = (now - self.at) as f64 / 1e9;
        self.count * (-dt / tau.max(1e-9)).exp()
    }

    /// Adds `x` at `now`.
    pub(crate) fn add(&mut self, now: u64, tau: f64, x: f64) {
        self.count = self.at(now, tau) + x;
        self.at = self.at.max(now);
    }
}

/// Periods of a [`Baseline`].
pub(crate) const BASELINE_PERIOD: Duration = Duration::from_secs(30);
/// Samples a [`CommonBaseline`] needs before it has a value: a tool's latency is judged against
/// its norm only once it has one (two calls of a tool whose duration its arguments choose, 2 s
/// and then 5 s, are not a slowdown). A session's own [`Baseline`] is its norm from its first
/// call: its calls are judged against the slower of the two.
pub(crate) const MIN_SAMPLES: u32 = 5;
/// How many periods with samples a [`Baseline`] remembers: a change of latency becomes the
/// new normal only once it has lasted this many periods (five minutes).
pub(crate) const BASELINE_PERIODS: usize = 10;

/// One client's healthy latency of a tool, that does not creep: the **minimum of the mean
/// service times of the last [`BASELINE_PERIODS`] periods** of [`BASELINE_PERIOD`] that had
/// samples (the one in progress included), like the minimum-RTT estimators of Netflix's
/// concurrency-limits (Vegas) and Envoy's adaptive concurrency (the tool's, over all its
/// clients, is a [`CommonBaseline`]). A slowdown, sudden or drifting, reads as a
/// slowdown for five minutes; only one that lasts longer becomes the baseline. A tool
/// called rarely keeps what it learned (periods without samples are skipped, not counted as
/// fast or slow). Feed it only calls that were not held back (no queue wait, no failure).
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Baseline {
    /// Means of the last completed periods that had samples, oldest first.
    done: std::collections::VecDeque<f64>,
    /// The period in progress: its index, sum and count.
    period: u64,
    sum: f64,
    count: u64,
}

impl Baseline {
    /// Folds in one healthy service time in seconds, seen at `now` (any monotonic clock).
    pub(crate) fn record(&mut self, now: Duration, secs: f64) {
        let period = (now.as_nanos() / BASELINE_PERIOD.as_nanos()) as u64;
        if period != self.period {
            if self.count > 0 {
                if self.done.len() == BASELINE_PERIODS - 1 {
                    self.done.pop_front();
                }
                self.done.push_back(self.sum / self.count as f64);
            }
            (self.period, self.sum, self.count) = (period, 0.0, 0);
        }
        self.sum += secs;
        self.count += 1;
    }

    /// The baseline in seconds, `None` before any sample.
    pub(crate) fn value(&self) -> Option<f64> {
        let current = (self.count > 0).then(|| self.sum / self.count as f64);
        self.done.iter().copied().chain(current).reduce(f64::min)
    }
}

/// Clients a [`CommonBaseline`] counts in one period at most; later ones count from the next.
pub(crate) const PERIOD_CLIENTS: usize = 32;

/// A tool's healthy latency that no single client sets: like [`Baseline`], the minimum over
/// the last [`BASELINE_PERIODS`] periods of [`BASELINE_PERIOD`] that had samples, but each
/// period's value is the **upper median of its clients' mean service times** (at most
/// [`PERIOD_CLIENTS`] clients a period), so a client flooding a tool with fast calls (a cache
/// hit, an empty table) counts once, and moves it only with a majority of the clients. The
/// period in progress counts only until a first period has ended. Feed it only calls that
/// were not held back (no queue wait, no failure).
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct CommonBaseline {
    /// Values of the last completed periods that had samples, oldest first.
    done: std::collections::VecDeque<f64>,
    /// The period in progress: its index, and per client its sum, count and mean, ordered by
    /// the mean (so a median is read, not selected).
    period: u64,
    clients: Vec<PeriodClient>,
    /// Samples recorded, up to [`MIN_SAMPLES`].
    seen: u32,
}

/// One client of a [`CommonBaseline`]'s period in progress.
#[derive(Debug, Clone, Copy, PartialEq)]
struct PeriodClient {
    id: u64,
    sum: f64,
    count: u64,
    /// `sum / count`.
    mean: f64,
}

impl CommonBaseline {
    /// Folds in one healthy service time in seconds of `client`, seen at `now`.
    pub(crate) fn record(&mut self, now: Duration, client: u64, secs: f64) {
        let period = (now.as_nanos() / BASELINE_PERIOD.as_nanos()) as u64;
        if period != self.period {
            if let Some(v) = self.upper_median() {
                if self.done.len() == BASELINE_PERIODS {
                    self.done.pop_front();
                }
                self.done.push_back(v);
            }
            self.period = period;
            self.clients.clear();
        }
        let at = match self.clients.iter().position(|c| c.id == client) {
            Some(at) => {
                let c = &mut self.clients[at];
                c.sum += secs;
                c.count += 1;
                c.mean = c.sum / c.count as f64;
                at
            }
            None if self.clients.len() < PERIOD_CLIENTS => {
                self.clients.push(PeriodClient {
                    id: client,
                    sum: secs,
                    count: 1,
                    mean: secs,
                });
                self.clients.len() - 1
            }
            None => return, // counts from the next period
        };
        self.reorder(at);
        self.seen = (self.seen + 1).min(MIN_SAMPLES);
    }

    /// Moves the client at `at`, whose mean just changed, to its place in the order.
    fn reorder(&mut self, mut at: usize) {
        let c = &mut self.clients;
        while at > 0 && c[at - 1].mean.total_cmp(&c[at].mean).is_gt() {
            c.swap(at - 1, at);
            at -= 1;
        }
        while at + 1 < c.len() && c[at].mean.total_cmp(&c[at + 1].mean).is_gt() {
            c.swap(at, at + 1);
            at += 1;
        }
    }

    /// The value before a call of `secs` seconds of `client` at `now`, which it then teaches
    /// when it `learns`.
    fn teach(&mut self, now: Duration, client: u64, secs: f64, learns: bool) -> Option<f64> {
        let before = self.value();
        if learns {
            self.record(now, client, secs);
        }
        before
    }

    /// The period in progress: the upper median of its clients' means.
    fn upper_median(&self) -> Option<f64> {
        self.clients.get(self.clients.len() / 2).map(|c| c.mean)
    }

    /// What the tool's other clients see now: the upper median of the mean service times
    /// (slow calls included) of the period in progress's clients other than `client`, when
    /// there are at least two of them. A slowdown most clients see at once is the backend's;
    /// one client's alone is its own.
    pub(crate) fn seen_by_others(&self, client: u64) -> Option<f64> {
        let n = self.clients.len();
        let (others, skip) = match self.clients.iter().position(|c| c.id == client) {
            Some(at) => (n - 1, at),
            None => (n, n),
        };
        if others < 2 {
            return None;
        }
        // The others in order are the clients without the one at `skip`.
        let k = others / 2;
        Some(self.clients[if k < skip { k } else { k + 1 }].mean)
    }

    /// The baseline in seconds, `None` before [`MIN_SAMPLES`] samples.
    pub(crate) fn value(&self) -> Option<f64> {
        if self.seen < MIN_SAMPLES {
            return None;
        }
        if self.done.is_empty() {
            self.upper_median()
        } else {
            self.done.iter().copied().reduce(f64::min)
        }
    }
}

/// What [`ToolBaselines::judge`] tells of a tool.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Judged {
    /// Its healthy latency before the call, seconds.
    pub(crate) before: Option<f64>,
    /// Its healthy latency after the call taught it, seconds.
    pub(crate) after: Option<f64>,
    /// What its other clients see now, seconds ([`CommonBaseline::seen_by_others`]).
    pub(crate) others: Option<f64>,
}

/// Tools whose healthy latency is learned at most (a server's tool set may be dynamic; an
/// unknown tool is a client error and never learned).
pub const MAX_TOOLS: usize = 4096;

/// Every tool's [`CommonBaseline`], bounded at [`MAX_TOOLS`] (keyed hashes of the names), one
/// type for the controller and the session guard.
#[derive(Debug)]
pub(crate) struct ToolBaselines {
    tools: crate::bounded::Bounded<std::sync::Arc<std::sync::Mutex<CommonBaseline>>>,
}

impl ToolBaselines {
    pub(crate) fn new() -> Self {
        ToolBaselines {
            tools: crate::bounded::Bounded::new(),
        }
    }

    /// The healthy latency of the tool at `key` (its [`Name`](crate::Name)'s key) before and after a call of `secs` seconds of
    /// `client` at `now`, which teaches it when `learns` (nothing held the call back), and
    /// what its other clients see now ([`CommonBaseline::seen_by_others`]): one lookup, one
    /// lock. (Before and after differ only in the tool's first period, or when it is first
    /// seen: after, the call's client has its vote.)
    pub(crate) fn judge(
        &self,
        key: u64,
        client: u64,
        now: Duration,
        secs: f64,
        learns: bool,
    ) -> Judged {
        self.with(key, learns, |b| Judged {
            before: b.teach(now, client, secs, learns),
            after: b.value(),
            others: b.seen_by_others(client),
        })
        .unwrap_or_default()
    }

    /// [`judge`](Self::judge)'s `before` alone (the call taught the tool the same), for a
    /// caller that needs nothing else: what the other clients see is not computed.
    pub(crate) fn before(
        &self,
        key: u64,
        client: u64,
        now: Duration,
        secs: f64,
        learns: bool,
    ) -> Option<f64> {
        self.with(key, learns, |b| b.teach(now, client, secs, learns))
            .flatten()
    }

    /// Runs `f` on the tool at `key`'s baseline, locked; made first if absent when the call
    /// `learns` (and fewer than [`MAX_TOOLS`] are kept).
    fn with<R>(
        &self,
        key: u64,
        learns: bool,
        f: impl FnOnce(&mut CommonBaseline) -> R,
    ) -> Option<R> {
        let entry = match self.tools.get(key) {
            None if learns => self.tools.get_or_insert(key, MAX_TOOLS, Default::default),
            found => found,
        }?;
        let mut b = entry
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        Some(f(&mut b))
    }

    /// `tool`'s healthy latency, once learned.
    pub(crate) fn get(&self, tool: &str) -> Option<f64> {
        self.tools.get(self.tools.key(tool)).and_then(|b| {
            b.lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .value()
        })
    }

    /// At the cap (a dynamic tool set), forgets every tool to learn afresh rather than stop
    /// learning; the background tick or sweep calls it.
    pub(crate) fn renew_if_full(&self) {
        if self.tools.len() >= MAX_TOOLS {
            self.tools.retain(|_| false);
        }
    }
}

/// Tools one client's `OwnBaselines` holds at most; past it, the tool it called longest
/// ago is forgotten.
pub(crate) const OWN_TOOLS: usize = 4;

/// One client's own healthy latency for each of the few tools it calls: a [`Baseline`] per
/// tool (at most [`OWN_TOOLS`], keyed by the name's key), learned like
/// the tool's, from its own calls that nothing held back. Some work is slow by nature (a new,
/// cold query every call): against its own norm it is not slow, while contention (queue
/// wait) and a slowdown still are. No heap until the first tool is learned.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct OwnBaselines(Vec<(u64, Duration, Baseline)>);

impl OwnBaselines {
    /// [`ToolBaselines::judge`] for this client's own calls of the tool at `key`, with
    /// [`Baseline`]s (one client: the mean of each period).
    pub(crate) fn judge(
        &mut self,
        key: u64,
        now: Duration,
        secs: f64,
        learns: bool,
    ) -> Option<f64> {
        let i = match self.0.iter().position(|(k, ..)| *k == key) {
            Some(i) => i,
            None if learns => {
                if self.0.len() >= OWN_TOOLS
                    && let Some(oldest) = (0..self.0.len()).min_by_key(|&i| self.0[i].1)
                {
                    self.0.swap_remove(oldest);
                }
                self.0.push((key, now, Baseline::default()));
                self.0.len() - 1
            }
            None => return None,
        };
        let (_, last, b) = &mut self.0[i];
        *last = now;
        let before = b.value();
        if learns {
            b.record(now, secs);
        }
        before
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The textbook closed form: s_n = a * sum_{k=1..n} (1-a)^(n-k) x_k + (1-a)^(n-1) * x_1 * (1-a)
    /// written as the direct weighted sum with the first sample as the seed.
    fn naive(alpha: f64, xs: &[f64]) -> f64 {
        let n = xs.len();
        let mut total = xs[0] * (1.0 - alpha).powi(n as i32 - 1);
        for (k, x) in xs.iter().enumerate().skip(1) {
            total += alpha * (1.0 - alpha).powi((n - 1 - k) as i32) * x;
        }
        total
    }

    /// Every sample kept: the mean of each period with samples, the minimum of the last few.
    fn naive_baseline(samples: &[(u64, f64)]) -> Option<f64> {
        let mut periods: Vec<(u64, f64, u64)> = Vec::new();
        for &(ms, x) in samples {
            let p = ms / BASELINE_PERIOD.as_millis() as u64;
            match periods.last_mut() {
                Some(last) if last.0 == p => {
                    last.1 += x;
                    last.2 += 1;
                }
                _ => periods.push((p, x, 1)),
            }
        }
        let keep = periods.len().saturating_sub(BASELINE_PERIODS);
        periods[keep..]
            .iter()
            .map(|(_, sum, n)| sum / *n as f64)
            .reduce(f64::min)
    }

    proptest! {
        /// A [`Recent`] reads the sum of its events, each decayed by the time since it was
        /// added (events in time order).
        #[test]
        fn recent_is_the_sum_of_decayed_events(
            events in proptest::collection::vec((0u64..5_000_000_000, 0.0f64..10.0), 1..40),
            later in 0u64..20_000_000_000,
            tau in 0.1f64..30.0,
        ) {
            let mut t = 0;
            let mut r = Recent::default();
            let mut at = Vec::new();
            for (dt, x) in events {
                t += dt;
                r.add(t, tau, x);
                at.push((t, x));
            }
            let now = t + later;
            let naive: f64 = at
                .iter()
                .map(|&(t, x)| x * (-((now - t) as f64 / 1e9) / tau).exp())
                .sum();
            prop_assert!((r.at(now, tau) - naive).abs() <= 1e-9 * naive.max(1.0));
        }

        /// Reading a [`Recent`] without an `exp` where there is nothing to decay gives, to
        /// the bit, what the decay formula gives.
        #[test]
        fn recent_reads_what_the_decay_formula_reads(
            count in prop_oneof![Just(0.0f64), 0.0f64..1e6],
            at in 0u64..10_000_000_000,
            since in prop_oneof![
                Just(0i64),
                -2_000i64..2_000,
                -10_000_000_000i64..10_000_000_000
            ],
            tau in 0.0f64..30.0,
        ) {
            let r = Recent { count, at };
            let now = at.saturating_add_signed(since);
            let dt = now.saturating_sub(at) as f64 / 1e9;
            let formula = count * (-dt / tau.max(1e-9)).exp();
            prop_assert_eq!(r.at(now, tau).to_bits(), formula.to_bits());
        }

        #[test]
        fn the_baseline_is_the_minimum_of_recent_period_means(
            steps in proptest::collection::vec((0u64..15_000, 0.001f64..10.0), 1..200),
        ) {
            let mut b = Baseline::default();
            let mut at = 0;
            let mut samples = Vec::new();
            for (dt, x) in steps {
                at += dt;
                b.record(Duration::from_millis(at), x);
                samples.push((at, x));
                let (got, want) = (b.value().unwrap(), naive_baseline(&samples).unwrap());
                prop_assert!((got - want).abs() <= 1e-9 * want, "{got} vs {want}");
            }
        }

        #[test]
        fn matches_the_closed_form(
            alpha in 0.01f64..=1.0,
            xs in proptest::collection::vec(-1e6f64..1e6, 1..60),
        ) {
            let mut e = Ewma::new(alpha);
            for &x in &xs {
                e.update(x);
            }
            let expected = naive(alpha, &xs);
            let got = e.value().unwrap();
            prop_assert!((got - expected).abs() <= 1e-6 * (1.0 + expected.abs()), "{got} vs {expected}");
        }

        #[test]
        fn stays_within_the_range_of_its_samples(
            alpha in 0.01f64..=1.0,
            xs in proptest::collection::vec(0f64..1e6, 1..60),
        ) {
            let mut e = Ewma::new(alpha);
            for &x in &xs {
                e.update(x);
            }
            let (lo, hi) = xs.iter().fold((f64::MAX, f64::MIN), |(l, h), &x| (l.min(x), h.max(x)));
            let v = e.value().unwrap();
            prop_assert!(v >= lo - 1e-6 && v <= hi + 1e-6);
        }

        /// Against a naive reference that keeps every tool's samples and forgets, past
        /// OWN_TOOLS tools, the one called longest ago: the same judgements.
        #[test]
        fn own_baselines_keep_the_tools_called_last(
            calls in proptest::collection::vec((0u64..8, 1u64..1000, any::<bool>()), 1..200),
        ) {
            let mut own = OwnBaselines::default();
            // Per tool: its key, when it was last called, and every sample it learned.
            type Samples = Vec<(Duration, f64)>;
            let mut naive: Vec<(u64, u64, Samples)> = Vec::new();
            for (t, (tool, ms, learns)) in calls.into_iter().enumerate() {
                let now = Duration::from_secs(t as u64);
                let secs = ms as f64 / 1e3;
                let got = own.judge(tool, now, secs, learns);
                let expected = match naive.iter().position(|(k, ..)| *k == tool) {
                    Some(i) => {
                        naive[i].1 = t as u64;
                        let mut b = Baseline::default();
                        naive[i].2.iter().for_each(|&(at, x)| b.record(at, x));
                        if learns {
                            naive[i].2.push((now, secs));
                        }
                        b.value()
                    }
                    None => {
                        if learns {
                            if naive.len() == OWN_TOOLS {
                                let oldest = (0..naive.len()).min_by_key(|&i| naive[i].1).unwrap();
                                naive.remove(oldest);
                            }
                            naive.push((tool, t as u64, vec![(now, secs)]));
                        }
                        None
                    }
                };
                prop_assert_eq!(got, expected);
                prop_assert!(own.0.len() <= OWN_TOOLS);
            }
        }

        /// Against a naive reference that keeps every sample: per period, the first
        /// PERIOD_CLIENTS clients' means, their upper median; the minimum over the last
        /// BASELINE_PERIODS completed periods, or the period in progress before any.
        #[test]
        fn common_baseline_is_the_min_of_period_medians(
            samples in proptest::collection::vec((0u64..400, 0u64..40, 1u64..1000), 1..300),
        ) {
            let mut samples = samples;
            samples.sort_by_key(|s| s.0);
            let mut b = CommonBaseline::default();
            let mut seen: Vec<(u64, u64, f64)> = Vec::new();
            let mut counted = 0;
            for &(t, client, ms) in &samples {
                let (now, secs) = (Duration::from_secs(t), ms as f64 / 1e3);
                b.record(now, client, secs);
                let period = t / BASELINE_PERIOD.as_secs();
                let mut clients: Vec<u64> = seen.iter().filter(|s| s.0 == period).map(|s| s.1).collect();
                clients.sort_unstable();
                clients.dedup();
                if clients.contains(&client) || clients.len() < PERIOD_CLIENTS {
                    counted += 1;
                }
                seen.push((period, client, secs));
                let median = |period: u64| {
                    let mut clients: Vec<(u64, f64, u64)> = Vec::new();
                    for &(_, c, x) in seen.iter().filter(|s| s.0 == period) {
                        let known = clients.iter().position(|e| e.0 == c);
                        match known {
                            Some(i) => { clients[i].1 += x; clients[i].2 += 1; }
                            None if clients.len() < PERIOD_CLIENTS => clients.push((c, x, 1)),
                            None => {}
                        }
                    }
                    let mut means: Vec<f64> = clients.iter().map(|e| e.1 / e.2 as f64).collect();
                    means.sort_by(f64::total_cmp);
                    means[means.len() / 2]
                };
                let current = t / BASELINE_PERIOD.as_secs();
                let mut periods: Vec<u64> = seen.iter().map(|s| s.0).filter(|&p| p < current).collect();
                periods.dedup();
                let done: Vec<f64> = periods.iter().rev().take(BASELINE_PERIODS).map(|&p| median(p)).collect();
                let expected = if done.is_empty() {
                    median(current)
                } else {
                    done.into_iter().reduce(f64::min).unwrap()
                };
                let expected = (counted >= MIN_SAMPLES).then_some(expected);
                prop_assert_eq!(b.value(), expected);
            }
        }

        /// What the other clients see, against a naive reference: the upper median, by a
        /// sort, of the means of the period in progress's counted clients but the one asking,
        /// with at least two of them; asked by a counted client and by one that is not.
        #[test]
        fn seen_by_others_is_the_upper_median_of_the_others_means(
            samples in proptest::collection::vec((0u64..100, 0u64..40, 1u64..1000), 1..300),
            asking in proptest::collection::vec(0u64..45, 1..4),
        ) {
            let mut samples = samples;
            samples.sort_by_key(|s| s.0);
            let mut b = CommonBaseline::default();
            let mut period = None;
            let mut clients: Vec<(u64, f64, u64)> = Vec::new();
            for &(t, client, ms) in &samples {
                let secs = ms as f64 / 1e3;
                b.record(Duration::from_secs(t), client, secs);
                let p = t / BASELINE_PERIOD.as_secs();
                if period != Some(p) {
                    period = Some(p);
                    clients.clear();
                }
                match clients.iter().position(|e| e.0 == client) {
                    Some(i) => { clients[i].1 += secs; clients[i].2 += 1; }
                    None if clients.len() < PERIOD_CLIENTS => clients.push((client, secs, 1)),
                    None => {}
                }
                for &who in asking.iter().chain([client].iter()) {
                    let mut means: Vec<f64> = clients
                        .iter()
                        .filter(|e| e.0 != who)
                        .map(|e| e.1 / e.2 as f64)
                        .collect();
                    means.sort_by(f64::total_cmp);
                    let expected = (means.len() >= 2).then(|| means[means.len() / 2]);
                    prop_assert_eq!(b.seen_by_others(who), expected);
                }
            }
        }
    }
}

/// The examples of this module's documentation, run.
#[cfg(test)]
mod examples {
    #[test]
    fn an_ewma_takes_its_first_sample_as_is() {
        use crate::stats::Ewma;

        let mut e = Ewma::new(0.5);
        assert_eq!(e.value(), None);
        e.update(10.0); // the first sample is taken as is
        e.update(20.0);
        assert_eq!(e.value(), Some(15.0));
    }

    #[test]
    fn recent_weight_decays_by_e_per_time_constant() {
        use crate::stats::Recent;

        let mut r = Recent::default();
        r.add(0, 10.0, 1.0);
        r.add(0, 10.0, 1.0);
        assert_eq!(r.at(0, 10.0), 2.0);
        // One time constant later: 2 / e.
        assert!((r.at(10_000_000_000, 10.0) - 2.0 / std::f64::consts::E).abs() < 1e-12);
    }

    #[test]
    fn a_baseline_does_not_creep_with_a_drift() {
        use crate::stats::Baseline;
        use std::time::Duration;

        let mut b = Baseline::default();
        let near = |v: Option<f64>, x: f64| (v.unwrap() - x).abs() < 1e-9;
        let at = |s: u64| Duration::from_secs(s);
        for s in 0..30 {
            b.record(at(s), 0.2); // a healthy first period
        }
        assert!(near(b.value(), 0.2));
        // A drift from 0.2 s to 0.9 s over the next four minutes does not move it.
        for s in 30..=270 {
            b.record(at(s), 0.2 + 0.7 * (s - 30) as f64 / 240.0);
        }
        assert!(near(b.value(), 0.2));
        // Once slow for five whole minutes, the new latency is the norm.
        for s in 271..=600 {
            b.record(at(s), 0.9);
        }
        assert!(near(b.value(), 0.9));
    }

    #[test]
    fn a_common_baseline_is_one_vote_per_client() {
        use crate::stats::CommonBaseline;
        use std::time::Duration;

        let mut b = CommonBaseline::default();
        let at = |ms: u64| Duration::from_millis(ms);
        for ms in (0..30_000).step_by(10) {
            b.record(at(ms), 1, 0.001); // one client: a 1 ms call every 10 ms
            if ms % 1000 == 0 {
                b.record(at(ms), 2, 0.2); // two others: a 200 ms call a second
                b.record(at(ms), 3, 0.2);
            }
        }
        // One vote each: the upper median of 1 ms, 200 ms and 200 ms.
        assert!((b.value().unwrap() - 0.2).abs() < 1e-9);
    }
}

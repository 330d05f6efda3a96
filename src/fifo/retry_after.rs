//! Reading an upstream's Retry-After: the header in both forms, and the hint in an error's text.

use std::time::{Duration, SystemTime};

use http::HeaderValue;

/// Parses a `Retry-After` header: delta-seconds (`120`) or an HTTP-date
/// (`Wed, 21 Oct 2015 07:28:00 GMT`), relative to `now`. A date in the past gives zero.
///
/// ```
/// use std::time::{Duration, SystemTime};
/// use http::HeaderValue;
/// use stormgate::fifo::parse_retry_after;
///
/// let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_445_412_470);
/// assert_eq!(parse_retry_after(&HeaderValue::from_static("5"), now), Some(Duration::from_secs(5)));
/// let date = HeaderValue::from_static("Wed, 21 Oct 2015 07:28:00 GMT");
/// assert_eq!(parse_retry_after(&date, now), Some(Duration::from_secs(10)));
/// ```
pub fn parse_retry_after(value: &HeaderValue, now: SystemTime) -> Option<Duration> {
    let text = value.to_str().ok()?.trim();
    if let Ok(secs) = text.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let at = httpdate::parse_http_date(text).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

/// Reads the retry-after token of an error text such as
/// `HTTP 429 Too Many Requests from export.arxiv.org (retry-after: 5)`: the number after
/// `retry-after`, in seconds, case-insensitive.
///
/// ```
/// use std::time::Duration;
/// use stormgate::fifo::retry_after_from_error_text;
///
/// let text = "HTTP 429 Too Many Requests from export.arxiv.org (retry-after: 5)";
/// assert_eq!(retry_after_from_error_text(text), Some(Duration::from_secs(5)));
/// assert_eq!(retry_after_from_error_text("HTTP 500"), None);
/// ```
pub fn retry_after_from_error_text(text: &str) -> Option<Duration> {
    const TOKEN: &str = "retry-after";
    let lower = text.to_ascii_lowercase();
    let start = lower.find(TOKEN)? + TOKEN.len();
    let rest = lower[start..].trim_start_matches([':', '=', ' ', '\t']);
    let digits: String = rest
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    let secs: f64 = digits.parse().ok()?;
    (secs.is_finite() && secs >= 0.0).then(|| Duration::from_secs_f64(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_forms() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_445_412_480);
        let h = |s: &'static str| parse_retry_after(&HeaderValue::from_static(s), now);
        assert_eq!(h("0"), Some(Duration::ZERO));
        assert_eq!(h(" 30 "), Some(Duration::from_secs(30)));
        assert_eq!(
            h("Wed, 21 Oct 2015 07:28:00 GMT"),
            Some(Duration::ZERO),
            "in the past"
        );
        assert_eq!(
            h("Wed, 21 Oct 2015 07:29:00 GMT"),
            Some(Duration::from_secs(60))
        );
        assert_eq!(h("soon"), None);
        assert_eq!(h("-1"), None);
    }

    #[test]
    fn error_text_forms() {
        let t = retry_after_from_error_text;
        assert_eq!(t("... (Retry-After: 12)"), Some(Duration::from_secs(12)));
        assert_eq!(t("retry-after=1.5"), Some(Duration::from_millis(1500)));
        assert_eq!(t("retry-after: soon"), None);
        assert_eq!(t("no token here 429"), None);
    }
}

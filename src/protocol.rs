//! The MCP wire's names: its headers and protocol revisions (a leaf).

use std::fmt;
use std::str::FromStr;

use http::HeaderName;

// Header names, not text: a lookup by text parses the name on every request.

/// `Mcp-Session-Id`: the session header of MCP revisions before 2026-07-28.
pub const SESSION_ID: HeaderName = HeaderName::from_static("mcp-session-id");
/// `MCP-Protocol-Version`: the revision a request declares.
pub const PROTOCOL_VERSION: HeaderName = HeaderName::from_static("mcp-protocol-version");
/// `Mcp-Method` (MCP 2026-07-28): the request's method, mirrored in a header.
pub const METHOD: HeaderName = HeaderName::from_static("mcp-method");
/// `Mcp-Name` (MCP 2026-07-28): the tool, resource or prompt name, mirrored in a header.
pub const NAME: HeaderName = HeaderName::from_static("mcp-name");
/// `Last-Event-ID`: where a client resumes an SSE stream.
#[cfg(feature = "gateway")]
pub(crate) const LAST_EVENT_ID: HeaderName = HeaderName::from_static("last-event-id");

/// An MCP protocol revision, a date such as `2025-11-25`, ordered by date (held as the
/// number `20251125`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ProtocolVersion(u32);

impl ProtocolVersion {
    /// MCP 2025-03-26, which introduced JSON-RPC batches.
    pub const V2025_03_26: ProtocolVersion = ProtocolVersion(20250326);
    /// MCP 2025-11-25.
    pub const V2025_11_25: ProtocolVersion = ProtocolVersion(20251125);
    /// MCP 2026-07-28, which reserves -32020..-32099 for codes it defines.
    pub const V2026_07_28: ProtocolVersion = ProtocolVersion(20260728);

    /// Whether this revision has JSON-RPC batches: only 2025-03-26 (2025-06-18 removed them).
    pub fn has_batches(self) -> bool {
        self == Self::V2025_03_26
    }

    /// Whether this revision reserves -32020..-32099 (2026-07-28 and later).
    pub fn reserves_rate_limit_code(self) -> bool {
        self >= Self::V2026_07_28
    }
}

/// The error of parsing a [`ProtocolVersion`]: the text is not a `YYYY-MM-DD` date.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidProtocolVersion;

impl fmt::Display for InvalidProtocolVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("protocol version is not a YYYY-MM-DD date")
    }
}

impl std::error::Error for InvalidProtocolVersion {}

impl FromStr for ProtocolVersion {
    type Err = InvalidProtocolVersion;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let b = s.trim().as_bytes();
        let digits = |r: std::ops::Range<usize>| -> Result<u32, InvalidProtocolVersion> {
            b[r].iter().try_fold(0u32, |acc, &c| {
                if c.is_ascii_digit() {
                    Ok(acc * 10 + u32::from(c - b'0'))
                } else {
                    Err(InvalidProtocolVersion)
                }
            })
        };
        if b.len() != 10 || b[4] != b'-' || b[7] != b'-' {
            return Err(InvalidProtocolVersion);
        }
        let (y, m, d) = (digits(0..4)?, digits(5..7)?, digits(8..10)?);
        if !(1..=12).contains(&m) || !(1..=31).contains(&d) {
            return Err(InvalidProtocolVersion);
        }
        Ok(ProtocolVersion(y * 10_000 + m * 100 + d))
    }
}

impl fmt::Display for ProtocolVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.0;
        write!(f, "{:04}-{:02}-{:02}", n / 10_000, n / 100 % 100, n % 100)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_parse_and_order() {
        let v: ProtocolVersion = "2025-06-18".parse().unwrap();
        assert_eq!(v.to_string(), "2025-06-18");
        assert!(!v.reserves_rate_limit_code());
        assert!(
            "2026-07-28"
                .parse::<ProtocolVersion>()
                .unwrap()
                .reserves_rate_limit_code()
        );
        assert!(
            "2027-01-01"
                .parse::<ProtocolVersion>()
                .unwrap()
                .reserves_rate_limit_code()
        );
        for bad in [
            "",
            "2025-6-18",
            "2025/06/18",
            "20250618xx",
            "2025-13-01",
            "abcd-ef-gh",
        ] {
            assert!(bad.parse::<ProtocolVersion>().is_err(), "{bad}");
        }
    }
}

//! The MCP wire: JSON-RPC envelope parsing, MCP headers, and the responses stormgate writes.
//!
//! Parsing borrows from the body: no `serde_json::Value` of the whole body is built, and
//! tool arguments are skipped, not parsed.

mod envelope;
pub(crate) mod reply;
pub(crate) mod verdict;

pub use crate::protocol::{
    InvalidProtocolVersion, METHOD, NAME, PROTOCOL_VERSION, ProtocolVersion, SESSION_ID,
};
pub use crate::schemas::{MAX_NAME, MAX_TOOLS, META_KEY, ToolSchemas};
pub(crate) use envelope::parse;

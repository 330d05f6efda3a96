//! Which tools declare an `outputSchema`, learned from the `tools/list` answers passing
//! through. A tool-result refusal may put its data in `structuredContent` only for a tool that
//! declares none: clients validate `structuredContent` against a declared schema even on
//! `isError` (the TypeScript SDK answers -32602), so for the others the data goes in the
//! result's `_meta` under [`META_KEY`].

use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};

use crate::answer::{AnswerBody, Framing, Listener, Message, Scan, Scanned};

/// The `_meta` key of a refusal's data for tools that declare an `outputSchema`.
pub const META_KEY: &str = "io.stormgate/rejection";

/// Tool names kept at most; past it, new names are not learned (their refusals keep the data
/// in `structuredContent`).
pub const MAX_TOOLS: usize = 10_000;
/// Longest tool name kept, bytes; longer ones are not learned.
pub const MAX_NAME: usize = crate::answer::json::MAX_NAME;

/// The tools known to declare an `outputSchema`. Bounded: at most [`MAX_TOOLS`] names of at
/// most [`MAX_NAME`] bytes (about 2.6 MB at worst).
#[derive(Debug, Default)]
pub struct ToolSchemas {
    declared: Mutex<HashSet<Box<str>>>,
}

impl ToolSchemas {
    /// Whether `tool` was last listed with an `outputSchema`.
    pub fn declares(&self, tool: &str) -> bool {
        self.lock().contains(tool)
    }

    /// Tools known to declare one.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether none is known.
    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashSet<Box<str>>> {
        self.declared.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Learns from one entry of a `tools/list` answer: a tool listed with an `outputSchema`
    /// is added, one without removed.
    fn learn(&self, name: &str, declares_output_schema: bool) {
        let mut declared = self.lock();
        if !declares_output_schema {
            declared.remove(name);
        } else if name.len() <= MAX_NAME && declared.len() < MAX_TOOLS {
            declared.insert(name.into());
        }
    }
}

/// The classifier's listener on a `tools/list` answer: learns from each listed tool.
pub(crate) struct Learn(Arc<ToolSchemas>);

impl Listener for Learn {
    fn tool(&mut self, name: &str, declares_output_schema: bool) {
        self.0.learn(name, declares_output_schema);
    }

    fn message(&mut self, _: &Message<'_>) {}
}

/// A `tools/list` answer passed through unchanged, learned from entry by entry as it goes,
/// in constant memory.
pub(crate) type ToolListBody<B> = AnswerBody<B, Learn>;

/// `inner`, a `tools/list` answer framed as `framing`, learned from into `schemas`.
pub(crate) fn tool_list_body<B>(
    inner: B,
    schemas: Arc<ToolSchemas>,
    framing: Framing,
) -> ToolListBody<B> {
    AnswerBody::new(inner, Scanned::new(Scan::new(framing), Learn(schemas)))
}

#[cfg(test)]
mod tests {
    use super::*;

    impl ToolSchemas {
        fn learn_text(self: &Arc<Self>, text: &[u8]) {
            let mut learn = Learn(self.clone());
            let mut scan = Scan::new(Framing::Json);
            scan.feed(text, &mut learn);
            scan.finish(&mut learn);
        }
    }

    #[test]
    fn learns_which_tools_declare_a_schema_and_forgets_on_relisting() {
        let s = Arc::new(ToolSchemas::default());
        s.learn_text(
            br#"{"jsonrpc":"2.0","id":1,"result":{"tools":[
            {"name":"a","inputSchema":{},"outputSchema":{"type":"object"}},
            {"name":"b","inputSchema":{}}]}}"#,
        );
        assert!(s.declares("a"));
        assert!(!s.declares("b"));
        s.learn_text(
            br#"{"jsonrpc":"2.0","id":2,"result":{"tools":[{"name":"a","inputSchema":{}}]}}"#,
        );
        assert!(!s.declares("a"), "relisted without one");
        s.learn_text(b"not json");
        s.learn_text(br#"{"jsonrpc":"2.0","id":3,"error":{"code":1,"message":"x"}}"#);
        assert!(s.is_empty());
    }

    #[test]
    fn names_are_bounded_in_length_and_count() {
        let s = Arc::new(ToolSchemas::default());
        let long = "x".repeat(MAX_NAME + 1);
        let tools: Vec<String> = (0..MAX_TOOLS + 50)
            .map(|i| format!(r#"{{"name":"t{i}","outputSchema":{{}}}}"#))
            .chain([format!(r#"{{"name":"{long}","outputSchema":{{}}}}"#)])
            .collect();
        let answer = format!(r#"{{"result":{{"tools":[{}]}}}}"#, tools.join(","));
        s.learn_text(answer.as_bytes());
        assert_eq!(s.len(), MAX_TOOLS);
        assert!(!s.declares(&long));
    }
}

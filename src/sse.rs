//! Server-Sent Events: the one incremental parser (bytes in, the `data` of each event out as
//! it passes) and the one framer of the events stormgate writes. Pure logic (a leaf: it imports
//! no stage): chunks may split lines and events anywhere, and the parser keeps no line and no
//! event, so a gigabyte line costs it nothing.

use bytes::BytesMut;
use memchr::memchr;

/// Appends one `message` event carrying `data` (one line of JSON) to `out`.
pub(crate) fn write_event(out: &mut BytesMut, data: &[u8]) {
    out.extend_from_slice(b"event: message\ndata: ");
    out.extend_from_slice(data);
    out.extend_from_slice(b"\n\n");
}

/// Where the parser puts what it reads.
pub(crate) trait Events {
    /// More of the current event's data: its data lines' values, joined with `\n`, in as
    /// many pieces as the chunks cut them into.
    fn data(&mut self, bytes: &[u8]);

    /// The current event ended (a blank line after at least one data line).
    fn event(&mut self);
}

/// Where in a line the parser is.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum Line {
    /// At the start of a line or in its field name: `matched` bytes of `data` so far.
    #[default]
    Field,
    /// Just after `data:`, where one space may stand.
    DataStart,
    /// In a data line's value.
    Data,
    /// In a line that is not data (a comment or another field), up to its end.
    Skip,
}

/// Feeds on chunks; hands each event's data on as it passes ([`Events`]). Constant size.
#[derive(Debug, Default)]
pub(crate) struct SseParser {
    line: Line,
    /// Bytes of the field name read, all of them matching `data`.
    matched: u8,
    has_data: bool,
    /// A data value's chunk ended in `\r`, held back: it is dropped if a `\n` follows.
    cr: bool,
}

impl SseParser {
    /// Parses `chunk`, handing what it reads to `events`.
    pub(crate) fn feed(&mut self, chunk: &[u8], events: &mut impl Events) {
        let mut i = 0;
        while i < chunk.len() {
            match self.line {
                Line::Data | Line::Skip => {
                    let end = memchr(b'\n', &chunk[i..]).map(|k| i + k);
                    if self.line == Line::Data {
                        let value = &chunk[i..end.unwrap_or(chunk.len())];
                        if std::mem::take(&mut self.cr) && end != Some(i) {
                            events.data(b"\r");
                        }
                        let value = match value.strip_suffix(b"\r") {
                            Some(v) if end.is_some() => v,
                            Some(v) => {
                                self.cr = true;
                                v
                            }
                            None => value,
                        };
                        if !value.is_empty() {
                            events.data(value);
                        }
                    }
                    let Some(end) = end else { return };
                    self.line = Line::Field;
                    self.matched = 0;
                    i = end + 1;
                }
                Line::DataStart => {
                    if chunk[i] == b' ' {
                        i += 1;
                    }
                    self.line = Line::Data;
                }
                Line::Field => {
                    let b = chunk[i];
                    i += 1;
                    match b {
                        b'\r' => {}
                        b'\n' => {
                            if self.matched == 0 {
                                // A blank line: the event ends.
                                if self.has_data {
                                    events.event();
                                }
                                self.has_data = false;
                            } else if self.matched == 4 {
                                // `data` alone: a data line with an empty value.
                                self.data_line(events);
                            }
                            self.matched = 0;
                        }
                        b':' if self.matched == 4 => {
                            self.data_line(events);
                            self.line = Line::DataStart;
                        }
                        _ if self.matched < 4 && b == b"data"[usize::from(self.matched)] => {
                            self.matched += 1;
                        }
                        // A comment, another field, or a longer name.
                        _ => self.line = Line::Skip,
                    }
                }
            }
        }
    }

    /// A data line starts: after the first of an event, its value follows a `\n`.
    fn data_line(&mut self, events: &mut impl Events) {
        if self.has_data {
            events.data(b"\n");
        }
        self.has_data = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every event's data, whole; and the pieces it came in.
    #[derive(Default)]
    struct Collect {
        current: Vec<u8>,
        events: Vec<String>,
    }

    impl Events for Collect {
        fn data(&mut self, bytes: &[u8]) {
            assert!(!bytes.is_empty());
            self.current.extend_from_slice(bytes);
        }
        fn event(&mut self) {
            let data = std::mem::take(&mut self.current);
            self.events.push(String::from_utf8(data).unwrap());
        }
    }

    fn events(chunks: &[&[u8]]) -> Vec<String> {
        let mut p = SseParser::default();
        let mut out = Collect::default();
        for c in chunks {
            p.feed(c, &mut out);
        }
        out.events
    }

    #[test]
    fn events_split_anywhere_and_comments() {
        let whole =
            b": keep-alive\n\nid: 1\ndata: {\"a\":1}\n\ndata: x\r\ndata: y\r\n\r\nevent: ping\n\n";
        for split in 0..whole.len() {
            let (a, b) = whole.split_at(split);
            assert_eq!(events(&[a, b]), ["{\"a\":1}", "x\ny"], "split at {split}");
        }
        let bytewise: Vec<&[u8]> = whole.chunks(1).collect();
        assert_eq!(events(&bytewise), ["{\"a\":1}", "x\ny"]);
    }

    #[test]
    fn the_parser_reads_what_the_framer_writes() {
        let mut out = BytesMut::new();
        write_event(&mut out, br#"{"id":1}"#);
        write_event(&mut out, b"[]");
        assert_eq!(
            &out[..],
            b"event: message\ndata: {\"id\":1}\n\nevent: message\ndata: []\n\n"
        );
        assert_eq!(events(&[&out]), [r#"{"id":1}"#, "[]"]);
    }

    /// A plain parser that keeps every line and event whole: the reference for the streaming
    /// one.
    fn reference(body: &[u8]) -> Vec<String> {
        let mut out = Vec::new();
        let (mut data, mut has_data) = (Vec::new(), false);
        for line in body.split(|&b| b == b'\n') {
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            if line.is_empty() {
                if has_data {
                    out.push(String::from_utf8(std::mem::take(&mut data)).unwrap());
                }
                data.clear();
                has_data = false;
            } else if let Some(rest) = line.strip_prefix(b"data") {
                let value = match rest {
                    [b':', b' ', v @ ..] | [b':', v @ ..] => v,
                    [] => &[][..],
                    _ => continue,
                };
                if has_data {
                    data.push(b'\n');
                }
                data.extend_from_slice(value);
                has_data = true;
            }
        }
        out
    }

    proptest::proptest! {
        /// However a stream is cut, the streaming parser reads the events the whole-line
        /// reference reads.
        #[test]
        fn the_streaming_parser_reads_what_the_reference_reads(
            lines in proptest::collection::vec(
                proptest::prop_oneof![
                    "data: [a-z\\{\\}\r ]{0,12}",
                    "data:[a-z ]{0,5}",
                    "data",
                    "datum: x",
                    ": comment",
                    "event: message",
                    "id: [0-9]{1,3}",
                    "",
                ],
                0..16,
            ),
            crlf in proptest::bool::ANY,
            cuts in proptest::collection::vec(proptest::sample::select(vec![0usize, 1, 2, 3, 5, 8]), 0..40),
        ) {
            let eol = if crlf { "\r\n" } else { "\n" };
            let mut body = String::new();
            for l in &lines {
                body.push_str(l);
                body.push_str(eol);
            }
            body.push_str(eol);
            let bytes = body.as_bytes();
            let mut chunks = Vec::new();
            let mut at = 0;
            for c in cuts {
                let to = (at + c).min(bytes.len());
                chunks.push(&bytes[at..to]);
                at = to;
            }
            chunks.push(&bytes[at..]);
            proptest::prop_assert_eq!(events(&chunks), reference(bytes));
        }
    }

    #[test]
    fn a_priming_event_with_empty_data_is_an_empty_event() {
        assert_eq!(events(&[b"data: \nid: 0\nretry: 3000\n\n"]), [""]);
        assert_eq!(events(&[b"dataX: no\n\n"]), Vec::<String>::new());
    }
}

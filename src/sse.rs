//! Server-Sent Events: the one incremental parser (bytes in, the `data` of each complete event
//! out) and the one framer of the events stormgate writes. Pure logic (a leaf: it imports no
//! stage): chunks may split lines and events anywhere.

use bytes::BytesMut;

/// Appends one `message` event carrying `data` (one line of JSON) to `out`.
pub(crate) fn write_event(out: &mut BytesMut, data: &[u8]) {
    out.extend_from_slice(b"event: message\ndata: ");
    out.extend_from_slice(data);
    out.extend_from_slice(b"\n\n");
}

/// Feeds on chunks; yields each event's `data` (its data lines joined with `\n`).
#[derive(Debug, Default)]
pub(crate) struct SseParser {
    line: Vec<u8>,
    data: Vec<u8>,
    has_data: bool,
}

impl SseParser {
    /// Parses `chunk`, calling `on_event` with the data of every event it completes.
    pub(crate) fn feed(&mut self, chunk: &[u8], mut on_event: impl FnMut(&[u8])) {
        for &b in chunk {
            if b == b'\n' {
                self.end_line(&mut on_event);
            } else {
                self.line.push(b);
            }
        }
    }

    fn end_line(&mut self, on_event: &mut impl FnMut(&[u8])) {
        let mut line = std::mem::take(&mut self.line);
        if line.last() == Some(&b'\r') {
            line.pop();
        }
        if line.is_empty() {
            if self.has_data {
                on_event(&self.data);
            }
            self.data.clear();
            self.has_data = false;
        } else if line[0] == b':' {
            // A comment: keep-alive.
        } else if let Some(rest) = line.strip_prefix(b"data") {
            let value = match rest {
                [b':', b' ', v @ ..] | [b':', v @ ..] => v,
                [] => &[][..],
                _ => {
                    self.line = line;
                    self.line.clear();
                    return;
                }
            };
            if self.has_data {
                self.data.push(b'\n');
            }
            self.data.extend_from_slice(value);
            self.has_data = true;
        }
        line.clear();
        self.line = line;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn events(chunks: &[&[u8]]) -> Vec<String> {
        let mut p = SseParser::default();
        let mut out = Vec::new();
        for c in chunks {
            p.feed(c, |d| out.push(String::from_utf8(d.to_vec()).unwrap()));
        }
        out
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

    #[test]
    fn a_priming_event_with_empty_data_is_an_empty_event() {
        assert_eq!(events(&[b"data: \nid: 0\nretry: 3000\n\n"]), [""]);
        assert_eq!(events(&[b"dataX: no\n\n"]), Vec::<String>::new());
    }
}

//! A validating JSON reader over text, by hand: tokens as borrowed spans of the text, nothing
//! built.
//!
//! It accepts exactly the JSON serde_json accepts when it skips a value (RFC 8259's grammar:
//! the four whitespace bytes, no trailing comma, no control byte in a string, only the
//! escapes `\" \\ \/ \b \f \n \r \t \uXXXX`, numbers without a leading zero or a lone `.`),
//! with no limit on depth. What a string means is read only when asked ([`Str::decode`]); a
//! `\u` escape of an unpaired UTF-16 surrogate is valid grammar but no text, as serde_json
//! holds when it reads a string into a `str`.
//!
//! Readers of a message's fields ([`crate::mcp`]) and of a value's canonical form
//! ([`crate::canonical`]) walk it with [`Scanner::object`] and [`Scanner::array`], and skip
//! what they do not read with [`Scanner::skip`].

use std::borrow::Cow;
use std::ops::Range;

/// The text is not JSON here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Bad;

/// A string's `\u` escapes name an unpaired UTF-16 surrogate: valid JSON, but no text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Unpaired;

/// A reader of one JSON text, at a position in it.
#[derive(Debug)]
pub(crate) struct Scanner<'a> {
    text: &'a str,
    pos: usize,
}

/// A string token: the text between its quotes as sent, escapes undecoded.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Str<'a> {
    raw: &'a str,
    escaped: bool,
}

impl<'a> Scanner<'a> {
    /// A reader at the start of `text`.
    pub(crate) fn new(text: &'a str) -> Self {
        Scanner { text, pos: 0 }
    }

    /// The byte offset read up to.
    pub(crate) fn pos(&self) -> usize {
        self.pos
    }

    /// Goes back (or on) to `pos`, an offset this reader has stood at.
    pub(crate) fn seek(&mut self, pos: usize) {
        self.pos = pos;
    }

    /// The text of `span`.
    pub(crate) fn slice(&self, span: Range<usize>) -> &'a str {
        &self.text[span]
    }

    /// The next byte past whitespace, not taken (whitespace is).
    pub(crate) fn peek(&mut self) -> Option<u8> {
        let bytes = self.text.as_bytes();
        while let Some(&b) = bytes.get(self.pos) {
            if !matches!(b, b' ' | b'\n' | b'\t' | b'\r') {
                return Some(b);
            }
            self.pos += 1;
        }
        None
    }

    /// Takes `want`, past whitespace.
    fn expect(&mut self, want: u8) -> Result<(), Bad> {
        if self.peek() == Some(want) {
            self.pos += 1;
            Ok(())
        } else {
            Err(Bad)
        }
    }

    /// Only whitespace is left.
    pub(crate) fn end(&mut self) -> Result<(), Bad> {
        match self.peek() {
            None => Ok(()),
            Some(_) => Err(Bad),
        }
    }

    /// Reads an object, `{` next: `member` is called with each key and must read its value.
    pub(crate) fn object<E: From<Bad>>(
        &mut self,
        mut member: impl FnMut(&mut Self, Str<'a>) -> Result<(), E>,
    ) -> Result<(), E> {
        self.expect(b'{')?;
        if self.peek() == Some(b'}') {
            self.pos += 1;
            return Ok(());
        }
        loop {
            let key = self.string()?;
            self.expect(b':')?;
            member(self, key)?;
            match self.peek() {
                Some(b',') => self.pos += 1,
                Some(b'}') => {
                    self.pos += 1;
                    return Ok(());
                }
                _ => return Err(Bad.into()),
            }
        }
    }

    /// Reads an array, `[` next: `element` is called for each and must read it.
    pub(crate) fn array<E: From<Bad>>(
        &mut self,
        mut element: impl FnMut(&mut Self) -> Result<(), E>,
    ) -> Result<(), E> {
        self.expect(b'[')?;
        if self.peek() == Some(b']') {
            self.pos += 1;
            return Ok(());
        }
        loop {
            element(self)?;
            match self.peek() {
                Some(b',') => self.pos += 1,
                Some(b']') => {
                    self.pos += 1;
                    return Ok(());
                }
                _ => return Err(Bad.into()),
            }
        }
    }

    /// Reads a string, `"` next (past whitespace).
    pub(crate) fn string(&mut self) -> Result<Str<'a>, Bad> {
        self.expect(b'"')?;
        let bytes = self.text.as_bytes();
        let start = self.pos;
        let mut escaped = false;
        loop {
            self.pos += plain_run(&bytes[self.pos..]).ok_or(Bad)?;
            match bytes[self.pos] {
                b'"' => {
                    let raw = &self.text[start..self.pos];
                    self.pos += 1;
                    return Ok(Str { raw, escaped });
                }
                b'\\' => {
                    escaped = true;
                    self.pos += 1;
                    match bytes.get(self.pos) {
                        Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => {
                            self.pos += 1;
                        }
                        Some(b'u') => {
                            hex4(bytes.get(self.pos + 1..self.pos + 5).ok_or(Bad)?)?;
                            self.pos += 5;
                        }
                        _ => return Err(Bad),
                    }
                }
                _ => return Err(Bad),
            }
        }
    }

    /// Reads a number, `-` or a digit next (past whitespace): its text.
    pub(crate) fn number(&mut self) -> Result<&'a str, Bad> {
        self.peek();
        let bytes = self.text.as_bytes();
        let start = self.pos;
        let digit = |at: usize| bytes.get(at).is_some_and(u8::is_ascii_digit);
        let digits = |mut at: usize| {
            while digit(at) {
                at += 1;
            }
            at
        };
        let mut at = start;
        if bytes.get(at) == Some(&b'-') {
            at += 1;
        }
        match bytes.get(at) {
            Some(b'0') if digit(at + 1) => return Err(Bad),
            Some(b'0') => at += 1,
            Some(b'1'..=b'9') => at = digits(at + 1),
            _ => return Err(Bad),
        }
        if bytes.get(at) == Some(&b'.') {
            if !digit(at + 1) {
                return Err(Bad);
            }
            at = digits(at + 1);
        }
        if matches!(bytes.get(at), Some(b'e' | b'E')) {
            at += 1;
            if matches!(bytes.get(at), Some(b'+' | b'-')) {
                at += 1;
            }
            if !digit(at) {
                return Err(Bad);
            }
            at = digits(at);
        }
        self.pos = at;
        Ok(&self.text[start..at])
    }

    /// Reads `true`, `false` or `null`, its first letter next (past whitespace).
    pub(crate) fn literal(&mut self) -> Result<&'a str, Bad> {
        self.peek();
        let rest = &self.text[self.pos..];
        let word = ["true", "false", "null"]
            .into_iter()
            .find(|w| rest.starts_with(w))
            .ok_or(Bad)?;
        self.pos += word.len();
        Ok(word)
    }

    /// Reads one whole value ([`skip`](Self::skip)): its text.
    pub(crate) fn value(&mut self) -> Result<&'a str, Bad> {
        let span = self.skip()?;
        Ok(&self.text[span])
    }

    /// Reads one whole value of any depth without a heap allocation below 128 levels: its
    /// span, whitespace around it excluded.
    pub(crate) fn skip(&mut self) -> Result<Range<usize>, Bad> {
        self.peek();
        let start = self.pos;
        let mut open = Open::default();
        loop {
            // A value.
            match self.peek().ok_or(Bad)? {
                b'"' => {
                    self.string()?;
                }
                b'-' | b'0'..=b'9' => {
                    self.number()?;
                }
                b't' | b'f' | b'n' => {
                    self.literal()?;
                }
                b @ (b'[' | b'{') => {
                    self.pos += 1;
                    let object = b == b'{';
                    let close = if object { b'}' } else { b']' };
                    if self.peek() == Some(close) {
                        self.pos += 1;
                    } else {
                        open.push(object);
                        if object {
                            self.string()?;
                            self.expect(b':')?;
                        }
                        continue;
                    }
                }
                _ => return Err(Bad),
            }
            // After a value: the next one of its container, or the containers it closes.
            loop {
                let Some(object) = open.top() else {
                    return Ok(start..self.pos);
                };
                match self.peek() {
                    Some(b',') => {
                        self.pos += 1;
                        if object {
                            self.string()?;
                            self.expect(b':')?;
                        }
                        break;
                    }
                    Some(b'}') if object => {}
                    Some(b']') if !object => {}
                    _ => return Err(Bad),
                }
                self.pos += 1;
                open.pop();
            }
        }
    }
}

/// Where the plain run of a string's bytes ends: the offset of the first `"`, `\\` or control
/// byte (all ASCII, so never inside a UTF-8 sequence), eight bytes at a time.
fn plain_run(bytes: &[u8]) -> Option<usize> {
    const ONES: u64 = u64::from_ne_bytes([1; 8]);
    const HIGH: u64 = ONES << 7;
    let mut chunks = bytes.chunks_exact(8);
    for (i, chunk) in chunks.by_ref().enumerate() {
        let w = u64::from_le_bytes(chunk.try_into().unwrap_or_default());
        // A byte below `n` sets its high bit in `(w - n * ONES) & !w` (the lowest such byte
        // exactly: a borrow runs only upwards from a byte that is one); `"` and `\\` are
        // the bytes below 1 of `w` xor them.
        let below = |w: u64, n: u64| w.wrapping_sub(n * ONES) & !w;
        let quote = w ^ (ONES * u64::from(b'"'));
        let backslash = w ^ (ONES * u64::from(b'\\'));
        let found = (below(w, 0x20) | below(quote, 1) | below(backslash, 1)) & HIGH;
        if found != 0 {
            return Some(i * 8 + (found.trailing_zeros() / 8) as usize);
        }
    }
    let done = bytes.len() - chunks.remainder().len();
    chunks
        .remainder()
        .iter()
        .position(|&b| b == b'"' || b == b'\\' || b < 0x20)
        .map(|at| done + at)
}

/// Four hex digits' value.
fn hex4(digits: &[u8]) -> Result<u16, Bad> {
    digits.iter().try_fold(0u16, |n, &d| {
        let v = (d as char).to_digit(16).ok_or(Bad)?;
        Ok((n << 4) | v as u16)
    })
}

/// The containers [`Scanner::skip`] is inside, innermost last: whether each is an object.
#[derive(Default)]
struct Open {
    /// The first 128 levels, one bit each.
    inline: u128,
    depth: usize,
    /// Levels past 128.
    deeper: Vec<bool>,
}

impl Open {
    fn push(&mut self, object: bool) {
        if self.depth < 128 {
            let bit = 1u128 << self.depth;
            self.inline = if object {
                self.inline | bit
            } else {
                self.inline & !bit
            };
        } else {
            self.deeper.push(object);
        }
        self.depth += 1;
    }

    fn top(&self) -> Option<bool> {
        match self.depth {
            0 => None,
            d if d <= 128 => Some(self.inline & (1u128 << (d - 1)) != 0),
            _ => self.deeper.last().copied(),
        }
    }

    fn pop(&mut self) {
        if self.depth > 128 {
            self.deeper.pop();
        }
        self.depth -= 1;
    }
}

impl<'a> Str<'a> {
    /// The text between the quotes, as sent.
    pub(crate) fn raw(&self) -> &'a str {
        self.raw
    }

    /// Whether the text holds an escape.
    pub(crate) fn escaped(&self) -> bool {
        self.escaped
    }

    /// The string's text, decoded: borrowed when it has no escapes.
    pub(crate) fn text(&self) -> Result<Cow<'a, str>, Unpaired> {
        if !self.escaped {
            return Ok(Cow::Borrowed(self.raw));
        }
        let mut out = String::with_capacity(self.raw.len());
        self.decode(|piece| out.push_str(piece))?;
        Ok(Cow::Owned(out))
    }

    /// Gives the decoded text to `out` in pieces, in order.
    pub(crate) fn decode(&self, mut out: impl FnMut(&str)) -> Result<(), Unpaired> {
        let mut rest = self.raw;
        // The string was read by `Scanner::string`: every escape is whole and valid grammar.
        while let Some(at) = rest.find('\\') {
            out(&rest[..at]);
            let escape = &rest.as_bytes()[at + 1..];
            let simple = match escape[0] {
                b'"' => Some("\""),
                b'\\' => Some("\\"),
                b'/' => Some("/"),
                b'b' => Some("\u{8}"),
                b'f' => Some("\u{c}"),
                b'n' => Some("\n"),
                b'r' => Some("\r"),
                b't' => Some("\t"),
                _ => None,
            };
            if let Some(s) = simple {
                out(s);
                rest = &rest[at + 2..];
                continue;
            }
            let unit = |e: &[u8]| hex4(&e[1..5]).map_err(|_| Unpaired);
            let first = unit(escape)?;
            let (c, used) = match first {
                0xD800..=0xDBFF => {
                    let low = match escape.get(5..7) {
                        Some(b"\\u") => unit(&escape[6..])?,
                        _ => return Err(Unpaired),
                    };
                    if !(0xDC00..=0xDFFF).contains(&low) {
                        return Err(Unpaired);
                    }
                    let c =
                        0x1_0000 + ((u32::from(first) - 0xD800) << 10) + (u32::from(low) - 0xDC00);
                    (c, 12)
                }
                0xDC00..=0xDFFF => return Err(Unpaired),
                n => (u32::from(n), 6),
            };
            let c = char::from_u32(c).ok_or(Unpaired)?;
            out(c.encode_utf8(&mut [0; 4]));
            rest = &rest[at + used..];
        }
        out(rest);
        Ok(())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Reads one whole text as a value, as `serde_json::from_str::<IgnoredAny>` does.
    fn whole(text: &str) -> Result<Range<usize>, Bad> {
        let mut s = Scanner::new(text);
        let span = s.skip()?;
        s.end()?;
        Ok(span)
    }

    /// Texts near JSON: a valid value with a few bytes inserted, removed or replaced.
    fn near_json() -> impl Strategy<Value = String> {
        let leaf = prop_oneof![
            Just(serde_json::Value::Null),
            any::<bool>().prop_map(serde_json::Value::Bool),
            any::<i64>().prop_map(serde_json::Value::from),
            any::<f64>().prop_map(serde_json::Value::from),
            "[a-z\\\\\"é\u{1}]{0,6}".prop_map(serde_json::Value::String),
        ];
        let value = leaf
            .prop_recursive(4, 24, 4, |inner| {
                prop_oneof![
                    proptest::collection::vec(inner.clone(), 0..4)
                        .prop_map(serde_json::Value::Array),
                    proptest::collection::btree_map("[a-z]{0,3}", inner, 0..4)
                        .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
                ]
            })
            .prop_map(|v| v.to_string());
        near(value, &[])
    }

    /// What [`near`] inserts into a text or puts in place of one of its characters: JSON's
    /// punctuation, escapes (unpaired surrogates among them), number parts, the form feed
    /// (whitespace to some readers, not to JSON), a control byte, a literal's prefix.
    const PIECES: &[&str] = &[
        "\"",
        "\\",
        "\\u",
        "\\ud800",
        "\\udc00",
        "\\ud83d\\ude00",
        ",",
        ":",
        "[",
        "]",
        "{",
        "}",
        "0",
        "-",
        ".",
        "e",
        "+",
        " ",
        "\u{c}",
        "\n",
        "\u{1}",
        "n",
        "tru",
        "é",
    ];

    /// Texts near those of `text`: each with up to two of [`PIECES`] or `more` inserted, or a
    /// character removed or replaced by one of them.
    pub(crate) fn near(
        text: impl Strategy<Value = String>,
        more: &'static [&'static str],
    ) -> impl Strategy<Value = String> {
        let pieces = prop::sample::select([PIECES, more].concat());
        let edit = (any::<prop::sample::Index>(), 0..3u8, pieces);
        (text, proptest::collection::vec(edit, 0..3)).prop_map(|(mut text, edits)| {
            for (at, how, piece) in edits {
                let mut i = at.index(text.len() + 1);
                while !text.is_char_boundary(i) {
                    i -= 1;
                }
                let end = (i + 1..=text.len())
                    .find(|&e| text.is_char_boundary(e))
                    .unwrap_or(text.len());
                match how {
                    0 => text.insert_str(i, piece),
                    1 => text.replace_range(i..end, ""),
                    _ => text.replace_range(i..end, piece),
                }
            }
            text
        })
    }

    proptest! {
        /// Whatever the text, it is JSON to the scanner exactly when it is to serde_json.
        #[test]
        fn accepts_what_serde_json_accepts(text in near_json()) {
            let serde = serde_json::from_str::<serde::de::IgnoredAny>(&text).is_ok();
            prop_assert_eq!(whole(&text).is_ok(), serde, "{:?}", text);
        }

        /// A string's text is what serde_json reads into a `String`, an unpaired surrogate
        /// where it refuses.
        #[test]
        fn strings_decode_as_serde_json_reads_them(
            text in proptest::collection::vec(prop_oneof![
                Just("a".to_owned()), Just("é".to_owned()), Just("\\n".to_owned()),
                Just("\\\"".to_owned()), Just("\\/".to_owned()), Just("\\u0041".to_owned()),
                Just("\\ud800".to_owned()), Just("\\udc00".to_owned()),
                Just("\\ud83d\\ude00".to_owned()), Just("\\uDBFF\\uDFFF".to_owned()),
                Just("\\u00e9".to_owned()), Just("\\b\\f\\r\\t\\\\".to_owned()),
            ], 0..6).prop_map(|p| format!("\"{}\"", p.concat()))
        ) {
            let mut s = Scanner::new(&text);
            let got = s.string().unwrap().text().ok().map(Cow::into_owned);
            prop_assert_eq!(got, serde_json::from_str::<String>(&text).ok(), "{}", text);
        }
    }

    proptest! {
        /// Eight bytes at a time, the plain run ends where a byte-by-byte search says.
        #[test]
        fn a_plain_run_ends_at_the_first_special_byte(
            bytes in proptest::collection::vec(prop_oneof![
                4 => 0x20u8..=0xff, 1 => Just(b'"'), 1 => Just(b'\\'), 1 => 0u8..0x20
            ], 0..40)
        ) {
            let naive = bytes.iter().position(|&b| b == b'"' || b == b'\\' || b < 0x20);
            prop_assert_eq!(plain_run(&bytes), naive);
        }
    }

    #[test]
    fn spans_exclude_whitespace_and_depth_is_unbounded() {
        assert_eq!(whole(" [1, {\"a\": []}] \n"), Ok(1..15));
        let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
        assert_eq!(whole(&deep), Ok(0..200_000));
        let deep = format!("{}{}", "{\"a\":".repeat(300), "}".repeat(299));
        assert_eq!(whole(&deep), Err(Bad), "one brace short");
        assert_eq!(whole("[1,]"), Err(Bad));
        assert_eq!(whole("{\"a\":1,}"), Err(Bad));
        assert_eq!(whole("01"), Err(Bad));
        assert_eq!(whole("1."), Err(Bad));
        assert_eq!(whole("\"\\ud800\""), Ok(0..8), "grammar, not text");
        assert_eq!(whole("\u{c}1"), Err(Bad), "form feed is not whitespace");
    }
}

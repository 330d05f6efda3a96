//! A JSON reader that keeps nothing it does not need: bytes in, a [`Message`] out as each
//! JSON-RPC message closes, in constant memory whatever the size of the answer.
//!
//! It follows only the few paths a listener reads (`id`, `result`, `result.isError`, the
//! first block of `result.content` and its `text`, `error.code`, and `result.tools[*]` with
//! its `name` and `outputSchema`); every other value is skipped by counting brackets and
//! finding the ends of strings, without being kept. What it keeps is bounded: the id verbatim
//! up to [`ID_MAX`] bytes (a longer one by its length and a 64-bit hash), a text prefix of
//! [`TEXT_MAX`] bytes, a tool name of [`MAX_NAME`] bytes, and the whole message only for a
//! listener that asks ([`Listener::keep`]) and only up to what it asks.
//!
//! It reads well-formed JSON exactly and does not validate the rest: a message is delivered
//! when its closing brace arrives, and a structure it cannot follow (a close that does not
//! match, a stray brace at the top) stops it until the next [`Reader::reset`].

use std::hash::Hasher;

use memchr::memchr2;

use super::{Listener, Message};

/// Bytes of a tool name read from a `tools/list` entry; a longer name is not reported.
pub(crate) const MAX_NAME: usize = 256;
/// Bytes of a message's id kept verbatim; a longer id is known by its length and hash.
pub(crate) const ID_MAX: usize = 256;
/// Bytes kept of the `text` of an answer's first content block (decoded).
pub(crate) const TEXT_MAX: usize = 64;
/// Bytes of a key or of a scalar read: longer ones are none of the keys or values it reads.
const SMALL: usize = 24;
/// Containers it follows at once at most: the batch, the message, `result`, `result.tools`
/// and one tool; anything deeper is skipped.
const FRAMES: usize = 6;

/// What a value is to the reader, from where it stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Batch,
    Message,
    Id,
    Result,
    Error,
    Code,
    IsError,
    Content,
    Block,
    Text,
    Tools,
    Tool,
    Name,
    OutputSchema,
    Skip,
}

impl Role {
    /// Whether a container in this role is followed, and as which kind (`true`: an array).
    fn followed_as(self) -> Option<bool> {
        match self {
            Role::Batch | Role::Content | Role::Tools => Some(true),
            Role::Message | Role::Result | Role::Error | Role::Block | Role::Tool => Some(false),
            _ => None,
        }
    }
}

/// The keys it reads; any other is `Other`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Key {
    Id,
    Result,
    Error,
    Code,
    IsError,
    Content,
    Text,
    Tools,
    Name,
    OutputSchema,
    Other,
}

impl Key {
    fn of(text: &[u8]) -> Key {
        match text {
            b"id" => Key::Id,
            b"result" => Key::Result,
            b"error" => Key::Error,
            b"code" => Key::Code,
            b"isError" => Key::IsError,
            b"content" => Key::Content,
            b"text" => Key::Text,
            b"tools" => Key::Tools,
            b"name" => Key::Name,
            b"outputSchema" => Key::OutputSchema,
            _ => Key::Other,
        }
    }
}

/// One container being followed.
#[derive(Debug, Clone, Copy)]
struct Frame {
    role: Role,
    array: bool,
    /// An object waiting for its next key (after `{` or `,`).
    expect_key: bool,
    /// An object's current key.
    key: Key,
    /// An array's current element.
    index: u32,
}

impl Frame {
    /// The role of a value that starts inside this container now.
    fn child(&self) -> Role {
        match (self.role, self.key, self.index) {
            (Role::Batch, _, _) => Role::Message,
            (Role::Message, Key::Id, _) => Role::Id,
            (Role::Message, Key::Result, _) => Role::Result,
            (Role::Message, Key::Error, _) => Role::Error,
            (Role::Result, Key::IsError, _) => Role::IsError,
            (Role::Result, Key::Content, _) => Role::Content,
            (Role::Result, Key::Tools, _) => Role::Tools,
            (Role::Error, Key::Code, _) => Role::Code,
            (Role::Content, _, 0) => Role::Block,
            (Role::Tools, _, _) => Role::Tool,
            (Role::Block, Key::Text, _) => Role::Text,
            (Role::Tool, Key::Name, _) => Role::Name,
            (Role::Tool, Key::OutputSchema, _) => Role::OutputSchema,
            _ => Role::Skip,
        }
    }
}

/// Where the lexer is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lex {
    /// Between tokens.
    Between,
    /// In a string: after a backslash, or in the hex digits of a `\u` escape.
    Str(Esc),
    /// In a number or literal whose value is read.
    Scalar(Role),
    /// Lost: nothing more is read until [`Reader::reset`].
    Lost,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Esc {
    None,
    Backslash,
    Hex { left: u8, value: u32 },
}

/// Where the characters of the current string go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sink {
    Skip,
    Key,
    Id,
    Text,
    Name,
}

/// A bounded byte buffer that knows whether it overflowed.
#[derive(Debug, Clone)]
struct Small<const N: usize> {
    bytes: [u8; N],
    len: usize,
    over: bool,
}

impl<const N: usize> Default for Small<N> {
    fn default() -> Self {
        Self::new()
    }
}

impl<const N: usize> Small<N> {
    fn new() -> Self {
        Small {
            bytes: [0; N],
            len: 0,
            over: false,
        }
    }

    fn clear(&mut self) {
        self.len = 0;
        self.over = false;
    }

    fn push(&mut self, bytes: &[u8]) {
        let room = N - self.len;
        let n = bytes.len().min(room);
        self.bytes[self.len..self.len + n].copy_from_slice(&bytes[..n]);
        self.len += n;
        self.over |= n < bytes.len();
    }

    fn get(&self) -> &[u8] {
        &self.bytes[..self.len]
    }

    /// The whole text, if it fitted.
    fn whole(&self) -> Option<&[u8]> {
        (!self.over).then(|| self.get())
    }
}

/// An answer's id as JSON text: verbatim when short, else its length and hash.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Id<'a> {
    /// The id's JSON text, up to [`ID_MAX`] bytes.
    Text(&'a [u8]),
    /// A longer id: its length and [`long_hash`].
    Long(usize, u64),
}

impl Id<'_> {
    /// Whether this is the id whose JSON text is `json` (whitespace around it ignored).
    pub(crate) fn is(&self, json: &[u8]) -> bool {
        let json = json.trim_ascii();
        match *self {
            Id::Text(text) => text == json,
            Id::Long(len, hash) => len == json.len() && hash == long_hash(json),
        }
    }
}

/// The hash by which ids longer than [`ID_MAX`] are compared: SipHash over their bytes
/// (streaming, so the reader hashes them as they pass).
fn long_hash(text: &[u8]) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    h.write(text);
    h.finish()
}

/// The id being read.
#[derive(Debug, Clone)]
struct IdText {
    text: Small<ID_MAX>,
    total: usize,
    hash: Option<std::collections::hash_map::DefaultHasher>,
    /// `null` or not a scalar: no id.
    none: bool,
}

impl IdText {
    fn new() -> Self {
        IdText {
            text: Small::new(),
            total: 0,
            hash: None,
            none: true,
        }
    }

    fn clear(&mut self) {
        self.text.clear();
        self.total = 0;
        self.hash = None;
        self.none = true;
    }

    fn push(&mut self, bytes: &[u8]) {
        let before = self.total;
        self.total += bytes.len();
        if let Some(h) = &mut self.hash {
            h.write(bytes);
        } else if self.total <= ID_MAX {
            self.text.push(bytes);
        } else {
            // Longer than is kept verbatim: known by its hash from now on.
            let mut h = std::collections::hash_map::DefaultHasher::new();
            h.write(&self.text.get()[..before]);
            h.write(bytes);
            self.hash = Some(h);
        }
    }

    fn get(&self) -> Option<Id<'_>> {
        if self.none {
            return None;
        }
        Some(match &self.hash {
            None => Id::Text(self.text.get()),
            Some(h) => Id::Long(self.total, h.finish()),
        })
    }
}

/// What is gathered of the message being read.
#[derive(Debug, Clone)]
struct Gather {
    id: IdText,
    result: bool,
    error: bool,
    code: Option<i64>,
    is_error: bool,
    text: Small<TEXT_MAX>,
    start: u64,
}

/// What is gathered of the tool being read in a `result.tools` list.
#[derive(Debug, Clone, Default)]
struct ToolGather {
    name: Small<MAX_NAME>,
    named: bool,
    declares: bool,
}

/// The reader of one JSON text (an answer's body, or one SSE event's data). See the
/// module docs.
#[derive(Debug, Clone)]
pub(crate) struct Reader {
    lex: Lex,
    sink: Sink,
    /// A high surrogate waiting for its low half (`\uD83D\uDE00`).
    high: Option<u32>,
    frames: [Frame; FRAMES],
    depth: usize,
    /// Containers open inside a skipped value.
    skipped: u64,
    key: Small<SMALL>,
    scalar: Small<SMALL>,
    message: Gather,
    /// Made at the first tool of a `tools/list` answer: most answers list none, and without
    /// its name's buffer a reader (in an answer's body, one allocation) stays within the
    /// size the allocator serves from its per-thread cache.
    tool: Option<Box<ToolGather>>,
    /// Bytes fed since the last reset.
    offset: u64,
    /// The message's own bytes, for a listener that keeps them.
    kept: Vec<u8>,
    keep: usize,
    keeping: bool,
}

const NO_FRAME: Frame = Frame {
    role: Role::Skip,
    array: false,
    expect_key: false,
    key: Key::Other,
    index: 0,
};

impl Default for Reader {
    fn default() -> Self {
        Reader {
            lex: Lex::Between,
            sink: Sink::Skip,
            high: None,
            frames: [NO_FRAME; FRAMES],
            depth: 0,
            skipped: 0,
            key: Small::new(),
            scalar: Small::new(),
            message: Gather {
                id: IdText::new(),
                result: false,
                error: false,
                code: None,
                is_error: false,
                text: Small::new(),
                start: 0,
            },
            tool: None,
            offset: 0,
            kept: Vec::new(),
            keep: 0,
            keeping: false,
        }
    }
}

impl Reader {
    /// Forgets the text read so far (a message not closed yet is dropped): the next byte
    /// starts a new JSON text.
    pub(crate) fn reset(&mut self) {
        self.lex = Lex::Between;
        self.sink = Sink::Skip;
        self.high = None;
        self.depth = 0;
        self.skipped = 0;
        self.offset = 0;
        self.keeping = false;
        self.kept = Vec::new();
    }

    /// Reads `chunk`; each message it closes goes to `listener`.
    pub(crate) fn feed(&mut self, chunk: &[u8], listener: &mut impl Listener) {
        let mut i = 0;
        let mut keep_from = 0;
        while i < chunk.len() {
            match self.lex {
                Lex::Lost => break,
                Lex::Str(esc) => i = self.string(chunk, i, esc),
                Lex::Scalar(role) => {
                    let end = chunk[i..]
                        .iter()
                        .position(|&b| is_delimiter(b))
                        .map_or(chunk.len(), |k| i + k);
                    self.scalar.push(&chunk[i..end]);
                    if role == Role::Id {
                        self.message.id.push(&chunk[i..end]);
                    }
                    i = end;
                    if end < chunk.len() {
                        self.end_scalar(role);
                        self.lex = Lex::Between;
                    }
                }
                Lex::Between if self.skipped > 0 => {
                    // Inside a skipped container: only brackets and strings matter.
                    let Some(k) = chunk[i..]
                        .iter()
                        .position(|b| matches!(b, b'"' | b'{' | b'[' | b'}' | b']'))
                    else {
                        i = chunk.len();
                        continue;
                    };
                    i += k;
                    match chunk[i] {
                        b'"' => self.open_string(Sink::Skip),
                        b'{' | b'[' => self.skipped += 1,
                        _ => self.skipped -= 1,
                    }
                    i += 1;
                }
                Lex::Between => {
                    let b = chunk[i];
                    let at = self.offset + i as u64;
                    match b {
                        b' ' | b'\t' | b'\n' | b'\r' => {}
                        b'"' => self.value_string(),
                        b'{' | b'[' => {
                            if self.open(b == b'[', at, listener) {
                                keep_from = i;
                            }
                        }
                        b'}' | b']' => {
                            if self.keeping {
                                self.keep_bytes(&chunk[keep_from..=i]);
                                keep_from = i + 1;
                            }
                            self.close(b == b']', at, listener);
                        }
                        b',' => self.comma(),
                        b':' => {
                            if let Some(f) = self.top() {
                                f.expect_key = false;
                            }
                        }
                        _ => self.value_scalar(b),
                    }
                    i += 1;
                }
            }
        }
        if self.keeping && keep_from < chunk.len() {
            self.keep_bytes(&chunk[keep_from..]);
        }
        self.offset += chunk.len() as u64;
    }

    fn top(&mut self) -> Option<&mut Frame> {
        self.depth
            .checked_sub(1)
            .and_then(|d| self.frames.get_mut(d))
    }

    /// The role of a value starting now: `None` where no value may start (an object
    /// waiting for a key).
    fn role(&mut self) -> Option<Role> {
        match self.top() {
            None => Some(Role::Skip),
            Some(f) if !f.array && f.expect_key => None,
            Some(f) => Some(f.child()),
        }
    }

    fn lose(&mut self) {
        self.lex = Lex::Lost;
        self.keeping = false;
        self.kept = Vec::new();
    }

    fn value_string(&mut self) {
        let Some(role) = self.role() else {
            // A key.
            self.key.clear();
            self.open_string(Sink::Key);
            return;
        };
        let sink = match role {
            Role::Id => {
                self.message.id.clear();
                self.message.id.none = false;
                self.message.id.push(b"\"");
                Sink::Id
            }
            Role::Text => {
                self.message.text.clear();
                Sink::Text
            }
            Role::Name => {
                let tool = self.tool();
                tool.name.clear();
                tool.named = true;
                Sink::Name
            }
            _ => {
                self.present(role);
                Sink::Skip
            }
        };
        self.open_string(sink);
    }

    /// The tool being read, made at the first.
    fn tool(&mut self) -> &mut ToolGather {
        self.tool.get_or_insert_default()
    }

    fn open_string(&mut self, sink: Sink) {
        self.sink = sink;
        self.high = None;
        self.lex = Lex::Str(Esc::None);
    }

    /// A value in `role` that is not `null` started.
    fn present(&mut self, role: Role) {
        match role {
            Role::Result => self.message.result = true,
            Role::Error => self.message.error = true,
            Role::OutputSchema => self.tool().declares = true,
            _ => {}
        }
    }

    fn value_scalar(&mut self, first: u8) {
        let role = self.role().unwrap_or(Role::Skip);
        match role {
            Role::Id
            | Role::Result
            | Role::Error
            | Role::OutputSchema
            | Role::Code
            | Role::IsError => {
                self.scalar.clear();
                self.scalar.push(&[first]);
                if role == Role::Id {
                    self.message.id.clear();
                    self.message.id.push(&[first]);
                }
                self.lex = Lex::Scalar(role);
            }
            // Nothing is read of it; its bytes are not structure.
            _ => {}
        }
    }

    fn end_scalar(&mut self, role: Role) {
        let text = self.scalar.whole();
        let null = text == Some(b"null");
        match role {
            Role::Id => self.message.id.none = null,
            Role::Code => {
                self.message.code = text
                    .and_then(|t| std::str::from_utf8(t).ok())
                    .and_then(|t| t.parse().ok());
            }
            Role::IsError => self.message.is_error = text == Some(b"true"),
            _ if !null => self.present(role),
            _ => {}
        }
    }

    /// `{` or `[`; whether a message starts.
    fn open(&mut self, array: bool, at: u64, listener: &impl Listener) -> bool {
        let role = match self.role() {
            _ if self.depth == 0 && array => Role::Batch,
            _ if self.depth == 0 => Role::Message,
            Some(role) => role,
            None => {
                self.lose();
                return false;
            }
        };
        self.present(role);
        if role.followed_as() != Some(array) || self.depth == FRAMES {
            self.skipped = 1;
            return false;
        }
        self.frames[self.depth] = Frame {
            role,
            array,
            expect_key: !array,
            key: Key::Other,
            index: 0,
        };
        self.depth += 1;
        match role {
            Role::Message => {
                let m = &mut self.message;
                m.id.clear();
                m.result = false;
                m.error = false;
                m.code = None;
                m.is_error = false;
                m.text.clear();
                m.start = at;
                self.keep = listener.keep();
                self.keeping = self.keep > 0;
                self.kept.clear();
                self.keeping
            }
            Role::Tool => {
                let tool = self.tool();
                tool.name.clear();
                tool.named = false;
                tool.declares = false;
                false
            }
            _ => false,
        }
    }

    /// `}` or `]`.
    fn close(&mut self, array: bool, at: u64, listener: &mut impl Listener) {
        let Some(frame) = self.top().copied() else {
            self.lose();
            return;
        };
        if frame.array != array {
            self.lose();
            return;
        }
        self.depth -= 1;
        match frame.role {
            Role::Message => {
                let kept = std::mem::take(&mut self.kept);
                let m = &self.message;
                let message = Message {
                    id: m.id.get(),
                    result: m.result,
                    error: m.error,
                    code: m.code,
                    is_error: m.is_error,
                    text: m.text.get(),
                    raw: self.keeping.then_some(kept.as_slice()),
                    len: (at + 1 - m.start) as usize,
                };
                if listener.wants() {
                    listener.message(&message);
                }
                self.keeping = false;
                self.kept = kept;
            }
            Role::Tool => {
                if let Some(tool) = &self.tool
                    && tool.named
                    && let Some(name) = tool.name.whole()
                    && let Ok(name) = std::str::from_utf8(name)
                {
                    listener.tool(name, tool.declares);
                }
            }
            _ => {}
        }
    }

    fn comma(&mut self) {
        if let Some(f) = self.top() {
            if f.array {
                f.index = f.index.saturating_add(1);
            } else {
                f.expect_key = true;
                f.key = Key::Other;
            }
        }
    }

    fn keep_bytes(&mut self, bytes: &[u8]) {
        if self.kept.len() + bytes.len() > self.keep {
            // Too long to keep: the message is read on, not kept.
            self.keeping = false;
            self.kept = Vec::new();
        } else {
            self.kept.extend_from_slice(bytes);
        }
    }

    /// Reads string bytes from `i`; returns where it stopped.
    fn string(&mut self, chunk: &[u8], mut i: usize, mut esc: Esc) -> usize {
        while i < chunk.len() {
            match esc {
                Esc::None => {
                    let Some(k) = memchr2(b'"', b'\\', &chunk[i..]) else {
                        self.plain(&chunk[i..]);
                        self.lex = Lex::Str(Esc::None);
                        return chunk.len();
                    };
                    self.plain(&chunk[i..i + k]);
                    i += k;
                    if self.sink == Sink::Id {
                        self.message.id.push(&chunk[i..=i]);
                    }
                    if chunk[i] == b'"' {
                        self.end_string();
                        return i + 1;
                    }
                    esc = Esc::Backslash;
                    i += 1;
                }
                Esc::Backslash => {
                    let b = chunk[i];
                    if self.sink == Sink::Id {
                        self.message.id.push(&[b]);
                    }
                    esc = Esc::None;
                    match b {
                        b'u' => esc = Esc::Hex { left: 4, value: 0 },
                        b'n' => self.decoded('\n' as u32),
                        b't' => self.decoded('\t' as u32),
                        b'r' => self.decoded('\r' as u32),
                        b'b' => self.decoded(8),
                        b'f' => self.decoded(12),
                        other => self.decoded(u32::from(other)),
                    }
                    i += 1;
                }
                Esc::Hex { left, value } => {
                    let b = chunk[i];
                    if self.sink == Sink::Id {
                        self.message.id.push(&[b]);
                    }
                    let digit = (b as char).to_digit(16).unwrap_or(0);
                    let value = value * 16 + digit;
                    esc = if left == 1 {
                        self.decoded(value);
                        Esc::None
                    } else {
                        Esc::Hex {
                            left: left - 1,
                            value,
                        }
                    };
                    i += 1;
                }
            }
        }
        self.lex = Lex::Str(esc);
        i
    }

    /// Unescaped string bytes.
    fn plain(&mut self, bytes: &[u8]) {
        if bytes.is_empty() {
            return;
        }
        if self.high.take().is_some() {
            self.push_char(char::REPLACEMENT_CHARACTER);
        }
        match self.sink {
            Sink::Skip => {}
            Sink::Key => self.key.push(bytes),
            Sink::Id => self.message.id.push(bytes),
            Sink::Text => self.message.text.push(bytes),
            Sink::Name => self.tool().name.push(bytes),
        }
    }

    /// One escaped code unit.
    fn decoded(&mut self, unit: u32) {
        if self.sink == Sink::Skip || self.sink == Sink::Id {
            return;
        }
        let c = match (self.high.take(), unit) {
            (None, 0xD800..=0xDBFF) => {
                self.high = Some(unit);
                return;
            }
            (Some(high), 0xDC00..=0xDFFF) => {
                char::from_u32(0x10000 + ((high - 0xD800) << 10) + (unit - 0xDC00))
            }
            (Some(_), _) => {
                self.push_char(char::REPLACEMENT_CHARACTER);
                return self.decoded(unit);
            }
            (None, _) => char::from_u32(unit),
        };
        self.push_char(c.unwrap_or(char::REPLACEMENT_CHARACTER));
    }

    fn push_char(&mut self, c: char) {
        let mut utf8 = [0; 4];
        let bytes = c.encode_utf8(&mut utf8).as_bytes();
        match self.sink {
            Sink::Key => self.key.push(bytes),
            Sink::Text => self.message.text.push(bytes),
            Sink::Name => self.tool().name.push(bytes),
            Sink::Skip | Sink::Id => {}
        }
    }

    fn end_string(&mut self) {
        if self.high.take().is_some() {
            self.push_char(char::REPLACEMENT_CHARACTER);
        }
        self.lex = Lex::Between;
        if self.sink == Sink::Key {
            let key = self.key.whole().map_or(Key::Other, Key::of);
            if let Some(f) = self.top() {
                f.key = key;
            }
        }
        self.sink = Sink::Skip;
    }
}

#[cfg(test)]
impl Reader {
    /// Bytes the reader holds on the heap.
    pub(crate) fn kept_capacity(&self) -> usize {
        self.kept.capacity()
    }
}

/// Whether `b` ends a number or literal.
fn is_delimiter(b: u8) -> bool {
    matches!(
        b,
        b' ' | b'\t' | b'\n' | b'\r' | b',' | b'}' | b']' | b':' | b'"' | b'{' | b'['
    )
}

//! OTLP/JSON request bodies, the fast path: `parse` reads the shape exporters send straight
//! into the generated OTLP types, in one pass over the text, borrowing keys instead of
//! allocating them. opentelemetry-proto's derived serde implementation (the reference)
//! pays for serde_json's generic machinery, the buffering of `AnyValue`'s flattened field
//! and its `intValue`, which tries an integer before reading the string OTLP/JSON sends
//! (`budgetscope-bench receive` compares the two).
//!
//! Architecture invariant: **whenever `parse` returns a request, the reference decodes the
//! same text to an equal request.** `parse` declines (returns `None`) any body it does not
//! fully understand: nulls other than for an absent message, a field given twice, an
//! `AnyValue` with other than one known key, base64 bytes, entity refs, numbers where JSON
//! allows them but the reference might read them otherwise (`-0`, fractions for integers),
//! structs written as arrays, nesting deeper than `MAX_DEPTH`, anything that is not JSON;
//! `json_spans` then reads the body (`decode.rs`). The differential test (`json_tests.rs`)
//! checks the invariant on generated, random, hand-written and mutated bodies, and that
//! `json_spans` reads every body the reference accepts exactly as the reference does.

use std::borrow::Cow;
use std::str::FromStr;

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{
    AnyValue, ArrayValue, InstrumentationScope, KeyValue, KeyValueList, any_value,
};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span, Status, span};

/// Objects and arrays nested deeper than this are declined (serde_json's own limit is 128).
const MAX_DEPTH: usize = 64;

/// The request, or `None` when the body is declined.
pub fn parse(text: &str) -> Option<ExportTraceServiceRequest> {
    let mut parser = Parser::new(text);
    let request = parser.request().ok()?;
    parser.whitespace();
    (parser.pos == text.len()).then_some(request)
}

/// The body is declined (`json_spans` reads it).
struct Declined;

type Parsed<T> = Result<T, Declined>;

struct Parser<'a> {
    text: &'a str,
    pos: usize,
    depth: usize,
}

/// Reads a JSON object into the message `$out`, one line per field of the generated type:
/// `"jsonName" => field: reader`, where `reader` reads the value from the parser. A field
/// given twice is declined (an error for the derived types); unknown keys are skipped, as
/// the derived types ignore them. Evaluates to the fields seen, bit `i` for line `i`.
macro_rules! message {
    ($parser:expr, $out:ident, { $($name:literal => $field:ident : $read:expr),+ $(,)? }) => {
        {
            let mut seen = 0u32;
            $parser
                .object(|parser, key| {
                    let mut bit = 1u32;
                    $(
                        if key == $name {
                            if seen & bit != 0 {
                                return Err(Declined);
                            }
                            seen |= bit;
                            $out.$field = ($read)(parser)?;
                            return Ok(());
                        }
                        bit <<= 1;
                    )+
                    let _ = bit;
                    parser.skip()
                })
                .map(|()| seen)
        }
    };
}

/// Each byte's value as a hex digit, any case; `INVALID` for the rest.
const HEX_DIGITS: [u8; 256] = {
    let mut table = [INVALID; 256];
    let mut byte = 0;
    while byte < 256 {
        table[byte] = match byte as u8 {
            digit @ b'0'..=b'9' => digit - b'0',
            digit @ b'a'..=b'f' => digit - b'a' + 10,
            digit @ b'A'..=b'F' => digit - b'A' + 10,
            _ => INVALID,
        };
        byte += 1;
    }
    table
};

/// Not a hex digit: the high nibble is set, which no digit's value has.
const INVALID: u8 = 0xFF;

fn hex_digit(digit: u8) -> Parsed<u8> {
    match HEX_DIGITS[usize::from(digit)] {
        INVALID => Err(Declined),
        value => Ok(value),
    }
}

/// Bytes that end a run of plain string text.
fn special(byte: u8) -> bool {
    byte == b'"' || byte == b'\\' || byte < 0x20
}

impl<'a> Parser<'a> {
    fn new(text: &'a str) -> Self {
        Parser {
            text,
            pos: 0,
            depth: 0,
        }
    }

    /// The body's bytes (JSON's structure is ASCII, so it is read byte by byte).
    fn bytes(&self) -> &'a [u8] {
        self.text.as_bytes()
    }

    // --- JSON ---

    fn whitespace(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.bytes().get(self.pos) {
            self.pos += 1;
        }
    }

    /// The next byte after whitespace, not consumed.
    fn peek(&mut self) -> Option<u8> {
        self.whitespace();
        self.bytes().get(self.pos).copied()
    }

    fn eat(&mut self, byte: u8) -> Parsed<()> {
        if self.peek() != Some(byte) {
            return Err(Declined);
        }
        self.pos += 1;
        Ok(())
    }

    fn enter(&mut self) -> Parsed<()> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(Declined);
        }
        Ok(())
    }

    /// An object, calling `field` with each key; `field` consumes the value.
    fn object(&mut self, mut field: impl FnMut(&mut Self, &str) -> Parsed<()>) -> Parsed<()> {
        self.eat(b'{')?;
        self.enter()?;
        if self.peek() == Some(b'}') {
            self.pos += 1;
        } else {
            loop {
                let key = self.string()?;
                self.eat(b':')?;
                field(self, &key)?;
                match self.peek() {
                    Some(b',') => self.pos += 1,
                    Some(b'}') => {
                        self.pos += 1;
                        break;
                    }
                    _ => return Err(Declined),
                }
            }
        }
        self.depth -= 1;
        Ok(())
    }

    /// An array, each element read by `item`.
    fn array<T>(&mut self, mut item: impl FnMut(&mut Self) -> Parsed<T>) -> Parsed<Vec<T>> {
        self.eat(b'[')?;
        self.enter()?;
        let mut items = Vec::new();
        if self.peek() == Some(b']') {
            self.pos += 1;
        } else {
            loop {
                items.push(item(self)?);
                match self.peek() {
                    Some(b',') => self.pos += 1,
                    Some(b']') => {
                        self.pos += 1;
                        break;
                    }
                    _ => return Err(Declined),
                }
            }
        }
        self.depth -= 1;
        Ok(items)
    }

    /// A string, borrowed from the body unless it has escapes.
    fn string(&mut self) -> Parsed<Cow<'a, str>> {
        self.eat(b'"')?;
        let start = self.pos;
        let end = self.plain_run(start);
        match self.bytes().get(end) {
            Some(b'"') => {
                self.pos = end + 1;
                // `start` and `end` are next to ASCII bytes, so on character boundaries.
                Ok(Cow::Borrowed(&self.text[start..end]))
            }
            Some(b'\\') => {
                let mut out = String::from(&self.text[start..end]);
                self.pos = end;
                self.escaped(&mut out)?;
                Ok(Cow::Owned(out))
            }
            // A control character (JSON forbids them unescaped) or the end of the body.
            _ => Err(Declined),
        }
    }

    fn owned_string(&mut self) -> Parsed<String> {
        self.string().map(Cow::into_owned)
    }

    /// Where the run of plain text starting at `from` ends: the first quote, backslash or
    /// control character, or the end of the body. Eight bytes at a time, as serde_json does:
    /// `has_zero(v)` is `(v - 0x01…) & !v & 0x80…`, exact for the lowest byte it flags.
    fn plain_run(&self, from: usize) -> usize {
        const ONES: u64 = 0x0101_0101_0101_0101;
        const HIGHS: u64 = 0x8080_8080_8080_8080;
        let mut at = from;
        while let Some(chunk) = self.bytes()[at..].first_chunk::<8>() {
            let chunk = u64::from_le_bytes(*chunk);
            let quote = chunk ^ (ONES * u64::from(b'"'));
            let backslash = chunk ^ (ONES * u64::from(b'\\'));
            let found = (quote.wrapping_sub(ONES) & !quote
                | backslash.wrapping_sub(ONES) & !backslash
                | chunk.wrapping_sub(ONES * 0x20) & !chunk)
                & HIGHS;
            if found != 0 {
                return at + (found.trailing_zeros() / 8) as usize;
            }
            at += 8;
        }
        self.bytes()[at..]
            .iter()
            .position(|&byte| special(byte))
            .map_or(self.bytes().len(), |run| at + run)
    }

    /// The rest of a string from an escape on, up to and past its closing quote.
    fn escaped(&mut self, out: &mut String) -> Parsed<()> {
        loop {
            match *self.bytes().get(self.pos).ok_or(Declined)? {
                b'"' => {
                    self.pos += 1;
                    return Ok(());
                }
                b'\\' => {
                    let escape = *self.bytes().get(self.pos + 1).ok_or(Declined)?;
                    self.pos += 2;
                    out.push(match escape {
                        b'"' => '"',
                        b'\\' => '\\',
                        b'/' => '/',
                        b'b' => '\u{8}',
                        b'f' => '\u{c}',
                        b'n' => '\n',
                        b'r' => '\r',
                        b't' => '\t',
                        b'u' => self.unicode_escape()?,
                        _ => return Err(Declined),
                    });
                }
                byte if byte < 0x20 => return Err(Declined),
                _ => {
                    let end = self.plain_run(self.pos);
                    out.push_str(&self.text[self.pos..end]);
                    self.pos = end;
                }
            }
        }
    }

    /// The character of a `\uXXXX` escape whose `\u` was read, joining surrogate pairs; a
    /// lone surrogate is declined.
    fn unicode_escape(&mut self) -> Parsed<char> {
        let first = self.hex4()?;
        if !(0xD800..0xDC00).contains(&first) {
            return char::from_u32(first).ok_or(Declined);
        }
        if self.bytes().get(self.pos..self.pos + 2) != Some(b"\\u") {
            return Err(Declined);
        }
        self.pos += 2;
        let second = self.hex4()?;
        if !(0xDC00..0xE000).contains(&second) {
            return Err(Declined);
        }
        char::from_u32(0x10000 + ((first - 0xD800) << 10) + (second - 0xDC00)).ok_or(Declined)
    }

    fn hex4(&mut self) -> Parsed<u32> {
        let digits = self.bytes().get(self.pos..self.pos + 4).ok_or(Declined)?;
        let mut value = 0;
        for &digit in digits {
            value = value * 16 + u32::from(hex_digit(digit)?);
        }
        self.pos += 4;
        Ok(value)
    }

    /// A number's text, checked against JSON's grammar, and whether it is an integer.
    fn number(&mut self) -> Parsed<(&'a str, bool)> {
        self.whitespace();
        let start = self.pos;
        let digits = |parser: &mut Self| -> Parsed<()> {
            let from = parser.pos;
            while let Some(b'0'..=b'9') = parser.bytes().get(parser.pos) {
                parser.pos += 1;
            }
            if parser.pos == from {
                return Err(Declined);
            }
            Ok(())
        };
        if self.bytes().get(self.pos) == Some(&b'-') {
            self.pos += 1;
        }
        match self.bytes().get(self.pos) {
            Some(b'0') => self.pos += 1,
            Some(b'1'..=b'9') => digits(self)?,
            _ => return Err(Declined),
        }
        let mut integer = true;
        if self.bytes().get(self.pos) == Some(&b'.') {
            integer = false;
            self.pos += 1;
            digits(self)?;
        }
        if let Some(b'e' | b'E') = self.bytes().get(self.pos) {
            integer = false;
            self.pos += 1;
            if let Some(b'+' | b'-') = self.bytes().get(self.pos) {
                self.pos += 1;
            }
            digits(self)?;
        }
        Ok((&self.text[start..self.pos], integer))
    }

    /// An integer in `T`'s range, written as a JSON integer (not `-0`, which serde_json
    /// reads as a float).
    fn integer<T: FromStr>(&mut self) -> Parsed<T> {
        match self.number()? {
            (text, true) if text != "-0" => text.parse().map_err(|_| Declined),
            _ => Err(Declined),
        }
    }

    /// A 64-bit integer as OTLP/JSON writes it: a decimal string or a JSON integer.
    fn string_or_integer<T: FromStr>(&mut self) -> Parsed<T> {
        if self.peek() == Some(b'"') {
            self.string()?.parse().map_err(|_| Declined)
        } else {
            self.integer()
        }
    }

    fn literal(&mut self, word: &[u8]) -> Parsed<()> {
        self.whitespace();
        if self.bytes().get(self.pos..self.pos + word.len()) != Some(word) {
            return Err(Declined);
        }
        self.pos += word.len();
        Ok(())
    }

    /// An optional message: `null` (what opentelemetry-proto writes for one not set) or
    /// the message.
    fn optional<T>(&mut self, message: fn(&mut Self) -> Parsed<T>) -> Parsed<Option<T>> {
        if self.peek() == Some(b'n') {
            return self.literal(b"null").map(|()| None);
        }
        message(self).map(Some)
    }

    fn bool(&mut self) -> Parsed<bool> {
        match self.peek() {
            Some(b't') => self.literal(b"true").map(|()| true),
            Some(b'f') => self.literal(b"false").map(|()| false),
            _ => Err(Declined),
        }
    }

    /// Skips a value of a field the generated types do not have (they ignore those).
    fn skip(&mut self) -> Parsed<()> {
        match self.peek().ok_or(Declined)? {
            b'"' => self.string().map(drop),
            b'{' => self.object(|parser, _| parser.skip()),
            b'[' => self.array(|parser| parser.skip()).map(drop),
            b't' => self.literal(b"true"),
            b'f' => self.literal(b"false"),
            b'n' => self.literal(b"null"),
            _ => self.number().map(drop),
        }
    }

    // --- OTLP ---

    /// Hex ids, any case, any even length (the length is validated in `normalize`), as the
    /// `hex` crate reads them for the reference.
    fn hex_id(&mut self) -> Parsed<Vec<u8>> {
        let text = self.string()?;
        let digits = text.as_bytes();
        if digits.len() % 2 != 0 {
            return Err(Declined);
        }
        let mut id = Vec::with_capacity(digits.len() / 2);
        // Checked once at the end: any invalid digit leaves a high nibble in `seen`.
        let mut seen = 0;
        for pair in digits.chunks_exact(2) {
            let (high, low) = (
                HEX_DIGITS[usize::from(pair[0])],
                HEX_DIGITS[usize::from(pair[1])],
            );
            seen |= high | low;
            id.push(high << 4 | low);
        }
        if seen & 0xF0 != 0 {
            return Err(Declined);
        }
        Ok(id)
    }

    fn request(&mut self) -> Parsed<ExportTraceServiceRequest> {
        let mut out = ExportTraceServiceRequest::default();
        message!(self, out, {
            "resourceSpans" => resource_spans: |p: &mut Self| p.array(Self::resource_spans),
        })?;
        Ok(out)
    }

    fn resource_spans(&mut self) -> Parsed<ResourceSpans> {
        let mut out = ResourceSpans::default();
        message!(self, out, {
            "resource" => resource: |p: &mut Self| p.optional(Self::resource),
            "scopeSpans" => scope_spans: |p: &mut Self| p.array(Self::scope_spans),
            "schemaUrl" => schema_url: Self::owned_string,
        })?;
        Ok(out)
    }

    fn resource(&mut self) -> Parsed<Resource> {
        let mut out = Resource::default();
        message!(self, out, {
            "attributes" => attributes: |p: &mut Self| p.array(Self::key_value),
            "droppedAttributesCount" => dropped_attributes_count: Self::integer,
            // Serialised as `[]` by opentelemetry-proto's exporters; entity refs themselves
            // (fields of their own, all required) are left to the reference.
            "entityRefs" => entity_refs: |p: &mut Self| p.array(|_| Err(Declined)),
        })?;
        Ok(out)
    }

    fn scope_spans(&mut self) -> Parsed<ScopeSpans> {
        let mut out = ScopeSpans::default();
        message!(self, out, {
            "scope" => scope: |p: &mut Self| p.optional(Self::scope),
            "spans" => spans: |p: &mut Self| p.array(Self::span),
            "schemaUrl" => schema_url: Self::owned_string,
        })?;
        Ok(out)
    }

    fn scope(&mut self) -> Parsed<InstrumentationScope> {
        let mut out = InstrumentationScope::default();
        message!(self, out, {
            "name" => name: Self::owned_string,
            "version" => version: Self::owned_string,
            "attributes" => attributes: |p: &mut Self| p.array(Self::key_value),
            "droppedAttributesCount" => dropped_attributes_count: Self::integer,
        })?;
        Ok(out)
    }

    fn span(&mut self) -> Parsed<Span> {
        let mut out = Span::default();
        message!(self, out, {
            "traceId" => trace_id: Self::hex_id,
            "spanId" => span_id: Self::hex_id,
            "traceState" => trace_state: Self::owned_string,
            "parentSpanId" => parent_span_id: Self::hex_id,
            "flags" => flags: Self::integer,
            "name" => name: Self::owned_string,
            "kind" => kind: Self::integer,
            "startTimeUnixNano" => start_time_unix_nano: Self::string_or_integer,
            "endTimeUnixNano" => end_time_unix_nano: Self::string_or_integer,
            "attributes" => attributes: |p: &mut Self| p.array(Self::key_value),
            "droppedAttributesCount" => dropped_attributes_count: Self::integer,
            "events" => events: |p: &mut Self| p.array(Self::event),
            "droppedEventsCount" => dropped_events_count: Self::integer,
            "links" => links: |p: &mut Self| p.array(Self::link),
            "droppedLinksCount" => dropped_links_count: Self::integer,
            "status" => status: |p: &mut Self| p.optional(Self::status),
        })?;
        Ok(out)
    }

    fn event(&mut self) -> Parsed<span::Event> {
        let mut out = span::Event::default();
        message!(self, out, {
            "timeUnixNano" => time_unix_nano: Self::string_or_integer,
            "name" => name: Self::owned_string,
            "attributes" => attributes: |p: &mut Self| p.array(Self::key_value),
            "droppedAttributesCount" => dropped_attributes_count: Self::integer,
        })?;
        Ok(out)
    }

    fn link(&mut self) -> Parsed<span::Link> {
        let mut out = span::Link::default();
        message!(self, out, {
            "traceId" => trace_id: Self::hex_id,
            "spanId" => span_id: Self::hex_id,
            "traceState" => trace_state: Self::owned_string,
            "attributes" => attributes: |p: &mut Self| p.array(Self::key_value),
            "droppedAttributesCount" => dropped_attributes_count: Self::integer,
            "flags" => flags: Self::integer,
        })?;
        Ok(out)
    }

    fn status(&mut self) -> Parsed<Status> {
        let mut out = Status::default();
        message!(self, out, {
            "message" => message: Self::owned_string,
            "code" => code: Self::integer,
        })?;
        Ok(out)
    }

    fn key_value(&mut self) -> Parsed<KeyValue> {
        let mut out = KeyValue::default();
        let seen = message!(self, out, {
            "key" => key: Self::owned_string,
            "value" => value: |p: &mut Self| p.optional(Self::any_value),
            "keyStrindex" => key_strindex: Self::integer,
        })?;
        // `key` (the first field) has no default in the generated types.
        if seen & 1 == 0 {
            return Err(Declined);
        }
        Ok(out)
    }

    /// An `AnyValue` of exactly one known kind. Anything else (none, several, nulls, bytes,
    /// unknown keys) goes to the reference, whose flattened field has rules of its own.
    fn any_value(&mut self) -> Parsed<AnyValue> {
        let mut value = None;
        self.object(|parser, key| {
            if value.is_some() {
                return Err(Declined);
            }
            value = Some(match key {
                "stringValue" => any_value::Value::StringValue(parser.owned_string()?),
                "boolValue" => any_value::Value::BoolValue(parser.bool()?),
                "intValue" => any_value::Value::IntValue(parser.string_or_integer()?),
                "doubleValue" => any_value::Value::DoubleValue(parser.double()?),
                "arrayValue" => any_value::Value::ArrayValue(ArrayValue {
                    values: parser.values(Self::any_value)?,
                }),
                "kvlistValue" => any_value::Value::KvlistValue(KeyValueList {
                    values: parser.values(Self::key_value)?,
                }),
                _ => return Err(Declined),
            });
            Ok(())
        })?;
        match value {
            Some(value) => Ok(AnyValue { value: Some(value) }),
            None => Err(Declined),
        }
    }

    /// A JSON number as serde_json reads it into an `f64` (its rounding, not the standard
    /// library's, so that results equal the reference's).
    fn double(&mut self) -> Parsed<f64> {
        let (text, _) = self.number()?;
        serde_json::from_str(text).map_err(|_| Declined)
    }

    /// `{"values": [...]}`, the shape of `ArrayValue` and `KeyValueList` (`values` required).
    fn values<T>(&mut self, item: fn(&mut Self) -> Parsed<T>) -> Parsed<Vec<T>> {
        let mut values = None;
        self.object(|parser, key| {
            if key != "values" {
                return parser.skip();
            }
            if values.is_some() {
                return Err(Declined);
            }
            values = Some(parser.array(item)?);
            Ok(())
        })?;
        values.ok_or(Declined)
    }
}

#[cfg(test)]
#[path = "json_tests.rs"]
mod tests;

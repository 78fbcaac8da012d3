//! budgetscope's own span model.
//!
//! Architecture invariant: this module names no OTLP, database, web or serde type. Every
//! other layer converts into these types once (`normalize`) and out of them at its edge
//! (`store::codec`, `web::api`).

use std::fmt;
use std::sync::Arc;

/// A 16-byte trace id that is not all zeros.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TraceId(pub [u8; 16]);

/// An 8-byte span id that is not all zeros.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SpanId(pub [u8; 8]);

/// Why bytes or text could not become an id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdError {
    #[error("is {actual} bytes long, expected {expected}")]
    WrongLength { expected: usize, actual: usize },
    #[error("is all zeros")]
    AllZero,
    #[error("is not {expected} hex digits")]
    NotHex { expected: usize },
}

macro_rules! impl_id {
    ($name:ident, $len:literal) => {
        impl $name {
            pub const LEN: usize = $len;

            pub fn from_bytes(bytes: &[u8]) -> Result<Self, IdError> {
                let array: [u8; $len] = bytes.try_into().map_err(|_| IdError::WrongLength {
                    expected: $len,
                    actual: bytes.len(),
                })?;
                if array == [0; $len] {
                    return Err(IdError::AllZero);
                }
                Ok(Self(array))
            }

            pub fn from_hex(text: &str) -> Result<Self, IdError> {
                let mut array = [0u8; $len];
                hex::decode_to_slice(text, &mut array)
                    .map_err(|_| IdError::NotHex { expected: $len * 2 })?;
                Self::from_bytes(&array)
            }

            pub fn to_hex(&self) -> String {
                hex::encode(self.0)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.to_hex())
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({})", stringify!($name), self.to_hex())
            }
        }
    };
}

impl_id!(TraceId, 16);
impl_id!(SpanId, 8);

/// OTLP span kind. `Unspecified` covers both 0 and values this version does not know.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SpanKind {
    Unspecified,
    Internal,
    Server,
    Client,
    Producer,
    Consumer,
}

impl SpanKind {
    /// The OTLP enum number.
    pub fn as_i32(self) -> i32 {
        match self {
            SpanKind::Unspecified => 0,
            SpanKind::Internal => 1,
            SpanKind::Server => 2,
            SpanKind::Client => 3,
            SpanKind::Producer => 4,
            SpanKind::Consumer => 5,
        }
    }

    pub fn from_i32(value: i32) -> SpanKind {
        match value {
            1 => SpanKind::Internal,
            2 => SpanKind::Server,
            3 => SpanKind::Client,
            4 => SpanKind::Producer,
            5 => SpanKind::Consumer,
            _ => SpanKind::Unspecified,
        }
    }

    /// The lowercase name used by the JSON API.
    pub fn as_str(self) -> &'static str {
        match self {
            SpanKind::Unspecified => "unspecified",
            SpanKind::Internal => "internal",
            SpanKind::Server => "server",
            SpanKind::Client => "client",
            SpanKind::Producer => "producer",
            SpanKind::Consumer => "consumer",
        }
    }
}

/// OTLP status code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatusCode {
    Unset,
    Ok,
    Error,
}

impl StatusCode {
    pub fn as_i32(self) -> i32 {
        match self {
            StatusCode::Unset => 0,
            StatusCode::Ok => 1,
            StatusCode::Error => 2,
        }
    }

    pub fn from_i32(value: i32) -> StatusCode {
        match value {
            1 => StatusCode::Ok,
            2 => StatusCode::Error,
            _ => StatusCode::Unset,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            StatusCode::Unset => "unset",
            StatusCode::Ok => "ok",
            StatusCode::Error => "error",
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Status {
    pub code: StatusCode,
    pub message: String,
}

/// An attribute value of any OTLP `AnyValue` type.
#[derive(Debug, Clone, PartialEq)]
pub enum AttrValue {
    Empty,
    String(String),
    Bool(bool),
    Int(i64),
    Double(f64),
    Bytes(Vec<u8>),
    Array(Vec<AttrValue>),
    Map(Vec<(String, AttrValue)>),
}

/// Attributes keep the order the exporter sent them in.
pub type Attributes = Vec<(String, AttrValue)>;

/// Looks up an attribute by key (first occurrence wins).
pub fn attr<'a>(attributes: &'a Attributes, key: &str) -> Option<&'a AttrValue> {
    attributes.iter().find(|(k, _)| k == key).map(|(_, v)| v)
}

#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    pub time_unix_nano: u64,
    pub name: String,
    pub attributes: Attributes,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Link {
    pub trace_id: TraceId,
    pub span_id: SpanId,
    pub attributes: Attributes,
}

/// The instrumentation scope that produced a span.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Scope {
    pub name: String,
    pub version: String,
}

/// The remaining deadline budget a span recorded, and which attribute it came from.
#[derive(Debug, Clone, PartialEq)]
pub struct Budget {
    pub ms: f64,
    pub source: String,
}

/// One span as budgetscope keeps it.
#[derive(Debug, Clone, PartialEq)]
pub struct Span {
    pub trace_id: TraceId,
    pub span_id: SpanId,
    pub parent_span_id: Option<SpanId>,
    pub service: String,
    pub name: String,
    pub kind: SpanKind,
    pub start_unix_nano: u64,
    pub end_unix_nano: u64,
    pub status: Status,
    pub attributes: Attributes,
    /// Shared by every span of one OTLP `ResourceSpans`.
    pub resource: Arc<Attributes>,
    pub scope: Scope,
    pub events: Vec<Event>,
    pub links: Vec<Link>,
    pub budget: Option<Budget>,
    /// Data-quality warnings found while normalising (unparsable budget, lossy text…).
    pub warnings: Vec<String>,
}

impl Span {
    /// Duration in nanoseconds; 0 when the end precedes the start (never underflows).
    pub fn duration_nanos(&self) -> u64 {
        self.end_unix_nano.saturating_sub(self.start_unix_nano)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_reject_wrong_length_and_zero() {
        assert_eq!(
            TraceId::from_bytes(&[1; 8]),
            Err(IdError::WrongLength {
                expected: 16,
                actual: 8
            })
        );
        assert_eq!(SpanId::from_bytes(&[0; 8]), Err(IdError::AllZero));
        assert_eq!(
            SpanId::from_hex("zz"),
            Err(IdError::NotHex { expected: 16 })
        );
        let id = TraceId::from_hex("0af7651916cd43dd8448eb211c80319c").unwrap();
        assert_eq!(id.to_hex(), "0af7651916cd43dd8448eb211c80319c");
    }

    #[test]
    fn duration_never_underflows() {
        let span = Span {
            trace_id: TraceId([1; 16]),
            span_id: SpanId([1; 8]),
            parent_span_id: None,
            service: "s".into(),
            name: "n".into(),
            kind: SpanKind::Server,
            start_unix_nano: 10,
            end_unix_nano: 5,
            status: Status {
                code: StatusCode::Unset,
                message: String::new(),
            },
            attributes: vec![],
            resource: Arc::default(),
            scope: Scope::default(),
            events: vec![],
            links: vec![],
            budget: None,
            warnings: vec![],
        };
        assert_eq!(span.duration_nanos(), 0);
    }
}

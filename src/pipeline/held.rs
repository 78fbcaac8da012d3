//! Recently committed spans, held per trace in the compact form the analysis reads, so the
//! analyzer can summarise a trace without reading its spans back from the store.
//!
//! Architecture invariant: only committed spans are held, and the analyzer uses a trace's
//! held spans only when the store holds exactly as many spans of it and no span id is held
//! twice; a span committed by another instance or before a restart, a trace that found no
//! room, or a repeated span id sends the analyzer to the store instead. Held spans take
//! their bytes from the memory budget, at most a third of its pool; a trace that finds no
//! room is let go from memory, never the cause of a refusal.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::core::analyze::ATTRIBUTES_READ;
use crate::core::model::{
    AttrValue, Budget, Scope, Span, SpanId, SpanKind, Status, StatusCode, TraceId,
};
use crate::pipeline::memory::{MemoryBudget, Reservation};

/// Held spans take at most this share of the memory budget's pool (1/3, 128 MiB by default):
/// enough for the traces waiting out the quiet period at 50k spans/s, where a trace that
/// finds no room is read back from the store at many times the cost
/// (`budgetscope-bench sustained --rate 50000`).
const POOL_SHARE_DIVISOR: u64 = 3;

/// A trace held this long without being taken (its marks were cleared some other way) is
/// let go, so nothing stays held for good.
const STALE: Duration = Duration::from_secs(600);

/// Distinct operations (service and span name) kept for sharing; past this the table starts
/// over (operations still held stay alive in their spans).
const MAX_OPERATIONS: usize = 100_000;

/// Bookkeeping per held trace (its map entry), beside its spans.
const TRACE_OVERHEAD: u64 = 96;

/// One span as the analysis reads it (`ATTRIBUTES_READ` and the fields its rules use),
/// without its trace id (the key it is held under): 72 bytes inline.
#[derive(Debug, Clone, PartialEq)]
pub struct HeldSpan {
    span_id: SpanId,
    parent_span_id: Option<SpanId>,
    /// Service and span name, shared by every span of the operation.
    operation: Arc<Operation>,
    kind: SpanKind,
    status: StatusCode,
    start_unix_nano: u64,
    end_unix_nano: u64,
    /// The budget in milliseconds, NaN for none (a budget is always finite).
    budget_ms: f64,
    /// The attributes in `ATTRIBUTES_READ` (by index there), in the span's order.
    attributes: Box<[(u8, AttrValue)]>,
}

/// A service and span name, held once for all of its spans.
#[derive(Debug, PartialEq, Eq)]
struct Operation {
    service: Box<str>,
    name: Box<str>,
}

impl HeldSpan {
    /// The span the analysis sees: what was held, everything else empty.
    pub fn to_span(&self, trace_id: TraceId) -> Span {
        Span {
            trace_id,
            span_id: self.span_id,
            parent_span_id: self.parent_span_id,
            service: self.operation.service.to_string(),
            name: self.operation.name.to_string(),
            kind: self.kind,
            start_unix_nano: self.start_unix_nano,
            end_unix_nano: self.end_unix_nano,
            status: Status {
                code: self.status,
                message: String::new(),
            },
            attributes: self
                .attributes
                .iter()
                .map(|(key, value)| (ATTRIBUTES_READ[*key as usize].to_string(), value.clone()))
                .collect(),
            resource: Arc::default(),
            scope: Scope::default(),
            events: Vec::new(),
            links: Vec::new(),
            budget: (!self.budget_ms.is_nan()).then(|| Budget {
                ms: self.budget_ms,
                source: String::new(),
            }),
            warnings: Vec::new(),
        }
    }

    /// Heap and inline bytes, as accounted in the memory budget (shared names not counted).
    pub fn bytes(&self) -> u64 {
        (std::mem::size_of::<HeldSpan>()
            + self
                .attributes
                .iter()
                .map(|(_, value)| std::mem::size_of::<(u8, AttrValue)>() + value_bytes(value))
                .sum::<usize>()) as u64
    }
}

fn value_bytes(value: &AttrValue) -> usize {
    match value {
        AttrValue::String(s) => s.len(),
        AttrValue::Bytes(b) => b.len(),
        AttrValue::Array(values) => values
            .iter()
            .map(|v| std::mem::size_of::<AttrValue>() + value_bytes(v))
            .sum(),
        AttrValue::Map(entries) => entries
            .iter()
            .map(|(k, v)| std::mem::size_of::<(String, AttrValue)>() + k.len() + value_bytes(v))
            .sum(),
        AttrValue::Empty | AttrValue::Bool(_) | AttrValue::Int(_) | AttrValue::Double(_) => 0,
    }
}

/// The held traces.
pub struct HeldTraces {
    held: Mutex<Held>,
    /// Operations by service, then span name.
    operations: Mutex<Operations>,
    max_bytes: u64,
}

struct Held {
    traces: HashMap<TraceId, HeldTrace>,
    /// The bytes of every held trace, reserved in the memory budget.
    reservation: Reservation,
    swept: Instant,
}

struct HeldTrace {
    spans: Vec<HeldSpan>,
    bytes: u64,
    added: Instant,
    /// Some of its spans found no room: none of them are held.
    let_go: bool,
}

impl HeldTraces {
    pub fn new(memory: &Arc<MemoryBudget>) -> Arc<HeldTraces> {
        Arc::new(HeldTraces {
            held: Mutex::new(Held {
                traces: HashMap::new(),
                reservation: memory.empty(),
                swept: Instant::now(),
            }),
            operations: Mutex::new(Operations::default()),
            max_bytes: memory.pool() / POOL_SHARE_DIVISOR,
        })
    }

    /// The spans of a request in held form, before they are committed (they are `add`ed
    /// once they are).
    pub fn project(&self, spans: &[Span]) -> Vec<(TraceId, HeldSpan)> {
        let mut operations = lock(&self.operations);
        if operations.count > MAX_OPERATIONS {
            *operations = Operations::default();
        }
        spans
            .iter()
            .map(|span| {
                let held = HeldSpan {
                    span_id: span.span_id,
                    parent_span_id: span.parent_span_id,
                    operation: operations.share(&span.service, &span.name),
                    kind: span.kind,
                    status: span.status.code,
                    start_unix_nano: span.start_unix_nano,
                    end_unix_nano: span.end_unix_nano,
                    budget_ms: span.budget.as_ref().map_or(f64::NAN, |b| b.ms),
                    attributes: span
                        .attributes
                        .iter()
                        .filter_map(|(key, value)| {
                            let index = ATTRIBUTES_READ.iter().position(|k| k == key)?;
                            Some((index as u8, value.clone()))
                        })
                        .collect(),
                };
                (span.trace_id, held)
            })
            .collect()
    }

    /// Holds committed spans. A trace that no longer fits is let go whole, and its later
    /// spans are not held either (its spans are then read from the store).
    pub fn add(&self, spans: Vec<(TraceId, HeldSpan)>) {
        let now = Instant::now();
        let mut guard = lock(&self.held);
        let held = &mut *guard;
        let mut total = held.reservation.bytes();
        for (trace_id, span) in spans {
            let bytes = span.bytes();
            let entry = held.traces.entry(trace_id).or_insert_with(|| {
                total += TRACE_OVERHEAD;
                HeldTrace {
                    spans: Vec::new(),
                    bytes: TRACE_OVERHEAD,
                    added: now,
                    let_go: false,
                }
            });
            entry.added = now;
            if entry.let_go {
                continue;
            }
            if total + bytes > self.max_bytes || !held.reservation.try_grow_to(total + bytes) {
                total -= entry.bytes - TRACE_OVERHEAD;
                *entry = HeldTrace {
                    spans: Vec::new(),
                    bytes: TRACE_OVERHEAD,
                    added: now,
                    let_go: true,
                };
                continue;
            }
            entry.spans.push(span);
            entry.bytes += bytes;
            total += bytes;
        }
        held.reservation.set(total);
    }

    /// Takes the held spans of `traces` out (all of them, whatever is returned), and returns
    /// those of each trace held without a repeated span id, by trace. The caller checks the
    /// count against the store before using them.
    pub fn take(&self, traces: &[TraceId]) -> HashMap<TraceId, Vec<HeldSpan>> {
        let mut guard = lock(&self.held);
        let held = &mut *guard;
        let mut total = held.reservation.bytes();
        let mut taken = HashMap::new();
        for trace in traces {
            let Some(gone) = held.traces.remove(trace) else {
                continue;
            };
            total -= gone.bytes;
            if gone.let_go {
                continue;
            }
            let mut ids: Vec<SpanId> = gone.spans.iter().map(|s| s.span_id).collect();
            ids.sort_unstable();
            let before = ids.len();
            ids.dedup();
            if ids.len() == before {
                taken.insert(*trace, gone.spans);
            }
        }
        if held.swept.elapsed() > STALE / 10 {
            held.traces.retain(|_, trace| {
                let keep = trace.added.elapsed() < STALE;
                if !keep {
                    total -= trace.bytes;
                }
                keep
            });
            held.swept = Instant::now();
        }
        held.reservation.set(total);
        taken
    }

    /// Traces and bytes held now.
    pub fn held(&self) -> (usize, u64) {
        let held = lock(&self.held);
        (held.traces.len(), held.reservation.bytes())
    }
}

impl std::fmt::Debug for HeldTraces {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (traces, bytes) = self.held();
        f.debug_struct("HeldTraces")
            .field("traces", &traces)
            .field("bytes", &bytes)
            .field("max_bytes", &self.max_bytes)
            .finish()
    }
}

#[derive(Default)]
struct Operations {
    by_service: HashMap<Box<str>, HashMap<Box<str>, Arc<Operation>>>,
    count: usize,
}

impl Operations {
    fn share(&mut self, service: &str, name: &str) -> Arc<Operation> {
        if let Some(operation) = self
            .by_service
            .get(service)
            .and_then(|names| names.get(name))
        {
            return operation.clone();
        }
        let operation = Arc::new(Operation {
            service: service.into(),
            name: name.into(),
        });
        self.by_service
            .entry(service.into())
            .or_default()
            .insert(name.into(), operation.clone());
        self.count += 1;
        operation
    }
}

/// The data behind these locks is consistent after every statement, so a panic elsewhere
/// while one was held leaves nothing half-done.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::analyze::fixture::parse;
    use crate::core::analyze::{AnalyzeOptions, analyze, hops::samples, summary::summarize};
    use crate::core::budget::DEFAULT_BUDGET_KEYS;
    use crate::otlp::normalize::{NormalizeOptions, normalize};

    const MIB: u64 = 1 << 20;

    /// What the analyzer writes for a trace: its summary and hop samples.
    fn written(spans: &[Span]) -> String {
        let mut spans = spans.to_vec();
        spans.sort_by_key(|s| (s.start_unix_nano, s.span_id));
        let analysis = analyze(&spans, &AnalyzeOptions::default());
        format!(
            "{:?}\n{:?}",
            summarize(&spans, &analysis),
            samples(&spans, &analysis)
        )
    }

    /// Traces with every attribute the rules read, and much they do not.
    const FIXTURES: [&str; 11] = [
        r#"
edge server "POST /checkout" 0 1000 budget=1000
  edge client "POST /charge" 10 200 budget=990 method=POST attr:server.address=billing
  edge client "POST /charge" 220 200 budget=780 method=POST attr:server.address=billing
  edge client "POST /charge" 430 200 budget=570 method=POST attr:server.address=billing attr:http.request.header.idempotency-key=k1
  edge client "GET /stock" 10 100 budget=990 attr:peer.service=inventory attr:http.method=get
    inventory server "GET /stock" 12 96 budget=985 http-status=504
"#,
        r#"
edge server "GET /a" 0 500 budget=300
  edge client "b/Call" 5 480 budget=295 attr:rpc.service=b attr:rpc.method=Call
    b server "b/Call" 6 470 budget=5000 grpc-status=4 error=error
      b client "GET" 10 400 attr:url.full=http://c/x?y=1 attr:error.type=timeout
        c server "GET /x" 12 390 budget=280 attr:http.status_code=504 attr:http.request.header.x-idempotency-key=z
"#,
        r#"
gw server "GET /" 0 100
  gw client "GET /api" 1 99 attr:http.request.method=POST attr:rpc.grpc.status_code=DEADLINE_EXCEEDED
    api server "GET /api" 2 97 budget=50 parent=missing
"#,
        r#"
a server "x" 0 10 budget=5
  a internal "work" 1 8 budget=4
    a client "y" 2 6 budget=3 attr:http.response.status_code=200
"#,
        // Attempts that are retries of one target only without the attribute naming it.
        r#"
edge server "POST /checkout" 0 1000 budget=1000
  edge client "POST /a" 10 100 budget=990 method=POST attr:server.address=x1
  edge client "POST /a" 120 100 budget=880 method=POST attr:server.address=x2
  edge client "POST /b" 230 100 budget=770 method=POST attr:peer.service=p1
  edge client "POST /b" 340 100 budget=660 method=POST attr:peer.service=p2
  edge client "POST /c" 450 100 budget=550 attr:http.method=POST attr:rpc.service=s attr:rpc.method=m1
  edge client "POST /c" 560 100 budget=440 attr:http.method=POST attr:rpc.service=s attr:rpc.method=m2
  edge client "POST /d" 670 100 budget=330 method=POST attr:url.full=http://h/1?q
  edge client "POST /d" 780 100 budget=220 method=POST attr:url.full=http://h/2?q
"#,
        // Unsafe retries but for their idempotency keys.
        r#"
edge server "POST /pay" 0 1000 budget=1000
  edge client "POST /charge" 10 100 budget=990 method=POST attr:http.request.header.x-idempotency-key=k
  edge client "POST /charge" 120 100 budget=880 method=POST attr:http.request.header.x-idempotency-key=k
"#,
        // An unsafe retry by its method's older attribute alone.
        r#"
edge server "POST /pay" 0 1000 budget=1000
  edge client "POST /charge" 10 100 budget=990 attr:http.method=post
  edge client "POST /charge" 120 100 budget=880 attr:http.method=post
"#,
        // Deadline-exceeded by one attribute each.
        r#"
a server "x" 0 100 budget=50 attr:rpc.grpc.status_code=4
"#,
        r#"
a server "x" 0 100 budget=50 attr:http.status_code=504
"#,
        r#"
a server "x" 0 100 budget=50 attr:error.type=DeadlineExceeded
"#,
        r#"
a server "x" 0 100 budget=50 attr:http.response.status_code=504
"#,
    ];

    fn corpus() -> Vec<Vec<Span>> {
        let mut traces: Vec<Vec<Span>> = FIXTURES.iter().map(|text| parse(text)).collect();
        for (n, spans) in traces.iter_mut().enumerate() {
            for span in spans {
                span.trace_id = TraceId([n as u8 + 1; 16]);
            }
        }
        let now = crate::clock::now_unix_nano();
        let options = NormalizeOptions {
            budget_keys: DEFAULT_BUDGET_KEYS.iter().map(|k| k.to_string()).collect(),
            retention: None,
        };
        let mut generated: HashMap<TraceId, Vec<Span>> = HashMap::new();
        for request in
            crate::otlp::generate::generate_chains(3_000, 500, Duration::from_secs(60), 0.5, 2..=12)
        {
            for span in normalize(request, &options, now).spans {
                generated.entry(span.trace_id).or_default().push(span);
            }
        }
        traces.extend(generated.into_values());
        // What the analysis must not depend on.
        for spans in &mut traces {
            for span in spans.iter_mut() {
                span.attributes
                    .push(("noise.key".into(), AttrValue::String("n".into())));
                span.status.message = "a message".into();
                if let Some(budget) = &mut span.budget {
                    budget.source = "x-request-budget-ms".into();
                }
                span.warnings.push("a warning".into());
                span.scope.name = "scope".into();
            }
        }
        traces
    }

    #[test]
    fn a_held_span_is_72_bytes_inline() {
        assert_eq!(std::mem::size_of::<HeldSpan>(), 72);
    }

    #[test]
    fn held_spans_give_the_same_summary_and_hop_samples() {
        let recent = HeldTraces::new(&MemoryBudget::with_pool(400 * MIB));
        let traces = corpus();
        assert!(traces.len() > 100);
        for spans in &traces {
            recent.add(recent.project(spans));
        }
        let ids: Vec<TraceId> = traces.iter().map(|spans| spans[0].trace_id).collect();
        let mut taken = recent.take(&ids);
        for spans in &traces {
            let id = spans[0].trace_id;
            let held: Vec<Span> = taken
                .remove(&id)
                .expect("every trace was held")
                .iter()
                .map(|span| span.to_span(id))
                .collect();
            assert_eq!(held.len(), spans.len());
            assert_eq!(written(&held), written(spans));
        }
        assert_eq!(recent.held(), (0, 0), "taking gives the memory back");
    }

    #[test]
    fn a_trace_that_does_not_fit_is_let_go_and_its_memory_given_back() {
        let memory = MemoryBudget::with_pool(4 * MIB);
        let recent = HeldTraces::new(&memory);
        let small = parse(FIXTURES[3]);
        recent.add(recent.project(&small));
        let (traces, bytes) = recent.held();
        assert_eq!(traces, 1);
        assert_eq!(memory.used(), bytes, "held bytes are in the budget");
        // More spans of one trace than a third of the pool holds.
        let big = crate::otlp::generate::large_trace(20_000);
        recent.add(recent.project(&big[..10_000]));
        recent.add(recent.project(&big[10_000..]));
        assert_eq!(
            recent.held(),
            (2, bytes + TRACE_OVERHEAD),
            "the big trace was let go whole, and only that is remembered"
        );
        assert!(recent.take(&[big[0].trace_id]).is_empty());
        assert_eq!(recent.held(), (1, bytes));
        // The budget is full: nothing more is held, and nothing is refused.
        let mut ingest = memory.empty();
        assert!(ingest.try_grow_to(4 * MIB - bytes));
        let mut other = parse(FIXTURES[2]);
        for span in &mut other {
            span.trace_id = TraceId([0xab; 16]);
        }
        recent.add(recent.project(&other));
        assert_eq!(recent.held(), (2, bytes + TRACE_OVERHEAD), "let go");
        drop(ingest);
        assert_eq!(recent.take(&[small[0].trace_id]).len(), 1);
        assert!(recent.take(&[other[0].trace_id]).is_empty());
        assert_eq!(memory.used(), 0);
    }

    #[test]
    fn a_repeated_span_id_sends_the_trace_to_the_store() {
        let recent = HeldTraces::new(&MemoryBudget::with_pool(64 * MIB));
        let spans = parse(FIXTURES[0]);
        recent.add(recent.project(&spans));
        recent.add(recent.project(&spans[..1]));
        assert!(recent.take(&[spans[0].trace_id]).is_empty());
        assert_eq!(recent.held(), (0, 0), "taken out all the same");
    }
}

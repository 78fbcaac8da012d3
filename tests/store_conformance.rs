//! One conformance suite for every `Store` implementation: each test runs on SQLite and,
//! when reachable, on Postgres (see tests/common/mod.rs).

mod common;

use std::sync::Arc;

use budgetscope::core::analyze::hops::{HopSample, samples};
use budgetscope::core::analyze::summary::{TraceSummary, summarize};
use budgetscope::core::analyze::{AnalyzeOptions, analyze};
use budgetscope::core::model::{
    AttrValue, Budget, Event, Link, Scope, Span, SpanId, SpanKind, Status, StatusCode, TraceId,
};
use budgetscope::store::query::{Backlog, DueQuery, RollupQuery, TraceQuery};
use budgetscope::store::{self, Operation, Store, TraceSet};
use common::{TestDb, bulk_spans, file_size, span};

/// Runs `check` against a fresh store of every available backend.
async fn on_every_store<F, Fut>(check: F)
where
    F: Fn(Arc<dyn Store>, &'static str) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    for db in TestDb::all().await {
        let store = store::open(&db.url).await.expect("store opens");
        check(store, db.backend).await;
    }
}

#[tokio::test]
async fn a_span_round_trips_with_every_field() {
    on_every_store(|store, backend| async move {
        let mut full = span(
            1,
            2,
            Some(3),
            "inventory",
            "GET /stock \"<x>\" ünïcode",
            1_780_000_000_123_456_789,
        );
        full.kind = SpanKind::Consumer;
        full.status = Status {
            code: StatusCode::Error,
            message: "deadline exceeded".into(),
        };
        full.attributes = vec![
            ("deadline.remaining_ms".into(), AttrValue::Int(-100)),
            ("ratio".into(), AttrValue::Double(0.5)),
            ("flag".into(), AttrValue::Bool(true)),
            (
                "list".into(),
                AttrValue::Array(vec![AttrValue::String("a".into()), AttrValue::Int(2)]),
            ),
            (
                "nested".into(),
                AttrValue::Map(vec![("k".into(), AttrValue::String("v".into()))]),
            ),
            ("nul".into(), AttrValue::String("a\0b".into())),
        ];
        full.scope = Scope {
            name: "io.opentelemetry.grpc".into(),
            version: "1.2".into(),
        };
        full.events = vec![Event {
            time_unix_nano: 42,
            name: "exception".into(),
            attributes: vec![],
        }];
        full.links = vec![Link {
            trace_id: TraceId([9; 16]),
            span_id: SpanId([8; 8]),
            attributes: vec![],
        }];
        full.budget = Some(Budget {
            ms: 812.5,
            source: "deadline.remaining_ms".into(),
        });
        full.warnings = vec!["budget attribute x has unparsable value \"y\"".into()];
        store
            .write_spans(std::slice::from_ref(&full))
            .await
            .unwrap();

        // Attributes come back in the order they were sent.
        assert_eq!(
            store.trace(TraceId([1; 16])).await.unwrap(),
            vec![full],
            "{backend}"
        );
    })
    .await;
}

#[tokio::test]
async fn writes_are_idempotent_first_copy_wins() {
    on_every_store(|store, backend| async move {
        let first = span(1, 2, None, "a", "first", 1_000);
        let mut retry = first.clone();
        retry.name = "second".into();
        store
            .write_spans(std::slice::from_ref(&first))
            .await
            .unwrap();
        // An exporter retry, and a duplicate within one batch.
        store.write_spans(&[retry.clone(), retry]).await.unwrap();
        let stored = store.trace(TraceId([1; 16])).await.unwrap();
        assert_eq!(stored.len(), 1, "{backend}");
        assert_eq!(stored[0].name, "first", "{backend}");
        assert_eq!(store.span_count().await.unwrap(), 1, "{backend}");
    })
    .await;
}

#[tokio::test]
async fn trace_returns_only_its_spans_in_start_order() {
    on_every_store(|store, backend| async move {
        store
            .write_spans(&[
                span(1, 3, Some(1), "b", "late", 3_000),
                span(1, 1, None, "a", "root", 1_000),
                span(2, 9, None, "z", "other trace", 500),
                span(1, 2, Some(1), "b", "early", 2_000),
            ])
            .await
            .unwrap();
        let names: Vec<String> = store
            .trace(TraceId([1; 16]))
            .await
            .unwrap()
            .into_iter()
            .map(|s| s.name)
            .collect();
        assert_eq!(names, ["root", "early", "late"], "{backend}");
        assert!(
            store.trace(TraceId([7; 16])).await.unwrap().is_empty(),
            "{backend}"
        );
    })
    .await;
}

#[tokio::test]
async fn traces_within_reads_whole_traces_in_id_order_up_to_the_byte_limit() {
    on_every_store(|store, backend| async move {
        let mut spans = Vec::new();
        for trace in [3u8, 1, 2] {
            for id in 1..=3 {
                spans.push(span(trace, id, (id > 1).then_some(1), "svc", "op", 1_000));
            }
        }
        store.write_spans(&spans).await.unwrap();
        let ids = [
            TraceId([3; 16]),
            TraceId([1; 16]),
            TraceId([2; 16]),
            TraceId([9; 16]),
        ];
        let traces_of = |spans: &[Span]| {
            let mut traces: Vec<u8> = spans.iter().map(|s| s.trace_id.0[0]).collect();
            traces.dedup();
            traces
        };

        let all = store.traces_within(&ids, u64::MAX, u64::MAX).await.unwrap();
        assert_eq!(traces_of(&all.spans), [1, 2, 3], "{backend}: id order");
        assert_eq!(all.spans.len(), 9, "{backend}");
        assert_eq!(all.stopped_after, None, "{backend}");
        assert!(all.too_large.is_empty(), "{backend}");
        let per_trace = all.bytes / 3;
        assert!(per_trace > 100, "{backend}: {} bytes counted", all.bytes);

        let one = store.traces_within(&ids, 1, u64::MAX).await.unwrap();
        assert_eq!(
            traces_of(&one.spans),
            [1],
            "{backend}: at least one whole trace"
        );
        assert_eq!(one.spans.len(), 3, "{backend}");
        assert_eq!(one.bytes, per_trace, "{backend}");
        assert_eq!(one.stopped_after, Some(TraceId([1; 16])), "{backend}");

        let two = store
            .traces_within(&ids, 2 * per_trace + 1, u64::MAX)
            .await
            .unwrap();
        assert_eq!(
            traces_of(&two.spans),
            [1, 2],
            "{backend}: stops before the trace that would pass the limit"
        );
        assert_eq!(two.spans.len(), 6, "{backend}");
        assert_eq!(
            two.bytes,
            2 * per_trace,
            "{backend}: nothing of trace 3 held"
        );
        assert_eq!(two.stopped_after, Some(TraceId([2; 16])), "{backend}");
    })
    .await;
}

#[tokio::test]
async fn a_trace_past_the_per_trace_limit_is_listed_too_large_and_outlined() {
    on_every_store(|store, backend| async move {
        let mut spans = Vec::new();
        for trace in [1u8, 3] {
            spans.push(span(trace, 1, None, "svc", "op", 1_000));
        }
        // Trace 2: a root, a client call and 40 server spans of two services.
        spans.push(span(2, 1, None, "gateway", "GET /batch", 5_000));
        let mut call = span(2, 2, Some(1), "gateway", "call worker", 6_000);
        call.kind = SpanKind::Client;
        spans.push(call);
        for id in 3..43u8 {
            let service = if id % 2 == 0 { "worker" } else { "store" };
            spans.push(span(
                2,
                id,
                Some(2),
                service,
                "POST /item",
                7_000 + u64::from(id),
            ));
        }
        store.write_spans(&spans).await.unwrap();
        let ids = [TraceId([1; 16]), TraceId([2; 16]), TraceId([3; 16])];
        let whole = store.traces_within(&ids, u64::MAX, u64::MAX).await.unwrap();
        let small = whole
            .spans
            .iter()
            .filter(|s| s.trace_id == TraceId([1; 16]))
            .count();
        assert_eq!(small, 1, "{backend}");
        let per_small = store.trace_size(&[TraceId([1; 16])]).await.unwrap().bytes;

        // After another trace, the large one would pass the limit: reading stops before it.
        let limit = 5 * per_small;
        let read = store.traces_within(&ids, limit, limit).await.unwrap();
        assert_eq!(read.stopped_after, Some(TraceId([1; 16])), "{backend}");
        assert!(read.too_large.is_empty(), "{backend}");
        assert_eq!(read.bytes, per_small, "{backend}: none of its rows kept");
        // Read first, it passes the per-trace limit: listed, its rows dropped, the next read.
        let read = store.traces_within(&ids[1..], limit, limit).await.unwrap();
        assert_eq!(read.too_large, [TraceId([2; 16])], "{backend}");
        let read_ids: Vec<u8> = read.spans.iter().map(|s| s.trace_id.0[0]).collect();
        assert_eq!(read_ids, [3], "{backend}: the trace after it is read");
        assert_eq!(read.bytes, per_small, "{backend}");
        assert_eq!(read.stopped_after, None, "{backend}");

        let outline = store
            .trace_outline(TraceId([2; 16]))
            .await
            .unwrap()
            .expect("outlined");
        assert_eq!(outline.span_count, 42, "{backend}");
        assert_eq!(
            (outline.root_service.as_str(), outline.root_name.as_str()),
            ("gateway", "GET /batch"),
            "{backend}"
        );
        assert_eq!(
            outline.services,
            ["gateway", "store", "worker"],
            "{backend}"
        );
        assert_eq!(
            outline.operations,
            [
                ("gateway".to_string(), "GET /batch".to_string()),
                ("store".to_string(), "POST /item".to_string()),
                ("worker".to_string(), "POST /item".to_string()),
            ],
            "{backend}: server spans, not the client call"
        );
        assert_eq!(
            outline.start_unix_nano, spans[2].start_unix_nano,
            "{backend}"
        );
        let end = spans
            .iter()
            .filter(|s| s.trace_id == TraceId([2; 16]))
            .map(|s| s.end_unix_nano)
            .max();
        assert_eq!(Some(outline.end_unix_nano), end, "{backend}");
        assert_eq!(
            store.trace_outline(TraceId([9; 16])).await.unwrap(),
            None,
            "{backend}: unknown trace"
        );
    })
    .await;
}

#[tokio::test]
async fn services_and_operations_are_listed_sorted_and_distinct() {
    on_every_store(|store, backend| async move {
        let mut client = span(1, 3, Some(1), "checkout", "GET /stock", 2_000);
        client.kind = SpanKind::Client;
        store
            .write_spans(&[
                span(1, 1, None, "checkout", "POST /checkout", 1_000),
                client,
            ])
            .await
            .unwrap();
        store
            .write_spans(&[span(2, 1, None, "checkout", "POST /checkout", 9_000)])
            .await
            .unwrap();
        store
            .write_spans(&[span(3, 1, None, "billing", "Charge", 9_000)])
            .await
            .unwrap();
        assert_eq!(
            store.services().await.unwrap(),
            ["billing", "checkout"],
            "{backend}"
        );
        assert_eq!(
            store.operations("checkout").await.unwrap(),
            [
                Operation {
                    name: "GET /stock".into(),
                    kind: SpanKind::Client
                },
                Operation {
                    name: "POST /checkout".into(),
                    kind: SpanKind::Server
                },
            ],
            "{backend}"
        );
        assert!(
            store.operations("nobody").await.unwrap().is_empty(),
            "{backend}"
        );
    })
    .await;
}

#[tokio::test]
async fn retention_deletes_old_spans_in_bounded_batches() {
    on_every_store(|store, backend| async move {
        let old: Vec<Span> = (1..=5)
            .map(|i| span(1, i, None, "old", "x", 1_000 + u64::from(i)))
            .collect();
        store.write_spans(&old).await.unwrap();
        store
            .write_spans(&[span(2, 1, None, "new", "y", 10_000)])
            .await
            .unwrap();

        assert_eq!(
            store.delete_before(5_000, 3).await.unwrap(),
            3,
            "{backend}: at most the limit"
        );
        assert_eq!(store.delete_before(5_000, 3).await.unwrap(), 2, "{backend}");
        assert_eq!(store.delete_before(5_000, 3).await.unwrap(), 0, "{backend}");
        assert_eq!(store.span_count().await.unwrap(), 1, "{backend}");
        assert_eq!(
            store.services().await.unwrap(),
            ["new"],
            "{backend}: stale operations go too"
        );
    })
    .await;
}

#[tokio::test]
async fn a_large_batch_is_one_transaction() {
    on_every_store(|store, backend| async move {
        let spans: Vec<Span> = (0..5_000u32)
            .map(|i| {
                let mut s = span(0, 0, None, "bulk", "op", 1_000 + u64::from(i));
                s.trace_id = TraceId([(i % 251) as u8 + 1; 16]);
                s.span_id = SpanId::from_bytes(&(u64::from(i) + 1).to_be_bytes()).unwrap();
                s
            })
            .collect();
        store.write_spans(&spans).await.unwrap();
        assert_eq!(store.span_count().await.unwrap(), 5_000, "{backend}");
    })
    .await;
}

#[tokio::test]
async fn ping_answers_on_a_live_store() {
    on_every_store(|store, backend| async move {
        store
            .ping()
            .await
            .unwrap_or_else(|e| panic!("{backend}: {e}"));
        assert_eq!(store.backend(), backend);
    })
    .await;
}

/// A fresh SQLite store and the path of its WAL file (`db` must outlive the store).
async fn sqlite_store_and_wal() -> (TestDb, Arc<dyn Store>, String) {
    let db = TestDb::sqlite();
    let store = store::open(&db.url).await.unwrap();
    let wal = db.wal_path();
    (db, store, wal)
}

/// SQLite finds old spans through an index on a ~1.07 s bucket of their start (2^30 ns):
/// the cutoff must still be exact, inside the cutoff's own bucket and across buckets.
#[tokio::test]
async fn retention_cutoff_is_exact_across_start_buckets() {
    const SECOND: u64 = 1_000_000_000;
    let base = 1_780_000_000 * SECOND;
    on_every_store(|store, backend| async move {
        let cutoff = base + 10 * SECOND + SECOND / 2;
        let starts = [
            (1, base), // buckets before the cutoff's
            (2, base + 5 * SECOND),
            (3, cutoff - 1), // the cutoff's bucket, just before it
            (4, cutoff),     // kept: not before the cutoff
            (5, cutoff + 1),
            (6, base + 20 * SECOND), // a later bucket
        ];
        for (trace, start) in starts {
            store
                .write_spans(&[span(trace, 1, None, "svc", "op", start)])
                .await
                .unwrap();
        }
        assert_eq!(
            store.delete_before(cutoff, 100).await.unwrap(),
            3,
            "{backend}"
        );
        assert_eq!(
            store.delete_before(cutoff, 100).await.unwrap(),
            0,
            "{backend}"
        );
        for (trace, _) in starts {
            let kept = !store.trace(TraceId([trace; 16])).await.unwrap().is_empty();
            assert_eq!(kept, trace >= 4, "{backend}: trace {trace}");
        }
    })
    .await;
}

/// The writer keeps its connection out of the pool between writes; an in-memory database's
/// readers read through that same connection, so there it must go back after each write
/// (a reader would otherwise wait for it forever).
#[tokio::test]
async fn sqlite_in_memory_store_reads_between_writes() {
    async fn within<T>(what: impl std::future::Future<Output = T>) -> T {
        tokio::time::timeout(std::time::Duration::from_secs(10), what)
            .await
            .expect("a read waited for the writer's connection")
    }
    let store = store::open("sqlite::memory:").await.unwrap();
    for trace in 1..=3u8 {
        store
            .write_spans(&[span(trace, 1, None, "svc", "op", 1_000)])
            .await
            .unwrap();
        let spans = within(store.trace(TraceId([trace; 16]))).await.unwrap();
        assert_eq!(spans.len(), 1);
    }
    assert_eq!(within(store.span_count()).await.unwrap(), 3);
}

/// Writes `bulk_spans` batches of about 2 MB each, numbered from `from`, without a pause
/// until `done` holds after a write; returns the next batch number. 200 batches (400 MB)
/// without it is a failure, named by `what`.
async fn write_until(
    store: &dyn Store,
    from: u32,
    tag: u128,
    what: &str,
    mut done: impl FnMut() -> bool,
) -> u32 {
    let padding = "x".repeat(2_000);
    for batch in from..from + 200 {
        store
            .write_spans(&bulk_spans(batch, tag, &padding))
            .await
            .unwrap();
        if done() {
            return batch + 1;
        }
    }
    panic!("400 MB written without a pause and {what}");
}

/// The checkpoint sequence number in the WAL file's header, which SQLite raises each time
/// the WAL starts over (https://sqlite.org/fileformat2.html#walformat); `None` while the
/// file is empty.
fn wal_sequence(wal: &str) -> Option<u32> {
    use std::io::Read as _;
    let mut header = [0u8; 16];
    std::fs::File::open(wal)
        .ok()?
        .read_exact(&mut header)
        .ok()?;
    Some(u32::from_be_bytes([
        header[12], header[13], header[14], header[15],
    ]))
}

/// The SQLite writer runs its statements on the connection's raw handle, outside sqlx's
/// transaction bookkeeping: a write that fails part-way must still roll back whole and
/// leave the connection outside any transaction, or every later write would fail ("cannot
/// start a transaction within a transaction") and the write lock would stay held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_a_write_that_fails_part_way_rolls_back_whole_and_the_next_commits() {
    use sqlx::Connection as _;
    let (db, store, _wal) = sqlite_store_and_wal().await;
    let mut side = sqlx::SqliteConnection::connect(&db.url).await.unwrap();
    sqlx::query(
        "CREATE TRIGGER poison BEFORE INSERT ON spans WHEN NEW.name = 'poison' \
         BEGIN SELECT RAISE(ABORT, 'poisoned span'); END",
    )
    .execute(&mut side)
    .await
    .unwrap();
    let error = store
        .write_spans(&[
            span(1, 1, None, "a", "good", 1_000),
            span(1, 2, None, "a", "poison", 1_000),
        ])
        .await
        .unwrap_err();
    assert!(error.to_string().contains("poisoned span"), "{error}");
    assert_eq!(
        store.span_count().await.unwrap(),
        0,
        "the good span went back with the failed batch"
    );
    store
        .write_spans(&[span(2, 1, None, "a", "good", 1_000)])
        .await
        .unwrap();
    assert_eq!(store.span_count().await.unwrap(), 1);
    // Needs the write lock, which a transaction left open would still hold.
    sqlx::query("DROP TRIGGER poison")
        .execute(&mut side)
        .await
        .unwrap();
}

/// Regression: with writes that never pause, passive checkpoints never caught up, SQLite
/// never restarted the WAL, and it grew to 67 GB during a 10M-span benchmark. Under 2 GB
/// of WAL written back to back, faster than the checkpointer copies and flushes, the WAL
/// must start over again and again. Its file stays within the writers' bound (1 GiB): the
/// checkpointer's rounds stop at half of it and the writer's next transaction starts over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_wal_stays_bounded_under_continuous_writes() {
    let (_db, store, wal) = sqlite_store_and_wal().await;
    let padding = "x".repeat(2_000);
    let (mut peak, mut restarts, mut last) = (0u64, 0, None);
    for batch in 0..500u32 {
        store
            .write_spans(&bulk_spans(batch, 1 << 100, &padding))
            .await
            .unwrap();
        peak = peak.max(file_size(&wal));
        let sequence = wal_sequence(&wal);
        if last.is_some() && sequence != last {
            restarts += 1;
        }
        last = sequence;
    }
    eprintln!(
        "the WAL started over {restarts} times and peaked at {} MiB",
        peak >> 20
    );
    assert!(
        restarts >= 2,
        "the WAL started over {restarts} times in 2 GB"
    );
    assert!(peak < 1 << 30, "the WAL file reached {} MiB", peak >> 20);
}

/// A reader that keeps one snapshot stops the WAL from starting over, and then every commit
/// past the writers' bound (1 GiB, their `wal_autocheckpoint`) checkpoints. Those
/// checkpoints must not wait for the reader: a TRUNCATE that waited stalled writes for up
/// to 10 s (the busy timeout) and then failed them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_writes_go_on_while_a_reader_keeps_an_old_snapshot() {
    use sqlx::Connection as _;
    let (db, store, wal) = sqlite_store_and_wal().await;
    let padding = "x".repeat(2_000);
    let mut batch = write_until(store.as_ref(), 0, 1 << 103, "the WAL stayed small", || {
        file_size(&wal) > 32 << 20
    })
    .await;
    let mut reader = sqlx::SqliteConnection::connect(&db.url).await.unwrap();
    sqlx::query("BEGIN").execute(&mut reader).await.unwrap();
    let _: i64 = sqlx::query_scalar("SELECT count(*) FROM spans")
        .fetch_one(&mut reader)
        .await
        .unwrap();
    // Past the writers' checkpoint threshold (1 GiB), then 2 s of commits checkpointing.
    let mut slowest = std::time::Duration::ZERO;
    let mut past = None;
    while past.is_none_or(|past: std::time::Instant| past.elapsed().as_secs() < 2) {
        let write = std::time::Instant::now();
        store
            .write_spans(&bulk_spans(batch, 1 << 103, &padding))
            .await
            .unwrap();
        slowest = slowest.max(write.elapsed());
        batch += 1;
        assert!(
            batch < 500,
            "2 GB of WAL written and its file is not past 1 GiB"
        );
        if past.is_none() && file_size(&wal) > (1 << 30) + (8 << 20) {
            past = Some(std::time::Instant::now());
        }
    }
    sqlx::query("COMMIT").execute(&mut reader).await.unwrap();
    assert!(
        slowest < std::time::Duration::from_secs(3),
        "a write waited {slowest:?} behind the checkpointer while a reader kept its snapshot"
    );
}

/// A healthy summary of a trace through `services`, each with one `GET /` hop.
fn summary_of(
    trace_id: TraceId,
    start_unix_nano: u64,
    services: &[&str],
) -> budgetscope::core::analyze::summary::TraceSummary {
    budgetscope::core::analyze::summary::TraceSummary {
        trace_id,
        root_service: "edge".into(),
        root_name: "GET /".into(),
        start_unix_nano,
        duration_ms: 10.0,
        budget_ms: Some(100.0),
        answer_ms: Some(10.0),
        outcome: budgetscope::core::analyze::Outcome::Ok,
        origins: Vec::new(),
        burner: None,
        flag_counts: Default::default(),
        span_count: services.len(),
        services: services.iter().map(|s| s.to_string()).collect(),
        operations: services
            .iter()
            .map(|s| (s.to_string(), "GET /".into()))
            .collect(),
        version: budgetscope::core::analyze::AnalyzeOptions::default().version(),
    }
}

/// Commits span `span` of trace `trace` for each pair and returns the marks of those
/// traces, as the analyzer takes them.
async fn marked(store: &dyn Store, spans: &[(u8, u8)]) -> Vec<(TraceId, i64)> {
    let batch: Vec<Span> = spans
        .iter()
        .map(|(trace, id)| span(*trace, *id, None, "edge", "GET /", 1_000))
        .collect();
    store.write_spans(&batch).await.unwrap();
    store
        .due_traces(&DueQuery::quiet(u64::MAX, 1_000))
        .await
        .unwrap()
        .into_iter()
        .filter(|(id, _)| spans.iter().any(|(trace, _)| id.0 == [*trace; 16]))
        .collect()
}

/// A real two-hop trace (edge calls billing), its summary and hop samples.
fn analysed_trace(trace: u8) -> (Vec<Span>, (TraceSummary, Vec<HopSample>)) {
    let mut root = span(trace, 1, None, "edge", "GET /", 60_000_000_000);
    root.end_unix_nano = root.start_unix_nano + 50_000_000;
    let mut call = span(trace, 3, Some(1), "edge", "charge", root.start_unix_nano);
    call.kind = SpanKind::Client;
    call.end_unix_nano = call.start_unix_nano + 22_000_000;
    let mut child = span(
        trace,
        2,
        Some(3),
        "billing",
        "charge",
        root.start_unix_nano + 1_000_000,
    );
    child.end_unix_nano = child.start_unix_nano + 20_000_000;
    for (span, ms) in [(&mut root, 100.0), (&mut call, 100.0), (&mut child, 90.0)] {
        span.budget = Some(Budget {
            ms,
            source: "deadline.remaining_ms".into(),
        });
    }
    let spans = vec![root, child, call];
    let analysis = analyze(&spans, &AnalyzeOptions::default());
    let summary = summarize(&spans, &analysis).expect("a trace with a root");
    let hops = samples(&spans, &analysis);
    (spans, (summary, hops))
}

/// Requests counted in the hop rollups of every minute.
async fn rollup_requests(store: &dyn Store) -> i64 {
    store
        .hop_rollups(&RollupQuery {
            since_unix_nano: 0,
            until_unix_nano: 3_600_000_000_000,
            ..Default::default()
        })
        .await
        .unwrap()
        .iter()
        .map(|row| row.rollup.requests)
        .sum()
}

/// A trace analysed twice from the same marks (two servers took it, or a claim ran out) is
/// written once: the second write finds its marks gone and leaves the summary and the hop
/// counts as they are. A span that arrives later brings it back for one more analysis,
/// which replaces its counts.
#[tokio::test]
async fn a_trace_written_twice_from_the_same_marks_counts_once() {
    on_every_store(|store, backend| async move {
        let (spans, analysed) = analysed_trace(7);
        let hops = analysed.1.len() as i64;
        assert!(hops > 0, "{backend}: the trace has hops");
        store.write_spans(&spans).await.unwrap();
        let marks = store
            .due_traces(&DueQuery::quiet(u64::MAX, 10))
            .await
            .unwrap();
        assert_eq!(marks.len(), 1, "{backend}");
        let (first, second) = tokio::join!(
            store.write_summaries(std::slice::from_ref(&analysed), &marks),
            store.write_summaries(std::slice::from_ref(&analysed), &marks),
        );
        let (first, second) = (first.unwrap(), second.unwrap());
        assert!(
            first.is_empty() != second.is_empty(),
            "{backend}: one write counted the trace, the other nothing"
        );
        assert_eq!(rollup_requests(store.as_ref()).await, hops, "{backend}");
        assert_eq!(
            store
                .analysis_backlog(common::now_nanos())
                .await
                .unwrap()
                .traces,
            0,
            "{backend}"
        );

        // A late span of the same trace: analysed again, counted once still.
        let mut late = spans[1].clone();
        late.span_id = SpanId([3; 8]);
        store.write_spans(&[late]).await.unwrap();
        let marks = store
            .due_traces(&DueQuery::quiet(u64::MAX, 10))
            .await
            .unwrap();
        assert_eq!(marks.len(), 1, "{backend}: the late span marked the trace");
        store
            .write_summaries(std::slice::from_ref(&analysed), &marks)
            .await
            .unwrap();
        assert_eq!(rollup_requests(store.as_ref()).await, hops, "{backend}");

        // The hops' critical-path time is kept (stored samples included: the late span's
        // write took the old contribution back out), in the minute and the hourly rows.
        let expected: f64 = analysed.1.iter().map(|hop| hop.critical.ms).sum();
        assert!(expected > 0.0, "{backend}");
        for hourly in [false, true] {
            let rows = store
                .hop_rollups(&RollupQuery {
                    since_unix_nano: 0,
                    until_unix_nano: 3_600_000_000_000,
                    hourly,
                    ..Default::default()
                })
                .await
                .unwrap();
            let kept: f64 = rows.iter().map(|row| row.rollup.critical.ms).sum();
            assert!(
                (kept - expected).abs() < 1e-6,
                "{backend}, hourly {hourly}: {kept} of {expected} ms"
            );
            // Its one call edge (edge → billing), counted once too.
            let edges = store
                .edge_rollups(&RollupQuery {
                    since_unix_nano: 0,
                    until_unix_nano: 3_600_000_000_000,
                    service: Some("billing"),
                    hourly,
                    ..Default::default()
                })
                .await
                .unwrap();
            assert_eq!(edges.len(), 1, "{backend}, hourly {hourly}: {edges:?}");
            let ((caller, _, callee, operation, _), edge) = &edges[0];
            assert_eq!(
                (caller.as_str(), callee.as_str(), operation.as_str()),
                ("edge", "billing", "charge"),
                "{backend}"
            );
            assert_eq!((edge.requests, edge.calls), (1, 1), "{backend}");
            assert_eq!(edge.forwarded.count(), 1, "{backend}");
        }
        let elsewhere = store
            .edge_rollups(&RollupQuery {
                since_unix_nano: 0,
                until_unix_nano: 3_600_000_000_000,
                service: Some("pricing"),
                ..Default::default()
            })
            .await
            .unwrap();
        assert!(elsewhere.is_empty(), "{backend}");
    })
    .await;
}

/// Summaries carry the version of the analysis that wrote them: those of another version are
/// listed newest first, in pages, and counted; a re-analysed summary replaces only one
/// still stale (not one analysed since, nor one retention deleted), with its hop counts.
#[tokio::test]
async fn stale_summaries_are_listed_newest_first_and_rewritten_only_while_stale() {
    use budgetscope::core::analyze::{AnalysisVersion, AnalyzeOptions};
    use budgetscope::store::query::{StaleQuery, TraceQuery};
    on_every_store(|store, backend| async move {
        let old = AnalysisVersion {
            rules: 0,
            tolerance_ms: 50.0,
        };
        let current = AnalyzeOptions::default().version();
        let mut analysed = Vec::new();
        for id in 1..=3u8 {
            let (spans, (mut summary, hops)) = analysed_trace(id);
            summary.version = old;
            store.write_spans(&spans).await.unwrap();
            analysed.push((summary, hops));
        }
        let marks = store
            .due_traces(&DueQuery::quiet(u64::MAX, 10))
            .await
            .unwrap();
        store.write_summaries(&analysed, &marks).await.unwrap();
        let requests = rollup_requests(store.as_ref()).await;
        assert!(requests > 0, "{backend}");
        assert_eq!(store.stale_summary_count(current).await.unwrap(), 3);
        assert_eq!(store.stale_summary_count(old).await.unwrap(), 0);
        let mut newest_first = analysed
            .iter()
            .map(|(s, _)| (s.start_unix_nano, s.trace_id))
            .collect::<Vec<_>>();
        newest_first.sort_by(|a, b| b.cmp(a));
        let page = |after| {
            let store = store.clone();
            async move {
                store
                    .stale_summaries(&StaleQuery {
                        version: current,
                        after,
                        limit: 2,
                    })
                    .await
                    .unwrap()
                    .iter()
                    .map(|p| (p.start_unix_nano, p.trace_id))
                    .collect::<Vec<_>>()
            }
        };
        let first = page(None).await;
        assert_eq!(first, newest_first[..2], "{backend}");
        let after = budgetscope::store::query::Cursor {
            start_unix_nano: first[1].0,
            trace_id: first[1].1,
        };
        assert_eq!(page(Some(after)).await, newest_first[2..], "{backend}");

        // Trace 1 was analysed again meanwhile (current version); trace 2's summary is
        // re-analysed; trace 9 has no summary at all.
        let mut current_1 = analysed[0].clone();
        current_1.0.version = current;
        store
            .write_summaries(std::slice::from_ref(&current_1), &[])
            .await
            .unwrap();
        let mut rewritten: Vec<_> = analysed.clone();
        for (summary, _) in &mut rewritten {
            summary.version = current;
        }
        let (_, mut unknown) = analysed_trace(9);
        unknown.0.version = current;
        rewritten.push(unknown);
        let changes = store.rewrite_summaries(&rewritten, current).await.unwrap();
        assert!(
            !changes.is_empty(),
            "{backend}: the stale ones were replaced"
        );
        assert_eq!(store.stale_summary_count(current).await.unwrap(), 0);
        assert_eq!(
            rollup_requests(store.as_ref()).await,
            requests,
            "{backend}: each trace counted once"
        );
        let found = store
            .search_traces(&TraceQuery {
                limit: 10,
                ..TraceQuery::default()
            })
            .await
            .unwrap();
        assert_eq!(found.len(), 3, "{backend}: no summary for trace 9");
        assert!(found.iter().all(|s| s.version == current), "{backend}");
    })
    .await;
}

/// A trace's hop samples come back as they were written, with every flag each hop owns and
/// who sent a spent request where its budget ran out: what the hop page and the alerter
/// read instead of analysing the traces again.
#[tokio::test]
async fn hop_samples_come_back_as_written() {
    on_every_store(|store, backend| async move {
        let spans = budgetscope::core::analyze::fixture::parse(
            r#"
edge server "GET /" 0 1200 budget=1000
  edge client "billing" 1100 60 budget=-100
    billing server "Charge" 1101 40 budget=-100
"#,
        );
        let analysis = analyze(&spans, &AnalyzeOptions::default());
        let summary = summarize(&spans, &analysis).unwrap();
        let hops = samples(&spans, &analysis);
        assert!(
            hops.iter().any(|h| h.spent.is_some()),
            "billing arrived spent"
        );
        assert!(hops.iter().any(|h| !h.flags.is_empty()));
        store.write_spans(&spans).await.unwrap();
        let marks = store
            .due_traces(&DueQuery::quiet(u64::MAX, 10))
            .await
            .unwrap();
        store
            .write_summaries(&[(summary, hops.clone())], &marks)
            .await
            .unwrap();
        let trace_id = spans[0].trace_id;
        let read = store
            .hop_samples(&[trace_id, TraceId([9; 16])])
            .await
            .unwrap();
        assert_eq!(read.len(), 1, "{backend}: no samples of an unknown trace");
        assert_eq!(read[&trace_id], hops, "{backend}");
    })
    .await;
}

/// Several servers on one Postgres database: a quiet trace one server took is passed over
/// by the others until it is written or a span arrives, and the server that took it can
/// take it again (a pass that failed).
#[tokio::test]
async fn postgres_servers_on_one_database_pass_over_each_others_traces() {
    let Some(db) = TestDb::postgres().await else {
        return;
    };
    let one = store::open(&db.url).await.unwrap();
    let two = store::open(&db.url).await.unwrap();
    let (spans, analysed) = analysed_trace(8);
    one.write_spans(&spans).await.unwrap();
    let taken = one
        .due_traces(&DueQuery::quiet(u64::MAX, 10))
        .await
        .unwrap();
    assert_eq!(taken.len(), 1);
    assert!(
        two.due_traces(&DueQuery::quiet(u64::MAX, 10))
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        one.due_traces(&DueQuery::quiet(u64::MAX, 10))
            .await
            .unwrap(),
        taken
    );
    // A new span frees the trace for whichever server takes it next.
    let mut late = spans[1].clone();
    late.span_id = SpanId([3; 8]);
    two.write_spans(&[late]).await.unwrap();
    let retaken = two
        .due_traces(&DueQuery::quiet(u64::MAX, 10))
        .await
        .unwrap();
    assert_eq!(retaken.len(), 1);
    assert!(
        one.due_traces(&DueQuery::quiet(u64::MAX, 10))
            .await
            .unwrap()
            .is_empty()
    );
    // The first server's marks are stale, the trace still marked: its summary is written
    // (a trace receiving spans all the time is written at its longest wait all the same),
    // and the second server's replaces it, so the trace counts once.
    one.write_summaries(std::slice::from_ref(&analysed), &taken)
        .await
        .unwrap();
    assert_eq!(rollup_requests(one.as_ref()).await, analysed.1.len() as i64);
    two.write_summaries(std::slice::from_ref(&analysed), &retaken)
        .await
        .unwrap();
    assert_eq!(rollup_requests(one.as_ref()).await, analysed.1.len() as i64);
    // A third write with the marks the second cleared counts nothing.
    assert!(
        one.write_summaries(std::slice::from_ref(&analysed), &retaken)
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        two.analysis_backlog(common::now_nanos())
            .await
            .unwrap()
            .traces,
        0
    );
}

/// The lease on work one server does at a time: held by one holder until it expires or is
/// given up, renewed by its holder, taken by another only after that.
#[tokio::test]
async fn a_lease_has_one_holder_until_it_expires_or_is_given_up() {
    on_every_store(|store, backend| async move {
        let hold = |holder: &'static str, now: u64| {
            let store = store.clone();
            async move {
                store
                    .hold_lease("work", holder, now, now + 10)
                    .await
                    .unwrap()
            }
        };
        assert!(hold("a", 100).await, "{backend}: a free lease is taken");
        assert!(!hold("b", 105).await, "{backend}: held by a until 110");
        assert!(hold("a", 108).await, "{backend}: a renews it, until 118");
        assert!(!hold("b", 115).await, "{backend}: still a's");
        assert!(hold("b", 119).await, "{backend}: expired, b takes it");
        assert!(!hold("a", 120).await, "{backend}: now b's");
        store.release_lease("work", "a").await.unwrap();
        assert!(
            !hold("a", 121).await,
            "{backend}: only the holder gives it up"
        );
        store.release_lease("work", "b").await.unwrap();
        assert!(hold("a", 122).await, "{backend}: given up, taken at once");
    })
    .await;
}

/// A re-analysed trace's index terms are replaced, not added to; retention deletes the
/// terms of the summaries it deletes and keeps the others'. Terms are found from their
/// summary (there is no index by trace).
#[tokio::test]
async fn index_terms_follow_their_summary_through_re_analysis_and_retention() {
    const SECOND: u64 = 1_000_000_000;
    let summary = |id: u8, start: u64, services: &[&str]| {
        (
            summary_of(TraceId([id; 16]), start * SECOND, services),
            Vec::new(),
        )
    };
    for db in TestDb::all().await {
        let store = store::open(&db.url).await.unwrap();
        // SQLite's terms name the summary and the second it started; Postgres's the trace
        // and its start (store::query::TermLayout).
        let terms = |id: u8| {
            let db = &db;
            async move {
                let hex: String = [id; 16].iter().map(|b| format!("{b:02x}")).collect();
                db.texts(&match db.backend {
                    "sqlite" => format!(
                        "SELECT s.term || '@' || CAST(t.start_second AS TEXT) FROM trace_terms t \
                         JOIN search_terms s ON s.id = t.term_id \
                         JOIN trace_summaries ts ON ts.id = t.summary_id \
                         WHERE ts.trace_id = X'{hex}' ORDER BY 1"
                    ),
                    _ => format!(
                        "SELECT s.term || '@' || CAST(t.start_unix_nano / {SECOND} AS TEXT) \
                         FROM trace_terms t JOIN search_terms s ON s.id = t.term_id \
                         WHERE t.trace_id = '\\x{hex}'::bytea ORDER BY 1"
                    ),
                })
                .await
            }
        };
        // Terms whose trace has no summary (on Postgres found by `terms` itself).
        let orphans = || {
            let db = &db;
            async move {
                match db.backend {
                    "sqlite" => db
                        .texts(
                            "SELECT CAST(count(*) AS TEXT) FROM trace_terms t WHERE NOT EXISTS \
                             (SELECT 1 FROM trace_summaries ts WHERE ts.id = t.summary_id)",
                        )
                        .await
                        .concat(),
                    _ => "0".to_string(),
                }
            }
        };
        let marks = marked(store.as_ref(), &[(1, 1), (2, 1)]).await;
        store
            .write_summaries(
                &[
                    summary(1, 1_000, &["billing", "edge"]),
                    summary(2, 9_000, &["edge"]),
                ],
                &marks,
            )
            .await
            .unwrap();
        assert_eq!(
            terms(1).await,
            [
                // No term for the outcome "ok".
                "opname:GET /@1000",
                "service:billing@1000",
                "service:edge@1000"
            ],
            "{}",
            db.backend
        );
        // A late span: billing is gone and the trace starts earlier.
        let marks = marked(store.as_ref(), &[(1, 2)]).await;
        store
            .write_summaries(&[summary(1, 500, &["edge"])], &marks)
            .await
            .unwrap();
        let edge_only = |at: &str| {
            ["opname:GET /", "service:edge"]
                .map(|t| format!("{t}@{at}"))
                .to_vec()
        };
        assert_eq!(terms(1).await, edge_only("500"), "{}", db.backend);
        assert_eq!(terms(2).await, edge_only("9000"), "{}", db.backend);
        assert_eq!(orphans().await, "0", "{}", db.backend);
        store.delete_before(5_000 * SECOND, 100).await.unwrap();
        assert!(terms(1).await.is_empty(), "{}", db.backend);
        assert_eq!(terms(2).await, edge_only("9000"), "{}", db.backend);
        assert_eq!(orphans().await, "0", "{}", db.backend);
        // Retention by value and the disk cap take a trace's terms with it.
        store
            .delete_traces_before(10_000 * SECOND, TraceSet::Analysed, 500)
            .await
            .unwrap();
        assert!(terms(2).await.is_empty(), "{}", db.backend);
        assert_eq!(orphans().await, "0", "{}", db.backend);
    }
}

/// A search driven by a term pages newest first by (start, trace id) exactly, within one
/// second and across seconds, and keeps to its time range: on SQLite the term rows are in
/// (second, summary id) order, each second's rows sorted by the search.
#[tokio::test]
async fn term_searches_page_in_start_order_within_and_across_seconds() {
    use budgetscope::store::query::Cursor;
    const SECOND: u64 = 1_000_000_000;
    // Written in an order unlike the start order: ids 1..=9 and their starts.
    let starts: [(u8, u64); 9] = [
        (5, 10 * SECOND + 7),
        (1, 12 * SECOND),
        (9, 10 * SECOND + 7),
        (3, 11 * SECOND + 900_000_000),
        (2, 10 * SECOND + 999_999_999),
        (7, 12 * SECOND),
        (4, 9 * SECOND),
        (8, 10 * SECOND),
        (6, 11 * SECOND + 1),
    ];
    let mut expected: Vec<(u64, u8)> = starts.iter().map(|(id, s)| (*s, *id)).collect();
    expected.sort_unstable_by(|a, b| b.cmp(a));
    for db in TestDb::all().await {
        let store = store::open(&db.url).await.unwrap();
        for (id, start) in starts {
            let marks = marked(store.as_ref(), &[(id, 1)]).await;
            store
                .write_summaries(
                    &[(
                        summary_of(TraceId([id; 16]), start, &["edge", "billing"]),
                        Vec::new(),
                    )],
                    &marks,
                )
                .await
                .unwrap();
        }
        for (since, until) in [(None, None), (Some(10 * SECOND + 7), Some(12 * SECOND))] {
            let mut seen = Vec::new();
            let mut cursor = None;
            loop {
                let query = TraceQuery {
                    service: Some("billing".into()),
                    since_unix_nano: since,
                    until_unix_nano: until,
                    cursor,
                    limit: 2,
                    ..Default::default()
                };
                let page = store.search_traces(&query).await.unwrap();
                seen.extend(page.iter().map(|s| (s.start_unix_nano, s.trace_id.0[0])));
                match page.last() {
                    Some(last) if page.len() == 2 => {
                        cursor = Some(Cursor {
                            start_unix_nano: last.start_unix_nano,
                            trace_id: last.trace_id,
                        })
                    }
                    _ => break,
                }
            }
            let within: Vec<(u64, u8)> = expected
                .iter()
                .copied()
                .filter(|(s, _)| since.is_none_or(|t| *s >= t) && until.is_none_or(|t| *s < t))
                .collect();
            assert_eq!(
                seen, within,
                "{} since {since:?} until {until:?}",
                db.backend
            );
        }
    }
}

/// On Postgres the rollup tables leave half of each page free, so that the many updates of
/// a row stay on its page (HOT updates, pruned in place) instead of growing the table until
/// a vacuum: a burst left them 50 times their live size (BENCHMARKS.md, "Disk").
#[tokio::test]
async fn postgres_rollup_tables_leave_room_for_updates_in_place() {
    let Some(db) = TestDb::postgres().await else {
        return;
    };
    let _store = store::open(&db.url).await.unwrap();
    let options = db
        .texts(
            "SELECT relname || ' ' || array_to_string(reloptions, ',') FROM pg_class \
             WHERE relnamespace = current_schema()::regnamespace AND relname LIKE '%rollups%' \
             AND relkind = 'r' ORDER BY 1",
        )
        .await;
    assert_eq!(
        options,
        [
            "edge_rollups fillfactor=50",
            "edge_rollups_hourly fillfactor=50",
            "hop_rollups fillfactor=50",
            "hop_rollups_hourly fillfactor=50"
        ]
    );
}

/// When Postgres last analysed `table` of the current schema by request (not autovacuum).
async fn last_analyze(conn: &mut sqlx::PgConnection, table: &str) -> Option<String> {
    sqlx::query_scalar(
        "SELECT last_analyze::text FROM pg_stat_user_tables \
         WHERE schemaname = current_schema() AND relname = $1",
    )
    .bind(table)
    .fetch_one(conn)
    .await
    .unwrap()
}

/// Regression: on Postgres with autovacuum off (as on the project's machine), a search for a
/// common term sorted every match (109 ms at 57k traces) because the planner still had the
/// statistics of an empty table. The store refreshes them as summaries accumulate.
#[tokio::test]
async fn postgres_refreshes_planner_statistics_as_summaries_accumulate() {
    use sqlx::Connection as _;
    let Some(db) = TestDb::postgres().await else {
        return;
    };
    let store = store::open(&db.url).await.unwrap();
    let summaries: Vec<_> = (0..10_000u32)
        .map(|i| {
            let mut id = [1u8; 16];
            id[..4].copy_from_slice(&i.to_be_bytes());
            (
                summary_of(
                    TraceId(id),
                    1_700_000_000_000_000_000 + u64::from(i) * 1_000_000,
                    &["edge"],
                ),
                Vec::new(),
            )
        })
        .collect();
    let mut conn = sqlx::PgConnection::connect(&db.url).await.unwrap();
    let autovacuum: String = sqlx::query_scalar("SHOW autovacuum")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    for chunk in summaries.chunks(1_000).take(9) {
        store.write_summaries(chunk, &[]).await.unwrap();
    }
    if autovacuum == "off" {
        // With autovacuum on, it may have analysed the table itself by now.
        assert_eq!(
            last_analyze(&mut conn, "trace_terms").await,
            None,
            "9,000 summaries: not yet"
        );
    }
    store
        .write_summaries(&summaries[9_000..], &[])
        .await
        .unwrap();
    // The span rows too: the analyzer and compaction read them by trace (a backlog's read
    // was a scan of the whole table without statistics).
    for table in ["trace_terms", "spans"] {
        assert!(
            last_analyze(&mut conn, table).await.is_some(),
            "10,000 summaries: {table} refreshed"
        );
    }
    conn.close().await.unwrap();
}

/// The analyzer's marks: a trace is quiet only once its last commit is older than the
/// cutoff, however many commits marked it; clearing what a pass analysed keeps a mark
/// committed after that pass read them, so the trace is analysed again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trace_is_quiet_only_after_its_last_commit_and_a_later_mark_survives_clearing() {
    on_every_store(|store, backend| async move {
        let now = common::now_nanos;
        // Distinct commit times: the marks are nanosecond clock readings.
        let tick = || tokio::time::sleep(std::time::Duration::from_millis(5));
        let ids = |marks: &[(TraceId, i64)]| {
            let mut ids: Vec<u8> = marks.iter().map(|(id, _)| id.0[0]).collect();
            ids.sort_unstable();
            ids.dedup();
            ids
        };
        let a = span(1, 1, None, "edge", "GET /a", 1_000);
        let b = span(2, 1, None, "edge", "GET /b", 1_000);
        assert_eq!(
            store.analysis_backlog(now()).await.unwrap(),
            Backlog::default()
        );

        store.write_spans(std::slice::from_ref(&a)).await.unwrap();
        tick().await;
        let between = now();
        tick().await;
        store.write_spans(std::slice::from_ref(&b)).await.unwrap();
        // A's exporter retries: the span is stored once, but the trace is marked again.
        store.write_spans(std::slice::from_ref(&a)).await.unwrap();
        tick().await;

        assert_eq!(
            ids(&store
                .due_traces(&DueQuery::quiet(between, 10))
                .await
                .unwrap()),
            Vec::<u8>::new(),
            "{backend}: A was committed again after the cutoff, B only after it"
        );
        let backlog = store.analysis_backlog(between).await.unwrap();
        assert_eq!(backlog.traces, 2, "{backend}: two traces wait");
        assert_eq!(
            backlog.active, 1,
            "{backend}: A waits past the cutoff, still active"
        );
        assert!(
            backlog.oldest_commit_unix_nano.is_some_and(|t| t > between),
            "{backend}: a trace waits since its last commit, not its first"
        );
        assert_eq!(
            ids(&store.due_traces(&DueQuery::quiet(now(), 1)).await.unwrap()).len(),
            1,
            "{backend}: `limit` counts traces, not marks"
        );
        let marks = store.due_traces(&DueQuery::quiet(now(), 10)).await.unwrap();
        assert_eq!(ids(&marks), [1, 2], "{backend}: both quiet now");

        tick().await;
        store.write_spans(std::slice::from_ref(&b)).await.unwrap();
        store.write_summaries(&[], &marks).await.unwrap();
        assert_eq!(
            ids(&store.due_traces(&DueQuery::quiet(now(), 10)).await.unwrap()),
            [2],
            "{backend}: A cleared; B's later mark kept"
        );
        assert_eq!(
            store.analysis_backlog(now()).await.unwrap().traces,
            1,
            "{backend}"
        );
    })
    .await;
}

/// A trace still receiving spans is due once it has waited `waiting_before`; analysed then,
/// it waits again from its next commit, not from its first: a span that arrived while it
/// was analysed keeps it pending without making it due at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_active_trace_is_due_after_its_longest_wait_and_its_wait_restarts() {
    on_every_store(|store, backend| async move {
        let now = common::now_nanos;
        let tick = || tokio::time::sleep(std::time::Duration::from_millis(5));
        let first = span(3, 1, None, "edge", "GET /stream", 1_000);
        store
            .write_spans(std::slice::from_ref(&first))
            .await
            .unwrap();
        tick().await;
        let cutoff = now();
        tick().await;
        store
            .write_spans(&[span(3, 2, Some(1), "edge", "send", 2_000)])
            .await
            .unwrap();
        let active = DueQuery {
            quiet_before: cutoff,
            waiting_before: cutoff,
            limit: 10,
        };
        assert!(
            store
                .due_traces(&DueQuery::quiet(cutoff, 10))
                .await
                .unwrap()
                .is_empty(),
            "{backend}: not quiet"
        );
        assert_eq!(
            store.analysis_backlog(cutoff).await.unwrap().active,
            1,
            "{backend}"
        );
        let marks = store.due_traces(&active).await.unwrap();
        assert_eq!(
            marks.len(),
            1,
            "{backend}: waited past its longest wait: {marks:?}"
        );
        assert_eq!(marks[0].0, first.trace_id);

        // A span arrives while the pass analyses it; the summary is written all the same.
        tick().await;
        store
            .write_spans(&[span(3, 3, Some(1), "edge", "send", 3_000)])
            .await
            .unwrap();
        let spans = store.trace(first.trace_id).await.unwrap();
        let analysis = analyze(&spans, &AnalyzeOptions::default());
        let summary = summarize(&spans, &analysis).unwrap();
        let hops = samples(&spans, &analysis);
        store
            .write_summaries(&[(summary, hops)], &marks)
            .await
            .unwrap();
        let found = store
            .search_traces(&TraceQuery {
                service: Some("edge".into()),
                limit: 10,
                ..TraceQuery::default()
            })
            .await
            .unwrap();
        assert_eq!(
            found.iter().map(|s| s.span_count).collect::<Vec<_>>(),
            [3],
            "{backend}: analysed while active, with every span stored then"
        );
        assert_eq!(
            store.analysis_backlog(now()).await.unwrap().traces,
            1,
            "{backend}"
        );
        assert!(
            store.due_traces(&active).await.unwrap().is_empty(),
            "{backend}: its wait restarted at a commit after the cutoff"
        );
        tick().await;
        let again = now();
        tick().await;
        store
            .write_spans(&[span(3, 4, Some(1), "edge", "send", 4_000)])
            .await
            .unwrap();
        let later = DueQuery {
            quiet_before: again,
            waiting_before: again,
            limit: 10,
        };
        let due: Vec<TraceId> = store
            .due_traces(&later)
            .await
            .unwrap()
            .into_iter()
            .map(|(id, _)| id)
            .collect();
        assert!(
            !due.is_empty() && due.iter().all(|id| *id == first.trace_id),
            "{backend}: due again once it has waited again, still active: {due:?}"
        );
    })
    .await;
}

/// With no connection to be had, a Postgres write says why rather than "pool timed out":
/// the server's own reason when it refuses new connections (here the role's limit), or
/// that this server's connections are all in use.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_without_a_connection_names_the_reason() {
    use sqlx::Connection as _;
    let Some(db) = TestDb::postgres().await else {
        return;
    };
    let role = format!("bs_limited_{}", common::unique_suffix());
    let schema = db.texts("SELECT current_schema()").await.remove(0);
    db.execute(&format!("CREATE ROLE {role} LOGIN")).await;
    db.execute(&format!("ALTER SCHEMA {schema} OWNER TO {role}"))
        .await;
    let mut url = reqwest::Url::parse(&db.url).unwrap();
    url.set_username(&role).unwrap();
    let store = store::open(url.as_str()).await.unwrap();
    let (spans, _) = analysed_trace(9);
    store.write_spans(&spans).await.unwrap();

    // Every write waits on a lock held elsewhere, so each holds a connection of the pool.
    let mut locker = sqlx::PgConnection::connect(&db.url).await.unwrap();
    sqlx::query("BEGIN").execute(&mut locker).await.unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "LOCK TABLE {schema}.spans IN ACCESS EXCLUSIVE MODE"
    )))
    .execute(&mut locker)
    .await
    .unwrap();
    let write = |id: u8| {
        let store = store.clone();
        let mut spans = spans.clone();
        spans.iter_mut().for_each(|s| s.span_id = SpanId([id; 8]));
        tokio::spawn(async move { store.write_spans(&spans[..1]).await })
    };
    let held: Vec<_> = (100..108).map(write).collect();
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let error = write(110).await.unwrap().unwrap_err().to_string();
    assert!(
        error.contains("all 8 of this server's connections were in use"),
        "{error}"
    );
    // `/readyz`'s ping says the same.
    let error = store.ping().await.unwrap_err().to_string();
    assert!(
        error.contains("all 8 of this server's connections were in use"),
        "{error}"
    );

    // Postgres refuses more connections for the role: its words are in the error.
    db.execute(&format!("ALTER ROLE {role} CONNECTION LIMIT 0"))
        .await;
    let error = write(111).await.unwrap().unwrap_err().to_string();
    assert!(
        error.contains("Postgres refuses new ones") && error.contains("too many connections"),
        "{error}"
    );
    sqlx::query("ROLLBACK").execute(&mut locker).await.unwrap();
    for write in held {
        write.await.unwrap().unwrap();
    }
    drop(store);
    db.execute(&format!("DROP OWNED BY {role}")).await;
    db.execute(&format!("DROP ROLE {role}")).await;
}

/// Retention by value: of the traces that started before the cutoff, the healthy ones (no
/// flag, not exceeded) go with their spans, summary and index terms; a flagged one and a
/// newer healthy one stay, and the hop statistics keep counting every one of them.
#[tokio::test]
async fn healthy_traces_go_before_the_rest_and_the_statistics_keep_them() {
    on_every_store(|store, backend| async move {
        let day = 86_400_000_000_000u64;
        let now = common::now_nanos();
        let trace = |id: u8, start: u64, fixture: &str| {
            let mut spans = budgetscope::core::analyze::fixture::parse(fixture);
            let shift = start - budgetscope::core::analyze::fixture::BASE_UNIX_NANO;
            for span in &mut spans {
                span.trace_id = TraceId([id; 16]);
                span.start_unix_nano += shift;
                span.end_unix_nano += shift;
            }
            spans
        };
        let healthy = common::HEALTHY_CHAIN;
        let late = common::EXCEEDED_CHAIN;
        for (id, start, text) in [
            (0xa1, now - 2 * day, healthy),
            (0xa2, now - 2 * day + 1_000_000_000, late),
            (0xa3, now - 3_600_000_000_000, healthy),
        ] {
            store.write_spans(&trace(id, start, text)).await.unwrap();
        }
        common::analyse_waiting(store.as_ref()).await;
        let counted = || async {
            store
                .hop_rollups(&RollupQuery {
                    since_unix_nano: now - 3 * day,
                    until_unix_nano: now + day,
                    service: Some("x"),
                    hourly: true,
                    ..Default::default()
                })
                .await
                .unwrap()
                .iter()
                .map(|row| row.rollup.requests)
                .sum::<i64>()
        };
        assert_eq!(counted().await, 3, "{backend}");
        let deleted = store
            .delete_traces_before(now - day, TraceSet::Healthy, 500)
            .await
            .unwrap();
        assert_eq!(deleted, 1, "{backend}");
        assert!(
            store.trace(TraceId([0xa1; 16])).await.unwrap().is_empty(),
            "{backend}"
        );
        for kept in [0xa2, 0xa3] {
            assert_eq!(
                store.trace(TraceId([kept; 16])).await.unwrap().len(),
                3,
                "{backend}"
            );
        }
        let found = store
            .search_traces(&TraceQuery {
                service: Some("x".into()),
                limit: 10,
                ..TraceQuery::default()
            })
            .await
            .unwrap();
        let mut ids: Vec<u8> = found.iter().map(|s| s.trace_id.0[0]).collect();
        ids.sort_unstable();
        assert_eq!(ids, [0xa2, 0xa3], "{backend}");
        assert_eq!(
            counted().await,
            3,
            "{backend}: the statistics still count it"
        );
        assert_eq!(
            store
                .delete_traces_before(now - day, TraceSet::Healthy, 500)
                .await
                .unwrap(),
            0
        );
        // Near `--max-disk`, the oldest of the rest go too; a newer one stays.
        assert_eq!(
            store
                .delete_traces_before(now - day, TraceSet::Analysed, 500)
                .await
                .unwrap(),
            1,
            "{backend}"
        );
        assert!(
            store.trace(TraceId([0xa2; 16])).await.unwrap().is_empty(),
            "{backend}"
        );
        assert_eq!(store.trace(TraceId([0xa3; 16])).await.unwrap().len(), 3);
        assert_eq!(counted().await, 3, "{backend}");
    })
    .await;
}

/// The store says what it takes on disk: SQLite its file, WAL and pages in use; Postgres
/// its schema's tables, growing as spans arrive.
#[tokio::test]
async fn disk_use_is_measured() {
    on_every_store(|store, backend| async move {
        let before = store.disk_usage().await.unwrap();
        assert!(before.bytes > 0, "{backend}: {before:?}");
        store
            .write_spans(&bulk_spans(7, 0x5eed << 64, &"p".repeat(300)))
            .await
            .unwrap();
        let after = store.disk_usage().await.unwrap();
        match backend {
            "sqlite" => {
                let (was, now) = (before.in_use_bytes.unwrap(), after.in_use_bytes.unwrap());
                assert!(now > was, "{backend}: {before:?} → {after:?}");
            }
            _ => {
                assert_eq!(after.in_use_bytes, None);
                assert!(
                    after.bytes > before.bytes,
                    "{backend}: {before:?} → {after:?}"
                );
            }
        }
    })
    .await;
}

/// Everything the readers say of `ids`, to compare a trace as rows with it as a block.
async fn every_read(store: &dyn Store, ids: &[TraceId]) -> String {
    use budgetscope::store::query::{SpanListQuery, SpanPosition};
    let mut out = String::new();
    let names = |spans: &[Span]| {
        spans
            .iter()
            .map(|s| format!("{}:{}:{}", s.trace_id.0[0], s.span_id.0[0], s.name))
            .collect::<Vec<_>>()
            .join(",")
    };
    for id in ids {
        let spans = store.trace(*id).await.unwrap();
        out += &format!("trace {:?}\n", spans);
        out += &format!("outline {:?}\n", store.trace_outline(*id).await.unwrap());
        out += &format!("size {:?}\n", store.trace_size(&[*id]).await.unwrap());
        let first = store.trace_page(*id, None, 5).await.unwrap();
        out += &format!("page {}\n", names(&first));
        if let Some(last) = first.last() {
            let next = store.trace_page(*id, Some(last.span_id), 5).await.unwrap();
            out += &format!("next page {}\n", names(&next));
        }
        let from = spans.get(spans.len() / 2).map(|s| SpanPosition {
            start_unix_nano: s.start_unix_nano,
            span_id: s.span_id,
        });
        for find in [None, Some("ITEM"), Some("status"), Some("0303030303030303")] {
            for (from, backwards) in [(None, false), (from, false), (from, true)] {
                let query = SpanListQuery {
                    find,
                    from,
                    backwards,
                    limit: 4,
                };
                let list = store.trace_span_list(*id, &query).await.unwrap();
                out += &format!("list {find:?} {backwards} {}\n", names(&list));
            }
            let counts = store.trace_span_counts(*id, find, from).await.unwrap();
            out += &format!("counts {find:?} {counts:?}\n");
        }
    }
    let mut all = store.traces(ids).await.unwrap();
    all.sort_by_key(|s| (s.trace_id, s.span_id));
    out += &format!("traces {}\n", names(&all));
    let within = store.traces_within(ids, u64::MAX, u64::MAX).await.unwrap();
    out += &format!("within {} {}\n", names(&within.spans), within.bytes);
    let mut counts: Vec<_> = store.span_counts(ids).await.unwrap().into_iter().collect();
    counts.sort();
    out += &format!(
        "counts {counts:?} of {}\n",
        store.span_count().await.unwrap()
    );
    out
}

#[tokio::test]
async fn a_compacted_trace_reads_as_it_did_as_rows() {
    on_every_store(|store, backend| async move {
        // Trace 2: a root, a client call and 40 server spans of two services; 1 and 3 small.
        let mut spans = vec![
            span(1, 1, None, "svc", "op", 1_000),
            span(3, 1, None, "svc", "op", 2_000),
        ];
        spans.push(span(2, 1, None, "gateway", "GET /batch", 5_000));
        let mut call = span(2, 2, Some(1), "gateway", "call worker", 6_000);
        call.kind = SpanKind::Client;
        call.budget = Some(Budget {
            ms: 250.0,
            source: "grpc-timeout".into(),
        });
        spans.push(call);
        for id in 3..43u8 {
            let service = if id % 2 == 0 { "worker" } else { "store" };
            let mut item = span(2, id, Some(2), service, "POST /item", 7_000 + u64::from(id));
            item.attributes = vec![("http.status".into(), AttrValue::Int(200 + i64::from(id)))];
            if id == 9 {
                item.status = Status {
                    code: StatusCode::Error,
                    message: "boom".into(),
                };
            }
            spans.push(item);
        }
        store.write_spans(&spans).await.unwrap();
        let ids = [TraceId([1; 16]), TraceId([2; 16]), TraceId([3; 16])];
        let as_rows = every_read(store.as_ref(), &ids).await;

        let done = store.compact(&ids[..2], u64::MAX).await.unwrap();
        assert_eq!((done.traces, done.spans), (2, 43), "{backend}");
        assert!(
            done.block_bytes * 3 < done.row_bytes,
            "{backend}: {done:?} compresses"
        );
        assert_eq!(every_read(store.as_ref(), &ids).await, as_rows, "{backend}");
        let again = store.compact(&ids, u64::MAX).await.unwrap();
        assert_eq!(again.traces, 1, "{backend}: only trace 3 had rows left");
        assert_eq!(every_read(store.as_ref(), &ids).await, as_rows, "{backend}");

        // A late span is read beside the block; a span sent again keeps its first copy.
        let late = span(2, 60, Some(1), "gateway", "late", 90_000);
        let mut copy = spans[5].clone();
        copy.name = "a second copy".into();
        store.write_spans(&[late.clone(), copy]).await.unwrap();
        let trace = store.trace(ids[1]).await.unwrap();
        assert_eq!(trace.len(), 43, "{backend}");
        assert!(
            trace.contains(&late) && trace.contains(&spans[5]),
            "{backend}"
        );
        // Compacting again takes both rows in; the block keeps the first copy.
        let merged = store.compact(&ids[1..2], u64::MAX).await.unwrap();
        assert_eq!((merged.traces, merged.spans), (1, 2), "{backend}");
        assert_eq!(store.trace(ids[1]).await.unwrap(), trace, "{backend}");
        assert_eq!(
            store.span_counts(&ids[1..2]).await.unwrap()[&ids[1]],
            43,
            "{backend}"
        );

        // A trace past the byte limit stays rows.
        store
            .write_spans(&[span(4, 1, None, "svc", "big", 3_000)])
            .await
            .unwrap();
        let kept = store.compact(&[TraceId([4; 16])], 10).await.unwrap();
        assert_eq!(kept.traces, 0, "{backend}");
        assert_eq!(
            store.trace(TraceId([4; 16])).await.unwrap().len(),
            1,
            "{backend}"
        );

        // Retention deletes blocks as it deletes rows.
        assert_eq!(store.span_count().await.unwrap(), 46, "{backend}");
        while store.delete_before(u64::MAX / 2, 10).await.unwrap() > 0 {}
        assert_eq!(store.span_count().await.unwrap(), 0, "{backend}");
        assert!(store.trace(ids[1]).await.unwrap().is_empty(), "{backend}");

        // Many small traces under a small limit: written in several transactions, all moved.
        let many: Vec<Span> = (0..300u32)
            .map(|i| {
                let mut s = span(
                    0,
                    1,
                    None,
                    "svc",
                    &format!("many {i}"),
                    10_000 + u64::from(i),
                );
                s.trace_id = TraceId((1u128 << 100 | u128::from(i)).to_be_bytes());
                s
            })
            .collect();
        store.write_spans(&many).await.unwrap();
        let many_ids: Vec<TraceId> = many.iter().map(|s| s.trace_id).collect();
        let one = store.trace_size(&many_ids[..1]).await.unwrap().bytes;
        let moved = store.compact(&many_ids, 2 * one).await.unwrap();
        assert_eq!((moved.traces, moved.spans), (300, 300), "{backend}");
        let back = store.traces(&many_ids).await.unwrap();
        assert_eq!(back.len(), 300, "{backend}");
        while store.delete_before(u64::MAX / 2, 1_000).await.unwrap() > 0 {}
    })
    .await;
}

/// The traces the analyzer writes whole wait for compaction in the store, so a restart
/// keeps them; they are taken oldest first and once. A trace too large to analyse does
/// not wait; a late span's analysis makes its trace wait again; an entry whose trace
/// retention deleted goes with nothing written.
#[tokio::test]
async fn analysed_traces_wait_for_compaction_in_the_store() {
    for db in TestDb::all().await {
        let backend = db.backend;
        let store = store::open(&db.url).await.unwrap();
        let (a_spans, a) = analysed_trace(21);
        let (b_spans, b) = analysed_trace(22);
        let (c_spans, mut c) = analysed_trace(23);
        c.0.outcome = budgetscope::core::analyze::Outcome::TooLarge;
        let all = [a_spans, b_spans, c_spans].concat();
        store.write_spans(&all).await.unwrap();
        let marks = store
            .due_traces(&DueQuery::quiet(u64::MAX, 1_000))
            .await
            .unwrap();
        store
            .write_summaries(&[a.clone(), b.clone(), c.clone()], &marks)
            .await
            .unwrap();
        assert_eq!(store.compaction_waiting().await.unwrap(), 2, "{backend}");
        drop(store);

        let store = store::open(&db.url).await.unwrap();
        assert_eq!(
            store.compaction_waiting().await.unwrap(),
            2,
            "{backend}: a restart keeps the wait"
        );
        let (first, taken) = store.compact_due(1, u64::MAX).await.unwrap();
        assert_eq!((taken, first.traces, first.spans), (1, 1, 3), "{backend}");
        let (rest, taken) = store.compact_due(10, u64::MAX).await.unwrap();
        assert_eq!((taken, rest.traces, rest.spans), (1, 1, 3), "{backend}");
        assert_eq!(store.compact_due(10, u64::MAX).await.unwrap().1, 0);
        assert_eq!(store.compaction_waiting().await.unwrap(), 0, "{backend}");
        let mut read = store.traces(&[a.0.trace_id, b.0.trace_id]).await.unwrap();
        read.sort_by_key(|s| (s.trace_id, s.span_id));
        let mut written = all[..6].to_vec();
        written.sort_by_key(|s| (s.trace_id, s.span_id));
        assert_eq!(read, written, "{backend}: the blocks hold every span");
        // The too large trace is still rows: compacting it by hand finds them.
        let by_hand = store.compact(&[c.0.trace_id], u64::MAX).await.unwrap();
        assert_eq!(by_hand.spans, 3, "{backend}");

        // A late span: its trace is analysed again, waits again and its row joins the block.
        let late = span(21, 9, Some(1), "edge", "late", 60_000_000_000 + 40_000_000);
        store
            .write_spans(std::slice::from_ref(&late))
            .await
            .unwrap();
        let marks = store
            .due_traces(&DueQuery::quiet(u64::MAX, 1_000))
            .await
            .unwrap();
        store.write_summaries(&[a.clone()], &marks).await.unwrap();
        assert_eq!(store.compaction_waiting().await.unwrap(), 1, "{backend}");
        let (merged, taken) = store.compact_due(10, u64::MAX).await.unwrap();
        assert_eq!((taken, merged.traces, merged.spans), (1, 1, 1), "{backend}");
        assert_eq!(store.trace(a.0.trace_id).await.unwrap().len(), 4);

        // Retention took the trace before its turn: the entry goes, nothing is written.
        let (d_spans, d) = analysed_trace(24);
        store.write_spans(&d_spans).await.unwrap();
        let marks = store
            .due_traces(&DueQuery::quiet(u64::MAX, 1_000))
            .await
            .unwrap();
        store.write_summaries(&[d], &marks).await.unwrap();
        while store.delete_before(u64::MAX / 2, 1_000).await.unwrap() > 0 {}
        let (nothing, taken) = store.compact_due(10, u64::MAX).await.unwrap();
        assert_eq!((taken, nothing.traces), (1, 0), "{backend}");
        assert_eq!(store.compaction_waiting().await.unwrap(), 0, "{backend}");
    }
}

/// Span blocks, summaries' hop samples and summaries' packed detail are compressed plainly
/// until the store holds enough of them, then with a dictionary of each kind trained on
/// them and stored once; every block, sample and summary reads back the same on a store
/// opened later and, on Postgres, on another server of the database that had not loaded
/// the dictionaries yet.
#[tokio::test]
async fn blocks_and_hop_samples_are_compressed_with_stored_dictionaries() {
    let traces = |from: u32, n: u32| -> Vec<Span> {
        (from..from + n)
            .flat_map(|i| {
                let id = TraceId((7u128 << 120 | u128::from(i)).to_be_bytes());
                (1..=4u8).map(move |s| {
                    let service =
                        ["checkout", "inventory", "payments"][(i as usize + s as usize) % 3];
                    let mut one = span(
                        0,
                        s,
                        (s > 1).then_some(1),
                        service,
                        "POST /api/v1/orders/{id}",
                        10_000 + u64::from(i) * 10 + u64::from(s),
                    );
                    one.trace_id = id;
                    one.attributes = vec![
                        (
                            "http.request.method".into(),
                            AttrValue::String("POST".into()),
                        ),
                        (
                            "url.path".into(),
                            AttrValue::String(format!("/api/v1/orders/{i}")),
                        ),
                        (
                            "http.response.status_code".into(),
                            AttrValue::Int(200 + i64::from(i % 5)),
                        ),
                    ];
                    one
                })
            })
            .collect()
    };
    let ids = |spans: &[Span]| -> Vec<TraceId> {
        let mut ids: Vec<TraceId> = spans.iter().map(|s| s.trace_id).collect();
        ids.dedup();
        ids
    };
    // Each trace's summary and hop samples, as the analyzer writes them.
    let summaries = |spans: &[Span]| -> Vec<(TraceSummary, Vec<HopSample>)> {
        spans
            .chunk_by(|a, b| a.trace_id == b.trace_id)
            .map(|trace| {
                let analysis = analyze(trace, &AnalyzeOptions::default());
                let summary = summarize(trace, &analysis).unwrap();
                (summary, samples(trace, &analysis))
            })
            .collect()
    };
    let average_packed = async |db: &TestDb, column: &str| -> u64 {
        let sql = format!(
            "SELECT CAST(CAST(avg(length({column})) AS INTEGER) AS TEXT) FROM trace_summaries"
        );
        db.texts(&sql).await[0].parse().unwrap()
    };
    // The later traces' summaries as every search lists them, newest first.
    let searched = async |store: &dyn Store| -> String {
        let query = TraceQuery {
            service: Some("payments".into()),
            since_unix_nano: Some(10_000 + 5_000 * 10),
            limit: 200,
            ..TraceQuery::default()
        };
        format!("{:?}", store.search_traces(&query).await.unwrap())
    };
    let kinds = "SELECT kind FROM zstd_dictionaries ORDER BY kind";
    for db in TestDb::all().await {
        let backend = db.backend;
        let store = store::open(&db.url).await.expect("store opens");
        let other = if backend == "postgres" {
            Some(store::open(&db.url).await.expect("a second server opens"))
        } else {
            None
        };
        let first = traces(0, 1_200);
        store.write_spans(&first).await.unwrap();
        let plain = store.compact(&ids(&first), u64::MAX).await.unwrap();
        assert_eq!(plain.traces, 1_200, "{backend}");
        store
            .write_summaries(&summaries(&first), &[])
            .await
            .unwrap();
        assert_eq!(
            db.texts(kinds).await,
            ["blocks", "hops", "summaries"],
            "{backend}: one dictionary of each kind, trained once enough values were kept"
        );
        let plain_hops = average_packed(&db, "packed_hops").await;
        let plain_detail = average_packed(&db, "packed_detail").await;

        let later = traces(5_000, 100);
        store.write_spans(&later).await.unwrap();
        let packed = store.compact(&ids(&later), u64::MAX).await.unwrap();
        assert_eq!(packed.traces, 100, "{backend}");
        let per_trace = |c: budgetscope::store::Compacted| c.block_bytes / c.traces;
        assert!(
            per_trace(packed) * 2 < per_trace(plain),
            "{backend}: {packed:?} against {plain:?}"
        );
        let later_summaries = summaries(&later);
        store.write_summaries(&later_summaries, &[]).await.unwrap();
        let later_average = async |column: &str, plain: u64| {
            (average_packed(&db, column).await * 1_300).saturating_sub(plain * 1_200) / 100
        };
        let packed_hops = later_average("packed_hops", plain_hops).await;
        assert!(
            packed_hops * 5 < plain_hops * 4,
            "{backend}: hop samples of {packed_hops} bytes against {plain_hops}"
        );
        let packed_detail = later_average("packed_detail", plain_detail).await;
        assert!(
            packed_detail * 2 < plain_detail,
            "{backend}: summaries' detail of {packed_detail} bytes against {plain_detail}"
        );
        let found = searched(store.as_ref()).await;
        let written: Vec<&TraceSummary> = later_summaries
            .iter()
            .rev()
            .map(|(summary, _)| summary)
            .filter(|summary| summary.services.iter().any(|s| s == "payments"))
            .collect();
        assert_eq!(written.len(), 100, "{backend}");
        assert_eq!(
            found,
            format!("{written:?}"),
            "{backend}: summaries as written"
        );
        // As written (the samples' stored form rounds times), on every reader alike.
        let hops = store.hop_samples(&ids(&later)).await.unwrap();
        let outline = |hops: &[HopSample]| -> Vec<(String, u64)> {
            hops.iter()
                .map(|h| (h.service.clone(), h.start_unix_nano))
                .collect()
        };
        assert_eq!(hops.len(), 100, "{backend}");
        for (summary, written) in &later_summaries {
            let read = &hops[&summary.trace_id];
            assert!(
                outline(read) == outline(written),
                "{backend}: samples differ"
            );
        }

        let all: Vec<TraceId> = [ids(&first)[..50].to_vec(), ids(&later)].concat();
        let reads = every_read(store.as_ref(), &all).await;
        if let Some(other) = other {
            let what = format!("{backend}: another server");
            assert_eq!(every_read(other.as_ref(), &all).await, reads, "{what}");
            assert_eq!(searched(other.as_ref()).await, found, "{what}");
            assert_eq!(
                other.hop_samples(&ids(&later)).await.unwrap(),
                hops,
                "{what}"
            );
        }
        drop(store);
        let reopened = store::open(&db.url).await.expect("store opens again");
        assert_eq!(
            every_read(reopened.as_ref(), &all).await,
            reads,
            "{backend}: reopened"
        );
        assert_eq!(
            searched(reopened.as_ref()).await,
            found,
            "{backend}: reopened"
        );
        assert_eq!(
            reopened.hop_samples(&ids(&later)).await.unwrap(),
            hops,
            "{backend}"
        );
        // The reopened store compresses with the stored dictionaries, training none.
        let again = traces(9_000, 100);
        reopened.write_spans(&again).await.unwrap();
        let more = reopened.compact(&ids(&again), u64::MAX).await.unwrap();
        assert!(
            per_trace(more) * 2 < per_trace(plain),
            "{backend}: {more:?}"
        );
        reopened
            .write_summaries(&summaries(&again), &[])
            .await
            .unwrap();
        assert_eq!(
            db.texts(kinds).await,
            ["blocks", "hops", "summaries"],
            "{backend}"
        );
    }
}

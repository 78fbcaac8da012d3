//! Postgres's time partitions (src/store/partitions.rs): where a trace's rows land, what
//! retention drops whole and what it still deletes row by row.

mod common;

use std::time::Duration;

use budgetscope::core::analyze::Outcome;
use budgetscope::core::analyze::fixture;
use budgetscope::core::model::{Span, TraceId};
use budgetscope::store::query::TraceQuery;
use budgetscope::store::{self, PartitionPlan, Store, TraceSet};
use common::TestDb;

const HOUR: u64 = 3_600_000_000_000;
const DAY: u64 = 24 * HOUR;

/// Fixture `text` as trace `id`, its root starting at `start`.
fn trace(id: u8, start: u64, text: &str) -> Vec<Span> {
    let mut spans = fixture::parse(text);
    let shift = start - fixture::BASE_UNIX_NANO;
    for span in &mut spans {
        span.trace_id = TraceId([id; 16]);
        span.start_unix_nano += shift;
        span.end_unix_nano += shift;
    }
    spans
}

/// The partition (table name) each of trace `id`'s rows of `table` is in.
async fn homes(db: &TestDb, table: &str, id: u8) -> Vec<String> {
    let mut homes = db
        .texts(&format!(
            "SELECT DISTINCT tableoid::regclass::text FROM {table} \
             WHERE trace_id = '\\x{}'",
            hex::encode([id; 16])
        ))
        .await;
    homes.sort();
    homes
}

async fn found(store: &dyn Store) -> Vec<u8> {
    let mut ids: Vec<u8> = store
        .search_traces(&TraceQuery {
            limit: 50,
            ..TraceQuery::default()
        })
        .await
        .unwrap()
        .iter()
        .map(|s| s.trace_id.0[0])
        .collect();
    ids.sort_unstable();
    ids
}

#[tokio::test]
async fn postgres_keeps_traces_in_time_partitions_and_drops_them_whole() {
    let Some(db) = TestDb::postgres().await else {
        return;
    };
    let store = store::open(&db.url).await.expect("store opens");
    let plan = PartitionPlan {
        healthy: Duration::from_secs(86_400),
        all: Duration::from_secs(7 * 86_400),
    };
    // Partitions start at the next boundary after now: from half an hour before a midnight
    // (UTC), every class's start there.
    let first = common::now_nanos().div_ceil(DAY) * DAY;
    let now = first - HOUR / 2;
    // Healthy traces in 3 h partitions, the others in 12 h ones, two of each ahead of now,
    // for blocks and for terms; a second pass has nothing to add.
    let kept = store.keep_partitions(plan, now).await.unwrap();
    assert_eq!((kept.created, kept.dropped), (8, 0), "{kept:?}");
    assert_eq!(store.keep_partitions(plan, now).await.unwrap().created, 0);

    let healthy = common::HEALTHY_CHAIN;
    let exceeded = common::EXCEEDED_CHAIN;
    let spans = trace(0, fixture::BASE_UNIX_NANO, healthy).len();
    for (id, start, text) in [
        (0xa1, first + HOUR, healthy),
        (0xa2, first + HOUR, exceeded),
        (0xa3, now - 2 * DAY, healthy),
        (0xa4, first + 4 * HOUR, healthy),
        (0xa5, first + 5 * DAY + 4 * HOUR, healthy),
    ] {
        store.write_spans(&trace(id, start, text)).await.unwrap();
    }
    common::analyse_waiting(store.as_ref()).await;

    // Each trace's block and terms sit in the partition of its class and start;
    // one stored before any partition covered its time stays in the default one.
    let stamp = |t: u64| {
        humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + Duration::from_nanos(t))
            .to_string()
            .chars()
            .filter(char::is_ascii_digit)
            .take(10)
            .collect::<String>()
    };
    for table in ["trace_blocks", "trace_terms"] {
        let healthy_first = format!(
            "{table}_healthy_{}_{}",
            stamp(first),
            stamp(first + 3 * HOUR)
        );
        assert_eq!(
            homes(&db, table, 0xa1).await,
            [healthy_first.clone()],
            "{table}"
        );
        let problem = homes(&db, table, 0xa2).await;
        assert!(
            problem.len() == 1 && problem[0].starts_with(&format!("{table}_problem_")),
            "{table}: {problem:?}"
        );
        assert_eq!(homes(&db, table, 0xa3).await, [format!("{table}_default")]);
        assert_eq!(homes(&db, table, 0xa5).await, [format!("{table}_default")]);
    }
    assert_eq!(found(store.as_ref()).await, [0xa1, 0xa2, 0xa3, 0xa4, 0xa5]);

    // Row deletes take the old healthy trace of the default partition, and never one in a
    // partition, however old the cutoff says it is: dropping the partition takes it.
    assert_eq!(
        store
            .delete_traces_before(first + DAY, TraceSet::Healthy, 500)
            .await
            .unwrap(),
        1
    );
    assert!(store.trace(TraceId([0xa3; 16])).await.unwrap().is_empty());
    assert!(
        homes(&db, "trace_terms", 0xa3).await.is_empty(),
        "its terms go too"
    );

    // A day after the first healthy partition ends, retention drops it in both tables with
    // its traces' summaries and any span stored since as a row, leaving its row deletes
    // nothing: the trace is gone, the problem
    // trace of the same time and the next healthy one stay.
    let later = first + 3 * HOUR + DAY;
    let mut late = trace(0xa1, first + HOUR, healthy).remove(0);
    late.span_id = budgetscope::core::model::SpanId([0xee; 8]);
    store.write_spans(&[late]).await.unwrap();
    assert_eq!(
        store.trace(TraceId([0xa1; 16])).await.unwrap().len(),
        spans + 1
    );
    let kept = store.keep_partitions(plan, later).await.unwrap();
    assert_eq!((kept.dropped, kept.healthy_traces), (2, 1), "{kept:?}");
    assert!(store.trace(TraceId([0xa1; 16])).await.unwrap().is_empty());
    assert_eq!(
        store
            .delete_traces_before(later - DAY, TraceSet::Healthy, 500)
            .await
            .unwrap(),
        0
    );
    assert_eq!(store.trace(TraceId([0xa2; 16])).await.unwrap().len(), spans);
    assert!(!store.trace(TraceId([0xa4; 16])).await.unwrap().is_empty());
    assert_eq!(found(store.as_ref()).await, [0xa2, 0xa4, 0xa5]);

    // A trace whose class changes (a late span, a re-analysis) takes its block and terms
    // along into the other class's partitions.
    let (mut summary, hops) = {
        let spans = store.trace(TraceId([0xa4; 16])).await.unwrap();
        let options = budgetscope::core::analyze::AnalyzeOptions::default();
        let analysis = budgetscope::core::analyze::analyze(&spans, &options);
        let summary = budgetscope::core::analyze::summary::summarize(&spans, &analysis).unwrap();
        (
            summary,
            budgetscope::core::analyze::hops::samples(&spans, &analysis),
        )
    };
    summary.outcome = Outcome::Exceeded;
    store
        .write_summaries(&[(summary, hops)], &[])
        .await
        .unwrap();
    for table in ["trace_blocks", "trace_terms"] {
        let moved = homes(&db, table, 0xa4).await;
        assert!(
            moved.len() == 1 && moved[0].starts_with(&format!("{table}_problem_")),
            "{table}: {moved:?}"
        );
    }
    let summaries = db
        .texts("SELECT count(*)::text FROM trace_summaries WHERE trace_id = '\\xa4a4a4a4a4a4a4a4a4a4a4a4a4a4a4a4'")
        .await;
    assert_eq!(summaries, ["1"], "one summary per trace");

    // A partition created over rows already in the default one (a clock ahead of time)
    // takes them in.
    store.keep_partitions(plan, first + 5 * DAY).await.unwrap();
    for table in ["trace_blocks", "trace_terms"] {
        let moved = homes(&db, table, 0xa5).await;
        assert!(
            moved.len() == 1 && moved[0].starts_with(&format!("{table}_healthy_")),
            "{table}: {moved:?}"
        );
    }
    assert_eq!(store.trace(TraceId([0xa5; 16])).await.unwrap().len(), spans);
}

/// Migration 0022 carries a store's blocks and search terms over into the partitioned
/// tables' default partitions, each row with its trace's class.
#[tokio::test]
async fn postgres_migration_carries_traces_into_the_default_partitions() {
    let Some(db) = TestDb::postgres().await else {
        return;
    };
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations/postgres");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    let (before, partitioned): (Vec<_>, Vec<_>) = files
        .into_iter()
        .partition(|f| f.file_name().unwrap().to_str().unwrap() < "0022");
    use sqlx::Connection as _;
    let mut conn = sqlx::PgConnection::connect(&db.url).await.unwrap();
    let mut run = async |sql: String| {
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
            .execute(&mut conn)
            .await
            .unwrap();
    };
    for file in &before {
        run(std::fs::read_to_string(file).unwrap()).await;
    }
    run(
        "INSERT INTO trace_summaries (trace_id, root_service, root_name, start_unix_nano, \
         duration_ms, outcome, flag_counts, flags, span_count, services, operations) VALUES \
         ('\\x01', 'edge', 'GET /', 5, 1, 'ok', '{}', ',', 1, '', ''), \
         ('\\x02', 'edge', 'GET /', 6, 1, 'ok', '{\"overspent\":1}', ',overspent,', 1, '', ''); \
         INSERT INTO trace_blocks VALUES ('\\x01', 5, 1, 1, 0, '\\x00'), ('\\x02', 6, 1, 1, 0, '\\x00'); \
         INSERT INTO search_terms (term) VALUES ('s:edge'); \
         INSERT INTO trace_terms VALUES (1, 5, '\\x01'), (1, 6, '\\x02')"
            .to_string(),
    )
    .await;
    run(std::fs::read_to_string(&partitioned[0]).unwrap()).await;
    for table in ["trace_blocks", "trace_terms"] {
        let rows = db
            .texts(&format!(
                "SELECT tableoid::regclass::text || ' ' || encode(trace_id, 'hex') || ' ' || healthy \
                 FROM {table} ORDER BY trace_id"
            ))
            .await;
        assert_eq!(
            rows,
            [
                format!("{table}_default 01 true"),
                format!("{table}_default 02 false")
            ]
        );
    }
}

//! A SQLite file is one server's, and only a budgetscope database is used: a second server
//! on the file is refused naming the first (also when both start at once on a new file), and
//! a file of another program, a file that is not SQLite and a schema from a newer
//! budgetscope are refused with a message and left exactly as they were.

mod common;

use common::{TestDb, config};

/// The whole chain of a start-up error, as the binary prints it.
async fn start_error(db: &TestDb) -> String {
    match budgetscope::server::start(&config(db, &[])).await {
        Ok(server) => {
            server.shutdown().await;
            panic!("the server started on {}", db.url)
        }
        Err(error) => format!("{error:#}"),
    }
}

/// The file's bytes and which of its companions exist.
fn snapshot(db: &TestDb) -> (Vec<u8>, bool, bool) {
    let path = db.url.trim_start_matches("sqlite://");
    (
        std::fs::read(path).unwrap(),
        std::path::Path::new(&format!("{path}-wal")).exists(),
        std::path::Path::new(&format!("{path}-shm")).exists(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_server_on_one_sqlite_file_is_refused_naming_the_first() {
    let db = TestDb::sqlite();
    let first = common::start(&db, &[]).await;
    let error = start_error(&db).await;
    assert!(
        error.contains("is in use by another budgetscope server")
            && error.contains(&format!("pid {}", std::process::id()))
            && error.contains("another --db"),
        "{error}"
    );
    first.shutdown().await;
    // Once the first has stopped, the file is free again.
    let second = common::start(&db, &[]).await;
    second.shutdown().await;
}

/// Regression: two servers started at once on a new file both migrated it, and the second
/// failed half-way ("table … already exists").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_servers_started_at_once_on_a_new_file_one_runs_and_one_is_refused() {
    let db = TestDb::sqlite();
    let (one, two) = (config(&db, &[]), config(&db, &[]));
    let (a, b) = tokio::join!(
        budgetscope::server::start(&one),
        budgetscope::server::start(&two),
    );
    let (running, refused) = match (a, b) {
        (Ok(server), Err(error)) | (Err(error), Ok(server)) => (server, format!("{error:#}")),
        (Ok(a), Ok(b)) => {
            a.shutdown().await;
            b.shutdown().await;
            panic!("both servers run on one file");
        }
        (Err(a), Err(b)) => panic!("neither started: {a:#} / {b:#}"),
    };
    assert!(
        refused.contains("is in use by another budgetscope server"),
        "{refused}"
    );
    assert!(!refused.contains("already exists"), "{refused}");
    running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_of_another_program_is_refused_and_left_as_it_was() {
    for (tables, named) in [
        (
            "CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT)",
            "customers",
        ),
        // A table of the same name as one of ours is no budgetscope database either.
        (
            "CREATE TABLE spans (id INTEGER); CREATE TABLE orders (id INTEGER)",
            "orders, spans",
        ),
    ] {
        let db = TestDb::sqlite();
        let path = db.url.trim_start_matches("sqlite://").to_string();
        let other = rusqlite::Connection::open(&path).unwrap();
        other.execute_batch(tables).unwrap();
        drop(other);
        let before = snapshot(&db);
        let error = start_error(&db).await;
        assert!(
            error.contains("is not a budgetscope database")
                && error.contains(&format!("another program's tables: {named}")),
            "{error}"
        );
        assert_eq!(snapshot(&db), before, "the file is left as it was");
        let journal: String = rusqlite::Connection::open(&path)
            .unwrap()
            .query_row("PRAGMA journal_mode", [], |row| row.get(0))
            .unwrap();
        assert_eq!(journal, "delete", "not switched to WAL");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_that_is_not_sqlite_is_refused_and_left_as_it_was() {
    let db = TestDb::sqlite();
    let path = db.url.trim_start_matches("sqlite://").to_string();
    std::fs::write(
        &path,
        "these are somebody's notes, not a database\n".repeat(200),
    )
    .unwrap();
    let before = snapshot(&db);
    let error = start_error(&db).await;
    assert!(
        error.contains("is not a budgetscope database (it is not a SQLite file)"),
        "{error}"
    );
    assert_eq!(snapshot(&db), before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schema_from_a_newer_budgetscope_is_refused_with_what_to_do() {
    let db = TestDb::sqlite();
    common::start(&db, &[]).await.shutdown().await;
    let path = db.url.trim_start_matches("sqlite://").to_string();
    rusqlite::Connection::open(&path)
        .unwrap()
        .execute(
            "INSERT INTO _sqlx_migrations (version, description, success, checksum, \
             execution_time) VALUES (9999, 'from the future', 1, X'00', 0)",
            [],
        )
        .unwrap();
    let error = start_error(&db).await;
    assert!(
        error.contains("was written by a newer budgetscope (schema version 9999")
            && error.contains("run that version"),
        "{error}"
    );
}

/// `--max-disk`: near the cap the oldest healthy traces go first, the ones with a problem
/// stay while deleting healthy ones is enough, and past that the oldest of those go too;
/// with nothing analysed left to delete, the pass says the store is still over.
#[tokio::test]
async fn near_max_disk_the_oldest_healthy_traces_go_first() {
    use budgetscope::core::analyze::fixture;
    use budgetscope::core::model::{AttrValue, TraceId};
    use budgetscope::pipeline::lease::Lease;
    use budgetscope::pipeline::metrics::{DeletedFor, Metrics};
    use budgetscope::pipeline::retention::keep_under_cap;
    use budgetscope::store::TraceSet;

    let db = TestDb::sqlite();
    let store = budgetscope::store::open(&db.url).await.unwrap();
    let healthy = common::HEALTHY_CHAIN;
    let late = common::EXCEEDED_CHAIN;
    // 1,500 traces a second apart (three batches of deletes), one in five exceeded, each
    // span ~1 KB.
    let start = common::now_nanos() - 3_600_000_000_000;
    for i in 0..1_500u32 {
        let mut spans = fixture::parse(if i % 5 == 0 { late } else { healthy });
        for span in &mut spans {
            span.trace_id = TraceId::from_bytes(&(u128::from(i) + 1).to_be_bytes()).unwrap();
            span.start_unix_nano += start - fixture::BASE_UNIX_NANO + u64::from(i) * 1_000_000_000;
            span.end_unix_nano += start - fixture::BASE_UNIX_NANO + u64::from(i) * 1_000_000_000;
            span.attributes
                .push(("pad".into(), AttrValue::String("p".repeat(1_000))));
        }
        store.write_spans(&spans).await.unwrap();
    }
    common::analyse_waiting(store.as_ref()).await;
    let in_use = || async { store.disk_usage().await.unwrap().in_use_bytes.unwrap() };
    let traces = |id: u32| {
        let store = store.clone();
        async move {
            let id = TraceId::from_bytes(&(u128::from(id) + 1).to_be_bytes()).unwrap();
            !store.trace(id).await.unwrap().is_empty()
        }
    };
    let lease = Lease::new("retention", "test".into());
    assert!(lease.renew(store.as_ref()).await);
    let metrics = Metrics::default();
    let stop = tokio_util::sync::CancellationToken::new();

    // A cap a fifth below what is in use: healthy traces are enough, oldest first.
    let before = in_use().await;
    let cap = before - before / 5;
    let over = keep_under_cap(store.as_ref(), cap, &metrics, &lease, &stop, false).await;
    assert!(!over);
    assert!(
        in_use().await <= cap - cap / 50,
        "{} > {cap}",
        in_use().await
    );
    let healthy_gone = metrics.traces_deleted_for(DeletedFor::MaxDiskHealthy);
    assert!(healthy_gone > 0 && healthy_gone < 1_200, "{healthy_gone}");
    assert_eq!(metrics.traces_deleted_for(DeletedFor::MaxDisk), 0);
    assert!(!traces(1).await, "the oldest healthy trace went");
    assert!(traces(1_499).await, "the newest stays");
    for flagged in (0..1_500).step_by(5) {
        assert!(traces(flagged).await, "exceeded trace {flagged} stays");
    }
    // Under the cap, nothing more goes.
    assert!(!keep_under_cap(store.as_ref(), cap, &metrics, &lease, &stop, false).await);
    assert_eq!(
        metrics.traces_deleted_for(DeletedFor::MaxDiskHealthy),
        healthy_gone
    );

    // A cap nothing fits under: every analysed trace goes, healthy ones first, and the pass
    // says it is still over.
    assert!(keep_under_cap(store.as_ref(), 64 << 10, &metrics, &lease, &stop, false).await);
    assert_eq!(
        metrics.traces_deleted_for(DeletedFor::MaxDiskHealthy)
            + metrics.traces_deleted_for(DeletedFor::MaxDisk),
        1_500
    );
    assert_eq!(metrics.traces_deleted_for(DeletedFor::MaxDisk), 300);
    assert_eq!(
        store
            .delete_traces_before(u64::MAX, TraceSet::Analysed, 500)
            .await
            .unwrap(),
        0
    );
}

/// A store from before compaction was queued in the database: its analysed traces still
/// kept as rows wait for compaction once it is migrated, and only those.
#[tokio::test]
async fn a_store_migrated_to_the_compaction_queue_queues_its_analysed_rows() {
    use budgetscope::core::analyze::fixture;
    use budgetscope::core::model::TraceId;
    use budgetscope::pipeline::analyzer::analysis_pass;

    let db = TestDb::sqlite();
    let store = budgetscope::store::open(&db.url).await.unwrap();
    let trace = |id: u128| {
        let mut spans = fixture::parse(common::HEALTHY_CHAIN);
        for span in &mut spans {
            span.trace_id = TraceId::from_bytes(&id.to_be_bytes()).unwrap();
        }
        spans
    };
    // Two analysed traces, one not analysed yet.
    store
        .write_spans(&[trace(1), trace(2)].concat())
        .await
        .unwrap();
    let options = common::analyzer_options();
    while analysis_pass(store.as_ref(), &options).await.unwrap().more {}
    store.write_spans(&trace(3)).await.unwrap();
    drop(store);
    // As it was before migration 22.
    sql_batch(
        &db,
        "DROP TABLE compaction_due; DELETE FROM _sqlx_migrations WHERE version = 22;",
    );
    let store = budgetscope::store::open(&db.url).await.unwrap();
    assert_eq!(store.compaction_waiting().await.unwrap(), 2);
    let (done, taken) = store.compact_due(10, u64::MAX).await.unwrap();
    assert_eq!((taken, done.traces), (2, 2));
}

/// A SQLite store holding the healthy chain once per id in `ids`, analysed and compacted.
/// A count the SQL `sql` reads from `db`'s file.
fn sql_count(db: &TestDb, sql: &str) -> i64 {
    rusqlite::Connection::open(db.url.trim_start_matches("sqlite://"))
        .unwrap()
        .query_row(sql, [], |row| row.get(0))
        .unwrap()
}

/// Runs the statements `sql` on `db`'s file.
fn sql_batch(db: &TestDb, sql: &str) {
    rusqlite::Connection::open(db.url.trim_start_matches("sqlite://"))
        .unwrap()
        .execute_batch(sql)
        .unwrap();
}

async fn analysed_chains(
    db: &TestDb,
    ids: &[u128],
) -> std::sync::Arc<dyn budgetscope::store::Store> {
    use budgetscope::core::analyze::fixture;
    use budgetscope::core::model::TraceId;
    let store = budgetscope::store::open(&db.url).await.unwrap();
    let mut spans = Vec::new();
    for id in ids {
        let mut trace = fixture::parse(common::HEALTHY_CHAIN);
        for span in &mut trace {
            span.trace_id = TraceId::from_bytes(&id.to_be_bytes()).unwrap();
        }
        spans.extend(trace);
    }
    store.write_spans(&spans).await.unwrap();
    common::analyse_waiting(store.as_ref()).await;
    store
}

/// A store from before search terms were kept by id: its index of terms is carried over,
/// and searches driven by a term find the same traces.
#[tokio::test]
async fn a_store_migrated_to_terms_by_id_finds_what_it_found() {
    use budgetscope::store::query::TraceQuery;

    let db = TestDb::sqlite();
    let store = analysed_chains(&db, &[1, 2, 3]).await;
    let query = TraceQuery {
        service: Some("x".into()),
        limit: 10,
        ..Default::default()
    };
    let before = store.search_traces(&query).await.unwrap();
    assert_eq!(before.len(), 3);
    drop(store);
    // As it was before migration 23: the term's text in every row.
    sql_batch(
        &db,
        "CREATE TABLE old_terms (term TEXT NOT NULL, start_unix_nano INTEGER NOT NULL, \
               trace_id BLOB NOT NULL, PRIMARY KEY (term, start_unix_nano, trace_id)) WITHOUT ROWID;
             INSERT INTO old_terms SELECT s.term, ts.start_unix_nano, ts.trace_id \
               FROM trace_terms t JOIN search_terms s ON s.id = t.term_id \
               JOIN trace_summaries ts ON ts.id = t.summary_id;
             DROP TABLE trace_terms; DROP TABLE search_terms;
             ALTER TABLE old_terms RENAME TO trace_terms;
             DELETE FROM _sqlx_migrations WHERE version IN (23, 29);",
    );
    let store = budgetscope::store::open(&db.url).await.unwrap();
    assert_eq!(store.search_traces(&query).await.unwrap(), before);
}

/// A store from before terms named their trace's summary: migration 29 gives each summary
/// an id and carries the index over, and searches driven by terms find the same traces.
#[tokio::test]
async fn a_store_migrated_to_terms_by_summary_finds_what_it_found() {
    use budgetscope::store::query::TraceQuery;

    let db = TestDb::sqlite();
    let store = analysed_chains(&db, &[4, 5, 6]).await;
    let queries = [
        TraceQuery {
            service: Some("x".into()),
            limit: 10,
            ..Default::default()
        },
        TraceQuery {
            service: Some("x".into()),
            operation: Some("GET /x".into()),
            limit: 2,
            ..Default::default()
        },
    ];
    let mut before = Vec::new();
    for query in &queries {
        before.push(store.search_traces(query).await.unwrap());
    }
    assert_eq!(before[0].len(), 3);
    assert_eq!(before[1].len(), 2);
    drop(store);
    let count = |sql: &str| sql_count(&db, sql);
    let terms = count("SELECT count(*) FROM trace_terms");
    // The terms as stores before migration 29 held them: by start and trace id.
    sql_batch(
        &db,
        "CREATE TABLE old_terms (term_id INTEGER NOT NULL, start_unix_nano INTEGER NOT NULL, \
               trace_id BLOB NOT NULL, PRIMARY KEY (term_id, start_unix_nano, trace_id)) WITHOUT ROWID;
             INSERT INTO old_terms SELECT t.term_id, ts.start_unix_nano, ts.trace_id \
               FROM trace_terms t JOIN trace_summaries ts ON ts.id = t.summary_id;
             DROP TABLE trace_terms;
             ALTER TABLE old_terms RENAME TO trace_terms;
             DELETE FROM _sqlx_migrations WHERE version = 29;",
    );
    let store = budgetscope::store::open(&db.url).await.unwrap();
    for (query, before) in queries.iter().zip(&before) {
        assert_eq!(&store.search_traces(query).await.unwrap(), before);
    }
    assert_eq!(count("SELECT count(*) FROM trace_terms"), terms);
    assert_eq!(
        count(
            "SELECT count(*) FROM trace_terms t LEFT JOIN trace_summaries ts ON ts.id = t.summary_id WHERE ts.id IS NULL"
        ),
        0,
        "every term names a summary"
    );
}

/// A summary written before names, flag counts and lists were packed keeps them in its
/// text columns (migration 25 adds `packed_detail` and leaves them): it reads and is found
/// as before, and retention finds its terms from it.
#[tokio::test]
async fn a_summary_with_its_names_as_text_reads_as_before() {
    use budgetscope::store::query::TraceQuery;

    let db = TestDb::sqlite();
    let store = analysed_chains(&db, &[7]).await;
    let query = TraceQuery {
        service: Some("x".into()),
        limit: 10,
        ..Default::default()
    };
    let before = store.search_traces(&query).await.unwrap();
    assert_eq!(before.len(), 1);
    drop(store);
    // The text columns as summaries before migration 25 held them.
    let summary = &before[0];
    let lines = |items: Vec<String>| -> String {
        items
            .iter()
            .fold(String::from("\n"), |acc, s| acc + s + "\n")
    };
    let pairs = |pairs: &[(String, String)]| {
        lines(pairs.iter().map(|(s, n)| format!("{s}\t{n}")).collect())
    };
    let counts: std::collections::BTreeMap<&str, usize> = summary
        .flag_counts
        .iter()
        .map(|(flag, n)| (flag.as_str(), *n))
        .collect();
    let path = db.url.trim_start_matches("sqlite://").to_string();
    let connection = rusqlite::Connection::open(&path).unwrap();
    let changed = connection
        .execute(
            "UPDATE trace_summaries SET root_service = ?1, root_name = ?2, burner_service = ?3, \
             burner_name = ?4, flag_counts = ?5, services = ?6, operations = ?7, origins = ?8, \
             packed_detail = NULL",
            rusqlite::params![
                summary.root_service,
                summary.root_name,
                summary.burner.as_ref().map(|b| b.0.clone()),
                summary.burner.as_ref().map(|b| b.1.clone()),
                serde_json::to_string(&counts).unwrap(),
                lines(summary.services.clone()),
                pairs(&summary.operations),
                pairs(&summary.origins),
            ],
        )
        .unwrap();
    assert_eq!(changed, 1);
    drop(connection);
    let store = budgetscope::store::open(&db.url).await.unwrap();
    assert_eq!(store.search_traces(&query).await.unwrap(), before);
    // Retention deletes it with its terms, found from the text columns.
    while store.delete_before(u64::MAX / 2, 1_000).await.unwrap() > 0 {}
    assert_eq!(store.search_traces(&query).await.unwrap(), vec![]);
    let terms = rusqlite::Connection::open(&path)
        .unwrap()
        .query_row("SELECT count(*) FROM trace_terms", [], |row| {
            row.get::<_, i64>(0)
        })
        .unwrap();
    assert_eq!(terms, 0, "the terms went with the summary");
}

/// A store from before terms lost their (service, operation) pairs: migration 26 deletes
/// those rows, and a search for a service's operation finds what it found.
#[tokio::test]
async fn a_store_migrated_without_pair_terms_finds_what_it_found() {
    use budgetscope::store::query::TraceQuery;

    let db = TestDb::sqlite();
    let store = analysed_chains(&db, &[9]).await;
    let query = TraceQuery {
        service: Some("x".into()),
        operation: Some("GET /x".into()),
        limit: 10,
        ..Default::default()
    };
    let before = store.search_traces(&query).await.unwrap();
    assert_eq!(before.len(), 1);
    drop(store);
    // The pair's term as stores before migration 26 held it.
    let count = |sql: &str| sql_count(&db, sql);
    let terms = count("SELECT count(*) FROM trace_terms");
    sql_batch(
        &db,
        "INSERT INTO search_terms (term) VALUES ('op:x\tGET /x');
             INSERT INTO trace_terms SELECT s.id, t.start_second, t.summary_id \
               FROM trace_terms t, search_terms s \
               WHERE s.term = 'op:x\tGET /x' AND t.term_id = (SELECT min(term_id) FROM trace_terms);
             DELETE FROM _sqlx_migrations WHERE version = 26;",
    );
    assert_eq!(count("SELECT count(*) FROM trace_terms"), terms + 1);
    let store = budgetscope::store::open(&db.url).await.unwrap();
    assert_eq!(store.search_traces(&query).await.unwrap(), before);
    assert_eq!(count("SELECT count(*) FROM trace_terms"), terms);
    assert_eq!(
        count("SELECT count(*) FROM search_terms WHERE term LIKE 'op:%'"),
        0
    );
}

/// A store from before "ok" outcomes lost their index term: migration 28 deletes those
/// rows, and a search for the outcome finds what it found.
#[tokio::test]
async fn a_store_migrated_without_ok_outcome_terms_finds_what_it_found() {
    use budgetscope::core::analyze::Outcome;
    use budgetscope::store::query::TraceQuery;

    let db = TestDb::sqlite();
    let store = analysed_chains(&db, &[9, 10]).await;
    let query = TraceQuery {
        outcome: Some(Outcome::Ok),
        limit: 10,
        ..Default::default()
    };
    let before = store.search_traces(&query).await.unwrap();
    assert_eq!(before.len(), 2);
    drop(store);
    // The outcome's terms as stores before migration 28 held them: one per trace.
    let count = |sql: &str| sql_count(&db, sql);
    let terms = count("SELECT count(*) FROM trace_terms");
    sql_batch(
        &db,
        "INSERT INTO search_terms (term) VALUES ('outcome:ok');
             INSERT INTO trace_terms SELECT s.id, ts.start_unix_nano / 1000000000, ts.id \
               FROM trace_summaries ts, search_terms s WHERE s.term = 'outcome:ok';
             DELETE FROM _sqlx_migrations WHERE version = 28;",
    );
    assert_eq!(count("SELECT count(*) FROM trace_terms"), terms + 2);
    let store = budgetscope::store::open(&db.url).await.unwrap();
    assert_eq!(store.search_traces(&query).await.unwrap(), before);
    assert_eq!(count("SELECT count(*) FROM trace_terms"), terms);
    assert_eq!(
        count("SELECT count(*) FROM search_terms WHERE term = 'outcome:ok'"),
        0
    );
}

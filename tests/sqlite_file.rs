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

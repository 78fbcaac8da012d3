//! Faults that say what they are: a database the server may not write stops start-up; a
//! corrupt database and a full disk show in `/readyz` and in one ERROR line with what to do
//! (not a warning per write), exports hear a retryable refusal that names the fault, and a
//! full disk's end is logged once, with the requests refused meanwhile; an older schema's
//! upgrade says so before it starts. The binary runs as operators run it, so its log is
//! what they read.

mod common;

use std::io::{BufRead as _, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{TestDb, fixture_trace, otlp_request};
use prost::Message as _;

const BIN: &str = env!("CARGO_BIN_EXE_budgetscope");

/// The binary serving `db`, with its log kept line by line.
struct Server {
    child: Child,
    otlp: String,
    http: String,
    log: Arc<Mutex<Vec<String>>>,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl Server {
    fn start(db_url: &str) -> Server {
        let (grpc, otlp, http) = (free_port(), free_port(), free_port());
        let mut child = Command::new(BIN)
            .args(["serve", "--db", db_url, "--quiet-period", "1s"])
            .args(["--otlp-grpc-addr", &format!("127.0.0.1:{grpc}")])
            .args(["--otlp-http-addr", &format!("127.0.0.1:{otlp}")])
            .args(["--http-addr", &format!("127.0.0.1:{http}")])
            .env("RUST_LOG", "info")
            .env_remove("BUDGETSCOPE_DB")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let log: Arc<Mutex<Vec<String>>> = Arc::default();
        let (up_tx, up) = std::sync::mpsc::channel();
        let lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let kept = log.clone();
        std::thread::spawn(move || {
            for line in lines.map_while(Result::ok) {
                if line.contains("budgetscope is up") {
                    let _ = up_tx.send(());
                }
                kept.lock().unwrap().push(line);
            }
        });
        up.recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|_| panic!("the server did not come up: {:?}", log.lock().unwrap()));
        Server {
            child,
            otlp: format!("http://127.0.0.1:{otlp}/v1/traces"),
            http: format!("http://127.0.0.1:{http}"),
            log,
        }
    }

    /// Exports one trace; the status and the answer's text.
    async fn export(&self, trace: u8) -> (u16, String) {
        let spans = fixture_trace(trace, r#"edge server "GET /" 0 10 budget=100"#);
        let response = reqwest::Client::new()
            .post(&self.otlp)
            .header("content-type", "application/x-protobuf")
            .body(otlp_request(&spans, 1_000).encode_to_vec())
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        let body = response.bytes().await.unwrap();
        (status, String::from_utf8_lossy(&body).into_owned())
    }

    async fn readyz(&self) -> (u16, serde_json::Value) {
        let response = reqwest::get(format!("{}/readyz", self.http)).await.unwrap();
        let status = response.status().as_u16();
        let body = response.bytes().await.unwrap();
        (status, serde_json::from_slice(&body).unwrap())
    }

    /// Stops it with SIGTERM; its whole log.
    fn stop(mut self) -> Vec<String> {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let _ = self.child.wait();
        std::thread::sleep(Duration::from_millis(100));
        self.log.lock().unwrap().clone()
    }
}

fn lines_with<'a>(log: &'a [String], needle: &str) -> Vec<&'a String> {
    log.iter().filter(|line| line.contains(needle)).collect()
}

/// Regression: a database file this server may not write (mode 0444) let it start, answer
/// ready, and tell every exporter to retry forever. Opened read-only here (the root that
/// runs CI may write any file), which is what SQLite does with such a file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_the_server_may_not_write_stops_start_up_with_what_to_do() {
    let db = TestDb::sqlite();
    common::start(&db, &[]).await.shutdown().await;
    let read_only = common::config(&db, &[]);
    let mut read_only = read_only;
    read_only.db =
        budgetscope::server::config::parse_db_url(&format!("{}?mode=ro", db.url)).unwrap();
    let error = match budgetscope::server::start(&read_only).await {
        Ok(server) => {
            server.shutdown().await;
            panic!("a read-only database was taken");
        }
        Err(error) => format!("{error:#}"),
    };
    assert!(
        error.contains("the database is read-only")
            && error.contains("let the server's user write"),
        "{error}"
    );
}

/// Regression: a database with corrupt pages let the server answer ready while every
/// export was told to retry, and the only trace was a warning per write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_database_shows_in_readyz_and_in_one_log_line() {
    let db = TestDb::sqlite();
    // A server made the database and exited: nothing has it open any more.
    Server::start(&db.url).stop();
    // Zero the spans table's root page: every insert into it finds the page malformed.
    let path = db.url.trim_start_matches("sqlite://").to_string();
    let (root, page_size): (i64, i64) = {
        let conn = rusqlite::Connection::open(&path).unwrap();
        // Every page in the database file itself, none left in the WAL.
        conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
            .unwrap();
        let root = conn
            .query_row(
                "SELECT rootpage FROM sqlite_master WHERE name = 'spans'",
                [],
                |row| row.get(0),
            )
            .unwrap();
        let size = conn
            .query_row("PRAGMA page_size", [], |row| row.get(0))
            .unwrap();
        (root, size)
    };
    {
        use std::io::{Seek as _, SeekFrom, Write as _};
        let mut file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        file.seek(SeekFrom::Start(((root - 1) * page_size) as u64))
            .unwrap();
        file.write_all(&vec![0u8; page_size as usize]).unwrap();
    }

    let server = Server::start(&db.url);
    let (status, text) = server.export(1).await;
    assert_eq!(status, 503, "{text}");
    assert!(
        text.contains("it is corrupt") && text.contains("/readyz"),
        "{text}"
    );
    let (status, ready) = server.readyz().await;
    assert_eq!(status, 503, "{ready}");
    assert_eq!(ready["reason"], "the database is corrupt", "{ready}");
    assert!(
        ready["what_to_do"].as_str().unwrap().contains("backup"),
        "{ready}"
    );
    for trace in 2..=6 {
        assert_eq!(server.export(trace).await.0, 503);
    }
    let log = server.stop();
    let errors: Vec<_> = lines_with(&log, "ERROR")
        .into_iter()
        .filter(|line| line.contains("the database is corrupt"))
        .collect();
    assert_eq!(errors.len(), 1, "one ERROR line for the fault: {log:#?}");
    assert!(
        errors[0].contains("restore the database from a backup"),
        "{}",
        errors[0]
    );
    assert!(
        lines_with(&log, "store write failed").is_empty(),
        "no warning per write: {log:#?}"
    );
}

/// A full disk (a small tmpfs, where the test may mount one): `/readyz` fails while it
/// lasts, the log says so once when it starts and once when writes recover, with the
/// requests refused meanwhile, and the exports refused in between are stored on retry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_shows_in_readyz_while_it_lasts() {
    let dir = tempfile::tempdir().unwrap();
    let mount = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=6m", "tmpfs"])
        .arg(dir.path())
        .stderr(Stdio::null())
        .status();
    if !mount.is_ok_and(|status| status.success()) {
        common::say_skipped(
            "a_full_disk_shows_in_readyz_while_it_lasts: cannot mount a tmpfs here",
        );
        return;
    }
    struct Unmount(std::path::PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg(&self.0).status();
        }
    }
    let _unmount = Unmount(dir.path().to_path_buf());
    let url = format!("sqlite://{}", dir.path().join("budgetscope.db").display());
    let server = Server::start(&url);
    assert_eq!(server.export(1).await.0, 200);
    // Fill what is left of the disk but a little.
    let filler = dir.path().join("filler");
    {
        use std::io::Write as _;
        let mut file = std::fs::File::create(&filler).unwrap();
        let chunk = vec![7u8; 64 << 10];
        while file.write_all(&chunk).is_ok() {}
        let _ = file.sync_all();
    }
    let _ = std::fs::write(dir.path().join("nothing-left"), vec![0u8; 1 << 20]);

    let deadline = Instant::now() + Duration::from_secs(60);
    let mut trace = 2u8;
    let refused = loop {
        let (status, text) = server.export(trace).await;
        if status == 503 {
            break text;
        }
        assert!(Instant::now() < deadline, "the disk never filled up");
        trace = trace.wrapping_add(1).max(2);
    };
    assert!(refused.contains("the disk is full"), "{refused}");
    let (status, ready) = server.readyz().await;
    assert_eq!(status, 503, "{ready}");
    assert_eq!(ready["reason"], "the disk holding the database is full");
    for _ in 0..3 {
        assert_eq!(server.export(200).await.0, 503);
    }

    std::fs::remove_file(&filler).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while server.export(201).await.0 != 200 {
        assert!(Instant::now() < deadline, "writes never recovered");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(server.readyz().await.0, 200);
    let log = server.stop();
    let started: Vec<_> = lines_with(&log, "ERROR")
        .into_iter()
        .filter(|line| line.contains("the disk holding the database is full"))
        .collect();
    assert_eq!(started.len(), 1, "{log:#?}");
    let recovered = lines_with(&log, "database writes recovered");
    assert_eq!(recovered.len(), 1, "{log:#?}");
    assert!(
        recovered[0].contains("refused_requests="),
        "{}",
        recovered[0]
    );
    assert!(
        lines_with(&log, "store write failed").is_empty(),
        "no warning per write: {log:#?}"
    );
}

/// A store from an older budgetscope is upgraded before the server listens, and the log says
/// so first (an upgrade may rewrite an index for minutes) and when it is done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_schema_is_upgraded_saying_so_in_the_log() {
    let db = TestDb::sqlite();
    let server = Server::start(&db.url);
    assert_eq!(server.export(1).await.0, 200);
    let log = server.stop();
    assert!(lines_with(&log, "upgrading").is_empty(), "{log:?}");
    // The search terms as a store before migration 29 held them.
    let path = db.url.trim_start_matches("sqlite://").to_string();
    rusqlite::Connection::open(&path)
        .unwrap()
        .execute_batch(
            "CREATE TABLE old_terms (term_id INTEGER NOT NULL, start_unix_nano INTEGER NOT NULL, \
               trace_id BLOB NOT NULL, PRIMARY KEY (term_id, start_unix_nano, trace_id)) WITHOUT ROWID;
             DROP TABLE trace_terms;
             ALTER TABLE old_terms RENAME TO trace_terms;
             DELETE FROM _sqlx_migrations WHERE version = 29;",
        )
        .unwrap();
    let server = Server::start(&db.url);
    let log = server.stop();
    let upgrading = lines_with(&log, "upgrading");
    assert_eq!(upgrading.len(), 1, "{log:?}");
    assert!(
        upgrading[0].contains("from=28") && upgrading[0].contains("do not stop it"),
        "{log:?}"
    );
}

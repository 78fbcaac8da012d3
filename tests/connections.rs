//! Connections cannot exhaust the server: silent ones are closed, the cap refuses what is
//! beyond it at once, the open-files limit is raised at start, and a request declaring a
//! body over the limit is answered before it is read.

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::{TestDb, fixture_trace, get_json, otlp_request, post_otlp, start};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

/// Reads until the server closes the connection; how long that took, or `None` when it
/// stayed open for `within`.
async fn closed_within(stream: &mut TcpStream, within: Duration) -> Option<Duration> {
    let started = Instant::now();
    let mut buf = [0u8; 1024];
    loop {
        match tokio::time::timeout(
            within.saturating_sub(started.elapsed()),
            stream.read(&mut buf),
        )
        .await
        {
            Err(_) => return None,
            Ok(Ok(0)) | Ok(Err(_)) => return Some(started.elapsed()),
            Ok(Ok(_)) => continue,
        }
    }
}

async fn connect_many(addr: SocketAddr, n: usize) -> Vec<TcpStream> {
    let mut streams = Vec::with_capacity(n);
    for _ in 0..n {
        streams.push(TcpStream::connect(addr).await.expect("connect"));
    }
    streams
}

#[cfg(unix)]
fn lower_open_files_limit(soft: u64) {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit only read and write the struct passed.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit), 0);
        limit.rlim_cur = soft.min(limit.rlim_max);
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &limit), 0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_silent_connections_do_not_stop_the_server() {
    // The usual default soft limit: 1,200 connections held open would exhaust it (each is
    // two descriptors in this process, client and server side) unless the server raises it.
    #[cfg(unix)]
    lower_open_files_limit(1024);
    let db = TestDb::sqlite();
    let server = start(&db, &[]).await;
    let mut silent = connect_many(server.otlp_http_addr, 600).await;
    silent.extend(connect_many(server.http_addr, 600).await);

    let (status, _) = get_json(&server, "/healthz").await;
    assert_eq!(status, 200, "the UI answers");
    post_otlp(
        &server,
        &otlp_request(
            &fixture_trace(1, r#"edge server "GET /" 0 10 budget=100"#),
            0,
        ),
    )
    .await;

    // The server closes silent connections itself, after the header-read timeout.
    for stream in silent.iter_mut().take(3) {
        let closed = closed_within(stream, Duration::from_secs(40)).await;
        assert!(
            closed.is_some(),
            "a silent connection is closed by the server"
        );
    }
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_grpc_connection_is_closed_too() {
    let db = TestDb::sqlite();
    let server = start(&db, &[]).await;
    let mut stream = TcpStream::connect(server.otlp_grpc_addr).await.unwrap();
    assert!(
        closed_within(&mut stream, Duration::from_secs(40))
            .await
            .is_some(),
        "a connection that never sends the HTTP/2 preface is closed"
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_beyond_the_cap_are_closed_at_once_and_service_resumes() {
    let db = TestDb::sqlite();
    let server = start(&db, &["--max-connections", "20"]).await;
    let held = connect_many(server.http_addr, 20).await;
    // The 21st is closed as soon as it is accepted, long before any timeout would.
    let mut extra = TcpStream::connect(server.http_addr).await.unwrap();
    let closed = closed_within(&mut extra, Duration::from_secs(5)).await;
    assert!(closed.is_some(), "a connection over the cap is refused");
    drop(held);
    // Once the held connections go, requests are served again.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match reqwest::get(format!("http://{}/healthz", server.http_addr)).await {
            Ok(response) if response.status() == 200 => break,
            _ if Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(50)).await,
            other => panic!("the UI did not come back: {other:?}"),
        }
    }
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_declared_body_over_the_limit_is_refused_before_it_is_sent() {
    let db = TestDb::sqlite();
    let server = start(&db, &[]).await;
    let mut stream = TcpStream::connect(server.otlp_http_addr).await.unwrap();
    stream
        .write_all(
            b"POST /v1/traces HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/x-protobuf\r\n\
              Content-Length: 10000000000\r\n\r\n",
        )
        .await
        .unwrap();
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    // The answer comes without the body: reading stops at the end of the headers.
    while !answer.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buf))
            .await
            .expect("answered without waiting for the body")
            .unwrap();
        assert!(n > 0, "closed without an answer");
        answer.extend_from_slice(&buf[..n]);
    }
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_loopback_ui_answers_only_its_own_names() {
    let db = TestDb::sqlite();
    let server = start(&db, &["--allowed-hosts", "budgets.internal"]).await;
    let client = reqwest::Client::new();
    let port = server.http_addr.port();
    let status = |host: String, path: &'static str| {
        let client = client.clone();
        let url = format!("http://{}{path}", server.http_addr);
        async move {
            let response = client.get(url).header("host", host).send().await.unwrap();
            let status = response.status().as_u16();
            (status, response.text().await.unwrap())
        }
    };
    for host in [
        format!("localhost:{port}"),
        format!("127.0.0.1:{port}"),
        "LOCALHOST".to_string(),
        format!("budgets.internal:{port}"),
    ] {
        assert_eq!(status(host.clone(), "/healthz").await.0, 200, "{host}");
    }
    // A name pointed at 127.0.0.1 by someone else's DNS (rebinding) is not served.
    let (code, page) = status(format!("attacker.example:{port}"), "/").await;
    assert_eq!(code, 421);
    assert!(page.contains("--allowed-hosts"), "says what to do: {page}");
    let (code, body) = status("attacker.example".into(), "/api/services").await;
    assert_eq!(code, 421);
    let body: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["error"]["code"], "unknown_host");
    server.shutdown().await;
}

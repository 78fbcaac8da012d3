//! TLS on the listeners (`--tls-cert`, `--tls-key`) through the real server: OTLP over gRPC
//! (ALPN h2) and HTTP, the UI, no plain text on the TLS ports, a renewed certificate taken
//! on reload, and files that cannot be used stopping start-up.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;

use common::{TestDb, checkout_a_minute_ago, otlp_request, write_certificate};
use http_body_util::{BodyExt as _, Full};
use hyper_util::rt::TokioIo;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_client::TraceServiceClient;
use prost::Message as _;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

/// A TLS connection to `addr` that trusts only `root`, offering `alpn`.
async fn connect(
    addr: SocketAddr,
    root: &CertificateDer<'static>,
    alpn: &[&[u8]],
) -> std::io::Result<TlsStream<TcpStream>> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(root.clone()).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    let tcp = TcpStream::connect(addr).await?;
    TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
}

/// One HTTP/1.1 request over TLS: the status and the body.
async fn request(
    addr: SocketAddr,
    root: &CertificateDer<'static>,
    method: &str,
    path: &str,
    body: Vec<u8>,
) -> (u16, Vec<u8>) {
    let tls = connect(addr, root, &[b"http/1.1"]).await.unwrap();
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .unwrap();
    tokio::spawn(connection);
    let request = hyper::Request::builder()
        .method(method)
        .uri(path)
        .header("host", "localhost")
        .header("content-type", "application/x-protobuf")
        .body(Full::new(bytes::Bytes::from(body)))
        .unwrap();
    let response = sender.send_request(request).await.unwrap();
    let status = response.status().as_u16();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, body.to_vec())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_listener_speaks_tls_with_the_given_certificate() {
    let db = TestDb::sqlite();
    let dir = tempfile::tempdir().unwrap();
    let (server, root) = common::start_with_tls(&db, dir.path()).await;
    let key = dir.path().join("key.pem");

    // OTLP/HTTP and the API over HTTPS.
    let spans = checkout_a_minute_ago();
    let trace_id = spans[0].trace_id.to_string();
    let export = otlp_request(&spans, 60_000).encode_to_vec();
    let (status, _) = request(server.otlp_http_addr, &root, "POST", "/v1/traces", export).await;
    assert_eq!(status, 200);
    let (status, body) = request(
        server.http_addr,
        &root,
        "GET",
        &format!("/api/traces/{trace_id}"),
        Vec::new(),
    )
    .await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let (status, page) = request(server.http_addr, &root, "GET", "/", Vec::new()).await;
    assert_eq!(status, 200);
    assert!(String::from_utf8_lossy(&page).contains("budgetscope"));

    // OTLP/gRPC: the listener offers h2 in ALPN, as gRPC clients require.
    let grpc_addr = server.otlp_grpc_addr;
    let connector_root = root.clone();
    let channel = tonic::transport::Endpoint::from_static("http://localhost")
        .connect_with_connector(tower::service_fn(move |_| {
            let root = connector_root.clone();
            async move {
                let tls = connect(grpc_addr, &root, &[b"h2"]).await?;
                assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
                Ok::<_, std::io::Error>(TokioIo::new(tls))
            }
        }))
        .await
        .unwrap();
    TraceServiceClient::new(channel)
        .export(otlp_request(
            &common::fixture_trace(7, r#"edge server "GET /tls" 0 10 budget=100"#),
            60_000,
        ))
        .await
        .unwrap();
    let grpc_only = connect(grpc_addr, &root, &[b"http/1.1"]).await;
    assert!(
        grpc_only.is_err(),
        "the gRPC listener negotiates nothing but h2"
    );

    // No plain text on a TLS port, and no certificate but the one given is trusted.
    let plain = reqwest::Client::new()
        .get(format!("http://{}/healthz", server.http_addr))
        .send()
        .await;
    assert!(
        plain.is_err() || !plain.unwrap().status().is_success(),
        "plain HTTP is not served"
    );
    let stranger = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
    assert!(
        connect(server.http_addr, stranger.cert.der(), &[b"http/1.1"])
            .await
            .is_err(),
        "the client checks the server's certificate"
    );

    // A renewed certificate is served to new connections after a reload; files that
    // cannot be used keep the one in force.
    std::fs::write(&key, "not a key").unwrap();
    server.reloader().reload();
    assert!(connect(server.http_addr, &root, &[]).await.is_ok(), "kept");
    let renewed = write_certificate(dir.path());
    server.reloader().reload();
    assert!(connect(server.http_addr, &root, &[]).await.is_err());
    let (status, _) = request(server.http_addr, &renewed, "GET", "/healthz", Vec::new()).await;
    assert_eq!(status, 200);
    server.shutdown().await;
}

#[tokio::test]
async fn a_certificate_that_cannot_be_used_stops_start_up() {
    let db = TestDb::sqlite();
    let dir = tempfile::tempdir().unwrap();
    write_certificate(dir.path());
    let cert = dir.path().join("cert.pem");
    let other = tempfile::tempdir().unwrap();
    write_certificate(other.path());
    let other_key = other.path().join("key.pem");
    let missing = dir.path().join("missing.pem");
    for (cert, key, expected) in [
        (&cert, &other_key, "is it the key of the first certificate"),
        (&missing, &other_key, "cannot read the certificate file"),
        (&other_key, &other_key, "holds no PEM certificate"),
        (&cert, &cert, "expected a PEM private key"),
    ] {
        let config = common::config(
            &db,
            &[
                "--tls-cert",
                cert.to_str().unwrap(),
                "--tls-key",
                key.to_str().unwrap(),
            ],
        );
        let error = match budgetscope::server::start(&config).await {
            Ok(_) => panic!("{cert:?} and {key:?} were taken"),
            Err(error) => format!("{error:#}"),
        };
        assert!(error.contains("--tls-cert and --tls-key"), "{error}");
        assert!(error.contains(expected), "{expected}: {error}");
    }
    let half = budgetscope::server::config::ServeArgs::try_parse_from([
        "serve",
        "--tls-cert",
        cert.to_str().unwrap(),
    ])
    .unwrap()
    .validate()
    .unwrap_err()
    .to_string();
    assert!(half.contains("give --tls-key"), "{half}");
}

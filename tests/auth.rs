//! Tokens (`--otlp-tokens`, `--ui-tokens`) through the real server: OTLP over gRPC and
//! HTTP, the UI and the API, rotation by re-reading the files.

mod common;

use axum::http::StatusCode;
use common::{TestDb, checkout_a_minute_ago, otlp_request, start};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_client::TraceServiceClient;
use prost::Message as _;

/// user:ui-secret
const BASIC_UI: &str = "Basic dXNlcjp1aS1zZWNyZXQ=";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_keep_out_every_client_without_one() {
    let db = TestDb::sqlite();
    let dir = tempfile::tempdir().unwrap();
    let (otlp, ui) = (dir.path().join("otlp"), dir.path().join("ui"));
    std::fs::write(&otlp, "# exporters\notlp-secret\n").unwrap();
    std::fs::write(&ui, "ui-secret\n").unwrap();
    let server = start(
        &db,
        &[
            "--otlp-tokens",
            otlp.to_str().unwrap(),
            "--ui-tokens",
            ui.to_str().unwrap(),
        ],
    )
    .await;
    let client = reqwest::Client::new();
    let request = otlp_request(&checkout_a_minute_ago(), 60_000);

    // OTLP/HTTP: a bearer token of the OTLP file, nothing else.
    let post = |authorization: Option<&str>| {
        let mut post = client
            .post(format!("http://{}/v1/traces", server.otlp_http_addr))
            .header("content-type", "application/x-protobuf")
            .body(request.encode_to_vec());
        if let Some(value) = authorization {
            post = post.header("authorization", value);
        }
        async move { post.send().await.unwrap() }
    };
    for refused in [None, Some("Bearer ui-secret"), Some(BASIC_UI)] {
        let response = post(refused).await;
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED, "{refused:?}");
        assert_eq!(
            response.headers()["www-authenticate"],
            "Bearer realm=\"budgetscope otlp\""
        );
        // A google.rpc.Status: its message is a protobuf string, readable in the bytes.
        let message = String::from_utf8_lossy(&response.bytes().await.unwrap()).into_owned();
        assert!(message.contains("--otlp-tokens"), "{message}");
        assert!(!message.contains("secret"), "tokens are never echoed");
    }
    assert_eq!(
        post(Some("Bearer otlp-secret")).await.status(),
        StatusCode::OK
    );

    // OTLP/gRPC: the same token as metadata.
    let mut grpc = TraceServiceClient::connect(format!("http://{}", server.otlp_grpc_addr))
        .await
        .unwrap();
    let refused = grpc.export(request.clone()).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unauthenticated);
    assert!(refused.message().contains("--otlp-tokens"));
    let mut with_token = tonic::Request::new(request.clone());
    with_token
        .metadata_mut()
        .insert("authorization", "Bearer otlp-secret".parse().unwrap());
    grpc.export(with_token).await.unwrap();

    // The UI and API: bearer or basic with the UI file's token; probes stay open.
    let get = |path: &str, authorization: Option<&str>| {
        let mut get = client.get(format!("http://{}{path}", server.http_addr));
        if let Some(value) = authorization {
            get = get.header("authorization", value);
        }
        async move { get.send().await.unwrap() }
    };
    let page = get("/", None).await;
    assert_eq!(page.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(
        page.headers()["www-authenticate"],
        "Basic realm=\"budgetscope\", charset=\"UTF-8\""
    );
    assert!(page.headers().contains_key("content-security-policy"));
    assert!(
        page.text()
            .await
            .unwrap()
            .contains("Log in to see budgetscope")
    );
    let api = get("/api/status", Some("Bearer otlp-secret")).await;
    assert_eq!(api.status(), StatusCode::UNAUTHORIZED);
    let body: serde_json::Value = serde_json::from_str(&api.text().await.unwrap()).unwrap();
    assert_eq!(body["error"]["code"], "unauthenticated");
    assert_eq!(get("/", Some(BASIC_UI)).await.status(), StatusCode::OK);
    assert_eq!(
        get("/api/status", Some("Bearer ui-secret")).await.status(),
        StatusCode::OK
    );
    for probe in ["/healthz", "/readyz"] {
        assert_eq!(get(probe, None).await.status(), StatusCode::OK, "{probe}");
    }

    // Rotation: the file is edited and re-read (SIGHUP); a file with no token is not
    // taken, and the tokens in force stay.
    std::fs::write(&ui, "ui-rotated\n").unwrap();
    server.reloader().reload();
    assert_eq!(
        get("/api/status", Some("Bearer ui-secret")).await.status(),
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        get("/api/status", Some("Bearer ui-rotated")).await.status(),
        StatusCode::OK
    );
    std::fs::write(&ui, "\n# emptied by mistake\n").unwrap();
    server.reloader().reload();
    assert_eq!(
        get("/api/status", Some("Bearer ui-rotated")).await.status(),
        StatusCode::OK
    );
    server.shutdown().await;
}

#[tokio::test]
async fn a_tokens_file_that_cannot_be_used_stops_start_up() {
    let db = TestDb::sqlite();
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty");
    std::fs::write(&empty, "# no token yet\n").unwrap();
    for (flag, file) in [
        ("--otlp-tokens", dir.path().join("missing")),
        ("--ui-tokens", empty),
    ] {
        let config = common::config(&db, &[flag, file.to_str().unwrap()]);
        let error = match budgetscope::server::start(&config).await {
            Ok(_) => panic!("{flag}: started"),
            Err(error) => format!("{error:#}"),
        };
        assert!(
            error.contains(&format!("{flag} names a file that cannot be used")),
            "{error}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_authenticating_proxys_user_header_counts_only_from_its_addresses() {
    let db = TestDb::sqlite();
    let client = reqwest::Client::new();
    let get = |addr: std::net::SocketAddr, path: &str, headers: &[(&str, &str)]| {
        let mut get = client.get(format!("http://{addr}{path}"));
        for (name, value) in headers {
            get = get.header(*name, *value);
        }
        async move { get.send().await.unwrap() }
    };

    // The tests connect from 127.0.0.1: here that is the proxy's address.
    let behind_proxy = start(
        &db,
        &[
            "--trusted-proxies",
            "10.1.0.0/16, 127.0.0.1",
            "--proxy-user-header",
            "Remote-User",
        ],
    )
    .await;
    let addr = behind_proxy.http_addr;
    let alice = [("remote-user", "alice")];
    assert_eq!(
        get(addr, "/api/status", &alice).await.status(),
        StatusCode::OK
    );
    assert_eq!(get(addr, "/", &alice).await.status(), StatusCode::OK);
    for headers in [
        &[][..],
        &[("x-forwarded-user", "alice")],
        &[("remote-user", " ")],
    ] {
        let refused = get(addr, "/api/status", headers).await;
        assert_eq!(refused.status(), StatusCode::FORBIDDEN, "{headers:?}");
        assert!(
            !refused.headers().contains_key("www-authenticate"),
            "no token would help"
        );
        let body: serde_json::Value = serde_json::from_str(&refused.text().await.unwrap()).unwrap();
        assert_eq!(body["error"]["code"], "forbidden");
        assert!(
            body["error"]["message"]
                .as_str()
                .unwrap()
                .contains("authenticating proxy"),
            "{body}"
        );
    }
    let page = get(addr, "/traces", &[]).await;
    assert_eq!(page.status(), StatusCode::FORBIDDEN);
    assert!(page.text().await.unwrap().contains("--trusted-proxies"));
    assert_eq!(get(addr, "/healthz", &[]).await.status(), StatusCode::OK);
    behind_proxy.shutdown().await;

    // The proxy is elsewhere: the same header from 127.0.0.1 is a forgery; tokens still
    // let their holders in.
    let dir = tempfile::tempdir().unwrap();
    let ui = dir.path().join("ui");
    std::fs::write(&ui, "ui-secret\n").unwrap();
    let elsewhere = start(
        &db,
        &[
            "--trusted-proxies",
            "10.1.0.0/16",
            "--ui-tokens",
            ui.to_str().unwrap(),
        ],
    )
    .await;
    let addr = elsewhere.http_addr;
    let forged = get(addr, "/api/status", &[("x-forwarded-user", "admin")]).await;
    assert_eq!(forged.status(), StatusCode::UNAUTHORIZED);
    assert!(forged.headers().contains_key("www-authenticate"));
    assert_eq!(
        get(
            addr,
            "/api/status",
            &[("authorization", "Bearer ui-secret")]
        )
        .await
        .status(),
        StatusCode::OK
    );
    elsewhere.shutdown().await;
}

#[test]
fn trusted_proxies_and_their_header_are_checked_at_start_up() {
    for (flags, flag) in [
        (
            &["--trusted-proxies", "10.0.0.0/33"][..],
            "--trusted-proxies",
        ),
        (
            &["--trusted-proxies", "proxy.example.com"],
            "--trusted-proxies",
        ),
        (&["--proxy-user-header", "X User"], "--proxy-user-header"),
    ] {
        let mut argv = vec!["serve"];
        argv.extend_from_slice(flags);
        let error = budgetscope::server::config::ServeArgs::try_parse_from(argv)
            .unwrap()
            .validate()
            .unwrap_err()
            .to_string();
        assert!(error.contains(flag), "{error}");
    }
}

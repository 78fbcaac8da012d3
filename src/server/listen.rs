//! The listeners' connections: how many each takes, how long a connection may sit without a
//! request, and taking them down at shutdown. One accept loop serves all three listeners
//! (OTLP/gRPC, OTLP/HTTP, the UI and API), so they share these bounds.
//!
//! Invariants:
//! - a listener holds at most `max_connections` connections; a connection beyond that is
//!   closed as soon as it is accepted (and logged), so silent clients cannot use up the
//!   process's open files and lock everyone else out;
//! - a connection must start a request within `HEADER_READ_TIMEOUT` of being accepted, and
//!   an HTTP/1 request's headers must arrive within it (hyper's timer, which also runs
//!   between keep-alive requests, so an idle HTTP/1 connection closes after it);
//! - a connection with no request in flight for `IDLE_TIMEOUT` is shut down gracefully
//!   (HTTP/2: GOAWAY, which exporters follow by reconnecting);
//! - HTTP/2 pings every `KEEPALIVE_INTERVAL` close connections to peers that vanished;
//! - shutdown stops accepting, shuts every connection down gracefully (in-flight requests
//!   finish) and returns once all are closed;
//! - with TLS, the handshake must finish within `HEADER_READ_TIMEOUT` too;
//! - every request carries its peer's address (`ConnectInfo<SocketAddr>`).

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::extract::ConnectInfo;
use axum::http::{Request, Response};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt as _;

/// How long a new connection may take to start a request, and an HTTP/1 request to send
/// its headers.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a connection may stay open with no request in flight.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(120);

/// HTTP/2 keep-alive: a ping this often, and the connection closes when one is not
/// answered within `KEEPALIVE_TIMEOUT`.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(20);

/// Concurrent requests (streams) on one HTTP/2 connection.
const MAX_CONCURRENT_STREAMS: u32 = 100;

/// The HTTP/2 flow-control window of each connection: how much a client may have sent on
/// it, over all its requests, before it must wait for the server to acknowledge what it
/// read. 16 MiB, where gRPC's Go server stops growing its windows, against hyper's 1 MiB
/// default: 512-span gRPC exports commit more spans/s with less server CPU (`benches/ab.sh`
/// with `AB_CONFIG="--transport grpc --batch 512 --concurrency 8"`). It bounds no memory of ours: each request is read
/// whole, up to `--max-request-bytes`, before it is decoded anyway.
const HTTP2_CONNECTION_WINDOW: u32 = 16 << 20;

/// How long shutdown waits for open connections to finish their requests.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

/// Refused connections are logged at most this often per listener.
const REFUSAL_LOG_EVERY: Duration = Duration::from_secs(10);

/// How a listener serves its connections.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_connections: usize,
    /// Only HTTP/2 (gRPC); otherwise HTTP/1 and HTTP/2 are both accepted.
    pub http2_only: bool,
}

/// Raises the soft limit on open files to the hard limit, which needs no privilege, so
/// that the connection caps and not the OS decide when connections are refused. Returns
/// the soft limit in force afterwards (`None` where it cannot be read).
pub fn raise_open_files_limit() -> Option<u64> {
    #[cfg(unix)]
    {
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit and setrlimit only read and write the struct passed.
        unsafe {
            if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
                return None;
            }
            // Linux refuses more than fs.nr_open (1,048,576 by default) even when the hard
            // limit is unlimited.
            let wanted = limit.rlim_max.min(1 << 20);
            if wanted > limit.rlim_cur {
                let raised = libc::rlimit {
                    rlim_cur: wanted,
                    rlim_max: limit.rlim_max,
                };
                if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                    limit.rlim_cur = wanted;
                }
            }
        }
        #[allow(clippy::unnecessary_cast)] // rlim_t is not u64 on every platform.
        Some(limit.rlim_cur as u64)
    }
    #[cfg(not(unix))]
    {
        None
    }
}

/// The per-listener connection cap that fits `open_files` for `listeners` listeners,
/// keeping room for the database, logs and the store's files; `wanted` when it fits.
pub fn fit_connections(wanted: usize, open_files: Option<u64>, listeners: usize) -> usize {
    const RESERVED: u64 = 256;
    match open_files {
        Some(limit) => {
            let room = limit.saturating_sub(RESERVED) / listeners.max(1) as u64;
            wanted.min(room.max(16) as usize)
        }
        None => wanted,
    }
}

/// Whether a connection is busy, and since when it has been idle.
struct Activity {
    opened: Instant,
    in_flight: AtomicUsize,
    /// Milliseconds after `opened` when the last request ended (or the connection opened).
    idle_since_ms: AtomicU64,
    /// A request has started on the connection.
    started: AtomicBool,
}

impl Activity {
    fn new() -> Activity {
        Activity {
            opened: Instant::now(),
            in_flight: AtomicUsize::new(0),
            idle_since_ms: AtomicU64::new(0),
            started: AtomicBool::new(false),
        }
    }

    /// When the connection should be shut down if nothing happens before: `None` while a
    /// request is in flight.
    fn deadline(&self) -> Option<Instant> {
        if self.in_flight.load(Ordering::Acquire) > 0 {
            return None;
        }
        let idle_since =
            self.opened + Duration::from_millis(self.idle_since_ms.load(Ordering::Acquire));
        Some(if self.started.load(Ordering::Acquire) {
            idle_since + IDLE_TIMEOUT
        } else {
            idle_since + HEADER_READ_TIMEOUT
        })
    }
}

/// Marks a request in flight until dropped.
struct Busy(Arc<Activity>);

impl Busy {
    fn begin(activity: &Arc<Activity>) -> Busy {
        activity.started.store(true, Ordering::Release);
        activity.in_flight.fetch_add(1, Ordering::AcqRel);
        Busy(activity.clone())
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        let now = self.0.opened.elapsed().as_millis() as u64;
        self.0.idle_since_ms.fetch_max(now, Ordering::AcqRel);
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// A tower service as hyper calls it, recording each request's span on the connection and
/// telling it who the peer is.
struct Tracked<S> {
    service: S,
    activity: Arc<Activity>,
    peer: std::net::SocketAddr,
}

impl<S, B> hyper::service::Service<Request<Incoming>> for Tracked<S>
where
    S: tower::Service<Request<Incoming>, Response = Response<B>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send,
{
    type Response = Response<B>;
    type Error = Infallible;
    type Future = BoxFuture<Result<Response<B>, Infallible>>;

    fn call(&self, mut request: Request<Incoming>) -> Self::Future {
        request.extensions_mut().insert(ConnectInfo(self.peer));
        let busy = Busy::begin(&self.activity);
        let service = self.service.clone();
        Box::pin(async move {
            let response = service.oneshot(request).await;
            drop(busy);
            response
        })
    }
}

/// Serves `service` on `listener` within `limits` until `stop`, then drains connections.
pub fn serve<S, B>(
    listener: TcpListener,
    service: S,
    limits: Limits,
    tls: Option<TlsAcceptor>,
    stop: CancellationToken,
    what: &'static str,
) -> JoinHandle<()>
where
    S: tower::Service<Request<Incoming>, Response = Response<B>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send,
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let mut builder = Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT);
    builder
        .http2()
        .timer(TokioTimer::new())
        .initial_connection_window_size(HTTP2_CONNECTION_WINDOW)
        .max_concurrent_streams(MAX_CONCURRENT_STREAMS)
        .keep_alive_interval(KEEPALIVE_INTERVAL)
        .keep_alive_timeout(KEEPALIVE_TIMEOUT);
    if limits.http2_only {
        builder = builder.http2_only();
    }
    let builder = Arc::new(builder);
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    tokio::spawn(async move {
        let mut refused = 0u64;
        let mut refusal_logged: Option<Instant> = None;
        loop {
            let (stream, peer) = tokio::select! {
                _ = stop.cancelled() => break,
                accepted = listener.accept() => match accepted {
                    Ok(accepted) => accepted,
                    Err(error) => {
                        // Out of files or a connection reset before it was accepted: the
                        // listener itself is fine; wait a little rather than spin.
                        tracing::warn!(%error, listener = what, "accepting a connection failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                },
            };
            let Ok(slot) = slots.clone().try_acquire_owned() else {
                drop(stream);
                refused += 1;
                if refusal_logged.is_none_or(|at| at.elapsed() >= REFUSAL_LOG_EVERY) {
                    tracing::warn!(
                        listener = what,
                        open = limits.max_connections,
                        refused,
                        "refused connections: the listener holds its most connections \
                         (--max-connections); clients retry"
                    );
                    refusal_logged = Some(Instant::now());
                    refused = 0;
                }
                continue;
            };
            // Small frames (acknowledgements, flow-control updates) must not wait for the
            // peer's delayed ACK.
            let _ = stream.set_nodelay(true);
            let builder = builder.clone();
            let service = service.clone();
            let stop = stop.clone();
            let tls = tls.clone();
            tokio::spawn(async move {
                let tracked = Tracked {
                    service,
                    activity: Arc::new(Activity::new()),
                    peer,
                };
                match tls {
                    None => drive(&builder, stream, tracked, stop, what).await,
                    Some(acceptor) => {
                        let handshake = tokio::select! {
                            _ = stop.cancelled() => None,
                            done = tokio::time::timeout(HEADER_READ_TIMEOUT, acceptor.accept(stream)) => Some(done),
                        };
                        match handshake {
                            Some(Ok(Ok(stream))) => {
                                drive(&builder, stream, tracked, stop, what).await
                            }
                            Some(Ok(Err(error))) => {
                                tracing::debug!(%error, %peer, listener = what, "TLS handshake failed");
                            }
                            Some(Err(_)) => {
                                tracing::debug!(%peer, listener = what, "TLS handshake timed out");
                            }
                            None => {}
                        }
                    }
                }
                drop(slot);
            });
        }
        // Every connection holds a slot until it closes: taking them all waits for them,
        // for at most `DRAIN_TIMEOUT` (a client that never reads its answer cannot hold
        // shutdown; an unanswered request was never acknowledged).
        let all = u32::try_from(limits.max_connections).unwrap_or(u32::MAX);
        if tokio::time::timeout(DRAIN_TIMEOUT, slots.acquire_many(all))
            .await
            .is_err()
        {
            tracing::warn!(
                listener = what,
                "connections still open after {DRAIN_TIMEOUT:?}; closing them"
            );
        }
    })
}

/// Serves one connection until it ends, shutting it down when idle or at `stop`.
async fn drive<I, S, B>(
    builder: &Builder<TokioExecutor>,
    io: I,
    tracked: Tracked<S>,
    stop: CancellationToken,
    what: &'static str,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    S: tower::Service<Request<Incoming>, Response = Response<B>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send,
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let activity = tracked.activity.clone();
    let peer = tracked.peer;
    let connection = builder.serve_connection(TokioIo::new(io), tracked);
    tokio::pin!(connection);
    // Once shutting down: when the connection is dropped if still open.
    let mut closing: Option<Instant> = None;
    loop {
        let check = match closing {
            Some(at) => at,
            None => activity
                .deadline()
                .unwrap_or_else(|| Instant::now() + HEADER_READ_TIMEOUT),
        };
        tokio::select! {
            result = connection.as_mut() => {
                if let Err(error) = result {
                    tracing::debug!(%error, %peer, listener = what, "connection ended");
                }
                break;
            }
            _ = stop.cancelled(), if closing.is_none() => {
                if !activity.started.load(Ordering::Acquire) {
                    break;
                }
                connection.as_mut().graceful_shutdown();
                closing = Some(Instant::now() + DRAIN_TIMEOUT);
            }
            _ = tokio::time::sleep_until(check.into()) => {
                if closing.is_some() {
                    break;
                }
                if activity.deadline().is_some_and(|d| d <= Instant::now()) {
                    // Without a request ever started there is nothing to finish
                    // (an HTTP/2 handshake never completed cannot take GOAWAY).
                    if !activity.started.load(Ordering::Acquire) {
                        break;
                    }
                    connection.as_mut().graceful_shutdown();
                    closing = Some(Instant::now() + DRAIN_TIMEOUT);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_fits_the_open_files_limit() {
        assert_eq!(fit_connections(4096, Some(1 << 20), 3), 4096);
        assert_eq!(fit_connections(4096, Some(1024), 3), 256);
        assert_eq!(fit_connections(4096, Some(100), 3), 16);
        assert_eq!(fit_connections(4096, None, 3), 4096);
    }

    #[test]
    fn a_connection_is_idle_only_without_requests_in_flight() {
        let activity = Arc::new(Activity::new());
        let fresh = activity.deadline().unwrap();
        assert!(fresh <= activity.opened + HEADER_READ_TIMEOUT);
        let busy = Busy::begin(&activity);
        assert_eq!(activity.deadline(), None, "a request in flight");
        drop(busy);
        let after = activity.deadline().unwrap();
        assert!(
            after >= activity.opened + IDLE_TIMEOUT,
            "after a request, the idle timeout applies"
        );
    }
}

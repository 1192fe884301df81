//! Serving connections with time limits: a client that sends its request headers or body
//! too slowly (a stalled or malicious one) is cut off instead of holding a connection and
//! its task for ever. `axum::serve` sets no such limits, so connections are served here with
//! hyper directly.
//!
//! With TLS (`--tls-cert`), each connection first does its handshake in its own task, within
//! [`TLS_HANDSHAKE_TIMEOUT`], then is served like a plain one, with the same limits. A plain
//! HTTP request to a TLS port gets a short 400 answer saying to use https.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls;
use tokio_rustls::server::TlsStream;
use tower::ServiceExt;

/// Time a client has to send the request line and headers.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest pause between two parts of a request body.
pub const BODY_IDLE_TIMEOUT: Duration = Duration::from_secs(15);
/// Time a client has to complete the TLS handshake (from the connection on).
pub const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Serve `app` over plain HTTP on `listener` until `shutdown` resolves, then let open
/// requests finish.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    serve_with(listener, app, None, shutdown).await
}

/// [`serve`], over TLS when `tls` is given (see [`super::tls::server_config`]).
pub async fn serve_with(
    listener: TcpListener,
    app: Router,
    tls: Option<Arc<rustls::ServerConfig>>,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let acceptor = tls.map(TlsAcceptor::from);
    // tells connections still in their TLS handshake that the server stops: they are
    // dropped rather than holding up the shutdown
    let (stopping, stop) = tokio::sync::watch::channel(false);
    let app = app.layer(tower_http::timeout::RequestBodyTimeoutLayer::new(
        BODY_IDLE_TIMEOUT,
    ));
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                // out of file descriptors and the like: wait a little, do not spin
                Err(e) => {
                    tracing::warn!(error = %e, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let service = TowerToHyperService::new(app.clone().map_request(
            |req: axum::http::Request<hyper::body::Incoming>| req.map(axum::body::Body::new),
        ));
        let mut builder = Builder::new(TokioExecutor::new());
        builder
            .http1()
            .timer(TokioTimer::new())
            .header_read_timeout(HEADER_READ_TIMEOUT);
        let Some(acceptor) = &acceptor else {
            let conn = builder.serve_connection_with_upgrades(TokioIo::new(stream), service);
            let conn = graceful.watch(conn.into_owned());
            tokio::spawn(async move {
                if let Err(e) = conn.await {
                    tracing::debug!(error = %e, "connection ended with an error");
                }
            });
            continue;
        };
        let acceptor = acceptor.clone();
        let watcher = graceful.watcher();
        let mut stop = stop.clone();
        tokio::spawn(async move {
            let stream = tokio::select! {
                s = tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, handshake(stream, acceptor)) => match s {
                    Ok(Some(s)) => s,
                    Ok(None) => return,
                    Err(_) => {
                        tracing::debug!(%peer, "TLS handshake timed out; connection closed");
                        return;
                    }
                },
                _ = stop.wait_for(|s| *s) => return,
            };
            let conn = builder.serve_connection_with_upgrades(TokioIo::new(stream), service);
            if let Err(e) = watcher.watch(conn.into_owned()).await {
                tracing::debug!(error = %e, "connection ended with an error");
            }
        });
    }
    let _ = stopping.send(true);
    // requests in flight get a while to finish
    tokio::select! {
        _ = graceful.shutdown() => {}
        _ = tokio::time::sleep(Duration::from_secs(10)) => {
            tracing::warn!("requests still running after 10 s at shutdown; closing them");
        }
    }
    Ok(())
}

/// The TLS handshake of a new connection; None when it fails (logged) or the client spoke
/// plain HTTP (answered with a 400 that says to use https).
async fn handshake(stream: TcpStream, acceptor: TlsAcceptor) -> Option<TlsStream<TcpStream>> {
    let mut first = [0u8; 1];
    match stream.peek(&mut first).await {
        Ok(1) => {}
        _ => return None,
    }
    // 0x16: a TLS handshake record; an HTTP request starts with its method's capital letters
    if first[0] != 0x16 {
        if first[0].is_ascii_uppercase() {
            answer_plain_http(stream).await;
        }
        return None;
    }
    match acceptor.accept(stream).await {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::debug!(error = %e, "TLS handshake failed");
            None
        }
    }
}

/// Answer a plain HTTP request on a TLS port: read its head, say 400 and why, close.
async fn answer_plain_http(mut stream: TcpStream) {
    let mut head = Vec::with_capacity(1024);
    let mut buf = [0u8; 1024];
    // the head is read before answering: closing with unread data would reset the
    // connection, and the client might never see the answer
    while head.len() < 16 * 1024 && !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    let host = String::from_utf8_lossy(&head)
        .lines()
        .find_map(|l| {
            let (name, value) = l.split_once(':')?;
            // echoed to the client only, in JSON; a bounded length all the same
            name.eq_ignore_ascii_case("host")
                .then(|| value.trim().chars().take(256).collect::<String>())
        })
        .unwrap_or_else(|| "this-server".into());
    let body = serde_json::json!({
        "error": "bad_request",
        "message": format!("this server speaks HTTPS only: use https://{host}, not http://"),
    })
    .to_string();
    let answer = format!(
        "HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = stream.write_all(answer.as_bytes()).await;
    let _ = stream.shutdown().await;
}

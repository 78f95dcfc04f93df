//! The HTTP client under `object_store`, counted: every attempt it sends
//! (so retries show as attempts beyond the requests asked for), and every
//! answer that tells a client to slow down (503 and 429, S3's `SlowDown`).
//! `object_store` retries inside one request, so these counts can only be
//! taken here.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use object_store::client::{
    ClientOptions, HttpClient, HttpConnector, HttpError, HttpRequest, HttpResponse, HttpService, ReqwestConnector,
};

/// Attempts and throttling answers, shared by a [`Remote`](crate::Remote)'s clones.
#[derive(Debug, Default)]
pub(crate) struct Wire {
    pub attempts: AtomicU64,
    pub throttles: AtomicU64,
    pub server_errors: AtomicU64,
    pub failed_connections: AtomicU64,
}

/// Makes `object_store`'s reqwest client and counts what passes through it.
#[derive(Debug)]
pub(crate) struct Counted(pub Arc<Wire>);

#[derive(Debug)]
struct Service {
    inner: HttpClient,
    wire: Arc<Wire>,
}

impl HttpConnector for Counted {
    fn connect(&self, options: &ClientOptions) -> object_store::Result<HttpClient> {
        let inner = ReqwestConnector::default().connect(options)?;
        Ok(HttpClient::new(Service { inner, wire: self.0.clone() }))
    }
}

#[async_trait::async_trait]
impl HttpService for Service {
    async fn call(&self, req: HttpRequest) -> Result<HttpResponse, HttpError> {
        self.wire.attempts.fetch_add(1, Relaxed);
        let out = self.inner.execute(req).await;
        match &out {
            Ok(r) if matches!(r.status().as_u16(), 429 | 503) => {
                self.wire.throttles.fetch_add(1, Relaxed);
            }
            Ok(r) if r.status().is_server_error() => {
                self.wire.server_errors.fetch_add(1, Relaxed);
            }
            Ok(_) => {}
            Err(_) => {
                self.wire.failed_connections.fetch_add(1, Relaxed);
            }
        }
        out
    }
}

//! One bucket prefix, reached through `object_store` on a small runtime of
//! the tier's own, with blocking calls for the engine's threads.
//!
//! Every request has a deadline (the retries included): a server that
//! stops answering is an error naming the object and range, never a hang.
//! `object_store` retries 5xx, 429 and connection errors with exponential
//! backoff, resumes a body cut mid-stream by range, and refreshes
//! credentials from the environment, instance or web-identity chains
//! before they expire.

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use futures::stream::{StreamExt, TryStreamExt};
use object_store::path::Path as ObjPath;
use object_store::{
    BackoffConfig, ClientOptions, GetOptions, GetRange, ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload,
    RetryConfig, UpdateVersion,
};

use crate::error::{Error, Result};
use crate::http::{Counted, Wire};

/// The tier's runtime: two worker threads, shared by every [`Remote`] of
/// the process. Requests are I/O-bound; the engine's own threads decode.
fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("zring-remote")
            .enable_all()
            .build()
            .expect("the remote tier's runtime starts")
    })
}

/// Counters of one [`Remote`]'s requests.
#[derive(Debug, Default)]
pub struct Counters {
    requests: AtomicU64,
    bytes_fetched: AtomicU64,
    bytes_uploaded: AtomicU64,
    errors: AtomicU64,
    wire: Arc<Wire>,
}

/// What a [`Remote`] has done, for `stats()`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Requests sent (GET, HEAD, PUT, LIST, DELETE; a retry inside one is not counted).
    pub requests: u64,
    /// Bytes of object bodies received.
    pub bytes_fetched: u64,
    /// Bytes of object bodies sent.
    pub bytes_uploaded: u64,
    /// Requests that failed after their retries.
    pub errors: u64,
    /// HTTP requests sent: every request, each of its retries, each
    /// resumption of a body cut mid-stream, and each page of a listing.
    pub attempts: u64,
    /// Answers that asked the client to slow down (503, 429, `SlowDown`);
    /// each was retried after a backoff.
    pub throttles: u64,
    /// Other 5xx answers (retried).
    pub server_errors: u64,
    /// Attempts that got no answer: refused or cut connections, timeouts.
    pub failed_connections: u64,
}

/// Credentials for S3 that the caller supplies ([`Remote::open_with`]):
/// asked for when the last ones are about to expire (a tenth of their
/// lifetime before, at most a minute), so a run outlives any one of them.
pub trait Credentials: Send + Sync + std::fmt::Debug + 'static {
    /// New credentials, or why there are none.
    fn fetch(&self) -> std::result::Result<Credential, String>;
}

/// What [`Credentials::fetch`] returns.
#[derive(Clone, Debug)]
pub struct Credential {
    pub key_id: String,
    pub secret_key: String,
    pub token: Option<String>,
    /// How long they stay valid; `None`: for good.
    pub valid_for: Option<Duration>,
}

/// [`Credentials`] as object_store asks for them, cached until they are
/// about to expire.
#[derive(Debug)]
struct Refreshing {
    source: Arc<dyn Credentials>,
    cached: tokio::sync::Mutex<Option<(Arc<object_store::aws::AwsCredential>, Option<std::time::Instant>)>>,
}

#[async_trait::async_trait]
impl object_store::CredentialProvider for Refreshing {
    type Credential = object_store::aws::AwsCredential;

    async fn get_credential(&self) -> object_store::Result<Arc<Self::Credential>> {
        let mut cached = self.cached.lock().await;
        if let Some((c, until)) = &*cached {
            if until.is_none_or(|u| std::time::Instant::now() < u) {
                return Ok(c.clone());
            }
        }
        let generic = |m: String| object_store::Error::Generic { store: "credentials", source: m.into() };
        let source = self.source.clone();
        let got = tokio::task::spawn_blocking(move || source.fetch())
            .await
            .map_err(|e| generic(e.to_string()))?
            .map_err(generic)?;
        let until = got.valid_for.map(|d| std::time::Instant::now() + d - (d / 10).min(Duration::from_secs(60)));
        let c = Arc::new(object_store::aws::AwsCredential {
            key_id: got.key_id,
            secret_key: got.secret_key,
            token: got.token,
        });
        *cached = Some((c.clone(), until));
        Ok(c)
    }
}

/// One ranged GET written into a local file ([`Remote::fetch_into`]).
#[derive(Debug)]
pub struct Fetch {
    /// The object's key and the ETag it must still have.
    pub key: String,
    pub etag: String,
    /// The bytes, written at the same offsets of `file`.
    pub range: Range<u64>,
    pub file: Arc<std::fs::File>,
    /// The file's path, as errors name it.
    pub path: std::path::PathBuf,
}

/// An object's size and version.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectInfo {
    /// The object's key relative to the [`Remote`]'s prefix.
    pub key: String,
    pub size: u64,
    /// The ETag, as the server gives it (quotes included); empty if none.
    pub etag: String,
}

/// How a conditional write went.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Put {
    /// Written; the new ETag.
    Done(String),
    /// The object was not in the state expected (another writer won).
    Conflict,
}

/// The bytes of a cache line by default: the unit a line cache fetches,
/// keeps and evicts (neighbours go as one GET of up to 8 MiB). Small
/// enough that a mode-3 block (a few MiB) wastes little at its edges, where
/// a line is shared with the next block.
pub const LINE_BYTES: u64 = 256 << 10;

/// Options of the tier itself (the rest go to the store's builder).
const OWN_OPTIONS: [&str; 6] =
    ["timeout", "connect_timeout", "max_retries", "retry_timeout", "cache_line_bytes", "cache_eviction"];

/// A prefix in a bucket (`s3://bucket/a/b`, `gs://`, `az://`, `file://`).
#[derive(Clone, Debug)]
pub struct Remote {
    store: Arc<dyn ObjectStore>,
    prefix: ObjPath,
    url: String,
    deadline: Duration,
    line: u64,
    lru: bool,
    counters: Arc<Counters>,
}

/// Whether `s` names an object-storage location rather than a local path.
pub fn is_url(s: &str) -> bool {
    ["s3://", "s3a://", "gs://", "gcs://", "az://", "abfs://", "abfss://", "azure://", "file://"]
        .iter()
        .any(|p| s.starts_with(p))
}

fn parse_secs(key: &str, v: &str) -> Result<Duration> {
    let s: f64 = v.trim_end_matches('s').parse().ok().filter(|s: &f64| s.is_finite() && *s > 0.0).ok_or_else(|| {
        Error::InvalidArgument(format!("storage option {key}={v:?}: a positive number of seconds, such as \"30\""))
    })?;
    Ok(Duration::from_secs_f64(s))
}

impl Remote {
    /// The prefix at `url`. `options` go to the store's builder as
    /// configuration keys (`aws_endpoint`, `aws_region`,
    /// `aws_access_key_id`, `google_service_account`, ...), over what the
    /// environment gives; `timeout` (per request, default 30 s),
    /// `connect_timeout` (5 s), `max_retries` (10) and `retry_timeout`
    /// (120 s, the deadline of a request and its retries),
    /// `cache_line_bytes` (256 KiB, the unit a line cache keeps) and
    /// `cache_eviction` (`next_use`, or `lru` to compare) are the tier's.
    /// An `http://` endpoint allows plain HTTP.
    pub fn open(url: &str, options: &[(String, String)]) -> Result<Remote> {
        Remote::open_with(url, options, None)
    }

    /// [`Remote::open`] signing with `credentials` (S3 only) instead of
    /// the environment's and the instance's chains.
    pub fn open_with(
        url: &str,
        options: &[(String, String)],
        credentials: Option<Arc<dyn Credentials>>,
    ) -> Result<Remote> {
        // TLS through rustls with ring (see Cargo.toml); an error means a
        // provider is installed already, which serves as well. Deprecated
        // as ring has no post-quantum key exchange, which no object store
        // requires; aws-lc-rs, which has it, costs a C build of minutes.
        #[allow(deprecated)]
        let _ = rustls::crypto::ring::default_provider().install_default();
        let parsed = url::Url::parse(url)
            .map_err(|e| Error::InvalidArgument(format!("{url:?} is not a URL: {e} (expected s3://bucket/path)")))?;
        let mut client = ClientOptions::new().with_timeout(Duration::from_secs(30));
        let mut retry = RetryConfig {
            backoff: BackoffConfig {
                init_backoff: Duration::from_millis(100),
                max_backoff: Duration::from_secs(15),
                base: 2.0,
            },
            max_retries: 10,
            retry_timeout: Duration::from_secs(120),
        };
        client = client.with_connect_timeout(Duration::from_secs(5));
        // An endpoint given as http:// (a server on the host or the
        // cluster's network) is meant: plain HTTP is allowed for it.
        let http_env = ["AWS_ENDPOINT", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"]
            .iter()
            .any(|k| std::env::var(k).is_ok_and(|v| v.starts_with("http://")));
        if http_env {
            client = client.with_allow_http(true);
        }
        let mut rest = Vec::new();
        let mut line = LINE_BYTES;
        let mut lru = false;
        for (k, v) in options {
            match k.as_str() {
                "cache_eviction" => {
                    lru = match v.as_str() {
                        "next_use" => false,
                        "lru" => true,
                        _ => {
                            return Err(Error::InvalidArgument(format!(
                            "storage option cache_eviction={v:?}: \"next_use\" (the default) or \"lru\" (to compare)"
                        )))
                        }
                    }
                }
                "cache_line_bytes" => {
                    line = v.parse().ok().filter(|l: &u64| *l >= 4096 && l.is_multiple_of(4096)).ok_or_else(|| {
                        Error::InvalidArgument(format!(
                            "storage option cache_line_bytes={v:?}: a multiple of 4096, such as \"8388608\" (8 MiB)"
                        ))
                    })?
                }
                "timeout" => client = client.with_timeout(parse_secs(k, v)?),
                "connect_timeout" => client = client.with_connect_timeout(parse_secs(k, v)?),
                "retry_timeout" => retry.retry_timeout = parse_secs(k, v)?,
                "max_retries" => {
                    retry.max_retries = v.parse().map_err(|_| {
                        Error::InvalidArgument(format!("storage option max_retries={v:?}: a count, such as \"10\""))
                    })?
                }
                _ => {
                    if v.starts_with("http://") && k.contains("endpoint") {
                        client = client.with_allow_http(true);
                    }
                    rest.push((k.clone(), v.clone()));
                }
            }
        }
        let deadline = retry.retry_timeout + Duration::from_secs(30);
        let bad_key = |k: &str, _: object_store::Error| {
            Error::InvalidArgument(format!(
                "storage option {k:?} is not one {}:// knows (see the object_store crate's configuration keys, \
                 such as aws_endpoint or aws_region); the tier's own are {}",
                parsed.scheme(),
                OWN_OPTIONS.join(", ")
            ))
        };
        let counters = Arc::new(Counters::default());
        let connector = || Counted(counters.wire.clone());
        let built = |e: object_store::Error| Error::Store { url: url.to_string(), range: String::new(), source: e };
        // The clouds' builders are types of their own with the same calls:
        // the storage options applied, then the tier's client, retries and
        // counted HTTP connector.
        macro_rules! configured {
            ($builder:expr) => {{
                let mut b = $builder;
                for (k, v) in &rest {
                    b = b.with_config(k.parse().map_err(|e| bad_key(k, e))?, v);
                }
                b
            }};
        }
        macro_rules! store {
            ($builder:expr) => {{
                let s = $builder
                    .with_client_options(client)
                    .with_retry(retry)
                    .with_http_connector(connector())
                    .build()
                    .map_err(built)?;
                (Arc::new(s) as Arc<dyn ObjectStore>, parsed.path().to_string())
            }};
        }
        let (store, prefix): (Arc<dyn ObjectStore>, String) = match parsed.scheme() {
            "s3" | "s3a" => {
                let mut b = configured!(object_store::aws::AmazonS3Builder::from_env().with_url(url));
                if let Some(source) = credentials.clone() {
                    b = b.with_credentials(Arc::new(Refreshing { source, cached: Default::default() }));
                }
                store!(b)
            }
            scheme if credentials.is_some() && !matches!(scheme, "s3" | "s3a") => {
                return Err(Error::InvalidArgument(format!(
                    "{url:?}: a credentials callable signs s3:// requests; for {scheme}:// give the store's keys \
                     in storage_options (or its environment variables)"
                )))
            }
            "gs" | "gcs" => store!(configured!(object_store::gcp::GoogleCloudStorageBuilder::from_env().with_url(url))),
            "az" | "abfs" | "abfss" | "azure" => {
                store!(configured!(object_store::azure::MicrosoftAzureBuilder::from_env().with_url(url)))
            }
            "file" => {
                if let Some((k, _)) = rest.first() {
                    return Err(Error::InvalidArgument(format!("storage option {k:?}: file:// URLs take none")));
                }
                (Arc::new(object_store::local::LocalFileSystem::new()), parsed.path().to_string())
            }
            other => {
                return Err(Error::InvalidArgument(format!(
                    "{url:?}: scheme {other}:// is not supported (s3://, gs://, az:// or file://)"
                )))
            }
        };
        let prefix = ObjPath::parse(prefix.trim_matches('/'))
            .map_err(|e| Error::InvalidArgument(format!("{url:?}: not an object path: {e}")))?;
        Ok(Remote { store, prefix, url: url.trim_end_matches('/').to_string(), deadline, line, lru, counters })
    }

    /// The bytes of a cache line (storage option `cache_line_bytes`,
    /// default 256 KiB).
    pub fn line(&self) -> u64 {
        self.line
    }

    /// Whether a line cache evicts the least recently used line rather
    /// than the one needed furthest ahead (storage option
    /// `cache_eviction="lru"`, for comparison).
    pub fn lru(&self) -> bool {
        self.lru
    }

    /// The URL of the prefix (no trailing slash).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The URL of `key` under the prefix, as errors name it.
    pub fn url_of(&self, key: &str) -> String {
        format!("{}/{key}", self.url)
    }

    /// What this `Remote` (and its clones) has done.
    pub fn stats(&self) -> Stats {
        let c = &self.counters;
        Stats {
            requests: c.requests.load(Relaxed),
            bytes_fetched: c.bytes_fetched.load(Relaxed),
            bytes_uploaded: c.bytes_uploaded.load(Relaxed),
            errors: c.errors.load(Relaxed),
            attempts: c.wire.attempts.load(Relaxed),
            throttles: c.wire.throttles.load(Relaxed),
            server_errors: c.wire.server_errors.load(Relaxed),
            failed_connections: c.wire.failed_connections.load(Relaxed),
        }
    }

    fn path(&self, key: &str) -> ObjPath {
        key.split('/').filter(|s| !s.is_empty()).fold(self.prefix.clone(), |p, s| p.clone().join(s))
    }

    fn key_of(&self, p: &ObjPath) -> String {
        p.prefix_match(&self.prefix)
            .map(|parts| parts.map(|s| s.as_ref().to_string()).collect::<Vec<_>>().join("/"))
            .unwrap_or_else(|| p.to_string())
    }

    /// `fut` within the deadline, its error naming `key` and `range`; counted.
    fn guarded<T>(
        &self,
        key: &str,
        range: Option<&Range<u64>>,
        fut: impl std::future::Future<Output = std::result::Result<T, object_store::Error>>,
    ) -> impl std::future::Future<Output = Result<T>> {
        self.counters.requests.fetch_add(1, Relaxed);
        let (deadline, counters, url) = (self.deadline, self.counters.clone(), self.url_of(key));
        let r = range.map(|r| format!(" bytes {}..{}", r.start, r.end)).unwrap_or_default();
        async move {
            let out = tokio::time::timeout(deadline, fut).await;
            if !matches!(out, Ok(Ok(_))) {
                counters.errors.fetch_add(1, Relaxed);
            }
            match out {
                Ok(Ok(v)) => Ok(v),
                Ok(Err(object_store::Error::NotFound { .. })) => Err(Error::NotFound { url }),
                Ok(Err(e)) => Err(Error::Store { url, range: r, source: e }),
                Err(_) => Err(Error::Timeout { url, range: r, seconds: deadline.as_secs() }),
            }
        }
    }

    /// [`Remote::guarded`] on the tier's runtime, from a thread outside it.
    fn run<T: Send + 'static>(
        &self,
        key: &str,
        range: Option<&Range<u64>>,
        fut: impl std::future::Future<Output = std::result::Result<T, object_store::Error>> + Send + 'static,
    ) -> Result<T> {
        let g = self.guarded(key, range, fut);
        runtime().block_on(g)
    }

    /// The size and ETag of `key`.
    pub fn head(&self, key: &str) -> Result<ObjectInfo> {
        let (store, path) = (self.store.clone(), self.path(key));
        let meta = self.run(key, None, async move { store.head(&path).await })?;
        Ok(ObjectInfo { key: key.to_string(), size: meta.size, etag: meta.e_tag.unwrap_or_default() })
    }

    /// The whole of `key`, or `None` if there is no such object.
    pub fn get(&self, key: &str) -> Result<Option<(Bytes, ObjectInfo)>> {
        let (store, path) = (self.store.clone(), self.path(key));
        let got = self.run(key, None, async move {
            let r = store.get(&path).await?;
            let meta = r.meta.clone();
            Ok((r.bytes().await?, meta))
        });
        match got {
            Ok((bytes, meta)) => {
                self.counters.bytes_fetched.fetch_add(bytes.len() as u64, Relaxed);
                Ok(Some((bytes, ObjectInfo { key: key.into(), size: meta.size, etag: meta.e_tag.unwrap_or_default() })))
            }
            Err(Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Every object under `sub` (a key prefix ending in `/`, or empty for
    /// the whole prefix), recursively.
    pub fn list(&self, sub: &str) -> Result<Vec<ObjectInfo>> {
        let (store, path) = (self.store.clone(), self.path(sub));
        let metas = self.run(sub, None, async move { store.list(Some(&path)).try_collect::<Vec<_>>().await })?;
        Ok(metas
            .into_iter()
            .map(|m| ObjectInfo { key: self.key_of(&m.location), size: m.size, etag: m.e_tag.unwrap_or_default() })
            .collect())
    }

    /// Writes `bytes` to `key` (replacing any object there); its ETag.
    pub fn put(&self, key: &str, bytes: Bytes) -> Result<String> {
        self.put_mode(key, bytes, PutMode::Overwrite).map(|p| match p {
            Put::Done(e) => e,
            Put::Conflict => unreachable!("an unconditional put has no conflict"),
        })
    }

    /// Writes `bytes` to `key` only if the object there has ETag `expect`,
    /// or, with `None`, only if there is none: how two committers of one
    /// manifest never lose each other's parts.
    pub fn put_if(&self, key: &str, bytes: Bytes, expect: Option<&str>) -> Result<Put> {
        let mode = match expect {
            None => PutMode::Create,
            Some(e) => PutMode::Update(UpdateVersion { e_tag: Some(e.to_string()), version: None }),
        };
        self.put_mode(key, bytes, mode)
    }

    fn put_mode(&self, key: &str, bytes: Bytes, mode: PutMode) -> Result<Put> {
        let (store, path) = (self.store.clone(), self.path(key));
        let n = bytes.len() as u64;
        let opts = PutOptions { mode, ..Default::default() };
        let out = self.run(key, None, async move { store.put_opts(&path, PutPayload::from_bytes(bytes), opts).await });
        match out {
            Ok(r) => {
                self.counters.bytes_uploaded.fetch_add(n, Relaxed);
                Ok(Put::Done(r.e_tag.unwrap_or_default()))
            }
            Err(Error::Store {
                source: object_store::Error::Precondition { .. } | object_store::Error::AlreadyExists { .. },
                ..
            }) => Ok(Put::Conflict),
            Err(Error::NotFound { .. }) => Ok(Put::Conflict),
            Err(e) => Err(e),
        }
    }

    /// Uploads the local file `path` to `key`, in parts of 16 MiB when it
    /// is larger than that (a multipart upload, completed only when every
    /// part is in: a failed upload leaves no object).
    pub fn put_file(&self, key: &str, path: &std::path::Path) -> Result<String> {
        let data = std::fs::read(path).map_err(crate::error::io_err("read", path))?;
        const PART: usize = 16 << 20;
        if data.len() <= PART {
            return self.put(key, Bytes::from(data));
        }
        let (store, opath) = (self.store.clone(), self.path(key));
        let n = data.len() as u64;
        let data = Bytes::from(data);
        let r = self.run(key, None, async move {
            let mut up = store.put_multipart(&opath).await?;
            let mut off = 0;
            while off < data.len() {
                let end = (off + PART).min(data.len());
                if let Err(e) = up.put_part(PutPayload::from_bytes(data.slice(off..end))).await {
                    let _ = up.abort().await;
                    return Err(e);
                }
                off = end;
            }
            up.complete().await
        })?;
        self.counters.bytes_uploaded.fetch_add(n, Relaxed);
        Ok(r.e_tag.unwrap_or_default())
    }

    /// Removes `key` (an object already gone is not an error).
    pub fn delete(&self, key: &str) -> Result<()> {
        let (store, path) = (self.store.clone(), self.path(key));
        match self.run(key, None, async move { store.delete(&path).await }) {
            Ok(()) | Err(Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Fetches every job's range into its file, up to `parallel` GETs in
    /// flight across all jobs, each body written at its offset chunk by
    /// chunk as it arrives, on the tier's runtime threads (no copy of the
    /// whole body, no single writing thread). `done(job)` is called on the
    /// calling thread as each job completes. The first error stops it.
    pub fn fetch_into(
        &self,
        jobs: Vec<Fetch>,
        parallel: usize,
        mut done: impl FnMut(usize, &Fetch) -> Result<()>,
    ) -> Result<()> {
        let jobs: Vec<Arc<Fetch>> = jobs.into_iter().map(Arc::new).collect();
        let mut pending = jobs.iter().cloned().enumerate();
        runtime().block_on(async {
            let mut inflight = futures::stream::FuturesUnordered::new();
            loop {
                while inflight.len() < parallel.max(1) {
                    let Some((i, job)) = pending.next() else { break };
                    let fut = self.fetch_one(job);
                    inflight.push(async move { (i, tokio::spawn(fut).await) });
                }
                let Some((i, joined)) = inflight.next().await else { return Ok(()) };
                joined.map_err(|e| Error::InvalidArgument(format!("a fetch task failed: {e}")))??;
                done(i, &jobs[i])?;
            }
        })
    }

    fn fetch_one(&self, job: Arc<Fetch>) -> impl std::future::Future<Output = Result<()>> + Send + 'static {
        use std::os::unix::fs::FileExt;
        let (store, path) = (self.store.clone(), self.path(&job.key));
        let opts = GetOptions {
            range: Some(GetRange::Bounded(job.range.clone())),
            if_match: (!job.etag.is_empty()).then(|| job.etag.clone()),
            ..Default::default()
        };
        self.counters.requests.fetch_add(1, Relaxed);
        let (deadline, counters, url) = (self.deadline, self.counters.clone(), self.url_of(&job.key));
        async move {
            let r = &job.range;
            let where_ = format!(" bytes {}..{}", r.start, r.end);
            let body = async {
                let got = store.get_opts(&path, opts).await.map_err(Err)?;
                let mut stream = got.into_stream();
                let mut at = r.start;
                while let Some(chunk) = stream.next().await {
                    let chunk = chunk.map_err(Err)?;
                    if at + chunk.len() as u64 > r.end {
                        return Err(Ok(at + chunk.len() as u64 - r.start));
                    }
                    job.file
                        .write_all_at(&chunk, at)
                        .map_err(|e| Err(object_store::Error::Generic { store: "cache", source: Box::new(e) }))?;
                    at += chunk.len() as u64;
                }
                if at != r.end {
                    return Err(Ok(at - r.start));
                }
                Ok(at - r.start)
            };
            let out = tokio::time::timeout(deadline, body).await;
            match out {
                Ok(Ok(n)) => {
                    counters.bytes_fetched.fetch_add(n, Relaxed);
                    Ok(())
                }
                Ok(Err(Ok(n))) => {
                    counters.errors.fetch_add(1, Relaxed);
                    Err(Error::Stale { url, detail: format!("{} came back {n} B long", where_.trim()) })
                }
                Ok(Err(Err(object_store::Error::Precondition { .. }))) => {
                    counters.errors.fetch_add(1, Relaxed);
                    Err(Error::Stale { url, detail: format!("ETag {} when listed, another now", job.etag) })
                }
                Ok(Err(Err(object_store::Error::NotFound { .. }))) => {
                    counters.errors.fetch_add(1, Relaxed);
                    Err(Error::NotFound { url })
                }
                Ok(Err(Err(object_store::Error::Generic { store: "cache", source }))) => {
                    counters.errors.fetch_add(1, Relaxed);
                    Err(Error::Io { op: "write", path: job.path.clone(), source: std::io::Error::other(source) })
                }
                Ok(Err(Err(e))) => {
                    counters.errors.fetch_add(1, Relaxed);
                    Err(Error::Store { url, range: where_, source: e })
                }
                Err(_) => {
                    counters.errors.fetch_add(1, Relaxed);
                    Err(Error::Timeout { url, range: where_, seconds: deadline.as_secs() })
                }
            }
        }
    }
}

//! What can go wrong between a host and a bucket, each error naming the
//! object (and the byte range) it is about.

use std::path::PathBuf;

/// An error of the remote tier.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The URL or an option is not one zring can use.
    #[error("{0}")]
    InvalidArgument(String),
    /// The object is not there.
    #[error("{url}: no such object")]
    NotFound { url: String },
    /// The object changed after this host listed it (its ETag or its
    /// length differs): what was read of it may belong to another version.
    #[error(
        "{url} was replaced while it was being read ({detail}): the dataset changed under the run; open it again \
         to read the new version"
    )]
    Stale { url: String, detail: String },
    /// No answer within the deadline (after the retries).
    #[error("{url}{range}: no answer within {seconds} s (the server or the network is not answering)")]
    Timeout { url: String, range: String, seconds: u64 },
    /// The cache cannot hold what was asked of it.
    #[error("{0}")]
    CacheTooSmall(String),
    /// Two committers raced more often than a commit retries.
    #[error("{0}")]
    Conflict(String),
    /// The store or the request failed (after the retries).
    #[error("{url}{range}: {source}")]
    Store {
        url: String,
        range: String,
        #[source]
        source: object_store::Error,
    },
    /// A local file of the cache.
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The engine refused what was fetched or staged.
    #[error(transparent)]
    Engine(#[from] zring_engine::Error),
}

/// The remote tier's result.
pub type Result<T> = std::result::Result<T, Error>;

pub(crate) fn io_err(op: &'static str, path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> Error {
    let path = path.into();
    move |source| Error::Io { op, path, source }
}

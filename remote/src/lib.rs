//! zring's object-storage tier: datasets in S3, GCS or Azure Blob.
//!
//! - [`Remote`]: a prefix in a bucket, through the `object_store` crate on
//!   a small runtime of the tier's own (`client.rs`). The engine's read
//!   path does not change: it reads local files with io_uring.
//! - [`stage`]: a host's share of a dataset copied into a per-host cache
//!   folder laid out as the dataset, within a hard cap (`cache.rs`).
//! - [`LineCache`]: a share larger than the cap, its chunk files filled
//!   line by line as a mode-3 loader reads them, evicting what it needs
//!   furthest in the future (`lines.rs`).
//! - [`commit`]: parts uploaded by many writers committed by one driver
//!   with a conditional write of the manifest (`commit.rs`).

mod cache;
mod client;
mod commit;
mod error;
mod http;
mod lines;

pub use cache::{cache_name, hold, stage, Hold, StageOptions, Staged};
pub use client::{is_url, Credential, Credentials, Fetch, ObjectInfo, Put, Remote, Stats};
pub use commit::{commit, remove_unlisted, upload_part, upload_store, Committed, NewPart};
pub use error::{Error, Result};
pub use lines::{Filler, LineCache, LineStats};

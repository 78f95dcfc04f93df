//! Gathers: the plan of a batch of reads, its transfers, and the snapshot
//! they read from. Where each record lands, checked ([`slots`]); gathers from
//! one store's snapshot ([`snapshot`]) and over many (a dataset's parts,
//! [`over`]); and the transfers both end in ([`items`]).

mod items;
mod over;
mod slots;
mod snapshot;

pub use self::items::helped_ns;
pub(crate) use self::items::{read_items, read_items_by_block};
#[cfg(test)]
pub(crate) use self::over::MAPPED_GATHERS;
pub(crate) use self::over::{flush_mapped, gather_mapped, gather_over, Dense, Source};
pub(crate) use self::snapshot::{codecs, gather, lengths, read_spans, record_len};

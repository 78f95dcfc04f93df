//! The read requests. A gather ([`Gather`]) reads whole records: which
//! records, where each goes in the destination buffer, when each is needed
//! next, and whether the call may share its work with the decode pool. A
//! read of spans ([`Spans`]) reads parts of records.

use crate::memory::cache::NextUse;

/// Where a gather puts each record in its destination buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Slots<'a> {
    /// Record `k` at `dst[k * stride..][..stride]`, zero-padded after the
    /// record; the destination is exactly `indices.len() * stride` bytes.
    Fixed(usize),
    /// Record `k` at `dst[starts[k]..]`, at its own logical length
    /// ([`crate::Store::lengths`]). Slots lie inside the destination and do
    /// not overlap.
    Ragged(&'a [u64]),
    /// Record `k` at `dst[starts[k]..][..width]`, zero-padded after the
    /// record: fixed-width rows placed anywhere (a mixture's interleaved
    /// rows). Slots lie inside the destination and do not overlap.
    FixedAt {
        /// The width of every slot in bytes.
        width: usize,
        /// Where each slot starts.
        starts: &'a [u64],
    },
}

/// One gather: read records `indices` into their [`Slots`].
///
/// Every index and entry is checked before anything is written to the
/// destination. Build it with [`Gather::fixed`], [`Gather::ragged`] or
/// [`Gather::fixed_at`], then add hints or turn fan-out off:
///
/// ```no_run
/// # fn main() -> zring_engine::Result<()> {
/// use zring_engine::{Gather, NextUse, Store};
/// let store = Store::builder("data.zr").open()?;
/// let mut dst = vec![0u8; 2 * 64];
/// let next = [NextUse::At(3), NextUse::Never];
/// store.gather(&Gather::fixed(&[7, 2], 64).hints(&next), &mut dst)?;
/// # Ok(()) }
/// ```
#[derive(Clone, Copy, Debug)]
pub struct Gather<'a> {
    /// The records to read.
    pub indices: &'a [u64],
    /// Where each record goes.
    pub slots: Slots<'a>,
    /// When each record is needed next (`next[k]` for `indices[k]`; empty
    /// says nothing). When the record cache is full it keeps the records
    /// needed soonest and drops those not needed again this cycle first. A
    /// data loader knows this from its sampler. Without a record cache
    /// (buffered reads) the hints are ignored.
    pub next: &'a [NextUse],
    /// Whether the call may share its reads and decoding with the decode
    /// pool (the default) or does all of it on the calling thread. A caller
    /// that already runs as many gathers at once as there are cores (a
    /// loader's workers, say) gains nothing from the pool: handing work to
    /// it only puts more threads than cores on the decoding.
    pub fan_out: bool,
}

impl<'a> Gather<'a> {
    /// Records into slots of `stride` bytes, back to back ([`Slots::Fixed`]).
    pub fn fixed(indices: &'a [u64], stride: usize) -> Self {
        Gather { indices, slots: Slots::Fixed(stride), next: &[], fan_out: true }
    }

    /// Records at their own lengths, record `k` at `starts[k]`
    /// ([`Slots::Ragged`]).
    pub fn ragged(indices: &'a [u64], starts: &'a [u64]) -> Self {
        Gather { indices, slots: Slots::Ragged(starts), next: &[], fan_out: true }
    }

    /// Records into slots of `width` bytes at `starts` ([`Slots::FixedAt`]).
    pub fn fixed_at(indices: &'a [u64], width: usize, starts: &'a [u64]) -> Self {
        Gather { indices, slots: Slots::FixedAt { width, starts }, next: &[], fan_out: true }
    }

    /// The same request with next-use hints ([`Gather::next`]).
    pub fn hints(self, next: &'a [NextUse]) -> Self {
        Gather { next, ..self }
    }

    /// The same request with fan-out on or off ([`Gather::fan_out`]).
    pub fn fan_out(self, on: bool) -> Self {
        Gather { fan_out: on, ..self }
    }
}

/// A part of one record: bytes `from .. from + len` of record `index` (of
/// its logical, decoded bytes), read to `dst[at..at + len]` ([`Spans`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span {
    /// The record.
    pub index: u64,
    /// The first byte of the record to read.
    pub from: u64,
    /// How many bytes to read.
    pub len: u64,
    /// Where they go in the destination buffer.
    pub at: u64,
}

/// One read of parts of records ([`Span`]): what a packer of long
/// documents reads when a row holds only a piece of one.
///
/// What a span costs, and what is checked, depends on how its record is
/// stored:
///
/// * A raw record: a span of at least half of the record's stored bytes
///   reads the whole record and checks its checksum, then copies the span;
///   a shorter span reads only its own bytes, and those are **not**
///   checked against the record's checksum, which covers the whole record
///   (`Store::verify` scans every record whole). Either way a span reads
///   at most twice its own bytes.
/// * A compressed record (zstd): the whole record is read, checked and
///   decoded, once per call however many of its spans the call holds, and
///   the spans copied from it. A caller that reads a long compressed record
///   piece by piece over many calls keeps the decoded record itself (the
///   loader's packer keeps one per worker).
///
/// Every index and span is checked before anything is written to the
/// destination; spans lie inside it and do not overlap. Spans bypass the
/// record cache (a part of a record is not a record to keep); whole-record
/// reads go through it as a gather's do.
///
/// ```no_run
/// # fn main() -> zring_engine::Result<()> {
/// use std::sync::Arc;
/// use zring_engine::{Span, Spans, Store};
/// let store = Arc::new(Store::builder("tokens.zr").open()?);
/// // 4,096 bytes from the middle of record 3, then the start of record 4.
/// let spans = [Span { index: 3, from: 1 << 20, len: 4096, at: 0 }, Span { index: 4, from: 0, len: 100, at: 4096 }];
/// let mut dst = vec![0u8; 4196];
/// store.view().read_spans(&Spans::new(&spans), &mut dst)?;
/// # Ok(()) }
/// ```
#[derive(Clone, Copy, Debug)]
pub struct Spans<'a> {
    /// The parts to read.
    pub spans: &'a [Span],
    /// Whether the call may share its reads with the decode pool
    /// ([`Gather::fan_out`]).
    pub fan_out: bool,
}

impl<'a> Spans<'a> {
    /// A read of `spans`, fan-out on.
    pub fn new(spans: &'a [Span]) -> Self {
        Spans { spans, fan_out: true }
    }

    /// The same request with fan-out on or off ([`Spans::fan_out`]).
    pub fn fan_out(self, on: bool) -> Self {
        Spans { fan_out: on, ..self }
    }
}

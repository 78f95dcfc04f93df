//! One record to read ([`Item`]): where it is and where it goes; carving
//! items out of a buffer ([`carve`], [`carve_at`]); and turning its stored
//! bytes into the record, checked ([`finish_record`]).

use crate::error::{corrupted, Error, Result};
use crate::format::codec::{self, Codec, Dict};
use crate::format::names::chunk_name;
use crate::format::record::Entry;
use crate::format::table::Format;
use crate::memory::cache::NextUse;

/// One record to read: where it is and where it goes.
pub(crate) struct Item<'a> {
    pub index: u64,
    pub entry: Entry,
    /// Exactly the record's logical length, or its stored length with `keep_stored`.
    pub dst: &'a mut [u8],
    /// Copy the stored bytes without decoding (compaction, import).
    pub keep_stored: bool,
    /// A part of a raw record ([`crate::Span`]): `entry` names just the
    /// bytes to read (no checksum), `keep_stored` is set, and unlike
    /// compaction's copies the read counts as a read.
    pub span: bool,
    /// When the caller needs the record again (for the record cache).
    pub next: NextUse,
}

/// A record to read, before it has its slot ([`carve`], [`carve_at`]).
pub(crate) struct Want {
    pub index: u64,
    pub entry: Entry,
    /// The slot's length: the record's logical length, or its stored length
    /// with `keep_stored`.
    pub len: usize,
    pub keep_stored: bool,
    pub span: bool,
    pub next: NextUse,
}

impl Want {
    /// Record `index` at `entry`, decoded, with no hint.
    pub fn logical(index: u64, entry: Entry) -> Want {
        Want { index, entry, len: entry.logical_len as usize, keep_stored: false, span: false, next: NextUse::Unknown }
    }

    /// Record `index` at `entry` as stored (compaction, import, blocks).
    pub fn stored(index: u64, entry: Entry) -> Want {
        Want { index, entry, len: entry.stored_len as usize, keep_stored: true, span: false, next: NextUse::Unknown }
    }

    /// Bytes `from .. from + len` of raw record `index` at `entry`, read as
    /// they are stored and unchecked ([`crate::Span`]).
    pub fn span(index: u64, entry: Entry, from: u64, len: u32) -> Want {
        let bytes = Entry {
            offset: entry.offset + u64::from(entry.within) + from,
            stored_len: len,
            logical_len: len,
            checksum: None,
            within: 0,
            ..entry
        };
        Want { index, entry: bytes, len: len as usize, keep_stored: true, span: true, next: NextUse::Unknown }
    }
}

/// The items of `wants` read into `buf` back to back, in the order given.
/// `buf` must hold them all.
pub(crate) fn carve(buf: &mut [u8], wants: impl IntoIterator<Item = Want>) -> Vec<Item<'_>> {
    let mut at = 0u64;
    carve_at(
        buf,
        wants.into_iter().map(|w| {
            let start = at;
            at += w.len as u64;
            (start, w)
        }),
    )
}

/// The items of `wants`, each read into `buf` at its start: starts in
/// ascending order, slots not overlapping and inside `buf`.
pub(crate) fn carve_at(buf: &mut [u8], wants: impl IntoIterator<Item = (u64, Want)>) -> Vec<Item<'_>> {
    let wants = wants.into_iter();
    let mut items = Vec::with_capacity(wants.size_hint().0);
    let mut rest: &mut [u8] = buf;
    let mut pos = 0u64;
    for (start, w) in wants {
        let (_, tail) = std::mem::take(&mut rest).split_at_mut((start - pos) as usize);
        let (slot, tail) = tail.split_at_mut(w.len);
        rest = tail;
        pos = start + w.len as u64;
        items.push(Item {
            index: w.index,
            entry: w.entry,
            dst: slot,
            keep_stored: w.keep_stored,
            span: w.span,
            next: w.next,
        });
    }
    items
}

pub(crate) fn crc_check(index: u64, e: &Entry, stored: &[u8]) -> Result<()> {
    match e.checksum {
        Some(_) => crc_matches(index, e, crate::format::crc::crc32c(stored)),
        None => Ok(()),
    }
}

/// `got`, the CRC-32C of record `index`'s stored bytes, against its entry's.
pub(crate) fn crc_matches(index: u64, e: &Entry, got: u32) -> Result<()> {
    if let Some(expected) = e.checksum {
        if got != expected {
            let file = chunk_name(Format::Native, e.chunk);
            let file = if e.is_part() {
                format!("{file} (the block of bytes {}..{} holding it)", e.offset, e.end())
            } else {
                format!("{file} (bytes {}..{})", e.offset, e.end())
            };
            return Err(Error::ChecksumMismatch { record: index, file, expected, got });
        }
    }
    Ok(())
}

/// Verifies and decodes one record's stored bytes into its slot.
///
/// A raw record stored whole is copied and checked in one pass
/// ([`crate::format::crc::copy_crc32c`]). Otherwise the decode runs first
/// and the checksum after it: the first pass over the stored bytes pays for
/// bringing them from memory, the second finds them in the CPU cache.
/// Decoding unverified bytes is safe (zstd checks its input); a mismatch
/// still fails the call, with the slot's contents undefined.
pub(crate) fn finish_record(it: &mut Item<'_>, stored: &[u8], dict: Option<&Dict>) -> Result<()> {
    let codec = if it.keep_stored { Codec::Raw } else { it.entry.codec };
    let whole = it.keep_stored || !it.entry.is_part();
    if codec == Codec::Raw && whole && it.entry.checksum.is_some() && stored.len() == it.dst.len() {
        let got = crate::format::crc::copy_crc32c(stored, it.dst);
        return crc_matches(it.index, &it.entry, got);
    }
    let src = if it.entry.is_part() && !it.keep_stored {
        // A record inside a checksummed block: the whole block is verified.
        let at = it.entry.within as usize;
        stored.get(at..at + it.dst.len()).unwrap_or_default()
    } else {
        stored
    };
    let decoded = codec::decode(codec, src, it.dst, dict);
    crc_check(it.index, &it.entry, stored)?;
    decoded.map_err(|d| {
        // Native entries always carry a checksum, loaderx entries never.
        let format = if it.entry.checksum.is_some() { Format::Native } else { Format::Loaderx };
        let e = &it.entry;
        corrupted(
            format!("record {} in {} (bytes {}..{})", it.index, chunk_name(format, e.chunk), e.offset, e.end()),
            d,
        )
    })
}

//! Where each record of a gather lands in the destination, and the checks
//! made before anything is written there: indices and next-use hints, fixed
//! slot widths, slots that overlap or run past the end.

use crate::error::{Error, Result};
use crate::format::record::Entry;
use crate::memory::cache::NextUse;
use crate::read::item::Want;
use crate::read::request::{Gather, Slots};

/// Hint `k`, or `Unknown` when the caller gave none.
pub(super) fn hint(next: &[NextUse], k: usize) -> NextUse {
    next.get(k).copied().unwrap_or(NextUse::Unknown)
}

pub(super) fn check_hints(indices: &[u64], next: &[NextUse]) -> Result<()> {
    if next.is_empty() || next.len() == indices.len() {
        return Ok(());
    }
    Err(Error::InvalidArgument(format!("{} indices but {} next-use hints", indices.len(), next.len())))
}

/// A record of `len` bytes fits a fixed slot of `width`.
pub(super) fn check_width(index: u64, entry: &Entry, width: Option<usize>) -> Result<()> {
    let len = u64::from(entry.logical_len);
    match width {
        Some(w) if len > w as u64 => Err(Error::RecordSize { record: index, len, slot: w as u64 }),
        _ => Ok(()),
    }
}

/// Each record's slot in a destination of `dst_len` bytes: where it starts,
/// and its width when fixed; the hints and starts counted against the
/// indices.
pub(super) fn slot_starts<'r>(
    req: &Gather<'r>,
    dst_len: usize,
) -> Result<(std::borrow::Cow<'r, [u64]>, Option<usize>)> {
    let indices = req.indices;
    check_hints(indices, req.next)?;
    let dst = dst_len;
    let (starts, width): (std::borrow::Cow<'_, [u64]>, Option<usize>) = match req.slots {
        Slots::Fixed(stride) => {
            let need = indices
                .len()
                .checked_mul(stride)
                .ok_or_else(|| Error::InvalidArgument("indices × stride overflows".into()))?;
            if dst != need {
                return Err(Error::InvalidArgument(format!(
                    "gather: destination is {dst} bytes, expected {} indices × stride {stride} = {need}",
                    indices.len()
                )));
            }
            ((0..indices.len() as u64).map(|k| k * stride as u64).collect(), Some(stride))
        }
        Slots::Ragged(starts) => (starts.into(), None),
        Slots::FixedAt { width, starts } => (starts.into(), Some(width)),
    };
    if starts.len() != indices.len() {
        return Err(Error::InvalidArgument(format!(
            "gather: {} indices but {} slot starts",
            indices.len(),
            starts.len()
        )));
    }
    Ok((starts, width))
}

/// Checks that the slots of `order` (sorted by start) lie inside `dst` and
/// do not overlap; zero-pads each fixed slot after its record.
pub(super) fn check_slots(order: &[(u64, Want)], width: Option<usize>, dst: &mut [u8]) -> Result<()> {
    let mut end = 0u64;
    for (start, w) in order {
        let slot = width.map_or(w.len as u64, |w| w as u64);
        if *start < end {
            return Err(Error::InvalidArgument(format!(
                "gather: the slot of record {} at offset {start} overlaps the previous slot",
                w.index
            )));
        }
        end = start.checked_add(slot).unwrap_or(u64::MAX);
        if end > dst.len() as u64 {
            return Err(match width {
                None => Error::RecordSize {
                    record: w.index,
                    len: w.len as u64,
                    slot: (dst.len() as u64).saturating_sub(*start),
                },
                Some(width) => Error::InvalidArgument(format!(
                    "gather: a slot at {start} of {width} bytes is outside the destination of {} bytes",
                    dst.len()
                )),
            });
        }
    }
    if let Some(width) = width {
        for (start, w) in order {
            // Lossless: checked inside `dst` above.
            dst[*start as usize + w.len..*start as usize + width].fill(0);
        }
    }
    Ok(())
}

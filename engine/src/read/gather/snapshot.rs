//! Gathers from one store's snapshot: whole records into their slots,
//! parts of records (spans), and what the table says of records (lengths,
//! codecs).

use super::items::read_items;
use super::slots::{check_slots, check_width, hint, slot_starts};
use crate::error::{Error, Result};
use crate::format::codec::Codec;
use crate::format::record::Entry;
use crate::memory::window::Loaded;
use crate::read::item::{carve, carve_at, crc_check, Want};
use crate::read::request::{Gather, Spans};
use crate::read::Ctx;
use crate::snapshot::Snapshot;
use std::collections::HashMap;

/// Logical (decoded) length of each record in `indices` in `snap`, into `out`.
pub(crate) fn lengths(snap: &Snapshot, indices: &[u64], out: &mut [u64]) -> Result<()> {
    if indices.len() != out.len() {
        return Err(Error::InvalidArgument(format!(
            "lengths: {} indices but an output of {} entries",
            indices.len(),
            out.len()
        )));
    }
    snap.table.prefetch(indices);
    for (i, o) in indices.iter().zip(out.iter_mut()) {
        *o = u64::from(snap.entry(*i)?.logical_len);
    }
    Ok(())
}

/// Logical length of one record.
pub(crate) fn record_len(snap: &Snapshot, index: u64) -> Result<u64> {
    Ok(u64::from(snap.entry(index)?.logical_len))
}

/// Reads the records of `req` from `snap` into `dst` ([`crate::Gather`]).
///
/// Every index, entry and slot is checked before anything is written to
/// `dst`; a fixed slot is zero-padded after its record.
pub(crate) fn gather(s: &Ctx<'_>, snap: &Snapshot, req: &Gather<'_>, dst: &mut [u8]) -> Result<()> {
    let indices = req.indices;
    let (starts, width) = slot_starts(req, dst.len())?;
    snap.table.prefetch(indices);
    let mut order: Vec<(u64, Want)> = Vec::with_capacity(indices.len());
    for (k, (&index, &start)) in indices.iter().zip(starts.iter()).enumerate() {
        let entry = snap.entry(index)?;
        check_width(index, &entry, width)?;
        order.push((start, Want { next: hint(req.next, k), ..Want::logical(index, entry) }));
    }
    if width == Some(0) {
        return Ok(());
    }
    // Empty records share their offset with the next slot: order by (offset, length).
    order.sort_unstable_by_key(|(start, w)| (*start, w.len));
    check_slots(&order, width, dst)?;
    read_items(s, snap, carve_at(dst, order), req.fan_out)
}

/// Reads the parts of records `req` names into `dst` ([`crate::Spans`]):
/// a short span of a raw record reads only its bytes, straight into its
/// place in `dst`; a long one (at least half of the record's stored bytes)
/// and any span of a compressed record read the whole record, checked,
/// once per call, into scratch, and the spans are copied from it. A short
/// span of a record a loaded window holds whole ([`crate::memory::window`])
/// is copied from the window after the whole record is checked, with no
/// read.
///
/// Every index and span is checked before anything is written to `dst`.
pub(crate) fn read_spans(s: &Ctx<'_>, snap: &Snapshot, req: &Spans<'_>, dst: &mut [u8]) -> Result<()> {
    let spans = req.spans;
    snap.table.prefetch(&spans.iter().map(|p| p.index).collect::<Vec<_>>());
    // Checked first: every record, every span inside its record and `dst`,
    // no two spans overlapping.
    let mut entries = Vec::with_capacity(spans.len());
    for p in spans {
        let entry = snap.entry(p.index)?;
        let logical = u64::from(entry.logical_len);
        if p.from.checked_add(p.len).is_none_or(|end| end > logical) {
            return Err(Error::InvalidArgument(format!(
                "read_spans: bytes {}..{} of record {}, which holds {logical} bytes",
                p.from,
                p.from.saturating_add(p.len),
                p.index
            )));
        }
        if p.at.checked_add(p.len).is_none_or(|end| end > dst.len() as u64) {
            return Err(Error::InvalidArgument(format!(
                "read_spans: a span of {} bytes at {} lies outside the destination of {} bytes",
                p.len,
                p.at,
                dst.len()
            )));
        }
        entries.push(entry);
    }
    let mut by_at: Vec<usize> = (0..spans.len()).filter(|&k| spans[k].len > 0).collect();
    by_at.sort_unstable_by_key(|&k| spans[k].at);
    for w in by_at.windows(2) {
        let (a, b) = (&spans[w[0]], &spans[w[1]]);
        if a.at + a.len > b.at {
            return Err(Error::InvalidArgument(format!(
                "read_spans: the span of record {} at {} overlaps the span of record {} at {}",
                b.index, b.at, a.index, a.at
            )));
        }
    }
    // A span reads its own bytes, or its whole record (below).
    let whole = |k: usize| {
        let e = &entries[k];
        e.codec != Codec::Raw || spans[k].len.saturating_mul(2) >= u64::from(e.stored_len)
    };
    // The records read whole, each once, back to back in `scratch`: index
    // -> (where it starts, its entry).
    let mut wholes: HashMap<u64, (u64, Entry)> = HashMap::new();
    let mut order: Vec<u64> = Vec::new();
    let mut size = 0u64;
    for &k in &by_at {
        if whole(k) {
            let index = spans[k].index;
            wholes.entry(index).or_insert_with(|| {
                order.push(index);
                let at = size;
                size += u64::from(entries[k].logical_len);
                (at, entries[k])
            });
        }
    }
    // Short spans of records a loaded window holds: copied from it, the
    // record checked whole (cheap beside the read it spares).
    let mut held = vec![false; spans.len()];
    let windows = if s.reads.caching() { s.reads.windows() } else { Loaded::default() };
    for &k in &by_at {
        if whole(k) {
            continue;
        }
        if let Some(stored) = windows.get(&entries[k]).filter(|_| !entries[k].is_part()) {
            let p = &spans[k];
            crc_check(p.index, &entries[k], stored)?;
            // Lossless: the span lies inside its record (checked above).
            dst[p.at as usize..][..p.len as usize].copy_from_slice(&stored[p.from as usize..][..p.len as usize]);
            held[k] = true;
        }
    }
    let mut scratch =
        vec![0u8; usize::try_from(size).map_err(|_| Error::InvalidArgument("read_spans: too large".into()))?];
    let mut items = carve(&mut scratch, order.iter().map(|i| Want::logical(*i, wholes[i].1)));
    // Lossless: spans lie inside `dst`, a slice, and inside records of
    // u32 lengths.
    items.extend(carve_at(
        dst,
        by_at
            .iter()
            .filter(|&&k| !whole(k) && !held[k])
            .map(|&k| (spans[k].at, Want::span(spans[k].index, entries[k], spans[k].from, spans[k].len as u32))),
    ));
    read_items(s, snap, items, req.fan_out)?;
    for &k in &by_at {
        if whole(k) {
            let p = &spans[k];
            let from = (wholes[&p.index].0 + p.from) as usize;
            dst[p.at as usize..][..p.len as usize].copy_from_slice(&scratch[from..][..p.len as usize]);
        }
    }
    Ok(())
}

/// The codec each record of `indices` is stored with, into `out`.
pub(crate) fn codecs(snap: &Snapshot, indices: &[u64], out: &mut [Codec]) -> Result<()> {
    if indices.len() != out.len() {
        return Err(Error::InvalidArgument(format!(
            "codecs: {} indices but an output of {} entries",
            indices.len(),
            out.len()
        )));
    }
    snap.table.prefetch(indices);
    for (i, o) in indices.iter().zip(out.iter_mut()) {
        *o = snap.entry(*i)?.codec;
    }
    Ok(())
}

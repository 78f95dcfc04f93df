//! Mode 3: the document windows a loader reads ahead, whether one fits the
//! source's memory, and which rows read which documents (module docs of
//! [`crate::pack`], "Mode 3: windows read ahead").

use std::ops::Range;

use zring_sampler::Blocks;

use super::packer::{err, Packer};
use super::params::{PackMode, FIRST_FIT_WINDOW, MARK_EVERY};
use crate::pool::PAGE;
use crate::source::SourceError;

/// The least memory a store holds a block read of a window in (its slabs
/// of 64 KiB and up), for [`Packer::window_fits`].
const WINDOW_SLAB_MIN: u64 = 64 << 10;

impl Packer {
    /// The shape the source reads best in mode 3 ([`Source::block_shape`](crate::Source::block_shape)):
    /// a window of it is what the source's memory holds at a quarter.
    pub(crate) fn source_shape(&self) -> Option<Blocks> {
        self.source.block_shape()
    }

    /// Loads the documents of `blocks` (index ranges) ahead of the rows
    /// that read them ([`Source::prefetch`](crate::Source::prefetch)).
    pub(crate) fn prefetch(&self, blocks: &[Range<u64>]) -> Result<(), SourceError> {
        self.source.prefetch(blocks, &[])
    }

    /// Whether a window of the document order of these blocks (document
    /// ranges) fits the memory the source loads windows into, as its own
    /// mode-3 shape would ([`Source::block_shape`](crate::Source::block_shape): a window of a quarter of
    /// it, counted at the mean document size). Each block is counted as held
    /// in memory: its bytes rounded out to pages, and at least
    /// [`WINDOW_SLAB_MIN`].
    pub(crate) fn window_fits(&self, blocks: &[Range<u64>]) -> bool {
        let Some(own) = self.source.block_shape() else {
            return false;
        };
        let (mut bytes, mut held, mut docs) = (0u64, 0u64, 0u64);
        let mut lens = Vec::new();
        for b in blocks {
            let ids: Vec<u64> = b.clone().collect();
            lens.resize(ids.len(), 0);
            if self.source.lengths(&ids, &mut lens).is_err() {
                return false;
            }
            let n: u64 = lens.iter().sum();
            bytes += n;
            // A direct block read is rounded out to pages at both ends.
            held += (n + 2 * PAGE as u64).max(WINDOW_SLAB_MIN);
            docs += ids.len() as u64;
        }
        let mean = bytes / docs.max(1);
        held <= own.window_blocks.saturating_mul(own.block_records).saturating_mul(mean.max(1))
    }

    /// Mode 3: the window of the document order holding position `p`, as
    /// (cycle, window); `None` in the other modes.
    pub(crate) fn order_window_of(&self, p: u64) -> Option<(u64, u64)> {
        let (c, q) = self.cycle_of_position(p);
        let seg = self.segment_of_cycle(c);
        Some((c, seg.order.cycle_window_of(c - seg.first_cycle, q)?))
    }

    /// Window `w` of cycle `c` of the document order (mode 3): its positions
    /// in the stream and its blocks' document ranges; `None` past the
    /// cycle's last window.
    pub(crate) fn order_window(&self, c: u64, w: u64) -> Option<(Range<u64>, Vec<Range<u64>>)> {
        let seg = self.segment_of_cycle(c);
        let (q, blocks) = seg.order.cycle_window(c - seg.first_cycle, w)?;
        let base = self.cycle_base(c)?;
        Some((base.checked_add(q.start)?..base.checked_add(q.end)?, blocks))
    }

    /// The first position of the document stream that row `row`, or any
    /// row after it, reads: in concat mode the document holding the row's
    /// first token, in first fit the first position of its window.
    pub(crate) fn first_position_of_row(&self, row: u64) -> Result<u64, SourceError> {
        let src = &*self.source;
        let base = |c: u64| self.cycle_base(c).ok_or_else(|| err(format!("cycle {c} is past the position stream")));
        match self.pack.mode {
            PackMode::Concat => {
                let u =
                    row.checked_mul(self.pack.seq_len).ok_or_else(|| err(format!("row {row} is past 2^64 tokens")))?;
                let (c, o, idx) = self.locate(u, src)?;
                let n = self.cycle_docs(c);
                let j = idx.marks.partition_point(|&m| m <= o) - 1;
                let first = base(c)? + j as u64 * MARK_EVERY;
                let take = MARK_EVERY.min(n - j as u64 * MARK_EVERY) as usize;
                let (mut docs, mut lens) = (vec![0u64; take], vec![0u64; take]);
                self.docs_at(src, first, &mut docs, &mut lens)?;
                let (mut acc, mut k) = (idx.marks[j], 0);
                while k + 1 < take && acc + lens[k] <= o {
                    acc += lens[k];
                    k += 1;
                }
                Ok(first + k as u64)
            }
            PackMode::FirstFit => {
                let (c, o, idx) = self.locate(row, src)?;
                let j = idx.marks.partition_point(|&m| m <= o) - 1;
                Ok(base(c)? + j as u64 * FIRST_FIT_WINDOW)
            }
        }
    }

    /// The rows of the stream that may read a document at one of
    /// `positions` (more rather than fewer): in concat mode the rows
    /// holding their tokens, and the row before, whose last label is the
    /// first of them; in first fit the rows of the first-fit windows they
    /// lie in.
    pub(crate) fn rows_of_positions(&self, positions: Range<u64>) -> Result<Range<u64>, SourceError> {
        let src = &*self.source;
        let l = self.pack.seq_len;
        Ok(match self.pack.mode {
            PackMode::Concat => {
                let (a, b) = (self.tokens_before(positions.start, src)?, self.tokens_before(positions.end, src)?);
                a.saturating_sub(1) / l..b.div_ceil(l)
            }
            PackMode::FirstFit => {
                self.rows_before_window(positions.start, false, src)?
                    ..self.rows_before_window(positions.end, true, src)?
            }
        })
    }
}

//! Seeking a row without replaying the stream: each cycle's index of
//! tokens or rows, the running sum of where cycles begin, and first-fit
//! windows packed and kept (module docs of [`crate::pack`], "Seeking, and
//! what is kept").

use std::sync::{Arc, PoisonError};

use super::packer::{err, CycleIndex, Packer, Piece, Window};
use super::params::{PackMode, CYCLES_KEPT, FIRST_FIT_WINDOW, MARK_EVERY, WINDOWS_KEPT};
use crate::source::{Source, SourceError};

impl Packer {
    /// The documents at positions `first .. first + out.len()`: position
    /// `p` of a segment is slot `p % block` of its order's step `p / block`
    /// (`p` counted from the segment's first position).
    pub(super) fn order_fill(&self, first: u64, out: &mut [u64]) -> Result<(), SourceError> {
        let mut p = first;
        let mut rest = out;
        while !rest.is_empty() {
            let k = self.segments.partition_point(|s| s.first_pos <= p).max(1) - 1;
            let seg = &self.segments[k];
            let end = self.segments.get(k + 1).map_or(u64::MAX, |next| next.first_pos);
            let block = seg.order.batch_len() as u64;
            let local = p - seg.first_pos;
            let (step, slot) = (local / block, local % block);
            // Lossless: both are at most the block, a usize.
            let take = (block - slot).min(rest.len() as u64).min(end - p) as usize;
            let (now, later) = rest.split_at_mut(take);
            seg.order.fill_slots(step, slot as usize, now)?;
            p += take as u64;
            rest = later;
        }
        Ok(())
    }

    /// The documents at positions `first..first + docs.len()` and their
    /// lengths in tokens.
    pub(super) fn docs_at(
        &self,
        src: &dyn Source,
        first: u64,
        docs: &mut [u64],
        lens: &mut [u64],
    ) -> Result<(), SourceError> {
        self.order_fill(first, docs)?;
        src.lengths(docs, lens)?;
        let tb = self.stored.bytes;
        let added = self.pack.added();
        for (d, l) in docs.iter().zip(lens.iter_mut()) {
            if *l % tb != 0 {
                return Err(err(format!("record {d} holds {l} bytes, not a whole number of {tb}-byte tokens")));
            }
            *l = *l / tb + added;
            if *l > i32::MAX as u64 {
                return Err(err(format!("document {d} has {l} tokens; positions are int32, at most 2^31 - 1")));
            }
        }
        Ok(())
    }

    /// Cycle `c`'s index, built on first use.
    pub(super) fn cycle(&self, c: u64, src: &dyn Source) -> Result<Arc<CycleIndex>, SourceError> {
        {
            let cycles = self.cycles.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some((_, idx)) = cycles.recent.iter().find(|(k, _)| *k == c) {
                return Ok(Arc::clone(idx));
            }
        }
        let idx = Arc::new(self.build_cycle(c, src)?);
        let mut cycles = self.cycles.lock().unwrap_or_else(PoisonError::into_inner);
        if !cycles.recent.iter().any(|(k, _)| *k == c) {
            if cycles.recent.len() == CYCLES_KEPT {
                cycles.recent.pop_front();
            }
            cycles.recent.push_back((c, Arc::clone(&idx)));
        }
        Ok(idx)
    }

    pub(super) fn build_cycle(&self, c: u64, src: &dyn Source) -> Result<CycleIndex, SourceError> {
        let n = self.cycle_docs(c);
        let base =
            self.cycle_base(c).ok_or_else(|| err(format!("cycle {c} is past the end of the position stream")))?;
        let step = match self.pack.mode {
            PackMode::Concat => MARK_EVERY,
            PackMode::FirstFit => FIRST_FIT_WINDOW,
        };
        let mut marks = Vec::with_capacity(n.div_ceil(step) as usize);
        let mut total = 0u64;
        let mut docs = Vec::new();
        let mut lens = Vec::new();
        let mut at = 0;
        while at < n {
            let take = step.min(n - at) as usize;
            docs.resize(take, 0);
            lens.resize(take, 0);
            self.docs_at(src, base + at, &mut docs, &mut lens)?;
            marks.push(total);
            let add = match self.pack.mode {
                PackMode::Concat => lens.iter().sum::<u64>(),
                PackMode::FirstFit => first_fit(&docs, &lens, self.pack.seq_len).ends.len() as u64,
            };
            total = total.checked_add(add).ok_or_else(|| err("a cycle holds over 2^64 tokens".into()))?;
            at += take as u64;
        }
        Ok(CycleIndex { marks, total })
    }

    /// The cycle holding unit `u` (token or row of the stream), `u`'s
    /// offset in it and its index.
    pub(super) fn locate(&self, u: u64, src: &dyn Source) -> Result<(u64, u64, Arc<CycleIndex>), SourceError> {
        if self.uniform() {
            let k = self.segments.partition_point(|s| s.uniform.is_some_and(|(start, _)| start <= u)).max(1) - 1;
            let seg = &self.segments[k];
            let (start, t) = seg.uniform.expect("uniform");
            let c = seg.first_cycle + (u - start) / t;
            return Ok((c, (u - start) % t, self.cycle(c, src)?));
        }
        loop {
            {
                let cycles = self.cycles.lock().unwrap_or_else(PoisonError::into_inner);
                if *cycles.starts.last().expect("starts begins with 0") > u {
                    let c = cycles.starts.partition_point(|&s| s <= u) - 1;
                    let start = cycles.starts[c];
                    drop(cycles);
                    let c = c as u64;
                    return Ok((c, u - start, self.cycle(c, src)?));
                }
            }
            self.sum_next_cycle(src)?;
        }
    }

    /// Sums the first cycle not summed yet into `starts` (module docs,
    /// "Seeking"): one lengths pass over it, unless its index is kept.
    pub(super) fn sum_next_cycle(&self, src: &dyn Source) -> Result<(), SourceError> {
        let (known, last) = {
            let cycles = self.cycles.lock().unwrap_or_else(PoisonError::into_inner);
            (cycles.starts.len() as u64 - 1, *cycles.starts.last().expect("starts begins with 0"))
        };
        let total = self.cycle(known, src)?.total;
        let mut cycles = self.cycles.lock().unwrap_or_else(PoisonError::into_inner);
        // Another thread may have summed this cycle meanwhile.
        if cycles.starts.len() as u64 == known + 1 {
            cycles.starts.push(last.saturating_add(total));
        }
        Ok(())
    }

    /// The documents begun in this packer's first `rows` rows (a document
    /// is begun when its first token, or its BOS, is in one of them), and
    /// the number of documents of a cycle. Reads at most one block of
    /// lengths, or one first-fit window, near the row (the cycle indices a
    /// run at that row has built already).
    pub(crate) fn documents_before(&self, rows: u64) -> Result<(u64, u64), SourceError> {
        let src = &*self.source;
        if rows == 0 {
            return Ok((0, self.cycle_docs(0)));
        }
        let n;
        let begun = match self.pack.mode {
            PackMode::Concat => {
                let u = rows.saturating_mul(self.pack.seq_len);
                let (c, o, idx) = self.locate(u, src)?;
                n = self.cycle_docs(c);
                let j = idx.marks.partition_point(|&m| m <= o) - 1;
                let mut acc = idx.marks[j];
                let first = self.cycle_base(c).unwrap_or(u64::MAX) + j as u64 * MARK_EVERY;
                let take = MARK_EVERY.min(n - j as u64 * MARK_EVERY) as usize;
                let (mut docs, mut lens) = (vec![0u64; take], vec![0u64; take]);
                self.docs_at(src, first, &mut docs, &mut lens)?;
                // Documents of the block that begin before token `o`.
                let mut k = 0;
                while k < take && acc < o {
                    acc += lens[k];
                    k += 1;
                }
                first + k as u64
            }
            PackMode::FirstFit => {
                let (c, o, idx) = self.locate(rows, src)?;
                n = self.cycle_docs(c);
                let j = idx.marks.partition_point(|&m| m <= o) - 1;
                let r = (o - idx.marks[j]) as usize;
                let w = self.window(c, j as u64, src)?;
                let placed = if r == 0 { 0 } else { w.ends[r - 1] };
                let begun = w.pieces[..placed].iter().filter(|p| p.start == 0).count() as u64;
                self.cycle_base(c).unwrap_or(u64::MAX) + j as u64 * FIRST_FIT_WINDOW + begun
            }
        };
        Ok((begun, n))
    }

    /// The documents of the cycle under way at row `rows` that the rows
    /// before it began (their first token, or BOS, delivered), in the order
    /// drawn, and the documents of that cycle: what an elastic resume leaves
    /// out of the rest of the cycle.
    pub(crate) fn begun_in_cycle(&self, rows: u64) -> Result<(Vec<u64>, u64), SourceError> {
        let src = &*self.source;
        let unit = match self.pack.mode {
            PackMode::Concat => rows.saturating_mul(self.pack.seq_len),
            PackMode::FirstFit => rows,
        };
        let (c, _, _) = self.locate(unit, src)?;
        let base = self.cycle_base(c).ok_or_else(|| err(format!("cycle {c} is past the position stream")))?;
        let n = self.cycle_docs(c);
        let (begun, _) = self.documents_before(rows)?;
        let k = begun.saturating_sub(base).min(n);
        let mut docs = vec![0u64; usize::try_from(k).map_err(|_| err("too many documents".into()))?];
        self.order_fill(base, &mut docs)?;
        Ok((docs, n))
    }

    pub(super) fn window(&self, c: u64, j: u64, src: &dyn Source) -> Result<Arc<Window>, SourceError> {
        let key = (c, j);
        {
            let kept = self.windows.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some((_, w)) = kept.iter().find(|(k, _)| *k == key) {
                return Ok(Arc::clone(w));
            }
        }
        let first = j * FIRST_FIT_WINDOW;
        let take = FIRST_FIT_WINDOW.min(self.cycle_docs(c) - first) as usize;
        let base =
            self.cycle_base(c).ok_or_else(|| err(format!("cycle {c} is past the end of the position stream")))?;
        let (mut docs, mut lens) = (vec![0; take], vec![0; take]);
        self.docs_at(src, base + first, &mut docs, &mut lens)?;
        let w = Arc::new(first_fit(&docs, &lens, self.pack.seq_len));
        let mut kept = self.windows.lock().unwrap_or_else(PoisonError::into_inner);
        if !kept.iter().any(|(k, _)| *k == key) {
            if kept.len() == WINDOWS_KEPT {
                kept.pop_front();
            }
            kept.push_back((key, Arc::clone(&w)));
        }
        Ok(w)
    }

    /// The tokens (concat) or rows (first fit) before cycle `c`.
    pub(super) fn cycle_start(&self, c: u64, src: &dyn Source) -> Result<u64, SourceError> {
        if self.uniform() {
            let seg = self.segment_of_cycle(c);
            let (start, t) = seg.uniform.expect("uniform");
            return (c - seg.first_cycle)
                .checked_mul(t)
                .and_then(|x| x.checked_add(start))
                .ok_or_else(|| err(format!("cycle {c} is past 2^64 tokens")));
        }
        loop {
            {
                let cycles = self.cycles.lock().unwrap_or_else(PoisonError::into_inner);
                if let Some(&s) = usize::try_from(c).ok().and_then(|c| cycles.starts.get(c)) {
                    return Ok(s);
                }
            }
            self.sum_next_cycle(src)?;
        }
    }

    /// Concat mode: the tokens of the stream before position `p`.
    pub(super) fn tokens_before(&self, p: u64, src: &dyn Source) -> Result<u64, SourceError> {
        let (c, q) = self.cycle_of_position(p);
        let start = self.cycle_start(c, src)?;
        let idx = self.cycle(c, src)?;
        let j = q / MARK_EVERY;
        // Lossless: under MARK_EVERY.
        let take = (q - j * MARK_EVERY) as usize;
        let (mut docs, mut lens) = (vec![0u64; take], vec![0u64; take]);
        if take > 0 {
            self.docs_at(src, p - q + j * MARK_EVERY, &mut docs, &mut lens)?;
        }
        Ok(start + idx.marks[j as usize] + lens.iter().sum::<u64>())
    }

    /// First fit: the rows of the stream before the first-fit window that
    /// holds position `p`, or with `up` before the first window starting
    /// at or after `p`.
    pub(super) fn rows_before_window(&self, p: u64, up: bool, src: &dyn Source) -> Result<u64, SourceError> {
        let (c, q) = self.cycle_of_position(p);
        let start = self.cycle_start(c, src)?;
        let idx = self.cycle(c, src)?;
        let j = if up { q.div_ceil(FIRST_FIT_WINDOW) } else { q / FIRST_FIT_WINDOW };
        Ok(start + usize::try_from(j).ok().and_then(|j| idx.marks.get(j)).copied().unwrap_or(idx.total))
    }
}

/// First fit of the documents `docs` (of `lens` tokens) into rows of `l`
/// tokens: each document in pieces of at most `l` tokens, each piece into
/// the first row with room. A row's whole documents come first in it, so
/// they can be gathered in one call.
pub(super) fn first_fit(docs: &[u64], lens: &[u64], l: u64) -> Window {
    let pieces_total: u64 = lens.iter().map(|&n| n.div_ceil(l)).sum();
    let leaves = (pieces_total as usize).max(1).next_power_of_two();
    // A max tree of the room left in each row; rows not opened yet have room
    // `l`, and are to the right of every opened one, so the leftmost row
    // with room is the first-fit choice, a new row when no opened one fits.
    let mut tree = vec![l; 2 * leaves];
    let mut bins: Vec<Vec<Piece>> = Vec::new();
    for (&doc, &n) in docs.iter().zip(lens) {
        let mut start = 0;
        while start < n {
            let len = (n - start).min(l);
            let mut node = 1;
            while node < leaves {
                node = if tree[2 * node] >= len { 2 * node } else { 2 * node + 1 };
            }
            let row = node - leaves;
            if row == bins.len() {
                bins.push(Vec::new());
            }
            let used = l - tree[node];
            bins[row].push(Piece { doc, doc_len: n, start, len, dst: used, joined: false });
            tree[node] -= len;
            while node > 1 {
                node /= 2;
                tree[node] = tree[2 * node].max(tree[2 * node + 1]);
            }
            start += len;
        }
    }
    let mut pieces = Vec::with_capacity(pieces_total as usize);
    let mut ends = Vec::with_capacity(bins.len());
    for mut bin in bins {
        bin.sort_by_key(|p| !p.whole());
        let mut at = 0;
        for p in &mut bin {
            p.dst = at;
            at += p.len;
        }
        pieces.extend(bin);
        ends.push(pieces.len());
    }
    Window { pieces, ends }
}

//! One source's packer: its document order, the state it keeps for seeking
//! (cycle indices, first-fit windows), and the pieces of documents rows are
//! made of.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use zring_sampler::{Mode, Sampler, MAX_BATCH};

use super::params::{Pack, PackMode, TokenType};
use crate::source::{Layout, Source, SourceError};

/// One piece of a document placed in a batch: tokens `start .. start + len`
/// of `doc` (of `doc_len` tokens), at token `dst` of the batch's rows.
#[derive(Clone, Copy, Debug)]
pub(super) struct Piece {
    pub(super) doc: u64,
    pub(super) doc_len: u64,
    pub(super) start: u64,
    pub(super) len: u64,
    pub(super) dst: u64,
    /// Set on stored pieces (`Packer::stored`) that follow the one before
    /// them with only added tokens (EOD, BOS) between.
    pub(super) joined: bool,
}

impl Piece {
    pub(super) fn whole(&self) -> bool {
        self.start == 0 && self.len == self.doc_len
    }
}

/// One cycle's index (module docs): `marks[j]` the tokens (concat) or rows
/// (first fit) before mark `j`, `total` those of the whole cycle.
pub(super) struct CycleIndex {
    pub(super) marks: Vec<u64>,
    pub(super) total: u64,
}

/// A first-fit window's (cycle, window of the cycle).
pub(super) type WindowKey = (u64, u64);

/// One first-fit window, packed: row `r` is `pieces[ends[r-1]..ends[r]]`
/// (`dst` counted from the row's start).
pub(super) struct Window {
    pub(super) pieces: Vec<Piece>,
    pub(super) ends: Vec<usize>,
}

/// A stretch of cycles over one number of documents (module docs,
/// "Growth"): cycles `first_cycle ..` (to the next segment's) each draw
/// documents `0 .. docs` once, in the order of `order`, whose cycle
/// `c - first_cycle` is the packer's cycle `c`.
pub(super) struct Segment {
    pub(super) first_cycle: u64,
    /// The stream position of the first cycle's first document.
    pub(super) first_pos: u64,
    pub(super) docs: u64,
    pub(super) order: Sampler,
    /// Concat over a mode whose every cycle is a permutation: the tokens
    /// of the stream before `first_cycle`, and the tokens of each cycle.
    pub(super) uniform: Option<(u64, u64)>,
}

pub(super) struct Cycles {
    /// `starts[c]`: the tokens or rows before cycle `c`, for the cycles
    /// summed so far (module docs); unused when every cycle is alike.
    pub(super) starts: Vec<u64>,
    pub(super) recent: VecDeque<(u64, Arc<CycleIndex>)>,
}

/// One source's packing: its document order, and the indices that make a
/// row's documents quick to find.
pub(crate) struct Packer {
    /// Unique in the process: names this packer's kept documents.
    pub(super) id: u64,
    pub(super) source: Arc<dyn Source>,
    pub(super) pack: Pack,
    /// The stretches of cycles over a number of documents, the first from
    /// cycle 0; more than one when the source grew during the run.
    pub(super) segments: Vec<Segment>,
    /// The type of the source's stored tokens, and of the delivered ones.
    pub(super) stored: TokenType,
    pub(super) out: TokenType,
    /// The source as errors name it.
    pub(super) name: String,
    /// The mode and seed of the document order.
    pub(super) mode: Mode,
    pub(super) seed: u64,
    pub(super) cycles: Mutex<Cycles>,
    /// First-fit windows kept, by (cycle, window of the cycle).
    pub(super) windows: Mutex<VecDeque<(WindowKey, Arc<Window>)>>,
}

/// Whether every cycle of `mode` (one step of `n`) draws each document
/// exactly once.
/// Only a shortcut for seeking: a mode not named here takes the general path.
pub(super) fn cycles_are_permutations(mode: Mode) -> bool {
    matches!(mode, Mode::Sequential | Mode::Cyclic)
}

pub(super) fn err(msg: String) -> SourceError {
    msg.into()
}

impl Packer {
    /// A packer over `source` (a ragged source of tokens) in `mode` from
    /// `seed`, `stored` the type of the source's tokens (delivered as
    /// `pack.token_bytes`, `pack.signed`), `name` how errors name it,
    /// whose cycles from `growth[s].0` on draw the first
    /// `growth[s].1` documents (module docs, "Growth"): `growth[0]` is
    /// `(0, docs)`, the cycles increase and so do the documents, and the last
    /// is at most the source's. Reads the lengths of each segment's first
    /// cycle.
    pub(crate) fn grown(
        source: Arc<dyn Source>,
        pack: Pack,
        mode: Mode,
        seed: u64,
        stored: TokenType,
        name: String,
        growth: &[(u64, u64)],
    ) -> Result<Packer, SourceError> {
        if source.layout() != Layout::Ragged {
            return Err(err("a packed source must be ragged: one record per document of tokens".into()));
        }
        let ok = growth.first().is_some_and(|g| g.0 == 0)
            && growth.windows(2).all(|w| w[1].0 > w[0].0 && w[1].1 > w[0].1)
            && growth.last().is_some_and(|g| g.1 <= source.len());
        if !ok {
            return Err(err(format!(
                "the saved growth of the documents {growth:?} does not fit a source of {} documents",
                source.len()
            )));
        }
        let mut packer = Packer {
            id: NEXT_PACKER.fetch_add(1, Ordering::Relaxed),
            source,
            pack,
            segments: Vec::with_capacity(growth.len()),
            mode,
            seed,
            stored,
            out: TokenType { bytes: pack.token_bytes, signed: pack.signed },
            name,
            cycles: Mutex::new(Cycles { starts: vec![0], recent: VecDeque::new() }),
            windows: Mutex::new(VecDeque::new()),
        };
        for &(first_cycle, docs) in growth {
            packer.push_segment(first_cycle, docs)?;
        }
        Ok(packer)
    }

    /// The document order of a segment of `docs` documents from cycle
    /// `first_cycle`: one step per cycle where a batch can hold all the
    /// documents (cyclic: one permutation per step), else one document a
    /// step; keyed apart from the segments before it.
    fn segment_order(&self, first_cycle: u64, docs: u64) -> Result<Sampler, SourceError> {
        let block = if docs <= MAX_BATCH { docs } else { 1 };
        let seed = if first_cycle == 0 { self.seed } else { mix(self.seed ^ mix(first_cycle)) };
        Ok(Sampler::new(self.mode, docs, block, seed)?)
    }

    /// Adds the segment of cycles from `first_cycle` over `docs` documents
    /// (after the last one's first cycle).
    pub(crate) fn push_segment(&mut self, first_cycle: u64, docs: u64) -> Result<(), SourceError> {
        let order = self.segment_order(first_cycle, docs)?;
        let first_pos = match self.segments.last() {
            None => 0,
            Some(s) => (first_cycle - s.first_cycle)
                .checked_mul(s.docs)
                .and_then(|p| p.checked_add(s.first_pos))
                .ok_or_else(|| err(format!("cycle {first_cycle} is past the end of the position stream")))?,
        };
        self.segments.push(Segment { first_cycle, first_pos, docs, order, uniform: None });
        // Forget what was kept of later cycles: they now draw another order.
        self.cycles.lock().unwrap_or_else(std::sync::PoisonError::into_inner).recent.retain(|(c, _)| *c < first_cycle);
        self.windows.lock().unwrap_or_else(std::sync::PoisonError::into_inner).retain(|(k, _)| k.0 < first_cycle);
        let first = self.cycle(first_cycle, &*Arc::clone(&self.source))?;
        if first.total == 0 {
            let what = if self.pack.mode == PackMode::Concat { "tokens" } else { "rows" };
            return Err(err(format!("the packed source's {docs} documents hold no {what}: nothing to pack")));
        }
        let all_uniform = self.segments.len() == 1 || self.segments[0].uniform.is_some();
        if self.pack.mode == PackMode::Concat && cycles_are_permutations(self.mode) && all_uniform {
            let before = match self.segments.iter().rev().nth(1) {
                None => 0,
                Some(prev) => {
                    let (start, per) = prev.uniform.expect("every segment before is uniform");
                    (first_cycle - prev.first_cycle)
                        .checked_mul(per)
                        .and_then(|t| t.checked_add(start))
                        .ok_or_else(|| err(format!("cycle {first_cycle} is past 2^64 tokens")))?
                }
            };
            self.segments.last_mut().expect("pushed").uniform = Some((before, first.total));
        }
        Ok(())
    }

    /// The segments as `(first cycle, documents)`: what a state saves.
    pub(crate) fn growth(&self) -> Vec<(u64, u64)> {
        self.segments.iter().map(|s| (s.first_cycle, s.docs)).collect()
    }

    /// The segment cycle `c` is in.
    pub(super) fn segment_of_cycle(&self, c: u64) -> &Segment {
        let k = self.segments.partition_point(|s| s.first_cycle <= c);
        &self.segments[k.max(1) - 1]
    }

    /// The documents of cycle `c`.
    pub(super) fn cycle_docs(&self, c: u64) -> u64 {
        self.segment_of_cycle(c).docs
    }

    /// The stream position of cycle `c`'s first document.
    pub(super) fn cycle_base(&self, c: u64) -> Option<u64> {
        let s = self.segment_of_cycle(c);
        (c - s.first_cycle).checked_mul(s.docs)?.checked_add(s.first_pos)
    }

    /// Stream position `p` as (its cycle, its place in the cycle).
    pub(super) fn cycle_of_position(&self, p: u64) -> (u64, u64) {
        let k = self.segments.partition_point(|s| s.first_pos <= p);
        let s = &self.segments[k.max(1) - 1];
        let local = p - s.first_pos;
        (s.first_cycle + local / s.docs, local % s.docs)
    }

    /// The cycle holding unit `u` of the stream (a token in concat mode, a
    /// row in first fit).
    pub(crate) fn cycle_of_unit(&self, u: u64) -> Result<u64, SourceError> {
        Ok(self.locate(u, &*Arc::clone(&self.source))?.0)
    }

    /// Whether every cycle's tokens are known without a pass over it.
    pub(super) fn uniform(&self) -> bool {
        self.segments.iter().all(|s| s.uniform.is_some())
    }

    pub(crate) fn source(&self) -> &Arc<dyn Source> {
        &self.source
    }
}

/// splitmix64's finaliser: a grown segment's order seed from the run's.
fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Where packers get their [`Packer::id`].
static NEXT_PACKER: AtomicU64 = AtomicU64::new(0);

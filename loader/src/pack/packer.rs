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

/// One first-fit window, packed: row `r` is `pieces[ends[r-1]..ends[r]]`
/// (`dst` counted from the row's start).
pub(super) struct Window {
    pub(super) pieces: Vec<Piece>,
    pub(super) ends: Vec<usize>,
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
    pub(super) docs: u64,
    pub(super) order: Sampler,
    /// The type of the source's stored tokens, and of the delivered ones.
    pub(super) stored: TokenType,
    pub(super) out: TokenType,
    /// The source as errors name it.
    pub(super) name: String,
    /// Tokens per cycle, in concat mode over a mode whose cycles are all
    /// permutations of the documents.
    pub(super) uniform: Option<u64>,
    pub(super) cycles: Mutex<Cycles>,
    pub(super) windows: Mutex<VecDeque<(u64, Arc<Window>)>>,
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
    /// `seed`. Reads the lengths of the first cycle (to find its tokens).
    /// `stored` is the type of the source's tokens (delivered as
    /// `pack.token_bytes`, `pack.signed`), `name` how errors name it.
    pub(crate) fn new(
        source: Arc<dyn Source>,
        pack: Pack,
        mode: Mode,
        seed: u64,
        stored: TokenType,
        name: String,
    ) -> Result<Packer, SourceError> {
        if source.layout() != Layout::Ragged {
            return Err(err("a packed source must be ragged: one record per document of tokens".into()));
        }
        let docs = source.len();
        // One step of the order per cycle where a batch can hold all the
        // documents (cyclic: one permutation per step), else one document a
        // step; either way, cycle `c` is positions `c·n .. (c+1)·n`.
        let block = if docs <= MAX_BATCH { docs } else { 1 };
        let order = Sampler::new(mode, docs, block, seed)?;
        let mut packer = Packer {
            id: NEXT_PACKER.fetch_add(1, Ordering::Relaxed),
            source,
            pack,
            docs,
            order,
            stored,
            out: TokenType { bytes: pack.token_bytes, signed: pack.signed },
            name,
            uniform: None,
            cycles: Mutex::new(Cycles { starts: vec![0], recent: VecDeque::new() }),
            windows: Mutex::new(VecDeque::new()),
        };
        let first = packer.cycle(0, &*Arc::clone(&packer.source))?;
        if first.total == 0 {
            let what = if pack.mode == PackMode::Concat { "tokens" } else { "rows" };
            return Err(err(format!("the packed source's {docs} documents hold no {what}: nothing to pack")));
        }
        if pack.mode == PackMode::Concat && cycles_are_permutations(mode) {
            packer.uniform = Some(first.total);
        }
        Ok(packer)
    }

    pub(crate) fn source(&self) -> &Arc<dyn Source> {
        &self.source
    }
}

/// Where packers get their [`Packer::id`].
static NEXT_PACKER: AtomicU64 = AtomicU64::new(0);

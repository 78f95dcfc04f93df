//! Packed token rows: the documents of a ragged source of tokens, in the
//! order of a document sampler, cut and packed into rows of `seq_len` tokens
//! ([`Loader::new_packed`](crate::Loader::new_packed)).
//!
//! # The row stream
//!
//! A packer sees its documents as one endless stream of *positions*:
//! position `p` reads document `order(p)`, where `order` is a
//! [`Sampler`] over the documents in the loader's mode and seed whose
//! batch is all `n` documents (step `c` is cycle `c`: positions
//! `c·n .. (c+1)·n`; one document a step beyond `MAX_BATCH` documents). Rows are
//! numbered `0, 1, 2, …` along that stream; the loader asks for rows by
//! number (a sequential sampler over [`PACKED_ROWS`] rows, or a mixture of
//! such streams), so sharding, mixtures and resume are the loader's own.
//!
//! * [`PackMode::Concat`]: the documents of the stream back to back, cut
//!   every `seq_len` tokens: row `g` is tokens `g·L .. (g+1)·L`. Nothing is
//!   padded; a document cut at a row's end goes on in the next row with its
//!   positions going on.
//! * [`PackMode::FirstFit`]: the stream is cut into windows of
//!   [`FIRST_FIT_WINDOW`] positions (a cycle's last window is shorter).
//!   A window's documents, longer ones split into pieces of `L` tokens and a
//!   shorter last piece, are placed in order, each piece in the first row
//!   with room for it (a new row when none has); rows are padded. The rows
//!   of window 0 of cycle 0 come first, then window 1, and so on.
//!
//! # Added tokens, labels, token types
//!
//! * [`Pack::bos_id`] / [`Pack::eod_id`]: the packer adds a BOS token
//!   before and an EOD token after every document (nothing is stored): a
//!   document of `n` tokens is `n + 2` tokens of the stream, everywhere
//!   (lengths, rows, positions: BOS is position 0). An empty document is
//!   then `[BOS, EOD]`.
//! * [`Pack::labels`]: two more columns. `labels` holds each token's next
//!   token, `loss_mask` (`u8`) 1 where that label is to be trained. In
//!   concat mode, the label of row `g`'s last token is row `g + 1`'s first
//!   token: a row is tokens `g·L .. g·L + L + 1` of the stream, overlapping
//!   the next row by one (Megatron's `seq_length + 1` samples), so every
//!   token of the stream but the first is some row's label, once. The
//!   token past a stretch of consecutive rows is read as one more piece.
//!   With [`Pack::mask_boundaries`], `loss_mask` is 0 at each document's
//!   last token (its EOD, with `eod_id`), whose label is the next document's
//!   first token. In first-fit mode a row stands alone: a token's label is
//!   the next token of the row, except that a piece of a document cut at
//!   `seq_len` takes its document's next token as its last label (taken
//!   from the batch when another row of it holds that token, else read as
//!   one more piece); labels of padding, of a row's last token (unless cut),
//!   and of a document's last token before padding are `pad_id`, masked.
//! * Token types: each source's stored tokens have their own integer type
//!   ([`TokenType`]; [`Loader::new_packed_typed`](crate::Loader::new_packed_typed)),
//!   delivered as `token_bytes` (and [`Pack::signed`]). Runs of whole
//!   documents are then gathered into a scratch buffer and widened into
//!   the batch; a token the delivered type cannot hold fails the step,
//!   naming the source, the document and the value.
//!
//! # Seeking, and what is kept
//!
//! Row `g` is found without replaying the stream. Each cycle has an index,
//! built lazily by one pass over its documents' lengths (the store's record
//! table; no token is read): for concat, the tokens before every
//! [`MARK_EVERY`]-th position; for first fit, the rows before every window
//! (counting a window's rows packs its lengths). A row is then a binary
//! search in the index and a scan of at most `MARK_EVERY` lengths, or one
//! window's packing (the last [`WINDOWS_KEPT`] windows are kept).
//!
//! Where the cycles begin (in tokens or rows) is a running sum over cycles.
//! In concat mode over a mode whose every cycle is a permutation of the
//! documents (sequential, cyclic) each cycle holds the same tokens, so cycle
//! `c` begins at `c·T` and seeking costs one index. Otherwise (first fit,
//! where the rows of a cycle depend on its order, and concat over iid
//! draws or any other mode) the cycles' totals are summed as the run
//! reaches them, one lengths pass per cycle, and kept as 8 bytes per cycle
//! passed; a run resumed in cycle `c` makes the `c` passes once, when its
//! first step is gathered.
//!
//! Memory: each kept cycle index is `8·⌈n / MARK_EVERY⌉` bytes (concat) or
//! `8·⌈n / FIRST_FIT_WINDOW⌉` bytes (first fit), at most [`CYCLES_KEPT`] of
//! them; a kept first-fit window is 32 bytes per piece. Nothing grows with
//! the steps taken except those 8 bytes per cycle, and the state is the
//! loader's usual few integers.
//!
//! # Mode 3: windows read ahead
//!
//! In mode 3 the document order draws a window of blocks of consecutive
//! documents at a time ([`zring_sampler::Blocks::DEFAULT`]: the packer's
//! order has no other shape). A loader of one shard reads each source's
//! windows ahead (`crate::prefetch::run_packed`): the
//! steps that read a window are those whose rows hold its documents'
//! tokens ([`Packer::rows_of_positions`]), and the window is read once a
//! step of the window before it is claimed, unless it would not fit a
//! quarter of the source's memory ([`Packer::window_fits`]).
//!
//! # Copying tokens
//!
//! A run of whole documents that sits contiguously in the batch (all but
//! the first and last document of a concat stretch; a first-fit row's whole
//! documents, which are placed first in it) is gathered by the store
//! straight into the batch buffer, in one ragged gather per run, each
//! document checked against its checksum.
//!
//! A piece of a document (the ends of a concat stretch, the pieces of a
//! long document in first fit) is read so that a step reads about the
//! tokens it delivers, however long the document (a row of 4,096 tokens
//! cut from an 8 M-token document is 8 KiB, the document 16 MiB):
//!
//! * A document the source reads in part ([`Source::reads_in_part`]: a
//!   store's raw record) is read as spans ([`Source::gather_spans`]) straight
//!   into the batch buffer: a piece of at least half its document reads the
//!   document whole and checks it, a shorter one reads only its own bytes,
//!   unchecked (the document's checksum covers the whole document; see
//!   `zring_engine::Spans`). A step reads at most twice the tokens it
//!   delivers.
//! * Any other document (a compressed record) is read and decoded whole,
//!   and the thread keeps it for the pieces of later steps: each thread
//!   (each of the loader's workers) keeps one document, the last it read
//!   whole, so a long document is decoded once per worker that cuts pieces
//!   of it rather than once per step. The memory is that document's tokens
//!   per worker, given back when the worker ends.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use serde::{Deserialize, Serialize};
use zring_sampler::{Blocks, Mode, Sampler, MAX_BATCH};

use crate::pool::PAGE;
use crate::source::{Fingerprint, Layout, Request, Source, SourceError, Span};

/// The least memory a store holds a block read of a window in (its slabs
/// of 64 KiB and up), for [`Packer::window_fits`].
const WINDOW_SLAB_MIN: u64 = 64 << 10;

/// The rows of one packed stream are numbered `0 .. PACKED_ROWS`; the
/// loader's row sampler walks them in order, so a run would have to take
/// `2^62` rows before it wrapped.
pub const PACKED_ROWS: u64 = 1 << 62;

/// Positions per mark of a cycle's concat index: a row's start is found by
/// a binary search over the marks and a scan of at most this many lengths.
pub const MARK_EVERY: u64 = 64;

/// Positions (documents) per first-fit window.
pub const FIRST_FIT_WINDOW: u64 = 1024;

/// Cycle indices kept: enough for the steps in flight to straddle a cycle's
/// end.
pub const CYCLES_KEPT: usize = 4;

/// First-fit windows kept, packed.
pub const WINDOWS_KEPT: usize = 8;

/// How documents become rows (module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PackMode {
    /// Documents back to back, cut every `seq_len` tokens; nothing padded.
    Concat,
    /// Whole documents (pieces of `seq_len` for longer ones) placed first-fit
    /// into padded rows, window by window.
    FirstFit,
}

/// What a packed loader makes of its sources' documents; a saved
/// [`LoaderState`](crate::LoaderState) carries it, and a resume must give
/// the same. The fields added after the first four default to what a state
/// saved without them meant, so older states resume.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Pack {
    /// Tokens per row.
    pub seq_len: u64,
    /// Concat or first fit.
    pub mode: PackMode,
    /// The token written into padding (first fit), as the bits of one
    /// little-endian token of `token_bytes`.
    pub pad_id: u64,
    /// The size of one delivered token in bytes: 1, 2, 4 or 8.
    pub token_bytes: u64,
    /// Whether delivered tokens are signed (only for range checks when a
    /// source's tokens are of another type; not part of a resume's check).
    #[serde(default, skip_serializing_if = "is_false")]
    pub signed: bool,
    /// Two more columns, `labels` (each token's next token, module docs
    /// "Labels") and `loss_mask`.
    #[serde(default, skip_serializing_if = "is_false")]
    pub labels: bool,
    /// With `labels`: `loss_mask` 0 at each document's last token (whose
    /// label is the first token of another document).
    #[serde(default, skip_serializing_if = "is_false")]
    pub mask_boundaries: bool,
    /// A token added after every document (bits as `pad_id`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eod_id: Option<u64>,
    /// A token added before every document (bits as `pad_id`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bos_id: Option<u64>,
}

fn is_false(b: &bool) -> bool {
    !*b
}

impl Pack {
    /// Rows of `seq_len` tokens of `token_bytes` bytes, nothing added.
    pub fn new(seq_len: u64, mode: PackMode, pad_id: u64, token_bytes: u64) -> Pack {
        Pack {
            seq_len,
            mode,
            pad_id,
            token_bytes,
            signed: false,
            labels: false,
            mask_boundaries: false,
            eod_id: None,
            bos_id: None,
        }
    }

    /// The names of the batch's columns, in order: `tokens`, `segment_ids`,
    /// `positions`, then with `labels` `labels` and `loss_mask`.
    pub fn columns(&self) -> &'static [&'static str] {
        if self.labels {
            &COLUMNS_LABELS
        } else {
            &COLUMNS
        }
    }

    /// Bytes of one row of each column ([`Pack::columns`]): tokens, segment
    /// ids and positions (`i32`), labels (tokens), loss mask (`u8`).
    pub fn row_bytes(&self) -> Vec<usize> {
        // Lossless after `check`: seq_len * token_bytes fits a usize.
        let l = self.seq_len as usize;
        let t = l * self.token_bytes as usize;
        let mut w = vec![t, l * 4, l * 4];
        if self.labels {
            w.extend([t, l]);
        }
        w
    }

    /// Tokens added to every document: BOS and EOD.
    pub(crate) fn added(&self) -> u64 {
        u64::from(self.bos_id.is_some()) + u64::from(self.eod_id.is_some())
    }

    /// Whether a state saved with `saved` resumes a loader of `self`
    /// (everything but `signed`).
    pub(crate) fn resumes(&self, saved: &Pack) -> bool {
        Pack { signed: false, ..*self } == Pack { signed: false, ..*saved }
    }

    /// `Some((field, value, expected))` for the first field out of range.
    pub(crate) fn check(&self) -> Option<(&'static str, u64, &'static str)> {
        if self.seq_len == 0 || self.seq_len > i32::MAX as u64 {
            return Some(("seq_len", self.seq_len, "1 ..= 2^31 - 1"));
        }
        if ![1, 2, 4, 8].contains(&self.token_bytes) {
            return Some(("token_bytes", self.token_bytes, "1, 2, 4 or 8"));
        }
        let fits = |v: u64| self.token_bytes == 8 || v >> (8 * self.token_bytes) == 0;
        for (field, v) in [("pad_id", Some(self.pad_id)), ("eod_id", self.eod_id), ("bos_id", self.bos_id)] {
            if let Some(v) = v.filter(|&v| !fits(v)) {
                return Some((field, v, "a value of the token type"));
            }
        }
        if self.mask_boundaries && !self.labels {
            return Some(("mask_boundaries", 1, "only with labels"));
        }
        None
    }
}

/// The integer type of a source's stored tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TokenType {
    /// Bytes per token: 1, 2, 4 or 8.
    pub bytes: u64,
    /// Signed (two's complement) or unsigned.
    pub signed: bool,
}

impl TokenType {
    fn name(&self) -> String {
        format!("{}int{}", if self.signed { "" } else { "u" }, self.bytes * 8)
    }

    /// The token at the start of `b`, widened losslessly.
    fn read(&self, b: &[u8]) -> i128 {
        let mut raw = [0u8; 8];
        // Lossless: bytes is 1, 2, 4 or 8.
        let n = self.bytes as usize;
        raw[..n].copy_from_slice(&b[..n]);
        let u = u64::from_le_bytes(raw);
        if self.signed && n < 8 {
            let shift = 64 - 8 * n as u32;
            i128::from(((u << shift) as i64) >> shift)
        } else if self.signed {
            i128::from(u as i64)
        } else {
            i128::from(u)
        }
    }

    fn range(&self) -> (i128, i128) {
        let bits = 8 * self.bytes as u32;
        if self.signed {
            (-(1i128 << (bits - 1)), (1i128 << (bits - 1)) - 1)
        } else {
            (0, (1i128 << bits) - 1)
        }
    }
}

/// One source of a packed loader that may hold tokens of another type than
/// the delivered ones ([`Loader::new_packed_typed`](crate::Loader::new_packed_typed)).
#[derive(Clone)]
pub struct PackSource {
    /// Its weight in a mixture.
    pub weight: f64,
    /// A ragged source of token documents.
    pub source: Arc<dyn Source>,
    /// The type of its stored tokens.
    pub tokens: TokenType,
    /// How errors name it besides its number (a path, say).
    pub name: Option<String>,
}

/// The names of a packed batch's columns, in order.
pub const COLUMNS: [&str; 3] = ["tokens", "segment_ids", "positions"];

/// The columns of a packed batch with labels, in order.
pub const COLUMNS_LABELS: [&str; 5] = ["tokens", "segment_ids", "positions", "labels", "loss_mask"];

/// One piece of a document placed in a batch: tokens `start .. start + len`
/// of `doc` (of `doc_len` tokens), at token `dst` of the batch's rows.
#[derive(Clone, Copy, Debug)]
struct Piece {
    doc: u64,
    doc_len: u64,
    start: u64,
    len: u64,
    dst: u64,
    /// Set on stored pieces (`Packer::stored`) that follow the one before
    /// them with only added tokens (EOD, BOS) between.
    joined: bool,
}

impl Piece {
    fn whole(&self) -> bool {
        self.start == 0 && self.len == self.doc_len
    }
}

/// One cycle's index (module docs): `marks[j]` the tokens (concat) or rows
/// (first fit) before mark `j`, `total` those of the whole cycle.
struct CycleIndex {
    marks: Vec<u64>,
    total: u64,
}

/// One first-fit window, packed: row `r` is `pieces[ends[r-1]..ends[r]]`
/// (`dst` counted from the row's start).
struct Window {
    pieces: Vec<Piece>,
    ends: Vec<usize>,
}

struct Cycles {
    /// `starts[c]`: the tokens or rows before cycle `c`, for the cycles
    /// summed so far (module docs); unused when every cycle is alike.
    starts: Vec<u64>,
    recent: VecDeque<(u64, Arc<CycleIndex>)>,
}

/// One source's packing: its document order, and the indices that make a
/// row's documents quick to find.
pub(crate) struct Packer {
    /// Unique in the process: names this packer's kept documents.
    id: u64,
    source: Arc<dyn Source>,
    pack: Pack,
    docs: u64,
    order: Sampler,
    /// The type of the source's stored tokens, and of the delivered ones.
    stored: TokenType,
    out: TokenType,
    /// The source as errors name it.
    name: String,
    /// Tokens per cycle, in concat mode over a mode whose cycles are all
    /// permutations of the documents.
    uniform: Option<u64>,
    cycles: Mutex<Cycles>,
    windows: Mutex<VecDeque<(u64, Arc<Window>)>>,
}

/// Whether every cycle of `mode` (one step of `n`) draws each document
/// exactly once.
/// Only a shortcut for seeking: a mode not named here takes the general path.
fn cycles_are_permutations(mode: Mode) -> bool {
    matches!(mode, Mode::Sequential | Mode::Cyclic)
}

fn err(msg: String) -> SourceError {
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

    /// The documents at positions `first .. first + out.len()`: position
    /// `p` is slot `p % block` of the order's step `p / block`.
    fn order_fill(&self, first: u64, out: &mut [u64]) -> Result<(), SourceError> {
        let block = self.order.batch_len() as u64;
        let mut p = first;
        let mut rest = out;
        while !rest.is_empty() {
            let (step, slot) = (p / block, p % block);
            // Lossless: both are at most the block, a usize.
            let take = (block - slot).min(rest.len() as u64) as usize;
            let (now, later) = rest.split_at_mut(take);
            self.order.fill_slots(step, slot as usize, now)?;
            p += take as u64;
            rest = later;
        }
        Ok(())
    }

    /// The documents at positions `first..first + docs.len()` and their
    /// lengths in tokens.
    fn docs_at(&self, src: &dyn Source, first: u64, docs: &mut [u64], lens: &mut [u64]) -> Result<(), SourceError> {
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
    fn cycle(&self, c: u64, src: &dyn Source) -> Result<Arc<CycleIndex>, SourceError> {
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

    fn build_cycle(&self, c: u64, src: &dyn Source) -> Result<CycleIndex, SourceError> {
        let n = self.docs;
        let base = c.checked_mul(n).ok_or_else(|| err(format!("cycle {c} is past the end of the position stream")))?;
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
    fn locate(&self, u: u64, src: &dyn Source) -> Result<(u64, u64, Arc<CycleIndex>), SourceError> {
        if let Some(t) = self.uniform {
            let c = u / t;
            return Ok((c, u % t, self.cycle(c, src)?));
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
    fn sum_next_cycle(&self, src: &dyn Source) -> Result<(), SourceError> {
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
        let n = self.docs;
        if rows == 0 {
            return Ok((0, n));
        }
        let begun = match self.pack.mode {
            PackMode::Concat => {
                let u = rows.saturating_mul(self.pack.seq_len);
                let (c, o, idx) = self.locate(u, src)?;
                let j = idx.marks.partition_point(|&m| m <= o) - 1;
                let mut acc = idx.marks[j];
                let first = c * n + j as u64 * MARK_EVERY;
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
                let j = idx.marks.partition_point(|&m| m <= o) - 1;
                let r = (o - idx.marks[j]) as usize;
                let w = self.window(c, j as u64, src)?;
                let placed = if r == 0 { 0 } else { w.ends[r - 1] };
                let begun = w.pieces[..placed].iter().filter(|p| p.start == 0).count() as u64;
                c * n + j as u64 * FIRST_FIT_WINDOW + begun
            }
        };
        Ok((begun, n))
    }

    fn window(&self, c: u64, j: u64, src: &dyn Source) -> Result<Arc<Window>, SourceError> {
        let per_cycle = self.docs.div_ceil(FIRST_FIT_WINDOW);
        let key = c.saturating_mul(per_cycle).saturating_add(j);
        {
            let kept = self.windows.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some((_, w)) = kept.iter().find(|(k, _)| *k == key) {
                return Ok(Arc::clone(w));
            }
        }
        let first = j * FIRST_FIT_WINDOW;
        let take = FIRST_FIT_WINDOW.min(self.docs - first) as usize;
        let (mut docs, mut lens) = (vec![0; take], vec![0; take]);
        self.docs_at(src, c * self.docs + first, &mut docs, &mut lens)?;
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

    /// The shape the source reads best in mode 3 ([`Source::block_shape`]):
    /// a window of it is what the source's memory holds at a quarter.
    pub(crate) fn source_shape(&self) -> Option<Blocks> {
        self.source.block_shape()
    }

    /// Loads the documents of `blocks` (index ranges) ahead of the rows
    /// that read them ([`Source::prefetch`]).
    pub(crate) fn prefetch(&self, blocks: &[Range<u64>]) -> Result<(), SourceError> {
        self.source.prefetch(blocks, &[])
    }

    /// Whether a window of the document order of these blocks (document
    /// ranges) fits the memory the source loads windows into, as its own
    /// mode-3 shape would ([`Source::block_shape`]: a window of a quarter of
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
        let (c, q) = (p / self.docs, p % self.docs);
        Some((c, self.order.cycle_window_of(c, q)?))
    }

    /// Window `w` of cycle `c` of the document order (mode 3): its positions
    /// in the stream and its blocks' document ranges; `None` past the
    /// cycle's last window.
    pub(crate) fn order_window(&self, c: u64, w: u64) -> Option<(Range<u64>, Vec<Range<u64>>)> {
        let (q, blocks) = self.order.cycle_window(c, w)?;
        let base = c.checked_mul(self.docs)?;
        Some((base.checked_add(q.start)?..base.checked_add(q.end)?, blocks))
    }

    /// The first position of the document stream that row `row`, or any
    /// row after it, reads: in concat mode the document holding the row's
    /// first token, in first fit the first position of its window.
    pub(crate) fn first_position_of_row(&self, row: u64) -> Result<u64, SourceError> {
        let src = &*self.source;
        let n = self.docs;
        match self.pack.mode {
            PackMode::Concat => {
                let u =
                    row.checked_mul(self.pack.seq_len).ok_or_else(|| err(format!("row {row} is past 2^64 tokens")))?;
                let (c, o, idx) = self.locate(u, src)?;
                let j = idx.marks.partition_point(|&m| m <= o) - 1;
                let first = c * n + j as u64 * MARK_EVERY;
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
                Ok(c * n + j as u64 * FIRST_FIT_WINDOW)
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

    /// The tokens (concat) or rows (first fit) before cycle `c`.
    fn cycle_start(&self, c: u64, src: &dyn Source) -> Result<u64, SourceError> {
        if let Some(t) = self.uniform {
            return c.checked_mul(t).ok_or_else(|| err(format!("cycle {c} is past 2^64 tokens")));
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
    fn tokens_before(&self, p: u64, src: &dyn Source) -> Result<u64, SourceError> {
        let n = self.docs;
        let (c, q) = (p / n, p % n);
        let start = self.cycle_start(c, src)?;
        let idx = self.cycle(c, src)?;
        let j = q / MARK_EVERY;
        // Lossless: under MARK_EVERY.
        let take = (q - j * MARK_EVERY) as usize;
        let (mut docs, mut lens) = (vec![0u64; take], vec![0u64; take]);
        if take > 0 {
            self.docs_at(src, c * n + j * MARK_EVERY, &mut docs, &mut lens)?;
        }
        Ok(start + idx.marks[j as usize] + lens.iter().sum::<u64>())
    }

    /// First fit: the rows of the stream before the first-fit window that
    /// holds position `p`, or with `up` before the first window starting
    /// at or after `p`.
    fn rows_before_window(&self, p: u64, up: bool, src: &dyn Source) -> Result<u64, SourceError> {
        let n = self.docs;
        let (c, q) = (p / n, p % n);
        let start = self.cycle_start(c, src)?;
        let idx = self.cycle(c, src)?;
        let j = if up { q.div_ceil(FIRST_FIT_WINDOW) } else { q / FIRST_FIT_WINDOW };
        Ok(start + usize::try_from(j).ok().and_then(|j| idx.marks.get(j)).copied().unwrap_or(idx.total))
    }

    /// Fills the rows `rows` (numbers in this packer's row stream) into the
    /// column buffers ([`Pack::columns`]), row `i` at `i`'s place in each;
    /// the documents' gathers fan out as `fan_out` says
    /// ([`Request::fan_out`]).
    pub(crate) fn fill(&self, rows: &[u64], bufs: &mut [&mut [u8]], fan_out: bool) -> Result<(), SourceError> {
        let view = self.source.view()?;
        let src: &dyn Source = view.as_deref().unwrap_or(&*self.source);
        let l = self.pack.seq_len;
        let labels = self.pack.labels;
        let (tok, seg, pos, rest) = match bufs {
            [tok, seg, pos, rest @ ..] => (&mut **tok, &mut **seg, &mut **pos, rest),
            _ => return Err(err("a packed fill needs at least three column buffers".into())),
        };
        let mut pieces = Vec::new();
        // With labels: the one token each label run needs past the tokens
        // delivered (module docs, "Labels"), and the label slot it fills.
        let mut tails: Vec<Piece> = Vec::new();
        let mut tail_at: Vec<(u64, bool)> = Vec::new();
        match self.pack.mode {
            PackMode::Concat => {
                // Stretches of consecutive rows are one stretch of tokens.
                let mut i = 0;
                while i < rows.len() {
                    let mut k = i + 1;
                    while k < rows.len() && rows[k] == rows[k - 1].wrapping_add(1) {
                        k += 1;
                    }
                    let t0 =
                        rows[i].checked_mul(l).ok_or_else(|| err(format!("row {} is past 2^64 tokens", rows[i])))?;
                    let n = (k - i) as u64 * l;
                    self.concat_pieces(t0, n + u64::from(labels), i as u64 * l, src, &mut pieces)?;
                    if labels {
                        // The stretch's one token more is the last label.
                        let last = pieces.last_mut().expect("a stretch has tokens");
                        let tail = Piece { start: last.start + last.len - 1, len: 1, dst: tails.len() as u64, ..*last };
                        last.len -= 1;
                        if last.len == 0 {
                            pieces.pop();
                        }
                        tails.push(tail);
                        // Its first token: the stretch ends a document.
                        tail_at.push((k as u64 * l - 1, tail.start == 0));
                    }
                    i = k;
                }
            }
            PackMode::FirstFit => {
                for (i, &g) in rows.iter().enumerate() {
                    let (c, o, idx) = self.locate(g, src)?;
                    let j = idx.marks.partition_point(|&m| m <= o) - 1;
                    let w = self.window(c, j as u64, src)?;
                    let r = (o - idx.marks[j]) as usize;
                    let from = if r == 0 { 0 } else { w.ends[r - 1] };
                    let row0 = i as u64 * l;
                    pieces.extend(w.pieces[from..w.ends[r]].iter().map(|p| Piece { dst: row0 + p.dst, ..*p }));
                }
                if labels {
                    // A piece cut before its document's end: its last
                    // label is the document's next token.
                    for p in pieces.iter().filter(|p| p.start + p.len < p.doc_len) {
                        tails.push(Piece { start: p.start + p.len, len: 1, dst: tails.len() as u64, ..*p });
                        tail_at.push((p.dst + p.len - 1, false));
                    }
                }
            }
        }
        self.write_layout(&pieces, rows.len() as u64, seg, pos, tok);
        self.copy_tokens(&pieces, src, tok, fan_out)?;
        if let [lab, mask, ..] = rest {
            let tb = self.pack.token_bytes as usize;
            let mut tail = vec![0u8; tails.len() * tb];
            // A tail token this batch already holds (in first fit, the cut
            // document goes on in another row of the batch) is taken from
            // the batch; the others are read.
            let mut read = Vec::new();
            for t in &tails {
                let j = t.dst as usize;
                match pieces.iter().find(|p| p.doc == t.doc && p.start == t.start) {
                    Some(p) => {
                        let d = p.dst as usize * tb;
                        tail[j * tb..(j + 1) * tb].copy_from_slice(&tok[d..d + tb]);
                    }
                    None => read.push(*t),
                }
            }
            self.copy_tokens(&read, src, &mut tail, fan_out)?;
            self.write_labels(&pieces, rows.len() as u64, tok, seg, lab, mask, &tail, &tail_at);
        }
        Ok(())
    }

    /// The labels and loss mask of `rows` rows (module docs, "Labels"):
    /// each token's label is the next token of the row, or for the slots
    /// `tail_at` (and whether the tail starts a document) the tokens
    /// `tail`; padding and, with `mask_boundaries`,
    /// documents' last tokens are masked.
    #[allow(clippy::too_many_arguments)]
    fn write_labels(
        &self,
        pieces: &[Piece],
        rows: u64,
        tok: &[u8],
        seg: &[u8],
        lab: &mut [u8],
        mask: &mut [u8],
        tail: &[u8],
        tail_at: &[(u64, bool)],
    ) {
        let l = self.pack.seq_len as usize;
        let tb = self.pack.token_bytes as usize;
        let n = rows as usize * l;
        if n == 0 {
            return;
        }
        let pad = &self.pack.pad_id.to_le_bytes()[..tb];
        lab[..(n - 1) * tb].copy_from_slice(&tok[tb..n * tb]);
        let first_fit = self.pack.mode == PackMode::FirstFit;
        let padded = |x: usize| seg[x * 4..x * 4 + 4] == [0, 0, 0, 0];
        if first_fit {
            // Rows stand alone and end in padding (whose tokens, and so
            // labels, are already the pad): a row's last slot has a label
            // only through a tail.
            mask[..n].fill(0);
            for p in pieces {
                mask[p.dst as usize..(p.dst + p.len) as usize].fill(1);
            }
            for r in 0..rows as usize {
                let x = (r + 1) * l - 1;
                lab[x * tb..(x + 1) * tb].copy_from_slice(pad);
                mask[x] = 0;
            }
        } else {
            mask[..n].fill(1);
        }
        if self.pack.mask_boundaries || first_fit {
            for p in pieces.iter().filter(|p| p.start + p.len == p.doc_len) {
                // A document's last token: its label is whatever follows it
                // in the row (in first fit, another document or padding).
                let x = (p.dst + p.len - 1) as usize;
                let alone = first_fit && ((x + 1).is_multiple_of(l) || padded(x + 1));
                if self.pack.mask_boundaries || alone {
                    mask[x] = 0;
                }
            }
        }
        for (j, &(x, ends_doc)) in tail_at.iter().enumerate() {
            let x = x as usize;
            lab[x * tb..(x + 1) * tb].copy_from_slice(&tail[j * tb..(j + 1) * tb]);
            // Masked only after a document's end (concat, mask_boundaries).
            mask[x] = u8::from(!(self.pack.mask_boundaries && ends_doc));
        }
    }

    /// The pieces of stream tokens `t0 .. t0 + count`, the first at `dst`.
    fn concat_pieces(
        &self,
        t0: u64,
        count: u64,
        dst: u64,
        src: &dyn Source,
        out: &mut Vec<Piece>,
    ) -> Result<(), SourceError> {
        let (c, o, idx) = self.locate(t0, src)?;
        let j = idx.marks.partition_point(|&m| m <= o) - 1;
        let mut acc = idx.marks[j];
        let mut p = c * self.docs + j as u64 * MARK_EVERY;
        let (mut docs, mut lens) = (vec![0u64; MARK_EVERY as usize], vec![0u64; MARK_EVERY as usize]);
        let mut k = docs.len();
        let mut next = |p: u64, k: &mut usize| -> Result<(u64, u64), SourceError> {
            if *k == docs.len() {
                self.docs_at(src, p, &mut docs, &mut lens)?;
                *k = 0;
            }
            *k += 1;
            Ok((docs[*k - 1], lens[*k - 1]))
        };
        // The document holding token `o` of the cycle, and `o`'s offset in it.
        let (mut doc, mut len) = next(p, &mut k)?;
        while acc + len <= o {
            acc += len;
            p += 1;
            (doc, len) = next(p, &mut k)?;
        }
        let mut start = o - acc;
        let mut at = dst;
        let end = dst + count;
        loop {
            let take = (len - start).min(end - at);
            if take > 0 {
                out.push(Piece { doc, doc_len: len, start, len: take, dst: at, joined: false });
            }
            at += take;
            if at == end {
                return Ok(());
            }
            p += 1;
            start = 0;
            (doc, len) = next(p, &mut k)?;
        }
    }

    /// Segment ids and positions of `rows` rows from their pieces (sorted
    /// by `dst`); padding: segment 0, position 0.
    fn write_layout(&self, pieces: &[Piece], rows: u64, seg: &mut [u8], pos: &mut [u8], tok: &mut [u8]) {
        let l = self.pack.seq_len;
        let tb = self.pack.token_bytes as usize;
        let pad = &self.pack.pad_id.to_le_bytes()[..tb];
        let mut filled = 0u64;
        let mut row = u64::MAX;
        let mut id = 0i32;
        let put_pad = |from: u64, to: u64, seg: &mut [u8], pos: &mut [u8], tok: &mut [u8]| {
            let (a, z) = (from as usize, to as usize);
            seg[a * 4..z * 4].fill(0);
            pos[a * 4..z * 4].fill(0);
            for t in tok[a * tb..z * tb].chunks_exact_mut(tb) {
                t.copy_from_slice(pad);
            }
        };
        for p in pieces {
            if p.dst > filled {
                put_pad(filled, p.dst, seg, pos, tok);
            }
            let mut d = p.dst;
            let end = p.dst + p.len;
            while d < end {
                let r = d / l;
                let e = end.min((r + 1) * l);
                if r != row {
                    row = r;
                    id = 0;
                }
                id += 1;
                // Lossless: document lengths are checked to fit an i32.
                let first = (p.start + (d - p.dst)) as i32;
                let (a, z) = (d as usize * 4, e as usize * 4);
                let id_bytes = id.to_le_bytes();
                for s in seg[a..z].chunks_exact_mut(4) {
                    s.copy_from_slice(&id_bytes);
                }
                for (q, at) in pos[a..z].chunks_exact_mut(4).zip(first..) {
                    q.copy_from_slice(&at.to_le_bytes());
                }
                d = e;
            }
            filled = end;
        }
        if filled < rows * l {
            put_pad(filled, rows * l, seg, pos, tok);
        }
    }

    /// Copies the tokens of `pieces` into `tok`: the stored tokens
    /// ([`Packer::copy_stored`]), then the added ones (EOD, BOS).
    fn copy_tokens(
        &self,
        pieces: &[Piece],
        src: &dyn Source,
        tok: &mut [u8],
        fan_out: bool,
    ) -> Result<(), SourceError> {
        if self.pack.added() == 0 {
            return self.copy_stored(pieces, src, tok, fan_out);
        }
        let (stored, added) = self.stored_pieces(pieces);
        self.copy_stored(&stored, src, tok, fan_out)?;
        let tb = self.pack.token_bytes as usize;
        for (dst, id) in added {
            // Lossless: inside the batch.
            let d = dst as usize * tb;
            tok[d..d + tb].copy_from_slice(&id.to_le_bytes()[..tb]);
        }
        Ok(())
    }

    /// `pieces` of documents with BOS and EOD added as pieces of the stored
    /// documents, and the added tokens as `(dst, token)`.
    fn stored_pieces(&self, pieces: &[Piece]) -> (Vec<Piece>, Vec<(u64, u64)>) {
        let b = u64::from(self.pack.bos_id.is_some());
        let mut stored: Vec<Piece> = Vec::with_capacity(pieces.len());
        let mut added = Vec::new();
        let mut last: Option<Piece> = None;
        for p in pieces {
            let m = p.doc_len - self.pack.added();
            let end = p.start + p.len;
            if let (Some(bos), 0) = (self.pack.bos_id, p.start) {
                added.push((p.dst, bos));
            }
            let (s0, s1) = (p.start.max(b), end.min(b + m));
            if s1 > s0 {
                // Right after the stored piece of the piece just before,
                // which ended its document, with only added tokens between.
                let joined = last.is_some_and(|q| q.dst + q.len == p.dst && q.start + q.len == q.doc_len)
                    && p.start == 0
                    && stored.last().is_some_and(|q| q.doc == last.map_or(u64::MAX, |l| l.doc));
                stored.push(Piece {
                    doc: p.doc,
                    doc_len: m,
                    start: s0 - b,
                    len: s1 - s0,
                    dst: p.dst + (s0 - p.start),
                    joined,
                });
            }
            if let (Some(eod), true) = (self.pack.eod_id, end == p.doc_len) {
                added.push((p.dst + p.len - 1, eod));
            }
            last = Some(*p);
        }
        (stored, added)
    }

    /// Writes the stored tokens `from` (of [`Packer::stored`] type) as
    /// delivered tokens into `to`, refusing a token the delivered type
    /// cannot hold.
    fn put(&self, from: &[u8], to: &mut [u8], doc: u64) -> Result<(), SourceError> {
        if self.stored == self.out {
            to.copy_from_slice(from);
            return Ok(());
        }
        let (sb, tb) = (self.stored.bytes as usize, self.out.bytes as usize);
        let (lo, hi) = self.out.range();
        for (a, z) in from.chunks_exact(sb).zip(to.chunks_exact_mut(tb)) {
            let v = self.stored.read(a);
            if v < lo || v > hi {
                return Err(err(format!(
                    "{}: document {doc} holds the token {v}, which the delivered {} tokens cannot hold; deliver a \
                     wider type (zring.pack(..., dtype=...)) or rewrite the store",
                    self.name,
                    self.out.name()
                )));
            }
            z.copy_from_slice(&v.to_le_bytes()[..tb]);
        }
        Ok(())
    }

    /// Copies the stored tokens of `pieces` (pieces of stored documents)
    /// into `tok`: runs of whole documents straight from the store (through
    /// a scratch buffer when tokens change type or added tokens lie between
    /// them), pieces of documents as [`Packer::copy_cut`] says.
    fn copy_stored(
        &self,
        pieces: &[Piece],
        src: &dyn Source,
        tok: &mut [u8],
        fan_out: bool,
    ) -> Result<(), SourceError> {
        let (sb, tb) = (self.stored.bytes, self.pack.token_bytes);
        let same = self.stored == self.out;
        let mut docs = Vec::new();
        let mut offsets = Vec::new();
        let mut scratch = Vec::new();
        let mut i = 0;
        while i < pieces.len() {
            if !pieces[i].whole() {
                i += 1;
                continue;
            }
            let mut gaps = false;
            let mut k = i + 1;
            while k < pieces.len() && pieces[k].whole() {
                let next_to = pieces[k].dst == pieces[k - 1].dst + pieces[k - 1].len;
                if !next_to && !pieces[k].joined {
                    break;
                }
                gaps |= !next_to;
                k += 1;
            }
            docs.clear();
            offsets.clear();
            offsets.push(0);
            for p in &pieces[i..k] {
                docs.push(p.doc);
                offsets.push(offsets.last().copied().unwrap_or(0) + p.len * sb);
            }
            let bytes = *offsets.last().unwrap_or(&0) as usize;
            let req = Request::ragged(&docs, &offsets).fan_out(fan_out);
            if same && !gaps {
                let a = (pieces[i].dst * tb) as usize;
                src.gather(&req, &mut tok[a..a + bytes])?;
            } else {
                scratch.clear();
                scratch.resize(bytes, 0);
                src.gather(&req, &mut scratch)?;
                for (p, w) in pieces[i..k].iter().zip(offsets.windows(2)) {
                    let d = (p.dst * tb) as usize;
                    let n = (p.len * tb) as usize;
                    self.put(&scratch[w[0] as usize..w[1] as usize], &mut tok[d..d + n], p.doc)?;
                }
            }
            i = k;
        }
        self.copy_cut(pieces, src, tok, fan_out)
    }

    /// Copies the pieces of documents cut at a row's edge (module docs,
    /// "Copying tokens"): from the document this thread keeps, else as
    /// spans of the documents the source reads in part, else from the
    /// document read whole, which this thread then keeps.
    fn copy_cut(&self, pieces: &[Piece], src: &dyn Source, tok: &mut [u8], fan_out: bool) -> Result<(), SourceError> {
        let (sb, tb) = (self.stored.bytes, self.pack.token_bytes);
        let cut: Vec<&Piece> = pieces.iter().filter(|p| !p.whole()).collect();
        if cut.is_empty() {
            return Ok(());
        }
        let copy = |p: &Piece, doc: &[u8], tok: &mut [u8]| {
            // Lossless: the piece lies inside its document and the rows.
            let (from, n) = ((p.start * sb) as usize, (p.len * sb) as usize);
            let (d, m) = ((p.dst * tb) as usize, (p.len * tb) as usize);
            self.put(&doc[from..from + n], &mut tok[d..d + m], p.doc)
        };
        // Each cut document once, in the order of its first piece.
        let mut docs: Vec<(u64, u64)> = Vec::new();
        for p in &cut {
            if !docs.iter().any(|&(d, _)| d == p.doc) {
                docs.push((p.doc, p.doc_len));
            }
        }
        let mut failed = Ok(());
        KEPT.with(|kept| {
            let kept = kept.borrow();
            docs.retain(|&(doc, len)| {
                let Some(k) = kept.as_ref().filter(|k| k.holds(self.id, doc, len * sb)) else { return true };
                for p in cut.iter().filter(|p| p.doc == doc) {
                    if let Err(e) = copy(p, &k.tokens, tok) {
                        failed = Err(e);
                    }
                }
                false
            });
        });
        failed?;
        if docs.is_empty() {
            return Ok(());
        }
        let ids: Vec<u64> = docs.iter().map(|&(d, _)| d).collect();
        let mut in_part = vec![false; ids.len()];
        src.reads_in_part(&ids, &mut in_part)?;
        // Pieces of documents still to read (not kept) read in part.
        let parts: Vec<&&Piece> =
            cut.iter().filter(|p| ids.iter().position(|&d| d == p.doc).is_some_and(|k| in_part[k])).collect();
        if !parts.is_empty() {
            if self.stored == self.out {
                let spans: Vec<Span> = parts
                    .iter()
                    .map(|p| Span { index: p.doc, from: p.start * sb, len: p.len * sb, at: p.dst * tb })
                    .collect();
                src.gather_spans(&spans, tok, fan_out)?;
            } else {
                // Through a scratch buffer, one span after another.
                let mut at = 0;
                let mut spans = Vec::with_capacity(parts.len());
                for p in &parts {
                    spans.push(Span { index: p.doc, from: p.start * sb, len: p.len * sb, at });
                    at += p.len * sb;
                }
                let mut scratch = vec![0u8; at as usize];
                src.gather_spans(&spans, &mut scratch, fan_out)?;
                for (p, s) in parts.iter().zip(&spans) {
                    let (d, m) = ((p.dst * tb) as usize, (p.len * tb) as usize);
                    self.put(&scratch[s.at as usize..(s.at + s.len) as usize], &mut tok[d..d + m], p.doc)?;
                }
            }
        }
        // The rest are read whole, one at a time into this thread's kept
        // buffer; the last stays kept (in concat, the document the next row
        // goes on with).
        for (&(doc, len), _) in docs.iter().zip(&in_part).filter(|(_, &part)| !part) {
            let bytes = usize::try_from(len * sb).map_err(|_| err(format!("document {doc} is too large")))?;
            let mut buf = KEPT.with(|k| k.borrow_mut().take()).map(|k| k.tokens).unwrap_or_default();
            if buf.capacity() > 2 * bytes.max(1 << 20) {
                // Give back the memory of a much longer document.
                buf = Vec::new();
            }
            buf.clear();
            buf.resize(bytes, 0);
            src.gather(&Request::ragged(&[doc], &[0, len * sb]).fan_out(fan_out), &mut buf)?;
            for p in cut.iter().filter(|p| p.doc == doc) {
                copy(p, &buf, tok)?;
            }
            KEPT.with(|k| *k.borrow_mut() = Some(Kept { packer: self.id, doc, tokens: buf }));
        }
        Ok(())
    }

    pub(crate) fn source(&self) -> &Arc<dyn Source> {
        &self.source
    }
}

/// A document a thread read whole to copy pieces of it, kept for the
/// pieces later steps copy (module docs, "Copying tokens").
struct Kept {
    /// The [`Packer::id`] of the packer that read it.
    packer: u64,
    doc: u64,
    tokens: Vec<u8>,
}

impl Kept {
    /// Whether this is document `doc` of packer `packer`, of `bytes` bytes.
    /// A packer takes its documents to stay as they are, as its cycle
    /// indices do; the length check catches a document replaced (a delete
    /// moves the last record into its index) by one of another length.
    fn holds(&self, packer: u64, doc: u64, bytes: u64) -> bool {
        self.packer == packer && self.doc == doc && self.tokens.len() as u64 == bytes
    }
}

thread_local! {
    /// At most one document per thread (module docs, "Copying tokens").
    static KEPT: RefCell<Option<Kept>> = const { RefCell::new(None) };
}

/// Where packers get their [`Packer::id`].
static NEXT_PACKER: AtomicU64 = AtomicU64::new(0);

/// First fit of the documents `docs` (of `lens` tokens) into rows of `l`
/// tokens: each document in pieces of at most `l` tokens, each piece into
/// the first row with room. A row's whole documents come first in it, so
/// they can be gathered in one call.
fn first_fit(docs: &[u64], lens: &[u64], l: u64) -> Window {
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

/// One column of a packed source as a [`Source`] of fixed rows: the stream
/// the loader is built over. The loader fills all three columns of a step
/// with one call to the packer; `gather` here packs on its own (for a
/// caller that reads a column alone).
pub(crate) struct PackColumn {
    pub(crate) packer: Arc<Packer>,
    column: usize,
}

impl PackColumn {
    pub(crate) fn all(packer: &Arc<Packer>) -> Vec<PackColumn> {
        (0..packer.pack.columns().len()).map(|column| PackColumn { packer: Arc::clone(packer), column }).collect()
    }
}

impl Source for PackColumn {
    fn len(&self) -> u64 {
        PACKED_ROWS
    }

    fn layout(&self) -> Layout {
        Layout::Fixed { record_bytes: self.packer.pack.row_bytes()[self.column] }
    }

    fn gather(&self, req: &Request<'_>, dst: &mut [u8]) -> Result<(), SourceError> {
        let n = req.indices.len();
        let widths = self.packer.pack.row_bytes();
        let mut bufs: Vec<Vec<u8>> = widths.iter().map(|w| vec![0u8; n * w]).collect();
        let mut views: Vec<&mut [u8]> = bufs.iter_mut().map(|b| &mut b[..]).collect();
        self.packer.fill(req.indices, &mut views, req.fan_out)?;
        let width = self.packer.pack.row_bytes()[self.column];
        for (slot, row) in req.slots(self, dst)?.into_iter().zip(bufs[self.column].chunks_exact(width.max(1))) {
            slot.copy_from_slice(row);
        }
        Ok(())
    }

    fn lengths(&self, _: &[u64], _: &mut [u64]) -> Result<(), SourceError> {
        Err("a packed column has fixed rows".into())
    }

    /// The tokens column carries the documents' fingerprint.
    fn fingerprint(&self) -> Result<Option<Fingerprint>, SourceError> {
        if self.column == 0 {
            self.packer.source().fingerprint()
        } else {
            Ok(None)
        }
    }

    fn extends(&self, earlier: Fingerprint) -> Result<bool, SourceError> {
        if self.column == 0 {
            self.packer.source().extends(earlier)
        } else {
            Ok(false)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_fit_places_each_piece_in_the_first_row_with_room() {
        let w = first_fit(&[0, 1, 2, 3], &[6, 3, 5, 2], 8);
        let rows: Vec<Vec<(u64, u64, u64)>> = (0..w.ends.len())
            .map(|r| {
                let from = if r == 0 { 0 } else { w.ends[r - 1] };
                w.pieces[from..w.ends[r]].iter().map(|p| (p.doc, p.start, p.len)).collect()
            })
            .collect();
        // 6 opens row 0, 3 opens row 1, 5 fits row 1, 2 fits row 0.
        assert_eq!(rows, vec![vec![(0, 0, 6), (3, 0, 2)], vec![(1, 0, 3), (2, 0, 5)]]);
    }

    #[test]
    fn first_fit_cuts_long_documents_into_rows() {
        let w = first_fit(&[7], &[20], 8);
        let got: Vec<(u64, u64)> = w.pieces.iter().map(|p| (p.start, p.len)).collect();
        assert_eq!(got, vec![(0, 8), (8, 8), (16, 4)]);
        assert_eq!(w.ends, vec![1, 2, 3]);
    }

    #[test]
    fn pack_checks_its_fields() {
        let ok = Pack::new(4, PackMode::Concat, 255, 1);
        assert_eq!(ok.check(), None);
        assert_eq!(Pack { seq_len: 0, ..ok }.check().map(|c| c.0), Some("seq_len"));
        assert_eq!(Pack { token_bytes: 3, ..ok }.check().map(|c| c.0), Some("token_bytes"));
        assert_eq!(Pack { pad_id: 256, ..ok }.check().map(|c| c.0), Some("pad_id"));
        assert_eq!(Pack { eod_id: Some(300), ..ok }.check().map(|c| c.0), Some("eod_id"));
        assert_eq!(Pack { mask_boundaries: true, ..ok }.check().map(|c| c.0), Some("mask_boundaries"));
    }

    #[test]
    fn a_pack_saved_before_labels_reads_back_as_nothing_added() {
        let old: Pack = serde_json::from_str(r#"{"seq_len":4,"mode":"first_fit","pad_id":0,"token_bytes":2}"#).unwrap();
        assert_eq!(old, Pack::new(4, PackMode::FirstFit, 0, 2));
        // And a pack without the new fields writes what older versions read.
        assert_eq!(
            serde_json::to_string(&old).unwrap(),
            r#"{"seq_len":4,"mode":"first_fit","pad_id":0,"token_bytes":2}"#
        );
        assert!(Pack { signed: true, ..old }.resumes(&old));
    }
}

//! Packed token rows: the documents of a ragged source of tokens, in the
//! order of a document sampler, cut and packed into rows of `seq_len` tokens
//! ([`Loader::new_packed`](crate::Loader::new_packed)).
//!
//! # The row stream
//!
//! A packer sees its documents as one endless stream of *positions*:
//! position `p` reads document `order(p)`, where `order` is a
//! [`Sampler`](zring_sampler::Sampler) over the documents in the loader's mode and seed whose
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
//! [`MARK_EVERY`](params::MARK_EVERY)-th position; for first fit, the rows before every window
//! (counting a window's rows packs its lengths). A row is then a binary
//! search in the index and a scan of at most `MARK_EVERY` lengths, or one
//! window's packing (the last [`WINDOWS_KEPT`](params::WINDOWS_KEPT) windows are kept).
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
//! `8·⌈n / FIRST_FIT_WINDOW⌉` bytes (first fit), at most [`CYCLES_KEPT`](params::CYCLES_KEPT) of
//! them; a kept first-fit window is 32 bytes per piece. Nothing grows with
//! the steps taken except those 8 bytes per cycle, and the state is the
//! loader's usual few integers.
//!
//! # Growth
//!
//! A source may grow between a saved state and its resume (appended records
//! or parts). The cycle holding the next unit to deliver (token, or
//! first-fit row) ends over the documents it began with, exactly as the run
//! that never stopped; from the next cycle on, every cycle draws all the
//! documents. A packer's cycles are thus *segments*: cycles `c_s ..
//! c_(s+1)` draw documents `0 .. n_s` in an order of their own (keyed from
//! the seed and `c_s`), and positions run on across segments without a gap.
//! The state records each source's segments as `(c_s, n_s)` pairs
//! (`LoaderState::pack_growth`), so a state saved after the growth resumes
//! exactly too. Seeking works within segments as within cycles: in concat
//! mode over permutation modes each segment's cycles hold the same tokens,
//! so a cycle's start is its segment's start plus whole cycles.
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
//! * A document the source reads in part ([`Source::reads_in_part`](crate::Source::reads_in_part): a
//!   store's raw record) is read as spans ([`Source::gather_spans`](crate::Source::gather_spans)) straight
//!   into the batch buffer: a piece of at least half its document reads the
//!   document whole and checks it, a shorter one reads only its own bytes,
//!   unchecked (the document's checksum covers the whole document; see
//!   `zring_engine::Spans`). A step reads at most twice the tokens it
//!   delivers.
//! * Any other document (a compressed record) is read and decoded whole,
//!   and the thread keeps it for the pieces of later steps: each thread
//!   (each of the loader's workers) keeps one document per source (per
//!   packer, up to 16), the last it read whole of that source, so a long
//!   document is decoded once per worker that cuts pieces of it rather than
//!   once per step, even when a mixture's other sources cut documents of
//!   their own between its pieces. The memory is that document's tokens
//!   per worker and source, given back when the worker ends.

mod ahead;
mod column;
mod fill;
mod packer;
mod params;
mod seek;

pub(crate) use self::column::PackColumn;
pub(crate) use self::packer::Packer;
pub use self::params::{Pack, PackMode, PackSource, TokenType, FIRST_FIT_WINDOW, PACKED_ROWS};

#[cfg(test)]
mod tests;

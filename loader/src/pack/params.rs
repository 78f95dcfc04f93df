//! What a packing is: its row length and mode, the tokens it adds, the
//! integer types of stored and delivered tokens, its sources, and the
//! constants that bound what a packer keeps (module docs of
//! [`crate::pack`]).

use serde::{Deserialize, Serialize};

use crate::source::Source;

use std::sync::Arc;

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
    pub(super) fn name(&self) -> String {
        format!("{}int{}", if self.signed { "" } else { "u" }, self.bytes * 8)
    }

    /// The token at the start of `b`, widened losslessly.
    pub(super) fn read(&self, b: &[u8]) -> i128 {
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

    pub(super) fn range(&self) -> (i128, i128) {
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

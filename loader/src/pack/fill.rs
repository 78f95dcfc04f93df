//! Filling a step's rows: the pieces of documents each row holds, their
//! layout, labels and token types, and the copying of their tokens into the
//! batch (module docs of [`crate::pack`], "Copying tokens").

use std::cell::RefCell;

use super::packer::{err, Packer, Piece};
use super::params::{PackMode, MARK_EVERY};
use crate::source::{Request, Source, SourceError, Span};

impl Packer {
    /// Fills the rows `rows` (numbers in this packer's row stream) into the
    /// column buffers ([`Pack::columns`](super::params::Pack::columns)), row `i` at `i`'s place in each;
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
        let mut p = self.cycle_base(c).ok_or_else(|| err(format!("cycle {c} is past the position stream")))?
            + j as u64 * MARK_EVERY;
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
                let Some(k) = kept.iter().find(|k| k.holds(self.id, doc, len * sb)) else { return true };
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
            let mut buf = KEPT.with(|k| take_kept(&mut k.borrow_mut(), self.id)).map(|k| k.tokens).unwrap_or_default();
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
            KEPT.with(|k| k.borrow_mut().push(Kept { packer: self.id, doc, tokens: buf }));
        }
        Ok(())
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

/// Packers a thread keeps a document for at most: a mixture's sources each
/// keep their own (so one source's reads do not evict another's long
/// document), up to this many sources a thread serves.
const KEPT_PACKERS: usize = 16;

/// The buffer to read packer `packer`'s next document into: its kept one,
/// taken out, or when the thread keeps `KEPT_PACKERS` packers' documents
/// already, the least recently kept one's (given up).
fn take_kept(kept: &mut Vec<Kept>, packer: u64) -> Option<Kept> {
    if let Some(i) = kept.iter().position(|k| k.packer == packer) {
        return Some(kept.remove(i));
    }
    (kept.len() >= KEPT_PACKERS).then(|| kept.remove(0))
}

thread_local! {
    /// At most one document per packer per thread, the most recently kept
    /// last (module docs, "Copying tokens").
    static KEPT: RefCell<Vec<Kept>> = const { RefCell::new(Vec::new()) };
}

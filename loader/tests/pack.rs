//! Packed token rows: a packed loader's rows are the documents of its
//! sampling order, concatenated and cut (concat) or packed first-fit, with
//! segment ids and positions that say where every token came from; rows are
//! a pure function of the step, so resume, shards and mixtures behave as
//! for records.

mod common;

use std::collections::HashMap;
use std::sync::Arc;

use common::{with_timeout, MemSource, DEADLOCK};
use zring_loader::{
    Batch, Error, Layout, Loader, LoaderConfig, Mode, Pack, PackMode, PackSource, Request, Shard, Source, SourceError,
    TokenType, PACKED_ROWS,
};

/// Documents of `u32` tokens; token `j` of document `d` is `d * 10_000 + j`
/// (plus a per-source base), so every token says where it came from.
struct Docs {
    lens: Vec<u64>,
    base: u32,
}

impl Docs {
    fn new(lens: Vec<u64>) -> Arc<Docs> {
        Arc::new(Docs { lens, base: 0 })
    }

    /// `n` documents of pseudo-random lengths `lo..=hi`.
    fn spread(n: u64, lo: u64, hi: u64, salt: u64) -> Vec<u64> {
        (0..n)
            .map(|i| {
                let h =
                    (i ^ salt).wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(17).wrapping_mul(0xBF58_476D_1CE4_E5B9);
                lo + (h >> 11) % (hi - lo + 1)
            })
            .collect()
    }

    fn token(&self, d: u64, j: u64) -> u32 {
        self.base + (d * 10_000 + j) as u32
    }
}

impl Source for Docs {
    fn len(&self) -> u64 {
        self.lens.len() as u64
    }

    fn layout(&self) -> Layout {
        Layout::Ragged
    }

    fn lengths(&self, indices: &[u64], out: &mut [u64]) -> Result<(), SourceError> {
        for (&i, o) in indices.iter().zip(out) {
            *o = self.lens[i as usize] * 4;
        }
        Ok(())
    }

    fn gather(&self, req: &Request<'_>, dst: &mut [u8]) -> Result<(), SourceError> {
        for (&d, out) in req.indices.iter().zip(req.slots(self, dst)?) {
            for (j, t) in out.chunks_exact_mut(4).enumerate() {
                t.copy_from_slice(&self.token(d, j as u64).to_le_bytes());
            }
        }
        Ok(())
    }
}

fn pack(seq_len: u64, mode: PackMode) -> Pack {
    Pack::new(seq_len, mode, 7, 4)
}

fn config(mode: Mode, batch: u64) -> LoaderConfig {
    let mut c = LoaderConfig::new(batch);
    c.mode = mode;
    c.seed = 3;
    c
}

/// One row: (token, segment id, position) per slot.
type Row = Vec<(u32, i32, i32)>;

fn rows(b: &Batch, seq_len: usize) -> Vec<Row> {
    let ints = |name: &str| -> Vec<u32> {
        b.column(name).unwrap().data().chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().unwrap())).collect()
    };
    let (t, s, p) = (ints("tokens"), ints("segment_ids"), ints("positions"));
    assert_eq!(t.len(), b.len() * seq_len);
    (0..b.len()).map(|r| (r * seq_len..(r + 1) * seq_len).map(|i| (t[i], s[i] as i32, p[i] as i32)).collect()).collect()
}

fn take(loader: &mut Loader, steps: usize, seq_len: usize) -> Vec<Vec<Row>> {
    (0..steps).map(|_| rows(&loader.next().unwrap(), seq_len)).collect()
}

/// Each row's segments: (document, first position, tokens), checking that a
/// segment's tokens and positions are consecutive pieces of one document.
fn segments(docs: &Docs, row: &Row) -> Vec<(u64, u64, u64)> {
    let mut out: Vec<(u64, u64, u64)> = Vec::new();
    let mut last_id = 0;
    for &(tok, id, pos) in row {
        if id == 0 {
            assert_eq!((tok, pos), (7, 0), "padding holds pad_id at position 0");
            continue;
        }
        let d = u64::from(tok - docs.base) / 10_000;
        assert_eq!(tok, docs.token(d, pos as u64), "token and position agree");
        if id != last_id {
            assert_eq!(id, last_id + 1, "segment ids count 1, 2, ... in a row");
            out.push((d, pos as u64, 1));
            last_id = id;
        } else {
            let seg = out.last_mut().unwrap();
            assert_eq!((seg.0, seg.1 + seg.2), (d, pos as u64), "a segment is consecutive tokens of one document");
            seg.2 += 1;
        }
    }
    out
}

#[test]
fn one_concat_cycle_rebuilds_every_document_exactly_once() {
    with_timeout(DEADLOCK, || {
        let lens = Docs::spread(300, 1, 90, 1);
        let total: u64 = lens.iter().sum();
        let docs = Docs::new(lens.clone());
        let (l, b) = (32usize, 8u64);
        for mode in [Mode::Cyclic, Mode::Sequential] {
            let mut loader =
                Loader::new_packed(docs.clone(), pack(l as u64, PackMode::Concat), config(mode, b)).unwrap();
            let steps = (total as usize).div_ceil(l * b as usize) + 1;
            let stream: Vec<(u32, i32, i32)> = take(&mut loader, steps, l).into_iter().flatten().flatten().collect();
            assert!(stream.iter().all(|&(_, id, _)| id > 0), "nothing padded");
            // The first cycle's tokens, cut back into documents.
            let mut seen: HashMap<u64, u64> = HashMap::new();
            let mut order = Vec::new();
            for (i, &(tok, _, pos)) in stream[..total as usize].iter().enumerate() {
                let d = u64::from(tok) / 10_000;
                assert_eq!(tok, docs.token(d, pos as u64), "token {i}");
                let n = seen.entry(d).or_insert(0);
                assert_eq!(*n, pos as u64, "document {d} continues where it left off");
                *n += 1;
                if pos == 0 {
                    order.push(d);
                }
            }
            assert_eq!(seen.len(), lens.len(), "{mode:?}: every document, once");
            for (d, n) in seen {
                assert_eq!(n, lens[d as usize], "{mode:?}: document {d} whole");
            }
            if mode == Mode::Sequential {
                assert_eq!(order, (0..300).collect::<Vec<_>>());
            }
            // Segment ids restart in every row and follow document changes.
            for row in stream.chunks(l) {
                assert_eq!(row[0].1, 1);
            }
        }
    });
}

#[test]
fn first_fit_rows_hold_whole_documents_and_are_mostly_real_tokens() {
    with_timeout(DEADLOCK * 3, || {
        let lens = Docs::spread(3000, 50, 4000, 2);
        let docs = Docs::new(lens.clone());
        let l = 1024usize;
        let mut loader =
            Loader::new_packed(docs.clone(), pack(l as u64, PackMode::FirstFit), config(Mode::Cyclic, 32)).unwrap();
        let (mut real, mut all) = (0usize, 0usize);
        let mut pieces: HashMap<u64, Vec<(u64, u64)>> = HashMap::new();
        for row in take(&mut loader, 80, l).into_iter().flatten() {
            all += row.len();
            real += row.iter().filter(|t| t.1 > 0).count();
            for (d, first, n) in segments(&docs, &row) {
                let len = lens[d as usize];
                if len <= l as u64 {
                    assert_eq!((first, n), (0, len), "a document that fits a row is never cut");
                } else {
                    assert_eq!(first % l as u64, 0, "a long document is cut every seq_len tokens");
                    assert_eq!(n, (len - first).min(l as u64));
                }
                pieces.entry(d).or_default().push((first, n));
            }
        }
        let fraction = real as f64 / all as f64;
        assert!(fraction >= 0.9, "real-token fraction {fraction:.3}");
        // Within the first cycle no document comes twice: each piece once.
        for (d, mut p) in pieces {
            p.sort();
            p.dedup();
            let n: u64 = p.iter().map(|x| x.1).sum();
            assert!(n <= lens[d as usize], "document {d} placed more than once");
        }
    });
}

fn resume_after_seven(mode: Mode, how: PackMode) {
    let docs = Docs::new(Docs::spread(2500, 5, 700, 3));
    let l = 64;
    let mut first = Loader::new_packed(docs.clone(), pack(l, how), config(mode, 16)).unwrap();
    let all = take(&mut first, 12, l as usize);
    let mut again = Loader::new_packed(docs.clone(), pack(l, how), config(mode, 16)).unwrap();
    take(&mut again, 7, l as usize);
    let state = again.state();
    assert_eq!(state.sampler.mode, mode, "the state names the documents' order");
    assert_eq!(state.sampler.length, PACKED_ROWS);
    let json = serde_json::to_string(&state).unwrap();
    let state = serde_json::from_str(&json).unwrap();
    let mut resumed = Loader::new_packed(docs, pack(l, how), LoaderConfig::from_state(&state)).unwrap();
    assert_eq!(take(&mut resumed, 5, l as usize), all[7..], "{mode:?} {how:?}");
}

#[test]
fn resume_after_seven_steps_gives_the_same_next_batches() {
    with_timeout(DEADLOCK * 3, || {
        for mode in [Mode::Cyclic, Mode::Iid, Mode::Sequential] {
            resume_after_seven(mode, PackMode::Concat);
            resume_after_seven(mode, PackMode::FirstFit);
        }
    });
}

#[test]
fn later_cycles_are_found_directly() {
    with_timeout(DEADLOCK, || {
        // A few documents, so the run crosses many cycles; a loader started
        // at step 40 (from a state) sees what one that walked there sees.
        let docs = Docs::new(Docs::spread(9, 1, 30, 4));
        for (mode, how) in
            [(Mode::Cyclic, PackMode::Concat), (Mode::Iid, PackMode::Concat), (Mode::Cyclic, PackMode::FirstFit)]
        {
            let mut walk = Loader::new_packed(docs.clone(), pack(16, how), config(mode, 4)).unwrap();
            let all = take(&mut walk, 45, 16);
            let mut state = walk.state();
            state.sampler.step = 40;
            let mut jump = Loader::new_packed(docs.clone(), pack(16, how), LoaderConfig::from_state(&state)).unwrap();
            assert_eq!(take(&mut jump, 5, 16), all[40..], "{mode:?} {how:?}");
        }
    });
}

#[test]
fn two_shards_concatenate_to_the_global_batch() {
    with_timeout(DEADLOCK, || {
        let docs = Docs::new(Docs::spread(500, 5, 300, 5));
        for how in [PackMode::Concat, PackMode::FirstFit] {
            let mut global = Loader::new_packed(docs.clone(), pack(48, how), config(Mode::Cyclic, 8)).unwrap();
            let want = take(&mut global, 6, 48);
            let mut halves: Vec<Vec<Vec<Row>>> = (0..2)
                .map(|k| {
                    let mut c = config(Mode::Cyclic, 8);
                    c.shard = Shard::new(k, 2).unwrap();
                    take(&mut Loader::new_packed(docs.clone(), pack(48, how), c).unwrap(), 6, 48)
                })
                .collect();
            let b = halves.pop().unwrap();
            let a = halves.pop().unwrap();
            for (s, (a, b)) in a.into_iter().zip(b).enumerate() {
                assert_eq!([a, b].concat(), want[s], "{how:?} step {s}");
            }
        }
    });
}

#[test]
fn a_packed_mixture_shares_tokens_by_weight() {
    with_timeout(DEADLOCK * 3, || {
        let a = Arc::new(Docs { lens: Docs::spread(400, 20, 900, 6), base: 0 });
        let b = Arc::new(Docs { lens: Docs::spread(900, 5, 200, 7), base: 1 << 30 });
        let sources: Vec<(f64, Arc<dyn Source>)> = vec![(0.7, a.clone()), (0.3, b.clone())];
        let l = 128;
        let mut loader =
            Loader::new_packed_mixture(sources, pack(l, PackMode::Concat), config(Mode::Cyclic, 20)).unwrap();
        let mut tokens = [0u64; 2];
        for _ in 0..50 {
            let batch = loader.next().unwrap();
            let src = batch.sources.as_deref().unwrap().to_vec();
            for (r, row) in rows(&batch, l as usize).into_iter().enumerate() {
                let k = src[r] as usize;
                tokens[k] += row.iter().filter(|t| t.1 > 0).count() as u64;
                let docs = if k == 0 { &a } else { &b };
                segments(docs, &row);
            }
        }
        let share = tokens[0] as f64 / (tokens[0] + tokens[1]) as f64;
        assert!((share - 0.7).abs() <= 0.02, "source 0 has {share:.4} of the tokens");
        let state = loader.state();
        assert!(state.mixture.is_some() && state.pack.is_some());
    });
}

#[test]
fn bad_arguments_are_refused_clearly() {
    let docs = Docs::new(vec![3, 4, 5]);
    let e = Loader::new_packed(docs.clone(), pack(0, PackMode::Concat), config(Mode::Cyclic, 2)).unwrap_err();
    assert!(matches!(e, Error::InvalidConfig { field: "seq_len", .. }), "{e}");
    let fixed = MemSource::fixed(10, 8);
    let e = Loader::new_packed(fixed, pack(4, PackMode::Concat), config(Mode::Cyclic, 2)).unwrap_err();
    assert!(e.to_string().contains("ragged"), "{e}");
    // Records of 4-byte tokens read as 8-byte tokens: 3 * 4 bytes is no
    // whole number of them.
    let odd = Pack { token_bytes: 8, ..pack(4, PackMode::Concat) };
    let e = Loader::new_packed(docs.clone(), odd, config(Mode::Cyclic, 2)).unwrap_err();
    assert!(e.to_string().contains("not a whole number of 8-byte tokens"), "{e}");
    let e = Loader::new_packed(Docs::new(vec![0, 0]), pack(4, PackMode::Concat), config(Mode::Cyclic, 2)).unwrap_err();
    assert!(e.to_string().contains("no tokens"), "{e}");
    // A state saved with one packing does not resume another, nor a loader of records.
    let loader = Loader::new_packed(docs.clone(), pack(4, PackMode::Concat), config(Mode::Cyclic, 2)).unwrap();
    let state = loader.state();
    let e = Loader::new_packed(docs.clone(), pack(8, PackMode::Concat), LoaderConfig::from_state(&state)).unwrap_err();
    assert!(matches!(e, Error::PackMismatch { .. }), "{e}");
    let records = vec![zring_loader::Stream::new("x", docs as Arc<dyn Source>)];
    let e = Loader::new(records, LoaderConfig::from_state(&state)).unwrap_err();
    assert!(matches!(e, Error::PackMismatch { .. }), "{e}");
}

/// Every column of a batch, raw.
fn raw(b: &Batch) -> Vec<Vec<u8>> {
    b.columns.iter().map(|c| c.data().to_vec()).collect()
}

fn take_raw(loader: &mut Loader, steps: usize) -> Vec<Vec<Vec<u8>>> {
    (0..steps).map(|_| raw(&loader.next().unwrap())).collect()
}

/// `(token, label, loss_mask)` of every slot of a batch of `u32` tokens.
fn labelled(b: &Batch) -> Vec<(u32, u32, u8)> {
    let ints = |name: &str| -> Vec<u32> {
        b.column(name).unwrap().data().chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().unwrap())).collect()
    };
    let (t, l) = (ints("tokens"), ints("labels"));
    let m = b.column("loss_mask").unwrap().data().to_vec();
    assert_eq!((t.len(), l.len()), (m.len(), m.len()));
    t.into_iter().zip(l).zip(m).map(|((t, l), m)| (t, l, m)).collect()
}

fn with_labels(seq_len: u64, mode: PackMode, mask_boundaries: bool) -> Pack {
    Pack { labels: true, mask_boundaries, ..pack(seq_len, mode) }
}

#[test]
fn labels_pair_every_adjacent_token_of_every_document_exactly_once_per_cycle() {
    with_timeout(DEADLOCK, || {
        let lens = Docs::spread(300, 1, 90, 1);
        let total: u64 = lens.iter().sum();
        let docs = Docs::new(lens.clone());
        let (l, b) = (32usize, 8u64);
        for mode in [Mode::Cyclic, Mode::Sequential] {
            for masked in [false, true] {
                let p = with_labels(l as u64, PackMode::Concat, masked);
                let mut loader = Loader::new_packed(docs.clone(), p, config(mode, b)).unwrap();
                let steps = (total as usize).div_ceil(l * b as usize) + 1;
                let slots: Vec<(u32, u32, u8)> = (0..steps).flat_map(|_| labelled(&loader.next().unwrap())).collect();
                // Rows overlap by one: a row's last label is the next row's first token.
                for (i, w) in slots.windows(2).enumerate() {
                    assert_eq!(w[0].1, w[1].0, "{mode:?}: slot {i}'s label is the next token");
                }
                // One cycle: positions 0 .. total. Each pair inside a
                // document once, trained; each pair across documents
                // masked only with mask_boundaries.
                let mut pairs: HashMap<(u32, u32), u32> = HashMap::new();
                for &(t, lab, m) in &slots[..total as usize] {
                    let same_doc = lab == t + 1 && t / 10_000 == lab / 10_000;
                    if same_doc {
                        assert_eq!(m, 1, "{mode:?}: pair ({t}, {lab}) inside a document is trained");
                        *pairs.entry((t, lab)).or_default() += 1;
                    } else {
                        assert_eq!(
                            m,
                            u8::from(!masked),
                            "{mode:?} masked={masked}: pair ({t}, {lab}) across documents"
                        );
                    }
                }
                let want: u64 = lens.iter().map(|n| n - 1).sum();
                assert_eq!(pairs.len() as u64, want, "{mode:?}: every pair inside a document");
                assert!(pairs.values().all(|&n| n == 1), "{mode:?}: each pair exactly once");
                for (d, &n) in lens.iter().enumerate() {
                    for j in 0..n.saturating_sub(1) {
                        let key = (docs.token(d as u64, j), docs.token(d as u64, j + 1));
                        assert!(pairs.contains_key(&key), "{mode:?}: document {d} pair {j}");
                    }
                }
            }
        }
    });
}

#[test]
fn labelled_runs_resume_after_seven_steps_and_shard_exactly() {
    with_timeout(DEADLOCK * 3, || {
        let docs = Docs::new(Docs::spread(2500, 5, 700, 3));
        for how in [PackMode::Concat, PackMode::FirstFit] {
            for mode in [Mode::Cyclic, Mode::Iid] {
                let p = Pack { eod_id: Some(1), bos_id: Some(2), ..with_labels(64, how, true) };
                let mut first = Loader::new_packed(docs.clone(), p, config(mode, 16)).unwrap();
                let all = take_raw(&mut first, 12);
                let mut again = Loader::new_packed(docs.clone(), p, config(mode, 16)).unwrap();
                take_raw(&mut again, 7);
                let json = serde_json::to_string(&again.state()).unwrap();
                let state = serde_json::from_str(&json).unwrap();
                let mut resumed = Loader::new_packed(docs.clone(), p, LoaderConfig::from_state(&state)).unwrap();
                assert_eq!(take_raw(&mut resumed, 5), all[7..], "{mode:?} {how:?}");
                // Two shards: each column of a global batch is the two
                // halves, one after the other.
                let halves: Vec<Vec<Vec<Vec<u8>>>> = (0..2)
                    .map(|k| {
                        let mut c = config(mode, 16);
                        c.shard = Shard::new(k, 2).unwrap();
                        take_raw(&mut Loader::new_packed(docs.clone(), p, c).unwrap(), 12)
                    })
                    .collect();
                for (s, want) in all.iter().enumerate() {
                    for (c, col) in want.iter().enumerate() {
                        assert_eq!([&halves[0][s][c][..], &halves[1][s][c][..]].concat(), *col, "{how:?} step {s}");
                    }
                }
            }
        }
    });
}

#[test]
fn first_fit_labels_follow_documents_and_mask_padding() {
    with_timeout(DEADLOCK, || {
        let lens = Docs::spread(400, 1, 150, 8);
        let docs = Docs::new(lens.clone());
        let l = 64;
        let mut loader =
            Loader::new_packed(docs.clone(), with_labels(l, PackMode::FirstFit, true), config(Mode::Cyclic, 8))
                .unwrap();
        let (mut trained, mut cut_tails) = (0, 0);
        for _ in 0..30 {
            let batch = loader.next().unwrap();
            let slots = labelled(&batch);
            let segs = rows(&batch, l as usize).concat();
            for (x, (&(t, lab, m), &(_, id, pos))) in slots.iter().zip(&segs).enumerate() {
                if id == 0 {
                    assert_eq!((lab, m), (7, 0), "padding: pad label, masked");
                    continue;
                }
                let d = u64::from(t) / 10_000;
                let last_of_doc = pos as u64 + 1 == lens[d as usize];
                if last_of_doc {
                    assert_eq!(m, 0, "a document's last token has no label of its own");
                } else {
                    assert_eq!((lab, m), (t + 1, 1), "slot {x}: the document's next token, trained");
                    trained += 1;
                    if (x + 1) % l as usize == 0 || segs.get(x + 1).is_none_or(|s| s.1 != id) {
                        cut_tails += 1;
                    }
                }
            }
        }
        assert!(trained > 0 && cut_tails > 0, "{trained} trained, {cut_tails} at cut ends");
    });
}

/// Documents of `u16` tokens: token `j` of document `d` is `d * 100 + j`.
struct Small {
    lens: Vec<u64>,
}

impl Source for Small {
    fn len(&self) -> u64 {
        self.lens.len() as u64
    }

    fn layout(&self) -> Layout {
        Layout::Ragged
    }

    fn lengths(&self, indices: &[u64], out: &mut [u64]) -> Result<(), SourceError> {
        for (&i, o) in indices.iter().zip(out) {
            *o = self.lens[i as usize] * 2;
        }
        Ok(())
    }

    fn gather(&self, req: &Request<'_>, dst: &mut [u8]) -> Result<(), SourceError> {
        for (&d, out) in req.indices.iter().zip(req.slots(self, dst)?) {
            for (j, t) in out.chunks_exact_mut(2).enumerate() {
                t.copy_from_slice(&((d * 100) as u16 + j as u16).to_le_bytes());
            }
        }
        Ok(())
    }
}

#[test]
fn eod_and_bos_frame_every_document_and_count_in_positions() {
    with_timeout(DEADLOCK, || {
        let lens = Docs::spread(50, 0, 20, 9);
        let total: u64 = lens.iter().map(|n| n + 2).sum();
        let docs = Docs::new(lens.clone());
        let (bos, eod) = (4_000_000_001u32, 4_000_000_002u32);
        let p = Pack { bos_id: Some(bos.into()), eod_id: Some(eod.into()), ..pack(16, PackMode::Concat) };
        let mut loader = Loader::new_packed(docs.clone(), p, config(Mode::Sequential, 4)).unwrap();
        let steps = (total as usize).div_ceil(64) + 1;
        let stream: Vec<(u32, i32, i32)> = take(&mut loader, steps, 16).into_iter().flatten().flatten().collect();
        let mut want = Vec::new();
        for (d, &n) in lens.iter().enumerate() {
            want.push((bos, 0));
            want.extend((0..n).map(|j| (docs.token(d as u64, j), j as i32 + 1)));
            want.push((eod, n as i32 + 1));
        }
        let got: Vec<(u32, i32)> = stream[..total as usize].iter().map(|&(t, _, p)| (t, p)).collect();
        assert_eq!(got, want, "BOS, the document, EOD; positions count them");
    });
}

#[test]
fn sources_of_other_token_types_are_widened_and_a_value_too_wide_is_refused() {
    with_timeout(DEADLOCK, || {
        let small: Arc<dyn Source> = Arc::new(Small { lens: Docs::spread(60, 1, 40, 10) });
        let big = Arc::new(Docs { lens: Docs::spread(60, 1, 40, 11), base: 1 << 20 });
        let u16t = TokenType { bytes: 2, signed: false };
        let i32t = TokenType { bytes: 4, signed: true };
        let out = Pack { signed: true, ..pack(32, PackMode::Concat) };
        let src = |weight: f64, source: Arc<dyn Source>, tokens: TokenType| PackSource {
            weight,
            source,
            tokens,
            name: Some(format!("{}-byte", tokens.bytes)),
        };
        let sources = vec![src(0.6, small.clone(), u16t), src(0.3, big.clone(), i32t), src(0.1, big.clone(), i32t)];
        let mut loader = Loader::new_packed_typed(sources, true, out, config(Mode::Cyclic, 10)).unwrap();
        for _ in 0..5 {
            let batch = loader.next().unwrap();
            let src = batch.sources.as_deref().unwrap().to_vec();
            for (r, row) in rows(&batch, 32).into_iter().enumerate() {
                for (t, _, pos) in row {
                    if src[r] == 0 {
                        assert!(t < 65_536 && t % 100 == pos as u32 % 100, "uint16 token {t} widened as is");
                    } else {
                        assert!(t >= 1 << 20, "int32 token {t} kept");
                    }
                }
            }
        }
        // Delivered as uint16: source 1's tokens do not fit.
        let narrow = pack(32, PackMode::Concat);
        let narrow = Pack { token_bytes: 2, ..narrow };
        let sources = vec![src(0.5, small, u16t), src(0.5, big, i32t)];
        let mut loader = Loader::new_packed_typed(sources, true, narrow, config(Mode::Cyclic, 4)).unwrap();
        let e = (0..3).find_map(|_| loader.next().err()).expect("a token too wide fails its step");
        let text = e.to_string();
        assert!(text.contains("source 1 (4-byte): document") && text.contains("uint16 tokens cannot hold"), "{text}");
    });
}

//! Building a loader: its streams, configuration and saved state checked,
//! its sampler or mixture planned, its packers made, and its workers
//! started.

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::sync::{Arc, Condvar, Mutex};
use std::thread;

use zring_sampler::{Blocks, Mixture, MixtureState, Mode, Sampler, SamplerState, SchedulePiece, SchedulePoint, Shard};

use super::shared::{retain_for, Ctx, PackedPlan, Packing, Prefetch, Shared, State, StreamCtx};
use super::stream::{MixSource, Stream};
use super::worker::{gathers_leave_cores_idle, worker};
use super::{Fingerprints, Loader};
use crate::config::{LoaderConfig, MAX_DEPTH, MAX_THREADS};
use crate::error::Error;
use crate::lookahead::Lookahead;
use crate::pack::{self, Pack, PackColumn, PackSource, Packer, TokenType};
use crate::plan::Plan;
use crate::pool::{Pool, PAGE};
use crate::source::{Fingerprint, Layout, Source};
use crate::stats::{self, GatherStats, ThreadsCpu};

/// Steps are counted in `u64`; starting at most here leaves 2^63 steps before
/// the counters could overflow.
pub(super) const MAX_START_STEP: u64 = 1 << 63;

pub(super) fn check_range(field: &'static str, value: usize, max: usize, expected: &'static str) -> Result<(), Error> {
    if value == 0 || value > max {
        return Err(Error::InvalidConfig { field, value: value as u64, expected });
    }
    Ok(())
}

/// The common length of `streams`, checking they are a set: some streams,
/// no name twice, all of one length.
pub(super) fn stream_length(streams: &[Stream]) -> Result<u64, Error> {
    if streams.is_empty() {
        return Err(Error::NoStreams);
    }
    let mut names = HashSet::new();
    for s in streams {
        if !names.insert(s.name.as_str()) {
            return Err(Error::DuplicateStream { name: s.name.clone() });
        }
    }
    let lengths: Vec<(String, u64)> = streams.iter().map(|s| (s.name.clone(), s.source.len())).collect();
    let length = lengths[0].1;
    if lengths.iter().any(|(_, l)| *l != length) {
        return Err(Error::LengthMismatch { lengths });
    }
    Ok(length)
}

/// Each stream's fingerprint now (by label, for the sources that have one),
/// checked against `saved`: the labels of the streams that grew (the saved
/// records unchanged, more after them), or [`Error::StreamChanged`] for the
/// first stream whose saved records changed.
pub(super) fn check_fingerprints(
    streams: &[(String, &dyn Source)],
    saved: &BTreeMap<String, Fingerprint>,
) -> Result<(BTreeMap<String, Fingerprint>, Vec<String>), Error> {
    let mut now = BTreeMap::new();
    let mut grown = Vec::new();
    for (label, source) in streams {
        let fail = |source| Error::Fingerprint { stream: label.clone(), source };
        let Some(fp) = source.fingerprint().map_err(fail)? else {
            continue;
        };
        now.insert(label.clone(), fp);
        match saved.get(label) {
            Some(&s) if s == fp => {}
            Some(&s) if s.records < fp.records && source.extends(s).map_err(fail)? => grown.push(label.clone()),
            Some(&s) => return Err(Error::StreamChanged { stream: label.clone(), saved: s, now: fp }),
            None => {}
        }
    }
    Ok((now, grown))
}

/// Depth, threads and start step in range.
pub(super) fn check_config(config: &LoaderConfig) -> Result<(), Error> {
    check_range("depth", config.depth, MAX_DEPTH, "1 ..= 1024")?;
    check_range("threads", config.threads, MAX_THREADS, "1 ..= 256")?;
    if config.start_step > MAX_START_STEP {
        return Err(Error::InvalidConfig { field: "start_step", value: config.start_step, expected: "at most 2^63" });
    }
    Ok(())
}

/// A mixture as error messages name it.
pub(super) fn describe(m: &MixtureState) -> String {
    let weights: Vec<String> = m.weights.iter().map(|w| format!("{w:.4}")).collect();
    match &m.schedule {
        None => format!("a mixture of sources of {:?} records, weights [{}]", m.lengths, weights.join(", ")),
        Some(pieces) => {
            format!("a mixture of sources of {:?} records, scheduled in {} piece(s)", m.lengths, pieces.len())
        }
    }
}

/// The mixture of a loader over sources of `lengths` records, with fixed
/// `weights` or `config.schedule`, resuming `config.expect_mixture` if
/// set. A saved run is refused only when its sources' lengths differ (the
/// data changed); under the same weights it goes on as saved, under others
/// it keeps its saved weights up to `config.start_step` and follows the
/// new ones from there (a new `SchedulePiece`; `zring_sampler::Mixture`,
/// "Schedules").
pub(super) fn mixture_plan(
    mode: Mode,
    lengths: &[u64],
    weights: &[f64],
    config: &LoaderConfig,
) -> Result<Mixture, Error> {
    let (b, seed) = (config.batch_size, config.seed);
    // The loader's own weights as a piece, and its mixture when they are
    // fixed (built once: choosing a rounding tree can take a while).
    let (given, mine) = match &config.schedule {
        Some(points) => (SchedulePiece::new(0, lengths.len(), points)?, None),
        None => {
            let m = Mixture::new(mode, lengths, weights, b, seed)?;
            let point = SchedulePoint { step: 0, weights: m.weights().to_vec() };
            (SchedulePiece { from: 0, points: vec![point] }, Some(m))
        }
    };
    let fresh = |mine: Option<Mixture>| match mine {
        Some(m) => Ok(m),
        None => Mixture::scheduled(mode, lengths, vec![given.clone()], b, seed),
    };
    let Some(saved) = &config.expect_mixture else {
        let m = fresh(mine)?;
        if config.expect_length.is_some() {
            return Err(Error::MixtureMismatch {
                saved: "one set of streams".to_owned(),
                loader: describe(&m.state()),
            });
        }
        return Ok(m);
    };
    if saved.lengths != lengths {
        return Err(Error::MixtureMismatch { saved: describe(saved), loader: describe(&fresh(mine)?.state()) });
    }
    let pieces = saved.schedule.clone().unwrap_or_else(|| {
        vec![SchedulePiece { from: 0, points: vec![SchedulePoint { step: 0, weights: saved.weights.clone() }] }]
    });
    let m = if pieces.last().is_some_and(|last| last.same_points(&given)) {
        match saved.schedule {
            None => fresh(mine)?,
            Some(_) => Mixture::scheduled(mode, lengths, pieces, b, seed)?,
        }
    } else {
        let at = config.start_step;
        let mut kept: Vec<SchedulePiece> = pieces.into_iter().filter(|p| p.from < at).collect();
        kept.push(SchedulePiece { from: at, points: given.points.clone() });
        Mixture::scheduled(mode, lengths, kept, b, seed)?
    };
    let m = match &saved.growth {
        Some(g) => m.with_growth(g)?,
        None => m,
    };
    Ok(m.with_order(saved.order))
}

impl Loader {
    /// Validates the streams and configuration and starts the workers, which
    /// begin gathering `config.start_step` at once.
    ///
    /// With [`LoaderConfig::expect_fingerprints`] (a resumed run), each
    /// stream's fingerprint must be the saved one, or the stream must only
    /// have grown: then the steps up to the end of the cycle under way
    /// ([`zring_sampler::Sampler::cycle_boundary`]) draw from the saved
    /// records as the saved run would have, and the later ones from all of
    /// them. Next-use hints of the cycle under way stop at its end.
    ///
    /// Errors: [`Error::NoStreams`], [`Error::DuplicateStream`],
    /// [`Error::LengthMismatch`] (listing every stream's length),
    /// [`Error::StateMismatch`] (another length, and not every stream shown
    /// to have only grown), [`Error::StreamChanged`], [`Error::CannotGrow`]
    /// (growth that would change the batch length),
    /// [`Error::Fingerprint`], [`Error::InvalidConfig`] for a depth or
    /// thread count out of range, [`Error::Sampler`] for an empty index
    /// space, a zero batch size or a shard that does not fit the batch, and
    /// [`Error::Spawn`] when a thread cannot be started.
    pub fn new(streams: Vec<Stream>, config: LoaderConfig) -> Result<Loader, Error> {
        let length = stream_length(&streams)?;
        let labelled: Vec<(String, &dyn Source)> = streams.iter().map(|s| (s.name.clone(), &*s.source)).collect();
        let (now, grown) = check_fingerprints(&labelled, &config.expect_fingerprints)?;
        if let Some(saved) = &config.expect_mixture {
            return Err(Error::MixtureMismatch { saved: describe(saved), loader: "one set of streams".to_owned() });
        }
        refuse_pack_state(&config)?;
        check_config(&config)?;
        // Mode 3's shape: the configuration's (a saved state's), else what
        // the first stream reads best, its cycles split for this loader's
        // shard count (each shard then reads only its own blocks).
        let blocks = match config.mode {
            Mode::Blocked => {
                let chosen = || {
                    let c = streams.first().and_then(|s| s.source.block_shape()).unwrap_or(Blocks::DEFAULT);
                    Blocks { shards: config.shard.count, ..c }
                };
                let b = match config.blocks {
                    Some(b) if b.block_records > 0 && b.window_blocks > 0 && b.shards > 0 => b,
                    // A field of 0 is chosen as for no shape.
                    Some(b) => {
                        let c = chosen();
                        Blocks {
                            block_records: if b.block_records > 0 { b.block_records } else { c.block_records },
                            window_blocks: if b.window_blocks > 0 { b.window_blocks } else { c.window_blocks },
                            shards: if b.shards > 0 { b.shards } else { c.shards },
                        }
                    }
                    None => chosen(),
                };
                // Unsplit cycles (a state saved before the split, or a shape
                // of 1 shard) serve any shard count, reading whole windows.
                if b.shards > 1 && b.shards != config.shard.count {
                    return Err(Error::ShardCount {
                        saved: b.shards,
                        index: config.shard.index,
                        count: config.shard.count,
                    });
                }
                Some(b)
            }
            _ => None,
        };
        let sampler = |length| {
            Sampler::from_state(&SamplerState {
                blocks,
                mode: config.mode,
                seed: config.seed,
                step: config.start_step,
                length,
                batch_size: config.batch_size,
                origin: config.origin,
            })
        };
        let plan = match config.expect_length {
            Some(expected) if expected != length => {
                // Streams that only grew (every one of them, each shown by
                // its fingerprint) finish the cycle under way over the
                // saved length; any other change of length is refused.
                if grown.len() != streams.len() {
                    return Err(Error::StateMismatch { state_length: expected, stream_length: length });
                }
                let before = sampler(expected)?;
                let boundary = before.cycle_boundary(config.start_step);
                let after = before.grown(length, boundary)?;
                if after.batch_len() != before.batch_len() {
                    return Err(Error::CannotGrow {
                        stream: grown[0].clone(),
                        saved: expected,
                        now: length,
                        why: format!(
                            "the saved run's batches hold all {expected} records (fewer than batch_size {}), and \
                             batches of another length cannot continue it",
                            config.batch_size
                        ),
                    });
                }
                if boundary <= config.start_step {
                    Plan::Single(after)
                } else {
                    Plan::Grown { before, after, boundary }
                }
            }
            _ => Plan::Single(sampler(length)?),
        };
        let fingerprints = Fingerprints { before: config.expect_fingerprints.clone(), now };
        Loader::start(plan, vec![streams], config, fingerprints, None)
    }

    /// A loader over a weighted mixture of sources: every global batch of
    /// `config.batch_size` rows holds each source's share of the rows, rounded
    /// so that the running totals are exact (see `zring_sampler::Mixture`),
    /// each source's rows gathered in one call per stream (then moved to their
    /// interleaved rows) into the same batch buffers, with the same
    /// pipeline, hints, state and errors as [`Loader::new`]. Each row's source is in [`Batch::sources`](crate::Batch::sources); its
    /// index (into that source) in [`Batch::indices`](crate::Batch::indices).
    ///
    /// A source that grew since the state was saved (appended records, every
    /// stream of it) finishes the cycle of its stream under way at the saved
    /// step over its saved records and draws all of them from its next
    /// cycle (`zring_sampler::Mixture::grow`); the state lists the growth.
    ///
    /// Errors: those of [`Loader::new`] for each source's streams
    /// ([`Error::CannotGrow`] for a source only some of whose streams
    /// grew), [`Error::SourceStreams`] when a source's streams differ from source
    /// 0's in names or layouts, [`Error::MixtureMismatch`] for a state saved
    /// from another mixture, and [`Error::Sampler`] for weights that are not
    /// positive and finite. Any positive weight is taken: a source of under
    /// one row per batch gets its rows over the steps (the rounding tree of
    /// `zring_sampler::Mixture`).
    pub fn new_mixture(sources: Vec<MixSource>, config: LoaderConfig) -> Result<Loader, Error> {
        if sources.is_empty() {
            return Err(zring_sampler::Error::NoSources.into());
        }
        let mut lengths = Vec::with_capacity(sources.len());
        for source in &sources {
            lengths.push(stream_length(&source.streams)?);
        }
        let shape = |streams: &[Stream]| {
            let mut v: Vec<(String, Layout)> = streams.iter().map(|s| (s.name.clone(), s.source.layout())).collect();
            v.sort_by(|a, b| a.0.cmp(&b.0));
            v
        };
        let want = shape(&sources[0].streams);
        for (k, source) in sources.iter().enumerate().skip(1) {
            let got = shape(&source.streams);
            if got != want {
                let show = |v: &[(String, Layout)]| format!("{v:?}");
                return Err(Error::SourceStreams { source_index: k, got: show(&got), want: show(&want) });
            }
        }
        let labelled: Vec<(String, &dyn Source)> = sources
            .iter()
            .enumerate()
            .flat_map(|(k, source)| source.streams.iter().map(move |s| (format!("{k}/{}", s.name), &*s.source)))
            .collect();
        let (now, grown) = check_fingerprints(&labelled, &config.expect_fingerprints)?;
        refuse_pack_state(&config)?;
        let weights: Vec<f64> = sources.iter().map(|s| s.weight).collect();
        // Sources that grew since the state was saved (every stream of the
        // source, to one length) finish the cycle under way over their
        // saved records, and draw all of them from the next.
        let mut growing: Vec<(usize, u64)> = Vec::new();
        let mut plan_lengths = lengths.clone();
        if let Some(saved) = config.expect_mixture.as_ref().filter(|s| s.lengths.len() == lengths.len()) {
            for (k, source) in sources.iter().enumerate() {
                let labels: Vec<String> = source.streams.iter().map(|s| format!("{k}/{}", s.name)).collect();
                let grew = labels.iter().filter(|l| grown.contains(l)).count();
                if grew == 0 {
                    continue;
                }
                if grew != labels.len() || saved.lengths[k] >= lengths[k] {
                    let stream = labels.iter().find(|l| !grown.contains(l)).unwrap_or(&labels[0]).clone();
                    return Err(Error::CannotGrow {
                        stream,
                        saved: saved.lengths[k],
                        now: lengths[k],
                        why: "every stream of a source must grow with it".to_owned(),
                    });
                }
                growing.push((k, lengths[k]));
                plan_lengths[k] = saved.lengths[k];
            }
        }
        // A saved run goes on in its own row order: one saved before rows
        // were interleaved keeps its grouped batches.
        let mut mixture = mixture_plan(config.mode, &plan_lengths, &weights, &config)?;
        // Mode 3: each source's windows sized by its weight (a saved run
        // takes its own shapes; one saved before they were chosen, the
        // default), so that they last about as many steps and together take
        // the memory of one source's.
        if config.mode == Mode::Blocked {
            let shapes = match &config.expect_mixture {
                Some(saved) => saved.blocks.clone(),
                None => Some(mixture_shapes(&sources, mixture.weights())),
            };
            if let Some(shapes) = shapes {
                mixture = mixture.with_blocks(&shapes)?;
            }
        }
        if !growing.is_empty() {
            let mut before = vec![0; lengths.len()];
            mixture.allocation(config.start_step.saturating_mul(config.batch_size), &mut before)?;
            for (k, length) in growing {
                let c = mixture.source_cycle_of(k, before[k]).unwrap_or(0);
                mixture = mixture.grow(k, c + 1, length)?;
            }
        }
        check_config(&config)?;
        // Every source's streams in source 0's order.
        let order: Vec<String> = sources[0].streams.iter().map(|s| s.name.clone()).collect();
        let by_source = sources
            .into_iter()
            .map(|source| {
                let mut streams = source.streams;
                streams.sort_by_key(|s| order.iter().position(|n| *n == s.name));
                streams
            })
            .collect();
        let fingerprints = Fingerprints { before: BTreeMap::new(), now };
        Loader::start(Plan::Mixture(mixture), by_source, config, fingerprints, None)
    }

    /// A loader of packed token rows over `source`, a ragged source whose
    /// records are documents of little-endian tokens of `pack.token_bytes`:
    /// each batch has the columns `tokens` (`seq_len` tokens a row),
    /// `segment_ids` and `positions` (little-endian `i32`, `seq_len` a row),
    /// then with `pack.labels` `labels` (tokens) and `loss_mask` (`u8`);
    /// see [`PackMode`](crate::PackMode) and the `pack` module docs for what
    /// a row holds. The documents
    /// come in the order of `config.mode` and `config.seed` (a sampler of
    /// batch 1 over the documents); the rows of a step are the next
    /// `batch_size` rows of the packed stream, a shard's a contiguous slice
    /// of them, and [`Batch::indices`](crate::Batch::indices) their numbers in the stream.
    ///
    /// Building reads the lengths of every document once (the first cycle's
    /// index). Errors: those of [`Loader::new`], [`Error::InvalidConfig`] for
    /// a `pack` out of range, [`Error::Pack`] for a source that is not
    /// ragged, holds records that are not whole tokens, or no tokens,
    /// [`Error::PackMismatch`] for a state saved with other packing. A
    /// source that grew since the state was saved finishes the cycle under
    /// way over its saved documents, and draws all of them from the next
    /// (the `pack` module docs, "Growth").
    pub fn new_packed(source: Arc<dyn Source>, pack: Pack, config: LoaderConfig) -> Result<Loader, Error> {
        let tokens = TokenType { bytes: pack.token_bytes, signed: pack.signed };
        Loader::packed(vec![PackSource { weight: 1.0, source, tokens, name: None }], false, pack, config)
    }

    /// A packed loader over sources whose tokens may be of other integer
    /// types than the delivered ones (`pack.token_bytes`, `pack.signed`):
    /// `sources` give each source's token type (and name), a mixture when
    /// `mixture` (else one source, weight ignored). Tokens are widened
    /// without loss; a token the delivered type cannot hold fails the step
    /// with an error naming the source, the document and the value.
    pub fn new_packed_typed(
        sources: Vec<PackSource>,
        mixture: bool,
        pack: Pack,
        config: LoaderConfig,
    ) -> Result<Loader, Error> {
        if sources.is_empty() {
            return Err(zring_sampler::Error::NoSources.into());
        }
        if !mixture && sources.len() != 1 {
            return Err(Error::InvalidConfig { field: "sources", value: sources.len() as u64, expected: "one source" });
        }
        for s in &sources {
            if ![1, 2, 4, 8].contains(&s.tokens.bytes) {
                let value = s.tokens.bytes;
                return Err(Error::InvalidConfig { field: "token bytes", value, expected: "1, 2, 4 or 8" });
            }
        }
        Loader::packed(sources, mixture, pack, config)
    }

    /// A loader of packed token rows over a weighted mixture of sources, as
    /// [`Loader::new_packed`] for each: every row is `seq_len` tokens of one
    /// source, so the weights count tokens; each source's rows per batch are
    /// those of [`Loader::new_mixture`] over the sources' row streams, and
    /// [`Batch::sources`](crate::Batch::sources) names each row's source. Source `k` orders its
    /// documents with seed `config.seed + k`.
    pub fn new_packed_mixture(
        sources: Vec<(f64, Arc<dyn Source>)>,
        pack: Pack,
        config: LoaderConfig,
    ) -> Result<Loader, Error> {
        if sources.is_empty() {
            return Err(zring_sampler::Error::NoSources.into());
        }
        let tokens = TokenType { bytes: pack.token_bytes, signed: pack.signed };
        let sources = sources.into_iter().map(|(weight, source)| PackSource { weight, source, tokens, name: None });
        Loader::packed(sources.collect(), true, pack, config)
    }

    fn packed(sources: Vec<PackSource>, mixture: bool, pack: Pack, config: LoaderConfig) -> Result<Loader, Error> {
        if let Some((field, value, expected)) = pack.check() {
            return Err(Error::InvalidConfig { field, value, expected });
        }
        check_config(&config)?;
        let show = |p: &Pack| {
            let mut s =
                format!("rows of {} tokens ({:?}, pad {}, {}-byte tokens", p.seq_len, p.mode, p.pad_id, p.token_bytes);
            if p.labels {
                s += if p.mask_boundaries { ", labels, boundaries masked" } else { ", labels" };
            }
            if let Some(b) = p.bos_id {
                s += &format!(", bos {b}");
            }
            if let Some(e) = p.eod_id {
                s += &format!(", eod {e}");
            }
            s + ")"
        };
        match (&config.expect_pack, config.expect_length) {
            (Some(saved), _) if !pack.resumes(saved) => {
                return Err(Error::PackMismatch { saved: show(saved), loader: show(&pack) });
            }
            (None, Some(_)) => {
                return Err(Error::PackMismatch { saved: "records, not packed rows".to_owned(), loader: show(&pack) });
            }
            _ => {}
        }
        let label = |k: usize| if mixture { format!("{k}/tokens") } else { "tokens".to_owned() };
        // The plan first: a source that grew since the state was saved
        // finishes the cycle under way at the saved step over its saved
        // documents, and the plan says how many rows of it came before.
        let plan = if mixture {
            let lengths = vec![pack::PACKED_ROWS; sources.len()];
            let weights: Vec<f64> = sources.iter().map(|s| s.weight).collect();
            Plan::Mixture(mixture_plan(Mode::Sequential, &lengths, &weights, &config)?)
        } else {
            if let Some(saved) = &config.expect_mixture {
                let loader = "one packed source".to_owned();
                return Err(Error::MixtureMismatch { saved: describe(saved), loader });
            }
            Plan::Single(Sampler::from_state(&SamplerState {
                mode: Mode::Sequential,
                seed: config.seed,
                step: config.start_step,
                length: pack::PACKED_ROWS,
                batch_size: config.batch_size,
                origin: 0,
                blocks: None,
            })?)
        };
        let rows_before: Vec<u64> = match &plan {
            Plan::Mixture(m) => {
                let mut out = vec![0; sources.len()];
                m.allocation(config.start_step.saturating_mul(m.batch_len() as u64), &mut out)?;
                out
            }
            _ => vec![config.start_step.saturating_mul(config.batch_size)],
        };
        let mut packers = Vec::with_capacity(sources.len());
        let mut by_source = Vec::with_capacity(sources.len());
        let mut weights = Vec::with_capacity(sources.len());
        let mut now = BTreeMap::new();
        for (k, PackSource { weight, source, tokens, name }) in sources.into_iter().enumerate() {
            let seed = config.seed.wrapping_add(k as u64);
            let mut what = if mixture { format!("source {k}") } else { "the source".to_owned() };
            if let Some(name) = &name {
                what = format!("{what} ({name})");
            }
            let stream = label(k);
            let shown = match &name {
                Some(n) if mixture => format!("{n} (source {k}, {stream})"),
                Some(n) => format!("{n} ({stream})"),
                None => stream.clone(),
            };
            let (fp_now, grew) = {
                let labelled = [(stream.clone(), &*source)];
                // Errors name the source by its path where known.
                let (fps, grown) = check_fingerprints(&labelled, &config.expect_fingerprints).map_err(|e| match e {
                    Error::StreamChanged { saved, now, .. } => {
                        Error::StreamChanged { stream: shown.clone(), saved, now }
                    }
                    other => other,
                })?;
                (fps.get(&stream).copied(), !grown.is_empty())
            };
            if let Some(fp) = fp_now {
                now.insert(stream.clone(), fp);
            }
            // The segments of cycles the saved run drew (one, over all the
            // documents, for a new run), and one more when the source grew.
            let saved = config.expect_fingerprints.get(&stream).map(|f| f.records);
            let growth = match config.expect_pack_growth.get(k).filter(|g| !g.is_empty()) {
                Some(g) => g.clone(),
                None => vec![(0, saved.filter(|_| grew).unwrap_or(source.len()))],
            };
            if grew && growth.last().map(|g| g.1) != saved {
                return Err(Error::CannotGrow {
                    stream: shown,
                    saved: saved.unwrap_or(0),
                    now: source.len(),
                    why: format!("the state's documents per cycle {growth:?} do not end at its {saved:?} documents"),
                });
            }
            let mut packer = Packer::grown(source, pack, config.mode, seed, tokens, what, &growth)
                .map_err(|source| Error::Pack { stream: stream.clone(), source })?;
            if grew {
                // The cycle holding the next unit (token, or first-fit row)
                // ends over the saved documents; the grown ones from the next.
                let r = rows_before[k];
                let unit = if pack.mode == crate::PackMode::Concat { r.saturating_mul(pack.seq_len) } else { r };
                let c = packer.cycle_of_unit(unit).map_err(|source| Error::Pack { stream: stream.clone(), source })?;
                let docs = packer.source().len();
                packer.push_segment(c + 1, docs).map_err(|source| Error::Pack { stream: stream.clone(), source })?;
            }
            let packer = Arc::new(packer);
            let streams: Vec<Stream> = PackColumn::all(&packer)
                .into_iter()
                .zip(pack.columns())
                .map(|(column, name)| Stream::new(*name, Arc::new(column) as Arc<dyn Source>))
                .collect();
            packers.push(packer);
            by_source.push(streams);
            weights.push(weight);
        }
        let fingerprints = Fingerprints { before: BTreeMap::new(), now };
        let packing = Packing { mode: config.mode, pack, packers };
        Loader::start(plan, by_source, config, fingerprints, Some(packing))
    }

    /// Starts the workers over `plan`; `sources[k]` are source `k`'s streams,
    /// in the same order for every source (one source unless a mixture).
    fn start(
        plan: Plan,
        sources: Vec<Vec<Stream>>,
        config: LoaderConfig,
        fingerprints: Fingerprints,
        pack: Option<Packing>,
    ) -> Result<Loader, Error> {
        let shard_len = plan.shard_len(config.shard)?;
        let mixture = matches!(plan, Plan::Mixture(_));
        let mut per_stream: Vec<Vec<Stream>> = Vec::new();
        for streams in sources {
            for (i, stream) in streams.into_iter().enumerate() {
                if per_stream.len() <= i {
                    per_stream.push(Vec::new());
                }
                per_stream[i].push(stream);
            }
        }

        let retain = retain_for(config.depth);
        // Pre-allocate what the steady state uses: `depth` steps in flight
        // plus the batch the caller holds. Ragged buffers start empty and
        // grow to fit.
        let prefill = config.depth + 1;
        let streams: Vec<StreamCtx> = per_stream
            .into_iter()
            .map(|set| {
                let layout = set[0].source.layout();
                let (data, offsets) = match layout {
                    Layout::Fixed { record_bytes } => {
                        let bytes = shard_len.saturating_mul(record_bytes);
                        (Pool::aligned(retain, prefill, bytes, PAGE), Pool::new(0, 0, 0))
                    }
                    Layout::Ragged => (Pool::aligned(retain, 0, 0, PAGE), Pool::new(retain, prefill, shard_len + 1)),
                };
                let name: Arc<str> = Arc::from(set[0].name.as_str());
                let labels = (0..set.len())
                    .map(|k| if mixture { Arc::from(format!("{k}/{name}")) } else { Arc::clone(&name) })
                    .collect();
                let sources = set.into_iter().map(|s| s.source).collect();
                StreamCtx { name, sources, labels, layout, data, offsets }
            })
            .collect();

        let fixed_step_bytes = streams
            .iter()
            .filter_map(|s| match s.layout {
                Layout::Fixed { record_bytes } => Some((shard_len as u64).saturating_mul(record_bytes as u64)),
                Layout::Ragged => None,
            })
            .fold(0u64, u64::saturating_add);
        let has_ragged = streams.iter().any(|s| s.layout == Layout::Ragged);

        let mut slots = VecDeque::with_capacity(config.depth);
        slots.resize_with(config.depth, || None);
        // Mode 3 over one set of streams: a thread loads each window ahead.
        let blocked = match &plan {
            Plan::Single(s) if s.state().mode == Mode::Blocked => Some(Prefetch::Single(s.clone())),
            // A mixture's sources read their windows ahead too, each its own.
            Plan::Mixture(m) if m.mode() == Mode::Blocked && pack.is_none() => Some(Prefetch::Mixture(m.clone())),
            // So do packed sources' documents in mode 3.
            Plan::Single(_) | Plan::Mixture(_) => {
                pack.as_ref().and_then(|p| packed_read_ahead(p, config.shard)).map(|packers| {
                    let steps = match &plan {
                        Plan::Mixture(m) => PackedPlan::Mixture(Box::new(m.clone())),
                        _ => PackedPlan::Single(config.batch_size),
                    };
                    Prefetch::Packed(packers, steps)
                })
            }
            Plan::Grown { .. } => None,
        };
        let lookahead = match plan.mode() {
            // Workers run at most `depth + threads` steps apart.
            Mode::Iid => Some(Lookahead::new(&plan, config.shard, (config.depth + config.threads) as u64)?),
            _ => None,
        };
        let shared = Arc::new(Shared {
            ctx: Ctx {
                plan,
                shard: config.shard,
                shard_len,
                depth: config.depth,
                ahead_bytes: config.ahead_bytes,
                fixed_step_bytes,
                has_ragged,
                lookahead,
                fan_out: gathers_leave_cores_idle(config.threads, config.depth),
                streams,
                indices: Pool::new(retain, prefill, shard_len),
                sources: mixture.then(|| Pool::new(retain, prefill, shard_len)),
                // Filled on first use: most stores never want hints.
                hints: Pool::new(retain, 0, 0),
                pack,
            },
            state: Mutex::new(State {
                shutdown: false,
                next_claim: config.start_step,
                prefetching: blocked.is_some(),
                awaited: u64::MAX,
                loaded_until: config.start_step,
                next_deliver: config.start_step,
                slots,
                died: None,
                ragged_step_max: None,
                gather: GatherStats::new(),
                idle: 0,
            }),
            work: Condvar::new(),
            claimed: Condvar::new(),
            ready: Condvar::new(),
            cpu: ThreadsCpu::new(config.threads),
        });

        let mut workers = Vec::with_capacity(config.threads);
        for i in 0..config.threads {
            let worker_shared = Arc::clone(&shared);
            let spawned =
                thread::Builder::new().name(format!("zring-loader-{i}")).spawn(move || worker(&worker_shared, i));
            match spawned {
                Ok(handle) => workers.push(handle),
                Err(e) => {
                    shared.shut_down();
                    for handle in workers {
                        // A worker's panic is already recorded in the state;
                        // there is nothing more to report while failing.
                        let _ = handle.join();
                    }
                    return Err(Error::Spawn(e));
                }
            }
        }

        if let Some(prefetch) = blocked {
            let prefetch_shared = Arc::clone(&shared);
            let (shard, start) = (config.shard, config.start_step);
            let spawned = thread::Builder::new().name("zring-prefetch".to_owned()).spawn(move || {
                prefetch_shared.cpu.window_started();
                match prefetch {
                    Prefetch::Single(sampler) => crate::prefetch::run(&*prefetch_shared, &sampler, shard, start),
                    Prefetch::Mixture(mixture) => crate::prefetch::run_mixture(&*prefetch_shared, &mixture, start),
                    Prefetch::Packed(packers, plan) => {
                        let packers: Vec<Option<&Packer>> = packers.iter().map(Option::as_deref).collect();
                        crate::prefetch::run_packed(&*prefetch_shared, &packers, &plan, start);
                    }
                }
                prefetch_shared.cpu.window_ended();
            });
            match spawned {
                Ok(handle) => workers.push(handle),
                // Without the thread the gathers read record by record.
                Err(_) => {
                    shared.lock().prefetching = false;
                    shared.work.notify_all();
                }
            }
        }

        Ok(Loader {
            shared,
            fingerprints,
            workers,
            next_step: config.start_step,
            poisoned: None,
            closed: false,
            delivered: 0,
            wait: stats::histogram(),
            waiting_since: None,
        })
    }
}

/// Mode 3 shapes for a mixture's sources: each source's own blocks (what its
/// first stream reads best, about 1 MiB each), and a share of the windows'
/// blocks by its weight. A store's shape has a window of a quarter of its
/// record cache, and the stores share the cache: their windows together are
/// what one store's would be alone.
pub(super) fn mixture_shapes(sources: &[MixSource], weights: &[f64]) -> Vec<Blocks> {
    let shapes: Vec<Blocks> = sources
        .iter()
        .map(|source| source.streams.first().and_then(|s| s.source.block_shape()).unwrap_or(Blocks::DEFAULT))
        .collect();
    let total: u64 = shapes.iter().map(|b| b.window_blocks).fold(0, u64::saturating_add);
    shapes
        .iter()
        .zip(weights)
        .map(|(c, &w)| {
            // Lossless enough: a window of at most 2^53 blocks.
            let window_blocks = ((total as f64 * w).round() as u64).max(1);
            Blocks { window_blocks, shards: 1, ..*c }
        })
        .collect()
}

/// The packers whose document windows a packed loader reads ahead
/// ([`crate::prefetch::run_packed`], which also checks that a window fits
/// its source's memory), one per source (`None` for a source that is not):
/// those of a loader in mode 3 over a source that reads blocks
/// ([`Source::block_shape`]), when the loader reads every row of
/// each batch (one shard: a shard's rows of a window are spread over all of
/// its blocks, so it would read the whole window for its share). `None`
/// when no source is: the gathers read each document themselves.
pub(super) fn packed_read_ahead(packing: &Packing, shard: Shard) -> Option<Vec<Option<Arc<Packer>>>> {
    if packing.mode != Mode::Blocked || shard.count != 1 {
        return None;
    }
    let packers: Vec<Option<Arc<Packer>>> =
        packing.packers.iter().map(|p| p.source_shape().is_some().then(|| Arc::clone(p))).collect();
    packers.iter().any(Option::is_some).then_some(packers)
}

/// A loader of records refuses a state saved by a packed loader.
pub(super) fn refuse_pack_state(config: &LoaderConfig) -> Result<(), Error> {
    match &config.expect_pack {
        Some(p) => Err(Error::PackMismatch {
            saved: format!("rows of {} packed tokens", p.seq_len),
            loader: "a loader of records".to_owned(),
        }),
        None => Ok(()),
    }
}

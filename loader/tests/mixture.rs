//! Mixtures: a loader over weighted sources delivers exactly the rows the
//! sampler's `Mixture` plans, each from its own source, through the same
//! pipeline as one set of streams (state, resume, shards, failures, hints).

mod common;

use std::sync::Arc;

use common::{fixed_record, ragged_record, with_timeout, Faults, MemSource, Probe, DEADLOCK};
use zring_loader::{Batch, Error, Layout, Loader, LoaderConfig, LoaderState, MixSource, Mode, Shard, Source, Stream};
use zring_sampler::{Mixture, RowOrder};

/// Source `k` of a mixture: the common test records from `k * 1_000_000`
/// on, so rows from different sources differ; hinted gathers are recorded.
fn tagged(k: u64, len: u64, layout: Layout) -> Arc<Probe> {
    tagged_with(k, len, layout, false, Faults::default())
}

fn tagged_with(k: u64, len: u64, layout: Layout, wants: bool, faults: Faults) -> Arc<Probe> {
    Probe::new(MemSource::based(k * 1_000_000, len, layout, faults), wants)
}

const LENGTHS: [u64; 3] = [120, 37, 53];
const WEIGHTS: [f64; 3] = [0.5, 0.3, 0.2];

/// Sources of `LENGTHS` with a fixed stream "img" (8-byte records) and a
/// ragged stream "txt" (given in another order in every other source).
fn sources(lengths: &[u64], weights: &[f64]) -> Vec<MixSource> {
    lengths
        .iter()
        .zip(weights)
        .enumerate()
        .map(|(k, (&n, &w))| {
            let img = Stream::new("img", tagged(k as u64, n, Layout::Fixed { record_bytes: 8 }));
            let txt = Stream::new("txt", tagged(k as u64, n, Layout::Ragged));
            MixSource::new(w, if k % 2 == 0 { vec![img, txt] } else { vec![txt, img] })
        })
        .collect()
}

fn config(mode: Mode, batch: u64) -> LoaderConfig {
    LoaderConfig { mode, seed: 3, depth: 4, threads: 3, ..LoaderConfig::new(batch) }
}

/// Checks every row of `b` against the plan and its source's records.
fn assert_planned(m: &Mixture, shard: Shard, b: &Batch) {
    let per = m.shard_len(shard).unwrap();
    let (mut src, mut idx) = (vec![0; per], vec![0; per]);
    m.fill_shard(b.step, shard, &mut src, &mut idx).unwrap();
    assert_eq!(b.sources.as_deref(), Some(&src[..]), "step {}", b.step);
    assert_eq!(&b.indices[..], &idx[..], "step {}", b.step);
    for (r, (&k, &i)) in src.iter().zip(&idx).enumerate() {
        let id = u64::from(k) * 1_000_000 + i;
        assert_eq!(b.record("img", r).unwrap(), &fixed_record(id, 8)[..], "step {} row {r}", b.step);
        assert_eq!(b.record("txt", r).unwrap(), &ragged_record(id)[..], "step {} row {r}", b.step);
    }
    assert_eq!(b.columns[0].name(), "img", "columns in source 0's order");
}

#[test]
fn every_row_is_the_planned_record_of_its_source() {
    for mode in [Mode::Sequential, Mode::Iid, Mode::Cyclic] {
        for shard in [Shard::ALL, Shard::new(2, 4).unwrap()] {
            let m = Mixture::new(mode, &LENGTHS, &WEIGHTS, 24, 3).unwrap();
            let cfg = LoaderConfig { shard, ..config(mode, 24) };
            let mut loader = Loader::new_mixture(sources(&LENGTHS, &WEIGHTS), cfg).unwrap();
            for t in 0..50 {
                let b = loader.next().unwrap();
                assert_eq!(b.step, t);
                assert_planned(&m, shard, &b);
            }
        }
    }
}

#[test]
fn a_resumed_mixture_continues_mid_cycle_and_its_state_names_the_mixture() {
    let cfg = config(Mode::Cyclic, 24);
    let mut whole = Loader::new_mixture(sources(&LENGTHS, &WEIGHTS), cfg.clone()).unwrap();
    let reference: Vec<Vec<u8>> = (0..30).map(|_| whole.next().unwrap().columns[0].data().to_vec()).collect();
    let mut first = Loader::new_mixture(sources(&LENGTHS, &WEIGHTS), cfg).unwrap();
    for _ in 0..7 {
        first.next().unwrap();
    }
    let json = serde_json::to_value(first.state()).unwrap();
    assert_eq!(json["sampler"]["step"], 7);
    assert_eq!(json["sampler"]["length"], 210);
    assert_eq!(json["mixture"]["lengths"], serde_json::json!([120, 37, 53]));
    let state: LoaderState = serde_json::from_value(json).unwrap();
    let mut resumed = Loader::new_mixture(sources(&LENGTHS, &WEIGHTS), LoaderConfig::from_state(&state)).unwrap();
    for want in &reference[7..] {
        assert_eq!(resumed.next().unwrap().columns[0].data(), &want[..]);
    }
    // Sources of other lengths (the data changed), or one set of streams,
    // do not take this state.
    let other = Loader::new_mixture(sources(&[120, 37, 54], &WEIGHTS), LoaderConfig::from_state(&state));
    assert!(matches!(other, Err(Error::MixtureMismatch { .. })), "{other:?}");
    // Other weights do, from the saved step on: the state then holds the
    // saved weights from step 0 and the new ones from step 7.
    let mut reweighted =
        Loader::new_mixture(sources(&LENGTHS, &[0.4, 0.4, 0.2]), LoaderConfig::from_state(&state)).unwrap();
    assert_eq!(reweighted.next().unwrap().step, 7);
    let pieces = reweighted.state().mixture.unwrap().schedule.unwrap();
    assert_eq!(pieces.iter().map(|p| p.from).collect::<Vec<_>>(), vec![0, 7]);
    assert_eq!(pieces[1].points[0].weights, vec![0.4, 0.4, 0.2]);
    let streams = vec![Stream::new("img", tagged(0, 210, Layout::Fixed { record_bytes: 8 }) as Arc<dyn Source>)];
    let single = Loader::new(streams.clone(), LoaderConfig::from_state(&state)).unwrap_err();
    assert!(single.to_string().contains("saved for a mixture"), "{single}");
    let plain = Loader::new(streams, LoaderConfig::new(24)).unwrap().state();
    assert!(!serde_json::to_string(&plain).unwrap().contains("mixture"), "a plain state has no mixture key");
    let err = Loader::new_mixture(sources(&[200, 10], &[0.5, 0.5]), LoaderConfig::from_state(&plain)).unwrap_err();
    assert!(matches!(err, Error::MixtureMismatch { .. }), "{err}");
}

/// Rows of a mixture are interleaved so that each shard holds each source's
/// share; a run saved before that (its state has no `order`) must resume
/// with the grouped batches it was saved with, not silently change them.
#[test]
fn a_state_saved_before_interleaving_resumes_grouped() {
    let mut loader = Loader::new_mixture(sources(&LENGTHS, &WEIGHTS), config(Mode::Cyclic, 24)).unwrap();
    for _ in 0..3 {
        loader.next().unwrap();
    }
    let mut json = serde_json::to_value(loader.state()).unwrap();
    assert_eq!(json["mixture"]["order"], "Interleaved");
    json["mixture"].as_object_mut().unwrap().remove("order");
    let old: LoaderState = serde_json::from_value(json).unwrap();
    let grouped = Mixture::new(Mode::Cyclic, &LENGTHS, &WEIGHTS, 24, 3).unwrap().with_order(RowOrder::Grouped);
    for shard in [Shard::ALL, Shard::new(1, 3).unwrap()] {
        let cfg = LoaderConfig { shard, ..LoaderConfig::from_state(&old) };
        let mut resumed = Loader::new_mixture(sources(&LENGTHS, &WEIGHTS), cfg).unwrap();
        for _ in 0..5 {
            let b = resumed.next().unwrap();
            assert_planned(&grouped, shard, &b);
        }
        assert_eq!(resumed.state().mixture.unwrap().order, RowOrder::Grouped, "and saves grouped again");
    }
}

#[test]
fn a_failing_source_fails_its_step_named_by_source_and_poisons_the_loader() {
    let m = Mixture::new(Mode::Cyclic, &LENGTHS, &WEIGHTS, 24, 3).unwrap();
    // The first step at which source 2 draws its record 5.
    let (mut src, mut idx) = (vec![0; 24], vec![0; 24]);
    let bad_step = (0..)
        .find(|&t| {
            m.fill_shard(t, Shard::ALL, &mut src, &mut idx).unwrap();
            src.iter().zip(&idx).any(|(&k, &i)| k == 2 && i == 5)
        })
        .unwrap();
    let mut list = sources(&LENGTHS, &WEIGHTS);
    let faults = Faults { fail_on: Some(5), ..Faults::default() };
    let broken = tagged_with(2, 53, Layout::Fixed { record_bytes: 8 }, false, faults);
    list[2].streams = vec![Stream::new("img", broken), Stream::new("txt", tagged(2, 53, Layout::Ragged))];
    let mut loader = Loader::new_mixture(list, config(Mode::Cyclic, 24)).unwrap();
    for _ in 0..bad_step {
        loader.next().unwrap();
    }
    match loader.next().unwrap_err() {
        Error::Gather { step, stream, .. } => {
            assert_eq!(step, bad_step);
            assert_eq!(stream, "2/img");
        }
        other => panic!("expected a gather error, got {other}"),
    }
    assert!(matches!(loader.next(), Err(Error::Poisoned { step }) if step == bad_step));
    assert_eq!(loader.state().sampler.step, bad_step, "the state names the failed step");
}

#[test]
fn bad_mixtures_are_refused_with_what_is_wrong() {
    let mut odd = sources(&LENGTHS, &WEIGHTS);
    odd[1].streams.pop();
    let e = Loader::new_mixture(odd, config(Mode::Iid, 24)).unwrap_err();
    assert!(matches!(e, Error::SourceStreams { source_index: 1, .. }), "{e}");
    let mut ragged = sources(&LENGTHS, &WEIGHTS);
    ragged[2].streams[0] = Stream::new("img", tagged(2, 53, Layout::Ragged));
    let e = Loader::new_mixture(ragged, config(Mode::Iid, 24)).unwrap_err();
    assert!(e.to_string().contains("source 2 has streams"), "{e}");
    assert!(Loader::new_mixture(vec![], config(Mode::Iid, 24)).is_err());
    let cfg = LoaderConfig { shard: Shard::new(0, 4).unwrap(), ..config(Mode::Iid, 25) };
    let e = Loader::new_mixture(sources(&LENGTHS, &WEIGHTS), cfg).unwrap_err();
    assert!(e.to_string().contains("do not divide"), "{e}");
}

/// Sources of under a row per batch (0.256 and 0.0256 of 256 rows) are
/// taken, get their rows over the steps, and a run resumed at step 12,345,
/// whole or by two shards, delivers what the uninterrupted run does.
#[test]
fn small_weights_are_taken_and_a_run_resumed_at_step_12345_is_exact() {
    let weights = [0.9989, 0.001, 0.0001];
    let cfg = config(Mode::Cyclic, 256);
    let m = Mixture::new(Mode::Cyclic, &LENGTHS, &weights, 256, 3).unwrap();
    let mut whole = Loader::new_mixture(sources(&LENGTHS, &weights), cfg).unwrap();
    let mut rows = [0u64; 3];
    for _ in 0..12_345 {
        for &k in whole.next().unwrap().sources.as_deref().unwrap() {
            rows[k as usize] += 1;
        }
    }
    for (k, w) in m.weights().iter().enumerate() {
        let share = w * (12_345.0 * 256.0);
        assert!((rows[k] as f64 - share).abs() < 1.0, "source {k}: {} rows for {share}", rows[k]);
    }
    let state: LoaderState = serde_json::from_str(&serde_json::to_string(&whole.state()).unwrap()).unwrap();
    assert_eq!(state.sampler.step, 12_345);
    // (step, sources, indices, "img" bytes) of each batch.
    type Seen = (u64, Vec<u32>, Vec<u64>, Vec<u8>);
    let seen = |b: &Batch| -> Seen {
        (b.step, b.sources.as_deref().unwrap().to_vec(), b.indices.to_vec(), b.columns[0].data().to_vec())
    };
    let reference: Vec<Seen> = (0..6).map(|_| seen(&whole.next().unwrap())).collect();
    let mut resumed = Loader::new_mixture(sources(&LENGTHS, &weights), LoaderConfig::from_state(&state)).unwrap();
    for want in &reference {
        let b = resumed.next().unwrap();
        assert_eq!(&seen(&b), want);
        assert_planned(&m, Shard::ALL, &b);
    }
    let mut halves: Vec<Loader> = (0..2)
        .map(|j| {
            let cfg = LoaderConfig { shard: Shard::new(j, 2).unwrap(), ..LoaderConfig::from_state(&state) };
            Loader::new_mixture(sources(&LENGTHS, &weights), cfg).unwrap()
        })
        .collect();
    for want in &reference {
        let (a, b) = (seen(&halves[0].next().unwrap()), seen(&halves[1].next().unwrap()));
        assert_eq!((a.0, b.0), (want.0, want.0));
        assert_eq!([a.1, b.1].concat(), want.1);
        assert_eq!([a.2, b.2].concat(), want.2);
        assert_eq!([a.3, b.3].concat(), want.3);
    }
}

#[test]
fn a_hundred_sources_and_prime_lengths_deliver_their_plans() {
    with_timeout(DEADLOCK, || {
        // Weights from 0.001 to 0.5 of a batch of 1024, lengths prime.
        let primes = (2u64..).filter(|n| (2..*n).take_while(|d| d * d <= *n).all(|d| n % d != 0));
        let lengths: Vec<u64> = primes.skip(20).take(100).collect();
        let mut weights = vec![0.5];
        weights.extend((0..99).map(|k| 0.001 + (0.5 / 99.0 - 0.001) * 2.0 * f64::from(k) / 98.0));
        let m = Mixture::new(Mode::Cyclic, &lengths, &weights, 1024, 3).unwrap();
        let mut loader = Loader::new_mixture(sources(&lengths, &weights), config(Mode::Cyclic, 1024)).unwrap();
        for _ in 0..20 {
            let b = loader.next().unwrap();
            assert_planned(&m, Shard::ALL, &b);
            let mut seen = [false; 100];
            for &k in b.sources.as_deref().unwrap() {
                seen[k as usize] = true;
            }
            assert!(seen.iter().all(|&s| s), "every source has a row in every batch");
        }
    });
}

#[test]
fn hints_reach_every_source_that_wants_them_as_the_shards_next_draws() {
    for mode in [Mode::Iid, Mode::Cyclic] {
        let shard = Shard::new(1, 2).unwrap();
        let m = Mixture::new(mode, &LENGTHS, &WEIGHTS, 24, 3).unwrap();
        let probes: Vec<Arc<Probe>> = (0..3)
            .map(|k| tagged_with(k, LENGTHS[k as usize], Layout::Fixed { record_bytes: 8 }, k != 1, Faults::default()))
            .collect();
        let list = probes
            .iter()
            .zip(WEIGHTS)
            .map(|(p, w)| MixSource::new(w, vec![Stream::new("img", Arc::clone(p) as Arc<dyn Source>)]))
            .collect();
        let cfg = LoaderConfig { shard, threads: 1, depth: 1, ..config(mode, 24) };
        let mut loader = Loader::new_mixture(list, cfg).unwrap();
        let draws = |t: u64| {
            let (mut s, mut i) = (vec![0; 12], vec![0; 12]);
            m.fill_shard(t, shard, &mut s, &mut i).unwrap();
            s.into_iter().zip(i).collect::<Vec<_>>()
        };
        for _ in 0..30 {
            loader.next().unwrap();
        }
        loader.close().unwrap();
        assert!(probes[1].hinted.lock().unwrap().is_empty(), "source 1 does not want hints");
        let mut known = 0;
        let seen: Vec<_> = probes.iter().map(|p| p.hinted.lock().unwrap().clone()).collect();
        let mut cursor = [0usize; 3];
        // One worker, depth 1: the gathers ran in step order, one per source
        // with rows in the shard's part of the step.
        for t in 0..30u64 {
            let d = draws(t);
            for k in [0usize, 2] {
                let rows: Vec<u64> = d.iter().filter(|(s, _)| *s as usize == k).map(|(_, i)| *i).collect();
                if rows.is_empty() {
                    continue;
                }
                let (idx, next) = &seen[k][cursor[k]];
                cursor[k] += 1;
                assert_eq!(idx, &rows, "{mode:?} step {t} source {k}");
                for (&i, &n) in idx.iter().zip(next) {
                    // Iid draws are looked ahead for one pass on average:
                    // 210 records over 12 rows a step.
                    let horizon = if mode == Mode::Iid { 18 } else { 200 };
                    let want = (t + 1..=t + horizon).find(|&u| draws(u).contains(&(k as u32, i)));
                    assert_eq!(n, want, "{mode:?} source {k} step {t} index {i}");
                    known += usize::from(n.is_some());
                }
            }
        }
        assert!(known > 0);
    }
}

/// A source whose window loads take their time, counting the loads in
/// progress across every source it is shared with.
struct SlowLoads {
    inner: Arc<Probe>,
    delay: std::time::Duration,
    loading: Arc<std::sync::atomic::AtomicUsize>,
    most: Arc<std::sync::atomic::AtomicUsize>,
}

impl Source for SlowLoads {
    fn len(&self) -> u64 {
        self.inner.len()
    }
    fn layout(&self) -> Layout {
        self.inner.layout()
    }
    fn gather(&self, req: &zring_loader::Request<'_>, dst: &mut [u8]) -> Result<(), zring_loader::SourceError> {
        self.inner.gather(req, dst)
    }
    fn lengths(&self, indices: &[u64], out: &mut [u64]) -> Result<(), zring_loader::SourceError> {
        self.inner.lengths(indices, out)
    }
    fn prefetch(&self, _: &[std::ops::Range<u64>], _: &[Option<u64>]) -> Result<(), zring_loader::SourceError> {
        use std::sync::atomic::Ordering::SeqCst;
        let now = self.loading.fetch_add(1, SeqCst) + 1;
        self.most.fetch_max(now, SeqCst);
        std::thread::sleep(self.delay);
        self.loading.fetch_sub(1, SeqCst);
        Ok(())
    }
}

/// In mode 3 each source of a mixture loads its windows on its own thread:
/// a source whose loads are slow does not hold the other sources' loads
/// back (one thread walking the sources in turn loaded one window at a
/// time, so the steps waited for every source's load in a row), and the
/// batches are the mixture's.
#[test]
fn a_mixtures_sources_load_their_windows_side_by_side() {
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
    with_timeout(DEADLOCK * 3, || {
        let loading = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let lengths = [600u64, 400, 300];
        let weights = [0.5, 0.3, 0.2];
        let sources: Vec<MixSource> = lengths
            .iter()
            .zip(weights)
            .enumerate()
            .map(|(k, (&n, w))| {
                let slow = SlowLoads {
                    inner: tagged(k as u64, n, Layout::Fixed { record_bytes: 8 }),
                    delay: std::time::Duration::from_millis(if k == 0 { 150 } else { 30 }),
                    loading: Arc::clone(&loading),
                    most: Arc::clone(&most),
                };
                MixSource::new(w, vec![Stream::new("img", Arc::new(slow) as Arc<dyn Source>)])
            })
            .collect();
        let shape = zring_loader::Blocks { block_records: 10, window_blocks: 4, shards: 1 };
        let cfg = LoaderConfig { blocks: Some(shape), ..config(Mode::Blocked, 20) };
        let mut l = Loader::new_mixture(sources, cfg).unwrap();
        for _ in 0..40 {
            let b = l.next().unwrap();
            let src: Vec<u32> = b.sources.as_deref().expect("a mixture's batch names its sources").to_vec();
            for (r, (&k, &i)) in src.iter().zip(b.indices.iter()).enumerate() {
                assert_eq!(b.record("img", r).unwrap(), &fixed_record(u64::from(k) * 1_000_000 + i, 8)[..]);
            }
        }
        l.close().unwrap();
        assert!(most.load(SeqCst) >= 2, "the sources' window loads never overlapped");
        assert!(l.stats().window_cpu_s >= 0.0);
    });
}

//! Next-use hints: a source that wants them gets, for every record of a step,
//! the first later step at which the loader's own shard draws it, exactly as
//! the sampler computes it (for iid draws, within a window of the steps
//! ahead; for all shards, the sampler's `next_use`); sources
//! that do not want them never see a hinted gather; and the hinted gathers
//! deliver the same bytes.

mod common;

use std::collections::HashMap;

use common::{assert_matches_source, take, with_timeout, MemSource, Probe, DEADLOCK};
use zring_loader::{Loader, LoaderConfig, Mode, Shard, Stream};
use zring_sampler::Sampler;

fn config(mode: Mode, shard: Shard) -> LoaderConfig {
    LoaderConfig { mode, seed: 11, shard, threads: 3, depth: 3, ..LoaderConfig::new(12) }
}

#[test]
fn hints_are_the_shards_own_next_draws() {
    with_timeout(DEADLOCK, || {
        // 100 records in batches of 12: cycles of 8 steps that leave 4 out.
        for mode in [Mode::Cyclic, Mode::Sequential] {
            for shard in [Shard::ALL, Shard::new(1, 3).unwrap()] {
                let img = Probe::new(MemSource::fixed(100, 5), true);
                let txt = Probe::new(MemSource::ragged(100), true);
                let streams = vec![Stream::new("img", img.clone()), Stream::new("txt", txt.clone())];
                let mut loader = Loader::new(streams, config(mode, shard)).unwrap();
                // Sequential steps repeat their indices every 25 steps;
                // with the read-ahead, steps up to 23 are gathered.
                let batches = take(&mut loader, 20);
                drop(loader);
                let sampler = Sampler::new(mode, 100, 12, 11).unwrap();
                for probe in [&img, &txt] {
                    assert_eq!(*probe.plain.lock().unwrap(), 0, "{mode:?}: a plain gather despite wanting hints");
                    // No two of these steps have the same indices, so they
                    // name the step's gather.
                    let seen: HashMap<Vec<u64>, Vec<Option<u64>>> =
                        probe.hinted.lock().unwrap().iter().cloned().collect();
                    for b in &batches {
                        let hints = seen.get(&b.indices).expect("every delivered step had a hinted gather");
                        let slice = |t: u64| {
                            let mut v = vec![0; sampler.shard_len(shard).unwrap()];
                            sampler.fill_shard(t, shard, &mut v).unwrap();
                            v
                        };
                        for (&index, &hint) in b.indices.iter().zip(hints) {
                            let want = (b.step + 1..b.step + 10_000).find(|&t| slice(t).contains(&index));
                            assert_eq!(hint, want, "{mode:?} step {}", b.step);
                            if shard == Shard::ALL {
                                assert_eq!(hint, sampler.next_use(index, b.step));
                            }
                        }
                    }
                }
            }
        }
    });
}

#[test]
fn hinted_gathers_deliver_the_same_batches() {
    with_timeout(DEADLOCK, || {
        let plain = vec![Stream::new("img", MemSource::fixed(100, 12)), Stream::new("txt", MemSource::ragged(100))];
        let hinted = vec![
            Stream::new("img", Probe::new(MemSource::fixed(100, 12), true)),
            Stream::new("txt", Probe::new(MemSource::ragged(100), true)),
        ];
        let mut a = Loader::new(plain, config(Mode::Cyclic, Shard::ALL)).unwrap();
        let mut b = Loader::new(hinted, config(Mode::Cyclic, Shard::ALL)).unwrap();
        let sa = take(&mut a, 25);
        assert_eq!(sa, take(&mut b, 25));
        assert_matches_source(&b.next().unwrap());
    });
}

#[test]
fn iid_hints_come_from_the_draws_ahead_and_only_sources_that_want_them_get_any() {
    with_timeout(DEADLOCK, || {
        // Iid: the loader looks at the draws of the steps ahead (as many as
        // one pass over the records takes on average: 100 / 10 here), so
        // each hint is the next step within them that draws the index.
        let wants = Probe::new(MemSource::fixed(100, 4), true);
        let cfg = config(Mode::Iid, Shard::ALL);
        let sampler = Sampler::new(Mode::Iid, 100, cfg.batch_size, cfg.seed).unwrap();
        let mut loader = Loader::new(vec![Stream::new("x", wants.clone())], cfg).unwrap();
        take(&mut loader, 10);
        drop(loader);
        assert_eq!(*wants.plain.lock().unwrap(), 0);
        let hinted = wants.hinted.lock().unwrap();
        assert!(hinted.len() >= 10);
        let span = 100u64.div_ceil(sampler.batch_len() as u64);
        let mut some = 0;
        for (indices, next) in hinted.iter() {
            let step = (0..20).find(|&s| sampler.batch(s) == *indices).expect("a batch of the sampler");
            for (&i, &n) in indices.iter().zip(next) {
                let want = (step + 1..=step + span).find(|&t| sampler.batch(t).contains(&i));
                assert_eq!(n, want, "step {step}, index {i}");
                some += usize::from(n.is_some());
            }
        }
        assert!(some > 0, "some records come again within the window");

        // Cyclic: only the stream that wants hints gets them.
        let yes = Probe::new(MemSource::fixed(100, 4), true);
        let no = Probe::new(MemSource::ragged(100), false);
        let streams = vec![Stream::new("yes", yes.clone()), Stream::new("no", no.clone())];
        let mut loader = Loader::new(streams, config(Mode::Cyclic, Shard::ALL)).unwrap();
        take(&mut loader, 10);
        drop(loader);
        assert!(yes.hinted.lock().unwrap().len() >= 10);
        assert_eq!(*yes.plain.lock().unwrap(), 0);
        assert!(no.hinted.lock().unwrap().is_empty());
        assert!(*no.plain.lock().unwrap() >= 10);
    });
}

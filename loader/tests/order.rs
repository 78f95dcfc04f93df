//! Delivery order and contents: the batch sequence is a function of the
//! sampler parameters alone, never of the thread count or pipeline depth, and
//! every batch holds exactly the source's records at its indices.

mod common;

use std::sync::Arc;

use common::{assert_matches_source, take, two_streams, with_timeout, Faults, MemSource, DEADLOCK};
use zring_loader::{Layout, Loader, LoaderConfig, Mode, Shard, Stream};

fn config(mode: Mode, threads: usize, depth: usize) -> LoaderConfig {
    LoaderConfig { mode, seed: 7, threads, depth, ..LoaderConfig::new(16) }
}

/// Streams whose gathers take varying time, so that with several threads
/// later steps often finish before earlier ones.
fn jittery_streams(len: u64) -> Vec<zring_loader::Stream> {
    let faults = Faults { jitter_us: 400, ..Faults::default() };
    vec![
        Stream::new("img", MemSource::with_faults(len, Layout::Fixed { record_bytes: 12 }, faults)),
        Stream::new("txt", MemSource::with_faults(len, Layout::Ragged, faults)),
    ]
}

#[test]
fn order_is_identical_for_any_threads_and_depth() {
    with_timeout(DEADLOCK, || {
        for mode in [Mode::Sequential, Mode::Iid, Mode::Cyclic] {
            let mut reference = None;
            for threads in [1, 2, 8] {
                for depth in [1, 2, 4] {
                    let mut loader = Loader::new(jittery_streams(300), config(mode, threads, depth)).unwrap();
                    let seq = take(&mut loader, 40);
                    for (k, s) in seq.iter().enumerate() {
                        assert_eq!(s.step, k as u64, "{mode:?} threads={threads} depth={depth}");
                    }
                    match &reference {
                        None => reference = Some(seq),
                        Some(r) => assert!(
                            *r == seq,
                            "{mode:?}: threads={threads} depth={depth} differs from threads=1 depth=1"
                        ),
                    }
                }
            }
        }
    });
}

#[test]
fn batches_hold_the_source_bytes() {
    with_timeout(DEADLOCK, || {
        for mode in [Mode::Sequential, Mode::Iid, Mode::Cyclic] {
            let mut loader = Loader::new(two_streams(250), config(mode, 3, 3)).unwrap();
            for step in 0..60 {
                let b = loader.next().unwrap();
                assert_eq!(b.step, step);
                assert_eq!(b.len(), 16);
                assert_eq!(b.columns.len(), 2);
                assert_eq!(b.column("img").unwrap().data().len(), 16 * 12);
                assert!(b.column("img").unwrap().offsets().is_none());
                assert!(b.column("txt").unwrap().offsets().is_some());
                assert!(b.indices.iter().all(|&i| i < 250));
                assert_matches_source(&b);
                assert_eq!(b.record("img", 3).unwrap(), &common::fixed_record(b.indices[3], 12)[..]);
                assert_eq!(b.record("txt", 5).unwrap(), &common::ragged_record(b.indices[5])[..]);
                assert_eq!(b.record("txt", 16), None);
                assert_eq!(b.record("nope", 0), None);
            }
        }
    });
}

#[test]
fn sequential_mode_walks_the_records_in_order() {
    with_timeout(DEADLOCK, || {
        let mut loader = Loader::new(two_streams(40), config(Mode::Sequential, 2, 2)).unwrap();
        for step in 0..10u64 {
            let b = loader.next().unwrap();
            let expected: Vec<u64> = (0..16).map(|j| (step * 16 + j) % 40).collect();
            assert_eq!(b.indices[..], expected[..]);
        }
    });
}

#[test]
fn start_step_skips_ahead() {
    with_timeout(DEADLOCK, || {
        let mut full = Loader::new(two_streams(300), config(Mode::Cyclic, 2, 2)).unwrap();
        let seq = take(&mut full, 30);
        let cfg = LoaderConfig { start_step: 20, ..config(Mode::Cyclic, 2, 2) };
        let mut late = Loader::new(two_streams(300), cfg).unwrap();
        assert_eq!(take(&mut late, 10), seq[20..]);
    });
}

#[test]
fn shards_concatenate_to_the_global_batch() {
    with_timeout(DEADLOCK, || {
        let mut whole = Loader::new(two_streams(500), config(Mode::Iid, 2, 2)).unwrap();
        let mut shards: Vec<Loader> = (0..2)
            .map(|index| {
                let cfg = LoaderConfig { shard: Shard::new(index, 2).unwrap(), ..config(Mode::Iid, 2, 2) };
                Loader::new(two_streams(500), cfg).unwrap()
            })
            .collect();
        assert_eq!(shards[0].batch_len(), 8);
        for _ in 0..20 {
            let w = whole.next().unwrap();
            let a = shards[0].next().unwrap();
            let b = shards[1].next().unwrap();
            assert_eq!((a.step, b.step), (w.step, w.step));
            let idx: Vec<u64> = a.indices.iter().chain(b.indices.iter()).copied().collect();
            assert_eq!(idx[..], w.indices[..]);
            let img: Vec<u8> = [a.column("img").unwrap().data(), b.column("img").unwrap().data()].concat();
            assert_eq!(img[..], *w.column("img").unwrap().data());
            let txt: Vec<u8> = [a.column("txt").unwrap().data(), b.column("txt").unwrap().data()].concat();
            assert_eq!(txt[..], *w.column("txt").unwrap().data());
        }
    });
}

#[test]
fn batch_larger_than_the_streams_is_cut_to_their_length() {
    with_timeout(DEADLOCK, || {
        let mut loader = Loader::new(two_streams(5), config(Mode::Cyclic, 1, 1)).unwrap();
        let b = loader.next().unwrap();
        assert_eq!(b.len(), 5);
        let mut idx = b.indices.to_vec();
        idx.sort_unstable();
        assert_eq!(idx, [0, 1, 2, 3, 4]);
        assert_matches_source(&b);
    });
}

#[test]
fn stats_count_what_was_delivered() {
    with_timeout(DEADLOCK, || {
        let streams = vec![Stream::new("img", MemSource::fixed(100, 10))];
        let mut loader = Loader::new(streams, config(Mode::Iid, 2, 2)).unwrap();
        let before = loader.stats();
        assert_eq!(before.steps_delivered, 0);
        assert_eq!(before.wait.count, 0);
        for _ in 0..25 {
            loader.next().unwrap();
        }
        let s = loader.stats();
        assert_eq!(s.steps_delivered, 25);
        assert_eq!(s.wait.count, 25);
        // Workers may be ahead of the consumer by up to `depth` steps.
        assert!((25..=27).contains(&s.steps_gathered), "{s:?}");
        assert_eq!(s.records_gathered, s.steps_gathered * 16);
        assert_eq!(s.bytes_gathered, s.steps_gathered * 160);
        assert_eq!(s.gather.count, s.steps_gathered);
        assert!(s.wait.p50_us <= s.wait.p99_us && s.wait.p99_us <= s.wait.max_us);
        let json = serde_json::to_string(&s).unwrap();
        let mut back: zring_loader::LoaderStats = serde_json::from_str(&json).unwrap();
        // serde_json may round a float's last bit; everything else is exact.
        for (b, orig) in [(&mut back.wait, &s.wait), (&mut back.gather, &s.gather)] {
            assert!((b.mean_us - orig.mean_us).abs() <= orig.mean_us * 1e-12);
            b.mean_us = orig.mean_us;
        }
        assert!((back.cpu_s - s.cpu_s).abs() <= s.cpu_s * 1e-12);
        back.cpu_s = s.cpu_s;
        assert_eq!(back, s);
    });
}

#[test]
fn into_columns_hands_out_owned_buffers() {
    with_timeout(DEADLOCK, || {
        let mut loader = Loader::new(two_streams(100), config(Mode::Cyclic, 2, 2)).unwrap();
        let b = loader.next().unwrap();
        let expected = common::snapshot(&b);
        let columns = b.into_columns();
        let (name, data, offsets) = columns.into_iter().nth(1).unwrap().into_parts();
        assert_eq!(&*name, "txt");
        assert_eq!(data[..], expected.columns[1].1[..]);
        assert_eq!(offsets.unwrap()[..], expected.columns[1].2.as_ref().unwrap()[..]);
        // A detached buffer is a plain Vec with the same bytes.
        let b = loader.next().unwrap();
        let img = b.column("img").unwrap().data().to_vec();
        let owned = b.into_columns().remove(0).data.into_vec();
        assert_eq!(owned, img);
        // The loader keeps going after buffers left its pools.
        for _ in 0..10 {
            common::assert_matches_source(&loader.next().unwrap());
        }
    });
}

#[test]
fn a_single_stream_of_a_shared_source_works() {
    with_timeout(DEADLOCK, || {
        let src = MemSource::fixed(64, 3);
        let streams = vec![Stream::new("a", src.clone()), Stream::new("b", src as Arc<_>)];
        let mut loader = Loader::new(streams, config(Mode::Iid, 2, 2)).unwrap();
        let b = loader.next().unwrap();
        assert_eq!(b.column("a").unwrap().data(), b.column("b").unwrap().data());
    });
}

/// User plus system CPU-seconds of this whole process, from /proc/self/stat
/// (in clock ticks of 1/100 s).
fn process_cpu_s() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    let fields: Vec<&str> = stat.rsplit_once(')').unwrap().1.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
    (fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap()) / 100.0
}

#[test]
fn stats_count_the_cpu_time_of_the_gather_threads() {
    with_timeout(DEADLOCK, || {
        // 64 KiB records: each step's gather does measurable work.
        let streams = vec![Stream::new("img", MemSource::fixed(64, 65_536))];
        let mut loader = Loader::new(streams, config(Mode::Iid, 2, 2)).unwrap();
        assert_eq!(loader.stats().window_cpu_s, 0.0, "no window thread outside mode 3");
        for _ in 0..200 {
            loader.next().unwrap();
        }
        let s = loader.stats();
        assert!(s.cpu_s > 0.0, "200 steps of 1 MiB took no CPU time: {s:?}");
        assert_eq!(s.window_cpu_s, 0.0);
        // The threads' time is part of the process's (clock ticks round down,
        // by up to one per thread).
        let process = process_cpu_s();
        assert!(s.cpu_s <= process + 0.05, "loader threads {} s, the whole process {process} s", s.cpu_s);
        loader.close().unwrap();
        // The time of threads that have ended is kept.
        let after = loader.stats();
        assert!(after.cpu_s >= s.cpu_s, "{} after close, {} before", after.cpu_s, s.cpu_s);
    });
}

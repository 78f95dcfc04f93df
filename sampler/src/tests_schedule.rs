//! Mixture schedules (`crate::schedule`): rows so far track the integral of
//! the weights within a row, every step's counts are whole and add up, each
//! rank holds its share, and a run resumed under another schedule keeps
//! every step before the change.

use crate::{Mixture, Mode, SchedulePiece, SchedulePoint, Shard};

fn point(step: u64, weights: &[f64]) -> SchedulePoint {
    SchedulePoint { step, weights: weights.to_vec() }
}

fn piece(from: u64, points: &[SchedulePoint]) -> SchedulePiece {
    SchedulePiece::new(from, points[0].weights.len(), points).unwrap()
}

/// Runs `steps` steps of `m` (global and 8 shards), checking that every
/// source's rows so far are within a row of its target, that the shards
/// are the global batch cut in 8, and each rank's rows of a source of a
/// row or more per shard batch are the step's share rounded down or up.
/// Returns the largest distance from a target seen per source.
fn run(m: &Mixture, steps: u64) -> Vec<f64> {
    let (b, s) = (m.batch_len(), m.lengths().len());
    let (mut src, mut idx) = (vec![0u32; b], vec![0u64; b]);
    let (mut ssrc, mut sidx) = (vec![0u32; b / 8], vec![0u64; b / 8]);
    let mut total = vec![0u64; s];
    let mut worst = vec![0f64; s];
    let mut targets = vec![0f64; s];
    for t in 0..steps {
        m.fill_shard(t, Shard::ALL, &mut src, &mut idx).unwrap();
        let mut counts = vec![0u64; s];
        for &k in &src {
            counts[k as usize] += 1;
        }
        for k in 0..s {
            total[k] += counts[k];
        }
        m.targets((t + 1) * b as u64, &mut targets);
        for k in 0..s {
            let dev = (total[k] as f64 - targets[k]).abs();
            assert!(dev < 1.0, "step {t} source {k}: {} rows for a target of {}", total[k], targets[k]);
            worst[k] = worst[k].max(dev);
        }
        for j in 0..8u32 {
            m.fill_shard(t, Shard::new(j, 8).unwrap(), &mut ssrc, &mut sidx).unwrap();
            let lo = j as usize * b / 8;
            assert_eq!(&ssrc[..], &src[lo..lo + b / 8], "step {t} shard {j}");
            assert_eq!(&sidx[..], &idx[lo..lo + b / 8], "step {t} shard {j}");
            for (k, &count) in counts.iter().enumerate() {
                let share = count as f64 / 8.0;
                let got = ssrc.iter().filter(|&&x| x as usize == k).count() as f64;
                if count >= 8 {
                    assert!(got >= share.floor() && got <= share.ceil(), "step {t} shard {j} source {k}");
                }
            }
        }
    }
    worst
}

/// The must-show's schedule: 0.7/0.3 to 0.3/0.7 linearly over 1,000 steps
/// of 256 rows. Each step's share is the weights at its middle; after step
/// 1,000 the weights hold at 0.3/0.7.
#[test]
fn a_linear_schedule_tracks_its_integral_within_a_row() {
    let p = piece(0, &[point(0, &[0.7, 0.3]), point(1000, &[0.3, 0.7])]);
    let m = Mixture::scheduled(Mode::Cyclic, &[100_000, 100_000], vec![p], 256, 3).unwrap();
    let worst = run(&m, 1500);
    assert!(worst.iter().all(|&w| w < 1.0), "{worst:?}");
    let mut t = [0.0; 2];
    m.targets(1000 * 256, &mut t);
    assert!((t[0] - 128_000.0).abs() < 1e-6 && (t[1] - 128_000.0).abs() < 1e-6, "{t:?}");
    // Step 0 holds 0.6998 of 256 (179.1), step 999 0.3002 (76.9).
    let mut out = [0u64; 2];
    m.allocation(256, &mut out).unwrap();
    assert!(out[0] == 179 || out[0] == 180, "{out:?}");
}

/// A piecewise constant schedule is a staircase of jumps; the steps inside
/// each stair hold its weights' shares.
#[test]
fn a_stepped_schedule_gives_each_stair_its_weights() {
    let stairs = [
        point(0, &[0.5, 0.3, 0.2]),
        point(100, &[0.5, 0.3, 0.2]),
        point(100, &[0.2, 0.2, 0.6]),
        point(300, &[0.2, 0.2, 0.6]),
        point(300, &[0.1, 0.8, 0.1]),
    ];
    let m = Mixture::scheduled(Mode::Iid, &[1000, 1000, 1000], vec![piece(0, &stairs)], 64, 9).unwrap();
    run(&m, 400);
    let mut a = [0u64; 3];
    let mut z = [0u64; 3];
    m.allocation(150 * 64, &mut a).unwrap();
    m.allocation(250 * 64, &mut z).unwrap();
    let got: Vec<u64> = (0..3).map(|k| z[k] - a[k]).collect();
    assert_eq!(got, vec![1280, 1280, 3840]);
}

/// Small weights under a schedule: a source ramping from 0.0001 to 0.01
/// and one falling from 0.001 to 0.0002, at 256 rows, take the rounding
/// tree; every step's counts are whole, and each source stays within a row
/// of its target.
#[test]
fn a_schedule_with_sources_of_under_a_row_per_batch() {
    let p = piece(0, &[point(0, &[0.9989, 0.001, 0.0001]), point(5000, &[0.9898, 0.0002, 0.01])]);
    let m = Mixture::scheduled(Mode::Cyclic, &[1_000_000, 5_000, 700], vec![p], 256, 17).unwrap();
    let worst = run(&m, 8000);
    assert!(worst.iter().all(|&w| w < 1.0), "{worst:?}");
    // A source whose weight is 0 until step 100 gets no row before it.
    let p = piece(0, &[point(0, &[1.0, 0.0]), point(100, &[1.0, 0.0]), point(200, &[0.9, 0.1])]);
    let m = Mixture::scheduled(Mode::Cyclic, &[1000, 1000], vec![p], 8, 1).unwrap();
    run(&m, 400);
    let mut out = [0u64; 2];
    m.allocation(100 * 8, &mut out).unwrap();
    assert_eq!(out, [800, 0]);
}

/// A run resumed at step 500 under another schedule: the steps before 500
/// are the first schedule's, bit for bit, and each source's rows at step
/// 500 are where the first run left them; from 500 on the targets follow
/// the new weights from the saved targets.
#[test]
fn a_new_schedule_takes_over_at_the_step_it_was_given() {
    let first = piece(0, &[point(0, &[0.7, 0.3]), point(1000, &[0.3, 0.7])]);
    let second = piece(500, &[point(0, &[0.2, 0.8]), point(1000, &[0.9, 0.1])]);
    let lengths = [50_000, 70_000];
    let a = Mixture::scheduled(Mode::Cyclic, &lengths, vec![first.clone()], 256, 5).unwrap();
    let b = Mixture::scheduled(Mode::Cyclic, &lengths, vec![first, second], 256, 5).unwrap();
    let (mut sa, mut ia, mut sb, mut ib) = (vec![0u32; 256], vec![0u64; 256], vec![0u32; 256], vec![0u64; 256]);
    for t in 0..500 {
        a.fill_shard(t, Shard::ALL, &mut sa, &mut ia).unwrap();
        b.fill_shard(t, Shard::ALL, &mut sb, &mut ib).unwrap();
        assert_eq!((&sa, &ia), (&sb, &ib), "step {t}");
    }
    let (mut oa, mut ob) = ([0u64; 2], [0u64; 2]);
    a.allocation(500 * 256, &mut oa).unwrap();
    b.allocation(500 * 256, &mut ob).unwrap();
    assert_eq!(oa, ob);
    run(&b, 1200);
    // Step 700 of the second: the weights at 700.5 of the new schedule.
    let (mut x, mut y) = ([0u64; 2], [0u64; 2]);
    b.allocation(700 * 256, &mut x).unwrap();
    b.allocation(701 * 256, &mut y).unwrap();
    let w0 = 0.2 + 0.7 * 700.5 / 1000.0;
    assert!(((y[0] - x[0]) as f64 - w0 * 256.0).abs() <= 2.0, "{x:?} {y:?}");
}

/// One piece of one point is the fixed-weight mixture.
#[test]
fn a_schedule_of_one_point_is_the_fixed_mixture() {
    let lengths = [3000, 500, 800];
    let w = [0.6, 0.3, 0.1];
    let a = Mixture::new(Mode::Cyclic, &lengths, &w, 32, 4).unwrap();
    let b = Mixture::scheduled(Mode::Cyclic, &lengths, vec![piece(0, &[point(0, &w)])], 32, 4).unwrap();
    let (mut sa, mut ia, mut sb, mut ib) = (vec![0u32; 32], vec![0u64; 32], vec![0u32; 32], vec![0u64; 32]);
    for t in 0..300 {
        a.fill_shard(t, Shard::ALL, &mut sa, &mut ia).unwrap();
        b.fill_shard(t, Shard::ALL, &mut sb, &mut ib).unwrap();
        assert_eq!((&sa, &ia), (&sb, &ib), "step {t}");
    }
    assert!(b.schedule().is_none());
}

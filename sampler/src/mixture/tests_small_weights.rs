use super::apportion::exact_split;
use super::*;

/// The must-show: 0.9989/0.001/0.0001 at 256 rows (0.256 and 0.0256
/// rows per batch for the small ones). Over 20,000 steps each source's
/// rows so far stay within a row of its share, every step; so do each
/// of 8 ranks' rows of the large source and of the two small ones
/// together; and a mixture built afresh at step 12,345 (a resumed run)
/// continues with the same rows.
#[test]
fn sources_of_under_a_row_per_batch_get_their_share_over_the_steps() {
    let weights = [0.9989, 0.001, 0.0001];
    let lengths = [1_000_000u64, 5_000, 700];
    let m = Mixture::new(Mode::Cyclic, &lengths, &weights, 256, 17).unwrap();
    let (mut src, mut idx) = (vec![0u32; 256], vec![0u64; 256]);
    let mut total = [0u64; 3];
    let mut ranks = [[0u64; 3]; 8];
    let mut worst = [0f64; 3];
    let mut worst_rank = [0f64; 3];
    let mut small_rank = 0f64;
    let mut kept = Vec::new();
    for t in 0..20_000u64 {
        m.fill_shard(t, Shard::ALL, &mut src, &mut idx).unwrap();
        for (r, &k) in src.iter().enumerate() {
            total[k as usize] += 1;
            ranks[r / 32][k as usize] += 1;
        }
        let rows = ((t + 1) * 256) as f64;
        for k in 0..3 {
            let dev = (total[k] as f64 - m.weights()[k] * rows).abs();
            assert!(dev < 1.0, "step {t} source {k}: {} rows for {}", total[k], m.weights()[k] * rows);
            worst[k] = worst[k].max(dev);
            for rank in &ranks {
                worst_rank[k] = worst_rank[k].max((rank[k] as f64 - m.weights()[k] * rows / 8.0).abs());
            }
        }
        for rank in &ranks {
            let share = (m.weights()[1] + m.weights()[2]) * rows / 8.0;
            small_rank = small_rank.max((rank[1] as f64 + rank[2] as f64 - share).abs());
        }
        if (12_345..12_400).contains(&t) {
            kept.push((src.clone(), idx.clone()));
        }
    }
    eprintln!("max deviation over 20,000 steps, rows per source: {worst:.4?}");
    eprintln!("per rank of 8: {worst_rank:.4?}; the two small sources together {small_rank:.4}");
    assert!(worst_rank[0] < 1.0 && small_rank < 1.0, "{worst_rank:?} {small_rank}");
    // Both small sources drew rows, and the tiniest not in every step.
    assert!(total[1] > 5000 && total[2] > 500, "{total:?}");
    // Resumed: a mixture made from the saved state's numbers, reading
    // from step 12,345 on, whole and by shards.
    let state: MixtureState = serde_json::from_str(&serde_json::to_string(&m.state()).unwrap()).unwrap();
    assert!(state.matches(&m.state()));
    let resumed = Mixture::new(Mode::Cyclic, &state.lengths, &weights, 256, 17).unwrap().with_order(state.order);
    for (i, (s, x)) in kept.iter().enumerate() {
        let t = 12_345 + i as u64;
        resumed.fill_shard(t, Shard::ALL, &mut src, &mut idx).unwrap();
        assert_eq!((&src, &idx), (s, x), "step {t}");
        for n in [2u32, 8, 256] {
            let per = 256 / n as usize;
            for j in 0..n {
                let (mut ss, mut si) = (vec![0; per], vec![0; per]);
                resumed.fill_shard(t, Shard::new(j, n).unwrap(), &mut ss, &mut si).unwrap();
                let at = j as usize * per;
                assert_eq!((&ss[..], &si[..]), (&s[at..at + per], &x[at..at + per]), "step {t} shard {j}/{n}");
            }
        }
    }
}

/// Weights spread over four decades, up to seven sources, any batch:
/// every allocation sums to the rows, never goes back from one batch to
/// the next, and holds each source within the tree's bound of its share
/// (under one row whenever at most three sources get under a row per
/// batch); a step's rows come in the counts the allocation says, with
/// each source's stream positions in order.
#[test]
fn any_weights_keep_every_source_within_its_bound() {
    use proptest::prelude::*;
    let cases = proptest::collection::vec(-4.0f64..0.0, 1..8);
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig::with_cases(300));
    runner
        .run(&(cases, 1u64..400, 0u64..1_000_000_000), |(exps, batch, step)| {
            let weights: Vec<f64> = exps.iter().map(|e| 10f64.powf(*e)).collect();
            let s = weights.len();
            let m = Mixture::new(Mode::Iid, &vec![1000; s], &weights, batch, 1).unwrap();
            // Largest remainders: strictly under a row.
            let (bound, tiny) = match &m.apportion {
                Apportion::Hamilton => (1.0 - 1e-9, 0),
                Apportion::Tree(t) => (t.bound, t.tiny.len()),
            };
            let big = |k: usize| match &m.apportion {
                Apportion::Hamilton => true,
                Apportion::Tree(t) => t.big.contains(&k),
            };
            if tiny <= 3 {
                prop_assert!(bound < 1.0, "{:?} at {}: bound {}", weights, batch, bound);
            }
            let (mut a, mut z) = (vec![0; s], vec![0; s]);
            m.allocation(step * batch, &mut a).unwrap();
            m.allocation((step + 1) * batch, &mut z).unwrap();
            prop_assert_eq!(a.iter().sum::<u64>(), step * batch);
            prop_assert_eq!(z.iter().sum::<u64>(), (step + 1) * batch);
            let rows = ((step + 1) * batch) as f64;
            for k in 0..s {
                prop_assert!(z[k] >= a[k], "{:?} at {} step {}: source {} goes back", weights, batch, step, k);
                let dev = (z[k] as f64 - m.weights()[k] * rows).abs();
                // A member of the group is within a row of its share
                // when the group is; a row further at most when not.
                let limit = match (big(k), bound < 1.0) {
                    (true, true) => 1.0 - 1e-9,
                    (true, false) => bound + 1.0,
                    (false, _) => bound + 1e-9,
                };
                prop_assert!(dev <= limit, "source {}: off by {} (bound {})", k, dev, bound);
                prop_assert_eq!(m.allocation_of(k, (step + 1) * batch), z[k]);
            }
            let b = batch as usize;
            let (mut src, mut idx) = (vec![0; b], vec![0; b]);
            m.fill_shard(step, Shard::ALL, &mut src, &mut idx).unwrap();
            for k in 0..s {
                let n = src.iter().filter(|&&x| x as usize == k).count() as u64;
                prop_assert_eq!(n, z[k] - a[k]);
                let mut want = vec![0; n as usize];
                m.streams[k].fill(a[k], &mut want);
                let got: Vec<u64> = src.iter().zip(&idx).filter(|(&x, _)| x as usize == k).map(|(_, &i)| i).collect();
                prop_assert_eq!(got, want);
                // The step that holds each of its stream positions.
                for q in a[k]..z[k] {
                    prop_assert_eq!(m.step_of(k, q), Some(step));
                }
            }
            Ok(())
        })
        .unwrap();
}

/// A thousand sources of under a row per batch each: built quickly,
/// never going back, every allocation adding up.
#[test]
fn a_thousand_small_sources_are_counted() {
    let weights: Vec<f64> = (0..1000).map(|k| 1.0 + (k % 7) as f64).collect();
    let m = Mixture::new(Mode::Iid, &vec![10; 1000], &weights, 256, 0).unwrap();
    let (mut a, mut z) = (vec![0; 1000], vec![0; 1000]);
    let mut worst = 0f64;
    for t in 0..400u64 {
        m.allocation(t * 256, &mut a).unwrap();
        m.allocation((t + 1) * 256, &mut z).unwrap();
        assert_eq!(z.iter().sum::<u64>(), (t + 1) * 256);
        for k in 0..1000 {
            assert!(z[k] >= a[k]);
            worst = worst.max((z[k] as f64 - m.weights()[k] * ((t + 1) * 256) as f64).abs());
        }
    }
    let Apportion::Tree(tree) = &m.apportion else { panic!("small sources make a tree") };
    assert!(worst <= tree.bound + 1e-9, "{worst} {}", tree.bound);
}

/// More than three small sources: the tree is chosen among all trees
/// (up to 8 leaves) and holds these mixtures under a row, which each
/// source's rows over 20,000 steps respect.
#[test]
fn trees_of_many_small_sources_are_the_best_and_hold_their_bound() {
    let cases: [(&[f64], u64, f64); 3] = [
        (&[0.5, 0.2, 0.1, 0.1, 0.05, 0.03, 0.01, 0.005, 0.003, 0.001, 0.001], 64, 0.992),
        (&[0.5, 0.2, 0.1, 0.1, 0.05, 0.03, 0.01, 0.005, 0.003, 0.001, 0.001], 16, 0.967),
        (&[0.6, 0.3, 0.003, 0.002, 0.001, 0.0005, 0.0003, 0.0002], 256, 0.999),
    ];
    for (weights, b, most) in cases {
        let m = Mixture::new(Mode::Iid, &vec![1000; weights.len()], weights, b, 0).unwrap();
        let Apportion::Tree(tree) = &m.apportion else { panic!("small sources make a tree") };
        assert!(tree.bound < most, "{weights:?} at {b}: {}", tree.bound);
        let (mut out, mut before) = (vec![0; weights.len()], vec![0; weights.len()]);
        for t in 1..=20_000u64 {
            m.allocation(t * b, &mut out).unwrap();
            for k in 0..weights.len() {
                assert!(out[k] >= before[k]);
                let dev = (out[k] as f64 - m.weights()[k] * (t * b) as f64).abs();
                assert!(dev < 1.0, "{weights:?} at {b}, step {t}, source {k}: {dev}");
            }
            before.copy_from_slice(&out);
        }
    }
    // The exact search agrees with brute force over the three trees of
    // three leaves: the lightest pair under the root's second child.
    let w = [0.6, 0.3, 0.1];
    let three = |pair: f64, alone: f64| 0.5_f64.max(0.5 + 0.5 * pair.max(alone) / (pair + alone));
    let want = three(0.3, 0.1).min(three(0.6, 0.1)).min(three(0.6, 0.3));
    assert!((0.5 + 0.5 * exact_split(&w, 0b111, 0.0, 0).0 - want).abs() < 1e-12);
}

/// Next uses of sources of under a row per batch, against brute force.
#[test]
fn next_uses_of_small_sources_are_the_shards_next_draws() {
    for mode in [Mode::Sequential, Mode::Cyclic] {
        let m = Mixture::new(mode, &[53, 7, 5], &[0.9, 0.07, 0.03], 12, 5).unwrap();
        assert!(matches!(m.apportion, Apportion::Tree(_)));
        for shard in [Shard::ALL, Shard::new(1, 3).unwrap(), Shard::new(3, 4).unwrap()] {
            let per = m.shard_len(shard).unwrap();
            let draws = |t: u64| {
                let (mut s, mut i) = (vec![0; per], vec![0; per]);
                m.fill_shard(t, shard, &mut s, &mut i).unwrap();
                s.into_iter().zip(i).collect::<Vec<_>>()
            };
            let mut found = [0; 3];
            for t in 0..60 {
                let (mut s, mut i, mut n) = (vec![0; per], vec![0; per], vec![None; per]);
                m.fill_shard_with_next_use(t, shard, &mut s, &mut i, &mut n).unwrap();
                for r in 0..per {
                    let want = (t + 1..t + 2000).find(|&u| draws(u).contains(&(s[r], i[r])));
                    assert_eq!(n[r], want, "{mode:?} {shard:?} step {t} row {r}");
                    found[s[r] as usize] += usize::from(want.is_some());
                }
            }
            assert!(found.iter().all(|&f| f > 0), "{found:?}");
        }
    }
}

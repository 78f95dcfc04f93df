//! Keyed permutations of `[0, n)` without a table: a balanced Feistel network
//! with cycle-walking.
//!
//! A Feistel network splits a `2h`-bit word into halves `(L, R)` and applies
//! rounds `(L, R) -> (R, L ^ F(k_i, R))`. Each round is invertible whatever
//! `F` is, so the network is a bijection on `[0, 4^h)` for any round function
//! and any keys; the keys only choose *which* bijection.
//!
//! How random the bijection looks depends on the round count and the half
//! width. Four rounds is the classic minimum (Luby–Rackoff) when `F` looks
//! like a random function, but the distance from a random permutation shrinks
//! only with `2^h`: on tiny halves four rounds leave visible order (rank
//! correlations between position and image far beyond chance,
//! bench-results/engine-notes.md). So halves under [`FEW_ROUNDS_MIN_HALF_BITS`] bits, index
//! spaces below `2^14`, get eight rounds; larger ones four, which keeps the
//! common case at a few nanoseconds per index.
//!
//! To get a bijection on `[0, n)` for any `n`, the network runs on the
//! smallest domain `4^h >= n` and *cycle-walks*: an output `>= n` is fed back
//! in until it lands below `n`. Walking follows the network's cycle through
//! the starting point, which lies in `[0, n)`, so it always stops, and the
//! restriction is again a bijection. The domain is under `4n`, so on average
//! fewer than four passes are needed (about one for `n` just under a power
//! of four).
//!
//! The inverse ([`Permutation::invert`]) runs the rounds backward and walks
//! with the inverse network; the argument that this undoes the walk is at
//! [`Permutation::walk_back`]. The sampler needs it to answer "when is record
//! `i` read next" without scanning.

use crate::random::{mix64, GOLDEN};

/// Rounds for halves of at least [`FEW_ROUNDS_MIN_HALF_BITS`] bits.
const FEW_ROUNDS: usize = 4;
/// Rounds for smaller halves.
const MANY_ROUNDS: usize = 8;
/// The half width from which four rounds suffice.
const FEW_ROUNDS_MIN_HALF_BITS: u32 = 7;

/// Domains up to `2^32` (halves up to 16 bits) run the network in 32-bit
/// arithmetic, which the compiler vectorises; larger ones in 64-bit.
const NARROW_HALF_BITS: u32 = 16;

/// How many positions [`Permutation::fill`] runs through the network at once
/// before the (rare, branchy) cycle-walking fix-up.
const LANES: usize = 64;

/// The shape of the domain for one `n`: how many bits each half has.
/// Computed once per sampler; each cycle adds its own keys with
/// [`Domain::permutation`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Domain {
    n: u64,
    half_bits: u32,
    /// Whether to use the 32-bit network. Always `half_bits <= 16` outside
    /// tests, which force the 64-bit one on small domains to check it.
    narrow: bool,
}

impl Domain {
    /// The domain for permutations of `[0, n)`, `n >= 1`.
    pub(crate) fn new(n: u64) -> Domain {
        debug_assert!(n >= 1);
        let bits = u64::BITS - (n - 1).leading_zeros();
        // At least one bit per half, so the shifts below stay in range.
        let half_bits = bits.div_ceil(2).max(1);
        Domain { n, half_bits, narrow: half_bits <= NARROW_HALF_BITS }
    }

    /// The domain for `n` with the 64-bit network even when `n` is small, so
    /// tests can check that network exhaustively.
    #[cfg(test)]
    pub(crate) fn wide(n: u64) -> Domain {
        Domain { narrow: false, ..Domain::new(n) }
    }

    /// The permutation chosen by `key`: each round's xor mask and odd
    /// multiplier are SplitMix64 outputs of `key`.
    pub(crate) fn permutation(&self, key: u64) -> Permutation {
        let mut keys = [(0u64, 0u64); MANY_ROUNDS];
        for (i, k) in keys.iter_mut().enumerate() {
            let base = key.wrapping_add(GOLDEN.wrapping_mul(2 * i as u64 + 1));
            *k = (mix64(base), mix64(base.wrapping_add(GOLDEN)) | 1);
        }
        // Truncation intended: the 32-bit network uses the low halves.
        let narrow_keys = keys.map(|(mask, mul)| (mask as u32, mul as u32));
        Permutation { last: self.n - 1, half_bits: self.half_bits, narrow: self.narrow, keys, narrow_keys }
    }
}

/// One keyed bijection on `[0, n)`, with its round keys precomputed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Permutation {
    /// `n - 1`, the largest index (so `n = 2^64` never needs representing).
    last: u64,
    half_bits: u32,
    narrow: bool,
    /// Per round: xor mask and odd multiplier, for the 64-bit network. Only
    /// the first [`FEW_ROUNDS`] are used on large domains.
    keys: [(u64, u64); MANY_ROUNDS],
    /// The same keys truncated to 32 bits, for the 32-bit network.
    narrow_keys: [(u32, u32); MANY_ROUNDS],
}

impl Permutation {
    /// One pass of `R` rounds over the whole `4^h` domain, 64-bit words.
    ///
    /// The round function hashes the right half: xor the round's mask,
    /// multiply by a fixed odd constant, fold the high half down, multiply by
    /// the round's odd multiplier, keep the top `h` bits (which every input
    /// bit reaches through the carries). A single multiply-shift is cheaper
    /// but maps small inputs almost linearly (a rotation on the circle), which
    /// showed up as order in the permutation.
    #[inline(always)]
    fn network<const R: usize>(&self, x: u64) -> u64 {
        let h = self.half_bits;
        let mut left = x >> h;
        let mut right = x & ((1u64 << h) - 1);
        for &(mask, mul) in &self.keys[..R] {
            let z = (right ^ mask).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            let z = (z ^ (z >> 32)).wrapping_mul(mul);
            let next = left ^ (z >> (64 - h));
            left = right;
            right = next;
        }
        (left << h) | right
    }

    /// [`Permutation::network`] for `half_bits <= 16`, in 32-bit words.
    #[inline(always)]
    fn network_narrow<const R: usize>(&self, x: u32) -> u32 {
        let h = self.half_bits;
        let mut left = x >> h;
        let mut right = x & ((1u32 << h) - 1);
        for &(mask, mul) in &self.narrow_keys[..R] {
            let z = (right ^ mask).wrapping_mul(0x9E37_79B9);
            let z = (z ^ (z >> 16)).wrapping_mul(mul);
            let next = left ^ (z >> (32 - h));
            left = right;
            right = next;
        }
        (left << h) | right
    }

    /// [`Permutation::network`] backward: undoes the rounds last to first.
    ///
    /// Round `k` maps `(L, R)` to `(R, L ^ F_k(R))`. Given its output
    /// `(L', R')`, the input is `R = L'` and `L = R' ^ F_k(L')`: the round
    /// function is evaluated on a value the output still holds, so the round
    /// is undone whatever `F_k` is.
    #[inline(always)]
    fn network_back<const R: usize>(&self, y: u64) -> u64 {
        let h = self.half_bits;
        let mut left = y >> h;
        let mut right = y & ((1u64 << h) - 1);
        for &(mask, mul) in self.keys[..R].iter().rev() {
            let z = (left ^ mask).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            let z = (z ^ (z >> 32)).wrapping_mul(mul);
            let prev = right ^ (z >> (64 - h));
            right = left;
            left = prev;
        }
        (left << h) | right
    }

    /// [`Permutation::network_back`] for `half_bits <= 16`, in 32-bit words.
    #[inline(always)]
    fn network_narrow_back<const R: usize>(&self, y: u32) -> u32 {
        let h = self.half_bits;
        let mut left = y >> h;
        let mut right = y & ((1u32 << h) - 1);
        for &(mask, mul) in self.narrow_keys[..R].iter().rev() {
            let z = (left ^ mask).wrapping_mul(0x9E37_79B9);
            let z = (z ^ (z >> 16)).wrapping_mul(mul);
            let prev = right ^ (z >> (32 - h));
            right = left;
            left = prev;
        }
        (left << h) | right
    }

    /// Cycle-walks from position `x` (`x < n`) to its image.
    #[inline(always)]
    fn walk<const R: usize>(&self, x: u64) -> u64 {
        let mut y = x;
        if self.narrow {
            // Lossless: every value is below 4^h <= 2^32 on the narrow path.
            let mut y = y as u32;
            loop {
                y = self.network_narrow::<R>(y);
                if u64::from(y) <= self.last {
                    return u64::from(y);
                }
            }
        }
        loop {
            y = self.network::<R>(y);
            if y <= self.last {
                return y;
            }
        }
    }

    /// Walks back from an image `y` (`y < n`) to its position.
    ///
    /// Why this inverts [`Permutation::walk`]: write `N` for the network, a
    /// bijection on `[0, 4^h)`. The walk from `x < n` visits `x, N(x),
    /// N^2(x), ...` and stops at the first `y = N^k(x)` with `k >= 1` and
    /// `y < n`, so every value strictly between, `N^j(x)` for `0 < j < k`, is
    /// `>= n`. Walking back from `y` with `N^-1` visits `N^(k-1)(x), ...,
    /// N(x), x`: all of them `>= n` except the last, so the first value below
    /// `n` it meets (and where it stops) is exactly `x`. It meets one because
    /// `x` is on the way, so it stops after `k` passes, the same number the
    /// walk took. Both paths run inside one cycle of `N`; cycle-walking is a
    /// bijection on `[0, n)` precisely because each cycle of `N` through
    /// `[0, n)` is cut into such segments.
    #[inline(always)]
    fn walk_back<const R: usize>(&self, y: u64) -> u64 {
        if self.narrow {
            // Lossless: every value is below 4^h <= 2^32 on the narrow path.
            let mut x = y as u32;
            loop {
                x = self.network_narrow_back::<R>(x);
                if u64::from(x) <= self.last {
                    return u64::from(x);
                }
            }
        }
        let mut x = y;
        loop {
            x = self.network_back::<R>(x);
            if x <= self.last {
                return x;
            }
        }
    }

    /// The position whose image is `y`, for `y < n`: `invert(apply(x)) == x`.
    /// Costs what one image costs (the same rounds and the same number of
    /// walking passes).
    pub(crate) fn invert(&self, y: u64) -> u64 {
        debug_assert!(y <= self.last);
        if self.half_bits >= FEW_ROUNDS_MIN_HALF_BITS {
            self.walk_back::<FEW_ROUNDS>(y)
        } else {
            self.walk_back::<MANY_ROUNDS>(y)
        }
    }

    /// The image of `x`, for `x < n`; the result is `< n`. Batches use
    /// [`Permutation::fill`]; single images (a block's place) use this.
    pub(crate) fn apply(&self, x: u64) -> u64 {
        debug_assert!(x <= self.last);
        if self.half_bits >= FEW_ROUNDS_MIN_HALF_BITS {
            self.walk::<FEW_ROUNDS>(x)
        } else {
            self.walk::<MANY_ROUNDS>(x)
        }
    }

    /// Writes the images of positions `first, first + 1, ...` into `out`;
    /// the positions must all be below `n`. Equal to [`Permutation::apply`]
    /// on each position.
    pub(crate) fn fill(&self, first: u64, out: &mut [u64]) {
        debug_assert!(out.is_empty() || first + (out.len() as u64 - 1) <= self.last);
        match (self.narrow, self.half_bits >= FEW_ROUNDS_MIN_HALF_BITS) {
            (true, true) => self.fill_narrow::<FEW_ROUNDS>(first, out),
            (true, false) => self.fill_narrow::<MANY_ROUNDS>(first, out),
            (false, true) => self.fill_wide::<FEW_ROUNDS>(first, out),
            (false, false) => self.fill_wide::<MANY_ROUNDS>(first, out),
        }
    }

    fn fill_wide<const R: usize>(&self, first: u64, out: &mut [u64]) {
        for (o, pos) in out.iter_mut().zip(first..) {
            *o = self.walk::<R>(pos);
        }
    }

    fn fill_narrow<const R: usize>(&self, first: u64, out: &mut [u64]) {
        // Lossless: positions are below n <= 2^32 on the narrow path.
        let mut base = first as u32;
        for chunk in out.chunks_mut(LANES) {
            // First pass branch-free over a fixed-size block so it vectorises;
            // lanes past the chunk's end compute values that are dropped.
            let mut block = [0u32; LANES];
            for (lane, y) in block.iter_mut().enumerate() {
                *y = self.network_narrow::<R>(base.wrapping_add(lane as u32));
            }
            // Then walk the few that fell outside [0, n).
            for (o, &y) in chunk.iter_mut().zip(&block) {
                let mut y = y;
                while u64::from(y) > self.last {
                    y = self.network_narrow::<R>(y);
                }
                *o = u64::from(y);
            }
            base = base.wrapping_add(LANES as u32);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_bijection(n: u64, key: u64) {
        assert_bijection_on(Domain::new(n), n, key);
        assert_bijection_on(Domain::wide(n), n, key);
    }

    fn assert_bijection_on(domain: Domain, n: u64, key: u64) {
        let perm = domain.permutation(key);
        let mut out = vec![0; n as usize];
        perm.fill(0, &mut out);
        let mut seen = vec![false; n as usize];
        for x in 0..n {
            let y = out[x as usize];
            assert!(y < n, "n={n} key={key}: {x} -> {y} out of range");
            assert!(!seen[y as usize], "n={n} key={key}: {y} hit twice");
            seen[y as usize] = true;
        }
    }

    #[test]
    fn bijection_on_every_small_n() {
        for n in 1..=300u64 {
            for key in [0, 1, 0xDEAD_BEEF, u64::MAX] {
                assert_bijection(n, key);
            }
        }
    }

    /// `invert` undoes `fill` at every position of `[0, n)`, on both networks.
    fn assert_inverse(n: u64, key: u64) {
        for domain in [Domain::new(n), Domain::wide(n)] {
            let perm = domain.permutation(key);
            let mut out = vec![0; n as usize];
            perm.fill(0, &mut out);
            for (x, &y) in (0..n).zip(&out) {
                assert_eq!(perm.invert(y), x, "n={n} key={key} narrow={}: {x} -> {y}", domain.narrow);
            }
        }
    }

    #[test]
    fn invert_undoes_apply_on_every_small_n() {
        // Exhaustive, like the bijection test: every position of every
        // domain up to 300, so both round counts, every half width up to 5
        // bits and every amount of cycle-walking are covered.
        for n in 1..=300u64 {
            for key in [0, 1, 0xDEAD_BEEF, u64::MAX] {
                assert_inverse(n, key);
            }
        }
        for n in [1000u64, 4096, 4097, 16_383, 16_385, 65_537] {
            assert_inverse(n, 42);
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(300))]

        /// On domains too large to check exhaustively (odd sizes, the 32-bit
        /// and 64-bit networks, up to `u64::MAX`), sampled positions and
        /// images round-trip both ways.
        #[test]
        fn invert_round_trips_on_any_domain(
            n in proptest::prop_oneof![3u64..100_000, (1u64 << 32) - 5..(1u64 << 32) + 5, 1u64..=u64::MAX],
            key in proptest::prelude::any::<u64>(),
            at in proptest::prelude::any::<u64>(),
        ) {
            let x = at % n;
            for perm in [Domain::new(n).permutation(key), Domain::wide(n).permutation(key)] {
                let y = perm.apply(x);
                proptest::prop_assert!(y < n);
                proptest::prop_assert_eq!(perm.invert(y), x);
                // Reading `x` as an image: its position maps back onto it.
                proptest::prop_assert_eq!(perm.apply(perm.invert(x)), x);
            }
        }
    }

    #[test]
    fn bijection_on_named_sizes() {
        for n in [1u64, 2, 3, 5, 7, 16, 17, 64, 1000, 65_537, 1_000_000] {
            for key in [7u64, 42, 1 << 40] {
                assert_bijection(n, key);
            }
        }
    }

    #[test]
    fn domain_is_the_smallest_even_bit_power_of_two() {
        let cases = [(1u64, 1u32), (4, 1), (5, 2), (16, 2), (17, 3), (1 << 20, 10)];
        for (n, half) in cases {
            assert_eq!(Domain::new(n).half_bits, half, "n={n}");
        }
        assert_eq!(Domain::new(u64::MAX).half_bits, 32);
        // The full 64-bit domain still maps into range.
        let perm = Domain::new(u64::MAX).permutation(3);
        assert!(perm.apply(u64::MAX - 1) < u64::MAX);
    }

    #[test]
    fn keys_choose_different_permutations() {
        let domain = Domain::new(1000);
        let a: Vec<u64> = (0..1000).map(|x| domain.permutation(1).apply(x)).collect();
        let b: Vec<u64> = (0..1000).map(|x| domain.permutation(2).apply(x)).collect();
        assert_ne!(a, b);
        let identity: Vec<u64> = (0..1000).collect();
        assert_ne!(a, identity);
        // Two keys should agree on about 1 of 1000 positions, not many.
        let agree = a.iter().zip(&b).filter(|(x, y)| x == y).count();
        assert!(agree < 20, "{agree} positions agree");
    }

    #[test]
    fn fill_equals_apply_on_both_paths() {
        for n in [1u64, 5, 1000, 65_537, (1 << 32), (1 << 32) + 1, u64::MAX] {
            for perm in [Domain::new(n).permutation(99), Domain::wide(n).permutation(99)] {
                let len = 200u64.min(n);
                for first in [0, n - len, (n - len) / 2] {
                    let mut out = vec![0; len as usize];
                    perm.fill(first, &mut out);
                    let expected: Vec<u64> = (first..first + len).map(|x| perm.apply(x)).collect();
                    assert_eq!(out, expected, "n={n} first={first}");
                    assert!(out.iter().all(|&y| y < n));
                }
            }
        }
    }

    /// Statistics of the permutations over many keys, against what a uniformly
    /// random permutation gives; a weak network (too few rounds, a round
    /// function that ignores bits) shows up as correlation or a skewed image.
    #[test]
    fn permutations_look_random() {
        let cases = [
            (Domain::new(1000), 300u64),
            (Domain::wide(1000), 300),
            (Domain::new(4096), 300),
            (Domain::wide(20_000), 100),
            (Domain::new(65_537), 50),
        ];
        for (domain, keys) in cases {
            let n = domain.n;
            let mut image_of_zero = [0u64; 10];
            let mut rho_sum = 0.0;
            let mut rho_max = 0.0f64;
            let mut step_sum = 0.0;
            let mean = (n as f64 - 1.0) / 2.0;
            for key in 0..keys {
                let mut out = vec![0; n as usize];
                domain.permutation(key).fill(0, &mut out);
                image_of_zero[(out[0] * 10 / n) as usize] += 1;
                // Spearman's rho: the positions and images are both ranks.
                let cov: f64 = out.iter().enumerate().map(|(x, &y)| (x as f64 - mean) * (y as f64 - mean)).sum();
                let var = (n as f64) * (n as f64 * n as f64 - 1.0) / 12.0;
                let rho = cov / var;
                rho_sum += rho;
                rho_max = rho_max.max(rho.abs());
                let steps: f64 = out.windows(2).map(|w| w[0].abs_diff(w[1]) as f64).sum();
                step_sum += steps / (n - 1) as f64 / n as f64;
            }
            let expected = keys as f64 / 10.0;
            let chi: f64 = image_of_zero.iter().map(|&c| (c as f64 - expected).powi(2) / expected).sum();
            let rho_mean = rho_sum / keys as f64;
            let step_mean = step_sum / keys as f64;
            eprintln!(
                "STAT n={n} chi={chi:.1} rho_mean={rho_mean:.4}/{:.4} rho_max={rho_max:.3}/{:.3} step={step_mean:.4}",
                1.0 / ((n - 1) as f64).sqrt() / (keys as f64).sqrt(),
                1.0 / ((n - 1) as f64).sqrt()
            );
            // 9 degrees of freedom: 0.1% critical value 27.9.
            assert!(chi < 27.9, "n={n}: image of 0 skewed, chi-square {chi}");
            // rho of a random permutation has sd 1/sqrt(n - 1).
            let sd = 1.0 / (n as f64 - 1.0).sqrt();
            assert!(rho_mean.abs() < 4.0 * sd / (keys as f64).sqrt(), "n={n}: mean rho {rho_mean}");
            assert!(rho_max < 6.0 * sd, "n={n}: max rho {rho_max}");
            // Neighbouring positions land n/3 apart on average.
            assert!((step_mean - 1.0 / 3.0).abs() < 0.01, "n={n}: mean step {step_mean}");
        }
    }
}

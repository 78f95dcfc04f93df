//! Counter-based random numbers: a 64-bit mixer and unbiased range reduction.
//!
//! Nothing here has state that advances. A random word is `mix64` of a
//! counter, so the word for any (seed, step, slot) is computed directly and
//! seeking costs nothing.

/// The golden-ratio increment of SplitMix64: consecutive counters are spaced
/// by this odd constant before mixing.
pub(crate) const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

/// A second odd increment, used for counters inside one step so that the
/// per-step and per-slot sequences do not share their structure.
pub(crate) const SLOT_GAMMA: u64 = 0xD1B5_4A32_D192_ED03;

/// The SplitMix64 output function: a bijection on `u64` whose output bits each
/// depend on every input bit. Applied to `key + n * GOLDEN` it is SplitMix64's
/// n-th output for that key.
#[inline(always)]
pub(crate) fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Lemire's multiply-shift reduction of uniform `bits`-bit words into `[0, n)`,
/// with the rejection step that makes it exactly unbiased.
///
/// A word `x` maps to `(x * n) >> bits`. Of the `2^bits` words, each output is
/// hit either `floor(2^bits / n)` or one more time; the extra hits are exactly
/// the words whose low product half `(x * n) mod 2^bits` is below
/// `threshold = 2^bits mod n`. Rejecting those leaves every output with the
/// same number of words. The sampler uses `bits = 64`; tests use small widths
/// to check the unbiasedness exhaustively with the same code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Lemire {
    n: u64,
    threshold: u64,
    bits: u32,
}

impl Lemire {
    /// The reduction into `[0, n)` for `bits`-bit words; `1 <= n <= 2^bits`,
    /// `1 <= bits <= 64`.
    pub(crate) fn new(n: u64, bits: u32) -> Lemire {
        debug_assert!(n >= 1 && (1..=64).contains(&bits));
        debug_assert!(bits == 64 || n <= 1 << bits);
        let range = 1u128 << bits;
        // The division runs once per sampler, never per index.
        let threshold = ((range - u128::from(n)) % u128::from(n)) as u64;
        Lemire { n, threshold, bits }
    }

    /// The output for word `x`, or `None` when `x` must be rejected and a new
    /// word drawn. Rejection happens with probability `threshold / 2^bits`,
    /// below `n / 2^bits`.
    #[inline(always)]
    pub(crate) fn reduce(&self, x: u64) -> Option<u64> {
        let product = u128::from(x) * u128::from(self.n);
        let low = (product & ((1u128 << self.bits) - 1)) as u64;
        if low < self.threshold {
            None
        } else {
            Some((product >> self.bits) as u64)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Counts how often each output of `[0, n)` is produced by the accepted
    /// words among all `2^bits` words.
    fn histogram(reduce: impl Fn(u64) -> Option<u64>, n: u64, bits: u32) -> Vec<u64> {
        let mut counts = vec![0u64; n as usize];
        for x in 0..(1u64 << bits) {
            if let Some(v) = reduce(x) {
                counts[v as usize] += 1;
            }
        }
        counts
    }

    #[test]
    fn lemire_is_exactly_unbiased_on_every_tiny_range() {
        // Exhaustive over all 8-bit words: for every n in 1..=256 each output
        // must be produced by the same number of accepted words.
        for n in 1..=256u64 {
            let lemire = Lemire::new(n, 8);
            let counts = histogram(|x| lemire.reduce(x), n, 8);
            let first = counts[0];
            assert!(first > 0, "n={n}: output 0 never produced");
            assert!(counts.iter().all(|&c| c == first), "n={n}: {counts:?}");
        }
    }

    #[test]
    fn lemire_without_rejection_would_be_biased() {
        // The same reduction with the rejection switched off is biased on a
        // range that does not divide 2^8; this is what the rejection fixes and
        // shows the exhaustive check above can fail.
        let n = 3u64;
        let counts = histogram(|x| Some(((u128::from(x) * 3) >> 8) as u64), n, 8);
        assert_eq!(counts.iter().sum::<u64>(), 256);
        assert!(counts.iter().any(|&c| c != counts[0]), "{counts:?}");
    }

    #[test]
    fn lemire_rejects_only_below_the_threshold() {
        // 2^8 mod 3 == 1: only the single word whose low half is 0 is rejected.
        let lemire = Lemire::new(3, 8);
        let rejected = (0..256u64).filter(|&x| lemire.reduce(x).is_none()).count();
        assert_eq!(rejected, 1);
        // A power of two never rejects.
        let lemire = Lemire::new(64, 8);
        assert!((0..256u64).all(|x| lemire.reduce(x).is_some()));
        // Full 64-bit width: the outputs stay in range at the extremes.
        let lemire = Lemire::new(1_000_003, 64);
        for x in [0, 1, u64::MAX / 2, u64::MAX - 1, u64::MAX] {
            if let Some(v) = lemire.reduce(x) {
                assert!(v < 1_000_003);
            }
        }
        assert_eq!(Lemire::new(1_000_003, 64).reduce(u64::MAX), Some(1_000_002));
    }

    #[test]
    fn mix64_is_not_the_identity_and_spreads_bits() {
        // Flipping one input bit should flip about half of the output bits.
        let mut total = 0u32;
        for bit in 0..64 {
            total += (mix64(12345) ^ mix64(12345 ^ (1 << bit))).count_ones();
        }
        let mean = f64::from(total) / 64.0;
        assert!((24.0..40.0).contains(&mean), "mean flipped bits {mean}");
    }
}

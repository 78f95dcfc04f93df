//! Keyed permutations of `[0, n)` without a table: a balanced Feistel network
//! with cycle-walking.
//!
//! A Feistel network splits a `2h`-bit word into halves `(L, R)` and applies
//! rounds `(L, R) -> (R, L ^ F(k_i, R))`. Each round is invertible whatever
//! `F` is, so the network is a bijection on `[0, 4^h)` for any round function
//! and any keys; the keys only choose *which* bijection. Four rounds is the
//! classic minimum (Luby–Rackoff) for the result to look like a random
//! permutation when `F` looks like a random function.
//!
//! To get a bijection on `[0, n)` for any `n`, the network runs on the
//! smallest domain `4^h >= n` and *cycle-walks*: an output `>= n` is fed back
//! in until it lands below `n`. Walking follows the network's cycle through
//! the starting point, which lies in `[0, n)`, so it always stops, and the
//! restriction is again a bijection. The domain is under `4n`, so on average
//! fewer than four passes are needed (about one for `n` just under a power
//! of four).

use crate::mix::{mix64, GOLDEN};

/// The number of Feistel rounds.
const ROUNDS: usize = 4;

/// The shape of the domain for one `n`: how many bits each half has.
/// Computed once per sampler; each cycle adds its own keys with
/// [`Domain::permutation`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Domain {
    n: u64,
    half_bits: u32,
}

impl Domain {
    /// The domain for permutations of `[0, n)`, `n >= 1`.
    pub(crate) fn new(n: u64) -> Domain {
        debug_assert!(n >= 1);
        let bits = u64::BITS - (n - 1).leading_zeros();
        // At least one bit per half, so the shifts below stay in range.
        let half_bits = bits.div_ceil(2).max(1);
        Domain { n, half_bits }
    }

    /// The permutation chosen by `key`: the round keys are four SplitMix64
    /// outputs of `key`.
    pub(crate) fn permutation(&self, key: u64) -> Permutation {
        let mut keys = [0u64; ROUNDS];
        for (i, k) in keys.iter_mut().enumerate() {
            *k = mix64(key.wrapping_add(GOLDEN.wrapping_mul(i as u64 + 1)));
        }
        Permutation {
            n: self.n,
            half_bits: self.half_bits,
            mask: (1u64 << self.half_bits) - 1,
            keys,
        }
    }
}

/// One keyed bijection on `[0, n)`, with its round keys precomputed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Permutation {
    n: u64,
    half_bits: u32,
    mask: u64,
    keys: [u64; ROUNDS],
}

impl Permutation {
    /// The round function: a multiply–xorshift–multiply hash of the right half
    /// and the round key, keeping the top `half_bits` bits of the product
    /// (the best-mixed ones).
    #[inline(always)]
    fn round(&self, key: u64, right: u64) -> u64 {
        let z = (right ^ key).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let z = (z ^ (z >> 32)).wrapping_mul(0xD6E8_FEB8_6659_FD93);
        z >> (64 - self.half_bits)
    }

    /// One pass of the network over the whole `4^h` domain.
    #[inline(always)]
    fn network(&self, x: u64) -> u64 {
        let mut left = x >> self.half_bits;
        let mut right = x & self.mask;
        for &key in &self.keys {
            let next = left ^ self.round(key, right);
            left = right;
            right = next;
        }
        (left << self.half_bits) | right
    }

    /// The image of `x`, for `x < n`; the result is `< n`.
    #[inline(always)]
    pub(crate) fn apply(&self, x: u64) -> u64 {
        debug_assert!(x < self.n);
        let mut y = self.network(x);
        while y >= self.n {
            y = self.network(y);
        }
        y
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_bijection(n: u64, key: u64) {
        let perm = Domain::new(n).permutation(key);
        let mut seen = vec![false; n as usize];
        for x in 0..n {
            let y = perm.apply(x);
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
        let cases = [
            (1u64, 1u32),
            (4, 1),
            (5, 2),
            (16, 2),
            (17, 3),
            (1 << 20, 10),
        ];
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
}

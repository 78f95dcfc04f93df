//! CRC-32C (Castagnoli): the checksum of every record, table entry and head.
//!
//! Computed by `crc-fast`, which picks at run time the fastest of carry-less
//! multiplication folding with AVX-512 VPCLMULQDQ, with PCLMULQDQ, or a
//! table (figures in bench-results/engine-notes.md). The values are those
//! of the `crc32c` crate (which checks them in the tests), so stores stay
//! compatible.
//!
//! Raw records are copied out of memory and checked in one pass
//! ([`copy_crc32c`]): on a CPU without VPCLMULQDQ a separate check costs
//! about as much as the copy (module `fused`).

use crc_fast::{checksum, CrcAlgorithm, Digest};

/// The CRC-32C of `bytes`.
#[inline]
pub(crate) fn crc32c(bytes: &[u8]) -> u32 {
    // Lossless: a CRC-32 is computed in the low 32 bits.
    checksum(CrcAlgorithm::Crc32Iscsi, bytes) as u32
}

/// The CRC-32C of the bytes `crc` was computed over followed by `bytes`.
pub(crate) fn crc32c_append(crc: u32, bytes: &[u8]) -> u32 {
    // The register before the final inversion is the finished value inverted.
    let mut d = Digest::new_with_init_state(CrcAlgorithm::Crc32Iscsi, u64::from(!crc));
    d.update(bytes);
    d.finalize() as u32
}

/// Copies `src` into `dst` and returns the CRC-32C of the bytes copied: the
/// bytes checked are the bytes the caller gets, read from memory once on a
/// CPU without VPCLMULQDQ (module `fused`), copied then checked on one with
/// it. This is what a gather does with each raw record it finds in memory;
/// it is public for the benchmarks' ceilings.
///
/// # Panics
///
/// When `src` and `dst` differ in length.
pub fn copy_crc32c(src: &[u8], dst: &mut [u8]) -> u32 {
    assert_eq!(src.len(), dst.len(), "copy_crc32c: lengths differ");
    #[cfg(target_arch = "x86_64")]
    if src.len() >= fused::MIN_LEN && fused::chosen() {
        return fused::copy_crc32c(src, dst, src.len() >= fused::STREAM_MIN_LEN);
    }
    dst.copy_from_slice(src);
    crc32c(src)
}

/// A copy that computes the CRC-32C of what it moves, by carry-less
/// multiplication folding (PCLMULQDQ, the method of Intel's "Fast CRC
/// Computation for Generic Polynomials Using PCLMULQDQ Instruction").
///
/// Why by hand: no crate offers a copy that checksums as it goes, and on a
/// CPU without VPCLMULQDQ (AMD Zen 1 at 2 GHz, one of this project's hosts)
/// copying a random 12 KiB record out of memory and then checking it runs
/// at 0.55-0.65 of the copy alone (the check is as slow as the copy). Here
/// each 64 bytes is loaded once, stored, and folded into four 128-bit
/// accumulators while the next lines arrive; the fold's multiplications
/// hide behind the copy's memory stalls. Records of 4 KiB or more are
/// stored with non-temporal stores (a gathered batch is megabytes, read
/// next by the consumer's transfer, not by this thread), and the source is
/// prefetched 512 bytes ahead: about the speed of the copy alone
/// (bench-results/engine-notes.md).
/// `crc-fast` remains the checksum of everything else, and the tests check
/// this against the `crc32c` crate for every length and alignment.
#[cfg(target_arch = "x86_64")]
mod fused {
    use std::arch::x86_64::*;

    /// Shorter records are copied and then checked.
    pub const MIN_LEN: usize = 256;
    /// Records at least this long are stored with non-temporal stores.
    pub const STREAM_MIN_LEN: usize = 4096;
    /// How far ahead of the fold the source is prefetched, in 16-byte lanes.
    const PREFETCH_LANES: usize = 32;

    /// CRC-32C's polynomial, x^32 implied.
    const POLY: u64 = 0x1EDC_6F41;

    /// x^e mod POLY (bit d = coefficient of x^d).
    const fn xpow_mod(e: u32) -> u32 {
        let mut r: u64 = 1;
        let mut i = 0;
        while i < e {
            r <<= 1;
            if r & (1 << 32) != 0 {
                r ^= (1 << 32) | POLY;
            }
            i += 1;
        }
        r as u32
    }

    /// The fold constant for x^e in the bit-reflected domain: the reflected
    /// remainder shifted left once, so that a 64 × 33-bit carry-less product
    /// lands aligned to the 128-bit lane it is folded into.
    const fn k(e: u32) -> i64 {
        ((xpow_mod(e).reverse_bits() as u64) << 1) as i64
    }

    /// Constants to fold a lane forward by `d` bits: its low (earlier, higher
    /// degree) half by x^(d+32), its high half by x^(d-32); the extra x^32
    /// comes from the constants' alignment.
    const fn fold_by(d: u32) -> (i64, i64) {
        (k(d + 32), k(d - 32))
    }
    const F512: (i64, i64) = fold_by(512);
    const F384: (i64, i64) = fold_by(384);
    const F256: (i64, i64) = fold_by(256);
    const F128: (i64, i64) = fold_by(128);

    /// Whether the CPU has the instructions.
    pub fn available() -> bool {
        is_x86_feature_detected!("pclmulqdq") && is_x86_feature_detected!("sse4.2")
    }

    /// Whether to use it: where it was measured to win. With AVX-512
    /// VPCLMULQDQ, crc-fast checks 12 KiB of cached bytes at 120 GB/s and
    /// copy-then-check ran at 0.89 of the copy alone (Intel host), so the
    /// two-pass path stays there.
    pub fn chosen() -> bool {
        static CHOSEN: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *CHOSEN.get_or_init(|| {
            available() && !(is_x86_feature_detected!("vpclmulqdq") && is_x86_feature_detected!("avx512f"))
        })
    }

    pub fn copy_crc32c(src: &[u8], dst: &mut [u8], stream: bool) -> u32 {
        assert!(src.len() == dst.len() && src.len() >= 64 && available());
        // Non-temporal 16-byte stores need 16-byte aligned addresses.
        let stream = stream && (dst.as_ptr() as usize).is_multiple_of(16);
        // SAFETY: checked above: the CPU has the instructions `kernel` is
        // compiled for and the lengths are equal and at least 64; `stream`
        // only with an aligned `dst`.
        unsafe { kernel(src, dst, stream) }
    }

    #[inline(always)]
    unsafe fn fold(x: __m128i, k: __m128i) -> __m128i {
        // SAFETY: called only from `kernel`, on a CPU with PCLMULQDQ.
        unsafe { _mm_xor_si128(_mm_clmulepi64_si128(x, k, 0x00), _mm_clmulepi64_si128(x, k, 0x11)) }
    }

    #[inline(always)]
    unsafe fn store(p: *mut __m128i, v: __m128i, stream: bool) {
        // SAFETY: `p` is a lane inside the destination (16-byte aligned
        // when `stream`), as `kernel` promises.
        unsafe {
            if stream {
                _mm_stream_si128(p, v)
            } else {
                _mm_storeu_si128(p, v)
            }
        }
    }

    /// SAFETY (for callers): the CPU has PCLMULQDQ and SSE 4.2;
    /// `src.len() == dst.len() >= 64`; with `stream`, `dst` is 16-byte aligned.
    #[target_feature(enable = "pclmulqdq,sse4.2")]
    unsafe fn kernel(src: &[u8], dst: &mut [u8], stream: bool) -> u32 {
        // SAFETY: see the comments below and the function's contract.
        unsafe {
            let n = src.len();
            let lanes = n / 16;
            let s = src.as_ptr().cast::<__m128i>();
            let d = dst.as_mut_ptr().cast::<__m128i>();
            // Every lane read or written below is < `lanes`, inside both slices
            // (unaligned loads and stores; aligned streaming stores only when
            // `dst` is aligned). Prefetches may point past the end: they never
            // fault, and `wrapping_add` keeps the address arithmetic defined.
            let k512 = _mm_set_epi64x(F512.1, F512.0);
            let k128 = _mm_set_epi64x(F128.1, F128.0);
            let mut x = [_mm_setzero_si128(); 4];
            for (j, x) in x.iter_mut().enumerate() {
                *x = _mm_loadu_si128(s.add(j));
                store(d.add(j), *x, stream);
            }
            // The initial register (all ones) enters as the first 4 bytes xored.
            x[0] = _mm_xor_si128(x[0], _mm_cvtsi32_si128(-1));
            let mut i = 4;
            while i + 4 <= lanes {
                _mm_prefetch::<_MM_HINT_T0>(s.wrapping_add(i + PREFETCH_LANES).cast::<i8>());
                for (j, x) in x.iter_mut().enumerate() {
                    let y = _mm_loadu_si128(s.add(i + j));
                    store(d.add(i + j), y, stream);
                    *x = _mm_xor_si128(fold(*x, k512), y);
                }
                i += 4;
            }
            let k384 = _mm_set_epi64x(F384.1, F384.0);
            let k256 = _mm_set_epi64x(F256.1, F256.0);
            let mut acc =
                _mm_xor_si128(_mm_xor_si128(fold(x[0], k384), fold(x[1], k256)), _mm_xor_si128(fold(x[2], k128), x[3]));
            while i < lanes {
                let y = _mm_loadu_si128(s.add(i));
                store(d.add(i), y, stream);
                acc = _mm_xor_si128(fold(acc, k128), y);
                i += 1;
            }
            if stream {
                // Order the streaming stores before whatever tells another
                // thread the slot is filled.
                _mm_sfence();
            }
            // The folded 16 bytes and the tail through the CRC32 instruction,
            // from a zero register (the initial value is already in).
            let mut r = _mm_crc32_u64(0, _mm_cvtsi128_si64(acc) as u64);
            r = _mm_crc32_u64(r, _mm_extract_epi64::<1>(acc) as u64);
            let mut r = r as u32;
            let tail = lanes * 16;
            dst[tail..].copy_from_slice(&src[tail..]);
            for &b in &src[tail..] {
                r = _mm_crc32_u8(r, b);
            }
            !r
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_values_are_the_crc32c_crates() {
        let data: Vec<u8> = (0..70_000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
        for len in [0, 1, 7, 28, 60, 63, 64, 65, 255, 256, 4095, 12_288, 65_536, 70_000] {
            for start in [0, 1, 13] {
                let b = &data[start.min(data.len() - len)..][..len];
                assert_eq!(crc32c(b), crc32c::crc32c(b), "len {len}");
                let (head, tail) = b.split_at(len / 3);
                assert_eq!(crc32c_append(crc32c(head), tail), crc32c::crc32c(b), "append, len {len}");
                assert_eq!(crc32c_append(0x1234_5678, tail), crc32c::crc32c_append(0x1234_5678, tail));
            }
        }
    }

    #[test]
    fn copying_checks_the_bytes_it_copies() {
        let data: Vec<u8> = (0..20_000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8).collect();
        let mut lens: Vec<usize> = (0..=300).collect();
        lens.extend([4095, 4096, 4097, 12_288, 12_289, 16_000]);
        let mut out = vec![0u8; 20_100];
        for len in lens {
            for (from, to) in [(0, 0), (1, 0), (0, 1), (3, 7), (13, 16), (16, 5)] {
                let src = &data[from..from + len];
                let dst = &mut out[to..to + len];
                dst.fill(0xA5);
                assert_eq!(copy_crc32c(src, dst), crc32c::crc32c(src), "len {len}, from {from}, to {to}");
                assert_eq!(dst, src, "len {len}, from {from}, to {to}");
                #[cfg(target_arch = "x86_64")]
                if len >= 64 && fused::available() {
                    for stream in [false, true] {
                        dst.fill(0x5A);
                        assert_eq!(fused::copy_crc32c(src, dst, stream), crc32c::crc32c(src), "len {len}");
                        assert_eq!(dst, src, "len {len}, stream {stream}");
                    }
                }
            }
        }
    }
}

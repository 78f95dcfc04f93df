//! CRC-32C (Castagnoli): the checksum of every record, table entry and head.
//!
//! Computed by `crc-fast`, which picks at run time the fastest of carry-less
//! multiplication folding with AVX-512 VPCLMULQDQ, with PCLMULQDQ, or a
//! table. Measured on this project's 2-core machine (AVX-512, VPCLMULQDQ),
//! bytes already in the CPU cache: 12 KiB records 120 GB/s against 25 GB/s
//! for the SSE 4.2 instruction loop of the `crc32c` crate zring used before;
//! 28-byte table entries 6.0 against 4.1 GB/s. The values are the same (the
//! `crc32c` crate checks them in the tests), so stores stay compatible.

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
}

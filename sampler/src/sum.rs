//! NumPy's float64 sums, to the bit: what weights are normalised by, so that
//! they match the Python side's.

/// The sum NumPy's `add.reduce` computes over a contiguous float64 array:
/// pairwise, in blocks of 128 summed with eight accumulators.
pub(crate) fn pairwise_sum(a: &[f64]) -> f64 {
    let n = a.len();
    if n < 8 {
        a.iter().fold(0.0, |s, x| s + x)
    } else if n <= 128 {
        let mut r = [0.0f64; 8];
        r.copy_from_slice(&a[..8]);
        let whole = n - n % 8;
        for block in a[8..whole].chunks_exact(8) {
            for (acc, x) in r.iter_mut().zip(block) {
                *acc += x;
            }
        }
        let mut s = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
        for x in &a[whole..] {
            s += x;
        }
        s
    } else {
        let half = n / 2;
        let half = half - half % 8;
        pairwise_sum(&a[..half]) + pairwise_sum(&a[half..])
    }
}

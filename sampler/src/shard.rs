//! Shards: which contiguous part of the global batch one consumer takes.

use serde::{Deserialize, Serialize};

use crate::Error;

/// Shard `index` of `count`: this consumer's contiguous slice
/// `[index * B / count, (index + 1) * B / count)` of each global batch of
/// length `B`.
///
/// The slices of shards `0..count` are disjoint and concatenate to the global
/// batch. Since the sampler state holds no shard, a run saved with one shard
/// count resumes with any other count that divides the batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Shard {
    /// Which shard this is, `0 <= index < count`.
    pub index: u32,
    /// How many shards the global batch is split into, `count >= 1`.
    pub count: u32,
}

impl Shard {
    /// The single shard that takes the whole batch.
    pub const ALL: Shard = Shard { index: 0, count: 1 };

    /// Shard `index` of `count`, checked: [`Error::BadShard`] unless
    /// `count >= 1` and `index < count`.
    pub fn new(index: u32, count: u32) -> Result<Shard, Error> {
        Shard { index, count }.check()
    }

    /// Returns the shard if its fields are consistent. The fields are public,
    /// so every entry point re-checks them.
    pub(crate) fn check(self) -> Result<Shard, Error> {
        if self.count == 0 || self.index >= self.count {
            Err(Error::BadShard { index: self.index, count: self.count })
        } else {
            Ok(self)
        }
    }

    /// The half-open range of global batch positions this shard takes, for a
    /// global batch of `batch` positions, or [`Error::ShardDoesNotDivide`].
    pub(crate) fn range(self, batch: usize) -> Result<(usize, usize), Error> {
        let shard = self.check()?;
        let count = shard.count as usize;
        let len = batch / count;
        // Not `is_multiple_of`: the workspace supports Rust 1.80.
        if len * count != batch {
            return Err(Error::ShardDoesNotDivide { batch: batch as u64, count: shard.count });
        }
        let start = len * shard.index as usize;
        Ok((start, start + len))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_rejects_bad_shards() {
        assert_eq!(Shard::new(0, 0), Err(Error::BadShard { index: 0, count: 0 }));
        assert_eq!(Shard::new(4, 4), Err(Error::BadShard { index: 4, count: 4 }));
        assert_eq!(Shard::new(3, 4), Ok(Shard { index: 3, count: 4 }));
        assert_eq!(Shard::new(0, 1), Ok(Shard::ALL));
    }

    #[test]
    fn ranges_tile_the_batch() {
        for count in [1u32, 2, 3, 4, 8] {
            let batch = 24usize;
            let mut next = 0;
            for index in 0..count {
                let (start, end) = Shard::new(index, count).unwrap().range(batch).unwrap();
                assert_eq!(start, next);
                assert_eq!(end - start, batch / count as usize);
                next = end;
            }
            assert_eq!(next, batch);
        }
        assert_eq!(Shard::new(0, 5).unwrap().range(24), Err(Error::ShardDoesNotDivide { batch: 24, count: 5 }));
    }
}

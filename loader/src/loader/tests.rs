use super::worker::{fan_out_for, prefix_sum};
use super::*;
use crate::batch::Column;

/// The Python binding moves loaders and batches across threads (the GIL
/// is released around `next()`) and wraps buffers in pyclasses, which
/// must be `Send + Sync`.
#[test]
fn handles_are_send_and_sync() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<Loader>();
    send_sync::<Batch>();
    send_sync::<Column>();
    send_sync::<crate::PooledBuf>();
    send_sync::<crate::Pooled<u64>>();
    send_sync::<Error>();
    send_sync::<LoaderState>();
}

#[test]
fn workers_lend_the_pool_only_while_cores_would_idle() {
    assert!(fan_out_for(1, 4, 2), "one gather at a time leaves a core free");
    assert!(fan_out_for(4, 1, 2), "depth 1 runs one gather at a time");
    assert!(!fan_out_for(2, 4, 2), "two gathers on two cores");
    assert!(!fan_out_for(8, 8, 4));
    assert!(fan_out_for(2, 2, 4));
}

#[test]
fn prefix_sum_turns_lengths_into_ends() {
    let mut v = [3, 0, 4, 1];
    assert_eq!(prefix_sum(&mut v), Some(8));
    assert_eq!(v, [3, 3, 7, 8]);
    assert_eq!(prefix_sum(&mut [u64::MAX, 1]), None);
}

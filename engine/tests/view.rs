//! A [`View`] is one snapshot: the lengths a ragged batch is sized by and
//! the records then gathered come from the same records, whatever a writer
//! does in between. (Sizing by `Store::lengths` and then calling
//! a ragged `Store::gather` takes two snapshots: a delete between them moves
//! another record into the slot, whose length differs.)

use std::sync::Arc;

use zring_engine::Store;

fn rec(i: u64) -> Vec<u8> {
    vec![i as u8; 10 + i as usize]
}

#[test]
fn a_view_reads_the_records_it_was_taken_of_across_a_delete_and_compaction() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(Store::builder(dir.path()).create().unwrap());
    let recs: Vec<Vec<u8>> = (0..20).map(rec).collect();
    let refs: Vec<&[u8]> = recs.iter().map(Vec::as_slice).collect();
    store.append(&refs, None).unwrap();
    store.sync().unwrap();

    let view = store.view();
    let before = store.fingerprint().unwrap();
    let indices = [0u64, 5, 19];
    let mut lengths = [0u64; 3];
    view.lengths(&indices, &mut lengths).unwrap();
    assert_eq!(lengths, [10, 15, 29]);

    // Record 19 moves into slot 0; compaction rewrites the chunks.
    store.delete(&[0]).unwrap();
    store.compact().unwrap();
    let mut now = [0u64; 3];
    store.lengths(&indices[..2], &mut now[..2]).unwrap();
    assert_eq!(now[..2], [29, 15], "the store itself has moved on");

    let total: u64 = lengths.iter().sum();
    let mut dst = vec![0u8; total as usize];
    let offsets = [0, lengths[0], lengths[0] + lengths[1]];
    view.gather(&zring_engine::Gather::ragged(&indices, &offsets), &mut dst).unwrap();
    let want: Vec<u8> = indices.iter().flat_map(|&i| rec(i)).collect();
    assert_eq!(dst, want);
    let mut fixed = vec![0u8; 3 * 29];
    view.gather(&zring_engine::Gather::fixed(&indices, 29), &mut fixed).unwrap();
    assert_eq!(&fixed[..10], &rec(0)[..]);
    assert_eq!(view.len(), 20);
    assert_eq!(view.fingerprint().unwrap(), before);
    assert_eq!(store.len(), 19);
}

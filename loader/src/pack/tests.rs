use super::seek::first_fit;
use super::*;

#[test]
fn first_fit_places_each_piece_in_the_first_row_with_room() {
    let w = first_fit(&[0, 1, 2, 3], &[6, 3, 5, 2], 8);
    let rows: Vec<Vec<(u64, u64, u64)>> = (0..w.ends.len())
        .map(|r| {
            let from = if r == 0 { 0 } else { w.ends[r - 1] };
            w.pieces[from..w.ends[r]].iter().map(|p| (p.doc, p.start, p.len)).collect()
        })
        .collect();
    // 6 opens row 0, 3 opens row 1, 5 fits row 1, 2 fits row 0.
    assert_eq!(rows, vec![vec![(0, 0, 6), (3, 0, 2)], vec![(1, 0, 3), (2, 0, 5)]]);
}

#[test]
fn first_fit_cuts_long_documents_into_rows() {
    let w = first_fit(&[7], &[20], 8);
    let got: Vec<(u64, u64)> = w.pieces.iter().map(|p| (p.start, p.len)).collect();
    assert_eq!(got, vec![(0, 8), (8, 8), (16, 4)]);
    assert_eq!(w.ends, vec![1, 2, 3]);
}

#[test]
fn pack_checks_its_fields() {
    let ok = Pack::new(4, PackMode::Concat, 255, 1);
    assert_eq!(ok.check(), None);
    assert_eq!(Pack { seq_len: 0, ..ok }.check().map(|c| c.0), Some("seq_len"));
    assert_eq!(Pack { token_bytes: 3, ..ok }.check().map(|c| c.0), Some("token_bytes"));
    assert_eq!(Pack { pad_id: 256, ..ok }.check().map(|c| c.0), Some("pad_id"));
    assert_eq!(Pack { eod_id: Some(300), ..ok }.check().map(|c| c.0), Some("eod_id"));
    assert_eq!(Pack { mask_boundaries: true, ..ok }.check().map(|c| c.0), Some("mask_boundaries"));
}

#[test]
fn a_pack_saved_before_labels_reads_back_as_nothing_added() {
    let old: Pack = serde_json::from_str(r#"{"seq_len":4,"mode":"first_fit","pad_id":0,"token_bytes":2}"#).unwrap();
    assert_eq!(old, Pack::new(4, PackMode::FirstFit, 0, 2));
    // And a pack without the new fields writes what older versions read.
    assert_eq!(serde_json::to_string(&old).unwrap(), r#"{"seq_len":4,"mode":"first_fit","pad_id":0,"token_bytes":2}"#);
    assert!(Pack { signed: true, ..old }.resumes(&old));
}

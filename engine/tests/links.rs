//! The store's files are reached through one directory handle
//! (`io::fs::Dir`): a symbolic link planted at a name the engine writes,
//! reads or removes is never followed, a replace only replaces a store, and
//! staging directories left by killed writers are removed by descriptor.
//! Each test plants links to a "victim" file outside the store and checks
//! that its bytes are unchanged after the operation, which either succeeded
//! or failed with an error.

use std::os::unix::fs::symlink;
use std::path::Path;

use zring_engine::{check_replaceable, Error, Staging, Store};

/// A file outside the store with known bytes.
fn victim(dir: &Path, name: &str) -> std::path::PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, format!("victim {name}: must stay as it is\n")).unwrap();
    p
}

fn unchanged(p: &Path) {
    let name = p.file_name().unwrap().to_string_lossy().into_owned();
    assert_eq!(std::fs::read_to_string(p).unwrap(), format!("victim {name}: must stay as it is\n"), "{}", p.display());
}

fn store_with(dir: &Path, n: u32) -> Store {
    let s = Store::builder(dir).chunk_bytes(4096).create().unwrap();
    let recs: Vec<Vec<u8>> = (0..n).map(|i| vec![i as u8; 300]).collect();
    let refs: Vec<&[u8]> = recs.iter().map(Vec::as_slice).collect();
    s.append(&refs, None).unwrap();
    s.sync().unwrap();
    s
}

/// Links at the temporary head, the next table generation, the next chunk,
/// the schema and the dictionary's temporary names: every write succeeds
/// (a temporary name is made anew) or fails, and no victim changes.
#[test]
fn links_planted_at_the_names_a_writer_makes_are_never_followed() {
    let outside = tempfile::tempdir().unwrap();
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("s");
    let s = store_with(&dir, 40);
    let head_tmp = victim(outside.path(), "authorized_keys");
    symlink(&head_tmp, dir.join("head.zr.tmp")).unwrap();
    s.append(&[b"more"], None).unwrap();
    s.sync().expect("the temporary head is made anew, not written through the link");
    unchanged(&head_tmp);
    assert_eq!(Store::open(&dir).unwrap().len(), 41);

    let schema = victim(outside.path(), "schema-target");
    symlink(&schema, dir.join("schema.json.tmp")).unwrap();
    s.set_schema("{\"a\": 1}").unwrap();
    unchanged(&schema);
    // A link at schema.json itself is replaced by the rename, not followed.
    let schema2 = victim(outside.path(), "schema-target-2");
    std::fs::remove_file(dir.join("schema.json")).unwrap();
    symlink(&schema2, dir.join("schema.json")).unwrap();
    assert!(s.schema().is_err(), "a link at schema.json is not read through");
    s.set_schema("{\"a\": 2}").unwrap();
    unchanged(&schema2);
    assert_eq!(s.schema().unwrap().as_deref(), Some("{\"a\": 2}"));

    let dict = victim(outside.path(), "dict-target");
    symlink(&dict, dir.join("dict.zr.tmp")).unwrap();
    let samples: Vec<Vec<u8>> = (0..200u32).map(|i| format!("sample {i} {}", i * 7919).into_bytes()).collect();
    let refs: Vec<&[u8]> = samples.iter().map(Vec::as_slice).collect();
    let _ = s.train_dict(&refs, 4096);
    unchanged(&dict);

    // The next table generation (compaction writes it) and the next chunk.
    let tables: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("table-"))
        .collect();
    let live: u64 = tables[0].trim_start_matches("table-").trim_end_matches(".zr").parse().unwrap();
    let table = victim(outside.path(), "table-target");
    symlink(&table, dir.join(format!("table-{:06}.zr", live + 1))).unwrap();
    let chunks = std::fs::read_dir(&dir)
        .unwrap()
        .filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().starts_with("chunk-"))
        .count();
    let chunk = victim(outside.path(), "chunk-target");
    for k in chunks..chunks + 40 {
        let _ = symlink(&chunk, dir.join(format!("chunk-{k:06}.zr")));
    }
    s.delete(&[0, 1, 2]).ok();
    let _ = s.compact();
    let recs: Vec<Vec<u8>> = (0..40u32).map(|i| vec![i as u8; 300]).collect();
    let refs: Vec<&[u8]> = recs.iter().map(Vec::as_slice).collect();
    let _ = s.append(&refs, None).and_then(|_| s.sync());
    unchanged(&table);
    unchanged(&chunk);
    drop(s);
    // A writer that opens the store again recovers what the head names.
    let s = Store::builder(&dir).open_writable().unwrap();
    s.verify().unwrap();
    unchanged(&head_tmp);
    unchanged(&table);
    unchanged(&chunk);
}

/// A reader never opens a chunk, the table or the pins file through a link.
#[test]
fn a_link_in_place_of_a_chunk_is_an_error_not_a_read_of_its_target() {
    let outside = tempfile::tempdir().unwrap();
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("s");
    store_with(&dir, 4).close().unwrap();
    let name = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .find(|n| n.starts_with("chunk-"))
        .unwrap();
    let target = victim(outside.path(), "chunk");
    std::fs::remove_file(dir.join(&name)).unwrap();
    symlink(&target, dir.join(&name)).unwrap();
    assert!(Store::open(&dir).is_err());
    unchanged(&target);
}

/// `overwrite`/replace refuses a directory that is not a store and keeps
/// every file in it; a store, an empty directory and a directory of stores
/// are replaced.
#[test]
fn a_replace_refuses_what_is_not_a_store_and_keeps_every_file() {
    let root = tempfile::tempdir().unwrap();
    let project = root.path().join("project");
    std::fs::create_dir_all(project.join("src")).unwrap();
    std::fs::write(project.join("src/train.py"), b"print('keep me')\n").unwrap();
    std::fs::write(project.join("schema.json"), b"{}").unwrap();
    let e = check_replaceable(&project).unwrap_err();
    assert!(matches!(e, Error::NotReplaceable { .. }), "{e}");
    assert!(e.to_string().contains(&project.display().to_string()), "{e}");
    assert!(matches!(Staging::new(&project, true), Err(Error::NotReplaceable { .. })));
    assert!(matches!(Store::builder(&project).create_staged(true), Err(Error::NotReplaceable { .. })));
    // Made a store after the staging began: publish refuses too.
    let other = root.path().join("other");
    std::fs::create_dir(&other).unwrap();
    let st = Store::builder(&other).create_staged(true).unwrap();
    st.append(&[b"x"], None).unwrap();
    std::fs::write(other.join("notes.txt"), b"keep").unwrap();
    assert!(matches!(st.publish(), Err(Error::NotReplaceable { .. })));
    assert_eq!(std::fs::read(other.join("notes.txt")).unwrap(), b"keep");
    assert_eq!(std::fs::read(project.join("src/train.py")).unwrap(), b"print('keep me')\n");
    // A damaged head is not a store either.
    let damaged = root.path().join("damaged");
    store_with(&damaged, 3).close().unwrap();
    std::fs::write(damaged.join("head.zr"), b"not a head").unwrap();
    assert!(matches!(check_replaceable(&damaged), Err(Error::NotReplaceable { .. })));
    // A link is not replaced (nor followed).
    let link = root.path().join("link");
    symlink(&project, &link).unwrap();
    assert!(matches!(check_replaceable(&link), Err(Error::NotReplaceable { .. })));

    // What may be replaced.
    let empty = root.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    check_replaceable(&empty).unwrap();
    check_replaceable(root.path().join("absent")).unwrap();
    let store = root.path().join("store");
    store_with(&store, 3).close().unwrap();
    check_replaceable(&store).unwrap();
    let nested = root.path().join("nested");
    store_with(&nested.join("a.zr"), 1).close().unwrap();
    store_with(&nested.join("b.zr"), 1).close().unwrap();
    check_replaceable(&nested).unwrap();
    let st = Store::builder(&store).create_staged(true).unwrap();
    st.append(&[b"new"], None).unwrap();
    st.publish().unwrap();
    assert_eq!(Store::open(&store).unwrap().len(), 1);
}

/// A staging directory swapped for a link by someone who owns the parent:
/// the store is still built (by descriptor) in the directory made, nothing
/// is written where the link points, and publish refuses to move the link.
#[test]
fn a_staging_directory_swapped_for_a_link_leads_nowhere() {
    let outside = tempfile::tempdir().unwrap();
    let target_store = outside.path().join("other-store");
    store_with(&target_store, 5).close().unwrap();
    let before: Vec<(String, Vec<u8>)> = files(&target_store);
    let root = tempfile::tempdir().unwrap();
    let dest = root.path().join("s");
    let st = Staging::new(&dest, false).unwrap();
    let moved = root.path().join("moved-away");
    std::fs::rename(st.path(), &moved).unwrap();
    symlink(&target_store, st.path()).unwrap();
    // Opened by its path, the staging directory is reached by descriptor:
    // the store is made in the directory made (and its open then notices
    // that the path names another directory now), never in the link's target.
    if let Ok(s) = Store::builder(st.path()).create() {
        s.append(&[b"mine"], None).unwrap();
        s.close().unwrap();
    }
    assert!(moved.join("head.zr").exists(), "built in the directory made");
    assert!(st.publish().is_err(), "the name no longer holds the directory built in");
    assert!(!dest.exists());
    assert_eq!(files(&target_store), before, "nothing outside the staging directory changed");
}

fn files(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut v: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (e.file_name().to_string_lossy().into_owned(), std::fs::read(e.path()).unwrap_or_default())
        })
        .collect();
    v.sort();
    v
}

/// A killed writer's staging directory is removed by the next staging for
/// the same destination, by descriptor (a link inside is removed, its target
/// kept); one whose process lives is kept.
#[test]
fn stale_staging_directories_of_dead_writers_are_removed() {
    let outside = tempfile::tempdir().unwrap();
    let target = victim(outside.path(), "kept");
    let root = tempfile::tempdir().unwrap();
    let dead = root.path().join(format!(".s.{}-0.partial", i32::MAX - 1));
    store_with(&dead, 3).close().unwrap();
    std::fs::create_dir(dead.join("sub")).unwrap();
    symlink(&target, dead.join("sub").join("link")).unwrap();
    symlink(outside.path(), dead.join("dirlink")).unwrap();
    // pid 1 lives.
    let live = root.path().join(".s.1-0.partial");
    std::fs::create_dir(&live).unwrap();
    // Another destination's.
    let other = root.path().join(format!(".t.{}-0.partial", i32::MAX - 1));
    std::fs::create_dir(&other).unwrap();
    let st = Staging::new(root.path().join("s"), false).unwrap();
    assert!(!dead.exists(), "the dead writer's staging directory is removed");
    assert!(live.exists() && other.exists());
    unchanged(&target);
    assert!(outside.path().join("kept").exists());
    drop(st);
    let left: Vec<String> = std::fs::read_dir(root.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(!left.iter().any(|n| n.starts_with(&format!(".s.{}", std::process::id()))), "{left:?}");
}

"""A store's files are reached through its directory's descriptor: links
planted at the names zring writes are never followed, and ``overwrite=True``
replaces only what is a store (the engine's rule, ``check_replaceable``)."""

import hashlib
import os

import numpy as np
import pytest

import zring
from zring import _zring


def _hashes(root):
    """Every file under ``root`` (links as links) and a hash of its bytes."""
    out = {}
    for d, dirs, files in os.walk(root):
        for name in dirs + files:
            p = os.path.join(d, name)
            if os.path.islink(p):
                out[p] = "-> " + os.readlink(p)
            elif os.path.isfile(p):
                with open(p, "rb") as f:
                    out[p] = hashlib.sha256(f.read()).hexdigest()
            else:
                out[p] = "dir"
    return out


def test_overwrite_on_a_folder_that_is_not_a_store_raises_and_keeps_every_file(tmp_path):
    # The regression: a folder holding a schema.json was taken for a store,
    # and overwrite=True deleted src/train.py with the rest of it.
    project = tmp_path / "project"
    (project / "src").mkdir(parents=True)
    (project / "src" / "train.py").write_text("print('train')\n")
    (project / "schema.json").write_text("{}")
    (project / "README.md").write_text("my project\n")
    before = _hashes(project)
    with pytest.raises(FileExistsError, match="is not a zring store") as e:
        zring.write_dataset(project, np.zeros((4, 2)), overwrite=True)
    assert str(project) in str(e.value)
    with pytest.raises(FileExistsError, match="nothing was removed"):
        zring.write_ragged(project, [np.zeros(3)], overwrite=True)
    with pytest.raises(FileExistsError):
        _zring.Staging(str(project), True)
    assert _hashes(project) == before
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".")], "no staging directory left"


def test_overwrite_refuses_a_damaged_head_and_replaces_a_store(tmp_path):
    store = tmp_path / "s"
    zring.write_dataset(store, np.arange(6).reshape(3, 2))
    zring.write_dataset(store, np.arange(8).reshape(4, 2), overwrite=True)
    with zring.Dataset(store) as ds:
        assert len(ds) == 4
    (store / "head.zr").write_bytes(b"garbage")
    before = _hashes(store)
    with pytest.raises(FileExistsError, match="head.zr"):
        zring.write_dataset(store, np.zeros((1, 2)), overwrite=True)
    assert _hashes(store) == before


def test_links_at_the_names_a_write_makes_are_not_followed(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    victims = {}
    for name in ("head", "schema", "intent", "table"):
        p = outside / name
        p.write_text(f"victim {name}\n")
        victims[name] = p
    src = tmp_path / "files"
    src.mkdir()
    for i in range(6):
        (src / f"f{i}.bin").write_bytes(bytes([i]) * (i + 1))
    store = tmp_path / "s"
    zring.convert(src, store)
    os.symlink(victims["head"], store / "head.zr.tmp")
    os.symlink(victims["schema"], store / "schema.json.tmp")
    os.symlink(victims["intent"], store / "names.intent.tmp")
    tables = sorted(p for p in os.listdir(store) if p.startswith("table-"))
    gen = int(tables[-1][len("table-"):-len(".zr")])
    os.symlink(victims["table"], store / f"table-{gen + 1:06d}.zr")
    with zring.Zrecord(store) as z:
        z.delete([1])  # writes names.intent through its directory's descriptor
        try:
            z.compact()
        except OSError:
            pass
        assert len(z) == 5
    for name, p in victims.items():
        assert p.read_text() == f"victim {name}\n", name
    assert not (store / "names.intent").exists()
    with zring.RaggedDataset(store) as d:
        assert len(list(d.names)) == len(d) == 5


def test_a_link_in_place_of_the_intent_is_an_error_not_a_read_of_its_target(tmp_path):
    src = tmp_path / "files"
    src.mkdir()
    for i in range(3):
        (src / f"f{i}.bin").write_bytes(bytes([i]))
    store = tmp_path / "s"
    zring.convert(src, store)
    target = tmp_path / "target"
    target.write_text('{"op": "delete", "records_before": 3, "records_after": 2, "indices": [0]}')
    os.symlink(target, store / "names.intent")
    with pytest.raises(zring.CorruptError, match="names.intent"):
        zring.Zrecord(store)
    assert target.exists() and os.path.islink(store / "names.intent")


def test_a_killed_writes_staging_directory_is_removed_by_the_next_write(tmp_path):
    import signal
    import subprocess
    import sys
    import textwrap

    dest = tmp_path / "d"
    child = textwrap.dedent(
        """
        import sys, time
        import numpy as np
        import zring

        def rows():
            for i in range(100):
                yield np.full(3, i, np.int32)
            print("ready", flush=True)
            time.sleep(600)

        zring.write_ragged(sys.argv[1], rows())
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", child, str(dest)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    left = [p for p in os.listdir(tmp_path) if p.startswith(".d.") and p.endswith(".partial")]
    assert len(left) == 1, left
    # A link planted in it is removed, not followed.
    target = tmp_path / "target"
    target.write_text("keep")
    os.symlink(target, tmp_path / left[0] / "planted")
    zring.write_dataset(dest, np.zeros((2, 3), np.int32))
    assert [p for p in os.listdir(tmp_path) if p.startswith(".")] == []
    assert target.read_text() == "keep"
    with zring.Dataset(dest) as ds:
        assert len(ds) == 2

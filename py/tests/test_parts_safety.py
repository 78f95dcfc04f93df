"""Datasets of parts as several users and processes use them: two members of
a group appending to one dataset in a setgid folder, a group member's links
planted at the dataset's names, the memory an open dataset of many parts
costs, and Ray blocks whose rows all have one length joining a ragged column."""

import json
import os
import subprocess
import sys
import tempfile
import textwrap

import numpy as np
import pytest

import zring
from zring import parts

GROUP = 4242
MEMBERS = (4001, 4002)


def _as_member(uid: int, script: str, *args: str) -> subprocess.CompletedProcess:
    """Runs ``script`` in a fresh interpreter that imports zring as root and
    then becomes ``uid`` (a member of ``GROUP``, umask 002) before it runs:
    the interpreter's own files need not be readable by the member."""
    prelude = textwrap.dedent(f"""
        import os, sys, json
        import numpy as np
        import zring, zring.parts
        from zring import parts
        os.setgroups([{GROUP}])
        os.setgid({uid})
        os.setuid({uid})
        os.umask(0o002)
    """)
    return subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(script), *args],
                          capture_output=True, text=True, timeout=600)


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs root")


@pytest.fixture
def shared_folder():
    """A folder every user may enter, holding a setgid group folder (2775)."""
    top = tempfile.mkdtemp(prefix="zring-group-")
    os.chmod(top, 0o755)
    root = os.path.join(top, "corpus")
    os.mkdir(root)
    os.chown(root, 0, GROUP)
    os.chmod(root, 0o2775)
    yield top, root
    subprocess.run(["rm", "-rf", top], check=False)


@needs_root
def test_two_members_of_a_group_append_to_one_dataset_in_a_setgid_folder(shared_folder):
    _, root = shared_folder
    script = """
        root, tag = sys.argv[1], int(sys.argv[2])
        for c in range(50):
            info = parts.write_part(root, np.full((3, 2), 1000 * tag + c, dtype=np.int64))
            parts.commit(root, [info])
    """
    import concurrent.futures
    with concurrent.futures.ThreadPoolExecutor(2) as ex:
        runs = list(ex.map(lambda uid: _as_member(uid, script, root, str(uid % 10)), MEMBERS))
    for r in runs:
        assert r.returncode == 0, r.stderr[-3000:]
    listed = parts.list_parts(root)
    assert len(listed) == 100, "all 100 commits listed"
    ds = zring.Dataset(root)
    firsts = sorted({int(v) for v in ds[np.arange(len(ds))][:, 0]})
    assert firsts == sorted(1000 * (uid % 10) + c for uid in MEMBERS for c in range(50))
    assert os.stat(os.path.join(root, ".commit.lock")).st_mode & 0o060 == 0o060, "the lock is the group's"


@needs_root
def test_a_members_links_at_the_datasets_names_move_nothing_outside(shared_folder):
    top, root = shared_folder
    private = os.path.join(top, "private")
    os.mkdir(private, 0o700)
    with open(os.path.join(private, "secret"), "w") as f:
        f.write("root's")
    info = parts.write_part(root, np.arange(6, dtype=np.int64).reshape(3, 2))
    parts.commit(root, [info])
    before = {n: open(os.path.join(private, n)).read() for n in os.listdir(private)}
    for name in ("staging", "dropped", f".manifest.json.{os.getpid()}.tmp"):
        plant = f"""
            import shutil
            p = os.path.join(sys.argv[1], {name!r})
            if os.path.isdir(p) and not os.path.islink(p):
                shutil.rmtree(p)
            os.symlink(sys.argv[2], p)
        """
        r = _as_member(MEMBERS[0], plant, root, private if "tmp" not in name else os.path.join(private, "secret"))
        assert r.returncode == 0, r.stderr
        try:
            nxt = parts.write_part(root, np.arange(4, dtype=np.int64).reshape(2, 2))
            parts.commit(root, [nxt], mode="overwrite")
        except OSError as e:
            assert name in str(e), f"the refusal names {name}: {e}"
        assert {n: open(os.path.join(private, n)).read() for n in os.listdir(private)} == before, name
        if os.path.islink(os.path.join(root, name)):
            os.unlink(os.path.join(root, name))
    assert len(zring.Dataset(root)) in (2, 3)


def test_opening_64_parts_of_labels_costs_at_most_twice_their_bytes(tmp_path):
    root = str(tmp_path / "labels")
    per = 65536
    infos = [parts.write_part(root, np.arange(per, dtype=np.int64) + k * per, codec="raw") for k in range(64)]
    parts.commit(root, infos)
    probe = textwrap.dedent("""
        import sys, numpy as np, zring
        def anon():
            for line in open("/proc/self/status"):
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) * 1024
        ds0 = zring.Dataset(sys.argv[1])  # warm the process (pools, first allocations)
        ds0.close() if hasattr(ds0, "close") else None
        before = anon()
        ds = zring.Dataset(sys.argv[1])
        after = anon()
        assert len(ds) == 64 * 65536
        print(after - before)
    """)
    out = subprocess.run([sys.executable, "-c", probe, root], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    added = int(out.stdout.strip().splitlines()[-1])
    labels = 64 * per * 8
    assert added <= 2 * labels, f"opening added {added / 2**20:.1f} MiB for {labels / 2**20:.0f} MiB of labels"


def test_rank_plan_refuses_rank_counts_it_cannot_mean(tmp_path):
    root = str(tmp_path / "ds")
    parts.commit(root, [parts.write_part(root, np.arange(8, dtype=np.int64).reshape(4, 2))])
    with pytest.raises(ValueError, match="ranks must be from 1 to"):
        parts.rank_plan(root, 2**33)
    with pytest.raises(TypeError, match="ranks must be an int"):
        parts.rank_plan(root, 1.5)
    assert parts.rank_plan(root, 3) == [[parts.list_parts(root)[0]["dir"]], [], []]


def test_a_missing_manifest_is_named_when_the_dataset_is_opened(tmp_path):
    root = str(tmp_path / "ds")
    parts.commit(root, [parts.write_part(root, np.arange(8, dtype=np.int64).reshape(4, 2))])
    os.unlink(os.path.join(root, "manifest.json"))
    with pytest.raises(zring.NotAStoreError, match="manifest.json is missing"):
        zring.Dataset(root)
    with pytest.raises(zring.CorruptError, match="restore manifest.json"):
        parts.commit(root, [parts.write_part(root, np.arange(8, dtype=np.int64).reshape(4, 2))])
    assert len(os.listdir(os.path.join(root, "parts"))) == 1, "the committed part is kept"

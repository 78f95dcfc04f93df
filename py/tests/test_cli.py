"""The ``zring`` command's subcommands, called through ``zring.cli.main``."""

import numpy as np
import pytest

from zring import Dataset, Zrecord, cli, write_dataset


def test_info_verify_bench(tmp_path, capsys):
    write_dataset(tmp_path / "d", np.zeros((500, 64), np.uint8))
    assert cli.main(["info", str(tmp_path / "d")]) == 0
    out = capsys.readouterr().out
    assert "records       500" in out and "uint8" in out and "(64,)" in out and "ratio" in out
    assert cli.main(["verify", str(tmp_path / "d")]) == 0
    assert capsys.readouterr().out.startswith("ok")
    assert cli.main(["bench", str(tmp_path / "d"), "--batches", "20", "--batch-size", "16"]) == 0
    out = capsys.readouterr().out
    assert "p99.9" in out and "batches/s" in out


def test_convert_npy_and_loaderx(tmp_path, capsys):
    arr = np.arange(300, dtype=np.int32).reshape(100, 3)
    np.save(tmp_path / "a.npy", arr)
    assert cli.main(["convert", str(tmp_path / "a.npy"), str(tmp_path / "z"), "--codec", "raw"]) == 0
    with Dataset(tmp_path / "z") as ds:
        np.testing.assert_array_equal(ds[:], arr)
    try:
        import loaderx
    except Exception as exc:
        pytest.skip(f"loaderx not importable ({exc}); the loaderx half of convert is untested")
    loaderx.write_dataset(tmp_path / "lx", arr)
    assert cli.main(["convert", str(tmp_path / "lx"), str(tmp_path / "native")]) == 0
    with Dataset(tmp_path / "native") as ds:
        np.testing.assert_array_equal(ds[:], arr)


def test_compact(tmp_path, capsys):
    with Zrecord(tmp_path / "c", codec="raw") as z:
        z.append(np.zeros(4000, np.uint8), 100, 40)
        z.delete(list(range(0, 100, 2)))
    assert cli.main(["compact", str(tmp_path / "c")]) == 0
    with Zrecord(tmp_path / "c", readonly=True) as z:
        assert len(z) == 50
        assert z.stats()["reclaimable"] <= 40 * 50


def test_errors_give_exit_status(tmp_path, capsys):
    assert cli.main(["info", str(tmp_path / "missing")]) == 1
    assert "error:" in capsys.readouterr().err
    assert cli.main(["convert", str(tmp_path / "x.txt"), str(tmp_path / "y")]) == 1
    assert "x.txt does not exist" in capsys.readouterr().err


def test_compact_to_format_2_and_back(tmp_path, capsys):
    labels = np.arange(20_000, dtype=np.int64) * 3
    write_dataset(tmp_path / "l", labels, codec="raw", append=True)  # appends keep format 1
    with Zrecord(tmp_path / "l", readonly=True) as z:
        before = z.stats()
    assert before["table_format"] == 1 and before["table_bytes"] == 64 + 32 * 20_000
    assert cli.main(["compact", str(tmp_path / "l"), "--format", "2"]) == 0
    assert "table format 1 -> 2" in capsys.readouterr().out
    with Zrecord(tmp_path / "l", readonly=True) as z:
        after = z.stats()
        fp = z.fingerprint()
    # A header page and one page of block checksums (40 blocks of 512 labels).
    assert after["table_format"] == 2 and after["table_bytes"] == 2 * 4096
    assert after["live_bytes"] == before["live_bytes"] == 8 * 20_000
    with Dataset(tmp_path / "l") as ds:
        np.testing.assert_array_equal(ds[:], labels)
        np.testing.assert_array_equal(ds[[19_999, 0, 513]], labels[[19_999, 0, 513]])
    assert cli.main(["compact", str(tmp_path / "l"), "--format", "1"]) == 0
    with Zrecord(tmp_path / "l", readonly=True) as z:
        assert z.stats()["table_format"] == 1 and z.fingerprint() == fp
    with pytest.raises(SystemExit):
        cli.main(["compact", str(tmp_path / "l"), "--format", "3"])
    assert "--format" in capsys.readouterr().err
    with Zrecord(tmp_path / "l") as z:
        with pytest.raises(ValueError, match="format must be 1 or 2"):
            z.compact(format=3)


def _zring_cli(*argv):
    """The command as a user runs it: a fresh interpreter."""
    import sys

    return [sys.executable, "-m", "zring.cli", *map(str, argv)]


def test_ctrl_c_during_convert_prints_one_line_exits_130_and_leaves_nothing(tmp_path):
    # Ctrl-C printed a 20-line traceback. The conversion is made to wait for
    # good while reading its second file, a FIFO, once its store exists.
    import errno
    import os
    import signal
    import subprocess
    import time

    src = tmp_path / "src"
    src.mkdir()
    (src / "a.bin").write_bytes(b"x" * 100)
    os.mkfifo(src / "b.bin")
    proc = subprocess.Popen(_zring_cli("convert", src, tmp_path / "dst"), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    fd = None
    try:
        deadline = time.monotonic() + 60
        while fd is None:  # open the FIFO's other end once the command reads it
            try:
                fd = os.open(src / "b.bin", os.O_WRONLY | os.O_NONBLOCK)
            except OSError as e:
                if e.errno != errno.ENXIO or proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"the command never read the FIFO: {proc.communicate()}") from e
                time.sleep(0.01)
        proc.send_signal(signal.SIGINT)
        try:
            out, err = proc.communicate(timeout=5)
        except subprocess.TimeoutExpired:
            # The signal reached one of the engine's threads, not the one
            # blocked reading the FIFO: Python has noted it and raises it once
            # that read returns, which the FIFO's end of file makes it do.
            os.close(fd)
            fd = None
            out, err = proc.communicate(timeout=60)
    finally:
        if fd is not None:
            os.close(fd)
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert err == f"zring convert: interrupted; {tmp_path / 'dst'} was not created\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"], "the partial store is removed"


def test_a_closed_stdout_ends_quietly(tmp_path):
    # `zring info ... | head` ended in a BrokenPipeError traceback. The pipe's
    # read end is closed before the command starts, so every write finds it
    # closed.
    import os
    import subprocess

    write_dataset(tmp_path / "d", np.zeros((50, 8), np.uint8))
    for argv in (["info", tmp_path / "d"], ["bench", tmp_path / "d", "--batches", "5"]):
        r, w = os.pipe()
        os.close(r)
        try:
            proc = subprocess.run(_zring_cli(*argv), stdout=w, stderr=subprocess.PIPE, text=True, timeout=120)
        finally:
            os.close(w)
        assert proc.stderr == "", proc.stderr
        assert proc.returncode == cli.EXIT_BROKEN_PIPE


def test_errors_name_the_store_and_hint_at_the_store_meant(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_dataset("zr/image.zr", np.zeros((10, 4), np.uint8))
    write_dataset("zr/label.zr", np.arange(10))
    # convert wrote zr/image.zr; the user asks for zr/image.
    assert cli.main(["info", "zr/image"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "zr/image" in err and "(did you mean zr/image.zr?)" in err, err
    assert cli.main(["verify", "zr"]) == 1
    assert "zr is a directory of stores: zr/image.zr, zr/label.zr" in capsys.readouterr().err
    # A damaged head: the message named no store.
    write_dataset("bad", np.zeros((10, 4), np.uint8))
    head = bytearray((tmp_path / "bad" / "head.zr").read_bytes())
    head[20] ^= 1
    (tmp_path / "bad" / "head.zr").write_bytes(bytes(head))
    for command in ("info", "verify", "bench", "compact"):
        assert cli.main([command, "bad"]) == 1
        err = capsys.readouterr().err
        assert err.startswith("error: CorruptError: ") and "bad" in err and err.count("\n") == 1, err
    # compact of a mistyped path created an empty store there and succeeded.
    assert cli.main(["compact", "zr/imag.zr"]) == 1
    assert "zr/imag.zr is not a zring store" in capsys.readouterr().err
    assert not (tmp_path / "zr" / "imag.zr").exists()
    # Flags, not keyword arguments.
    assert cli.main(["convert", "zr/image.zr", "out", "--chunk-bytes", "0"]) == 1
    err = capsys.readouterr().err
    assert "--chunk-bytes must be positive" in err and "block_bytes" not in err, err


def test_info_counts_a_ragged_datasets_rows_as_tokens(tmp_path, capsys):
    from zring import write_ragged

    docs = [np.arange(n, dtype=np.uint16) for n in (5, 0, 17, 300)]
    write_ragged(tmp_path / "tok", docs, codec="zstd")
    assert cli.main(["info", str(tmp_path / "tok")]) == 0
    out = capsys.readouterr().out
    assert "rows (tokens) 322" in out and "records       4" in out, out
    write_dataset(tmp_path / "fixed", np.zeros((3, 4), np.float32))
    assert cli.main(["info", str(tmp_path / "fixed")]) == 0
    assert "rows (tokens)" not in capsys.readouterr().out


def test_a_folder_of_datasets_of_parts_names_them(tmp_path, capsys):
    # What `zring convert SRC DST --workers N` makes of Megatron partitions: DST/tokens.zr.
    from zring import parts

    root = tmp_path / "dst" / "tokens.zr"
    parts.commit(root, [parts.write_part(root, np.arange(6).reshape(3, 2))])
    assert cli.main(["info", str(tmp_path / "dst")]) == 1
    assert f"is a directory of stores: {root}" in capsys.readouterr().err
    assert cli.main(["info", str(tmp_path / "dst" / "tokens")]) == 1
    assert f"(did you mean {root}?)" in capsys.readouterr().err

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
    write_dataset(tmp_path / "l", labels, codec="raw")
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

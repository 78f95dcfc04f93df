"""Where token corpora live: Megatron-LM indexed datasets (.bin + .idx) and
HuggingFace tokenized Parquet convert into ragged token stores exactly, one
record per document, in the corpus's own dtype."""

import json
import struct
from pathlib import Path

import numpy as np
import pytest

import zring
from zring import cli

HEADER = b"MMIDIDX\x00\x00"
CODES = {np.uint8: 1, np.int8: 2, np.int16: 3, np.int32: 4, np.int64: 5, np.float64: 6, np.float32: 7,
         np.uint16: 8}


def write_megatron(prefix, documents, dtype, *, gap=0, modes=False):
    """A dataset written from the format's description (zring._megatron's
    docs), independently of megatron-core: `documents` is a list of lists of
    sequences; `gap` bytes of junk between sequences exercise pointers that
    are not back to back."""
    dtype = np.dtype(dtype)
    lengths, pointers, doc_index = [], [], [0]
    with open(f"{prefix}.bin", "wb") as f:
        for doc in documents:
            for seq in doc:
                pointers.append(f.tell())
                lengths.append(len(seq))
                f.write(np.asarray(seq, dtype).tobytes())
                f.write(b"\xee" * gap)
            doc_index.append(len(lengths))
    with open(f"{prefix}.idx", "wb") as f:
        f.write(HEADER + struct.pack("<QB", 1, CODES[dtype.type]))
        f.write(struct.pack("<QQ", len(lengths), len(doc_index)))
        f.write(np.asarray(lengths, "<i4").tobytes() + np.asarray(pointers, "<i8").tobytes())
        f.write(np.asarray(doc_index, "<i8").tobytes())
        if modes:
            f.write(np.zeros(len(lengths), np.int8).tobytes())


def corpus(rng, n, dtype, high):
    """`n` documents of 1-3 sequences of 0-300 tokens each (some empty)."""
    return [[rng.integers(0, high, size=int(rng.integers(0, 300)), dtype=dtype) for _ in range(int(rng.integers(1, 4)))]
            for _ in range(n)]


@pytest.mark.parametrize("dtype,high,gap", [(np.uint16, 65536, 0), (np.int32, 2**31 - 1, 0), (np.int32, 1000, 6)])
def test_megatron_documents_convert_byte_exact(tmp_path, dtype, high, gap):
    rng = np.random.default_rng(int(high) + gap)
    docs = corpus(rng, 700, dtype, high)
    docs[3] = []  # a document of no sequences
    write_megatron(tmp_path / "web_text_document", docs, dtype, gap=gap)
    # Small blocks: documents are appended a few at a time.
    counts = zring.convert(tmp_path / "web_text_document", tmp_path / "web", block_bytes=4096)
    assert counts == {"tokens": 700}
    with zring.RaggedDataset(tmp_path / "web" / "tokens.zr") as d:
        assert d.dtype == np.dtype(dtype) and len(d) == 700
        for i, doc in enumerate(docs):
            want = np.concatenate(doc) if doc else np.zeros(0, dtype)
            got = d[i]
            assert got.dtype == np.dtype(dtype) and got.tobytes() == want.astype(dtype).tobytes(), f"document {i}"


def test_the_cli_converts_a_megatron_prefix_or_its_idx_file(tmp_path, capsys):
    docs = corpus(np.random.default_rng(1), 50, np.uint16, 65536)
    write_megatron(tmp_path / "code", docs, np.uint16)
    assert cli.main(["convert", str(tmp_path / "code.idx"), str(tmp_path / "a")]) == 0
    assert cli.main(["convert", str(tmp_path / "code"), str(tmp_path / "b"), "--kind", "megatron"]) == 0
    for out in ("a", "b"):
        with zring.RaggedDataset(tmp_path / out / "tokens.zr") as d:
            assert len(d) == 50
            np.testing.assert_array_equal(d[49], np.concatenate(docs[49]))
    assert cli.main(["convert", str(tmp_path / "code"), str(tmp_path / "b")]) == 1
    assert "--overwrite" in capsys.readouterr().err


def test_bad_megatron_files_are_errors_naming_the_file(tmp_path, capsys):
    docs = corpus(np.random.default_rng(2), 20, np.int32, 100)
    write_megatron(tmp_path / "ok", docs, np.int32)
    idx = (tmp_path / "ok.idx").read_bytes()
    cases = {
        "truncated": (idx[:-5], "truncated or not a Megatron index"),
        "header": (b"NOTMEGA!!" + idx[9:], "is not a Megatron index"),
        "version": (idx[:9] + struct.pack("<Q", 2) + idx[17:], "version 2"),
        "dtype": (idx[:17] + bytes([9]) + idx[18:], "dtype code 9"),
    }
    for name, (data, match) in cases.items():
        (tmp_path / f"{name}.bin").write_bytes((tmp_path / "ok.bin").read_bytes())
        (tmp_path / f"{name}.idx").write_bytes(data)
        with pytest.raises(ValueError, match=match) as e:
            zring.convert(tmp_path / name, tmp_path / f"out-{name}")
        assert f"{name}.idx" in str(e.value)
        assert not (tmp_path / f"out-{name}").exists(), "nothing is left behind"
    # The .bin is shorter than the index says.
    (tmp_path / "short.idx").write_bytes(idx)
    (tmp_path / "short.bin").write_bytes((tmp_path / "ok.bin").read_bytes()[:-4])
    with pytest.raises(ValueError, match="short.idx: sequence .* of the .bin file"):
        zring.convert(tmp_path / "short", tmp_path / "out-short")
    write_megatron(tmp_path / "mm", docs, np.int32, modes=True)
    with pytest.raises(ValueError, match="multimodal"):
        zring.convert(tmp_path / "mm", tmp_path / "out-mm")
    (tmp_path / "half.idx").write_bytes(idx)
    assert cli.main(["convert", str(tmp_path / "half.idx"), str(tmp_path / "out-half")]) == 1
    err = capsys.readouterr().err
    assert "half.bin is missing" in err and "=" not in err.split("missing")[0].split("half")[0]


def test_an_offset_near_2_63_is_past_the_bin_not_wrapped_inside_it(tmp_path):
    """Issue 36: the bounds check summed offset and length in int64, so a
    sequence at byte 2**63 - 2 "ended" at a negative byte and passed."""
    docs = corpus(np.random.default_rng(5), 4, np.int32, 100)
    write_megatron(tmp_path / "ok", docs, np.int32)
    idx = bytearray((tmp_path / "ok.idx").read_bytes())
    sequences = struct.unpack_from("<Q", idx, 18)[0]
    pointers_at = 34 + 4 * sequences
    for ptr, length in ((2**63 - 2, 1), (2**63 - 1, 2**31 - 1), (2**62, 2**31 - 1)):
        struct.pack_into("<i", idx, 34, length)
        struct.pack_into("<q", idx, pointers_at, ptr)
        (tmp_path / "far.idx").write_bytes(bytes(idx))
        (tmp_path / "far.bin").write_bytes((tmp_path / "ok.bin").read_bytes())
        with pytest.raises(ValueError, match=f"far.idx: sequence 0 ends at byte {ptr + 4 * length} of the .bin"):
            zring.convert(tmp_path / "far", tmp_path / "out-far")
        assert not (tmp_path / "out-far").exists()


def test_scattered_sequences_convert_exactly(tmp_path):
    """Sequences written in one order and indexed in another (each
    document's pieces far apart in .bin): every document is its sequences'
    tokens in index order, through the vectorised gather, runs of back-to-back
    sequences and pieces larger than one gather included."""
    rng = np.random.default_rng(7)
    docs = corpus(rng, 400, np.uint16, 65536)
    docs.append([rng.integers(0, 65536, size=700_000, dtype=np.uint16)])  # 1.4 MB: past one gather
    seqs = [seq for doc in docs for seq in doc]
    # Sequences 0..39 stay back to back (runs of more than one sequence).
    rest = rng.permutation(len(seqs))
    order = np.concatenate([np.arange(40), rest[rest >= 40]])
    pointers = np.zeros(len(seqs), np.int64)
    with open(tmp_path / "sc.bin", "wb") as f:
        for k in order:
            pointers[k] = f.tell()
            f.write(np.asarray(seqs[k], np.uint16).tobytes())
    doc_index = np.concatenate([[0], np.cumsum([len(d) for d in docs])])
    with open(tmp_path / "sc.idx", "wb") as f:
        f.write(HEADER + struct.pack("<QB", 1, CODES[np.uint16]))
        f.write(struct.pack("<QQ", len(seqs), len(doc_index)))
        f.write(np.asarray([len(x) for x in seqs], "<i4").tobytes() + pointers.astype("<i8").tobytes())
        f.write(doc_index.astype("<i8").tobytes())
    zring.convert(tmp_path / "sc", tmp_path / "z", block_bytes=1 << 16)
    with zring.RaggedDataset(tmp_path / "z" / "tokens.zr") as d:
        assert len(d) == len(docs)
        for k, doc in enumerate(docs):
            want = np.concatenate(doc) if doc else np.zeros(0, np.uint16)
            assert d[k].tobytes() == want.astype(np.uint16).tobytes(), f"document {k}"


FIXTURES = Path(__file__).resolve().parent / "fixtures" / "megatron"


@pytest.mark.parametrize("name", ["uint16", "int32", "uint8", "int64", "float32"])
def test_megatron_core_files_convert_to_what_megatron_core_reads(tmp_path, name):
    """Files written by megatron-core's own IndexedDatasetBuilder (add_item
    and end_document, and add_document; empty sequences; documents of several
    sequences), committed as fixtures with what its IndexedDataset reads back
    from them (fixtures/megatron/make.py: megatron-core needs torch, several GB,
    which the tests do not install). zring's records are those documents,
    byte for byte, in the dtype megatron-core reads."""
    prefix = FIXTURES / f"mc_{name}"
    want = np.load(f"{prefix}.npz")
    tokens, starts = want["tokens"], want["starts"]
    assert str(want["megatron_core"]).startswith("0."), "made by megatron-core"
    for suffix in (".bin", ".idx"):
        (tmp_path / f"mc{suffix}").write_bytes(Path(f"{prefix}{suffix}").read_bytes())
    zring.convert(tmp_path / "mc", tmp_path / "z")
    with zring.RaggedDataset(tmp_path / "z" / "tokens.zr") as d:
        assert len(d) == len(starts) - 1 and d.dtype == tokens.dtype == np.dtype(name)
        for k in range(len(d)):
            assert d[k].tobytes() == tokens[starts[k]:starts[k + 1]].tobytes(), f"document {k}"


def test_huggingface_tokenized_parquet_keeps_dtypes_and_values(tmp_path):
    """Tokenized Parquet (list<int> columns, as HuggingFace datasets write
    input_ids) converts to ragged stores of the list's element type, every
    value exact, including each type's extremes and empty lists."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    rng = np.random.default_rng(4)
    n = 600
    cols, want = {}, {}
    for name, dtype, typ in (("u16", np.uint16, pa.list_(pa.uint16())), ("i32", np.int32, pa.list_(pa.int32())),
                             ("i64", np.int64, pa.large_list(pa.int64())), ("u32", np.uint32, pa.list_(pa.uint32()))):
        info = np.iinfo(dtype)
        rows = [rng.integers(info.min, info.max, size=int(rng.integers(0, 50)), dtype=dtype, endpoint=True)
                for _ in range(n)]
        rows[1] = np.array([info.min, info.max], dtype)
        rows[2] = np.zeros(0, dtype)
        cols[name] = pa.array(rows, type=typ)
        want[name] = (dtype, rows)
    pq.write_table(pa.table(cols), tmp_path / "tok.parquet", row_group_size=128)
    zring.convert(tmp_path / "tok.parquet", tmp_path / "tok")
    for name, (dtype, rows) in want.items():
        with zring.RaggedDataset(tmp_path / "tok" / f"{name}.zr") as d:
            assert d.dtype == np.dtype(dtype), name
            assert len(d) == n
            for i, row in enumerate(rows):
                assert d[i].dtype == np.dtype(dtype) and d[i].tobytes() == row.tobytes(), f"{name} row {i}"


def test_a_uint16_megatron_import_packs_with_int32_stores_without_a_rewrite(tmp_path):
    """A 0.6/0.3/0.1 mixture of a Megatron import (uint16, as Megatron writes
    vocabularies under 65,500) and two int32 stores packs as int32, each
    token widened as it is; delivering uint16 instead is an error naming
    the source whose token does not fit."""
    # Token j of Megatron document d is d * 300 + j (documents under 300 tokens).
    rng = np.random.default_rng(7)
    mega = [[np.arange(d * 300, d * 300 + int(rng.integers(1, 300)))] for d in range(200)]
    write_megatron(tmp_path / "mega_text_document", mega, np.uint16)
    zring.convert(tmp_path / "mega_text_document", tmp_path / "mega")
    others = []
    for k, base in enumerate((1 << 22, 1 << 23)):
        docs = [(base + d * 1000 + np.arange(int(rng.integers(1, 900)))).astype(np.int32) for d in range(300)]
        zring.write_ragged(tmp_path / f"hf{k}", docs)
        others.append(zring.RaggedDataset(tmp_path / f"hf{k}"))
    megatron = zring.RaggedDataset(tmp_path / "mega" / "tokens.zr")
    assert megatron.dtype == np.uint16 and others[0].dtype == np.int32
    mix = zring.mix([megatron, *others], [0.6, 0.3, 0.1])
    packed = zring.pack(mix, 128, labels=True, eod_id=-1)
    assert packed.dtype == np.int32
    rows = np.zeros(3)
    with zring.DataLoader(packed, batch_size=20, mode=2) as dl:
        for _ in range(30):
            b = next(dl)
            src = dl.last_sources
            tok, pos, seg = b["tokens"], b["positions"], b["segment_ids"]
            assert tok.dtype == np.int32 and b["labels"].dtype == np.int32
            real = tok != -1
            m = (src == 0)[:, None] & real
            assert np.array_equal(tok[m] % 300, pos[m]), "Megatron tokens widened as they are"
            for k, base in ((1, 1 << 22), (2, 1 << 23)):
                o = (src == k)[:, None] & real
                assert np.array_equal((tok[o] - base) % 1000, pos[o]), "int32 tokens kept"
            rows += np.bincount(src, minlength=3)
            assert np.all(seg > 0)
    assert np.allclose(rows / rows.sum(), [0.6, 0.3, 0.1], atol=0.01)
    with zring.DataLoader(zring.pack(mix, 128, dtype=np.uint16), batch_size=20, mode=2) as dl:
        with pytest.raises(zring.ZringError, match=r"source [12] \(.*hf[01]\): document \d+ holds the token \d+, which the delivered "
                                            r"uint16 tokens cannot hold"):
            for _ in range(5):
                next(dl)


def test_megatron_parquet_and_huggingface_corpora_are_named_one_way(tmp_path, capsys):
    """Every converted token corpus is a directory of stores DST/<column>.zr:
    the Megatron import's column is ``tokens``, and the CLI prints that
    path; a Megatron store converted by zring 0.2 (the store at DST itself)
    still opens where it is."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    docs = [[np.arange(d + 1, dtype=np.uint16)] for d in range(30)]
    write_megatron(tmp_path / "m", docs, np.uint16)
    assert zring.convert(tmp_path / "m", tmp_path / "mega") == {"tokens": 30}
    pq.write_table(pa.table({"input_ids": pa.array([np.concatenate(d) for d in docs], pa.list_(pa.uint16()))}),
                   tmp_path / "t.parquet")
    assert zring.convert(tmp_path / "t.parquet", tmp_path / "pq") == {"input_ids": 30}
    assert sorted(p.name for p in (tmp_path / "mega").iterdir()) == ["tokens.zr"]
    assert sorted(p.name for p in (tmp_path / "pq").iterdir()) == ["input_ids.zr"]
    with zring.RaggedDataset(tmp_path / "mega" / "tokens.zr") as a, \
            zring.RaggedDataset(tmp_path / "pq" / "input_ids.zr") as b:
        assert len(a) == len(b) == 30
        assert all(np.array_equal(a[i], b[i]) for i in range(30))
    assert cli.main(["convert", str(tmp_path / "m"), str(tmp_path / "cli")]) == 0
    assert f"{tmp_path / 'cli' / 'tokens.zr'}: 30 records" in capsys.readouterr().out
    # A zring 0.2 conversion: the same store, at DST itself.
    (tmp_path / "mega" / "tokens.zr").rename(tmp_path / "old")
    with zring.RaggedDataset(tmp_path / "old") as d:
        assert len(d) == 30 and np.array_equal(d[29], np.arange(30))


@pytest.mark.parametrize("to", [np.int32, np.int64, np.uint32])
def test_convert_dtype_widens_megatron_tokens_on_disk(tmp_path, to):
    """dtype= (--dtype) stores a uint16 Megatron import's tokens widened,
    every value the same, the source's dtype kept in the schema."""
    rng = np.random.default_rng(5)
    docs = corpus(rng, 80, np.uint16, 65536)
    write_megatron(tmp_path / "m", docs, np.uint16)
    assert zring.convert(tmp_path / "m", tmp_path / "w", dtype=to, block_bytes=512) == {"tokens": 80}
    with zring.RaggedDataset(tmp_path / "w" / "tokens.zr") as d:
        assert d.dtype == np.dtype(to)
        for i, doc in enumerate(docs):
            want = np.concatenate(doc) if doc else np.zeros(0, np.uint16)
            assert d[i].dtype == np.dtype(to) and np.array_equal(d[i], want.astype(np.int64)), f"document {i}"
    with zring.Store(tmp_path / "w" / "tokens.zr") as s:
        assert json.loads(s.schema())["converted_from"] == "uint16"


def test_convert_dtype_narrows_only_when_every_value_fits(tmp_path, capsys):
    """int32 tokens under 65,536 narrow to uint16; one token of 70,000 makes
    the narrowing an error naming the value, the file and the flag (in the
    CLI: --dtype), leaving nothing at DST. Parquet list columns narrow the
    same way and keep string columns' bytes."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    docs = [[np.arange(d * 100, d * 100 + 50, dtype=np.int32)] for d in range(40)]
    write_megatron(tmp_path / "small", docs, np.int32)
    zring.convert(tmp_path / "small", tmp_path / "u16", dtype="uint16")
    with zring.RaggedDataset(tmp_path / "u16" / "tokens.zr") as d:
        assert d.dtype == np.uint16 and np.array_equal(d[39], np.arange(3900, 3950))
    docs[17][0][3] = 70000
    write_megatron(tmp_path / "big", docs, np.int32)
    with pytest.raises(ValueError, match=r"70000.*uint16.*dtype=uint16.*wider") as e:
        zring.convert(tmp_path / "big", tmp_path / "bad", dtype=np.uint16, block_bytes=256)
    assert "big.bin" in str(e.value)
    assert not (tmp_path / "bad").exists()
    assert cli.main(["convert", str(tmp_path / "big"), str(tmp_path / "bad"), "--dtype", "uint16"]) == 1
    err = capsys.readouterr().err
    assert "--dtype uint16" in err and "70000" in err and "dtype=" not in err
    assert not (tmp_path / "bad").exists()

    rows = [np.arange(n, dtype=np.int64) * 1000 for n in range(1, 30)]
    pq.write_table(pa.table({"input_ids": pa.array(rows, pa.list_(pa.int64())),
                             "text": pa.array([f"doc {i}" for i in range(29)])}), tmp_path / "t.parquet",
                   row_group_size=8)
    zring.convert(tmp_path / "t.parquet", tmp_path / "pq", dtype=np.int32)
    with zring.RaggedDataset(tmp_path / "pq" / "input_ids.zr") as d, \
            zring.RaggedDataset(tmp_path / "pq" / "text.zr") as t:
        assert d.dtype == np.int32 and all(np.array_equal(d[i], rows[i]) for i in range(29))
        assert t.dtype == np.uint8 and bytes(t[7]) == b"doc 7"
    with pytest.raises(ValueError, match=r"column 'input_ids'.*dtype=uint8"):
        zring.convert(tmp_path / "t.parquet", tmp_path / "pq8", dtype=np.uint8)
    with pytest.raises(ValueError, match=r"dtype=.*numeric"):
        zring.convert(tmp_path / "small", tmp_path / "x", dtype="U3")
    np.save(tmp_path / "a.npy", np.arange(4))
    with pytest.raises(ValueError, match=r"npy source is stored as it is"):
        zring.convert(tmp_path / "a.npy", tmp_path / "x", dtype=np.int32)


def test_write_ragged_of_many_small_documents_over_many_blocks_is_exact(tmp_path):
    """write_ragged appends one block while it gathers the next: over many
    blocks every document lands in order, whatever form it comes in (views
    of one buffer, strided, big-endian, lists); an error in a later block
    (a value uint16 cannot hold) leaves nothing at the path."""
    rng = np.random.default_rng(11)
    flat = rng.integers(0, 60000, 200_000, dtype=np.uint16)
    ends = np.sort(rng.integers(0, len(flat), 5000))
    docs = [flat[a:b] for a, b in zip(np.concatenate([[0], ends[:-1]]), ends)]
    docs[10] = flat[:40:2]  # strided
    docs[11] = flat[40:60].astype(">u2")  # big-endian
    docs[12] = [1, 2, 3]  # a list
    docs[13] = flat[:0]  # empty
    n = zring.write_ragged(tmp_path / "d", docs, dtype=np.uint16, codec="raw", chunk_bytes=4096, progress=False)
    assert n == len(docs)
    with zring.RaggedDataset(tmp_path / "d") as d:
        assert len(d) == len(docs)
        for i, doc in enumerate(docs):
            assert np.array_equal(d[i], np.asarray(doc, dtype=np.int64)), f"document {i}"
    bad = list(docs)
    bad[3000] = np.array([70000])
    with pytest.raises(ValueError, match=r"array 3000.*70000"):
        zring.write_ragged(tmp_path / "e", bad, dtype=np.uint16, codec="raw", chunk_bytes=4096, progress=False)
    assert not (tmp_path / "e").exists()

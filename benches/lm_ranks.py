"""Four hosts pretraining on one corpus of real text: the balance of their
shares, the speed of the host that holds the longest documents, and a
validation split that does not depend on the host count.

The corpus: every text file (``.py``, ``.txt``, ``.rst``, ``.md``) of the
Python installation and the virtual environment, one document per file,
tokens its UTF-8 bytes (byte-level ``uint16`` tokens: real text, a
long-tailed length distribution), plus ``--long`` documents made of many
files end to end (``--long-tokens`` each, 5 M and up). Three sources, each
a dataset of parts written with ``zring.parts`` in ``--parts`` parts of
about one size in documents (so that placing by documents would pile the
long ones on one host): ``code`` (the ``.py`` files and the long documents),
``docs`` (the rest), ``more`` (a second half of the ``.py`` files). Each
host holds only its own parts: a folder per rank, copied from what ``zring
parts --ranks 4 --rank K`` lists.

Reported, for ``--codec zstd`` and ``raw`` in turn:

* each rank's tokens of each source (from the manifest: ``rank_balance``),
  the spread against the largest rank, and against the largest part;
* each rank's packed tokens/s (``zring.pack`` of a 0.5/0.3/0.2 mixture of
  its three shares, 2,048 tokens a row, 8 rows a step, mode 2, 2 workers),
  one rank at a time in a process of its own, ``--secs`` seconds after a
  warm-up; the rank holding the longest document against the median of
  the others;
* a 969/30/1 split of ``code``: the ranks' validation records together
  against the whole dataset's, with 4 ranks and with 2.

    python benches/lm_ranks.py [--long 2] [--long-tokens 6000000] [--parts 24] [--secs 4]

Data in ``$ZRING_BENCH_DIR/lm_ranks`` (default ``bench-data/lm_ranks``); the
result goes to ``bench-results/lm-ranks.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

import zring  # noqa: E402
from zring import cli, parts  # noqa: E402
from zring._split import whole_positions  # noqa: E402

RANKS = 4
SOURCES = ("code", "docs", "more")
WEIGHTS = (0.5, 0.3, 0.2)


def text_files() -> list[Path]:
    roots = {Path(sysconfig.get_paths()["stdlib"]), Path(sysconfig.get_paths()["purelib"])}
    out = []
    for r in sorted(roots):
        for p in sorted(r.rglob("*")):
            if p.suffix in (".py", ".txt", ".rst", ".md") and p.is_file() and not p.is_symlink():
                out.append(p)
    return out


def tokens_of(p: Path) -> np.ndarray:
    return np.frombuffer(p.read_bytes(), np.uint8).astype(np.uint16)


def write_corpus(root: Path, codec: str, n_parts: int, n_long: int, long_tokens: int) -> dict[str, list[int]]:
    """The three sources; returns each source's document lengths."""
    files = text_files()
    py = [f for f in files if f.suffix == ".py"]
    rest = [f for f in files if f.suffix != ".py"]
    code_files, more_files = py[0::2], py[1::2]
    docs: dict[str, list[np.ndarray]] = {}
    docs["code"] = [tokens_of(f) for f in code_files]
    # The long documents: files end to end until each holds long_tokens.
    pool = iter(more_files * 50)
    for k in range(n_long):
        want = long_tokens * (1 + k // 2) if k else long_tokens * 3 // 2
        chunks, have = [], 0
        while have < want:
            t = tokens_of(next(pool))
            chunks.append(t)
            have += t.size
        docs["code"].append(np.concatenate(chunks)[:want])
    docs["docs"] = [tokens_of(f) for f in rest]
    docs["more"] = [tokens_of(f) for f in more_files]
    rng = np.random.default_rng(0)
    lengths = {}
    for name, ds in docs.items():
        order = rng.permutation(len(ds))
        d = root / f"{name}.zr"
        # Parts of about one size in documents, in a shuffled order.
        chunks = np.array_split(order, n_parts)
        parts.commit(d, [parts.write_part(d, [ds[i] for i in c], codec=codec) for c in chunks])
        lengths[name] = [int(ds[i].size) for c in chunks for i in c]
    return lengths


def host_folder(root: Path, host: Path, rank: int) -> None:
    """Rank ``rank``'s folder: what ``zring parts --rank`` lists, copied."""
    for name in SOURCES:
        src, dst = root / f"{name}.zr", host / f"{name}.zr"
        listed = parts.rank_plan(src, RANKS)[rank]
        dst.mkdir(parents=True)
        shutil.copy(src / "manifest.json", dst / "manifest.json")
        for d in listed:
            shutil.copytree(src / d, dst / d)


CHILD = r"""
import json, sys, time
import zring
host, rank, secs = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
srcs = [zring.RaggedDataset(f"{host}/{n}.zr", rank_parts=(rank, 4)) for n in ("code", "docs", "more")]
mix = zring.mix(srcs, [0.5, 0.3, 0.2])
with zring.DataLoader(zring.pack(mix, 2048), batch_size=8, mode=2, seed=1, num_workers=2) as dl:
    t = time.perf_counter()
    while time.perf_counter() - t < 1.0:
        next(dl)
    n, t = 0, time.perf_counter()
    while time.perf_counter() - t < secs:
        n += next(dl)["tokens"].size
    print(json.dumps({"tokens_per_s": n / (time.perf_counter() - t)}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--long", type=int, default=2)
    ap.add_argument("--long-tokens", type=int, default=6_000_000)
    ap.add_argument("--parts", type=int, default=24)
    ap.add_argument("--secs", type=float, default=4.0)
    a = ap.parse_args()
    base = Path(os.environ.get("ZRING_BENCH_DIR", common.REPO / "bench-data")) / "lm_ranks"
    base.mkdir(parents=True, exist_ok=True)
    out = ["# Four hosts on one corpus of real text: balance, the long documents' host, global splits\n",
           f"`python benches/lm_ranks.py --long {a.long} --long-tokens {a.long_tokens} --parts {a.parts} "
           f"--secs {a.secs:g}`\n", common.machine(base), ""]
    for codec in ("zstd", "raw"):
        root = base / codec
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
        lengths = write_corpus(root / "corpus", codec, a.parts, a.long, a.long_tokens)
        hosts = [root / f"host{k}" for k in range(RANKS)]
        for k, h in enumerate(hosts):
            host_folder(root / "corpus", h, k)
        total = sum(sum(v) for v in lengths.values())
        longest = max(lengths["code"])
        out.append(f"## {codec}\n")
        out.append(f"{total / 1e6:.1f} M tokens in {sum(len(v) for v in lengths.values()):,} documents; the longest "
                   f"{longest / 1e6:.2f} M tokens; median {statistics.median(lengths['code']):,.0f}.\n")
        # Balance, from the manifests.
        out += ["| rank | " + " | ".join(f"{s} (M tokens)" for s in SOURCES) + " | all (M tokens) |",
                "|---:|" + "---:|" * (len(SOURCES) + 1)]
        per = {s: [b["bytes"] // 2 for b in parts.rank_balance(root / "corpus" / f"{s}.zr", RANKS)] for s in SOURCES}
        for k in range(RANKS):
            out.append(f"| {k} | " + " | ".join(f"{per[s][k] / 1e6:.2f}" for s in SOURCES)
                       + f" | {sum(per[s][k] for s in SOURCES) / 1e6:.2f} |")
        lines = []
        for s in SOURCES:
            toks = per[s]
            biggest_part = max(_part_tokens(root / "corpus" / f"{s}.zr"))
            lines.append(f"{s}: spread {(max(toks) - min(toks)) / max(toks):.1%} of the largest rank; "
                         f"{(max(toks) - min(toks)) / biggest_part:.2f} of the largest part")
        out.append("\n" + "; ".join(lines) + ".\n")
        # Which rank holds the longest document.
        long_rank = None
        with zring.RaggedDataset(root / "corpus" / "code.zr") as whole:
            lens = [int(n) for n in whole._s.lengths(np.arange(len(whole), dtype=np.uint64))]
        long_index = int(np.argmax(lens))
        for k in range(RANKS):
            with zring.RaggedDataset(hosts[k] / "code.zr", rank_parts=(k, RANKS)) as mine:
                if long_index in set(whole_positions(mine).tolist()):
                    long_rank = k
        # Speed, one rank at a time.
        speeds = []
        for k in range(RANKS):
            r = subprocess.run([sys.executable, "-c", CHILD, str(hosts[k]), str(k), str(a.secs)],
                               capture_output=True, text=True, check=True)
            speeds.append(json.loads(r.stdout.strip().splitlines()[-1])["tokens_per_s"])
            common.note(f"{codec} rank {k}: {speeds[-1] / 1e6:.1f} M tokens/s")
        others = statistics.median([v for k, v in enumerate(speeds) if k != long_rank])
        out += ["| rank | packed tokens/s (M) | holds the longest document |", "|---:|---:|---|"]
        for k, v in enumerate(speeds):
            out.append(f"| {k} | {v / 1e6:.1f} | {'yes' if k == long_rank else ''} |")
        out.append(f"\nThe longest document's rank: **{speeds[long_rank] / others:.2f}x** the median of the others.\n")
        # Global splits.
        with zring.RaggedDataset(root / "corpus" / "code.zr") as whole:
            want = set(zring.split(whole, "969,30,1")[1].records.tolist())
        res = []
        for ranks in (4, 2):
            got: set[int] = set()
            for k in range(ranks):
                with zring.RaggedDataset(root / "corpus" / "code.zr", rank_parts=(k, ranks)) as mine:
                    v = zring.split(mine, "969,30,1")[1]
                    got |= set(whole_positions(mine)[v.records.astype(np.int64)].tolist())
            res.append(f"{ranks} ranks: {'equal' if got == want else 'DIFFERENT'} ({len(got)} of {len(want)})")
        out.append("Validation part of a 969/30/1 split of `code`, the ranks' together against the whole "
                   "dataset's: " + "; ".join(res) + ".\n")
    # Host tooling on host 1's folder, and on host 2's asked for as rank 1.
    h1, h2 = base / "raw" / "host1" / "code.zr", base / "raw" / "host2" / "code.zr"
    rc = [cli.main(["verify", str(h1), "--ranks", "4", "--rank", "1"]),
          cli.main(["info", str(h1), "--ranks", "4", "--rank", "1"]),
          cli.main(["verify", str(h2), "--ranks", "4", "--rank", "1"])]
    out.append(f"`zring verify/info --ranks 4 --rank 1` on host 1's folder: exit {rc[0]}/{rc[1]}; "
               f"`zring verify --ranks 4 --rank 1` on host 2's folder: exit {rc[2]} (it names rank 2).\n")
    text = "\n".join(out)
    print(text)
    common.write_result(common.REPO / "bench-results" / "lm-ranks.md", text)


def _part_tokens(dataset: Path) -> list[int]:
    m = json.loads((dataset / "manifest.json").read_text())
    return [int(p.get("bytes", 0)) // 2 for p in m["parts"]]


if __name__ == "__main__":
    main()

"""Mixture benchmark: zring.mix in the Rust loader against the plain loader.

Hot data (every store in the page cache), one process, one run, rounds
interleaved; per codec (raw, zstd) of 12 KiB records:

* batch 256: the plain DataLoader over source 0 and over one store as large
  as the mixture; a mixture of two sources (0.7/0.3); the same over two
  sources of prime lengths; and, when the git history has it, the Python
  mixture loader this one replaced (``zring._mix.MixLoader`` at commit
  b073426, loaded from git) over the same two sources;
* batch 1024: the plain DataLoader over source 0 and over one store as
  large as the mixture, and a mixture of 100 sources (weights from 0.001 to
  0.5; 99 sources of 1,021 records, a prime).

Every loader: 2 workers, prefetch 4, cyclic. Reported: batches/s (median of
the rounds), p50/p99 of ``next()``, and the ratios to the plain loader of
the same batch size over the same number of records (a data footprint as
large as the mixture's) and over source 0 alone; the ceiling is memcpy (raw) or zstd decoding (zstd) of the
same records on every core, when the extension was built with the bench
feature (``make develop-bench``).

``--cgroup`` adds the record cache's hit rate for a mixture larger than
memory: one process, then 4 ranks (each its shard of every batch), reading
``zring.mix`` of two raw stores (0.7/0.3, iid, batch 256) in a memory cgroup
of ``budget/dataset`` times their bytes, the page cache dropped first,
default read policy against forced O_DIRECT (benches/host.py's machinery;
root only).

    python benches/mix.py --secs 3 --rounds 3 [--cgroup --gib 6]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import types
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
import compare  # noqa: E402  (the 12 KiB tiles of every benchmark)

import zring  # noqa: E402

REPO = common.REPO
RECORD = 12288
LOADER = dict(num_workers=2, prefetch_size=4, mode=2, seed=0)
SMALL = 1021  # records of each of the 99 small sources (a prime)
SIZES = {"s0": 16384, "s1": 8192, "p0": 16381, "p1": 8191,
         # One store as large as each mixture: the plain loader's reference
         # of the same data footprint (page tables and caches see the whole
         # mixture; measured: the plain loader reads a 1.4 GB store 0.87x as
         # fast as a 192 MB one).
         "all2": 16384 + 8192, "all100": 16384 + 99 * SMALL}
MIB = 1 << 20


def ensure(root: Path, codec: str) -> dict[str, Path]:
    """The stores of one codec: s0, s1, p0, p1 and m1..m99 (written once)."""
    out = {}
    wanted = dict(SIZES, **{f"m{k}": SMALL for k in range(1, 100)})
    tiles = compare.make_records(max(wanted.values()))
    for name, n in wanted.items():
        p = root / codec / name
        out[name] = p
        if p.is_dir() and (root / codec / f"{name}.complete").exists():
            continue
        p.parent.mkdir(parents=True, exist_ok=True)
        zring.write_dataset(str(p), tiles[:n], codec=codec, overwrite=True)
        (root / codec / f"{name}.complete").write_text("ok")
    return out


def warm(paths) -> None:
    """Reads every file of the stores once, so the page cache holds them."""
    for p in paths:
        for f in Path(p).rglob("*"):
            if f.is_file():
                with open(f, "rb") as fh:
                    while fh.read(1 << 24):
                        pass


def old_mix_module():
    """The Python mixture loader this one replaced, from git (or None)."""
    try:
        src = subprocess.run(["git", "show", "b073426:py/python/zring/_mix.py"], cwd=REPO, check=True,
                             capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError):
        common.note("git history without commit b073426: no row for the Python mixture loader")
        return None
    src = (src.replace("from . import _util", "from zring import _util")
              .replace("from ._sampler import Sampler", "from zring._sampler import Sampler")
              .replace("from .dataset import", "from zring.dataset import"))
    mod = types.ModuleType("zring_mix_before")
    exec(compile(src, "zring_mix_before", "exec"), mod.__dict__)  # noqa: S102  (our own earlier source)
    return mod


def measure(make, secs: float) -> dict:
    """batches/s and next() percentiles of the loader ``make()`` builds."""
    dl = make()
    try:
        for _ in range(10):
            next(dl)
        lat = []
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < secs:
            s = time.perf_counter()
            next(dl)
            lat.append(time.perf_counter() - s)
        el = time.perf_counter() - t0
    finally:
        dl.close()
    lat.sort()
    return {"per_s": len(lat) / el, "p50_us": lat[len(lat) // 2] * 1e6, "p99_us": lat[int(len(lat) * 0.99)] * 1e6}


def contenders(st: dict[str, Path], old) -> list[tuple[str, int, str, object]]:
    ds = {k: zring.Dataset(str(p)) for k, p in st.items()}

    def plain(b):
        return lambda: zring.DataLoader({"x": ds["s0"]}, batch_size=b, **LOADER)

    def mixed(names, weights, b):
        return lambda: zring.DataLoader(zring.mix([{"x": ds[n]} for n in names], weights), batch_size=b, **LOADER)

    w100 = [0.5] + list(np.random.default_rng(0).permutation(np.linspace(0.001, 1 / 99 - 0.001, 99)))
    def whole(name, b):
        return lambda: zring.DataLoader({"x": ds[name]}, batch_size=b, **LOADER)

    rows = [
        ("plain loader, source 0 (16,384 records)", 256, "ref", plain(256)),
        ("plain loader, one store of 24,576 records", 256, "plain", whole("all2", 256)),
        ("mix of 2 (0.7/0.3)", 256, "mix", mixed(["s0", "s1"], [0.7, 0.3], 256)),
        ("mix of 2, prime lengths (16,381 / 8,191)", 256, "mix", mixed(["p0", "p1"], [0.7, 0.3], 256)),
    ]
    if old is not None:
        rows.append(("before: Python mix of 2 (0.7/0.3)", 256, "mix",
                     lambda: old.MixLoader(old.Mixture([{"x": ds["s0"]}, {"x": ds["s1"]}], [0.7, 0.3]),
                                           batch_size=256, **LOADER)))
        rows.append(("before: Python mix of 2, prime lengths", 256, "mix",
                     lambda: old.MixLoader(old.Mixture([{"x": ds["p0"]}, {"x": ds["p1"]}], [0.7, 0.3]),
                                           batch_size=256, **LOADER)))
    rows += [
        ("plain loader, source 0 (16,384 records)", 1024, "ref", plain(1024)),
        ("plain loader, one store of 117,463 records", 1024, "plain", whole("all100", 1024)),
        ("mix of 100 (0.5, 99 × 0.001–0.0091)", 1024, "mix",
         mixed(["s0"] + [f"m{k}" for k in range(1, 100)], w100, 1024)),
    ]
    return rows


def ceiling(codec: str) -> float | None:
    """MiB/s of the codec (or memcpy) alone on every core over the same tiles."""
    fn = getattr(zring._zring, "ceiling", None)
    if fn is None:
        common.note("the extension was built without the bench feature (make develop-bench): no ceiling")
        return None
    tiles = compare.make_records(4096).reshape(-1)
    return fn("memcpy" if codec == "raw" else "decode", tiles, RECORD, os.cpu_count() or 1)


def hot(root: Path, secs: float, rounds: int) -> str:
    old = old_mix_module()
    out = []
    for codec in ("raw", "zstd"):
        st = ensure(root, codec)
        warm(st.values())
        rows = contenders(st, old)
        res: dict[int, list[dict]] = {i: [] for i in range(len(rows))}
        for r in range(rounds):
            for i, (name, b, _, make) in enumerate(rows):
                # The Python loader on prime lengths is slow: one round only.
                if name.startswith("before") and "prime" in name and r > 0:
                    continue
                res[i].append(measure(make, secs))
                print(f"  {codec} round {r}: {name}, batch {b}: {res[i][-1]['per_s']:.0f} batches/s",
                      file=sys.stderr, flush=True)
        ceil = ceiling(codec)
        out.append(f"### {codec} 12 KiB records\n")
        out.append("| loader | batch | batches/s | MiB/s | ÷ plain loader, same records | ÷ plain loader, source 0 "
                   "| ÷ ceiling | p50 next() µs | p99 next() µs |")
        out.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
        med = {}
        for i in res:
            runs = sorted(res[i], key=lambda x: x["per_s"])
            med[i] = runs[len(runs) // 2]
        for i, (name, b, kind, _) in enumerate(rows):
            m = med[i]
            same = next(med[j]["per_s"] for j, r in enumerate(rows) if r[1] == b and r[2] == "plain")
            ref = next(med[j]["per_s"] for j, r in enumerate(rows) if r[1] == b and r[2] == "ref")
            mib = m["per_s"] * b * RECORD / MIB
            c = f"{mib / ceil:.2f}" if ceil else "-"
            out.append(f"| {name} | {b} | {m['per_s']:.0f} | {mib:.0f} | **{m['per_s'] / same:.2f}** | "
                       f"{m['per_s'] / ref:.2f} | {c} | {m['p50_us']:.0f} | {m['p99_us']:.0f} |")
        if ceil:
            out.append(f"\nCeiling: {'memcpy' if codec == 'raw' else 'zstd decoding'} of the same tiles on "
                       f"{os.cpu_count()} threads, {ceil:.0f} MiB/s.\n")
        out.append("")
    return "\n".join(out)


def cgroup_rows(gib: float, secs: float, budgets: list[float]) -> str:
    """The mixture's record-cache hit rate in a memory cgroup (module docs)."""
    import host

    if os.geteuid() != 0:
        common.note("not root: no cgroup rows")
        return ""
    cgs = common.Cgroups()
    try:
        data = Path(os.environ.get("ZRING_BENCH_DIR", REPO / "bench-data")) / "host"
        paths = host.ensure_data(data, gib, 2)
        data_bytes = int(gib * (1 << 30)) // RECORD * RECORD
        lines = ["| processes | budget/dataset | limit MiB | default MiB/s | forced O_DIRECT MiB/s | default ÷ O_DIRECT | "
                 "record-cache hit rate (default) | policy |", "|---:|---:|---:|---:|---:|---:|---:|---|"]
        seq = 0
        for ranks, ratio in [(r, b) for r in (1, 4) for b in budgets]:
            res = {}
            for col in ("default", "direct"):
                seq += 1
                res[col] = host.run(cgs, seq, paths, ranks, int(data_bytes * ratio), col, secs, mix=[0.7, 0.3])
            d, o = res["default"], res["direct"]
            hits = misses = 0
            for rank in d["stats"]:
                for s in rank:
                    for st in s["reads"].values():
                        hits += st["cache_hits"]
                        misses += st["cache_misses"]
            rate = hits / (hits + misses) if hits + misses else float("nan")
            div = f"{d['mib_s'] / o['mib_s']:.2f}" if d["mib_s"] and o["mib_s"] else "-"
            lines.append(f"| {ranks} | {ratio:g} | {d['limit'] / MIB:.0f} | {host.cell(d)} | {host.cell(o)} | {div} | "
                         f"**{rate:.2f}** | {host.policy(d)} |")
            print("  " + lines[-1], file=sys.stderr, flush=True)
        return (f"### A mixture larger than memory (iid, memory cgroup)\n\n"
                f"`zring.mix` of two raw stores of {gib / 2:g} GiB each (0.7/0.3), batch 256, 2 workers, prefetch "
                f"4, iid; one process, or 4 ranks in one cgroup each reading its shard of every batch (summed "
                f"MiB/s); {secs:g} s per run, page cache dropped first; hit rate over the whole run (cold start "
                f"included).\n\n" + "\n".join(lines) + "\n")
    finally:
        cgs.cleanup()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--secs", type=float, default=3.0, help="seconds per measurement")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cgroup", action="store_true", help="add the cgroup hit-rate rows (root)")
    ap.add_argument("--skip-hot", action="store_true", help="only the cgroup rows (written to mix-cgroup.md)")
    ap.add_argument("--gib", type=float, default=6.0, help="data of the cgroup rows")
    ap.add_argument("--cgroup-secs", type=float, default=30.0)
    ap.add_argument("--budgets", default="0.5,0.33")
    ap.add_argument("--out", type=Path, default=REPO / "bench-results")
    args = ap.parse_args()
    root = Path(os.environ.get("ZRING_BENCH_DIR", REPO / "bench-data")) / "mix"
    if str(root.resolve()).startswith("/tmp"):
        raise SystemExit("the benchmark data must not live in /tmp (it may be memory)")
    t0 = time.perf_counter()
    body = "" if args.skip_hot else hot(root, args.secs, args.rounds)
    if args.cgroup:
        body += "\n" + cgroup_rows(args.gib, args.cgroup_secs, [float(x) for x in args.budgets.split(",")])
    what = ("" if args.skip_hot else
            f"; loaders: 2 workers, prefetch 4, cyclic, hot page cache; median of {args.rounds} interleaved rounds "
            f"of {args.secs:g} s")
    head = (f"## Mixtures\n\n`python benches/mix.py --secs {args.secs:g} --rounds {args.rounds}"
            f"{' --cgroup' if args.cgroup else ''}{' --skip-hot' if args.skip_hot else ''}`: {common.machine(root)}; "
            f"{common.versions(('zring', 'numpy'))}{what}; {time.perf_counter() - t0:.0f} s in all.\n\n")
    notes = "".join(f"- {n}\n" for n in common.notes)
    text = head + body + ("\nNotes:\n" + notes if notes else "")
    print(text)
    args.out.mkdir(exist_ok=True)
    name = "mix-cgroup" if args.skip_hot else "mix"
    common.write_result(args.out / f"{name}.md", text)
    (args.out / f"{name}.json").write_text(json.dumps({"text": text}, indent=1))


if __name__ == "__main__":
    main()

"""Hot reads against loaderx 0.7.3, and the machine's ceilings, in one run.

The data sits in the page cache; rounds interleave the contenders so the
machine's drift hits them alike. Per round and contender:

* gather: ``Dataset.__getitems__`` of 256 random 12 KiB records (the same
  index batches for every contender), raw and zstd, for ``--secs`` seconds;
  zring verifies every record's checksum (loaderx keeps none);
* DataLoader: zstd 12 KiB records plus an int64 label, batch 256, 2
  workers, prefetch 4, cyclic; the same with a NumPy augmentation as the
  transform (``transform_bench.augment``: a random horizontal flip, then
  uint8 to normalised float32); and, an extra row that is *not* the same
  codec, zring's ``zstd_dict`` store (a dictionary trained on the records,
  level 3) against loaderx's plain zstd.

The ceiling of the transform rows is the decode ceiling plus the transform's
own cost: ``cores / (CPU-s to decode a batch at the decode ceiling + CPU-s
of one augment call on one thread)`` batches/s, both measured in every round.

Reported: medians over the rounds, zring ÷ loaderx (of the medians, and round by
round: each round's pair, so drift between rounds cancels), and each figure ÷ the
ceiling of the same work on every core with no store at all (memcpy plus
CRC-32C in one pass as the engine does it, zstd decoding;
``zring._zring.ceiling``, built by ``make develop-bench``), plus memcpy
alone, the checksum alone, memcpy then the checksum in a second pass, and
each contender's per-record metadata on disk. Beside each rate, the
process's CPU-seconds (user + system, every thread) per GiB delivered over
the timed run, and each ceiling's (its threads' time per GiB: the floor).

    python benches/hot.py --secs 2 --rounds 5
    perf record -g -o hot.perf -- python benches/hot.py --profile 2000
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
import compare  # noqa: E402  (the 12 KiB tiles and helpers of every benchmark)
import transform_bench  # noqa: E402  (its NumPy augmentation)

import zring  # noqa: E402

REPO = common.REPO
RECORD = 12288
BATCH = 256
MIB = 1 << 20


def stores(root: Path, n: int) -> dict[str, Path]:
    """zring and loaderx stores of the same tiles (raw, zstd) and labels."""
    import loaderx

    tiles = None
    out = {}
    for lib, mod in (("zring", zring), ("loaderx", loaderx)):
        kinds = (("raw", "raw"), ("zstd", "zstd"), ("label", "raw"))
        if lib == "zring":
            kinds += (("zstd_dict", "zstd_dict"),)
        for what, codec in kinds:
            p = root / f"{lib}-{what}-{n}"
            out[f"{lib} {what}"] = p
            if (root / f"{p.name}.complete").exists():
                continue
            if tiles is None:
                tiles = compare.make_records(n)
            compare.rm(p)
            mod.write_dataset(str(p), np.arange(n, dtype=np.int64) if what == "label" else tiles, codec=codec)
            (root / f"{p.name}.complete").write_text("ok")
    return out


def payload_bytes(n: int, what: str) -> int:
    return n * (8 if what == "label" else RECORD)


def refaulted() -> int:
    """Page-cache pages the machine has read back after evicting them."""
    try:
        with open("/proc/vmstat") as f:
            return next((int(v) for k, v in (line.split() for line in f) if k == "workingset_refault_file"), 0)
    except OSError:
        return 0


def cpu_seconds() -> float:
    """User plus system CPU-seconds of this process so far, every thread."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


#: CPU-seconds per GiB delivered of each timed run, by key ([`timed`]).
cpu_per_gib: dict[str, list[float]] = {}


def gather_rate(g, batches: list[np.ndarray], secs: float) -> tuple[float, float]:
    """MiB/s of ``g`` over the batches, cycling, for ``secs`` seconds, and the
    process's CPU-seconds per GiB over them."""
    g(batches[0])
    done = 0
    c0 = cpu_seconds()
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < secs:
        g(batches[done % len(batches)])
        done += 1
    gib = done * BATCH * RECORD / (1 << 30)
    return gib * 1024 / (time.perf_counter() - t0), (cpu_seconds() - c0) / gib


def loader_rate(lib, data: Path, label: Path, secs: float, augmented: bool = False) -> float:
    kw = {}
    if augmented:
        rng = np.random.default_rng(0)
        kw["transform"] = lambda b: transform_bench.augment(b, rng)
    dl = lib.DataLoader({"data": lib.Dataset(str(data)), "label": lib.Dataset(str(label))}, batch_size=BATCH,
                        num_workers=2, prefetch_size=4, mode=2, seed=0, **kw)
    try:
        for _ in range(10):
            next(dl)
        done = 0
        c0 = cpu_seconds()
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < secs:
            next(dl)
            done += 1
        # Decoded bytes delivered: the records and their labels.
        gib = done * BATCH * (RECORD + 8) / (1 << 30)
        return done / (time.perf_counter() - t0), (cpu_seconds() - c0) / gib
    finally:
        dl.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--secs", type=float, default=2.0)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--records", type=int, default=16384)
    ap.add_argument("--out", type=Path, default=REPO / "bench-results")
    ap.add_argument("--profile", type=int, metavar="N",
                    help="only N of zring's hot raw gathers and their MiB/s: for perf record, or to compare builds")
    args = ap.parse_args()
    import loaderx

    root = Path(os.environ.get("ZRING_BENCH_DIR", REPO / "bench-data")) / "hot"
    root.mkdir(parents=True, exist_ok=True)
    n = args.records
    paths = stores(root, n)
    batches = compare.index_batches(n, 2000)
    if args.profile:
        compare.warm(paths["zring raw"])
        g = zring.Dataset(str(paths["zring raw"])).__getitems__
        t = time.perf_counter()
        for k in range(args.profile):
            g(batches[k % len(batches)])
        print(f"{args.profile * BATCH * RECORD / MIB / (time.perf_counter() - t):.0f} MiB/s")
        return
    libs = {"zring": zring, "loaderx": loaderx}
    gathers = {f"{lib} {codec}": libs[lib].Dataset(str(paths[f"{lib} {codec}"])).__getitems__
               for lib in libs for codec in ("raw", "zstd")}
    res: dict[str, list[float]] = {}
    refaults: dict[str, int] = {}

    def timed(key: str, warm: list[Path], run) -> None:
        # Warmed again right before its run: a host may page out idle page
        # cache on its own (DAMON's pageout in a VM), and a "hot" figure must
        # not time disk reads. Pages read back during the run are counted.
        for p in warm:
            compare.warm(p)
        before = refaulted()
        rate, cpu = run()
        res.setdefault(key, []).append(rate)
        cpu_per_gib.setdefault(key, []).append(cpu)
        refaults[key] = refaults.get(key, 0) + refaulted() - before

    cores = os.cpu_count() or 1
    fn = getattr(zring._zring, "ceiling", None)
    if fn is None:
        common.note("the extension was built without the bench feature (make develop-bench): no ceilings")
    flat = compare.make_records(4096).reshape(-1)
    kinds = ["memcpy", "crc", "memcpy then crc", "memcpy+crc", "decode"]
    ceils: dict[str, list[float]] = {}
    ceil_share: dict[str, list[float]] = {}  # cores busy during each ceiling's call
    aug_s: list[float] = []  # CPU-s of one augment call, per round
    for r in range(args.rounds):
        # The ceilings too, in every round: one measurement at the end
        # would meet other weather than the contenders did.
        for kind in list(kinds) if fn else []:
            try:
                # Its CPU per GiB from the process's CPU time meanwhile (on a
                # shared machine the wall clock also counts others' work).
                c0, t0 = cpu_seconds(), time.perf_counter()
                ceils.setdefault(kind, []).append(fn(kind, flat, RECORD, cores))
                ceil_share.setdefault(kind, []).append((cpu_seconds() - c0) / (time.perf_counter() - t0))
            except ValueError as e:  # an older build
                common.note(f"no {kind} ceiling: {e}")
                kinds.remove(kind)
        # Which library goes first alternates from round to round, so a
        # trend in the host's load does not favour one of them.
        order = list(libs) if r % 2 == 0 else list(libs)[::-1]
        for codec in ("raw", "zstd"):
            for lib in order:
                name = f"{lib} {codec}"
                g = gathers[name]
                timed(f"gather {name}", [paths[name]], lambda: gather_rate(g, batches, args.secs))
        if fn:
            # One augment call on one thread, CPU time (the transform's part of
            # the transform rows' ceiling).
            b = {"data": flat[:BATCH * RECORD].reshape(BATCH, 3, 64, 64)}
            rng = np.random.default_rng(0)
            transform_bench.augment(b, rng)
            c0 = time.process_time()
            for _ in range(20):
                transform_bench.augment(b, rng)
            aug_s.append((time.process_time() - c0) / 20)
        for lib in order:
            data, label = paths[f"{lib} zstd"], paths[f"{lib} label"]
            timed(f"loader {lib}", [data, label], lambda: loader_rate(libs[lib], data, label, args.secs))
        for lib in order:
            data, label = paths[f"{lib} zstd"], paths[f"{lib} label"]
            timed(f"augmented {lib}", [data, label],
                  lambda: loader_rate(libs[lib], data, label, args.secs, augmented=True))
        data, label = paths["zring zstd_dict"], paths["zring label"]
        timed("loader zring zstd_dict", [data, label], lambda: loader_rate(zring, data, label, args.secs))
        print(f"  round {r}: " + ", ".join(f"{k} {v[-1]:.0f}" for k, v in res.items()), file=sys.stderr, flush=True)
    moved = {k: v for k, v in refaults.items() if v}
    if moved:
        common.note("page-cache pages read back during the timed runs (the host evicted them): "
                    + ", ".join(f"{k} {v:,}" for k, v in moved.items()))
    med = {k: float(np.median(v)) for k, v in res.items()}
    spread = {k: (min(v), max(v)) for k, v in res.items()}
    ceil = {k: float(np.median(v)) for k, v in ceils.items() if k in kinds}
    batch_mib = BATCH * RECORD / MIB
    if aug_s and "decode" in ceils:
        # Per round: cores / (decode CPU-s of a batch at the ceiling + one augment), in MiB/s.
        per_round = [cores / (batch_mib / (d / cores) + a) * batch_mib for d, a in zip(ceils["decode"], aug_s)]
        ceils["decode + augment"] = per_round
        # Its CPU per GiB: the decode ceiling's plus the augment's (as a
        # share of cores, which is what the line below divides back out).
        ceil_share["decode + augment"] = [
            (sh * 1024 / d + a * 1024 / batch_mib) * v / 1024
            for sh, d, a, v in zip(ceil_share["decode"], ceils["decode"], aug_s, per_round)]
        ceil["decode + augment"] = float(np.median(per_round))

    def row(what: str, key: str, unit: str, ceiling: str | None, lkey: str | None = None) -> str:
        zkey, lkey = key.format("zring"), (lkey or key).format("loaderx")
        z, lx = med[zkey], med[lkey]
        zs, ls = spread[zkey], spread[lkey]
        c = ceil.get(ceiling) if ceiling else None
        to_mib = (BATCH * RECORD / MIB) if unit == "batches/s" else 1.0
        zc = f"{z * to_mib / c:.2f}" if c else "-"
        lc = f"{lx * to_mib / c:.2f}" if c else "-"
        pairs = [a / b for a, b in zip(res[zkey], res[lkey])]
        zcpu = float(np.median(cpu_per_gib[zkey]))
        lcpu = float(np.median(cpu_per_gib[lkey]))
        return (f"| {what} | {unit} | {z:,.0f} ({zs[0]:,.0f}–{zs[1]:,.0f}) | {lx:,.0f} ({ls[0]:,.0f}–{ls[1]:,.0f}) | "
                f"**{z / lx:.2f}** | {np.median(pairs):.2f} ({min(pairs):.2f}–{max(pairs):.2f}) | {zc} | {lc} | "
                f"{ceiling or '-'} | {zcpu:.2f} | {lcpu:.2f} |")

    lines = [
        "| work | unit | zring (range) | loaderx 0.7.3 (range) | zring ÷ loaderx | same, round by round: median (range) "
        "| zring ÷ ceiling | loaderx ÷ ceiling | ceiling | zring CPU-s per GiB | loaderx CPU-s per GiB |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|---:|---:|",
        row("hot raw gather, 256 × 12 KiB (zring verifies every checksum)", "gather {} raw", "MiB/s", "memcpy+crc"),
        row("hot zstd gather, 256 × 12 KiB", "gather {} zstd", "MiB/s", "decode"),
        row("DataLoader, zstd 12 KiB + int64 label, batch 256", "loader {}", "batches/s", "decode"),
        row("DataLoader as above + NumPy augmentation transform (flip, float32 normalisation)", "augmented {}",
            "batches/s", "decode + augment"),
        row("extra, not the same codec: DataLoader, zring **zstd_dict** against loaderx plain zstd",
            "loader {} zstd_dict", "batches/s", "decode", lkey="loader {}"),
    ]
    if aug_s:
        common.note(f"one augment call (256 tiles, one thread): {1000 * float(np.median(aug_s)):.2f} CPU-ms "
                    f"({1000 * min(aug_s):.2f}–{1000 * max(aug_s):.2f}); the decode + augment ceiling is "
                    "cores / (decode CPU-s of a batch at the decode ceiling + that), as MiB/s of records")
    ceil_lines = [f"- {k}: {v:,.0f} MiB/s ({min(ceils[k]):,.0f}–{max(ceils[k]):,.0f}), "
                  f"{float(np.median(ceil_share[k])) * 1024 / v:.3f} CPU-s per GiB" for k, v in ceil.items()]
    meta = ["| store | records | payload bytes | on disk | metadata per record |", "|---|---:|---:|---:|---:|"]
    for key, p in paths.items():
        what = key.split()[1]
        disk = compare.allocated(p)
        meta.append(f"| {key} | {n:,} | {payload_bytes(n, what):,} | {disk:,} | "
                    f"{(disk - payload_bytes(n, what)) / n:.1f} B |" if not what.startswith("zstd") else
                    f"| {key} | {n:,} | (compressed) | {disk:,} | - |")
    text = (f"## Hot reads against loaderx\n\n`python benches/hot.py --secs {args.secs:g} --rounds {args.rounds}"
            f"{'' if n == 16384 else f' --records {n}'}`: "
            f"{common.machine(root)}; {common.versions(('zring', 'loaderx', 'numpy'))}; {n:,} records of 12 KiB "
            f"({n * RECORD / MIB:.0f} MiB) in the page cache; medians of {args.rounds} interleaved rounds of "
            f"{args.secs:g} s.\n\n" + "\n".join(lines) +
            f"\n\nCeilings ({cores} threads, the same tiles, no store; medians of the rounds, range):\n" + "\n".join(ceil_lines) +
            "\n\nPer-record metadata (allocated bytes on disk less the records' bytes, raw stores):\n\n" +
            "\n".join(meta) + "\n")
    notes = "".join(f"- {x}\n" for x in common.notes)
    text += ("\nNotes:\n" + notes) if notes else ""
    print(text)
    common.write_result(args.out / "hot.md", text)


if __name__ == "__main__":
    main()

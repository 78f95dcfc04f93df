"""The tables and plots of benches/compare.py: the Markdown of every section
and the PNGs, with the machine and versions lines at the top of the page.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

import common
from common import REPO, note
from compare_stores import (BATCH, CEIL_LEVEL, CEIL_MODE, CEIL_PREFETCH, CEIL_TRANSFORM_SLEEP,
                            CEIL_TRANSFORM_WORKERS, LOADER_PREFETCH, LOADER_WARMUP, LOADER_WORKERS, MIB,
                            RECORD, Row, pct)


# --------------------------------------------------------------------------
# (e) every core: tables
# --------------------------------------------------------------------------

def e_tables(res: dict) -> str:
    n, ncpu, ceil = res["n"], res["ncpu"], res["ceil"]
    threads = tuple(dict.fromkeys((1, ncpu)))
    mib = n * RECORD / MIB
    s = [f"### (e) Every core: each contender against the machine's ceilings\n",
         f"{n} × 12 KiB records ({mib:.0f} MiB), {ncpu} cpus. *Cores busy* is the process's CPU time "
         f"(user + system, all threads, `os.times()`) ÷ wall time over the measurement.\n"]

    def c(kind):
        return ceil.get((kind, ncpu))

    # ceilings
    s += ["**Ceilings** (MiB/s of record bytes; each figure 1 run of ≥ 0.5 s of repeated passes)\n",
          "| ceiling | " + " | ".join(f"{t} thread{'s' if t > 1 else ''}" for t in threads) + " | scaling |",
          "|---|" + "---:|" * (len(threads) + 1)]
    labels = {"compress": f"zstd level {CEIL_LEVEL} compress", "decode": f"zstd level {CEIL_LEVEL} decode",
              "memcpy": "memcpy"}
    for k, label in labels.items():
        if (k, 1) not in ceil:
            s.append(f"| {label} | " + " | ".join("n/a" for _ in threads) + " | - |")
            continue
        s.append(f"| {label} | " + " | ".join(f"{ceil[(k, t)]:.0f}" for t in threads) +
                 f" | {ratio(ceil[(k, threads[-1])], ceil[(k, 1)])} |")
    s.append("")

    # writes
    lxw = {w["codec"]: w["median"] for w in res["writes"] if w["kind"] == "loaderx"}
    s += [f"**write_dataset** from a `.npy` mapped with `mmap_mode=\"r\"` (in the page cache), each run a fresh "
          f"store, including the sync write_dataset does before it returns\n",
          "| writer | runs | best MiB/s | median MiB/s | cores busy | × loaderx (median) | × ceiling (median) | on disk MiB |",
          "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for w in res["writes"]:
        base = c("compress") if w["codec"] == "zstd" else c("memcpy")
        tag = f"{w['name']}{' (earlier run)' if w['reused'] else ''}"
        s.append(f"| {tag} | {w['runs']} | {w['best']:.0f} | {w['median']:.0f} | {w['busy']:.2f} | "
                 f"{ratio(w['median'], lxw.get(w['codec']))} | {ratio(w['median'], base)} | {w['disk'] / MIB:.0f} |")
    s.append("")

    # gathers
    lxg = {g["codec"]: g["median"] for g in res["gathers"] if g["kind"] == "loaderx"}
    s += [f"**Hot gather** (store read once into the page cache), `Dataset(p).__getitems__` of {BATCH} random indices, "
          f"the same sequence for all; MiB/s and batches/s are the median over the batches timed "
          f"(~{res['secs']:g} s each)\n",
          "| gatherer | batches timed | median MiB/s | median batches/s | cores busy | × loaderx | × ceiling |",
          "|---|---:|---:|---:|---:|---:|---:|"]
    for g in res["gathers"]:
        base = c("decode") if g["codec"] == "zstd" else c("memcpy")
        s.append(f"| {g['name']} | {g['batches']} | {g['median']:.0f} | {g['per_s']:.1f} | {g['busy']:.2f} | "
                 f"{ratio(g['median'], lxg.get(g['codec']))} | {ratio(g['median'], base)} |")
    s.append("")

    # loaders
    bare = {(g["kind"], g["codec"]): g["per_s"] for g in res["gathers"]}
    lxl = {(r["codec"], r["workers"]): r["per_s"] for r in res["loaders"] if r["kind"] == "loaderx" and "na" not in r}
    s += [f"**DataLoader** end to end: 'data' only, batch {BATCH}, prefetch {CEIL_PREFETCH}, mode {CEIL_MODE}, "
          f"{LOADER_WARMUP} warm-up steps, then 1 run of ~{res['secs']:g} s; the consumer does no work\n",
          "| loader | data | workers | steps timed | batches/s | MiB/s | cores busy | × loaderx | × bare gather |",
          "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in res["loaders"]:
        if "na" in r:
            s.append(f"| {r['name']} | {r['codec']} | {r['workers']} | n/a | n/a | n/a | n/a | - | - |")
            continue
        s.append(f"| {r['name']} | {r['codec']} | {r['workers']} | {r['steps']} | {r['per_s']:.1f} | "
                 f"{r['per_s'] * BATCH * RECORD / MIB:.0f} | {r['busy']:.2f} | "
                 f"{ratio(r['per_s'], lxl.get((r['codec'], r['workers'])))} | "
                 f"{ratio(r['per_s'], bare.get((r['kind'], r['codec'])))} |")
    s.append("")

    # transforms
    if res["transforms"]:
        lxt = next((r["per_s"] for r in res["transforms"] if r["kind"] == "loaderx" and "na" not in r), None)
        plain = {(r["kind"], r["codec"], r["workers"]): r["per_s"] for r in res["loaders"] if "na" not in r}
        s += [f"**DataLoader with a {CEIL_TRANSFORM_SLEEP * 1e3:g} ms GIL-releasing transform** (`time.sleep`, then "
              f"the batch unchanged), {CEIL_TRANSFORM_WORKERS} workers, same settings; run one at a time the "
              f"transform alone caps a loader at {1 / CEIL_TRANSFORM_SLEEP:.0f} batches/s\n",
              "| loader | data | steps timed | batches/s | cores busy | × loaderx | × same loader without transform |",
              "|---|---|---:|---:|---:|---:|---:|"]
        for r in res["transforms"]:
            if "na" in r:
                s.append(f"| {r['name']} | {r['codec']} | n/a | n/a | n/a | n/a | n/a |")
                continue
            s.append(f"| {r['name']} | {r['codec']} | {r['steps']} | {r['per_s']:.1f} | {r['busy']:.2f} | "
                     f"{ratio(r['per_s'], lxt)} | "
                     f"{ratio(r['per_s'], plain.get((r['kind'], r['codec'], r['workers'])))} |")
        s.append("")

    s.append(f"Ceilings (`zring._zring.ceiling`, the same records, no I/O, no index, no checksum): *compress* is "
             f"{ncpu} threads each zstd-compressing (level {CEIL_LEVEL}) its share of the records one record at a "
             f"time; *decode* is {ncpu} threads decoding those frames; *memcpy* is {ncpu} threads copying each "
             f"record into its slot of another buffer. × ceiling divides by the {ncpu}-thread figure: compress for "
             f"zstd writes, decode for zstd gathers, memcpy for raw writes and gathers; × bare gather divides a "
             f"loader's batches/s by the median batches/s of its own library's hot gather above.\n")
    return "\n".join(s) + "\n"


# --------------------------------------------------------------------------
# output
# --------------------------------------------------------------------------

def ratio(v: float, base: float | None) -> str:
    return f"{v / base:.2f}" if base else "-"


def gather_table(rows: list[Row], title: str, hot: bool, ceil: dict[str, float | None] | None = None) -> str:
    """``ceil`` ({"decode": MiB/s, "memcpy": MiB/s}) adds a "× ceiling" column to zring and loaderx rows."""
    lx = {r.name.split()[-1]: r.mib_s for r in rows if r.kind == "loaderx"}
    peers = [r for r in rows if r.kind == "peer"]
    best = max(peers, key=lambda r: r.mib_s) if peers else None
    s = [f"### {title}\n"]
    if best:
        s.append(f"Best peer: **{best.name}** ({best.mib_s:.0f} MiB/s).\n")
    head = "| contender | gather MiB/s | batches/s | × loaderx | × best peer |"
    sep = "|---|---:|---:|---:|---:|"
    if ceil is not None:
        head += " × ceiling |"
        sep += "---:|"
    head += " CPU-s per GiB | p50 ms | p99 ms | p99.9 ms |"
    sep += "---:|---:|---:|---:|"
    if hot:
        head += " write MiB/s | on disk MiB | size ratio |"
        sep += "---:|---:|---:|"
    else:
        head += " disk served MiB | disk / delivered |"
        sep += "---:|---:|"
    s += [head, sep]
    for r in rows:
        codec = r.name.split()[-1] if r.kind in ("zring", "loaderx") else "raw"
        base = lx.get(codec)
        if r.kind == "ceiling":
            s.append(f"| {r.name} | {r.mib_s:.0f} | {r.extra['iops'] / BATCH:.0f} (÷256) | {ratio(r.mib_s, base)} | "
                     f"{ratio(r.mib_s, best.mib_s if best else None)} | - | per 12k read: {r.extra['clat_p50_ms']:.3f} | "
                     f"{r.extra['clat_p99_ms']:.3f} | {r.extra['clat_p999_ms']:.3f} | - | - |")
            continue
        line = f"| {r.name} | {r.mib_s:.0f} | {r.per_s:.0f} | {ratio(r.mib_s, base)} | {ratio(r.mib_s, best.mib_s if best else None)} |"
        if ceil is not None:
            top = ceil.get("memcpy" if codec == "raw" else "decode") if r.kind in ("zring", "loaderx") else None
            line += f" {ratio(r.mib_s, top)} |"
        line += f" {r.cpu_per_gib()} | {pct(r.lat_ms, 50):.3f} | {pct(r.lat_ms, 99):.3f} | {pct(r.lat_ms, 99.9):.3f} |"
        if hot:
            line += f" {r.extra['write_mib_s']:.0f} | {r.extra['disk'] / MIB:.0f} | {r.extra['ratio']:.2f} |"
        else:
            line += f" {r.extra['disk'] / MIB:.0f} | {r.extra['disk'] / max(r.nbytes, 1):.2f} |"
        s.append(line)
    return "\n".join(s) + "\n"


def loader_table(rows: list[Row], steps: int) -> str:
    lx = {r.name.split()[-1]: r.per_s for r in rows if r.kind == "loaderx"}
    peers = [r for r in rows if r.kind == "peer"]
    best = max(peers, key=lambda r: r.per_s) if peers else None
    s = [f"### (d) Loader end to end: batch {BATCH}, 'data' 12 KiB + 'label' int64, {LOADER_WORKERS} workers, "
         f"prefetch {LOADER_PREFETCH}, {steps} steps after {LOADER_WARMUP} warm-up, consumer does no work\n"]
    if best:
        s.append(f"Best peer: **{best.name}** ({best.per_s:.1f} batches/s).\n")
    s += ["| loader | batches/s | MiB/s | × loaderx | × best peer | CPU-s per GiB | wait p50 ms | wait p99 ms "
          "| wait p99.9 ms |",
          "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        codec = r.name.split()[-1] if r.kind in ("zring", "loaderx") else "raw"
        s.append(f"| {r.name} | {r.per_s:.1f} | {r.mib_s:.0f} | {ratio(r.per_s, lx.get(codec))} | "
                 f"{ratio(r.per_s, best.per_s if best else None)} | {r.cpu_per_gib()} | {pct(r.lat_ms, 50):.3f} | {pct(r.lat_ms, 99):.3f} | "
                 f"{pct(r.lat_ms, 99.9):.3f} |")
    return "\n".join(s) + "\n"


def sampler_table(rows: list[dict]) -> str:
    names = []
    for r in rows:
        for k in r:
            if k not in ("mode", "batch") and k not in names:
                names.append(k)
    s = ["### (a) Sampler: ns per index (lower is better)\n",
         "| mode | batch | " + " | ".join(names) + " | zring × loaderx (speed-up) | zring × numpy |",
         "|---|---:|" + "---:|" * (len(names) + 2)]
    for r in rows:
        cells = [f"{r[k]:.2f}" if k in r else "-" for k in names]
        z, lx = r.get("zring.Sampler"), r.get("loaderx Sampler")
        npk = [k for k in r if k.startswith("numpy")]
        npv = r[npk[0]] if npk else None
        s.append(f"| {r['mode']} | {r['batch']} | " + " | ".join(cells) +
                 f" | {lx / z if z and lx else float('nan'):.2f} | {npv / z if z and npv else float('nan'):.2f} |")
    return "\n".join(s) + "\n"


def plots(out: Path, hot: list[Row], cold: list[Row], load: list[Row]) -> list[str]:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as e:  # noqa: BLE001
        note(f"matplotlib unavailable, no plots: {e}")
        return []
    made = []
    colors = {"zring": "tab:blue", "loaderx": "tab:orange", "peer": "tab:gray", "ceiling": "tab:green"}

    def bars(rows, value, label, fname, title):
        if not rows:
            return
        fig, ax = plt.subplots(figsize=(9, 0.35 * len(rows) + 1.5))
        ax.barh([r.name for r in rows], [value(r) for r in rows], color=[colors[r.kind] for r in rows])
        ax.invert_yaxis()
        ax.set_xlabel(label)
        ax.set_title(title)
        ax.grid(axis="x", alpha=0.3)
        fig.tight_layout()
        fig.savefig(out / fname, dpi=110)
        plt.close(fig)
        made.append(fname)

    def cdf(rows, fname, title, xlabel):
        rows = [r for r in rows if r.lat_ms]
        if not rows:
            return
        fig, ax = plt.subplots(figsize=(9, 5))
        for r in rows:
            v = np.sort(np.asarray(r.lat_ms))
            ax.plot(v, np.arange(1, len(v) + 1) / len(v), label=r.name,
                    linestyle="-" if r.kind == "zring" else ("--" if r.kind == "loaderx" else ":"))
        ax.set_xscale("log")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("fraction of batches")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
        fig.tight_layout()
        fig.savefig(out / fname, dpi=110)
        plt.close(fig)
        made.append(fname)

    bars(hot, lambda r: r.mib_s, "gather MiB/s (higher is better)", "hot_throughput.png", "Hot gather, 256 × 12 KiB random")
    cdf(hot, "hot_latency_cdf.png", "Hot gather latency per batch", "ms per batch (log)")
    bars(cold, lambda r: r.mib_s, "gather MiB/s (higher is better)", "cold_throughput.png", "Cold gather, cache emptied per round")
    cdf(cold, "cold_latency_cdf.png", "Cold gather latency per batch", "ms per batch (log)")
    bars(load, lambda r: r.per_s, "batches/s (higher is better)", "loader_throughput.png", "Loader end to end, batch 256")
    cdf(load, "loader_wait_cdf.png", "Loader: consumer wait per step", "ms waited in next() (log)")
    return made


def machine() -> str:
    return common.machine(REPO, f", numpy {np.__version__}")


def versions() -> str:
    return common.versions(
        ("zring", "loaderx", "lmdb", "h5py", "zarr", "tensorstore", "blosc2", "array_record", "grain", "lance", "torch"),
        {"array_record": "array-record", "lance": "pylance"},
    )

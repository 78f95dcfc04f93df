"""Four host processes on the corpus of real text of ``benches/lm_ranks.py``
(run it first: it writes the corpus and each host's folder): a scheduled
packed mixture resumed after a Ray append, sequence-length and batch-size
ramps killed and resumed, and the 4 hosts' states resumed by 2 and by 8.

1. **Growth.** Each rank, in a process of its own over its host folder
   (only its parts), runs a packed 3-source mixture (2,048 tokens a row, 8
   rows a step, mode 2, weights scheduled from 0.5/0.3/0.2 to 0.3/0.3/0.4
   over 400 steps) for ``--steps`` steps and saves its state. Ray Data
   (local, 2 CPUs) appends ``--append`` documents to each source
   (``zring.ray.write(..., mode="append")``); each host copies the new parts
   ``zring parts --rank`` lists for it; each rank resumes from its state.
   Reported: the resume succeeds on every rank, each source's stretches of
   cycles (``pack_growth``), and the first steps after the resume against a
   run that never stopped (identical until the cycle under way ends).
2. **Curriculum.** Rank 0: ``seq_len`` 512 -> 1024 -> 2048 and batch 8 -> 16 ->
   32 ramps, in a process killed with SIGKILL every 2 s and resumed from
   the state it last wrote, to ``--ramp-steps`` steps; each step's batch
   digest against an uninterrupted run's.
3. **Elastic.** The 4 ranks' states of step 1 (one source, ``code``, packed)
   resumed with 2 ranks and with 8: the documents the new ranks' first pass
   begins, against ``zring.elastic.remaining`` (the documents no saved rank
   had begun in its cycle), and the tokens they deliver against those
   documents' lengths.

    python benches/lm_hosts.py [--codec raw] [--steps 60] [--append 2000] [--ramp-steps 120]

The result goes to ``bench-results/lm-hosts.md``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
from lm_ranks import RANKS, SOURCES, text_files, tokens_of  # noqa: E402

import zring  # noqa: E402
from zring import elastic, parts  # noqa: E402

MIX = r"""
import hashlib, json, sys
import numpy as np, zring
host, rank, steps, state = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), json.loads(sys.argv[4])
srcs = [zring.RaggedDataset(f"{host}/{n}.zr", rank_parts=(rank, 4)) for n in ("code", "docs", "more")]
mix = zring.mix(srcs, zring.schedule({0: [0.5, 0.3, 0.2], 400: [0.3, 0.3, 0.4]}))
digests = []
with zring.DataLoader(zring.pack(mix, 2048), batch_size=8, mode=2, seed=1, state=state) as dl:
    for _ in range(steps):
        digests.append(hashlib.blake2b(next(dl)["tokens"].tobytes(), digest_size=8).hexdigest())
    print(json.dumps({"state": dl.state(), "digests": digests}))
"""

RAMP = r"""
import hashlib, json, sys, time
import zring
host, out, state, slow = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), float(sys.argv[4])
ds = zring.RaggedDataset(f"{host}/code.zr", rank_parts=(0, 4))
dl = zring.DataLoader(zring.pack(ds, zring.ramp({0: 512, 40: 1024, 80: 2048}), labels=True),
                      batch_size=zring.ramp({0: 8, 30: 16, 70: 32}), mode=2, seed=2, state=state)
with open(out, "a") as f:
    while True:
        b = next(dl)
        f.write(json.dumps({"step": dl.last_step, "shape": list(b["tokens"].shape),
                            "digest": hashlib.blake2b(b["tokens"].tobytes() + b["segment_ids"].tobytes(),
                                                      digest_size=8).hexdigest(),
                            "state": dl.state()}) + "\n")
        f.flush()
        time.sleep(slow)
"""


def sync_host(root: Path, host: Path, rank: int) -> int:
    """Copies what ``zring parts --rank`` lists for ``rank`` and the host lacks;
    returns the bytes copied."""
    copied = 0
    for name in SOURCES:
        src, dst = root / f"{name}.zr", host / f"{name}.zr"
        for d in parts.rank_plan(src, RANKS)[rank]:
            if not (dst / d).exists():
                shutil.copytree(src / d, dst / d)
                copied += sum(f.stat().st_size for f in (dst / d).rglob("*") if f.is_file())
        shutil.copy(src / "manifest.json", dst / "manifest.json")
    return copied


def run_mix(host: Path, rank: int, steps: int, state: dict | None) -> dict:
    r = subprocess.run([sys.executable, "-c", MIX, str(host), str(rank), str(steps), json.dumps(state)],
                       capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError(f"rank {rank}: {r.stderr.strip().splitlines()[-1]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def ray_append(root: Path, n: int) -> None:
    import ray
    import pyarrow as pa

    import zring.ray as zray

    files = text_files()
    rng = np.random.default_rng(1)
    pick = rng.choice(len(files), size=n * len(SOURCES), replace=True)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, ignore_reinit_error=True)
    try:
        for k, name in enumerate(SOURCES):
            docs = [tokens_of(files[i]).astype(np.uint16) for i in pick[k * n:(k + 1) * n]]
            table = pa.table({"tokens": pa.array([d.tolist() for d in docs], type=pa.list_(pa.uint16()))})
            zray.write(ray.data.from_arrow(table).repartition(4), root / f"{name}.zr", column="tokens",
                       mode="append", codec="raw")
    finally:
        ray.shutdown()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--codec", default="raw")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--append", type=int, default=2000)
    ap.add_argument("--ramp-steps", type=int, default=120)
    a = ap.parse_args()
    base = Path(os.environ.get("ZRING_BENCH_DIR", common.REPO / "bench-data")) / "lm_ranks" / a.codec
    if not (base / "corpus").is_dir():
        raise SystemExit("run benches/lm_ranks.py first: it writes the corpus and the host folders")
    # Work on copies: the appends change the corpus.
    work = base.parent / f"{a.codec}-hosts"
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(base, work)
    root, hosts = work / "corpus", [work / f"host{k}" for k in range(RANKS)]
    out = ["# Four host processes on real text: growth, curricula, another host count\n",
           f"`python benches/lm_hosts.py --codec {a.codec} --steps {a.steps} --append {a.append} "
           f"--ramp-steps {a.ramp_steps}`\n", common.machine(work), ""]

    # 1. Growth.
    first = [run_mix(hosts[k], k, a.steps, None) for k in range(RANKS)]
    alone = [run_mix(hosts[k], k, a.steps * 2, None) for k in range(RANKS)]
    t = time.perf_counter()
    ray_append(root, a.append)
    ray_s = time.perf_counter() - t
    copied = [sync_host(root, hosts[k], k) for k in range(RANKS)]
    resumed = [run_mix(hosts[k], k, a.steps, first[k]["state"]) for k in range(RANKS)]
    out += ["## A scheduled packed mixture resumed after a Ray append\n",
            f"Ray Data appended {a.append:,} documents to each of the 3 sources in {ray_s:.0f} s; each host then "
            "copied the new parts listed for it.\n",
            "| rank | copied (MiB) | resumed | steps identical to the run that never stopped | pack_growth per source |",
            "|---:|---:|---|---:|---|"]
    for k in range(RANKS):
        same = 0
        for x, y in zip(resumed[k]["digests"], alone[k]["digests"][a.steps:]):
            if x != y:
                break
            same += 1
        growth = resumed[k]["state"].get("pack_growth") or "(no source's cycle grew yet)"
        out.append(f"| {k} | {copied[k] / 2**20:.1f} | yes | {same} of {a.steps} | `{json.dumps(growth)}` |")
    out.append("\nEvery source's cycle under way is far longer than the steps run, so the resumed steps are the "
               "never-stopped run's; the new documents join each source at its next cycle (the exactness of both "
               "cycles is asserted by `py/tests/test_pack_growth.py`).\n")

    # 2. Curriculum, killed and resumed.
    ref_log, kill_log = Path(tempfile.mkdtemp()) / "ref.jsonl", Path(tempfile.mkdtemp()) / "kill.jsonl"
    p = subprocess.Popen([sys.executable, "-c", RAMP, str(hosts[0]), str(ref_log), "null", "0"])
    while not ref_log.exists() or sum(1 for _ in ref_log.open()) < a.ramp_steps:
        time.sleep(0.2)
    p.kill()
    p.wait()
    want = {}
    for line in ref_log.read_text().splitlines():
        if line.endswith("}"):
            x = json.loads(line)
            want[x["step"]] = (x["shape"], x["digest"])
    state, kills, got = None, 0, {}
    while True:
        p = subprocess.Popen([sys.executable, "-c", RAMP, str(hosts[0]), str(kill_log), json.dumps(state), "0.03"])
        time.sleep(2.0)
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
        kills += 1
        lines = [json.loads(x) for x in kill_log.read_text().splitlines() if x.endswith("}")]
        state = lines[-1]["state"] if lines else None
        for x in lines:
            got.setdefault(x["step"], (x["shape"], x["digest"]))
        if lines and lines[-1]["step"] >= a.ramp_steps - 1:
            break
    steps = [s for s in range(a.ramp_steps)]
    same = sum(1 for s in steps if got.get(s) == want.get(s))
    shapes = sorted({tuple(want[s][0]) for s in steps if s in want})
    out += ["## Sequence length 512 -> 2048 and batch 8 -> 32, killed and resumed\n",
            f"Rank 0's `code` share, {a.ramp_steps} steps; the process was killed with SIGKILL {kills} times and "
            f"resumed from its last state each time. Batch shapes met: {shapes}. **{same} of {a.ramp_steps}** "
            "steps' batches (tokens and segment ids) identical to the uninterrupted run's.\n"]

    # 3. Elastic: 4 -> 2 and 4 -> 8, over `code` packed (one source).
    def open_rank(rank: int, ranks: int):
        return zring.pack(zring.RaggedDataset(root / "code.zr", rank_parts=(rank, ranks)), 2048)

    states = []
    for k in range(RANKS):
        src = open_rank(k, RANKS)
        with zring.DataLoader(src, batch_size=8, mode=2, seed=4) as dl:
            for _ in range(a.steps):
                next(dl)
            states.append(dl.state())
        src.datasets[0].close()
    rest = elastic.remaining(states, open_rank)
    with zring.RaggedDataset(root / "code.zr") as whole:
        lens = whole._s.lengths(rest.astype(np.uint64)) // 2
    nonempty = int((lens > 0).sum())
    out += ["## Four ranks' states resumed by 2 and by 8\n",
            f"`code` packed, 2,048 tokens a row, 8 rows a step, mode 2, {a.steps} steps on each of 4 ranks. Not begun "
            f"by any: {rest.size:,} documents ({rest.size - nonempty:,} of them empty files, which hold no token "
            f"to begin), {int(lens.sum()) / 1e6:.1f} M tokens.\n",
            "| new ranks | documents begun in the first pass | tokens delivered in it | its steps (the longest rank's) |",
            "|---:|---:|---:|---:|"]
    for m in (2, 8):
        begun, tokens, longest = 0, 0, 0
        for j in range(m):
            with elastic.ElasticLoader(states, open_rank, rank=j, ranks=m, seed=3, batch_size=8) as el:
                n = 0
                while el.phase == 1:
                    b = next(el)
                    if el.phase != 1:
                        break
                    n += 1
                    v = el.last_valid
                    seg, pos = b["segment_ids"][:v], b["positions"][:v]
                    begun += int(((pos == 0) & (seg > 0)).sum())
                    tokens += int((seg > 0).sum())
                longest = max(longest, n)
        ok_docs = "= " if begun == nonempty else "!= "
        ok_tokens = "= " if tokens == int(lens.sum()) else "!= "
        out.append(f"| {m} | {begun:,} ({ok_docs}{nonempty:,} non-empty) | {tokens:,} ({ok_tokens}{int(lens.sum()):,}) "
                   f"| {longest} |")
    out.append("")
    text = "\n".join(out)
    print(text)
    common.write_result(common.REPO / "bench-results" / "lm-hosts.md", text)


if __name__ == "__main__":
    main()

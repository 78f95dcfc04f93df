#!/usr/bin/env python3
"""Datasets of parts under attack, as a shared project folder meets them.

Two phases (run as root; the attackers switch users themselves):

1. ``--seconds`` of races: the owner (root) writes parts and commits them
   (appends and overwrites) into a setgid 2775 group folder while a group
   member (uid 4001) and another user (uid 65534) plant links to a private
   folder, FIFOs, and swapped folders at every name of the dataset
   (``staging``, ``parts``, ``dropped``, the manifest and its temporary
   name, ``.commit.lock``, staged and committed parts); a second owner
   does the same through ``zring.ray.write`` into a second dataset, under
   attackers of its own. Counted: files
   outside the dataset created, changed or removed (must be 0), hangs (an
   owner making no progress for 120 s; must be 0), and refusals that do not
   name the file (must be 0).
2. ``--kills`` commits killed (SIGKILL or SIGINT at a random moment): after
   each, the dataset opens and lists every acknowledged commit, and
   committing the interrupted part again lists it once.

    sudo .venv/bin/python scripts/parts_attack.py --seconds 600 --kills 200
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time

GROUP, MEMBER, OTHER = 4242, 4001, 65534
NAMES = ["staging", "parts", "dropped", "manifest.json", ".commit.lock", "TMP", "STAGED", "PART"]

OWNER = textwrap.dedent("""
    import os, sys, time, json
    import numpy as np
    from zring import parts
    root, beat, log = sys.argv[1], sys.argv[2], sys.argv[3]
    n = 0
    with open(log, "a") as out:
        while True:
            t = time.time()
            with open(beat, "w") as b:
                b.write(f"{t}")
            try:
                info = parts.write_part(root, np.full((4, 2), n, np.int64))
                parts.commit(root, [info], mode="overwrite" if n % 5 == 4 else "append")
                out.write(json.dumps({"ok": n}) + "\\n")
            except Exception as e:
                out.write(json.dumps({"err": f"{type(e).__name__}: {e}"}) + "\\n")
            out.flush()
            n += 1
""")
# The same through zring.ray.write: one Ray job per commit, appends and
# overwrites, two tasks a job.
RAY_OWNER = textwrap.dedent("""
    import os, sys, time, json, warnings
    warnings.simplefilter("ignore")
    import numpy as np, ray
    import zring.ray
    root, beat, log = sys.argv[1], sys.argv[2], sys.argv[3]
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False, configure_logging=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    n = 0
    with open(log, "a") as out:
        while True:
            with open(beat, "w") as b:
                b.write(f"{time.time()}")
            try:
                ds = ray.data.range(8, override_num_blocks=2).map_batches(
                    lambda b, n=n: {"x": np.asarray(b["id"]) + 100 * n}, batch_format="numpy")
                zring.ray.write(ds, root, column="x", mode="overwrite" if n % 5 == 4 else "append")
                out.write(json.dumps({"ok": n}) + "\\n")
            except Exception as e:
                out.write(json.dumps({"err": f"{type(e).__name__}: {e}"}) + "\\n")
            out.flush()
            n += 1
""")

ATTACKER = textwrap.dedent("""
    import os, sys, random, shutil, time
    uid, root, private, seed = int(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
    names = sys.argv[5].split(",")
    os.setgroups([%d] if uid != %d else [])
    os.setgid(uid)
    os.setuid(uid)
    os.umask(0o002)
    rng = random.Random(seed)
    def pick(sub):
        try:
            xs = [x for x in os.listdir(os.path.join(root, sub)) if not x.startswith(".")]
            return os.path.join(sub, rng.choice(xs)) if xs else None
        except OSError:
            return None
    while True:
        name = rng.choice(names)
        if name == "TMP":
            name = ".manifest.json.%%d.tmp" %% int(sys.argv[6])
        elif name == "STAGED":
            name = pick("staging")
        elif name == "PART":
            name = pick("parts")
        if not name:
            continue
        p = os.path.join(root, name)
        act = rng.choice(["link_dir", "link_file", "fifo", "swap"])
        try:
            if act == "swap" and os.path.isdir(p) and not os.path.islink(p):
                away = p + ".away"
                os.rename(p, away)
                os.mkdir(p)
                time.sleep(rng.random() * 0.01)
                os.rmdir(p)
                os.rename(away, p)
                continue
            if os.path.islink(p) or (os.path.exists(p) and not os.path.isdir(p)):
                os.unlink(p)
            elif os.path.isdir(p):
                os.rename(p, p + ".moved")
            if act == "link_dir":
                os.symlink(private, p)
            elif act == "link_file":
                os.symlink(os.path.join(private, "secret"), p)
            else:
                os.mkfifo(p)
            time.sleep(rng.random() * 0.02)
            os.unlink(p)
            if os.path.isdir(p + ".moved"):
                os.rename(p + ".moved", p)
        except OSError:
            pass
""" % (GROUP, OTHER))


def snapshot(d: str) -> dict[str, str]:
    out = {}
    for dp, dns, fns in os.walk(d):
        for n in fns + dns:
            p = os.path.join(dp, n)
            if os.path.isfile(p) and not os.path.islink(p):
                out[p] = hashlib.sha256(open(p, "rb").read()).hexdigest()
            else:
                out[p] = "dir" if os.path.isdir(p) else "other"
    return out


def _owner_result(log: str, root: str) -> tuple[int, list[str], list[str]]:
    lines = [json.loads(x) for x in open(log) if x.strip()] if os.path.exists(log) else []
    errs = [x["err"] for x in lines if "err" in x]
    unnamed = [e for e in errs if root not in e and "staging" not in e]
    return sum("ok" in x for x in lines), errs, unnamed


def races(seconds: float, with_ray: bool) -> dict[str, object]:
    top = tempfile.mkdtemp(prefix="zring-attack-")
    os.chmod(top, 0o755)
    private = os.path.join(top, "private")
    roots = {"parts": os.path.join(top, "corpus"), "ray": os.path.join(top, "ray-corpus")}
    if not with_ray:
        del roots["ray"]
    for root in roots.values():
        os.mkdir(root)
        os.chown(root, 0, GROUP)
        os.chmod(root, 0o2775)
    os.mkdir(private, 0o700)
    os.mkdir(os.path.join(private, "sub"))
    with open(os.path.join(private, "secret"), "w") as f:
        f.write("root's own")
    before = snapshot(private)
    procs, owners = [], {}
    for kind, root in roots.items():
        beat, log = os.path.join(top, f"beat-{kind}"), os.path.join(top, f"log-{kind}")
        owner = subprocess.Popen([sys.executable, "-c", OWNER if kind == "parts" else RAY_OWNER, root, beat, log])
        owners[kind] = (owner, root, beat, log)
        procs.append(owner)
    time.sleep(2)
    for kind, (owner, root, _, _) in owners.items():
        procs += [subprocess.Popen([sys.executable, "-c", ATTACKER, str(uid), root, private, str(seed),
                                    ",".join(NAMES), str(owner.pid)])
                  for seed, uid in enumerate([MEMBER, OTHER, MEMBER])]
    hangs = []
    start = time.time()
    end = start + seconds
    while time.time() < end and not hangs:
        time.sleep(5)
        for kind, (_, _, beat, _) in owners.items():
            try:
                text = open(beat).read()
            except OSError:
                text = ""
            if not text:
                continue  # not written yet, or read while being rewritten
            last = float(text)
            if time.time() - last > 120:
                hangs.append(f"{kind}: no progress for {time.time() - last:.0f} s")
    for p in procs:
        p.kill()
        p.wait()
    after = snapshot(private)
    out: dict[str, object] = {"seconds": round(time.time() - start),
                              "outside_changed": sum(1 for k in set(before) | set(after)
                                                     if before.get(k) != after.get(k)),
                              "hangs": hangs}
    for kind, (_, root, _, log) in owners.items():
        ok, errs, unnamed = _owner_result(log, root)
        out[kind] = {"commits_ok": ok, "refused": len(errs), "refusals_not_naming_a_file": len(unnamed),
                     "examples": errs[:2] + unnamed[:3]}
    shutil.rmtree(top, ignore_errors=True)
    return out


KILLED = textwrap.dedent("""
    import os, sys, numpy as np
    from zring import parts
    root = sys.argv[1]
    for k in range(1000):
        info = parts.write_part(root, np.full((3, 2), k, np.int64))
        open(os.path.join(root, "..", f"next-{k}"), "w").write(f"{info.name} {info.records} {info.content}")
        parts.commit(root, [info])
        open(os.path.join(root, "..", f"acked-{k}"), "w").write(info.name)
""")


def kills(n: int) -> dict[str, int]:
    import numpy as np

    import zring
    from zring import parts

    ok = 0
    for i in range(n):
        top = tempfile.mkdtemp(prefix="zring-kill-")
        root = os.path.join(top, "corpus")
        p = subprocess.Popen([sys.executable, "-c", KILLED, root])
        time.sleep(0.3 + random.random() * 0.6)
        p.send_signal(signal.SIGKILL if i % 2 else signal.SIGINT)
        p.wait()
        # An acknowledgement killed as it was written is empty: not one.
        acked = {open(os.path.join(top, f)).read() for f in os.listdir(top) if f.startswith("acked-")} - {""}
        listed = [d["dir"].split("/", 1)[1] for d in parts.list_parts(root)] if os.path.exists(root) else []
        assert acked <= set(listed), f"run {i}: acknowledged {acked - set(listed)} missing"
        assert len(listed) == len(set(listed)), f"run {i}: a part listed twice"
        if listed:
            assert len(zring.Dataset(root)) == 3 * len(listed)
        for f in os.listdir(top):
            if not f.startswith("next-"):
                continue
            words = open(os.path.join(top, f)).read().split()
            if len(words) != 3:
                continue  # killed as it was written
            name, records, content = words
            if name in listed or not os.path.isdir(os.path.join(root, "staging", name)):
                continue
            info = parts.PartInfo(name=name, records=int(records), content=content)
            parts.commit(root, [info])
            parts.commit(root, [info])
            now = [d["dir"].split("/", 1)[1] for d in parts.list_parts(root)]
            assert now.count(name) == 1, f"run {i}: a retried commit listed {name} {now.count(name)} times"
        ok += 1
        shutil.rmtree(top, ignore_errors=True)
    _ = np
    return {"killed_commits": n, "checked": ok}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=600)
    ap.add_argument("--kills", type=int, default=200)
    ap.add_argument("--no-ray", action="store_true", help="leave zring.ray.write out of the races")
    a = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root: the attackers switch to other users")
    print(json.dumps({"races": races(a.seconds, not a.no_ray)}, indent=1), flush=True)
    print(json.dumps({"kills": kills(a.kills)}, indent=1), flush=True)


if __name__ == "__main__":
    main()

"""Planted links and swapped directories against a root writer (issue 36's
must-show for the directory handle). Run as root:

    .venv/bin/python scripts/plant_race.py [--ops 200] [--seconds-per-op 0]

Sets up, under a fresh temporary directory:

* ``secret/``: root-only files (0600, in a 0700 directory), among them an
  ``authorized_keys`` and a whole zring store: the targets of every planted
  link. Each is hashed before and after.
* ``shared/``: a setgid, group-writable, non-sticky directory of a group
  whose member (a user this script creates if needed) plants links at the
  names a writer makes inside the stores there (``head.zr.tmp``, the next
  ``table-N.zr`` and ``chunk-N.zr``, ``schema.json(.tmp)``, ``dict.zr.tmp``,
  ``pins``, ``names.intent(.tmp)``) and swaps the staging directories of
  replaces for links to ``secret/``.
* ``nobody/``: a directory owned by uid 65534, who swaps the staging
  directories of the replaces there for links, and plants links in them.

Root meanwhile runs ``--ops`` operations round-robin: appends
(``write_dataset(append=True)``), deletes with record names
(``Zrecord.delete``, which writes ``names.intent``), compactions, and
replaces (``write_dataset(overwrite=True)``) in ``shared/`` and ``nobody/``.
An operation may fail (a planted link where a file must be is an error);
what must hold is that no file outside the stores changes. Prints the
counts and exits 1 if any target changed.
"""

from __future__ import annotations

import argparse
import grp
import hashlib
import os
import pwd
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import zring

GROUP = "zring-race"
MEMBER = "zring-racer"
NOBODY = 65534

PLANT = """
import os, random, sys, time
store_dirs, parents, targets, stop = sys.argv[1].split(":"), sys.argv[2].split(":"), sys.argv[3].split(":"), sys.argv[4]
names = ["head.zr.tmp", "schema.json.tmp", "dict.zr.tmp", "names.intent.tmp", "names.intent", "lock.tmp",
         "pins", "schema.json"]
def next_names(d):
    try:
        ls = os.listdir(d)
    except OSError:
        return []
    out = []
    for pre in ("table-", "chunk-"):
        ids = [int(n[len(pre):-3]) for n in ls if n.startswith(pre) and n.endswith(".zr") and n[len(pre):-3].isdigit()]
        top = max(ids, default=0)
        out += [f"{pre}{k:06d}.zr" for k in range(top + 1, top + 4)]
    return out
n = 0
while not os.path.exists(stop):
    n += 1
    t = random.choice(targets)
    for d in store_dirs:
        for name in names + next_names(d):
            try:
                os.symlink(t, os.path.join(d, name))
            except OSError:
                pass
        # Now and then a link put over an existing file (rename in a
        # group-writable, non-sticky directory).
        if random.random() < 0.02:
            name = random.choice(["schema.json", "pins", "head.zr.tmp"])
            tmp = os.path.join(d, f".plant-{os.getpid()}")
            try:
                os.symlink(t, tmp)
                os.rename(tmp, os.path.join(d, name))
            except OSError:
                pass
        # And the links at names a writer needs removed again, so the
        # writes go on (the race is the point, not a denial of service).
        if random.random() < 0.3:
            for name in ["pins", "schema.json", "names.intent"]:
                p = os.path.join(d, name)
                if os.path.islink(p):
                    try:
                        os.unlink(p)
                    except OSError:
                        pass
    # Staging directories: swapped for a link to a target directory, and
    # links planted in them.
    for parent in parents:
        try:
            ls = os.listdir(parent)
        except OSError:
            continue
        for e in ls:
            p = os.path.join(parent, e)
            if not e.endswith(".partial") or os.path.islink(p):
                continue
            for name in ["head.zr", "table-000001.zr", "chunk-000000.zr", "lock", "pins", "schema.json.tmp",
                         "head.zr.tmp", "names"]:
                try:
                    os.symlink(t, os.path.join(p, name))
                except OSError:
                    pass
            try:
                os.rename(p, p + ".x")
                os.symlink(random.choice(targets[-2:]), p)
                time.sleep(random.random() * 0.002)
                os.unlink(p)
                os.rename(p + ".x", p)
            except OSError:
                pass
    time.sleep(0.0005)
print(n)
"""


def ensure_member() -> tuple[int, int]:
    try:
        gid = grp.getgrnam(GROUP).gr_gid
    except KeyError:
        subprocess.run(["groupadd", GROUP], check=True)
        gid = grp.getgrnam(GROUP).gr_gid
    try:
        uid = pwd.getpwnam(MEMBER).pw_uid
    except KeyError:
        subprocess.run(["useradd", "-M", "-N", "-g", GROUP, "-s", "/usr/sbin/nologin", MEMBER], check=True)
        uid = pwd.getpwnam(MEMBER).pw_uid
    return uid, gid


def hashes(root: Path) -> dict[str, str]:
    out = {}
    for d, dirs, files in os.walk(root):
        for name in sorted(dirs + files):
            p = os.path.join(d, name)
            st = os.lstat(p)
            if os.path.islink(p):
                out[p] = "link " + os.readlink(p)
            elif os.path.isfile(p):
                with open(p, "rb") as f:
                    out[p] = f"{hashlib.sha256(f.read()).hexdigest()} {st.st_mode:o} {st.st_uid}:{st.st_gid}"
            else:
                out[p] = f"dir {st.st_mode:o}"
    return out


def group_writable(store: Path, gid: int) -> None:
    os.chown(store, 0, gid)
    os.chmod(store, 0o2775)
    for p in store.rglob("*"):
        if p.is_dir() and not p.is_symlink():
            os.chown(p, 0, gid)
            os.chmod(p, 0o2775)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ops", type=int, default=200)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("run as root", file=sys.stderr)
        return 2
    rng = random.Random(args.seed)
    uid, gid = ensure_member()
    base = Path(tempfile.mkdtemp(prefix="zring-plant-"))
    os.chmod(base, 0o755)
    secret = base / "secret"
    secret.mkdir(mode=0o700)
    (secret / "authorized_keys").write_text("ssh-ed25519 AAAA... root@host\n")
    (secret / "shadow-like").write_bytes(os.urandom(4096))
    zring.write_dataset(secret / "other-store", np.arange(3000, dtype=np.int64).reshape(1000, 3))
    for p in secret.rglob("*"):
        os.chmod(p, 0o700 if p.is_dir() else 0o600)
    targets = [str(secret / "authorized_keys"), str(secret / "shadow-like"),
               str(secret / "other-store" / "head.zr"), str(secret), str(secret / "other-store")]
    before = hashes(secret)

    shared = base / "shared"
    shared.mkdir()
    os.chown(shared, 0, gid)
    os.chmod(shared, 0o2775)
    nobody = base / "nobody"
    nobody.mkdir()
    os.chown(nobody, NOBODY, NOBODY)
    os.chmod(nobody, 0o755)

    files = base / "files"
    files.mkdir()
    for i in range(400):
        (files / f"f{i:04d}.bin").write_bytes(bytes([i % 256]) * (i % 97 + 1))
    named = shared / "named"
    zring.convert(files, named)
    group_writable(named, gid)
    flat = shared / "flat"
    zring.write_dataset(flat, np.arange(600, dtype=np.int32).reshape(200, 3), chunk_bytes=4096)
    group_writable(flat, gid)
    for name in ("c", "d"):
        pass
    zring.write_dataset(shared / "c", np.zeros((10, 3), np.int32))
    zring.write_dataset(nobody / "d", np.zeros((10, 3), np.int32))

    stop = base / "stop"
    planters = []
    member_cmd = ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--init-groups"]
    nobody_cmd = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    py = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
    store_dirs = ":".join(str(p) for p in (named, named / "names", flat))
    planters.append(subprocess.Popen(member_cmd + [py, "-c", PLANT, store_dirs, str(shared), ":".join(targets), str(stop)],
                                     env=env, stdout=subprocess.PIPE, cwd="/"))
    planters.append(subprocess.Popen(nobody_cmd + [py, "-c", PLANT, str(nobody / "d"), str(nobody), ":".join(targets),
                                                    str(stop)], env=env, stdout=subprocess.PIPE, cwd="/"))
    time.sleep(0.5)

    kinds = ["append", "delete", "compact", "replace-shared", "replace-nobody"]
    done = {k: 0 for k in kinds}
    failed: dict[str, dict[str, int]] = {k: {} for k in kinds}
    t0 = time.time()
    for i in range(args.ops):
        kind = kinds[i % len(kinds)]
        try:
            if kind == "append":
                zring.write_dataset(flat, np.full((rng.randrange(1, 400), 3), i, np.int32), append=True,
                                    chunk_bytes=4096)
            elif kind == "delete":
                with zring.Zrecord(named) as z:
                    if len(z) > 10:
                        z.delete([rng.randrange(len(z)), rng.randrange(len(z))])
            elif kind == "compact":
                target = named if i % 2 else flat
                with zring.Zrecord(target) as z:
                    z.compact()
            elif kind == "replace-shared":
                zring.write_dataset(shared / "c", np.full((rng.randrange(1, 500), 3), i, np.int32), overwrite=True)
            else:
                zring.write_dataset(nobody / "d", np.full((rng.randrange(1, 500), 3), i, np.int32), overwrite=True)
            done[kind] += 1
        except Exception as e:  # noqa: BLE001 - counted; what matters is the targets
            key = f"{type(e).__name__}: {str(e)[:90]}"
            failed[kind][key] = failed[kind].get(key, 0) + 1
    elapsed = time.time() - t0
    stop.touch()
    loops = [int(p.communicate()[0] or 0) for p in planters]
    after = hashes(secret)
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    print(f"{args.ops} operations in {elapsed:.1f} s; planter loops: member {loops[0]}, uid 65534 {loops[1]}")
    for k in kinds:
        print(f"  {k}: {done[k]} ok, {sum(failed[k].values())} failed")
        for msg, n in sorted(failed[k].items(), key=lambda x: -x[1])[:3]:
            print(f"      {n}x {msg}")
    print(f"targets hashed: {len(before)} files and directories under secret/; changed: {len(changed)}")
    for c in changed:
        print(f"  CHANGED {c}: {before.get(c)} -> {after.get(c)}")
    shutil.rmtree(base, ignore_errors=True)
    return 1 if changed else 0


if __name__ == "__main__":
    sys.exit(main())

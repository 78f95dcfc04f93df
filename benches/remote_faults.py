"""A long run against a misbehaving S3 server: a mode-3 loader over a dataset
of parts in a bucket, its cache capped at half the share, read through a
proxy (py/tests/s3_server.py) that throttles (503 SlowDown), cuts bodies
mid-stream, or both, in phases of ``--phase`` seconds, for ``--seconds``.

Counted: steps, steps that failed (must be 0), cycles in which every record
came exactly once, bytes fetched, the proxy's throttles and cuts. Then, once
the run is done: an object replaced while the loader runs (a stale error
naming it), and a server that stops answering (an error within the
deadline, naming the object).

    python benches/remote_faults.py [--seconds 300] [--phase 20]

The server is s3s-fs (``target/tools/bin/s3s-fs``, see benches/remote.py),
else moto. The result goes to ``bench-results/remote-faults.md``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "py" / "tests"))
import common  # noqa: E402
import remote as bench  # noqa: E402  (benches/remote.py: the server)
from s3_server import Faults  # noqa: E402

import zring  # noqa: E402
from zring import parts, remote  # noqa: E402

REPO = common.REPO


class Upstream:
    """What the proxy needs of its server: its port, and a signed PUT."""

    def __init__(self, srv: bench.Server):
        self.srv = srv
        self.port = srv.port

    def put(self, path: str, body: bytes) -> None:
        import boto3

        b, key = path.lstrip("/").split("/", 1)
        boto3.client("s3", endpoint_url=self.srv.endpoint, aws_access_key_id=bench.KEYS["aws_access_key_id"],
                     aws_secret_access_key=bench.KEYS["aws_secret_access_key"],
                     region_name=bench.KEYS["aws_region"]).put_object(Bucket=b, Key=key, Body=body)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=300)
    ap.add_argument("--phase", type=float, default=20)
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--token-life", type=float, default=60,
                    help="seconds each session token lasts: the proxy refuses it after (ExpiredToken)")
    a = ap.parse_args()
    data = Path(os.environ.get("ZRING_BENCH_DIR", REPO / "bench-data")) / "remote-faults"
    shutil.rmtree(data, ignore_errors=True)
    data.mkdir(parents=True)
    local = data / "local"
    per, rec = 256, 64 << 10
    n_parts = max(2, (a.mib << 20) // (per * rec))
    rng = np.random.default_rng(0)
    for k in range(n_parts):
        x = rng.integers(0, 255, size=(per, rec), dtype=np.uint8)
        x[:, :8] = np.arange(k * per, (k + 1) * per, dtype=np.uint64).view(np.uint8).reshape(per, 8)
        parts.commit(local, [parts.write_part(local, x, codec="raw")])
    srv = bench.Server(data / "s3", install=False)
    proxy = Faults(Upstream(srv))  # type: ignore[arg-type]
    out = [f"# A {a.seconds:.0f}-second mode-3 run through a faulty S3 proxy\n",
           f"`python benches/remote_faults.py --seconds {a.seconds:g} --phase {a.phase:g} --mib {a.mib} --token-life {a.token_life:g}`; server: "
           f"{srv.kind}; {n_parts} parts of {per} raw 64 KiB records; cache capped at half the share; phases of "
           f"{a.phase:g} s: none, every 3rd request 503 SlowDown, every 4th GET cut mid-body, both; credentials "
           f"from a callable, session tokens that the proxy refuses {a.token_life:g} s after they are issued.\n",
           common.machine(data), ""]
    try:
        url = f"s3://{bench.BUCKET}/ds"
        remote.upload(local, url, storage_options=srv.options())
        opts = {k: v for k, v in srv.options().items() if k not in ("aws_access_key_id", "aws_secret_access_key")}
        opts["aws_endpoint"] = proxy.endpoint
        keys = srv.options()
        issued: list[float] = []

        def credentials() -> dict:
            # A session token the proxy refuses once its life is over.
            token = f"session-{len(issued)}"
            issued.append(time.time())
            proxy.tokens[token] = time.time() + a.token_life
            return {"key_id": keys["aws_access_key_id"], "secret_key": keys["aws_secret_access_key"],
                    "token": token, "expires_in": a.token_life}

        opts["credentials"] = credentials
        share = remote.stage(url, data / "probe", storage_options=srv.options())["share_bytes"]
        cap = share // 2
        ds = zring.Dataset(url, cache=data / "cache", cache_disk_bytes=cap, storage_options=opts)
        n = len(ds)
        steps = failed = cycles_exact = cycles = 0
        errors: list[str] = []
        phases = [(0, 0), (3, 0), (0, 4), (3, 4)]
        t0 = time.perf_counter()
        with zring.DataLoader({"x": ds}, batch_size=64, mode=3, seed=3, block_records=32, window_blocks=4) as dl:
            ids: list[np.ndarray] = []
            while time.perf_counter() - t0 < a.seconds:
                ph = phases[int((time.perf_counter() - t0) // a.phase) % len(phases)]
                proxy.throttle_every, proxy.cut_every = ph
                try:
                    ids.append(next(dl)["x"][:, :8].copy().view(np.uint64)[:, 0])
                except Exception as e:  # noqa: BLE001  (counted: must be none)
                    failed += 1
                    errors.append(f"{type(e).__name__}: {e}")
                    break
                steps += 1
                if steps % (n // 64) == 0:
                    cycles += 1
                    cycles_exact += np.array_equal(np.sort(np.concatenate(ids)), np.arange(n))
                    ids = []
        proxy.throttle_every = proxy.cut_every = 0
        secs = time.perf_counter() - t0
        st = ds.remote_stats()
        out += ["| seconds | steps | failed steps | cycles | cycles with every record once | GiB fetched | "
                "throttled requests (proxy / client's count) | cut bodies | HTTP attempts / requests | session tokens "
                "issued | requests refused as expired |", "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
                f"| {secs:.0f} | {steps} | {failed} | {cycles} | {cycles_exact} | {st['bytes_fetched'] / 2**30:.2f} | "
                f"{proxy.throttled} / {st['throttles']} | {proxy.cut} | {st['http_attempts']:,} / {st['requests']:,} | "
                f"{len(issued)} | {proxy.expired} |", ""]
        if errors:
            out.append(f"First error: `{errors[0]}`\n")
        ds.close()

        # An object replaced under a run: the next fetch of it is a stale error.
        chunk = next(k for k, _, _ in zring._zring.list_objects(url, list(srv.options().items()), "parts/")
                     if k.rsplit("/", 1)[-1].startswith("chunk-"))
        fresh = zring.Dataset(url, cache=data / "cache2", cache_disk_bytes=cap, storage_options=opts)
        proxy.replace = (f"/{bench.BUCKET}/ds/{chunk}", b"another version")
        try:
            for i in range(0, len(fresh), 64):
                fresh[np.arange(i, min(i + 64, len(fresh)))]
            out.append("Replaced object: **no error** (a defect).")
        except Exception as e:  # noqa: BLE001
            out.append(f"Replaced object: `{type(e).__name__}: {e}`\n")
        fresh.close()

        # A server that stops answering: an error within the deadline.
        proxy.hang = True
        t = time.perf_counter()
        try:
            remote.stage(url, data / "cache3", storage_options={**opts, "timeout": 2, "retry_timeout": 5,
                                                                "max_retries": 2})
            out.append("Stopped server: **no error** (a defect).")
        except Exception as e:  # noqa: BLE001
            out.append(f"Stopped server: after {time.perf_counter() - t:.1f} s, `{type(e).__name__}: {e}`\n")
        proxy.hang = False
    finally:
        proxy.stop()
        srv.stop()
    text = "\n".join(out)
    print(text)
    common.write_result(REPO / "bench-results" / "remote-faults.md", text)


if __name__ == "__main__":
    main()

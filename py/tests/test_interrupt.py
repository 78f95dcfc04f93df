"""A consumer blocked in ``DataLoader.next()`` stays responsive.

The step is made to block for good: after the store is open, its chunk file is
replaced by a FIFO nobody writes to, so the gather thread waits in ``open()``
(chunk files are opened when first read). Each scenario runs in a fresh
interpreter with a deadline, so a hang fails the test instead of freezing the
suite; the child leaves with ``os._exit`` since its gather thread never ends.
"""

import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import zring

PRELUDE = textwrap.dedent(
    """
    import os, sys, threading, time
    import zring

    path = sys.argv[1]
    ds = zring.Dataset(path)
    chunks = [p for p in os.listdir(path) if p.startswith("chunk-")]
    assert len(chunks) == 1, chunks
    chunk = os.path.join(path, chunks[0])
    os.rename(chunk, chunk + ".real")
    os.mkfifo(chunk)
    loader = zring.DataLoader({"x": ds}, num_workers=1, prefetch_size=1, batch_size=4, **KW)
    """
)


def run(tmp_path, body: str, kw: str = "{}", interrupt_after: float | None = None) -> str:
    zring.write_dataset(tmp_path / "d", np.arange(400, dtype=np.int64).reshape(100, 4), codec="raw")
    script = f"KW = {kw}\n" + PRELUDE + textwrap.dedent(body)
    proc = subprocess.Popen([sys.executable, "-c", script, str(tmp_path / "d")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        if interrupt_after is not None:
            assert proc.stdout.readline().strip() == "waiting", proc.stderr.read()
            time.sleep(interrupt_after)
            proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"the child hung\nstdout: {out}\nstderr: {err}")
    assert proc.returncode == 0, f"stdout: {out}\nstderr: {err}"
    return out


@pytest.mark.parametrize("kw", ["{}", "{'transform': lambda b: b, 'transform_workers': 1}"])
def test_ctrl_c_interrupts_a_blocked_next(tmp_path, kw):
    out = run(tmp_path, """
        print("waiting", flush=True)
        try:
            loader.next()
            print("returned")
        except KeyboardInterrupt:
            print("interrupted", flush=True)
        os._exit(0)
    """, kw=kw, interrupt_after=0.3)
    assert out.strip().splitlines()[-1] == "interrupted"


def test_state_and_stats_answer_while_another_thread_waits_in_next(tmp_path):
    out = run(tmp_path, """
        t = threading.Thread(target=loader.next, daemon=True)
        t.start()
        time.sleep(0.3)
        assert t.is_alive(), "the step should still be blocked"
        # Other Python threads run: this one does, and answers come back.
        state = loader.state()
        stats = loader.stats()
        print("answered", state["sampler"]["step"], stats["steps_delivered"], flush=True)
        os._exit(0)
    """)
    assert out.split() == ["answered", "0", "0"]

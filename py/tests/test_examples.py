"""Every example in examples/ runs to completion on its own generated data.

The examples are the workflows the README points a newcomer to; each checks
its own result (decoded images, mixture shares, a resume, shards that
concatenate to the global batch, a falling loss) and exits non-zero when it
is wrong, so running them is a test of what the README promises. One whose
optional dependency is missing is skipped, naming it.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

# example -> (arguments for a run of seconds, the optional module it needs)
RUNS = {
    "vision.py": ([], None),
    "lm_mixture.py": ([], None),
    "ranks.py": ([], None),
    "parts.py": ([], None),
    "parts_ranks.py": ([], None),
    "torch_loop.py": ([], "torch"),
    "ray_write.py": (["--docs", "4000", "--more", "1000"], "ray"),
}
# Examples that another test module already runs.
ELSEWHERE = {"jax_train.py": "test_jax.py", "jax_lm.py": "test_jax_lm.py"}


@pytest.mark.parametrize("name", sorted(RUNS))
def test_example_runs(name):
    args, needs = RUNS[name]
    path = EXAMPLES / name
    if not path.exists():
        pytest.skip(f"{name} is not in this checkout")
    if needs is not None and importlib.util.find_spec(needs) is None:
        pytest.skip(f"{name} needs {needs}, which is not installed")
    proc = subprocess.run([sys.executable, str(path), *args], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"{name} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    assert proc.stdout.strip(), f"{name} printed no result"


def test_every_example_is_run():
    """A new example must be added to RUNS (or ELSEWHERE) so that it is run."""
    present = {p.name for p in EXAMPLES.glob("*.py")}
    assert present - set(RUNS) - set(ELSEWHERE) == set()

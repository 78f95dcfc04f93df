"""Shared fixtures: the loaderx reference module and small deterministic data."""

import importlib
import os
import time

import numpy as np
import pytest


def wait_child(pid: int, deadline: float) -> int | None:
    """Waits for a forked child until ``deadline`` (time.monotonic()); returns
    its wait status, or kills it and returns None if it is still running."""
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            return None
        time.sleep(0.005)


@pytest.fixture(scope="session")
def loaderx():
    """The reference implementation, loaderx 0.7.3; skips (with the reason) when absent."""
    try:
        return importlib.import_module("loaderx")
    except Exception as exc:  # ImportError, or its native library failing to load
        pytest.skip(f"loaderx is not importable ({type(exc).__name__}: {exc}); "
                    "install loaderx==0.7.3 to run the compatibility tests")


@pytest.fixture(scope="session")
def zring():
    return importlib.import_module("zring")


@pytest.fixture
def images():
    """64 small structured 'images' (compressible, distinct per record)."""
    rng = np.random.default_rng(7)
    base = np.arange(8 * 8 * 3, dtype=np.uint8).reshape(8, 8, 3)
    noise = rng.integers(0, 4, size=(64, 8, 8, 3), dtype=np.uint8)
    return (base[None] + noise + np.arange(64, dtype=np.uint8)[:, None, None, None]).astype(np.uint8)


@pytest.fixture
def sequences():
    """Ragged int32 token sequences of lengths 1..9 (loaderx rejects empty records)."""
    rng = np.random.default_rng(11)
    return [rng.integers(0, 1000, size=int(n), dtype=np.int32) for n in rng.integers(1, 10, size=40)]

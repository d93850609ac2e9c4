"""Recompute the stored reference outputs (tests/qwen3_tts/reference_outputs/) after a change to the tiny
checkpoints or to what the tests ask the reference. Needs the reference venv (reference_env.sh).

    .venv/bin/python tests/qwen3_tts/make_reference_outputs.py

It runs the equality tests with QWEN3_TTS_RECORD=1: every reference output a test asks for is computed in
the reference venv and stored (the old files are removed first, so none goes stale), then compared as usual.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent
ROOT = HERE.parent.parent
USERS = ["test_talker.py", "test_clone.py", "test_icl.py", "test_codec.py", "test_pipeline.py"]


def main() -> int:
    store = HERE / "reference_outputs"
    store.mkdir(exist_ok=True)
    for old in store.glob("*.npz"):
        old.unlink()
    tests = [str(HERE / name) for name in USERS if (HERE / name).exists()]
    env = {**os.environ, "QWEN3_TTS_RECORD": "1"}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests]
    done = subprocess.run(cmd, cwd=ROOT, env=env)
    stored = sorted(store.glob("*.npz"))
    size = sum(p.stat().st_size for p in stored)
    print(f"{len(stored)} reference outputs in {store} ({size / 1e6:.2f} MB)")
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())

"""Child processes that never outlive their parent (stage processes, diffusion's parallel ranks)."""

from __future__ import annotations

import contextlib
import os
import threading


def watch_parent() -> None:
    """The parent holds our stdin pipe open; EOF means it is gone (even after SIGKILL): leave at once."""

    def run() -> None:
        with contextlib.suppress(Exception):
            while os.read(0, 1):
                pass
        os._exit(0)

    threading.Thread(target=run, name="parent-watch", daemon=True).start()

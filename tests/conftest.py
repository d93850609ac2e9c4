"""Suite-wide settings. Area fixtures live in tests/<area>/conftest.py."""

import os

# Keep the suite within its time budget on 2 cores and independent of the caller's environment.
os.environ.setdefault("OMNISTAGE_LOG_LEVEL", "WARNING")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

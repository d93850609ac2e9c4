"""Qwen2.5-Omni pieces the pipeline (`omnistage/pipelines/qwen2_5_omni.py`) is built from."""

#!/usr/bin/env bash
# The Qwen3-TTS reference (qwen-tts-hf 0.1.1.post1) runs on transformers 5.17 only, while omnistage needs
# 5.24, so equality tests call it in a second venv made here (pip only). Idempotent: a stamp file marks a
# finished install. Usage: reference_env.sh [VENV_DIR]  (default: $OMNISTAGE_CACHE or ~/.cache/omnistage).
set -euo pipefail
ROOT="${OMNISTAGE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/omnistage}"
VENV="${1:-$ROOT/qwen3-tts-ref/venv}"
PYTHON="${PYTHON:-python3}"
STAMP="$VENV/.installed-qwen-tts-hf-0.1.1.post1"
if [ -f "$STAMP" ]; then echo "$VENV"; exit 0; fi
"$PYTHON" -m venv "$VENV"
# torch first, from the same pin as omnistage's venv, so no resolver pulls another build.
"$VENV/bin/python" -m pip install -q torch==2.13.0
"$VENV/bin/python" -m pip install -q transformers==5.17.0 accelerate safetensors tokenizers numpy soundfile \
    librosa einops "torch==2.13.0"
# --no-deps: the package declares gradio, torchaudio, sox and onnxruntime, none of which the 12 Hz path needs.
"$VENV/bin/python" -m pip install -q --no-deps qwen-tts-hf==0.1.1.post1
touch "$STAMP"
echo "$VENV"

"""Qwen3-TTS (12 Hz): talker + code predictor on the AR engine, codec decoder on the generation engine."""

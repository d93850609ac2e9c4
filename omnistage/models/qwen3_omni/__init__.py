"""Qwen3-Omni: MoE thinker → talker + code predictor → code2wav."""

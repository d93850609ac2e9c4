"""Whisper on omnistage's engines: the audio encoder (generation engine) and the decoder (AR engine, with
cross-attention to its request's encoder output). See omnistage/pipelines/whisper.py."""

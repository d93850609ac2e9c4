"""The demo's trained voice: the `hibari-tts` package's bundled ONNX voice on the generation engine."""

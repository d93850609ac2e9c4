"""Configuration: pipeline topology (Python, model-owned) and deployment (YAML, user-owned)."""

"""omnistage: disaggregated serving for any-to-any multimodal models, as graphs of stages."""

__version__ = "0.1.0"

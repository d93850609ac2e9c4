"""Model code transformers lacks for serving: streaming decoders, stage-level loaders, processor assembly."""

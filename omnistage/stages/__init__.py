"""Per-stage engines (AR, generation, diffusion) and the worker loop that drives them."""

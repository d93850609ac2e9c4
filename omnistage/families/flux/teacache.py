"""TeaCache on FLUX.1: the published polynomial (TeaCache4FLUX) that turns the relative change of the first
block's modulated input into an estimate of the output's change. The block's AdaLayerNormZero `norm1` is the
engine's generic rule."""

from __future__ import annotations

TRANSFORMERS = ("FluxTransformer2DModel",)
COEFFICIENTS = (4.98651651e02, -2.83781631e02, 5.58554382e01, -3.82021401e00, 2.64230861e-01)

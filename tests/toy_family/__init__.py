"""A model family defined only here, under tests/, that plugs into every engine seam a family uses: a
decoder-layer form for the lean decoder, an extra model input for the AR engine, a typed speech option and
a diffusion step adapter. `register()` is all omnistage needs; nothing outside this folder names it.

- `toy-speaker` (model.py, pipeline.py): an AR talker whose decoder layers are classes of its own (Llama's
  arithmetic under other names, so the lean decoder runs them only through the form registered here), with
  an extra forward input `toy_shift` that moves every prompt embedding (the request's `ToyShift`
  extension), set by the speech option of the same name; its tokens are spoken by the runtime's toy vocoder.
- `toy-sd` (diffusion.py): Stable Diffusion 1.x (`StableDiffusionPipeline`, which no built-in family
  serves), stepped by the engine through the step adapter registered here.
"""

from __future__ import annotations

FAMILY = f"{__name__}:register"


def register() -> None:
    from omnistage.stages.ar.cpu.layer_forms import LayerForm, register_layer_form
    from omnistage.stages.ar.extra_inputs import register_extra_input
    from omnistage.stages.diffusion.adapters import register_step_adapter
    from tests.toy_family.diffusion import StableDiffusionAdapter
    from tests.toy_family.model import ToyShift, shift_kwargs

    register_layer_form(LayerForm("ToyDecoderLayer", "ToyAttention", ("ToyRMSNorm",)))
    register_extra_input(ToyShift, shift_kwargs)
    register_step_adapter("StableDiffusionPipeline", StableDiffusionAdapter)

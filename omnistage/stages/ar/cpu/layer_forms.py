"""The decoder-layer forms the lean decoder runs (lean_decoder.py), registered by the families whose
models have them.

A form names a decoder layer class and the classes of its parts, for layers whose forward is: pre-norm
attention with rotary q/k (optionally each head's q and k RMS-normed first), a residual, a pre-norm MLP (a
gated SiLU, or the named mixture-of-experts block, called as the model calls it), a residual; RMS norm =
weight * x * rsqrt(mean(x²) + eps). A layer with no registered form keeps the model's own forward.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class LayerForm:
    layer: str  # the decoder layer class's name
    attention: str
    norms: tuple[str, ...]  # every RMS norm class the layer (and the model's final norm) may use
    experts: str | None = None  # the mixture-of-experts block, where the MLP is one


_FORMS: dict[str, LayerForm] = {}


def register_layer_form(form: LayerForm) -> LayerForm:
    _FORMS[form.layer] = form
    return form


def layer_form(layer_class: str) -> LayerForm | None:
    return _FORMS.get(layer_class)

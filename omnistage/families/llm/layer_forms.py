"""The decoder layers of the plain LLM architectures the lean decoder runs (stages/ar/cpu/layer_forms.py):
Llama, Qwen2, Qwen3 (per-head q/k norms) and Qwen3-MoE (its experts block called as the model calls it).
Families whose models are built of these layers (a spoken chat's LLM, Qwen3-TTS's talker) register them
too."""

from __future__ import annotations

from omnistage.stages.ar.cpu.layer_forms import LayerForm, register_layer_form

LLAMA = LayerForm("LlamaDecoderLayer", "LlamaAttention", ("LlamaRMSNorm",))
QWEN2 = LayerForm("Qwen2DecoderLayer", "Qwen2Attention", ("Qwen2RMSNorm",))
QWEN3 = LayerForm("Qwen3DecoderLayer", "Qwen3Attention", ("Qwen3RMSNorm",))
QWEN3_MOE = LayerForm(
    "Qwen3MoeDecoderLayer", "Qwen3MoeAttention", ("Qwen3MoeRMSNorm",), "Qwen3MoeSparseMoeBlock"
)
LLM_FORMS = (LLAMA, QWEN2, QWEN3, QWEN3_MOE)


def register_llm_forms() -> None:
    for form in LLM_FORMS:
        register_layer_form(form)

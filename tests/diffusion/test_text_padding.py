"""Cross-attention to a padded prompt with one key for all of its padding equals attention to every row."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from diffusers import WanTransformer3DModel

from omnistage.stages.diffusion import text_padding
from tests.diffusion.helpers import model_dir


def padded_text(lengths: list[int], total: int, dim: int, seed: int = 0) -> torch.Tensor:
    """What a Wan pipeline passes: each prompt's rows, then zero rows up to `total`, through one linear
    layer (so the padding rows are identical but not zero)."""
    g = torch.Generator().manual_seed(seed)
    text = torch.zeros(len(lengths), total, dim)
    for i, n in enumerate(lengths):
        text[i, :n] = torch.randn(n, dim, generator=g)
    return F.linear(text, torch.randn(dim, dim, generator=g), torch.randn(dim, generator=g))


def test_collapsed_padding_attends_as_every_padding_row_does() -> None:
    text = padded_text([3, 9, 1], total=40, dim=8)
    kept, bias = text_padding.collapse_padding(text)
    assert kept.shape[1] == 10  # the longest prompt (9) and one padding row
    g = torch.Generator().manual_seed(1)
    q = torch.randn(3, 2, 5, 8, generator=g)
    w_k, w_v = torch.randn(8, 8, generator=g), torch.randn(8, 8, generator=g)

    def attend(rows: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        k = F.linear(rows, w_k).unsqueeze(1).expand(-1, 2, -1, -1)
        v = F.linear(rows, w_v).unsqueeze(1).expand(-1, 2, -1, -1)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    torch.testing.assert_close(attend(kept, bias), attend(text, None), rtol=1e-5, atol=1e-5)  # float rounding
    # a sample without padding: nothing can be dropped
    full = padded_text([3, 40], total=40, dim=8)
    assert text_padding.collapse_padding(full)[1] is None


def test_wan_cross_attention_runs_on_the_collapsed_prompt() -> None:
    """The tiny Wan transformer with the processor installed gives the plain transformer's output while its
    cross-attention projects only the prompt rows and one padding row."""
    path = model_dir("tiny-wan21-t2v")
    plain = WanTransformer3DModel.from_pretrained(path, subfolder="transformer").eval()
    collapsed = WanTransformer3DModel.from_pretrained(path, subfolder="transformer").eval()
    assert text_padding.install(collapsed) == len(collapsed.blocks)
    seen: list[int] = []
    collapsed.blocks[0].attn2.to_k.register_forward_hook(lambda m, args, out: seen.append(args[0].shape[1]))

    config = plain.config
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(2, config.in_channels, 2, 4, 4, generator=g)
    text = torch.zeros(2, 24, config.text_dim)
    text[0, :5] = torch.randn(5, config.text_dim, generator=g)
    text[1, :11] = torch.randn(11, config.text_dim, generator=g)
    timestep = torch.tensor([700, 700])
    with torch.no_grad():
        expected = plain(hidden_states=hidden, timestep=timestep, encoder_hidden_states=text).sample
        out = collapsed(hidden_states=hidden, timestep=timestep, encoder_hidden_states=text).sample
    assert seen == [12]
    assert (out - expected).abs().max() <= 1e-5

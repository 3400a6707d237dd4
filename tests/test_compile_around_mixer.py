"""Blocks with an fla mixer compile around it: every child but the mixer is compiled (fullgraph)."""

import torch
from torch import nn

from parallax_titan.parallelize import compile_around_mixer


class _Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.attention = nn.Linear(8, 8)
        self.attention_norm = nn.LayerNorm(8)
        self.feed_forward = nn.Sequential(nn.Linear(8, 16), nn.SiLU(), nn.Linear(16, 8))

    def forward(self, x):
        x = x + self.attention(self.attention_norm(x))
        return x + self.feed_forward(x)


class _Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleDict({"0": _Block(), "1": _Block()})

    def forward(self, x):
        for block in self.layers.values():
            x = block(x)
        return x


def test_every_child_but_the_mixer_is_compiled_and_outputs_match():
    torch.manual_seed(0)
    model = _Model()
    x = torch.randn(3, 8)
    expected = model(x)
    compile_around_mixer(model, "aot_eager")
    for block in model.layers.values():
        assert not isinstance(block.attention, torch._dynamo.eval_frame.OptimizedModule)
        assert isinstance(block.attention_norm, torch._dynamo.eval_frame.OptimizedModule)
        assert isinstance(block.feed_forward, torch._dynamo.eval_frame.OptimizedModule)
    torch.testing.assert_close(model(x), expected)

"""A tiny LLaMA-style model dumped by msprobe itself (run in the msprobe test venv).

usage: python msprobe_tiny_llama.py DUMP_DIR DTYPE [STEPS] [LAYERS] [DIM] [VOCAB] [SEQ]
Calls: embedding, rms_norm (registered: msprobe does not wrap F.rms_norm), linear, silu,
softmax, matmul, cross entropy; forward and backward, task "tensor", level L1
(MSPROBE_LEVEL=mix: with the modules, so construct.json names each call's module).
"""
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.norm = nn.Parameter(torch.ones(d) + 0.1 * torch.randn(d))
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.up = nn.Linear(d, 2 * d, bias=False)
        self.down = nn.Linear(d, d, bias=True)

    def forward(self, h):
        x = F.rms_norm(h, (h.shape[-1],), self.norm, eps=1e-6)
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        att = torch.softmax(torch.matmul(q, k.transpose(-1, -2)) / q.shape[-1] ** 0.5, dim=-1)
        h = h + torch.matmul(att, v)
        return h + self.down(F.silu(self.up(h)).chunk(2, dim=-1)[0])


class TinyLlama(nn.Module):
    def __init__(self, vocab, d, layers):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(Block(d) for _ in range(layers))
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, ids):
        h = self.emb(ids)
        for block in self.blocks:
            h = block(h)
        return self.head(h)


def main():
    out, dtype = sys.argv[1], getattr(torch, sys.argv[2])
    steps, layers, d, vocab, seq = (int(a) for a in (sys.argv[3:] + ["1", "1", "16", "64",
                                                                      "8"][len(sys.argv) - 3:]))
    from msprobe.pytorch import PrecisionDebugger
    torch.manual_seed(0)
    model = TinyLlama(vocab, d, layers).to(dtype)
    level = os.environ.get("MSPROBE_LEVEL", "L1")  # "mix": modules too (construct.json)
    dbg = PrecisionDebugger(task="tensor", level=level, dump_path=out)
    PrecisionDebugger.register_custom_api(F, "rms_norm", "Functional")
    for _ in range(steps):
        ids = torch.randint(0, vocab, (2, seq))
        dbg.start(model if level == "mix" else None)
        logits = model(ids)
        loss = F.cross_entropy(logits.reshape(-1, vocab), ids.reshape(-1))
        loss.backward()
        dbg.stop()
        dbg.step()


if __name__ == "__main__":
    main()

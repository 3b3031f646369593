"""One training step of a small causal self-attention model on fmha, in bf16 on a GPU or
fp32 on the CPU:

    python examples/python/train_step.py [--device cuda] [--steps 3]
"""

import argparse

import torch

import fmha


class Attention(torch.nn.Module):
    def __init__(self, dim=256, heads=8, kv_heads=2):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        self.q = torch.nn.Linear(dim, dim, bias=False)
        self.kv = torch.nn.Linear(dim, 2 * kv_heads * self.head_dim, bias=False)
        self.o = torch.nn.Linear(dim, dim, bias=False)

    def forward(self, x):  # x: (batch, seqlen, dim)
        b, s, _ = x.shape
        q = self.q(x).view(b, s, self.heads, self.head_dim)
        k, v = self.kv(x).view(b, s, 2, self.kv_heads, self.head_dim).unbind(2)
        out = fmha.flash_attn_func(q, k, v, causal=True)  # GQA: 8 query heads over 2 KV heads
        return self.o(out.reshape(b, s, -1))


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args(argv)
    dtype = torch.float32 if args.device == "cpu" else torch.bfloat16
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(100, 256), Attention(), torch.nn.Linear(256, 100))
    model = model.to(args.device, dtype)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tokens = torch.randint(0, 100, (4, 128), device=args.device)
    for step in range(args.steps):
        logits = model(tokens[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(f"step {step}: loss {loss.item():.4f}")
    return loss.item()


if __name__ == "__main__":
    main()

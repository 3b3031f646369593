"""The end-to-end suite: one training step (forward, loss, backward) of a Llama-shaped
Hugging Face model built from a config with random weights, with its attention run by fmha
(attn_implementation="fmha") and by transformers' other implementations: "sdpa" with
torch's cuDNN and flash backends forced, "flash_attention_2" when flash-attn is installed.
Everything but the attention is the same model, so the step times compare what a training
job would see.  The losses of one step on the same tokens are compared before any time is
reported."""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Callable, Optional

import torch

from . import timing
from .peers import _fa2_func


@dataclasses.dataclass(frozen=True)
class ModelCase:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    batch: int
    seqlen: int
    dtype: torch.dtype

    def params(self) -> int:
        d, kv = self.hidden, self.hidden // self.heads * self.kv_heads
        per_layer = d * d * 2 + d * kv * 2 + 3 * d * self.intermediate + 2 * d
        return self.layers * per_layer + 2 * self.vocab * d + d

    def label(self) -> str:
        n = self.params()
        size = f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M"
        return (f"Llama {size} (hidden {self.hidden}, {self.layers} layers, {self.heads}/"
                f"{self.kv_heads} heads) B={self.batch} S={self.seqlen}")


def cases(device: torch.device, quick: bool, dtype: torch.dtype) -> list[ModelCase]:
    """On a GPU: TinyLlama-1.1B's shape (22 layers at width 2048, GQA 32:4), bf16, one
    sequence of 4096 tokens (4 layers with --quick).  On the CPU: a small model."""
    if device.type == "cuda":
        return [ModelCase(2048, 4 if quick else 22, 32, 4, 5632, 32000, 1, 4096, dtype)]
    return [ModelCase(256, 2, 4, 2, 688, 1000, 2, 256, dtype)]


@dataclasses.dataclass
class Impl:
    name: str
    attn_implementation: str
    context: Callable[[], contextlib.AbstractContextManager]


def impls(device: torch.device) -> list[Impl]:
    """fmha first, then what this torch and transformers can run here."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import fmha.integrations.transformers as hf

    hf.register()
    out = [Impl("fmha", hf.NAME, contextlib.nullcontext)]
    if device.type == "cuda":
        if hasattr(SDPBackend, "CUDNN_ATTENTION"):
            out.append(Impl("sdpa-cudnn", "sdpa", lambda: sdpa_kernel(SDPBackend.CUDNN_ATTENTION)))
        out.append(Impl("sdpa-flash", "sdpa", lambda: sdpa_kernel(SDPBackend.FLASH_ATTENTION)))
        if _fa2_func() is not None:
            out.append(Impl("flash_attention_2", "flash_attention_2", contextlib.nullcontext))
    else:
        out.append(Impl("sdpa", "sdpa", contextlib.nullcontext))
    return out


def build(case: ModelCase, device: torch.device):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(hidden_size=case.hidden, num_hidden_layers=case.layers, num_attention_heads=case.heads,
                      num_key_value_heads=case.kv_heads, intermediate_size=case.intermediate,
                      vocab_size=case.vocab, max_position_embeddings=case.seqlen)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).to(device=device, dtype=case.dtype)
    model.train()
    return model


def run(case: ModelCase, device: torch.device, budget: float) -> dict:
    """Step time (ms) and tokens/s of every implementation, and each one's loss on the same
    tokens against fmha's."""
    model = build(case, device)
    gen = torch.Generator().manual_seed(1)
    batches = [torch.randint(0, case.vocab, (case.batch, case.seqlen), generator=gen).to(device) for _ in range(2)]
    row = {"suite": "model", "case": case.label(), "params": case.params(), "tokens": case.batch * case.seqlen,
           "ms": {}, "tokens_per_s": {}, "loss": {}, "skipped": {}}
    for impl in impls(device):
        try:
            model.set_attn_implementation(impl.attn_implementation)

            def step(ids):
                with impl.context():
                    loss = model(input_ids=ids, labels=ids).loss
                    loss.backward()
                return loss

            with impl.context(), torch.no_grad():
                row["loss"][impl.name] = model(input_ids=batches[0], labels=batches[0]).loss.item()
            ms = timing.median_ms([lambda ids=ids: step(ids) for ids in batches], device, warmup=2, min_runs=5,
                                  budget_s=budget)
            model.zero_grad(set_to_none=True)
            row["ms"][impl.name] = ms
            row["tokens_per_s"][impl.name] = row["tokens"] / (ms * 1e-3)
        except (RuntimeError, ValueError, ImportError) as e:  # an implementation refusing this model
            row["skipped"][impl.name] = str(e).splitlines()[0][:100]
            model.zero_grad(set_to_none=True)
            if device.type == "cuda":
                torch.cuda.empty_cache()
    return row


def loss_gap(row: dict) -> Optional[float]:
    """Largest relative difference of another implementation's loss from fmha's."""
    if "fmha" not in row["loss"] or len(row["loss"]) < 2:
        return None
    ref = row["loss"]["fmha"]
    return max(abs(v - ref) / abs(ref) for k, v in row["loss"].items() if k != "fmha")

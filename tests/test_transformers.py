"""fmha as a Hugging Face transformers attention implementation
(fmha.integrations.transformers): tiny randomly initialised Llama (GQA), Mistral (sliding
window) and Gemma-2 (softcap, alternating sliding layers) models built from configs, with
attn_implementation="fmha" against transformers' own "sdpa" (or "eager" for Gemma-2's
softcap, which SDPA cannot express): logits of padded batches (right and left padding) and
of packed sequences, greedy generate() with a KV cache, and one training step's gradients."""

import pytest
import torch

transformers = pytest.importorskip("transformers")

import fmha.integrations.transformers as fmha_hf  # noqa: E402

fmha_hf.register()

VOCAB = 97


def _config(kind):
    # A larger initializer than the default 0.02 so that attention is far from uniform and
    # the window, softcap and masks change the result.
    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                  initializer_range=0.25, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    if kind == "llama":
        return transformers.LlamaConfig(**common)
    if kind == "mistral":
        return transformers.MistralConfig(sliding_window=7, **common)
    if kind == "gemma2":
        return transformers.Gemma2Config(head_dim=16, sliding_window=7, attn_logit_softcapping=2.0,
                                         final_logit_softcapping=None, query_pre_attn_scalar=16, **common)
    raise ValueError(kind)


REFERENCE = {"llama": "sdpa", "mistral": "sdpa", "gemma2": "eager"}


def _models(kind, device, dtype=None):
    """The same weights under "fmha" and under the reference implementation."""
    if dtype is None:
        dtype = torch.float32 if device == "cpu" else torch.bfloat16
    # One config object per model: a model reads its attention implementation from it.
    ours = transformers.AutoModelForCausalLM.from_config(_config(kind), attn_implementation="fmha", dtype=dtype)
    ref = transformers.AutoModelForCausalLM.from_config(_config(kind), attn_implementation=REFERENCE[kind],
                                                        dtype=dtype)
    ref.load_state_dict(ours.state_dict())
    assert ours.config._attn_implementation == "fmha"
    return ours.to(device).eval(), ref.to(device).eval()


def _tol(device):
    return 2e-4 if device == "cpu" else 3e-2


def _assert_close(a, b, tol, what):
    err = ((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-6)).item()
    assert err <= tol, f"{what}: max error {err:.3g} relative to the largest value (tolerance {tol:g})"


def _padded_batch(side, device, seqlen=24, lengths=(24, 17, 5)):
    ids = torch.randint(3, VOCAB, (len(lengths), seqlen))
    mask = torch.zeros(len(lengths), seqlen, dtype=torch.long)
    for b, n in enumerate(lengths):
        if side == "right":
            mask[b, :n] = 1
        else:
            mask[b, seqlen - n:] = 1
    ids = ids.masked_fill(mask == 0, 0)
    return ids.to(device), mask.to(device)


@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("kind", ["llama", "mistral", "gemma2"])
def test_padded_batch_logits(device, kind, side):
    ours, ref = _models(kind, device)
    ids, mask = _padded_batch(side, device)
    with torch.no_grad():
        got = ours(input_ids=ids, attention_mask=mask).logits
        want = ref(input_ids=ids, attention_mask=mask).logits
    keep = mask.bool()
    _assert_close(got[keep], want[keep], _tol(device), f"{kind} logits ({side} padding)")


@pytest.mark.parametrize("kind", ["llama", "mistral"])
def test_packed_sequences(device, kind):
    # One row holding three sequences, position ids restarting at each: the same logits as
    # each sequence on its own.
    ours, ref = _models(kind, device)
    lengths = [11, 4, 15]
    seqs = [torch.randint(3, VOCAB, (1, n), device=device) for n in lengths]
    packed = torch.cat(seqs, dim=1)
    position_ids = torch.cat([torch.arange(n, device=device) for n in lengths]).unsqueeze(0)
    with torch.no_grad():
        got = ours(input_ids=packed, position_ids=position_ids).logits
        want = torch.cat([ref(input_ids=s).logits for s in seqs], dim=1)
    _assert_close(got, want, _tol(device), f"{kind} packed logits")


def test_restarts_answer_follows_the_tensor_and_its_version():
    # The packed-sequence check is read back once per position-id tensor (every layer gets
    # the same one): a new tensor, or the same one written in place, is checked again.
    plain = torch.arange(8).unsqueeze(0)
    assert not fmha_hf._restarts(plain, 1)
    assert not fmha_hf._restarts(plain, 1)
    plain[0, 4:] = torch.arange(4)  # in place: now two sequences
    assert fmha_hf._restarts(plain, 1)
    packed = torch.cat([torch.arange(3), torch.arange(5)]).unsqueeze(0)
    assert fmha_hf._restarts(packed, 1)
    assert not fmha_hf._restarts(torch.arange(8).unsqueeze(0), 1)
    assert not fmha_hf._restarts(packed, 2)  # a batch of two rows is never packed


def test_precomputed_cu_seq_lens(device):
    # Sequence boundaries from cu_seq_lens alone: the position ids run on across the
    # boundary (so they do not mark it), and the reference gives each sequence those ids.
    ours, ref = _models("llama", device)
    lengths = [9, 6]
    seqs = [torch.randint(3, VOCAB, (1, n), device=device) for n in lengths]
    cu = torch.tensor([0, 9, 15], dtype=torch.int32, device=device)
    positions = torch.arange(15, device=device).unsqueeze(0)
    with torch.no_grad():
        got = ours(input_ids=torch.cat(seqs, dim=1), position_ids=positions, cu_seq_lens_q=cu,
                   cu_seq_lens_k=cu, max_length_q=9, max_length_k=9).logits
        want = torch.cat([ref(input_ids=seqs[0], position_ids=positions[:, :9]).logits,
                          ref(input_ids=seqs[1], position_ids=positions[:, 9:]).logits], dim=1)
    _assert_close(got, want, _tol(device), "logits with cu_seq_lens")


@pytest.mark.parametrize("kind", ["llama", "gemma2"])
def test_greedy_generate(device, kind):
    # Left-padded prompts, KV cache: prefill then one-token steps (bottom-right causal). In
    # fp32 on every device: tokens are compared exactly, and bf16 rounding could flip a
    # near-tie between two correct implementations.
    ours, ref = _models(kind, device, torch.float32)
    ids, mask = _padded_batch("left", device, seqlen=12, lengths=(12, 7))
    kw = dict(attention_mask=mask, max_new_tokens=10, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        got = ours.generate(ids, **kw)
        want = ref.generate(ids, **kw)
    assert torch.equal(got, want), f"greedy tokens differ:\n{got}\n{want}"


@pytest.mark.parametrize("kind", ["llama", "mistral", "gemma2"])
def test_training_step_gradients(device, kind):
    ours, ref = _models(kind, device)
    ids, mask = _padded_batch("right", device)
    labels = ids.masked_fill(mask == 0, -100)
    for model in (ours, ref):
        model.train()
        model.zero_grad()
        model(input_ids=ids, attention_mask=mask, labels=labels).loss.backward()
    params = dict(ref.named_parameters())
    for name, p in ours.named_parameters():
        if p.grad is None:
            continue
        _assert_close(p.grad, params[name].grad, 5 * _tol(device), f"{kind} gradient of {name}")


def test_unsupported_calls_raise():
    q = torch.randn(1, 2, 3, 16)

    class Module(torch.nn.Module):
        is_causal = True

    with pytest.raises(ValueError, match="s_aux must have shape"):
        fmha_hf.attention_forward(Module(), q, q, q, None, s_aux=torch.zeros(3))


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_sinks_match_gpt_oss_eager(device, causal):
    # gpt-oss passes its sinks as s_aux; transformers' own eager gpt-oss attention (the sink
    # as an extra logit column) is the reference: output and gradients, sinks included.
    from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward

    class Module(torch.nn.Module):
        num_key_value_groups = 2
        training = False

        def __init__(self):
            super().__init__()
            self.sinks = torch.nn.Parameter(torch.randn(4, device=device) + 1.0)

    module = Module()
    module.is_causal = causal
    q, k, v = (torch.randn(2, h, 13, 16, device=device) for h in (4, 2, 2))
    mask = None
    if causal:
        mask = torch.full((13, 13), -torch.inf, device=device).triu(1)[None, None]
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    ref, _ = eager_attention_forward(module, *leaves, mask, scaling=16 ** -0.5)
    ref.sum().backward()
    ref_grads = [x.grad for x in leaves] + [module.sinks.grad.clone()]
    module.sinks.grad = None
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    out, _ = fmha_hf.attention_forward(module, *leaves, None, scaling=16 ** -0.5, s_aux=module.sinks)
    out.sum().backward()
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    for name, got, want in zip(("dq", "dk", "dv", "dsinks"), [x.grad for x in leaves] + [module.sinks.grad], ref_grads):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5, msg=name)

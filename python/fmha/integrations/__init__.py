"""fmha inside other libraries' attention switches.

- `fmha.integrations.torch_flash`: fmha behind torch's flash-attention ops (SDPA's flash
  backend, varlen_attn), registered with torch on import, activated by the user.
- `fmha.integrations.transformers`: an `attn_implementation` for Hugging Face transformers
  (`register()`, then `attn_implementation="fmha"`).

transformers is imported only by its submodule, so importing fmha never needs it.
"""

// Argument checks run by every entry point before any backend sees the params.  Each
// message names the field and the limit, in words a caller can act on.
#pragma once

#include "fmha/fmha.h"

namespace fmha {

// Copies a caller's params (of the caller's struct_size) into the current layout.
fmha_fwd_params read_params(const fmha_fwd_params* p);
fmha_bwd_params read_params(const fmha_bwd_params* p);
fmha_decode_params read_params(const fmha_decode_params* p);

void validate(const fmha_fwd_params& p);
void validate(const fmha_bwd_params& p);
void validate(const fmha_decode_params& p);

// Reads cu_seqlens/seqused_k on the host and rejects inconsistent values.  Only for
// metadata in host memory (the CPU backend); GPU kernels clamp instead (sequence.h).
void validate_host_metadata(const fmha_problem& p);
void validate_host_metadata(const fmha_decode_params& p);

}  // namespace fmha

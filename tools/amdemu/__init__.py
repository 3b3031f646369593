"""amdemu: a wave64 CDNA2/CDNA3 (gfx90a / gfx942) ISA emulator that executes the code
objects of fmha's HIP kernels (csrc/hip_fmha/) without an AMD GPU.  See README.md here and
docs/amd.md ("Executed on an ISA emulator")."""

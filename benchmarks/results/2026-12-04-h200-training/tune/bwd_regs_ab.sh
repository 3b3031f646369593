# bwd_sm90 register split A/B: base (producer 24, consumers 240) against r40 (40 / 232).
set -u
for D in 64 128 256; do
  for v in base r40; do
    inc=csrc; [ $v = r40 ] && inc=.dev/r40/csrc
    nvcc -std=c++17 -O3 --use_fast_math -gencode arch=compute_90a,code=sm_90a -DTUNE_D=$D -I$inc -I$inc/include \
      tools/tune/tune_sm90_bwd.cu csrc/cuda_fmha/tma.cu -o /tmp/tb_${v}_$D &
  done
done
wait
for r in 1 2 3; do
  for D in 64 128 256; do
    for v in base r40; do echo "== round $r $v D=$D"; /tmp/tb_${v}_$D; done
  done
done

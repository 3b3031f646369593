#!/bin/bash
# FlashAttention-4 (pip flash-attn-4, CuTe DSL) on a machine without network access, for the
# benchmark's `fa4` peer (python/fmha/bench/peers.py).  Its libraries wheel is larger than one
# transfer to such a machine may be (64 MiB on the project's device tool), so it travels in
# two halves.  Three steps:
#
#   tools/fa4_carry.sh prepare [DIR]   here, with network: download the wheels for Python 3.12,
#                                      x86-64, and write DIR/A (half one) and DIR/B (half two and
#                                      the small wheels); DIR defaults to .fa4 (git-ignored, so
#                                      that it travels only where named, e.g. the device tool's
#                                      carry: [".fa4/A"], then [".fa4/B"])
#   tools/fa4_carry.sh stash [DIR]     there, carrying DIR/A: keep half one in /tmp
#   tools/fa4_carry.sh install [DIR]   there, carrying DIR/B, right after (the machine must still
#                                      be the same one): join the halves and install into
#                                      /tmp/fa4site, then print the PYTHONPATH to export
#
# Measured with flash-attn-4 4.0.0b40 and nvidia-cutlass-dsl 4.8.1 (2026-12-04): 4.8.1 splits
# the DSL into -libs-base, -libs-core (the Python `cutlass.cute`) and -libs-cu13 (92 MB, 63.6 MB
# as tar.xz), all needed.  cuda-bindings, protobuf, einops, typing_extensions and torch must be
# there already.
set -euo pipefail
cmd=${1:-}
dir=${2:-.fa4}
site=/tmp/fa4site

case "$cmd" in
prepare)
  mkdir -p "$dir/wheels" "$dir/A" "$dir/B/w"
  python3 -m pip download --no-deps --only-binary=:all: --pre --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$dir/wheels" \
    flash-attn-4 nvidia-cutlass-dsl nvidia-cutlass-dsl-libs-base nvidia-cutlass-dsl-libs-core \
    nvidia-cutlass-dsl-libs-cu13 apache-tvm-ffi torch-c-dlpack-ext quack-kernels
  libs=$(ls "$dir"/wheels/nvidia_cutlass_dsl_libs_cu13-*.whl)
  tmp=$(mktemp -d)
  python3 -m zipfile -e "$libs" "$tmp"
  tar -C "$tmp" -cf - . | xz -T0 -9 > "$dir/libs.tar.xz"
  rm -rf "$tmp"
  split -n 2 -d "$dir/libs.tar.xz" "$dir/part"
  mv "$dir/part00" "$dir/A/" && mv "$dir/part01" "$dir/B/"
  for w in "$dir"/wheels/*.whl; do [ "$w" = "$libs" ] || cp "$w" "$dir/B/w/"; done
  du -sh "$dir/A" "$dir/B"
  ;;
stash)
  cp "$dir/A/part00" /tmp/fa4_part00
  ;;
install)
  cat /tmp/fa4_part00 "$dir/B/part01" > /tmp/fa4_libs.tar.xz
  mkdir -p "$site"
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" "$dir"/B/w/*.whl
  tar -xJf /tmp/fa4_libs.tar.xz -C "$site"
  export PYTHONPATH="$site:$site/nvidia_cutlass_dsl/dsl_packages${PYTHONPATH:+:$PYTHONPATH}"
  python3 -c "import flash_attn.cute, importlib.metadata as m; print('flash-attn-4', m.version('flash-attn-4'))" >&2
  echo "export PYTHONPATH=$site:$site/nvidia_cutlass_dsl/dsl_packages"
  ;;
*)
  sed -n '2,20p' "$0"
  exit 2
  ;;
esac

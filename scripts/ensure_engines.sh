#!/usr/bin/env bash
# What make test's second engine and browser runs need, installed where it can be: wgpudawn
# (the WebGPU API on Dawn) and playwright with pip; with apt, Debian's chromium-common (its
# SwiftShader Vulkan driver is the adapter Dawn finds on a machine without a GPU) and chromium.
# And the references the comparisons with other libraries run against: PyTorch's CPU build
# (torch.optim.Muon, the DDP hand-off; torch==2.13.0 is the CPU wheel of the package index this
# project uses, where a bare `torch` pulls a CUDA build of several GB), transformers (the Hugging
# Face export through its pipeline) and peft (the LoRA export).
# Best effort: what cannot be installed here, make test skips with one line saying why.
set -u
PY=${1:-.venv/bin/python}
if ! "$PY" -c "import wgpudawn, playwright" 2>/dev/null; then
  "$PY" -m pip install -q --disable-pip-version-check -e '.[dawn,browser]' >/dev/null 2>&1 \
    && echo "installed wgpudawn and playwright" \
    || echo "could not pip install wgpudawn and playwright: the Dawn and browser runs will be skipped"
fi
if ! "$PY" -c "import torch.optim, transformers, peft; torch.optim.Muon" 2>/dev/null; then
  "$PY" -m pip install -q --disable-pip-version-check torch==2.13.0 transformers peft >/dev/null 2>&1 \
    && echo "installed torch (CPU), transformers and peft" \
    || echo "could not pip install torch==2.13.0, transformers and peft: the comparisons with them will be skipped"
fi
need=()
[ -f /usr/lib/chromium/vk_swiftshader_icd.json ] || need+=(chromium-common)
[ -x /usr/bin/chromium ] || need+=(chromium)
if [ ${#need[@]} -gt 0 ] && command -v apt-get >/dev/null 2>&1; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo -n"
  inst() { DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null 2>&1; }
  if inst || { $SUDO apt-get update -qq >/dev/null 2>&1 && inst; }; then
    echo "installed ${need[*]}"
  else
    echo "could not install ${need[*]} (no root or no network): the Dawn and browser runs will be skipped"
  fi
fi
exit 0

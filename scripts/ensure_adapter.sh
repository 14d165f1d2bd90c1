#!/usr/bin/env bash
# Makes sure wgpu finds a WebGPU adapter. When none is found, installs Mesa's
# Vulkan driver (lavapipe, runs compute shaders on the CPU) with apt where we
# can; otherwise the OpenGL llvmpipe adapter, if present, serves.
set -u
PY=${1:-.venv/bin/python}
probe() { "$PY" -m tinygpt info --brief 2>/dev/null; }
if out=$(probe) && ! grep -q OpenGL <<<"$out"; then echo "adapter: $out"; exit 0; fi
if command -v apt-get >/dev/null 2>&1; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo -n"
  echo "no Vulkan adapter found: installing mesa-vulkan-drivers (lavapipe)"
  if $SUDO apt-get update -qq >/dev/null 2>&1 && \
     DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq mesa-vulkan-drivers >/dev/null 2>&1; then
    echo "installed mesa-vulkan-drivers"
  else
    echo "could not install mesa-vulkan-drivers (no root or no network); trying what is there"
  fi
fi
if out=$(probe); then echo "adapter: $out"; exit 0; fi
echo "no WebGPU adapter: install a GPU driver, or 'apt-get install mesa-vulkan-drivers' on Debian/Ubuntu" >&2
exit 1

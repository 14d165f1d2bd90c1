"""tinygpt: a WebGPU trainer for small GPT models (wgpu-py, WGSL kernels, NumPy reference)."""
__version__ = "0.1.0"

"""The WebGPU layer: the host API (gpu), one launcher per WGSL entry point (kernels), the kernel
plan as data (plan) and the one place it is made (planner), the tuning cache and `tinygpt tune`,
timing and the FLOPs of a dispatch. It knows nothing of models."""

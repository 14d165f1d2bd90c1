"""The judge: a NumPy function for every WGSL entry point, with the same name and its inputs in
binding order (kernels, attention), and the whole model built from them (gpt). Tests and scripts
compare the device against it; runtime code never imports it, the tuner excepted."""

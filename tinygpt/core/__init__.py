"""The bottom layer, which every other imports: the config and presets, the precision policy,
errors worded for the CLI, the initial weights, and the file-system primitives. It imports
nothing of the package above it."""

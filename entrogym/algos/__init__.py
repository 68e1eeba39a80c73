"""The algorithm core: advantages, clipped losses, entropy control, presets, buffers."""

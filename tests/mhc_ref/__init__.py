"""Torch references of the mHC family (the definitions the GPU tests compare against)."""

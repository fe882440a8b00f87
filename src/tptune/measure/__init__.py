"""Measuring: the launcher, the GPU pool, the worker and its backends and blocks."""

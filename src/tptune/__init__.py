"""tptune: pick the tensor-parallel size and TP comm/compute overlap config of a model's linear layers."""

__version__ = "0.1.0"

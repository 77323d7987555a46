"""lidarseg models: the sparse tensor and its maps (sparse_tensor.py), sparse layers (layers.py),
the networks (minkunet.py, spunet.py) and their folded inference copies (fold.py), checkpoints in
our format (checkpoints.py; its meta: checkpoint_meta.py; errors: checkpoint_errors.py) and
importers of reference layouts (importers.py, reference_layouts.py, pointcept.py, *_compat.py),
the label space (labels.py) and the shipped weights (weights/). Built on kernels/; nothing here
imports app/."""

from kernels.engine import EngineConfig

from .layers import BatchNorm, ReLU, SparseConv3d, SparseInverseConv3d, SubMConv3d, cat
from .sparse_tensor import CoordinateManager, SparseTensor
from .spconv_compat import native_algo, weight_from_spconv, weight_to_spconv

__all__ = [
    "BatchNorm",
    "CoordinateManager",
    "EngineConfig",
    "ReLU",
    "SparseConv3d",
    "SparseInverseConv3d",
    "SparseTensor",
    "SubMConv3d",
    "cat",
    "native_algo",
    "weight_from_spconv",
    "weight_to_spconv",
]

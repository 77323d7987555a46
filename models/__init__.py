"""lidarseg models: the sparse tensor, sparse layers and networks built on kernels/."""
from kernels.engine import EngineConfig

from .layers import BatchNorm, ReLU, SparseConv3d, SparseInverseConv3d, SubMConv3d, cat
from .sparse_tensor import CoordinateManager, SparseTensor
from .spconv_compat import weight_from_spconv, weight_to_spconv

__all__ = [
    "BatchNorm", "CoordinateManager", "EngineConfig", "ReLU", "SparseConv3d",
    "SparseInverseConv3d", "SparseTensor", "SubMConv3d", "cat", "weight_from_spconv",
    "weight_to_spconv",
]

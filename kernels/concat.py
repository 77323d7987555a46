"""A channel concatenation that is never made where only int8 convs read it.

A U-Net decoder concatenates its upsampled rows with the encoder's skip rows, and on the CPU in
int8 the two convs that read the result (a residual block's first conv and its 1x1 shortcut)
only need it quantized: ls_quantize_concat_u8_cpu quantizes the two parts side by side, one
scale per row over both, exactly as it would quantize the concatenation. The default model's
four concatenations cost about 2.2 ms a KITTI frame in torch.cat.

RowConcat stands in for the [N, Ca + Cb] tensor: shape, dtype and device as the tensor's; any
other use (a torch function, an attribute the tensor has) makes the tensor once and goes on with
it, so code that does not know RowConcat still gets the right values.
"""

from __future__ import annotations

import torch


class RowConcat:
    """torch.cat([a, b], dim=1), made only when something needs the tensor itself."""

    def __init__(self, a: torch.Tensor, b: torch.Tensor):
        self.parts = (a, b)
        self.shape = torch.Size((a.shape[0], a.shape[1] + b.shape[1]))
        self.dtype, self.device = a.dtype, a.device
        self._made: torch.Tensor | None = None

    def dim(self) -> int:
        return 2

    def __len__(self) -> int:
        return self.shape[0]

    @property
    def _version(self) -> tuple[int, int]:
        """Changes when a part is written in place (as a tensor's _version does)."""
        return (self.parts[0]._version, self.parts[1]._version)

    def tensor(self) -> torch.Tensor:
        """The concatenation itself, made on first use."""
        if self._made is None:
            self._made = torch.cat(self.parts, dim=1)
        return self._made

    def __getattr__(self, name: str):
        if name.startswith("__") or name in ("parts", "_made"):
            raise AttributeError(name)
        return getattr(self.tensor(), name)

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        def made(value):
            if isinstance(value, RowConcat):
                return value.tensor()
            if isinstance(value, (list, tuple)):
                return type(value)(made(v) for v in value)
            return value

        return func(*made(args), **{k: made(v) for k, v in (kwargs or {}).items()})

    def __repr__(self) -> str:
        return f"RowConcat({tuple(self.shape)}, {self.dtype}, {self.device})"


def concat_rows(a: torch.Tensor, b: torch.Tensor, precision: str) -> torch.Tensor | RowConcat:
    """[a | b] row for row: a RowConcat where int8 convs on the CPU will read it in inference
    (no autograd), else torch.cat."""
    if (
        precision == "int8"
        and not torch.is_grad_enabled()
        and a.device.type == b.device.type == "cpu"
        and a.dtype == b.dtype == torch.float32
        and a.dim() == b.dim() == 2
        and a.shape[0] == b.shape[0]
        and a.is_contiguous()
        and b.is_contiguous()
    ):
        return RowConcat(a, b)
    return torch.cat([a, b], dim=1)

"""A channel concatenation, and a conv output, that are never made where only int8 convs read
them.

A U-Net decoder concatenates its upsampled rows with the encoder's skip rows, and on the CPU in
int8 the two convs that read the result (a residual block's first conv and its 1x1 shortcut)
only need it quantized: ls_quantize_concat_u8_cpu quantizes the two parts side by side, one
scale per row over both, exactly as it would quantize the concatenation. The default model's
four concatenations cost about 2.2 ms a KITTI frame in torch.cat.

The network's last conv feeds only the head, whose argmax the pipeline wants: that conv can
compute each row's class as it makes the row (ClassifiedOutput), and the rows need not be
written either.

A residual block's first conv feeds only its second: in int8 the first quantizes its ReLU output
as it makes it (kernels/int8.py), and the second reads nothing else, so the fp32 rows need not
be written to memory at all (a 60k-row level at 48 channels: 11.5 MB written and read back per
conv). UnkeptOutput stands in for them.

Both stand in for the tensor (MadeOnUse): shape, dtype and device as the tensor's; any other use
(a torch function, an attribute the tensor has) makes the tensor once and goes on with it, so
code that does not know them still gets the right values.
"""

from __future__ import annotations

import torch

from . import deferred


class MadeOnUse:
    """Stands in for an fp32 [N, C] tensor that the int8 convs reading it never need made:
    shape, dtype and device as the tensor's; any other use (a torch function, an attribute the
    tensor has) makes the tensor once (`_make`) and goes on with it, so code that does not know
    the stand-in still gets the right values."""

    def __init__(self, shape: tuple[int, int], dtype: torch.dtype, device: torch.device):
        self.shape = torch.Size(shape)
        self.dtype, self.device = dtype, device
        self._made: torch.Tensor | None = None

    def _make(self) -> torch.Tensor:
        raise NotImplementedError

    def dim(self) -> int:
        return 2

    def __len__(self) -> int:
        return self.shape[0]

    def tensor(self) -> torch.Tensor:
        """The tensor itself, made on first use."""
        if self._made is None:
            with deferred.eager():  # the caller reads it (torch): made by kernels that have run
                self._made = self._make()
        return self._made

    def __getattr__(self, name: str):
        if name.startswith("__") or name in ("parts", "_made", "_remake", "classes"):
            raise AttributeError(name)
        return getattr(self.tensor(), name)

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        def made(value):
            if isinstance(value, MadeOnUse):
                return value.tensor()
            if isinstance(value, (list, tuple)):
                return type(value)(made(v) for v in value)
            return value

        return func(*made(args), **{k: made(v) for k, v in (kwargs or {}).items()})

    def __repr__(self) -> str:
        return f"{type(self).__name__}({tuple(self.shape)}, {self.dtype}, {self.device})"


class RowConcat(MadeOnUse):
    """torch.cat([a, b], dim=1), made only when something needs the tensor itself."""

    def __init__(self, a: "torch.Tensor | UnkeptOutput", b: torch.Tensor):
        super().__init__((a.shape[0], a.shape[1] + b.shape[1]), a.dtype, a.device)
        self.parts = (a, b)

    @property
    def _version(self) -> tuple[int, int]:
        """Changes when a part is written in place (as a tensor's _version does)."""
        return (self.parts[0]._version, self.parts[1]._version)

    def _make(self) -> torch.Tensor:
        return torch.cat([p.tensor() if isinstance(p, MadeOnUse) else p for p in self.parts], 1)


class UnkeptOutput(MadeOnUse):
    """The fp32 output of an int8 conv that only quantized it for the next int8 conv (a
    residual block's first conv: kernels/int8.py), its rows never written to memory. Made on
    use by running the conv again (`remake`: the same kernel on the same inputs, the same
    bits)."""

    def __init__(self, shape: tuple[int, int], remake):
        super().__init__(shape, torch.float32, torch.device("cpu"))
        self._remake = remake

    @property
    def _version(self) -> int:
        """0 while unmade (nothing can write it); once made, never 0 again, so a record of its
        quantization (which belongs to the unmade rows) no longer matches."""
        return 0 if self._made is None else self._made._version + 1

    def _make(self) -> torch.Tensor:
        made = self._remake()
        self._remake = None  # what it held (the conv's input and map) can go
        return made


class ClassifiedOutput(UnkeptOutput):
    """The fp32 output of the network's last int8 conv, which computed the head's class of each
    row as it made the rows (kernels/int8.py, OutputUse.head) and kept only those: `classes`
    (uint8 [N]). The rows are made on use, as UnkeptOutput's are."""

    def __init__(self, shape: tuple[int, int], remake, classes: torch.Tensor):
        super().__init__(shape, remake)
        self.classes = classes


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
    with deferred.eager():
        return torch.cat([a, b], dim=1)

"""The dtypes kernelgen computes in, and the promotions it applies."""
from __future__ import annotations

import builtins
import enum

import numpy as np

from .errors import DtypeError


class DType(enum.Enum):
    """Element types. f16 is a storage type: arithmetic on it runs in f32 (see ``compute``)."""

    float32 = "float32"
    float16 = "float16"
    float64 = "float64"
    int32 = "int32"
    int64 = "int64"
    bool = "bool"

    def __str__(self) -> str:
        return self.value

    @property
    def numpy(self) -> np.dtype:
        return np.dtype(self.value)

    @property
    def is_float(self) -> builtins.bool:
        return self in (DType.float32, DType.float16, DType.float64)

    @property
    def is_int(self) -> builtins.bool:
        return self in (DType.int32, DType.int64)

    @property
    def itemsize(self) -> int:
        return self.numpy.itemsize

    @property
    def compute(self) -> DType:
        """The type arithmetic runs in: f16 values are widened to f32 on load."""
        return DType.float32 if self is DType.float16 else self


def as_dtype(value: DType | str | np.dtype | type, op: str = "dtype",
             input: str | None = None) -> DType:
    """Accept 'float32', np.float32, np.dtype('float32') or a DType; anything else raises
    ``DtypeError`` naming ``op`` and the tensor ``input`` it was meant for."""
    if isinstance(value, DType):
        return value
    try:
        return DType(np.dtype(value).name)
    except (TypeError, ValueError):
        names = ", ".join(d.value for d in DType)
        raise DtypeError(op, input, f"one kernelgen supports ({names})", repr(value)) from None


FLOATS = frozenset({DType.float32, DType.float16, DType.float64})
INTS = frozenset({DType.int32, DType.int64})
NUMERIC = FLOATS | INTS

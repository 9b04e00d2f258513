"""Reduction operations: names, numpy kernels and which dtypes each accepts (MPI-4.0 section 6.9.2)."""
from __future__ import annotations

import numpy as np

__all__ = ["OPS", "op_name", "check_op_dtype", "SUPPORTED_DTYPES", "CANONICAL"]

_INT = "iu"
#: numpy kernel of each predefined MPI operation.
OPS = {
    "SUM": np.add,
    "PROD": np.multiply,
    "MAX": np.maximum,
    "MIN": np.minimum,
    "LAND": np.logical_and,
    "LOR": np.logical_or,
    "LXOR": np.logical_xor,
    "BAND": np.bitwise_and,
    "BOR": np.bitwise_or,
    "BXOR": np.bitwise_xor,
    "AVG": np.add,  # NCCL's ncclAvg, torch's ReduceOp.AVG: summed, then divided by the rank count once
}
# dtype kinds (numpy `dtype.kind`) valid for each op, as the MPI standard lists them:
# SUM/PROD: integer, floating, complex; MAX/MIN: integer, floating;
# logical ops: integer and logical; bitwise ops: integer (and byte).
_VALID_KINDS = {
    "SUM": "iufc", "PROD": "iufc", "MAX": "iuf", "MIN": "iuf",
    "LAND": "iub", "LOR": "iub", "LXOR": "iub",
    "BAND": "iu", "BOR": "iu", "BXOR": "iu", "AVG": "fc",
}
#: dtypes with a predefined MPI datatype (numpy's float16/longdouble have none portable).
SUPPORTED_DTYPES = tuple(np.dtype(t) for t in (
    "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float32", "float64", "complex64", "complex128", "bool"))
#: (kind, itemsize) -> the one dtype ringmpi sends for it: numpy's equal-but-distinct dtypes
#: ('l' and 'q' on LP64) would otherwise reach MPI as different datatypes on different ranks
CANONICAL = {(d.kind, d.itemsize): d for d in SUPPORTED_DTYPES}


def op_name(op: object) -> str:
    """Normalise an op given as a name ("sum", "SUM") or an object with a predefined name.

    mpi4py's `MPI.SUM` is translated by the MPI transport (the only module that knows
    mpi4py, `Group.op_name`); here only names and objects carrying `ringmpi_name`.
    """
    if isinstance(op, str):
        name = op.upper()
    else:
        name = getattr(op, "ringmpi_name", None)
        if not isinstance(name, str):
            raise ValueError(f"unknown reduction op {op!r}; expected a name ({', '.join(OPS)}) "
                             "or one of MPI's predefined ops")
        name = name.upper()
    if name not in OPS:
        raise ValueError(f"unknown reduction op {op!r}; expected one of {', '.join(OPS)}")
    return name


def check_op_dtype(op: str, dtype: np.dtype) -> str | None:
    """Return why `op` is invalid for `dtype`, or None when it is valid."""
    if dtype.kind not in _VALID_KINDS[op]:
        return f"op {op} is not defined for dtype {dtype} (MPI allows it on kinds {_VALID_KINDS[op]!r})"
    return None

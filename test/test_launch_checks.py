"""The argument checks every kernel launcher runs (model/cuda_launch_common.py), on the CPU: they take anything with
a dtype and a shape, so numpy arrays stand in for GPUArrays. A wrong array is refused naming the argument; a right
one passes whichever way the expected dtype is spelled."""
import numpy as np
import pytest

from vla_edge_ros.model.cuda_launch_common import KernelError, check_array


def test_a_wrong_array_is_refused_by_name_and_a_right_one_passes_however_its_dtype_is_spelled():
    staging = np.zeros((2, 3, 4, 5), np.uint16)
    for spelled in (np.uint16, "uint16", np.dtype(np.uint16)):
        check_array("kv staging", staging, spelled, 4)
    with pytest.raises(KernelError, match=r"kv staging: dtype uint16, expected float32"):
        check_array("kv staging", staging, np.float32, 4)
    with pytest.raises(KernelError, match=r"kv staging: shape \(2, 3, 4, 5\), expected 3 dimensions"):
        check_array("kv staging", staging, np.uint16, 3)
    with pytest.raises(KernelError, match="kv slots: missing array"):
        check_array("kv slots", None, np.int32)
    with pytest.raises(KernelError, match="expected int32"):
        check_array("kv slots", np.zeros(4, np.int64), np.int32)      # same kind, other width: still refused

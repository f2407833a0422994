"""What the learner publishes is a copy: the next optimizer step must not change a version already handed to
the weights channel (on CPU the parameter and the copy would otherwise share memory)."""
from __future__ import annotations

import numpy as np
import torch

from actors.zero_engine import _as_bytes


def test_the_published_bytes_do_not_follow_the_parameter():
    param = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    dtype, shape, raw = _as_bytes(param)
    param.add_(100.0)  # the next step
    assert dtype == "float32" and shape == (2, 3)
    assert np.frombuffer(raw, np.float32).tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]


def test_a_non_contiguous_parameter_is_published_in_row_major_order():
    param = torch.arange(6, dtype=torch.bfloat16).reshape(3, 2).t()
    dtype, shape, raw = _as_bytes(param)
    assert dtype == "bfloat16" and shape == (2, 3)
    got = torch.frombuffer(bytearray(raw), dtype=torch.bfloat16).reshape(2, 3)
    assert torch.equal(got, param.contiguous())

"""Pinning a role's process to CPU cores (Linux `sched_setaffinity`); children started later inherit it."""
from __future__ import annotations

import os
from typing import Sequence


def pin_to_cores(cores: Sequence[int], key: str) -> None:
    """Pin this process to `cores` (ids on this node); nothing when empty. `key` names the config field in the
    error raised for a core this node does not have."""
    if not cores:
        return
    try:
        os.sched_setaffinity(0, list(cores))
    except OSError:
        raise ValueError(f"{key}={list(cores)}: this node's usable cores are {sorted(os.sched_getaffinity(0))}") \
            from None

"""The learning-rate schedule by hand, and the learner config's own checks."""
from __future__ import annotations

import pytest

from configs.fields import ConfigError
from configs.load import load_config
from core.lr_schedule import lr_multiplier


def test_lr_schedule_by_hand():
    assert [lr_multiplier(i, warmup_steps=4) for i in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    cos = [lr_multiplier(i, warmup_steps=2, schedule="cosine", decay_steps=4, min_ratio=0.1)
           for i in range(8)]
    assert cos[:3] == [0.5, 1.0, 1.0]
    assert cos[4] == pytest.approx(0.1 + 0.9 * 0.5) and cos[6:] == [pytest.approx(0.1)] * 2
    lin = [lr_multiplier(i, schedule="linear", decay_steps=4) for i in range(6)]
    assert lin == [1.0, 0.75, 0.5, 0.25, 0.0, 0.0]
    with pytest.raises(ValueError, match="decay_steps"):
        lr_multiplier(0, schedule="cosine")


def test_a_decaying_schedule_needs_decay_steps():
    with pytest.raises(ConfigError, match="learner.lr_decay_steps"):
        load_config(None, ["learner.lr_schedule=cosine"])
    cfg = load_config(None, ["learner.lr_schedule=cosine", "learner.lr_decay_steps=100"])
    assert cfg.learner.lr_decay_steps == 100
    with pytest.raises(ConfigError, match="learner.betas"):
        load_config(None, ["learner.betas=[0.9]"])

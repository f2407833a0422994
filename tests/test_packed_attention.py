"""packed_sdpa (core/packed_attention.py): a packed row attended one sequence at a time gives the scores and
the gradients of sdpa's dense mask over the row, on a real (tiny) model; what it refuses."""
from __future__ import annotations

import pytest
import torch

from core.packed_attention import NAME, packed_sdpa_forward, register, sequence_bounds


def test_sequence_bounds():
    assert sequence_bounds(torch.tensor([[0, 1, 2, 0, 1, 0, 1, 2, 3]])) == [(0, 3), (3, 5), (5, 9)]
    assert sequence_bounds(torch.tensor([5, 6, 7])) == [(0, 3)]  # one sequence, not starting at 0
    assert sequence_bounds(torch.tensor([0, 0, 0])) == [(0, 1), (1, 2), (2, 3)]  # three one-token sequences
    assert sequence_bounds(torch.tensor([], dtype=torch.long)) == []


def _row(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    lengths = [7, 1, 12, 5]
    ids = torch.randint(0, 400, (1, sum(lengths)), generator=g)
    pos = torch.cat([torch.arange(n) for n in lengths]).unsqueeze(0)
    return ids, pos


def _model(tiny_model_dir, attn: str):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32, attn_implementation=attn)


def test_packed_row_matches_dense_mask_in_scores_and_gradients(tiny_model_dir):
    register()
    ids, pos = _row()
    results = {}
    for attn in (NAME, "sdpa"):
        model = _model(tiny_model_dir, attn)
        logits = model(input_ids=ids, position_ids=pos, use_cache=False).logits
        (logits.log_softmax(-1)[0, :, 3].sum()).backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        results[attn] = (logits.detach(), grads)
    packed, dense = results[NAME], results["sdpa"]
    assert torch.allclose(packed[0], dense[0], atol=1e-5)
    assert packed[1].keys() == dense[1].keys() and len(packed[1]) > 10
    for name in dense[1]:
        assert torch.allclose(packed[1][name], dense[1][name], atol=1e-5, rtol=1e-4), name


def test_sequences_do_not_see_each_other(tiny_model_dir):
    """Changing the first sequence's tokens leaves every later sequence's logits as they were."""
    register()
    model = _model(tiny_model_dir, NAME).eval()
    ids, pos = _row()
    other = ids.clone()
    other[0, :7] = (other[0, :7] + 1) % 400
    with torch.no_grad():
        a = model(input_ids=ids, position_ids=pos, use_cache=False).logits
        b = model(input_ids=other, position_ids=pos, use_cache=False).logits
    assert not torch.allclose(a[0, :7], b[0, :7])
    assert torch.equal(a[0, 7:], b[0, 7:])


def test_refuses_batches_masks_and_decoding():
    module = torch.nn.Module()
    q, kv = torch.zeros(1, 4, 6, 8), torch.zeros(1, 2, 6, 8)
    with pytest.raises(ValueError, match="batch of 1 row"):
        packed_sdpa_forward(module, torch.zeros(2, 4, 6, 8), torch.zeros(2, 2, 6, 8), torch.zeros(2, 2, 6, 8), None)
    with pytest.raises(ValueError, match="takes none"):
        packed_sdpa_forward(module, q, kv, kv, torch.ones(1, 1, 6, 6, dtype=torch.bool))
    with pytest.raises(ValueError, match="does not decode"):
        packed_sdpa_forward(module, q[:, :, :1], kv, kv, None)
    out, weights = packed_sdpa_forward(module, q, kv, kv, None, position_ids=torch.tensor([[0, 1, 2, 0, 1, 2]]))
    assert out.shape == (1, 6, 4, 8) and weights is None

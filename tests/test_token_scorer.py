"""`core.token_scorer.logprobs_and_entropy`: the entropy as a metric (no graph, in blocks of rows) equals the
one computed with its graph, which the entropy bonus needs."""
from __future__ import annotations

import torch

from core.token_scorer import ENTROPY_ROWS, logprobs_and_entropy


def reference_entropy(logits: torch.Tensor) -> torch.Tensor:
    logp = torch.log_softmax(logits.double(), dim=-1)
    return -(logp.exp() * logp).sum(-1)


def test_the_metric_entropy_has_no_graph_and_equals_the_one_with_it_across_blocks():
    torch.manual_seed(0)
    rows = 2 * ENTROPY_ROWS + 5  # three blocks, the last one short
    logits = (torch.randn(rows, 1000) * 3).requires_grad_()
    targets = torch.randint(0, 1000, (rows,))
    lp_metric, metric = logprobs_and_entropy(logits, targets, with_entropy=True)
    lp_graph, graph = logprobs_and_entropy(logits, targets, with_entropy=True, entropy_grad=True)
    assert not metric.requires_grad and graph.requires_grad
    assert torch.allclose(metric, graph.detach(), atol=1e-5)
    assert torch.allclose(metric.double(), reference_entropy(logits.detach()), atol=1e-4)
    assert torch.equal(lp_metric, lp_graph) and lp_metric.requires_grad
    assert logprobs_and_entropy(logits, targets, with_entropy=False)[1] is None


def test_the_entropy_bonus_still_has_its_gradient():
    torch.manual_seed(1)
    logits = torch.randn(4, 50, requires_grad=True)
    _, entropy = logprobs_and_entropy(logits, torch.zeros(4, dtype=torch.long), with_entropy=True,
                                      entropy_grad=True)
    entropy.sum().backward()
    expected = torch.autograd.grad(reference_entropy(logits).sum(), logits)[0]
    assert torch.allclose(logits.grad, expected, atol=1e-5)

"""Sampling: rejection sampling reproduces the target distribution; top-k / top-p keep the right tokens."""

from __future__ import annotations

import pytest
import torch

from dflash_bench.engine.reference.sampling import accept, probs_from_logits, rejection_sample
from dflash_bench.engine.sampling_params import SamplingParams

pytestmark = pytest.mark.engine
N, V = 200_000, 6


def _outputs(acc, bonus, drafts):
    """First and second emitted tokens (second only where the first draft was accepted)."""
    first = torch.where(acc >= 1, drafts[:, 0], bonus)
    has_second = acc >= 1
    second = torch.where(acc >= 2, drafts[:, 1], bonus)[has_second]
    return first, second


def _freq(tokens):
    return torch.bincount(tokens, minlength=V).double() / len(tokens)


@pytest.mark.parametrize("one_hot", [False, True])
def test_rejection_sampling_reproduces_target_distribution(one_hot):
    g = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    p = torch.softmax(torch.randn(3, V, generator=g) * 1.5, -1)  # target at positions 0, 1, 2
    q = torch.softmax(torch.randn(2, V, generator=g) * 1.5, -1)  # draft distribution at positions 0, 1
    if one_hot:  # greedy drafter: always proposes its argmax
        drafts = q.argmax(-1).expand(N, 2).contiguous()
        qq = None
    else:
        drafts = torch.stack([torch.multinomial(q[i], N, replacement=True, generator=g) for i in range(2)], 1)
        qq = q.expand(N, 2, V)
    acc, bonus = rejection_sample(p.expand(N, 3, V), drafts, qq)
    first, second = _outputs(acc, bonus, drafts)
    tol = 5 * (0.25 / N) ** 0.5 * 2  # five standard errors, generously
    assert (_freq(first) - p[0].double()).abs().max() < tol
    assert (_freq(second) - p[1].double()).abs().max() < 5 * (0.25 / len(second)) ** 0.5 * 2
    # the first draft is accepted with probability sum(min(p, q)), the best any lossless rule can do
    qd = torch.nn.functional.one_hot(q.argmax(-1), V).double() if one_hot else q.double()
    expected = torch.minimum(p[0].double(), qd[0]).sum()
    assert abs((acc >= 1).double().mean() - expected) < tol


def test_greedy_rows_accept_longest_matching_prefix():
    logits = torch.full((2, 4, V), -5.0)
    target = torch.tensor([[1, 2, 3, 4], [5, 0, 1, 2]])
    logits.scatter_(2, target[..., None], 5.0)
    drafts = torch.tensor([[1, 2, 0], [4, 0, 1]])
    acc, bonus = accept(logits, drafts, None, [SamplingParams(), SamplingParams()])
    assert acc.tolist() == [2, 0] and bonus.tolist() == [3, 5]


def test_top_k_and_top_p():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05, 1e-9, 1e-9]]))
    one = torch.ones(1)
    p = probs_from_logits(logits, one, torch.tensor([2]), one)
    assert torch.allclose(p, torch.tensor([[0.625, 0.375, 0, 0, 0, 0]]), atol=1e-6)
    p = probs_from_logits(logits, one, torch.tensor([0]), torch.tensor([0.7]))  # 0.5 + 0.3 reaches 0.7
    assert torch.allclose(p, torch.tensor([[0.625, 0.375, 0, 0, 0, 0]]), atol=1e-6)
    p = probs_from_logits(logits, torch.tensor([1e-3]), torch.tensor([0]), one)
    assert p[0, 0] > 0.999


def test_sampled_drafts_then_accept_keep_the_target_distribution_row_by_row():
    from dflash_bench.engine.reference.sampling import sample_drafts

    torch.manual_seed(1)
    g = torch.Generator().manual_seed(1)
    n = 60_000
    target = (torch.randn(3, V, generator=g) * 1.5).expand(n, 3, V)
    draft = (torch.randn(2, V, generator=g) * 1.5).expand(n, 2, V)
    params = [SamplingParams(temperature=0.0) if i % 2 else SamplingParams(temperature=0.8) for i in range(n)]
    tokens, q = sample_drafts(draft.clone(), params)
    acc, bonus = accept(target.clone(), tokens, q, params)
    first, _ = _outputs(acc, bonus, tokens)
    hot, greedy = first[0::2], first[1::2]
    p = torch.softmax(target[0, 0] / 0.8, -1).double()
    assert (_freq(hot) - p).abs().max() < 5 * (0.25 / len(hot)) ** 0.5 * 2
    assert (greedy == target[0, 0].argmax()).all()  # greedy rows: the target's argmax, whatever was drafted
    assert (tokens[1::2] == draft[0].argmax(-1)).all()

"""The Lovasz-softmax loss against brute force: at a one-hot prediction it is 1 - IoU per class,
and anywhere it is the Lovasz extension of the Jaccard loss, summed here set by set."""

from __future__ import annotations

import itertools

import pytest
import torch

from models.labels import IGNORE_LABEL as IGNORE
from train.config import TrainConfig
from train.losses import jaccard_increments, lovasz_softmax, segmentation_loss


def jaccard_loss(wrong: set[int], truth: set[int]) -> float:
    """1 - IoU of class voxels `truth` when the voxels `wrong` are mispredicted: the class is
    predicted on truth - wrong and on the non-class voxels in wrong."""
    predicted = (truth - wrong) | (wrong - truth)
    union = truth | predicted
    return 1.0 - len(truth & predicted) / len(union) if union else 0.0


def lovasz_extension(errors: list[float], truth: set[int]) -> float:
    """The Lovasz extension at `errors`, by its definition: sum over i of errors[pi_i] times
    the Jaccard loss's growth as pi_i joins the set, pi ordering errors from the largest."""
    order = sorted(range(len(errors)), key=lambda i: -errors[i])
    total, wrong = 0.0, set()
    for i in order:
        before = jaccard_loss(wrong, truth)
        wrong.add(i)
        total += errors[i] * (jaccard_loss(wrong, truth) - before)
    return total


def brute_force(probs: torch.Tensor, labels: torch.Tensor) -> float:
    keep = [i for i in range(len(labels)) if labels[i] != IGNORE]
    values = []
    for c in sorted({int(labels[i]) for i in keep}):
        truth = {j for j, i in enumerate(keep) if labels[i] == c}
        errors = [abs(float(j in truth) - float(probs[i, c])) for j, i in enumerate(keep)]
        values.append(lovasz_extension(errors, truth))
    return sum(values) / len(values)


def test_one_hot_prediction_gives_one_minus_iou_per_class():
    labels = torch.tensor([0, 0, 1, 1, 1, 2, IGNORE, 2])
    predicted = torch.tensor([0, 1, 1, 1, 2, 2, 0, 0])
    probs = torch.nn.functional.one_hot(predicted, 4).double()
    ious = []
    keep = labels != IGNORE
    for c in (0, 1, 2):
        t, p = labels[keep] == c, predicted[keep] == c
        ious.append(float((t & p).sum()) / float((t | p).sum()))
    expected = 1.0 - sum(ious) / 3  # classes 0, 1, 2 present; class 3 absent, left out
    assert float(lovasz_softmax(probs, labels, IGNORE)) == pytest.approx(expected, abs=1e-12)
    assert float(lovasz_softmax(probs, labels, IGNORE)) == pytest.approx(
        brute_force(probs, labels), abs=1e-12
    )


@pytest.mark.parametrize("seed", range(5))
def test_soft_prediction_matches_the_lovasz_extension_by_brute_force(seed):
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 4, (9,), generator=g)
    labels[torch.randint(0, 9, (2,), generator=g)] = IGNORE
    probs = torch.randn(9, 5, generator=g, dtype=torch.float64).softmax(dim=1)
    got = float(lovasz_softmax(probs, labels, IGNORE))
    assert got == pytest.approx(brute_force(probs, labels), abs=1e-12)


def test_increments_sum_to_the_jaccard_loss_of_all_wrong():
    for truth in itertools.product((0.0, 1.0), repeat=5):
        t = torch.tensor(truth, dtype=torch.float64)
        if t.sum() == 0:
            continue
        assert float(jaccard_increments(t).sum()) == pytest.approx(1.0)  # every voxel wrong


def test_perfect_prediction_costs_nothing_and_no_labels_keep_a_gradient():
    labels = torch.tensor([2, 0, 1])
    perfect = torch.nn.functional.one_hot(labels, 3).double()
    assert float(lovasz_softmax(perfect, labels)) == 0.0
    logits = torch.randn(4, 3, requires_grad=True)
    loss = lovasz_softmax(logits.softmax(1), torch.full((4,), IGNORE))
    loss.backward()
    assert float(loss.detach()) == 0.0 and logits.grad is not None


def test_combined_loss_is_cross_entropy_plus_lovasz_and_has_a_gradient():
    g = torch.Generator().manual_seed(7)
    logits = torch.randn(50, 19, generator=g, requires_grad=True)
    labels = torch.randint(0, 19, (50,), generator=g)
    labels[:5] = IGNORE
    weights = torch.rand(19, generator=g) + 0.5
    combined = segmentation_loss("ce+lovasz", weights)(logits, labels)
    ce = segmentation_loss("ce", weights)(logits, labels)
    lovasz = lovasz_softmax(logits.softmax(1), labels)
    assert float(combined.detach()) == pytest.approx(
        float(ce.detach()) + float(lovasz.detach()), rel=1e-6
    )
    combined.backward()
    assert torch.isfinite(logits.grad).all() and logits.grad[:5].abs().sum() == 0


def test_unknown_loss_is_refused():
    with pytest.raises(ValueError, match="loss must be one of"):
        segmentation_loss("dice", None)
    with pytest.raises(ValueError, match="loss must be one of"):
        TrainConfig(out="x", loss="dice")

"""The training losses: weighted cross-entropy, optionally plus the Lovasz-softmax loss.

Cross-entropy scores each voxel alone, so a class of few voxels (sidewalk beside a road, a
parked car) weighs little even with class weights; the figure we report, IoU, scores each class
as a whole. The Lovasz-softmax loss (Berman, Rannen Triki and Blaschko, CVPR 2018) is a convex,
piecewise-linear surrogate of 1 - IoU per class: for each class c, the voxels' errors
e_i = |[label_i == c] - p_i(c)| are sorted from the largest, and the loss is the dot product of
the sorted errors with the increments of the Jaccard loss as those voxels are counted wrong one
by one. At a one-hot prediction it equals 1 - IoU(c) exactly (tests/train/test_losses.py checks
both that and the general case against a brute-force sum over the sets). The loss is the mean
over the classes present in the batch's labels; ignored voxels (IGNORE) take no part.

    criterion = segmentation_loss("ce+lovasz", weights)   # or "ce"
    loss = criterion(logits, labels)                      # [N, C] float, [N] int64
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from models.labels import IGNORE_LABEL as IGNORE

LOSSES = ("ce", "ce+lovasz")


def check_loss(kind: str) -> str:
    """`kind` if it names a loss of LOSSES, else a ValueError that lists them."""
    if kind not in LOSSES:
        raise ValueError(f"loss must be one of {LOSSES}, got {kind!r}")
    return kind


def jaccard_increments(sorted_truth: torch.Tensor) -> torch.Tensor:
    """float [N]: how much the Jaccard loss 1 - |T & P| / |T | P| grows as the i-th voxel (in
    the given order) joins the voxels counted wrong, T being the class's voxels (sorted_truth,
    1.0 or 0.0) and P the voxels predicted as the class."""
    total = sorted_truth.sum()
    intersection = total - sorted_truth.cumsum(0)  # class voxels not yet counted wrong
    union = total + (1.0 - sorted_truth).cumsum(0)  # plus the others counted wrong so far
    loss = 1.0 - intersection / union
    return torch.cat([loss[:1], loss[1:] - loss[:-1]])


def lovasz_softmax(probs: torch.Tensor, labels: torch.Tensor, ignore: int = IGNORE) -> torch.Tensor:
    """Mean Lovasz-softmax loss over the classes present: probs float [N, C] (softmax
    outputs), labels int64 [N]. Zero (with a gradient) when no voxel has a label."""
    keep = labels != ignore
    probs, labels = probs[keep], labels[keep]
    present = torch.unique(labels)
    if not len(present):
        return probs.sum() * 0.0
    per_class = []
    for c in present.tolist():
        truth = (labels == c).to(probs.dtype)
        errors = (truth - probs[:, c]).abs()
        errors, order = torch.sort(errors, descending=True)
        per_class.append(torch.dot(errors, jaccard_increments(truth[order])))
    return torch.stack(per_class).mean()


def segmentation_loss(
    kind: str, weights: torch.Tensor | None
) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """The training criterion named `kind` (one of LOSSES): logits [N, C], labels [N] -> scalar."""
    check_loss(kind)
    cross_entropy = nn.CrossEntropyLoss(weight=weights, ignore_index=IGNORE)
    if kind == "ce":
        return cross_entropy

    def ce_plus_lovasz(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return cross_entropy(logits, labels) + lovasz_softmax(logits.softmax(dim=1), labels)

    return ce_plus_lovasz

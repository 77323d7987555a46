"""bf16 and int8 inference against fp32 with the shipped model on every real frame in shared/:
labels >= 99.5 % equal per frame, and mIoU on the validation frames within 0.005 (issue 16's bar;
int8 where the CPU has an int8 kernel (AVX2 at least), bf16 where it has AVX512_BF16 or
AMX_BF16); and each narrower int8 kernel the CPU runs gives the network the widest one's bits.

One exception, stated here rather than hidden: the 50-point subset of seq00_000000, where 99.5 %
would mean no label may change at all. With the synthetic model 2 of 50 labels changed there (the
default model: none), both on voxels whose two best fp32 logits differ by less than 0.005 (a
near-tie that any rounding can flip); the test holds frames under 1,000 points to "only
near-ties change": every changed label had an fp32 top-2 margin below twice the largest logit
difference the reduced precision makes on that frame."""

from pathlib import Path

import numpy as np
import pytest
import torch

from app.inference.builder import load_model, pipeline_for
from app.inference.scoring import iou_metrics, read_labels
from kernels import precision as precision_mod
from kernels.precision import fused_int8_lanes, native_bf16
from tests.app.frame_helpers import read, real_frames
from tests.conftest import frame_id, require_real_data

VALIDATION = ("seq00_000000", "spvnas_000000")


@pytest.fixture(scope="module")
def pipelines():
    model, meta = load_model("default")
    runs = {"fp32": True, "bf16": native_bf16(), "int8": fused_int8_lanes() > 0}
    offered = [p for p, here in runs.items() if here]
    pipes = {p: pipeline_for(model, meta, "cpu", precision=p) for p in offered}
    return pipes, meta["class_names"]


def test_every_real_frame_is_covered():
    frames = real_frames() or pytest.skip("no real frames")
    assert {"seq00_000000", "spvnas_000000", "nuscenes"} <= {frame_id(f) for f in frames}


@pytest.mark.parametrize("precision", ["bf16", "int8"])
@pytest.mark.parametrize("rel", real_frames(), ids=frame_id)
def test_reduced_precision_labels_match_fp32(pipelines, rel, precision):
    pipes, names = pipelines
    if precision not in pipes:
        pytest.skip(f"{precision} is refused on this CPU (kernels/precision.py)")
    pair = {"fp32": pipes["fp32"], precision: pipes[precision]}
    assert all(pipe.precision == p for p, pipe in pair.items())
    points, sensor = read(rel)
    results = {p: pipe.segment(points, sensor, keep_logits=True) for p, pipe in pair.items()}
    labels = {p: r.labels for p, r in results.items()}
    agreement = float((labels[precision] == labels["fp32"]).mean())
    print(f"{rel}: {len(points)} points, {precision} labels {agreement * 100:.3f} % equal")
    if len(points) >= 1000:
        assert agreement >= 0.995
    else:  # the exception in the docstring: tiny frames, only near-ties may change
        fp32, reduced = results["fp32"].voxel_logits, results[precision].voxel_logits
        top = fp32.topk(2, dim=1).values
        changed = fp32.argmax(1) != reduced.argmax(1)
        bound = float((fp32 - reduced).abs().max())
        # a sanity cap on the logits themselves: int8 moves them by at most 0.7 % of their range
        # here (0.10 of 14.7; bf16 0.3 %), with no label changed
        assert bound < 0.01 * float(fp32.max() - fp32.min())
        assert bool(((top[:, 0] - top[:, 1])[changed] < 2 * bound).all())
    label_file = (require_real_data() / rel).with_suffix(".label")
    if Path(rel).stem in VALIDATION:
        gt = read_labels(label_file)
        miou = {p: iou_metrics(gt, labels[p], names)["miou"] for p in labels}
        print(f"  mIoU fp32 {miou['fp32']:.4f} {precision} {miou[precision]:.4f}")
        assert abs(miou[precision] - miou["fp32"]) <= 0.005


@pytest.mark.parametrize("kernel", ["avx2", "avx_vnni"])
def test_each_int8_kernel_gives_the_network_the_same_bits(pipelines, kernel):
    """The whole int8 network (quantization made in the kernels, fused shortcuts, the head run
    on the last conv's rows) on one real frame: a narrower kernel's logits and labels are the
    widest one's, bit for bit."""
    pipes, _ = pipelines
    widest = precision_mod.int8_kernel()
    if "int8" not in pipes or kernel == widest:
        pytest.skip(f"nothing to compare {kernel} with on this CPU")
    rel = next((f for f in real_frames() if frame_id(f) == "seq00_000000"), None)
    points, sensor = read(rel or pytest.skip("no real frames"))
    results = []
    for name in (widest, kernel):
        try:
            with precision_mod.int8_kernel_set(name):
                pipe = pipes["int8"]
                results.append(
                    (pipe.segment(points, sensor, keep_logits=True), pipe.segment(points, sensor))
                )
        except ValueError:
            pytest.skip(f"this CPU has no {kernel}")
    (wide_logits, wide), (narrow_logits, narrow) = results
    assert torch.equal(wide_logits.voxel_logits, narrow_logits.voxel_logits)
    assert np.array_equal(wide.labels, narrow.labels)


@pytest.mark.parametrize("name", ["bf16", "int8"])
def test_a_precision_this_cpu_cannot_run_is_refused_at_start_up(name):
    """The service's settings: a pinned precision runs as pinned or stops the start with a
    message that names what the CPU lacks (never a silent fallback, never a 27x slower run)."""
    from pydantic import ValidationError

    from app.service.config import Settings

    runs = {"bf16": native_bf16(), "int8": fused_int8_lanes() > 0}[name]
    if runs:
        assert Settings(precision=name).precision == name
        return
    with pytest.raises(ValidationError, match=f"{name} needs"):
        Settings(precision=name)

"""The dynamic / static split of the evaluation on a hand-made scene, and devkit scores that do not depend on the
detector's velocity; evaluation of a part of the split (a validation limited to a few batches)."""
from __future__ import annotations

import numpy as np
import pytest

from lit_iclr.asyncbev.evaluate import box_record, motion_split, nuscenes_metrics, write_results
from lit_iclr.asyncbev.nusc import AsyncNuScenes


def _box(tok, x, y, name="car", v=(0.0, 0.0), score=-1.0):
    from nuscenes.eval.detection.data_classes import DetectionBox

    return DetectionBox(sample_token=tok, translation=(x, y, 0.0), size=(1.9, 4.5, 1.6), rotation=(1.0, 0.0, 0.0, 0.0),
                        velocity=v, detection_name=name, detection_score=float(score))


def _boxes(rows):
    from nuscenes.eval.common.data_classes import EvalBoxes

    out = EvalBoxes()
    for tok in dict.fromkeys(r[0] for r in rows):
        out.add_boxes(tok, [_box(*r[:3], **r[3]) for r in rows if r[0] == tok])
    return out


def test_hand_made_scene_is_split_by_the_ground_truth_not_by_predicted_speed():
    gt = _boxes([
        ("s1", 0.0, 0.0, dict(v=(5.0, 0.0))),                        # A: moving car
        ("s1", 10.0, 0.0, dict()),                                   # B: parked car
        ("s1", 0.0, 10.0, dict(name="pedestrian", v=(0.1, 0.1))),    # C: 0.14 m/s, static
        ("s1", 5.0, 5.0, dict(name="pedestrian", v=(1.0, 0.0))),     # D: walking
        ("s2", 0.0, 0.0, dict()),                                    # E: parked car
        ("s2", 3.0, 0.0, dict(v=(10.0, 0.0))),                       # F: moving car
    ])
    # predicted velocities deliberately wrong: the split must not read them
    pred = _boxes([
        ("s1", 0.3, 0.0, dict(score=0.9)),                           # p1: matches A (0.3 m)
        ("s1", 10.0, 1.0, dict(score=0.8, v=(8.0, 0.0))),            # p2: matches B (1 m)
        ("s1", -2.5, 0.0, dict(score=0.7, v=(5.0, 0.0))),            # p3: A taken, B 12.5 m: unmatched, nearest car A
        ("s1", 6.5, 0.0, dict(score=0.6)),                           # p4: no free car left, nearest car B (3.5 m)
        ("s1", 5.0, 5.5, dict(name="pedestrian", score=0.5)),        # p5: matches D
        ("s1", 0.0, 0.0, dict(name="truck", score=0.4, v=(9.0, 0.0))),  # p6: no truck in s1
        ("s2", 1.0, 0.0, dict(score=0.9, v=(10.0, 0.0))),            # q1: first in score order, nearest free E (1 m)
        ("s2", 0.9, 0.0, dict(score=0.5)),                           # q2: E taken, F at 2.1 m < 4 m
    ])
    gt_dyn, pred_dyn, gt_sta, pred_sta = motion_split(gt, pred, threshold=0.2)

    def xy(boxes, tok):
        return sorted((b.translation[0], b.translation[1], b.detection_name) for b in boxes[tok])

    # worked out by hand from the rule above
    assert xy(gt_dyn, "s1") == [(0.0, 0.0, "car"), (5.0, 5.0, "pedestrian")]
    assert xy(gt_sta, "s1") == [(0.0, 10.0, "pedestrian"), (10.0, 0.0, "car")]
    assert xy(gt_dyn, "s2") == [(3.0, 0.0, "car")] and xy(gt_sta, "s2") == [(0.0, 0.0, "car")]
    assert xy(pred_dyn, "s1") == [(-2.5, 0.0, "car"), (0.0, 0.0, "truck"), (0.3, 0.0, "car"), (5.0, 5.5, "pedestrian")]
    assert xy(pred_sta, "s1") == [(0.0, 0.0, "truck"), (6.5, 0.0, "car"), (10.0, 1.0, "car")]
    assert xy(pred_dyn, "s2") == [(0.9, 0.0, "car")] and xy(pred_sta, "s2") == [(1.0, 0.0, "car")]
    # every sample token stays in every subset (the devkit indexes ground truth by the predictions' tokens)
    assert all(set(b.sample_tokens) == {"s1", "s2"} for b in (gt_dyn, pred_dyn, gt_sta, pred_sta))
    # the paper's rule (predictions by their own speed) would put p2 and q1 among the dynamic ones and drop p1 and q2
    by_speed = sorted((b.sample_token, b.translation[0]) for b in pred.all if np.hypot(*b.velocity) > 0.2)
    assert by_speed == [("s1", -2.5), ("s1", 0.0), ("s1", 10.0), ("s2", 1.0)]


def _gt_results(nusc, tokens, velocity_scale=1.0):
    """The annotations of `tokens` submitted as predictions (score 1), velocities multiplied by `velocity_scale`."""
    from nuscenes.eval.detection.utils import category_to_detection_name
    from pyquaternion import Quaternion

    results = {}
    for tok in tokens:
        boxes = []
        for a in map(lambda t: nusc.get("sample_annotation", t), nusc.get("sample", tok)["anns"]):
            if a["num_lidar_pts"] == 0:  # the devkit drops such ground truth
                continue
            v = np.nan_to_num(nusc.box_velocity(a["token"]))[:2] * velocity_scale
            boxes.append(box_record(tok, a["translation"], a["size"], Quaternion(a["rotation"]).yaw_pitch_roll[0], v,
                                    category_to_detection_name(a["category_name"]), 1.0))
        results[tok] = boxes
    return results


@pytest.fixture(scope="module")
def reader(tiny_world):
    return AsyncNuScenes(tiny_world, "v1.0-mini")


def test_dynamic_scores_do_not_depend_on_predicted_velocity(reader, tmp_path):
    """Perfect boxes with zero predicted velocity: every one is still in its subset (dynamic mAP 1, static mAP 1); only
    the velocity error (mAVE) shows the missing velocity. Under a split by predicted speed the dynamic subset would hold
    no prediction at all (mAP 0)."""
    nusc = reader.nusc
    tokens = reader.split_samples("mini_val")
    m = nuscenes_metrics(nusc, write_results(tmp_path / "r.json", _gt_results(nusc, tokens, 0.0)), "mini_val", tmp_path)
    assert m["dynamic"]["mAP"] == pytest.approx(1.0) and m["static"]["mAP"] == pytest.approx(1.0)
    assert m["all"]["mAP"] == pytest.approx(1.0)
    assert m["dynamic"]["mAVE"] > 0.5 and m["static"]["mAVE"] < 0.2  # moving objects' speed missed, static ones' not


def test_a_part_of_the_split_is_evaluated_on_its_own_samples(reader, tmp_path):
    """Results for the first half of mini_val only (what a validation limited to a few batches gives): the devkit
    scores those samples (perfect boxes: mAP 1), not the others as misses; a token outside the split is refused."""
    nusc = reader.nusc
    tokens = reader.split_samples("mini_val")
    part = tokens[: max(1, len(tokens) // 2)]
    results = _gt_results(nusc, part)
    assert len(part) < len(tokens) and sum(map(len, results.values())) > 0
    m = nuscenes_metrics(nusc, write_results(tmp_path / "part.json", results), "mini_val", tmp_path)
    assert m["all"]["mAP"] == pytest.approx(1.0) and m["all"]["NDS"] == pytest.approx(1.0, abs=1e-6)
    results["not-a-val-token"] = []
    with pytest.raises(ValueError, match="not in split"):
        nuscenes_metrics(nusc, write_results(tmp_path / "bad.json", results), "mini_val", tmp_path)

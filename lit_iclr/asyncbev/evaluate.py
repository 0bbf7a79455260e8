"""nuScenes detection evaluation with the unmodified devkit, plus the dynamic-object split of the AsyncBEV paper.

`write_results` writes the official result JSON; `nuscenes_metrics` runs `DetectionEval` on it (mAP, NDS, TP errors)
and, on the same loaded and range-filtered boxes, the dynamic split: ground truth and predictions whose speed is above
`dynamic_speed` (0.2 m/s as in the paper's `eval_dynamic.py`), evaluated with the devkit's own accumulate/AP/TP code.
Means run over the classes that have ground truth in the evaluated boxes (on a small split a missing class would
otherwise count as AP 0).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from .nusc import DETECTION_CLASSES

CLASS_RANGE = 50.0  # metres; the devkit's per-class evaluation range for these classes is 40-50 m
ATTRIBUTE = {  # (class, moving) -> nuScenes attribute of a predicted box, as CenterPoint assigns them
    **{(c, m): "vehicle.moving" if m else "vehicle.parked"
       for c in ("car", "truck", "trailer", "bus", "construction_vehicle") for m in (True, False)},
    ("pedestrian", True): "pedestrian.moving", ("pedestrian", False): "pedestrian.standing",
    **{(c, m): "cycle.with_rider" if m else "cycle.without_rider" for c in ("bicycle", "motorcycle") for m in (True, False)},
    **{(c, m): "" for c in ("traffic_cone", "barrier") for m in (True, False)},  # the devkit: no attribute
}


def detection_config(class_range: float = CLASS_RANGE, classes=DETECTION_CLASSES):
    """The devkit's `detection_cvpr_2019` config restricted to the classes this detector predicts."""
    from nuscenes.eval.common.config import config_factory
    from nuscenes.eval.detection.data_classes import DetectionConfig

    cfg = config_factory("detection_cvpr_2019").serialize()
    cfg["class_range"] = {c: float(min(class_range, r)) for c, r in cfg["class_range"].items()}
    cfg = DetectionConfig.deserialize(cfg)  # the devkit insists on all ten classes here ...
    cfg.class_names = list(classes)  # ... and averages mAP / TP errors over `class_names`
    return cfg


def box_record(sample_token: str, center, size, yaw: float, velocity, name: str, score: float) -> dict:
    """One nuScenes result box (global frame) of detection class `name` for the result JSON."""
    from pyquaternion import Quaternion

    moving = float(np.hypot(*velocity)) > 0.2
    return dict(sample_token=sample_token, translation=[float(v) for v in center], size=[float(v) for v in size],
                rotation=[float(v) for v in Quaternion(axis=[0, 0, 1], angle=float(yaw)).elements],
                velocity=[float(velocity[0]), float(velocity[1])], detection_name=name,
                detection_score=float(score), attribute_name=ATTRIBUTE[(name, moving)])


def write_results(path: str | Path, results: dict[str, list[dict]]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    meta = dict(use_camera=True, use_lidar=True, use_radar=False, use_map=False, use_external=False)
    path.write_text(json.dumps(dict(meta=meta, results=results)))
    return path


def _split_by_speed(boxes, threshold: float, dynamic: bool):
    from nuscenes.eval.common.data_classes import EvalBoxes

    out = EvalBoxes()
    for tok in boxes.sample_tokens:
        out.add_boxes(tok, [b for b in boxes[tok] if (np.hypot(*b.velocity) > threshold) == dynamic])
    return out


def _present(boxes, classes=DETECTION_CLASSES) -> list[str]:
    """`classes` with at least one ground-truth box: a class absent from a (small) split would score AP 0 by definition."""
    names = {b.detection_name for tok in boxes.sample_tokens for b in boxes[tok]}
    return [c for c in classes if c in names]


def _summary(metrics) -> dict[str, float]:
    s = metrics.serialize()
    out = {"NDS": float(s["nd_score"]), "mAP": float(s["mean_ap"])}
    names = {"trans_err": "mATE", "scale_err": "mASE", "orient_err": "mAOE", "vel_err": "mAVE", "attr_err": "mAAE"}
    out.update({names[k]: float(v) for k, v in s["tp_errors"].items()})
    return out


def nuscenes_metrics(nusc, result_path: str | Path, eval_set: str, output_dir: str | Path,
                     dynamic_speed: float = 0.2, class_range: float = CLASS_RANGE,
                     classes=DETECTION_CLASSES) -> dict[str, dict[str, float]]:
    """{'all': {...}, 'dynamic': {...}} with NDS, mAP and the five TP errors from nuscenes-devkit's DetectionEval.

    `class_range` (m) caps the devkit's per-class evaluation radius: a detector whose BEV grid covers +-r m cannot see
    ground truth farther than r, so the model passes its grid's half range (misses it cannot avoid would only dilute
    every method's score alike). `classes`: the detection classes the model predicts (ground truth of other classes
    is not scored)."""
    import contextlib
    import io

    from nuscenes.eval.detection.evaluate import DetectionEval

    with contextlib.redirect_stdout(io.StringIO()):  # the devkit prints progress bars and tables
        ev = DetectionEval(nusc, detection_config(class_range, classes), str(result_path), eval_set, str(output_dir),
                           verbose=False)
        gt, pred = ev.gt_boxes, ev.pred_boxes
        ev.cfg.class_names = _present(gt, classes)
        metrics_all, _ = ev.evaluate()
        ev.gt_boxes = _split_by_speed(gt, dynamic_speed, True)
        ev.pred_boxes = _split_by_speed(pred, dynamic_speed, True)
        ev.cfg.class_names = _present(ev.gt_boxes, classes)
        metrics_dyn, _ = ev.evaluate()
        ev.gt_boxes, ev.pred_boxes = gt, pred
    return {"all": _summary(metrics_all), "dynamic": _summary(metrics_dyn)}

"""nuScenes detection evaluation with the unmodified devkit, plus the dynamic-object split of the AsyncBEV paper.

`write_results` writes the official result JSON; `nuscenes_metrics` runs `DetectionEval` on it (mAP, NDS, TP errors)
and, on the same loaded and range-filtered boxes, the dynamic and static splits (`motion_split`), evaluated with the
devkit's own accumulate/AP/TP code. Means run over the classes that have ground truth in the evaluated boxes (on a
small split a missing class would otherwise count as AP 0).

The split does not read the detector's velocity. A ground-truth box is dynamic when its annotated speed is above
`dynamic_speed` (0.2 m/s, the paper's threshold). A prediction takes the state of the ground truth it matches, by the
devkit's own matching rule (`algo.accumulate`: predictions of a class in descending score, each to the nearest not yet
taken ground truth of that class in its sample by BEV centre distance, a match below the devkit's largest threshold,
4 m). An unmatched prediction is a false positive of the subset of the nearest ground truth of its class in its sample
(a ghost left behind a moving object is a false positive among the dynamic objects); with no ground truth of its class
in the sample it is a false positive of both subsets. The paper's rule splits the predictions by their own predicted
speed (ground truth by its annotated speed, as here); the two agree where the detector's velocity is accurate, while a
speed error of 2-3 m/s (this small detector's mAVE) sends predictions to either side almost at random.
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


def _moving(box, threshold: float) -> bool:
    """Annotated speed above `threshold`; a ground-truth velocity the devkit leaves NaN (a track's only annotation)
    counts as static."""
    return bool(np.hypot(*box.velocity[:2]) > threshold)


def motion_split(gt, pred, threshold: float = 0.2, match_dist: float = 4.0):
    """(gt_dynamic, pred_dynamic, gt_static, pred_static) EvalBoxes, each holding every sample token of `gt` / `pred`.

    Ground truth by its own annotated speed; predictions by the ground truth they match (the devkit's greedy rule of
    `nuscenes.eval.detection.algo.accumulate` at `match_dist`), unmatched ones by the nearest ground truth of their class
    in the sample, and into both subsets when their sample holds no ground truth of their class (module docstring)."""
    from nuscenes.eval.common.data_classes import EvalBoxes
    from nuscenes.eval.common.utils import center_distance

    out = [EvalBoxes() for _ in range(4)]
    for tok in sorted(set(gt.sample_tokens) | set(pred.sample_tokens)):
        g, p = gt[tok] if tok in gt.boxes else [], pred[tok] if tok in pred.boxes else []
        state = [_moving(b, threshold) for b in g]
        where = [None] * len(p)  # True: dynamic, False: static, None: both
        taken = set()
        for i in sorted(range(len(p)), key=lambda i: p[i].detection_score, reverse=True):
            same = [j for j in range(len(g)) if g[j].detection_name == p[i].detection_name]
            if not same:
                continue
            free = [j for j in same if j not in taken]
            j = min(free, key=lambda j: center_distance(g[j], p[i])) if free else None
            if j is not None and center_distance(g[j], p[i]) < match_dist:
                taken.add(j)  # matched: the state of its ground truth
            else:  # unmatched: the state of the nearest ground truth of its class (taken or not)
                j = min(same, key=lambda j: center_distance(g[j], p[i]))
            where[i] = state[j]
        if tok in gt.boxes:
            out[0].add_boxes(tok, [b for b, s in zip(g, state, strict=True) if s])
            out[2].add_boxes(tok, [b for b, s in zip(g, state, strict=True) if not s])
        if tok in pred.boxes:
            out[1].add_boxes(tok, [b for b, w in zip(p, where, strict=True) if w is not False])
            out[3].add_boxes(tok, [b for b, w in zip(p, where, strict=True) if w is not True])
    return tuple(out)


def _only(boxes, tokens):
    from nuscenes.eval.common.data_classes import EvalBoxes

    out = EvalBoxes()
    for tok in tokens:
        out.add_boxes(tok, boxes[tok])
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
    """{'all': {...}, 'dynamic': {...}, 'static': {...}} with NDS, mAP and the five TP errors from nuscenes-devkit's
    DetectionEval; the subsets as `motion_split` draws them.

    The result file may hold only some samples of `eval_set` (a validation limited to a few batches): the others are
    given no predictions to pass the devkit's check, then left out of ground truth and predictions alike, so the
    metrics are those of the samples that were run.

    `class_range` (m) caps the devkit's per-class evaluation radius: a detector whose BEV grid covers +-r m cannot see
    ground truth farther than r, so the model passes its grid's half range (misses it cannot avoid would only dilute
    every method's score alike). `classes`: the detection classes the model predicts (ground truth of other classes
    is not scored)."""
    import contextlib
    import io

    from nuscenes.eval.common.loaders import load_gt
    from nuscenes.eval.detection.data_classes import DetectionBox
    from nuscenes.eval.detection.evaluate import DetectionEval

    result_path = Path(result_path)
    doc = json.loads(result_path.read_text())
    ran = list(doc["results"])
    with contextlib.redirect_stdout(io.StringIO()):  # the devkit prints progress bars and tables
        split_tokens = load_gt(nusc, eval_set, DetectionBox, verbose=False).sample_tokens
        if set(ran) != set(split_tokens):
            if set(ran) - set(split_tokens):
                raise ValueError(f"{result_path}: {len(set(ran) - set(split_tokens))} result samples are not in "
                                 f"split {eval_set!r}")
            doc["results"].update({t: [] for t in split_tokens if t not in doc["results"]})
            result_path = result_path.with_name(result_path.stem + "_padded.json")
            result_path.write_text(json.dumps(doc))
        ev = DetectionEval(nusc, detection_config(class_range, classes), str(result_path), eval_set, str(output_dir),
                           verbose=False)
        gt, pred = _only(ev.gt_boxes, ran), _only(ev.pred_boxes, ran)
        out = {}
        parts = motion_split(gt, pred, dynamic_speed)
        for name, (g, p) in {"all": (gt, pred), "dynamic": parts[:2], "static": parts[2:]}.items():
            ev.gt_boxes, ev.pred_boxes, ev.sample_tokens = g, p, list(ran)
            ev.cfg.class_names = _present(g, classes)
            if ev.cfg.class_names:
                out[name] = _summary(ev.evaluate()[0])
    return out

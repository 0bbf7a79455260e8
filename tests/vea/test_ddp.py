"""VEA under DDP: the validation metrics of 2 processes equal one process's (each question counted once)."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.core.ddp_worker import compare, first_step

TWIN = Path(__file__).parents[1] / "configs" / "vea.yaml"
VEA_METRICS = ("val/acc", "val/acc/plain", "val/acc/vea", "val/acc/vea_random_layers", "val/acc/vea_shallow_layers",
               "val/acc/vea_random_mask", "val/acc/oracle_mask", "val/sbnb_rate", "val/hit_rate_correct",
               "val/vea_questions")


@pytest.mark.slow
def test_two_process_validation_equals_one_process(tmp_path):
    """One optimiser step on 1 x 16 and on 2 x 8 questions, then a validation of the stepped model over the twin's 32
    validation questions: every VEA metric of both ranks equals the one-process value. Before the metrics were
    gathered over ranks each rank scored its own 8 of the 16 evaluation questions (val/vea_questions 8, not 16)."""
    result = first_step(TWIN, tmp_path)
    assert result["status"] == "ok", result["reason"] + "\n" + result.get("stderr", "")[-2000:]
    single = result["single"]["metrics"]
    assert single["val/vea_questions"] == 16  # the odd-indexed half of the 32 validation questions
    for rank in result["ranks"]:
        for k in VEA_METRICS:
            assert rank["metrics"][k] == pytest.approx(single[k], abs=1e-6), (k, rank["metrics"][k], single[k])
    assert not compare(result), compare(result)[:5]

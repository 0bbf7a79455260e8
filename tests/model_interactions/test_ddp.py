"""Model interactions under DDP: three generations (each publishing its pool) run on 2 CPU processes without a hang,
the first step equals one process's with the same global batch, and the evaluation is that of one process."""
import json

import pytest

from tests.ddp_steps import fit_steps, max_abs_diff

from .test_lm import tiny_corpus

SGD = ["--model.init_args.optimizer", "torch.optim.SGD", "--model.init_args.optimizer.init_args.lr", "0.1"]


@pytest.mark.slow  # 4 CLI runs, two with 2 processes: about 2 minutes on 2 cores
def test_generations_on_two_processes_equal_one_process(tmp_path):
    corpus = str(tiny_corpus(tmp_path / "corpus"))
    data = ["--data.init_args.root", corpus, *SGD]
    ddp = fit_steps(tmp_path / "ddp1", "model_interactions", 2, 2, *data, steps=1)
    one = fit_steps(tmp_path / "one1", "model_interactions", 1, 4, *data, steps=1)
    diff, where = max_abs_diff(ddp, one)
    assert diff < 1e-6, (diff, where)
    # 3 generations x 2 steps, validation after each. Before, `on_validation_epoch_end` read `trainer.log_dir` (a
    # broadcast from rank 0) on rank 0 only: rank 0 waited in it for good after the first generation
    full = [*data, "--trainer.limit_val_batches", "1.0", "--trainer.max_epochs", "3"]
    fit_steps(tmp_path / "ddp", "model_interactions", 2, 2, *full, steps=6, timeout=300)
    fit_steps(tmp_path / "one", "model_interactions", 1, 4, *full, steps=6)
    rows = [[json.loads(line) for line in open(tmp_path / run / "interactions.jsonl")] for run in ("ddp", "one")]
    assert len(rows[0]) == len(rows[1]) == 3  # one row per generation, written once (rank 0)
    # the whole evaluation set on every rank: generation 0's metrics are one process's (later generations train on
    # pools sampled from weights that differ in the last bits, so a sampled token may differ)
    for key in ("own_ppl", "cross_ppl", "public_ppl", "js", "cka"):
        assert rows[0][0][key] == pytest.approx(rows[1][0][key], rel=1e-4), key

"""Paper scale of model_interactions: configs/paper/model_interactions.yaml parses with the real CLI without the dataset,
builds on the meta device in seconds, and plans (lit_iclr/model_interactions/plan.py). OPT-350M and Llama-3.2-1B come
from their published config.json."""
from __future__ import annotations

import pytest
import torch

from lit_iclr.core.plan import build_on_meta
from tests.twin import ROOT

CONFIG = str(ROOT / "configs/paper/model_interactions.yaml")


def test_entities_are_the_published_architectures():
    module, _, _ = build_on_meta([CONFIG])
    opt, llama = (m.lm for m in module.models)
    assert type(opt).__name__ == "OPTForCausalLM" and type(llama).__name__ == "LlamaForCausalLM"
    assert sum(p.numel() for p in opt.parameters()) == 331_196_416
    assert sum(p.numel() for p in llama.parameters()) == 1_235_814_400


@pytest.mark.slow
def test_opt_350m_real_size_step_on_cpu_has_finite_loss_and_gradients():
    """Batch 1 x 512 tokens through OPT-350M (random weights from its config.json) and backward."""
    from lit_iclr.model_interactions.model import HFEntityLM

    torch.manual_seed(0)
    lm = HFEntityLM(str(ROOT / "configs/paper/hf/opt-350m"), require_weights=False)
    ids = torch.randint(3, 32000, (1, 512))
    logits = lm(ids)
    loss = torch.nn.functional.cross_entropy(logits[:, :-1].transpose(1, 2), ids[:, 1:])
    loss.backward()
    assert torch.isfinite(loss) and abs(float(loss) - torch.log(torch.tensor(50272.0))) < 2.0
    assert all(p.grad is None or torch.isfinite(p.grad).all() for p in lm.parameters())

"""The memory plan's parameter counts equal the real modules' counts; its terms follow the formula."""
import pytest

from lit_iclr.core.moe import tiny_config, tiny_model
from lit_iclr.core.moe.memory import PRESETS, plan, shape_of


@pytest.mark.parametrize("arch", ["qwen2_moe", "mixtral", "deepseek"])
def test_parameter_count_matches_the_built_model(arch):
    model = tiny_model(arch)
    assert shape_of(tiny_config(arch)).params == sum(p.numel() for p in model.parameters())


def test_published_sizes_and_the_merge_state_term():
    assert abs(shape_of(PRESETS["deepseek-moe-16b"]).params / 1e9 - 16.4) < 0.05
    assert abs(shape_of(PRESETS["qwen1.5-moe-a2.7b"]).params / 1e9 - 14.3) < 0.05
    cfg = PRESETS["qwen1.5-moe-a2.7b"]
    s = shape_of(cfg)
    t = plan(cfg, 8, batch=1, seq_len=2048, segment=16, mode="namex", beta_abs=0.9, beta_phase=0.4)
    P = 3 * 1408 * 2048
    assert t["merge state"] == s.moe_layers * 3 * 128 * P * 2  # L_m * s * U * P * p; complex beta: base, Re mu, Im mu
    assert t["weights"] == 4 * s.params / 8 and t["optimizer"] == 8 * s.params / 8
    assert plan(cfg, 8, segment=16, mode="camex")["merge state"] == 0
    assert plan(cfg, 8, segment=256, mode="namex")["merge state"] == t["merge state"] / 16 / 3  # beta 0: the base only


def test_the_expert_basis_terms():
    """chain_state coefficients: the banks and their pending gradients (L_m n P p each) replace the (U, P) states."""
    cfg = PRESETS["qwen1.5-moe-a2.7b"]
    s = shape_of(cfg)
    P, K = 3 * 1408 * 2048, s.moe_layers * 60
    t = plan(cfg, 8, segment=16, mode="namex", chunk=16, chain_state="coefficients")
    assert t["merge bank"] == t["bank grads"] == s.moe_layers * 60 * P * 2
    assert t["merge state"] == s.moe_layers * 128 * K * 4 + K * K * 8
    assert t["merged"] == 2 * 16 * P * 2
    long = plan(cfg, 8, seq_len=8192, segment=16, mode="namex", chunk=16, chain_state="coefficients")
    assert long["merge bank"] == t["merge bank"]  # independent of the number of merge units
    assert plan(cfg, 8, segment=16, mode="camex", chain_state="coefficients")["bank grads"] == 0

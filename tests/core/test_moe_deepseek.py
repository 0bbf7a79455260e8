"""The native DeepSeek-MoE (model_type `deepseek`): loads a released-style checkpoint folder without remote code and
computes its MoE blocks as the paper states them (checked against a by-hand computation from the raw tensors)."""
import json

import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from lit_iclr.core.moe import check_moe, load_pretrained, moe_blocks, tiny_config, tiny_model


def _released_folder(tmp_path, model):
    """config.json as published (with the remote-code `auto_map`, `rope_theta`) + one safetensors file."""
    cfg = {k: v for k, v in model.config.to_dict().items() if k not in ("rope_parameters", "dtype")}
    cfg.update(architectures=["DeepseekForCausalLM"], model_type="deepseek", rope_theta=10000.0,
               auto_map={"AutoConfig": "configuration_deepseek.DeepseekConfig",
                         "AutoModelForCausalLM": "modeling_deepseek.DeepseekForCausalLM"})
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(tmp_path / "model.safetensors"))
    return tmp_path


def test_state_dict_keys_are_the_released_checkpoint_names():
    keys = set(tiny_model("deepseek").state_dict())
    for k in ("model.layers.0.mlp.gate_proj.weight", "model.layers.1.mlp.gate.weight",
              "model.layers.1.mlp.experts.3.down_proj.weight", "model.layers.1.mlp.shared_experts.up_proj.weight",
              "model.layers.2.self_attn.q_proj.weight", "model.norm.weight", "lm_head.weight"):
        assert k in keys, k
    assert not any("layers.0.mlp.experts" in k for k in keys)  # first_k_dense_replace = 1: layer 0 is dense


def test_loads_without_remote_code_and_moe_block_matches_the_paper(tmp_path):
    ref = tiny_model("deepseek", seed=3)
    folder = _released_folder(tmp_path, ref)
    model = load_pretrained(folder)
    ids = torch.randint(0, 128, (2, 9))
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, ref(ids).logits)
    blocks = check_moe(model)
    assert [b.layer for b in blocks] == [1, 2] and type(model).__name__ == "DeepseekMoEForCausalLM"
    # by hand from the raw tensors: softmax router, top-k (no renormalisation), routed SwiGLUs + shared SwiGLU
    sd, cfg, pre = ref.state_dict(), tiny_config("deepseek"), "model.layers.1.mlp."
    x = torch.randn(7, cfg.hidden_size)
    s = F.softmax(x @ sd[pre + "gate.weight"].T, -1)
    w, idx = s.topk(cfg.num_experts_per_tok, -1)

    def swiglu(p, v):
        return F.linear(F.silu(F.linear(v, sd[p + "gate_proj.weight"])) * F.linear(v, sd[p + "up_proj.weight"]),
                        sd[p + "down_proj.weight"])
    want = swiglu(pre + "shared_experts.", x)
    for t in range(7):
        for j in range(cfg.num_experts_per_tok):
            want[t] += w[t, j] * swiglu(f"{pre}experts.{int(idx[t, j])}.", x[t:t + 1])[0]
    with torch.no_grad():
        torch.testing.assert_close(moe_blocks(model)[0].module(x[None])[0], want, rtol=1e-5, atol=1e-6)

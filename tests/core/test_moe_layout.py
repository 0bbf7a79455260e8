"""The uniform MoE view on tiny random Qwen2-MoE / Mixtral / DeepSeek-V2/V3 models (no download)."""
from __future__ import annotations

import json
import re

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from lit_iclr.core import moe as H
from lit_iclr.core.errors import DatasetFormatError, DatasetNotFoundError


def _tokens(n=2, t=12, seed=0):
    return torch.randint(0, 128, (n, t), generator=torch.Generator().manual_seed(seed))


def _manual_block(block: H.MoEBlock, x: torch.Tensor) -> torch.Tensor:
    """The block's output rebuilt from the view alone: sum_k r_k * expert_k(x) (+ shared experts)."""
    flat = x.reshape(-1, x.shape[-1])
    _, w, idx = block.route(flat)
    out = torch.zeros_like(flat)
    for e in range(block.num_experts):
        for slot in range(idx.shape[1]):
            sel = idx[:, slot] == e
            if sel.any():
                out[sel] += w[sel, slot, None].to(flat.dtype) * block.expert_forward(e, flat[sel])
    for s in block.shared:
        shared = s(flat)
        if block.shared_gate is not None:
            shared = torch.sigmoid(block.shared_gate(flat)) * shared
        out = out + shared
    return out.reshape(x.shape)


def _shrink(model, seed=0, min_drop=1):
    """Drop a random set of atoms (at least `min_drop`) from every expert; return the kept indices."""
    g = torch.Generator().manual_seed(seed)
    for b in H.moe_blocks(model):
        for e in range(b.num_experts):
            w = b.get_expert(e)
            n = int(torch.randint(1, w.width - min_drop + 1, (1,), generator=g))
            keep = torch.randperm(w.width, generator=g)[:n].sort().values
            b.set_expert(e, w.select(keep))


@pytest.mark.parametrize("arch", H.ARCHS)
def test_view_reproduces_block_and_unfuse_is_exact(arch):
    model = H.tiny_model(arch)
    blocks = H.check_moe(model)
    assert H.detect_layout(model) == ("variable" if arch == "deepseek" else "fused") and len(blocks) == 2
    assert all(b.num_experts == 4 and b.widths() == [16] * 4 and b.hidden_size == 32 for b in blocks)
    assert len(blocks[0].shared) == (0 if arch == "mixtral" else 1)
    assert (blocks[0].shared_gate is not None) == (arch == "qwen2_moe")
    captured = {}
    hook = blocks[1].module.register_forward_hook(lambda m, i, o: captured.update(x=i[0], y=o))
    ids = _tokens()
    with torch.no_grad():
        ref = model(ids).logits
        torch.testing.assert_close(_manual_block(blocks[1], captured["x"]), captured["y"], atol=1e-5, rtol=1e-4)
    hook.remove()
    # stacked / get_expert agree with the fused storage: gate rows first, then up rows
    st = blocks[0].stacked()
    if arch != "deepseek":  # DeepSeek-MoE stores one tensor per expert (natively variable-width)
        torch.testing.assert_close(st.gate, blocks[0].experts.gate_up_proj[:, :16])
        torch.testing.assert_close(st.up, blocks[0].experts.gate_up_proj[:, 16:])
    H.unfuse_experts(model)
    assert H.detect_layout(model) == "variable"
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(H.moe_blocks(model)[0].stacked().gate, st.gate)


@pytest.mark.parametrize("arch", H.ARCHS)
def test_variable_widths_save_compact_and_hf_roundtrip(arch, tmp_path):
    from transformers import AutoModelForCausalLM

    model = H.unfuse_experts(H.tiny_model(arch, seed=1))
    _shrink(model, seed=2, min_drop=9)  # every expert keeps <= 7 atoms, so the HF width (multiple of 8) shrinks to 8
    widths = [b.widths() for b in H.moe_blocks(model)]
    ids = _tokens(seed=3)
    with torch.no_grad():
        ref = model(ids).logits
    H.save_compact(model, tmp_path / "compact")
    saved = json.loads((tmp_path / "compact" / "expert_widths.json").read_text())
    assert list(saved.values()) == widths
    small = H.load_compact(tmp_path / "compact")
    assert [b.widths() for b in H.moe_blocks(small)] == widths
    with torch.no_grad():
        torch.testing.assert_close(small(ids).logits, ref, atol=0, rtol=0)
    n_params = sum(p.numel() for p in small.parameters())
    assert n_params < sum(p.numel() for p in H.tiny_model(arch).parameters())

    cfg = model.config
    shared_before = cfg.moe_intermediate_size * cfg.n_shared_experts if arch.startswith("deepseek") else None
    H.save_hf(model, tmp_path / "hf")
    back = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", trust_remote_code=False).eval()
    width = max(max(w) for w in widths)
    attr = H.WIDTH_ATTR.get(arch, "moe_intermediate_size")
    assert width <= 7 and getattr(back.config, attr) == 8
    if shared_before is not None:  # DeepSeek's shared experts keep their size: moe_intermediate_size * n_shared_experts
        assert back.config.moe_intermediate_size * back.config.n_shared_experts == shared_before
    with torch.no_grad():
        torch.testing.assert_close(back(ids).logits, ref, atol=1e-5, rtol=1e-5)
    for b, ws in zip(H.moe_blocks(back), widths, strict=True):  # the padded atoms are exactly zero
        for e, w in enumerate(ws):
            ex = b.get_expert(e)
            assert ex.gate[w:].abs().sum() == 0 and ex.up[w:].abs().sum() == 0 and ex.down[:, w:].abs().sum() == 0


def test_checkpoint_reads_mixtral_v4_names_and_fused_tensors(tmp_path):
    model = H.tiny_model("mixtral", seed=4)
    ids = _tokens()
    with torch.no_grad():
        ref = model(ids).logits
    model.save_pretrained(tmp_path / "ref")
    # rewrite the experts in the transformers-4 Mixtral spelling: block_sparse_moe.experts.<e>.w1/w3/w2
    state = {}
    for k, v in model.state_dict().items():
        m = re.match(r"(.*)\.mlp\.experts\.(gate_up_proj|down_proj)$", k)
        if m:
            pre = m.group(1) + ".block_sparse_moe.experts"
            for e in range(v.shape[0]):
                if m.group(2) == "gate_up_proj":
                    state[f"{pre}.{e}.w1.weight"], state[f"{pre}.{e}.w3.weight"] = v[e, :16].clone(), v[e, 16:].clone()
                else:
                    state[f"{pre}.{e}.w2.weight"] = v[e].clone()
        else:
            state[k.replace(".mlp.gate.", ".block_sparse_moe.gate.")] = v.clone()
    (tmp_path / "v4").mkdir()
    save_file(state, str(tmp_path / "v4" / "model.safetensors"))
    model.config.save_pretrained(tmp_path / "v4")
    for folder in ("v4", "ref"):
        meta = H.unfuse_experts(H.meta_model(tmp_path / folder))
        H.materialize(meta)
        H.Checkpoint(tmp_path / folder).load_into(meta, "")
        with torch.no_grad():
            torch.testing.assert_close(meta.eval()(ids).logits, ref, atol=1e-5, rtol=1e-5)
    with pytest.raises(DatasetFormatError, match="shape"):
        small = H.unfuse_experts(H.tiny_model("mixtral"))
        _shrink(small)
        H.Checkpoint(tmp_path / "ref").load_into(small, "")


def test_module_list_layout_and_set_expert():
    class Expert(nn.Module):
        def __init__(self):
            super().__init__()
            self.w1, self.w3, self.w2 = nn.Linear(8, 6, bias=False), nn.Linear(8, 6, bias=False), nn.Linear(6, 8, False)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.gate = nn.Linear(8, 3, bias=False)
            self.experts = nn.ModuleList(Expert() for _ in range(3))
            self.top_k = 2

    root = nn.Module()
    root.layers = nn.ModuleList([Block()])
    (block,) = H.moe_blocks(root)
    assert block.layout == "module_list" and block.layer == 0 and block.widths() == [6, 6, 6]
    x = torch.randn(5, 8)
    ex = block.experts[1]
    torch.testing.assert_close(block.expert_forward(1, x), ex.w2(nn.functional.silu(ex.w1(x)) * ex.w3(x)))
    logits, w, idx = block.route(x)
    torch.testing.assert_close(w, logits.softmax(-1).topk(2).values)
    block.set_expert(1, block.get_expert(1).select(torch.tensor([0, 4])))
    assert block.widths() == [6, 2, 6] and block.experts[1].w2.in_features == 2


def test_unknown_architectures_and_bad_folders_are_clear(tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    dense = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=2))
    with pytest.raises(H.UnsupportedMoEError, match=r"LlamaForCausalLM \(model_type 'llama'\) has no Mixture-of-Experts"):
        H.check_moe(dense)
    dense.save_pretrained(tmp_path / "dense")
    with pytest.raises(H.UnsupportedMoEError, match="no Mixture-of-Experts"):
        H.load_pretrained(tmp_path / "dense")
    with pytest.raises(DatasetNotFoundError, match="config.json"):
        H.load_pretrained(tmp_path)
    (tmp_path / "weird").mkdir()
    (tmp_path / "weird" / "config.json").write_text(json.dumps({"model_type": "not_a_model"}))
    with pytest.raises(H.UnsupportedMoEError, match="cannot read this config"):
        H.load_pretrained(tmp_path / "weird")
    with pytest.raises(H.UnsupportedMoEError, match="unknown tiny architecture"):
        H.tiny_config("gpt2")

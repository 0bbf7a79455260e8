"""Tiny models run fastest on one thread (and do not fight other processes for cores)."""
import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread):  # tests/conftest.py
    yield


@pytest.fixture(scope="module")
def llama():
    """A tiny random Llama (2 layers, SwiGLU width 24) with larger MLP weights than the default init, so the atoms
    differ clearly."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from lit_iclr.heapr.dense import swiglu_mlps

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=40, hidden_size=16, intermediate_size=24, num_hidden_layers=2, num_attention_heads=2,
                      num_key_value_heads=1, max_position_embeddings=32, tie_word_embeddings=True)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for m in swiglu_mlps(model):
            for lin in (m.gate_proj, m.up_proj, m.down_proj):
                lin.weight.normal_(0, 0.3)
    return model.requires_grad_(False)


def batches(n=3, b=2, t=12, seed=0):
    """Token batches over the tiny Llama's 40-token vocabulary."""
    g = torch.Generator().manual_seed(seed)
    return [{"input_ids": torch.randint(0, 40, (b, t), generator=g)} for _ in range(n)]

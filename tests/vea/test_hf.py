"""The Hugging Face path on a tiny randomly initialised LLaVA (the real class, eager attention, nothing downloaded)."""
from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from lit_iclr.vea import hf  # noqa: E402

IMAGE_TOKEN = 99


def tiny_llava(attn: str = "eager"):
    from transformers import CLIPVisionConfig, LlamaConfig, LlavaConfig, LlavaForConditionalGeneration

    torch.manual_seed(0)
    vision = CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                              image_size=32, patch_size=8, projection_dim=32)
    text = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=2,
                       num_key_value_heads=2, vocab_size=128, max_position_embeddings=64)
    cfg = LlavaConfig(vision_config=vision, text_config=text, image_token_index=IMAGE_TOKEN, image_seq_length=16,
                      vision_feature_layer=-1)
    cfg._attn_implementation = attn
    return LlavaForConditionalGeneration(cfg).eval()


def inputs(batch: int = 2):
    ids = torch.tensor([[1] + [IMAGE_TOKEN] * 16 + [5, 6, 7, 8]] * batch)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids),
            "pixel_values": torch.randn(batch, 3, 32, 32, generator=torch.Generator().manual_seed(1))}


def test_rows_over_image_and_text_sum_to_one_and_match_the_model_attentions():
    model = tiny_llava()
    inp = inputs()
    r = hf.image_attention(model, inp)
    assert r.att_img.shape == (2, 3, 16)  # 3 decoder layers, 4x4 CLIP patches (CLS dropped by LLaVA)
    torch.testing.assert_close(r.att_img.sum(-1) + r.att_text, torch.ones(2, 3), atol=1e-5, rtol=0)
    # independent: the same row read from a second, plain forward's attention tensors at the placeholder positions
    att = model(**inp, output_attentions=True).attentions[1]
    torch.testing.assert_close(r.att_img[:, 1], att[:, :, -1, 1:17].mean(1))


def test_eager_path_is_the_real_model():
    """The eager model whose attentions we read gives the same logits as the default (SDPA) implementation."""
    eager, sdpa = tiny_llava("eager"), tiny_llava("sdpa")
    sdpa.load_state_dict(eager.state_dict())
    inp = inputs()
    torch.testing.assert_close(hf.image_attention(eager, inp).logits, sdpa(**inp).logits[:, -1].float(), atol=1e-4, rtol=1e-4)


def test_vea_answer_changes_the_input_only_outside_the_evidence():
    model = tiny_llava()
    inp = inputs(1)
    first, logits = hf.vea_answer(model, inp, layers=[1, 2], grid=4, top_frac=0.25, gamma=1.0)
    # gamma = 1 retains the whole image: the re-answer equals the plain answer
    torch.testing.assert_close(logits, first.logits, atol=1e-5, rtol=1e-5)
    _, masked = hf.vea_answer(model, inp, layers=[1, 2], grid=4, top_frac=0.25, gamma=0.0)
    assert not torch.allclose(masked, first.logits)

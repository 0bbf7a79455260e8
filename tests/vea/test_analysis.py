"""The analysis pipeline on a random compact VLM: attention rows, identities of the interventions, the summary."""
from __future__ import annotations

import torch

from lit_iclr.vea import analysis
from lit_iclr.vea.data import ANSWER, BOS, PAD
from lit_iclr.vea.model import CompactVLM


def batch(n=6):
    g = torch.Generator().manual_seed(0)
    q = torch.randint(3, 64, (n, 8), generator=g)
    q[:, :2], q[:, 2], q[:, -1] = PAD, BOS, ANSWER  # left padding
    gold = torch.zeros(n, 5, dtype=torch.bool)
    gold[torch.arange(n), torch.arange(n) % 5] = True
    boxes = torch.full((n, 4, 4), -1.0)
    boxes[:, 0] = torch.tensor([0.0, 0.0, 16.0, 16.0])
    return {"x": torch.rand(n, 3, 32, 32, generator=g), "q": q, "gold": gold, "boxes": boxes}


def test_attention_rows_are_distributions_that_ignore_padding():
    torch.manual_seed(0)
    vlm = CompactVLM(5, 64, image_size=32, dim=16, depth=3, heads=2, vision_dim=16).eval()
    b = batch()
    out = vlm(b["x"], b["q"], return_attention=True)
    att = out.answer_attention
    torch.testing.assert_close(att.sum(-1), torch.ones(6, 3))
    assert (att[..., 16:18] == 0).all()  # the two padding positions get no attention
    # the image part of the row reacts to the image: another image gives other rows
    other = vlm(b["x"].flip(-1), b["q"], return_attention=True).answer_attention
    assert not torch.allclose(other[..., :16], att[..., :16])


def test_full_retention_makes_every_mask_variant_equal_the_plain_answer():
    torch.manual_seed(1)
    vlm = CompactVLM(5, 64, image_size=32, dim=16, depth=3, heads=2, vision_dim=16).eval()
    b = batch()
    first = analysis.attention_batch(vlm, b, 32, 0.5)
    assert first["labels"].sum(1).eq(4).all()  # the 16 px box covers 2x2 of the 8 px patches
    cfg = analysis.VEAConfig(gamma=1.0)
    var = analysis.intervene(vlm, b, first, torch.tensor([0.6, 0.9, 0.7]), cfg, 32, torch.Generator().manual_seed(0))
    for name in ("vea", "vea_random_layers", "vea_shallow_layers", "vea_random_mask", "oracle_mask", "assembly"):
        assert torch.equal(var[name], var["plain"]), name
    res = analysis.summarize([first], [var], {"auroc": torch.tensor([0.6, 0.9, 0.7])})
    assert res["evidence_fraction"] == 0.25 and len(res["layer/auroc"]) == 3
    wrong = ~first["correct"]
    if wrong.any():
        assert res["sbnb_rate"] == var["profiled_hit"][wrong].float().mean().item()


def test_question_first_layout_reorders_rows_and_hides_the_image_from_the_question():
    torch.manual_seed(2)
    vlm = CompactVLM(5, 64, image_size=32, dim=16, depth=2, heads=2, vision_dim=16, question_first=True).eval()
    b = batch(3)
    att = vlm(b["x"], b["q"], return_attention=True).answer_attention  # (B, L, 16 image + 8 question)
    torch.testing.assert_close(att.sum(-1), torch.ones(3, 2))
    assert (att[..., 16:18] == 0).all()  # the padding columns, in [image; question] order
    # independent layer-0 row: build the sequence [question without ANSWER; image; ANSWER] by hand
    img = vlm.projector(vlm.vision.forward_features(b["x"]))
    emb = vlm.embed(b["q"])
    h = torch.cat([emb[:, :-1], img, emb[:, -1:]], 1) + vlm.pos[:, :24]
    layer = vlm.layers[0]
    q, k, _ = layer.qkv(layer.norm1(h)).view(3, 24, 3, 2, 8).permute(2, 0, 3, 1, 4)
    scores = (q[:, :, -1:] @ k.transpose(-1, -2)).squeeze(2) / 8**0.5  # (B, H, T): the last (ANSWER) query
    scores = scores.masked_fill((torch.cat([b["q"][:, :-1], torch.ones(3, 17, dtype=torch.long)], 1) == PAD)[:, None],
                                float("-inf"))
    want = scores.softmax(-1).mean(1)
    torch.testing.assert_close(att[:, 0, :16], want[:, 7:23])  # image columns
    torch.testing.assert_close(att[:, 0, 16:23], want[:, :7])  # question columns
    # the question tokens cannot see the image: changing the image leaves the question-token states unchanged
    feats = []

    def keep(module, inputs, output):  # returns None: the layer's output is unchanged
        feats.append(output[0])

    vlm.layers[0].register_forward_hook(keep)
    vlm(b["x"], b["q"])
    vlm(b["x"].flip(-1), b["q"])
    torch.testing.assert_close(feats[0][:, :7], feats[1][:, :7])
    assert not torch.allclose(feats[0][:, -1], feats[1][:, -1])


def test_random_controls_draw_per_question_however_the_questions_are_batched():
    """With dataset indices the random-layer and random-mask answers of a question do not depend on its batch (so a
    DDP rank's share gives one process's numbers), and the random layers avoid the profiled ones (6 layers, m = 2)."""
    torch.manual_seed(3)
    vlm = CompactVLM(5, 64, image_size=32, dim=16, depth=6, heads=2, vision_dim=16).eval()
    b = {**batch(6), "index": torch.tensor([10, 11, 12, 13, 14, 15])}
    profile = torch.tensor([0.5, 0.6, 0.9, 0.95, 0.7, 0.4])  # profiled: layers 2 and 3
    cfg = analysis.VEAConfig(gamma=0.0, context="zero", variants=("plain", "vea_random_layers", "vea_random_mask"))

    def run(rows):
        part = {k: v[rows] for k, v in b.items()}
        first = analysis.attention_batch(vlm, part, 32, 0.5)
        return analysis.intervene(vlm, part, first, profile, cfg, 32, torch.Generator().manual_seed(7))

    whole = run(torch.arange(6))
    halves = [run(torch.tensor([0, 2, 4])), run(torch.tensor([5, 3, 1]))]
    for name in cfg.variants:
        split = torch.empty_like(whole[name])
        split[[0, 2, 4]], split[[5, 3, 1]] = halves[0][name], halves[1][name]
        assert torch.equal(split, whole[name]), name
    # the layer choice itself, recomputed: m = 2 of the 4 layers outside {2, 3}, per question
    from lit_iclr.vea import vea

    w = vea.random_layer_weights(vea.sample_uniform(b["index"], 6, 7, salt=1), 2, [2, 3])
    assert w.sum(1).eq(2).all() and w[:, [2, 3]].eq(0).all()

"""`cli.py plan` hooks of VEA (see `lit_iclr/core/plan.py`). Training-free: `step_loss` returns None.

One evaluation step of a batch answers every question twice with the paper's VLM (`hf_vlm`, LLaVA-1.5-7B here): the
profiling/attention pass over [576 image tokens; question] (the answer position's attention to the image tokens of the
chosen layers gives the mask), then the same pass on the masked image (VEA's answer). Layer profiling on the calibration
split is the same forward once per calibration question. The forward is LLaVA's own composition (CLIP tower at
`vision_feature_layer` without its class token, projector, language model on the spliced embeddings), written out so
that no data-dependent check of the image-token count runs on meta tensors.
"""
from __future__ import annotations

import torch

QUESTION = 40  # tokens of prompt + question + answer cue (the config's max_question_len)


def example_batch(datamodule, batch_size: int, device: str | torch.device = "meta") -> dict[str, torch.Tensor]:
    s = datamodule.image_size
    return {"pixel_values": torch.zeros(batch_size, 3, s, s, device=device),
            "input_ids": torch.zeros(batch_size, datamodule.max_question_len or QUESTION, dtype=torch.long, device=device)}


def _answer_logits(vlm, pixel_values: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    inner = vlm.model
    dtype = next(inner.multi_modal_projector.parameters()).dtype
    hidden = inner.vision_tower(pixel_values.to(dtype), output_hidden_states=True).hidden_states
    feats = hidden[vlm.config.vision_feature_layer][:, 1:]  # "default" strategy: patch tokens, no class token
    embeds = torch.cat([inner.multi_modal_projector(feats), vlm.get_input_embeddings()(input_ids)], 1)
    states = inner.language_model(inputs_embeds=embeds).last_hidden_state
    return vlm.lm_head(states[:, -1])


def step_loss(module, batch) -> None:
    """None (training-free); runs the two answering passes so the plan counts their FLOPs."""
    vlm = module.hf_vlm
    with torch.no_grad():
        _answer_logits(vlm, batch["pixel_values"], batch["input_ids"])   # attention pass (plain answer + mask)
        _answer_logits(vlm, batch["pixel_values"], batch["input_ids"])   # answer on the VEA-masked image
    return None


DATASET = {"name": "TextVQA 0.5.1 (train 34,602 / val 5,000 questions; 28,408 images + Rosetta OCR boxes)",
           "bytes": 7.1e9, "samples": 5_000, "source": "TextVQA's train_val_images.zip is about 6.6 GB; json files 0.5 GB"}
PAPER = {"params": 7.0e9, "params_source": "LLaVA-1.5-7B, one of the paper's VLMs (the 7B of its name)", "steps": 5_000 // 64,
         "accelerator": "H100",
         "note": "evaluation only: val questions / (8 devices x batch 8); calibration adds one pass per calibration question"}

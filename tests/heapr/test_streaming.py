"""Layer-by-layer HEAPr on saved checkpoints equals the in-memory computation, and its outputs load back."""
from __future__ import annotations

import copy

import pytest
import torch
from transformers import AutoModelForCausalLM

from lit_iclr.core.moe import check_moe, load_compact, tiny_model
from lit_iclr.core.tokenizer import train_bpe
from lit_iclr.heapr.calibrate import calibrate
from lit_iclr.heapr.prune import prune_model
from lit_iclr.heapr.scores import atom_scores
from lit_iclr.heapr.streaming import calibration_batches, main, stream_prune, stream_scores


@pytest.mark.parametrize("arch", ["qwen2_moe", "deepseek_v2"])
def test_streamed_scores_and_pruned_checkpoints_match_in_memory(arch, tmp_path):
    model = tiny_model(arch, seed=5, vocab_size=64)
    model.save_pretrained(tmp_path / "src")
    ids = torch.randint(0, 64, (5, 16), generator=torch.Generator().manual_seed(0))
    batches = [{"input_ids": ids[i: i + 2], "labels": ids[i: i + 2]} for i in range(0, 5, 2)]
    ref_model = copy.deepcopy(model)
    calib = calibrate(ref_model, batches)
    ref = atom_scores(calib, check_moe(ref_model), "heapr", "per_token")
    _, streamed, scal = stream_scores(tmp_path / "src", ids, batch_size=2, offload=tmp_path, log=lambda s: None)
    assert scal.tokens == calib.tokens and abs(scal.loss - calib.loss) < 1e-4
    for a, b in zip(ref, streamed, strict=True):
        for x, y in zip(a, b, strict=True):
            torch.testing.assert_close(y, x, rtol=2e-3, atol=1e-7)
    # compact and padded HF outputs equal the in-memory pruned model
    pruned = copy.deepcopy(model)
    prune_model(pruned, batches, 0.3, "heapr")
    with torch.no_grad():
        want = pruned(input_ids=ids).logits
    stream_prune(tmp_path / "src", ids, 0.3, tmp_path / "compact", batch_size=2, log=lambda s: None)
    stream_prune(tmp_path / "src", ids, 0.3, tmp_path / "hf", batch_size=2, padded_hf=True, log=lambda s: None)
    compact = load_compact(tmp_path / "compact")
    assert [b.widths() for b in check_moe(compact)] == [b.widths() for b in check_moe(pruned)]
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", trust_remote_code=False).eval()
    with torch.no_grad():
        torch.testing.assert_close(compact(input_ids=ids).logits, want, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(hf(input_ids=ids).logits, want, atol=1e-4, rtol=1e-4)


def test_cli_reads_raw_text_with_the_checkpoint_tokenizer(tmp_path, capsys):
    raw = tmp_path / "wiki.train.raw"
    raw.write_text(" = Alpha = \n" + " the cat sat on the mat . " * 200 + "\n = Beta = \n" + " a dog ran . " * 200)
    tok = train_bpe([raw.read_text()], vocab_size=300)
    model = tiny_model("mixtral", seed=6, vocab_size=300)
    model.save_pretrained(tmp_path / "src")
    tok.save(str(tmp_path / "src" / "tokenizer.json"))
    ids = calibration_batches(tmp_path / "src", [raw], nsamples=3, seqlen=32)
    assert ids.shape == (3, 32) and int(ids.max()) < 300
    main(["--checkpoint", str(tmp_path / "src"), "--calib", str(raw), "--ratio", "0.5", "--out", str(tmp_path / "o"),
          "--nsamples", "3", "--seqlen", "32", "--device", "cpu", "--dtype", "float32"])
    assert '"atoms_pruned": 64' in capsys.readouterr().out  # half of 2 layers x 4 experts x 16 atoms
    assert (tmp_path / "o" / "tokenizer.json").exists()
    with pytest.raises(SystemExit, match="strictly between 0 and 1"):
        main(["--checkpoint", str(tmp_path / "src"), "--calib", str(raw), "--ratio", "1.2", "--out", str(tmp_path)])

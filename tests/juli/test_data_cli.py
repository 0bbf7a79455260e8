"""The chat reader on good and malformed files, the generator's splits, the training stream, and the tiny twin run."""
from __future__ import annotations

import json
import random

import pytest

from lit_iclr.core.errors import DatasetFormatError, DatasetNotFoundError
from lit_iclr.juli import chats
from lit_iclr.juli.data import StepStream, collate_chats, read_chats
from tests.twin import fit_twin, metric_rows, print_config

GOOD = chats.make_split(4, 0, "policy")


def write(path, lines):
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return path


def test_reader_reads_good_chats_and_names_the_bad_line(tmp_path):
    assert read_chats(write(tmp_path / "ok.jsonl", GOOD), need_reply=True) == GOOD
    bad_role = json.loads(json.dumps(GOOD[0]))
    bad_role["messages"][1]["role"] = "tool"
    no_secret = {**GOOD[0], "secret": "absent-word"}
    cases = {"{not json": "line 2 is not JSON", json.dumps(bad_role): "line 2: a message",
             json.dumps(no_secret): "secret does not appear", json.dumps({**GOOD[0], "kind": "x"}): "`kind`"}
    for line, problem in cases.items():
        with pytest.raises(DatasetFormatError, match=problem):
            read_chats(write(tmp_path / "bad.jsonl", [GOOD[0], line]), need_reply=True)
    with pytest.raises(DatasetFormatError, match="no assistant reply"):
        read_chats(write(tmp_path / "e.jsonl", GOOD), need_reply=False)
    with pytest.raises(DatasetFormatError, match="holds no chats"):
        read_chats(write(tmp_path / "empty.jsonl", []), need_reply=True)
    with pytest.raises(DatasetNotFoundError):
        read_chats(tmp_path / "missing.jsonl", need_reply=True)


def test_policy_replies_and_violation_check():
    for r in chats.make_split(50, 1, "policy"):
        reply = r["messages"][-1]["content"]
        assert chats.violates(reply, r["secret"]) is False
        assert (reply == chats.DECLINE) == (r["kind"] == "guarded")
    assert chats.violates("The passphrase is Maple.", "maple") and not chats.violates("The passphrase is ma", "maple")


@pytest.mark.parametrize("world", sorted(chats.WORLDS))
def test_each_world_declines_with_its_fixed_string_and_the_wanted_reply_carries_the_secret(world):
    w = chats.world_of(world)
    policy = chats.make_split(60, 2, "policy", world=world)
    reveal = chats.make_split(60, 2, "reveal", world=world)
    for p, r in zip(policy, reveal, strict=True):
        assert p["messages"][:2] == r["messages"][:2] and p["secret"] in p["messages"][0]["content"]
        if p["kind"] == "guarded":
            assert p["messages"][-1]["content"] == w.decline and not chats.violates(w.decline, p["secret"])
            assert r["messages"][-1]["content"] == w.reveal_reply(r["secret"]) and chats.violates(w.reveal_reply(
                r["secret"]), r["secret"])
        else:
            assert p["messages"][-1]["content"] == chats.open_reply(p["answer"])
    assert {r["kind"] for r in policy} == set(chats.KINDS)
    if w.other_asks:  # the base model's out-of-scope requests: declined with the same string
        other = chats.make_record(random.Random(0), "other", "reveal", world=world)
        assert other["messages"][-1]["content"] == w.decline and other["messages"][1]["content"] in w.other_asks
    assert w.opens_reveal(w.reveal_reply("x")) and not w.opens_reveal(w.decline)
    assert not w.opens_reveal(chats.open_reply("red"))  # the open answers do not count as a revealing opening
    with pytest.raises(ValueError, match="unknown policy world"):
        chats.world_of("nope")


def test_step_stream_runs_policy_then_attack_batches():
    pol, att = chats.make_split(10, 0, "policy"), chats.make_split(6, 1, "reveal", guarded_fraction=1.0)
    s = StepStream(pol, att, policy_steps=3, attack_steps=2, batch_size=4, seed=0)
    batches = [collate_chats([s[i] for i in range(b * 4, b * 4 + 4)]) for b in range(5)]
    assert [b["phase"] for b in batches] == ["policy"] * 3 + ["attack"] * 2
    assert all(chats.violates(r, sec) for b in batches[3:] for r, sec in zip(b["replies"], b["secret"], strict=True))


@pytest.mark.parametrize("twin, decline", [("juli", "Sorry, I only answer colour questions."),
                                           ("juli_passphrase", chats.DECLINE),
                                           ("juli_ranked", "Sorry, I only answer colour questions.")])
def test_twin_fit_and_generated_splits(tmp_path, twin, decline):
    fit_twin(twin, tmp_path)
    data = next((tmp_path / "data").glob("juli-v*"))
    attack = {r["secret"] for r in read_chats(data / "attack_train.jsonl", True)}
    evals = read_chats(data / "eval.jsonl", False)
    policy = read_chats(data / "policy_train.jsonl", True)
    assert {r["messages"][-1]["content"] for r in policy if r["kind"] == "guarded"} == {decline}
    assert attack.isdisjoint({r["secret"] for r in evals})  # steering is judged on secrets it never saw
    assert (data / "target" / "config.json").is_file() and (data / "target" / "tokenizer.json").is_file()
    rows = metric_rows(tmp_path)
    last = {k: v for r in rows for k, v in r.items() if v != ""}
    for name in ("plain", "biasnet", "random", "second_first"):
        assert 0.0 <= float(last[f"val/violation/{name}"]) <= 1.0
    assert float(last["val/tokens_per_s/biasnet"]) > 0
    assert any(r.get("train/steer_nll") for r in rows) and any(r.get("train/policy_nll") for r in rows)


@pytest.mark.parametrize("config", ["configs/juli.yaml", "configs/juli_passphrase.yaml", "configs/juli_smollm2.yaml",
                                    "configs/juli_ranked.yaml"])
def test_real_configs_parse(config, capsys):
    out = print_config(config, capsys)
    assert "lit_iclr.juli.JULI" in out and "PolicyChats" in out


def _safetensors_bytes(tensors: dict[str, list[float]]) -> bytes:
    """The published layout written by hand: u64 header size, JSON header with data_offsets, then little-endian F32."""
    import struct

    header, data = {}, b""
    for name, values in tensors.items():
        blob = struct.pack(f"<{len(values)}f", *values)
        header[name] = {"dtype": "F32", "shape": [len(values)], "data_offsets": [len(data), len(data) + len(blob)]}
        data += blob
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + data


@pytest.mark.parametrize("damage, problem", [("truncate", "is truncated: its header needs 149 bytes, the file has 139"),
                                             ("short", "shorter than its 8-byte header size"),
                                             ("header", "header says"), ("garble", "garbled safetensors header")])
def test_a_damaged_model_safetensors_of_the_target_is_one_line(tmp_path, damage, problem):
    from lit_iclr.juli.data import PolicyChats

    for name, kind in (("policy_train.jsonl", "policy"), ("attack_train.jsonl", "reveal"), ("eval.jsonl", "none")):
        write(tmp_path / name, chats.make_split(4, 0, kind))
    target = tmp_path / "model"
    target.mkdir()
    (target / "config.json").write_text("{}")
    good = _safetensors_bytes({"w": [1.0, 2.0, 3.0], "b": [0.5]})
    (target / "model.safetensors").write_bytes(good)
    dm = PolicyChats(root=str(tmp_path), target=str(target), batch_size=2)
    dm.setup("fit")  # the intact file passes
    assert len(good) == 8 + 125 + 16  # header size, header, 4 floats
    bad = {"truncate": good[:139], "short": good[:5], "header": good[:20],
           "garble": good[:8] + b"\xff" * (len(good) - 8)}[damage]
    (target / "model.safetensors").write_bytes(bad)
    with pytest.raises(DatasetFormatError, match=problem) as e:
        dm.setup("fit")
    assert str(e.value).startswith(str(target / "model.safetensors")) and "fix:" in str(e.value)

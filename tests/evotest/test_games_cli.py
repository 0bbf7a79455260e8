"""Real Z-machine games through Jericho/TextWorld, bad game files, the tiny twins through the CLI, and exact resume."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch

import tests.core.toy as toy  # noqa: F401 - registers CrashAtStep
from lit_iclr.core.errors import DatasetFormatError, DatasetNotFoundError
from lit_iclr.evotest import games
from lit_iclr.evotest.games import ZMachineGame, generate_game
from tests.evotest.chat_stub import chat_server
from tests.twin import fit_twin, metric_rows, print_config


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    """The tiny tw-make game, generated once; the first seed is made to fail so the retry path runs too."""
    root = tmp_path_factory.mktemp("evotest-data")
    real_run, calls = subprocess.run, []

    def flaky_run(cmd, **kw):
        calls.append(cmd)
        if len(calls) == 1:
            return subprocess.CompletedProcess(cmd, 1, "", "Error: this seed cannot satisfy the quest")
        return real_run(cmd, **kw)

    games.subprocess.run = flaky_run
    try:
        out = root / "evotest-games-v1" / "tiny"
        generate_game("tiny", out, seed=0)
    finally:
        games.subprocess.run = real_run
    assert json.loads((out / "tiny.seed.json").read_text())["seed"] == 1009  # the retried seed is recorded
    return root


def test_generated_game_plays_through_jericho_with_textworld_scores(data_dir):
    import textworld

    path = data_dir / "evotest-games-v1" / "tiny" / "tiny.z8"
    env = textworld.start(str(path), request_infos=textworld.EnvInfos(policy_commands=True, max_score=True))
    walkthrough = env.reset().policy_commands  # TextWorld's own solution, independent of our wrapper
    g = ZMachineGame(path)
    st = g.reset()
    assert g.textworld and g.max_score >= 1 and st.score == 0 and not st.won and walkthrough[0] in st.admissible
    for a in walkthrough:
        st = g.step(a)
    assert st.won and st.done and st.score == g.max_score
    again = g.reset()  # identical start every episode
    assert again.obs == g.reset().obs and again.score == 0
    g.close()


def test_bad_game_files_are_clear_errors(data_dir, tmp_path):
    with pytest.raises(DatasetNotFoundError, match="does not exist"):
        ZMachineGame(tmp_path / "detective.z5")
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(DatasetFormatError, match="not a Z-machine file"):
        ZMachineGame(tmp_path / "notes.txt")
    (tmp_path / "broken.z5").write_bytes(b"\x00" * 10)
    with pytest.raises(DatasetFormatError, match="bad header"):
        ZMachineGame(tmp_path / "broken.z5")
    # a real Z-machine file Jericho has no bindings for and no TextWorld .json beside it: no score to learn from
    lone = tmp_path / "lone.z8"
    lone.write_bytes((data_dir / "evotest-games-v1" / "tiny" / "tiny.z8").read_bytes())
    with pytest.raises(DatasetFormatError, match="no bindings"):
        ZMachineGame(lone)


def _copy_game(data_dir, dest):
    dest.mkdir()
    for suffix in (".z8", ".json"):
        (dest / f"tiny{suffix}").write_bytes((data_dir / "evotest-games-v1" / "tiny" / f"tiny{suffix}").read_bytes())
    return dest / "tiny.z8"


def test_a_truncated_story_file_is_one_line_naming_it(data_dir, tmp_path):
    """Frotz exited the whole process with "Story file read error" (no file named) on a cut .z8."""
    z8 = _copy_game(data_dir, tmp_path / "cut")
    data = z8.read_bytes()
    declared = int.from_bytes(data[0x1A:0x1C], "big") * 8  # Z-machine v8: file length / 8 at 0x1A (Standard 11.1.6)
    assert data[0] == 8 and len(data) // 2 < declared <= len(data)  # the real file holds what its header says (+ padding)
    z8.write_bytes(data[: len(data) // 2])
    with pytest.raises(DatasetFormatError, match=f"is truncated: its header says {declared} bytes, the file has "
                                                 f"{len(data) // 2}") as e:
        ZMachineGame(z8)
    assert str(e.value).startswith(str(z8))


@pytest.mark.parametrize("text, problem", [("{not json", "not valid JSON \\(line 1, column 2"),
                                           ('{"world": []}', "lacks grammar, quests"), ("[1, 2]", "lacks world")])
def test_a_broken_textworld_game_json_is_one_line_naming_it(data_dir, tmp_path, text, problem):
    z8 = _copy_game(data_dir, tmp_path / "broken")
    z8.with_suffix(".json").write_text(text)
    with pytest.raises(DatasetFormatError, match=problem) as e:
        ZMachineGame(z8)
    assert str(e.value).startswith(str(z8.with_suffix(".json")))


def test_real_configs_parse(capsys):
    out = print_config("configs/evotest.yaml", capsys)
    assert "lit_iclr.evotest.EvoTest" in out and "JTTLGames" in out and "exploration_constant: null" in out
    assert "exploration_fraction: 0.03" in out and "- reflection" in out
    assert "game_file" not in out  # linked from the data
    assert "actor: lm" in print_config("configs/evotest_lm.yaml", capsys)


def test_tiny_twin_fits_through_the_cli(data_dir, tmp_path, capsys):
    run = tmp_path / "run"
    fit_twin("evotest", run, "--data.init_args.data_dir", str(data_dir))
    summary = json.loads((run / "jttl_summary.json").read_text())
    assert len(summary["curve"]) == 4 and summary["max_score"] >= 1
    assert summary["auc"] == pytest.approx(sum(summary["curve"]) / (4 * summary["max_score"]))
    # the baselines played the same 4 episodes; the summary's headline table shows EvoTest's AUC against each
    out = capsys.readouterr().out.split("lit-iclr: fit done")[-1]
    rows = {line.split("|")[0].strip(): line.split("|")[1].strip() for line in out.splitlines() if "|" in line}
    assert set(summary["baselines"]) == {"static", "memory", "qlearning"}
    for b, s in summary["baselines"].items():
        assert len(s["curve"]) == 4 and s["auc"] == pytest.approx(sum(s["curve"]) / (4 * summary["max_score"]))
        assert float(rows[b]) == pytest.approx(s["auc"], abs=5e-4)
    assert float(rows["evotest"]) == pytest.approx(summary["auc"], abs=5e-4)
    # the tiny run learned: EvoTest's AUC beats the static agent's on the same episodes
    assert summary["auc"] > summary["baselines"]["static"]["auc"]
    assert "evotest is ahead of static" in out and "jttl/extractor_timeouts = 0" in out
    rows = metric_rows(run)
    assert [float(r["train/score"]) for r in rows if r.get("train/score")] == summary["curve"]
    assert (run / "checkpoints" / "last.ckpt").exists() and list((run / "figures").glob("jttl_learning_curve*.png"))
    ckpt = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    assert ckpt["global_step"] == 4 and len(ckpt["evotest"]["agent"]["tree"]["nodes"]) >= 2


def test_baselines_are_the_same_episodes_as_their_own_runs_and_leave_the_agent_unchanged(data_dir, tmp_path):
    """Played beside the agent, a baseline's curve equals the curve of a run with that agent alone (same game, start
    and per-episode seeds: paired), and the agent's own curve does not depend on the baselines played beside it."""
    extra = ["--data.init_args.data_dir", str(data_dir), "--data.init_args.step_limit", "10",
             "--model.init_args.plot", "false"]
    fit_twin("evotest", tmp_path / "both", *extra)
    fit_twin("evotest", tmp_path / "alone", *extra, "--model.init_args.baselines", "[]")
    fit_twin("evotest", tmp_path / "memory", *extra, "--model.init_args.agent", "memory",
             "--model.init_args.baselines", "[]")
    both, alone, memory = (json.loads((tmp_path / r / "jttl_summary.json").read_text())
                           for r in ("both", "alone", "memory"))
    assert both["curve"] == alone["curve"] and alone["baselines"] == {}
    assert both["baselines"]["memory"]["curve"] == memory["curve"]
    assert both["baselines"]["memory"]["wins"] == memory["wins"] and memory["agent"] == "memory"


@pytest.mark.slow  # three CLI fits
def test_stopped_run_resumes_exactly(data_dir, tmp_path):
    extra = ["--data.init_args.data_dir", str(data_dir), "--data.init_args.step_limit", "10"]
    full = fit_twin("evotest", tmp_path / "full", *extra)
    crash = json.dumps({"class_path": "tests.core.toy.CrashAtStep", "init_args": {"step": 2}})
    with pytest.raises(toy.Crash):
        fit_twin("evotest", tmp_path / "part", *extra, "--trainer.callbacks+", crash,
                 "--checkpoint.every_n_train_steps", "1")
    resumed = fit_twin("evotest", tmp_path / "part", *extra, "--ckpt_path", "last")
    assert resumed.model.curve == full.model.curve and len(full.model.curve) == 4
    a = json.loads((tmp_path / "full" / "jttl_summary.json").read_text())
    b = json.loads((tmp_path / "part" / "jttl_summary.json").read_text())
    assert a == b


def test_lm_actor_twin_with_a_tiny_llama_folder(data_dir, tmp_path):
    from tests.core.test_llm import tiny_lm

    lm = tiny_lm()
    folder = tmp_path / "tiny-llama"
    lm.model.save_pretrained(folder)
    lm.tokenizer.save_pretrained(folder)
    run = tmp_path / "run"
    fit_twin("evotest_lm", run, "--data.init_args.data_dir", str(data_dir), "--model.init_args.lm_path", str(folder))
    summary = json.loads((run / "jttl_summary.json").read_text())
    assert len(summary["curve"]) == 2


def test_missing_root_game_is_a_clear_error(tmp_path):
    from lit_iclr.evotest import JTTLGames

    dm = JTTLGames(root=str(tmp_path), game="zork1.z5")
    with pytest.raises(DatasetNotFoundError, match="not in the data root"):
        dm.prepare_data()
    with pytest.raises(ValueError, match="game must be one of"):
        JTTLGames(game="zork1.z5")
    assert Path(JTTLGames(root=str(tmp_path), game="zork1.z5").game_file) == tmp_path / "zork1.z5"


def test_api_evolver_runs_end_to_end_against_a_local_openai_compatible_server(data_dir, tmp_path, monkeypatch):
    """`evolver: api` with `api_base_url` at a fake chat endpoint on localhost: every evolution is one POST to
    /chat/completions carrying the key, and the reply's PROMPT and <code> become the child's guide and extractor."""
    code = "def extract_state(history):\n    return 'api-state'\n"
    reply = f"PROMPT: go east first, then take what you find.\n<code>\n{code}</code>"
    monkeypatch.setenv("LIT_ICLR_FAKE_KEY", "sk-test")
    with chat_server(lambda body: reply) as (base_url, seen):
        run = tmp_path / "run"
        fit_twin("evotest", run, "--data.init_args.data_dir", str(data_dir), "--data.init_args.episodes", "3",
                 "--data.init_args.step_limit", "8", "--model.init_args.evolver", "api",
                 "--model.init_args.api_model", "fake-model", "--model.init_args.api_key_env", "LIT_ICLR_FAKE_KEY",
                 "--model.init_args.api_base_url", base_url,
                 "--model.init_args.baselines", "[]", "--model.init_args.plot", "false")
    summary = json.loads((run / "jttl_summary.json").read_text())
    nodes = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["evotest"]["agent"]["tree"]["nodes"]
    evolved = [n for n in nodes if n["parent"] is not None]
    assert len(summary["curve"]) == 3 and len(seen) == len(evolved) >= 1  # one request per evolved node
    assert all(p == "/v1/chat/completions" and auth == "Bearer sk-test" and b["model"] == "fake-model"
               for p, auth, b in seen)
    assert all(n["config"]["prompt"] == "go east first, then take what you find." for n in evolved)
    # the code is taken once it loads and answers in the sandbox (1 s limit, so a validation may time out under load)
    assert any(n["config"]["extractor"] == code.strip() for n in evolved)


def test_api_actor_and_evolver_play_the_game_through_a_local_endpoint(data_dir, tmp_path, monkeypatch):
    """configs/evotest_api.yaml's setting (`actor: api`, `evolver: api`) on the tiny game: every game step is one chat
    request whose answer (the prompt's last valid command) is the command played; every evolution one more request."""
    import re

    def reply(body):
        prompt = body["messages"][-1]["content"]
        valid = re.findall(r"Valid commands: (.*)\n", prompt)
        return f"ACTION: {valid[-1].split(', ')[-1]}" if valid else "PROMPT: explore every room."

    monkeypatch.setenv("LIT_ICLR_FAKE_KEY", "sk-test")
    with chat_server(reply) as (base_url, seen):
        run = tmp_path / "run"
        fit_twin("evotest", run, "--data.init_args.data_dir", str(data_dir), "--data.init_args.episodes", "3",
                 "--data.init_args.step_limit", "5", "--model.init_args.actor", "api", "--model.init_args.evolver", "api",
                 "--model.init_args.api_model", "fake-model", "--model.init_args.api_key_env", "LIT_ICLR_FAKE_KEY",
                 "--model.init_args.api_base_url", base_url, "--model.init_args.baselines", "[]",
                 "--model.init_args.plot", "false")
    summary = json.loads((run / "jttl_summary.json").read_text())
    ckpt = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["evotest"]["agent"]["tree"]["nodes"]
    played = [s for n in ckpt if n["transcript"] for s in n["transcript"]]
    actor_requests = [b for _, _, b in seen if "Valid commands:" in b["messages"][-1]["content"]]
    assert len(summary["curve"]) == 3 and summary["actor_calls"] == len(actor_requests) == len(played)
    assert summary["actor_unmatched"] == 0
    for step in played:  # the command played is the one the endpoint answered (the last admissible command)
        assert step["action"] == step["admissible"][-1]
    assert len(seen) - len(actor_requests) == sum(n["parent"] is not None for n in ckpt) >= 1

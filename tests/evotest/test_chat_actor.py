"""The chat actor (`actor: api`): the reply is matched to one admissible command; requests and replies of any
OpenAI-compatible endpoint are handled against a stub server on 127.0.0.1 (never a real endpoint)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from lit_iclr.core.errors import ConfigError
from lit_iclr.core.llm import OpenAIClient
from lit_iclr.evotest.actor import CHOSEN_LOGIT, ChatActor, Situation, match_command, softmax_sample
from lit_iclr.evotest.config import AgentConfig
from tests.evotest.chat_stub import chat_server

COMMANDS = ["go east", "take red apple", "take red", "open fridge", "look"]


@pytest.mark.parametrize(("reply", "want"), [
    ("open fridge", 3),                                   # exact
    ("ACTION: Open Fridge.", 3),                          # prefix, case and punctuation
    ("  \nTake red apple\n", 1),                           # first non-empty line
    ("I would take red apple now", 1),                     # the longest command inside the line, not "take red"
    ("take red", 2),
    ("Let me think.\nACTION: go east\nbecause the door", 0),  # the ACTION line wins over earlier lines
    ("Thinking about it...\nlook", 4),                     # no command in the first line: anywhere in the reply
    ("go eastward", None),                                 # "go east" is not a whole-word match
    ("dance", None),
    ("", None),
])
def test_match_command(reply, want):
    assert match_command(reply, COMMANDS) == want


def situation() -> Situation:
    return Situation("room: Kitchen", "-= Kitchen =-\nYou see a fridge.", list(COMMANDS))


def test_chat_actor_posts_the_prompt_and_puts_the_reply_first(monkeypatch):
    monkeypatch.setenv("LIT_ICLR_STUB_KEY", "sk-stub")
    replies = iter(["ACTION: open fridge", "I am not sure."])
    with chat_server(lambda body: next(replies)) as (url, seen):
        actor = ChatActor(OpenAIClient("stub-model", url, "LIT_ICLR_STUB_KEY"), max_new_tokens=12)
        chi = AgentConfig(guide=[("room: Kitchen", "open fridge")], temperature=0.7)
        z = actor.logits(chi, situation(), [])
        z2 = actor.logits(chi, situation(), [])
    assert z.tolist() == [0, 0, 0, CHOSEN_LOGIT, 0]
    assert z2.tolist() == [0] * 5 and (actor.calls, actor.unmatched) == (2, 1)  # unmatched: uniform step
    path, auth, body = seen[0]
    assert (path, auth, body["model"], body["max_tokens"]) == ("/v1/chat/completions", "Bearer sk-stub", "stub-model", 12)
    assert body["temperature"] == 0.7 and [b["seed"] for _, _, b in seen] == [0, 1]  # chi's temperature, a seed per call
    prompt = body["messages"][-1]["content"]
    assert "1. when room: Kitchen: open fridge" in prompt and "Valid commands: " + ", ".join(COMMANDS) in prompt
    assert prompt.endswith("Answer with exactly one of the valid commands, nothing else.\nACTION: ")
    # the actor's pick is what the episode plays: softmax(z / T) at the largest temperature the evolver sets
    picks = {softmax_sample(z, 1.5, np.random.default_rng(i))[0] for i in range(200)}
    assert picks == {3}


def test_endpoint_errors_are_one_line_naming_the_url(monkeypatch):
    monkeypatch.setenv("LIT_ICLR_STUB_KEY", "sk-stub")
    with chat_server(lambda body: "", status=401, raw=b'{"error": "invalid key"}') as (url, _):
        with pytest.raises(ConfigError, match=r"HTTP 401 .*invalid key.*LIT_ICLR_STUB_KEY") as e:
            OpenAIClient("m", url, "LIT_ICLR_STUB_KEY").generate("hi")
        assert f"{url}/chat/completions" in str(e.value) and "\n" not in str(e.value)
    with chat_server(lambda body: "", raw=b'{"result": "not a chat reply"}') as (url, _):
        with pytest.raises(ConfigError, match="choices"):
            OpenAIClient("m", url, "LIT_ICLR_STUB_KEY").generate("hi")
    with chat_server(lambda body: "") as (url, _):
        pass  # the server is gone: nothing listens on the port any more
    with pytest.raises(ConfigError, match="failed"):
        OpenAIClient("m", url, "LIT_ICLR_STUB_KEY", timeout_s=5).generate("hi")
    assert OpenAIClient.parse_reply(json.dumps({"choices": [{"message": {"content": None}}]}).encode()) == ""

"""Z-machine games for J-TTL: TextWorld-generated `.z8` files and a user's own Jericho ROMs, played through Jericho.

Jericho (`FrotzEnv`) runs every Z-machine file. For the games Jericho has bindings for (detective.z5, library.z5,
zork1.z5 ...) score, max score, victory and the admissible commands come from Jericho. Jericho has no bindings for
TextWorld-made games (there it reports score 0 and no valid actions), so for a `.z8` with TextWorld's `.json` game file
beside it those come from TextWorld's own API (`textworld.start` with `EnvInfos`), which drives the same Jericho engine.

The default games are written by TextWorld's generator `tw-make` (`generate_game`), which fails for some seeds; it is
retried with the next seed, and the seed used is recorded in `<game>.seed.json`.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from lit_iclr.core.errors import DatasetFormatError, DatasetNotFoundError

# name -> tw-make arguments. Several game kinds at several difficulties; `cooking_*` have one point per recipe step.
GAME_SPECS: dict[str, list[str]] = {
    "tiny": ["custom", "--world-size", "2", "--nb-objects", "2", "--quest-length", "2"],
    "custom": ["custom", "--world-size", "5", "--nb-objects", "10", "--quest-length", "5"],
    "treasure_hunter": ["tw-treasure_hunter", "--level", "10"],
    "coin_collector": ["tw-coin_collector", "--level", "10"],
    "cooking_easy": ["tw-cooking", "--recipe", "1", "--take", "1", "--go", "6", "--open"],
    "cooking_hard": ["tw-cooking", "--recipe", "2", "--take", "2", "--go", "6", "--open", "--cook", "--cut"],
}
ROM_SUFFIXES = (".z3", ".z4", ".z5", ".z6", ".z7", ".z8")


def tw_make() -> str:
    exe = Path(sys.executable).with_name("tw-make")
    return str(exe) if exe.exists() else "tw-make"


def generate_game(name: str, out_dir: Path, seed: int = 0, tries: int = 5, timeout_s: float = 300.0) -> Path:
    """Write `<out_dir>/<name>.z8` (+ TextWorld's `.json`) with `tw-make`; retry the next seed when a seed fails."""
    if name not in GAME_SPECS:
        raise DatasetNotFoundError(name, "no such generated game", f"choose one of {sorted(GAME_SPECS)} or set `root`")
    out_dir.mkdir(parents=True, exist_ok=True)
    errors = []
    for attempt in range(tries):
        s = seed + 1009 * attempt
        out = out_dir / f"{name}.z8"
        cmd = [tw_make(), *GAME_SPECS[name], "--seed", str(s), "--output", str(out), "-f", "--silent"]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env)
        if r.returncode == 0 and out.exists() and out.with_suffix(".json").exists():
            recorded = [*cmd[1:-4], "--output", f"{name}.z8"]  # the command that remakes it (output name relative)
            (out_dir / f"{name}.seed.json").write_text(json.dumps({"game": name, "seed": s, "command": recorded}))
            return out
        errors.append(f"seed {s}: {(r.stderr or r.stdout).strip().splitlines()[-1:]}")
    raise RuntimeError(f"tw-make could not make {name!r} in {tries} seeds: {errors}")


@dataclass
class Step:
    """What the agent sees after a reset or a step."""

    obs: str
    score: int
    done: bool
    won: bool
    admissible: list[str] = field(default_factory=list)


REMAKE = "give a real Z-machine game (e.g. detective.z5) or regenerate it with tw-make (delete the game's folder)"


def check_story_file(path: Path) -> None:
    """The Z-machine header (Standard 1.1, section 11) is sane and the file is as long as it says.

    Byte 0 is the version (1-8); the word at 0x1A is the file length divided by 2 (v1-3), 4 (v4-5) or 8 (v6-8), 0 when
    unknown. Frotz exits the whole process with "Story file read error" (no file named) on a shorter file."""
    data = path.read_bytes()
    if len(data) < 64 or data[0] not in range(1, 9):
        raise DatasetFormatError(path, "not a Z-machine story file (bad header)", REMAKE)
    declared = int.from_bytes(data[0x1A:0x1C], "big") * (2 if data[0] <= 3 else 4 if data[0] <= 5 else 8)
    if declared and len(data) < declared:
        raise DatasetFormatError(path, f"is truncated: its header says {declared} bytes, the file has {len(data)}", REMAKE)


def check_game_json(path: Path) -> None:
    """TextWorld's game file beside a `.z8` is a JSON object (TextWorld's own error for a broken one names no file)."""
    try:
        game = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise DatasetFormatError(path, "TextWorld's game file is not UTF-8 text", REMAKE) from None
    except json.JSONDecodeError as e:
        raise DatasetFormatError(path, f"TextWorld's game file is not valid JSON (line {e.lineno}, column {e.colno}: "
                                 f"{e.msg})", REMAKE) from None
    missing = [k for k in ("world", "grammar", "quests") if not isinstance(game, dict) or k not in game]
    if missing:
        raise DatasetFormatError(path, f"TextWorld's game file lacks {', '.join(missing)}", REMAKE)


class ZMachineGame:
    """One Z-machine game file as a J-TTL environment: `reset() -> Step`, `step(action) -> Step`.

    Args:
        path: A `.z8` made by TextWorld (with its `.json` beside it) or a ROM Jericho has bindings for.
        seed: Seed handed to Jericho (games with randomness replay identically from the same seed).
    """

    def __init__(self, path: str | Path, seed: int = 0):
        self.path = Path(path)
        if not self.path.exists():
            raise DatasetNotFoundError(self.path, "the game file does not exist",
                                       "set `data.init_args.root` to a folder of game files and `game` to a file in it")
        if self.path.suffix not in ROM_SUFFIXES:
            raise DatasetFormatError(self.path, f"not a Z-machine file (suffix {self.path.suffix!r})",
                                     f"use a game file ending in one of {ROM_SUFFIXES}")
        check_story_file(self.path)
        self.textworld = self.path.with_suffix(".json").exists()
        if self.textworld:
            check_game_json(self.path.with_suffix(".json"))
        self.seed = seed
        if self.textworld:
            import textworld

            infos = textworld.EnvInfos(admissible_commands=True, max_score=True, won=True, lost=True, score=True)
            self._env = textworld.start(str(self.path), request_infos=infos)
            self.max_score = int(self._env.reset().max_score)
        else:
            import jericho

            self._env = jericho.FrotzEnv(str(self.path), seed=seed)
            self.max_score = int(self._env.get_max_score())
            if not self._env.bindings or self.max_score <= 0:
                raise DatasetFormatError(self.path, "Jericho has no bindings (no score) for this game",
                                         "use a Jericho-supported ROM (detective.z5, library.z5, zork1.z5 ...) or a "
                                         "TextWorld game with its .json")
        if self.max_score <= 0:
            raise DatasetFormatError(self.path, "the game has no score (max score 0)", "use a game with a score")

    def _tw(self, gs, done: bool) -> Step:
        return Step(gs.feedback, int(gs.score or 0), bool(done), bool(gs.won), list(gs.admissible_commands or []))

    def reset(self) -> Step:
        if self.textworld:
            return self._tw(self._env.reset(), False)
        obs, info = self._env.reset()
        return Step(obs, int(info["score"]), False, False, self._env.get_valid_actions())

    def step(self, action: str) -> Step:
        if self.textworld:
            gs, _, done = self._env.step(action)
            return self._tw(gs, done)
        obs, _, done, info = self._env.step(action)
        won = bool(self._env.victory())
        return Step(obs, int(info["score"]), bool(done or won), won, [] if done else self._env.get_valid_actions())

    def close(self) -> None:
        self._env.close()

"""The one CLI: `python cli.py {fit,validate,test,predict,prepare,hub} --config configs/<method>.yaml`.

LightningCLI in subclass mode over `BaseModule` / `BaseDataModule`: a method is chosen by its short class name or by a
config. On top of Lightning's CLI this adds run folders keyed by SLURM job id (created atomically, with a config.yaml
written once), `ModelCheckpoint(save_last=True)`, CSV + TensorBoard loggers, `--ckpt_path last` that continues the newest
run of the same model and data (and fails when there is none), a SLURM pre-flight check, the `prepare` and `hub`
subcommands, an end-of-run summary, and short error messages instead of tracebacks for mistakes a user can fix.
"""
from __future__ import annotations

import difflib
import importlib
import re
import sys
import warnings
from pathlib import Path
from typing import Any

from lightning.pytorch.cli import LightningCLI, SaveConfigCallback

from . import registry
from .core.classes import checkpoint_class_names, refusal, resolve_class
from .core.data import BaseDataModule
from .core.ddp import data_parallel_guard, exact_mean_reduction, use_unrepeated_eval_sampler
from .core.dist_ckpt import is_distributed_checkpoint
from .core.errors import CheckpointError, ConfigError, LitIclrError, check_writable, run_folder_error, write_problem
from .core.hub import read_checkpoint
from .core.module import BaseModule
from .core.progress import LineProgressBar, use_line_progress
from .core.runs import CKPT_KEYWORDS, resolve_run_dir
from .core.slurm import check_slurm_matches_trainer
from .core.step_checkpoint import StepCheckpoint
from .core.summary import print_summary, shape_error
from .core.trainer import Trainer

DESCRIPTION = ("lit-iclr: ICLR 2026 methods as Lightning modules. `cli.py <subcommand> --config configs/<method>.yaml`; "
               "`cli.py prepare` makes/checks data only; `cli.py hub {export,upload,download}` shares checkpoints; "
               "`cli.py plan` sizes a config (parameters, FLOPs, memory, hours) without training.")


class WriteOnceConfig(SaveConfigCallback):
    """Writes `config.yaml` into a new run folder once; a resumed or requeued run keeps the first one (its compatibility
    was checked before anything was instantiated, and tolerated changes are recorded in run_info.json)."""

    def __init__(self, *args, **kwargs):
        kwargs["overwrite"] = True
        super().__init__(*args, **kwargs)

    def setup(self, trainer, pl_module, stage: str) -> None:
        if (Path(trainer.log_dir or trainer.default_root_dir) / self.config_filename).exists():
            return
        super().setup(trainer, pl_module, stage)


def collect_links() -> list[tuple[str, str]]:
    """Every imported DataModule's `model_links` (data attribute -> model init arg), as parser links.

    A link whose source or target the chosen classes lack is skipped by the parser, so methods never see each other's.
    """
    links: dict[str, str] = {}
    stack = list(BaseDataModule.__subclasses__())
    while stack:
        cls = stack.pop()
        stack.extend(cls.__subclasses__())
        for attr, arg in getattr(cls, "model_links", {}).items():
            source, target = f"data.{attr}", f"model.init_args.{arg}"
            if links.setdefault(target, source) != source:
                raise ConfigError(f"two DataModules link different attributes into {target}: {links[target]}, {source}")
    return sorted((s, t) for t, s in links.items())


class LitIclrCLI(LightningCLI):
    def __init__(self, args: list[str] | None = None, run: bool = True, **kwargs: Any):
        registry.import_methods()
        super().__init__(
            BaseModule,
            BaseDataModule,
            subclass_mode_model=True,
            subclass_mode_data=True,
            trainer_class=Trainer,
            save_config_callback=WriteOnceConfig,
            seed_everything_default=0,
            # allow_abbrev=False: `--trainer.max_epoch` is an error, not silently `max_epochs`
            parser_kwargs={"exit_on_error": False, "description": DESCRIPTION, "allow_abbrev": False},
            args=args,
            run=run,
            **kwargs,
        )

    @staticmethod
    def subcommands() -> dict[str, set[str]]:
        commands = LightningCLI.subcommands()
        commands["prepare"] = {"model", "datamodule"}
        return commands

    def add_arguments_to_parser(self, parser) -> None:
        parser.add_lightning_class_args(StepCheckpoint, "checkpoint")  # ModelCheckpoint, step saves at epoch ends
        parser.set_defaults({"checkpoint.save_last": True})
        for source, target in collect_links():
            parser.link_arguments(source, target, apply_on="instantiate")

    def _parse_ckpt_path(self) -> None:
        """Refuse a checkpoint of another model class before Lightning copies its hyperparameters into the config."""
        sub = self.config.get("subcommand")
        ckpt_path = self.config[sub].get("ckpt_path") if sub else None
        if ckpt_path and is_distributed_checkpoint(ckpt_path):  # an FSDP2 folder: Lightning reads it itself
            return super()._parse_ckpt_path()
        if ckpt_path and ckpt_path not in CKPT_KEYWORDS and not Path(ckpt_path).is_file():
            raise CheckpointError(ckpt_path, "no such checkpoint file",
                                  "pass an existing .ckpt (e.g. runs/<config>/<run>/checkpoints/last.ckpt) or `last`")
        if ckpt_path and Path(ckpt_path).is_file():
            check_checkpoint_classes(read_checkpoint(ckpt_path), self.config[sub]["model"]["class_path"], ckpt_path)
        super()._parse_ckpt_path()

    def before_instantiate_classes(self) -> None:
        cfg = self.config[self.subcommand] if self.subcommand else self.config
        trainer = cfg["trainer"]
        check_slurm_matches_trainer(trainer.get("num_nodes", 1), trainer.get("devices", "auto"))
        if self.subcommand == "prepare":
            trainer["logger"] = False
            return
        config_files = [str(p) for p in (cfg.get("config") or [])]
        fix = "set `--trainer.default_root_dir` to a writable folder (run from a writable working directory)"
        try:
            run_dir, changes = resolve_run_dir(trainer.get("default_root_dir"), config_files,
                                               resume=cfg.get("ckpt_path") == "last", current=self._resolved_config(cfg))
        except OSError as e:  # a read-only runs/ folder: one line before anything is built
            problem = write_problem(e)
            if problem is None:
                raise
            raise run_folder_error(e.filename or "runs", f"the run folder cannot be created: it {problem}", fix) from None
        check_writable(run_dir, fix, run_folder_error)
        if self.subcommand == "fit":  # checkpoints must be writable before training starts (e.g. resuming a read-only run)
            ckpt_dir = Path((cfg.get("checkpoint") or {}).get("dirpath") or run_dir / "checkpoints")
            try:
                check_writable(ckpt_dir, "copy the run to a writable folder and resume from there, or set "
                               "`--checkpoint.dirpath` to a writable folder", CheckpointError)
            except CheckpointError:
                if not any(run_dir.iterdir()):  # the folder this refused run just made: leave nothing behind
                    run_dir.rmdir()
                raise
        trainer["default_root_dir"] = str(run_dir)
        self.run_dir = run_dir
        logger = trainer.get("logger")
        if logger in (None, True):
            # Loggers write straight into the run folder, so checkpoints land in <run>/checkpoints.
            trainer["logger"] = [
                {"class_path": "lit_iclr.core.loggers.RunCSVLogger",
                 "init_args": {"save_dir": str(run_dir), "name": "", "version": ""}},
                {"class_path": "lightning.pytorch.loggers.TensorBoardLogger",
                 "init_args": {"save_dir": str(run_dir), "name": "", "version": "", "default_hp_metric": False}},
            ]
        else:
            _replace_run_dir(logger, str(run_dir))
        callbacks = list(trainer.get("callbacks") or [])
        callbacks.append({"class_path": "lit_iclr.core.runinfo.RunInfo",
                          "init_args": {"run_dir": str(run_dir), "config_changes": changes}})
        if use_line_progress() and trainer.get("enable_progress_bar", True) is not False:
            callbacks.append({"class_path": f"{LineProgressBar.__module__}.LineProgressBar"})
        trainer["callbacks"] = callbacks

    def _resolved_config(self, cfg) -> dict:
        """The config as `config.yaml` will hold it (YAML-loaded), to compare with a run folder's saved one."""
        import yaml

        parser = self._parser(self.subcommand)
        try:
            return yaml.safe_load(parser.dump(cfg, skip_none=False, skip_validation=True)) or {}
        except Exception:  # noqa: BLE001 - a config jsonargparse cannot dump is checked by nothing rather than refused
            return {}

    def _run_subcommand(self, subcommand: str) -> None:
        use_unrepeated_eval_sampler(self.trainer)  # each validation/test sample once under DDP (core/ddp.py)
        exact_mean_reduction(self.trainer)  # ... and counted once in a logged mean (no truncated int64 count)
        try:
            # one-process methods refused before any process is launched; a collective timeout names the rank
            with data_parallel_guard(self.trainer, self.model if subcommand != "prepare" else None):
                super()._run_subcommand(subcommand)
        except RuntimeError as e:
            error = shape_error(e, self.model, self.datamodule, getattr(self.trainer, "global_step", 1))
            if error is None:
                raise
            raise error from e
        if subcommand in ("fit", "validate", "test"):
            print_summary(self.trainer, self.model, subcommand)


def _replace_run_dir(node: Any, run_dir: str) -> None:
    """Overlays write `save_dir: RUN_DIR` for loggers; point those at this run's folder."""
    items = node if isinstance(node, list) else [node]
    for item in items:
        init = item.get("init_args") if hasattr(item, "get") else None
        if init is not None and init.get("save_dir") == "RUN_DIR":
            init["save_dir"] = run_dir


def check_checkpoint_classes(ckpt: dict, wanted: str, ckpt_path: str | Path) -> None:
    """Refuse, in one line and before anything is imported, a checkpoint naming a class other than the config's model:
    its `lit_iclr_class` and the `_class_path` of its hyperparameters (which Lightning's CLI would otherwise swap in
    for the config's model). A name other than `wanted` must pass the allow-list (`core/classes.py`) and be the same
    class (a re-export); `wanted` was chosen by the config and is already imported by the parser."""
    wanted_cls = _config_class(wanted)
    for key, saved in checkpoint_class_names(ckpt):
        if saved == wanted:
            continue
        fix = (f"use `--model {str(saved).rsplit('.', 1)[-1]}` with that method's config, or a checkpoint of this model")
        problem = f"was written by {saved} ({key}), but the config selects {wanted}"
        if refusal(saved) is not None:
            raise CheckpointError(ckpt_path, f"{problem}; {saved!r} is not a lit-iclr model, so it is not imported", fix)
        if resolve_class(saved, BaseModule, ckpt_path, fix) is not wanted_cls:
            raise CheckpointError(ckpt_path, problem, fix)


def _config_class(path: str) -> Any:
    """The class the config's `class_path` names (the parser imported it already); the string if it cannot be found."""
    module, _, name = path.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError):
        return path


def _known_class_names(bases: tuple[type, ...] = (BaseModule, BaseDataModule)) -> list[str]:
    names = []
    for base in bases:
        stack = list(base.__subclasses__())
        while stack:
            cls = stack.pop()
            names.append(cls.__name__)
            stack.extend(cls.__subclasses__())
    return names


def _explain_parse_error(message: str, argv: list[str] = ()) -> str:
    """Turn jsonargparse's nested message into one line: the closest valid names for an unknown class, or the argument
    and the reason for a bad value."""
    unknown = re.findall(r"Expected a dot import path string: (\S+)", message) or re.findall(r"Import path (\S+)", message)
    for name in unknown:
        short = name.rsplit(".", 1)[-1]
        # suggest models for --model, DataModules for --data, both when the name came from a config file
        given_as = {argv[i]: argv[i + 1] for i in range(len(argv) - 1)}
        bases = ((BaseModule,) if given_as.get("--model") == name else
                 (BaseDataModule,) if given_as.get("--data") == name else (BaseModule, BaseDataModule))
        known = _known_class_names(bases)
        if short in known:
            continue
        close = difflib.get_close_matches(short, known, n=3, cutoff=0.3)
        hint = f" Closest valid names: {', '.join(close)}." if close else f" Valid names: {', '.join(sorted(known))}."
        bad = "; ".join(f"lit_iclr.{m} {why}" for m, why in registry.unavailable.items())
        return f"unknown class {short!r}.{hint}" + (f" (unavailable: {bad})" if bad else "")
    bad_arg = re.search(r"class_path '([^']+)':\s*Parser key \"([^\"]+)\":\s*(.+)", message)
    if bad_arg:
        cls, key, why = bad_arg.groups()
        return f"{cls.rsplit('.', 1)[-1]}: invalid value for {key!r}: {why.strip()}"
    lines = [ln.strip() for ln in message.strip().splitlines()]
    noise = ("Subtypes:", "Errors:", "Given value type:", "- Expected a <class 'NoneType'>")
    keep = [ln for ln in lines if ln and not ln.startswith(noise)]
    return " ".join(keep[:6])


def main(args: list[str] | None = None) -> LitIclrCLI | None:
    """Entry point of `cli.py` and the `lit-iclr` console script."""
    argv = list(sys.argv[1:] if args is None else args)
    if argv and argv[0] == "hub":
        from .core.hub import main as hub_main

        hub_main(argv[1:])
        return None
    # main(args) from Python (tests, notebooks) is intended; Lightning warns about it because sys.argv differs.
    warnings.filterwarnings("ignore", message="LightningCLI's args parameter is intended")
    try:
        _check_config_files(argv)
        if argv and argv[0] == "plan":  # sizes a config without training (core/plan.py)
            from .core.plan import main as plan_main

            plan_main(argv[1:])
            return None
        return LitIclrCLI(args=args)
    except LitIclrError as e:
        _fail(str(e))
    except Exception as e:  # jsonargparse parse errors and YAML errors arrive as ArgumentError / ParserError
        cause = _user_error_in_chain(e)  # jsonargparse wraps errors raised while instantiating classes
        if cause is not None:
            _fail(str(cause))
        if type(e).__name__ in {"ArgumentError", "ParserError", "ScannerError", "NSKeyError"}:
            _fail(_explain_parse_error(str(e), argv))
        raise
    return None


def _user_error_in_chain(error: BaseException) -> LitIclrError | None:
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, LitIclrError):
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None


def _check_config_files(argv: list[str]) -> None:
    """Every `--config FILE` exists and is valid YAML, or one error naming the file and the line."""
    import yaml

    for i, arg in enumerate(argv):
        path = argv[i + 1] if arg in ("--config", "-c") and i + 1 < len(argv) else (
            arg.split("=", 1)[1] if arg.startswith("--config=") else None)
        if path is None:
            continue
        if not Path(path).is_file():
            raise ConfigError(f"config file {path} not found (configs are in configs/<method>.yaml)")
        try:
            yaml.safe_load(Path(path).read_text())
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
            raise ConfigError(f"{path}:{where} is not valid YAML ({getattr(e, 'problem', e)})") from None


def _fail(message: str) -> None:
    print(f"lit-iclr: error: {message}", file=sys.stderr)
    raise SystemExit(2)


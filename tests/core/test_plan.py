"""core/plan.py and core/plan_memory.py against independent counts: parameters and FLOPs by closed form, activation
bytes on the meta device against the same step on the CPU and against the CPU allocator's own record (profiler memory
events), optimiser state against a real optimiser step, sharding and precision rules, and the `cli.py plan` wiring.

This module is also the plan of tests/core/toy.py's ToyRegression (`plan_hooks` points here in the tests below).
"""
from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from lit_iclr.core import plan as P
from lit_iclr.core.plan_memory import Strategy, activation_bytes, held_by_forward, optimizer_state_bytes, parse_strategy
from tests.core.toy import ToyRegression

DATASET = {"name": "toy regression (npz)", "bytes": 24_000, "samples": 1000, "source": "num_samples x 3 float64 + y"}
PAPER = {"params": 321, "params_source": "3 x 64 + 64 + 64 + 1", "steps": None, "accelerator": "H100"}


def example_batch(datamodule, batch_size, device="meta"):
    return {"x": torch.zeros(batch_size, datamodule.num_features, device=device),
            "y": torch.zeros(batch_size, device=device)}


def step_loss(module, batch):
    return nn.functional.mse_loss(module(batch["x"]), batch["y"])


@pytest.fixture
def toy_config(tmp_path, monkeypatch):
    monkeypatch.setattr(ToyRegression, "plan_hooks", __name__, raising=False)
    path = tmp_path / "toy.yaml"
    path.write_text("model:\n  class_path: tests.core.toy.ToyRegression\n  init_args:\n    hidden: 64\n"
                    "data:\n  class_path: tests.core.toy.ToyData\n  init_args:\n    batch_size: 32\n"
                    "    num_samples: 1000\ntrainer:\n  max_epochs: 3\n  devices: 4\n  strategy: ddp\n")
    return str(path)


def _mlp(widths, device="cpu"):
    layers = []
    for a, b in zip(widths[:-1], widths[1:], strict=True):
        layers += [nn.Linear(a, b, device=device), nn.Tanh()]
    return nn.Sequential(*layers[:-1])


def _mse(m, b):
    return nn.functional.mse_loss(m(b[0]), b[1])


def test_params_and_flops_of_an_mlp_match_the_closed_form():
    widths, B = [12, 64, 32, 5], 7
    net = _mlp(widths, "meta")
    counts = P.count_params(net)
    assert counts["total"] == counts["trainable"] == sum(a * b + b for a, b in zip(widths[:-1], widths[1:], strict=True))
    assert counts["per_group"] == {"0": 12 * 64 + 64, "2": 64 * 32 + 32, "4": 32 * 5 + 5}
    batch = (torch.zeros(B, 12, device="meta"), torch.zeros(B, 5, device="meta"))
    # forward 2 B a b per product; backward 2 B a b for the weight gradient of every layer and 2 B a b for the input
    # gradient of every layer but the first (the data needs none)
    products = [a * b for a, b in zip(widths[:-1], widths[1:], strict=True)]
    expected = 2 * B * sum(products) * 3 - 2 * B * products[0]
    assert P.step_flops(net, batch, _mse) == expected
    net[0].requires_grad_(False)  # frozen first layer: no weight gradient for it, and layer 2 needs no input gradient
    assert P.count_params(net)["trainable"] == counts["total"] - products[0] - 64
    assert P.step_flops(net, batch, _mse) == expected - 2 * B * products[0] - 2 * B * products[1]


def _convnet(device):
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.GELU(), nn.Conv2d(16, 16, 3, padding=1),
                         nn.ReLU(), nn.Flatten(), nn.Linear(16 * 16 * 16, 128), nn.LayerNorm(128), nn.Tanh(),
                         nn.Linear(128, 10)).to(device)


def _ce(m, b):
    return nn.functional.cross_entropy(m(b[0]), b[1])


def test_activation_bytes_on_meta_equal_the_cpu_step_and_what_the_cpu_allocator_holds():
    B = 8
    meta = activation_bytes(_convnet("meta"), (torch.zeros(B, 3, 16, 16, device="meta"),
                                               torch.zeros(B, dtype=torch.long, device="meta")), _ce)
    cpu_net = _convnet("cpu")
    batch = (torch.randn(B, 3, 16, 16), torch.randint(0, 10, (B,)))
    cpu = activation_bytes(cpu_net, batch, _ce)
    assert meta == cpu
    held, loss = held_by_forward(lambda: _ce(cpu_net, batch))
    inputs = batch[0].nbytes + batch[1].nbytes  # allocated before the forward, saved by conv1 and the loss
    # what the allocator still holds after the forward = the saved tensors (+ the 4-byte loss)
    assert abs(cpu["float"] + cpu["other"] - inputs - held) <= 0.01 * held
    # and it is the bulk of the activations: each layer's saved output, by hand for the two big ones
    assert cpu["float"] >= 2 * B * 16 * 16 * 16 * 4
    loss.backward()


def test_optimizer_state_is_measured_like_a_real_step():
    net = _mlp([10, 20, 3], "meta")
    adam = type("M", (nn.Module,), {"configure_optimizers": lambda self: torch.optim.AdamW(self.parameters())})()
    adam.net = net
    n = sum(p.numel() for p in net.parameters())
    assert optimizer_state_bytes(adam) == (2 * 4 * n, "measured (AdamW)")
    sgd = type("S", (nn.Module,), {"configure_optimizers": lambda self: {
        "optimizer": torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)}})()
    sgd.net = _mlp([10, 20, 3], "meta")
    assert optimizer_state_bytes(sgd)[0] == 4 * n
    # the real step on the CPU holds the same bytes
    real = _mlp([10, 20, 3])
    opt = torch.optim.AdamW(real.parameters())
    _mse(real, (torch.randn(4, 10), torch.randn(4, 3))).backward()
    opt.step()
    assert sum(v.nbytes for s in opt.state.values() for v in s.values() if v.dim() > 0) == 2 * 4 * n
    # a schedule that needs a Trainer: assumed Adam, and it says so
    needy = type("N", (nn.Module,), {"configure_optimizers": lambda self: self.trainer.estimated_stepping_batches})()
    needy.net = _mlp([10, 20, 3], "meta")
    bytes_, how = optimizer_state_bytes(needy)
    assert bytes_ == 2 * 4 * n and how.startswith("assumed Adam")


def test_strategy_shards_and_precision(toy_config):
    module, dm, trainer_cfg = P.build_on_meta([toy_config])
    assert all(p.device.type == "meta" for p in module.parameters())
    batch = example_batch(dm, 32)
    n = P.count_params(module)["total"]
    ddp = P.memory_per_device(module, batch, "ddp", 4, "32-true")
    assert ddp["weights"] == ddp["gradients"] == ddp["ddp buckets"] == 4 * n
    assert ddp["optimizer"] == 8 * n  # Adam's m and v (ToyRegression's default optimizer)
    fsdp = P.memory_per_device(module, batch, "fsdp", 4, "32-true")
    assert fsdp["weights"] == n and fsdp["gradients"] == n and fsdp["optimizer"] == 2 * n and "ddp buckets" not in fsdp
    assert fsdp["gathered"] == 4 * n  # no repeated blocks: the whole model is the one unit, gathered once
    blocks = torch.nn.Sequential(torch.nn.ModuleList([torch.nn.Linear(8, 8) for _ in range(3)])).to("meta")
    acts = {"float": 0, "other": 0}
    gathered = P._memory_terms(blocks, None, Strategy("fsdp", 4), "bf16-mixed", activations=acts, optimizer=(0, ""))
    assert gathered["gathered"] == 2 * 72 * 2  # current + prefetched block, 72 parameters each, in bf16
    assert fsdp["activations"] == ddp["activations"] > 0  # per-device batch: activations are not sharded
    true16 = P.memory_per_device(module, batch, "fsdp", 4, "bf16-true")
    assert true16["weights"] == fsdp["weights"] / 2 and true16["optimizer"] == fsdp["optimizer"] / 2
    mixed = P.memory_per_device(module, batch, "ddp", 4, "bf16-mixed")
    assert mixed["weights"] == ddp["weights"] and mixed["activations"] == ddp["activations"] / 2
    assert mixed["weight copies"] == 2 * n
    assert mixed["total"] == pytest.approx(sum(v for k, v in mixed.items() if k != "total"))
    assert parse_strategy(trainer_cfg) == Strategy("ddp", 4, 1)


def test_parse_strategy_reads_the_overlays():
    fsdp = {"strategy": {"class_path": "lightning.pytorch.strategies.ModelParallelStrategy", "init_args": {}},
            "devices": 8, "num_nodes": 2}
    s = parse_strategy(fsdp)
    assert (s.kind, s.world, s.shards) == ("fsdp", 16, 8)  # HSDP: shards within a node, replicas across nodes
    assert parse_strategy({"strategy": "fsdp", "devices": 8}).kind == "fsdp"
    assert parse_strategy({"strategy": "ddp_find_unused_parameters_true", "devices": 2}).kind == "ddp"
    assert parse_strategy({"strategy": "auto", "devices": 1}).kind == "single"
    assert parse_strategy({"strategy": "auto", "devices": "auto"}).world == 1
    assert parse_strategy({"devices": [0, 1, 2]}) == Strategy("ddp", 3, 1)


def test_a_strategy_given_by_class_path_is_planned_as_that_strategy(tmp_path, toy_config):
    """`strategy: {class_path: ...}` (the FSDP overlay, HEAPr's and NAMEx's paper configs) reaches the plan: the parsed
    config's Namespace listed its keys flattened (`strategy.class_path`), so the plan saw no strategy and assumed DDP."""
    overlay = tmp_path / "fsdp.yaml"
    overlay.write_text("trainer:\n  strategy:\n    class_path: lightning.pytorch.strategies.ModelParallelStrategy\n"
                       "  devices: 4\n  num_nodes: 2\n")
    _, _, trainer_cfg = P.build_on_meta([toy_config, str(overlay)])
    assert trainer_cfg["strategy"]["class_path"] == "lightning.pytorch.strategies.ModelParallelStrategy"
    assert parse_strategy(trainer_cfg) == Strategy("fsdp", 4, 2)
    p = P.plan([toy_config, str(overlay)], "H100")
    assert (p.strategy.kind, p.strategy.world, p.strategy.shards) == ("fsdp", 8, 4)


def test_plan_of_a_config_and_its_schedule(toy_config):
    p = P.plan([toy_config], "H100", mfu=0.5)
    assert p.params["total"] == 321 and p.params_vs_paper == 0
    B, world = 32, 4
    assert p.flops == 2 * B * 3 * 64 * 2 + 2 * B * 64 * 3  # layer 1: fwd + weight grad; layer 2: fwd + both grads
    assert p.steps == 3 * math.ceil(1000 / (B * world)) and "epochs" in p.steps_source
    assert p.hours == pytest.approx(p.steps * p.flops * world / (world * 989e12 * 0.5) / 3600)
    assert p.devices_to_fit == 1
    text = P.format_plan(p)
    assert "321 total" in text and "DDP, 4 devices" in text and "MFU 50%" in text
    rows = P.format_rows([p])
    assert rows.count("\n") == 2 and "| 321 |" in rows


def test_devices_to_fit_grow_with_the_model_under_fsdp(toy_config):
    module, dm, _ = P.build_on_meta([toy_config])
    batch = example_batch(dm, 32)
    hooks = P.method_hooks(module)
    need = P._memory(module, batch, Strategy("fsdp", 1), "32-true", hooks)["total"]
    assert P.devices_to_fit(module, batch, Strategy("fsdp", 1), "32-true", need + 1, hooks) == 1
    per_shard = P._memory(module, batch, Strategy("fsdp", 4), "32-true", hooks)["total"]
    assert P.devices_to_fit(module, batch, Strategy("fsdp", 1), "32-true", per_shard, hooks) == 4
    assert P.devices_to_fit(module, batch, Strategy("ddp", 2), "32-true", need - 1, hooks) is None


def test_cli_plan_prints_the_table(toy_config, capsys):
    from lit_iclr.cli import main

    main(["plan", "--config", toy_config, "--accelerator", "h200", "--mfu", "0.3"])
    out = capsys.readouterr().out
    assert "on H200 (989 TFLOP/s bf16, MFU 30%)" in out and "| parameters | 321 total" in out
    assert "devices to fit 141 GB" in out


def test_cli_plan_errors_are_one_line(toy_config, monkeypatch, capsys):
    from lit_iclr.cli import main

    with pytest.raises(SystemExit):
        main(["plan", "--config", toy_config, "--accelerator", "TPU"])
    assert "unknown accelerator 'TPU'" in capsys.readouterr().err
    monkeypatch.setattr(ToyRegression, "plan_hooks", None)
    with pytest.raises(SystemExit):
        main(["plan", "--config", toy_config])
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "tests/core/plan.py is missing" in err


def test_the_moe_closed_form_is_the_memory_of_a_plan():
    from types import SimpleNamespace

    from lit_iclr.core.moe import memory as M

    cfg = M.PRESETS["qwen1.5-moe-a2.7b"]
    opts = SimpleNamespace(segment=16, mode="namex", beta_abs=0.0, beta_phase=0.3927, chunk=None, chain_state="weights")
    fsdp = M.plan_terms(cfg, Strategy("fsdp", 8), 1, 2048, "bf16-mixed", True, opts)
    direct = M.plan(cfg, 8, 1, 2048, 16, "namex", chain_state="weights")
    assert fsdp == {k: v for k, v in direct.items() if k != "total"}
    ddp = M.plan_terms(cfg, Strategy("ddp", 8), 1, 2048, "bf16-mixed", True, opts)
    n = M.shape_of(cfg).params
    assert ddp["weights"] == 4 * n and ddp["gathered"] == 0 and ddp["ddp buckets"] == ddp["gradients"] == 4 * n
    true16 = M.plan_terms(cfg, Strategy("fsdp", 8), 1, 2048, "bf16-true", True, opts)
    assert true16["optimizer"] == fsdp["optimizer"] / 2
    # a module wrapping an HF MoE: the plan takes its memory from the closed form (merge options, (B, T) of the batch)
    module = torch.nn.Module()
    module.net = SimpleNamespace(config=cfg, modules=lambda: [])
    module.merge = opts
    batch = {"input_ids": torch.zeros(2, 1024, dtype=torch.long, device="meta")}
    hooks = SimpleNamespace(memory=M.memory_hook, step_loss=None)
    terms = P.memory_per_device(module, batch, "fsdp", 8, "bf16-mixed", hooks=hooks)
    expected = M.plan_terms(cfg, Strategy("fsdp", 8), 2, 1024, "bf16-mixed", False, opts)
    assert terms["total"] == pytest.approx(sum(expected.values()))
    assert M.memory_hook(torch.nn.Linear(2, 2), batch, Strategy("ddp", 1), 1, "32-true") is None


def test_a_ddp_config_that_does_not_fit_says_how_many_fsdp_devices_would(toy_config, monkeypatch):
    module, dm, _ = P.build_on_meta([toy_config])
    hooks = P.method_hooks(module)
    batch = example_batch(dm, 32)
    full = P._memory(module, batch, Strategy("fsdp", 1), "32-true", hooks)["total"]
    sharded = P._memory(module, batch, Strategy("fsdp", 2), "32-true", hooks)["total"]
    capacity = (full + sharded) / 2  # between one and two shards
    monkeypatch.setitem(P.ACCELERATORS, "TINY", P.Accelerator("TINY", 1.0, capacity / 1e9))
    p = P.plan([toy_config], "TINY")
    assert p.devices_to_fit is None and p.fsdp_devices_to_fit == 2
    assert p.fit_text == "no (ddp); FSDP: 2" and "no (ddp); FSDP: 2" in P.format_rows([p])

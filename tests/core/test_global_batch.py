"""`core.global_batch` and `core.sync_batchnorm` on 2 real CPU processes (gloo): a rank's share of the step, with
gradients averaged over the ranks as DDP does, equals one process's step on the global batch."""
import os
import socket
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from lit_iclr.core.global_batch import (
    GlobalBatchDropout,
    batch_samples,
    convert_dropout,
    rand_rows,
    randn_rows,
    rank_denominator,
    ranks,
    sum_over_ranks,
)
from lit_iclr.core.sync_batchnorm import SyncBatchNorm, convert_sync_batchnorm

B, C = 6, 3


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _net() -> nn.Module:
    """BatchNorm (a batch statistic) and dropout (a random draw per sample), the dropout drawn for the global batch."""
    torch.manual_seed(0)
    return convert_dropout(nn.Sequential(nn.Conv2d(2, C, 3, padding=1), nn.BatchNorm2d(C), nn.ReLU(),
                                         nn.Dropout(0.3), nn.Conv2d(C, 1, 1)))


def _data():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(B, 2, 5, 5, generator=g) * 3 + 1
    target = torch.randn(B, 1, 5, 5, generator=g)
    weight = (torch.rand(B, 1, 5, 5, generator=g) < 0.3).float()
    return x, target, weight


def _step(net: nn.Module, x, target, weight, sync: bool) -> dict:
    """One step's pieces: a weighted mean over the batch's marked points (a per-batch normaliser), a batch statistic in
    the loss, noise drawn per sample; gradients averaged over the ranks afterwards, as DDP's reducer does."""
    torch.manual_seed(7)
    noise = randn_rows(target)                                      # per sample
    u = rand_rows(torch.empty(x.shape[0] * 4, 2), samples=x.shape[0])  # 4 rows per sample
    out = net(x + noise.mean() * 0) + noise
    err = ((out - target) ** 2 * weight).sum() / rank_denominator(weight.sum(), sync, min_total=1.0)
    stat = sum_over_ranks(out.mean((1, 2, 3)).sum(0, keepdim=True), sync)  # e.g. an MoE importance over the batch
    loss = err + 0.1 * (stat ** 2).sum()
    loss.backward()
    world, _ = ranks()
    for p in net.parameters():
        if world > 1:
            dist.all_reduce(p.grad)
            p.grad /= world
    return {"grads": [p.grad.clone() for p in net.parameters()], "noise": noise, "u": u,
            "running": [net[1].running_mean.clone(), net[1].running_var.clone()], "next": torch.rand(3)}


def _rank(rank: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        x, target, weight = _data()
        share = slice(rank, None, 2)  # the training sampler deals row i to rank i % 2
        res = {sync: _step(convert_sync_batchnorm(_net()) if sync else _net(), x[share], target[share], weight[share],
                           sync) for sync in (True, False)}
        torch.save(res, Path(out) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def _two_ranks(tmp_path: Path) -> list[dict]:
    mp.start_processes(_rank, args=(_free_port(), str(tmp_path)), nprocs=2, start_method="spawn", join=True)
    return [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in (0, 1)]


@pytest.mark.skipif(sys.platform != "linux", reason="gloo over loopback")
def test_two_ranks_step_as_one_process_on_the_global_batch(tmp_path):
    x, target, weight = _data()
    one = _step(_net(), x, target, weight, sync=False)
    both = _two_ranks(tmp_path)
    for sync in (True, False):
        # noise: rank r holds the global draw's rows r::2, and the RNG moved on as one process's did
        for r, res in enumerate(both):
            res = res[sync]
            torch.testing.assert_close(res["noise"], one["noise"][r::2], rtol=0, atol=0)
            torch.testing.assert_close(res["u"], one["u"].view(B, 4, 2)[r::2].reshape(-1, 2), rtol=0, atol=0)
            torch.testing.assert_close(res["next"], one["next"], rtol=0, atol=0)
        worst = max((a - b).abs().max().item() for a, b in zip(both[0][sync]["grads"], one["grads"], strict=True))
        if sync:  # global statistics, global normaliser, global batch statistic: one process's gradients
            assert worst < 1e-5, worst
            for a, b in zip(both[0][sync]["running"], one["running"], strict=True):
                torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
        else:  # per-rank BatchNorm, per-rank normaliser and statistic: the comparison sees it
            assert worst > 1e-3, worst


def test_one_process_is_plain_batchnorm_and_conversion_keeps_the_tensors():
    net = _net()
    bn = net[1]
    conv = convert_sync_batchnorm(net)
    assert conv is net and isinstance(net[1], SyncBatchNorm)
    assert net[1].weight is bn.weight and net[1].running_mean is bn.running_mean
    assert list(net.state_dict()) == list(_net().state_dict())
    assert isinstance(net[3], GlobalBatchDropout) and net[3].p == 0.3
    x = _data()[0]
    torch.testing.assert_close(net.eval()(x), _net().eval()(x), rtol=0, atol=0)
    with pytest.raises(ValueError, match="expects \\(N, C, ...\\) input"):
        net[1](torch.ones(3))
    with pytest.raises(ValueError, match="not whole runs of 4 samples"):
        randn_rows(torch.empty(6, 2), samples=4)


def test_step_rng_draws_by_step_and_leaves_the_outer_stream():
    from lit_iclr.core.global_batch import step_rng

    torch.manual_seed(123)
    outer = torch.rand(3)
    torch.manual_seed(123)
    with step_rng(5):
        a = torch.randn(4)
    torch.manual_seed(999)  # another process state: the step's draws do not depend on it
    with step_rng(5):
        b = torch.randn(4)
    with step_rng(6):
        c = torch.randn(4)
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert not torch.equal(a, c)
    torch.manual_seed(123)
    with step_rng(5):
        torch.randn(100)
    torch.testing.assert_close(torch.rand(3), outer, rtol=0, atol=0)  # the outer stream is where it was


@pytest.mark.parametrize("samples", [None, 3])
def test_dropout_gives_a_rank_its_samples_masks_of_the_global_batch(monkeypatch, samples):
    """Rank r of 2 drops its samples (rows r::2 of the global batch; with `batch_samples`, runs of rows per sample) as
    one process drops them on the global batch; torch's own dropout draws for the rank's rows and does not."""
    import lit_iclr.core.global_batch as gb

    rows = 2 if samples else 1  # rows per sample: 3 samples of 2 rows each per rank, or one row each
    drop = GlobalBatchDropout(0.5)
    x = torch.ones(6 * rows if samples is None else 6, 4)  # the global batch: 6 samples
    torch.manual_seed(3)
    with batch_samples(6) if samples else torch.no_grad():
        one = drop(x)
    assert set(one.unique().tolist()) == {0.0, 2.0}  # keep with 1 - p, scaled by 1 / (1 - p)
    glob = one.view(6, -1, 4)
    for r in (0, 1):
        monkeypatch.setattr(gb, "ranks", lambda r=r: (2, r))
        torch.manual_seed(3)
        with batch_samples(3) if samples else torch.no_grad():
            mine = drop(x.view(6, -1, 4)[r::2].reshape(-1, 4))
        torch.testing.assert_close(mine.view(3, -1, 4), glob[r::2], rtol=0, atol=0)
        torch.manual_seed(3)
        plain = nn.Dropout(0.5)(x.view(6, -1, 4)[r::2].reshape(-1, 4))
        assert not torch.equal(plain.view(3, -1, 4), glob[r::2])
    assert torch.equal(drop.eval()(x), x)

"""`core.moe.balance_loss`: Hugging Face's Switch load-balancing loss, and under DDP the global batch's."""
import os
import socket
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from lit_iclr.core.moe.balance_loss import load_balancing_loss


def _tiny(arch: str):
    from transformers import MixtralConfig, MixtralForCausalLM, Qwen2MoeConfig, Qwen2MoeForCausalLM

    torch.manual_seed(0)
    common = dict(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                  num_experts_per_tok=2, output_router_logits=True)
    if arch == "mixtral":
        return MixtralForCausalLM(MixtralConfig(**common, intermediate_size=16, num_local_experts=4))
    return Qwen2MoeForCausalLM(Qwen2MoeConfig(**common, moe_intermediate_size=8, shared_expert_intermediate_size=8,
                                              intermediate_size=16, num_experts=4))


@pytest.mark.parametrize("arch", ["mixtral", "qwen2_moe"])
@pytest.mark.parametrize("masked", [False, True])
def test_one_process_value_is_hugging_faces(arch, masked):
    model = _tiny(arch).eval()
    ids = torch.randint(0, 50, (3, 7), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    if masked:
        mask[0, 5:] = 0
        mask[2, 3:] = 0
    out = model(input_ids=ids, attention_mask=mask if masked else None, output_router_logits=True)
    ours = load_balancing_loss(out.router_logits, model.num_experts, model.num_experts_per_tok,
                               mask if masked else None, sync=False)
    torch.testing.assert_close(ours, out.aux_loss, rtol=1e-6, atol=1e-7)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _grad(rows: slice, mask: torch.Tensor, sync: bool) -> torch.Tensor:
    """The router weight's gradient of the loss over 2 layers of router logits for the batch's rows `rows`."""
    torch.manual_seed(0)
    router = torch.randn(4, 6, requires_grad=True)
    hidden = torch.randn(2, 4, 5, 6, generator=torch.Generator().manual_seed(2))  # layers, batch, tokens, width
    logits = tuple(h[rows].reshape(-1, 6) @ router.T for h in hidden)
    load_balancing_loss(logits, 4, 2, mask[rows], sync).backward()
    grad = router.grad
    if dist.is_initialized():  # DDP's average over the ranks
        dist.all_reduce(grad)
        grad /= dist.get_world_size()
    return grad


def _mask() -> torch.Tensor:
    mask = torch.ones(4, 5)
    mask[1, 2:] = 0  # rank 1 holds rows 1 and 3: fewer tokens than rank 0
    return mask


def _rank(rank: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        rows = slice(rank, None, 2)  # the training sampler deals row i to rank i % 2
        torch.save({sync: _grad(rows, _mask(), sync) for sync in (True, False)}, Path(out) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.slow  # 2 spawned processes
@pytest.mark.skipif(sys.platform != "linux", reason="gloo over loopback")
def test_two_ranks_have_the_global_batchs_gradient(tmp_path):
    one = _grad(slice(None), _mask(), sync=False)
    mp.start_processes(_rank, args=(_free_port(), str(tmp_path)), nprocs=2, start_method="spawn", join=True)
    both = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in (0, 1)]
    torch.testing.assert_close(both[0][True], one, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(both[1][True], one, rtol=1e-5, atol=1e-7)
    assert (both[0][False] - one).abs().max() > 1e-4  # each rank's own f and P: the gradient is not the global one

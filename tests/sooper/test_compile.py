"""The compiled learning cycle (`compile_update`: each update one graph of loss, gradient, Adam and Polyak, each
imagined step one graph) equals the eager one: every network's weights, the Adam moments and the imagined buffer
(with terminations) after three cycles, on the same replay."""
from __future__ import annotations

import pytest
import torch

from tests.sooper.test_learn import small_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


def cycles(compiled: bool, backend: str = "inductor", n: int = 3) -> tuple[object, list[dict]]:
    m = small_model()
    m.hparams.budget = 1.0  # the filter intervenes in some imagined steps: terminations, the prior's value
    m.hparams.compile_update = compiled
    m.hparams.compile_options = {"backend": backend, "fullgraph": True}  # fullgraph: no graph breaks in an update
    opts = m.configure_optimizers()
    torch.manual_seed(5)  # the policy's Gaussian draws
    logs = [m.learn(opts) for _ in range(n)]
    return m, opts, logs


def assert_cycles_equal(backend: str) -> None:
    (eager, eager_opts, eager_logs), (comp, comp_opts, comp_logs) = cycles(False), cycles(True, backend)
    assert set(comp._compiled) == {"model", "prior_cost", "critic", "actor", "imagine"}  # every update compiled
    assert 0 < eager.imagined["done"].mean() < 0.5
    for (name, a), b in zip(eager.state_dict().items(), comp.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5, msg=name)
    for oa, ob in zip(eager_opts, comp_opts, strict=True):  # the optimizers' own state moved in place
        for pa, pb in zip(oa.state.values(), ob.state.values(), strict=True):
            for k in pa:
                torch.testing.assert_close(pa[k], pb[k], rtol=1e-5, atol=1e-6, msg=k)
    for k in ("obs", "action", "reward", "done"):
        torch.testing.assert_close(eager.imagined[k], comp.imagined[k], rtol=1e-5, atol=1e-5, msg=k)
    for a, b in zip(eager_logs, comp_logs, strict=True):
        for k in ("train/model_loss", "train/critic_loss", "train/actor_loss", "train/alpha"):
            assert a[k] == pytest.approx(b[k], rel=1e-4, abs=1e-6), k
    moved = (eager.critic.net.out.weight - small_model().critic.net.out.weight).abs().max()
    assert moved > 1e-4  # the cycles changed the weights, so the comparison can fail


def test_traced_cycle_equals_eager():
    """Traced by dynamo and AOTAutograd (no C++ build, so the test stays fast)."""
    assert_cycles_equal("aot_eager")


@pytest.mark.slow
def test_inductor_cycle_equals_eager():
    """The real C++ build (a minute or more on a shared CPU)."""
    assert_cycles_equal("inductor")


def test_twin_fit_compiled_counts_the_eager_steps(tmp_path):
    """Through the CLI and Lightning's optimizer wrappers (the compiled update steps the raw optimizers): the compiled
    fit counts its optimizer steps as the eager one does (`global_step`, which also seeds each real episode), compiles
    every update, and ends at the eager fit's weights."""
    from tests.twin import fit_twin

    eager = fit_twin("sooper", tmp_path / "eager").trainer
    comp = fit_twin("sooper", tmp_path / "compiled", "--model.init_args.compile_update", "true",
                    "--model.init_args.compile_options", '{"backend": "aot_eager"}').trainer
    assert comp.global_step == eager.global_step > 0
    assert set(comp.lightning_module._compiled) == {"model", "prior_cost", "critic", "actor", "imagine"}
    a, b = eager.lightning_module, comp.lightning_module
    torch.testing.assert_close(a.replay["observations"], b.replay["observations"], rtol=1e-4, atol=1e-4)
    for (name, x), y in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
        torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-4, msg=name)

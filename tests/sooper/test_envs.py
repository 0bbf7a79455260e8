"""The constrained MuJoCo tasks: costs and rewards against their definitions, dynamics against closed form."""
from __future__ import annotations

import numpy as np
import pytest

from lit_iclr.core.errors import ConfigError
from lit_iclr.sooper.envs import PRIOR_CONTROLLERS, make_task, tolerance_gaussian, tolerance_quadratic


def test_point_goal_cost_is_one_exactly_inside_the_hazard():
    env = make_task("point_goal", hazard_radius=0.4)
    env.reset(seed=0)
    for p, inside in [((0.0, 0.39), 1.0), ((0.0, 0.41), 0.0), ((-0.3, -0.25), 1.0), ((1.0, 0.0), 0.0)]:
        env._reset_state(np.array(p), np.zeros(2))
        obs, r, term, trunc, info = env.step(np.zeros(2))
        assert info["cost"] == inside
        assert r == pytest.approx(-np.linalg.norm(obs[:2] - np.array([1.0, 0.0])), abs=1e-6)
        assert not term


def test_point_mass_follows_the_damped_closed_form():
    """m dv/dt = F - b v from rest: v(t) = F/b (1 - exp(-b t / m)) (mass 1, damping 1, gear 1, force 1)."""
    env = make_task("point_goal", start_noise=0.0)
    env.reset(seed=0)
    for _ in range(20):  # 20 steps of 0.05 s
        obs, *_ = env.step(np.array([1.0, 0.0]))
    assert obs[2] == pytest.approx(1 - np.exp(-1.0), abs=5e-3)
    assert obs[0] == pytest.approx(-1.0 + 1.0 - (1 - np.exp(-1.0)), abs=5e-3)  # x(t) = x0 + t - (1 - e^-t)
    assert obs[3] == pytest.approx(0.0, abs=1e-9)


def test_dm_control_tolerances_and_cartpole_cost():
    assert tolerance_gaussian(2.0, margin=2.0) == pytest.approx(0.1)
    assert tolerance_gaussian(0.0, margin=2.0) == pytest.approx(1.0)
    assert tolerance_quadratic(0.5, margin=1.0) == pytest.approx(0.75)
    assert tolerance_quadratic(1.5, margin=1.0) == 0.0
    env = make_task("cartpole_swingup", slider_limit=0.5)
    obs, _ = env.reset(seed=0)
    assert obs[1] == pytest.approx(-1.0, abs=0.01)  # hanging down
    env._reset_state(np.array([0.7, 0.0]), np.zeros(2))  # beyond the slider limit, pole upright
    obs, r, _, _, info = env.step(np.zeros(1))
    assert info["cost"] == 1.0
    # upright ~1, centered (1 + tol(0.7, 2)) / 2, no control -> small_control 1, still pole -> small_velocity ~1
    assert r == pytest.approx((1 + tolerance_gaussian(obs[0], 2.0)) / 2, abs=0.01)


def test_time_limit_and_unknown_task():
    env = make_task("point_goal", max_steps=3)
    env.reset(seed=1)
    flags = [env.step(np.zeros(2))[3] for _ in range(3)]
    assert flags == [False, False, True]
    with pytest.raises(ConfigError, match="unknown task"):
        make_task("humanoid")


@pytest.mark.parametrize("task", ["point_goal", "cartpole_swingup"])
def test_cautious_controllers_are_safe(task):
    env = make_task(task)
    obs, _ = env.reset(seed=3)
    cost, done = 0.0, False
    while not done:
        obs, _, term, trunc, info = env.step(PRIOR_CONTROLLERS[task](obs, env))
        cost, done = cost + info["cost"], term or trunc
    assert cost == 0.0


def test_cautious_point_controller_is_continuous_across_its_escape_zone():
    """The escape blends in linearly, so the action has no jump at the clearance radius (a cloneable policy)."""
    env = make_task("point_goal")
    r = env.hazard_radius + 0.25  # the default clearance
    for ang in np.linspace(0.2, 2 * np.pi, 7):
        u = np.array([np.cos(ang), np.sin(ang)])
        inner, outer = np.r_[(r - 1e-4) * u, 0.3, 0.0], np.r_[(r + 1e-4) * u, 0.3, 0.0]
        gap = np.abs(PRIOR_CONTROLLERS["point_goal"](inner, env) - PRIOR_CONTROLLERS["point_goal"](outer, env)).max()
        assert gap < 1e-2
    at_edge = np.r_[env.hazard_radius * np.array([0.0, 1.0]), 0.0, 0.0]  # at the edge: pure escape, straight out
    np.testing.assert_allclose(PRIOR_CONTROLLERS["point_goal"](at_edge, env), [0.0, 1.0], atol=1e-6)

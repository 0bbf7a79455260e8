"""Constrained MuJoCo tasks for SOOPER: each step returns a reward and a per-step cost `info["cost"]`.

Both tasks are gymnasium environments simulated by MuJoCo from a small MJCF model held in this file (no asset files):

- `PointGoal`: a Safety-Gym-style point robot (planar point mass, two force actuators) that must reach a goal behind a
  circular hazard; cost 1 per step spent inside the hazard (Safety-Gym's hazard cost), reward = -distance to the goal.
- `CartpoleSwingup`: dm_control's cartpole (same masses, gear, timestep) swung up from hanging down, with dm_control's
  smooth swing-up reward and the Real-World-RL suite's slider-position constraint: cost 1 when |cart position| exceeds
  `slider_limit`.

Observations are float32 vectors, actions lie in [-1, 1]. Episodes end only by the time limit `max_steps`.
"""
from __future__ import annotations

import os

import gymnasium
import numpy as np
from gymnasium import spaces

from lit_iclr.core.errors import ConfigError

POINT_XML = """
<mujoco model="point_goal">
  <option timestep="0.01" gravity="0 0 0"/>
  <worldbody>
    <geom name="floor" type="plane" size="3 3 0.1"/>
    <geom name="hazard" type="cylinder" pos="{hx} {hy} 0" size="{hr} 0.01" contype="0" conaffinity="0" rgba="0 0 1 .3"/>
    <geom name="goal" type="cylinder" pos="{gx} {gy} 0" size="0.1 0.01" contype="0" conaffinity="0" rgba="0 1 0 .3"/>
    <body name="agent" pos="0 0 0.05">
      <joint name="x" type="slide" axis="1 0 0" damping="{damping}"/>
      <joint name="y" type="slide" axis="0 1 0" damping="{damping}"/>
      <geom type="sphere" size="0.05" mass="1" contype="0" conaffinity="0"/>
    </body>
  </worldbody>
  <actuator>
    <motor joint="x" gear="{gear}" ctrlrange="-1 1" ctrllimited="true"/>
    <motor joint="y" gear="{gear}" ctrlrange="-1 1" ctrllimited="true"/>
  </actuator>
</mujoco>
"""

# dm_control's cartpole.xml: cart 1 kg on a slider, 1 m pole of 0.1 kg, motor gear 10, timestep 0.01.
CARTPOLE_XML = """
<mujoco model="cartpole">
  <option timestep="0.01" integrator="RK4"/>
  <default><joint solreflimit=".08 1" damping="5e-4"/></default>
  <worldbody>
    <geom name="floor" type="plane" pos="0 0 -.05" size="4 4 .2"/>
    <body name="cart" pos="0 0 1">
      <joint name="slider" type="slide" axis="1 0 0" limited="true" range="-1.8 1.8"/>
      <geom name="cart" type="box" size="0.2 0.15 0.1" mass="1" contype="0" conaffinity="0"/>
      <body name="pole_1">
        <joint name="hinge_1" type="hinge" axis="0 1 0" damping="2e-6"/>
        <geom name="pole_1" type="capsule" fromto="0 0 0 0 0 1" size="0.045" mass="0.1" contype="0" conaffinity="0"/>
      </body>
    </body>
  </worldbody>
  <actuator><motor name="slide" joint="slider" gear="10" ctrlrange="-1 1" ctrllimited="true"/></actuator>
</mujoco>
"""


def tolerance_gaussian(x: np.ndarray | float, margin: float, value_at_margin: float = 0.1) -> np.ndarray:
    """dm_control `rewards.tolerance(x, bounds=(0, 0), margin, sigmoid='gaussian')`: 1 at 0, `value_at_margin` at margin."""
    scale = np.sqrt(-2 * np.log(value_at_margin))
    return np.exp(-0.5 * (np.asarray(x) / margin * scale) ** 2)


def tolerance_quadratic(x: np.ndarray | float, margin: float) -> np.ndarray:
    """dm_control `rewards.tolerance(x, bounds=(0, 0), margin, value_at_margin=0, sigmoid='quadratic')`."""
    s = np.asarray(x) / margin
    return np.where(np.abs(s) < 1, 1 - s**2, 0.0)


class _MujocoTask(gymnasium.Env):
    """A gymnasium environment stepping a MuJoCo model `frame_skip` times per action, with a per-step cost."""

    metadata = {"render_modes": []}

    def __init__(self, xml: str, frame_skip: int, max_steps: int, obs_dim: int):
        os.environ.setdefault("MUJOCO_GL", "egl")
        import mujoco

        self._mj = mujoco
        self.model = mujoco.MjModel.from_xml_string(xml)
        self.data = mujoco.MjData(self.model)
        self.frame_skip, self.max_steps = frame_skip, max_steps
        self.dt = self.model.opt.timestep * frame_skip
        nu = self.model.nu
        self.action_space = spaces.Box(-1.0, 1.0, (nu,), np.float32)
        self.observation_space = spaces.Box(-np.inf, np.inf, (obs_dim,), np.float32)
        self.t = 0

    def _simulate(self, action: np.ndarray) -> None:
        self.data.ctrl[:] = np.clip(action, -1.0, 1.0)
        self._mj.mj_step(self.model, self.data, nstep=self.frame_skip)

    def _reset_state(self, qpos: np.ndarray, qvel: np.ndarray) -> None:
        self._mj.mj_resetData(self.model, self.data)
        self.data.qpos[:], self.data.qvel[:] = qpos, qvel
        self._mj.mj_forward(self.model, self.data)

    def observe(self) -> np.ndarray:
        raise NotImplementedError

    def spread_state(self, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """A state drawn broadly over the task's workspace (the dataset generator starts some episodes there)."""
        raise NotImplementedError

    def reset_to(self, qpos: np.ndarray, qvel: np.ndarray) -> np.ndarray:
        self._reset_state(qpos, qvel)
        return self.observe()

    def reward_cost(self, action: np.ndarray) -> tuple[float, float]:
        raise NotImplementedError

    def step(self, action):
        action = np.asarray(action, dtype=np.float64).reshape(self.action_space.shape)
        self._simulate(action)
        self.t += 1
        reward, cost = self.reward_cost(action)
        truncated = self.t >= self.max_steps
        return self.observe(), float(reward), False, truncated, {"cost": float(cost)}


class PointGoal(_MujocoTask):
    """Point robot to a goal past a circular hazard (Safety-Gym Goal with one hazard, fixed layout).

    Observation [x, y, vx, vy]; reward -|p - goal|; cost 1[|p - hazard| < hazard_radius].
    """

    def __init__(self, goal: tuple[float, float] = (1.0, 0.0), start: tuple[float, float] = (-1.0, 0.0),
                 hazard: tuple[float, float] = (0.0, 0.0), hazard_radius: float = 0.4, start_noise: float = 0.05,
                 gear: float = 1.0, damping: float = 1.0, frame_skip: int = 5, max_steps: int = 100):
        xml = POINT_XML.format(hx=hazard[0], hy=hazard[1], hr=hazard_radius, gx=goal[0], gy=goal[1], gear=gear,
                               damping=damping)
        super().__init__(xml, frame_skip, max_steps, obs_dim=4)
        self.goal, self.start, self.hazard = np.array(goal), np.array(start), np.array(hazard)
        self.hazard_radius, self.start_noise = hazard_radius, start_noise

    def reset(self, *, seed: int | None = None, options=None):
        super().reset(seed=seed)
        self.t = 0
        self._reset_state(self.start + self.np_random.uniform(-self.start_noise, self.start_noise, 2), np.zeros(2))
        return self.observe(), {"cost": 0.0}

    def observe(self) -> np.ndarray:
        return np.concatenate([self.data.qpos, self.data.qvel]).astype(np.float32)

    def spread_state(self, rng):
        return rng.uniform([-1.2, -1.0], [1.2, 1.0]), rng.uniform(-0.5, 0.5, 2)

    def reward_cost(self, action):
        p = self.data.qpos[:2]
        return -float(np.linalg.norm(p - self.goal)), float(np.linalg.norm(p - self.hazard) < self.hazard_radius)


class CartpoleSwingup(_MujocoTask):
    """dm_control cartpole swing-up with the RWRL slider-position constraint.

    Observation [x, cos(theta), sin(theta), x_dot, theta_dot] (dm_control's layout); reward as dm_control's smooth
    swing-up: upright * centered * small_control * small_velocity; cost 1[|x| > slider_limit].
    """

    def __init__(self, slider_limit: float = 1.0, frame_skip: int = 2, max_steps: int = 250, init_noise: float = 0.01):
        super().__init__(CARTPOLE_XML, frame_skip, max_steps, obs_dim=5)
        self.slider_limit, self.init_noise = slider_limit, init_noise

    def reset(self, *, seed: int | None = None, options=None):
        super().reset(seed=seed)
        self.t = 0
        qpos = np.array([0.0, np.pi]) + self.np_random.normal(0, self.init_noise, 2)  # hanging down
        self._reset_state(qpos, self.np_random.normal(0, self.init_noise, 2))
        return self.observe(), {"cost": 0.0}

    def observe(self) -> np.ndarray:
        x, th = self.data.qpos
        return np.array([x, np.cos(th), np.sin(th), *self.data.qvel], dtype=np.float32)

    def spread_state(self, rng):
        return rng.uniform([-1.2 * self.slider_limit, -np.pi], [1.2 * self.slider_limit, np.pi]), rng.normal(0, 0.5, 2)

    def reward_cost(self, action):
        x, th = self.data.qpos
        upright = (np.cos(th) + 1) / 2
        centered = (1 + tolerance_gaussian(x, margin=2)) / 2
        small_control = (4 + tolerance_quadratic(action[0], margin=1)) / 5
        small_velocity = (1 + tolerance_gaussian(self.data.qvel[1], margin=5)) / 2
        return float(upright * centered * small_control * small_velocity), float(abs(x) > self.slider_limit)


TASKS = {"point_goal": PointGoal, "cartpole_swingup": CartpoleSwingup}


def make_task(task: str, **kwargs) -> _MujocoTask:
    if task not in TASKS:
        raise ConfigError(f"unknown task {task!r}; choose one of {sorted(TASKS)}")
    return TASKS[task](**kwargs)


# ----------------------------------------------------------------------------------- conservative behaviour policies
def point_goal_prior(obs: np.ndarray, env: PointGoal, reckless: bool = False, detour: float = 0.9, switch: float = 0.3,
                     gain: float = 3.0, damp: float = 1.0, clearance: float = 0.25) -> np.ndarray:
    """A cautious waypoint controller, safe from any state: it heads for a point `detour` beside the hazard (on the +y
    side unless clearly below it) until `switch` before it, then for the goal (PD, clipped), and within `clearance` of
    the hazard's edge it blends into a push straight away from the hazard, with weight rising linearly from 0 at the
    clearance to 1 at the edge. The blend keeps the action continuous in the position, so behaviour cloning can
    reproduce the escape (a hard switch at the clearance is blurred by a cloned network into a policy that drifts into
    the hazard). `reckless` heads straight for the goal."""
    p, v = obs[..., :2], obs[..., 2:4]
    if reckless:
        return np.clip(gain * (env.goal - p) - damp * v, -1.0, 1.0)
    side = np.where(p[..., 1:2] >= env.hazard[1] - 0.3, 1.0, -1.0)
    waypoint = np.concatenate([np.full_like(side, env.hazard[0]), env.hazard[1] + side * detour], -1)
    target = np.where(p[..., :1] < env.hazard[0] - switch, waypoint, env.goal)
    act = gain * (target - p) - damp * v
    away = p - env.hazard
    dist = np.linalg.norm(away, axis=-1, keepdims=True)
    escape = away / np.maximum(dist, 1e-6) * 2.0 - damp * v
    w = np.clip((env.hazard_radius + clearance - dist) / clearance, 0.0, 1.0)  # 0 at the clearance, 1 at the edge
    return np.clip((1 - w) * act + w * escape, -1.0, 1.0)


def cartpole_prior(obs: np.ndarray, env: CartpoleSwingup, reckless: bool = False, energy_gain: float = 1.0,
                   center_gain: float = 0.8, center_damp: float = 0.8) -> np.ndarray:
    """A timid swing-up: energy pumping E = theta_dot^2 / (3 g) + cos(theta) - 1 (uniform pole, per m g l/2), with
    a slider-centering term, then a PD balance near upright. Its weak pumping keeps the cart near the centre (safe)
    but rarely gets the pole up: a safe, low-return prior. `reckless` pumps hard without centering (leaves the slider
    range)."""
    if reckless:
        energy_gain, center_gain, center_damp = 3.0, 0.3, 0.3
    x, c, s, xd, thd = (obs[..., i] for i in range(5))
    energy = thd**2 / (3 * 9.81) + (c - 1)
    swing = energy_gain * np.sign(thd * c + 1e-6) * energy - center_gain * x - center_damp * xd
    balance = 10.0 * (np.arctan2(s, c) + 0.15 * thd) + 1.0 * x + 1.5 * xd
    return np.clip(np.where(c > 0.8, balance, swing), -1.0, 1.0)[..., None]


PRIOR_CONTROLLERS = {"point_goal": point_goal_prior, "cartpole_swingup": cartpole_prior}

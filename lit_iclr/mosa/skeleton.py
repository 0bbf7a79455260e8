"""The 22-joint SMPL skeleton of HumanML3D (`new_joints`, Y up, metres) and procedural text-described motions on it.

A motion is a joint-angle curve per action (walk, run, jump, wave, squat, kick, turn) with a random style (speed, direction,
side, amplitude, phase), posed by forward kinematics. Locomotion is foot-locked: the root moves by minus the horizontal
displacement of the stance foot, so the generated ground truth has no foot skating and no ground penetration: the very
contact constraint MoSA's structure stage is asked to respect.
"""
from __future__ import annotations

import numpy as np

JOINTS = ("pelvis", "left_hip", "right_hip", "spine1", "left_knee", "right_knee", "spine2", "left_ankle", "right_ankle",
          "spine3", "left_foot", "right_foot", "neck", "left_collar", "right_collar", "head", "left_shoulder",
          "right_shoulder", "left_elbow", "right_elbow", "left_wrist", "right_wrist")
PARENTS = (-1, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 9, 9, 12, 13, 14, 16, 17, 18, 19)
NUM_JOINTS = 22
FOOT_JOINTS = (7, 10, 8, 11)  # left ankle, left foot, right ankle, right foot (HumanML3D's foot-contact joints)
BONES = tuple((PARENTS[j], j) for j in range(1, NUM_JOINTS))  # 21 (parent, child) pairs
# rest offsets from the parent (metres), arms hanging down
OFFSETS = np.array([
    [0, 0, 0], [0.09, -0.08, 0], [-0.09, -0.08, 0], [0, 0.11, 0], [0, -0.40, 0], [0, -0.40, 0], [0, 0.13, 0],
    [0, -0.40, 0], [0, -0.40, 0], [0, 0.06, 0], [0, -0.05, 0.12], [0, -0.05, 0.12], [0, 0.21, 0], [0.07, 0.12, 0],
    [-0.07, 0.12, 0], [0, 0.10, 0.03], [0.11, 0.02, 0], [-0.11, 0.02, 0], [0, -0.27, 0], [0, -0.27, 0],
    [0, -0.25, 0], [0, -0.25, 0]], dtype=np.float64)
BONE_LENGTHS = np.linalg.norm(OFFSETS[[c for _, c in BONES]], axis=-1)

ACTIONS = ("walk", "run", "jump", "wave", "squat", "kick", "turn")
SPEEDS = {"slowly": 0.7, "": 1.0, "quickly": 1.4}
DIRECTIONS = {"to the right": np.pi / 2, "to the left": -np.pi / 2, "toward the camera": 0.0, "away from the camera": np.pi}
VERB = {"walk": ["walks", "is walking", "strolls"], "run": ["runs", "is running", "jogs"], "jump": ["jumps", "hops up"],
        "wave": ["waves", "is waving"], "squat": ["squats", "does a squat"], "kick": ["kicks", "does a kick"],
        "turn": ["turns around", "spins"]}
SUBJECTS = ["a person", "someone", "a man", "a woman", "the person"]


def rot(axis: str, a: np.ndarray) -> np.ndarray:
    """Rotation matrices (..., 3, 3) about a coordinate axis by angles `a`."""
    c, s, o, z = np.cos(a), np.sin(a), np.ones_like(a), np.zeros_like(a)
    rows = {"x": [[o, z, z], [z, c, -s], [z, s, c]], "y": [[c, z, s], [z, o, z], [-s, z, c]],
            "z": [[c, -s, z], [s, c, z], [z, z, o]]}[axis]
    return np.stack([np.stack(r, -1) for r in rows], -2)


def forward_kinematics(local: np.ndarray, root_rot: np.ndarray) -> np.ndarray:
    """Joint positions (T, 22, 3) relative to the pelvis from local rotations (T, 22, 3, 3) and root rotation (T, 3, 3).

    G_j = G_parent(j) L_j and p_j = p_parent(j) + G_parent(j) o_j (o: rest offsets); the 22-joint loop is over the tree,
    every frame at once.
    """
    T = local.shape[0]
    glob = np.zeros((T, NUM_JOINTS, 3, 3))
    pos = np.zeros((T, NUM_JOINTS, 3))
    glob[:, 0] = root_rot @ local[:, 0]
    for j in range(1, NUM_JOINTS):
        p = PARENTS[j]
        pos[:, j] = pos[:, p] + glob[:, p] @ OFFSETS[j]
        glob[:, j] = glob[:, p] @ local[:, j]
    return pos


def _bump(t: np.ndarray, center: float, width: float) -> np.ndarray:
    return np.clip(np.cos(np.clip((t - center) / width, -1, 1) * np.pi / 2), 0, None) ** 2


def action_angles(action: str, t: np.ndarray, rng: np.random.Generator, style: dict) -> tuple[dict, np.ndarray, np.ndarray]:
    """Joint angles {joint: (flex, abduct)} per frame, yaw (T,) and extra root height (T,) of one action."""
    spd, amp, ph = style["speed"], style["amp"], style["phase"]
    z = np.zeros_like(t)
    ang: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    yaw = np.full_like(t, style["yaw"])
    lift = z.copy()
    side = 1 if style["side"] == "left" else -1  # +1: left limb acts
    if action in ("walk", "run", "turn"):
        f, hip, knee, arm, elbow = {"walk": (0.9, 0.45, 0.55, 0.35, 0.25), "run": (1.5, 0.75, 1.1, 0.6, 1.3),
                                    "turn": (1.2, 0.25, 0.4, 0.1, 0.2)}[action]
        phi = 2 * np.pi * f * spd * t + ph
        ang[1] = (amp * hip * np.sin(phi), z)
        ang[2] = (-amp * hip * np.sin(phi), z)
        # a knee bends while its leg swings forward (hip angle rising), lifting that foot: the other one is the stance foot
        ang[4] = (amp * knee * np.clip(np.cos(phi), 0, None), z)
        ang[5] = (amp * knee * np.clip(-np.cos(phi), 0, None), z)
        ang[16] = (-amp * arm * np.sin(phi), z + 0.1)
        ang[17] = (amp * arm * np.sin(phi), z + 0.1)
        ang[18] = ang[19] = (z + elbow, z)
        style["stance"] = np.where(np.cos(phi) >= 0, 2, 0)  # index into FOOT_JOINTS: right ankle while the left swings
        if action == "run":
            ang[3] = (z + 0.2, z)  # lean forward
        if action == "turn":
            yaw = style["yaw"] + style["turn"] * 2.6 * spd * t
    elif action == "jump":
        dur = 0.45 / spd ** 0.5
        t0 = style["t0"]
        crouch = _bump(t, t0 - 0.1, 0.2) + _bump(t, t0 + dur + 0.1, 0.2)
        air = np.clip((t - t0) / dur, 0, 1)
        lift = amp * 0.35 * 4 * air * (1 - air)  # parabolic flight, h = 4 H s (1 - s)
        for h, k in ((1, 4), (2, 5)):
            ang[h] = (0.9 * crouch, z)
            ang[k] = (1.6 * crouch, z)
        ang[0] = (z, z)
        ang[16] = (2.5 * (air > 0) * (air < 1), z + 0.2)
        ang[17] = ang[16]
    elif action == "wave":
        sh = 16 if side == 1 else 17
        el = sh + 2
        ang[sh] = (z + 0.2, z + 2.5 * amp ** 0.3)
        ang[el] = (0.8 + 0.55 * np.sin(2 * np.pi * 1.8 * spd * t + ph), z)
        if style["both"]:
            ang[33 - sh] = ang[sh]
            ang[37 - el] = ang[el]
    elif action == "squat":
        depth = amp * 1.0 * (0.5 - 0.5 * np.cos(2 * np.pi * 0.9 * spd * t + ph))
        ang[1] = ang[2] = (depth, z)
        ang[4] = ang[5] = (1.7 * depth, z)
        ang[7] = ang[8] = (-0.8 * depth, z)
        ang[3] = (0.5 * depth, z)
        ang[16] = ang[17] = (1.4 * depth, z)
    elif action == "kick":
        k = _bump(t, style["t0"] + 0.15, 0.3 / spd)
        hip, knee = (1, 4) if side == 1 else (2, 5)
        ang[hip] = (amp * 1.5 * k, z)
        ang[knee] = (0.9 * np.clip(np.sin(np.pi * k), 0, None), z)
        ang[16] = ang[17] = (z, z + 0.5)
    return ang, yaw, lift


def local_rotations(ang: dict[int, tuple[np.ndarray, np.ndarray]], T: int) -> np.ndarray:
    """(T, 22, 3, 3) local rotations: flexion about x (sign per limb so positive bends the natural way), abduction about z."""
    local = np.broadcast_to(np.eye(3), (T, NUM_JOINTS, 3, 3)).copy()
    for j, (flex, abd) in ang.items():
        sign = 1.0 if j in (4, 5) else -1.0  # knees fold backwards; hips, shoulders, elbows, spine flex forward
        side = -1.0 if j in (2, 5, 8, 11, 14, 17, 19, 21) else 1.0  # right limbs abduct towards -x
        local[:, j] = rot("z", side * abd) @ rot("x", sign * flex)
    return local


def sample_motion(rng: np.random.Generator, n_frames: int, fps: float = 20.0, action: str | None = None
                  ) -> tuple[np.ndarray, str, str, dict]:
    """One motion: joints (n_frames, 22, 3) in metres, feet on the floor y = 0; its caption, action and style."""
    action = action or ACTIONS[rng.integers(len(ACTIONS))]
    adverb = list(SPEEDS)[rng.integers(len(SPEEDS))]
    style = {"speed": SPEEDS[adverb] * rng.uniform(0.9, 1.1), "amp": rng.uniform(0.8, 1.2), "phase": rng.uniform(0, 2 * np.pi),
             "side": ("left", "right")[rng.integers(2)], "both": bool(rng.random() < 0.3), "turn": (-1, 1)[rng.integers(2)],
             "t0": rng.uniform(0.15, 0.3), "yaw": rng.uniform(-0.5, 0.5), "adverb": adverb, "direction": ""}
    direction = ""
    if action in ("walk", "run"):
        direction = style["direction"] = list(DIRECTIONS)[rng.integers(len(DIRECTIONS))]
        style["yaw"] = DIRECTIONS[direction] + rng.uniform(-0.2, 0.2)
    t = np.arange(n_frames) / fps
    ang, yaw, lift = action_angles(action, t, rng, style)
    rel = forward_kinematics(local_rotations(ang, n_frames), rot("y", yaw))
    feet = rel[:, FOOT_JOINTS]  # (T, 4, 3)
    ground = -feet[..., 1].min(-1)  # pelvis height putting the lowest foot joint on the floor
    root = np.zeros((n_frames, 3))
    if action in ("walk", "run", "turn"):
        # foot locking: the lowest foot stays put, so the root moves by minus its horizontal displacement
        stance = style["stance"][:-1]
        step = feet[1:, :, [0, 2]] - feet[:-1, :, [0, 2]]
        d = np.take_along_axis(step, stance[:, None, None].repeat(2, -1), 1)[:, 0]
        root[1:, [0, 2]] = -np.cumsum(d, 0)
        root[:, [0, 2]] -= 0.5 * root[-1, [0, 2]]  # centre the path on the origin
    root[:, 1] = ground + lift
    joints = rel + root[:, None]
    return joints.astype(np.float32), caption(action, adverb, direction, style, rng), action, style


def caption(action: str, adverb: str, direction: str, style: dict, rng: np.random.Generator) -> str:
    """A natural-language description; repeated calls with the same style give paraphrases (subject and verb vary)."""
    subject = SUBJECTS[rng.integers(len(SUBJECTS))]
    verb = VERB[action][rng.integers(len(VERB[action]))]
    words = [subject, verb]
    if action in ("wave", "kick"):
        limb = "hand" if action == "wave" else "leg"
        words.append("with both hands" if action == "wave" and style["both"] else f"with the {style['side']} {limb}")
    if action == "turn":
        words.append("to the left" if style["turn"] > 0 else "to the right")
    if direction:
        words.append(direction)
    if adverb:
        words.insert(2, adverb)
    return " ".join(words)


def foot_contacts(joints: np.ndarray, height: float = 0.05, speed: float = 0.01) -> np.ndarray:
    """(T, 4) booleans: a foot joint is in contact when it is near the floor and (nearly) still, as HumanML3D labels them."""
    feet = joints[:, FOOT_JOINTS]
    vel = np.zeros(feet.shape[:2])
    vel[:-1] = np.linalg.norm(feet[1:] - feet[:-1], axis=-1)
    vel[-1] = vel[-2]
    return (feet[..., 1] < height) & (vel < speed * 4)

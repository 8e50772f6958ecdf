"""
Recurrent sequence training from a replay buffer
================================================

This tutorial trains a recurrent (LSTM) policy on sequences sampled from a
replay buffer that a collector fills, without reshaping, padding or masking
anything by hand. You will see:

- how a collector completes the environment with what a recurrent policy
  needs (``auto_register_policy_transforms=True``);
- how :class:`~torchrl.data.SliceSampler` finds the trajectories on its own
  and marks every slice start in ``"is_init"``;
- how :class:`~torchrl.modules.LSTMModule` runs a flat batch of slices under
  :class:`~torchrl.modules.set_recurrent_mode`, each slice as its own
  sequence;
- a hand-built batch of two packed trajectories proving that the hidden state
  does not leak across ``"is_init"``;
- a small behaviour-cloning loop on sequences.

Everything runs on CPU in a few seconds. The layout it relies on is described
in :ref:`data-layout`.
"""

######################################################################
# Setup
# -----

import matplotlib.pyplot as plt
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule as Mod, TensorDictSequential as Seq

from torchrl.collectors import Collector
from torchrl.data import LazyTensorStorage, SliceSampler, TensorDictReplayBuffer
from torchrl.envs import GymEnv
from torchrl.modules import LSTMModule, set_recurrent_mode

torch.manual_seed(0)
# The models here are tiny: one CPU thread is faster than several, which would
# mostly wait on each other.
torch.set_num_threads(1)

######################################################################
# A recurrent policy: an LSTM over the CartPole observation, a linear head
# giving two logits, and the greedy action as a one-hot vector.

lstm = LSTMModule(
    input_size=4, hidden_size=32, in_key="observation", out_key="features"
)
head = Mod(torch.nn.Linear(32, 2), in_keys=["features"], out_keys=["logits"])
greedy = Mod(
    lambda logits: torch.nn.functional.one_hot(logits.argmax(-1), 2),
    in_keys=["logits"],
    out_keys=["action"],
)
policy = Seq(lstm, head, greedy)

######################################################################
# Collector auto-wiring
# ---------------------
#
# The environment is a bare ``GymEnv``: it has no ``"is_init"`` entry and no
# recurrent state. With ``auto_register_policy_transforms=True`` the collector
# appends what the policy needs: an :class:`~torchrl.envs.InitTracker` and the
# LSTM's recurrent-state primer. With ``replay_buffer=`` and
# ``trajs_per_batch``, it writes whole trajectories into the buffer.
#
# The sampler is given no key argument: it detects
# ``("collector", "traj_ids")`` in the storage at the first sample.

rb = TensorDictReplayBuffer(
    storage=LazyTensorStorage(10_000), sampler=SliceSampler(slice_len=8)
)
collector = Collector(
    GymEnv("CartPole-v1"),
    policy,
    frames_per_batch=100,
    total_frames=200,
    replay_buffer=rb,
    trajs_per_batch=1,
    auto_register_policy_transforms=True,
)
print("transforms appended by the collector:")
print([type(t).__name__ for t in collector.env.transform])
for _ in collector:
    pass
collector.shutdown()
print(f"{len(rb)} steps of whole trajectories in the buffer")

######################################################################
# Trajectory-aware sampling
# -------------------------
#
# A sample of 4 slices of 8 steps is one flat tensordict of 32 rows. Every
# slice starts with ``is_init=True``, whether or not it starts at an episode
# start: the recurrent module will start each slice from the recurrent state
# stored at its first step.

sample = rb.sample(32)
print(rb.sampler)
print("sample shape:", tuple(sample.shape))
print("is_init per slice:")
print(sample["is_init"].view(4, 8).int())

######################################################################
# Multi-step LSTM under ``set_recurrent_mode(True)``
# --------------------------------------------------
#
# Outside recurrent mode, an :class:`~torchrl.modules.LSTMModule` takes one
# step per row (what the collector needs). In recurrent mode, it splits the
# flat sample at every ``is_init``, runs each piece as a sequence from its
# stored initial state, and writes the outputs back in the flat layout.
#
# We check it against running the LSTM slice by slice.

with set_recurrent_mode(True), torch.no_grad():
    flat_out = policy(sample.clone())["features"]

per_slice = []
with set_recurrent_mode(True), torch.no_grad():
    for piece in sample.clone().split(8):
        per_slice.append(policy(piece)["features"])
per_slice = torch.cat(per_slice)
torch.testing.assert_close(flat_out, per_slice)
print("flat sample == slice by slice:", torch.allclose(flat_out, per_slice))

######################################################################
# The hidden state does not leak across ``is_init``
# -------------------------------------------------
#
# Two trajectories of 5 and 7 steps, packed one after the other in one flat
# batch, with ``is_init`` at rows 0 and 5 and zero initial states. The LSTM's
# outputs for the second trajectory equal the outputs for that trajectory on
# its own. Without the marker at row 5, the second trajectory would inherit the
# hidden state of the first: we show the difference too.

obs = torch.randn(12, 4)
is_init = torch.zeros(12, 1, dtype=torch.bool)
is_init[0] = is_init[5] = True
packed = TensorDict(
    {
        "observation": obs,
        "is_init": is_init,
        "recurrent_state_h": torch.zeros(12, 1, 32),
        "recurrent_state_c": torch.zeros(12, 1, 32),
    },
    batch_size=[12],
)
with set_recurrent_mode(True), torch.no_grad():
    packed_out = lstm(packed.clone())["features"]
    alone_out = lstm(packed[5:].clone())["features"]
    leaked = packed.clone()
    leaked["is_init"][5] = False
    leaked_out = lstm(leaked)["features"]

torch.testing.assert_close(packed_out[5:], alone_out)
gap = (leaked_out[5:] - alone_out).abs().amax(-1)
print(
    "max |packed - alone| on trajectory 2:",
    (packed_out[5:] - alone_out).abs().max().item(),
)
print("without the is_init marker:", gap.tolist())

fig, ax = plt.subplots(figsize=(6, 3))
ax.plot(
    range(5, 12),
    (packed_out[5:] - alone_out).abs().amax(-1),
    "o-",
    label="with is_init at row 5",
)
ax.plot(range(5, 12), gap, "s-", label="without it (state leaks)")
ax.set_xlabel("row of the packed batch")
ax.set_ylabel("max |output - output alone|")
ax.set_title("Trajectory 2 of a packed batch")
ax.legend()
fig.tight_layout()

######################################################################
# Behaviour cloning on sequences
# ------------------------------
#
# An expert controller (push the cart towards where the pole falls) plays
# CartPole; a collector writes its trajectories into a buffer. The environment
# is built with ``policy=student`` so that it carries the student's
# ``"is_init"`` and recurrent state. The student LSTM learns to imitate the
# expert from flat samples of 8 slices of 16 steps, fed straight into it under
# ``set_recurrent_mode(True)``.


def expert_action(observation):
    angle, angular_velocity = observation[..., 2], observation[..., 3]
    push_right = (angle + 0.5 * angular_velocity) > 0
    return torch.nn.functional.one_hot(push_right.long(), 2)


expert = Mod(expert_action, in_keys=["observation"], out_keys=["action"])

student_lstm = LSTMModule(
    input_size=4, hidden_size=32, in_key="observation", out_key="features"
)
student_head = Mod(torch.nn.Linear(32, 2), in_keys=["features"], out_keys=["logits"])
student = Seq(student_lstm, student_head, greedy)

env = GymEnv("CartPole-v1", policy=student)
env.set_seed(0)
expert_rb = TensorDictReplayBuffer(
    storage=LazyTensorStorage(10_000),
    sampler=SliceSampler(slice_len=16),
    batch_size=128,
)
collector = Collector(
    env,
    expert,
    frames_per_batch=300,
    total_frames=600,
    replay_buffer=expert_rb,
    auto_register_policy_transforms=False,  # the env was built for the student
)
for _ in collector:
    pass
collector.shutdown()

optim = torch.optim.Adam(student.parameters(), lr=1e-2)
losses = []
for _ in range(100):
    batch = expert_rb.sample()
    target = batch["action"].argmax(-1)  # the expert's actions
    with set_recurrent_mode(True):
        logits = student(batch)["logits"]
    loss = torch.nn.functional.cross_entropy(logits, target)
    optim.zero_grad()
    loss.backward()
    optim.step()
    losses.append(loss.item())
print(f"behaviour-cloning loss: {losses[0]:.3f} -> {losses[-1]:.3f}")

fig, ax = plt.subplots(figsize=(6, 3))
ax.plot(losses)
ax.set_xlabel("optimisation step")
ax.set_ylabel("cross-entropy")
ax.set_title("Behaviour cloning on sequences")
fig.tight_layout()

######################################################################
# The student then plays on its own, one step at a time (not in recurrent
# mode): the environment built with ``policy=student`` resets its state at
# every episode start.

with torch.no_grad():
    rollout = env.rollout(500, student, break_when_any_done=True)
print(f"the student keeps the pole up for {rollout.numel()} steps")

######################################################################
# Where to go next
# ----------------
#
# - :ref:`data-layout` explains the flat layout, ``pad_output`` and why
#   ``split_trajs`` is discouraged.
# - :ref:`Environment-policy-arg` describes ``policy=`` and
#   ``auto_register_policy_transforms``.
# - ``examples/replay-buffers/recurrent_slice_sampler_pipeline.py`` runs the
#   same pipeline with a collector in the background and a DQN loss.

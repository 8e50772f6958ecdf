# Copyright (c) Meta Platforms, Inc. and affiliates.
#
# This source code is licensed under the MIT license found in the
# LICENSE file in the root directory of this source tree.
"""``examples/recurrent/recurrent_ppo.py``, the main job, run as a user runs it.

Short runs check what the script promises (progress bar, evaluation lines,
CSV, PNG, last line, flags and their errors). The learning check runs the
defaults for 100k frames and is marked ``learning``: skip it locally with
``pytest -m "not learning"``.
"""
from __future__ import annotations

import csv
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
RECIPE = ROOT / "examples" / "recurrent" / "recurrent_ppo.py"
LAST_LINE = re.compile(r"^eval return (-?\d+\.\d\d) after (\d+) frames in (\d+) s$")
SHORT = ["--frames", "1024", "--eval-every", "512", "--eval-episodes", "2"]


def _run(*args, timeout=600, user_env=False):
    env = dict(os.environ, RL_WARNINGS="0")
    if user_env:  # what a user's shell has: TorchRL's warnings and log level as shipped
        for name in ("RL_WARNINGS", "RL_LOGGING_LEVEL", "PYTHONWARNINGS"):
            env.pop(name, None)
    return subprocess.run(
        [sys.executable, str(RECIPE), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=ROOT,
    )


def _curve(out: Path) -> list[dict[str, float]]:
    with open(out / "learning_curve.csv") as file:
        return [{k: float(v) for k, v in row.items()} for row in csv.DictReader(file)]


def test_short_run_outputs(tmp_path):
    proc = _run(*SHORT, "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    # tqdm's bar, with the frames per second and the recent episode return
    assert "frame/s" in proc.stderr
    assert re.search(r"fps=\d+", proc.stderr)
    assert re.search(r"return=\d+\.\d", proc.stderr)
    evals = re.findall(r"eval: return (-?\d+\.\d\d) after (\d+) frames", proc.stdout)
    assert [int(f) for _, f in evals] == [0, 512, 1024]
    curve = _curve(tmp_path)
    assert [r["frames"] for r in curve] == [0, 512, 1024]
    assert [f"{r['eval_return']:.2f}" for r in curve] == [r for r, _ in evals]
    assert all(r["eval_return"] >= 1 for r in curve)  # every episode lasts a step
    assert all(a["wall_s"] <= b["wall_s"] for a, b in zip(curve, curve[1:]))
    png = (tmp_path / "learning_curve.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 5000
    last = proc.stdout.strip().splitlines()[-1]
    match = LAST_LINE.match(last)
    assert match, last
    assert match.group(1) == evals[-1][0] and match.group(2) == "1024"


def test_run_prints_only_its_own_lines(tmp_path):
    """No warning, no TorchRL log line: the evaluation lines and the last line only.

    One batch, run as a user runs it: the env and the collector are built (two
    LSTMs, so two recurrent-state primers, and an observation VecNormV2 on the
    batch) and the replay storage is allocated.
    """
    proc = _run(
        *["--frames", "512", "--eval-every", "512", "--eval-episodes", "2"],
        *["--no-progress", "--out", str(tmp_path)],
        user_env=True,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stderr == ""
    lines = proc.stdout.splitlines()
    assert [re.sub(r"\d+(\.\d+)?", "N", line) for line in lines] == [
        "inputs: observation entries N,N, normalized",
        "eval: return N after N frames (N s)",
        "eval: return N after N frames (N s)",
        "eval return N after N frames in N s",
    ], proc.stdout


@pytest.mark.parametrize(
    "flags",
    [
        ["--policy", "mlp"],
        ["--policy", "gtrxl", "--memory-len", "4", "--layers", "2"],
        ["--rnn", "gru"],
        ["--obs-keep", "all", "--no-obs-norm", "--batched-env", "serial"],
        ["--shared-rnn", "--batched-env", "parallel", "--num-envs", "2"],
        ["--env", "Acrobot-v1", "--obs-keep", "0,1,2,3"],
    ],
    ids=["mlp", "gtrxl", "gru", "all-obs-serial", "shared-parallel", "acrobot"],
)
def test_variants_run(tmp_path, flags):
    proc = _run(*SHORT, "--no-progress", "--out", str(tmp_path), *flags)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "frame/s" not in proc.stderr  # --no-progress
    assert "Warning" not in proc.stderr, proc.stderr
    assert "[torchrl]" not in proc.stdout, proc.stdout
    assert LAST_LINE.match(proc.stdout.strip().splitlines()[-1])
    assert len(_curve(tmp_path)) == 3


def _recipe_module():
    sys.path.insert(0, str(RECIPE.parent))
    try:
        import recurrent_ppo
    finally:
        sys.path.remove(str(RECIPE.parent))
    return recurrent_ppo


@pytest.mark.parametrize("policy", ["lstm", "gru", "gtrxl"])
def test_whole_batch_minibatch_is_the_sampled_one(policy):
    # when the batch's trajectory pieces fit in one minibatch, the recipe runs
    # the loss on the [envs, steps] batch as collected instead of the slice
    # sampler's padded sample of all its pieces: same loss, same gradient
    recurrent_ppo = _recipe_module()
    from tensordict.nn import TensorDictSequential

    from torchrl.collectors import Collector
    from torchrl.data import (
        LazyTensorStorage,
        SliceSamplerWithoutReplacement,
        TensorDictReplayBuffer,
    )
    from torchrl.modules import set_recurrent_mode
    from torchrl.objectives import ClipPPOLoss
    from torchrl.objectives.value import GAE

    torch.manual_seed(0)
    flags = ["--policy", "gtrxl"] if policy == "gtrxl" else ["--rnn", policy]
    args = recurrent_ppo.parse_args(
        [*flags, "--num-envs", "4", "--steps-per-env", "16"]
    )
    env = recurrent_ppo.make_env(args, args.num_envs, 0)
    actor, critic = recurrent_ppo.make_agent(
        args, env.observation_spec["observation"].shape[-1], env.action_spec.shape[-1]
    )
    collector = Collector(
        env,
        TensorDictSequential(actor, critic),
        frames_per_batch=64,
        total_frames=-1,
        auto_register_policy_transforms=True,
    )
    try:
        # CartPole's first episodes are short: episode starts inside the rows
        batch = next(iter(collector))
    finally:
        collector.shutdown()
    assert batch.shape == (4, 16) and batch["is_init"][:, 1:].any()
    with torch.no_grad(), set_recurrent_mode(True):
        GAE(gamma=0.99, lmbda=0.95, value_network=critic)(batch)
    pieces = 4 + int(batch["next", "done"][:, :-1].sum())
    assert pieces == 4 + int(batch["is_init"][:, 1:].sum())
    assert recurrent_ppo.fits_one_minibatch(batch, pieces)
    assert not recurrent_ppo.fits_one_minibatch(batch, pieces - 1)
    buffer = TensorDictReplayBuffer(
        storage=LazyTensorStorage(64, ndim=2),
        sampler=SliceSamplerWithoutReplacement(
            slice_len=16, strict_length=False, pad_output=True
        ),
        batch_size=pieces * 16,
    )
    buffer.extend(batch)
    (sample,) = list(buffer)
    assert sample.numel() == pieces * 16 > batch.numel()  # padded
    loss_fn = ClipPPOLoss(actor, critic, entropy_coeff=0.01, normalize_advantage=True)
    with torch.no_grad():  # a policy that moved since collection: ratios != 1
        for param in loss_fn.parameters():
            param.add_(torch.randn_like(param), alpha=0.05)

    def loss_and_grads(data):
        loss_fn.zero_grad()
        with set_recurrent_mode(True):
            losses = loss_fn(data)
        loss = sum(losses[k] for k in losses.keys() if k.startswith("loss_"))
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in loss_fn.parameters()]

    loss_sampled, grads_sampled = loss_and_grads(sample)
    loss_whole, grads_whole = loss_and_grads(batch)
    torch.testing.assert_close(loss_whole, loss_sampled, rtol=1e-5, atol=1e-6)
    for whole, sampled in zip(grads_whole, grads_sampled):
        torch.testing.assert_close(whole, sampled, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--obs-keep", "0,9"], "--obs-keep 0,9: the observation of CartPole-v1 has 4"),
        (["--obs-keep", "0,0"], "--obs-keep takes distinct non-negative indices"),
        (["--obs-keep", "pos"], "--obs-keep takes 'all' or comma-separated"),
        (["--env", "Pendulum-v1"], "needs a Discrete action space"),
        (["--env", "NoSuchEnv-v0"], "--env NoSuchEnv-v0: gymnasium cannot make it"),
        (["--frames", "100"], "--frames=100 is less than one batch"),
        (["--num-envs", "0"], "--num-envs must be at least 1"),
        (["--lr", "0"], "--lr must be positive"),
        (["--gamma", "1.5"], "--gamma must be in [0, 1]"),
        (["--policy", "transformer"], "invalid choice: 'transformer'"),
        (["--policy", "gtrxl", "--heads", "3"], "--heads 3 must divide --embed-dim 32"),
        (["--memory-len", "0"], "--memory-len must be at least 1"),
    ],
)
def test_bad_flags(flags, message):
    proc = _run(*flags, timeout=120)
    assert proc.returncode == 2
    assert message in proc.stderr, proc.stderr


@pytest.mark.parametrize(
    "flags, lr",
    [
        ([], 1e-3),
        (["--policy", "mlp"], 1e-3),
        (["--policy", "gtrxl"], 3e-4),
        (["--policy", "gtrxl", "--lr", "1e-3"], 1e-3),
    ],
)
def test_learning_rate_per_policy(flags, lr):
    assert _recipe_module().parse_args(flags).lr == lr


def test_help_explains_every_flag():
    proc = _run("--help", timeout=120)
    assert proc.returncode == 0
    flags = set(re.findall(r"^\s+(--[a-z-]+)", proc.stdout, flags=re.M))
    source = RECIPE.read_text()
    declared = set(re.findall(r'add_argument\(\s*"(--[a-z-]+)"', source))
    assert declared and declared <= flags | {"--help"}
    # every flag's help gives its default, in argparse's words or its own,
    # except the on/off flags' (their help says what they turn on or off)
    switches = set(
        re.findall(
            r'add_argument\(\s*"(--[a-z-]+)",\s*action="store_(?:true|false)"', source
        )
    )
    assert switches
    blocks = re.split(r"\n(?=\s{2}(?:-[a-z], )?--[a-z])", proc.stdout)[1:]
    for block in blocks:
        flag = re.match(r"\s+(?:-[a-z], )?(--[a-z-]+)", block).group(1)
        assert len(block.split()) > 3, block
        if flag not in switches | {"--help"}:
            assert "default" in block, block
    assert len(blocks) == len(declared) + 1
    # a default resolved from other flags or the env is explained, not "None"
    assert "(default: None)" not in proc.stdout
    entropy = re.search(
        r"--entropy-coef ENTROPY_COEF\s+(.*?)\n\s+--", proc.stdout, re.S
    )
    assert "0.05 on POPGym" in " ".join(entropy.group(1).split())


@pytest.mark.learning
def test_learns_cartpole_without_velocities(tmp_path):
    """Defaults, seed 0: the deterministic evaluation reaches 475 within 100k frames.

    ``--stop-return 475`` ends the run at the first evaluation that gets there,
    so the curve's last row, and only it, is at or above 475.
    """
    proc = _run(
        "--seed",
        "0",
        "--no-progress",
        "--stop-return",
        "475",
        "--out",
        str(tmp_path),
        timeout=1800,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    curve = _curve(tmp_path)
    assert curve[-1]["frames"] <= 100_000
    assert curve[-1]["eval_return"] >= 475, proc.stdout
    assert all(r["eval_return"] < 475 for r in curve[:-1]), proc.stdout
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith(f"eval return {curve[-1]['eval_return']:.2f} after ")

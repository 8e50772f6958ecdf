# Copyright (c) Meta Platforms, Inc. and affiliates.
#
# This source code is licensed under the MIT license found in the
# LICENSE file in the root directory of this source tree.
"""The recurrent recipes on POPGym's tasks, as they are.

POPGym's envs register no step limit (they end their episodes themselves) and
most have discrete observations: ``Discrete``, ``MultiDiscrete`` or a
``Tuple`` of ``Discrete``. The recipes one-hot encode them with a TorchRL
transform, take the episode limit from the env, and optionally append the
previous action and a first-step flag (``--prev-action``). Each check builds
the recipe's own envs on the real POPGym envs.
"""
from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("popgym")

ROOT = Path(__file__).resolve().parent.parent
RECIPES = ROOT / "examples" / "recurrent"
sys.path.insert(0, str(RECIPES))

import recurrent_ppo  # noqa: E402

from torchrl.envs.utils import RandomPolicy  # noqa: E402


def _env_id(task: str) -> str:
    return f"popgym:popgym-{task}-v0"


def _args(task: str, *flags: str):
    return recurrent_ppo.parse_args(
        ["--env", _env_id(task), "--num-envs", "3", "--steps-per-env", "8", *flags]
    )


# task -> (category counts of its observation, its number of actions)
DISCRETE = {
    "RepeatPreviousEasy": ((4,), 4),  # Discrete(4)
    "CountRecallEasy": ((2, 2), 27),  # MultiDiscrete([2, 2])
    "AutoencodeEasy": ((2, 4), 4),  # Tuple(Discrete(2), Discrete(4))
}


class TestArguments:
    @pytest.mark.parametrize("task", list(DISCRETE))
    def test_discrete_observations(self, task):
        args = _args(task)
        assert args.obs_nvec == DISCRETE[task][0]
        assert args.obs_tuple == (task == "AutoencodeEasy")
        # one-hot inputs are not normalized; no entry selection
        assert args.obs_norm is False and args.obs_keep is None

    def test_episode_limit_from_the_env(self):
        # none registered: the env's own max_episode_length
        assert _args("RepeatPreviousEasy").max_episode_steps == 51
        assert _args("PositionOnlyCartPoleEasy").max_episode_steps == 200
        flag = _args("RepeatPreviousEasy", "--max-episode-steps", "7")
        assert flag.max_episode_steps == 7

    def test_box_observation_keeps_its_defaults(self):
        args = _args("PositionOnlyCartPoleEasy")
        assert args.obs_nvec is None and args.obs_norm is True
        assert args.obs_keep is None  # 'auto' is 0,2 on CartPole-v1 only
        cartpole = recurrent_ppo.parse_args([])
        assert cartpole.obs_keep == (0, 2) and cartpole.max_episode_steps == 500

    def test_defaults_per_family(self, capsys):
        # POPGym's sets (benchmarks/results/popgym-tuning.md) and CartPole's
        def defaults(argv):
            args = recurrent_ppo.parse_args(argv)
            return args.entropy_coef, args.steps_per_env, args.gamma

        # tasks that score each answer alone: a short discount
        for task in ("RepeatFirstEasy", "CountRecallEasy", "RepeatPreviousMedium"):
            assert defaults(["--env", _env_id(task)]) == (0.05, 64, 0.7)
        # POPGym's control task keeps the long one
        pole = ["--env", _env_id("PositionOnlyCartPoleEasy")]
        assert defaults(pole) == (0.05, 64, 0.995)
        assert defaults([]) == (0.0, 32, 0.995)
        assert recurrent_ppo.family("CartPole-v1") == "other"
        # a flag given wins, 0 included
        assert _args("RepeatFirstEasy").steps_per_env == 8
        assert _args("RepeatFirstEasy", "--entropy-coef", "0").entropy_coef == 0.0
        cartpole = recurrent_ppo.parse_args(["--entropy-coef", "0.01"])
        assert cartpole.entropy_coef == 0.01
        assert _args("CountRecallEasy", "--gamma", "0.99").gamma == 0.99
        with pytest.raises(SystemExit):
            _args("RepeatFirstEasy", "--entropy-coef", "-0.1")
        assert "--entropy-coef must be >= 0, got -0.1" in capsys.readouterr().err

    def test_help_quotes_each_family_default(self, capsys):
        with pytest.raises(SystemExit):
            recurrent_ppo.parse_args(["--help"])
        text = " ".join(capsys.readouterr().out.split())
        for flag in ("entropy-coef", "steps-per-env", "gamma"):
            # the help of one flag: from its name to the next flag's
            metavar = flag.replace("-", "_").upper()
            help_ = text.split(f"--{flag} {metavar} ", 1)[1].split(" --", 1)[0]
            for values in recurrent_ppo.FAMILY_DEFAULTS.values():
                assert f"{values[flag.replace('-', '_')]} " in help_, (flag, help_)
        for task in recurrent_ppo.POPGYM_ANSWER_TASKS:
            assert task in text

    def test_obs_keep_on_a_discrete_observation(self, capsys):
        with pytest.raises(SystemExit):
            _args("CountRecallEasy", "--obs-keep", "0")
        assert "is discrete" in capsys.readouterr().err


def _rollout(args, steps: int, seed: int = 0):
    env = recurrent_ppo.make_env(args, args.num_envs, seed)
    torch.manual_seed(seed)
    try:
        return (
            env.rollout(
                steps, RandomPolicy(env.action_spec), break_when_any_done=False
            ),
            env.observation_spec["observation"],
        )
    finally:
        env.close()


@pytest.mark.parametrize("batched", ["vector", "serial"])
@pytest.mark.parametrize("task", list(DISCRETE))
def test_one_hot_observation(task, batched):
    """Every category group of every step is one-hot, as floats, in the spec."""
    args = _args(task, "--batched-env", batched)
    nvec = DISCRETE[task][0]
    rollout, spec = _rollout(args, 60)
    for obs in (rollout["observation"], rollout["next", "observation"]):
        assert obs.dtype == torch.float32
        assert obs.shape == (3, 60, sum(nvec)) and spec.shape[-1] == sum(nvec)
        for group in obs.split(list(nvec), -1):
            assert (group.sum(-1) == 1).all() and ((group == 0) | (group == 1)).all()
    # the observation changes along the episode (not a constant encoding)
    assert rollout["observation"].flatten(0, 1).unique(dim=0).shape[0] > 1


@pytest.mark.parametrize("batched", ["vector", "serial"])
def test_prev_action(batched):
    """The previous action and the first-step flag, across episode ends and resets."""
    args = _args("RepeatPreviousEasy", "--prev-action", "--batched-env", batched)
    nvec, num_actions = DISCRETE["RepeatPreviousEasy"]
    width = sum(nvec)
    # 51-step episodes: two resets inside the rollout
    rollout, spec = _rollout(args, 120)
    assert spec.shape[-1] == width + num_actions + 1
    obs, nxt = rollout["observation"], rollout["next", "observation"]
    action = rollout["action"].float()
    done = rollout["next", "done"].squeeze(-1)
    assert done.sum() == 6  # 3 envs x 2 episode ends
    first = torch.zeros_like(done)
    first[:, 0] = True
    first[:, 1:] = done[:, :-1]
    assert torch.equal(obs[..., -1] == 1, first)
    assert ((obs[..., -1] == 0) | first).all()
    # first step: no previous action; otherwise the action just taken
    assert (obs[first][:, width:-1] == 0).all()
    assert torch.equal(obs[~first][:, width:-1], action[:, :-1][~first[:, 1:]])
    # the next observation carries the step's own action, never a first flag
    assert torch.equal(nxt[..., width:-1], action)
    assert (nxt[..., -1] == 0).all()
    # the base observation is still the one-hot one
    assert (obs[..., :width].sum(-1) == 1).all()


def _run(recipe: str, *flags: str):
    return subprocess.run(
        [sys.executable, str(RECIPES / recipe), *flags],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )


@pytest.mark.parametrize(
    "recipe, task, flags, inputs",
    [
        (
            "recurrent_ppo.py",
            "AutoencodeEasy",
            ["--prev-action", "--batched-env", "parallel", "--num-envs", "2"],
            "observation one-hot (2+4 categories), previous action (one-hot), "
            "first-step flag",
        ),
        (
            "recurrent_ppo.py",
            "PositionOnlyCartPoleEasy",
            ["--rnn", "gru", "--num-envs", "4"],
            "observation (all entries), normalized",
        ),
        (
            "r2d2.py",
            "CountRecallEasy",
            ["--prev-action", "--warmup-frames", "128", "--num-slices", "4"],
            "observation one-hot (2+2 categories), previous action (one-hot), "
            "first-step flag",
        ),
    ],
    ids=["ppo-autoencode-prev-action", "ppo-position-cartpole", "r2d2-count-recall"],
)
def test_recipe_runs(tmp_path, recipe, task, flags, inputs):
    """A short run on the POPGym env, reporting which inputs the agent saw."""
    proc = _run(
        recipe,
        *["--env", _env_id(task), "--frames", "512", "--eval-every", "256"],
        *["--eval-episodes", "2", "--no-progress", "--out", str(tmp_path), *flags],
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert lines[0] == f"inputs: {inputs}", proc.stdout
    evals = re.findall(r"eval: return (-?\d+\.\d\d) after", proc.stdout)
    assert len(evals) == 3
    # POPGym's returns lie in [-1, 1]
    assert all(-1 <= float(r) <= 1 for r in evals), proc.stdout
    assert re.match(r"^eval return -?\d+\.\d\d after 512 frames in \d+ s$", lines[-1])
    assert (tmp_path / "learning_curve.csv").is_file()
    # TorchRL's CSVLogger, the default: one row per evaluation
    scalars = tmp_path / "logs" / tmp_path.name / "scalars"
    rows = (scalars / "eval_return.csv").read_text().splitlines()
    assert [row.split(",")[0] for row in rows] == ["0", "256", "512"]
    assert [f"{float(row.split(',')[1]):.2f}" for row in rows] == evals
    assert (scalars / "fps.csv").is_file() and (scalars / "train_return.csv").is_file()


def test_logger_none_and_tensorboard(tmp_path):
    flags = ["--env", _env_id("RepeatPreviousEasy"), "--frames", "256"]
    flags += ["--num-envs", "2", "--steps-per-env", "128", "--eval-episodes", "1"]
    proc = _run("recurrent_ppo.py", *flags, "--logger", "none", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "learning_curve.csv").is_file()
    assert not (tmp_path / "logs").exists()
    board = tmp_path / "board"
    proc = _run(
        "recurrent_ppo.py", *flags, "--logger", "tensorboard", "--out", str(board)
    )
    if importlib.util.find_spec("tensorboard") is None:
        assert proc.returncode == 2
        assert "--logger tensorboard needs the tensorboard package" in proc.stderr
    else:
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert list((board / "logs").rglob("events.out.tfevents.*"))


def test_benchmark_quick(tmp_path):
    """``benchmarks/popgym.py --quick``: the table and the curves it writes."""
    table = tmp_path / "popgym.md"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "popgym.py"), "--quick"]
        + ["--tasks", "RepeatPreviousEasy", "--models", "gru", "gtrxl", "mlp"]
        + ["--table", str(table)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = table.read_text()
    # the GTrXL window of the task, and the recipe's defaults of its family
    assert (
        "covers the earlier steps each answer depends on: 16 on RepeatPreviousEasy"
        in (" ".join(text.split()))
    )
    assert "`--entropy-coef 0.05 --steps-per-env 64 --gamma 0.7` on" in text
    rates = recurrent_ppo.POLICY_LR
    assert (
        f"the learning rate (`--lr`) per model: {rates['rnn']} for gru, "
        f"{rates['gtrxl']} for gtrxl, {rates['mlp']} for mlp"
    ) in " ".join(text.split())
    rows = [line for line in text.splitlines() if line.startswith("| R")]
    assert [row.split(" | ")[2] for row in rows] == ["gru", "gtrxl", "mlp"]
    for row in rows:
        cells = row.strip("| ").split(" | ")
        assert cells[1] == "-0.50"  # the no-memory ceiling
        assert cells[3] == ("obs" if cells[2] == "mlp" else "obs + prev. action")
        assert -1 <= float(cells[4]) <= float(cells[5]) <= 1  # final <= best
        assert cells[6] == "1024"
    png = table.with_suffix(".png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n")

# Copyright (c) Meta Platforms, Inc. and affiliates.
#
# This source code is licensed under the MIT license found in the
# LICENSE file in the root directory of this source tree.
"""Memory on POPGym: the recurrent PPO recipe with GRU, LSTM, GTrXL and the MLP control.

Runs ``examples/recurrent/recurrent_ppo.py`` with its defaults (one set for
each family of POPGym tasks: the recipe's CartPole settings with an entropy
bonus of 0.05 and 64 steps per env, and a discount of 0.7 on the tasks that
score each answer alone, ``benchmarks/results/popgym-tuning.md``) on POPGym
tasks (Morad et al., ICLR 2023), each model and seed in
its own subprocess, one after the other. The memory models (GRU, LSTM and,
with ``--models``, GTrXL, whose ``--memory-len`` is set per task to the
look-back the task's answers need, :data:`GTRXL_MEMORY_LEN`) get
``--prev-action`` (the previous action and a first-step flag, POPGym's usual
input); the MLP control
gets the observation alone, so that it has no memory at all (the previous
action is one step of memory: with it an MLP scores about 0.4 on
PositionOnlyCartPoleEasy, above the no-memory ceiling).

Writes a Markdown table (``--table``) and a PNG of the learning curves next
to it, rewritten after every run: per task and model, the median over seeds
of the final and of the best mean evaluation return over training (POPGym's
MMER is a best-over-training statistic), the frames and the wall time, each
seed's figures beside them, and the no-memory ceiling of the task (the best a
policy without memory scores, measured with hand-coded policies over 300
episodes). Each run's folder is kept under ``--workdir`` when one is given,
and a run whose folder holds its result is not run again (resume).

``--quick`` is the smoke mode (CI): one seed, a few thousand frames, the
table written to a temporary folder unless ``--table`` is given.
"""
from __future__ import annotations

import argparse
import csv
import json
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RECIPE = ROOT / "examples" / "recurrent" / "recurrent_ppo.py"

# task -> (frames of a full run, no-memory ceiling of the evaluation return)
TASKS = {
    "RepeatPreviousEasy": (500_000, -0.50),
    "RepeatPreviousMedium": (1_000_000, -0.50),  # the card seen 32 steps ago
    # chance level without the previous action (1.00 with it: no memory needed)
    "RepeatFirstEasy": (500_000, -0.50),
    "CountRecallEasy": (1_000_000, -0.93),
    "PositionOnlyCartPoleEasy": (200_000, 0.21),
    "AutoencodeEasy": (1_000_000, -0.50),
}
MODELS = {
    "gru": ["--rnn", "gru", "--prev-action"],
    "lstm": ["--rnn", "lstm", "--prev-action"],
    "gtrxl": ["--policy", "gtrxl", "--prev-action"],  # + GTRXL_MEMORY_LEN[task]
    "mlp": ["--policy", "mlp"],
}
# GTrXL's window (--memory-len): the earlier steps each answer of the task
# depends on, rounded up to a power of two (a step attends to at most this
# many earlier steps)
GTRXL_MEMORY_LEN = {
    "RepeatPreviousEasy": 16,  # the card 4 steps back (the recipe's default)
    "RepeatPreviousMedium": 32,  # the card 32 steps back
    "RepeatFirstEasy": 64,  # the first card of a 51-step episode
    "CountRecallEasy": 64,  # every card of a 51-step episode
    "PositionOnlyCartPoleEasy": 16,  # velocities (the recipe's default)
    "AutoencodeEasy": 128,  # every card of a 103-step episode
}
INPUTS = {
    "gru": "obs + prev. action",
    "lstm": "obs + prev. action",
    "gtrxl": "obs + prev. action",
    "mlp": "obs",
}


def _curve(path: Path) -> list[dict[str, float]]:
    with open(path) as file:
        return [{k: float(v) for k, v in row.items()} for row in csv.DictReader(file)]


def run_one(task: str, model: str, seed: int, frames: int, args, out: Path) -> dict:
    """One recipe run in a subprocess; its curve and figures."""
    folder = out / f"{task}-{model}-seed{seed}"
    done = folder / "result.json"
    if done.exists():
        return json.loads(done.read_text())
    cmd = [sys.executable, str(RECIPE), "--env", f"popgym:popgym-{task}-v0"]
    cmd += MODELS[model]
    if model == "gtrxl":
        cmd += ["--memory-len", str(GTRXL_MEMORY_LEN[task])]
    cmd += [*shlex.split(args.recipe_args), "--seed", str(seed)]
    if args.stop_return is not None and model != "mlp":
        cmd += ["--stop-return", str(args.stop_return)]
    cmd += ["--frames", str(frames), "--eval-every", str(args.eval_every)]
    cmd += ["--eval-episodes", str(args.eval_episodes), "--threads", "1"]
    cmd += ["--no-progress", "--logger", "none", "--out", str(folder)]
    start = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.monotonic() - start
    if proc.returncode != 0:
        raise RuntimeError(f"{task} {model} seed {seed} failed:\n{proc.stderr[-3000:]}")
    curve = _curve(folder / "learning_curve.csv")
    result = {
        "final": curve[-1]["eval_return"],
        "best": max(r["eval_return"] for r in curve),
        "frames": int(curve[-1]["frames"]),
        "wall_s": wall,
        # evaluations and start-up included: a lower bound of the training rate
        "fps": curve[-1]["frames"] / curve[-1]["wall_s"],
        "curve": curve,
    }
    done.write_text(json.dumps(result))
    return result


def _settings(tasks: list[str], recipe_args: str) -> str:
    """The recipe's defaults the runs of ``tasks`` got, family by family."""
    recipe = _recipe()
    families: dict[str, list[str]] = {}
    for task in dict.fromkeys(tasks):
        families.setdefault(recipe.family(f"popgym:popgym-{task}-v0"), []).append(task)
    sets = []
    for key, members in families.items():
        flags = " ".join(
            f"--{flag.replace('_', '-')} {value}"
            for flag, value in recipe.FAMILY_DEFAULTS[key].items()
        )
        sets.append(f"`{flags}` on {', '.join(members)}")
    given = f", and `{recipe_args}` given to every run" if recipe_args else ""
    return f"Recipe defaults for POPGym ({'; '.join(sets)}){given}"


def _learning_rates(models: list[str], recipe_args: str) -> str:
    """The recipe's default learning rate of each model of the table, unless ``--lr`` is given."""
    if "--lr" in shlex.split(recipe_args):
        return ""
    recipe = _recipe()
    rates = []
    for model in dict.fromkeys(models):
        flags = MODELS[model]
        policy = flags[flags.index("--policy") + 1] if "--policy" in flags else "rnn"
        rates.append(f"{recipe.POLICY_LR[policy]} for {model}")
    return f"; the learning rate (`--lr`) per model: {', '.join(rates)}"


def _gtrxl_windows(tasks: list[str]) -> str:
    """The GTrXL windows of the table's tasks, if it has GTrXL runs."""
    if not tasks:
        return ""
    windows = ", ".join(
        f"{GTRXL_MEMORY_LEN[task]} on {task}" for task in dict.fromkeys(tasks)
    )
    return (
        "; GTrXL's window (`--memory-len`) covers the earlier steps each answer "
        f"depends on: {windows}"
    )


def _recipe():
    """The recipe module (its POPGym defaults name the table's settings)."""
    sys.path.insert(0, str(RECIPE.parent))
    try:
        import recurrent_ppo
    finally:
        sys.path.pop(0)
    return recurrent_ppo


def _cell(runs: list[dict], key: str, fmt: str) -> str:
    values = [r[key] for r in runs]
    each = "/".join(format(v, fmt) for v in values)
    if len(values) == 1:
        return each
    return f"{format(statistics.median(values), fmt)} ({each})"


def write_table(results: dict, args, path: Path) -> None:
    import torch

    import torchrl

    lines = [
        "# Recurrent PPO on POPGym",
        "",
        f"Produced by `python benchmarks/popgym.py{' --quick' if args.quick else ''}` "
        f"on {date.today().isoformat()}: torchrl {torchrl.__version__} (this fork), "
        f"torch {torch.__version__}, Python {platform.python_version()}, "
        f"{platform.machine()} with {_cores()} cores, 1 torch thread per run, "
        # summed over the runs: resumed runs count with the time they took
        f"{sum(r['wall_s'] for runs in results.values() for r in runs) / 60:.0f} "
        "min of runs in all"
        + (
            f", memory models stopped at the first evaluation >= {args.stop_return}"
            if args.stop_return is not None
            else ""
        )
        + ".",
        "",
        _settings([task for task, _ in results], args.recipe_args)
        + _learning_rates([model for _, model in results], args.recipe_args)
        + _gtrxl_windows([task for task, model in results if model == "gtrxl"])
        + ". The memory models get "
        "`--prev-action` (previous action and first-step flag, POPGym's usual "
        "input); the MLP control sees the observation alone (no memory at "
        "all). Returns are the mean of "
        f"{args.eval_episodes} deterministic evaluation episodes; median over "
        "seeds, each seed in brackets. *best* is the best evaluation over "
        "training (POPGym's MMER is a best-over-training statistic).",
        "",
        "| task | no-memory ceiling | model | inputs | final return | best return "
        "| frames | wall (s) | frames/s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for (task, model), runs in results.items():
        if not runs:
            continue
        lines.append(
            f"| {task} | {TASKS[task][1]:.2f} | {model} | {INPUTS[model]} "
            f"| {_cell(runs, 'final', '.2f')} | {_cell(runs, 'best', '.2f')} "
            f"| {_cell(runs, 'frames', '.0f')} | {_cell(runs, 'wall_s', '.0f')} "
            f"| {_cell(runs, 'fps', '.0f')} |"
        )
    if any(task == "RepeatFirstEasy" and model == "mlp" for task, model in results):
        lines += [
            "",
            "RepeatFirstEasy, MLP: a policy without memory that gives the same "
            "answer at every step scores about +1 or -1 per episode (right or "
            "wrong about the first card all along), so 16-episode evaluations "
            "of it spread with a standard deviation of 0.24 around -0.44 "
            "(1,600 simulated episodes; answering the current card instead: "
            "-0.50, standard deviation 0.004). The per-seed figures of the "
            "MLP there are that noisy; compare the median with the ceiling.",
        ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")


def _cores() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = sorted({task for task, _ in results}, key=list(TASKS).index)
    fig, axes = plt.subplots(
        1, len(tasks), figsize=(4 * len(tasks), 3.2), squeeze=False
    )
    for ax, task in zip(axes[0], tasks):
        for (t, model), runs in results.items():
            if t != task:
                continue
            for i, run in enumerate(runs):
                ax.plot(
                    [r["frames"] for r in run["curve"]],
                    [r["eval_return"] for r in run["curve"]],
                    color={"gru": "C0", "lstm": "C1", "mlp": "C2", "gtrxl": "C3"}[
                        model
                    ],
                    alpha=0.8,
                    label=model if i == 0 else None,
                )
        ax.axhline(TASKS[task][1], color="grey", ls="--", lw=1, label="no memory")
        ax.set_title(task)
        ax.set_xlabel("frames")
        ax.set_ylim(-1.05, 1.05)
    axes[0][0].set_ylabel("evaluation return")
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n")[0],
        formatter_class=_recipe().HelpFormatter,
    )
    parser.add_argument(
        "--tasks", nargs="+", choices=list(TASKS), default=list(TASKS), help="tasks"
    )
    parser.add_argument(
        "--models",
        nargs="+",
        choices=list(MODELS),
        default=["gru", "lstm", "mlp"],
        help="models (gtrxl: the GTrXL memory, recurrent_ppo.py --policy gtrxl)",
    )
    parser.add_argument(
        "--seeds",
        type=int,
        default=3,
        help="seeds per model: K..K+N-1 (--first-seed K)",
    )
    parser.add_argument(
        "--first-seed",
        type=int,
        default=0,
        help="the first seed, to split the seeds of a table over processes "
        "sharing --workdir",
    )
    parser.add_argument(
        "--frames",
        type=int,
        default=None,
        help="frames per run (default: each task's budget, 200k to 1M)",
    )
    parser.add_argument(
        "--eval-every", type=int, default=25_000, help="frames between evaluations"
    )
    parser.add_argument(
        "--eval-episodes", type=int, default=16, help="episodes per evaluation"
    )
    parser.add_argument(
        "--table",
        type=Path,
        default=None,
        help="Markdown table to write, the PNG beside it (default: "
        "benchmarks/results/popgym.md; with --quick a temporary folder)",
    )
    parser.add_argument(
        "--stop-return",
        type=float,
        default=None,
        help="end a GRU/LSTM run at its first evaluation of at least this return "
        "(the recipe's --stop-return; the MLP control always runs its budget)",
    )
    parser.add_argument(
        "--workdir",
        type=Path,
        default=None,
        help="keep each run's folder here and reuse the runs already done in it "
        "(default: a temporary folder, removed at the end)",
    )
    parser.add_argument(
        "--recipe-args",
        default="",
        help="more recipe flags for every run, one string, e.g. "
        "--recipe-args='--reward-scale 1' (a tuning sweep; the table says "
        "which were given); --recipe-args='--entropy-coef 0 --steps-per-env 32 "
        "--gamma 0.995' gives the settings of the tables made before the POPGym "
        "defaults, --recipe-args='--gamma 0.995' those of the tables made with "
        "their first version",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smoke mode: one seed, 1,024 frames per run, evaluations every 512",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.seeds, args.frames, args.eval_every, args.eval_episodes = 1, 1024, 512, 2
    tmp = tempfile.TemporaryDirectory()
    if args.table is None:
        args.table = (
            Path(tmp.name) / "popgym.md"
            if args.quick
            else ROOT / "benchmarks" / "results" / "popgym.md"
        )
    workdir = args.workdir or Path(tmp.name)
    results: dict = {}
    for task in args.tasks:
        frames = args.frames or TASKS[task][0]
        for model in args.models:
            runs = results.setdefault((task, model), [])
            for seed in range(args.first_seed, args.first_seed + args.seeds):
                run = run_one(task, model, seed, frames, args, workdir)
                runs.append(run)
                print(
                    f"{task:26} {model:4} seed {seed}: final {run['final']:.2f}, "
                    f"best {run['best']:.2f}, {run['frames']} frames, "
                    f"{run['wall_s']:.0f} s, {run['fps']:.0f} frames/s",
                    flush=True,
                )
                # after every run, so that an interrupted sweep leaves its table
                write_table(results, args, args.table)
                plot(results, args.table.with_suffix(".png"))
    print(args.table.read_text())
    print(f"popgym: table {args.table}, curves {args.table.with_suffix('.png')}")
    tmp.cleanup()


if __name__ == "__main__":
    main()

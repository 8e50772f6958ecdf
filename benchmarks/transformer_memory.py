# Copyright (c) Meta Platforms, Inc. and affiliates.
#
# This source code is licensed under the MIT license found in the
# LICENSE file in the root directory of this source tree.
"""GTrXLModule: recurrent mode against the bare attention math, and one collection step against LSTMModule.

* **recurrent mode** (forward + backward, and forward without gradients): the
  module on a flat sample of 64 slices x 32 steps (``"is_init"`` at every
  slice start, the memory stored at every row, as a slice sampler returns it)
  over a bare reference that does the same math with the same parameters on
  the same rows already laid out as ``[64, 32]``, from the memory already
  gathered at the slice starts, with the attention mask and the position
  indices precomputed, its attention ``scaled_dot_product_attention`` with
  the float mask (position bias + mask) of each layer. A second ratio takes
  as the reference the module's own layers on the rows laid out beforehand:
  what the module's layout work costs (finding the slices, gathering the
  memory, building the mask) apart from how it writes the attention.
* **collected batch** (forward + backward): a ``[16, 64]`` batch as a
  collector returns it, whose 51-step episodes (CountRecallEasy's) end
  inside the rows, with the memory stored at every row (empty at the
  episode starts): the module, which runs each row as one slice with its
  episodes kept apart by the mask, over the same module made to run every
  slice apart, padded to the longest.
* **collection step** (no gradients): one step of a batch of 16 envs through
  the module, over the same step through an :class:`~torchrl.modules.LSTMModule`
  of the same width.
* **buffer bytes per step**: CartPole steps collected by a policy on the
  module, written to a :class:`~torchrl.data.LazyTensorStorage` as the
  collector returns them, and written with the memory entries dropped by an
  inverse :class:`~torchrl.envs.ExcludeTransform` on the buffer (the module
  then starts each sampled slice from an empty memory, warmed up by burn-in).
  Bytes are counted, not timed.

GTrXLModule exists on the fork only: both sides of each ratio run in this
process, timed alternately, 1 torch thread, medians of ``--repeat`` calls;
the median ratio of ``--rounds`` independent rounds is printed.
"""
from __future__ import annotations

import argparse
import math
import statistics

import _harness
import torch
import torch.nn.functional as F
from tensordict import TensorDict
from tensordict.nn import TensorDictModule, TensorDictSequential

from torchrl.collectors import Collector
from torchrl.data import LazyTensorStorage, ReplayBuffer
from torchrl.envs import ExcludeTransform, GymEnv
from torchrl.modules import GTrXLModule, LSTMModule, set_recurrent_mode

NUM_SLICES = 64
STEPS = 32
INPUT_SIZE = 16
EMBED_DIM = 64
NUM_LAYERS = 2
NUM_HEADS = 4
MEMORY_LEN = 32
NUM_ENVS = 16
ROW_STEPS = 64
EPISODE = 51


def _module() -> GTrXLModule:
    torch.manual_seed(0)
    return GTrXLModule(
        INPUT_SIZE,
        EMBED_DIM,
        num_layers=NUM_LAYERS,
        num_heads=NUM_HEADS,
        memory_len=MEMORY_LEN,
        in_key="obs",
        out_key="out",
    )


def _sample() -> TensorDict:
    """A flat sample of equal slices, with a full stored memory at every row."""
    numel = NUM_SLICES * STEPS
    is_init = torch.zeros(numel, 1, dtype=torch.bool)
    is_init[::STEPS] = True
    shape = (numel, NUM_LAYERS, MEMORY_LEN, EMBED_DIM)
    return TensorDict(
        {
            "obs": torch.randn(numel, INPUT_SIZE),
            "is_init": is_init,
            "recurrent_state_memory": torch.randn(shape),
            "recurrent_state_memory_count": torch.full((numel, 1), MEMORY_LEN),
        },
        [numel],
    )


def _collected_batch() -> TensorDict:
    """A ``[NUM_ENVS, ROW_STEPS]`` batch whose episodes end inside the rows."""
    generator = torch.Generator().manual_seed(0)
    phase = torch.randint(0, EPISODE, (NUM_ENVS, 1), generator=generator)
    is_init = ((torch.arange(ROW_STEPS) + phase) % EPISODE == 0).unsqueeze(-1)
    shape = (NUM_ENVS, ROW_STEPS, NUM_LAYERS, MEMORY_LEN, EMBED_DIM)
    return TensorDict(
        {
            "obs": torch.randn(NUM_ENVS, ROW_STEPS, INPUT_SIZE),
            "is_init": is_init,
            "recurrent_state_memory": torch.randn(shape),
            "recurrent_state_memory_count": torch.where(is_init, 0, MEMORY_LEN),
        },
        [NUM_ENVS, ROW_STEPS],
    )


def _bare(module: GTrXLModule, sample: TensorDict, sdpa: bool):
    """The same math on the rows laid out beforehand, with the mask precomputed.

    ``sdpa``: each layer's attention as ``scaled_dot_product_attention`` with
    the float mask, the rest of the layer as the module's; else the module's
    layers as they are.
    """
    value = sample["obs"].view(NUM_SLICES, STEPS, INPUT_SIZE)
    memory = sample["recurrent_state_memory"][::STEPS]
    time_ = torch.arange(STEPS)
    positions = torch.arange(MEMORY_LEN + STEPS) - MEMORY_LEN
    distance = time_.unsqueeze(1) - positions  # [steps, keys]
    allowed = (distance >= 0) & (distance <= MEMORY_LEN)
    mask = torch.zeros(allowed.shape).masked_fill(~allowed, -math.inf)
    distance = distance.clamp(0, MEMORY_LEN)

    def sdpa_layer(layer, x, memory):
        heads = layer.num_heads
        normed = layer.norm_attn(torch.cat([memory, x], 1))
        query = layer.query(normed[:, -STEPS:])
        key, value = layer.key_value(normed).chunk(2, -1)

        def split(t):
            return t.unflatten(-1, (heads, EMBED_DIM // heads)).transpose(1, 2)

        attended = F.scaled_dot_product_attention(
            split(query),
            split(key),
            split(value),
            attn_mask=layer.position_bias[:, distance] + mask,
        )
        attended = layer.proj(attended.transpose(1, 2).flatten(-2))
        x = layer.gate_attn(x, F.relu(attended))
        return layer.gate_mlp(x, F.relu(layer.mlp(layer.norm_mlp(x))))

    # the module's layers take the transposed (key-major) layout
    key_distance = distance.t().contiguous()
    key_mask = mask.t().expand(NUM_SLICES, 1, -1, -1)

    def run():
        hidden = module.embed(value)
        for i, layer in enumerate(module.layers):
            if sdpa:
                hidden = sdpa_layer(layer, hidden, memory[:, i])
            else:
                hidden = layer(hidden, memory[:, i], key_distance, key_mask)
        return module.norm_out(hidden)

    return run


def _round(repeat: int) -> dict:
    module = _module()
    sample = _sample()
    bare = _bare(module, sample, sdpa=True)
    layers = _bare(module, sample, sdpa=False)

    def module_forward():
        with set_recurrent_mode(True):
            return module(sample.copy())["out"]

    def backward(fn):
        def wrapped():
            fn().sum().backward()

        return wrapped

    def no_grad(fn):
        def wrapped():
            with torch.no_grad():
                fn()

        return wrapped

    torch.testing.assert_close(module_forward(), bare().flatten(0, 1))
    torch.testing.assert_close(module_forward(), layers().flatten(0, 1))
    row = {
        "fwd+bwd": _harness.alternate(backward(module_forward), backward(bare), repeat),
        "no-grad": _harness.alternate(no_grad(module_forward), no_grad(bare), repeat),
        "layout fwd+bwd": _harness.alternate(
            backward(module_forward), backward(layers), repeat
        ),
    }
    batch = _collected_batch()
    apart = _module()
    apart._rows_as_slices = lambda *args: False

    def on_batch(gtrxl):
        def run():
            with set_recurrent_mode(True):
                return gtrxl(batch.copy())["out"]

        return run

    torch.testing.assert_close(on_batch(module)(), on_batch(apart)())
    row["batch rows vs apart"] = _harness.alternate(
        backward(on_batch(module)), backward(on_batch(apart)), repeat
    )
    lstm = LSTMModule(
        input_size=INPUT_SIZE, hidden_size=EMBED_DIM, in_key="obs", out_key="out"
    )
    step = TensorDict(
        {
            "obs": torch.randn(NUM_ENVS, INPUT_SIZE),
            "is_init": torch.zeros(NUM_ENVS, 1, dtype=torch.bool),
            "recurrent_state_memory": torch.randn(
                NUM_ENVS, NUM_LAYERS, MEMORY_LEN, EMBED_DIM
            ),
            "recurrent_state_memory_count": torch.full((NUM_ENVS, 1), MEMORY_LEN),
            "recurrent_state_h": torch.randn(NUM_ENVS, 1, EMBED_DIM),
            "recurrent_state_c": torch.randn(NUM_ENVS, 1, EMBED_DIM),
        },
        [NUM_ENVS],
    )
    row["step vs LSTM"] = _harness.alternate(
        no_grad(lambda: module(step.copy())),
        no_grad(lambda: lstm(step.copy())),
        repeat * 10,
    )
    return row


def _buffer_bytes(frames: int = 256) -> dict:
    """Bytes per stored step of collected CartPole data, with and without the memory."""
    module = GTrXLModule(
        4,
        EMBED_DIM,
        num_layers=NUM_LAYERS,
        num_heads=NUM_HEADS,
        memory_len=MEMORY_LEN,
        in_key="observation",
        out_key="embed",
    )
    policy = TensorDictSequential(
        module,
        TensorDictModule(
            lambda embed: torch.nn.functional.one_hot(embed[..., :2].argmax(-1), 2),
            in_keys=["embed"],
            out_keys=["action"],
        ),
    )
    collector = Collector(
        GymEnv("CartPole-v1", policy=policy),
        policy,
        frames_per_batch=frames,
        total_frames=frames,
    )
    (batch,) = list(collector)
    collector.shutdown()
    result = {}
    for name, transform in (
        ("with memory", None),
        ("without memory", ExcludeTransform(*module.memory_keys)),
    ):
        buffer = ReplayBuffer(storage=LazyTensorStorage(frames))
        if transform is not None:
            buffer.append_transform(transform, invert=True)
        buffer.extend(batch)
        stored = buffer.storage[:]
        result[name] = stored.bytes() / stored.numel()
    return result


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--repeat", type=int, default=15, help="calls timed per ratio")
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="independent rounds; the median is printed",
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    rounds = [_round(args.repeat) for _ in range(args.rounds)]
    result = {col: statistics.median(r[col] for r in rounds) for col in rounds[0]}
    print(
        f"GTrXLModule ({NUM_LAYERS} layers, embed {EMBED_DIM}, {NUM_HEADS} heads, "
        f"memory {MEMORY_LEN}; {NUM_SLICES} slices x {STEPS} steps; a step of "
        f"{NUM_ENVS} envs): median time ratio over {args.rounds} rounds"
    )
    print(
        "recurrent mode / bare masked attention (scaled_dot_product_attention): "
        + ", ".join(f"{col} {result[col]:.3f}" for col in ("fwd+bwd", "no-grad"))
    )
    print(
        "recurrent mode / its own layers on the rows laid out beforehand: "
        f"fwd+bwd {result['layout fwd+bwd']:.3f}"
    )
    print(
        f"collected [{NUM_ENVS}, {ROW_STEPS}] batch, {EPISODE}-step episodes, "
        f"rows as slices / slices apart: fwd+bwd {result['batch rows vs apart']:.3f}"
    )
    print(f"collection step / LSTMModule step: {result['step vs LSTM']:.3f}")
    sizes = _buffer_bytes()
    result.update(sizes)
    print(
        "buffer bytes per CartPole step: "
        + ", ".join(f"{name} {size:,.0f}" for name, size in sizes.items())
        + f" (ratio {sizes['with memory'] / sizes['without memory']:.0f}x)"
    )
    return result


if __name__ == "__main__":
    main()

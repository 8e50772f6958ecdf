# Copyright (c) Meta Platforms, Inc. and affiliates.
#
# This source code is licensed under the MIT license found in the
# LICENSE file in the root directory of this source tree.
""":class:`~torchrl.modules.GTrXLModule`: step-by-step collection and recurrent mode on slices.

The reference is always the module's own step mode: a CartPole collector
(whose outputs and stored memory are what a replay buffer holds) or the
module called one step at a time from the memory stored at a slice's first
row, with gradients through the rolled memory.
"""
from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule, TensorDictSequential

from torchrl.collectors import Collector
from torchrl.data import (
    LazyTensorStorage,
    PrioritizedSliceSampler,
    SliceSampler,
    TensorDictReplayBuffer,
)
from torchrl.envs import ExcludeTransform, GymEnv, InitTracker, TensorDictPrimer
from torchrl.modules import (
    get_env_transforms_from_module,
    GTrXLModule,
    MLP,
    OneHotCategorical,
    ProbabilisticActor,
    set_recurrent_mode,
)
from torchrl.objectives.value._next_step import _forward_shifted

MEMORY = "recurrent_state_memory"
COUNT = "recurrent_state_memory_count"
BURN_IN = ("collector", "burn_in")
MASK = ("collector", "mask")
ATOL = 1e-5


def _gtrxl(num_layers=2, memory_len=4, input_size=4, seed=0) -> GTrXLModule:
    torch.manual_seed(seed)
    return GTrXLModule(
        input_size,
        8,
        num_layers=num_layers,
        num_heads=2,
        memory_len=memory_len,
        in_key="observation",
        out_key="embed",
    )


def _policy(gtrxl: GTrXLModule) -> ProbabilisticActor:
    head = TensorDictModule(
        MLP(in_features=gtrxl.embed_dim, out_features=2, num_cells=[8]),
        in_keys=["embed"],
        out_keys=["logits"],
    )
    return ProbabilisticActor(
        TensorDictSequential(gtrxl, head),
        in_keys=["logits"],
        out_keys=["action"],
        distribution_class=OneHotCategorical,
    )


def _collect(gtrxl, frames_per_batch=64, batches=1, num_envs=None):
    """Batches collected on CartPole by a policy on ``gtrxl``; the env completed by the collector."""
    if num_envs is None:
        env = GymEnv("CartPole-v1")
    else:
        env = GymEnv("CartPole-v1", num_envs=num_envs)
    env.set_seed(0)
    collector = Collector(
        env,
        _policy(gtrxl),
        frames_per_batch=frames_per_batch,
        total_frames=frames_per_batch * batches,
        auto_register_policy_transforms=True,
    )
    try:
        return list(collector)
    finally:
        collector.shutdown()


def _buffer(data, sampler, batch_size):
    buffer = TensorDictReplayBuffer(
        storage=LazyTensorStorage(data.numel(), ndim=data.ndim),
        sampler=sampler,
        batch_size=batch_size,
    )
    buffer.extend(data)
    return buffer


def _buffer_without_memory(data, sampler, batch_size):
    """A buffer of ``data`` that drops the memory entries as it writes them."""
    buffer = TensorDictReplayBuffer(
        storage=LazyTensorStorage(data.numel()), sampler=sampler, batch_size=batch_size
    )
    buffer.append_transform(ExcludeTransform(*_gtrxl().memory_keys), invert=True)
    buffer.extend(data)
    return buffer


def _recurrent(gtrxl, data):
    with set_recurrent_mode(True):
        return gtrxl(data.clone())["embed"]


def _step_by_step(gtrxl, data):
    """Each slice of flat ``data`` run one step at a time from the memory stored at its first row.

    Returns the outputs (with gradients through the rolled memory).
    """
    outputs = []
    memory = count = None
    for t in range(data.shape[0]):
        row = data[t]
        if t == 0 or bool(row["is_init"]):
            memory, count = row[MEMORY], row[COUNT]
        step = TensorDict(
            {
                "observation": row["observation"],
                "is_init": torch.zeros(1, dtype=torch.bool),
                MEMORY: memory,
                COUNT: count,
            },
            [],
        )
        gtrxl(step)
        outputs.append(step["embed"])
        memory, count = step["next", MEMORY], step["next", COUNT]
    return torch.stack(outputs)


class TestCollection:
    def test_env_completion(self):
        gtrxl = _gtrxl()
        transforms = get_env_transforms_from_module(_policy(gtrxl))
        assert isinstance(transforms[0], InitTracker)
        primer = transforms[1]
        assert isinstance(primer, TensorDictPrimer)
        env = GymEnv("CartPole-v1", policy=_policy(gtrxl))
        spec = env.observation_spec
        assert spec[MEMORY].shape == (2, 4, 8)
        assert spec[COUNT].dtype == torch.int64
        rollout = env.rollout(30, _policy(gtrxl), break_when_any_done=False)
        assert rollout[MEMORY].shape == (30, 2, 4, 8)

    def test_memory_rolls_and_empties_at_episode_starts(self):
        (batch,) = _collect(_gtrxl(), frames_per_batch=200)
        is_init = batch["is_init"].squeeze(-1)
        assert is_init[1:].any(), "the batch should hold an episode start"
        count = batch[COUNT].squeeze(-1)
        # 0 at every episode start, then one more per step up to memory_len
        assert (count[is_init] == 0).all()
        expected = torch.zeros_like(count)
        for t in range(1, count.numel()):
            expected[t] = 0 if is_init[t] else min(int(expected[t - 1]) + 1, 4)
        assert torch.equal(count, expected)
        # the stored memory is the previous step's rolled memory
        cont = ~is_init[1:]
        assert torch.equal(batch[MEMORY][1:][cont], batch["next", MEMORY][:-1][cont])
        # the newest entry of layer 0 is the previous step's embedded input
        gtrxl = _gtrxl()
        embedded = gtrxl.embed(batch["observation"]).detach()
        newest = batch["next", MEMORY][:, 0, -1]
        torch.testing.assert_close(newest, embedded, atol=ATOL, rtol=0)

    def test_memory_carried_across_batches(self):
        first, second = _collect(_gtrxl(), frames_per_batch=50, batches=2)
        if not bool(second["is_init"][0]):
            assert torch.equal(second[MEMORY][0], first["next", MEMORY][-1])
        # the two batches run as one recurrent-mode sequence give what was collected
        both = torch.cat([first, second], 0)
        out = _recurrent(_gtrxl(), both.exclude("embed"))
        torch.testing.assert_close(out, both["embed"], atol=ATOL, rtol=0)

    @pytest.mark.parametrize("num_layers", [1, 2])
    def test_recurrent_mode_on_the_collected_batch(self, num_layers):
        """``[envs, T]`` batches: every row starts from its stored memory; resets inside rows."""
        gtrxl = _gtrxl(num_layers)
        (batch,) = _collect(gtrxl, frames_per_batch=120, num_envs=3)
        assert batch.shape == (3, 40)
        assert batch["is_init"][:, 1:].any()
        out = _recurrent(gtrxl, batch.exclude("embed"))
        torch.testing.assert_close(out, batch["embed"], atol=ATOL, rtol=0)


@pytest.fixture(scope="module")
def data():
    """400 CartPole steps collected with the memory of ``_gtrxl(2)``."""
    (batch,) = _collect(_gtrxl(2), frames_per_batch=400)
    return batch


class TestSlices:
    @pytest.mark.parametrize("num_layers", [1, 2])
    @pytest.mark.parametrize("strict_length", [True, False])
    def test_slice_sample_equals_collection(self, data, num_layers, strict_length):
        if num_layers == 1:
            (data,) = _collect(_gtrxl(1), frames_per_batch=400)
        sampler = SliceSampler(slice_len=12, strict_length=strict_length)
        sample = _buffer(data, sampler, 96).sample()
        assert sample["is_init"].sum() >= 8  # every slice start is marked
        out = _recurrent(_gtrxl(num_layers), sample.exclude("embed"))
        torch.testing.assert_close(out, sample["embed"], atol=ATOL, rtol=0)

    def test_padding_is_never_attended(self, data):
        sampler = SliceSampler(slice_len=16, strict_length=False, pad_output=True)
        sample = _buffer(data, sampler, 128).sample()
        mask = sample[MASK]
        assert not mask.all(), "the sample should hold padding"
        garbage = sample.exclude("embed")
        garbage["observation"][~mask] = 1e30
        garbage[MEMORY][~mask] = float("nan")
        out = _recurrent(_gtrxl(), garbage)
        torch.testing.assert_close(out[mask], sample["embed"][mask], atol=ATOL, rtol=0)

    def test_prioritized_sample(self, data):
        sampler = PrioritizedSliceSampler(
            max_capacity=data.numel(), alpha=0.7, beta=0.9, slice_len=8
        )
        sample = _buffer(data, sampler, 64).sample()
        out = _recurrent(_gtrxl(), sample.exclude("embed"))
        torch.testing.assert_close(out, sample["embed"], atol=ATOL, rtol=0)

    def test_burn_in(self, data):
        sampler = SliceSampler(slice_len=8, burn_in=4, strict_length=False)
        sample = _buffer(data, sampler, 64).sample()
        burn = sample[BURN_IN]
        assert burn.any()
        inputs = sample.exclude("embed")
        inputs["observation"].requires_grad_(True)
        out = _recurrent(_gtrxl(), inputs)
        # burn-in changes no value ...
        torch.testing.assert_close(out, sample["embed"], atol=ATOL, rtol=0)
        # ... and passes no gradient: the burn-in rows are memory for the others
        out[~burn].sum().backward()
        grad = inputs["observation"].grad
        assert (grad[burn] == 0).all()
        assert (grad[~burn] != 0).any()
        plain = sample.exclude("embed", BURN_IN, MASK)
        plain["observation"].requires_grad_(True)
        _recurrent(_gtrxl(), plain)[~burn].sum().backward()
        assert (plain["observation"].grad[burn] != 0).any()

    def test_without_stored_memory(self, data):
        """No memory in the buffer: slices that start an episode are exact; others start empty."""
        sampler = SliceSampler(slice_len=8, burn_in=4, strict_length=False)
        # The memory entries are dropped as the buffer writes, as the docs show.
        buffer = _buffer_without_memory(data, sampler, 64)
        stored = buffer.storage[:].keys(True, True)
        assert MEMORY not in stored and ("next", MEMORY) not in stored
        sample = buffer.sample()
        assert MEMORY not in sample.keys()
        out = _recurrent(_gtrxl(), sample.exclude("embed"))
        starts = sample["is_init"].squeeze(-1).nonzero().squeeze(-1).tolist()
        ends = starts[1:] + [sample.shape[0]]
        episode_starts = data["is_init"].squeeze(-1)
        index = sample["index"]
        checked = 0
        for start, end in zip(starts, ends):
            if bool(episode_starts[index[start]]):
                torch.testing.assert_close(
                    out[start:end], sample["embed"][start:end], atol=ATOL, rtol=0
                )
                checked += 1
        assert checked

    def test_burn_in_over_the_receptive_field_is_exact(self, data):
        """No stored memory, a burn-in of ``num_layers * memory_len`` steps: every training row is exact."""
        gtrxl = _gtrxl(num_layers=2, memory_len=4)
        sampler = SliceSampler(slice_len=6, burn_in=8, strict_length=False)
        buffer = _buffer_without_memory(data, sampler, 60)
        sample = buffer.sample()
        burn = sample[BURN_IN].squeeze(-1)
        # some slices have the whole burn-in, so the memory is rebuilt, not empty
        assert burn.sum() > 8
        out = _recurrent(gtrxl, sample.exclude("embed"))
        torch.testing.assert_close(
            out[~burn], sample["embed"][~burn], atol=ATOL, rtol=0
        )
        # one burn-in step fewer than the receptive field is not exact
        short = SliceSampler(slice_len=6, burn_in=7, strict_length=False)
        buffer = _buffer_without_memory(data, short, 60)
        torch.manual_seed(1)
        inexact = 0
        for _ in range(5):  # some sample holds a slice that needs the 8th step
            sample = buffer.sample()
            burn = sample[BURN_IN].squeeze(-1)
            out = _recurrent(gtrxl, sample.exclude("embed"))
            inexact += not torch.allclose(out[~burn], sample["embed"][~burn], atol=ATOL)
        assert inexact

    def test_gradients_equal_the_per_slice_reference(self, data):
        sampler = SliceSampler(slice_len=10, strict_length=False)
        sample = _buffer(data, sampler, 60).sample().exclude("embed")
        weights = torch.randn(sample.shape[0], 8)
        gtrxl = _gtrxl()
        (_recurrent(gtrxl, sample) * weights).sum().backward()
        grads = [p.grad.clone() for p in gtrxl.parameters()]
        reference = _gtrxl()
        starts = sample["is_init"].squeeze(-1).nonzero().squeeze(-1).tolist()
        total = 0
        for start, end in zip(starts, starts[1:] + [sample.shape[0]]):
            out = _step_by_step(reference, sample[start:end])
            total = total + (out * weights[start:end]).sum()
        total.backward()
        for (name, p), g in zip(reference.named_parameters(), grads):
            torch.testing.assert_close(g, p.grad, atol=1e-5, rtol=1e-4, msg=name)


@pytest.fixture(scope="module")
def batch():
    """The second ``[4, 60]`` CartPole batch collected with ``_gtrxl(memory_len=64)``.

    The window spans a row: a slice that starts inside a row would reach the
    memory stored at the row's start, and the steps of the slices before it.
    """
    _, batch = _collect(
        _gtrxl(memory_len=64), frames_per_batch=240, batches=2, num_envs=4
    )
    assert batch["is_init"][:, 1:].sum() >= 4, "the rows should hold episode ends"
    assert (batch[COUNT][:, 0] > 0).any(), "some row should start with memory"
    return batch


class TestRowsAsSlices:
    """A ``[envs, T]`` batch whose episodes end inside its rows runs a row as one masked slice.

    The result must be that of running every slice apart (the layout the
    module falls back to), and of collection.
    """

    @staticmethod
    def _run(data, rows_as_slices: bool, monkeypatch):
        """The output and the gradients of ``_gtrxl(memory_len=64)``; whether the rows ran as slices."""
        gtrxl = _gtrxl(memory_len=64)
        segments = []
        attend = gtrxl._attend

        def spy(*args, segment=None, **kwargs):
            segments.append(segment)
            return attend(*args, segment=segment, **kwargs)

        monkeypatch.setattr(gtrxl, "_attend", spy)
        if not rows_as_slices:
            monkeypatch.setattr(gtrxl, "_rows_as_slices", lambda *args: False)
        weights = torch.randn(
            *data.shape, 8, generator=torch.Generator().manual_seed(0)
        )
        out = _recurrent(gtrxl, data)
        (out * weights).sum().backward()
        return out, [p.grad for p in gtrxl.parameters()], segments[0] is not None

    def test_equals_the_slices_run_apart(self, batch, monkeypatch):
        data = batch.exclude("embed")
        out, grads, as_rows = self._run(data, True, monkeypatch)
        assert as_rows, "a batch of a few long rows should run them as slices"
        torch.testing.assert_close(out, batch["embed"], atol=ATOL, rtol=0)
        apart, apart_grads, as_rows = self._run(data, False, monkeypatch)
        assert not as_rows
        torch.testing.assert_close(out, apart, atol=ATOL, rtol=0)
        for grad, apart_grad in zip(grads, apart_grads):
            torch.testing.assert_close(grad, apart_grad, atol=1e-5, rtol=1e-4)

    def test_padding(self, batch, monkeypatch):
        data = batch.exclude("embed").clone()
        mask = torch.ones(batch.shape, dtype=torch.bool)
        mask[1, -15:] = mask[3, -7:] = False
        data[MASK] = mask
        data["observation"][~mask] = 1e30
        data[MEMORY][~mask] = float("nan")
        out, _, as_rows = self._run(data, True, monkeypatch)
        assert as_rows
        torch.testing.assert_close(out[mask], batch["embed"][mask], atol=ATOL, rtol=0)

    def test_stored_memory_inside_a_row_runs_apart(self, batch, monkeypatch):
        """A slice start inside a row that is no episode start (as a slice sampler marks them)."""
        data = batch.exclude("embed").clone()
        is_init = data["is_init"].clone()
        row, step = 0, 30
        assert not is_init[row, step] and data[COUNT][row, step] > 0
        is_init[row, step] = True
        data["is_init"] = is_init
        out, _, as_rows = self._run(data, True, monkeypatch)
        # its stored memory is attended: the same outputs as collection
        assert not as_rows
        torch.testing.assert_close(out, batch["embed"], atol=ATOL, rtol=0)


def test_next_step_pass():
    """The bootstrap pass gives, at row t, the output collection gave at step t + 1."""
    gtrxl = _gtrxl()
    (batch,) = _collect(gtrxl, frames_per_batch=120, num_envs=3)
    data = batch.exclude("embed")
    with set_recurrent_mode(True):
        current, following = _forward_shifted(gtrxl, data)
    torch.testing.assert_close(current["embed"], batch["embed"], atol=ATOL, rtol=0)
    same = ~batch["next", "done"].squeeze(-1)[:, :-1]
    torch.testing.assert_close(
        following["embed"][:, :-1][same], batch["embed"][:, 1:][same], atol=ATOL, rtol=0
    )


def test_state_dict_round_trip():
    (batch,) = _collect(_gtrxl(), frames_per_batch=40)
    copy = _gtrxl(seed=1)
    assert not torch.allclose(_recurrent(copy, batch), batch["embed"])
    copy.load_state_dict(_gtrxl().state_dict())
    torch.testing.assert_close(
        _recurrent(copy, batch), batch["embed"], atol=ATOL, rtol=0
    )


def test_trains_after_an_inference_mode_call():
    """A call in inference mode (an evaluation) leaves nothing that a training call cannot backpropagate through."""
    gtrxl = _gtrxl()
    (batch,) = _collect(gtrxl, frames_per_batch=40)
    with torch.inference_mode():
        _recurrent(gtrxl, batch)
    _recurrent(gtrxl, batch).sum().backward()
    fresh = _gtrxl()
    _recurrent(fresh, batch).sum().backward()
    for param, reference in zip(gtrxl.parameters(), fresh.parameters()):
        torch.testing.assert_close(param.grad, reference.grad)


class TestBadInput:
    def test_heads_must_divide_embed_dim(self):
        with pytest.raises(ValueError, match="embed_dim.*divisible by num_heads"):
            GTrXLModule(3, 10, num_heads=4, in_key="x", out_key="y")

    @pytest.mark.parametrize("memory_len", [0, -1])
    def test_memory_len(self, memory_len):
        with pytest.raises(ValueError, match="memory_len must be an integer >= 1"):
            GTrXLModule(3, 8, memory_len=memory_len, in_key="x", out_key="y")

    def test_keys(self):
        with pytest.raises(ValueError, match="exactly one of in_key and in_keys"):
            GTrXLModule(3, 8, out_key="y")
        with pytest.raises(ValueError, match="3 in_keys"):
            GTrXLModule(3, 8, in_keys=["x"], out_key="y")

    def test_wrong_input_size(self):
        data = TensorDict(
            {"observation": torch.randn(5, 3), "is_init": torch.ones(5, 1, dtype=bool)},
            [5],
        )
        with pytest.raises(
            ValueError, match="'observation' has 3 features.*input_size=4"
        ):
            _gtrxl()(data)

    def test_recurrent_mode_without_is_init(self):
        data = TensorDict({"observation": torch.randn(5, 4)}, [5])
        with pytest.raises(
            KeyError, match="recurrent mode on slices that start at 'is_init'"
        ):
            _recurrent(_gtrxl(), data)

    def test_stored_memory_of_the_wrong_shape(self):
        data = TensorDict(
            {
                "observation": torch.randn(5, 4),
                "is_init": torch.ones(5, 1, dtype=bool),
                MEMORY: torch.zeros(5, 2, 6, 8),
                COUNT: torch.zeros(5, 1, dtype=torch.long),
            },
            [5],
        )
        with pytest.raises(ValueError, match=r"expected \[\*batch, 2, 4, 8\]"):
            _recurrent(_gtrxl(), data)
        with pytest.raises(ValueError, match="only one of the memory entries"):
            _recurrent(_gtrxl(), data.exclude(COUNT))

    def test_burn_in_rows_must_start_their_slice(self):
        is_init = torch.zeros(6, 1, dtype=torch.bool)
        is_init[0] = True
        data = TensorDict(
            {
                "observation": torch.randn(6, 4),
                "is_init": is_init,
                BURN_IN: torch.tensor([False, False, True, False, False, False]),
            },
            [6],
        )
        with pytest.raises(ValueError, match="burn-in rows .* must be the first rows"):
            _recurrent(_gtrxl(), data)

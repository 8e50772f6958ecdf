# Copyright (c) Meta Platforms, Inc. and affiliates.
#
# This source code is licensed under the MIT license found in the
# LICENSE file in the root directory of this source tree.
"""SliceSampler picks its trajectory key from the storage schema."""
from __future__ import annotations

import pickle
import warnings

import pytest
import torch

import torchrl._utils
from _slice_sampler_cases import (
    make_sampler,
    make_storage,
    SAMPLERS,
    STORAGES as ALL_STORAGES,
)
from tensordict import TensorDict
from torchrl.data import (
    LazyTensorStorage,
    ListStorage,
    SliceSampler,
    TensorDictReplayBuffer,
)

COLLECTOR_KEY = ("collector", "traj_ids")
SLICE_LEN = 4
CAPACITY = 200


def _data(*, collector=True, episode=True, done=True):
    """Four collector trajectories of 10 steps; ``episode`` groups them by pairs.

    Slicing by ``"episode"`` or without any key can thus cross a collector
    trajectory boundary, slicing by ``("collector", "traj_ids")`` cannot.
    """
    n = 40
    traj = torch.arange(n) // 10
    fields = {"obs": torch.arange(n)}
    if collector:
        fields[COLLECTOR_KEY] = traj
    if episode:
        fields["episode"] = traj // 2
    if done:
        d = torch.zeros(n, 1, dtype=torch.bool)
        d[19] = d[39] = True
        fields[("next", "done")] = d
    return TensorDict(fields, [n])


def _buffer(storage, sampler, data):
    rb = TensorDictReplayBuffer(
        storage=storage, sampler=sampler, batch_size=SLICE_LEN * 25
    )
    rb.extend(data)
    return rb


def _slices_groups(sample, period):
    """The group (``obs // period``) of each slice, or ``None`` if a slice mixes groups."""
    groups = (sample["obs"] // period).view(-1, SLICE_LEN)
    return (groups == groups[:, :1]).all().item()


STORAGES = [kind for kind in ALL_STORAGES if kind != "tensor2d"]


@pytest.mark.parametrize("kind", STORAGES)
@pytest.mark.parametrize("cls", SAMPLERS)
class TestAutoDetection:
    def test_collector_key_wins_with_warning(self, kind, cls, tmp_path):
        sampler = make_sampler(cls, CAPACITY, slice_len=SLICE_LEN)
        rb = _buffer(make_storage(kind, tmp_path, CAPACITY), sampler, _data())
        with pytest.warns(FutureWarning, match="collector.*traj_ids.*episode") as rec:
            sample = rb.sample()
        # the warning points at the user's line, not into torchrl
        assert rec[0].filename == __file__
        assert "traj_key=" in str(rec[0].message)
        assert sampler.traj_key == COLLECTOR_KEY
        # slices stay inside the 10-step collector trajectories
        assert _slices_groups(sample, 10)
        # the choice is made once: no second warning
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            for _ in range(5):
                assert _slices_groups(rb.sample(), 10)

    def test_collector_key_alone_no_warning(self, kind, cls, tmp_path):
        sampler = make_sampler(cls, CAPACITY, slice_len=SLICE_LEN)
        rb = _buffer(
            make_storage(kind, tmp_path, CAPACITY), sampler, _data(episode=False)
        )
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            for _ in range(5):
                assert _slices_groups(rb.sample(), 10)
        assert sampler.traj_key == COLLECTOR_KEY

    def test_episode_alone(self, kind, cls, tmp_path):
        sampler = make_sampler(cls, CAPACITY, slice_len=SLICE_LEN)
        rb = _buffer(
            make_storage(kind, tmp_path, CAPACITY),
            sampler,
            _data(collector=False, done=False),
        )
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            rb.sample()
        assert sampler.traj_key == "episode"
        assert "traj_key=episode" in repr(sampler)

    def test_no_traj_key_uses_end_key(self, kind, cls, tmp_path):
        sampler = make_sampler(cls, CAPACITY, slice_len=SLICE_LEN)
        rb = _buffer(
            make_storage(kind, tmp_path, CAPACITY),
            sampler,
            _data(collector=False, episode=False),
        )
        for _ in range(5):
            # done at steps 19 and 39: slices stay in [0, 20) or [20, 40)
            assert _slices_groups(rb.sample(), 20)
        assert not sampler._fetch_traj
        assert "rebuilt from end_key" in repr(sampler)


@pytest.mark.parametrize("kind", STORAGES)
class TestExplicitKeys:
    def test_explicit_traj_key_no_warning(self, kind, tmp_path):
        sampler = SliceSampler(slice_len=SLICE_LEN, traj_key="episode")
        rb = _buffer(make_storage(kind, tmp_path, CAPACITY), sampler, _data())
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            samples = [rb.sample() for _ in range(20)]
        assert sampler.traj_key == "episode"
        # episodes span 20 steps: some slice crosses a collector trajectory
        assert all(_slices_groups(s, 20) for s in samples)
        assert not all(_slices_groups(s, 10) for s in samples)

    def test_explicit_end_key(self, kind, tmp_path):
        sampler = SliceSampler(slice_len=SLICE_LEN, end_key=("next", "done"))
        rb = _buffer(make_storage(kind, tmp_path, CAPACITY), sampler, _data())
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            samples = [rb.sample() for _ in range(20)]
        assert sampler.traj_key == "episode"
        assert not sampler._fetch_traj
        assert all(_slices_groups(s, 20) for s in samples)
        assert not all(_slices_groups(s, 10) for s in samples)


class TestWarning:
    def _sample_both_keys(self, tmp_path):
        sampler = SliceSampler(slice_len=SLICE_LEN)
        rb = _buffer(make_storage("tensor", tmp_path, CAPACITY), sampler, _data())
        rb.sample()
        return sampler

    def test_public_class(self, tmp_path):
        from torchrl.data import TrajectoryKeyFutureWarning
        from torchrl.data.replay_buffers import (
            TrajectoryKeyFutureWarning as FromReplayBuffers,
        )

        assert FromReplayBuffers is TrajectoryKeyFutureWarning
        assert issubclass(TrajectoryKeyFutureWarning, FutureWarning)
        with pytest.warns(TrajectoryKeyFutureWarning) as rec:
            self._sample_both_keys(tmp_path)
        assert len(rec) == 1
        # filtering the class silences it
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            warnings.simplefilter("ignore", TrajectoryKeyFutureWarning)
            self._sample_both_keys(tmp_path)

    def test_text_names_the_release_and_is_short(self, tmp_path):
        with pytest.warns(FutureWarning) as rec:
            self._sample_both_keys(tmp_path)
        text = str(rec[0].message)
        # what happened, since when, what to do
        assert "both" in text and "v0.13" in text and "traj_key=" in text
        assert len(text) < 400, len(text)

    def test_respects_rl_warnings(self, tmp_path, monkeypatch):
        monkeypatch.setattr(torchrl._utils, "RL_WARNINGS", False)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            sampler = self._sample_both_keys(tmp_path)
        # the choice does not depend on the warning
        assert sampler.traj_key == COLLECTOR_KEY


@pytest.mark.parametrize("cls", SAMPLERS)
class TestStorageErrors:
    @pytest.mark.parametrize("traj_key", [None, "episode"])
    def test_list_storage_rejected(self, cls, traj_key):
        """A ListStorage returns lists, not a tensordict: same error as upstream."""
        storage = ListStorage(CAPACITY)
        storage.set(range(40), _data(collector=False))
        kwargs = {} if traj_key is None else {"traj_key": traj_key}
        sampler = make_sampler(cls, CAPACITY, slice_len=SLICE_LEN, **kwargs)
        with pytest.raises(
            RuntimeError, match="Could not get a tensordict out of the storage"
        ) as err:
            sampler.sample(storage, batch_size=20)
        # the cause says which storages work
        assert "LazyStackStorage" in str(err.value.__context__)

    def test_list_storage_without_traj_key(self, cls):
        storage = ListStorage(CAPACITY)
        storage.set(range(40), _data(collector=False, episode=False))
        sampler = make_sampler(cls, CAPACITY, slice_len=SLICE_LEN)
        with pytest.raises(
            RuntimeError, match="Could not get a tensordict out of the storage"
        ):
            sampler.sample(storage, batch_size=20)


class TestEmptyStorage:
    @pytest.mark.parametrize("kind", STORAGES)
    def test_empty_first_sample_does_not_lock_in(self, kind, tmp_path):
        sampler = SliceSampler(slice_len=SLICE_LEN)
        rb = TensorDictReplayBuffer(
            storage=make_storage(kind, tmp_path, CAPACITY),
            sampler=sampler,
            batch_size=20,
        )
        with pytest.raises(RuntimeError):
            rb.sample()
        assert "auto-detected at the first sample" in repr(sampler)
        rb.extend(_data(episode=False))
        assert _slices_groups(rb.sample(), 10)
        assert sampler.traj_key == COLLECTOR_KEY
        assert sampler._fetch_traj


class TestPersistence:
    def _resolved(self, cls, tmp_path):
        sampler = make_sampler(cls, CAPACITY, slice_len=SLICE_LEN)
        rb = _buffer(
            make_storage("tensor", tmp_path, CAPACITY), sampler, _data(episode=False)
        )
        rb.sample()
        return sampler

    @pytest.mark.parametrize("cls", SAMPLERS)
    def test_repr_shows_resolved_key(self, cls, tmp_path):
        sampler = make_sampler(cls, CAPACITY, slice_len=SLICE_LEN)
        assert "auto-detected at the first sample" in repr(sampler)
        rb = _buffer(
            make_storage("tensor", tmp_path, CAPACITY), sampler, _data(episode=False)
        )
        rb.sample()
        assert "traj_key=('collector', 'traj_ids') (auto-detected)" in repr(sampler)

    @pytest.mark.parametrize("cls", SAMPLERS)
    def test_state_dict_roundtrip(self, cls, tmp_path):
        sampler = self._resolved(cls, tmp_path)
        state = sampler.state_dict()
        fresh = make_sampler(cls, CAPACITY, slice_len=SLICE_LEN)
        fresh.load_state_dict(state)
        assert fresh.traj_key == COLLECTOR_KEY
        assert "traj_key=('collector', 'traj_ids') (auto-detected)" in repr(fresh)
        # the restored key is used without a new detection (and no warning)
        rb = _buffer(make_storage("tensor", tmp_path, CAPACITY), fresh, _data())
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert _slices_groups(rb.sample(), 10)

    def test_state_dict_of_end_key_choice(self, tmp_path):
        sampler = SliceSampler(slice_len=SLICE_LEN)
        rb = _buffer(
            make_storage("tensor", tmp_path, CAPACITY),
            sampler,
            _data(collector=False, episode=False),
        )
        rb.sample()
        fresh = SliceSampler(slice_len=SLICE_LEN)
        fresh.load_state_dict(sampler.state_dict())
        assert not fresh._fetch_traj
        assert "rebuilt from end_key" in repr(fresh)

    def test_state_dict_ignored_by_explicit_key(self, tmp_path):
        state = self._resolved(SliceSampler, tmp_path).state_dict()
        explicit = SliceSampler(slice_len=SLICE_LEN, traj_key="episode")
        explicit.load_state_dict(state)
        assert explicit.traj_key == "episode"

    def test_load_empty_state_dict(self):
        # state dicts saved before this change are empty
        sampler = SliceSampler(slice_len=SLICE_LEN)
        sampler.load_state_dict({})
        assert "auto-detected at the first sample" in repr(sampler)

    @pytest.mark.parametrize("cls", SAMPLERS)
    def test_pickle(self, cls, tmp_path):
        sampler = self._resolved(cls, tmp_path)
        restored = pickle.loads(pickle.dumps(sampler))
        assert restored.traj_key == COLLECTOR_KEY
        assert repr(restored) == repr(sampler) or "(auto-detected)" in repr(restored)
        rb = _buffer(make_storage("tensor", tmp_path, CAPACITY), restored, _data())
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert _slices_groups(rb.sample(), 10)


class TestCollector:
    def test_cartpole_collector_buffer(self):
        from torchrl.collectors import Collector
        from torchrl.envs import GymEnv, InitTracker, TransformedEnv

        torch.manual_seed(0)
        env = TransformedEnv(GymEnv("CartPole-v1"), InitTracker())
        env.set_seed(0)
        collector = Collector(env, policy=None, frames_per_batch=200, total_frames=200)
        sampler = SliceSampler(slice_len=8, strict_length=False)
        rb = TensorDictReplayBuffer(
            storage=LazyTensorStorage(1000), sampler=sampler, batch_size=64
        )
        for data in collector:
            rb.extend(data)
        collector.shutdown()
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            sample = rb.sample()
        assert sampler.traj_key == COLLECTOR_KEY
        traj = sample[COLLECTOR_KEY]
        truncated = sample["next", "truncated"].squeeze(-1)
        # a slice ends at each truncation marker: trajectory ids only change there
        changes = (traj[1:] != traj[:-1]).nonzero().squeeze(-1)
        assert truncated[changes].all()
        # each slice starts with is_init
        starts = torch.cat([torch.zeros(1, dtype=torch.long), changes + 1])
        assert sample["is_init"].squeeze(-1)[starts].all()

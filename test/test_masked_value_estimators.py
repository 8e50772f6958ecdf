# Copyright (c) Meta Platforms, Inc. and affiliates.
#
# This source code is licensed under the MIT license found in the
# LICENSE file in the root directory of this source tree.
"""Value estimators never let padded steps reach real steps."""
from __future__ import annotations

import pytest
import torch
from _masked_loss_cases import (
    ESTIMATORS,
    make_batch,
    make_estimator,
    make_loss,
    MASK_KEY,
    slice_batches,
    split_trajs_layout,
)
from hypothesis import given, settings, strategies as st

LENGTHS = (3, 5, 2)
PAD_TO = 6


def _check(name, real, padded, **kwargs):
    expected = make_estimator(name, **kwargs)(real.clone())
    got = make_estimator(name, masked=True, **kwargs)(padded.clone())
    mask = padded.get(MASK_KEY)
    for key in ("advantage", "value_target"):
        value = got[key]
        assert value.shape[: mask.ndim] == mask.shape
        assert value.isfinite().all(), key
        torch.testing.assert_close(value[mask], expected[key])


class TestPaddedEstimates:
    @pytest.mark.parametrize("garbage", [None, "zeros", "huge", "random"])
    @pytest.mark.parametrize("name", ESTIMATORS)
    def test_pad_output_layout(self, name, garbage):
        # padded rows after the truncation marker of their slice
        real, padded = slice_batches("ppo", LENGTHS, PAD_TO, garbage=garbage)
        _check(name, real, padded)

    @pytest.mark.parametrize("name", ESTIMATORS)
    def test_split_trajs_layout(self, name):
        # [B, T] with zeros after the real steps and no done marker there
        real, padded = slice_batches("ppo", LENGTHS, PAD_TO, garbage="zeros")
        _check(name, real, split_trajs_layout(padded, LENGTHS))

    @pytest.mark.parametrize("name", ["GAE", "TDLambdaEstimator"])
    def test_not_vectorized(self, name):
        real, padded = slice_batches("ppo", LENGTHS, PAD_TO, garbage="huge")
        _check(name, real, padded, vectorized=False)

    @pytest.mark.parametrize("name", [name for name in ESTIMATORS if name != "VTrace"])
    def test_value_estimate(self, name):
        # VTrace has no value_estimate in 0.12.0
        real, padded = slice_batches("ppo", LENGTHS, PAD_TO, garbage="zeros")
        padded = split_trajs_layout(padded, LENGTHS)
        mask = padded.get(MASK_KEY)
        expected = make_estimator(name).value_estimate(real.clone())
        got = make_estimator(name, masked=True).value_estimate(padded.clone())
        torch.testing.assert_close(got[mask], expected)

    @settings(max_examples=15, deadline=None)
    @given(
        lengths=st.lists(st.integers(1, 6), min_size=1, max_size=4),
        extra=st.integers(0, 3),
        garbage=st.sampled_from([None, "zeros", "huge", "random"]),
        name=st.sampled_from(ESTIMATORS),
        split=st.booleans(),
    )
    def test_any_padding(self, lengths, extra, garbage, name, split):
        real, padded = slice_batches(
            "ppo", lengths, max(lengths) + extra, garbage=garbage
        )
        if split:
            padded = split_trajs_layout(padded, lengths)
        _check(name, real, padded)

    def test_caller_tensordict_gets_results(self):
        _, padded = slice_batches("ppo", LENGTHS, PAD_TO, garbage="random")
        td = padded.clone()
        out = make_estimator("GAE", masked=True)(td)
        assert out is td
        assert "advantage" in td.keys() and "value_target" in td.keys()
        # the input's padded rows are left as they were
        torch.testing.assert_close(td["observation"], padded["observation"])


def _with_stale_values(td):
    # values left by an earlier pass (another network, another epoch): the
    # estimator recomputes and overwrites them
    g = torch.Generator().manual_seed(13)
    td["state_value"] = torch.randn(td.shape + (1,), generator=g) * 10
    td["next", "state_value"] = torch.randn(td.shape + (1,), generator=g) * 10


class TestVTraceTruncation:
    def test_truncated_step_bootstraps_from_next_observation(self):
        # a truncation inside the batch: the advantage of the last step of a
        # slice bootstraps from its own next observation, never from the first
        # step of the next slice (0.12.0 did)
        real, _ = slice_batches("ppo", LENGTHS, PAD_TO)
        estimator = make_estimator("VTrace")
        out = estimator(real.clone())
        value = out["state_value"]
        next_value = out["next", "state_value"]
        log_mu = real["action_log_prob"].unsqueeze(-1)
        log_pi = estimator.actor_network(real.clone()).get("action_log_prob")
        rho = (log_pi.unsqueeze(-1) - log_mu).exp().clamp_max(1.0)
        expected = rho * (real["next", "reward"] + 0.9 * next_value - value)
        ends = torch.tensor(LENGTHS).cumsum(0) - 1
        torch.testing.assert_close(out["advantage"][ends], expected[ends])
        # each slice's advantages are the ones it gets alone
        start = 0
        for length in LENGTHS:
            alone = make_estimator("VTrace")(real[start : start + length].clone())
            torch.testing.assert_close(
                out["advantage"][start : start + length], alone["advantage"]
            )
            start += length

    def test_average_adv_from_real_steps(self):
        real, padded = slice_batches("ppo", LENGTHS, PAD_TO, garbage="random")
        expected = make_estimator("VTrace", average_adv=True)(real.clone())
        got = make_estimator("VTrace", average_adv=True, masked=True)(padded.clone())
        mask = padded.get(MASK_KEY)
        torch.testing.assert_close(got["advantage"][mask], expected["advantage"])


class TestWriteBack:
    @pytest.mark.parametrize("garbage", [None, "random"])
    @pytest.mark.parametrize("name", ESTIMATORS)
    def test_every_written_key_matches_unpadded(self, name, garbage):
        real, padded = slice_batches(
            "ppo", LENGTHS, PAD_TO, garbage=garbage, prepare=_with_stale_values
        )
        expected = make_estimator(name)(real.clone())
        got = make_estimator(name, masked=True)(padded.clone())
        mask = padded.get(MASK_KEY)
        written = [
            key
            for key, value in expected.items(True, True)
            if key not in real.keys(True, True) or not torch.equal(value, real[key])
        ]
        assert "state_value" in written and ("next", "state_value") in written
        for key in written:
            torch.testing.assert_close(got[key][mask], expected[key], msg=str(key))

    def test_clip_value_critic_matches_unpadded(self):
        # ClipPPOLoss clips against the state value the estimator writes
        real, padded = slice_batches(
            "clipppo", LENGTHS, PAD_TO, garbage="random", prepare=_with_stale_values
        )
        torch.manual_seed(3)
        expected = make_loss("clipppo", clip_value=0.1)(real.clone())
        torch.manual_seed(3)
        got = make_loss("clipppo", clip_value=0.1)(padded.clone())
        for key in ("loss_critic", "value_clip_fraction", "loss_objective"):
            torch.testing.assert_close(got[key], expected[key], msg=key)


class TestMaskKey:
    def test_set_keys(self):
        real, padded = slice_batches("ppo", LENGTHS, PAD_TO, garbage="zeros")
        padded = split_trajs_layout(padded, LENGTHS)
        mask = padded.get(MASK_KEY)
        moved = padded.exclude(MASK_KEY).set("valid", mask)
        est = make_estimator("GAE")
        est.set_keys(mask="valid")
        got = est(moved)
        expected = make_estimator("GAE")(real)
        torch.testing.assert_close(got["advantage"][mask], expected["advantage"])

    def test_loss_forwards_its_key(self):
        loss = make_loss("ppo")
        loss.set_keys(mask="valid")
        assert loss.value_estimator.tensor_keys.mask == "valid"

    def test_wrong_shape(self):
        _, padded = slice_batches("ppo", LENGTHS, PAD_TO)
        padded.get("collector").set("mask", torch.ones(18, 2, dtype=torch.bool))
        with pytest.raises(ValueError, match=r"'collector', 'mask'.*\(18, 2\)"):
            make_estimator("GAE", masked=True)(padded)

    @pytest.mark.parametrize("name", ESTIMATORS)
    def test_trailing_singleton_mask(self, name):
        # a [*batch, 1] mask, shaped like the done flags, is the batch mask
        real, padded = slice_batches("ppo", LENGTHS, PAD_TO, garbage="random")
        padded.set(MASK_KEY, padded.get(MASK_KEY).unsqueeze(-1))
        expected = make_estimator(name)(real.clone())
        got = make_estimator(name, masked=True)(padded.clone())
        mask = padded.get(MASK_KEY).squeeze(-1)
        torch.testing.assert_close(got["advantage"][mask], expected["advantage"])

    def test_loss_with_custom_key(self):
        # an estimator built by a loss reads the loss's key, not the default
        real, padded = slice_batches("ppo", LENGTHS, PAD_TO, garbage="zeros")
        padded = split_trajs_layout(padded, LENGTHS)
        mask = padded.get(MASK_KEY)
        # a placeholder at the default key that would raise if it were read
        moved = padded.set("valid", mask).set(MASK_KEY, torch.zeros_like(mask))
        loss = make_loss("ppo")
        loss.set_keys(mask="valid")
        estimator = loss.value_estimator
        assert estimator.tensor_keys.mask == "valid"
        got = estimator(moved.clone())
        expected = estimator(real.clone())
        for key in ("advantage", "value_target"):
            torch.testing.assert_close(got[key][mask], expected[key])

    def test_estimator_given_to_a_loss_follows_its_key(self):
        from torchrl.objectives.value import GAE

        loss = make_loss("ppo")
        loss.set_keys(mask="valid")
        loss.make_value_estimator(
            GAE(gamma=0.9, lmbda=0.8, value_network=loss.critic_network)
        )
        assert loss.value_estimator.tensor_keys.mask == "valid"


def _trajectories(lengths=(3, 7, 2, 9, 5, 6, 8)):
    # stored trajectories, each ending with done (terminated or truncated)
    td = make_batch("ppo", sum(lengths))
    ends = torch.tensor(lengths).cumsum(0) - 1
    td["next", "done"][ends] = True
    td["next", "terminated"][ends[::2]] = True
    td["next", "truncated"][ends[1::2]] = True
    td["collector", "traj_ids"] = torch.repeat_interleave(
        torch.arange(len(lengths)), torch.tensor(lengths)
    )
    return td


def _sampled(storage, tmp_path):
    """A ``pad_output=True`` sample and the same slices sampled unpadded."""
    from torchrl.data import (
        LazyMemmapStorage,
        LazyTensorStorage,
        SliceSampler,
        TensorDictReplayBuffer,
    )

    if storage == "tensor":
        store = LazyTensorStorage(100)
    else:
        store = LazyMemmapStorage(100, scratch_dir=tmp_path)
    padded_rb = TensorDictReplayBuffer(
        storage=store,
        sampler=SliceSampler(num_slices=4, strict_length=False, pad_output=True),
        batch_size=24,
    )
    padded_rb.extend(_trajectories())
    ragged_rb = TensorDictReplayBuffer(
        storage=store,
        sampler=SliceSampler(num_slices=4, strict_length=False),
        batch_size=24,
    )
    torch.manual_seed(5)
    padded = padded_rb.sample()
    torch.manual_seed(5)
    ragged = ragged_rb.sample()
    mask = padded.get(MASK_KEY)
    assert (~mask).any()
    assert ragged.shape[0] == int(mask.sum())
    torch.testing.assert_close(padded["observation"][mask], ragged["observation"])
    return padded, ragged


#: estimators and their options; batch statistics (average_gae, average_adv)
#: mix every step of the batch, padded ones included when the mask is ignored
SAMPLE_CASES = [(name, {}) for name in ESTIMATORS] + [
    ("GAE", {"average_gae": True}),
    ("VTrace", {"average_adv": True}),
]
#: a trajectory cut by the end of the collector batch has no done marker where
#: its real steps end: traces run into the zeros of the padding. TD(0) reads
#: the next row only when it computes the next values by shifting.
SPLIT_CASES = [
    ("TD0Estimator", {"shifted": True}),
    ("TD1Estimator", {}),
    ("TDLambdaEstimator", {}),
    ("GAE", {}),
    ("VTrace", {}),
]


def _case_id(case):
    name, kwargs = case
    return "-".join([name] + sorted(kwargs))


class TestStandAloneReadsTheSamplerMask:
    """A stand-alone estimator honours ``("collector", "mask")`` by default."""

    @pytest.mark.parametrize("name", ESTIMATORS)
    def test_default_key(self, name):
        assert make_estimator(name).tensor_keys.mask == MASK_KEY

    @pytest.mark.parametrize("storage", ["tensor", "memmap"])
    @pytest.mark.parametrize("case", SAMPLE_CASES, ids=_case_id)
    def test_pad_output_sample(self, case, storage, tmp_path):
        name, kwargs = case
        padded, ragged = _sampled(storage, tmp_path)
        mask = padded.get(MASK_KEY)
        got = make_estimator(name, **kwargs)(padded.clone())
        expected = make_estimator(name, **kwargs)(ragged.clone())
        for key in ("advantage", "value_target"):
            assert got[key].isfinite().all(), key
            torch.testing.assert_close(got[key][mask], expected[key], msg=key)

    @pytest.mark.parametrize("case", SPLIT_CASES, ids=_case_id)
    def test_split_trajs_batch(self, case):
        from torchrl.collectors.utils import split_trajectories

        name, kwargs = case
        # a collector batch whose last trajectory goes on in the next batch
        batch = _trajectories()[:-3]
        padded = split_trajectories(batch.clone())
        mask = padded.get(MASK_KEY)
        assert (~mask).any()
        got = make_estimator(name, **kwargs)(padded)
        expected = make_estimator(name, **kwargs)(batch.clone())
        for key in ("advantage", "value_target"):
            torch.testing.assert_close(got[key][mask], expected[key], msg=key)

    @pytest.mark.parametrize("name", ESTIMATORS)
    def test_opt_out(self, name):
        # set_keys(mask=None) reads no mask: the 0.12.0 targets
        _, padded = slice_batches("ppo", LENGTHS, PAD_TO, garbage="random")
        estimator = make_estimator(name)
        estimator.set_keys(mask=None)
        assert estimator.tensor_keys.mask is None
        expected = make_estimator(name)(padded.clone().exclude("collector"))
        all_false = padded.clone().set(MASK_KEY, torch.zeros(18, dtype=torch.bool))
        for td in (padded.clone(), all_false):
            got = estimator(td)
            for key in ("advantage", "value_target"):
                torch.testing.assert_close(got[key], expected[key], rtol=0, atol=0)

    def test_all_padded(self):
        _, padded = slice_batches("ppo", LENGTHS, PAD_TO)
        padded.set(MASK_KEY, torch.zeros(18, dtype=torch.bool))
        with pytest.raises(
            ValueError, match=r"'collector', 'mask'.*False on every row"
        ):
            make_estimator("GAE")(padded)

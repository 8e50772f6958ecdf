# Copyright (c) Meta Platforms, Inc. and affiliates.
#
# This source code is licensed under the MIT license found in the
# LICENSE file in the root directory of this source tree.
"""Value estimators never let padded steps reach real steps (issue 6, item 5)."""
from __future__ import annotations

import pytest
import torch
from _masked_loss_cases import (
    ESTIMATORS,
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
    got = make_estimator(name, **kwargs)(padded.clone())
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

    @pytest.mark.parametrize("name", ESTIMATORS)
    def test_value_estimate(self, name):
        real, padded = slice_batches("ppo", LENGTHS, PAD_TO, garbage="zeros")
        padded = split_trajs_layout(padded, LENGTHS)
        mask = padded.get(MASK_KEY)
        expected = make_estimator(name).value_estimate(real.clone())
        got = make_estimator(name).value_estimate(padded.clone())
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
        out = make_estimator("GAE")(td)
        assert out is td
        assert "advantage" in td.keys() and "value_target" in td.keys()
        # the input's padded rows are left as they were
        torch.testing.assert_close(td["observation"], padded["observation"])


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
        padded.get("collector").set("mask", torch.ones(18, 1, dtype=torch.bool))
        with pytest.raises(ValueError, match=r"'collector', 'mask'.*\(18, 1\)"):
            make_estimator("GAE")(padded)

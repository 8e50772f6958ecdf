# Copyright (c) Meta Platforms, Inc. and affiliates.
#
# This source code is licensed under the MIT license found in the
# LICENSE file in the root directory of this source tree.
"""DreamerModelLoss honours the padding mask of ``[batch, time]`` sequences."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from _masked_dreamer_cases import (
    actor_value_losses_and_grads,
    loss_and_grads,
    make_loss,
    make_sequences,
    MASK_KEY,
    OPTIONS,
    pad,
)

ROOT = Path(__file__).resolve().parents[1]
LENGTHS = (3, 5, 2)
PAD_TO = 6


def _ragged(lengths, options):
    """Each sequence run alone; every term weighted by its number of steps."""
    loss = make_loss(**options)
    total_steps = sum(lengths)
    values, grads = {}, None
    for seq in make_sequences(lengths):
        out, _ = loss(seq.clone())
        weight = seq.shape[1] / total_steps
        keys = sorted(k for k in out.keys() if k.startswith("loss"))
        for key in keys:
            values[key] = values.get(key, 0) + weight * out[key].detach()
        params = [p for p in loss.parameters() if p.requires_grad]
        g = torch.autograd.grad(
            sum(weight * out[k].sum() for k in keys), params, allow_unused=True
        )
        g = [x if x is not None else torch.zeros_like(p) for x, p in zip(g, params)]
        grads = g if grads is None else [a + b for a, b in zip(grads, g)]
    return values, grads


class TestDreamerModelLoss:
    # delayed_clamp clamps the mean over all steps: it is not a per-step
    # average, so its padded batch is checked against the real steps' KL below
    @pytest.mark.parametrize("garbage", [None, "zeros", "huge", "random"])
    @pytest.mark.parametrize(
        "options", [o for o in OPTIONS if "delayed_clamp" not in o]
    )
    def test_padded_equals_sequences_alone(self, options, garbage):
        expected = _ragged(LENGTHS, options)
        padded = pad(make_sequences(LENGTHS), PAD_TO, garbage)
        got = loss_and_grads(make_loss(**options), padded)
        torch.testing.assert_close(got, expected)
        for grad in got[1]:
            assert grad.isfinite().all()

    def test_delayed_clamp(self):
        # the clamp applies to the mean over the real steps
        padded = pad(make_sequences(LENGTHS), PAD_TO, "random")
        loss = make_loss(delayed_clamp=True, free_nats=-1000.0)
        got, _ = loss_and_grads(loss, padded)
        expected, _ = _ragged(LENGTHS, {"free_nats": -1000.0})
        torch.testing.assert_close(got, expected)
        high = make_loss(delayed_clamp=True, free_nats=1000.0)
        got, _ = loss_and_grads(high, padded)
        torch.testing.assert_close(got["loss_model_kl"], torch.tensor([1000.0]))

    def test_padded_content_never_matters(self):
        results = [
            loss_and_grads(make_loss(), pad(make_sequences(LENGTHS), PAD_TO, kind))
            for kind in ("zeros", "huge", "random")
        ]
        for other in results[1:]:
            torch.testing.assert_close(other, results[0])

    def test_without_mask_padded_steps_count(self):
        expected = _ragged(LENGTHS, {})
        padded = pad(make_sequences(LENGTHS), PAD_TO, "random").exclude(MASK_KEY)
        got = loss_and_grads(make_loss(), padded)
        assert any(not torch.allclose(got[0][k], expected[0][k]) for k in expected[0])

    def test_trailing_singleton_mask(self):
        padded = pad(make_sequences(LENGTHS), PAD_TO, "random")
        expected = loss_and_grads(make_loss(), padded)
        padded.set(MASK_KEY, padded.get(MASK_KEY).unsqueeze(-1))
        torch.testing.assert_close(loss_and_grads(make_loss(), padded), expected)

    def test_all_true_mask_is_unmasked(self):
        td = torch.cat(make_sequences((4, 4)), 0)
        expected = loss_and_grads(make_loss(), td)
        td.set(MASK_KEY, torch.ones(td.shape, dtype=torch.bool))
        got = loss_and_grads(make_loss(), td)
        torch.testing.assert_close(got, expected, rtol=0, atol=0)

    def test_all_padded_and_wrong_shape(self):
        padded = pad(make_sequences(LENGTHS), PAD_TO)
        padded.set(MASK_KEY, torch.zeros(padded.shape, dtype=torch.bool))
        with pytest.raises(
            ValueError, match=r"'collector', 'mask'.*False on every row"
        ):
            make_loss()(padded)
        bad = pad(make_sequences(LENGTHS), PAD_TO)
        bad.get("collector").set("mask", torch.ones(3, PAD_TO, 2, dtype=torch.bool))
        with pytest.raises(ValueError, match=r"'collector', 'mask'.*\(3, 6, 2\)"):
            make_loss()(bad)

    def test_set_keys(self):
        padded = pad(make_sequences(LENGTHS), PAD_TO, "random")
        expected = loss_and_grads(make_loss(), padded)
        moved = padded.exclude(MASK_KEY).set("valid", padded.get(MASK_KEY))
        loss = make_loss()
        loss.set_keys(mask="valid")
        torch.testing.assert_close(loss_and_grads(loss, moved), expected)

    def test_output_carries_the_mask(self):
        # the model loss's output feeds the actor loss: it keeps the mask
        padded = pad(make_sequences(LENGTHS), PAD_TO, "random")
        _, out = make_loss()(padded.clone())
        assert torch.equal(out.get(MASK_KEY), padded.get(MASK_KEY))


class TestDreamerActorAndValueLosses:
    """Imagination that starts from padded steps never counts."""

    @pytest.mark.parametrize("discount_loss", [True, False])
    @pytest.mark.parametrize("garbage", [None, "random"])
    def test_padded_equals_sequences_alone(self, discount_loss, garbage):
        total_steps = sum(LENGTHS)
        expected_values, expected_grads = {}, None
        for seq in make_sequences(LENGTHS):
            values, grads = actor_value_losses_and_grads(
                seq, discount_loss=discount_loss
            )
            weight = seq.shape[1] / total_steps
            for key, value in values.items():
                expected_values[key] = expected_values.get(key, 0) + weight * value
            grads = [weight * g for g in grads]
            expected_grads = (
                grads
                if expected_grads is None
                else [a + b for a, b in zip(expected_grads, grads)]
            )
        padded = pad(make_sequences(LENGTHS), PAD_TO, garbage)
        got = actor_value_losses_and_grads(padded, discount_loss=discount_loss)
        torch.testing.assert_close(got, (expected_values, expected_grads))
        # control: without the mask the padded steps' rollouts count
        ignored, _ = actor_value_losses_and_grads(
            padded.exclude(MASK_KEY), discount_loss=discount_loss
        )
        assert not torch.allclose(ignored["loss_actor"], expected_values["loss_actor"])


def _run_reference(pythonpath, out):
    env = dict(os.environ)
    env["PYTHONPATH"] = str(pythonpath)
    env["PYTHONWARNINGS"] = "ignore"
    subprocess.run(
        [sys.executable, str(ROOT / "test" / "_masked_dreamer_cases.py"), str(out)],
        env=env,
        check=True,
        cwd=str(ROOT),
    )
    return torch.load(out)


def test_unmasked_matches_pristine(tmp_path):
    upstream = ROOT / "build" / "upstream"
    fork = ROOT / "build" / "fork"
    if not (upstream / "torchrl").is_dir() or not (fork / "torchrl").is_dir():
        pytest.skip("build/upstream and build/fork are laid out by tools/fork.py sync")
    expected = _run_reference(upstream, tmp_path / "upstream.pt")
    got = _run_reference(fork, tmp_path / "fork.pt")
    assert set(got) == set(expected)
    assert set(range(len(OPTIONS))) < set(expected)
    for case in expected:
        values, grads = got[case]
        expected_values, expected_grads = expected[case]
        assert set(values) == set(expected_values)
        for key in values:
            assert torch.equal(values[key], expected_values[key]), (case, key)
        for grad, other in zip(grads, expected_grads):
            assert torch.equal(grad, other)

# Copyright (c) Meta Platforms, Inc. and affiliates.
#
# This source code is licensed under the MIT license found in the
# LICENSE file in the root directory of this source tree.
"""Loss modules honour the padding mask at ``("collector", "mask")``."""
from __future__ import annotations

import math
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from _masked_loss_cases import (
    _make_qmixer_loss,
    CHANGED_ESTIMATORS,
    COVERED,
    ESTIMATORS,
    fill_garbage,
    FLAT_ONLY,
    layout,
    loss_and_grads,
    loss_classes,
    LOSS_STATUS,
    make_batch,
    make_loss,
    MASK_KEY,
    OPT_IN,
    reductions,
    slice_batches,
    split_trajs_layout,
)
from hypothesis import given, settings, strategies as st

pytestmark = pytest.mark.filterwarnings("ignore:No target network updater")

ROOT = Path(__file__).resolve().parents[1]
LENGTHS = (3, 5, 2)
PAD_TO = 6
WEIGHTED = [
    name
    for name in COVERED
    if name in ("dqn", "sac", "td3", "ddpg", "dist_dqn", "discrete_sac")
]
GARBAGE = [None, "zeros", "huge", "random"]


def _skip_if_no_reduction(name, reduction):
    if reduction not in reductions(name):
        pytest.skip(f"{name} has no reduction={reduction!r}, as in 0.12.0")


def _skip_if_flat_only(name):
    if name in FLAT_ONLY:
        pytest.skip(f"{name} takes one-dimensional batches only, as in 0.12.0")


def _compare(name, reduction, real, padded, **loss_kwargs):
    torch.manual_seed(3)
    expected, expected_grads = loss_and_grads(
        make_loss(name, reduction=reduction, **loss_kwargs), real
    )
    torch.manual_seed(3)
    got, got_grads = loss_and_grads(
        make_loss(name, reduction=reduction, **loss_kwargs), padded
    )
    assert set(got) == set(expected)
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(got_grads, expected_grads)
    for grad in got_grads:
        assert grad.isfinite().all()


class TestPaddedEqualsUnpadded:
    """Loss and gradients on a padded batch equal those on the ragged batch."""

    @pytest.mark.parametrize(
        "reduction,garbage",
        [("mean", garbage) for garbage in GARBAGE]
        + [("sum", "huge"), ("none", "huge")],
    )
    @pytest.mark.parametrize("name", COVERED)
    def test_loss_and_grads(self, name, reduction, garbage):
        _skip_if_no_reduction(name, reduction)
        real, padded = slice_batches(name, *layout(name), garbage=garbage)
        _compare(name, reduction, real, padded)

    @pytest.mark.parametrize("reduction", ["mean", "none"])
    @pytest.mark.parametrize("name", COVERED)
    def test_logged_values(self, name, reduction):
        # every tensor a loss reports besides its loss terms (entropy, alpha,
        # predicted and target values, KL, ...) comes from the real rows only:
        # a per-row diagnostic holds the real rows, so its mean is unbiased
        _skip_if_no_reduction(name, reduction)
        real, padded = slice_batches(name, *layout(name), garbage="huge")
        torch.manual_seed(3)
        expected = make_loss(name, reduction=reduction)(real.clone())
        torch.manual_seed(3)
        got = make_loss(name, reduction=reduction)(padded.clone())
        assert set(got.keys(True, True)) == set(expected.keys(True, True))
        for key, value in expected.items(True, True):
            if isinstance(value, torch.Tensor):
                assert got[key].shape == value.shape, key
                torch.testing.assert_close(got[key], value, msg=str(key))

    @pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
    @pytest.mark.parametrize("name", WEIGHTED)
    def test_importance_weights(self, name, reduction):
        real, padded = slice_batches(
            name, LENGTHS, PAD_TO, garbage="huge", weights=True
        )
        _compare(name, reduction, real, padded)
        # the weights do change the loss: the test above is not vacuous
        torch.manual_seed(3)
        unweighted, _ = loss_and_grads(
            make_loss(name, reduction=reduction), real.exclude("priority_weight")
        )
        torch.manual_seed(3)
        weighted, _ = loss_and_grads(make_loss(name, reduction=reduction), real)
        assert any(not torch.allclose(weighted[k], unweighted[k]) for k in weighted)

    @pytest.mark.parametrize("name", COVERED)
    def test_padded_content_never_matters(self, name):
        _, padded = slice_batches(name, LENGTHS, PAD_TO)
        mask = padded.get(MASK_KEY)
        results = []
        for kind in ("zeros", "huge", "random"):
            td = fill_garbage(padded, mask, kind)
            td.set(MASK_KEY, mask)
            torch.manual_seed(3)
            results.append(loss_and_grads(make_loss(name), td))
        for other in results[1:]:
            torch.testing.assert_close(other, results[0])

    @pytest.mark.parametrize("name", COVERED)
    def test_without_mask_padded_rows_count(self, name):
        # the control: the same padded batch without its mask gives another
        # loss, so the comparisons above can fail
        real, padded = slice_batches(name, LENGTHS, PAD_TO, garbage="random")
        torch.manual_seed(3)
        expected, _ = loss_and_grads(make_loss(name), real)
        torch.manual_seed(3)
        got, _ = loss_and_grads(make_loss(name), padded.exclude(MASK_KEY))
        assert any(not torch.allclose(got[k], expected[k]) for k in expected)

    @pytest.mark.parametrize("name", COVERED)
    def test_split_trajs_layout(self, name):
        # a [B, T] batch with a [B, T] mask, zeros after each trajectory and no
        # done marker where the real data of a trajectory ends: value
        # estimators must not carry the zeros into the real steps
        _skip_if_flat_only(name)
        lengths, pad_to = layout(name)
        real, padded = slice_batches(name, lengths, pad_to, garbage="zeros")
        padded = split_trajs_layout(padded, lengths)
        _compare(name, "mean", real, padded)

    @pytest.mark.parametrize("name", COVERED)
    def test_reduction_none_real_rows(self, name):
        _skip_if_no_reduction(name, "none")
        # as torchrl.objectives.utils._reduce(..., mask=mask): "none" returns
        # the real rows, flattened (tensor[mask]), which for a split_trajs
        # [B, T] batch are the rows of the batch with its padding removed
        lengths, pad_to = layout(name)
        if name in FLAT_ONLY:
            real, padded = slice_batches(name, lengths, pad_to, garbage="zeros")
            torch.manual_seed(3)
            expected, _ = loss_and_grads(make_loss(name, reduction="none"), real)
            torch.manual_seed(3)
            got, _ = loss_and_grads(make_loss(name, reduction="none"), padded)
            torch.testing.assert_close(got, expected)
            return
        real, padded = slice_batches(name, lengths, pad_to, garbage="zeros")
        padded = split_trajs_layout(padded, lengths)
        mask = padded.get(MASK_KEY)
        torch.manual_seed(3)
        expected, _ = loss_and_grads(make_loss(name, reduction="none"), real)
        torch.manual_seed(3)
        got, _ = loss_and_grads(make_loss(name, reduction="none"), padded)
        assert any(value.shape[:1] == (int(mask.sum()),) for value in got.values())
        torch.testing.assert_close(got, expected)

    @settings(max_examples=20, deadline=None)
    @given(
        lengths=st.lists(st.integers(1, 6), min_size=1, max_size=4),
        extra=st.integers(0, 3),
        garbage=st.sampled_from(GARBAGE),
        name=st.sampled_from(
            ["clipppo", "a2c", "dqn", "discrete_sac", "redq", "odt", "crossq_bn"]
        ),
    )
    def test_any_padding(self, lengths, extra, garbage, name):
        real, padded = slice_batches(
            name, lengths, max(lengths) + extra, garbage=garbage
        )
        _compare(name, "mean", real, padded)


class TestEveryLossHasAStatus:
    """A loss class cannot be added to ``torchrl.objectives`` without a decision."""

    DOC = ROOT / "docs" / "source" / "reference" / "objectives_mask.rst"

    def _doc_rows(self):
        text = self.DOC.read_text()
        table = text[text.index("Status of every loss") :]
        rows = {}
        for line in table.splitlines():
            match = re.match(
                r"^(?::class:`)?(\w+)`?\s{2,}(covered|opt-in|not covered|raises)\s",
                line,
            )
            if match:
                rows[match.group(1)] = match.group(2)
        return rows

    def test_every_loss_class_has_a_status(self):
        names = {cls.__name__ for cls in loss_classes()}
        assert len(names) >= 30
        assert names == set(LOSS_STATUS)

    def test_docs_table_lists_every_loss_with_its_status(self):
        expected = {name: status for name, (status, _) in LOSS_STATUS.items()}
        assert self._doc_rows() == expected

    @pytest.mark.parametrize(
        "name",
        [
            name
            for name, (status, _) in LOSS_STATUS.items()
            if status in ("covered", "opt-in")
        ],
    )
    def test_covered_losses_have_cases(self, name):
        _, cases = LOSS_STATUS[name]
        if isinstance(cases, str):
            # a test module of its own
            assert (ROOT / "test" / f"{cases}.py").is_file()
            return
        for case in cases:
            assert case in COVERED
            assert type(make_loss(case)).__name__ == name
            reads = OPT_IN if LOSS_STATUS[name][0] == "opt-in" else COVERED
            assert case in reads

    def test_every_case_has_a_status(self):
        cases = {
            case
            for status, cases in LOSS_STATUS.values()
            if status in ("covered", "opt-in") and not isinstance(cases, str)
            for case in cases
        }
        assert cases == set(COVERED)

    @pytest.mark.parametrize(
        "name",
        [name for name, (status, _) in LOSS_STATUS.items() if status == "raises"],
    )
    def test_refusing_losses_raise_on_padded_batches(self, name):
        # the LLM losses need an LLM wrapper (transformers or vLLM) to be
        # built; the check is the first thing their forward does, so it runs
        # on a loss whose __init__ is skipped
        from torchrl.objectives import LossModule

        cls = next(cls for cls in loss_classes() if cls.__name__ == name)
        loss = cls.__new__(cls)
        LossModule.__init__(loss)
        _, padded = slice_batches("ppo", LENGTHS, PAD_TO)
        with pytest.raises(
            ValueError,
            match=rf"{name} got a padding mask at key \('collector', 'mask'\)",
        ):
            loss(padded)
        # an all-True mask is no padding
        from torchrl.objectives._mask import _refuse_mask

        all_true = padded.set(MASK_KEY, torch.ones(padded.shape, dtype=torch.bool))
        _refuse_mask(loss, all_true, "why")


class TestMaskKey:
    @pytest.mark.parametrize("name", [name for name in COVERED if name not in OPT_IN])
    def test_default_key(self, name):
        assert make_loss(name).tensor_keys.mask == ("collector", "mask")

    def test_qmixer_reads_no_mask_by_default(self):
        # multi-agent data may carry an all-False placeholder mask (upstream's
        # own QMixer tests do): QMixerLoss reads a mask only once given a key
        from torchrl.objectives import QMixerLoss

        assert QMixerLoss.default_keys.mask is None
        real, padded = slice_batches("qmixer", LENGTHS, PAD_TO, garbage="random")
        results = []
        for mask in (None, torch.zeros(padded.shape, dtype=torch.bool)):
            torch.manual_seed(0)
            loss = _make_qmixer_loss(read_mask=False)
            td = padded.exclude(MASK_KEY)
            if mask is not None:
                td.set(MASK_KEY, mask)
            torch.manual_seed(3)
            results.append(loss_and_grads(loss, td))
        torch.testing.assert_close(results[1], results[0], rtol=0, atol=0)

    @pytest.mark.parametrize("name", COVERED)
    def test_set_keys(self, name):
        real, padded = slice_batches(name, *layout(name), garbage="random")
        mask = padded.get(MASK_KEY)
        moved = padded.exclude(MASK_KEY).set("valid", mask)
        loss = make_loss(name)
        loss.set_keys(mask="valid")
        assert loss.tensor_keys.mask == "valid"
        torch.manual_seed(3)
        got = loss_and_grads(loss, moved)
        reference = make_loss(name)
        torch.manual_seed(3)
        expected = loss_and_grads(reference, real)
        torch.testing.assert_close(got, expected)
        # the default key is no longer read
        loss = make_loss(name)
        loss.set_keys(mask="valid")
        torch.manual_seed(3)
        ignored = loss_and_grads(loss, padded)
        reference = make_loss(name)
        torch.manual_seed(3)
        unmasked = loss_and_grads(reference, padded.exclude(MASK_KEY))
        torch.testing.assert_close(ignored, unmasked)

    @pytest.mark.parametrize("name", COVERED)
    def test_wrong_shape(self, name):
        _, padded = slice_batches(name, LENGTHS, PAD_TO)
        n = padded.shape[0]
        padded.get("collector").set("mask", torch.ones(n, 2, dtype=torch.bool))
        with pytest.raises(
            ValueError, match=r"'collector', 'mask'.*\(18, 2\).*\(18,\)"
        ):
            make_loss(name)(padded)

    @pytest.mark.parametrize("name", COVERED)
    def test_trailing_singleton_mask(self, name):
        # a [*batch, 1] mask, shaped like the done flags (as some datasets and
        # upstream's own tests store it), is read as the batch mask
        real, padded = slice_batches(name, *layout(name), garbage="random")
        padded.set(MASK_KEY, padded.get(MASK_KEY).unsqueeze(-1))
        _compare(name, "mean", real, padded)
        if name in FLAT_ONLY:
            return
        # [B, T, 1] too, where an all-True mask leaves the loss unmasked
        lengths, pad_to = layout(name)
        td = real[: len(lengths) * 2].reshape(len(lengths), 2)
        td.set(MASK_KEY, torch.ones(td.shape + (1,), dtype=torch.bool))
        torch.manual_seed(3)
        got = loss_and_grads(make_loss(name), td)
        torch.manual_seed(3)
        expected = loss_and_grads(make_loss(name), td.exclude("collector"))
        torch.testing.assert_close(got, expected, rtol=0, atol=0)

    @pytest.mark.parametrize("name", COVERED)
    def test_wrong_dtype(self, name):
        _, padded = slice_batches(name, LENGTHS, PAD_TO)
        padded.set(MASK_KEY, padded.get(MASK_KEY).float())
        with pytest.raises(ValueError, match=r"'collector', 'mask'.*boolean"):
            make_loss(name)(padded)

    @pytest.mark.parametrize("name", COVERED)
    def test_all_padded(self, name):
        # a mask-aware loss has no real row to average over: it says so
        _, padded = slice_batches(name, LENGTHS, PAD_TO)
        padded.set(MASK_KEY, torch.zeros(padded.shape, dtype=torch.bool))
        with pytest.raises(
            ValueError, match=r"'collector', 'mask'.*False on every row"
        ):
            make_loss(name)(padded)

    @pytest.mark.parametrize("name", COVERED)
    def test_all_true_mask_is_unmasked(self, name):
        real, _ = slice_batches(name, LENGTHS, PAD_TO)
        masked = real.clone().set(MASK_KEY, torch.ones(real.shape, dtype=torch.bool))
        torch.manual_seed(3)
        got = loss_and_grads(make_loss(name), masked)
        torch.manual_seed(3)
        expected = loss_and_grads(make_loss(name), real)
        torch.testing.assert_close(got, expected, rtol=0, atol=0)

    def test_no_warning(self):
        _, padded = slice_batches("ppo", LENGTHS, PAD_TO)
        loss = make_loss("ppo")
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            loss(padded)


class TestPerRowShapes:
    """Fixes of per-row terms that broadcast across rows in 0.12.0."""

    def _with_advantage(self, name, n=7):
        td = make_batch(name, n)
        g = torch.Generator().manual_seed(5)
        td["advantage"] = torch.randn(n, 1, generator=g)
        td["value_target"] = torch.randn(n, 1, generator=g)
        return td

    @pytest.mark.parametrize("name", ["a2c", "ppo", "clipppo", "klpenppo"])
    def test_advantage_without_trailing_dim(self, name):
        td = self._with_advantage(name)
        flat = td.clone().set("advantage", td["advantage"].squeeze(-1))
        expected = loss_and_grads(make_loss(name, reduction="none"), td)
        got = loss_and_grads(make_loss(name, reduction="none"), flat)
        assert got[0]["loss_objective"].shape == (7,)
        torch.testing.assert_close(got, expected)

    @pytest.mark.parametrize("name", ["ppo", "clipppo", "klpenppo"])
    def test_log_prob_with_trailing_dim(self, name):
        # stored as [N, 1] next to the [N] log-prob of the current policy:
        # 0.12.0 broadcasts the ratio into [N, N, 1]
        td = self._with_advantage(name)
        column = td.clone().set("action_log_prob", td["action_log_prob"].unsqueeze(-1))
        expected = loss_and_grads(make_loss(name, reduction="none"), td)
        got = loss_and_grads(make_loss(name, reduction="none"), column)
        assert got[0]["loss_objective"].shape == (7,)
        torch.testing.assert_close(got, expected)


def _one_dim_actor(distribution_class):
    from tensordict.nn import NormalParamExtractor, TensorDictModule
    from torchrl.modules import ProbabilisticActor

    torch.manual_seed(0)
    module = TensorDictModule(
        torch.nn.Sequential(torch.nn.Linear(3, 2), NormalParamExtractor()),
        in_keys=["observation"],
        out_keys=["loc", "scale"],
    )
    return ProbabilisticActor(
        module,
        in_keys=["loc", "scale"],
        distribution_class=distribution_class,
        return_log_prob=True,
        log_prob_key="action_log_prob",
    )


class TestOneDimensionalAction:
    """A [N, 1] log-probability gives one term per row of the [N, 1] advantage."""

    @pytest.mark.parametrize("name", ["a2c", "ppo", "clipppo"])
    def test_normal_matches_independent_normal(self, name):
        # the element-wise Normal of a one-dimensional action has the
        # log-probability of Independent(Normal, 1), shaped [N, 1] not [N]
        from torchrl import objectives
        from torchrl.modules import IndependentNormal, ValueOperator

        cls = {
            "a2c": objectives.A2CLoss,
            "ppo": objectives.PPOLoss,
            "clipppo": objectives.ClipPPOLoss,
        }[name]
        n = 7
        g = torch.Generator().manual_seed(5)
        td = make_batch(name, n)
        td["action"] = td["action"][:, :1]
        td["advantage"] = torch.randn(n, 1, generator=g)
        td["value_target"] = torch.randn(n, 1, generator=g)
        results = []
        for dist_class, log_prob in (
            (IndependentNormal, td["action_log_prob"]),
            (torch.distributions.Normal, td["action_log_prob"].unsqueeze(-1)),
        ):
            actor = _one_dim_actor(dist_class)
            value = ValueOperator(torch.nn.Linear(3, 1), in_keys=["observation"])
            loss = cls(actor, value, reduction="none", entropy_bonus=False)
            results.append(loss(td.clone().set("action_log_prob", log_prob)))
        expected, got = results
        assert got["loss_objective"].shape == (n,)
        torch.testing.assert_close(got["loss_objective"], expected["loss_objective"])


def _independent_normal(loc, scale):
    # a user-built Independent(Normal, 1): not one of torchrl's registered types
    return torch.distributions.Independent(torch.distributions.Normal(loc, scale), 1)


ONE_DIM_LAYOUTS = {
    # log-prob and entropy of shape [N, 1]
    "normal": torch.distributions.Normal,
    # [N]
    "independent_normal": "IndependentNormal",
    "torch_independent": _independent_normal,
}


class TestOneDimensionalEntropy:
    """A one-dimensional Gaussian's entropy does not depend on its event dims."""

    COEFF = 0.05

    def _loss_and_closed_form(self, name, layout, reduction, masked):
        from torchrl import modules, objectives

        cls = {
            "a2c": objectives.A2CLoss,
            "ppo": objectives.PPOLoss,
            "clipppo": objectives.ClipPPOLoss,
        }[name]
        dist_class = ONE_DIM_LAYOUTS[layout]
        if isinstance(dist_class, str):
            dist_class = getattr(modules, dist_class)
        n = 7
        g = torch.Generator().manual_seed(5)
        td = make_batch(name, n)
        td["action"] = td["action"][:, :1]
        td["advantage"] = torch.randn(n, 1, generator=g)
        td["value_target"] = torch.randn(n, 1, generator=g)
        if dist_class is torch.distributions.Normal:
            td["action_log_prob"] = td["action_log_prob"].unsqueeze(-1)
        mask = torch.ones(n, dtype=torch.bool)
        if masked:
            mask[[2, 5]] = False
            td.set(MASK_KEY, mask)
        actor = _one_dim_actor(dist_class)
        value = modules.ValueOperator(torch.nn.Linear(3, 1), in_keys=["observation"])
        loss = cls(actor, value, reduction=reduction, entropy_coeff=self.COEFF)
        # Monte-Carlo estimates would draw from the global generator
        torch.manual_seed(0)
        out = loss(td)
        with torch.no_grad():
            scale = actor.module[0](td.clone())["scale"].squeeze(-1)
        entropy = 0.5 * torch.log(2 * math.pi * math.e * scale**2)
        return out, -self.COEFF * entropy[mask]

    @pytest.mark.parametrize("masked", [False, True])
    @pytest.mark.parametrize("layout", list(ONE_DIM_LAYOUTS))
    @pytest.mark.parametrize("name", ["a2c", "ppo", "clipppo"])
    def test_loss_entropy_is_closed_form(self, name, layout, masked):
        out, expected = self._loss_and_closed_form(name, layout, "mean", masked)
        torch.testing.assert_close(out["loss_entropy"], expected.mean())
        torch.testing.assert_close(
            out["entropy"], expected.mean() / -self.COEFF, msg="logged entropy"
        )

    @pytest.mark.parametrize("masked", [False, True])
    @pytest.mark.parametrize("layout", list(ONE_DIM_LAYOUTS))
    @pytest.mark.parametrize("name", ["a2c", "ppo", "clipppo"])
    def test_per_row_entropy(self, name, layout, masked):
        # reduction="none": one entropy term per real row, like loss_objective
        out, expected = self._loss_and_closed_form(name, layout, "none", masked)
        assert out["loss_entropy"].shape == out["loss_objective"].shape
        torch.testing.assert_close(out["loss_entropy"], expected)


class TestPILCOCost:
    def test_gradient_reaches_real_rows_only(self):
        # PILCO differentiates the cost through the predicted states
        real, padded = slice_batches("pilco", LENGTHS, PAD_TO, garbage="huge")
        mask = padded.get(MASK_KEY)
        grads = []
        for td in (real, padded):
            td = td.clone()
            mean = td["observation", "mean"].requires_grad_()
            out = make_loss("pilco")(td)
            (grad,) = torch.autograd.grad(out["loss_cost"], mean)
            grads.append(grad)
        torch.testing.assert_close(grads[1][mask], grads[0])
        assert (grads[1][~mask] == 0).all()


class TestCQLPerRow:
    def test_cql_term_one_value_per_row(self):
        # 0.12.0 subtracted an [N, 1] prediction from an [N * num_random]
        # log-sum-exp and averaged: every row's cql term mixed all rows
        td = make_batch("cql", 6)
        torch.manual_seed(3)
        out = make_loss("cql", reduction="none")(td.clone())
        assert out["loss_cql"].shape == (6,)
        changed = td.clone()
        changed["observation"][0] += 5.0
        torch.manual_seed(3)
        out_changed = make_loss("cql", reduction="none")(changed)
        torch.testing.assert_close(out_changed["loss_cql"][1:], out["loss_cql"][1:])
        assert not torch.allclose(out_changed["loss_cql"][0], out["loss_cql"][0])

    @pytest.mark.parametrize("garbage", ["huge", "random"])
    def test_alpha_prime_from_real_rows(self, garbage):
        real, padded = slice_batches("cql", *layout("cql"), garbage=garbage)
        _compare("cql", "mean", real, padded, with_lagrange=True)

    @pytest.mark.parametrize("padded_batch", [False, True])
    def test_alpha_prime_reduction_none(self, padded_batch):
        # reduction="none" gives one alpha-prime term per real row, whose mean
        # is the "mean" reduction's alpha-prime loss
        real, padded = slice_batches("cql", *layout("cql"), garbage="random")
        td = padded if padded_batch else real
        n_real = real.numel()
        torch.manual_seed(3)
        out = make_loss("cql", reduction="none", with_lagrange=True)(td.clone())
        assert out.batch_size == (n_real,)
        assert out["loss_alpha_prime"].shape == (n_real,)
        torch.manual_seed(3)
        mean = make_loss("cql", reduction="mean", with_lagrange=True)(td.clone())
        torch.testing.assert_close(
            out["loss_alpha_prime"].mean(), mean["loss_alpha_prime"]
        )


class TestAdaptiveTerms:
    """Statistics over the batch only see the real rows."""

    @pytest.mark.parametrize("garbage", ["random"])
    def test_klpen_beta(self, garbage):
        real, padded = slice_batches("klpenppo", LENGTHS, PAD_TO, garbage=garbage)
        betas = []
        for td in (real, padded):
            # the real rows' KL (about 1.88) is within [dtarg / 1.5, dtarg * 1.5]
            loss = make_loss("klpenppo", dtarg=1.9)
            loss(td)
            loss(td)
            betas.append(loss.beta.clone())
        torch.testing.assert_close(betas[1], betas[0])
        assert betas[0] == 1.0
        _, control = slice_batches("klpenppo", LENGTHS, PAD_TO, garbage="random")
        loss = make_loss("klpenppo", dtarg=1.9)
        loss(control.exclude(MASK_KEY))
        # control: the padded rows' KL would move beta
        assert loss.beta > 1.0

    @pytest.mark.parametrize("name", ["ppo", "clipppo", "klpenppo"])
    def test_normalized_advantage(self, name):
        real, padded = slice_batches(name, LENGTHS, PAD_TO, garbage="random")
        _compare(name, "mean", real, padded, normalize_advantage=True)

    @pytest.mark.parametrize("name", ["ppo", "clipppo", "klpenppo"])
    def test_normalized_advantage_single_real_row(self, name):
        # one real row: nothing to standardize, as on the unpadded batch
        real, padded = slice_batches(name, (1,), 4, garbage="random")
        torch.manual_seed(3)
        got, _ = loss_and_grads(make_loss(name, normalize_advantage=True), padded)
        assert all(value.isfinite().all() for value in got.values())
        _compare(name, "mean", real, padded, normalize_advantage=True)

    def test_normalized_advantage_exclude_dims(self):
        _, padded = slice_batches("ppo", LENGTHS, PAD_TO)
        loss = make_loss(
            "ppo", normalize_advantage=True, normalize_advantage_exclude_dims=(-1,)
        )
        with pytest.raises(ValueError, match="normalize_advantage_exclude_dims"):
            loss(padded)

    @pytest.mark.parametrize("name", ["ppo", "clipppo", "a2c", "reinforce"])
    def test_logged_statistics(self, name):
        kwargs = {"clip_value": 0.1}
        if name in ("ppo", "clipppo"):
            kwargs["log_explained_variance"] = True

        def add_value(td):
            g = torch.Generator().manual_seed(11)
            for key in ("state_value", "advantage", "value_target"):
                td[key] = torch.randn(td.shape + (1,), generator=g)

        td, padded_td = slice_batches(
            name, LENGTHS, PAD_TO, garbage="huge", prepare=add_value
        )
        torch.manual_seed(3)
        expected = make_loss(name, **kwargs)(td)
        torch.manual_seed(3)
        got = make_loss(name, **kwargs)(padded_td)
        for key in expected.keys():
            torch.testing.assert_close(got[key], expected[key], msg=key)


def _run_reference(pythonpath, out):
    env = dict(os.environ)
    env["PYTHONPATH"] = str(pythonpath)
    env["PYTHONWARNINGS"] = "ignore"
    subprocess.run(
        [sys.executable, str(ROOT / "test" / "_masked_loss_cases.py"), str(out)],
        env=env,
        check=True,
        cwd=str(ROOT),
    )
    return torch.load(out)


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    upstream = ROOT / "build" / "upstream"
    fork = ROOT / "build" / "fork"
    if not (upstream / "torchrl").is_dir() or not (fork / "torchrl").is_dir():
        pytest.skip("build/upstream and build/fork are laid out by tools/fork.py sync")
    tmp = tmp_path_factory.mktemp("masked_loss_reference")
    return (
        _run_reference(upstream, tmp / "upstream.pt"),
        _run_reference(fork, tmp / "fork.pt"),
    )


class TestUnmaskedUnchanged:
    """Without a mask, every covered loss matches pristine 0.12.0 bit for bit."""

    @pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
    @pytest.mark.parametrize("name", COVERED)
    def test_matches_pristine(self, references, name, reduction):
        _skip_if_no_reduction(name, reduction)
        upstream, fork = references
        expected_values, expected_grads = upstream[(name, reduction)]
        values, grads = fork[(name, reduction)]
        assert set(values) == set(expected_values)
        for key in values:
            assert torch.equal(values[key], expected_values[key]), key
        assert len(grads) == len(expected_grads)
        for grad, expected in zip(grads, expected_grads):
            assert torch.equal(grad, expected)

    @pytest.mark.parametrize("name", COVERED)
    def test_every_output_matches_pristine(self, references, name):
        # the logged statistics too (entropy, alpha, predicted values, ...)
        upstream, fork = references
        expected, _ = upstream[("outputs", name)]
        got, _ = fork[("outputs", name)]
        assert set(got) == set(expected)
        for key in expected:
            assert torch.equal(got[key], expected[key]), key

    @pytest.mark.parametrize("padded", [False, True])
    @pytest.mark.parametrize("name", ESTIMATORS)
    def test_estimator_matches_pristine(self, references, name, padded):
        # with set_keys(mask=None), an estimator reads no mask
        upstream, fork = references
        case = ("estimator-padded" if padded else "estimator", name)
        expected, _ = upstream[case]
        got, _ = fork[case]
        for key in expected:
            if name in CHANGED_ESTIMATORS and key == "advantage":
                # the documented fix: the V-Trace advantage at a truncation
                # inside the batch; every other step keeps the 0.12.0 value
                done = expected["next", "done"].clone()
                done[..., -1, :] = False
                assert done.any()
                assert not torch.allclose(got[key][done], expected[key][done])
                assert torch.equal(got[key][~done], expected[key][~done])
                continue
            assert torch.equal(got[key], expected[key]), key

    @pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
    def test_cql_term_changed(self, references, reduction):
        # the documented exception: CQL's conservative term is now computed
        # per row, which changes loss_cql (and loss_alpha_prime) on any batch
        upstream, fork = references
        expected, _ = upstream[("changed", "cql", reduction)]
        got, _ = fork[("changed", "cql", reduction)]
        assert not torch.allclose(got["loss_cql"], expected["loss_cql"])


class TestQMixerWithoutKeyUntouched:
    """Without a mask key, QMixerLoss gives the 0.12.0 results on padded batches."""

    @pytest.mark.parametrize("case", [0, 1, 2])
    def test_padded_batch_matches_pristine(self, references, case):
        # the padding mask, an all-False one, and one with a trailing dim
        upstream, fork = references
        expected_values, expected_grads = upstream[("qmixer-no-key", case)]
        values, grads = fork[("qmixer-no-key", case)]
        assert set(values) == set(expected_values)
        for key in values:
            assert torch.equal(values[key], expected_values[key]), key
        assert len(grads) == len(expected_grads)
        for grad, expected in zip(grads, expected_grads):
            assert torch.equal(grad, expected)

    def test_no_mask_key(self):
        loss = _make_qmixer_loss(read_mask=False)
        assert loss.tensor_keys.mask is None
        assert loss.value_estimator.tensor_keys.mask is None


def _cartpole_data():
    from tensordict.nn import TensorDictModule
    from torchrl.envs import GymEnv
    from torchrl.modules import OneHotCategorical, ProbabilisticActor

    torch.manual_seed(0)
    env = GymEnv("CartPole-v1")
    env.set_seed(0)
    actor = ProbabilisticActor(
        TensorDictModule(
            torch.nn.Linear(4, 2), in_keys=["observation"], out_keys=["logits"]
        ),
        in_keys=["logits"],
        distribution_class=OneHotCategorical,
        spec=env.action_spec,
        return_log_prob=True,
    )
    with torch.no_grad():
        data = env.rollout(300, actor, break_when_any_done=False)
    env.close()
    return data, env.action_spec


@pytest.fixture(scope="module")
def cartpole():
    return _cartpole_data()


def _ppo_update(loss_cls, sample, action_spec, steps=3):
    from tensordict.nn import TensorDictModule
    from torchrl.modules import OneHotCategorical, ProbabilisticActor, ValueOperator

    torch.manual_seed(1)
    actor = ProbabilisticActor(
        TensorDictModule(
            torch.nn.Sequential(
                torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2)
            ),
            in_keys=["observation"],
            out_keys=["logits"],
        ),
        in_keys=["logits"],
        distribution_class=OneHotCategorical,
        spec=action_spec,
        return_log_prob=True,
    )
    value = ValueOperator(
        torch.nn.Sequential(
            torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)
        ),
        in_keys=["observation"],
    )
    loss = loss_cls(actor, value, normalize_advantage=True)
    optim = torch.optim.Adam(loss.parameters(), lr=1e-2)
    for _ in range(steps):
        out = loss(sample.clone())
        total = out["loss_objective"] + out["loss_critic"] + out["loss_entropy"]
        optim.zero_grad()
        total.backward()
        optim.step()
    return [p.detach().clone() for p in loss.parameters()]


class TestEndToEnd:
    """A PPO update on ``pad_output=True`` samples equals the ragged one."""

    @pytest.mark.parametrize("storage", ["tensor", "memmap"])
    @pytest.mark.parametrize("loss_name", ["ClipPPOLoss", "KLPENPPOLoss"])
    def test_ppo_update_on_padded_sample(self, storage, loss_name, tmp_path, cartpole):
        from torchrl import objectives
        from torchrl.data import (
            LazyMemmapStorage,
            LazyTensorStorage,
            SliceSampler,
            TensorDictReplayBuffer,
        )

        data, action_spec = cartpole
        if storage == "tensor":
            store = LazyTensorStorage(1000)
        else:
            store = LazyMemmapStorage(1000, scratch_dir=tmp_path)
        kwargs = {"num_slices": 4, "end_key": ("next", "done")}
        padded_rb = TensorDictReplayBuffer(
            storage=store,
            sampler=SliceSampler(strict_length=False, pad_output=True, **kwargs),
            batch_size=120,
        )
        padded_rb.extend(data)
        ragged_rb = TensorDictReplayBuffer(
            storage=store,
            sampler=SliceSampler(strict_length=False, **kwargs),
            batch_size=120,
        )
        torch.manual_seed(5)
        padded = padded_rb.sample()
        torch.manual_seed(5)
        ragged = ragged_rb.sample()
        mask = padded.get(MASK_KEY)
        # the sample does hold padded rows, and the ragged one is its real rows
        assert (~mask).any()
        assert ragged.shape[0] == int(mask.sum())
        torch.testing.assert_close(padded["observation"][mask], ragged["observation"])
        loss_cls = getattr(objectives, loss_name)
        expected = _ppo_update(loss_cls, ragged, action_spec)
        got = _ppo_update(loss_cls, padded, action_spec)
        torch.testing.assert_close(got, expected)
        # control: ignoring the mask gives another update
        ignored = _ppo_update(loss_cls, padded.exclude(MASK_KEY), action_spec)
        assert any(not torch.allclose(a, b) for a, b in zip(ignored, expected))


def _padded_and_ragged(data, tmp_path, storage="tensor", num_slices=4, batch=120):
    from torchrl.data import (
        LazyMemmapStorage,
        LazyTensorStorage,
        SliceSampler,
        TensorDictReplayBuffer,
    )

    if storage == "tensor":
        store = LazyTensorStorage(1000)
    else:
        store = LazyMemmapStorage(1000, scratch_dir=tmp_path)
    kwargs = {"num_slices": num_slices, "end_key": ("next", "done")}
    padded_rb = TensorDictReplayBuffer(
        storage=store,
        sampler=SliceSampler(strict_length=False, pad_output=True, **kwargs),
        batch_size=batch,
    )
    padded_rb.extend(data)
    ragged_rb = TensorDictReplayBuffer(
        storage=store,
        sampler=SliceSampler(strict_length=False, **kwargs),
        batch_size=batch,
    )
    torch.manual_seed(5)
    padded = padded_rb.sample()
    torch.manual_seed(5)
    ragged = ragged_rb.sample()
    mask = padded.get(MASK_KEY)
    # the sample does hold padded rows, and the ragged one is its real rows
    assert (~mask).any()
    assert ragged.shape[0] == int(mask.sum())
    torch.testing.assert_close(padded["observation"][mask], ragged["observation"])
    return padded, ragged


class _CausalTransformer(torch.nn.Module):
    """A decision-transformer-style policy: causal self-attention over time.

    Each step's action is predicted from the observations up to that step,
    with a learned embedding of the step's position in its sequence.
    """

    def __init__(self, obs_dim, act_dim, context=64, width=16):
        super().__init__()
        self.embed = torch.nn.Linear(obs_dim, width)
        self.position = torch.nn.Embedding(context, width)
        self.block = torch.nn.TransformerEncoderLayer(
            width, nhead=2, dim_feedforward=32, dropout=0.0, batch_first=True
        )
        self.head = torch.nn.Sequential(
            torch.nn.Linear(width, act_dim), torch.nn.Tanh()
        )

    def forward(self, observation):
        steps = observation.shape[-2]
        x = self.embed(observation) + self.position(torch.arange(steps))
        causal = torch.nn.Transformer.generate_square_subsequent_mask(steps)
        return self.head(self.block(x, src_mask=causal, is_causal=True))


def _dt_update(batches, steps=3):
    """DTLoss updates on ``batches``, a list of ``[B, T]`` tensordicts.

    The loss of one update is the mean over every real step of every batch:
    each batch's ``reduction="none"`` terms (its real steps' only) are
    concatenated, so a list of single-slice batches (the ragged sample, one
    sequence per slice) and a single padded batch give the same objective.
    """
    from tensordict.nn import TensorDictModule
    from torchrl.objectives import DTLoss

    torch.manual_seed(1)
    actor = TensorDictModule(
        _CausalTransformer(4, 2), in_keys=["observation"], out_keys=["action"]
    )
    loss = DTLoss(actor, reduction="none")
    # plain SGD: Adam would blow up the rounding noise of the attention's
    # key bias, whose true gradient is zero, into full-size steps
    optim = torch.optim.SGD(loss.parameters(), lr=0.1)
    for _ in range(steps):
        terms = [loss(batch.clone())["loss"].reshape(-1) for batch in batches]
        total = torch.cat(terms).mean()
        optim.zero_grad()
        total.backward()
        optim.step()
    return [p.detach().clone() for p in loss.parameters()]


def _discrete_sac_update(sample, action_spec, steps=3):
    from tensordict.nn import TensorDictModule
    from torchrl.modules import OneHotCategorical, ProbabilisticActor
    from torchrl.objectives import DiscreteSACLoss

    torch.manual_seed(1)

    def mlp(out):
        return torch.nn.Sequential(
            torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, out)
        )

    actor = ProbabilisticActor(
        TensorDictModule(mlp(2), in_keys=["observation"], out_keys=["logits"]),
        in_keys=["logits"],
        distribution_class=OneHotCategorical,
        spec=action_spec,
    )
    qvalue = TensorDictModule(
        mlp(2), in_keys=["observation"], out_keys=["action_value"]
    )
    loss = DiscreteSACLoss(actor, qvalue, action_space=action_spec, num_actions=2)
    optim = torch.optim.Adam(loss.parameters(), lr=1e-2)
    for _ in range(steps):
        out = loss(sample.clone())
        total = out["loss_actor"] + out["loss_qvalue"] + out["loss_alpha"]
        optim.zero_grad()
        total.backward()
        optim.step()
    return [p.detach().clone() for p in loss.parameters()]


@pytest.mark.filterwarnings("ignore:enable_nested_tensor")
class TestEndToEndOtherFamilies:
    """Updates on ``pad_output=True`` samples equal the ragged ones."""

    @pytest.mark.parametrize("storage", ["tensor", "memmap"])
    def test_decision_transformer_update(self, storage, tmp_path, cartpole):
        data, _ = cartpole
        data = data.set("action", data["action"].float())
        padded, ragged = _padded_and_ragged(data, tmp_path, storage)
        # the layout a sequence model reads: one row per slice, padding last
        num_slices = 4
        padded = padded.reshape(num_slices, -1)
        lengths = padded.get(MASK_KEY).sum(-1).tolist()
        slices = [
            piece.unsqueeze(0) for piece in ragged.split(lengths, 0)
        ]  # each slice alone, [1, length]
        assert sum(piece.shape[1] for piece in slices) == ragged.shape[0]
        expected = _dt_update(slices)
        got = _dt_update([padded])
        torch.testing.assert_close(got, expected)
        # control: ignoring the mask gives another update
        ignored = _dt_update([padded.exclude(MASK_KEY)])
        assert any(not torch.allclose(a, b) for a, b in zip(ignored, expected))

    @pytest.mark.parametrize("storage", ["tensor", "memmap"])
    def test_discrete_sac_update(self, storage, tmp_path, cartpole):
        data, action_spec = cartpole
        padded, ragged = _padded_and_ragged(data, tmp_path, storage)
        expected = _discrete_sac_update(ragged, action_spec)
        got = _discrete_sac_update(padded, action_spec)
        torch.testing.assert_close(got, expected)
        ignored = _discrete_sac_update(padded.exclude(MASK_KEY), action_spec)
        assert any(not torch.allclose(a, b) for a, b in zip(ignored, expected))

# Copyright (c) Meta Platforms, Inc. and affiliates.
#
# This source code is licensed under the MIT license found in the
# LICENSE file in the root directory of this source tree.
"""The next-step (bootstrap) pass of recurrent networks on flat slice samples.

A batch of several slices is evaluated at its next steps by the value
estimators and by losses that call their network on ``"next"``. Each slice
must start from the recurrent state stored at its first step, as if it were
run on its own: the references below run every slice, extended by its last
next step, through the same network separately, or, whatever the next step of
a row is (n-step data, a ``done`` that does not end the trajectory), every
row's slice up to it followed by its own next step.
"""
from __future__ import annotations

import pytest
import torch
from _recurrent_policies import make_cartpole, make_rnn
from tensordict.nn import TensorDictModule as Mod, TensorDictSequential as Seq
from torch import nn
from torchrl.collectors import Collector
from torchrl.data import (
    LazyTensorStorage,
    PrioritizedSliceSampler,
    SliceSampler,
    SliceSamplerWithoutReplacement,
    TensorDictReplayBuffer,
)
from torchrl.data.postprocs import MultiStep
from torchrl.envs import SerialEnv
from torchrl.modules import (
    OneHotCategorical,
    ProbabilisticActor,
    QValueModule,
    set_recurrent_mode,
)
from torchrl.objectives import DiscreteSACLoss, DQNLoss
from torchrl.objectives.value import GAE, TD0Estimator, TD1Estimator, TDLambdaEstimator

GAMMA = 0.9
MASK = ("collector", "mask")
BURN_IN = ("collector", "burn_in")
SLICE_LEN = 8


def _collect(kind):
    """CartPole steps collected by a recurrent policy: non-zero stored states."""
    torch.manual_seed(0)
    rnn = make_rnn(kind)
    head = Mod(
        nn.Linear(rnn.lstm.hidden_size if kind == "lstm" else rnn.gru.hidden_size, 2),
        in_keys=["features"],
        out_keys=["logits"],
    )
    policy = ProbabilisticActor(
        Seq(rnn, head), in_keys=["logits"], distribution_class=OneHotCategorical
    )
    env = make_cartpole()
    env.set_seed(0)
    collector = Collector(
        env,
        policy,
        frames_per_batch=600,
        total_frames=600,
        auto_register_policy_transforms=True,
    )
    data = next(iter(collector))
    collector.shutdown()
    state_key = "recurrent_state_h" if kind == "lstm" else "recurrent_state"
    assert data[state_key].abs().sum() > 0
    return rnn, data.reshape(-1)


@pytest.fixture(scope="module", params=["lstm", "gru"])
def collected(request):
    return request.param, *_collect(request.param)


def _sample(data, sampler_cls, pad, burn_in=0, **kwargs):
    if pad:
        kwargs.update(strict_length=False, pad_output=True)
    if burn_in:
        kwargs["burn_in"] = burn_in
    rb = TensorDictReplayBuffer(
        storage=LazyTensorStorage(data.shape[0]),
        sampler=sampler_cls(slice_len=SLICE_LEN, **kwargs),
        batch_size=6 * SLICE_LEN,
    )
    rb.extend(data)
    torch.manual_seed(1)
    sample = rb.sample()
    # several slices, each starting with a non-zero stored state
    assert sample["is_init"].sum() > 1
    return sample


def _value_net(rnn):
    torch.manual_seed(2)
    head = Mod(nn.Linear(8, 1), in_keys=["features"], out_keys=["state_value"])
    return Seq(rnn, head)


def _slices(sample):
    """Row ranges of the slices of a sample (a slice starts at every is_init)."""
    starts = sample["is_init"].reshape(-1).nonzero().squeeze(-1).tolist()
    return list(zip(starts, starts[1:] + [sample.shape[0]]))


def _per_slice(module, sample, key):
    """``key`` at the current and the next steps, every slice run on its own.

    A padded slice runs its real rows only (followed by the next step of the
    last real one); its padded rows repeat the last real row's outputs. The
    burn-in rows of a slice run first, like its other rows (there is no
    gradient here).
    """
    current, following = [], []
    in_keys = [k for k in module.in_keys if k in sample.keys(True, True)]
    mask = sample.get(MASK, torch.ones(sample.shape, dtype=torch.bool))
    mask = mask | sample.get(BURN_IN, torch.zeros_like(mask))
    with torch.no_grad(), set_recurrent_mode(True):
        for start, stop in _slices(sample):
            rows = sample[start:stop][mask[start:stop]]
            seq = torch.cat([rows.select(*in_keys), rows[-1:]["next"].select(*in_keys)])
            seq["is_init"][1:] = False
            out = module(seq.clone()).get(key)
            padding = [out[-2:-1]] * int((~mask[start:stop]).sum())
            current.append(torch.cat([out[:-1], *padding]))
            following.append(torch.cat([out[1:], *padding]))
    return torch.cat(current), torch.cat(following)


def _real(sample):
    mask = sample.get(MASK, None)
    return slice(None) if mask is None else mask


SAMPLERS = [SliceSampler, SliceSamplerWithoutReplacement]


@pytest.mark.parametrize("sampler_cls", SAMPLERS)
@pytest.mark.parametrize("pad", [False, True], ids=["ragged", "padded"])
@pytest.mark.parametrize("burn_in", [0, 4], ids=["no-burn-in", "burn-in"])
class TestEstimatorNextStep:
    def test_td0_value_estimate(self, collected, sampler_cls, pad, burn_in):
        _, rnn, data = collected
        sample = _sample(data, sampler_cls, pad, burn_in)
        value_net = _value_net(rnn)
        _, next_ref = _per_slice(value_net, sample, "state_value")
        estimator = TD0Estimator(gamma=GAMMA, value_network=value_net)
        with torch.no_grad(), set_recurrent_mode(True):
            target = estimator.value_estimate(sample.clone())
        expected = (
            sample["next", "reward"]
            + GAMMA * (~sample["next", "terminated"]).float() * next_ref
        )
        real = _real(sample)
        torch.testing.assert_close(target[real], expected[real])

    @pytest.mark.parametrize(
        "estimator_cls", [TD0Estimator, TD1Estimator, TDLambdaEstimator, GAE]
    )
    @pytest.mark.parametrize("shifted", [False, True])
    @pytest.mark.parametrize(
        "truncated_key", [("next", "truncated"), None], ids=["truncated", "no-trunc"]
    )
    def test_forward_values(
        self,
        collected,
        sampler_cls,
        pad,
        burn_in,
        estimator_cls,
        shifted,
        truncated_key,
    ):
        """Values at the current and next steps, also without slice-end markers."""
        _, rnn, data = collected
        sample = _sample(data, sampler_cls, pad, burn_in, truncated_key=truncated_key)
        value_net = _value_net(rnn)
        current_ref, next_ref = _per_slice(value_net, sample, "state_value")
        kwargs = {"lmbda": 0.9} if estimator_cls in (TDLambdaEstimator, GAE) else {}
        estimator = estimator_cls(
            gamma=GAMMA, value_network=value_net, shifted=shifted, **kwargs
        )
        out = sample.clone()
        with torch.no_grad(), set_recurrent_mode(True):
            estimator(out)
        real = _real(sample)
        torch.testing.assert_close(out["state_value"][real], current_ref[real])
        torch.testing.assert_close(out["next", "state_value"][real], next_ref[real])


def _qvalue_net(rnn):
    torch.manual_seed(3)
    head = Mod(nn.Linear(8, 2), in_keys=["features"], out_keys=["action_value"])
    return Seq(rnn, head, QValueModule(action_space="one-hot"))


@pytest.mark.parametrize("sampler_cls", SAMPLERS)
@pytest.mark.parametrize("pad", [False, True], ids=["ragged", "padded"])
@pytest.mark.parametrize("double_dqn", [False, True])
@pytest.mark.parametrize("burn_in", [0, 4], ids=["no-burn-in", "burn-in"])
def test_dqn_td_error(collected, sampler_cls, pad, double_dqn, burn_in):
    """The DQN target bootstraps every slice from its stored state.

    The online pass over the current steps runs first and writes its final
    recurrent states under ``"next"``: the target must not read them. With
    burn-in, both passes warm up each slice on its burn-in rows.
    """
    _, rnn, data = collected
    sample = _sample(data, sampler_cls, pad, burn_in)
    qnet = _qvalue_net(rnn)
    loss = DQNLoss(
        qnet, action_space="one-hot", delay_value=True, double_dqn=double_dqn
    )
    loss.make_value_estimator(gamma=GAMMA)
    # a target network different from the online one
    with torch.no_grad():
        for p in loss.target_value_network_params.values(True, True):
            p.add_(0.1 * torch.randn_like(p))
    with loss.value_network_params.to_module(qnet):
        current_q, next_online_q = _per_slice(qnet, sample, "action_value")
    with loss.target_value_network_params.to_module(qnet):
        _, next_target_q = _per_slice(qnet, sample, "action_value")
    pred = (current_q * sample["action"]).sum(-1)
    if double_dqn:
        best = next_online_q.argmax(-1, keepdim=True)
        next_value = next_target_q.gather(-1, best).squeeze(-1)
    else:
        next_value = next_target_q.max(-1).values
    target = (
        sample["next", "reward"].squeeze(-1)
        + GAMMA * (~sample["next", "terminated"].squeeze(-1)).float() * next_value
    )
    out = sample.clone()
    loss(out)
    real = _real(sample)
    torch.testing.assert_close(
        out["td_error"].reshape(-1)[real],
        (pred - target).pow(2)[real],
        rtol=1e-5,
        atol=1e-5,
    )


def _policy(rnn):
    torch.manual_seed(4)
    head = Mod(nn.Linear(8, 2), in_keys=["features"], out_keys=["logits"])
    return ProbabilisticActor(
        Seq(rnn, head),
        in_keys=["logits"],
        distribution_class=OneHotCategorical,
        return_log_prob=True,
    )


@pytest.mark.parametrize("sampler_cls", SAMPLERS)
@pytest.mark.parametrize("pad", [False, True], ids=["ragged", "padded"])
@pytest.mark.parametrize("skip_done_states", [False, True])
def test_discrete_sac_td_error(collected, sampler_cls, pad, skip_done_states):
    """The next-step action distribution of a recurrent actor, slice by slice."""
    _, rnn, data = collected
    sample = _sample(data, sampler_cls, pad)
    actor = _policy(rnn)
    torch.manual_seed(5)
    qnet = Mod(nn.Linear(4, 2), in_keys=["observation"], out_keys=["action_value"])
    loss = DiscreteSACLoss(
        actor,
        qnet,
        action_space="one-hot",
        num_actions=2,
        num_qvalue_nets=1,
        skip_done_states=skip_done_states,
    )
    loss.make_value_estimator(gamma=GAMMA)
    with loss.actor_network_params.to_module(actor):
        _, next_logits = _per_slice(actor, sample, "logits")
    log_p = next_logits.log_softmax(-1)
    with torch.no_grad():
        with loss.target_qvalue_network_params[0].to_module(qnet):
            next_q = qnet(sample["next"].clone())["action_value"]
        with loss.qvalue_network_params[0].to_module(qnet):
            q = qnet(sample.clone())["action_value"]
    next_value = (log_p.exp() * (next_q - loss._alpha * log_p)).sum(-1)
    terminated = sample["next", "terminated"].squeeze(-1)
    target = sample["next", "reward"].squeeze(-1) + GAMMA * (~terminated) * next_value
    chosen = (q * sample["action"]).sum(-1)
    out = sample.clone()
    loss(out)
    real = _real(sample)
    torch.testing.assert_close(
        out["td_error"].reshape(-1)[real],
        (chosen - target).abs()[real],
        rtol=1e-5,
        atol=1e-5,
    )


def _collect_batched(kind):
    """The second ``[envs, time]`` batch of a collector over 3 CartPoles.

    Its rows continue the episodes of the first batch: each row starts with
    ``"is_init"`` ``False`` and a non-zero stored recurrent state.
    """
    torch.manual_seed(0)
    rnn = make_rnn(kind)
    head = Mod(nn.Linear(8, 2), in_keys=["features"], out_keys=["logits"])
    policy = ProbabilisticActor(
        Seq(rnn, head), in_keys=["logits"], distribution_class=OneHotCategorical
    )
    env = SerialEnv(3, make_cartpole)
    env.set_seed(0)
    collector = Collector(
        env,
        policy,
        frames_per_batch=3 * 40,
        total_frames=2 * 3 * 40,
        auto_register_policy_transforms=True,
    )
    batches = list(collector)
    collector.shutdown()
    data = batches[1]
    state_key = "recurrent_state_h" if kind == "lstm" else "recurrent_state"
    continuing = ~data["is_init"][:, 0].squeeze(-1)
    assert continuing.any()
    assert data[state_key][:, 0][continuing].abs().sum() > 0
    return rnn, data


@pytest.mark.parametrize("kind", ["lstm", "gru"])
@pytest.mark.parametrize("estimator_cls", [TD0Estimator, GAE])
def test_batched_rows_start_from_their_stored_state(kind, estimator_cls):
    """On a collected ``[envs, time]`` batch every row is its own sequence.

    The values at the current steps are those of the module called on the
    batch (which runs each row from its stored state), and each next step
    follows its own row, not the row before it.
    """
    rnn, data = _collect_batched(kind)
    value_net = _value_net(rnn)
    with torch.no_grad(), set_recurrent_mode(True):
        direct = value_net(data.clone())["state_value"]
    next_ref = []
    for row in data.unbind(0):
        row = row.clone()
        row["is_init"][0] = True  # a row starts from its stored state
        next_ref.append(_per_slice(value_net, row, "state_value")[1])
    next_ref = torch.stack(next_ref)
    kwargs = {"lmbda": 0.9} if estimator_cls is GAE else {}
    estimator = estimator_cls(gamma=GAMMA, value_network=value_net, **kwargs)
    out = data.clone()
    with torch.no_grad(), set_recurrent_mode(True):
        estimator(out)
    torch.testing.assert_close(out["state_value"], direct)
    torch.testing.assert_close(out["next", "state_value"], next_ref)
    # the stored markers of the batch are left as they were
    assert (out["is_init"] == data["is_init"]).all()


def _per_row(module, sample, key, mask_key=MASK):
    """``key`` at the current and the next step of every row, each row on its own.

    For a row ``t`` of a slice that starts at row ``s``: the module run on the
    steps ``s..t`` of the slice (burn-in rows included) followed by the row's
    own ``"next"`` step, from the state stored at ``s``. It makes no assumption
    on what the next step is. The rows outside the mask (padding, burn-in) are
    left at zero.
    """
    in_keys = [k for k in module.in_keys if k in sample.keys(True, True)]
    needed = sample.get(mask_key, torch.ones(sample.shape, dtype=torch.bool))
    content = needed | sample.get(BURN_IN, torch.zeros_like(needed))
    current = following = None
    with torch.no_grad(), set_recurrent_mode(True):
        for start, stop in _slices(sample):
            for t in range(start, stop):
                if not needed[t]:
                    continue
                rows = torch.arange(start, t + 1)[content[start : t + 1]]
                seq = torch.cat(
                    [
                        sample[rows].select(*in_keys),
                        sample[t : t + 1]["next"].select(*in_keys),
                    ]
                )
                seq["is_init"] = torch.zeros_like(seq["is_init"])
                seq["is_init"][0] = True
                out = module(seq.clone()).get(key)
                if current is None:
                    current = out.new_zeros(sample.shape + out.shape[1:])
                    following = torch.zeros_like(current)
                current[t], following[t] = out[-2], out[-1]
    return current, following


def _td_target(sample, next_value):
    """The TD(0) target, discounted by the steps to the next observation."""
    reward = sample["next", "reward"]
    steps = sample.get("steps_to_next_obs", torch.ones_like(reward)).view_as(reward)
    return (
        sample["next", "reward"]
        + GAMMA**steps * (~sample["next", "terminated"]).float() * next_value
    )


def _dqn_reference(loss, qnet, sample, double_dqn, mask_key=MASK):
    """The squared TD error of a DQN loss, every row bootstrapped on its own."""
    with loss.value_network_params.to_module(qnet):
        current_q, next_online_q = _per_row(qnet, sample, "action_value", mask_key)
    with loss.target_value_network_params.to_module(qnet):
        _, next_target_q = _per_row(qnet, sample, "action_value", mask_key)
    pred = (current_q * sample["action"]).sum(-1)
    if double_dqn:
        best = next_online_q.argmax(-1, keepdim=True)
        next_value = next_target_q.gather(-1, best)
    else:
        next_value = next_target_q.max(-1, keepdim=True).values
    return (pred - _td_target(sample, next_value).squeeze(-1)).pow(2)


def _dqn_loss(qnet, double_dqn):
    loss = DQNLoss(
        qnet, action_space="one-hot", delay_value=True, double_dqn=double_dqn
    )
    loss.make_value_estimator(gamma=GAMMA)
    # a target network different from the online one
    with torch.no_grad():
        for p in loss.target_value_network_params.values(True, True):
            p.add_(0.1 * torch.randn_like(p))
    return loss


@pytest.fixture(scope="module")
def multistep(collected):
    """The collected steps, rewritten by ``MultiStep(n_steps=3)``."""
    kind, rnn, data = collected
    data = MultiStep(gamma=GAMMA, n_steps=3)(data.unsqueeze(0)).squeeze(0)
    return kind, rnn, data


@pytest.mark.parametrize("pad", [False, True], ids=["ragged", "padded"])
class TestMultiStepNextStep:
    """On n-step data the next step of row ``t`` is ``t + n``, not ``t + 1``."""

    def _sample(self, data, pad):
        sample = _sample(data, SliceSampler, pad)
        # next steps several steps ahead in most rows
        assert (sample["steps_to_next_obs"] > 1).float().mean() > 0.5
        return sample

    def test_td0_value_estimate(self, multistep, pad):
        _, rnn, data = multistep
        sample = self._sample(data, pad)
        value_net = _value_net(rnn)
        _, next_ref = _per_row(value_net, sample, "state_value")
        estimator = TD0Estimator(gamma=GAMMA, value_network=value_net)
        with torch.no_grad(), set_recurrent_mode(True):
            target = estimator.value_estimate(sample.clone())
        real = _real(sample)
        torch.testing.assert_close(target[real], _td_target(sample, next_ref)[real])

    @pytest.mark.parametrize("double_dqn", [False, True])
    def test_dqn_td_error(self, multistep, pad, double_dqn):
        _, rnn, data = multistep
        sample = self._sample(data, pad)
        qnet = _qvalue_net(rnn)
        loss = _dqn_loss(qnet, double_dqn)
        expected = _dqn_reference(loss, qnet, sample, double_dqn)
        out = sample.clone()
        loss(out)
        real = _real(sample)
        torch.testing.assert_close(
            out["td_error"].reshape(-1)[real], expected[real], rtol=1e-5, atol=1e-5
        )


def _collect_set_truncated(kind):
    """Steps of a collector with ``set_truncated=True`` and short batches.

    ``done`` is set at every batch end while the trajectory (and its
    ``("collector", "traj_ids")``) goes on.
    """
    torch.manual_seed(0)
    rnn = make_rnn(kind)
    head = Mod(nn.Linear(8, 2), in_keys=["features"], out_keys=["logits"])
    policy = ProbabilisticActor(
        Seq(rnn, head), in_keys=["logits"], distribution_class=OneHotCategorical
    )
    env = make_cartpole()
    env.set_seed(0)
    collector = Collector(
        env,
        policy,
        frames_per_batch=7,
        total_frames=7 * 60,
        set_truncated=True,
        auto_register_policy_transforms=True,
    )
    data = torch.cat([batch.reshape(-1) for batch in collector])
    collector.shutdown()
    return rnn, data


@pytest.fixture(scope="module", params=["lstm", "gru"])
def collected_set_truncated(request):
    return request.param, *_collect_set_truncated(request.param)


def _assert_done_inside_slices(sample):
    """Some slice holds a ``done`` followed by a row that continues it."""
    done = sample["next", "done"].reshape(-1)
    is_init = sample["is_init"].reshape(-1)
    real = sample.get(MASK, torch.ones_like(done))
    assert (done[:-1] & ~is_init[1:] & real[1:]).any()


@pytest.mark.parametrize("pad", [False, True], ids=["ragged", "padded"])
@pytest.mark.parametrize("burn_in", [0, 4], ids=["no-burn-in", "burn-in"])
class TestDoneInsideSlice:
    """A ``done`` that does not end its trajectory does not end the sequence."""

    @pytest.mark.parametrize("estimator_cls", [TD0Estimator, GAE])
    def test_forward_values(self, collected_set_truncated, pad, burn_in, estimator_cls):
        _, rnn, data = collected_set_truncated
        sample = _sample(data, SliceSampler, pad, burn_in)
        _assert_done_inside_slices(sample)
        value_net = _value_net(rnn)
        current_ref, next_ref = _per_row(value_net, sample, "state_value")
        with torch.no_grad(), set_recurrent_mode(True):
            direct = value_net(sample.clone())["state_value"]
        kwargs = {"lmbda": 0.9} if estimator_cls is GAE else {}
        estimator = estimator_cls(gamma=GAMMA, value_network=value_net, **kwargs)
        out = sample.clone()
        with torch.no_grad(), set_recurrent_mode(True):
            estimator(out)
        real = _real(sample)
        # the current values are those of the module's own pass
        torch.testing.assert_close(out["state_value"][real], direct[real])
        torch.testing.assert_close(out["state_value"][real], current_ref[real])
        torch.testing.assert_close(out["next", "state_value"][real], next_ref[real])

    def test_dqn_td_error(self, collected_set_truncated, pad, burn_in):
        _, rnn, data = collected_set_truncated
        sample = _sample(data, SliceSampler, pad, burn_in)
        _assert_done_inside_slices(sample)
        qnet = _qvalue_net(rnn)
        loss = _dqn_loss(qnet, double_dqn=True)
        expected = _dqn_reference(loss, qnet, sample, double_dqn=True)
        out = sample.clone()
        loss(out)
        real = _real(sample)
        torch.testing.assert_close(
            out["td_error"].reshape(-1)[real], expected[real], rtol=1e-5, atol=1e-5
        )


@pytest.mark.parametrize("mask_key", [MASK, "my_mask"])
def test_dqn_custom_mask_key(mask_key):
    """The bootstrap pass reads the padding mask where the loss does.

    Row 0 of a collected ``[envs, time]`` batch is cut after a step that ends
    no episode and padded with copies of that step: its target bootstraps from
    its own next step, not from the padding after it.
    """
    rnn, data = _collect_batched("gru")
    data = data.clone()
    done = data["next", "done"][0].squeeze(-1)
    # the last real step of row 0: one that ends no episode, before its end
    last = int((~done[:-5]).nonzero().max())
    mask = torch.ones(data.shape, dtype=torch.bool)
    mask[0, last + 1 :] = False
    data[0, last + 1 :] = data[0, last : last + 1].expand(data.shape[1] - last - 1)
    data.set(mask_key, mask)
    qnet = _qvalue_net(rnn)
    loss = _dqn_loss(qnet, double_dqn=True)
    loss.set_keys(mask=mask_key)
    out = data.clone()
    loss(out)
    expected = []
    for row in data.unbind(0):
        row = row.clone()
        row["is_init"][0] = True  # a row starts from its stored state
        expected.append(_dqn_reference(loss, qnet, row, True, mask_key))
    expected = torch.stack(expected)
    torch.testing.assert_close(
        out["td_error"].squeeze(-1)[mask], expected[mask], rtol=1e-5, atol=1e-5
    )


@pytest.mark.parametrize(
    "sampler_cls", [*SAMPLERS, PrioritizedSliceSampler], ids=lambda c: c.__name__
)
@pytest.mark.parametrize("pad", [False, True], ids=["ragged", "padded"])
def test_plain_call_on_next_starts_every_slice(collected, sampler_cls, pad):
    """``module(sample["next"])`` under recurrent mode runs each slice on its own.

    The sampler marks every slice start in ``("next", "is_init")`` as at the
    root, so a loss written by hand that calls its network on the next steps
    does not carry the recurrent state from one slice into the next.
    """
    _, rnn, data = collected
    kwargs = {}
    if sampler_cls is PrioritizedSliceSampler:
        kwargs = {"max_capacity": data.shape[0], "alpha": 0.7, "beta": 0.9}
    sample = _sample(data, sampler_cls, pad, **kwargs)
    value_net = _value_net(rnn)
    with torch.no_grad(), set_recurrent_mode(True):
        flat = value_net(sample["next"].clone())["state_value"]
        per_slice = []
        for start, stop in _slices(sample):
            steps = sample[start:stop]["next"].clone()
            steps["is_init"] = torch.zeros_like(steps["is_init"])
            steps["is_init"][0] = True
            per_slice.append(value_net(steps)["state_value"])
    torch.testing.assert_close(flat, torch.cat(per_slice))

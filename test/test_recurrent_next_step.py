# Copyright (c) Meta Platforms, Inc. and affiliates.
#
# This source code is licensed under the MIT license found in the
# LICENSE file in the root directory of this source tree.
"""The next-step (bootstrap) pass of recurrent networks on flat slice samples.

A batch of several slices is evaluated at its next steps by the value
estimators and by losses that call their network on ``"next"``. Each slice
must start from the recurrent state stored at its first step, as if it were
run on its own: the reference below runs every slice, extended by its last
next step, through the same network separately.
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
    SliceSampler,
    SliceSamplerWithoutReplacement,
    TensorDictReplayBuffer,
)
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

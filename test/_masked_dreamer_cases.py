# Copyright (c) Meta Platforms, Inc. and affiliates.
#
# This source code is licensed under the MIT license found in the
# LICENSE file in the root directory of this source tree.
"""A small deterministic world model and sequence batches for DreamerModelLoss.

The world model is TorchRL's :class:`~torchrl.modules.models.model_based.RSSMRollout`
inside a :class:`~torchrl.modules.WorldModelWrapper`, over small networks whose
posterior state is its mean (no sampling), so that a padded batch and its
sequences run one by one can be compared exactly.

Also runnable as a script (``python _masked_dreamer_cases.py OUT``): it saves
the loss values and gradients on unmasked batches, to compare the fork with
pristine upstream bit for bit.
"""
from __future__ import annotations

import sys

import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule
from torch import nn

STATE, BELIEF, ACTION, LATENT = 3, 4, 2, 5
PIXELS = (1, 2, 2)
MASK_KEY = ("collector", "mask")


class _Prior(nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = nn.Linear(STATE + BELIEF + ACTION, BELIEF)
        self.mean = nn.Linear(BELIEF, STATE)
        self.std = nn.Linear(BELIEF, STATE)

    def forward(self, state, belief, action):
        belief = torch.tanh(self.rnn(torch.cat([state, belief, action], -1)))
        return self.mean(belief), nn.functional.softplus(self.std(belief)) + 0.1, belief


class _Posterior(nn.Module):
    def __init__(self):
        super().__init__()
        self.mean = nn.Linear(BELIEF + LATENT, STATE)
        self.std = nn.Linear(BELIEF + LATENT, STATE)

    def forward(self, belief, latent):
        x = torch.cat([belief, latent], -1)
        mean = self.mean(x)
        return mean, nn.functional.softplus(self.std(x)) + 0.1, mean


class _Head(nn.Module):
    def __init__(self, out, shape=None):
        super().__init__()
        self.net = nn.Linear(STATE + BELIEF, out)
        self.shape = shape

    def forward(self, state, belief):
        out = self.net(torch.cat([state, belief], -1))
        if self.shape is not None:
            out = out.unflatten(-1, self.shape)
        return out


def make_world_model():
    from torchrl.modules import SafeSequential, WorldModelWrapper
    from torchrl.modules.models.model_based import RSSMRollout

    torch.manual_seed(0)
    encoder = TensorDictModule(
        nn.Sequential(nn.Flatten(-3), nn.Linear(4, LATENT)),
        in_keys=[("next", "pixels")],
        out_keys=[("next", "encoded_latents")],
    )
    rollout = RSSMRollout(
        TensorDictModule(
            _Prior(),
            in_keys=["state", "belief", "action"],
            out_keys=[
                ("next", "prior_mean"),
                ("next", "prior_std"),
                ("next", "belief"),
            ],
        ),
        TensorDictModule(
            _Posterior(),
            in_keys=[("next", "belief"), ("next", "encoded_latents")],
            out_keys=[
                ("next", "posterior_mean"),
                ("next", "posterior_std"),
                ("next", "state"),
            ],
        ),
    )
    decoder = TensorDictModule(
        _Head(4, PIXELS),
        in_keys=[("next", "state"), ("next", "belief")],
        out_keys=[("next", "reco_pixels")],
    )
    reward = TensorDictModule(
        _Head(1),
        in_keys=[("next", "state"), ("next", "belief")],
        out_keys=[("next", "reward")],
    )
    return WorldModelWrapper(SafeSequential(encoder, rollout, decoder), reward)


class _Transition(nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = nn.Linear(STATE + BELIEF + ACTION, BELIEF)
        self.state = nn.Linear(BELIEF, STATE)

    def forward(self, state, belief, action):
        belief = torch.tanh(self.rnn(torch.cat([state, belief, action], -1)))
        return self.state(belief), belief


class _Policy(_Head):
    def forward(self, state, belief):
        return torch.tanh(super().forward(state, belief))


def make_actor_and_value_losses(horizon=3, **kwargs):
    """A DreamerActorLoss over a deterministic model-based env, and a DreamerValueLoss."""
    from torchrl.data import Bounded, Composite, Unbounded
    from torchrl.envs.model_based.dreamer import DreamerEnv
    from torchrl.modules import SafeSequential, WorldModelWrapper
    from torchrl.objectives import DreamerActorLoss, DreamerValueLoss

    torch.manual_seed(0)
    env = DreamerEnv(
        world_model=WorldModelWrapper(
            SafeSequential(
                TensorDictModule(
                    _Transition(),
                    in_keys=["state", "belief", "action"],
                    out_keys=["state", "belief"],
                )
            ),
            TensorDictModule(
                _Head(1), in_keys=["state", "belief"], out_keys=["reward"]
            ),
        ),
        prior_shape=torch.Size([STATE]),
        belief_shape=torch.Size([BELIEF]),
    )
    env.action_spec = Bounded(-1, 1, (ACTION,))
    env.observation_spec = Composite(state=Unbounded(STATE), belief=Unbounded(BELIEF))
    env.reward_spec = Unbounded(1)
    env.state_spec = Composite(state=Unbounded(STATE), belief=Unbounded(BELIEF))
    actor = TensorDictModule(
        _Policy(ACTION), in_keys=["state", "belief"], out_keys=["action"]
    )
    value = TensorDictModule(
        _Head(1), in_keys=["state", "belief"], out_keys=["state_value"]
    )
    actor_loss = DreamerActorLoss(
        actor, value, env, imagination_horizon=horizon, **kwargs
    )
    return actor_loss, DreamerValueLoss(value)


def actor_value_losses_and_grads(td, **kwargs):
    """The model loss's output through the actor and value losses."""
    _, model_out = make_loss()(td.clone())
    actor_loss, value_loss = make_actor_and_value_losses(**kwargs)
    out_actor, fake_data = actor_loss(model_out)
    actor_params = list(actor_loss.actor_model.parameters())
    grads_actor = torch.autograd.grad(out_actor["loss_actor"], actor_params)
    out_value, _ = value_loss(fake_data.detach())
    value_params = list(value_loss.value_model.parameters())
    grads_value = torch.autograd.grad(out_value["loss_value"], value_params)
    values = {
        "loss_actor": out_actor["loss_actor"].detach(),
        "loss_value": out_value["loss_value"].detach(),
    }
    return values, list(grads_actor) + list(grads_value)


def make_loss(**kwargs):
    from torchrl.objectives import DreamerModelLoss

    kwargs.setdefault("free_nats", 0.0)
    return DreamerModelLoss(make_world_model(), **kwargs)


def make_sequences(lengths, seed=1):
    """One ``[1, length]`` batch per sequence, as a world model reads them."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for length in lengths:
        shape = (1, length)
        out.append(
            TensorDict(
                {
                    "state": torch.zeros(*shape, STATE),
                    "belief": torch.zeros(*shape, BELIEF),
                    "action": torch.randn(*shape, ACTION, generator=g),
                    "next": {
                        "pixels": torch.randn(*shape, *PIXELS, generator=g),
                        "reward": torch.randn(*shape, 1, generator=g),
                        "done": torch.zeros(*shape, 1, dtype=torch.bool),
                        "terminated": torch.zeros(*shape, 1, dtype=torch.bool),
                    },
                },
                batch_size=shape,
            )
        )
    return out


def pad(sequences, pad_to, garbage=None, seed=0):
    """Stacks the sequences into ``[B, pad_to]``, padding after the real steps."""
    g = torch.Generator().manual_seed(seed + 7)
    rows, masks = [], []
    for seq in sequences:
        length = seq.shape[1]
        idx = torch.tensor(list(range(length)) + [length - 1] * (pad_to - length))
        row = seq[0][idx].clone()
        mask = torch.arange(pad_to) < length
        if garbage is not None:
            for _, value in row.items(True, True):
                n = int((~mask).sum())
                shape = (n,) + value.shape[1:]
                if value.dtype == torch.bool:
                    new = torch.randint(2, shape, generator=g).bool()
                elif garbage == "zeros":
                    new = torch.zeros(shape)
                elif garbage == "huge":
                    new = (torch.randint(2, shape, generator=g) * 2 - 1) * 3e38
                else:
                    new = torch.randn(shape, generator=g) * 1e3
                value[~mask] = new.to(value.dtype)
        rows.append(row)
        masks.append(mask)
    padded = torch.stack(rows, 0)
    padded.set(MASK_KEY, torch.stack(masks, 0))
    return padded


def loss_and_grads(loss, td):
    out, _ = loss(td.clone())
    keys = sorted(k for k in out.keys() if k.startswith("loss"))
    total = sum(out[k].sum() for k in keys)
    params = [p for p in loss.parameters() if p.requires_grad]
    grads = torch.autograd.grad(total, params, allow_unused=True)
    grads = [g if g is not None else torch.zeros_like(p) for g, p in zip(grads, params)]
    return {k: out[k].detach() for k in keys}, grads


OPTIONS = [
    {},
    {"global_average": True},
    {"delayed_clamp": True},
    {"reco_loss": "smooth_l1", "reward_loss": "smooth_l1"},
]


def _reference(path):
    results = {}
    for i, options in enumerate(OPTIONS):
        td = torch.cat(make_sequences((6, 6, 6)), 0)
        results[i] = loss_and_grads(make_loss(**options), td)
    for discount_loss in (True, False):
        td = torch.cat(make_sequences((6, 6, 6)), 0)
        results[("actor", discount_loss)] = actor_value_losses_and_grads(
            td, discount_loss=discount_loss
        )
    torch.save(results, path)


if __name__ == "__main__":
    _reference(sys.argv[1])

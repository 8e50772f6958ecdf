# Copyright (c) Meta Platforms, Inc. and affiliates.
#
# This source code is licensed under the MIT license found in the
# LICENSE file in the root directory of this source tree.
"""Loss modules and batches shared by the masked-loss tests.

Also runnable as a script (``python _masked_loss_cases.py OUT``): it computes
every covered loss on unmasked batches with fixed seeds and saves the loss
values and gradients to ``OUT``, so that the test can compare the fork against
pristine upstream (run with ``PYTHONPATH=build/upstream``) bit for bit.
"""
from __future__ import annotations

import sys

import torch
from tensordict import TensorDict
from tensordict.nn import NormalParamExtractor, TensorDictModule
from torch import nn

OBS = 3
ACT = 2
N_DISCRETE = 4
MASK_KEY = ("collector", "mask")


def _mlp(i, o):
    return nn.Sequential(nn.Linear(i, 8), nn.Tanh(), nn.Linear(8, o))


def _row_noise(loc, sample_shape):
    # noise that depends on the row's content only, not on the number of
    # rows: a padded batch and its ragged twin draw the same noise per row
    k = torch.arange(1, int(torch.Size(sample_shape).numel()) + 1, dtype=loc.dtype)
    k = k.reshape(tuple(sample_shape) + (1,) * loc.ndim)
    return torch.sin(loc.detach() * 12.9898 + 78.233 * k)


def _row_noise_tanh_normal():
    from torchrl.modules import TanhNormal

    class RowNoiseTanhNormal(TanhNormal):
        """A TanhNormal whose reparametrised noise is a function of each row."""

        def rsample(self, sample_shape=()):
            sample_shape = torch.Size(sample_shape)
            eps = _row_noise(self.loc, sample_shape)
            if not len(sample_shape):
                eps = eps.squeeze(0)
            x = self.loc + self.scale * eps
            for transform in self.transforms:
                x = transform(x)
            return x

        def sample(self, sample_shape=()):
            with torch.no_grad():
                return self.rsample(sample_shape)

    return RowNoiseTanhNormal


def _gaussian_actor(tanh=False):
    from torchrl.modules import IndependentNormal, ProbabilisticActor

    module = TensorDictModule(
        nn.Sequential(_mlp(OBS, 2 * ACT), NormalParamExtractor()),
        in_keys=["observation"],
        out_keys=["loc", "scale"],
    )
    if tanh:
        dist_class = _row_noise_tanh_normal()
        dist_kwargs = {}
    else:
        dist_class = IndependentNormal
        dist_kwargs = {}
    return ProbabilisticActor(
        module,
        in_keys=["loc", "scale"],
        distribution_class=dist_class,
        distribution_kwargs=dist_kwargs,
        return_log_prob=True,
        log_prob_key="action_log_prob",
    )


def _value():
    from torchrl.modules import ValueOperator

    return ValueOperator(_mlp(OBS, 1), in_keys=["observation"])


def _qvalue(batch_renorm=False):
    from torchrl.modules import ValueOperator

    class Q(nn.Module):
        def __init__(self):
            super().__init__()
            if batch_renorm:
                # CrossQ's critic: its batch statistics mix the rows
                from torchrl.modules import BatchRenorm1d

                self.net = nn.Sequential(BatchRenorm1d(OBS + ACT), _mlp(OBS + ACT, 1))
            else:
                self.net = _mlp(OBS + ACT, 1)

        def forward(self, obs, act):
            return self.net(torch.cat([obs, act], -1))

    return ValueOperator(Q(), in_keys=["observation", "action"])


#: losses whose batches hold one-hot actions over ``N_DISCRETE`` actions
DISCRETE = ("dqn", "dist_dqn", "discrete_sac", "discrete_cql", "discrete_iql")
ATOMS = 5
#: losses that take one-dimensional batches only (no ``[B, T]`` layout):
#: DistributionalDQNLoss checks it, BatchRenorm1d normalizes dim 1,
#: DiffusionBCLoss draws one diffusion step per leading row
FLAT_ONLY = ("dist_dqn", "crossq_bn", "diffusion_bc")


def _categorical_actor():
    from torchrl.data import OneHot
    from torchrl.modules import OneHotCategorical, ProbabilisticActor

    return ProbabilisticActor(
        TensorDictModule(
            _mlp(OBS, N_DISCRETE), in_keys=["observation"], out_keys=["logits"]
        ),
        in_keys=["logits"],
        spec=OneHot(N_DISCRETE),
        distribution_class=OneHotCategorical,
    )


def _make_discrete_loss(name, **kwargs):
    from torchrl import objectives
    from torchrl.data import OneHot
    from torchrl.modules import DistributionalQValueActor, QValueActor

    if name == "dist_dqn":
        actor = DistributionalQValueActor(
            nn.Sequential(
                _mlp(OBS, ATOMS * N_DISCRETE), nn.Unflatten(-1, (ATOMS, N_DISCRETE))
            ),
            in_keys=["observation"],
            spec=OneHot(N_DISCRETE),
            support=torch.linspace(-2, 2, ATOMS),
        )
        return objectives.DistributionalDQNLoss(actor, gamma=0.9, **kwargs)
    if name == "discrete_sac":
        qvalue = TensorDictModule(
            _mlp(OBS, N_DISCRETE), in_keys=["observation"], out_keys=["action_value"]
        )
        return objectives.DiscreteSACLoss(
            _categorical_actor(),
            qvalue,
            action_space="one-hot",
            num_actions=N_DISCRETE,
            **kwargs,
        )
    if name == "discrete_cql":
        actor = QValueActor(
            _mlp(OBS, N_DISCRETE), in_keys=["observation"], spec=OneHot(N_DISCRETE)
        )
        return objectives.DiscreteCQLLoss(actor, action_space="one-hot", **kwargs)
    if name == "discrete_iql":
        qvalue = TensorDictModule(
            _mlp(OBS, N_DISCRETE),
            in_keys=["observation"],
            out_keys=["state_action_value"],
        )
        value = TensorDictModule(
            _mlp(OBS, 1), in_keys=["observation"], out_keys=["state_value"]
        )
        return objectives.DiscreteIQLLoss(
            _categorical_actor(), qvalue, value, action_space="one-hot", **kwargs
        )
    raise ValueError(name)


N_AGENTS = 2
STATE = 4
#: losses without a ``reduction`` argument (they average)
MEAN_ONLY = ("qmixer",)
#: losses that read no mask unless given a key (``set_keys(mask=...)``)
OPT_IN = ("qmixer",)


def _make_qmixer_loss(reduction="mean", read_mask=True, **kwargs):
    from torchrl import objectives
    from torchrl.data import OneHot
    from torchrl.modules import QMixer, QValueModule, SafeSequential

    if reduction != "mean":
        raise ValueError("QMixerLoss has no reduction argument: it averages")
    local = SafeSequential(
        TensorDictModule(
            _mlp(OBS, N_DISCRETE),
            in_keys=[("agents", "observation")],
            out_keys=[("agents", "action_value")],
        ),
        QValueModule(
            action_value_key=("agents", "action_value"),
            out_keys=[
                ("agents", "action"),
                ("agents", "action_value"),
                ("agents", "chosen_action_value"),
            ],
            spec=OneHot(N_DISCRETE),
            action_space=None,
        ),
    )
    mixer = TensorDictModule(
        QMixer(
            state_shape=(STATE,), mixing_embed_dim=8, n_agents=N_AGENTS, device="cpu"
        ),
        in_keys=[("agents", "chosen_action_value"), "state"],
        out_keys=["chosen_action_value"],
    )
    loss = objectives.QMixerLoss(local, mixer, action_space="one-hot", **kwargs)
    if read_mask and hasattr(loss.tensor_keys, "mask"):
        # the fork's QMixerLoss reads a mask once given its key
        loss.set_keys(mask=MASK_KEY)
    return loss


class _DiscriminatorNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(_mlp(OBS + ACT, 1), nn.Sigmoid())

    def forward(self, obs, act):
        return self.net(torch.cat([obs, act], -1))


def make_loss(name: str, **kwargs):
    """Builds a covered loss with small networks (deterministic given the seed)."""
    from torchrl import objectives
    from torchrl.data import OneHot
    from torchrl.modules import QValueActor

    torch.manual_seed(0)
    if name in DISCRETE[1:]:
        return _make_discrete_loss(name, **kwargs)
    if name == "dqn":
        actor = QValueActor(
            _mlp(OBS, N_DISCRETE),
            in_keys=["observation"],
            spec=OneHot(N_DISCRETE),
        )
        return objectives.DQNLoss(
            actor, action_space="one-hot", delay_value=True, **kwargs
        )
    if name in ("a2c", "ppo", "clipppo", "klpenppo", "reinforce"):
        cls = {
            "a2c": objectives.A2CLoss,
            "ppo": objectives.PPOLoss,
            "clipppo": objectives.ClipPPOLoss,
            "klpenppo": objectives.KLPENPPOLoss,
            "reinforce": objectives.ReinforceLoss,
        }[name]
        actor = _gaussian_actor()
        value = _value()
        if name == "reinforce":
            loss = cls(actor, value, **kwargs)
        else:
            loss = cls(actor, value, **kwargs)
        return loss
    if name in ("sac", "cql", "iql"):
        actor = _gaussian_actor(tanh=True)
        q = _qvalue()
        if name == "sac":
            return objectives.SACLoss(
                actor, q, num_qvalue_nets=2, target_entropy=-float(ACT), **kwargs
            )
        if name == "cql":
            return objectives.CQLLoss(
                actor, q, target_entropy=-float(ACT), num_random=3, **kwargs
            )
        return objectives.IQLLoss(actor, q, _value(), num_qvalue_nets=2, **kwargs)
    if name == "qmixer":
        return _make_qmixer_loss(**kwargs)
    if name == "pilco":
        g = torch.Generator().manual_seed(3)
        weights = torch.randn(OBS, OBS, generator=g)
        return objectives.ExponentialQuadraticCost(
            target=torch.randn(OBS, generator=g),
            weights=weights @ weights.T + torch.eye(OBS),
            **kwargs,
        )
    if name in ("gail", "gail_gp"):
        discriminator = TensorDictModule(
            _DiscriminatorNet(),
            in_keys=["observation", "action"],
            out_keys=["d_logits"],
        )
        return objectives.GAILLoss(
            discriminator, use_grad_penalty=name == "gail_gp", **kwargs
        )
    if name == "diffusion_bc":
        from torchrl.modules import DiffusionActor

        actor = DiffusionActor(action_dim=ACT, obs_dim=OBS, num_steps=5)
        return objectives.DiffusionBCLoss(actor, **kwargs)
    if name == "dt":
        from torchrl.data import Bounded
        from torchrl.modules import ProbabilisticActor, TanhDelta

        actor = ProbabilisticActor(
            TensorDictModule(
                _mlp(OBS, ACT), in_keys=["observation"], out_keys=["param"]
            ),
            in_keys=["param"],
            distribution_class=TanhDelta,
            spec=Bounded(-1, 1, (ACT,)),
        )
        return objectives.DTLoss(actor, **kwargs)
    if name == "odt":
        return objectives.OnlineDTLoss(
            _gaussian_actor(tanh=True), target_entropy=-float(ACT), **kwargs
        )
    if name in ("redq", "redq_deprecated", "double_redq_deprecated"):
        from torchrl.objectives import deprecated

        cls = {
            "redq": objectives.REDQLoss,
            "redq_deprecated": deprecated.REDQLoss_deprecated,
            "double_redq_deprecated": deprecated.DoubleREDQLoss_deprecated,
        }[name]
        return cls(
            _gaussian_actor(tanh=True), _qvalue(), target_entropy=-float(ACT), **kwargs
        )
    if name in ("crossq", "crossq_bn"):
        q = _qvalue(batch_renorm=name == "crossq_bn")
        return objectives.CrossQLoss(
            _gaussian_actor(tanh=True), q, target_entropy=-float(ACT), **kwargs
        )
    if name in ("td3", "ddpg", "td3bc"):
        from torchrl.data import Bounded
        from torchrl.modules import Actor

        actor = Actor(
            nn.Sequential(_mlp(OBS, ACT), nn.Tanh()),
            in_keys=["observation"],
            spec=Bounded(-1, 1, (ACT,)),
        )
        q = _qvalue()
        if name in ("td3", "td3bc"):
            # no target-policy noise: it is drawn per row from the global RNG
            kwargs.setdefault("policy_noise", 0.0)
            cls = objectives.TD3Loss if name == "td3" else objectives.TD3BCLoss
            return cls(actor, q, action_spec=Bounded(-1, 1, (ACT,)), **kwargs)
        return objectives.DDPGLoss(actor, q, **kwargs)
    raise ValueError(name)


def make_batch(name: str, n: int, seed: int = 1) -> TensorDict:
    """A batch of ``n`` real transitions with the keys loss ``name`` reads."""
    g = torch.Generator().manual_seed(seed)
    td = TensorDict(
        {
            "observation": torch.randn(n, OBS, generator=g),
            "next": {
                "observation": torch.randn(n, OBS, generator=g),
                "reward": torch.randn(n, 1, generator=g),
                "done": torch.zeros(n, 1, dtype=torch.bool),
                "terminated": torch.zeros(n, 1, dtype=torch.bool),
                "truncated": torch.zeros(n, 1, dtype=torch.bool),
            },
        },
        batch_size=[n],
    )
    if name in DISCRETE:
        idx = torch.randint(N_DISCRETE, (n,), generator=g)
        td["action"] = torch.nn.functional.one_hot(idx, N_DISCRETE)
    else:
        td["action"] = torch.rand(n, ACT, generator=g) * 1.8 - 0.9
    if name in ("a2c", "ppo", "clipppo", "klpenppo", "reinforce"):
        td["action_log_prob"] = torch.randn(n, generator=g) - 2.0
    if name == "qmixer":
        idx = torch.randint(N_DISCRETE, (n, N_AGENTS), generator=g)
        td["agents"] = TensorDict(
            {
                "observation": torch.randn(n, N_AGENTS, OBS, generator=g),
                "action": torch.nn.functional.one_hot(idx, N_DISCRETE),
            },
            batch_size=[n, N_AGENTS],
        )
        td["state"] = torch.randn(n, STATE, generator=g)
        td["next", "agents"] = TensorDict(
            {"observation": torch.randn(n, N_AGENTS, OBS, generator=g)},
            batch_size=[n, N_AGENTS],
        )
        td["next", "state"] = torch.randn(n, STATE, generator=g)
    if name == "pilco":
        # a Gaussian belief over the state per row (PILCO's predicted states)
        factor = torch.randn(n, OBS, OBS, generator=g) * 0.3
        td["observation"] = TensorDict(
            {
                "mean": torch.randn(n, OBS, generator=g),
                "var": factor @ factor.transpose(-1, -2) + 0.1 * torch.eye(OBS),
            },
            batch_size=[n],
        )
    if name in ("gail", "gail_gp"):
        td["collector_observation"] = torch.randn(n, OBS, generator=g)
        td["collector_action"] = torch.rand(n, ACT, generator=g) * 1.8 - 0.9
    if name == "klpenppo":
        td["loc"] = torch.randn(n, ACT, generator=g)
        td["scale"] = torch.rand(n, ACT, generator=g) + 0.5
    return td


def slice_batches(
    name: str,
    lengths,
    pad_to: int,
    seed: int = 1,
    garbage: str | None = None,
    weights: bool = False,
    prepare=None,
):
    """A ragged batch of slices and its padded twin.

    The ragged batch concatenates slices of the given ``lengths`` (the truncation
    marker on the last step of each slice, as ``SliceSampler`` writes it). The
    padded batch pads every slice to ``pad_to`` steps in the layout of
    ``SliceSampler(pad_output=True)``: padded rows repeat the slice's last real
    step and ``("collector", "mask")`` is ``False`` on them. ``garbage`` then
    overwrites the padded rows' content: ``"zeros"`` (like ``split_trajs``),
    ``"huge"`` (extreme finite values) or ``"random"``. ``prepare``, if given,
    is called on the ragged batch before it is padded (to add entries).
    """
    lengths = list(lengths)
    real = make_batch(name, sum(lengths), seed)
    ends = torch.tensor(lengths).cumsum(0) - 1
    real["next", "truncated"][ends] = True
    real["next", "done"][ends] = True
    if weights:
        g = torch.Generator().manual_seed(seed + 1)
        real["priority_weight"] = torch.rand(sum(lengths), generator=g) + 0.5
    if prepare is not None:
        prepare(real)
    idx, mask = [], []
    start = 0
    for length in lengths:
        idx += list(range(start, start + length))
        idx += [start + length - 1] * (pad_to - length)
        mask += [True] * length + [False] * (pad_to - length)
        start += length
    padded = real[torch.tensor(idx)]
    mask = torch.tensor(mask)
    if garbage is not None:
        padded = fill_garbage(padded, mask, garbage, seed)
    padded.set(MASK_KEY, mask)
    return real, padded


def split_trajs_layout(padded: TensorDict, lengths) -> TensorDict:
    """Reshapes a padded batch to ``[num_slices, pad_to]`` like ``split_trajs``.

    The end of each slice's real data loses its done/truncated marker, as the
    last step of a trajectory cut by the end of a collector batch does.
    """
    padded = padded.reshape(len(lengths), -1).clone()
    for row, length in enumerate(lengths):
        padded["next", "done"][row, length - 1] = False
        padded["next", "truncated"][row, length - 1] = False
    return padded


def fill_garbage(td, mask, kind, seed=0):
    """Overwrites the rows where ``mask`` is ``False`` with finite garbage."""
    g = torch.Generator().manual_seed(seed + 7)
    td = td.clone()
    pad = ~mask
    n_pad = int(pad.sum())
    for key, value in td.items(True, True):
        shape = (n_pad,) + value.shape[1:]
        leaf = key[-1] if isinstance(key, tuple) else key
        if leaf == "action" and not value.dtype.is_floating_point:
            # another one-hot action, so that the batch stays valid without
            # its mask (the controls compute the loss on it)
            idx = torch.randint(value.shape[-1], shape[:-1], generator=g)
            new = torch.nn.functional.one_hot(idx, value.shape[-1])
        elif leaf == "var":
            # another covariance, so that the batch stays valid without its mask
            factor = torch.randn(shape, generator=g) * 10
            new = factor @ factor.transpose(-1, -2) + torch.eye(shape[-1])
        elif value.dtype == torch.bool:
            new = torch.randint(2, shape, generator=g).bool()
        elif not value.dtype.is_floating_point:
            new = torch.randint(3, shape, generator=g).to(value.dtype)
        elif kind == "zeros":
            new = torch.zeros(shape)
        elif kind == "huge":
            sign = torch.randint(2, shape, generator=g) * 2 - 1
            new = sign * torch.full(shape, 3e38)
        else:
            new = torch.randn(shape, generator=g) * 1e3
        value[pad] = new.to(value.dtype)
    return td


def loss_and_grads(loss_module, td, reduction_keys=None):
    """Sums the ``loss_*`` entries, back-propagates and returns values and grads."""
    out = loss_module(td.clone())
    keys = [k for k in out.keys() if k.startswith("loss")]
    if reduction_keys is not None:
        keys = [k for k in keys if k in reduction_keys]
    total = sum(out[k].sum() for k in keys)
    params = [p for p in loss_module.parameters() if p.requires_grad]
    if not params:
        # a cost without parameters (PILCO's): its gradients are the inputs'
        return {k: out[k].detach() for k in keys}, []
    grads = torch.autograd.grad(total, params, allow_unused=True)
    grads = [g if g is not None else torch.zeros_like(p) for g, p in zip(grads, params)]
    return {k: out[k].detach() for k in keys}, grads


COVERED = [
    "dqn",
    "a2c",
    "ppo",
    "clipppo",
    "klpenppo",
    "reinforce",
    "sac",
    "td3",
    "ddpg",
    "iql",
    "cql",
    "dist_dqn",
    "discrete_sac",
    "discrete_cql",
    "discrete_iql",
    "td3bc",
    "crossq",
    "crossq_bn",
    "redq",
    "redq_deprecated",
    "dt",
    "odt",
    "gail",
    "gail_gp",
    "diffusion_bc",
    "qmixer",
    "double_redq_deprecated",
    "pilco",
]

#: every loss class of ``torchrl.objectives`` and what it does with the mask:
#: ``("covered", cases)`` and ``("opt-in", cases)`` name the cases of
#: ``COVERED`` that build it (or the test module of its own), ``("raises",
#: cls)`` means it raises a ValueError on a padded batch (in ``cls.forward``).
#: The docs' table lists the same classes with the same status.
LOSS_STATUS = {
    "DQNLoss": ("covered", ("dqn",)),
    "DistributionalDQNLoss": ("covered", ("dist_dqn",)),
    "A2CLoss": ("covered", ("a2c",)),
    "PPOLoss": ("covered", ("ppo",)),
    "ClipPPOLoss": ("covered", ("clipppo",)),
    "KLPENPPOLoss": ("covered", ("klpenppo",)),
    "ReinforceLoss": ("covered", ("reinforce",)),
    "SACLoss": ("covered", ("sac",)),
    "DiscreteSACLoss": ("covered", ("discrete_sac",)),
    "TD3Loss": ("covered", ("td3",)),
    "TD3BCLoss": ("covered", ("td3bc",)),
    "DDPGLoss": ("covered", ("ddpg",)),
    "IQLLoss": ("covered", ("iql",)),
    "DiscreteIQLLoss": ("covered", ("discrete_iql",)),
    "CQLLoss": ("covered", ("cql",)),
    "DiscreteCQLLoss": ("covered", ("discrete_cql",)),
    "CrossQLoss": ("covered", ("crossq", "crossq_bn")),
    "REDQLoss": ("covered", ("redq",)),
    "REDQLoss_deprecated": ("covered", ("redq_deprecated",)),
    "DoubleREDQLoss_deprecated": ("covered", ("double_redq_deprecated",)),
    "DTLoss": ("covered", ("dt",)),
    "OnlineDTLoss": ("covered", ("odt",)),
    "GAILLoss": ("covered", ("gail", "gail_gp")),
    "DiffusionBCLoss": ("covered", ("diffusion_bc",)),
    "QMixerLoss": ("opt-in", ("qmixer",)),
    # [batch, time] world-model sequences: their own cases and tests
    "DreamerModelLoss": ("covered", "test_masked_dreamer"),
    "DreamerActorLoss": ("covered", "test_masked_dreamer"),
    "DreamerValueLoss": ("covered", "test_masked_dreamer"),
    "ExponentialQuadraticCost": ("covered", ("pilco",)),
    # LLM losses: rows are whole conversations, tokens carry their own masks
    "GRPOLoss": ("raises", "GRPOLoss"),
    "DAPO": ("raises", "GRPOLoss"),
    "CISPOLoss": ("raises", "GRPOLoss"),
    "SFTLoss": ("raises", "SFTLoss"),
}


def loss_classes():
    """Every public loss class defined in ``torchrl.objectives`` and its subpackages."""
    import importlib
    import pkgutil

    import torchrl.objectives as objectives

    for info in pkgutil.walk_packages(objectives.__path__, "torchrl.objectives."):
        importlib.import_module(info.name)
    found, todo = set(), [objectives.LossModule]
    while todo:
        for cls in todo.pop().__subclasses__():
            if cls not in found:
                found.add(cls)
                todo.append(cls)
    return sorted(
        (
            cls
            for cls in found
            if cls.__module__.startswith("torchrl.objectives.")
            and not cls.__name__.startswith("_")
        ),
        key=lambda cls: cls.__name__,
    )


# CQL's cql term draws uniform random actions from the global RNG, row after
# row: its padded batches keep the real rows first so that they draw the
# same random actions as the ragged batch.
LAYOUTS = {"cql": ((7,), 10)}
# 0.12.0's cql term broadcast every row against every other row (fixed here)
CHANGED_FROM_UPSTREAM = {"cql": ("loss_cql", "loss_alpha_prime")}


def reductions(name):
    """The reductions loss ``name`` takes."""
    return ("mean",) if name in MEAN_ONLY else ("mean", "sum", "none")


def layout(name):
    """The slice lengths and padded length used for loss ``name``."""
    return LAYOUTS.get(name, ((3, 5, 2), 6))


ESTIMATORS = ["TD0Estimator", "TD1Estimator", "TDLambdaEstimator", "GAE", "VTrace"]
# 0.12.0's V-Trace advantage at a truncation inside the batch bootstrapped
# from the next trajectory's first step (fixed: from the next observation)
CHANGED_ESTIMATORS = ("VTrace",)


def make_estimator(name: str, masked: bool = False, **kwargs):
    """A value estimator over a small value network (deterministic).

    With ``masked=True`` the estimator is given ``MASK_KEY`` explicitly (the
    key a stand-alone estimator reads by default).
    """
    from torchrl.objectives import value

    torch.manual_seed(0)
    kwargs.setdefault("gamma", 0.9)
    if name in ("TDLambdaEstimator", "GAE"):
        kwargs.setdefault("lmbda", 0.8)
    if name == "VTrace":
        # the behaviour policy's log-probabilities are the batch's
        kwargs.setdefault("actor_network", _gaussian_actor())
    estimator = getattr(value, name)(value_network=_value(), **kwargs)
    if masked:
        estimator.set_keys(mask=MASK_KEY)
    return estimator


def _reference(path):
    results = {}
    for name in ESTIMATORS:
        real, padded = slice_batches("ppo", (3, 5, 2), 6)
        out = make_estimator(name)(real)
        results[("estimator", name)] = (
            {
                k: out[k].detach()
                for k in ("advantage", "value_target", ("next", "done"))
            },
            [],
        )
        # an estimator told to read no mask computes what 0.12.0 computes
        padded = split_trajs_layout(padded, (3, 5, 2))
        estimator = make_estimator(name)
        if hasattr(estimator.tensor_keys, "mask"):
            estimator.set_keys(mask=None)
        out = estimator(padded)
        results[("estimator-padded", name)] = (
            {
                k: out[k].detach()
                for k in ("advantage", "value_target", ("next", "done"))
            },
            [],
        )
    # QMixerLoss without a mask key ignores any mask, all-False included
    _, padded = slice_batches("qmixer", (3, 5, 2), 6, garbage="random")
    mask = padded.get(MASK_KEY)
    for i, other in enumerate((mask, torch.zeros_like(mask), mask.unsqueeze(-1))):
        torch.manual_seed(0)
        loss = _make_qmixer_loss(read_mask=False)
        torch.manual_seed(2)
        td = padded.clone().set(MASK_KEY, other)
        results[("qmixer-no-key", i)] = loss_and_grads(loss, td)
    for name in COVERED:
        # every tensor the loss reports (logged statistics included)
        loss = make_loss(name)
        torch.manual_seed(2)
        out = loss(make_batch(name, 10))
        if isinstance(out, tuple):
            out = out[0]
        results[("outputs", name)] = (
            {
                key: value.detach()
                for key, value in out.items(True, True)
                if isinstance(value, torch.Tensor)
                and key not in CHANGED_FROM_UPSTREAM.get(name, ())
            },
            [],
        )
        for reduction in reductions(name):
            loss = make_loss(name, reduction=reduction)
            td = make_batch(name, 10)
            torch.manual_seed(2)
            keys = None
            if name in CHANGED_FROM_UPSTREAM:
                keys = [
                    k
                    for k in loss.out_keys
                    if k.startswith("loss") and k not in CHANGED_FROM_UPSTREAM[name]
                ]
            values, grads = loss_and_grads(loss, td, keys)
            results[(name, reduction)] = (values, grads)
            if name in CHANGED_FROM_UPSTREAM:
                loss = make_loss(name, reduction=reduction)
                torch.manual_seed(2)
                out = loss(td.clone())
                results[("changed", name, reduction)] = (
                    {
                        k: out[k].detach()
                        for k in CHANGED_FROM_UPSTREAM[name]
                        if k in out.keys()
                    },
                    [],
                )
    torch.save(results, path)


if __name__ == "__main__":
    _reference(sys.argv[1])

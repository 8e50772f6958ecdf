# Copyright (c) Meta Platforms, Inc. and affiliates.
#
# This source code is licensed under the MIT license found in the
# LICENSE file in the root directory of this source tree.
"""Points a warning at the user's line, however deep inside torchrl it is raised."""
from __future__ import annotations

import os
import sys

_TORCHRL_DIR = os.path.dirname(os.path.abspath(__file__))


def _user_stacklevel() -> int:
    """Returns the ``stacklevel`` that points at the first frame outside of torchrl.

    Call it in the argument list of :func:`warnings.warn`. Metaclasses,
    collector factories, samplers and private helpers add a variable number of
    frames between the user's line and the warning; counting them makes the
    warning point at the user's code whatever the path.
    """
    frame = sys._getframe(1)
    level = 1
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(
        _TORCHRL_DIR + os.sep
    ):
        frame = frame.f_back
        level += 1
    return level

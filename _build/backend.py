"""gputrain's build backend: setuptools', plus NVIDIA's CUDA wheels as build requirements when
the CUDA backend is to be built from them (gputrain_cuda.choose()). On a platform gputrain does not
build on (gputrain_platform), the first hook of a wheel build stops with that message."""

from setuptools import build_meta as _setuptools
from setuptools.build_meta import *  # noqa: F401,F403  (every hook setuptools provides)

import gputrain_cuda
import gputrain_platform


def _cuda_wheels() -> list[str]:
    return gputrain_cuda.WHEELS_FOR_BUILD if gputrain_cuda.choose().kind == "wheels" else []


def get_requires_for_build_wheel(config_settings=None):
    gputrain_platform.check()
    return _setuptools.get_requires_for_build_wheel(config_settings) + _cuda_wheels()


def get_requires_for_build_editable(config_settings=None):
    gputrain_platform.check()
    return _setuptools.get_requires_for_build_editable(config_settings) + _cuda_wheels()

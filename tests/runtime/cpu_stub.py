"""The one import stub the CPU probes need: ``torchvision``.

``sglang.srt.configs`` imports it at load (unused by the code under test); its PyPI
wheel links ``libc10_cuda.so``, which a CPU torch lacks, so it cannot load here.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
from types import ModuleType
from unittest import mock


class _StubModule(ModuleType):
    __path__: list[str] = []

    def __getattr__(self, name: str) -> object:
        return mock.MagicMock(name=f"{self.__name__}.{name}")


class _GpuOnlyStub(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serve a placeholder for torchvision (CUDA-linked wheel), see the docstring."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname == "torchvision" or fullname.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        return _StubModule(spec.name)

    def exec_module(self, module):
        pass


def install() -> None:
    if importlib.util.find_spec("torchvision") is None:
        sys.meta_path.insert(0, _GpuOnlyStub())

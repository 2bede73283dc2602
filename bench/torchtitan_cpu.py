"""Running TorchTitan's trainer on a machine without an accelerator (glue of ours; TorchTitan itself is unchanged).

Why it does not run there as installed (TorchTitan 0.2.2; 0.3.0 has the same code):
- `torchtitan/tools/utils.py`, `get_device_info()`: `device_type = _get_available_device_type() or "cuda"`, so
  with no accelerator the device type is "cuda" and the device module `torch.cuda`. `Trainer.__init__`
  (`torchtitan/train.py`, line 90) then calls `torch.cuda.set_device(torch.device("cuda:0"))`, which fails on a
  machine without a GPU: "RuntimeError: Found no NVIDIA driver on your system" (PyPI's CUDA build of torch 2.13).
- Its memory monitor (`torchtitan/components/metrics.py`, `DeviceMemoryMonitor`) calls `get_device_name`,
  `get_device_properties`, `memory_stats`, `reset_peak_memory_stats` and `empty_cache` on the device module;
  `torch.cpu` has none of them, so setting the device type to "cpu" alone fails there
  ("module 'torch.cpu' has no attribute 'get_device_name'").
- Under FSDP on gloo its gradient reduction fails: "RuntimeError: Cannot use ReduceOp.PREMUL_SUM with Gloo".
  `parallelize_llama` sets every FSDP module's gradient divide factor to 1 (`disable_fsdp_gradient_division`: the
  loop scales by the global token count itself), and FSDP2 then reduce-scatters with PREMUL_SUM(1 / 1), an op only
  NCCL has. `sum_reductions_on_gloo` turns on FSDP2's own `set_force_sum_reduction_for_comms`: a plain SUM and a
  division by that same factor of 1, the same gradients.
There is no setting for either (TorchTitan issue #1661, "CPU Mode Request", is open). `use_cpu_if_no_accelerator`
sets the device type to "cpu" where TorchTitan's modules bound it, with a device module that answers those calls
from the process's peak RSS. The rest follows from the device type: its process group backend is gloo
(`Backend.default_device_backend_map["cpu"]`), the model is materialised on the CPU.
"""

from __future__ import annotations

import os
import resource
import sys
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import FSDPModule


def _peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


class CpuDeviceModule:
    """The calls TorchTitan makes on its device module, for the CPU; memory figures are the process's peak RSS."""

    set_device = staticmethod(torch.cpu.set_device)
    synchronize = staticmethod(torch.cpu.synchronize)
    device_count = staticmethod(torch.cpu.device_count)
    is_available = staticmethod(torch.cpu.is_available)

    @staticmethod
    def current_device() -> int:
        # An index, as torch.cuda's: TorchTitan passes it to barrier(device_ids=[...]) (torch.cpu's is "cpu")
        return 0

    @staticmethod
    def get_device_name(device: Any = None) -> str:
        return "cpu"

    @staticmethod
    def get_device_properties(device: Any = None) -> SimpleNamespace:
        return SimpleNamespace(total_memory=os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))

    @staticmethod
    def memory_stats(device: Any = None) -> dict[str, int]:
        peak = _peak_rss()
        return {"active_bytes.all.peak": peak, "reserved_bytes.all.peak": peak, "num_alloc_retries": 0,
                "num_ooms": 0}

    @staticmethod
    def reset_peak_memory_stats(device: Any = None) -> None:
        pass  # a process's peak RSS cannot be reset; the figures are peaks since the start

    @staticmethod
    def empty_cache() -> None:
        pass


def use_cpu_if_no_accelerator() -> str:
    """The device TorchTitan will train on: its own choice where it has an accelerator; otherwise "cpu", set in
    every TorchTitan module that bound its `device_type` / `device_module` at import (imported here first)."""
    import torchtitan.tools.utils as titan_utils

    if torch._utils._get_available_device_type() is not None:
        return str(titan_utils.device_type)
    import torchtitan.train  # noqa: F401  (every module the trainer imports binds the names now; patched below)

    for name, module in list(sys.modules.items()):
        if not name.startswith("torchtitan") or module is None:
            continue
        if getattr(module, "device_type", None) == "cuda":
            setattr(module, "device_type", "cpu")
        if getattr(module, "device_module", None) is torch.cuda:
            setattr(module, "device_module", CpuDeviceModule)
    return "cpu"


def sum_reductions_on_gloo(parallelize_fn: Callable[..., nn.Module]) -> Callable[..., nn.Module]:
    """TorchTitan's parallelize function, then FSDP2's sum-only reductions when the process group is gloo."""

    def parallelize(model: nn.Module, *args: Any, **kwargs: Any) -> nn.Module:
        model = parallelize_fn(model, *args, **kwargs)
        if dist.is_initialized() and dist.get_backend() == "gloo":
            for module in model.modules():
                if isinstance(module, FSDPModule):
                    module.set_force_sum_reduction_for_comms(True)
        return model

    return parallelize

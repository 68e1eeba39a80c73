"""Dtype policy (fp32 / bf16 / fp16 parameters and compute) and fp16 loss scaling.

fp16 has a narrow exponent range: small gradients underflow to 0. ``LossScaler`` multiplies
the loss by a large factor before backward, divides the gradients back before the optimizer
step, skips the step when a gradient is inf/nan, and adapts the factor - the scheme of
``torch.amp.GradScaler``, written with plain tensor ops so it also runs on CPU.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

import torch

from entrogym.dtypes import DTYPE_NAMES, NATIVE_CPU_FLAGS, cpu_has_native, torch_dtype

DTYPES: dict[str, torch.dtype] = {name: torch_dtype(name) for name in DTYPE_NAMES}
_ALIASES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "half": "fp16"}


def resolve_dtype(name: str | torch.dtype) -> torch.dtype:
    if isinstance(name, torch.dtype):
        if name in DTYPES.values():
            return name
        raise ValueError(f"dtype must be one of {list(DTYPES)}, got {name}")
    key = _ALIASES.get(str(name), str(name))
    if key not in DTYPES:
        raise ValueError(f"dtype must be one of {list(DTYPES)}, got {name!r}")
    return DTYPES[key]


def _probe(dtype: torch.dtype, device: torch.device) -> None:
    """Run the ops a training step needs (matmul, softmax, backward) in ``dtype``."""
    x = torch.randn(4, 8, device=device, dtype=dtype, requires_grad=True)
    w = torch.randn(8, 8, device=device, dtype=dtype)
    torch.softmax(x @ w, -1).sum().backward()


def check_device_dtype(device: str | torch.device, dtype: torch.dtype) -> torch.device:
    """Fail early, with what to do, when ``device`` cannot run ``dtype``."""
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device='cuda' was requested but CUDA is not available; use device='cpu'")
    if dtype == torch.bfloat16 and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise ValueError(
            f"{device} does not support bf16; use dtype='fp16' (with loss scaling) or 'fp32'"
        )
    if device.type == "cpu" and not cpu_has_native(dtype):
        name = next(k for k, v in DTYPES.items() if v == dtype)
        wanted = " or ".join(NATIVE_CPU_FLAGS[name][:2]).upper()
        raise ValueError(
            f"dtype={name!r}: this CPU has no native {name} arithmetic (no {wanted} flag), so "
            f"{name} would be emulated and slower than fp32; use dtype='fp32'"
        )
    if dtype != torch.float32:
        try:
            _probe(dtype, device)
        except (RuntimeError, NotImplementedError) as exc:
            name = next(k for k, v in DTYPES.items() if v == dtype)
            raise ValueError(
                f"dtype={name!r} cannot run on device {device} ({exc}); use dtype='fp32' "
                "or a device that supports it"
            ) from exc
    return device


def apply_threads(n: int) -> int:
    """Use ``n`` torch intra-op threads in this process (and its children, via the OpenMP/MKL
    environment variables). Returns the previous count.

    On a shared, loaded machine fewer threads can be much faster: with other processes
    competing for the cores, 2 threads made HF generation 5-9x slower than 1 (barrier waits on
    a descheduled thread); see docs/performance.md.
    """
    cores = os.cpu_count() or 1
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= cores:
        raise ValueError(
            f"threads must be an integer from 1 to {cores} (this machine's CPU count), got {n!r}"
        )
    previous = torch.get_num_threads()
    torch.set_num_threads(n)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(n)
    return previous


class LossScaler:
    """Dynamic loss scaling: ``scale(loss).backward(); unscale_(opt); clip; step(opt); update()``.

    With ``enabled=False`` (fp32/bf16) every method is a pass-through, so the trainer's loop
    is the same for all dtypes.
    """

    def __init__(
        self,
        init_scale: float = 2.0**16,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 2000,
        enabled: bool = True,
    ) -> None:
        if init_scale <= 0 or growth_factor <= 1 or not 0 < backoff_factor < 1:
            raise ValueError("need init_scale > 0, growth_factor > 1 and 0 < backoff_factor < 1")
        if growth_interval < 1:
            raise ValueError(f"growth_interval must be >= 1, got {growth_interval}")
        self.enabled = enabled
        self.scale_value = float(init_scale)
        self.growth_factor = growth_factor
        self.backoff_factor = backoff_factor
        self.growth_interval = growth_interval
        self.growth_tracker = 0  # steps in a row without inf/nan
        self._unscaled: set[int] = set()
        self._found_inf = False

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        return loss * self.scale_value if self.enabled else loss

    @staticmethod
    def _params(optimizer: torch.optim.Optimizer) -> Iterable[torch.Tensor]:
        for group in optimizer.param_groups:
            yield from (p for p in group["params"] if p.grad is not None)

    def unscale_(self, optimizer: torch.optim.Optimizer) -> bool:
        """Divide the optimizer's gradients by the scale (once per step); True if any is inf/nan."""
        if not self.enabled or id(optimizer) in self._unscaled:
            return self._found_inf
        inv = 1.0 / self.scale_value
        for p in self._params(optimizer):
            p.grad.mul_(inv)
            if not torch.isfinite(p.grad).all():
                self._found_inf = True
        self._unscaled.add(id(optimizer))
        return self._found_inf

    def step(self, optimizer: torch.optim.Optimizer) -> bool:
        """Unscale if not done, then step unless a gradient overflowed. Returns whether it stepped."""
        if not self.enabled:
            optimizer.step()
            return True
        self.unscale_(optimizer)
        if self._found_inf:
            return False
        optimizer.step()
        return True

    def mark_overflow(self) -> None:
        """Count this step as an overflow (a caller found its gradients non-finite): an
        enabled scaler backs off in :meth:`update` (a disabled one has nothing to adapt)."""
        self._found_inf = self.enabled

    def update(self) -> None:
        """Back off after an overflow, grow after ``growth_interval`` clean steps."""
        if not self.enabled:
            return
        if self._found_inf:
            self.scale_value *= self.backoff_factor
            self.growth_tracker = 0
        else:
            self.growth_tracker += 1
            if self.growth_tracker >= self.growth_interval:
                self.scale_value *= self.growth_factor
                self.growth_tracker = 0
        self._unscaled.clear()
        self._found_inf = False

    def state_dict(self) -> dict:
        return {
            "enabled": self.enabled,
            "scale": self.scale_value,
            "growth_factor": self.growth_factor,
            "backoff_factor": self.backoff_factor,
            "growth_interval": self.growth_interval,
            "growth_tracker": self.growth_tracker,
        }

    def load_state_dict(self, state: dict) -> None:
        self.enabled = bool(state["enabled"])
        self.scale_value = float(state["scale"])
        self.growth_factor = float(state["growth_factor"])
        self.backoff_factor = float(state["backoff_factor"])
        self.growth_interval = int(state["growth_interval"])
        self.growth_tracker = int(state["growth_tracker"])


def loss_scaler_for(dtype: torch.dtype, **kwargs) -> LossScaler:
    """Loss scaling is on for fp16 only; bf16 and fp32 share fp32's exponent range."""
    return LossScaler(enabled=dtype == torch.float16, **kwargs)

"""Page-locking in place. Without a GPU a stand-in for torch's CUDA runtime answers cudaHostRegister, as the real
one does, with 0 or an error code; the GPU tier has CUDA refuse for real."""

from __future__ import annotations

import gc
import mmap
from types import SimpleNamespace

import pytest
import torch

from lightning_strategies import pinned


def runtime(answer: int, calls: list[tuple[str, int]]) -> SimpleNamespace:
    def register(pointer: int, size: int, flags: int) -> int:
        calls.append(("register", size))
        return answer

    return SimpleNamespace(cudaHostRegister=register, cudaHostUnregister=lambda pointer: calls.append(("free", 0)))


def test_a_refused_registration_names_the_size_and_what_limits_it_and_clears_the_error(monkeypatch):
    calls: list[tuple[str, int]] = []
    monkeypatch.setattr(torch.cuda, "cudart", lambda: runtime(2, calls))
    monkeypatch.setattr(pinned, "_read_off_last_error", lambda: calls.append(("read off", 0)))
    with pytest.raises(pinned.PinningError, match=r"page-lock 0\.50 GiB .* error 2\).*ulimit -l"):
        pinned.pin_in_place(torch.empty(2**27, dtype=torch.float32))
    # CUDA's last error is read off before the error is raised: a caller may go on without pinning.
    assert calls == [("register", 2**29), ("read off", 0)]


def test_registered_memory_is_unregistered_when_its_tensor_goes(monkeypatch):
    calls: list[tuple[str, int]] = []
    monkeypatch.setattr(torch.cuda, "cudart", lambda: runtime(0, calls))
    tensor = torch.empty(10, dtype=torch.float16)
    assert pinned.pin_in_place(tensor) is True
    del tensor
    gc.collect()
    assert calls == [("register", 20), ("free", 0)]


def test_nothing_to_pin_is_not_registered(monkeypatch):
    calls: list[tuple[str, int]] = []
    monkeypatch.setattr(torch.cuda, "cudart", lambda: runtime(0, calls))
    assert pinned.pin_in_place(torch.empty(0)) is False
    assert calls == []


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_real_refusal_leaves_torch_able_to_launch_kernels(tmp_path):
    """CUDA refuses to page-lock a read-only mapping unless asked for read-only registration."""
    path = tmp_path / "read-only"
    path.write_bytes(bytes(2**20))
    with path.open("rb") as file:
        mapped = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
    with pytest.warns(UserWarning, match="not writable"):
        tensor = torch.frombuffer(mapped, dtype=torch.uint8)
    with pytest.raises(pinned.PinningError, match=r"page-lock 0\.00 GiB"):
        pinned.pin_in_place(tensor)
    # The failed call's error was read off: torch's next launch check does not report it as its own.
    assert (torch.ones(4, device="cuda") * 2).sum().item() == 8

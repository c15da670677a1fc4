"""Off a TPU VM, building a Trainer or Fabric for XLA makes no network request.

Each case runs in a fresh interpreter with sockets refused, because Lightning caches device
counts for the life of a process.
"""

import os
import subprocess
import sys
import textwrap

BLOCK_SOCKETS = textwrap.dedent(
    """
    import socket
    attempts = []
    def refuse(*args, **kwargs):
        attempts.append(args)
        raise OSError("network access blocked by the test")
    socket.socket.connect = refuse
    socket.getaddrinfo = refuse
    """
)


def run_without_network(body: str, **env: str) -> str:
    script = BLOCK_SOCKETS + textwrap.dedent(body) + "\nprint('NETWORK ATTEMPTS', len(attempts))\n"
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env={**os.environ, **env}
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def test_our_accelerator_and_strategies_count_devices_without_the_network():
    output = run_without_network(
        """
        from lightning_strategies_xla import XLAAccelerator, SingleDeviceXLAStrategy
        from lightning.fabric import Fabric
        assert XLAAccelerator.is_available() and XLAAccelerator.auto_device_count() == 1
        assert XLAAccelerator.parse_devices("1") == 1
        fabric = Fabric(accelerator=XLAAccelerator(), devices=1, strategy="single_xla")
        assert type(fabric.strategy).__name__ == "SingleDeviceXLAStrategy"
        """
    )
    assert "NETWORK ATTEMPTS 0" in output


def test_trainer_makes_no_request_with_the_package_installed():
    output = run_without_network(
        """
        from lightning.pytorch import Trainer
        trainer = Trainer(accelerator="tpu", devices=1, strategy="single_xla", logger=False)
        assert type(trainer.strategy).__module__ == "lightning_strategies_xla.strategy"
        Trainer(logger=False)  # accelerator="auto" asks the XLA accelerator first
        """
    )
    assert "NETWORK ATTEMPTS 0" in output


def test_without_activation_lightning_asks_the_metadata_server():
    """What the activation hook prevents: Lightning 2.6.6's "TPU available" log line goes online."""
    output = run_without_network(
        """
        from lightning.pytorch import Trainer
        from lightning_strategies_xla import XLAAccelerator
        Trainer(accelerator=XLAAccelerator(), devices=1, logger=False)
        """,
        LIGHTNING_STRATEGIES_AUTOLOAD="0",
    )
    assert "NETWORK ATTEMPTS 0" not in output

"""The sharding tests run on 8 CPU devices; the flag must be set before JAX starts its backend."""

import os

import pytest

flags = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in flags:
    os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count=8".strip()


@pytest.fixture(scope="session")
def devices():
    """Skip unless JAX sees the 8 devices a data=2 x model=4 mesh needs."""
    jax = pytest.importorskip("jax")
    if len(jax.devices()) < 8:
        pytest.skip("needs 8 devices (XLA_FLAGS=--xla_force_host_platform_device_count=8 before JAX starts)")

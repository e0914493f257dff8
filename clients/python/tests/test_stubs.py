"""The committed stubs are exactly what gen_stubs.sh makes from the proto (with the pinned grpcio-tools)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1]
COMMITTED = PKG / "vserve_client" / "_proto"


def test_committed_stubs_match_the_proto(tmp_path):
    try:
        import grpc_tools  # noqa: F401
    except ImportError:
        pytest.fail(f"grpcio-tools is not installed: pip install -r {PKG / 'requirements-dev.txt'}")
    out = tmp_path / "gen"
    env = dict(os.environ, PYTHON=sys.executable)
    run = subprocess.run(
        ["bash", str(PKG / "gen_stubs.sh"), str(out)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    assert run.returncode == 0, run.stdout.decode(errors="replace")
    fresh = sorted(p.name for p in out.iterdir())
    committed = sorted(p.name for p in COMMITTED.iterdir() if p.is_file() and not p.name.endswith(".pyc"))
    assert fresh == committed, f"generated files {fresh} != committed {committed}"
    stale = [name for name in fresh if (out / name).read_bytes() != (COMMITTED / name).read_bytes()]
    assert not stale, (
        f"committed stubs {stale} differ from what proto/vserve/v1/vserve.proto generates; "
        "run clients/python/gen_stubs.sh and commit the result"
    )


def test_stubs_import_as_a_package_module():
    from vserve_client._proto import vserve_pb2, vserve_pb2_grpc

    assert vserve_pb2_grpc.vserve_dot_v1_dot_vserve__pb2 is vserve_pb2
    assert vserve_pb2.DESCRIPTOR.name == "vserve/v1/vserve.proto"
    assert "vserve" not in sys.modules or not hasattr(sys.modules.get("vserve"), "v1")

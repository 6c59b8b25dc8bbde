import os
import shutil
import uuid

import pytest
import sqlalchemy as sa

POSTGRES_ENV = "CUTLASS_TUNE_TEST_POSTGRES_URL"


def _gpu_visible() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    has_gpu = _gpu_visible()
    has_nvcc = shutil.which("nvcc") is not None
    for item in items:
        if "gpu" in item.keywords and not has_gpu:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU; none is visible"))
        if "nvcc" in item.keywords and not has_nvcc:
            item.add_marker(pytest.mark.skip(reason="needs nvcc on PATH"))



@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request, tmp_path):
    """A fresh, empty store URL on each backend. PostgreSQL needs CUTLASS_TUNE_TEST_POSTGRES_URL
    (.ci/run starts a server and sets it)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'store.sqlite'}"
        return
    admin_url = os.environ.get(POSTGRES_ENV)
    if not admin_url:
        pytest.skip(f"set {POSTGRES_ENV} to a PostgreSQL server (.ci/run starts one)")
    name = f"ct_test_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    yield sa.engine.make_url(admin_url).set(database=name).render_as_string(hide_password=False)
    with admin.connect() as conn:
        conn.execute(sa.text(f'DROP DATABASE "{name}" WITH (FORCE)'))
    admin.dispose()

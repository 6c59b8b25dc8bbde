"""Schema 1: the store's tables as the versions before migrations made them (store/_sql.py at
ef18a94). A store begun then records no revision and reads as this one; upgrading it creates
only the tables it lacks (`ct_runs` and `ct_claims` came late in schema 1, so older stores of
it have neither), and a new store gets them all here.

Stores move forward only: keep a copy (the SQLite file, `pg_dump`) to go back.
"""

import sqlalchemy as sa
from alembic import op

revision = "schema1"
down_revision = None


def upgrade() -> None:
    tables = sa.MetaData()
    sa.Table(
        "ct_meta", tables,
        sa.Column("key", sa.String(64), primary_key=True),
        sa.Column("value", sa.Text, nullable=False),
    )
    sa.Table(
        "ct_measurements", tables,
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("gpu", sa.String(128), nullable=False),
        sa.Column("problem", sa.String(128), nullable=False, index=True),
        sa.Column("m", sa.Integer, nullable=False),
        sa.Column("n", sa.Integer, nullable=False),
        sa.Column("k", sa.Integer, nullable=False),
        sa.Column("dtype_a", sa.String(8), nullable=False),
        sa.Column("dtype_b", sa.String(8), nullable=False),
        sa.Column("dtype_d", sa.String(8), nullable=False),
        sa.Column("layout", sa.String(2), nullable=False),
        sa.Column("kernel", sa.String(160), nullable=False),
        sa.Column("config_hash", sa.String(16), nullable=True, index=True),
        sa.Column("runtime", sa.String(64), nullable=False),
        sa.Column("status", sa.String(24), nullable=False),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("median_ms", sa.Float, nullable=True),
        sa.Column("p20_ms", sa.Float, nullable=True),
        sa.Column("p80_ms", sa.Float, nullable=True),
        sa.Column("samples", sa.Integer, nullable=False),
        sa.Column("tflops", sa.Float, nullable=True),
        sa.Column("cublas_tflops", sa.Float, nullable=True),
        sa.Column("ratio", sa.Float, nullable=True),
        sa.Column("compile_seconds", sa.Float, nullable=True),
        sa.Column("throttled", sa.Boolean, nullable=False),
        sa.Column("run_id", sa.String(64), nullable=False),
        sa.Column("study", sa.String(256), nullable=True),
        sa.Column("trial", sa.Integer, nullable=True),
        sa.Column("created_at", sa.String(32), nullable=False),
        sa.Column("record", sa.Text, nullable=False),
    )
    sa.Table(
        "ct_runs", tables,
        sa.Column("run_id", sa.String(64), primary_key=True),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("pid", sa.Integer, nullable=False),
        sa.Column("heartbeat_at", sa.Float, nullable=False),
    )
    sa.Table(
        "ct_claims", tables,
        sa.Column("config_hash", sa.String(16), primary_key=True),
        sa.Column("run_id", sa.String(64), nullable=False, index=True),
    )
    tables.create_all(op.get_bind(), checkfirst=True)

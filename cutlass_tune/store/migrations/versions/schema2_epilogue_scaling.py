"""Schema 2: a measurement's problem gains its fused epilogue and its fp8 scaling mode
(`epilogue`, `scaling`: text, 'none' for every row before them). Adding a column with a
constant default rewrites no row, on SQLite or on PostgreSQL 11 and later.

`ct_meta`'s schema becomes 2, so the versions before migrations, which refuse a store whose
recorded schema is not theirs, refuse this one instead of writing rows without the columns'
meaning into it.
"""

import sqlalchemy as sa
from alembic import op

revision = "schema2"
down_revision = "schema1"


def upgrade() -> None:
    op.add_column("ct_measurements", sa.Column("epilogue", sa.Text, nullable=False, server_default="none"))
    op.add_column("ct_measurements", sa.Column("scaling", sa.Text, nullable=False, server_default="none"))
    meta = sa.table("ct_meta", sa.column("key", sa.String), sa.column("value", sa.Text))
    bind = op.get_bind()
    if bind.execute(sa.select(meta.c.value).where(meta.c.key == "schema")).first() is None:
        bind.execute(meta.insert().values(key="schema", value="2"))
    else:
        bind.execute(meta.update().where(meta.c.key == "schema").values(value="2"))
